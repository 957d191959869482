//! [`InboxLayer`]: the door of an inbox. A route that reads, verifies and keys a delivery as
//! [`IdempotencyLayer`] does, then stores it in the inbox and answers at once.

use std::fmt;
use std::time::Duration;

use http::{HeaderName, Method};
use tower_layer::Layer;

use super::route::InboxRoute;
use super::store::InboxStore;
use crate::claim::observe::OutcomeEvent;
use crate::http::config::{AckResponse, Scope};
use crate::http::rejection::RenderRejection;
use crate::key::{ExtractKey, HeaderKey};
use crate::order::EventOrder;
use crate::store::LocalCache;
use crate::verify::VerifyRequest;
use crate::{Idempotency, IdempotencyLayer, MemoryStore};

/// A route in **inbox mode**, built from the inbox alone: read (bounded) → verify → key
/// (→ order) → **enqueue**, and answer at once; the inner service is never called:
/// [`Worker`](super::Worker)s apply the entries.
///
/// The key becomes `queued` in the same atomic step that stores the [`InboxEntry`](super::InboxEntry)
/// (with the delivery's id as derived, its route's namespace, the kept headers and a
/// correlation id), and the sender gets:
/// - a first delivery: `202 {"ok":true,"queued":true}` ([`accepted`](Self::accepted));
/// - a duplicate (queued, running, dead or done): the ack with `Idempotent-Replayed: true`
///   ([`ack_response`](Self::ack_response));
/// - an ordered event older than what its object already applied: `200` with
///   `Idempotent-Stale: true`, not queued;
/// - the inbox unreachable or full: `503` + `Retry-After` (nothing acknowledged that was not
///   stored); and every rejection of the read, verify and key phases as on
///   [`IdempotencyLayer`] (problem+json).
///
/// Every answer carries `Idempotency-Correlation-Id`. There is no record store, no retention
/// and no call setting here: the inbox holds the keys, and how long a done key is kept is the
/// inbox's retention, which the workers apply ([`Worker::retention`](super::Worker::retention)).
///
/// ```
/// use axum::{Router, routing::post};
/// use tower_idempotency::inbox::{InboxLayer, MemoryInbox};
/// use tower_idempotency::key::JsonPathKey;
///
/// let inbox = MemoryInbox::default();
/// let door = InboxLayer::new(inbox.clone())
///     .namespace("email")
///     .key(JsonPathKey::new("$.event_id")?)
///     .keep_headers([http::header::CONTENT_TYPE]);
/// // The handler is never called on the request path: workers apply the entries.
/// let app: Router = Router::new().route("/inbox/email", post(|| async { "" }).route_layer(door));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct InboxLayer<K = HeaderKey> {
    /// The request path's phases, in inbox mode. Its record store is an empty memory store
    /// that an inbox route never calls.
    layer: IdempotencyLayer<MemoryStore, K>,
}

impl<K> Clone for InboxLayer<K> {
    fn clone(&self) -> Self {
        InboxLayer {
            layer: self.layer.clone(),
        }
    }
}

impl<K> fmt::Debug for InboxLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("InboxLayer").field(&self.layer).finish()
    }
}

impl InboxLayer<HeaderKey> {
    /// The door of `inbox`, with the defaults: keyed by the `Idempotency-Key` header (set the
    /// provider's with [`key`](Self::key)), a missing key → 400, 1 MiB body limit, 2 s store
    /// timeout, namespace `default` with the request path as scope, the correlation id from
    /// `X-Request-Id` (else generated), no headers kept.
    pub fn new(inbox: impl InboxStore) -> Self {
        let layer = IdempotencyLayer::webhook(MemoryStore::new())
            .local_cache(LocalCache::off())
            .with_inbox(InboxRoute::new(inbox));
        InboxLayer { layer }
    }

    /// The door of `inbox` for a sender of [Standard Webhooks](crate::verify::StandardWebhooks)
    /// (Svix and those who follow it): verified by `scheme`, keyed by `svix-id`, else
    /// `webhook-id`.
    #[cfg(feature = "verify")]
    #[cfg_attr(docsrs, doc(cfg(feature = "verify")))]
    pub fn standard_webhooks(
        inbox: impl InboxStore,
        scheme: crate::verify::StandardWebhooks,
    ) -> InboxLayer<crate::key::Fallback<HeaderKey, HeaderKey>> {
        let layer = IdempotencyLayer::standard_webhooks(MemoryStore::new(), scheme)
            .local_cache(LocalCache::off())
            .with_inbox(InboxRoute::new(inbox));
        InboxLayer { layer }
    }
}

impl<K> InboxLayer<K> {
    /// Sets where the key comes from (see [`IdempotencyLayer::key`]).
    pub fn key<K2: ExtractKey>(self, extractor: K2) -> InboxLayer<K2> {
        InboxLayer {
            layer: self.layer.key(extractor),
        }
    }
}

impl<K: Clone> InboxLayer<K> {
    fn map(
        self,
        f: impl FnOnce(IdempotencyLayer<MemoryStore, K>) -> IdempotencyLayer<MemoryStore, K>,
    ) -> Self {
        InboxLayer {
            layer: f(self.layer),
        }
    }

    /// Verifies every delivery before its key is read (see [`IdempotencyLayer::verify`]).
    pub fn verify(self, verifier: impl VerifyRequest) -> Self {
        self.map(|layer| layer.verify(verifier))
    }

    /// Orders the events of each object (see [`crate::order`]): the inbox hands an object's
    /// entries to workers one at a time, in position order, and an event older than what its
    /// object applied is answered stale at the door.
    pub fn order(self, order: EventOrder) -> Self {
        self.map(|layer| layer.order(order))
    }

    /// The namespace of the route's keys, logs and metrics (see
    /// [`IdempotencyLayer::namespace`]); workers see it as [`InboxRequest::route`](super::InboxRequest::route).
    pub fn namespace(self, namespace: impl Into<String>) -> Self {
        self.map(|layer| layer.namespace(namespace))
    }

    /// What else than the namespace a key is scoped by (default: the request path).
    pub fn scope(self, scope: Scope) -> Self {
        self.map(|layer| layer.scope(scope))
    }

    /// The largest body stored (default 1 MiB; past it, 413).
    pub fn body_limit(self, bytes: usize) -> Self {
        self.map(|layer| layer.body_limit(bytes))
    }

    /// How long reading the body may take (default: no limit of its own).
    pub fn body_timeout(self, timeout: Duration) -> Self {
        self.map(|layer| layer.body_timeout(timeout))
    }

    /// How long the enqueue may take before the answer is 503 (default 2 s).
    pub fn store_timeout(self, timeout: Duration) -> Self {
        self.map(|layer| layer.store_timeout(timeout))
    }

    /// The `Retry-After` of a 503 when the inbox could not take a delivery.
    pub fn store_retry_after(self, after: Duration) -> Self {
        self.map(|layer| layer.store_retry_after(after))
    }

    /// The methods that are enqueued (default: every non-safe method); others pass through.
    pub fn methods(self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.map(|layer| layer.methods(methods))
    }

    /// The answer to a duplicate (default `200 {"ok":true,"duplicate":true}`).
    pub fn ack_response(self, ack: AckResponse) -> Self {
        self.map(|layer| layer.ack_response(ack))
    }

    /// The answer to a first delivery (default `202 {"ok":true,"queued":true}`).
    pub fn accepted(self, answer: AckResponse) -> Self {
        self.map(|layer| layer.with_inbox_route(|route| route.accepted = answer))
    }

    /// The request header whose value becomes the correlation id, when present (default
    /// `X-Request-Id`).
    pub fn correlation_header(self, name: HeaderName) -> Self {
        self.map(|layer| layer.with_inbox_route(|route| route.correlation_header = name))
    }

    /// The request headers stored with the entry for the worker (no others are kept).
    pub fn keep_headers(self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        let names = names.into_iter().collect();
        self.map(|layer| layer.with_inbox_route(|route| route.keep_headers = names))
    }

    /// Calls `hook` with every delivery's outcome (see [`IdempotencyLayer::on_outcome`]).
    pub fn on_outcome(self, hook: impl Fn(&OutcomeEvent<'_>) + Send + Sync + 'static) -> Self {
        self.map(|layer| layer.on_outcome(hook))
    }

    /// How often the summary of outcomes is logged (see [`IdempotencyLayer::log_interval`]).
    pub fn log_interval(self, interval: Duration) -> Self {
        self.map(|layer| layer.log_interval(interval))
    }

    /// Renders rejections (see [`IdempotencyLayer::render_rejection`]).
    pub fn render_rejection(self, render: impl RenderRejection) -> Self {
        self.map(|layer| layer.render_rejection(render))
    }
}

impl<S, K> Layer<S> for InboxLayer<K> {
    type Service = Idempotency<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        self.layer.layer(inner)
    }
}
