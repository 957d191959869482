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
//! - `POST /webhooks/kalipto`: keyed by `X-Kalipto-Delivery-Id`.
//! - `POST /webhooks/meta`: keyed by every WhatsApp message id and Instagram mid of the batch.
//! - `POST /webhooks/sangho`: keyed by `Sangho-Event-ID`, else the body's `$.id`.
//! - `POST /webhooks/email`: keyed by `$.event_id`; applies the message-status transition.
//! - `POST /api/orders`: replay mode, keyed by `Idempotency-Key`; answers 201 with an order id.
//! - `GET /effects`: `{"total": N, "by_key": {"<id>": count}}` of side effects performed.
//! - `GET /messages/{message_id}`: `{"message_id": .., "status": ..}`.
//! - `GET /metrics`: Prometheus text; the layer's `idempotency_*` metrics need the crate
//!   feature `metrics` (`--all-features` or `--features metrics`).
//!
//! Logs go to stderr through `tracing-subscriber`; `RUST_LOG` is respected (default
//! `info,tower_idempotency=debug`).
//!
//! On every webhook route, `x-demo-fail: true` makes the handler answer 500 (no effect) and
//! `x-demo-delay-ms: N` makes it sleep N ms first, so retries and concurrent duplicates can be
//! seen with curl.

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
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, IdempotencyStore, MemoryStore, Mode};

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
fn app<St: IdempotencyStore>(store: St, metrics: PrometheusHandle) -> Router {
    let retention = Duration::from_secs(72 * 3600);
    let kalipto = IdempotencyLayer::new(store.clone())
        .namespace("kalipto")
        .retention(retention)
        .key(HeaderKey::new("X-Kalipto-Delivery-Id").unwrap());
    let meta = IdempotencyLayer::new(store.clone())
        .namespace("meta")
        .retention(retention)
        .key(
            JsonPathKey::new("$.entry[*].changes[*].value.messages[*].id")
                .unwrap()
                .or(JsonPathKey::new("$.entry[*].messaging[*].message.mid").unwrap()),
        );
    let sangho = IdempotencyLayer::new(store.clone())
        .namespace("sangho")
        .retention(Duration::from_secs(7 * 24 * 3600))
        .key(
            HeaderKey::new("Sangho-Event-ID")
                .unwrap()
                .or(JsonPathKey::new("$.id").unwrap()),
        );
    let email_layer = IdempotencyLayer::new(store.clone())
        .namespace("email")
        .retention(retention)
        .key(JsonPathKey::new("$.event_id").unwrap());
    let orders = IdempotencyLayer::new(store)
        .namespace("orders")
        .retention(Duration::from_secs(24 * 3600))
        .mode(Mode::Replay);

    Router::new()
        .route("/webhooks/kalipto", post(webhook).route_layer(kalipto))
        .route("/webhooks/meta", post(webhook).route_layer(meta))
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
                .unwrap_or_else(|_| "info,tower_idempotency=debug".into()),
        )
        .with_writer(std::io::stderr)
        .init();

    let bind: SocketAddr = std::env::var("BIND")
        .unwrap_or_else(|_| "127.0.0.1:3000".to_owned())
        .parse()?;
    let metrics = PrometheusBuilder::new().install_recorder()?;
    let router = match (std::env::var("REDIS_URL"), std::env::var("DATABASE_URL")) {
        (Ok(url), _) => app(connect_redis(&url).await?, metrics),
        (_, Ok(url)) if url.starts_with("postgres") => app(connect_postgres(&url).await?, metrics),
        (_, Ok(url)) => app(open_sqlite(&url).await?, metrics),
        _ => app(MemoryStore::new(), metrics),
    };
    let listener = tokio::net::TcpListener::bind(bind).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router).await?;
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
        .build_pool(4)?;
    pool.init().await?;
    tracing::info!("using the Redis store");
    Ok(tower_idempotency::RedisStore::new(pool))
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
