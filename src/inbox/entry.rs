//! What the inbox stores and hands to a worker: [`InboxEntry`], [`Lease`], [`InboxRequest`].

use std::time::SystemTime;

use bytes::Bytes;
use http::HeaderMap;

use crate::order::{EqualPositions, Position};
use crate::store::{ObjectKey, StoreKey, Token};

/// One stored delivery, waiting to be applied: what the worker needs and no more.
///
/// The layer builds entries; a store of your own keeps their fields and, reading one back,
/// sets them all:
///
/// ```
/// use std::time::SystemTime;
/// use bytes::Bytes;
/// use http::HeaderMap;
/// use tower_idempotency::inbox::{EntryOrder, InboxEntry};
/// use tower_idempotency::order::{EqualPositions, Position};
/// use tower_idempotency::store::{ObjectKey, StoreKey};
///
/// let now = SystemTime::now();
/// let entry = InboxEntry {
///     key: StoreKey::new("email", None, "evt_1"),
///     id: "evt_1".into(),
///     route: "email".into(),
///     body: Bytes::from_static(b"{}"),
///     headers: HeaderMap::new(),
///     order: Some(EntryOrder {
///         object: ObjectKey::new("email", None, "msg_1"),
///         position: Position::from_integer_text("7").unwrap(),
///         equal: EqualPositions::Process,
///     }),
///     correlation_id: "req-1".into(),
///     attempts: 0,
///     next_attempt_at: now,
///     enqueued_at: now,
/// };
/// ```
#[derive(Clone, Debug)]
pub struct InboxEntry {
    /// The delivery's idempotency key (it is `queued` while the entry exists): the hash of
    /// [`route`](Self::route), the route's scope and [`id`](Self::id).
    pub key: StoreKey,
    /// The delivery's key as the route derived it (a `webhook-id`, an `$.event_id`), before
    /// hashing; empty on an entry made from a store key alone.
    pub id: String,
    /// The namespace of the route that enqueued it; empty likewise.
    pub route: String,
    /// The request body, byte for byte as it arrived (and as it was verified).
    pub body: Bytes,
    /// The headers the route names (content type, event type, ...); no others are kept.
    pub headers: HeaderMap,
    /// On ordered routes, the object the event is about and its position among its events.
    pub order: Option<EntryOrder>,
    /// Relates the callback, its acknowledgement and the worker's run (a request id).
    pub correlation_id: String,
    /// How many attempts were started so far (0 until a worker first takes it).
    pub attempts: u32,
    /// The earliest time a worker may take it.
    pub next_attempt_at: SystemTime,
    /// When it was stored (for the age of the oldest entry).
    pub enqueued_at: SystemTime,
}

impl InboxEntry {
    /// A new entry of `key` carrying `body`, due now, with no named headers and no order (the
    /// layer sets the rest: [`with_delivery`](Self::with_delivery),
    /// [`with_headers`](Self::with_headers), [`ordered`](Self::ordered)).
    pub(crate) fn new(key: StoreKey, body: Bytes, correlation_id: impl Into<String>) -> Self {
        let now = SystemTime::now();
        InboxEntry {
            key,
            id: String::new(),
            route: String::new(),
            body,
            headers: HeaderMap::new(),
            order: None,
            correlation_id: correlation_id.into(),
            attempts: 0,
            next_attempt_at: now,
            enqueued_at: now,
        }
    }

    /// The entry with the delivery's key as derived (`id`) by the route of namespace `route`:
    /// what operators find it by (the store key is their hash).
    pub(crate) fn with_delivery(mut self, route: impl Into<String>, id: impl Into<String>) -> Self {
        self.route = route.into();
        self.id = id.into();
        self
    }

    /// The entry with the headers the route keeps.
    pub(crate) fn with_headers(mut self, headers: HeaderMap) -> Self {
        self.headers = headers;
        self
    }

    /// The entry ordered among the events of `object` at `position`, processed at a position
    /// equal to the watermark (the default rule).
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn ordered(self, object: ObjectKey, position: Position) -> Self {
        self.ordered_by(crate::store::Order {
            object,
            position,
            equal: EqualPositions::default(),
        })
    }

    /// The entry ordered as the route's `order` says: among the events of its object, at its
    /// position, with the route's rule for a position equal to the watermark.
    pub(crate) fn ordered_by(mut self, order: crate::store::Order) -> Self {
        self.order = Some(EntryOrder {
            object: order.object,
            position: order.position,
            equal: order.equal,
        });
        self
    }
}

/// Where an entry of an ordered route stands: its object and its position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryOrder {
    /// The object the event is about.
    pub object: ObjectKey,
    /// Its position among the object's events.
    pub position: Position,
    /// Whether the entry is stale at a position equal to its object's watermark (the route's
    /// [`EventOrder::equal_positions`](crate::order::EventOrder::equal_positions)): a store
    /// keeps it with the entry, since it decides at the door and again when the entry is
    /// taken.
    pub equal: EqualPositions,
}

/// An entry a worker took: the entry (its attempt counted), the lease's token, and whether the
/// entry is stale (its object already went past its position: settle it without the handler).
#[derive(Clone, Debug)]
pub struct Lease {
    /// The entry, `attempts` including this one.
    pub entry: InboxEntry,
    /// The lease's owner token: renew, complete and fail are refused without it.
    pub token: Token,
    /// The entry is stale against its object's watermark
    /// ([`EqualPositions::is_stale`](crate::order::EqualPositions::is_stale)): settle it without
    /// the handler.
    pub stale: bool,
}

/// What the worker's service is called with: the entry and its lease's token.
#[derive(Clone, Debug)]
pub struct InboxRequest {
    entry: InboxEntry,
    token: Token,
}

impl InboxRequest {
    pub(crate) fn new(entry: InboxEntry, token: Token) -> Self {
        InboxRequest { entry, token }
    }

    /// The delivery's store key (a hash; [`id`](Self::id) is the key the route derived).
    pub fn key(&self) -> &StoreKey {
        &self.entry.key
    }

    /// The delivery's key as the route derived it (a `webhook-id`, an `$.event_id`); empty for
    /// an entry enqueued from a store key alone.
    pub fn id(&self) -> &str {
        &self.entry.id
    }

    /// The namespace of the route that enqueued it (empty likewise): one worker serving the
    /// inbox of several routes tells them apart by it.
    pub fn route(&self) -> &str {
        &self.entry.route
    }

    /// The body as it arrived.
    pub fn body(&self) -> &Bytes {
        &self.entry.body
    }

    /// The headers the route keeps.
    pub fn headers(&self) -> &HeaderMap {
        &self.entry.headers
    }

    /// The correlation id of the delivery (the acknowledgement's `Idempotency-Correlation-Id`).
    pub fn correlation_id(&self) -> &str {
        &self.entry.correlation_id
    }

    /// This attempt's number, from 1.
    pub fn attempt(&self) -> u32 {
        self.entry.attempts
    }

    /// The object and position on ordered routes.
    pub fn order(&self) -> Option<&EntryOrder> {
        self.entry.order.as_ref()
    }

    /// The lease's token: a handler writing its effect where the record lives can check it.
    pub fn token(&self) -> &Token {
        &self.token
    }
}
