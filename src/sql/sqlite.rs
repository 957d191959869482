//! The SQLite store: [`SqliteStore`], over an [`sqlx`] [`SqlitePool`], on a database file.
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_idempotency::SqliteStore;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), tower_idempotency::store::StoreError> {
//! // WAL journal, `synchronous = FULL`, 5 s busy timeout; creates the file and the table.
//! let store = SqliteStore::open("/var/lib/app/idempotency.db").await?;
//! let _purge = store.spawn_purge(Duration::from_secs(600));
//! // Hand `store` to the idempotency layer.
//! # Ok(())
//! # }
//! ```
//!
//! Or bring your own pool with [`SqliteStore::new`] and call [`SqliteStore::migrate`] (or run
//! its [`schema`](SqliteStore::schema) with your own migrations). Every process using the same file shares the claims; an
//! in-memory database (`sqlite::memory:`) is per connection, so use a file.
//!
//! Times are milliseconds since the Unix epoch from this host's clock. See the [parent
//! module](super) for the table and the statements.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::Sqlite;
#[cfg(doc)]
use sqlx::sqlite::SqlitePool;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqliteLockingMode, SqlitePoolOptions,
    SqliteQueryResult, SqliteSynchronous,
};

use super::run::error;
use super::{Dialect, SqlStore, dialect};
use crate::store::{StoreError, StoreErrorKind};

/// An [`IdempotencyStore`](crate::IdempotencyStore) in an SQLite table, over an
/// [`SqlitePool`]: [`SqlStore`] on SQLite.
///
/// Open a database file with [`SqliteStore::open`], or build it over your own pool with
/// [`SqliteStore::new`] and [`migrate`](SqlStore::migrate); purge expired rows with
/// [`purge_expired`](SqlStore::purge_expired) or [`spawn_purge`](SqlStore::spawn_purge).
pub type SqliteStore = SqlStore<Sqlite>;

/// What only the SQLite record store has: a database file opened for it, where every other
/// SQL store and inbox is built over a pool ([`new`](crate::store::sql::SqlTable::new)):
///
/// ```compile_fail,E0599
/// # async fn run() {
/// // The SQLite inbox is built over a pool (`SqliteInbox::new`): `open` is the record store's.
/// let inbox = tower_idempotency::inbox::SqliteInbox::open("inbox.db").await;
/// # }
/// ```
impl SqliteStore {
    /// The schema of the default table, written out: what the unit tests compare
    /// [`SqlStore::schema`] with.
    #[cfg(test)]
    pub(crate) const SCHEMA: &'static str = "CREATE TABLE IF NOT EXISTS idempotency_keys (
    key         TEXT    NOT NULL PRIMARY KEY,
    state       TEXT    NOT NULL CHECK (state IN ('in_flight', 'completed')),
    token       BLOB,
    fingerprint BLOB    NOT NULL,
    record      BLOB,
    expires_at  INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,
    CHECK ((state = 'in_flight') = (token IS NOT NULL)),
    CHECK ((state = 'completed') = (record IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);
CREATE TABLE IF NOT EXISTS idempotency_keys_objects (
    object          TEXT    NOT NULL PRIMARY KEY,
    token           BLOB,
    lease_until     INTEGER,
    watermark       BLOB,
    watermark_until INTEGER,
    expires_at      INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS idempotency_keys_objects_expires_at_idx ON idempotency_keys_objects (expires_at);
";

    /// Opens the database file at `path` (creating it if missing) with the WAL journal,
    /// `synchronous = FULL` (a completed record survives a power loss) and a 5 s busy timeout,
    /// and creates the tables ([`migrate`](SqlStore::migrate)). Several processes may share
    /// the file.
    ///
    /// In WAL mode SQLite maps the `-shm` file next to the database into memory: if that file
    /// is truncated or made unreadable under a running process (by another process, a
    /// misconfigured backup, an attacker with access to the directory), the process dies of
    /// `SIGBUS`, which no library can catch. A store used by one process only should use
    /// [`open_exclusive`](Self::open_exclusive), which has no `-shm` file.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(path, false).await
    }

    /// [`open`](Self::open) for a database only this process uses: `locking_mode =
    /// EXCLUSIVE`, so that the WAL index lives in the process's own memory and no `-shm` file
    /// is mapped (nothing outside the process can make it crash), over one connection (SQLite
    /// serializes writes anyway). Another process opening the file meanwhile gets
    /// `SQLITE_BUSY`.
    pub async fn open_exclusive(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(path, true).await
    }

    async fn open_with(path: impl AsRef<Path>, exclusive: bool) -> Result<Self, StoreError> {
        let mut options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5));
        if exclusive {
            options = options.locking_mode(SqliteLockingMode::Exclusive);
        }
        let pool = SqlitePoolOptions::new()
            .max_connections(if exclusive { 1 } else { 8 })
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await
            .map_err(error::<Sqlite>)?;
        let store = SqliteStore::new(pool);
        store.migrate().await?;
        Ok(store)
    }
}

impl Dialect for Sqlite {}

impl dialect::Sealed for Sqlite {
    const BACKEND: &'static str = "sqlite";
    const QUALIFIED_TABLES: bool = false;
    // Writers are serialized: the purge's short transactions just take their turn.
    const PURGE_LOCKS: &'static str = "";
    const BYTES: &'static str = "BLOB";
    const ONE_WRITER: bool = true;
    const NOTIFIES: bool = false;
    const ADD_COLUMN_IF_NOT_EXISTS: bool = false;
    const FIND_TEXT: &'static str = "instr";
    const GREATEST: &'static str = "max";
    // The claim returns a row only when it is ours; otherwise a following `SELECT` reads the
    // live row.
    const RESERVE: Option<&'static str> = None;
    // Claims run one after the other anyway (writers are serialized), in this process.
    const RESERVE_MANY: Option<&'static str> = None;
    const MIGRATE: &'static str = "{schema}";

    fn now(clock: usize) -> String {
        format!("${clock}")
    }

    fn plus_millis(time: &str, millis: &str) -> String {
        format!("{time} + {millis}")
    }

    fn millis_until(time: &str, now: &str) -> String {
        format!("({time} - {now})")
    }

    /// Now, in milliseconds since the Unix epoch.
    fn clock() -> Option<i64> {
        Some(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64),
        )
    }

    fn schema(table: &str) -> String {
        super::schema(
            table,
            include_str!("queries/sqlite/columns.sql"),
            include_str!("queries/sqlite/objects.sql"),
        )
    }

    fn rows_affected(done: &SqliteQueryResult) -> u64 {
        done.rows_affected()
    }

    /// By the (extended) result code.
    fn classify(code: &str) -> StoreErrorKind {
        let Ok(code) = code.parse::<i32>() else {
            return StoreErrorKind::Other;
        };
        match code & 0xff {
            // SQLITE_BUSY, SQLITE_LOCKED (the busy timeout ran out), SQLITE_IOERR,
            // SQLITE_CANTOPEN, SQLITE_READONLY.
            5 | 6 | 10 | 14 | 8 => StoreErrorKind::Unavailable,
            // SQLITE_FULL (disk full), SQLITE_NOMEM.
            13 | 7 => StoreErrorKind::Capacity,
            // SQLITE_CORRUPT, SQLITE_NOTADB.
            11 | 26 => StoreErrorKind::Corrupt,
            _ => StoreErrorKind::Other,
        }
    }

    fn notify(_statement: &str, _channel: &str) -> Option<String> {
        None
    }

    fn listen(
        _pool: &sqlx::Pool<Self>,
        _channel: &str,
        _heard: dialect::Heard,
    ) -> Option<tokio::task::JoinHandle<()>> {
        None
    }

    fn place(pool: &sqlx::Pool<Self>) -> Option<String> {
        // `app.db`, `./app.db` and `/srv/app.db` are one file; an in-memory database keeps
        // the name sqlx gave it.
        let options = pool.connect_options();
        let file = options.get_filename();
        // A file not created yet (a lazy pool) is named by its folder's canonical path.
        let canonical = std::fs::canonicalize(file).ok().or_else(|| {
            let folder = match file.parent() {
                Some(folder) if !folder.as_os_str().is_empty() => folder,
                _ => std::path::Path::new("."),
            };
            Some(std::fs::canonicalize(folder).ok()?.join(file.file_name()?))
        });
        Some(
            canonical
                .unwrap_or_else(|| file.to_owned())
                .display()
                .to_string(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::DEFAULT_TABLE;
    use super::super::statements::Statements;
    use super::*;
    use crate::sql::dialect::Sealed;

    /// Moved from the integration test of a custom table (`tests/stores/sqlite.rs`): a lazy
    /// pool never connects.
    #[tokio::test]
    async fn a_stores_schema_is_the_constant() {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .connect_lazy("sqlite::memory:")
            .unwrap();
        let default = SqliteStore::new(pool);
        assert_eq!(default.schema(), SqliteStore::SCHEMA);
    }

    #[test]
    fn schema_constant_is_the_default_tables() {
        assert_eq!(SqliteStore::SCHEMA, Sqlite::schema(DEFAULT_TABLE));
    }

    #[test]
    fn statements_bind_the_clock_last() {
        let sql = Statements::new::<Sqlite>("t");
        assert!(
            sql.reserve
                .contains("VALUES ($1, 'in_flight', $2, $3, NULL, $5 + $4, $5)")
        );
        assert_eq!(
            sql.read_live.as_deref(),
            Some(
                "SELECT false AS acquired, state, fingerprint, record, (expires_at - $2) AS left_ms FROM t
WHERE key = $1 AND expires_at > $2"
            )
        );
        assert_eq!(
            sql.renew,
            "UPDATE t SET expires_at = $4 + $3
WHERE key = $1 AND state = 'in_flight' AND token = $2 AND expires_at > $4"
        );
        assert!(sql.complete.contains("expires_at = $6 + $5\n"));
        assert!(sql.purge.contains("LIMIT $1\n"));
        assert_eq!(*sql.migrate, *sql.schema);
        assert!(sql.reserve_many.is_none());
    }

    #[test]
    fn result_codes_are_classified() {
        assert_eq!(Sqlite::classify("5"), StoreErrorKind::Unavailable);
        assert_eq!(Sqlite::classify("517"), StoreErrorKind::Unavailable);
        assert_eq!(Sqlite::classify("13"), StoreErrorKind::Capacity);
        assert_eq!(Sqlite::classify("11"), StoreErrorKind::Corrupt);
        assert_eq!(Sqlite::classify("19"), StoreErrorKind::Other);
        assert_eq!(Sqlite::classify("x"), StoreErrorKind::Other);
    }
}
