//! The demo interface the comparison's receivers speak, shared by the peers.
//!
//! - `BIND` (default `127.0.0.1:3000`, `127.0.0.1:0` for a free port); the first stdout line is
//!   `listening on http://ADDR`, flushed.
//! - `POST /webhooks/kalipto`, keyed by `X-Kalipto-Delivery-Id`: the handler sleeps
//!   `x-demo-delay-ms` ms when set, answers 500 on `x-demo-fail: true` without counting, else
//!   counts one effect for the id and answers 200 `{"ok":true}`.
//! - `GET /effects` -> `{"total": N, "by_key": {"<id>": count}}`.
//! - `REDIS_URL`, when set, selects the peer's Redis backend.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, State};
use axum::handler::Handler;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

/// The delivery id header (header names are matched case-insensitively).
pub const DELIVERY_HEADER: &str = "x-kalipto-delivery-id";

/// The request body limit of every receiver in the comparison: 1 MiB.
pub const BODY_LIMIT: usize = 1 << 20;

/// How long a delivery id is remembered: 7 days, as Kalipto's guide says.
pub const RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// The side effects performed: one count per delivery id.
#[derive(Clone, Default)]
pub struct Effects {
    inner: Arc<Mutex<Counts>>,
}

#[derive(Default)]
struct Counts {
    total: u64,
    by_key: BTreeMap<String, u64>,
}

impl Effects {
    fn count(&self, id: &str) {
        let mut counts = self.inner.lock().unwrap();
        counts.total += 1;
        match counts.by_key.get_mut(id) {
            Some(n) => *n += 1,
            None => {
                counts.by_key.insert(id.to_owned(), 1);
            }
        }
    }

    /// The `GET /effects` route, to merge outside any idempotency layer.
    pub fn router(&self) -> Router {
        async fn show(State(effects): State<Effects>) -> Json<serde_json::Value> {
            let counts = effects.inner.lock().unwrap();
            Json(json!({ "total": counts.total, "by_key": counts.by_key }))
        }
        Router::new().route("/effects", get(show)).with_state(self.clone())
    }
}

/// The delivery id of a request, if it has one that is text and not empty.
pub fn delivery_id(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(DELIVERY_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|id| !id.is_empty())
}

/// The processing of one delivery: sleep `x-demo-delay-ms` if set, then fail (no effect) on
/// `x-demo-fail: true`, else count one effect for `id`. `Err` is the answer to give (500).
pub async fn process(effects: &Effects, headers: &HeaderMap, id: &str) -> Result<(), Response> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    if let Some(ms) = text("x-demo-delay-ms").and_then(|v| v.parse::<u64>().ok()) {
        tokio::time::sleep(Duration::from_millis(ms.min(60_000))).await;
    }
    if text("x-demo-fail").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Err(answer(StatusCode::INTERNAL_SERVER_ERROR, "x-demo-fail was set"));
    }
    effects.count(id);
    Ok(())
}

/// 200 `{"ok":true}`: processed, or a duplicate of a delivery that was.
pub fn ok() -> Response {
    Json(json!({ "ok": true })).into_response()
}

/// 400: no delivery id.
pub fn missing_id() -> Response {
    answer(StatusCode::BAD_REQUEST, "missing X-Kalipto-Delivery-Id")
}

/// 503: the store could not be asked or written; the sender should retry.
pub fn store_unavailable() -> Response {
    answer(StatusCode::SERVICE_UNAVAILABLE, "store unavailable")
}

fn answer(status: StatusCode, error: &str) -> Response {
    (status, Json(json!({ "ok": false, "error": error }))).into_response()
}

/// `REDIS_URL`, if set and not blank.
pub fn redis_url() -> Option<String> {
    std::env::var("REDIS_URL").ok().filter(|url| !url.trim().is_empty())
}

/// The state of a hand-written receiver: where it marks deliveries, and the effects.
#[derive(Clone)]
pub struct App<Seen> {
    pub seen: Seen,
    pub effects: Effects,
}

/// Serves a hand-written receiver: `kalipto` on `POST /webhooks/kalipto` (at most
/// [`BODY_LIMIT`] bytes) with an [`App`] marking deliveries in `seen`, and `GET /effects`;
/// see [`serve`].
pub async fn serve_receiver<Seen, H, T>(seen: Seen, kalipto: H) -> std::io::Result<()>
where
    Seen: Clone + Send + Sync + 'static,
    H: Handler<T, App<Seen>>,
    T: 'static,
{
    let effects = Effects::default();
    let app = Router::new()
        .route("/webhooks/kalipto", post(kalipto))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(App { seen, effects: effects.clone() })
        .merge(effects.router());
    serve(app).await
}

/// Binds `BIND`, prints `listening on http://ADDR` (flushed) and serves `app` until killed.
pub async fn serve(app: Router) -> std::io::Result<()> {
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on http://{}", listener.local_addr()?)?;
    stdout.flush()?;
    drop(stdout);
    axum::serve(listener, app).await
}
