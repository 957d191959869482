//! The PostgreSQL store: [`PostgresStore`], over an [`sqlx`] [`PgPool`].
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_idempotency::PostgresStore;
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
//! // CREATE TABLE IF NOT EXISTS: or run `store.schema()` with your own migrations.
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

use sqlx::Postgres;
#[cfg(doc)]
use sqlx::postgres::PgPool;
use sqlx::postgres::PgQueryResult;

use super::{Dialect, SqlStore, dialect};
use crate::store::StoreErrorKind;

/// An [`IdempotencyStore`](crate::IdempotencyStore) in a PostgreSQL table, over a
/// [`PgPool`]: [`SqlStore`] on PostgreSQL.
///
/// Build it with [`PostgresStore::new`], create the table with
/// [`migrate`](SqlStore::migrate) (or run its [`schema`](SqlStore::schema) yourself), and purge
/// expired rows with [`purge_expired`](SqlStore::purge_expired) or
/// [`spawn_purge`](SqlStore::spawn_purge).
///
/// Note that sqlx keeps retrying a refused connection until the pool's `acquire_timeout`
/// (30 s by default): keep it below the layer's store timeout, or the layer's timeout answers
/// first.
pub type PostgresStore = SqlStore<Postgres>;

impl PostgresStore {
    /// The schema of the default table, written out: what the unit tests compare
    /// [`SqlStore::schema`] with.
    #[cfg(test)]
    pub(crate) const SCHEMA: &'static str = "CREATE TABLE IF NOT EXISTS idempotency_keys (
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
CREATE TABLE IF NOT EXISTS idempotency_keys_objects (
    object          text        PRIMARY KEY,
    token           bytea,
    lease_until     timestamptz,
    watermark       bytea,
    watermark_until timestamptz,
    expires_at      timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS idempotency_keys_objects_expires_at_idx ON idempotency_keys_objects (expires_at);
";
}

impl Dialect for Postgres {}

/// Relays `channel`'s notifications to `heard` until the listener fails.
async fn listen_until_error(
    pool: &sqlx::PgPool,
    channel: &str,
    heard: &(dyn Fn(Option<&str>) + Send + Sync),
) -> Result<std::convert::Infallible, sqlx::Error> {
    let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    // Listening now: what was sent before may have been missed.
    heard(None);
    loop {
        match listener.try_recv().await? {
            Some(notification) => heard(Some(notification.payload())),
            // The connection was lost and is back.
            None => heard(None),
        }
    }
}

impl dialect::Sealed for Postgres {
    const BACKEND: &'static str = "postgres";
    const QUALIFIED_TABLES: bool = true;
    // Never wait for (nor block) a claim taking an expired row over, and let several purgers
    // share the work.
    const PURGE_LOCKS: &'static str = " FOR UPDATE SKIP LOCKED";
    const BYTES: &'static str = "bytea";
    const ONE_WRITER: bool = false;
    const NOTIFIES: bool = true;
    const ADD_COLUMN_IF_NOT_EXISTS: bool = true;
    const FIND_TEXT: &'static str = "strpos";
    const GREATEST: &'static str = "greatest";
    const RESERVE: Option<&'static str> = Some(include_str!("queries/postgres/reserve.sql"));
    const RESERVE_MANY: Option<&'static str> =
        Some(include_str!("queries/postgres/reserve_many.sql"));
    const MIGRATE: &'static str = include_str!("queries/postgres/migrate.sql");

    fn now(_clock: usize) -> String {
        "now()".to_owned()
    }

    fn plus_millis(time: &str, millis: &str) -> String {
        format!("{time} + {millis}::bigint * interval '1 millisecond'")
    }

    fn millis_until(time: &str, now: &str) -> String {
        format!("floor(extract(epoch FROM ({time} - {now})) * 1000)::bigint")
    }

    fn clock() -> Option<i64> {
        None
    }

    fn schema(table: &str) -> String {
        super::schema(
            table,
            include_str!("queries/postgres/columns.sql"),
            include_str!("queries/postgres/objects.sql"),
        )
    }

    fn rows_affected(done: &PgQueryResult) -> u64 {
        done.rows_affected()
    }

    /// By SQLSTATE.
    fn classify(code: &str) -> StoreErrorKind {
        match code {
            // connection_exception (class 08); admin_shutdown, crash_shutdown,
            // cannot_connect_now; too_many_connections; read_only_sql_transaction (a standby
            // after a failover).
            _ if code.starts_with("08") => StoreErrorKind::Unavailable,
            "57P01" | "57P02" | "57P03" | "53300" | "25006" => StoreErrorKind::Unavailable,
            // disk_full, out_of_memory, insufficient_resources.
            "53100" | "53200" | "53000" => StoreErrorKind::Capacity,
            // query_canceled (statement_timeout).
            "57014" => StoreErrorKind::Timeout,
            _ => StoreErrorKind::Other,
        }
    }

    /// `pg_notify` over the rows the statement returned, sent by PostgreSQL at commit: one
    /// statement still, no round trip of its own. `channel` is a validated table name and a
    /// suffix: letters, digits, `_` and `.`, safe inside a literal.
    fn notify(statement: &str, channel: &str) -> Option<String> {
        Some(format!(
            "WITH written AS ({statement})
SELECT written.key FROM written, LATERAL (SELECT pg_notify('{channel}', written.at::text)) AS told"
        ))
    }

    /// A `PgListener`, which reconnects by itself; an error (the pool closed, say) is retried
    /// every second.
    fn listen(
        pool: &sqlx::Pool<Self>,
        channel: &str,
        heard: dialect::Heard,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let (pool, channel) = (pool.clone(), channel.to_owned());
        Some(tokio::spawn(async move {
            loop {
                let Err(error) = listen_until_error(&pool, &channel, &*heard).await;
                tracing::warn!(%error, channel, "inbox: listening for enqueues failed; polling");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }))
    }

    fn place(_pool: &sqlx::Pool<Self>) -> Option<String> {
        // Every process hears the database's `NOTIFY`.
        None
    }
}

#[cfg(test)]
mod tests {
    use super::super::DEFAULT_TABLE;
    use super::super::statements::Statements;
    use super::*;
    use crate::sql::dialect::Sealed;

    /// Moved from the integration test of a schema-qualified table (`tests/stores/postgres.rs`):
    /// a lazy pool never connects.
    #[tokio::test]
    async fn a_stores_schema_is_the_constant() {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://127.0.0.1:1/none")
            .unwrap();
        assert!(PostgresStore::SCHEMA.contains(DEFAULT_TABLE));
        assert_eq!(PostgresStore::new(pool).schema(), PostgresStore::SCHEMA);
    }

    #[test]
    fn schema_constant_is_the_default_tables() {
        assert_eq!(PostgresStore::SCHEMA, Postgres::schema(DEFAULT_TABLE));
        let app = Postgres::schema("app.keys");
        assert!(app.contains("CREATE TABLE IF NOT EXISTS app.keys ("));
        assert!(app.contains("CREATE INDEX IF NOT EXISTS keys_expires_at_idx ON app.keys"));
        assert!(app.contains("CREATE TABLE IF NOT EXISTS app.keys_objects ("));
        assert!(app.contains("keys_objects_expires_at_idx ON app.keys_objects (expires_at)"));
    }

    #[test]
    fn statements_read_the_server_clock() {
        let sql = Statements::new::<Postgres>("t");
        assert!(sql.read_live.is_none());
        let many = sql.reserve_many.unwrap();
        assert!(many.contains("AS keys ORDER BY key\nON CONFLICT (key) DO UPDATE"));
        assert!(
            sql.reserve
                .starts_with("WITH claimed AS (\nINSERT INTO t AS cur")
        );
        assert_eq!(
            sql.renew,
            "UPDATE t SET expires_at = now() + $3::bigint * interval '1 millisecond'
WHERE key = $1 AND state = 'in_flight' AND token = $2 AND expires_at > now()"
        );
        assert!(sql.purge.contains("LIMIT $1 FOR UPDATE SKIP LOCKED\n"));
        assert!(sql.migrate.starts_with(
            "SELECT pg_advisory_xact_lock(hashtext('tower_idempotency:t'));
SET LOCAL client_min_messages = warning;
CREATE TABLE"
        ));
    }

    #[test]
    fn sqlstates_are_classified() {
        assert_eq!(Postgres::classify("08006"), StoreErrorKind::Unavailable);
        assert_eq!(Postgres::classify("57P01"), StoreErrorKind::Unavailable);
        assert_eq!(Postgres::classify("53100"), StoreErrorKind::Capacity);
        assert_eq!(Postgres::classify("57014"), StoreErrorKind::Timeout);
        assert_eq!(Postgres::classify("23505"), StoreErrorKind::Other);
    }
}
