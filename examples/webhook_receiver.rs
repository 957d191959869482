//! A webhook receiver that applies every delivery exactly once.
//!
//! ```text
//! cargo run --example webhook_receiver
//! ```
//!
//! Binds `127.0.0.1:3000`, or `BIND` (`BIND=127.0.0.1:0` picks a free port); the first line on
//! stdout is `listening on http://ADDR`. The store is the embedded memory store, or Redis when
//! `REDIS_URL` is set (`REDIS_URL=redis://127.0.0.1:6379`), or SQL when `DATABASE_URL` is set
//! (`postgres://user@host/db` or `sqlite://receiver.db`; features `postgres` / `sqlite`).
//!
//! Routes (all `POST` routes are protected; each shares the one store and the one effect
//! counter):
//! - `POST /webhooks/kalipto`: keyed by `X-Kalipto-Delivery-Id`; kept 7 days.
//! - `POST /webhooks/meta`: **one key per message**: every WhatsApp message id (wamid) and
//!   Instagram mid of the batch is claimed and recorded on its own, and the handler applies only
//!   the new ones; a batch without message ids (WhatsApp status callbacks: sent, delivered,
//!   read) falls back to `X-Kalipto-Delivery-Id`. Kept 72 hours.
//! - `POST /webhooks/sangho`: keyed by `Sangho-Event-ID`, else the body's `$.id`; kept 72
//!   hours (Sangho never redelivers after 48).
//! - `POST /webhooks/email`: keyed by `$.event_id`; applies the message-status transition.
//! - `POST /api/orders`: the API profile (replay mode, `Idempotency-Key`, 422 when a key is
//!   reused with another payload); answers 201 with an order id.
//! - `GET /effects`: `{"total": N, "by_key": {"<id>": count}}` of side effects performed
//!   (`by_key` holds message ids for Meta batches, delivery or event ids elsewhere).
//! - `GET /messages/{message_id}`: `{"message_id": .., "status": ..}`.
//! - `GET /metrics`: Prometheus text; the layer's `idempotency_*` metrics need the crate
//!   feature `metrics` (`--all-features` or `--features metrics`).
//!
//! Logs go to stderr through `tracing-subscriber`; `RUST_LOG` is respected (default
//! `info,tower_idempotency=debug`).
//!
//! Webhook routes use the webhook profile ([`IdempotencyLayer::webhook`]: a duplicate, or a
//! redelivery whose JSON was re-serialized, is acknowledged, never a 4xx).
//! `IDEMPOTENCY_LEASE_MS` sets the lease (default 10 s; renewed while a handler runs).
//!
//! On every webhook route, `x-demo-fail: true` makes the handler answer 500 (no effect) and
//! `x-demo-delay-ms: N` makes it sleep N ms first, so retries and concurrent duplicates can be
//! seen with curl. On `/webhooks/meta`, `x-demo-fail-item: <message id>` applies the batch's
//! new messages in order and fails (500) at that one: the messages applied before it are
//! reported done and recorded, so the retry applies only the rest.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::{Value, json};
use tower_idempotency::key::{HeaderKey, JsonPathKey};
use tower_idempotency::{
    BatchItems, IdempotencyKey, IdempotencyLayer, IdempotencyStore, MemoryStore,
};

/// The receiver's visible state: side effects performed, and message statuses.
#[derive(Clone, Default)]
struct AppState {
    effects: Arc<Mutex<Effects>>,
    messages: Arc<Mutex<HashMap<String, &'static str>>>,
}

#[derive(Default)]
struct Effects {
    total: u64,
    by_key: BTreeMap<String, u64>,
    next_order: u64,
}

impl AppState {
    fn record(&self, key: &IdempotencyKey) {
        let mut effects = self.effects.lock().unwrap();
        effects.total += 1;
        for part in key.parts() {
            *effects.by_key.entry(part.to_owned()).or_default() += 1;
        }
    }

    /// One effect per message of a batch.
    fn record_item(&self, item: &str) {
        let mut effects = self.effects.lock().unwrap();
        effects.total += 1;
        *effects.by_key.entry(item.to_owned()).or_default() += 1;
    }
}

/// `x-demo-delay-ms` and `x-demo-fail`, for trying retries and concurrency by hand.
async fn demo_behaviour(headers: &HeaderMap) -> Option<Response> {
    if let Some(ms) = headers
        .get("x-demo-delay-ms")
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
    {
        tokio::time::sleep(Duration::from_millis(ms.min(60_000))).await;
    }
    let fail = headers
        .get("x-demo-fail")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
    fail.then(|| {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({"error": "x-demo-fail was set"})),
        )
            .into_response()
    })
}

async fn webhook(
    State(state): State<AppState>,
    Extension(key): Extension<IdempotencyKey>,
    headers: HeaderMap,
) -> Response {
    if let Some(failure) = demo_behaviour(&headers).await {
        return failure;
    }
    state.record(&key);
    Json(json!({"ok": true})).into_response()
}

/// Meta: applies each new message of the batch once; a status callback (no message id, keyed
/// by its delivery id) is one effect.
async fn meta(
    State(state): State<AppState>,
    Extension(key): Extension<IdempotencyKey>,
    items: Option<Extension<BatchItems>>,
    headers: HeaderMap,
) -> Response {
    if let Some(failure) = demo_behaviour(&headers).await {
        return failure;
    }
    let Some(Extension(items)) = items else {
        state.record(&key);
        return Json(json!({"ok": true})).into_response();
    };
    let fail_at = headers.get("x-demo-fail-item").map(|v| v.as_bytes());
    let mut applied = 0;
    for item in items.new_items() {
        if fail_at == Some(item.as_bytes()) {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(json!({"error": "x-demo-fail-item was set", "applied": applied})),
            )
                .into_response();
        }
        state.record_item(item);
        // Reported as it goes: recorded even if a later message fails.
        items.mark_done(item);
        applied += 1;
    }
    Json(json!({"ok": true, "applied": applied})).into_response()
}

/// The rank of an email message status; a status never moves back to a lower rank.
fn email_status(event_type: &str) -> Option<(&'static str, u8)> {
    match event_type.strip_prefix("email.")? {
        "received" => Some(("received", 0)),
        "processed" => Some(("processed", 1)),
        "delivered" => Some(("delivered", 2)),
        "failed" => Some(("failed", 2)),
        _ => None,
    }
}

fn rank(status: &str) -> u8 {
    email_status(&format!("email.{status}")).map_or(0, |(_, rank)| rank)
}

async fn email(
    State(state): State<AppState>,
    Extension(key): Extension<IdempotencyKey>,
    headers: HeaderMap,
    Json(event): Json<Value>,
) -> Response {
    if let Some(failure) = demo_behaviour(&headers).await {
        return failure;
    }
    let (Some(message_id), Some(event_type)) =
        (event["message_id"].as_str(), event["type"].as_str())
    else {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"error": "message_id and type are required"})),
        )
            .into_response();
    };
    state.record(&key);
    let Some((status, new_rank)) = email_status(event_type) else {
        tracing::info!(
            event_type,
            "email event without a status change; acknowledged"
        );
        return Json(json!({"ok": true, "applied": false})).into_response();
    };
    let mut messages = state.messages.lock().unwrap();
    let current = messages.get(message_id).copied();
    let applied = match current {
        Some(current) if rank(current) >= new_rank && current != status => {
            tracing::info!(
                message_id,
                current,
                ignored = status,
                "out-of-order email event; the status does not move back"
            );
            false
        }
        _ => {
            messages.insert(message_id.to_owned(), status);
            true
        }
    };
    Json(json!({"ok": true, "applied": applied})).into_response()
}

async fn message(State(state): State<AppState>, Path(message_id): Path<String>) -> Response {
    match state.messages.lock().unwrap().get(&message_id) {
        Some(status) => Json(json!({"message_id": message_id, "status": status})).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({"error": "unknown message"})),
        )
            .into_response(),
    }
}

async fn create_order(
    State(state): State<AppState>,
    Extension(key): Extension<IdempotencyKey>,
    headers: HeaderMap,
) -> Response {
    if let Some(failure) = demo_behaviour(&headers).await {
        return failure;
    }
    state.record(&key);
    let order_id = {
        let mut effects = state.effects.lock().unwrap();
        effects.next_order += 1;
        format!("ord_{:06}", effects.next_order)
    };
    (
        StatusCode::CREATED,
        [("location", format!("/api/orders/{order_id}"))],
        Json(json!({"order_id": order_id})),
    )
        .into_response()
}

async fn effects(State(state): State<AppState>) -> Json<Value> {
    let effects = state.effects.lock().unwrap();
    Json(json!({"total": effects.total, "by_key": effects.by_key}))
}

/// The receiver's routes, every webhook protected on `store`.
fn app<St: IdempotencyStore>(store: St, metrics: PrometheusHandle, lease: Duration) -> Router {
    const HOUR: u64 = 3600;
    let delivery_id = || HeaderKey::new("X-Kalipto-Delivery-Id").expect("a valid header name");
    let json = |path: &str| JsonPathKey::new(path).expect("a valid JSONPath");
    // Kalipto retries within 9 hours; ids are kept 7 days.
    let kalipto = IdempotencyLayer::webhook(store.clone())
        .namespace("kalipto")
        .lease(lease)
        .retention(Duration::from_secs(7 * 24 * HOUR))
        .key(delivery_id());
    // Meta: deduplicate at the message level; status callbacks carry no message id.
    let messages = JsonPathKey::each_of([
        "$.entry[*].changes[*].value.messages[*].id",
        "$.entry[*].messaging[*].message.mid",
    ])
    .expect("valid JSONPaths");
    let meta_layer = IdempotencyLayer::webhook(store.clone())
        .namespace("meta")
        .lease(lease)
        .retention(Duration::from_secs(72 * HOUR))
        .key(messages.or(delivery_id()));
    // Sangho never redelivers after 48 hours; ids are kept 72.
    let sangho = IdempotencyLayer::webhook(store.clone())
        .namespace("sangho")
        .lease(lease)
        .retention(Duration::from_secs(72 * HOUR))
        .key(
            HeaderKey::new("Sangho-Event-ID")
                .expect("a valid header name")
                .or(json("$.id")),
        );
    let email_layer = IdempotencyLayer::webhook(store.clone())
        .namespace("email")
        .lease(lease)
        .retention(Duration::from_secs(72 * HOUR))
        .key(json("$.event_id"));
    let orders = IdempotencyLayer::api(store)
        .namespace("orders")
        .lease(lease);

    Router::new()
        .route("/webhooks/kalipto", post(webhook).route_layer(kalipto))
        .route("/webhooks/meta", post(meta).route_layer(meta_layer))
        .route("/webhooks/sangho", post(webhook).route_layer(sangho))
        .route("/webhooks/email", post(email).route_layer(email_layer))
        .route("/api/orders", post(create_order).route_layer(orders))
        .route("/effects", get(effects))
        .route("/messages/{message_id}", get(message))
        .route(
            "/metrics",
            get(move || std::future::ready(metrics.render())),
        )
        .with_state(AppState::default())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // `info`: no line per first delivery (those are `debug`); duplicates,
                // conflicts, releases and store errors are logged.
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();

    let bind: SocketAddr = std::env::var("BIND")
        .unwrap_or_else(|_| "127.0.0.1:3000".to_owned())
        .parse()?;
    // Histograms with buckets (what `histogram_quantile` in docs/operations.md reads, and what
    // aggregates across instances), from 100 µs to 10 s; summaries would cost a quantile
    // sketch update per sample.
    let metrics = PrometheusBuilder::new()
        .set_buckets(&[
            0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
            2.5, 5.0, 10.0,
        ])?
        .install_recorder()?;
    // The recorder keeps histogram samples until they are drained: drain them regularly, so
    // memory stays flat when nobody scrapes `/metrics`.
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    let lease = match std::env::var("IDEMPOTENCY_LEASE_MS") {
        Ok(ms) => Duration::from_millis(ms.parse()?),
        Err(_) => tower_idempotency::defaults::LEASE,
    };
    let router = match (std::env::var("REDIS_URL"), std::env::var("DATABASE_URL")) {
        (Ok(url), _) => app(connect_redis(&url).await?, metrics, lease),
        (_, Ok(url)) if url.starts_with("postgres") => {
            app(connect_postgres(&url).await?, metrics, lease)
        }
        (_, Ok(url)) => app(open_sqlite(&url).await?, metrics, lease),
        _ => app(MemoryStore::new(), metrics, lease),
    };
    let listener = tokio::net::TcpListener::bind(bind).await?;
    println!("listening on http://{}", listener.local_addr()?);
    serve(listener, router).await
}

/// Serves `router` until Ctrl-C, then lets requests in flight finish (up to 10 s): a claim is
/// never left to expire because the process stopped mid-request. A client that does not send
/// its request head within 10 s is disconnected, so idle half-open connections cannot starve
/// the server of file descriptors.
async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
) -> Result<(), Box<dyn std::error::Error>> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto;
    use hyper_util::server::graceful::GracefulShutdown;
    use hyper_util::service::TowerToHyperService;

    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(10));
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(tokio::signal::ctrl_c());
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    tracing::warn!(error = %err, "accept failed");
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let service = TowerToHyperService::new(router.clone());
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
        let connection = graceful.watch(connection.into_owned());
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(error = %err, "connection closed with an error");
            }
        });
    }
    tracing::info!("shutting down: waiting for requests in flight");
    if tokio::time::timeout(Duration::from_secs(10), graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("requests still in flight after 10 s; stopping anyway");
    }
    Ok(())
}

#[cfg(feature = "redis")]
async fn connect_redis(
    url: &str,
) -> Result<tower_idempotency::RedisStore, Box<dyn std::error::Error>> {
    use tower_idempotency::fred::prelude::*;
    let config = Config::from_url(url)?;
    let pool = Builder::from_config(config)
        .with_connection_config(|c| c.connection_timeout = Duration::from_secs(2))
        .set_policy(ReconnectPolicy::new_exponential(0, 100, 2_000, 2))
        .build_pool(redis_pool_size())?;
    pool.init().await?;
    tracing::info!("using the Redis store");
    Ok(tower_idempotency::RedisStore::new(pool))
}

/// `REDIS_POOL_SIZE`: connections to Redis (default 2).
#[cfg(feature = "redis")]
fn redis_pool_size() -> usize {
    std::env::var("REDIS_POOL_SIZE")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2)
}

#[cfg(feature = "postgres")]
async fn connect_postgres(
    url: &str,
) -> Result<tower_idempotency::PostgresStore, Box<dyn std::error::Error>> {
    use tower_idempotency::store::sql::sqlx::postgres::PgPoolOptions;
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(1))
        .connect(url)
        .await?;
    let store = tower_idempotency::PostgresStore::new(pool);
    store.migrate().await?;
    // Expired rows are purged every 10 minutes, in batches.
    drop(store.spawn_purge(Duration::from_secs(600)));
    tracing::info!("using the PostgreSQL store");
    Ok(store)
}

#[cfg(not(feature = "postgres"))]
async fn connect_postgres(_url: &str) -> Result<MemoryStore, Box<dyn std::error::Error>> {
    Err("DATABASE_URL is a postgres:// URL but the `postgres` feature is off".into())
}

#[cfg(feature = "sqlite")]
async fn open_sqlite(
    url: &str,
) -> Result<tower_idempotency::SqliteStore, Box<dyn std::error::Error>> {
    let path = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .ok_or("DATABASE_URL must start with postgres:// or sqlite://")?;
    let store = tower_idempotency::SqliteStore::open(path).await?;
    drop(store.spawn_purge(Duration::from_secs(600)));
    tracing::info!(path, "using the SQLite store");
    Ok(store)
}

#[cfg(not(feature = "sqlite"))]
async fn open_sqlite(_url: &str) -> Result<MemoryStore, Box<dyn std::error::Error>> {
    Err("DATABASE_URL is a sqlite:// URL but the `sqlite` feature is off".into())
}

#[cfg(not(feature = "redis"))]
async fn connect_redis(_url: &str) -> Result<MemoryStore, Box<dyn std::error::Error>> {
    Err("REDIS_URL is set but the `redis` feature is off".into())
}
