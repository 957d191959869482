//! [`OrderedItems`]: a batch whose items are events of several objects, each ordered on its
//! own.

use std::collections::HashSet;
use std::fmt;

use serde_json::Value;

use super::Placed;
use super::value::PositionAt;
use crate::key::query::ValuePath;
use crate::key::{JsonPathKey, KeyError, KeyErrorKind, KeyInput, MAX_KEY_PARTS};

/// Where the items of a batch are, and in each item its key, its object and its position: a
/// WhatsApp status callback carries statuses of several messages (`sent`, `delivered`,
/// `read`), each an event of its message.
///
/// Paths inside an item are RFC 9535 JSONPaths on the item (`$` is the item; filters,
/// descendants and slices with the `jsonpath` feature). An item's key is
/// the values at its key paths, joined with `:` (`wamid.A:read`): each item is claimed,
/// recorded and released on its own, and the handler sees them in
/// [`BatchItems`](crate::BatchItems). The items are read from the parsed body (a DOM), so
/// integers must fit 64 bits there.
///
/// ```
/// use tower_idempotency::{IdempotencyLayer, MemoryStore};
/// use tower_idempotency::key::HeaderKey;
/// use tower_idempotency::order::{EventOrder, OrderedItems, PositionAt};
///
/// let statuses = OrderedItems::new(
///     "$.entry[*].changes[*].value.statuses[*]",
///     ["$.id", "$.status"],
///     "$.id",
///     PositionAt::rank("$.status", [("sent", 1), ("delivered", 2), ("read", 3), ("failed", 3)])?,
/// )?;
/// // Callbacks without statuses (new messages) fall back to the delivery id, unordered.
/// let layer = IdempotencyLayer::webhook(MemoryStore::new())
///     .namespace("whatsapp-statuses")
///     .key(HeaderKey::new("X-Kalipto-Delivery-Id")?)
///     .order(EventOrder::items(statuses));
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct OrderedItems {
    items: Vec<(ValuePath, String)>,
    key: Vec<JsonPathKey>,
    object: JsonPathKey,
    position: PositionAt,
}

impl fmt::Debug for OrderedItems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let items: Vec<&str> = self.items.iter().map(|(_, s)| s.as_str()).collect();
        f.debug_struct("OrderedItems")
            .field("items", &items)
            .field("object", &self.object.path())
            .finish_non_exhaustive()
    }
}

impl OrderedItems {
    /// The items `items` selects (an RFC 9535 JSONPath selecting objects), each keyed by the
    /// values at `key` (paths on the item), about the object at `object`, placed by
    /// `position`.
    pub fn new<I, S>(
        items: &str,
        key: I,
        object: &str,
        position: PositionAt,
    ) -> Result<Self, crate::ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let parsed = ValuePath::parse(items)?;
        Ok(OrderedItems {
            items: vec![(parsed, items.to_owned())],
            key: key
                .into_iter()
                .map(|p| JsonPathKey::new(p.as_ref()))
                .collect::<Result<_, _>>()?,
            object: JsonPathKey::new(object)?,
            position,
        })
    }

    /// The ordered events of a request: one per item, in document order, each key once.
    pub(crate) fn place(&self, input: &KeyInput<'_>) -> Result<Vec<Placed>, KeyError> {
        let json = input.json()?;
        let mut seen = HashSet::new();
        let mut placed = Vec::new();
        for (path, source) in &self.items {
            for item in path.select(json) {
                let event = self.place_item(item, source)?;
                if seen.insert(event.key.clone()) {
                    placed.push(event);
                }
                if placed.len() > MAX_KEY_PARTS {
                    return Err(KeyError::new(
                        KeyErrorKind::TooManyParts,
                        format!("the request holds more than {MAX_KEY_PARTS} ordered items"),
                    ));
                }
            }
        }
        Ok(placed)
    }

    fn place_item(&self, item: &Value, source: &str) -> Result<Placed, KeyError> {
        let missing = |what: &str| {
            KeyError::new(
                KeyErrorKind::Other,
                format!("an item at {source} carries no {what}"),
            )
        };
        let mut parts = Vec::with_capacity(self.key.len());
        for path in &self.key {
            parts.push(
                path.one_in(item)?
                    .ok_or_else(|| missing(&format!("value at {}", path.path())))?,
            );
        }
        let key = parts.join(":");
        crate::key::IdempotencyKey::new(key.clone())?;
        let object = self
            .object
            .one_in(item)?
            .ok_or_else(|| missing(&format!("object at {}", self.object.path())))?;
        let position = self
            .position
            .in_value(item)?
            .ok_or_else(|| missing("position"))?;
        Ok(Placed {
            key,
            object,
            position,
        })
    }

    /// Whether the items' positions are instants (see [`ExtractPosition::instant`]).
    pub(crate) fn instant(&self) -> bool {
        self.position.is_instant()
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::order::Position;

    fn statuses() -> OrderedItems {
        OrderedItems::new(
            "$.entry[*].changes[*].value.statuses[*]",
            ["$.id", "$.status"],
            "$.id",
            PositionAt::rank("$.status", [("sent", 1), ("delivered", 2), ("read", 3)]).unwrap(),
        )
        .unwrap()
    }

    fn place(items: &OrderedItems, body: &'static str) -> Result<Vec<Placed>, KeyError> {
        let (parts, ()) = http::Request::post("/").body(()).unwrap().into_parts();
        let body = Bytes::from_static(body.as_bytes());
        items.place(&KeyInput::new(&parts, Some(&body)))
    }

    #[test]
    fn every_status_is_an_event_of_its_message() {
        let placed = place(
            &statuses(),
            r#"{"entry":[{"changes":[{"value":{"statuses":[
                {"id":"wamid.A","status":"read"},
                {"id":"wamid.B","status":"sent"},
                {"id":"wamid.A","status":"read"}
            ]}}]}]}"#,
        )
        .unwrap();
        let keys: Vec<&str> = placed.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            ["wamid.A:read", "wamid.B:sent"],
            "each key once, in order"
        );
        assert_eq!(placed[0].object, "wamid.A");
        assert_eq!(placed[0].position, Position::new(3));
        assert!(place(&statuses(), r#"{"entry":[]}"#).unwrap().is_empty());
        let err = place(
            &statuses(),
            r#"{"entry":[{"changes":[{"value":{"statuses":[{"id":"wamid.A","status":"lost"}]}}]}]}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("ranked"), "{err}");
        let err = place(
            &statuses(),
            r#"{"entry":[{"changes":[{"value":{"statuses":[{"status":"read"}]}}]}]}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("$.id"), "{err}");
    }
}
