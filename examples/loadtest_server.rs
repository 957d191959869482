//! The server behind `scripts/loadtest`: one axum router, bare or behind the idempotency
//! layer, on the memory store or on Redis. Not a demo: see `webhook_receiver` for that.
//!
//! ```text
//! VARIANT=memory cargo run --release --all-features --example loadtest_server
//! VARIANT=redis REDIS_URL=redis://127.0.0.1:6379 cargo run --release --all-features --example loadtest_server
//! ```
//!
//! - `VARIANT`: `bare` (no layer), `memory` (the layer on a `MemoryStore`) or `redis` (the
//!   layer on a `RedisStore` over a fred pool of `REDIS_POOL` connections, default 4);
//! - `BIND`: the address, default `127.0.0.1:0` (a free port); the first line on stdout is
//!   `listening on http://ADDR`;
//! - `WORKERS`: Tokio worker threads, default 1 (the load test pins the server to one core);
//! - `SPIN_NS` (`bare` only): nanoseconds of CPU the handler burns per request, to calibrate
//!   what a given per-request cost does to req/s on this machine (default 0);
//! - `PREFILL` (`memory` only): completed ack-mode records written into the store before the
//!   server starts, to measure how cost grows with the keys held (`scripts/scale`);
//! - `INBOX_WORKERS` (`redis` only): entries the server's inbox [`Worker`] runs at once, with
//!   the instant handler; `0` (the default) receives only, so that entries wait (the drain
//!   measurement of `scripts/inbox_bench` fills the inbox with 0, then restarts with workers);
//! - `INBOX_STARTED` (`redis` only): set, the handler records when it starts each entry, for
//!   `GET /inbox/started/{id}` (off by default: a drain should not pay for the record).
//!
//! Routes, both `POST`, keyed by the `Idempotency-Key` header with the layer's defaults (10 s
//! lease, renewed; 72 h retention, payload fingerprint on):
//! - `/webhook`: ack mode; reads the body, answers `200 {"ok":true}`;
//! - `/orders`: replay mode; answers `201` with a `location` header and a small JSON order;
//! - `GET /keys` (memory variant): the number of keys the memory store holds;
//! - `/inbox` (redis variant): **inbox mode** on a `RedisInbox` named `loadtest` (same pool as
//!   the store), keyed like `/webhook`: 202 once the entry is stored, the handler left to the
//!   workers; `GET /inbox` gives `{"pending":N,"in_flight":N,"dead":N}`, and
//!   `GET /inbox/started/{correlation_id}` when the workers' handler started the entry of that
//!   `X-Request-Id` (microseconds since the epoch; 404 before, and without `INBOX_STARTED`),
//!   for the wake-up latency of `scripts/inbox_bench`.
//!
//! [`Worker`]: tower_idempotency::inbox::Worker

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use tower_idempotency::{IdempotencyLayer, IdempotencyStore, MemoryStore, Mode};

/// Every delivery the load test sends is kept: the memory store must not refuse keys.
const MEMORY_MAX_ENTRIES: usize = 50_000_000;

async fn webhook(body: Bytes) -> impl IntoResponse {
    std::hint::black_box(body);
    (
        [(header::CONTENT_TYPE, "application/json")],
        r#"{"ok":true}"#,
    )
}

async fn order(body: Bytes) -> impl IntoResponse {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    std::hint::black_box(body);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    (
        StatusCode::CREATED,
        [
            (header::CONTENT_TYPE, "application/json".to_owned()),
            (header::LOCATION, format!("/orders/ord_{id:08}")),
        ],
        format!(r#"{{"order_id":"ord_{id:08}","status":"created"}}"#),
    )
}

fn bare() -> Router {
    let spin = std::env::var("SPIN_NS")
        .ok()
        .and_then(|ns| ns.parse().ok())
        .map(std::time::Duration::from_nanos)
        .unwrap_or_default();
    if spin.is_zero() {
        return Router::new()
            .route("/webhook", post(webhook))
            .route("/orders", post(order));
    }
    let spinning = move |body: Bytes| async move {
        let started = std::time::Instant::now();
        while started.elapsed() < spin {
            std::hint::spin_loop();
        }
        webhook(body).await
    };
    Router::new()
        .route("/webhook", post(spinning))
        .route("/orders", post(order))
}

fn protected<St: IdempotencyStore>(store: St) -> Router {
    let ack = IdempotencyLayer::new(store.clone()).namespace("loadtest");
    let replay = IdempotencyLayer::new(store)
        .namespace("loadtest")
        .mode(Mode::Replay);
    Router::new()
        .route("/webhook", post(webhook).route_layer(ack))
        .route("/orders", post(order).route_layer(replay))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let workers = std::env::var("WORKERS")
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or(1);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()?
        .block_on(serve())
}

async fn serve() -> Result<(), Box<dyn std::error::Error>> {
    let variant = std::env::var("VARIANT").unwrap_or_else(|_| "memory".to_owned());
    let router = match variant.as_str() {
        "bare" => bare(),
        "memory" => {
            let store = MemoryStore::new()
                .with_max_entries(MEMORY_MAX_ENTRIES)
                .with_max_bytes(usize::MAX);
            prefill(&store).await?;
            let keys = store.clone();
            protected(store).route("/keys", get(move || async move { keys.len().to_string() }))
        }
        "redis" => redis().await?,
        other => return Err(format!("unknown VARIANT {other:?}: bare, memory or redis").into()),
    };
    let bind: SocketAddr = std::env::var("BIND")
        .unwrap_or_else(|_| "127.0.0.1:0".to_owned())
        .parse()?;
    let listener = tokio::net::TcpListener::bind(bind).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router).await?;
    Ok(())
}

/// Writes `PREFILL` completed ack records (default none), as earlier deliveries would have.
async fn prefill(store: &MemoryStore) -> Result<(), Box<dyn std::error::Error>> {
    use std::time::Duration;
    use tower_idempotency::fingerprint::Fingerprint;
    use tower_idempotency::store::{StoreKey, Target};
    use tower_idempotency::test_util::values;

    let count: u64 = match std::env::var("PREFILL") {
        Ok(n) => n.parse()?,
        Err(_) => return Ok(()),
    };
    let (lease, retention) = (Duration::from_secs(60), Duration::from_secs(72 * 3600));
    for i in 0..count {
        let key = [Target::key(StoreKey::new(
            "prefill",
            None,
            &format!("evt_{i:012}"),
        ))];
        let claim = values::claim(Fingerprint::of_bytes(b"{}"));
        store.reserve(&key, &claim, lease).await?;
        let record = values::record_ack(claim.fingerprint());
        store.complete(&key, &claim, &record, retention).await?;
    }
    Ok(())
}

/// The routes on Redis: `/webhook` and `/orders` on a `RedisStore`, `/inbox` in inbox mode on a
/// `RedisInbox`, one fred pool for both; the inbox's workers when `INBOX_WORKERS` is set.
#[cfg(feature = "redis")]
async fn redis() -> Result<Router, Box<dyn std::error::Error>> {
    use tower_idempotency::RedisStore;
    use tower_idempotency::inbox::{InboxLayer, InboxStore, RedisInbox};

    let pool = redis_pool().await?;
    let mut store = RedisStore::new(pool.clone());
    // So that the first completion does not pay a NOSCRIPT round trip.
    store.load_scripts().await?;
    let mut inbox = RedisInbox::new(pool, "loadtest");
    // `REDIS_WAIT_REPLICAS=N` (`REDIS_WAIT_TIMEOUT_MS`, default 50): durable completions and
    // inbox writes, as the demo sets them.
    if let Ok(replicas) = std::env::var("REDIS_WAIT_REPLICAS") {
        let timeout = std::env::var("REDIS_WAIT_TIMEOUT_MS").map_or(Ok(50), |ms| ms.parse())?;
        let timeout = std::time::Duration::from_millis(timeout);
        store = store.durable_completion(replicas.parse()?, timeout);
        inbox = inbox.durable(replicas.parse()?, timeout);
    }
    let layer = InboxLayer::new(inbox.clone()).namespace("loadtest-inbox");
    let workers: usize = match std::env::var("INBOX_WORKERS") {
        Ok(n) => n.parse()?,
        Err(_) => 0,
    };
    let started = Started(std::env::var_os("INBOX_STARTED").map(|_| std::sync::Arc::default()));
    if workers > 0 {
        tokio::spawn(work(inbox.clone(), workers, started.clone()));
    }
    let counts = move || {
        let inbox = inbox.clone();
        async move {
            let counts = inbox.counts().await.map_err(|e| e.to_string())?;
            Ok::<_, String>(format!(
                r#"{{"pending":{},"in_flight":{},"dead":{}}}"#,
                counts.pending, counts.in_flight, counts.dead
            ))
        }
    };
    let started_at = move |axum::extract::Path(id): axum::extract::Path<String>| {
        let at = (started.0.as_ref()).and_then(|map| map.lock().unwrap().get(&id).copied());
        async move { at.map(|at| at.to_string()).ok_or(StatusCode::NOT_FOUND) }
    };
    Ok(protected(store)
        .route("/inbox", post(webhook).route_layer(layer).get(counts))
        .route("/inbox/started/{id}", get(started_at)))
}

/// When the handler started each entry, by correlation id (microseconds since the epoch);
/// forgotten past 100 000 entries. `None`: not recorded.
#[cfg(feature = "redis")]
#[derive(Clone)]
#[allow(clippy::type_complexity)]
struct Started(Option<std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>>>);

#[cfg(feature = "redis")]
impl Started {
    fn now(&self, correlation_id: &str) {
        let Some(map) = &self.0 else { return };
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_micros() as u64);
        let mut started = map.lock().unwrap();
        if started.len() >= 100_000 {
            started.clear();
        }
        started.insert(correlation_id.to_owned(), at);
    }
}

/// Runs the inbox's entries through the instant handler, `workers` at a time, until the process
/// ends. The handler is the one `/webhook` runs on the request path, so that the drain rate
/// compares with the synchronous route's.
#[cfg(feature = "redis")]
async fn work(inbox: tower_idempotency::inbox::RedisInbox, workers: usize, started: Started) {
    use tower_idempotency::inbox::{InboxRequest, Worker};

    let handler = tower::service_fn(move |request: InboxRequest| {
        started.now(request.correlation_id());
        async move {
            let response = webhook(request.body().clone()).await.into_response();
            std::hint::black_box(response);
            Ok::<(), std::convert::Infallible>(())
        }
    });
    // Idle, the workers wait for the inbox's wake-ups (its defaults), not a poll.
    Worker::new(inbox, handler)
        .namespace("loadtest-inbox")
        .workers(workers)
        .run(std::future::pending())
        .await;
}

#[cfg(feature = "redis")]
async fn redis_pool() -> Result<tower_idempotency::fred::clients::Pool, Box<dyn std::error::Error>>
{
    use std::time::Duration;
    use tower_idempotency::fred::prelude::*;

    let url = std::env::var("REDIS_URL").map_err(|_| "VARIANT=redis needs REDIS_URL")?;
    let size = std::env::var("REDIS_POOL")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let pool = Builder::from_config(Config::from_url(&url)?)
        .with_connection_config(|c| c.connection_timeout = Duration::from_secs(2))
        .with_performance_config(|p| p.default_command_timeout = Duration::from_secs(2))
        .set_policy(ReconnectPolicy::new_constant(0, 100))
        .build_pool(size)?;
    pool.init().await?;
    Ok(pool)
}

#[cfg(not(feature = "redis"))]
async fn redis() -> Result<Router, Box<dyn std::error::Error>> {
    Err("VARIANT=redis needs the `redis` feature".into())
}
