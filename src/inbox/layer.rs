//! [`InboxLayer`]: the door of an inbox. A route that reads, verifies and keys a delivery as
//! [`IdempotencyLayer`] does, then stores it in the inbox and answers at once.

use http::HeaderName;

use super::route;
use super::store::InboxStore;
use crate::http::config::AckResponse;
use crate::http::layer::{Door, Inbox};
use crate::key::HeaderKey;
use crate::store::LocalCache;
use crate::{IdempotencyLayer, MemoryStore};

/// A route in **inbox mode**, built from the inbox alone: read (bounded) → verify → key
/// (→ order) → **enqueue**, and answer at once; the inner service is never called:
/// [`Worker`](super::Worker)s apply the entries.
///
/// The key becomes `queued` in the same atomic step that stores the [`InboxEntry`](super::InboxEntry)
/// (with the delivery's id as derived, its route's namespace, the kept headers and a
/// correlation id), and the sender gets:
/// - a first delivery: `202 {"ok":true,"queued":true}` ([`accepted`](Door::accepted));
/// - a duplicate (queued, running, dead or done): the ack with `Idempotent-Replayed: true`
///   ([`ack_response`](Door::ack_response));
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
/// The methods are those of [`Door`], the builder this layer shares with
/// [`IdempotencyLayer`]: the read, verify, key and order settings and the answers are set as
/// there; a lease, a retention or a replay mode cannot be set here.
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
pub type InboxLayer<K = HeaderKey> = Door<Inbox, K>;

impl Door<Inbox, HeaderKey> {
    /// The door of `inbox`, with the defaults: keyed by the `Idempotency-Key` header (set the
    /// provider's with [`key`](Door::key)), a missing key → 400, 1 MiB body limit, 2 s store
    /// timeout, namespace `default` with the request path as scope, the correlation id from
    /// `X-Request-Id` (else generated), no headers kept.
    pub fn new(inbox: impl InboxStore) -> Self {
        Self::on(IdempotencyLayer::webhook(MemoryStore::new()), inbox)
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
        Door::on(
            IdempotencyLayer::standard_webhooks(MemoryStore::new(), scheme),
            inbox,
        )
    }
}

impl<K: Clone> Door<Inbox, K> {
    /// The door of `inbox` with the read, verify and key settings of `layer`. Its record
    /// store is an empty memory store that an inbox route never calls.
    fn on<St>(layer: IdempotencyLayer<St, K>, inbox: impl InboxStore) -> Self {
        layer
            .local_cache(LocalCache::off())
            .with_inbox(route::InboxRoute::new(inbox))
            .into_kind()
    }

    /// Sets the answer to a first delivery (default `202 {"ok":true,"queued":true}`).
    pub fn accepted(self, answer: AckResponse) -> Self {
        self.with_inbox_route(|route| route.accepted = answer)
    }

    /// Sets the request header whose value becomes the correlation id, when present (default
    /// `X-Request-Id`).
    pub fn correlation_header(self, name: HeaderName) -> Self {
        self.with_inbox_route(|route| route.correlation_header = name)
    }

    /// Sets the request headers stored with the entry for the worker (no others are kept).
    pub fn keep_headers(self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        let names = names.into_iter().collect();
        self.with_inbox_route(|route| route.keep_headers = names)
    }
}

/// What [`IdempotencyLayer::inbox`](Door::inbox) took before [`InboxLayer`] was an inbox's
/// door. Kept, hidden, so that code written against that API (the team's queue benchmark)
/// still builds; it makes the same door as `InboxLayer::new`.
#[doc(hidden)]
#[deprecated(note = "build the door of an inbox with `InboxLayer::new(inbox)`")]
pub struct InboxRoute(route::InboxRoute);

#[allow(deprecated)]
impl InboxRoute {
    /// The route of `inbox`.
    #[doc(hidden)]
    pub fn new(inbox: impl InboxStore) -> Self {
        InboxRoute(route::InboxRoute::new(inbox))
    }
}

#[allow(deprecated)]
impl<St, K: Clone> Door<crate::http::layer::Records<St>, K> {
    /// The door of `route`'s inbox with this layer's read, verify and key settings: what
    /// [`InboxLayer::new`] makes from the inbox alone.
    #[doc(hidden)]
    #[deprecated(note = "build the door of an inbox with `InboxLayer::new(inbox)`")]
    pub fn inbox(self, route: InboxRoute) -> InboxLayer<K> {
        self.local_cache(LocalCache::off())
            .with_inbox(route.0)
            .into_kind()
    }
}
