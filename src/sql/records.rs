//! [`SqlStore`]: the one implementation of the SQL record stores, over a [`Dialect`]: the
//! record store's kind of [`SqlTable`].

use std::fmt;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{Pool, Transaction};

use super::query::Param;
use super::run::{self, error};
use super::statements::{Sql, Statements};
use super::table::{Records, SqlTable, kind};
use super::{
    DEFAULT_TABLE, Dialect, RESERVE_ATTEMPTS, completion_after_miss, held, millis, unsettled,
};
use crate::order::Position;
use crate::store::contract::{IdempotencyStore, OrderedStore};
use crate::store::record::Record;
use crate::store::{
    Claim, Completion, Kinds, Order, Reservation, StoreError, StoreErrorKind, StoreKey, Target,
};

/// An [`IdempotencyStore`] in an SQL table: [`PostgresStore`](crate::PostgresStore) and
/// [`SqliteStore`](crate::SqliteStore) (see the [module docs](crate::store::sql) for the table and the
/// statements); the record store's kind of [`SqlTable`].
///
/// Cheap to clone (the pool and the statements are shared). Build it over a pool with
/// [`new`](SqlTable::new), create the tables with [`migrate`](SqlTable::migrate) (or run
/// [`schema`](SqlTable::schema) with your own migrations), and purge expired claims and records
/// with [`purge_expired`](SqlTable::purge_expired) or [`spawn_purge`](SqlTable::spawn_purge).
///
/// Leases and retentions longer than 100 years are written as 100 years, so that timestamps
/// never overflow.
///
/// When the database cannot be reached, calls fail with
/// [`StoreErrorKind::Unavailable`](crate::store::StoreErrorKind::Unavailable) and the layer
/// answers as configured (503 when failing closed). A layer puts a local cache of completed
/// records in front of this store (see
/// [`IdempotencyLayer::local_cache`](crate::IdempotencyLayer::local_cache)).
pub type SqlStore<DB> = SqlTable<DB, Records>;

/// A record store: `idempotency_keys` (and `<table>_objects`), the statements of
/// `statements.rs`.
impl kind::Sealed for Records {
    type Statements = Statements;
    /// A record store wakes no one up.
    type Announcer = ();
    const DEFAULT_TABLE: &'static str = DEFAULT_TABLE;
    const PURGED: &'static str = "idempotency keys";

    fn statements<DB: Dialect>(table: &str) -> Statements {
        Statements::new::<DB>(table)
    }

    fn announcer<DB: Dialect>(_pool: &Pool<DB>, _table: &str) {}

    fn ddl(sql: &Statements) -> kind::Ddl<'_> {
        kind::Ddl::of(&sql.table, &sql.schema, &sql.migrate)
    }

    async fn after_migrate<DB: Dialect>(
        _pool: &Pool<DB>,
        _sql: &Statements,
    ) -> Result<(), StoreError> {
        Ok(())
    }

    fn purge(sql: &Statements) -> [&Sql; 2] {
        [&sql.purge, &sql.purge_objects]
    }

    fn purge_params(limit: i64) -> Vec<Param<'static>> {
        vec![Param::Int(limit)]
    }

    fn purge_clock<DB: Dialect>() -> Option<i64> {
        DB::clock()
    }
}

impl<DB: Dialect> fmt::Debug for SqlStore<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlStore")
            .field("pool", &self.pool)
            .field("sql", &self.sql)
            .finish()
    }
}

impl<DB: Dialect> SqlStore<DB> {
    /// A connection from the pool.
    async fn connection(&self) -> Result<PoolConnection<DB>, StoreError> {
        run::acquire(&self.pool).await
    }

    /// Runs `sql` on `conn`; returns how many rows it wrote.
    async fn execute(
        &self,
        conn: &mut DB::Connection,
        sql: &Sql,
        params: &[Param<'_>],
    ) -> Result<u64, StoreError> {
        run::execute::<DB>(conn, sql, params, DB::clock()).await
    }

    /// Runs `sql` on `conn`; returns its rows.
    async fn fetch(
        &self,
        conn: &mut DB::Connection,
        sql: &Sql,
        params: &[Param<'_>],
    ) -> Result<Vec<DB::Row>, StoreError> {
        run::fetch::<DB>(conn, sql, params, DB::clock()).await
    }

    /// Runs `sql` on `conn`; returns its first row, if any (the statements read at most one).
    async fn fetch_one(
        &self,
        conn: &mut DB::Connection,
        sql: &Sql,
        params: &[Param<'_>],
    ) -> Result<Option<DB::Row>, StoreError> {
        Ok(self.fetch(conn, sql, params).await?.into_iter().next())
    }
}

/// The statements on one key, on a connection (or in a transaction) the caller holds.
impl<DB: Dialect> SqlStore<DB> {
    async fn reserve_on(
        &self,
        conn: &mut DB::Connection,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        let fingerprint = claim.fingerprint();
        let params = [
            Param::Text(key.as_str()),
            Param::Bytes(claim.token().as_bytes()),
            Param::Bytes(fingerprint.as_bytes()),
            Param::Int(millis(lease)),
        ];
        for _ in 0..RESERVE_ATTEMPTS {
            let mut row = self.fetch_one(conn, &self.sql.reserve, &params).await?;
            if let (None, Some(read_live)) = (&row, &self.sql.read_live) {
                // The claim wrote nothing: a live row holds the key. Whatever this read finds
                // is the key's current state.
                row = self.fetch_one(conn, read_live, &params[..1]).await?;
            }
            // No row: the conflicting row is gone (released or expired in between), or, on
            // PostgreSQL, not visible to the statement's snapshot (written by a claim that
            // committed while ours waited for it). The next statement has a fresh snapshot.
            let Some(row) = row else { continue };
            if let Some(found) = reservation::<DB>(&row)? {
                return Ok(found);
            }
        }
        Err(unsettled())
    }

    async fn complete_on(
        &self,
        conn: &mut DB::Connection,
        key: &StoreKey,
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> Result<Completion, StoreError> {
        let (fingerprint, encoded) = (record.fingerprint(), record.encode_for(claim.token()));
        let params = [
            Param::Text(key.as_str()),
            Param::Bytes(claim.token().as_bytes()),
            Param::Bytes(fingerprint.as_bytes()),
            Param::Bytes(&encoded),
            Param::Int(millis(retention)),
        ];
        if self.execute(conn, &self.sql.complete, &params).await? == 1 {
            return Ok(Completion::Written);
        }
        let row = self
            .fetch_one(conn, &self.sql.read_record, &params[..1])
            .await?;
        let record = match &row {
            Some(row) => DB::bytes(row, 0).map_err(error::<DB>)?,
            None => None,
        };
        completion_after_miss(record, claim)
    }

    /// [`complete`](IdempotencyStore::complete) inside the caller's transaction (the door of
    /// [`Idempotent::once_in_tx`](crate::Idempotent::once_in_tx)): the token-checked `UPDATE`
    /// to completed runs in `tx`, so the record exists when `tx` commits and not at all when
    /// it rolls back. Nothing is committed here.
    pub(crate) async fn complete_in_tx(
        &self,
        tx: &mut Transaction<'_, DB>,
        key: &StoreKey,
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> Result<Completion, StoreError> {
        self.complete_on(tx, key, claim, record, retention).await
    }

    /// Commits `tx`, with the store's error classification.
    pub(crate) async fn commit(&self, tx: Transaction<'static, DB>) -> Result<(), StoreError> {
        commit::<DB>(tx).await
    }

    async fn release_on(
        &self,
        conn: &mut DB::Connection,
        key: &StoreKey,
        claim: &Claim,
    ) -> Result<bool, StoreError> {
        let params = [
            Param::Text(key.as_str()),
            Param::Bytes(claim.token().as_bytes()),
        ];
        Ok(self.execute(conn, &self.sql.release, &params).await? == 1)
    }

    async fn renew_on(
        &self,
        conn: &mut DB::Connection,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let params = [
            Param::Text(key.as_str()),
            Param::Bytes(claim.token().as_bytes()),
            Param::Int(millis(lease)),
        ];
        Ok(self.execute(conn, &self.sql.renew, &params).await? == 1)
    }

    /// The batch claim of PostgreSQL: every key in one statement, claimed again where the
    /// statement's snapshot could not see the row holding it.
    async fn reserve_batch(
        &self,
        sql: &Sql,
        keys: &[Target],
        claim: &Claim,
        lease: Duration,
    ) -> Result<Vec<Reservation>, StoreError> {
        let fingerprint = claim.fingerprint();
        let mut out: Vec<Option<Reservation>> = vec![None; keys.len()];
        // The positions of the keys still to claim.
        let mut pending: Vec<usize> = (0..keys.len()).collect();
        let mut conn = self.connection().await?;
        for _ in 0..RESERVE_ATTEMPTS {
            if pending.is_empty() {
                break;
            }
            let batch = pending
                .iter()
                .map(|&i| keys[i].key.as_str())
                .collect::<Vec<_>>()
                .join(",");
            let params = [
                Param::Text(&batch),
                Param::Bytes(claim.token().as_bytes()),
                Param::Bytes(fingerprint.as_bytes()),
                Param::Int(millis(lease)),
            ];
            let rows = self.fetch(&mut conn, sql, &params).await?;
            if rows.len() != pending.len() {
                return Err(StoreError::with_source(
                    StoreErrorKind::Corrupt,
                    "a batch claim returned a row count other than its number of keys",
                ));
            }
            let mut again = Vec::new();
            for (row, i) in rows.iter().zip(pending) {
                match reservation::<DB>(row)? {
                    Some(found) => out[i] = Some(found),
                    None => again.push(i),
                }
            }
            pending = again;
        }
        out.into_iter()
            .map(|found| found.ok_or_else(unsettled))
            .collect()
    }
}

/// The ordered events: one transaction per event, the key's statement first, then the
/// object's.
impl<DB: Dialect> SqlStore<DB> {
    async fn reserve_event(
        &self,
        key: &StoreKey,
        event: &Order,
        claim: &Claim,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        let mut tx = self.begin().await?;
        let found = self.reserve_on(&mut tx, key, claim, lease).await?;
        if found != Reservation::Acquired {
            // Nothing was written.
            return Ok(found);
        }
        let params = [
            Param::Text(event.object.as_str()),
            Param::Bytes(claim.token().as_bytes()),
            Param::Int(millis(lease)),
        ];
        let Some(row) = self
            .fetch_one(&mut tx, &self.sql.lease_object, &params)
            .await?
        else {
            // Another event of the object is in flight: the key's claim is undone.
            rollback::<DB>(tx).await?;
            return Ok(Reservation::ObjectBusy);
        };
        let watermark = DB::bytes(&row, 0)
            .map_err(error::<DB>)?
            .map(position)
            .transpose()?;
        commit::<DB>(tx).await?;
        Ok(match watermark {
            Some(watermark) if event.equal.is_stale(event.position, watermark) => {
                Reservation::Stale { watermark }
            }
            _ => Reservation::Acquired,
        })
    }

    async fn complete_event(
        &self,
        key: &StoreKey,
        event: &Order,
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> Result<Completion, StoreError> {
        let mut tx = self.begin().await?;
        let done = self
            .complete_on(&mut tx, key, claim, record, retention)
            .await?;
        let object = Param::Text(event.object.as_str());
        if done == Completion::Written {
            let position = event.position.to_bytes();
            let params = [
                object,
                Param::Bytes(&position),
                Param::Int(millis(retention)),
            ];
            self.execute(&mut tx, &self.sql.raise_watermark, &params)
                .await?;
        }
        let params = [object, Param::Bytes(claim.token().as_bytes())];
        self.execute(&mut tx, &self.sql.unlock_object, &params)
            .await?;
        commit::<DB>(tx).await?;
        Ok(done)
    }

    async fn release_event(
        &self,
        key: &StoreKey,
        event: &Order,
        claim: &Claim,
    ) -> Result<bool, StoreError> {
        let mut tx = self.begin().await?;
        let released = self.release_on(&mut tx, key, claim).await?;
        let params = [
            Param::Text(event.object.as_str()),
            Param::Bytes(claim.token().as_bytes()),
        ];
        self.execute(&mut tx, &self.sql.unlock_object, &params)
            .await?;
        commit::<DB>(tx).await?;
        Ok(released)
    }

    async fn renew_event(
        &self,
        key: &StoreKey,
        event: &Order,
        claim: &Claim,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let mut tx = self.begin().await?;
        let renewed = self.renew_on(&mut tx, key, claim, lease).await?;
        let params = [
            Param::Text(event.object.as_str()),
            Param::Bytes(claim.token().as_bytes()),
            Param::Int(millis(lease)),
        ];
        self.execute(&mut tx, &self.sql.renew_object, &params)
            .await?;
        commit::<DB>(tx).await?;
        Ok(renewed)
    }
}

async fn commit<DB: Dialect>(tx: Transaction<'static, DB>) -> Result<(), StoreError> {
    tx.commit().await.map_err(error::<DB>)
}

async fn rollback<DB: Dialect>(tx: Transaction<'static, DB>) -> Result<(), StoreError> {
    tx.rollback().await.map_err(error::<DB>)
}

/// A watermark column's position.
fn position(bytes: &[u8]) -> Result<Position, StoreError> {
    let bytes: [u8; Position::LEN] = bytes.try_into().map_err(|_| {
        StoreError::with_source(StoreErrorKind::Corrupt, "a watermark of the wrong length")
    })?;
    Ok(Position::from_bytes(bytes))
}

/// A plain target is one statement (a reserve of several is one statement on PostgreSQL);
/// the targets of a completion, release or renewal are one statement per key, on one
/// connection; an ordered event is one transaction (see above).
impl<DB: Dialect> IdempotencyStore for SqlStore<DB> {
    async fn reserve(
        &self,
        targets: &[Target],
        claim: &Claim,
        lease: Duration,
    ) -> Result<Vec<Reservation>, StoreError> {
        if let [Target { key, order: None }] = targets {
            let mut conn = self.connection().await?;
            return Ok(vec![self.reserve_on(&mut conn, key, claim, lease).await?]);
        }
        // Boxed: the single key's future, which every request awaits, stays small.
        Box::pin(async move {
            match Kinds::of(targets) {
                Kinds::Plain => self.reserve_keys(targets, claim, lease).await,
                Kinds::Ordered | Kinds::Mixed(..) => {
                    let mut out = Vec::with_capacity(targets.len());
                    for target in targets {
                        out.push(match &target.order {
                            Some(order) => {
                                self.reserve_event(&target.key, order, claim, lease).await?
                            }
                            None => {
                                let mut conn = self.connection().await?;
                                self.reserve_on(&mut conn, &target.key, claim, lease)
                                    .await?
                            }
                        });
                    }
                    Ok(out)
                }
            }
        })
        .await
    }

    async fn complete(
        &self,
        targets: &[Target],
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> Result<Vec<Completion>, StoreError> {
        if let [Target { key, order: None }] = targets {
            let mut conn = self.connection().await?;
            let done = self.complete_on(&mut conn, key, claim, record, retention);
            return Ok(vec![done.await?]);
        }
        Box::pin(async move {
            let mut out = Vec::with_capacity(targets.len());
            let mut conn = None;
            for target in targets {
                out.push(match &target.order {
                    Some(order) => {
                        let done =
                            self.complete_event(&target.key, order, claim, record, retention);
                        done.await?
                    }
                    None => {
                        let conn = self.shared_connection(&mut conn).await?;
                        self.complete_on(conn, &target.key, claim, record, retention)
                            .await?
                    }
                });
            }
            Ok(out)
        })
        .await
    }

    async fn release(&self, targets: &[Target], claim: &Claim) -> Result<usize, StoreError> {
        if let [Target { key, order: None }] = targets {
            let mut conn = self.connection().await?;
            return Ok(usize::from(self.release_on(&mut conn, key, claim).await?));
        }
        Box::pin(async move {
            let mut released = 0;
            let mut conn = None;
            for target in targets {
                released += usize::from(match &target.order {
                    Some(order) => self.release_event(&target.key, order, claim).await?,
                    None => {
                        let conn = self.shared_connection(&mut conn).await?;
                        self.release_on(conn, &target.key, claim).await?
                    }
                });
            }
            Ok(released)
        })
        .await
    }

    async fn renew(
        &self,
        targets: &[Target],
        claim: &Claim,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        if let [Target { key, order: None }] = targets {
            let mut conn = self.connection().await?;
            return self.renew_on(&mut conn, key, claim, lease).await;
        }
        Box::pin(async move {
            let mut all = true;
            let mut conn = None;
            for target in targets {
                all &= match &target.order {
                    Some(order) => self.renew_event(&target.key, order, claim, lease).await?,
                    None => {
                        let conn = self.shared_connection(&mut conn).await?;
                        self.renew_on(conn, &target.key, claim, lease).await?
                    }
                };
            }
            Ok(all)
        })
        .await
    }
}

/// An ordered event and its object are written in one transaction.
impl<DB: Dialect> OrderedStore for SqlStore<DB> {}

impl<DB: Dialect> SqlStore<DB> {
    /// The reserve of several plain targets: one statement where the dialect has one
    /// (PostgreSQL), else one statement per key on one connection.
    async fn reserve_keys(
        &self,
        targets: &[Target],
        claim: &Claim,
        lease: Duration,
    ) -> Result<Vec<Reservation>, StoreError> {
        if let Some(sql) = &self.sql.reserve_many {
            return self.reserve_batch(sql, targets, claim, lease).await;
        }
        let mut conn = self.connection().await?;
        let mut out = Vec::with_capacity(targets.len());
        for target in targets {
            out.push(
                self.reserve_on(&mut conn, &target.key, claim, lease)
                    .await?,
            );
        }
        Ok(out)
    }

    /// The connection in `slot`, taken from the pool at its first use.
    async fn shared_connection<'c>(
        &self,
        slot: &'c mut Option<PoolConnection<DB>>,
    ) -> Result<&'c mut PoolConnection<DB>, StoreError> {
        if slot.is_none() {
            *slot = Some(self.connection().await?);
        }
        Ok(slot.as_mut().expect("just set"))
    }
}

/// What a row of a reserve statement says: `acquired`, or the `state`, `fingerprint`,
/// `record` and milliseconds left of the live row holding the key; `None` when there is no
/// such row (it vanished, or the statement's snapshot could not see it): the key is to be
/// claimed again.
fn reservation<DB: Dialect>(row: &DB::Row) -> Result<Option<Reservation>, StoreError> {
    if DB::flag(row, 0).map_err(error::<DB>)? {
        return Ok(Some(Reservation::Acquired));
    }
    let Some(state) = DB::text(row, 1).map_err(error::<DB>)? else {
        return Ok(None);
    };
    let fingerprint = DB::bytes(row, 2).map_err(error::<DB>)?;
    let record = DB::bytes(row, 3).map_err(error::<DB>)?;
    let left = DB::int(row, 4).map_err(error::<DB>)?;
    let found = held(state, fingerprint.unwrap_or_default(), record)?;
    Ok(Some(
        match (found, left.and_then(|ms| u64::try_from(ms).ok())) {
            (Reservation::Completed(record), Some(ms)) if ms > 0 => {
                Reservation::Completed(record.expiring_in(Duration::from_millis(ms)))
            }
            (found, _) => found,
        },
    ))
}
