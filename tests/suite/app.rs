//! The inner service of the suite: axum handlers with a visible, counted side effect.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body::Frame;
use http_body_util::StreamBody;
use tower_idempotency::{BatchItems, IdempotencyLayer, key::ExtractKey};

/// Side effects performed by the handlers.
#[derive(Clone, Default)]
pub struct Effects {
    started: Arc<AtomicUsize>,
    completed: Arc<AtomicUsize>,
    /// Effects per batch item (`/items`).
    items: Arc<Mutex<HashMap<String, usize>>>,
    /// Events applied by `/ordered`, and each object's state.
    ordered: Arc<Mutex<Ordered>>,
    /// Handlers asked to hold (`x-demo-hold`) wait until it is open ([`Effects::open_gate`]).
    gate: Arc<tokio::sync::watch::Sender<bool>>,
}

/// What `/ordered` applied: each event's effects, in order, and each object's state (the
/// position of the last event applied to it).
#[derive(Default, Clone, Debug)]
pub struct Ordered {
    pub effects: HashMap<String, usize>,
    pub state: HashMap<String, i64>,
    /// `(event, object, seq, stale)` in the order applied (`stale`: passed on marked stale).
    pub log: Vec<(String, String, i64, bool)>,
}

impl Effects {
    /// How many times an effect handler ran (started).
    pub fn total(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    /// How many effect handlers ran to their end.
    pub fn completed(&self) -> usize {
        self.completed.load(Ordering::SeqCst)
    }

    /// How many times the batch item `id` was applied.
    pub fn item(&self, id: &str) -> usize {
        self.items.lock().unwrap().get(id).copied().unwrap_or(0)
    }

    /// Every item applied, with its count.
    pub fn items(&self) -> HashMap<String, usize> {
        self.items.lock().unwrap().clone()
    }

    /// What `/ordered` applied.
    pub fn ordered(&self) -> Ordered {
        self.ordered.lock().unwrap().clone()
    }

    /// Lets the handlers held by `x-demo-hold` go on (and every later one pass).
    pub fn open_gate(&self) {
        self.gate.send_replace(true);
    }

    /// Waits until `n` handlers have started (at most 10 s: a loaded machine can be slow to
    /// get there, and nothing is decided by how long it took).
    pub async fn wait_started(&self, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.total() < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "handler never started"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Where a handler works: `x-demo-delay-ms: N` takes N ms; `x-demo-hold` holds it until the
/// test opens the gate (an in-flight window that no machine is too slow for).
async fn work(effects: &Effects, headers: &HeaderMap) {
    if let Some(ms) = headers
        .get("x-demo-delay-ms")
        .and_then(|v| v.to_str().ok()?.parse().ok())
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if headers.contains_key("x-demo-hold") {
        let mut gate = effects.gate.subscribe();
        gate.wait_for(|open| *open).await.expect("the gate is kept");
    }
}

async fn effect(State(effects): State<Effects>, headers: HeaderMap, _body: Bytes) -> Response {
    let n = effects.started.fetch_add(1, Ordering::SeqCst) + 1;
    work(&effects, &headers).await;
    if headers.contains_key("x-demo-panic") {
        panic!("handler panicked on purpose");
    }
    effects.completed.fetch_add(1, Ordering::SeqCst);
    if headers.contains_key("x-demo-fail") {
        return (StatusCode::INTERNAL_SERVER_ERROR, "failed on purpose").into_response();
    }
    (
        StatusCode::CREATED,
        [("x-handler", "effect")],
        format!("effect {n}"),
    )
        .into_response()
}

/// Applies the new items of a batch once each, in order; `x-fail-item: <id>` fails at that
/// item (500) after reporting the ones before it done.
async fn items(
    State(effects): State<Effects>,
    items: Option<Extension<BatchItems>>,
    headers: HeaderMap,
) -> Response {
    effects.started.fetch_add(1, Ordering::SeqCst);
    work(&effects, &headers).await;
    let Some(Extension(items)) = items else {
        return (StatusCode::CREATED, "no items").into_response();
    };
    let fail_at = headers.get("x-fail-item").map(|v| v.as_bytes().to_vec());
    let mut applied = Vec::new();
    for item in items.new_items() {
        if fail_at.as_deref() == Some(item.as_bytes()) {
            return (StatusCode::INTERNAL_SERVER_ERROR, "failed on purpose").into_response();
        }
        *effects
            .items
            .lock()
            .unwrap()
            .entry(item.to_owned())
            .or_default() += 1;
        items.mark_done(item);
        applied.push(item.to_owned());
    }
    effects.completed.fetch_add(1, Ordering::SeqCst);
    let done_before = items.done_before().collect::<Vec<_>>().join(",");
    (
        StatusCode::CREATED,
        [("x-done-before", done_before)],
        applied.join(","),
    )
        .into_response()
}

/// Applies an ordered event `{"event_id", "object", "seq"}`: sets the object's state to `seq`
/// (last writer wins: only the layer keeps an older event from overwriting a newer one).
/// `x-demo-fail` fails it (500) without an effect; `x-demo-delay-ms` or `x-demo-hold` delays it.
async fn ordered(
    State(effects): State<Effects>,
    stale: Option<Extension<tower_idempotency::order::StaleEvent>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    effects.started.fetch_add(1, Ordering::SeqCst);
    work(&effects, &headers).await;
    if headers.contains_key("x-demo-fail") {
        return (StatusCode::INTERNAL_SERVER_ERROR, "failed on purpose").into_response();
    }
    let event: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let (id, object) = (
        event["event_id"].as_str().unwrap(),
        event["object"].as_str().unwrap(),
    );
    let seq = event["seq"].as_i64().unwrap();
    let mut log = effects.ordered.lock().unwrap();
    *log.effects.entry(id.to_owned()).or_default() += 1;
    if stale.is_none() {
        log.state.insert(object.to_owned(), seq);
    }
    log.log
        .push((id.to_owned(), object.to_owned(), seq, stale.is_some()));
    effects.completed.fetch_add(1, Ordering::SeqCst);
    (StatusCode::CREATED, "applied").into_response()
}

async fn trailers(State(effects): State<Effects>) -> Response {
    let n = effects.started.fetch_add(1, Ordering::SeqCst) + 1;
    let mut trailers = HeaderMap::new();
    trailers.insert("x-checksum", format!("sum-{n}").parse().unwrap());
    let frames = futures_util::stream::iter([
        Ok::<_, std::io::Error>(Frame::data(Bytes::from(format!("order {n}")))),
        Ok(Frame::trailers(trailers)),
    ]);
    Response::builder()
        .status(StatusCode::CREATED)
        .header("content-type", "text/plain")
        .header("location", "/orders/1")
        .header("set-cookie", "session=secret")
        .body(Body::new(StreamBody::new(frames)))
        .unwrap()
}

async fn broken_body(State(effects): State<Effects>) -> Response {
    effects.started.fetch_add(1, Ordering::SeqCst);
    let frames = futures_util::stream::iter([
        Ok(Frame::data(Bytes::from_static(b"partial"))),
        Err(std::io::Error::other("the handler's stream broke")),
    ]);
    Response::new(Body::new(StreamBody::new(frames)))
}

async fn large(State(effects): State<Effects>) -> Response {
    effects.started.fetch_add(1, Ordering::SeqCst);
    let frames = futures_util::stream::iter(
        (0..64).map(|_| Ok::<_, std::io::Error>(Frame::data(Bytes::from(vec![b'x'; 1024])))),
    );
    Response::new(Body::new(StreamBody::new(frames)))
}

/// The suite's router: the layer on every covered route (route_layer: unknown paths stay 404).
pub fn router<St: 'static, K: ExtractKey + Clone>(
    layer: IdempotencyLayer<St, K>,
    effects: &Effects,
) -> Router {
    Router::new()
        .route("/effect", post(effect).put(effect))
        .route("/trailers", post(trailers))
        .route("/broken-body", post(broken_body))
        .route("/large", post(large))
        .route("/items", post(items))
        .route("/ordered", post(ordered))
        .route("/echo", get(|| async { "get ok" }))
        .route_layer(layer)
        .with_state(effects.clone())
}
