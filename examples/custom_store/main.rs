//! A record store of your own behind the layer: `MapStore` (in `store.rs`, written on the
//! crate's public API only) protects an axum route exactly as a built-in store would. The same
//! delivery is sent twice; the handler runs once.
//!
//! `cargo run --example custom_store`
//!
//! A real store keeps its keys where every instance sees them (a database, a cache server):
//! see "A store of your own" in docs/guide.md for what the contract asks of it, and
//! `tests/stores/custom.rs` for the contract suite run on this one.

mod store;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use axum::routing::post;
use tower::ServiceExt;
use tower_idempotency::IdempotencyLayer;

use self::store::MapStore;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runs = Arc::new(AtomicU32::new(0));
    let counted = runs.clone();
    let handler = move || async move {
        counted.fetch_add(1, Ordering::SeqCst);
        "processed"
    };
    let layer = IdempotencyLayer::webhook(MapStore::default()).namespace("custom");
    let app = Router::new().route("/webhooks", post(handler).route_layer(layer));

    for attempt in ["first delivery", "redelivery"] {
        let request = Request::post("/webhooks")
            .header("idempotency-key", "evt_1")
            .header("content-type", "application/json")
            .body(Body::from(r#"{"id":"evt_1"}"#))?;
        let response = app.clone().oneshot(request).await?;
        let replayed = response.headers().contains_key("idempotent-replayed");
        println!("{attempt}: {} (replayed: {replayed})", response.status());
    }
    println!("handler runs: {}", runs.load(Ordering::SeqCst));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    Ok(())
}
