//! The SQLite store: [`SqliteStore`], over an [`sqlx`] [`SqlitePool`], on a database file.
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_idempotency::store::sql::SqliteStore;
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
//! [`SqliteStore::SCHEMA`]). Every process using the same file shares the claims; an
//! in-memory database (`sqlite::memory:`) is per connection, so use a file.
//!
//! Times are milliseconds since the Unix epoch from this host's clock. See the [parent
//! module](super) for the table and the statements.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::{
    DEFAULT_PURGE_BATCH, DEFAULT_TABLE, RESERVE_ATTEMPTS, bare_name, completion_after_miss, held,
    millis, purge_in_batches, spawn_purge_task, store_error, unsettled, validate_table,
};
use crate::record::Record;
use crate::store::{
    Claim, Completion, IdempotencyStore, Reservation, StoreError, StoreErrorKind, StoreKey,
};

/// An [`IdempotencyStore`] in an SQLite table.
///
/// Cheap to clone (the pool and the statements are shared). Open a database file with
/// [`SqliteStore::open`], or build it over your own [`SqlitePool`] with [`SqliteStore::new`]
/// and [`migrate`](SqliteStore::migrate); purge expired rows with
/// [`purge_expired`](SqliteStore::purge_expired) or [`spawn_purge`](SqliteStore::spawn_purge).
#[derive(Clone, Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
    sql: Arc<Statements>,
}

#[derive(Debug)]
struct Statements {
    table: String,
    schema: String,
    claim: String,
    read: String,
    complete: String,
    release: String,
    renew: String,
    read_record: String,
    purge: String,
}

impl Statements {
    fn new(table: &str) -> Self {
        Statements {
            table: table.to_owned(),
            schema: schema(table),
            // Inserts the row, or takes over in place a row that expired (or is our own
            // claim, sent again); returns a row only when the claim is ours.
            // ?4: now, ?5: the lease, in milliseconds.
            claim: format!(
                "INSERT INTO {table} AS cur (key, state, token, fingerprint, record, expires_at, created_at)
VALUES (?1, 'in_flight', ?2, ?3, NULL, ?4 + ?5, ?4)
ON CONFLICT (key) DO UPDATE
    SET state = 'in_flight', token = excluded.token, fingerprint = excluded.fingerprint,
        record = NULL, expires_at = excluded.expires_at, created_at = excluded.created_at
    WHERE cur.expires_at <= ?4
       OR (cur.state = 'in_flight' AND cur.token = excluded.token)
RETURNING 1"
            ),
            read: format!(
                "SELECT state, fingerprint, record FROM {table} WHERE key = ?1 AND expires_at > ?2"
            ),
            complete: format!(
                "UPDATE {table}
SET state = 'completed', token = NULL, fingerprint = ?3, record = ?4, expires_at = ?5 + ?6
WHERE key = ?1 AND state = 'in_flight' AND token = ?2 AND expires_at > ?5"
            ),
            release: format!(
                "DELETE FROM {table}
WHERE key = ?1 AND state = 'in_flight' AND token = ?2 AND expires_at > ?3"
            ),
            renew: format!(
                "UPDATE {table} SET expires_at = ?3 + ?4
WHERE key = ?1 AND state = 'in_flight' AND token = ?2 AND expires_at > ?3"
            ),
            read_record: format!(
                "SELECT record FROM {table}
WHERE key = ?1 AND state = 'completed' AND expires_at > ?2"
            ),
            purge: format!(
                "DELETE FROM {table}
WHERE key IN (SELECT key FROM {table} WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2)"
            ),
        }
    }
}

/// The `CREATE TABLE` and `CREATE INDEX` statements of `table`.
fn schema(table: &str) -> String {
    let index = bare_name(table);
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (
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
CREATE INDEX IF NOT EXISTS {index}_expires_at_idx ON {table} (expires_at);
"
    )
}

/// Now, in milliseconds since the Unix epoch.
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl SqliteStore {
    /// The schema of the default table ([`DEFAULT_TABLE`]), for your own migration tool.
    /// Idempotent: `CREATE ... IF NOT EXISTS`. [`SqliteStore::schema`] gives it for another
    /// table name.
    pub const SCHEMA: &'static str = "CREATE TABLE IF NOT EXISTS idempotency_keys (
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
";

    /// A store over `pool`, in the table [`DEFAULT_TABLE`].
    ///
    /// Configure the pool's connections for concurrent use: a busy timeout (sqlx's default is
    /// 5 s) and preferably the WAL journal, as [`SqliteStore::open`] does.
    pub fn new(pool: SqlitePool) -> Self {
        SqliteStore {
            pool,
            sql: Arc::new(Statements::new(DEFAULT_TABLE)),
        }
    }

    /// Opens the database file at `path` (creating it if missing) with the WAL journal,
    /// `synchronous = FULL` (a completed record survives a power loss) and a 5 s busy timeout,
    /// and creates the table ([`migrate`](Self::migrate)).
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await
            .map_err(sqlite_error)?;
        let store = SqliteStore::new(pool);
        store.migrate().await?;
        Ok(store)
    }

    /// Uses the table `table` instead of [`DEFAULT_TABLE`].
    ///
    /// # Panics
    ///
    /// If `table` is not an SQL identifier (`[A-Za-z_][A-Za-z0-9_]*`, at most 40
    /// characters): it is written into the statements as it is.
    pub fn with_table(mut self, table: &str) -> Self {
        validate_table(table, false);
        self.sql = Arc::new(Statements::new(table));
        self
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// The `CREATE TABLE IF NOT EXISTS` and `CREATE INDEX IF NOT EXISTS` statements of this
    /// store's table (the same as [`SqliteStore::SCHEMA`] for the default table).
    pub fn schema(&self) -> &str {
        &self.sql.schema
    }

    /// The pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Returns the pool.
    pub fn into_inner(self) -> SqlitePool {
        self.pool
    }

    /// Creates the table and its index if they do not exist yet ([`schema`](Self::schema)).
    /// Idempotent, and safe to call from every process at start-up.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        sqlx::raw_sql(&self.sql.schema)
            .execute(&self.pool)
            .await
            .map_err(sqlite_error)?;
        Ok(())
    }

    /// Deletes the rows whose lease or retention has expired, at most `batch_size` per
    /// statement (each a short write transaction, so claims are not held up for long), until
    /// a statement deletes fewer; returns how many rows were deleted.
    pub async fn purge_expired(&self, batch_size: u32) -> Result<u64, StoreError> {
        purge_in_batches(batch_size, |limit| async move {
            sqlx::query(&self.sql.purge)
                .bind(now_ms())
                .bind(limit)
                .execute(&self.pool)
                .await
                .map(|done| done.rows_affected())
                .map_err(sqlite_error)
        })
        .await
    }

    /// Spawns a Tokio task that runs [`purge_expired`](Self::purge_expired) with
    /// [`DEFAULT_PURGE_BATCH`] every `every`, the first time right away, logging failures with
    /// `tracing`. Abort the returned handle to stop it.
    ///
    /// # Panics
    ///
    /// When called outside a Tokio runtime.
    pub fn spawn_purge(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let store = self.clone();
        spawn_purge_task(every, "sqlite", move || {
            let store = store.clone();
            async move { store.purge_expired(DEFAULT_PURGE_BATCH).await }
        })
    }
}

impl IdempotencyStore for SqliteStore {
    async fn reserve(
        &self,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        for _ in 0..RESERVE_ATTEMPTS {
            let now = now_ms();
            let claimed = sqlx::query(&self.sql.claim)
                .bind(key.as_str())
                .bind(&claim.token().as_bytes()[..])
                .bind(&claim.fingerprint().as_bytes()[..])
                .bind(now)
                .bind(millis(lease))
                .fetch_optional(&self.pool)
                .await
                .map_err(sqlite_error)?;
            if claimed.is_some() {
                return Ok(Reservation::Acquired);
            }
            // The claim wrote nothing: a live row holds the key. Whatever this read finds is
            // the key's current state; if the row is gone (released or expired in between),
            // claim again.
            let row = sqlx::query(&self.sql.read)
                .bind(key.as_str())
                .bind(now_ms())
                .fetch_optional(&self.pool)
                .await
                .map_err(sqlite_error)?;
            let Some(row) = row else { continue };
            let state: &str = row.try_get(0).map_err(sqlite_error)?;
            let fingerprint: &[u8] = row.try_get(1).map_err(sqlite_error)?;
            let record: Option<&[u8]> = row.try_get(2).map_err(sqlite_error)?;
            return held(state, fingerprint, record);
        }
        Err(unsettled())
    }

    async fn complete(
        &self,
        key: &StoreKey,
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> Result<Completion, StoreError> {
        let done = sqlx::query(&self.sql.complete)
            .bind(key.as_str())
            .bind(&claim.token().as_bytes()[..])
            .bind(&record.fingerprint().as_bytes()[..])
            .bind(&record.encode_for(claim.token())[..])
            .bind(now_ms())
            .bind(millis(retention))
            .execute(&self.pool)
            .await
            .map_err(sqlite_error)?;
        if done.rows_affected() == 1 {
            return Ok(Completion::Written);
        }
        let row = sqlx::query(&self.sql.read_record)
            .bind(key.as_str())
            .bind(now_ms())
            .fetch_optional(&self.pool)
            .await
            .map_err(sqlite_error)?;
        let record: Option<Vec<u8>> = row
            .map(|r| r.try_get(0))
            .transpose()
            .map_err(sqlite_error)?;
        completion_after_miss(record.as_deref(), claim)
    }

    async fn release(&self, key: &StoreKey, claim: &Claim) -> Result<bool, StoreError> {
        let done = sqlx::query(&self.sql.release)
            .bind(key.as_str())
            .bind(&claim.token().as_bytes()[..])
            .bind(now_ms())
            .execute(&self.pool)
            .await
            .map_err(sqlite_error)?;
        Ok(done.rows_affected() == 1)
    }

    async fn renew(
        &self,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let now = now_ms();
        let done = sqlx::query(&self.sql.renew)
            .bind(key.as_str())
            .bind(&claim.token().as_bytes()[..])
            .bind(now)
            .bind(millis(lease))
            .execute(&self.pool)
            .await
            .map_err(sqlite_error)?;
        Ok(done.rows_affected() == 1)
    }
}

fn sqlite_error(error: sqlx::Error) -> StoreError {
    store_error(error, classify_result_code)
}

/// The kind of an SQLite error, by its (extended) result code.
fn classify_result_code(code: &str) -> StoreErrorKind {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_constant_is_the_default_tables() {
        assert_eq!(SqliteStore::SCHEMA, schema(DEFAULT_TABLE));
    }

    #[test]
    fn result_codes_are_classified() {
        assert_eq!(classify_result_code("5"), StoreErrorKind::Unavailable);
        assert_eq!(classify_result_code("517"), StoreErrorKind::Unavailable);
        assert_eq!(classify_result_code("13"), StoreErrorKind::Capacity);
        assert_eq!(classify_result_code("11"), StoreErrorKind::Corrupt);
        assert_eq!(classify_result_code("19"), StoreErrorKind::Other);
        assert_eq!(classify_result_code("x"), StoreErrorKind::Other);
    }
}
