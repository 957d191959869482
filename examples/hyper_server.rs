//! A plain hyper 1 server (no framework) whose `POST /charges` runs once per `Idempotency-Key`.
//!
//! ```text
//! cargo run --example hyper_server
//! curl -i -X POST http://127.0.0.1:3001/charges -H 'Idempotency-Key: ord_1001' -d '{"amount":1999}'
//! curl -i --http2-prior-knowledge -X POST http://127.0.0.1:3001/charges \
//!     -H 'Idempotency-Key: ord_1001' -d '{"amount":1999}'
//! curl http://127.0.0.1:3001/effects
//! ```
//!
//! Binds `127.0.0.1:3001`, or `BIND` (`BIND=127.0.0.1:0` picks a free port); the first line on
//! stdout is `listening on http://ADDR`. Serves HTTP/1.1 and HTTP/2 (h2c with prior knowledge)
//! on the same port with hyper-util's `auto::Builder`; the layer wraps a `service_fn` with
//! `tower::ServiceBuilder`, and `TowerToHyperService` adapts the result for hyper.
//!
//! - `POST /charges`: answers `201 {"charge_id": ..}`; a duplicate gets
//!   `200 {"ok":true,"duplicate":true}` with `Idempotent-Replayed: true`.
//! - `GET /effects`: `{"calls": N, "charges": M}`: handler runs and charges made.
//!
//! Demo hooks (request headers) to try failures by hand: `x-demo-fail: true` answers 500 (no
//! charge, so a retry is processed again); `x-demo-delay-ms: N` sleeps N ms first (a duplicate
//! meanwhile gets 409 with `Retry-After`); `x-demo-break-body: N` answers 200 with a body that
//! fails after N bytes (not recorded either: the client got a broken response). Responses up
//! to the layer's response buffer limit (64 KiB) are held until they end, so a small broken
//! body fails the exchange before the client sees the head; past the limit the client gets
//! the head and the first bytes, then the failure.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::ServiceBuilder;
use tower_idempotency::{IdempotencyLayer, IdempotencyStore, MemoryStore, RequestBody};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = UnsyncBoxBody<Bytes, BoxError>;

/// Handler runs and charges made, shared by every connection.
#[derive(Clone, Default)]
pub struct Ledger {
    calls: Arc<AtomicU64>,
    charges: Arc<AtomicU64>,
}

impl Ledger {
    /// How many times the charge handler ran (failed attempts included).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// How many charges were made: the side effect that must happen once per key.
    pub fn charges(&self) -> u64 {
        self.charges.load(Ordering::SeqCst)
    }
}

fn json(status: StatusCode, value: serde_json::Value) -> Response<Body> {
    let body = Full::new(Bytes::from(value.to_string()))
        .map_err(|never| match never {})
        .boxed_unsync();
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body)
        .expect("a valid response")
}

fn hook(req: &Request<RequestBody<Incoming>>, name: &str) -> Option<String> {
    Some(req.headers().get(name)?.to_str().ok()?.to_owned())
}

/// A body of `len` bytes (8 KiB chunks) that then fails, as when a handler streams a result
/// and its source breaks off.
fn broken_body(len: usize) -> Body {
    let chunks = futures_util::stream::unfold(len, |left| async move {
        if left == 0 {
            // Let the server flush what it has before the failure.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let err: BoxError = "the charge could not be written".into();
            return Some((Err(err), usize::MAX));
        }
        if left == usize::MAX {
            return None;
        }
        let n = left.min(8 * 1024);
        Some((Ok(Frame::data(Bytes::from(vec![b'x'; n]))), left - n))
    });
    StreamBody::new(chunks).boxed_unsync()
}

/// The application: what runs behind the idempotency layer.
async fn handle(
    ledger: Ledger,
    req: Request<RequestBody<Incoming>>,
) -> Result<Response<Body>, Infallible> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/effects") => Ok(json(
            StatusCode::OK,
            serde_json::json!({"calls": ledger.calls(), "charges": ledger.charges()}),
        )),
        (&Method::POST, "/charges") => {
            ledger.calls.fetch_add(1, Ordering::SeqCst);
            if let Some(ms) = hook(&req, "x-demo-delay-ms").and_then(|v| v.parse::<u64>().ok()) {
                tokio::time::sleep(Duration::from_millis(ms.min(60_000))).await;
            }
            let fail = hook(&req, "x-demo-fail").is_some_and(|v| v == "true");
            let break_after = hook(&req, "x-demo-break-body").and_then(|v| v.parse().ok());
            // The exact bytes the client sent (the layer buffered them to fingerprint them).
            let body = match req.into_body().collect().await {
                Ok(body) => body.to_bytes(),
                Err(_) => {
                    return Ok(json(
                        StatusCode::BAD_REQUEST,
                        serde_json::json!({"error": "unreadable body"}),
                    ));
                }
            };
            if fail {
                return Ok(json(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    serde_json::json!({"error": "x-demo-fail was set"}),
                ));
            }
            if let Some(bytes) = break_after {
                return Ok(Response::new(broken_body(bytes)));
            }
            let n = ledger.charges.fetch_add(1, Ordering::SeqCst) + 1;
            tracing::info!(charge = n, request_bytes = body.len(), "charged");
            Ok(json(
                StatusCode::CREATED,
                serde_json::json!({"charge_id": format!("ch_{n:06}")}),
            ))
        }
        _ => Ok(json(
            StatusCode::NOT_FOUND,
            serde_json::json!({"error": "not found"}),
        )),
    }
}

/// The idempotency layer: `Idempotency-Key` header, ack mode (the defaults).
pub fn idempotency<St: IdempotencyStore>(store: St) -> IdempotencyLayer<St> {
    IdempotencyLayer::new(store).namespace("charges")
}

/// Serves `handle` behind `idempotency` on `listener`, HTTP/1.1 and HTTP/2, until the task is
/// dropped.
pub async fn serve<St: 'static>(
    listener: TcpListener,
    ledger: Ledger,
    idempotency: IdempotencyLayer<St>,
) -> std::io::Result<()> {
    let service = ServiceBuilder::new()
        .layer(idempotency)
        .service_fn(move |req| handle(ledger.clone(), req));
    loop {
        let (stream, _) = listener.accept().await?;
        let service = TowerToHyperService::new(service.clone());
        tokio::spawn(async move {
            if let Err(err) = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %err, "connection closed with an error");
            }
        });
    }
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
        .unwrap_or_else(|_| "127.0.0.1:3001".to_owned())
        .parse()?;
    let listener = TcpListener::bind(bind).await?;
    println!("listening on http://{}", listener.local_addr()?);
    serve(listener, Ledger::default(), idempotency(MemoryStore::new())).await?;
    Ok(())
}
