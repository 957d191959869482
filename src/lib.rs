//! Tower middleware that makes HTTP and gRPC receivers idempotent.
//!
//! Webhook senders and API clients deliver **at least once**: network retries, timeouts, a
//! worker that crashed after doing the work. [`IdempotencyLayer`] turns that into an
//! exactly-once effect, in this order for every covered request:
//!
//! 1. **read** the body, bounded (413 past the limit);
//! 2. **verify** its signature over the exact bytes that arrived, when the route verifies
//!    ([`verify`]: Standard Webhooks, Stripe-style, GitHub/Meta, Shopify, Slack, or your own):
//!    a forged request gets 401 and never reaches the store, so it can neither hold a genuine
//!    delivery's key nor learn which ids exist;
//! 3. derive the **key** from a header, JSON paths in the body, a fingerprint of chosen
//!    fields, a fallback chain or a closure ([`key`]), and, on routes that order events, each
//!    event's object and position ([`order`]);
//! 4. **claim** the key atomically (Redis `SET NX PX`, SQL `INSERT ... ON CONFLICT`, one
//!    critical section in memory) with a short lease, renewed while the handler runs;
//! 5. **call** the inner service once;
//! 6. **settle**: record the key only when the response succeeded (2xx; `grpc-status: 0` for
//!    gRPC) and its body completed; anything else (error status, `Err`, panic, dropped
//!    future, failed body) releases the claim, so the sender's retry is processed again.
//!
//! Duplicates are short-circuited: an acknowledgement (webhook routes) or a replay of the
//! original response (API routes), with `Idempotent-Replayed: true`; a duplicate while the
//! first is still in flight gets 409 with `Retry-After`, never a 2xx.
//!
//! | situation | response | inner service called |
//! |---|---|---|
//! | method not covered (GET/HEAD/OPTIONS/TRACE by default) | passes through untouched | yes |
//! | body over the limit (`Content-Length` first, then while reading) | 413 problem+json | no |
//! | body slower than the read timeout (when set) | 408 problem+json | no |
//! | signature missing, malformed, not matching, or timestamp outside the tolerance (verified routes) | 401 problem+json; nothing claimed | no |
//! | key missing | 400 problem+json (default) or pass through, [`MissingKey`] | no / yes |
//! | key malformed (too long, control characters, body not JSON) | 400 problem+json | no |
//! | first time | the inner response, unchanged | once |
//! | duplicate of a completed key, same payload | ack or replay, `Idempotent-Replayed: true` | no |
//! | duplicate while the first is in flight | 409 problem+json + `Retry-After` | no |
//! | event older than what was processed for its object (ordered routes) | 200 `Idempotent-Stale: true` | no (or, by option, marked stale) |
//! | another event of the same object in flight (ordered routes) | 409 problem+json + `Retry-After` | no |
//! | key reused with a different payload | 422 problem+json; ack on webhook routes ([`OnMismatch`]) | no |
//! | store unreachable or timed out | 503 + `Retry-After` (or fail open, [`FailureMode`]) | no / yes |
//!
//! gRPC requests (`content-type: application/grpc*`) get the same protection with gRPC
//! statuses instead (see [`rejection`]).
//!
//! # axum
//!
//! One layer per route, from a profile: [`IdempotencyLayer::webhook`] (ack duplicates, ack a
//! payload mismatch under a known id) or [`IdempotencyLayer::api`] (replay the original
//! response, 422 on a mismatch).
//!
//! ```
//! use axum::{Router, routing::post};
//! use tower_idempotency::key::HeaderKey;
//! use tower_idempotency::{IdempotencyLayer, MemoryStore};
//!
//! async fn kalipto_webhook(body: axum::body::Bytes) -> &'static str {
//!     // ... apply the event exactly once ...
//!     "ok"
//! }
//!
//! let store = MemoryStore::new(); // or RedisStore, PostgresStore, SqliteStore, store::connect(url)
//! let kalipto = IdempotencyLayer::webhook(store.clone())
//!     .namespace("kalipto")
//!     .key(HeaderKey::new("X-Kalipto-Delivery-Id")?);
//! let orders = IdempotencyLayer::api(store).namespace("orders");
//! let app: Router = Router::new()
//!     // route_layer: unknown paths stay 404 instead of being asked for a key.
//!     .route("/webhooks/kalipto", post(kalipto_webhook).route_layer(kalipto))
//!     .route("/orders", post(|| async { "created" }).route_layer(orders));
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
//! use tower_idempotency::{IdempotencyLayer, MemoryStore, key::HeaderKey};
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
//! use tower_idempotency::{IdempotencyLayer, MemoryStore, RequestBody};
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
//! # Stores
//!
//! One trait, [`IdempotencyStore`] (reserve, complete, release, renew; and their batch and
//! ordered forms), and four backends tested against the real thing: [`MemoryStore`] (always
//! there: one process, bounded), [`RedisStore`] (feature `redis`: standalone, cluster,
//! sentinel), [`PostgresStore`] and [`SqliteStore`] (features `postgres`, `sqlite`); or one
//! chosen at run time from a URL with [`store::connect`]. A layer puts a local cache of
//! completed records in front of a store that talks to a server
//! ([`IdempotencyLayer::local_cache`]).
//!
//! # Observability
//!
//! Each covered request has a `tracing` span `idempotency{namespace, method, key, outcome,
//! store_ms}` (the key hashed, never raw); outcomes ([`Outcome`]) are logged at the right
//! levels, and what an outsider can cause at will (forgeries, malformed requests, a store
//! that refuses) at most once per outcome and reason every 10 s, with the count left out
//! ([`IdempotencyLayer::log_interval`]); bodies, tokens, secrets and signatures never are. With the `metrics` feature,
//! through the `metrics` facade:
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `idempotency_requests_total` | counter | `namespace`, `outcome`, `reason` | one per covered request, by [`Outcome`] (`reason`: the rejection's code or the verification failure's, else `none`) |
//! | `idempotency_store_duration_seconds` | histogram | `namespace`, `operation` | latency of `reserve`, `complete`, `release`, `renew` (not for a store that answers in process, see [`IdempotencyStore::in_process`]) |
//! | `idempotency_store_errors_total` | counter | `namespace`, `operation` | failed store calls (timeouts included) |
//! | `idempotency_inner_duration_seconds` | histogram | `namespace` | time the inner service took to answer (from the end of the reserve to the response head) |
//! | `idempotency_lease_lost_total` | counter | `namespace` | claims found lost before their owner finished (a renewal or completion that found the key taken or gone) |
//! | `idempotency_memory_evictions_total` | counter | none | records the memory store evicted early to make room |
//! | `idempotency_memory_effective_retention_seconds` | gauge | none | how old the youngest record evicted was: the retention the memory store really gives |
//! | `idempotency_inbox_*` | counters, gauges | `namespace` | the inbox's workers: attempts, retries, dead letters, stale settlements, pending, in flight, oldest age, dead ([docs/inbox.md](https://github.com/tower-idempotency/tower-idempotency/blob/main/docs/inbox.md), "What to watch") |
//!
//! [`IdempotencyLayer::on_outcome`] calls a hook once per covered request, in the
//! application's own terms.
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
//! - On an ordered route, the watermark of an object is written in the same atomic step that
//!   records its event's key, so an event older than one already processed is never applied
//!   after it.
//! - If recording fails after success (the store went down in between), it is retried while
//!   the claim is alive; the response waits for that (at most about one lease), and at worst
//!   the claim expires with its lease (a later duplicate is then processed again).
#![warn(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
// The docs link to every backend; a build without one of them has no page to link to (docs.rs
// builds with every feature, and so does CI's `cargo doc`, where a broken link is an error).
#![cfg_attr(
    not(all(feature = "redis", feature = "postgres", feature = "sqlite")),
    allow(rustdoc::broken_intra_doc_links)
)]

mod claim;
mod config_error;
pub(crate) mod defaults;
pub mod fingerprint;
mod http;
pub mod inbox;
pub mod key;
pub mod once;
pub mod order;
#[cfg(feature = "redis")]
mod redis;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod sql;
#[cfg(feature = "admin")]
mod stats;
pub mod store;
#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod test_util;
mod util;
pub mod verify;

pub use self::claim::items::BatchItems;
pub use self::claim::observe::OutcomeEvent;
pub use self::claim::outcome::Outcome;
pub use self::config_error::{ConfigError, ConfigErrorKind};
pub use self::http::body::{RequestBody, ResponseBody};
pub use self::http::config::{AckResponse, FailureMode, MissingKey, Mode, OnMismatch, Scope};
pub use self::http::future::ResponseFuture;
pub use self::http::layer::{Door, IdempotencyLayer};
pub use self::http::rejection;
pub use self::http::service::Idempotency;
pub use self::key::value::IdempotencyKey;
pub use self::once::{Idempotent, OnceError};
pub use self::store::contract::{IdempotencyStore, OrderedStore};
pub use self::store::memory::MemoryStore;

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use self::redis::records::RedisStore;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use self::sql::postgres::PostgresStore;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use self::sql::sqlite::SqliteStore;
/// The Redis client the Redis store runs on, re-exported so that its version always matches.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use fred;

/// The code blocks of the README and of docs/guide.md (the longer half of what the README once
/// held), compiled and run as doctests (`cargo test --all-features --doc`: they use every store
/// and the built-in signature schemes).
#[cfg(all(
    doctest,
    feature = "redis",
    feature = "postgres",
    feature = "sqlite",
    feature = "verify"
))]
#[doc = include_str!("../README.md")]
#[doc = include_str!("../docs/guide.md")]
pub struct ReadmeDoctests;
