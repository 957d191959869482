//! [`BatchItems`]: what the inner service learns about a batch request keyed per item
//! ([`JsonPathKey::each`](crate::key::JsonPathKey::each), or the ordered items of
//! [`EventOrder::items`](crate::order::EventOrder::items)).
//!
//! ```
//! use tower_idempotency::BatchItems;
//!
//! // What the layer hands the handler for a batch {A, B, C} where B was done before.
//! let items = BatchItems::for_tests(["A", "C"], ["B"]);
//! assert_eq!(items.new_items().collect::<Vec<_>>(), ["A", "C"]);
//! assert!(items.is_done_before("B"));
//! // The handler applied A, then failed on C: A is recorded all the same, so the sender's
//! // retry runs only C.
//! assert!(items.mark_done("A"));
//! assert!(!items.mark_done("B"), "B is not new in this request");
//! ```

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The items of a batch request, in its request extensions, when the key is per item.
///
/// The layer claims every item; the inner service is called when some are new and none is in
/// flight elsewhere. It should apply only [`new_items`](Self::new_items): the others were done
/// by an earlier request, or are stale (on a route that orders events, an item older than
/// what was processed for its object, acknowledged without the handler). On success every new
/// item is recorded. On failure they are released so that the sender's retry runs them again,
/// except the items the handler reported with [`mark_done`](Self::mark_done) as it went: those
/// are recorded even though the response is an error (the idea of AWS Lambda's partial batch
/// responses, at the HTTP layer).
///
/// Cheap to clone; in axum, take it as `Option<Extension<BatchItems>>` (a request keyed by a
/// header fallback has none).
#[derive(Clone)]
pub struct BatchItems {
    inner: Arc<Inner>,
}

struct Inner {
    /// The items this request holds, in the order the layer claimed them.
    held: Vec<Held>,
    /// Items completed by an earlier request.
    before: Vec<String>,
}

struct Held {
    id: String,
    role: Role,
    /// Reported done by the handler (or, for a stale item acknowledged, done from the start).
    done: AtomicBool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// New: for the handler.
    New,
    /// Stale, acknowledged by the layer: not for the handler, recorded whatever happens.
    Stale,
    /// Stale, passed on to the handler (`StaleEvents::PassOn`).
    StaleNew,
}

impl BatchItems {
    /// The items of a request: `new` for the handler, `stale` ones (acknowledged, or passed on
    /// when `pass_on`) and those done `before`.
    pub(crate) fn new(
        held: impl IntoIterator<Item = (String, bool)>,
        before: Vec<String>,
        pass_on: bool,
    ) -> Self {
        let held = held
            .into_iter()
            .map(|(id, stale)| {
                let role = match (stale, pass_on) {
                    (false, _) => Role::New,
                    (true, false) => Role::Stale,
                    (true, true) => Role::StaleNew,
                };
                Held {
                    id,
                    role,
                    done: AtomicBool::new(role == Role::Stale),
                }
            })
            .collect();
        BatchItems {
            inner: Arc::new(Inner { held, before }),
        }
    }

    /// A value as the layer would build it: for handler unit tests.
    pub fn for_tests<N, B>(new: N, done_before: B) -> Self
    where
        N: IntoIterator,
        N::Item: Into<String>,
        B: IntoIterator,
        B::Item: Into<String>,
    {
        Self::new(
            new.into_iter().map(|id| (id.into(), false)),
            done_before.into_iter().map(Into::into).collect(),
            false,
        )
    }

    /// The items this request must apply.
    pub fn new_items(&self) -> impl Iterator<Item = &str> {
        self.held_but(Role::Stale)
    }

    /// The held items whose role is not `role`.
    fn held_but(&self, role: Role) -> impl Iterator<Item = &str> {
        self.inner
            .held
            .iter()
            .filter(move |h| h.role != role)
            .map(|h| h.id.as_str())
    }

    /// The items an earlier request already applied: skip them.
    pub fn done_before(&self) -> impl Iterator<Item = &str> {
        self.inner.before.iter().map(String::as_str)
    }

    /// The items that are stale: older than what was processed for their object. Acknowledged
    /// by the layer and not among [`new_items`](Self::new_items), unless the route passes
    /// stale events on (then they are among them too, for the handler to log or keep).
    pub fn stale_items(&self) -> impl Iterator<Item = &str> {
        self.held_but(Role::New)
    }

    /// Whether `item` is new in this request.
    pub fn is_new(&self, item: &str) -> bool {
        self.new_items().any(|i| i == item)
    }

    /// Whether `item` was applied by an earlier request.
    pub fn is_done_before(&self, item: &str) -> bool {
        self.inner.before.iter().any(|i| i == item)
    }

    /// Reports that the new `item` has been applied, so that it is recorded even if the
    /// response ends up an error. `false` when `item` is not a new item of this request.
    pub fn mark_done(&self, item: &str) -> bool {
        match self
            .inner
            .held
            .iter()
            .find(|h| h.role != Role::Stale && h.id == item)
        {
            Some(held) => {
                held.done.store(true, Ordering::Release);
                true
            }
            None => false,
        }
    }

    /// Which held items are done, in claim order.
    pub(crate) fn done_mask(&self) -> Vec<bool> {
        self.inner
            .held
            .iter()
            .map(|h| h.done.load(Ordering::Acquire))
            .collect()
    }

    /// Whether the handler has nothing to apply (every held item is stale and acknowledged).
    pub(crate) fn nothing_new(&self) -> bool {
        self.new_items().next().is_none()
    }
}

impl fmt::Debug for BatchItems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Item ids may be sensitive: counts only.
        f.debug_struct("BatchItems")
            .field("new", &self.new_items().count())
            .field("stale", &self.stale_items().count())
            .field("done_before", &self.inner.before.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_items_are_done_and_not_new_unless_passed_on() {
        let held = || [("a".to_owned(), false), ("b".to_owned(), true)];
        let acked = BatchItems::new(held(), vec!["z".into()], false);
        assert_eq!(acked.new_items().collect::<Vec<_>>(), ["a"]);
        assert_eq!(acked.stale_items().collect::<Vec<_>>(), ["b"]);
        assert_eq!(acked.done_mask(), [false, true]);
        assert!(!acked.mark_done("b"));
        assert!(acked.mark_done("a"));
        assert_eq!(acked.done_mask(), [true, true]);
        let passed = BatchItems::new(held(), Vec::new(), true);
        assert_eq!(passed.new_items().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(passed.stale_items().collect::<Vec<_>>(), ["b"]);
        assert_eq!(passed.done_mask(), [false, false]);
        assert!(!BatchItems::new([("b".to_owned(), true)], Vec::new(), false).is_new("b"));
        assert!(BatchItems::new([("b".to_owned(), true)], Vec::new(), false).nothing_new());
    }
}
