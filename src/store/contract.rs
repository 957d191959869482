//! [`IdempotencyStore`]: the one trait every store implements (see the [store docs](super)
//! for the state machine it keeps).

use std::future::Future;
use std::time::Duration;

use super::record::Record;
use super::{Claim, Completion, OrderedEvent, Reservation, StoreError, StoreErrorKind, StoreKey};
use crate::order::EqualPositions;

/// A store of claims and records. Implemented by [`MemoryStore`](crate::MemoryStore), the Redis
/// store (feature `redis`) and the SQL stores (features `postgres`, `sqlite`).
///
/// Implementations must be cheap to clone (an `Arc` or a client handle inside): the layer clones
/// the store into every response future.
///
/// The `*_many` methods act on the items of one batch request, all under one claim (one
/// token). Their default implementations call the single-key method once per key, in order;
/// shared stores override them to spend one round trip for the whole batch.
pub trait IdempotencyStore: Clone + Send + Sync + 'static {
    /// Atomically claims `key` for `claim` with a lease of `lease`, or reports what holds it.
    ///
    /// Must be a single atomic step: two concurrent calls for one key never both get
    /// [`Reservation::Acquired`] while the first lease is alive. A key already held by the same
    /// claim (a retried call) is [`Reservation::Acquired`] again.
    fn reserve(
        &self,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> impl Future<Output = Result<Reservation, StoreError>> + Send;

    /// Replaces our in-flight claim with the completed `record`, kept for `retention`.
    ///
    /// Writes nothing and answers [`Completion::Lost`] when the key is no longer held by
    /// `claim`'s token (the lease expired and another attempt took it, or it was released), and
    /// [`Completion::AlreadyWritten`] when it already holds the record of this claim.
    fn complete(
        &self,
        key: &StoreKey,
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> impl Future<Output = Result<Completion, StoreError>> + Send;

    /// Deletes our in-flight claim so that a retry is processed again.
    ///
    /// Returns `Ok(false)` and deletes nothing when the key is not held by `claim`'s token.
    fn release(
        &self,
        key: &StoreKey,
        claim: &Claim,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Extends our in-flight claim to `lease` from now: what keeps a slow handler's claim alive.
    ///
    /// Returns `Ok(false)` and changes nothing when the key is not held by `claim`'s token.
    fn renew(
        &self,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Whether this store answers every call in this process, without I/O (the
    /// [`MemoryStore`](crate::MemoryStore)). The layer does not time such calls: they take
    /// nanoseconds (microseconds when a full memory store makes room), and a latency sample
    /// (two clock reads and a histogram update) would cost more than the call and tell an
    /// operator little (no `idempotency_store_duration_seconds` sample, no `store_ms` span
    /// field). Their failures are still counted, and the inner service's timer still starts
    /// after the reserve.
    ///
    /// The default, `false`, is right for any store that talks to a server. A store that wraps
    /// another answers as the wrapped one does (as [`CachedStore`](super::CachedStore) does).
    fn in_process(&self) -> bool {
        false
    }

    /// The timeout this store's client puts on each command it sends, if it has one: a call
    /// that gets no answer by then fails on its own with a
    /// [`Timeout`](StoreErrorKind::Timeout) error.
    ///
    /// The layer times each store call with its
    /// [store timeout](crate::IdempotencyLayer::store_timeout). When this is no longer than
    /// that, the client's own timer answers the layer in time, and the layer arms none of its
    /// own: one timer per store call instead of two. A call whose first command is answered
    /// and which then sends another (a script sent again as `EVAL` after `NOSCRIPT`: load the
    /// scripts at start-up) may take that one quick round trip longer. Return `None` for a
    /// store whose calls can chain more than that.
    ///
    /// The default, `None`, is right for any store whose client does not bound its calls.
    fn command_timeout(&self) -> Option<Duration> {
        None
    }

    /// [`reserve`](Self::reserve) of every key, one answer per key, in order. Not atomic as a
    /// whole: each key is claimed atomically on its own. After an error some keys may be held
    /// by `claim`: the caller releases them.
    fn reserve_many(
        &self,
        keys: &[StoreKey],
        claim: &Claim,
        lease: Duration,
    ) -> impl Future<Output = Result<Vec<Reservation>, StoreError>> + Send {
        async move {
            let mut out = Vec::with_capacity(keys.len());
            for key in keys {
                out.push(self.reserve(key, claim, lease).await?);
            }
            Ok(out)
        }
    }

    /// [`complete`](Self::complete) of every key with the same `record`, one answer per key.
    fn complete_many(
        &self,
        keys: &[StoreKey],
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> impl Future<Output = Result<Vec<Completion>, StoreError>> + Send {
        async move {
            let mut out = Vec::with_capacity(keys.len());
            for key in keys {
                out.push(self.complete(key, claim, record, retention).await?);
            }
            Ok(out)
        }
    }

    /// [`release`](Self::release) of every key; returns how many were released.
    fn release_many(
        &self,
        keys: &[StoreKey],
        claim: &Claim,
    ) -> impl Future<Output = Result<usize, StoreError>> + Send {
        async move {
            let mut released = 0;
            for key in keys {
                released += usize::from(self.release(key, claim).await?);
            }
            Ok(released)
        }
    }

    /// [`renew`](Self::renew) of every key; `Ok(true)` when every one was still ours.
    fn renew_many(
        &self,
        keys: &[StoreKey],
        claim: &Claim,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        async move {
            let mut all = true;
            for key in keys {
                all &= self.renew(key, claim, lease).await?;
            }
            Ok(all)
        }
    }

    /// Whether this store implements the `*_ordered` methods (every store of this crate
    /// does). A layer that orders events refuses, at its first request, a store that does not.
    fn orders_events(&self) -> bool {
        false
    }

    /// Claims the key of every event, and its object's turn, one event after the other (each
    /// atomically on its own, as [`reserve_many`](Self::reserve_many)): see [Ordered
    /// events](super#ordered-events). One answer per event, in order: what
    /// [`reserve`](Self::reserve) answers for a key held elsewhere;
    /// [`Reservation::ObjectBusy`] when another claim holds the object (nothing written); else
    /// the key and the object lease are taken for `lease`, and the answer is
    /// [`Reservation::Stale`] when `equal` says the position is stale against the object's
    /// watermark, [`Reservation::Acquired`] otherwise. Events of one request may share an
    /// object: the object's lease is then this claim's for all of them.
    ///
    /// The default answers an error: a store that does not order events.
    fn reserve_ordered(
        &self,
        events: &[OrderedEvent],
        claim: &Claim,
        lease: Duration,
        equal: EqualPositions,
    ) -> impl Future<Output = Result<Vec<Reservation>, StoreError>> + Send {
        let _ = (events, claim, lease, equal);
        async { Err(unsupported()) }
    }

    /// Completes every event as [`complete`](Self::complete) does and, in the same atomic
    /// step, raises its object's watermark to its position (when higher, kept for
    /// `retention`) and lets the object lease go (when this claim's). A lost claim writes
    /// nothing but still lets go of this claim's object lease.
    fn complete_ordered(
        &self,
        events: &[OrderedEvent],
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> impl Future<Output = Result<Vec<Completion>, StoreError>> + Send {
        let _ = (events, claim, record, retention);
        async { Err(unsupported()) }
    }

    /// Releases every event's key and its object's lease, each only when this claim's; returns
    /// how many keys were released.
    fn release_ordered(
        &self,
        events: &[OrderedEvent],
        claim: &Claim,
    ) -> impl Future<Output = Result<usize, StoreError>> + Send {
        let _ = (events, claim);
        async { Err(unsupported()) }
    }

    /// Renews every event's key and its object's lease, each only when this claim's;
    /// `Ok(true)` when every key was still ours.
    fn renew_ordered(
        &self,
        events: &[OrderedEvent],
        claim: &Claim,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let _ = (events, claim, lease);
        async { Err(unsupported()) }
    }
}

/// The error of a store that does not order events.
fn unsupported() -> StoreError {
    StoreError::with_source(
        StoreErrorKind::Other,
        "this store does not implement ordered events (IdempotencyStore::reserve_ordered)",
    )
}
