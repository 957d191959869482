//! [`SqlTable`]: a pool and the statements of one table, of one of two kinds (the record store,
//! the inbox). What both kinds do alike (build, name the table, migrate, purge) is written here
//! once; each kind supplies its statements and what differs through a sealed [`Kind`].

use std::sync::Arc;
use std::time::Duration;

use sqlx::{Pool, Transaction};

use super::run;
use super::{DEFAULT_PURGE_BATCH, Dialect, spawn_purge_every};
use crate::ConfigError;
use crate::store::StoreError;

/// One SQL table (and the tables beside it) on a pool: the type of both SQL backends of the
/// crate, the record store [`SqlStore`](crate::store::sql::SqlStore)
/// (`SqlTable<DB, Records>`: [`PostgresStore`](crate::PostgresStore),
/// [`SqliteStore`](crate::SqliteStore)) and the inbox [`SqlInbox`](crate::inbox::SqlInbox)
/// (`SqlTable<DB, Inbox>`: `PostgresInbox`, `SqliteInbox`). Write one of those names; this type
/// exists so that what both do alike (built over a pool, [`with_table`](Self::with_table),
/// [`migrate`](Self::migrate), [`purge_expired`](Self::purge_expired),
/// [`spawn_purge`](Self::spawn_purge)) is written and documented once, while what only one of
/// them is or has is on that one only, checked by the compiler:
///
/// ```compile_fail,E0277
/// use tower_idempotency::inbox::InboxStore;
/// use tower_idempotency::store::sql::{Dialect, SqlStore};
///
/// fn worker_on(_inbox: impl InboxStore) {}
///
/// // A record store keeps claims and records, not a queue: it is no inbox.
/// fn mixed_up<DB: Dialect>(store: SqlStore<DB>) {
///     worker_on(store);
/// }
/// ```
///
/// `DB` is the database (a [`Dialect`]); `K`, the table's kind, is sealed in this crate (the
/// statements, the default table name and what the purge deletes are the kind's): `Records`
/// or `Inbox`, names seen in type errors that user code never writes (it writes the aliases).
/// Cheap to clone: the pool and the statements are shared.
pub struct SqlTable<DB: Dialect, K: Kind> {
    pub(super) pool: Pool<DB>,
    pub(super) sql: Arc<K::Statements>,
    /// Where the kind's writes wake its readers up (the inbox's workers), for this table.
    pub(super) announcer: K::Announcer,
}

/// The kind of [`SqlStore`](crate::store::sql::SqlStore): claims and records, keyed, in
/// `idempotency_keys`.
pub struct Records(());

/// The kind of [`SqlInbox`](crate::inbox::SqlInbox): the inbox's entries and done keys, in
/// `inbox_entries`.
pub struct Inbox(());

/// The kinds of [`SqlTable`]: records and the inbox. Sealed: what a kind supplies (its
/// statements, its default table, what its purge deletes) is private to this crate.
pub trait Kind: kind::Sealed {}

impl Kind for Records {}
impl Kind for Inbox {}

pub(crate) mod kind {
    use std::fmt;

    use sqlx::Pool;

    use crate::sql::Dialect;
    use crate::sql::query::Param;
    use crate::sql::statements::Sql;
    use crate::store::StoreError;

    /// What every kind's statements hold alike.
    pub struct Ddl<'a> {
        /// The table name.
        pub table: &'a str,
        /// The schema (`CREATE ... IF NOT EXISTS`).
        pub schema: &'a str,
        /// The script `migrate` runs.
        pub migrate: &'a Sql,
    }

    impl<'a> Ddl<'a> {
        /// The name, the schema and the migration of one table.
        pub fn of(table: &'a str, schema: &'a str, migrate: &'a Sql) -> Self {
            Ddl {
                table,
                schema,
                migrate,
            }
        }
    }

    /// What differs between the kinds of table, for the methods they share.
    pub trait Sealed: Sized + 'static {
        /// The text of every statement of one table of this kind.
        type Statements: fmt::Debug + Send + Sync + 'static;
        /// What wakes up the readers of a table after a write their database does not tell
        /// them of: the inbox's [`Announcer`](crate::inbox::Announcer); nothing for records.
        type Announcer: Clone + fmt::Debug + Send + Sync + 'static;
        /// The table `new` uses.
        const DEFAULT_TABLE: &'static str;
        /// What the purge deletes, in its log events.
        const PURGED: &'static str;

        /// The statements of `table`, a valid table name.
        fn statements<DB: Dialect>(table: &str) -> Self::Statements;
        /// The announcer of `table` on `pool`'s database.
        fn announcer<DB: Dialect>(pool: &Pool<DB>, table: &str) -> Self::Announcer;
        /// The table's name, schema and migration, out of its statements.
        fn ddl(sql: &Self::Statements) -> Ddl<'_>;
        /// What `migrate` does after its script: what the script cannot do on `DB` (the
        /// inbox's columns added to an older table, on SQLite).
        fn after_migrate<DB: Dialect>(
            pool: &Pool<DB>,
            sql: &Self::Statements,
        ) -> impl Future<Output = Result<(), StoreError>> + Send;
        /// The purge's statements, run in this order.
        fn purge(sql: &Self::Statements) -> [&Sql; 2];
        /// The purge's parameters, from the most rows one statement deletes.
        fn purge_params(limit: i64) -> Vec<Param<'static>>;
        /// The bound clock of the purge's statements (see `Dialect::clock`), if they read one.
        fn purge_clock<DB: Dialect>() -> Option<i64>;
    }
}

impl<DB: Dialect, K: Kind> Clone for SqlTable<DB, K> {
    fn clone(&self) -> Self {
        SqlTable {
            pool: self.pool.clone(),
            sql: self.sql.clone(),
            announcer: self.announcer.clone(),
        }
    }
}

impl<DB: Dialect, K: Kind> SqlTable<DB, K> {
    /// A table over `pool`, under its kind's name: a record store in `idempotency_keys` (and
    /// its table of objects, `idempotency_keys_objects`), an inbox in `inbox_entries` (and
    /// `inbox_entries_objects`, `inbox_entries_paused`).
    ///
    /// On SQLite, configure the pool's connections for concurrent use: a busy timeout (sqlx's
    /// default is 5 s) and preferably the WAL journal, as
    /// [`SqliteStore::open`](crate::SqliteStore::open) does.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn run(pool: sqlx::PgPool) {
    /// let inbox = tower_idempotency::inbox::PostgresInbox::new(pool.clone());
    /// assert_eq!(inbox.table(), "inbox_entries");
    /// let store = tower_idempotency::PostgresStore::new(pool);
    /// assert_eq!(store.table(), "idempotency_keys");
    /// # }
    /// ```
    pub fn new(pool: Pool<DB>) -> Self {
        let announcer = K::announcer(&pool, K::DEFAULT_TABLE);
        SqlTable {
            pool,
            sql: Arc::new(K::statements::<DB>(K::DEFAULT_TABLE)),
            announcer,
        }
    }

    /// Uses the table `table` instead of the kind's (see [`new`](Self::new)), and
    /// `<table>_objects` beside it for ordered events (an inbox also `<table>_paused`, and
    /// its wake-ups are this table's); on PostgreSQL it may be schema-qualified
    /// (`app.idempotency_keys`).
    ///
    /// A [`ConfigError`] of kind [`Table`](crate::ConfigErrorKind::Table) when `table` is not an
    /// SQL identifier (`[A-Za-z_][A-Za-z0-9_]*`, at most 40 characters, or on PostgreSQL
    /// `schema.table` of two such): it is written into the statements as it is.
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
    pub fn with_table(mut self, table: &str) -> Result<Self, ConfigError> {
        self.sql = run::statements_for::<DB, _>(table, K::statements::<DB>)?;
        // Another table's wake-ups are not this one's.
        self.announcer = K::announcer(&self.pool, table);
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
        K::ddl(&self.sql).table
    }

    /// The `CREATE TABLE IF NOT EXISTS` and `CREATE INDEX IF NOT EXISTS` statements of this
    /// table and those beside it, for your own migration tool (what [`migrate`](Self::migrate)
    /// runs). Idempotent. An inbox's also hold, on PostgreSQL, the `ALTER TABLE .. ADD COLUMN IF
    /// NOT EXISTS` of the columns added since its table was first released (SQLite has no such
    /// statement: [`migrate`](Self::migrate) adds them there).
    ///
    /// ```no_run
    /// # #[cfg(feature = "sqlite")]
    /// # async fn run(pool: sqlx::SqlitePool) {
    /// let inbox = tower_idempotency::inbox::SqliteInbox::new(pool);
    /// assert!(inbox.schema().starts_with("CREATE TABLE IF NOT EXISTS inbox_entries"));
    /// # }
    /// ```
    pub fn schema(&self) -> &str {
        K::ddl(&self.sql).schema
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

    /// Creates the tables and their indexes if they do not exist yet ([`schema`](Self::schema));
    /// an inbox's also adds to a table made by an earlier version the columns it lacks.
    ///
    /// Idempotent, and safe to call from every instance at start-up. On PostgreSQL the
    /// statements run as one transaction under an advisory lock (`pg_advisory_xact_lock`), so
    /// instances starting together do not trip over each other.
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
        run::migrate(&self.pool, K::ddl(&self.sql).migrate).await?;
        K::after_migrate(&self.pool, &self.sql).await
    }

    /// Deletes the rows past their time, at most `batch_size` per statement (each a short
    /// transaction, so claims are not held up for long), until a statement deletes fewer;
    /// returns how many rows were deleted:
    ///
    /// - of a record store, the claims and records whose lease or retention has expired, and
    ///   the objects whose lease and watermark both have;
    /// - of an inbox, the done keys and the objects' watermarks past their retention. Entries
    ///   (queued, running, dead) are never deleted.
    ///
    /// On PostgreSQL, rows locked by a concurrent claim are skipped (`FOR UPDATE SKIP
    /// LOCKED`), so several instances may purge at once. Run it from a scheduled job, or let
    /// [`spawn_purge`](Self::spawn_purge) run it.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn run(inbox: tower_idempotency::inbox::PostgresInbox) {
    /// let deleted = inbox.purge_expired(1000).await.unwrap();
    /// println!("{deleted} done keys purged");
    /// # }
    /// ```
    pub async fn purge_expired(&self, batch_size: u32) -> Result<u64, StoreError> {
        let statements = K::purge(&self.sql);
        let clock = K::purge_clock::<DB>;
        run::purge(&self.pool, statements, batch_size, K::purge_params, clock).await
    }

    /// Spawns a Tokio task that runs [`purge_expired`](Self::purge_expired) with
    /// a batch of 1,000 rows every `every`, the first time right away, logging its outcome
    /// with `tracing`. Abort the returned handle to stop it; it also ends with the runtime.
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
        let purge = |table: Self| async move { table.purge_expired(DEFAULT_PURGE_BATCH).await };
        spawn_purge_every(every, DB::BACKEND, K::PURGED, self.clone(), purge)
    }

    /// A transaction on a connection from the pool.
    pub(crate) async fn begin(&self) -> Result<Transaction<'static, DB>, StoreError> {
        run::begin(&self.pool).await
    }
}
