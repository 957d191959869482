//! [`SqlStore`]: the one implementation of the SQL stores, over a [`Dialect`].

use crate::store::cache::LocalCache;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Pool;

use super::query::Param;
use super::statements::Statements;
use super::{
    DEFAULT_PURGE_BATCH, DEFAULT_TABLE, Dialect, InvalidTable, RESERVE_ATTEMPTS,
    completion_after_miss, held, millis, purge_in_batches, store_error, unsettled, validate_table,
};
use crate::store::record::Record;
use crate::store::{
    Claim, Completion, IdempotencyStore, Reservation, StoreError, StoreErrorKind, StoreKey,
};

/// An [`IdempotencyStore`] in an SQL table: [`PostgresStore`](super::PostgresStore) and
/// [`SqliteStore`](super::SqliteStore) (see the [module docs](super) for the table and the
/// statements).
///
/// Cheap to clone (the pool and the statements are shared). Build it over a pool with
/// [`new`](Self::new), create the table with [`migrate`](Self::migrate) (or run the dialect's
/// `SCHEMA` with your own migrations), and purge expired rows with
/// [`purge_expired`](Self::purge_expired) or [`spawn_purge`](Self::spawn_purge).
///
/// When the database cannot be reached, calls fail with
/// [`StoreErrorKind::Unavailable`](crate::store::StoreErrorKind::Unavailable) and the layer
/// answers as configured (503 when failing closed).
#[derive(Debug)]
pub struct SqlStore<DB: Dialect> {
    pool: Pool<DB>,
    sql: Arc<Statements>,
    cache: LocalCache,
}

impl<DB: Dialect> Clone for SqlStore<DB> {
    fn clone(&self) -> Self {
        SqlStore {
            pool: self.pool.clone(),
            sql: self.sql.clone(),
            cache: self.cache.clone(),
        }
    }
}

impl<DB: Dialect> SqlStore<DB> {
    /// A store over `pool`, in the table [`DEFAULT_TABLE`].
    ///
    /// On SQLite, configure the pool's connections for concurrent use: a busy timeout (sqlx's
    /// default is 5 s) and preferably the WAL journal, as
    /// [`SqliteStore::open`](super::SqliteStore::open) does.
    pub fn new(pool: Pool<DB>) -> Self {
        SqlStore {
            pool,
            sql: Arc::new(Statements::new::<DB>(DEFAULT_TABLE)),
            cache: LocalCache::new(),
        }
    }

    /// Sets the local cache of completed records this store answers duplicates from without a
    /// round trip: on by default ([`LocalCache::new`]); [`LocalCache::off`] turns it off. See
    /// [the cache's docs](crate::store::cache) for what is cached, for how long, and what an
    /// operator who deletes rows by hand must know. Clones of the store share the cache.
    pub fn local_cache(mut self, cache: LocalCache) -> Self {
        self.cache = cache;
        self
    }

    /// The local cache of completed records.
    pub fn cache(&self) -> &LocalCache {
        &self.cache
    }

    /// Uses the table `table` instead of [`DEFAULT_TABLE`]; on PostgreSQL it may be
    /// schema-qualified (`app.idempotency_keys`).
    ///
    /// An [`InvalidTable`] error when `table` is not an SQL identifier
    /// (`[A-Za-z_][A-Za-z0-9_]*`, at most 40 characters, or on PostgreSQL `schema.table` of two
    /// such): it is written into the statements as it is.
    pub fn with_table(mut self, table: &str) -> Result<Self, InvalidTable> {
        validate_table(table, DB::QUALIFIED_TABLES)?;
        self.sql = Arc::new(Statements::new::<DB>(table));
        Ok(self)
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// The `CREATE TABLE IF NOT EXISTS` and `CREATE INDEX IF NOT EXISTS` statements of this
    /// store's table (the same as the dialect's `SCHEMA` for the default table).
    pub fn schema(&self) -> &str {
        &self.sql.schema
    }

    /// The pool.
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    /// Returns the pool.
    pub fn into_inner(self) -> Pool<DB> {
        self.pool
    }

    /// Creates the table and its index if they do not exist yet ([`schema`](Self::schema)).
    ///
    /// Idempotent, and safe to call from every instance at start-up. On PostgreSQL the
    /// statements run as one transaction under an advisory lock (`pg_advisory_xact_lock`), so
    /// instances starting together do not trip over each other.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        DB::execute_script(&self.pool, &self.sql.migrate)
            .await
            .map_err(error::<DB>)?;
        Ok(())
    }

    /// Deletes the rows whose lease or retention has expired, at most `batch_size` per
    /// statement (each a short transaction, so claims are not held up for long), until a
    /// statement deletes fewer; returns how many rows were deleted.
    ///
    /// On PostgreSQL, rows locked by a concurrent claim are skipped (`FOR UPDATE SKIP
    /// LOCKED`), so several instances may purge at once.
    pub async fn purge_expired(&self, batch_size: u32) -> Result<u64, StoreError> {
        purge_in_batches(batch_size, |limit| async move {
            self.execute(&self.sql.purge, &[Param::Int(limit)]).await
        })
        .await
    }

    /// Spawns a Tokio task that runs [`purge_expired`](Self::purge_expired) with
    /// [`DEFAULT_PURGE_BATCH`] every `every`, the first time right away, logging its outcome
    /// with `tracing`. Abort the returned handle to stop it; it also ends with the runtime.
    ///
    /// # Panics
    ///
    /// When called outside a Tokio runtime.
    pub fn spawn_purge(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let store = self.clone();
        let every = every.max(Duration::from_millis(1));
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                match store.purge_expired(DEFAULT_PURGE_BATCH).await {
                    Ok(deleted) => tracing::debug!(
                        backend = DB::BACKEND,
                        deleted,
                        "purged expired idempotency keys"
                    ),
                    Err(error) => tracing::warn!(
                        backend = DB::BACKEND,
                        %error,
                        "purging expired idempotency keys failed"
                    ),
                }
            }
        })
    }

    /// Runs `sql`; returns how many rows it wrote.
    async fn execute(&self, sql: &str, params: &[Param<'_>]) -> Result<u64, StoreError> {
        let done = DB::execute(&self.pool, sql, params, DB::clock())
            .await
            .map_err(error::<DB>)?;
        Ok(DB::rows_affected(&done))
    }

    /// Runs `sql`; returns its rows.
    async fn fetch(&self, sql: &str, params: &[Param<'_>]) -> Result<Vec<DB::Row>, StoreError> {
        DB::fetch_all(&self.pool, sql, params, DB::clock())
            .await
            .map_err(error::<DB>)
    }

    /// Runs `sql`; returns its first row, if any (the statements read at most one).
    async fn fetch_one(
        &self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Option<DB::Row>, StoreError> {
        Ok(self.fetch(sql, params).await?.into_iter().next())
    }
}

/// The store's own calls, without the local cache.
impl<DB: Dialect> SqlStore<DB> {
    async fn reserve_uncached(
        &self,
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
            let mut row = self.fetch_one(&self.sql.reserve, &params).await?;
            if let (None, Some(read_live)) = (&row, &self.sql.read_live) {
                // The claim wrote nothing: a live row holds the key. Whatever this read finds
                // is the key's current state.
                row = self.fetch_one(read_live, &params[..1]).await?;
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

    async fn reserve_many_uncached(
        &self,
        keys: &[StoreKey],
        claim: &Claim,
        lease: Duration,
    ) -> Result<Vec<Reservation>, StoreError> {
        let Some(sql) = &self.sql.reserve_many else {
            let mut out = Vec::with_capacity(keys.len());
            for key in keys {
                out.push(self.reserve_uncached(key, claim, lease).await?);
            }
            return Ok(out);
        };
        let fingerprint = claim.fingerprint();
        let mut out: Vec<Option<Reservation>> = vec![None; keys.len()];
        // The positions of the keys still to claim.
        let mut pending: Vec<usize> = (0..keys.len()).collect();
        for _ in 0..RESERVE_ATTEMPTS {
            if pending.is_empty() {
                break;
            }
            let batch = pending
                .iter()
                .map(|&i| keys[i].as_str())
                .collect::<Vec<_>>()
                .join(",");
            let params = [
                Param::Text(&batch),
                Param::Bytes(claim.token().as_bytes()),
                Param::Bytes(fingerprint.as_bytes()),
                Param::Int(millis(lease)),
            ];
            let rows = self.fetch(sql, &params).await?;
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

    async fn complete_uncached(
        &self,
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
        if self.execute(&self.sql.complete, &params).await? == 1 {
            return Ok(Completion::Written);
        }
        let row = self.fetch_one(&self.sql.read_record, &params[..1]).await?;
        let record = match &row {
            Some(row) => DB::bytes(row, 0).map_err(error::<DB>)?,
            None => None,
        };
        completion_after_miss(record, claim)
    }

    async fn release_uncached(&self, key: &StoreKey, claim: &Claim) -> Result<bool, StoreError> {
        let params = [
            Param::Text(key.as_str()),
            Param::Bytes(claim.token().as_bytes()),
        ];
        Ok(self.execute(&self.sql.release, &params).await? == 1)
    }

    async fn renew_uncached(
        &self,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let params = [
            Param::Text(key.as_str()),
            Param::Bytes(claim.token().as_bytes()),
            Param::Int(millis(lease)),
        ];
        Ok(self.execute(&self.sql.renew, &params).await? == 1)
    }
}

/// Every call goes through the [local cache](SqlStore::local_cache) first; the batch
/// completion, release and renewal are one statement per key.
impl<DB: Dialect> IdempotencyStore for SqlStore<DB> {
    /// One `SELECT` of the live record and the milliseconds it has left, by the database's
    /// clock (SQLite: the store's).
    async fn remaining(
        &self,
        key: &StoreKey,
        record: &Record,
    ) -> Result<Option<Duration>, StoreError> {
        let Some(row) = self
            .fetch_one(&self.sql.remaining, &[Param::Text(key.as_str())])
            .await?
        else {
            return Ok(None);
        };
        let stored = DB::bytes(&row, 0).map_err(error::<DB>)?;
        if !stored.is_some_and(|stored| stored.starts_with(&record.encoded_head())) {
            return Ok(None);
        }
        let left = DB::int(&row, 1).map_err(error::<DB>)?;
        Ok(left
            .and_then(|ms| u64::try_from(ms).ok())
            .map(Duration::from_millis))
    }

    async fn reserve(
        &self,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        let store = self.reserve_uncached(key, claim, lease);
        self.cache.reserve(key, self, store).await
    }

    async fn reserve_many(
        &self,
        keys: &[StoreKey],
        claim: &Claim,
        lease: Duration,
    ) -> Result<Vec<Reservation>, StoreError> {
        let store = |misses: Vec<StoreKey>| async move {
            self.reserve_many_uncached(&misses, claim, lease).await
        };
        self.cache.reserve_many(keys, self, store).await
    }

    async fn complete(
        &self,
        key: &StoreKey,
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> Result<Completion, StoreError> {
        let store = self.complete_uncached(key, claim, record, retention);
        self.cache
            .complete(key, claim, record, retention, self, store)
            .await
    }

    async fn release(&self, key: &StoreKey, claim: &Claim) -> Result<bool, StoreError> {
        let store = self.release_uncached(key, claim);
        self.cache
            .forgetting(std::slice::from_ref(key), store)
            .await
    }

    async fn renew(
        &self,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let store = self.renew_uncached(key, claim, lease);
        self.cache
            .forgetting(std::slice::from_ref(key), store)
            .await
    }
}

/// What a row of a reserve statement says: `acquired`, or the `state`, `fingerprint` and
/// `record` of the live row holding the key; `None` when there is no such row (it vanished, or
/// the statement's snapshot could not see it): the key is to be claimed again.
fn reservation<DB: Dialect>(row: &DB::Row) -> Result<Option<Reservation>, StoreError> {
    if DB::flag(row, 0).map_err(error::<DB>)? {
        return Ok(Some(Reservation::Acquired));
    }
    let Some(state) = DB::text(row, 1).map_err(error::<DB>)? else {
        return Ok(None);
    };
    let fingerprint = DB::bytes(row, 2).map_err(error::<DB>)?;
    let record = DB::bytes(row, 3).map_err(error::<DB>)?;
    held(state, fingerprint.unwrap_or_default(), record).map(Some)
}

/// Maps an sqlx error to a [`StoreError`], classified by the dialect.
pub(super) fn error<DB: Dialect>(error: sqlx::Error) -> StoreError {
    store_error(error, DB::classify)
}
