//! The inbox: answer the sender at once, apply every event exactly once in workers.
//!
//! A route in inbox mode reads, verifies and keys a delivery, then **enqueues** it: the key
//! becomes `queued` in the same atomic step that stores the [`InboxEntry`], and the sender is
//! answered. [`Worker`]s take the entries (any number, in any number of processes), each under
//! a lease renewed while the handler runs, call a `tower::Service<InboxRequest>` and settle:
//! success marks the key done and removes the entry; failure asks the [`RetryPolicy`] for a
//! retry time or makes the entry a dead letter, listable and re-queueable.
//!
//! The pieces:
//! - [`InboxEntry`], [`Lease`], [`InboxRequest`]: what is stored, taken, and handled;
//! - [`InboxStore`]: the queue contract, beside the record contract; [`MemoryInbox`] in memory,
//!   `SqlInbox` in PostgreSQL and SQLite (features `postgres`, `sqlite`),
//!   `RedisInbox` on Redis (feature `redis`); [`AnyInbox`], one of them chosen at run time
//!   (on an [`AnyStore`](crate::store::AnyStore)'s connections);
//! - [`InboxAdmin`]: the operator's side (find, list, re-queue, discard, pause), with each
//!   entry's [`Attempt`]s; `AdminService`, the same as JSON over HTTP to mount behind an
//!   application's authentication (feature `admin`);
//! - [`RetryPolicy`] and [`Backoff`]: the policy decides, the worker's loop executes;
//! - [`Announcer`] and [`Wakeups`]: what an idle worker waits on instead of polling;
//! - [`Worker`]: the loop.
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use bytes::Bytes;
//! use http::Request;
//! use http_body_util::Full;
//! use tower::{Layer, ServiceExt};
//! use tower_idempotency::inbox::{InboxLayer, InboxRequest, InboxStore, MemoryInbox, Worker};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let inbox = MemoryInbox::default();
//! // The door stores a delivery and answers 202 at once; its inner service is never called.
//! let route = InboxLayer::new(inbox.clone()).layer(tower::service_fn(|_: Request<_>| async {
//!     Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::new())))
//! }));
//! let body = Full::new(Bytes::from_static(b"{}"));
//! let delivery = Request::post("/webhooks").header("idempotency-key", "evt_1").body(body);
//! route.oneshot(delivery.unwrap()).await.unwrap();
//!
//! let handler = tower::service_fn(|request: InboxRequest| async move {
//!     println!("applying {} ({})", request.key(), request.correlation_id());
//!     Ok::<_, Infallible>(())
//! });
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let worker = Worker::new(inbox.clone(), handler).workers(2).lease(Duration::from_secs(10));
//! let running = tokio::spawn(worker.run(async { stopped.await.ok(); }));
//! while inbox.counts().await.unwrap().pending + inbox.counts().await.unwrap().in_flight > 0 {
//!     tokio::time::sleep(Duration::from_millis(10)).await;
//! }
//! stop.send(()).unwrap();
//! running.await.unwrap();
//! # });
//! ```

pub(crate) mod admin;
#[cfg(feature = "admin")]
mod admin_service;
pub(crate) mod any;
#[cfg(any(feature = "redis", feature = "sqlite", feature = "postgres"))]
pub(crate) mod codec;
pub(crate) mod completions;
pub(crate) mod entry;
pub(crate) mod idle;
pub(crate) mod layer;
pub(crate) mod memory;
pub(crate) mod metrics;
pub(crate) mod retry;
pub(crate) mod route;
pub(crate) mod store;
pub(crate) mod wake;
pub(crate) mod worker;

pub use self::admin::{
    Attempt, AttemptOutcome, DeadLetter, EntryInfo, Filter, InboxAdmin, Page, Requeued,
};
#[cfg(feature = "admin")]
#[cfg_attr(docsrs, doc(cfg(feature = "admin")))]
pub use self::admin_service::AdminService;
pub use self::any::AnyInbox;
pub use self::entry::{EntryOrder, InboxEntry, InboxRequest, Lease};
pub use self::layer::InboxLayer;
#[allow(deprecated)]
#[doc(hidden)]
pub use self::layer::InboxRoute;
pub use self::memory::MemoryInbox;
pub use self::retry::{Backoff, Decision, RetryPolicy};
pub use self::route::IDEMPOTENCY_CORRELATION_ID;
pub use self::store::{Enqueued, Failure, InboxCounts, InboxStore, KeyState};
pub use self::wake::{Announcer, Wakeups};
pub use self::worker::Worker;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use crate::redis::inbox::{RedisInbox, RedisWrites};
#[cfg(feature = "postgres")]
pub use crate::sql::inbox::PostgresInbox;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use crate::sql::inbox::SqlInbox;
#[cfg(feature = "sqlite")]
pub use crate::sql::inbox::SqliteInbox;
