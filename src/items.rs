//! [`BatchItems`]: what the inner service learns about a batch request keyed per item
//! ([`JsonPathKey::each`](crate::key::JsonPathKey::each)).
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
/// by an earlier request. On success every new item is recorded. On failure they are released
/// so that the sender's retry runs them again, except the items the handler reported with
/// [`mark_done`](Self::mark_done) as it went: those are recorded even though the response is
/// an error (the idea of AWS Lambda's partial batch responses, at the HTTP layer).
///
/// Cheap to clone; in axum, take it as `Option<Extension<BatchItems>>` (a request keyed by a
/// header fallback has none).
#[derive(Clone)]
pub struct BatchItems {
    inner: Arc<Inner>,
}

struct Inner {
    /// The new items, in the order the layer claimed them.
    new: Vec<String>,
    done: Vec<AtomicBool>,
    /// Items completed by an earlier request.
    before: Vec<String>,
}

impl BatchItems {
    pub(crate) fn new(new: Vec<String>, before: Vec<String>) -> Self {
        let done = new.iter().map(|_| AtomicBool::new(false)).collect();
        BatchItems {
            inner: Arc::new(Inner { new, done, before }),
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
            new.into_iter().map(Into::into).collect(),
            done_before.into_iter().map(Into::into).collect(),
        )
    }

    /// The items this request must apply.
    pub fn new_items(&self) -> impl Iterator<Item = &str> {
        self.inner.new.iter().map(String::as_str)
    }

    /// The items an earlier request already applied: skip them.
    pub fn done_before(&self) -> impl Iterator<Item = &str> {
        self.inner.before.iter().map(String::as_str)
    }

    /// Whether `item` is new in this request.
    pub fn is_new(&self, item: &str) -> bool {
        self.inner.new.iter().any(|i| i == item)
    }

    /// Whether `item` was applied by an earlier request.
    pub fn is_done_before(&self, item: &str) -> bool {
        self.inner.before.iter().any(|i| i == item)
    }

    /// Reports that the new `item` has been applied, so that it is recorded even if the
    /// response ends up an error. `false` when `item` is not a new item of this request.
    pub fn mark_done(&self, item: &str) -> bool {
        match self.inner.new.iter().position(|i| i == item) {
            Some(at) => {
                self.inner.done[at].store(true, Ordering::Release);
                true
            }
            None => false,
        }
    }

    /// Which new items were reported done, in claim order.
    pub(crate) fn done_mask(&self) -> Vec<bool> {
        self.inner
            .done
            .iter()
            .map(|d| d.load(Ordering::Acquire))
            .collect()
    }
}

impl fmt::Debug for BatchItems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Item ids may be sensitive: counts only.
        f.debug_struct("BatchItems")
            .field("new", &self.inner.new.len())
            .field("done_before", &self.inner.before.len())
            .finish()
    }
}
