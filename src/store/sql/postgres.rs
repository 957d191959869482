//! The PostgreSQL store: [`PostgresStore`], over an [`sqlx`] [`PgPool`].
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_idempotency::store::sql::PostgresStore;
//! use tower_idempotency::store::sql::sqlx::postgres::PgPoolOptions;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = PgPoolOptions::new()
//!     .max_connections(8)
//!     // Below the layer's store timeout (2 s by default), so that a database that is down is
//!     // reported as unavailable rather than waited for.
//!     .acquire_timeout(Duration::from_secs(1))
//!     .connect("postgres://app@127.0.0.1/app")
//!     .await?;
//! let store = PostgresStore::new(pool);
//! // CREATE TABLE IF NOT EXISTS: or run `PostgresStore::SCHEMA` with your own migrations.
//! store.migrate().await?;
//! // Deletes expired claims and records every ten minutes.
//! let _purge = store.spawn_purge(Duration::from_secs(600));
//! // Hand `store` to the idempotency layer.
//! # Ok(())
//! # }
//! ```
//!
//! Times are the database server's (`now()`), so application hosts with skewed clocks still
//! agree on when a lease or record expires. See the [parent module](super) for the table and
//! the statements.

use std::sync::Arc;
use std::time::Duration;

use sqlx::Row;
use sqlx::postgres::PgPool;

use super::{
    DEFAULT_PURGE_BATCH, DEFAULT_TABLE, RESERVE_ATTEMPTS, bare_name, completion_after_miss, held,
    millis, purge_in_batches, spawn_purge_task, store_error, unsettled, validate_table,
};
use crate::record::Record;
use crate::store::{
    Claim, Completion, IdempotencyStore, Reservation, StoreError, StoreErrorKind, StoreKey,
};

/// An [`IdempotencyStore`] in a PostgreSQL table.
///
/// Cheap to clone (the pool and the statements are shared). Build it over a [`PgPool`] with
/// [`PostgresStore::new`], create the table with [`migrate`](PostgresStore::migrate) (or run
/// [`PostgresStore::SCHEMA`] yourself), and purge expired rows with
/// [`purge_expired`](PostgresStore::purge_expired) or
/// [`spawn_purge`](PostgresStore::spawn_purge).
///
/// When the database cannot be reached, calls fail with [`StoreErrorKind::Unavailable`] and
/// the layer answers as configured (503 when failing closed). Note that sqlx keeps retrying a
/// refused connection until the pool's `acquire_timeout` (30 s by default): keep it below the
/// layer's store timeout, or the layer's timeout answers first.
#[derive(Clone, Debug)]
pub struct PostgresStore {
    pool: PgPool,
    sql: Arc<Statements>,
}

#[derive(Debug)]
struct Statements {
    table: String,
    schema: String,
    reserve: String,
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
            // The CTE claims the key: it inserts the row, or takes over the row in place when
            // it expired (or is our own claim, sent again). When the CTE wrote nothing, the
            // live row is read back in the same statement. $4: the lease in milliseconds.
            reserve: format!(
                "WITH claimed AS (
    INSERT INTO {table} AS cur (key, state, token, fingerprint, record, expires_at, created_at)
    VALUES ($1, 'in_flight', $2, $3, NULL, now() + $4::bigint * interval '1 millisecond', now())
    ON CONFLICT (key) DO UPDATE
        SET state = 'in_flight', token = EXCLUDED.token, fingerprint = EXCLUDED.fingerprint,
            record = NULL, expires_at = EXCLUDED.expires_at, created_at = EXCLUDED.created_at
        WHERE cur.expires_at <= now()
           OR (cur.state = 'in_flight' AND cur.token = EXCLUDED.token)
    RETURNING 1
)
SELECT true AS acquired, NULL::text AS state, NULL::bytea AS fingerprint, NULL::bytea AS record
FROM claimed
UNION ALL
SELECT false, state, fingerprint, record FROM {table}
WHERE key = $1 AND expires_at > now() AND NOT EXISTS (SELECT 1 FROM claimed)"
            ),
            complete: format!(
                "UPDATE {table}
SET state = 'completed', token = NULL, fingerprint = $3, record = $4,
    expires_at = now() + $5::bigint * interval '1 millisecond'
WHERE key = $1 AND state = 'in_flight' AND token = $2 AND expires_at > now()"
            ),
            release: format!(
                "DELETE FROM {table}
WHERE key = $1 AND state = 'in_flight' AND token = $2 AND expires_at > now()"
            ),
            renew: format!(
                "UPDATE {table} SET expires_at = now() + $3::bigint * interval '1 millisecond'
WHERE key = $1 AND state = 'in_flight' AND token = $2 AND expires_at > now()"
            ),
            read_record: format!(
                "SELECT record FROM {table}
WHERE key = $1 AND state = 'completed' AND expires_at > now()"
            ),
            // SKIP LOCKED: never wait for (nor block) a claim taking an expired row over, and
            // let several purgers share the work.
            purge: format!(
                "DELETE FROM {table}
WHERE key IN (
    SELECT key FROM {table} WHERE expires_at <= now()
    ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
) AND expires_at <= now()"
            ),
        }
    }
}

/// The `CREATE TABLE` and `CREATE INDEX` statements of `table`.
fn schema(table: &str) -> String {
    let index = bare_name(table);
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (
    key         text        PRIMARY KEY,
    state       text        NOT NULL CHECK (state IN ('in_flight', 'completed')),
    token       bytea,
    fingerprint bytea       NOT NULL,
    record      bytea,
    expires_at  timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CHECK ((state = 'in_flight') = (token IS NOT NULL)),
    CHECK ((state = 'completed') = (record IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS {index}_expires_at_idx ON {table} (expires_at);
"
    )
}

impl PostgresStore {
    /// The schema of the default table ([`DEFAULT_TABLE`]), for your own migration tool.
    /// Idempotent: `CREATE ... IF NOT EXISTS`. [`PostgresStore::schema`] gives it for another
    /// table name.
    pub const SCHEMA: &'static str = "CREATE TABLE IF NOT EXISTS idempotency_keys (
    key         text        PRIMARY KEY,
    state       text        NOT NULL CHECK (state IN ('in_flight', 'completed')),
    token       bytea,
    fingerprint bytea       NOT NULL,
    record      bytea,
    expires_at  timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CHECK ((state = 'in_flight') = (token IS NOT NULL)),
    CHECK ((state = 'completed') = (record IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);
";

    /// A store over `pool`, in the table [`DEFAULT_TABLE`].
    pub fn new(pool: PgPool) -> Self {
        PostgresStore {
            pool,
            sql: Arc::new(Statements::new(DEFAULT_TABLE)),
        }
    }

    /// Uses the table `table` instead of [`DEFAULT_TABLE`]; it may be schema-qualified
    /// (`app.idempotency_keys`).
    ///
    /// # Panics
    ///
    /// If `table` is not an SQL identifier (`[A-Za-z_][A-Za-z0-9_]*`, at most 40 characters,
    /// optionally `schema.table`): it is written into the statements as it is.
    pub fn with_table(mut self, table: &str) -> Self {
        validate_table(table, true);
        self.sql = Arc::new(Statements::new(table));
        self
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// The `CREATE TABLE IF NOT EXISTS` and `CREATE INDEX IF NOT EXISTS` statements of this
    /// store's table (the same as [`PostgresStore::SCHEMA`] for the default table).
    pub fn schema(&self) -> &str {
        &self.sql.schema
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Returns the pool.
    pub fn into_inner(self) -> PgPool {
        self.pool
    }

    /// Creates the table and its index if they do not exist yet ([`schema`](Self::schema)).
    ///
    /// Safe to call from every instance at start-up: the statements run as one transaction
    /// under an advisory lock (`pg_advisory_xact_lock`), so instances starting together do
    /// not trip over each other.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        // One simple-protocol query: PostgreSQL runs its statements as one transaction.
        let sql = format!(
            "SELECT pg_advisory_xact_lock(hashtext('tower_idempotency:{}'));\n{}",
            self.sql.table, self.sql.schema
        );
        sqlx::raw_sql(&sql)
            .execute(&self.pool)
            .await
            .map_err(pg_error)?;
        Ok(())
    }

    /// Deletes the rows whose lease or retention has expired, at most `batch_size` per
    /// statement (each a short transaction), until a statement deletes fewer; returns how
    /// many rows were deleted.
    ///
    /// Rows locked by a concurrent claim are skipped (`FOR UPDATE SKIP LOCKED`), so several
    /// instances may purge at once.
    pub async fn purge_expired(&self, batch_size: u32) -> Result<u64, StoreError> {
        purge_in_batches(batch_size, |limit| async move {
            sqlx::query(&self.sql.purge)
                .bind(limit)
                .execute(&self.pool)
                .await
                .map(|done| done.rows_affected())
                .map_err(pg_error)
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
        spawn_purge_task(every, "postgres", move || {
            let store = store.clone();
            async move { store.purge_expired(DEFAULT_PURGE_BATCH).await }
        })
    }
}

impl IdempotencyStore for PostgresStore {
    async fn reserve(
        &self,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        for _ in 0..RESERVE_ATTEMPTS {
            let row = sqlx::query(&self.sql.reserve)
                .bind(key.as_str())
                .bind(&claim.token().as_bytes()[..])
                .bind(&claim.fingerprint().as_bytes()[..])
                .bind(millis(lease))
                .fetch_optional(&self.pool)
                .await
                .map_err(pg_error)?;
            // No row: the conflicting row is not visible to this statement's snapshot (it was
            // written by a claim that committed while ours waited for it) or it expired or was
            // released in between. The next statement has a fresh snapshot.
            let Some(row) = row else { continue };
            if row.try_get::<bool, _>(0).map_err(pg_error)? {
                return Ok(Reservation::Acquired);
            }
            let state: &str = row.try_get(1).map_err(pg_error)?;
            let fingerprint: &[u8] = row.try_get(2).map_err(pg_error)?;
            let record: Option<&[u8]> = row.try_get(3).map_err(pg_error)?;
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
            .bind(millis(retention))
            .execute(&self.pool)
            .await
            .map_err(pg_error)?;
        if done.rows_affected() == 1 {
            return Ok(Completion::Written);
        }
        let row = sqlx::query(&self.sql.read_record)
            .bind(key.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(pg_error)?;
        let record: Option<Vec<u8>> = row.map(|r| r.try_get(0)).transpose().map_err(pg_error)?;
        completion_after_miss(record.as_deref(), claim)
    }

    async fn release(&self, key: &StoreKey, claim: &Claim) -> Result<bool, StoreError> {
        let done = sqlx::query(&self.sql.release)
            .bind(key.as_str())
            .bind(&claim.token().as_bytes()[..])
            .execute(&self.pool)
            .await
            .map_err(pg_error)?;
        Ok(done.rows_affected() == 1)
    }

    async fn renew(
        &self,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(&self.sql.renew)
            .bind(key.as_str())
            .bind(&claim.token().as_bytes()[..])
            .bind(millis(lease))
            .execute(&self.pool)
            .await
            .map_err(pg_error)?;
        Ok(done.rows_affected() == 1)
    }
}

fn pg_error(error: sqlx::Error) -> StoreError {
    store_error(error, classify_sqlstate)
}

/// The kind of a PostgreSQL error, by SQLSTATE.
fn classify_sqlstate(code: &str) -> StoreErrorKind {
    match code {
        // connection_exception (class 08); admin_shutdown, crash_shutdown, cannot_connect_now;
        // too_many_connections; read_only_sql_transaction (a standby after a failover).
        _ if code.starts_with("08") => StoreErrorKind::Unavailable,
        "57P01" | "57P02" | "57P03" | "53300" | "25006" => StoreErrorKind::Unavailable,
        // disk_full, out_of_memory, insufficient_resources.
        "53100" | "53200" | "53000" => StoreErrorKind::Capacity,
        // query_canceled (statement_timeout).
        "57014" => StoreErrorKind::Timeout,
        _ => StoreErrorKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_constant_is_the_default_tables() {
        assert_eq!(PostgresStore::SCHEMA, schema(DEFAULT_TABLE));
        let app = schema("app.keys");
        assert!(app.contains("CREATE TABLE IF NOT EXISTS app.keys ("));
        assert!(app.contains("CREATE INDEX IF NOT EXISTS keys_expires_at_idx ON app.keys"));
    }

    #[test]
    fn sqlstates_are_classified() {
        assert_eq!(classify_sqlstate("08006"), StoreErrorKind::Unavailable);
        assert_eq!(classify_sqlstate("57P01"), StoreErrorKind::Unavailable);
        assert_eq!(classify_sqlstate("53100"), StoreErrorKind::Capacity);
        assert_eq!(classify_sqlstate("57014"), StoreErrorKind::Timeout);
        assert_eq!(classify_sqlstate("23505"), StoreErrorKind::Other);
    }
}
