//! [`SqlInbox`]: the inbox in an SQL table, on [`sqlx`]: `PostgresInbox` (feature `postgres`)
//! and `SqliteInbox` (feature `sqlite`), one implementation over the record store's
//! [`Dialect`].

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::future::join_all;
use sqlx::{Pool, Transaction};

use crate::inbox::admin::{
    EntryInfo, Filter, InboxAdmin, KEPT_ATTEMPTS, Page, Requeued, history, worker_id,
};
use crate::inbox::codec::{decode_headers, encode_headers};
use crate::inbox::entry::{EntryOrder, InboxEntry, Lease};
use crate::inbox::store::{DeadLetter, Enqueued, Failure, InboxCounts, InboxStore, KeyState};
use crate::inbox::wake::{Announcer, Wakeups};
use crate::order::Position;
use crate::sql::query::Param;
use crate::sql::statements::Sql;
use crate::sql::{
    DEFAULT_PURGE_BATCH, Dialect, InvalidTable, bare_name, millis, purge_in_batches,
    spawn_purge_every, store_error, validate_table,
};
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
    next_at, enqueued_at, id, route";

/// The columns of what an operator sees of an entry, in the order `info` reads them.
const INFO_COLUMNS: &str = "key, body, headers, object, position, correlation_id, attempts, \
    next_at, enqueued_at, id, route, state, lease_until, expires_at, last_error, history, \
    started_us, worker";

/// The columns added to the table since it was first released, with their definitions: what
/// `migrate` adds to a table created before.
const ADDED_COLUMNS: [(&str, &str); 5] = [
    ("id", "text NOT NULL DEFAULT ''"),
    ("route", "text NOT NULL DEFAULT ''"),
    ("history", "text NOT NULL DEFAULT ''"),
    ("started_us", "bigint"),
    ("worker", "text"),
];

/// An [`InboxStore`] in an SQL table: `PostgresInbox` (feature `postgres`) and `SqliteInbox`
/// (feature `sqlite`).
///
/// Cheap to clone (the pool and the statements are shared). Build it over a pool with
/// [`new`](Self::new), create the tables with [`migrate`](Self::migrate), and delete done keys
/// and watermarks past their retention with [`purge_expired`](Self::purge_expired). A handler
/// whose effect lives in the same database completes its entry in its own transaction with
/// [`complete_in_tx`](Self::complete_in_tx).
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
/// [`migrate`](Self::migrate) adds the columns a table made by an earlier version lacks.
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
///   its object's watermark is at or past its position. A unique index on the object of the
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
#[derive(Debug)]
pub struct SqlInbox<DB: Dialect> {
    pool: Pool<DB>,
    sql: Arc<Statements>,
    announcer: Announcer,
}

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

impl<DB: Dialect> Clone for SqlInbox<DB> {
    fn clone(&self) -> Self {
        SqlInbox {
            pool: self.pool.clone(),
            sql: self.sql.clone(),
            announcer: self.announcer.clone(),
        }
    }
}

impl<DB: Dialect> SqlInbox<DB> {
    /// An inbox over `pool`, in the table `inbox_entries` (and `inbox_entries_objects`,
    /// `inbox_entries_paused`).
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn run(pool: sqlx::PgPool) {
    /// let inbox = tower_idempotency::inbox::PostgresInbox::new(pool);
    /// assert_eq!(inbox.table(), "inbox_entries");
    /// # }
    /// ```
    pub fn new(pool: Pool<DB>) -> Self {
        let announcer = announcer(&pool, DEFAULT_INBOX_TABLE);
        SqlInbox {
            pool,
            sql: Arc::new(Statements::new::<DB>(DEFAULT_INBOX_TABLE)),
            announcer,
        }
    }

    /// Uses the table `table` (and `<table>_objects`); on PostgreSQL it may be
    /// schema-qualified. An [`InvalidTable`] error when it is not an SQL identifier of at most
    /// 40 characters.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn run(pool: sqlx::PgPool) {
    /// let inbox = tower_idempotency::inbox::PostgresInbox::new(pool)
    ///     .with_table("app.inbox")
    ///     .unwrap();
    /// assert_eq!(inbox.table(), "app.inbox");
    /// # }
    /// ```
    pub fn with_table(mut self, table: &str) -> Result<Self, InvalidTable> {
        validate_table(table, DB::QUALIFIED_TABLES)?;
        self.sql = Arc::new(Statements::new::<DB>(table));
        // Another table's wake-ups are not this one's.
        self.announcer = announcer(&self.pool, table);
        Ok(self)
    }

    /// The table name.
    ///
    /// ```no_run
    /// # #[cfg(feature = "sqlite")]
    /// # async fn run(pool: sqlx::SqlitePool) {
    /// let inbox = tower_idempotency::inbox::SqliteInbox::new(pool);
    /// assert_eq!(inbox.table(), "inbox_entries");
    /// # }
    /// ```
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// The `CREATE TABLE IF NOT EXISTS` and `CREATE INDEX IF NOT EXISTS` statements of the
    /// inbox's tables, for your own migration tool; on PostgreSQL also the `ALTER TABLE .. ADD
    /// COLUMN IF NOT EXISTS` of the columns added since the table was first released (SQLite
    /// has no such statement: [`migrate`](Self::migrate) adds them there).
    ///
    /// ```no_run
    /// # #[cfg(feature = "sqlite")]
    /// # async fn run(pool: sqlx::SqlitePool) {
    /// let inbox = tower_idempotency::inbox::SqliteInbox::new(pool);
    /// assert!(inbox.schema().starts_with("CREATE TABLE IF NOT EXISTS inbox_entries"));
    /// # }
    /// ```
    pub fn schema(&self) -> &str {
        &self.sql.schema
    }

    /// The pool.
    ///
    /// ```no_run
    /// # #[cfg(feature = "sqlite")]
    /// # async fn run(inbox: tower_idempotency::inbox::SqliteInbox) {
    /// let tx = inbox.pool().begin().await.unwrap();
    /// # drop(tx);
    /// # }
    /// ```
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    /// Creates the tables and their indexes if they do not exist yet ([`schema`](Self::schema)),
    /// and adds to a table made by an earlier version the columns it lacks. Idempotent; on
    /// PostgreSQL it runs as one transaction under an advisory lock, so instances starting
    /// together do not trip over each other.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn run(pool: sqlx::PgPool) -> Result<(), tower_idempotency::store::StoreError> {
    /// let inbox = tower_idempotency::inbox::PostgresInbox::new(pool);
    /// inbox.migrate().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn migrate(&self) -> Result<(), StoreError> {
        DB::execute_script(&self.pool, &self.sql.migrate)
            .await
            .map_err(error::<DB>)?;
        if !DB::ADD_COLUMN_IF_NOT_EXISTS {
            self.add_missing_columns().await?;
        }
        Ok(())
    }

    /// Adds the [`ADDED_COLUMNS`] a table created before them lacks (where the database has
    /// no `ADD COLUMN IF NOT EXISTS`, which the schema then holds). Another process adding one
    /// at the same time is not an error: the column is there.
    async fn add_missing_columns(&self) -> Result<(), StoreError> {
        let mut conn = self.pool.acquire().await.map_err(error::<DB>)?;
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
        let columns = present(fetch::<DB>(&mut conn, &self.sql.columns, &[]).await?)?;
        for (column, definition) in ADDED_COLUMNS {
            if columns.iter().any(|name| name == column) {
                continue;
            }
            let table = &self.sql.table;
            let add = format!("ALTER TABLE {table} ADD COLUMN {column} {definition}").into();
            if let Err(failed) = execute::<DB>(&mut conn, &add, &[]).await {
                let columns = present(fetch::<DB>(&mut conn, &self.sql.columns, &[]).await?)?;
                if !columns.iter().any(|name| name == column) {
                    return Err(failed);
                }
            }
        }
        Ok(())
    }

    /// Deletes the done keys and the objects' watermarks past their retention, at most
    /// `batch_size` rows per statement, until a statement deletes fewer; returns how many
    /// rows. Entries (queued, running, dead) are never deleted. Run it from a scheduled job
    /// (or [`spawn_purge`](Self::spawn_purge)).
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn run(inbox: tower_idempotency::inbox::PostgresInbox) {
    /// let deleted = inbox.purge_expired(1000).await.unwrap();
    /// println!("{deleted} done keys purged");
    /// # }
    /// ```
    pub async fn purge_expired(&self, batch_size: u32) -> Result<u64, StoreError> {
        let mut deleted = 0;
        for statement in [&self.sql.purge, &self.sql.purge_watermarks] {
            deleted += purge_in_batches(batch_size, |limit| async move {
                let params = [Param::Int(limit), Param::Int(epoch_ms(SystemTime::now()))];
                let mut conn = self.pool.acquire().await.map_err(error::<DB>)?;
                execute::<DB>(&mut conn, statement, &params).await
            })
            .await?;
        }
        Ok(deleted)
    }

    /// Spawns a Tokio task that runs [`purge_expired`](Self::purge_expired) (in batches of
    /// [`DEFAULT_PURGE_BATCH`]) every `every`, the first time
    /// right away, logging its outcome with `tracing`: the same schedule as
    /// [`SqlStore::spawn_purge`](crate::sql::SqlStore::spawn_purge). Abort the returned
    /// handle to stop it; it also ends with the runtime.
    ///
    /// ```no_run
    /// # #[cfg(feature = "sqlite")]
    /// # async fn run(inbox: tower_idempotency::inbox::SqliteInbox) {
    /// let purging = inbox.spawn_purge(std::time::Duration::from_secs(300));
    /// # purging.abort();
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// When called outside a Tokio runtime.
    pub fn spawn_purge(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let inbox = self.clone();
        spawn_purge_every(every, DB::BACKEND, "inbox keys", move || {
            let inbox = inbox.clone();
            async move { inbox.purge_expired(DEFAULT_PURGE_BATCH).await }
        })
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

    async fn begin(&self) -> Result<Transaction<'static, DB>, StoreError> {
        self.pool.begin().await.map_err(error::<DB>)
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
        let rows = fetch::<DB>(conn, &self.sql.complete, &params).await?;
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
            execute::<DB>(conn, &self.sql.raise_watermark, &params).await?;
        }
        Ok(true)
    }

    /// The state of a key an enqueue found there; `None` when no row holds it (any more).
    /// [`Enqueued::Stale`] with its object's watermark when `entry` is ordered and the
    /// watermark is at or past its position (`now` as the enqueue's parameter).
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
        ];
        let rows = fetch::<DB>(conn, &self.sql.stale_at, &params).await?;
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
        let rows = fetch::<DB>(conn, &self.sql.read_state, &[Param::Text(key.as_str())]).await?;
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
        let (object, position) = match &entry.order {
            Some(order) => (order.object.as_str(), order.position.to_bytes().to_vec()),
            None => ("", Vec::new()),
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
            ];
            let mut tx = self.begin().await?;
            let stored = !fetch::<DB>(&mut tx, &self.sql.enqueue, &params)
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
        let mut conn = self.pool.acquire().await.map_err(error::<DB>)?;
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
                    stale: DB::flag(row, 11).map_err(error::<DB>)?,
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
        let mut conn = self.pool.acquire().await.map_err(error::<DB>)?;
        Ok(execute::<DB>(&mut conn, &self.sql.renew, &params).await? == 1)
    }

    /// On SQLite, which writes one transaction at a time, one transaction for all of them (one
    /// commit). On PostgreSQL each in a transaction of its own, all at once over the pool: one
    /// transaction of many statements would make them wait for each other's round trips.
    async fn complete(
        &self,
        leases: &[(StoreKey, Token)],
        retention: Duration,
    ) -> Result<Vec<bool>, StoreError> {
        if !DB::ONE_WRITER {
            let each = leases.iter().map(|(key, token)| async move {
                let mut tx = self.begin().await?;
                let done = self.complete_on(&mut tx, key, token, retention).await?;
                tx.commit().await.map_err(error::<DB>)?;
                Ok(done)
            });
            return join_all(each).await.into_iter().collect();
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
        let mut conn = self.pool.acquire().await.map_err(error::<DB>)?;
        // Told like an enqueue: a retry at its time, a dead letter now (its object's next).
        let (rows, at) = match &failure {
            Failure::RetryAt(at, error) => {
                let next = Param::Int(epoch_ms(*at));
                let params = [key, token, next, Param::Text(error), ended, kept];
                (fetch::<DB>(&mut conn, &self.sql.retry, &params).await?, *at)
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
                (fetch::<DB>(&mut conn, &self.sql.bury, &params).await?, now)
            }
        };
        let settled = !rows.is_empty();
        if settled {
            self.tell(at);
        }
        Ok(settled)
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        let limit = Param::Int(i64::try_from(limit).unwrap_or(i64::MAX));
        let mut conn = self.pool.acquire().await.map_err(error::<DB>)?;
        let rows = fetch::<DB>(&mut conn, &self.sql.dead_letters, &[limit]).await?;
        rows.iter()
            .map(|row| {
                let last_error = DB::text(row, 11).map_err(error::<DB>)?;
                Ok(DeadLetter {
                    entry: entry::<DB>(row)?,
                    last_error: last_error.unwrap_or_default().to_owned(),
                })
            })
            .collect()
    }

    async fn requeue(&self, key: &StoreKey) -> Result<bool, StoreError> {
        let params = [
            Param::Text(key.as_str()),
            Param::Int(epoch_ms(SystemTime::now())),
        ];
        let mut conn = self.pool.acquire().await.map_err(error::<DB>)?;
        let requeued = !fetch::<DB>(&mut conn, &self.sql.requeue, &params)
            .await?
            .is_empty();
        if requeued {
            self.tell(SystemTime::now());
        }
        Ok(requeued)
    }

    async fn counts(&self) -> Result<InboxCounts, StoreError> {
        let now = SystemTime::now();
        let mut conn = self.pool.acquire().await.map_err(error::<DB>)?;
        let params = [Param::Int(epoch_ms(now))];
        let rows = fetch::<DB>(&mut conn, &self.sql.counts, &params).await?;
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

/// Listing and re-queueing read by key, with the filter's conditions in the statement (an
/// entry's error is checked again on what was read: a page may hold fewer than asked). The
/// bulk re-queue is one statement. Pausing is a row of `<table>_paused`, which every take
/// reads in its statement; the resume is told like an enqueue.
impl<DB: Dialect> InboxAdmin for SqlInbox<DB> {
    async fn find(&self, key: &StoreKey) -> Result<Option<EntryInfo>, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(error::<DB>)?;
        let rows = fetch::<DB>(&mut conn, &self.sql.find, &[Param::Text(key.as_str())]).await?;
        let now = epoch_ms(SystemTime::now());
        rows.first().map_or(Ok(None), |row| info::<DB>(row, now))
    }

    async fn list(
        &self,
        filter: &Filter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let after = after(cursor)?;
        let object = filter.object.as_ref().map(ObjectKey::as_str);
        let state = filter.state.map(state_name);
        let params = filter_params(
            filter,
            after,
            epoch_ms(SystemTime::now()),
            limit,
            state,
            object,
        );
        let mut conn = self.pool.acquire().await.map_err(error::<DB>)?;
        let rows = fetch::<DB>(&mut conn, &self.sql.list, &params).await?;
        let now = epoch_ms(SystemTime::now());
        let mut entries = Vec::with_capacity(rows.len());
        for row in &rows {
            if let Some(info) = info::<DB>(row, now)?.filter(|info| filter.matches(info)) {
                entries.push(info);
            }
        }
        // A full page read: the next one starts after its last row, whatever matched of it.
        let next = match (rows.len() == limit, rows.last()) {
            (true, Some(last)) => Some(row_key::<DB>(last)?),
            _ => None,
        };
        Ok(Page::new(entries, next))
    }

    async fn requeue_matching(
        &self,
        filter: &Filter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Requeued, StoreError> {
        let after = after(cursor)?;
        let object = filter.object.as_ref().map(ObjectKey::as_str);
        let now = SystemTime::now();
        let dead = Some(state_name(KeyState::Dead));
        let params = filter_params(filter, after, epoch_ms(now), limit, dead, object);
        let mut conn = self.pool.acquire().await.map_err(error::<DB>)?;
        let rows = fetch::<DB>(&mut conn, &self.sql.requeue_matching, &params).await?;
        drop(conn);
        let keys = rows
            .iter()
            .map(|row| row_key::<DB>(row))
            .collect::<Result<Vec<_>, _>>()?;
        if !keys.is_empty() {
            self.tell(now);
        }
        // Fewer than the limit: no matching dead letter is left after this page (but those
        // another re-queue held, locked, which it re-queues).
        let next = match keys.len() == limit {
            true => keys.into_iter().max(),
            false => None,
        };
        Ok(Requeued {
            requeued: u64::try_from(rows.len()).unwrap_or(u64::MAX),
            next,
        })
    }

    async fn discard(&self, key: &StoreKey, retention: Duration) -> Result<bool, StoreError> {
        let until = epoch_ms(SystemTime::now()).saturating_add(millis(retention));
        let params = [Param::Text(key.as_str()), Param::Int(until)];
        let mut conn = self.pool.acquire().await.map_err(error::<DB>)?;
        Ok(!fetch::<DB>(&mut conn, &self.sql.discard, &params)
            .await?
            .is_empty())
    }

    async fn pause(&self) -> Result<(), StoreError> {
        let now = Param::Int(epoch_ms(SystemTime::now()));
        let mut conn = self.pool.acquire().await.map_err(error::<DB>)?;
        execute::<DB>(&mut conn, &self.sql.pause, &[now]).await?;
        Ok(())
    }

    async fn resume(&self) -> Result<(), StoreError> {
        let now = SystemTime::now();
        let mut conn = self.pool.acquire().await.map_err(error::<DB>)?;
        let resumed = !fetch::<DB>(&mut conn, &self.sql.resume, &[Param::Int(epoch_ms(now))])
            .await?
            .is_empty();
        if resumed {
            self.tell(now);
        }
        Ok(())
    }

    async fn is_paused(&self) -> Result<bool, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(error::<DB>)?;
        let rows = fetch::<DB>(&mut conn, &self.sql.is_paused, &[]).await?;
        let paused = rows.first().map(|row| DB::int(row, 0)).transpose();
        Ok(paused.map_err(error::<DB>)?.flatten().unwrap_or(0) > 0)
    }
}

/// The key a listing starts after: the cursor's (a store key as printed), or none.
fn after(cursor: Option<&str>) -> Result<&str, StoreError> {
    match cursor {
        None => Ok(""),
        Some(cursor) => match StoreKey::parse(cursor) {
            Some(_) => Ok(cursor),
            None => Err(StoreError::with_source(
                StoreErrorKind::Other,
                "a listing's cursor that is not a store key",
            )),
        },
    }
}

/// The parameters of [`Statements::list`] and [`Statements::requeue_matching`].
fn filter_params<'a>(
    filter: &'a Filter,
    after: &'a str,
    now: i64,
    limit: usize,
    state: Option<&'a str>,
    object: Option<&'a str>,
) -> [Param<'a>; 9] {
    [
        Param::Text(after),
        Param::Int(now),
        Param::Int(i64::try_from(limit).unwrap_or(i64::MAX)),
        Param::MaybeText(state),
        Param::MaybeText(filter.id_prefix.as_deref()),
        Param::MaybeText(filter.route.as_deref()),
        Param::MaybeText(object),
        Param::MaybeText(filter.correlation_id.as_deref()),
        Param::MaybeText(filter.error_contains.as_deref()),
    ]
}

/// The key in the first column of `row`, as printed.
fn row_key<DB: Dialect>(row: &DB::Row) -> Result<String, StoreError> {
    let key = DB::text(row, 0).map_err(error::<DB>)?;
    Ok(key.unwrap_or_default().to_owned())
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
struct Statements {
    table: String,
    schema: String,
    migrate: Sql,
    /// $1 key, $2 body, $3 headers, $4 object (`''`: none), $5 position, $6 correlation id,
    /// $7 attempts, $8 next attempt, $9 enqueued at, $10 now, $11 delivery id, $12 route. A
    /// row when it stored the entry.
    enqueue: Sql,
    /// $1 key. The key's state.
    read_state: Sql,
    /// $1 object, $2 position, $3 now. The object's watermark when it is at or past the
    /// position.
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
    /// $1 after this key, $2 now, $3 limit, then the filter's $4 to $9 (see [`matching`]).
    /// Rows as [`INFO_COLUMNS`], by key.
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
        let held = "key = $1 AND state = 'running' AND lease_token = $2";
        // The attempt held ends at $5 as failed, with the error $6.
        let failed = format!(
            "history = CASE WHEN started_us IS NOT NULL THEN {} ELSE history END",
            appended::<DB>(&ended_line::<DB>('f', "$5", "$6"))
        );
        let channel = wake_channel(table);
        // What arrives is told to the other processes by the database where it can.
        let told = |statement: String| DB::notify(&statement, &channel).unwrap_or(statement);
        Statements {
            table: table.to_owned(),
            migrate: DB::migrate(table, &schema).into(),
            schema,
            enqueue: told(enqueue(table)).into(),
            read_state: format!("SELECT state FROM {table} WHERE key = $1").into(),
            stale_at: format!(
                "SELECT watermark FROM {table}_objects
WHERE object = $1 AND watermark >= $2 AND expires_at > $3"
            )
            .into(),
            take: take::<DB>(table, DB::PURGE_LOCKS).into(),
            renew: format!("UPDATE {table} SET lease_until = $3 WHERE {held}").into(),
            complete: complete::<DB>(table).into(),
            raise_watermark: raise_watermark(table).into(),
            // A retry is told at its time; a dead letter now, since its object's next entry
            // may go.
            retry: told(format!(
                "UPDATE {table}
SET state = 'queued', next_at = $3, lease_token = NULL, lease_until = NULL, last_error = $4,
    {failed}
WHERE {held}
RETURNING key, next_at AS at"
            ))
            .into(),
            bury: told(format!(
                "UPDATE {table}
SET state = 'dead', lease_token = NULL, lease_until = NULL, last_error = $3,
    {failed}
WHERE {held}
RETURNING key, $4 AS at"
            ))
            .into(),
            dead_letters: format!(
                "SELECT {ENTRY_COLUMNS}, last_error FROM {table}
WHERE state = 'dead' ORDER BY enqueued_at, key LIMIT $1"
            )
            .into(),
            requeue: told(format!(
                "UPDATE {table} SET state = 'queued', attempts = 0, next_at = $2, last_error = NULL
WHERE key = $1 AND state = 'dead'
RETURNING key, next_at AS at"
            ))
            .into(),
            counts: counts(table).into(),
            purge: purge(table, DB::PURGE_LOCKS).into(),
            purge_watermarks: purge_watermarks(table, DB::PURGE_LOCKS).into(),
            find: format!("SELECT {INFO_COLUMNS} FROM {table} WHERE key = $1").into(),
            list: format!(
                "SELECT {INFO_COLUMNS} FROM {table}
WHERE key > $1 AND (state <> 'done' OR expires_at > $2) AND {matching}
ORDER BY key LIMIT $3",
                matching = matching::<DB>()
            )
            .into(),
            requeue_matching: told(requeue_matching::<DB>(table, DB::PURGE_LOCKS)).into(),
            // The watermark stays: the dead letter was not applied.
            discard: format!(
                "UPDATE {table}
SET state = 'done', body = NULL, headers = NULL, last_error = NULL, expires_at = $2
WHERE key = $1 AND state = 'dead'
RETURNING key"
            )
            .into(),
            pause: format!(
                "INSERT INTO {table}_paused (one, paused_at) VALUES (1, $1)
ON CONFLICT (one) DO NOTHING"
            )
            .into(),
            // Told like an enqueue due now: every idle worker takes again.
            resume: told(format!(
                "DELETE FROM {table}_paused RETURNING 'resumed' AS key, $1 AS at"
            ))
            .into(),
            is_paused: format!("SELECT COUNT(*) FROM {table}_paused").into(),
            columns: format!("SELECT name FROM pragma_table_info('{table}')").into(),
            told_by_database: DB::NOTIFIES,
            channel,
        }
    }
}

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

/// The enqueue: the claim of the key (a done key past its retention is taken over) with its
/// entry, unless its object's watermark is at or past its position (stale at the door); one
/// row (the key and its due time) when it stored the entry.
fn enqueue(table: &str) -> String {
    format!(
        "INSERT INTO {table} AS cur (key, state, body, headers, object, position,
    correlation_id, attempts, next_at, enqueued_at, id, route)
SELECT $1, 'queued', $2, $3, NULLIF($4, ''), $5, $6, $7, $8, $9, $11, $12
WHERE NOT EXISTS (
    SELECT 1 FROM {table}_objects AS w
    WHERE w.object = $4 AND w.watermark >= $5 AND w.expires_at > $10
)
ON CONFLICT (key) DO UPDATE
    SET state = 'queued', body = EXCLUDED.body, headers = EXCLUDED.headers,
        object = EXCLUDED.object, position = EXCLUDED.position,
        correlation_id = EXCLUDED.correlation_id, attempts = EXCLUDED.attempts,
        next_at = EXCLUDED.next_at, enqueued_at = EXCLUDED.enqueued_at, lease_token = NULL,
        lease_until = NULL, last_error = NULL, expires_at = NULL, id = EXCLUDED.id,
        route = EXCLUDED.route, history = '', started_us = NULL, worker = NULL
    WHERE cur.state = 'done' AND cur.expires_at <= $10
RETURNING key, next_at AS at"
    )
}

/// The completion: the key done (a done key keeps its first retention, and its history), its
/// attempt ended at `$4` as succeeded, its object and position returned for the watermark.
fn complete<DB: Dialect>(table: &str) -> String {
    let succeeded = appended::<DB>(&ended_line::<DB>('s', "$4", "''"));
    format!(
        "UPDATE {table}
SET state = 'done', body = NULL, headers = NULL, lease_until = NULL, last_error = NULL,
    expires_at = CASE WHEN state = 'done' THEN expires_at ELSE $3 END,
    history = CASE WHEN state = 'running' AND started_us IS NOT NULL
        THEN {succeeded} ELSE history END
WHERE key = $1 AND state IN ('running', 'done') AND lease_token = $2
RETURNING object, position"
    )
}

/// The stored history with the SQL text `line` appended as its last line, its first dropped
/// when it keeps [`KEPT_ATTEMPTS`] already ([`history::push`]'s bound, in the statement).
fn appended<DB: Dialect>(line: &str) -> String {
    let lines = "length(history) - length(replace(history, '\n', '')) + 1";
    let first_break = DB::find_text("history", "'\n'");
    format!(
        "CASE WHEN history = '' THEN {line}
            WHEN {lines} >= {KEPT_ATTEMPTS}
            THEN substr(history, {first_break} + 1) || '\n' || {line}
            ELSE history || '\n' || {line} END"
    )
}

/// The line of the attempt the row runs (`attempts`, `started_us`, `worker`), ended at the
/// microseconds `now` as `outcome` (`s` or `f`) with the SQL text `error`: the stored form of
/// [`history`].
fn ended_line<DB: Dialect>(outcome: char, now: &str, error: &str) -> String {
    let duration = DB::greatest("0", &format!("{now} - started_us"));
    format!(
        "CAST(attempts AS text) || '\t' || CAST(started_us AS text) || '\t'
                || CAST({duration} AS text) || '\t{outcome}\t' || COALESCE(worker, '')
                || '\t' || {error}"
    )
}

/// The line of the attempt the row runs, its lease lost: another take took it over.
const LOST_LINE: &str = "CAST(attempts AS text) || '\t' || CAST(started_us AS text)
                || '\t\tl\t' || COALESCE(worker, '') || '\t'";

/// The watermark raised to a position (an expired one counts as none), for the retention.
fn raise_watermark(table: &str) -> String {
    format!(
        "INSERT INTO {table}_objects AS cur (object, watermark, expires_at)
VALUES ($1, $2, $3)
ON CONFLICT (object) DO UPDATE
    SET watermark = CASE WHEN cur.expires_at > $4 AND cur.watermark >= EXCLUDED.watermark
            THEN cur.watermark ELSE EXCLUDED.watermark END,
        expires_at = EXCLUDED.expires_at"
    )
}

/// Pending (a lease that ran out counts), in flight, dead, the oldest enqueue time: read
/// through the partial indexes of the live rows (`<table>_take_idx`) and of the dead ones
/// (`<table>_dead_idx`), never the done keys, which outnumber them (a worker counts every
/// second).
fn counts(table: &str) -> String {
    format!(
        "SELECT
    COALESCE(SUM(CASE WHEN state = 'queued' OR lease_until <= $1 THEN 1 ELSE 0 END), 0),
    COALESCE(SUM(CASE WHEN state = 'running' AND lease_until > $1 THEN 1 ELSE 0 END), 0),
    (SELECT COUNT(*) FROM {table} WHERE state = 'dead'),
    MIN(enqueued_at)
FROM {table} WHERE state IN ('queued', 'running')"
    )
}

/// Done keys past their retention, a batch at a time.
fn purge(table: &str, locks: &str) -> String {
    format!(
        "DELETE FROM {table}
WHERE key IN (
    SELECT key FROM {table} WHERE state = 'done' AND expires_at <= $2
    ORDER BY expires_at LIMIT $1{locks}
) AND state = 'done' AND expires_at <= $2"
    )
}

/// Watermarks past their retention, a batch at a time.
fn purge_watermarks(table: &str, locks: &str) -> String {
    format!(
        "DELETE FROM {table}_objects
WHERE object IN (
    SELECT object FROM {table}_objects WHERE expires_at <= $2
    ORDER BY expires_at LIMIT $1{locks}
) AND expires_at <= $2"
    )
}

/// When an entry is due: a queued one at its next attempt, a running one when its lease runs
/// out. The take orders by it, and `<table>_take_idx` indexes it (the same expression, which the
/// planners match), so that a take reads the due entries in order and stops at its limit.
const DUE_AT: &str = "CASE WHEN state = 'queued' THEN next_at ELSE lease_until END";

/// The take: the due entries (queued and due, or running with a lease that ran out), locked
/// with `locks` and skipped when another take holds them. An ordered one only when it is its
/// object's next: a queued one when none of its object is running and no queued one stands
/// before it (by position, then key); a running one (taken over) whatever is queued before
/// it, since an object's entry in flight is the only one of it that runs until it settles.
///
/// Read through `<table>_take_idx`, in due order, until `$1` entries are found: its cost
/// follows the entries it passes over (locked by another take, or waiting behind their
/// object's), not the backlog; never a sort of the table.
fn take<DB: Dialect>(table: &str, locks: &str) -> String {
    let lost = appended::<DB>(LOST_LINE);
    format!(
        "UPDATE {table}
SET state = 'running', attempts = attempts + 1, lease_token = $3, lease_until = $2,
    history = CASE WHEN state = 'running' AND started_us IS NOT NULL
        THEN {lost} ELSE history END,
    started_us = $5, worker = $6
WHERE key IN (
    SELECT e.key FROM {table} AS e
    WHERE e.state IN ('queued', 'running') AND {DUE_AT} <= $4
      AND NOT EXISTS (SELECT 1 FROM {table}_paused)
      AND (e.object IS NULL OR NOT EXISTS (
        SELECT 1 FROM {table} AS o
        WHERE o.object = e.object AND o.key <> e.key AND o.state IN ('queued', 'running')
          AND ((o.state = 'running' AND e.state = 'queued')
            OR (o.state = e.state AND (o.position < e.position
                OR (o.position = e.position AND o.key < e.key))))))
    ORDER BY {DUE_AT}, e.key
    LIMIT $1{locks}
)
RETURNING {ENTRY_COLUMNS}, EXISTS (
    SELECT 1 FROM {table}_objects AS w
    WHERE w.object = {table}.object AND w.watermark >= {table}.position AND w.expires_at > $4
) AS stale"
    )
}

/// The conditions of a [`Filter`], each on when its parameter is not `NULL`: $4 state, $5 id
/// prefix, $6 route, $7 object, $8 correlation id, $9 error text. Exact on every row but the
/// error of an entry that is not dead, whose history (every attempt's error) is searched
/// where the filter reads only the last failed attempt's: what is read is checked again.
fn matching<DB: Dialect>() -> String {
    let in_error = DB::find_text("last_error", "$9");
    let in_history = DB::find_text("history", "$9");
    format!(
        "($4 IS NULL OR state = $4)
    AND ($5 IS NULL OR substr(id, 1, length($5)) = $5)
    AND ($6 IS NULL OR route = $6)
    AND ($7 IS NULL OR object = $7)
    AND ($8 IS NULL OR correlation_id = $8)
    AND ($9 IS NULL OR (state = 'dead' AND {in_error} > 0)
        OR (state <> 'dead' AND {in_history} > 0))"
    )
}

/// The bulk re-queue: the first `$3` dead letters matching the filter after the key `$1`, by
/// key, queued again now (`$2`) as [`InboxStore::requeue`] does; the keys re-queued. On a dead
/// letter every condition of [`matching`] is exact. The choice is materialized: a semi-join
/// may run a `LIMIT` subquery again for each row it joins, and re-queue more than `$3`.
fn requeue_matching<DB: Dialect>(table: &str, locks: &str) -> String {
    format!(
        "WITH chosen AS MATERIALIZED (
    SELECT key FROM {table}
    WHERE key > $1 AND state = 'dead' AND {matching}
    ORDER BY key LIMIT $3{locks}
)
UPDATE {table} SET state = 'queued', attempts = 0, next_at = $2, last_error = NULL
WHERE key IN (SELECT key FROM chosen) AND state = 'dead'
RETURNING key, next_at AS at",
        matching = matching::<DB>()
    )
}

/// The tables, with `bytes` the dialect's column type of bytes, and the `ALTER TABLE`s of
/// the [`ADDED_COLUMNS`] where the dialect takes `ADD COLUMN IF NOT EXISTS` (`alter`). Times
/// are `bigint` milliseconds (an integer column on SQLite too), but an attempt's start
/// (microseconds, as its history keeps it).
fn schema(table: &str, bytes: &str, alter: bool) -> String {
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
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (
    key            text    NOT NULL PRIMARY KEY,
    state          text    NOT NULL CHECK (state IN ('queued', 'running', 'dead', 'done')),
    body           {bytes},
    headers        {bytes},
    object         text,
    position       {bytes},
    correlation_id text    NOT NULL,
    attempts       bigint  NOT NULL,
    next_at        bigint  NOT NULL,
    lease_token    {bytes},
    lease_until    bigint,
    last_error     text,
    enqueued_at    bigint  NOT NULL,
    expires_at     bigint,
    -- The delivery's key as the route derived it, and the route: what operators find it by.
    id             text    NOT NULL DEFAULT '',
    route          text    NOT NULL DEFAULT '',
    -- The attempts that ended, one line each (the crate's `admin::history` form); the one
    -- that runs is `attempts`, `started_us` (µs since the epoch) and `worker`.
    history        text    NOT NULL DEFAULT '',
    started_us     bigint,
    worker         text,
    -- A done key keeps the token that completed it.
    CHECK (state = 'done' OR (state = 'running') = (lease_token IS NOT NULL)),
    CHECK ((state = 'done') = (expires_at IS NOT NULL))
);
{added}-- The take's order, over what it may take: a take is an index scan that stops at its limit.
CREATE INDEX IF NOT EXISTS {index}_take_idx ON {table} (({DUE_AT}), key)
    WHERE state IN ('queued', 'running');
-- Replaced by the take's index (SQLite's planner preferred it and sorted the backlog).
DROP INDEX IF EXISTS {schema_prefix}{index}_due_idx;
-- The purge's order over the done keys, and the dead letters' over the dead entries.
CREATE INDEX IF NOT EXISTS {index}_expires_idx ON {table} (expires_at) WHERE state = 'done';
CREATE INDEX IF NOT EXISTS {index}_dead_idx ON {table} (enqueued_at, key) WHERE state = 'dead';
CREATE INDEX IF NOT EXISTS {index}_object_idx ON {table} (object, position);
-- One entry of an object in flight: the database's own guard (see the take).
CREATE UNIQUE INDEX IF NOT EXISTS {index}_in_flight_idx ON {table} (object)
    WHERE state = 'running';
-- An object's watermark lasts for the retention of the last completion of its events, as
-- the done keys do.
CREATE TABLE IF NOT EXISTS {table}_objects (
    object     text    NOT NULL PRIMARY KEY,
    watermark  {bytes} NOT NULL,
    expires_at bigint  NOT NULL
);
CREATE INDEX IF NOT EXISTS {index}_objects_expires_idx ON {table}_objects (expires_at);
-- One row while taking is paused (every take reads it).
CREATE TABLE IF NOT EXISTS {table}_paused (
    one       integer NOT NULL PRIMARY KEY CHECK (one = 1),
    paused_at bigint  NOT NULL
);
"
    )
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

/// What an operator sees of the row (as [`INFO_COLUMNS`]); `None` for a done key past its
/// retention at `now` (milliseconds), which counts as absent.
fn info<DB: Dialect>(row: &DB::Row, now: i64) -> Result<Option<EntryInfo>, StoreError> {
    let text = |column| DB::text(row, column).map_err(error::<DB>);
    let int = |column| DB::int(row, column).map_err(error::<DB>);
    let entry = entry::<DB>(row)?;
    let state = key_state(text(11)?.unwrap_or_default())?;
    let (until, dead) = match state {
        KeyState::Queued => (Some(entry.next_attempt_at), None),
        KeyState::Running => (int(12)?.map(from_epoch_ms), None),
        KeyState::Dead => (None, text(14)?.map(str::to_owned)),
        KeyState::Done => match int(13)? {
            Some(expires) if expires > now => (Some(from_epoch_ms(expires)), None),
            _ => return Ok(None),
        },
    };
    let stored = text(15)?.unwrap_or_default();
    // The attempt that runs is not in the stored lines (a take writes no text): its line is
    // made here, as the take would have appended it.
    let running = match (state, int(16)?) {
        (KeyState::Running, Some(started)) => {
            let at = UNIX_EPOCH + Duration::from_micros(u64::try_from(started).unwrap_or(0));
            let worker = text(17)?.unwrap_or_default();
            Some(history::push(
                stored,
                &history::started(entry.attempts, at, worker),
            ))
        }
        _ => None,
    };
    let stored = running.as_deref().unwrap_or(stored);
    Ok(Some(EntryInfo::of(entry, state, until, stored, dead)))
}

/// The stored name of `state`.
fn state_name(state: KeyState) -> &'static str {
    match state {
        KeyState::Queued => "queued",
        KeyState::Running => "running",
        KeyState::Dead => "dead",
        KeyState::Done => "done",
    }
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

fn error<DB: Dialect>(error: sqlx::Error) -> StoreError {
    store_error(error, DB::classify)
}

async fn execute<DB: Dialect>(
    conn: &mut DB::Connection,
    sql: &Sql,
    params: &[Param<'_>],
) -> Result<u64, StoreError> {
    let done = DB::execute(conn, sql, params, None)
        .await
        .map_err(error::<DB>)?;
    Ok(DB::rows_affected(&done))
}

async fn fetch<DB: Dialect>(
    conn: &mut DB::Connection,
    sql: &Sql,
    params: &[Param<'_>],
) -> Result<Vec<DB::Row>, StoreError> {
    DB::fetch_all(conn, sql, params, None)
        .await
        .map_err(error::<DB>)
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

    #[cfg(feature = "postgres")]
    #[test]
    fn the_take_locks_only_where_asked() {
        let take = take::<sqlx::Postgres>;
        assert!(
            take("t", " FOR UPDATE SKIP LOCKED").contains("LIMIT $1 FOR UPDATE SKIP LOCKED\n)")
        );
        assert!(take("t", "").contains("LIMIT $1\n)"));
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
