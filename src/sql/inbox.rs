//! [`SqlInbox`]: the inbox in an SQL table, on [`sqlx`]: `PostgresInbox` (feature `postgres`)
//! and `SqliteInbox` (feature `sqlite`), one implementation over the record store's
//! [`Dialect`]: the inbox's kind of [`SqlTable`].

mod admin;

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::future::join_all;
use sqlx::{Pool, Transaction};

use crate::inbox::admin::DeadLetter;
use crate::inbox::admin::{
    EntryInfo, Filter, InboxAdmin, KEPT_ATTEMPTS, Page, Requeued, history, worker_id,
};
use crate::inbox::codec::{decode_headers, encode_headers};
use crate::inbox::entry::{EntryOrder, InboxEntry, Lease};
use crate::inbox::store::{Enqueued, Failure, InboxCounts, InboxStore, KeyState};
use crate::inbox::wake::{Announcer, Wakeups};
use crate::order::{EqualPositions, Position};
use crate::sql::query::Param;
use crate::sql::run::{acquire, error, execute, fetch};
use crate::sql::statements::{self, Sql, ddl, file, fill, render, substitute};
use crate::sql::table::{Inbox, SqlTable, kind};
use crate::sql::{Dialect, bare_name, millis};
use crate::store::{ObjectKey, StoreError, StoreErrorKind, StoreKey, Token};

/// The default name of the inbox's table (and `inbox_entries_objects` for watermarks).
const DEFAULT_INBOX_TABLE: &str = "inbox_entries";

/// How often an enqueue is tried again when the key it conflicted with vanished before its
/// state could be read (a done key purged in between).
const ENQUEUE_ATTEMPTS: usize = 3;

/// How often a take is tried when it met another take's entry of the same object (the
/// in-flight index): each conflict waited for that take to commit, so the next try sees it.
const TAKE_ATTEMPTS: usize = 3;

/// The columns of an entry, in the order `entry` reads them (then `stale` or `last_error`).
const ENTRY_COLUMNS: &str = "key, body, headers, object, position, correlation_id, attempts, \
    next_at, enqueued_at, id, route, equal_stale";

/// The columns of what an operator sees of an entry, in the order `info` reads them.
const INFO_COLUMNS: &str = "key, body, headers, {info_rest}";

/// The columns of [`INFO_COLUMNS`] after the body and the headers (which a listing reads only
/// when asked: `list.sql`).
const INFO_REST: &str = "object, position, correlation_id, attempts, next_at, enqueued_at, id, \
    route, equal_stale, state, lease_until, expires_at, last_error, history, started_us, worker";

/// The columns added to the table since it was first released, with their definitions: what
/// `migrate` adds to a table created before.
const ADDED_COLUMNS: [(&str, &str); 6] = [
    ("id", "text NOT NULL DEFAULT ''"),
    ("route", "text NOT NULL DEFAULT ''"),
    ("history", "text NOT NULL DEFAULT ''"),
    ("started_us", "bigint"),
    ("worker", "text"),
    ("equal_stale", "bigint NOT NULL DEFAULT 0"),
];

/// An [`InboxStore`] in an SQL table: `PostgresInbox` (feature `postgres`) and `SqliteInbox`
/// (feature `sqlite`); the inbox's kind of [`SqlTable`].
///
/// Cheap to clone (the pool and the statements are shared). Build it over a pool with
/// [`new`](SqlTable::new), create the tables with [`migrate`](SqlTable::migrate), and delete
/// done keys and watermarks past their retention with
/// [`purge_expired`](SqlTable::purge_expired) or [`spawn_purge`](SqlTable::spawn_purge). A
/// handler whose effect lives in the same database completes its entry in its own transaction
/// with [`complete_in_tx`](SqlTable::complete_in_tx).
///
/// # The tables
///
/// One row per key in `<table>` (`inbox_entries` unless configured otherwise), its
/// `state` one of `queued`, `running`, `dead` and `done`: the key is the `PRIMARY KEY`, so the
/// database itself guarantees one entry per key, and a done key keeps its row (without its
/// body and headers: with its correlation id, delivery `id`, `route`, order and attempts, for
/// [`find`](InboxAdmin::find)) until `expires_at`. `history` holds the attempts that ended, a
/// line each (the last 10); the one that runs is
/// `attempts`, `started_us` (microseconds since the epoch) and `worker`
/// (`host/pid`, as [`Attempt::worker`](crate::inbox::Attempt::worker)). Times are milliseconds since the Unix epoch from this
/// host's clock (a retry time comes from it anyway). `<table>_objects` holds each ordered object's
/// watermark: the highest position completed (16 bytes, byte order is position order), until
/// the retention of the last completion of one of its entries runs out, as on Redis, where it
/// is a key with that `PX` (an expired watermark counts as none, and is purged).
/// `<table>_paused` holds one row while taking is [paused](InboxAdmin::pause).
/// [`migrate`](SqlTable::migrate) adds the columns a table made by an earlier version lacks.
///
/// # Statements
///
/// - **enqueue** is one transaction: `INSERT ... ON CONFLICT (key) DO UPDATE ... WHERE` the
///   row there is a done key past its retention, then, when that wrote nothing, the `SELECT`
///   of the known key's state. Never a `SELECT` then an `INSERT`: two enqueues of one
///   delivery store one entry.
/// - **take** is one `UPDATE ... WHERE key IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED)
///   RETURNING` on PostgreSQL (several workers in several processes each lock their own due
///   rows and skip the others'), the same without row locks on SQLite (writers are
///   serialized). An ordered entry is due only when it is its object's next: none of its
///   object is running (one that is, its lease run out or not, is the only one taken until
///   it settles) and no queued one stands before it by position; it comes back stale when
///   it is stale against its object's watermark (past its position, or at it when the entry's
///   `equal_stale` says so). A unique index on the object of the
///   `running` rows holds that rule against concurrent takes on PostgreSQL (each reads its
///   own snapshot): the later of two that chose entries of one object waits for the first to
///   commit, fails on the index, and takes again.
///   The take also reads `<table>_paused` (a paused inbox hands out nothing), and starts the
///   attempt's history: its start and this process's worker id, and, when it takes over a lease
///   that ran out, the line of the attempt that lost it.
/// - **renew**, **complete** and **fail** are `UPDATE`s whose `WHERE` holds the lease's token;
///   **complete** also raises the watermark, in the same transaction. **complete** and **fail**
///   append the attempt's line to `history` in their statement (the error cut in Rust), as
///   does the completion in the handler's transaction.
/// - **list** reads by key from the cursor (`key > $1 ORDER BY key LIMIT n`), the filter's
///   conditions in the statement; **requeue_matching** re-queues the dead letters of such a
///   page in one `UPDATE`; **discard** makes a dead letter done without moving its object's
///   watermark.
///
/// The entries of one `take` share their lease token (each is still settled by its own key).
///
/// # Wake-ups
///
/// On PostgreSQL the enqueue, the re-queue and the resume `pg_notify` the entry's due time on
/// the channel `<table>_wake` when they commit (in the same statement), and
/// [`wakeups`](InboxStore::wakeups) listens with one connection of the pool per process
/// (`PgListener`, reconnecting by itself) while a worker waits: size the pool for it. On SQLite
/// the enqueues, re-queues and resumes of this process wake its workers (those of every inbox
/// of the process on the same database and table); another process's are seen at the workers'
/// poll (5 s by default).
///
/// ```no_run
/// # #[cfg(feature = "sqlite")]
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tower_idempotency::inbox::{InboxStore, SqliteInbox};
///
/// let pool = sqlx::SqlitePool::connect("sqlite:inbox.db?mode=rwc").await?;
/// let inbox = SqliteInbox::new(pool);
/// inbox.migrate().await?;
/// println!("{:?}", inbox.counts().await?);
/// # Ok(())
/// # }
/// ```
pub type SqlInbox<DB> = SqlTable<DB, Inbox>;

/// The inbox in PostgreSQL: [`SqlInbox`] over a `PgPool`.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tower_idempotency::inbox::PostgresInbox;
///
/// let pool = sqlx::PgPool::connect("postgres://app@127.0.0.1/app").await?;
/// let inbox = PostgresInbox::new(pool).with_table("app_inbox")?;
/// inbox.migrate().await?;
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "postgres")]
pub type PostgresInbox = SqlInbox<sqlx::Postgres>;

/// The inbox in SQLite: [`SqlInbox`] over an `SqlitePool` (on a file: an in-memory database
/// is per connection).
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tower_idempotency::inbox::SqliteInbox;
///
/// let pool = sqlx::SqlitePool::connect("sqlite:inbox.db?mode=rwc").await?;
/// let inbox = SqliteInbox::new(pool);
/// inbox.migrate().await?;
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "sqlite")]
pub type SqliteInbox = SqlInbox<sqlx::Sqlite>;

/// An inbox: `inbox_entries` (and `<table>_objects`, `<table>_paused`), the statements of
/// this file; its wake-ups announced per database and table.
impl kind::Sealed for Inbox {
    type Statements = Statements;
    type Announcer = Announcer;
    const DEFAULT_TABLE: &'static str = DEFAULT_INBOX_TABLE;
    const PURGED: &'static str = "inbox keys";

    fn statements<DB: Dialect>(table: &str) -> Statements {
        Statements::new::<DB>(table)
    }

    fn announcer<DB: Dialect>(pool: &Pool<DB>, table: &str) -> Announcer {
        announcer(pool, table)
    }

    fn ddl(sql: &Statements) -> kind::Ddl<'_> {
        kind::Ddl::of(&sql.table, &sql.schema, &sql.migrate)
    }

    async fn after_migrate<DB: Dialect>(
        pool: &Pool<DB>,
        sql: &Statements,
    ) -> Result<(), StoreError> {
        if !DB::ADD_COLUMN_IF_NOT_EXISTS {
            add_missing_columns(pool, sql).await?;
        }
        Ok(())
    }

    fn purge(sql: &Statements) -> [&Sql; 2] {
        [&sql.purge, &sql.purge_watermarks]
    }

    fn purge_params(limit: i64) -> Vec<Param<'static>> {
        vec![Param::Int(limit), Param::Int(epoch_ms(SystemTime::now()))]
    }

    /// The inbox's statements read no bound clock: `now` is their own parameter.
    fn purge_clock<DB: Dialect>() -> Option<i64> {
        None
    }
}

impl<DB: Dialect> fmt::Debug for SqlInbox<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlInbox")
            .field("pool", &self.pool)
            .field("sql", &self.sql)
            .field("announcer", &self.announcer)
            .finish()
    }
}

/// What only an inbox has: the completion of an entry in the caller's transaction.
impl<DB: Dialect> SqlInbox<DB> {
    /// An inbox on `pool` in the table `table`, its tables created ([`migrate`](Self::migrate)):
    /// what [`AnyInbox::on`](crate::inbox::AnyInbox::on) builds on an SQL store's pool. A table
    /// name that is not an SQL identifier is an error of kind `Other`.
    pub(crate) async fn migrated_on(pool: &Pool<DB>, table: &str) -> Result<Self, StoreError> {
        let inbox = Self::new(pool.clone())
            .with_table(table)
            .map_err(|err| StoreError::with_source(StoreErrorKind::Other, err))?;
        inbox.migrate().await?;
        Ok(inbox)
    }

    /// [`complete`](InboxStore::complete) inside the caller's transaction: the key is marked
    /// done for `retention`, the entry's body dropped and its object's watermark moved when
    /// `tx` commits, and not at all when it rolls back (the entry is then taken again after
    /// its lease). A handler that writes its effect in the same database commits the effect
    /// and the completion together. `false` (and nothing written) when the lease is not
    /// `token`'s. Once `tx` committed, the worker's own completion with the same token finds
    /// the key done by it and changes nothing; when `tx` does not commit, the handler must
    /// return an error, so that the worker schedules a retry instead of completing.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn run(
    /// #     inbox: tower_idempotency::inbox::PostgresInbox,
    /// #     request: tower_idempotency::inbox::InboxRequest,
    /// # ) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    ///
    /// let mut tx = inbox.pool().begin().await?;
    /// sqlx::query("INSERT INTO refunds (event) VALUES ($1)")
    ///     .bind(request.key().as_str())
    ///     .execute(&mut *tx)
    ///     .await?;
    /// let retention = Duration::from_secs(7 * 24 * 3600);
    /// if !inbox.complete_in_tx(&mut tx, request.key(), request.token(), retention).await? {
    ///     // Another worker holds the entry now: the refund rolls back with `tx`, and the error
    ///     // makes the worker fail the attempt rather than complete it.
    ///     return Err("lease lost before the effect committed".into());
    /// }
    /// tx.commit().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn complete_in_tx(
        &self,
        tx: &mut Transaction<'_, DB>,
        key: &StoreKey,
        token: &Token,
        retention: Duration,
    ) -> Result<bool, StoreError> {
        self.complete_on(tx, key, token, retention).await
    }

    /// Tells this process's workers that an entry is due at `at`, where the database does
    /// not tell every process itself.
    fn tell(&self, at: SystemTime) {
        if !self.sql.told_by_database {
            self.announcer.announce(at);
        }
    }

    /// Marks the key done and raises the watermark, on a connection in a transaction.
    async fn complete_on(
        &self,
        conn: &mut DB::Connection,
        key: &StoreKey,
        token: &Token,
        retention: Duration,
    ) -> Result<bool, StoreError> {
        let at = SystemTime::now();
        let now = epoch_ms(at);
        let until = now.saturating_add(millis(retention));
        let params = [
            Param::Text(key.as_str()),
            Param::Bytes(token.as_bytes()),
            Param::Int(until),
            Param::Int(epoch_us(at)),
        ];
        let rows = fetch::<DB>(conn, &self.sql.complete, &params, None).await?;
        let Some(row) = rows.first() else {
            return Ok(false);
        };
        let object = DB::text(row, 0).map_err(error::<DB>)?;
        let position = DB::bytes(row, 1).map_err(error::<DB>)?;
        if let (Some(object), Some(position)) = (object, position) {
            let params = [
                Param::Text(object),
                Param::Bytes(position),
                Param::Int(until),
                Param::Int(now),
            ];
            execute::<DB>(conn, &self.sql.raise_watermark, &params, None).await?;
        }
        Ok(true)
    }

    /// The state of a key an enqueue found there; `None` when no row holds it (any more).
    /// [`Enqueued::Stale`] with its object's watermark when `entry` is ordered and stale
    /// against the watermark (`now` as the enqueue's parameter).
    async fn stale_at(
        &self,
        conn: &mut DB::Connection,
        entry: &InboxEntry,
        now: &Param<'_>,
    ) -> Result<Option<Enqueued>, StoreError> {
        let Some(order) = &entry.order else {
            return Ok(None);
        };
        let position = order.position.to_bytes();
        let params = [
            Param::Text(order.object.as_str()),
            Param::Bytes(&position),
            *now,
            Param::Int(equal_stale(order)),
        ];
        let rows = fetch::<DB>(conn, &self.sql.stale_at, &params, None).await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let watermark = DB::bytes(row, 0).map_err(error::<DB>)?.unwrap_or_default();
        let watermark = <[u8; Position::LEN]>::try_from(watermark)
            .map_err(|_| corrupt("a watermark of another size"))?;
        Ok(Some(Enqueued::Stale(Position::from_bytes(watermark))))
    }

    async fn known(
        &self,
        conn: &mut DB::Connection,
        key: &StoreKey,
    ) -> Result<Option<KeyState>, StoreError> {
        let rows = fetch::<DB>(
            conn,
            &self.sql.read_state,
            &[Param::Text(key.as_str())],
            None,
        )
        .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let state = DB::text(row, 0).map_err(error::<DB>)?.unwrap_or_default();
        key_state(state).map(Some)
    }
}

impl<DB: Dialect> InboxStore for SqlInbox<DB> {
    async fn enqueue(&self, entry: InboxEntry) -> Result<Enqueued, StoreError> {
        let headers = encode_headers(&entry.headers);
        let (object, position, equal) = match &entry.order {
            Some(order) => (
                order.object.as_str(),
                order.position.to_bytes().to_vec(),
                equal_stale(order),
            ),
            None => ("", Vec::new(), 0),
        };
        for _ in 0..ENQUEUE_ATTEMPTS {
            let params = [
                Param::Text(entry.key.as_str()),
                Param::Bytes(&entry.body),
                Param::Bytes(&headers),
                Param::Text(object),
                Param::Bytes(&position),
                Param::Text(&entry.correlation_id),
                Param::Int(i64::from(entry.attempts)),
                Param::Int(epoch_ms(entry.next_attempt_at)),
                Param::Int(epoch_ms(entry.enqueued_at)),
                Param::Int(epoch_ms(SystemTime::now())),
                Param::Text(&entry.id),
                Param::Text(&entry.route),
                Param::Int(equal),
            ];
            let mut tx = self.begin().await?;
            let stored = !fetch::<DB>(&mut tx, &self.sql.enqueue, &params, None)
                .await?
                .is_empty();
            let known = match stored {
                true => None,
                false => match self.known(&mut tx, &entry.key).await? {
                    Some(state) => Some(Enqueued::Duplicate(state)),
                    None => self.stale_at(&mut tx, &entry, &params[9]).await?,
                },
            };
            tx.commit().await.map_err(error::<DB>)?;
            match (stored, known) {
                (true, _) => {
                    self.tell(entry.next_attempt_at);
                    return Ok(Enqueued::Queued);
                }
                (false, Some(answer)) => return Ok(answer),
                // The row it conflicted with is gone: claim again.
                (false, None) => {}
            }
        }
        Err(StoreError::with_source(
            StoreErrorKind::Other,
            "the key kept changing while it was being enqueued",
        ))
    }

    async fn take(&self, max: usize, lease: Duration) -> Result<Vec<Lease>, StoreError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let at = SystemTime::now();
        let now = epoch_ms(at);
        let token = Token::random();
        let worker = worker();
        let params = [
            Param::Int(i64::try_from(max).unwrap_or(i64::MAX)),
            Param::Int(now.saturating_add(millis(lease))),
            Param::Bytes(token.as_bytes()),
            Param::Int(now),
            Param::Int(epoch_us(at)),
            Param::Text(worker),
        ];
        let mut conn = acquire(&self.pool).await?;
        let mut attempt = 1;
        let rows = loop {
            // Two takes that read before either committed can each find a different entry of
            // one object its next (PostgreSQL's READ COMMITTED: the NOT EXISTS reads the
            // statement's snapshot); the second one's write then waits on the in-flight index
            // until the first commits and fails: it takes again, and sees the first's entry.
            match DB::fetch_all(&mut conn, &self.sql.take, &params, None).await {
                Err(sqlx::Error::Database(db)) if raced(&*db) && attempt < TAKE_ATTEMPTS => {
                    attempt += 1;
                }
                done => break done.map_err(error::<DB>)?,
            }
        };
        rows.iter()
            .map(|row| {
                Ok(Lease {
                    entry: entry::<DB>(row)?,
                    token,
                    stale: DB::flag(row, 12).map_err(error::<DB>)?,
                })
            })
            .collect()
    }

    async fn renew(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let until = epoch_ms(SystemTime::now()).saturating_add(millis(lease));
        let params = [
            Param::Text(key.as_str()),
            Param::Bytes(token.as_bytes()),
            Param::Int(until),
        ];
        let mut conn = acquire(&self.pool).await?;
        Ok(execute::<DB>(&mut conn, &self.sql.renew, &params, None).await? == 1)
    }

    /// On SQLite, which writes one transaction at a time, one transaction for all of them (one
    /// commit). On PostgreSQL each in a transaction of its own, as many at once as the pool has
    /// connections (a chunk at a time): one transaction of many statements would make them wait for each other's
    /// round trips, and more at once than the pool holds would only wait for a connection, up
    /// to the pool's acquire timeout. Every lease is attempted; the first error is returned.
    async fn complete(
        &self,
        leases: &[(StoreKey, Token)],
        retention: Duration,
    ) -> Result<Vec<bool>, StoreError> {
        if !DB::ONE_WRITER {
            let at_once = (self.pool.options().get_max_connections() as usize).max(1);
            let mut flags = Vec::with_capacity(leases.len());
            for some in leases.chunks(at_once) {
                let each = some.iter().map(|(key, token)| async move {
                    let mut tx = self.begin().await?;
                    let done = self.complete_on(&mut tx, key, token, retention).await?;
                    tx.commit().await.map_err(error::<DB>)?;
                    Ok(done)
                });
                flags.extend(join_all(each).await);
            }
            return flags.into_iter().collect();
        }
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let mut done = Vec::with_capacity(leases.len());
        let mut tx = self.begin().await?;
        for (key, token) in leases {
            done.push(self.complete_on(&mut tx, key, token, retention).await?);
        }
        tx.commit().await.map_err(error::<DB>)?;
        Ok(done)
    }

    async fn fail(
        &self,
        key: &StoreKey,
        token: &Token,
        failure: Failure,
    ) -> Result<bool, StoreError> {
        let (key, token) = (Param::Text(key.as_str()), Param::Bytes(token.as_bytes()));
        let now = SystemTime::now();
        let ended = Param::Int(epoch_us(now));
        let (Failure::RetryAt(_, why) | Failure::Dead(why)) = &failure;
        let kept = history::error_field(why);
        let kept = Param::Text(&kept);
        let mut conn = acquire(&self.pool).await?;
        // Told like an enqueue: a retry at its time, a dead letter now (its object's next).
        let (rows, at) = match &failure {
            Failure::RetryAt(at, error) => {
                let next = Param::Int(epoch_ms(*at));
                let params = [key, token, next, Param::Text(error), ended, kept];
                (
                    fetch::<DB>(&mut conn, &self.sql.retry, &params, None).await?,
                    *at,
                )
            }
            Failure::Dead(error) => {
                let params = [
                    key,
                    token,
                    Param::Text(error),
                    Param::Int(epoch_ms(now)),
                    ended,
                    kept,
                ];
                (
                    fetch::<DB>(&mut conn, &self.sql.bury, &params, None).await?,
                    now,
                )
            }
        };
        let settled = !rows.is_empty();
        if settled {
            self.tell(at);
        }
        Ok(settled)
    }

    async fn counts(&self) -> Result<InboxCounts, StoreError> {
        let now = SystemTime::now();
        let mut conn = acquire(&self.pool).await?;
        let params = [Param::Int(epoch_ms(now))];
        let rows = fetch::<DB>(&mut conn, &self.sql.counts, &params, None).await?;
        let row = rows
            .first()
            .ok_or_else(|| corrupt("counts returned no row"))?;
        let count = |column| -> Result<u64, StoreError> {
            let n = DB::int(row, column).map_err(error::<DB>)?.unwrap_or(0);
            Ok(u64::try_from(n).unwrap_or(0))
        };
        let oldest = DB::int(row, 3).map_err(error::<DB>)?.map(from_epoch_ms);
        Ok(InboxCounts {
            pending: count(0)?,
            in_flight: count(1)?,
            dead: count(2)?,
            oldest_age: oldest.map(|at| now.duration_since(at).unwrap_or_default()),
        })
    }

    /// On PostgreSQL, every process's enqueues and re-queues (`NOTIFY` on `<table>_wake`,
    /// relayed by one `LISTEN` connection of the pool while a worker waits); on SQLite, this
    /// process's.
    fn wakeups(&self) -> Wakeups {
        if !self.sql.told_by_database {
            return self.announcer.subscribe();
        }
        let (pool, channel) = (self.pool.clone(), self.sql.channel.clone());
        self.announcer.subscribe_relayed(move |announcer| {
            let heard = move |at: Option<&str>| {
                // A message's text is its entry's due time; none: messages may have been lost.
                let at = at
                    .and_then(|ms| ms.parse().ok())
                    .map_or(UNIX_EPOCH, from_epoch_ms);
                announcer.announce(at);
            };
            DB::listen(&pool, &channel, Box::new(heard))
        })
    }
}

/// Adds to the table of `sql` the [`ADDED_COLUMNS`] a table created before them lacks (where
/// the database has no `ADD COLUMN IF NOT EXISTS`, which the schema then holds). Another
/// process adding one at the same time is not an error: the column is there.
async fn add_missing_columns<DB: Dialect>(
    pool: &Pool<DB>,
    sql: &Statements,
) -> Result<(), StoreError> {
    let mut conn = acquire(pool).await?;
    let present = |rows: Vec<DB::Row>| -> Result<Vec<String>, StoreError> {
        rows.iter()
            .map(|row| {
                Ok(DB::text(row, 0)
                    .map_err(error::<DB>)?
                    .unwrap_or_default()
                    .to_owned())
            })
            .collect()
    };
    let columns = present(fetch::<DB>(&mut conn, &sql.columns, &[], None).await?)?;
    for (column, definition) in ADDED_COLUMNS {
        if columns.iter().any(|name| name == column) {
            continue;
        }
        let table = &sql.table;
        let add = format!("ALTER TABLE {table} ADD COLUMN {column} {definition}").into();
        if let Err(failed) = execute::<DB>(&mut conn, &add, &[], None).await {
            let columns = present(fetch::<DB>(&mut conn, &sql.columns, &[], None).await?)?;
            if !columns.iter().any(|name| name == column) {
                return Err(failed);
            }
        }
    }
    Ok(())
}

/// Whether a take failed on another take's write: the in-flight index (the other took an
/// entry of the same object first), or a deadlock between two takes that each waited on the
/// other's entries of two objects (PostgreSQL cancels one: `40P01`). Taken again, it sees the
/// other's entries.
fn raced(db: &dyn sqlx::error::DatabaseError) -> bool {
    db.is_unique_violation() || db.code().as_deref() == Some("40P01")
}

/// Where an inbox on `table` of `pool`'s database announces. PostgreSQL tells every process
/// (each inbox relays its own `LISTEN`); on SQLite, where only this process hears, every inbox
/// of the process on the same database (its file, however its path is spelled) and table
/// shares one, so that a route's and a worker's inboxes built apart still wake each other.
fn announcer<DB: Dialect>(pool: &Pool<DB>, table: &str) -> Announcer {
    match DB::place(pool) {
        Some(database) => Announcer::shared(format!("{database}\n{table}")),
        None => Announcer::new(),
    }
}

/// The text of every statement of an inbox, for one table.
#[derive(Debug)]
pub struct Statements {
    table: String,
    schema: String,
    migrate: Sql,
    /// $1 key, $2 body, $3 headers, $4 object (`''`: none), $5 position, $6 correlation id,
    /// $7 attempts, $8 next attempt, $9 enqueued at, $10 now, $11 delivery id, $12 route,
    /// $13 1 when equal positions are stale. A row when it stored the entry.
    enqueue: Sql,
    /// $1 key. The key's state.
    read_state: Sql,
    /// $1 object, $2 position, $3 now, $4 1 when equal positions are stale. The object's
    /// watermark when the position is stale against it.
    stale_at: Sql,
    /// $1 max, $2 lease end, $3 token, $4 now, $5 now in µs, $6 worker. The entries taken,
    /// then `stale`.
    take: Sql,
    /// $1 key, $2 token, $3 lease end.
    renew: Sql,
    /// $1 key, $2 token, $3 retention end, $4 now in µs. The entry's object and position when
    /// the token holds the entry, or already completed it (the done key keeps the token: the
    /// worker's completion after the handler's `complete_in_tx` is not a lost lease).
    complete: Sql,
    /// $1 object, $2 position, $3 retention end, $4 now.
    raise_watermark: Sql,
    /// $1 key, $2 token, $3 next attempt, $4 error, $5 now in µs, $6 the error as the
    /// attempt's line keeps it.
    retry: Sql,
    /// $1 key, $2 token, $3 error, $4 now, $5 now in µs, $6 the error as the attempt's line
    /// keeps it.
    bury: Sql,
    /// $1 limit. The dead entries, then `last_error`.
    dead_letters: Sql,
    /// $1 key, $2 now. A row when it re-queued.
    requeue: Sql,
    /// $1 now. Pending, in flight, dead, the oldest enqueue time.
    counts: Sql,
    /// $1 the most rows to delete, $2 now.
    purge: Sql,
    /// $1 the most rows to delete, $2 now.
    purge_watermarks: Sql,
    /// $1 key. The row as [`INFO_COLUMNS`].
    find: Sql,
    /// $1 after this key, $2 now, $3 limit, then the filter's $4 to $9 (see [`matching`]), $10
    /// `1` to read bodies and headers. Rows as [`INFO_COLUMNS`] (body and headers NULL unless
    /// read), by key.
    list: Sql,
    /// $1 after this key, $2 now, $3 limit, then the filter's $4 to $9. The keys re-queued.
    requeue_matching: Sql,
    /// $1 key, $2 retention end. A row when it discarded.
    discard: Sql,
    /// $1 now.
    pause: Sql,
    /// $1 now. A row when it resumed.
    resume: Sql,
    /// Whether paused (a count).
    is_paused: Sql,
    /// The names of the table's columns (SQLite), for `migrate`.
    columns: Sql,
    /// The channel the enqueue and the re-queue tell other processes on (PostgreSQL).
    channel: String,
    /// Whether the database tells (PostgreSQL `NOTIFY`); else the process tells its own.
    told_by_database: bool,
}

impl Statements {
    fn new<DB: Dialect>(table: &str) -> Self {
        let schema = schema(table, DB::BYTES, DB::ADD_COLUMN_IF_NOT_EXISTS);
        let appended = |line: &str| {
            let kept = KEPT_ATTEMPTS.to_string();
            fill(QUERY_APPENDED, &[("line", line), ("kept_attempts", &kept)])
        };
        let ended = |outcome, at, error| {
            fill(
                QUERY_ENDED_LINE,
                &[("outcome", outcome), ("at", at), ("error", error)],
            )
        };
        let fragments = [
            ("held", file(include_str!("queries/inbox/held.sql"))),
            ("due_at", file(include_str!("queries/inbox/due_at.sql"))),
            ("matching", file(include_str!("queries/inbox/matching.sql"))),
            (
                "history_failed",
                file(include_str!("queries/inbox/history_failed.sql")),
            ),
            // The attempt held ends at $5 as failed, with the error $6 (a retry, a burial);
            // at $4 as succeeded (a completion); its lease lost (a take over it).
            ("appended_failed", appended(&ended("f", "$5", "$6"))),
            ("appended_succeeded", appended(&ended("s", "$4", "''"))),
            (
                "appended_lost",
                appended(&file(include_str!("queries/inbox/lost_line.sql"))),
            ),
        ];
        let mut names = vec![
            ("table", table),
            ("entry_columns", ENTRY_COLUMNS),
            ("info_columns", INFO_COLUMNS),
            ("info_rest", INFO_REST),
        ];
        names.extend(fragments.iter().map(|(name, text)| (*name, text.as_str())));
        let sql = |text: &str| Sql::from(render::<DB>(text, &names));
        let channel = wake_channel(table);
        // What arrives is told to the other processes by the database where it can: an
        // enqueue, a retry at its time, a dead letter now (its object's next entry may go), a
        // re-queue, a resume (like an enqueue due now: every idle worker takes again).
        let told = |text: &str| {
            let statement = render::<DB>(text, &names);
            Sql::from(DB::notify(&statement, &channel).unwrap_or(statement))
        };
        Statements {
            table: table.to_owned(),
            migrate: statements::migrate::<DB>(table, &schema).into(),
            schema,
            enqueue: told(include_str!("queries/inbox/enqueue.sql")),
            read_state: sql(include_str!("queries/inbox/read_state.sql")),
            stale_at: sql(include_str!("queries/inbox/stale_at.sql")),
            take: sql(include_str!("queries/inbox/take.sql")),
            renew: sql(include_str!("queries/inbox/renew.sql")),
            complete: sql(include_str!("queries/inbox/complete.sql")),
            raise_watermark: sql(include_str!("queries/inbox/raise_watermark.sql")),
            retry: told(include_str!("queries/inbox/retry.sql")),
            bury: told(include_str!("queries/inbox/bury.sql")),
            dead_letters: sql(include_str!("queries/inbox/dead_letters.sql")),
            requeue: told(include_str!("queries/inbox/requeue.sql")),
            counts: sql(include_str!("queries/inbox/counts.sql")),
            purge: sql(include_str!("queries/inbox/purge.sql")),
            purge_watermarks: sql(include_str!("queries/inbox/purge_watermarks.sql")),
            find: sql(include_str!("queries/inbox/find.sql")),
            list: sql(include_str!("queries/inbox/list.sql")),
            requeue_matching: told(include_str!("queries/inbox/requeue_matching.sql")),
            discard: sql(include_str!("queries/inbox/discard.sql")),
            pause: sql(include_str!("queries/inbox/pause.sql")),
            resume: told(include_str!("queries/inbox/resume.sql")),
            is_paused: sql(include_str!("queries/inbox/is_paused.sql")),
            columns: sql(include_str!("queries/inbox/columns.sql")),
            told_by_database: DB::NOTIFIES,
            channel,
        }
    }
}

/// The stored history with the SQL text `{line}` appended (see the file).
const QUERY_APPENDED: &str = include_str!("queries/inbox/appended.sql");

/// The line of an attempt that ended (see the file).
const QUERY_ENDED_LINE: &str = include_str!("queries/inbox/ended_line.sql");

/// The channel of `table`'s wake-ups: `<table>_wake`, or, past PostgreSQL's 63 bytes for a
/// name (a schema-qualified table may have 81), its first 40 characters, a hash of the whole
/// name (FNV-1a, the same in every process and build) and `_wake`.
fn wake_channel(table: &str) -> String {
    const MAX_NAME: usize = 63;
    let channel = format!("{table}_wake");
    if channel.len() <= MAX_NAME {
        return channel;
    }
    let hash = table.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    // A validated table name is ASCII: any byte index is a character boundary.
    format!("{}_{hash:016x}_wake", &table[..40])
}

/// The tables, with `bytes` the dialect's column type of bytes, and the `ALTER TABLE`s of
/// the [`ADDED_COLUMNS`] where the dialect takes `ADD COLUMN IF NOT EXISTS` (`alter`). Times
/// are `bigint` milliseconds (an integer column on SQLite too), but an attempt's start
/// (microseconds, as its history keeps it).
fn schema(table: &str, bytes: &str, alter: bool) -> String {
    // The take's order, as the take writes it: the planners match the expression.
    let due_at = file(include_str!("queries/inbox/due_at.sql"));
    let index = bare_name(table);
    // An index lives in its table's schema: a dropped one is named there.
    let schema_prefix = &table[..table.len() - index.len()];
    let added: String = match alter {
        true => ADDED_COLUMNS
            .iter()
            .map(|(column, definition)| {
                format!("ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {definition};\n")
            })
            .collect(),
        false => String::new(),
    };
    let names = [
        ("table", table),
        ("index", index),
        ("schema_prefix", schema_prefix),
        ("bytes", bytes),
        ("due_at", &due_at),
        ("added", &added),
    ];
    substitute(ddl(include_str!("queries/inbox/schema.sql")), &names)
}

/// The entry in the first nine columns of `row` (as [`ENTRY_COLUMNS`]).
fn entry<DB: Dialect>(row: &DB::Row) -> Result<InboxEntry, StoreError> {
    let text = |column| DB::text(row, column).map_err(error::<DB>);
    let bytes = |column| DB::bytes(row, column).map_err(error::<DB>);
    let int = |column| DB::int(row, column).map_err(error::<DB>);
    let key = text(0)?
        .and_then(|key| StoreKey::from_stored(key.as_bytes()))
        .ok_or_else(|| corrupt("an inbox row without a valid key"))?;
    let order = match (text(3)?, bytes(4)?) {
        (Some(object), Some(position)) => Some(EntryOrder {
            object: ObjectKey::from_stored(object.as_bytes())
                .ok_or_else(|| corrupt("an inbox row with an invalid object"))?,
            position: Position::from_bytes(
                position
                    .try_into()
                    .map_err(|_| corrupt("a position of the wrong length"))?,
            ),
            equal: match int(11)? {
                Some(1) => EqualPositions::Stale,
                _ => EqualPositions::Process,
            },
        }),
        _ => None,
    };
    Ok(InboxEntry {
        key,
        body: Bytes::copy_from_slice(bytes(1)?.unwrap_or_default()),
        headers: decode_headers(bytes(2)?.unwrap_or_default())?,
        order,
        correlation_id: text(5)?.unwrap_or_default().to_owned(),
        id: text(9)?.unwrap_or_default().to_owned(),
        route: text(10)?.unwrap_or_default().to_owned(),
        attempts: u32::try_from(int(6)?.unwrap_or(0)).unwrap_or(u32::MAX),
        next_attempt_at: from_epoch_ms(int(7)?.unwrap_or(0)),
        enqueued_at: from_epoch_ms(int(8)?.unwrap_or(0)),
    })
}

/// This process's worker id as an attempt's line names it.
fn worker() -> &'static str {
    static WORKER: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| history::worker_field(worker_id()));
    &WORKER
}

fn key_state(state: &str) -> Result<KeyState, StoreError> {
    Ok(match state {
        "queued" => KeyState::Queued,
        "running" => KeyState::Running,
        "dead" => KeyState::Dead,
        "done" => KeyState::Done,
        _ => return Err(corrupt("an inbox row in an unknown state")),
    })
}

/// The `equal_stale` column of an entry ordered by `order`.
fn equal_stale(order: &EntryOrder) -> i64 {
    i64::from(order.equal == EqualPositions::Stale)
}

fn epoch_ms(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn epoch_us(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

fn from_epoch_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn corrupt(why: &'static str) -> StoreError {
    StoreError::with_source(StoreErrorKind::Corrupt, why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_table_is_inbox_entries() {
        assert_eq!(DEFAULT_INBOX_TABLE, "inbox_entries");
    }

    #[test]
    fn times_round_trip_in_milliseconds() {
        let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(from_epoch_ms(epoch_ms(at)), at);
        assert_eq!(from_epoch_ms(-5), UNIX_EPOCH);
    }

    #[test]
    fn wake_channels_fit_postgresql_names() {
        assert_eq!(wake_channel("app.inbox"), "app.inbox_wake");
        let schema = "s".repeat(40);
        let (a, b) = (
            format!("{schema}.{}", "a".repeat(40)),
            format!("{schema}.{}", "b".repeat(40)),
        );
        let (wake_a, wake_b) = (wake_channel(&a), wake_channel(&b));
        assert!(
            wake_a.len() <= 63 && wake_b.len() <= 63,
            "{wake_a} {wake_b}"
        );
        assert_ne!(
            wake_a, wake_b,
            "tables that share their first 40 characters"
        );
        assert_eq!(wake_a, wake_channel(&a));
    }

    /// The take of `table` on `DB`, with `locks` for the dialect's row locks.
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    fn take<DB: Dialect>(table: &str, locks: &str) -> String {
        let take = Statements::new::<DB>(table).take.to_string();
        match DB::PURGE_LOCKS {
            "" => take,
            own => take.replace(own, locks),
        }
    }

    /// The counts of `table`, the same in every dialect.
    #[cfg(feature = "sqlite")]
    fn counts(table: &str) -> String {
        Statements::new::<sqlx::Sqlite>(table).counts.to_string()
    }

    /// The line breaks inside the history's string literals survive the templates' comments.
    #[cfg(feature = "sqlite")]
    #[test]
    fn the_history_keeps_its_line_breaks() {
        let complete = Statements::new::<sqlx::Sqlite>("t").complete.to_string();
        assert!(
            complete.contains("length(replace(history, '\n', ''))"),
            "{complete}"
        );
        assert!(
            complete.contains("ELSE history || '\n' || CAST(attempts AS text)"),
            "{complete}"
        );
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn the_take_locks_only_where_asked() {
        let take = take::<sqlx::Postgres>;
        assert!(
            take("t", " FOR UPDATE SKIP LOCKED").contains("LIMIT $1 FOR UPDATE SKIP LOCKED\n)")
        );
        assert!(take("t", "").contains("LIMIT $1\n)"));
    }

    /// The take's choice is made once: a semi-join on a `LIMIT ... SKIP LOCKED` subquery may
    /// run it again per row and lease more than asked.
    #[cfg(feature = "postgres")]
    #[test]
    fn the_take_chooses_once() {
        let take = take::<sqlx::Postgres>("t", " FOR UPDATE SKIP LOCKED");
        assert!(
            take.starts_with("WITH chosen AS MATERIALIZED (\n"),
            "{take}"
        );
        assert!(
            take.contains("WHERE key IN (SELECT key FROM chosen)\n"),
            "{take}"
        );
    }

    /// SQLite reads the take through `<table>_take_idx` in due order: no temporary b-tree for
    /// the order, whose cost would grow with the backlog (PostgreSQL's plan is checked against
    /// a real server in tests/inbox/sql.rs); and the counts through the partial indexes.
    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_takes_and_counts_through_the_indexes() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async {
            let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
            sqlx::raw_sql(sqlx::AssertSqlSafe(schema("t", "blob", false)))
                .execute(&pool)
                .await
                .unwrap();
            let explain = format!("EXPLAIN QUERY PLAN {}", take::<sqlx::Sqlite>("t", ""));
            let rows: Vec<(i64, i64, i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(explain))
                .bind(32_i64)
                .bind(0_i64)
                .bind(vec![0_u8; 16])
                .bind(0_i64)
                .bind(0_i64)
                .bind("w")
                .fetch_all(&pool)
                .await
                .unwrap();
            let plan: Vec<&str> = rows.iter().map(|row| row.3.as_str()).collect();
            assert!(
                plan.iter()
                    .any(|step| step.contains("USING INDEX t_take_idx")),
                "{plan:?}"
            );
            assert!(
                !plan.iter().any(|step| step.contains("TEMP B-TREE")),
                "{plan:?}"
            );

            // The counts read the live and the dead rows' indexes, never the whole table.
            let explain = format!("EXPLAIN QUERY PLAN {}", counts("t"));
            let rows: Vec<(i64, i64, i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(explain))
                .bind(0_i64)
                .fetch_all(&pool)
                .await
                .unwrap();
            let plan: Vec<&str> = rows.iter().map(|row| row.3.as_str()).collect();
            assert!(plan.contains(&"SCAN t USING INDEX t_take_idx"), "{plan:?}");
            assert!(
                plan.iter().any(|step| step.contains("t_dead_idx")),
                "{plan:?}"
            );
            assert!(!plan.contains(&"SCAN t"), "{plan:?}");
        });
    }
}
