//! The smallest receiver: one webhook route behind [`IdempotencyLayer`], nothing else.
//!
//! ```text
//! cargo run --release --example layer_receiver --features redis
//! ```
//!
//! It speaks the demo's benchmark interface (`BIND`, first stdout line `listening on
//! http://ADDR`, `POST /webhooks/kalipto` keyed by `X-Kalipto-Delivery-Id`, `x-demo-fail`,
//! `x-demo-delay-ms`, `GET /effects`, `REDIS_URL` or `DATABASE_URL`) with none of the demo's
//! extras: no metrics recorder, no log subscriber, no other routes, `axum::serve`. Loaded
//! beside the demo and the hand-written peers (`scripts/compare`), it tells what the layer
//! costs from what the demo around it costs.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde_json::{Value, json};
use tower_idempotency::key::HeaderKey;
use tower_idempotency::store::{AnyStore, connect};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, MemoryStore};

type Effects = Arc<Mutex<BTreeMap<String, u64>>>;

/// Sleeps `x-demo-delay-ms`, fails on `x-demo-fail: true`, else counts one effect.
async fn webhook(
    State(effects): State<Effects>,
    Extension(key): Extension<IdempotencyKey>,
    headers: HeaderMap,
) -> Response {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(ms) = header("x-demo-delay-ms").and_then(|v| v.parse::<u64>().ok()) {
        tokio::time::sleep(Duration::from_millis(ms.min(60_000))).await;
    }
    if header("x-demo-fail").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return (StatusCode::INTERNAL_SERVER_ERROR, "x-demo-fail was set").into_response();
    }
    *effects.lock().unwrap().entry(key.to_string()).or_default() += 1;
    Json(json!({"ok": true})).into_response()
}

async fn effects(State(effects): State<Effects>) -> Json<Value> {
    let by_key = effects.lock().unwrap();
    Json(json!({"total": by_key.values().sum::<u64>(), "by_key": *by_key}))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store: AnyStore =
        match std::env::var("REDIS_URL").or_else(|_| std::env::var("DATABASE_URL")) {
            Ok(url) => connect(&url).await?,
            Err(_) => MemoryStore::new().into(),
        };
    let layer = IdempotencyLayer::webhook(store)
        .namespace("kalipto")
        .retention(Duration::from_secs(7 * 24 * 3600))
        .key(HeaderKey::new("x-kalipto-delivery-id")?);
    let app = Router::new()
        .route("/webhooks/kalipto", post(webhook).route_layer(layer))
        .route("/effects", get(effects))
        .with_state(Effects::default());
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(bind).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
