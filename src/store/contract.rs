//! [`IdempotencyStore`]: the one trait every store implements (see the [store docs](super)
//! for the state machine it keeps), and [`OrderedStore`], the capability of ordering events.

use std::future::Future;
use std::time::Duration;

#[cfg(doc)]
use super::StoreErrorKind;
use super::record::Record;
use super::{Claim, Completion, Reservation, StoreError, Target};

/// A store of claims and records. Implemented by [`MemoryStore`](crate::MemoryStore), the Redis
/// store (feature `redis`) and the SQL stores (features `postgres`, `sqlite`).
///
/// Implementations must be cheap to clone (an `Arc` or a client handle inside): the layer clones
/// the store into every response future.
///
/// # One method per operation, over targets
///
/// Each operation takes the [`Target`]s of one claim: one key for a single request, the items of
/// a batch (all under one claim, one token), or the events of an ordered route (each a key with
/// its [`Order`](super::Order)). Each target is handled atomically on its own; the slice as a
/// whole is not atomic. Answers come one per target, in order. A store spends as few round
/// trips as it can on a slice (one pipeline, one statement); the usual slice holds one
/// unordered target, and is worth a path of its own.
///
/// A target with an order is handed only to a store that implements [`OrderedStore`]: a store
/// that does not may answer an error for one.
pub trait IdempotencyStore: Clone + Send + Sync + 'static {
    /// Atomically claims every target's key for `claim` with a lease of `lease`, or reports
    /// what holds it: one answer per target, in order.
    ///
    /// Each key must be claimed in a single atomic step: two concurrent calls for one key never
    /// both get [`Reservation::Acquired`] while the first lease is alive. A key already held by
    /// the same claim (a retried call) is [`Reservation::Acquired`] again. After an error some
    /// keys may be held by `claim`: the caller releases them.
    ///
    /// A target with an order (see [`OrderedStore`]) also takes its object's turn, in the same
    /// atomic step: the answer is what a key held elsewhere answers;
    /// [`Reservation::ObjectBusy`] when another claim holds the object (nothing written); else
    /// the key and the object lease are taken for `lease`, and the answer is
    /// [`Reservation::Stale`] when the order's `equal` says the position is stale against the
    /// object's watermark, [`Reservation::Acquired`] otherwise. Targets of one call may share
    /// an object: the object's lease is then this claim's for all of them. A retried call for
    /// an ordered key this claim holds answers as the first did ([`Reservation::Stale`] again
    /// while the position is stale). See [Ordered events](super#ordered-events).
    ///
    /// A store that knows how long it keeps a completed record it answers may say so with
    /// [`Record::expiring_in`]: a local cache in front of the store then keeps the record no
    /// longer. A store that does not know leaves it out.
    fn reserve(
        &self,
        targets: &[Target],
        claim: &Claim,
        lease: Duration,
    ) -> impl Future<Output = Result<Vec<Reservation>, StoreError>> + Send;

    /// Replaces our in-flight claim on every target's key with the completed `record`, kept for
    /// `retention`: one answer per target, in order.
    ///
    /// Writes nothing and answers [`Completion::Lost`] for a key no longer held by `claim`'s
    /// token (it was released, or its lease expired: whether or not another attempt took it
    /// since), and [`Completion::AlreadyWritten`] for one that already holds the record of
    /// this claim. The record is kept for `retention`, then the key is absent.
    /// With an order, in the same atomic step: the object's watermark is raised to the
    /// position (when higher, kept for `retention`) and the object lease let go (when this
    /// claim's); a lost claim writes nothing but still lets go of this claim's object lease.
    /// Only a completion that writes raises the watermark: a retried one
    /// ([`Completion::AlreadyWritten`]) leaves it where the first one put it.
    ///
    /// The layer hands over a record owned by `claim`: a store may keep
    /// [`record.encode()`](Record::encode) as it is, and tell a retried completion by
    /// [`Record::decode`] of what the key holds and [`is_owned_by`](Record::is_owned_by)`(claim.token())`.
    fn complete(
        &self,
        targets: &[Target],
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> impl Future<Output = Result<Vec<Completion>, StoreError>> + Send;

    /// Deletes our in-flight claim on every target's key (and, with an order, lets go of the
    /// object lease), so that a retry is processed again; returns how many keys were released.
    ///
    /// A key (or an object lease) not held by `claim`'s token is left as it is.
    fn release(
        &self,
        targets: &[Target],
        claim: &Claim,
    ) -> impl Future<Output = Result<usize, StoreError>> + Send;

    /// Extends our in-flight claim on every target's key (and, with an order, the object
    /// lease) to `lease` from now: what keeps a slow handler's claim alive. `Ok(true)` when
    /// every key was still ours; every key still ours is renewed, even when another is not.
    /// The answer speaks of the keys only: an object lease this claim no longer holds is left
    /// as it is and does not make it `false`.
    ///
    /// A key (or an object lease) not held by `claim`'s token is left as it is.
    fn renew(
        &self,
        targets: &[Target],
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
}

/// A store that honours each target's [`Order`](super::Order): its object's lease and
/// watermark are claimed, recorded, released and renewed in the same atomic step as the
/// target's key (see [Ordered events](super#ordered-events)).
///
/// What [`IdempotencyLayer::order`](crate::IdempotencyLayer::order) asks of its store: a layer
/// that orders events on a store without it does not compile. Every store of this crate
/// implements it, as do [`AnyStore`](super::AnyStore) and a
/// [`CachedStore`](super::CachedStore) of an ordered store.
pub trait OrderedStore: IdempotencyStore {}
