//! rustango 0.62.0's idempotency layer (`rustango::idempotency::IdempotencyLayer`) in front of
//! the demo handler, keyed on `X-Kalipto-Delivery-Id`, over rustango's `RedisCache` when
//! `REDIS_URL` is set and its `InMemoryCache` otherwise. Bodies are capped at 1 MiB by rustango's
//! own `BodyLimitLayer` and the layer's `body_cap`; ids are kept 7 days.
//!
//! What the layer does, not this file: a duplicate gets the stored first answer replayed (200);
//! a duplicate while the first delivery still runs gets 409; a request without the header
//! passes through untouched, and the handler answers it 400; a cache error is logged and the
//! request processed anyway (the layer fails open), so this peer never answers 503.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use common::{BODY_LIMIT, DELIVERY_HEADER, Effects, RETENTION};
use rustango::body_limit::{BodyLimitLayer, BodyLimitRouterExt};
use rustango::cache::redis_backend::RedisCache;
use rustango::cache::{BoxedCache, InMemoryCache};
use rustango::idempotency::{IdempotencyLayer, IdempotencyRouterExt};

async fn kalipto(State(effects): State<Effects>, headers: HeaderMap, _body: Bytes) -> Response {
    let Some(id) = common::delivery_id(&headers) else {
        return common::missing_id();
    };
    match common::process(&effects, &headers, id).await {
        Ok(()) => common::ok(),
        Err(failed) => failed,
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cache: BoxedCache = match common::redis_url() {
        Some(url) => Arc::new(RedisCache::new(&url).await?),
        None => Arc::new(InMemoryCache::new()),
    };
    let layer = IdempotencyLayer::new(cache)
        .header(DELIVERY_HEADER)
        .ttl(RETENTION)
        .body_cap(BODY_LIMIT);
    let effects = Effects::default();
    let app = Router::new()
        .route("/webhooks/kalipto", post(kalipto))
        .idempotency(layer)
        .body_limit(BodyLimitLayer::new(BODY_LIMIT))
        .with_state(effects.clone())
        .merge(effects.router());
    common::serve(app).await?;
    Ok(())
}
