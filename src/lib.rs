//! Tower middleware that makes HTTP and gRPC receivers idempotent.
//!
//! Webhook senders and API clients deliver **at least once**: network retries, timeouts, a
//! worker that crashed after doing the work. [`IdempotencyLayer`] turns that into an
//! exactly-once effect:
//!
//! 1. it buffers the request body (bounded, 413 past the limit) and derives a key from a header,
//!    JSON paths in the body, a fingerprint of chosen fields, a fallback chain or a closure
//!    ([`key`]);
//! 2. it **claims** the key atomically in a [`store`] (in-memory, Redis via `fred`) with a short
//!    lease;
//! 3. it calls the inner service once, and **records** the key only when the response
//!    succeeded (2xx; `grpc-status: 0` for gRPC) and its body completed; any other outcome
//!    (error status, `Err`, panic, dropped future, failed body) **releases** the claim so the
//!    sender's retry is processed again;
//! 4. duplicates are short-circuited: `200 {"ok":true,"duplicate":true}` (ack mode) or the
//!    original response (replay mode), with `Idempotent-Replayed: true`; a duplicate while
//!    the first is still in flight gets 409 with `Retry-After`, never a 2xx.
//!
//! | situation | response | inner service called |
//! |---|---|---|
//! | method not covered (GET/HEAD/OPTIONS/TRACE by default) | passes through untouched | yes |
//! | body over the limit (`Content-Length` first, then while reading) | 413 problem+json | no |
//! | body slower than the read timeout (when set) | 408 problem+json | no |
//! | key missing | 400 problem+json (default) or pass through, [`MissingKey`] | no / yes |
//! | key malformed (too long, control characters, body not JSON) | 400 problem+json | no |
//! | first time | the inner response, unchanged | once |
//! | duplicate of a completed key, same payload | ack or replay, `Idempotent-Replayed: true` | no |
//! | duplicate while the first is in flight | 409 problem+json + `Retry-After` | no |
//! | key reused with a different payload | 422 problem+json; ack on webhook routes ([`OnMismatch`]) | no |
//! | store unreachable or timed out | 503 + `Retry-After` (or fail open, [`FailureMode`]) | no / yes |
//!
//! gRPC requests (`content-type: application/grpc*`) get the same protection with gRPC
//! statuses instead (see [`rejection`]).
//!
//! # axum
//!
//! ```
//! use axum::{routing::post, Router};
//! use tower_idempotency::{IdempotencyLayer, key::HeaderKey, store::MemoryStore};
//!
//! async fn kalipto_webhook(body: axum::body::Bytes) -> &'static str {
//!     // ... apply the event exactly once ...
//!     "ok"
//! }
//!
//! let store = MemoryStore::new();
//! let app: Router = Router::new()
//!     .route("/webhooks/kalipto", post(kalipto_webhook))
//!     // route_layer: unknown paths stay 404 instead of being asked for a key.
//!     .route_layer(
//!         IdempotencyLayer::new(store)
//!             .namespace("kalipto")
//!             .key(HeaderKey::new("X-Kalipto-Delivery-Id")?),
//!     );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # tonic
//!
//! gRPC metadata is a header, so the key is a [`HeaderKey`](key::HeaderKey); success is the
//! final `grpc-status: 0`, duplicates get the original reply, and the layer's own answers are
//! gRPC statuses. `examples/grpc_receiver.rs` is the runnable program.
//!
//! ```no_run
//! use tonic::service::Routes;
//! use tonic::transport::Server;
//! use tower_idempotency::{IdempotencyLayer, key::HeaderKey, store::MemoryStore};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let idempotency = IdempotencyLayer::new(MemoryStore::new())
//!     .namespace("payments")
//!     .key(HeaderKey::idempotency_key());
//! Server::builder()
//!     .layer(idempotency)
//!     // .add_service(PaymentsServer::new(MyPayments::default()))
//!     .add_routes(Routes::default())
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # hyper
//!
//! ```
//! use std::convert::Infallible;
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::Full;
//! use tower::ServiceBuilder;
//! use tower_idempotency::{IdempotencyLayer, RequestBody, store::MemoryStore};
//!
//! async fn handle(_req: Request<RequestBody<hyper::body::Incoming>>) -> Result<Response<Full<Bytes>>, Infallible> {
//!     Ok(Response::new(Full::new(Bytes::from_static(b"charged"))))
//! }
//!
//! let service = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::new(MemoryStore::new()))
//!     .service_fn(handle);
//! // Serve `service` with hyper-util's `TowerToHyperService` and `auto::Builder`.
//! # let _ = service;
//! ```
//!
//! # Guarantees and limits
//!
//! - Two concurrent identical requests never both reach the inner service while the first
//!   attempt is alive: its lease is renewed every third of the lease for as long as the inner
//!   service runs and its response streams, however slow the handler.
//! - A crashed owner (no more renewals) frees its key within about one lease (10 s by
//!   default), so the sender's next retry is processed.
//! - A duplicate is never answered 2xx before the first attempt has succeeded and been recorded.
//! - A batch keyed per item ([`key::JsonPathKey::each`]) applies every item once, across
//!   overlapping batches; the handler sees which items are new in [`BatchItems`].
//! - If recording fails after success (the store went down in between), it is retried while
//!   the claim is alive, the response still goes out, and at worst the claim expires with its
//!   lease (a later duplicate is then processed again).
#![warn(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod body;
mod classify;
mod config;
pub mod defaults;
pub mod fingerprint;
mod future;
mod guard;
mod items;
pub mod key;
mod layer;
pub mod observe;
mod outcome;
pub mod rejection;
mod service;
pub mod store;
pub use self::store::record;
mod util;

pub use self::body::{RequestBody, ResponseBody};
pub use self::config::{AckResponse, FailureMode, MissingKey, Mode, OnMismatch, Scope};
pub use self::future::ResponseFuture;
pub use self::items::BatchItems;
pub use self::key::IdempotencyKey;
pub use self::layer::IdempotencyLayer;
pub use self::observe::OutcomeEvent;
pub use self::outcome::Outcome;
pub use self::service::{IDEMPOTENT_REPLAYED, Idempotency};
pub use self::store::{CachedStore, IdempotencyStore, MemoryStore};

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use self::store::redis::RedisStore;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use self::store::sql::PostgresStore;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use self::store::sql::SqliteStore;
/// The Redis client the Redis store runs on, re-exported so that its version always matches.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use fred;

/// The README's code blocks, compiled and run as doctests (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
