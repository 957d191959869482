//! Receivers and workers in separate processes on one shared inbox (issue #33).
//!
//! One binary, two roles (the first argument, else `ROLE`):
//!
//! - `receiver`: serves `POST /inbox` in **inbox mode** (keyed by `$.event_id`, correlation id
//!   from `X-Request-Id`): 202 at once, a duplicate acknowledged with `Idempotent-Replayed`;
//!   `GET /inbox` gives the inbox's counts. `BIND` (`127.0.0.1:3000`); the first line of stdout
//!   is `listening on http://ADDR`.
//! - `worker`: runs a [`Worker`] (`WORKERS` entries at once, 2; lease `LEASE_MS`, 10 000) until
//!   Ctrl-C. Its handler sleeps the body's optional `"delay_ms"` first (so that a test can kill
//!   it mid-entry), then applies the event's effect where every process can check it. The first
//!   line of stdout is `worker ready`.
//!
//! The inbox is shared through a store (one of them must be set):
//!
//! - `DATABASE_URL=sqlite://FILE` or `postgres://...`: `SqliteInbox` / `PostgresInbox`
//!   (migrated at start). The effect is a row of the `effects` table (`applied` counts the
//!   applications), written in the handler's transaction with `SqlInbox::complete_in_tx`: the
//!   effect and the done key commit together, so a worker killed at any point leaves either
//!   both or neither, and the event is applied exactly once.
//! - `REDIS_URL=redis://...`: `RedisInbox` (`INBOX_NAME`, `events`). The effect is an `INCR` of
//!   `inbox_worker:effect:<event_id>`, then the worker completes: at least once (a worker killed
//!   between the two applies it again after the lease).
//!
//! ```sh
//! cargo build --example inbox_worker --features redis,sqlite,postgres
//! export DATABASE_URL=sqlite:///tmp/inbox.db
//! target/debug/examples/inbox_worker receiver &
//! target/debug/examples/inbox_worker worker & target/debug/examples/inbox_worker worker &
//! curl -si localhost:3000/inbox -H 'X-Request-Id: req-1' -d '{"event_id":"ev_1"}'
//! curl -s localhost:3000/inbox
//! sqlite3 /tmp/inbox.db 'SELECT * FROM effects'
//! ```

use std::str::FromStr;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use tower_idempotency::fred::prelude::{
    Builder, ClientLike, Config, KeysInterface, Pool, ReconnectPolicy,
};
use tower_idempotency::inbox::{
    InboxRequest, InboxRoute, InboxStore, PostgresInbox, RedisInbox, SqliteInbox, Worker,
};
use tower_idempotency::key::JsonPathKey;
use tower_idempotency::{IdempotencyLayer, MemoryStore};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a done key dedups: the worker's and the handler's completions agree on it.
const RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// The shared inbox, from `REDIS_URL` or `DATABASE_URL`.
enum Shared {
    Redis(RedisInbox, Pool),
    Sqlite(SqliteInbox),
    Postgres(PostgresInbox),
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let role = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("ROLE").ok())
        .ok_or("the role (receiver or worker) is the first argument or ROLE")?;
    let shared = Shared::from_env().await?;
    match (role.as_str(), shared) {
        ("receiver", Shared::Redis(inbox, _)) => receive(inbox).await,
        ("receiver", Shared::Sqlite(inbox)) => receive(inbox).await,
        ("receiver", Shared::Postgres(inbox)) => receive(inbox).await,
        ("worker", Shared::Redis(inbox, pool)) => work(inbox.clone(), redis_effect(pool)).await,
        ("worker", Shared::Sqlite(inbox)) => work(inbox.clone(), sqlite_effect(inbox)).await,
        ("worker", Shared::Postgres(inbox)) => work(inbox.clone(), postgres_effect(inbox)).await,
        (other, _) => Err(format!("unknown role {other:?}: receiver or worker").into()),
    }
}

impl Shared {
    async fn from_env() -> Result<Self, BoxError> {
        if let Ok(url) = std::env::var("REDIS_URL") {
            let pool = Builder::from_config(Config::from_url(&url)?)
                .set_policy(ReconnectPolicy::new_constant(0, 100))
                .build_pool(2)?;
            pool.init().await?;
            let name = std::env::var("INBOX_NAME").unwrap_or_else(|_| "events".to_owned());
            return Ok(Shared::Redis(RedisInbox::new(pool.clone(), &name), pool));
        }
        let url = std::env::var("DATABASE_URL").map_err(|_| "set REDIS_URL or DATABASE_URL")?;
        if url.starts_with("postgres") {
            let inbox = PostgresInbox::new(sqlx::PgPool::connect(&url).await?);
            inbox.migrate().await?;
            let effects = "CREATE TABLE IF NOT EXISTS effects \
                 (event_id TEXT PRIMARY KEY, applied BIGINT NOT NULL)";
            sqlx::query(effects).execute(inbox.pool()).await?;
            return Ok(Shared::Postgres(inbox));
        }
        // Several processes write one file: WAL, and writers wait for each other's lock.
        let options = SqliteConnectOptions::from_str(&url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        let inbox = SqliteInbox::new(pool);
        inbox.migrate().await?;
        let effects = "CREATE TABLE IF NOT EXISTS effects \
             (event_id TEXT PRIMARY KEY, applied INTEGER NOT NULL)";
        sqlx::query(effects).execute(inbox.pool()).await?;
        Ok(Shared::Sqlite(inbox))
    }
}

/// The receiver: `POST /inbox` in inbox mode, `GET /inbox` the counts.
async fn receive<St: InboxStore + Clone>(inbox: St) -> Result<(), BoxError> {
    // In inbox mode the inbox itself knows every key (queued, running, dead, done): the
    // layer's record store is not where duplicates are found.
    let layer = IdempotencyLayer::webhook(MemoryStore::new())
        .key(JsonPathKey::new("$.event_id")?)
        .inbox(InboxRoute::new(inbox.clone()));
    let app = Router::new()
        .route("/inbox", post(|| async {}).route_layer(layer))
        .route("/inbox", get(counts::<St>))
        .with_state(inbox);
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(bind).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

async fn counts<St: InboxStore>(State(inbox): State<St>) -> Response {
    match inbox.counts().await {
        Ok(c) => {
            axum::Json(json!({"pending": c.pending, "in_flight": c.in_flight, "dead": c.dead}))
                .into_response()
        }
        Err(err) => (http::StatusCode::SERVICE_UNAVAILABLE, err.to_string()).into_response(),
    }
}

/// The worker: `WORKERS` entries at once under a `LEASE_MS` lease, until Ctrl-C.
async fn work<St, S>(inbox: St, handler: S) -> Result<(), BoxError>
where
    St: InboxStore,
    S: tower::Service<InboxRequest, Response = (), Error = BoxError> + Clone + Send + 'static,
    S::Future: Send,
{
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let worker = Worker::new(inbox, handler)
        .namespace("inbox-worker")
        .workers(env("WORKERS", 2) as usize)
        .lease(Duration::from_millis(env("LEASE_MS", 10_000)))
        .retention(RETENTION);
    println!("worker ready");
    worker
        .run(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
    Ok(())
}

/// The event id, after the body's optional `"delay_ms"`.
async fn event_id(request: &InboxRequest) -> Result<String, BoxError> {
    let event: Value = serde_json::from_slice(request.body())?;
    if let Some(ms) = event["delay_ms"].as_u64() {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let id = event["event_id"]
        .as_str()
        .ok_or("the event has no event_id")?;
    Ok(id.to_owned())
}

/// SQL: the effect's row and the entry's completion in one transaction (one body for both
/// databases: a macro, as sqlx's executor bounds do not read well generically).
macro_rules! sql_effect {
    ($name:ident, $inbox:ty) => {
        fn $name(
            inbox: $inbox,
        ) -> impl tower::Service<InboxRequest, Response = (), Error = BoxError, Future: Send>
        + Clone
        + Send {
            tower::service_fn(move |request: InboxRequest| {
                let inbox = inbox.clone();
                async move {
                    let id = event_id(&request).await?;
                    let mut tx = inbox.pool().begin().await?;
                    // `applied` counts: a second application shows as 2, not as a no-op.
                    sqlx::query(
                        "INSERT INTO effects (event_id, applied) VALUES ($1, 1) \
                         ON CONFLICT (event_id) DO UPDATE SET applied = effects.applied + 1",
                    )
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                    let done = inbox
                        .complete_in_tx(&mut tx, request.key(), request.token(), RETENTION)
                        .await?;
                    if !done {
                        // Another worker holds the entry now: the effect rolls back with `tx`.
                        return Err("lease lost before the effect committed".into());
                    }
                    tx.commit().await?;
                    Ok::<_, BoxError>(())
                }
            })
        }
    };
}
sql_effect!(sqlite_effect, SqliteInbox);
sql_effect!(postgres_effect, PostgresInbox);

/// Redis: an `INCR` of the event's counter, then the worker completes.
fn redis_effect(
    pool: Pool,
) -> impl tower::Service<InboxRequest, Response = (), Error = BoxError, Future: Send> + Clone + Send
{
    tower::service_fn(move |request: InboxRequest| {
        let pool = pool.clone();
        async move {
            let id = event_id(&request).await?;
            let _: i64 = pool.incr(format!("inbox_worker:effect:{id}")).await?;
            Ok::<_, BoxError>(())
        }
    })
}
