//! Events of one object in order: an older transition never overtakes a newer one.
//!
//! Providers do not promise order: Stripe says so, WhatsApp status callbacks (sent, delivered,
//! read, failed) and email events (processed, delivered, opened, bounced) arrive out of order
//! and are retried out of order. A receiver that applies them as they come lets "delivered"
//! overwrite "failed". An [`EventOrder`] on a layer guards this once, in the store, for every
//! instance sharing it:
//!
//! - each event names an **object** (the message, the payment: any [`ExtractKey`], such as
//!   `JsonPathKey::new("$.message_id")`) and a **position** ([`ExtractPosition`]: an RFC 3339
//!   timestamp, a sequence number, a rank of a status, or a closure);
//! - the store keeps, per object, the highest position of an event **processed successfully**
//!   (its watermark), written in the same atomic step that records the event's key, for the
//!   same retention;
//! - an event below the watermark is **stale**: answered `200` with `Idempotent-Stale: true`
//!   (never `Idempotent-Replayed`) without calling the inner service, its key recorded (a
//!   redelivery is then a duplicate), counted as outcome `stale` and logged at info with the
//!   namespace and both positions; or, with [`StaleEvents::PassOn`], handed to the inner
//!   service with a [`StaleEvent`] in its extensions, for applications that record invalid
//!   transitions. Equal positions are processed ([`EqualPositions::Process`], the default:
//!   Stripe's `created` counts whole seconds) or stale ([`EqualPositions::Stale`]);
//! - events of one object are handled **one at a time**: while one is in flight, another event
//!   of the same object gets `409` + `Retry-After` (or waits, with
//!   [`wait_for_in_flight`](crate::IdempotencyLayer::wait_for_in_flight)), so the comparison and
//!   the write are atomic with the outcome on every store.
//!
//! ```
//! use axum::{Router, routing::post};
//! use tower_idempotency::{IdempotencyLayer, MemoryStore};
//! use tower_idempotency::key::JsonPathKey;
//! use tower_idempotency::order::{EventOrder, PositionAt};
//!
//! // Email status callbacks: `{"event_id": .., "message_id": .., "type": .., "occurred_at": ..}`.
//! let order = EventOrder::new(JsonPathKey::new("$.message_id")?, PositionAt::timestamp("$.occurred_at")?);
//! let layer = IdempotencyLayer::webhook(MemoryStore::new())
//!     .namespace("email")
//!     .key(JsonPathKey::new("$.event_id")?)
//!     .order(order);
//! let app: Router = Router::new().route("/webhooks/email", post(|| async { "ok" }).route_layer(layer));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A batch whose items are events of several objects (a WhatsApp callback with statuses of
//! several messages) orders each item on its own with [`OrderedItems`]: see there.
//!
//! What it costs: on Redis an ordered first delivery takes the same two round trips as an
//! unordered one (one script claims the key and the object together, one records both); a
//! duplicate one, or none from the local cache. A stale event takes one more (its key is
//! recorded and the object let go before the answer).

mod items;
mod position;
mod value;

use std::fmt;
use std::sync::Arc;

use http::HeaderName;

pub use self::items::OrderedItems;
pub use self::position::Position;
pub use self::value::PositionAt;
use crate::key::{ExtractKey, IdempotencyKey, KeyError, KeyInput};

/// `Idempotent-Stale`: the header set (to `true`) on the layer's answer to a stale event.
pub(crate) const IDEMPOTENT_STALE: HeaderName = HeaderName::from_static("idempotent-stale");

/// Whether an event at the same position as its object's watermark is processed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EqualPositions {
    /// Processed (the default): positions with a coarse resolution (Stripe's `created` counts
    /// whole seconds) give several events the same one.
    #[default]
    Process,
    /// Stale, like a lower position.
    Stale,
}

impl EqualPositions {
    /// Whether an event at `position` is stale against its object's `watermark` under this
    /// rule: behind it, or at it with [`Stale`](Self::Stale). What a store of your own answers
    /// a stale reserve ([`Reservation::Stale`](crate::store::Reservation::Stale)) or enqueue
    /// ([`Enqueued::Stale`](crate::inbox::Enqueued::Stale)) by, with the event's
    /// [`Order::equal`](crate::store::Order::equal) or
    /// [`EntryOrder::equal`](crate::inbox::EntryOrder::equal).
    pub fn is_stale(self, position: Position, watermark: Position) -> bool {
        match self {
            EqualPositions::Process => position < watermark,
            EqualPositions::Stale => position <= watermark,
        }
    }
}

/// What happens to a stale event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StaleEvents {
    /// Answered `200 {"ok":true,"stale":true}` with `Idempotent-Stale: true`, the inner
    /// service not called, the key recorded (the default).
    #[default]
    Acknowledge,
    /// Handed to the inner service with a [`StaleEvent`] in the request extensions (for
    /// applications that log or store invalid transitions); its key is recorded when the
    /// inner service succeeds, the watermark stays where it is.
    PassOn,
}

/// In the request extensions of a stale event passed on ([`StaleEvents::PassOn`]): where the
/// event stands, and the watermark it is below.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StaleEvent {
    /// The event's position.
    pub position: Position,
    /// The highest position processed for its object.
    pub watermark: Position,
}

/// Where an event stands among its object's events: an RFC 3339 timestamp, a Unix time, a
/// sequence number or a rank at a path of the body ([`PositionAt`]), or any closure of the
/// request.
///
/// `Ok(None)` when the request carries none, `Err` when it is malformed: both are a `400`
/// saying why (an ordered route does not process an event it cannot place).
///
/// ```
/// use tower_idempotency::key::{KeyError, KeyErrorKind, KeyInput};
/// use tower_idempotency::order::{ExtractPosition, Position};
///
/// // The position in a header.
/// let header = |input: &KeyInput<'_>| -> Result<Option<Position>, KeyError> {
///     let Some(value) = input.parts().headers.get("x-sequence") else { return Ok(None) };
///     let text = value.to_str().unwrap_or_default();
///     Position::from_integer_text(text)
///         .map(Some)
///         .ok_or_else(|| KeyError::new(KeyErrorKind::Other, "x-sequence is not an integer"))
/// };
/// # fn check(_: impl ExtractPosition) {}
/// check(header);
/// ```
pub trait ExtractPosition: Send + Sync + 'static {
    /// The position of one request's event.
    fn extract_position(&self, input: &KeyInput<'_>) -> Result<Option<Position>, KeyError>;

    /// Whether this extractor reads the body.
    fn needs_body(&self) -> bool {
        true
    }

    /// Where the position is expected (`"at $.occurred_at"`), for the `400` answer.
    fn expected(&self) -> Option<String> {
        None
    }

    /// Whether the positions are instants, nanoseconds since the Unix epoch (as
    /// [`PositionAt::timestamp`] and [`PositionAt::unix_seconds`] give): logs then show them as
    /// RFC 3339 date-times.
    fn instant(&self) -> bool {
        false
    }
}

impl<F> ExtractPosition for F
where
    F: Fn(&KeyInput<'_>) -> Result<Option<Position>, KeyError> + Send + Sync + 'static,
{
    fn extract_position(&self, input: &KeyInput<'_>) -> Result<Option<Position>, KeyError> {
        self(input)
    }
}

/// The ordering guard of a layer: where the object and the position of each event come from,
/// and the rules. Set it with [`IdempotencyLayer::order`](crate::IdempotencyLayer::order); see
/// the [module docs](self).
#[derive(Clone)]
pub struct EventOrder {
    source: Source,
    equal: EqualPositions,
    stale: StaleEvents,
}

#[derive(Clone)]
enum Source {
    /// One event per request: the object and the position from the whole request.
    PerRequest {
        object: Arc<dyn ExtractKey>,
        position: Arc<dyn ExtractPosition>,
    },
    /// One event per item of a batch.
    Items(OrderedItems),
}

impl fmt::Debug for EventOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = match &self.source {
            Source::PerRequest { .. } => "per request",
            Source::Items(_) => "per item",
        };
        f.debug_struct("EventOrder")
            .field("source", &source)
            .field("equal", &self.equal)
            .field("stale", &self.stale)
            .finish()
    }
}

/// One event of a request, as the ordering guard sees it: its key text (a whole key, or one
/// item), its object and its position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Placed {
    pub(crate) key: String,
    pub(crate) object: String,
    pub(crate) position: Position,
}

impl EventOrder {
    /// Orders each request's event by the object `object` names and the position `position`
    /// reads. The layer's key stays the event's key (a header, a JSON path, a fallback chain):
    /// a request whose key is per item (a batch) needs [`EventOrder::items`] instead, and is
    /// answered `400` here.
    pub fn new(object: impl ExtractKey, position: impl ExtractPosition) -> Self {
        EventOrder {
            source: Source::PerRequest {
                object: Arc::new(object),
                position: Arc::new(position),
            },
            equal: EqualPositions::default(),
            stale: StaleEvents::default(),
        }
    }

    /// Orders every item of a batch on its own: [`OrderedItems`] says where the items are and,
    /// in each, its key, its object and its position. Items are the request's keys (each
    /// claimed, recorded and released on its own, as with `JsonPathKey::each`); a body without
    /// items falls back to the layer's key extractor, unordered (a callback of another kind
    /// keyed by its delivery id).
    pub fn items(items: OrderedItems) -> Self {
        EventOrder {
            source: Source::Items(items),
            equal: EqualPositions::default(),
            stale: StaleEvents::default(),
        }
    }

    /// Sets whether an event at the watermark's position is processed (default
    /// [`EqualPositions::Process`]). On an inbox route each entry keeps the rule, for the door
    /// and for when a worker takes it.
    pub fn equal_positions(mut self, equal: EqualPositions) -> Self {
        self.equal = equal;
        self
    }

    /// Sets what happens to a stale event (default [`StaleEvents::Acknowledge`]). On the
    /// synchronous route only: an inbox route acknowledges a stale event at its door, and its
    /// workers settle an entry that went stale while it waited without the handler.
    pub fn stale_events(mut self, stale: StaleEvents) -> Self {
        self.stale = stale;
        self
    }

    /// The rule for equal positions.
    pub(crate) fn equal(&self) -> EqualPositions {
        self.equal
    }

    /// What happens to a stale event.
    pub(crate) fn stale(&self) -> StaleEvents {
        self.stale
    }

    /// Whether placing events reads the body.
    pub(crate) fn needs_body(&self) -> bool {
        match &self.source {
            Source::PerRequest { object, position } => object.needs_body() || position.needs_body(),
            Source::Items(_) => true,
        }
    }

    /// The events of a request keyed `key` (from the layer's extractor): one per request, or
    /// none when [items](Self::items) are ordered (see [`items_of`](Self::items_of)).
    pub(crate) fn place(
        &self,
        input: &KeyInput<'_>,
        key: &IdempotencyKey,
    ) -> Result<Vec<Placed>, KeyError> {
        let Source::PerRequest { object, position } = &self.source else {
            return Ok(Vec::new());
        };
        if key.is_items() {
            return Err(KeyError::new(
                crate::key::KeyErrorKind::Other,
                "this route orders one event per request, and the request holds a batch of \
                 items: order the items with EventOrder::items",
            ));
        }
        let object = object
            .extract_key(input)?
            .ok_or_else(|| missing("the object the event is about", object.expected()))?;
        let at = position
            .extract_position(input)?
            .ok_or_else(|| missing("the event's position", position.expected()))?;
        Ok(vec![Placed {
            key: key.as_str().to_owned(),
            object: object.as_str().to_owned(),
            position: at,
        }])
    }

    /// `position` as logs show it: an RFC 3339 date-time when the positions are instants,
    /// else the number.
    pub(crate) fn show(&self, position: Position) -> String {
        let instant = match &self.source {
            Source::PerRequest { position, .. } => position.instant(),
            Source::Items(items) => items.instant(),
        };
        instant
            .then(|| position.to_rfc3339())
            .flatten()
            .unwrap_or_else(|| position.to_string())
    }

    /// The ordered items of a request, when this guard orders items: `None` when it does not,
    /// `Some(empty)` when the body holds none.
    pub(crate) fn items_of(&self, input: &KeyInput<'_>) -> Option<Result<Vec<Placed>, KeyError>> {
        match &self.source {
            Source::Items(items) => Some(items.place(input)),
            Source::PerRequest { .. } => None,
        }
    }
}

/// The error for a missing object or position.
fn missing(what: &str, expected: Option<String>) -> KeyError {
    let detail = match expected {
        Some(at) => format!("the request does not carry {what}; it was expected {at}"),
        None => format!("the request does not carry {what}"),
    };
    KeyError::new(crate::key::KeyErrorKind::Other, detail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{HeaderKey, JsonPathKey};
    use bytes::Bytes;
    use http::request::Parts;

    fn input_of<'a>(parts: &'a Parts, body: &'a Bytes) -> KeyInput<'a> {
        KeyInput::new(parts, Some(body))
    }

    #[test]
    fn one_event_per_request_from_the_body() {
        let order = EventOrder::new(
            JsonPathKey::new("$.message_id").unwrap(),
            PositionAt::timestamp("$.occurred_at").unwrap(),
        );
        let (parts, ()) = http::Request::post("/").body(()).unwrap().into_parts();
        let body = Bytes::from_static(
            br#"{"event_id":"e1","message_id":"m1","occurred_at":"2024-05-01T14:02:00Z"}"#,
        );
        let key = IdempotencyKey::new("e1").unwrap();
        let placed = order.place(&input_of(&parts, &body), &key).unwrap();
        assert_eq!(
            placed,
            [Placed {
                key: "e1".into(),
                object: "m1".into(),
                position: Position::from_rfc3339("2024-05-01T14:02:00Z").unwrap(),
            }]
        );
        // A missing position or object is an error saying what and where.
        let body = Bytes::from_static(br#"{"message_id":"m1"}"#);
        let err = order.place(&input_of(&parts, &body), &key).unwrap_err();
        let detail = "the request does not carry the event's position; it was expected at";
        assert!(err.to_string().contains(detail), "{err}");
        assert!(err.to_string().contains("$.occurred_at"), "{err}");
        let body = Bytes::from_static(br#"{"occurred_at":"2024-05-01T14:02:00Z"}"#);
        let err = order.place(&input_of(&parts, &body), &key).unwrap_err();
        let detail = "the request does not carry the object the event is about";
        assert!(err.to_string().contains(detail), "{err}");
        assert!(err.to_string().contains("$.message_id"), "{err}");
        // A batch key needs items.
        let items = IdempotencyKey::items(["a", "b"]).unwrap().unwrap();
        assert!(order.place(&input_of(&parts, &body), &items).is_err());
    }

    #[test]
    fn the_object_may_come_from_a_header() {
        let order = EventOrder::new(
            HeaderKey::new("x-object").unwrap(),
            PositionAt::sequence("$.seq").unwrap(),
        )
        .equal_positions(EqualPositions::Stale)
        .stale_events(StaleEvents::PassOn);
        assert_eq!(order.equal(), EqualPositions::Stale);
        assert_eq!(order.stale(), StaleEvents::PassOn);
        let (parts, ()) = http::Request::post("/")
            .header("x-object", "pay_1")
            .body(())
            .unwrap()
            .into_parts();
        let body = Bytes::from_static(br#"{"seq":18446744073709551617}"#);
        let key = IdempotencyKey::new("k").unwrap();
        let placed = order.place(&input_of(&parts, &body), &key).unwrap();
        assert_eq!(placed[0].object, "pay_1");
        assert_eq!(
            placed[0].position,
            Position::new(18_446_744_073_709_551_617)
        );
    }

    /// Logs show a timestamp position as RFC 3339, any other as its number.
    #[test]
    fn positions_are_shown_as_the_route_reads_them() {
        let at = Position::from_rfc3339("2024-05-01T14:02:03.5Z").unwrap();
        let object = || JsonPathKey::new("$.object").unwrap();
        let timestamps = EventOrder::new(object(), PositionAt::timestamp("$.at").unwrap());
        assert_eq!(timestamps.show(at), "2024-05-01T14:02:03.5Z");
        let seconds = EventOrder::new(object(), PositionAt::unix_seconds("$.at").unwrap());
        assert_eq!(seconds.show(Position::new(0)), "1970-01-01T00:00:00Z");
        let sequence = EventOrder::new(object(), PositionAt::sequence("$.seq").unwrap());
        assert_eq!(sequence.show(Position::new(42)), "42");
        let items = OrderedItems::new(
            "$.items[*]",
            ["$.id"],
            "$.object",
            PositionAt::timestamp("$.at").unwrap(),
        );
        assert_eq!(
            EventOrder::items(items.unwrap()).show(at),
            "2024-05-01T14:02:03.5Z"
        );
    }

    #[test]
    fn equal_positions_follow_the_rule() {
        let (low, high) = (Position::new(1), Position::new(2));
        assert!(EqualPositions::Process.is_stale(low, high));
        assert!(!EqualPositions::Process.is_stale(high, high));
        assert!(EqualPositions::Stale.is_stale(high, high));
        assert!(!EqualPositions::Stale.is_stale(high, low));
    }
}
