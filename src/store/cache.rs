//! [`LocalCache`] and [`CachedStore`]: a bounded in-process cache of completed records in
//! front of a shared store, so that an instance answers repeated duplicates without a round
//! trip. A layer puts one in front of every store that talks to a server (see
//! [`IdempotencyLayer::local_cache`](crate::IdempotencyLayer::local_cache)); [`CachedStore`] is
//! that composition as a store of its own, the one place where a store call goes through the
//! cache.
//!
//! A completed record never changes until it expires (see the [state machine](super)), so it
//! can be copied. An in-flight claim can change at any moment (completed, released, expired,
//! taken over): it is never cached, and neither is the absence of a key.
//!
//!
//! See [`LocalCache`] for what is cached, until when, and what it costs.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::map::{ExpiringMap, Weigh};
use super::record::Record;
use super::slot::Slot;
use super::{Claim, Completion, Reservation, StoreError, StoreErrorKind, StoreKey, Target};
use crate::store::contract::{IdempotencyStore, OrderedStore};

/// How much earlier than the store a cached record expires: stores count time in whole
/// milliseconds (Redis, SQL), rounded down from a clock read after the cache's own, so the
/// cache ends its entries this much sooner and never after the store.
const CLOCK_MARGIN: Duration = Duration::from_millis(1);

/// What a replay-mode record's stored response is accounted as, on top of its body and header
/// bytes: the boxed response and its header maps.
const RESPONSE_BYTES: usize = 256;

/// What each stored header (or trailer) is accounted as, on top of its name and value bytes.
const HEADER_BYTES: usize = 64;

/// A cached record, as the map weighs it.
struct Cached(Record);

impl Weigh for Cached {
    fn bytes(&self) -> usize {
        cost(&self.0)
    }

    /// Anything may go: the store still holds it.
    fn evictable(&self) -> bool {
        true
    }
}

/// What `record` is accounted as.
fn cost(record: &Record) -> usize {
    let headers = |h: &http::HeaderMap| -> usize {
        h.iter()
            .map(|(name, value)| HEADER_BYTES + name.as_str().len() + value.len())
            .sum()
    };
    LocalCache::ENTRY_BYTES
        + record.response().map_or(0, |r| {
            RESPONSE_BYTES + r.body().len() + headers(r.headers()) + r.trailers().map_or(0, headers)
        })
}

/// The local cache of completed records: bounds and lives.
///
/// Cheap to clone: clones share the records, so one cache may serve several layers (give each
/// layer a clone with [`IdempotencyLayer::local_cache`](crate::IdempotencyLayer::local_cache)).
/// The builder methods [`max_entries`](Self::max_entries) and [`max_bytes`](Self::max_bytes)
/// start a new, empty cache.
///
/// # What is cached, and until when
///
/// - **Records this instance completed** ([`Completion::Written`]): until the record's
///   retention ends in the store, or [`max_ttl`](Self::max_ttl) (default
///   10 minutes), whichever comes first. The clock starts
///   before the store is asked, so the entry does not outlive the record.
/// - **Records read from the store** (a reserve that found the key completed) and retried
///   completions ([`Completion::AlreadyWritten`]): for [`read_ttl`](Self::read_ttl) (default
///   5 seconds), and no longer than the store said it keeps the
///   record when it said so with the record it read (the memory and
///   SQL stores do, at no cost; the Redis store does not, so that a reserve stays one plain
///   `SET`). The cache never asks the store how long a record has left: a duplicate that
///   misses the cache costs the one reserve call, nothing more.
///   A record read near the end of its retention may therefore be answered from the cache up
///   to `read_ttl` after the store dropped it, as may a record the store dropped *before* its
///   expiry (evicted, deleted by hand, see below): the event was processed, so the answer is
///   still true; only the retention is a few seconds longer. Set `read_ttl` to zero to never
///   cache a record you did not write.
/// - A cache hit answers [`Reservation::Completed`] with no call to the inner store. A miss
///   asks the inner store, as without the cache. Batches send only the keys the cache does not
///   hold, in one call, and merge the answers in order; ordered events likewise.
/// - Completions, releases and renewals always go to the inner store. A reserve answer that
///   shows a key is not completed (acquired, in flight, stale, its object busy) drops whatever
///   the cache held for it, and so does every release and renewal (a claim only releases or
///   renews keys it acquired from the inner store, so a record cached for one is stale at
///   best).
///
/// Exactly-once is unchanged: every claim is still taken by the inner store, atomically, and
/// only a completed record, which the inner store answered or was told to write, is ever
/// served from the cache, so a duplicate is never answered 2xx before the first attempt has
/// succeeded.
///
/// # Deleting keys by hand
///
/// Deleting a completed key from the shared store (to have an event processed again) is not
/// seen by an instance that cached it until its entry expires: at most
/// [`max_ttl`](Self::max_ttl) for a key it completed itself, at most
/// [`read_ttl`](Self::read_ttl) for one it read. Wait that long before redelivering, or
/// call [`clear`](Self::clear) on every instance (from an admin endpoint, say).
///
/// # Memory
///
/// The cache holds at most [`max_entries`](Self::max_entries) records (default
/// 100,000) and at most [`max_bytes`](Self::max_bytes)
/// accounted bytes (default 64 MiB): an entry counts
/// 192 bytes, plus the stored response of a replay-mode record (body,
/// headers and trailers). It is the crate's one bounded, expiring, sharded map (the memory
/// store's too): up to 16 independently locked shards, each with its share of both bounds;
/// when one is full, the entry nearest to its expiry goes (with one life for the records this
/// instance writes, the oldest), and a record larger than a shard's share of the bytes is not
/// cached. Expired entries are dropped whenever a record is added to their shard or found
/// there. Every operation is O(1).
///
/// ```
/// use std::convert::Infallible;
/// use std::time::Duration;
/// use bytes::Bytes;
/// use http::{Request, Response};
/// use http_body_util::Full;
/// use tower::{Layer, ServiceExt};
/// use tower_idempotency::{IdempotencyLayer, MemoryStore};
/// use tower_idempotency::store::{CachedStore, LocalCache};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // In production the inner store is shared (Redis, SQL): a layer on one of those composes
/// // this by itself, with its `local_cache` setting. The memory store stands in for one here.
/// let cache = LocalCache::new()
///     .max_entries(50_000)
///     .max_bytes(32 * 1024 * 1024)
///     .max_ttl(Duration::from_secs(300))
///     .read_ttl(Duration::from_secs(2));
/// // Keep a clone of the cache: clones share its records.
/// let store = CachedStore::with_cache(MemoryStore::new(), cache.clone());
/// let route = IdempotencyLayer::new(store).layer(tower::service_fn(|_: Request<_>| async {
///     Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
/// }));
/// let delivery = || {
///     let body = Full::new(Bytes::from_static(b"{}"));
///     Request::post("/webhooks").header("idempotency-key", "evt_1").body(body).unwrap()
/// };
///
/// route.clone().oneshot(delivery()).await.unwrap();
/// // Completed: duplicates are answered from the cache, without asking the inner store.
/// assert_eq!(cache.len(), 1);
/// let repeat = route.clone().oneshot(delivery()).await.unwrap();
/// assert_eq!(repeat.headers()["idempotent-replayed"], "true");
///
/// cache.clear();
/// assert!(cache.is_empty());
/// # }
/// ```
///
/// # Building one
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::store::LocalCache;
///
/// let cache = LocalCache::new()
///     .max_entries(50_000)
///     .max_ttl(Duration::from_secs(300))
///     .read_ttl(Duration::from_secs(2));
/// assert!(cache.is_empty());
/// let _off = LocalCache::off();
/// ```
#[derive(Clone)]
pub struct LocalCache {
    map: Arc<ExpiringMap<Cached>>,
    max_entries: usize,
    max_bytes: usize,
    max_ttl: Duration,
    read_ttl: Duration,
}

impl Default for LocalCache {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for LocalCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalCache")
            .field("max_entries", &self.max_entries)
            .field("max_bytes", &self.max_bytes)
            .field("max_ttl", &self.max_ttl)
            .field("read_ttl", &self.read_ttl)
            .finish()
    }
}

impl LocalCache {
    /// The default bound on the number of cached records: 100 000, about 20 MB of ack-mode
    /// records (192 bytes each). At 160 first deliveries a second,
    /// that is every record of the last 10 minutes (10 minutes);
    /// above that rate the oldest go first, and the duplicates that come in bursts, seconds
    /// after the first delivery, are still answered from the cache.
    pub(crate) const DEFAULT_MAX_ENTRIES: usize = 100_000;

    /// The default bound on the bytes the cache accounts for: 64 MiB. It is what bounds a
    /// cache of replay-mode records, which carry the response body: 100 000 responses of 1 KiB
    /// would take about 150 MB.
    pub(crate) const DEFAULT_MAX_BYTES: usize = 64 * 1024 * 1024;

    /// The default longest life of a cached record: 10 minutes.
    ///
    /// The duplicates worth saving a round trip for come soon after the first delivery: a
    /// sender that timed out and retried, an at-least-once queue redelivering, the first
    /// retries of a webhook provider's schedule (Standard Webhooks retries after 5 seconds,
    /// then 5 minutes). A duplicate arriving later costs one round trip, as without the cache.
    /// And it bounds how long an instance that completed a key answers it as a duplicate after
    /// the key was deleted from the shared store by hand.
    pub(crate) const DEFAULT_MAX_TTL: Duration = Duration::from_secs(600);

    /// The default longest life of a record read from the store rather than written by this
    /// instance: 5 seconds (and never past the record's expiry in the store, when the store
    /// tells it). This is how late a duplicate may be answered after the record was
    /// deleted from the store by hand. Short enough to be harmless, long enough to absorb a
    /// burst of duplicates with one round trip.
    pub(crate) const DEFAULT_READ_TTL: Duration = Duration::from_secs(5);

    /// What one cached record is accounted as, before any stored response: its slot in the
    /// shard's table (key, record, expiry) and in its expiry queue, with the tables' slack.
    pub(crate) const ENTRY_BYTES: usize = 192;

    /// A cache of at most 100,000 records and
    /// 64 MiB bytes, kept at most
    /// 10 minutes (5 seconds
    /// for records read from the store).
    pub fn new() -> Self {
        Self::with_bounds(Self::DEFAULT_MAX_ENTRIES, Self::DEFAULT_MAX_BYTES)
    }

    fn with_bounds(max_entries: usize, max_bytes: usize) -> Self {
        LocalCache {
            map: Arc::new(ExpiringMap::new(max_entries, max_bytes)),
            max_entries,
            max_bytes,
            max_ttl: Self::DEFAULT_MAX_TTL,
            read_ttl: Self::DEFAULT_READ_TTL,
        }
    }

    /// No cache: every call goes to the store.
    pub fn off() -> Self {
        Self::new().max_entries(0)
    }

    /// Whether the cache can hold records (it is not [`off`](Self::off)).
    pub(crate) fn is_on(&self) -> bool {
        self.map.holds_anything()
    }

    /// Sets the bound on the number of cached records (default
    /// 100,000); zero turns the cache off. Starts a
    /// new, empty cache.
    pub fn max_entries(self, max_entries: usize) -> Self {
        LocalCache {
            max_ttl: self.max_ttl,
            read_ttl: self.read_ttl,
            ..Self::with_bounds(max_entries, self.max_bytes)
        }
    }

    /// Sets the bound on the accounted bytes (default
    /// 64 MiB): 192 bytes per
    /// record, plus the stored response of replay-mode records. Starts a new, empty cache.
    pub fn max_bytes(self, max_bytes: usize) -> Self {
        LocalCache {
            max_ttl: self.max_ttl,
            read_ttl: self.read_ttl,
            ..Self::with_bounds(self.max_entries, max_bytes)
        }
    }

    /// Sets the longest time a record is cached (default
    /// 10 minutes). A record this instance completed is cached
    /// for its retention or `max_ttl`, whichever is shorter; this is also how long a key
    /// deleted from the store by hand may still be answered as a duplicate by this instance.
    pub fn max_ttl(mut self, max_ttl: Duration) -> Self {
        self.max_ttl = max_ttl;
        self
    }

    /// Sets how long a record read from the store (not written by this instance) is cached at
    /// most (default 5 seconds, never more than
    /// [`max_ttl`](Self::max_ttl), never past the record's expiry in the store when the store
    /// tells it): how late a duplicate may be answered after the record was deleted from the
    /// store by hand, or expired there. Zero
    /// caches only the records this instance wrote.
    pub fn read_ttl(mut self, read_ttl: Duration) -> Self {
        self.read_ttl = read_ttl;
        self
    }

    /// The number of records held, including expired ones not yet dropped (they are dropped
    /// when a record is next added to their shard or found there).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the cache holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes accounted for the records held (192 bytes each, plus
    /// stored responses).
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.map.bytes()
    }

    /// Forgets every cached record (of every clone of this cache): the next duplicate of each
    /// key asks the store. What an operator who deleted keys from the shared store by hand
    /// calls on every instance.
    pub fn clear(&self) {
        self.map.clear()
    }

    /// The live record cached for `key`.
    fn get(&self, key: &StoreKey) -> Option<Record> {
        if !self.is_on() {
            return None;
        }
        let slot = Slot::of(key);
        // A first delivery misses: its lookup reads no clock (nothing expired can be found).
        let (table, now) = self.map.shard_holding(&slot)?;
        table.get(&slot, now).map(|cached| cached.0.clone())
    }

    /// Drops the entry for `key`, if any.
    fn forget(&self, key: &StoreKey) {
        if self.is_on() {
            let slot = Slot::of(key);
            self.map.shard_as_is(&slot).remove(&slot);
        }
    }

    /// The longest life of a record read from the store.
    fn read_life(&self) -> Duration {
        self.read_ttl.min(self.max_ttl)
    }

    /// Whether records read from the store are cached at all.
    fn reads(&self) -> bool {
        self.read_life() > CLOCK_MARGIN && self.is_on()
    }

    /// The life of a record this instance wrote with `retention`, from before the write.
    fn written_life(&self, retention: Duration) -> Duration {
        retention.min(self.max_ttl).saturating_sub(CLOCK_MARGIN)
    }

    /// The life of `record`, read from the store: the read life, and no longer than the store
    /// said it keeps the record, when it said.
    fn read_life_of(&self, record: &Record) -> Duration {
        let life = record
            .expires_in()
            .map_or(self.read_life(), |left| left.min(self.read_life()));
        life.saturating_sub(CLOCK_MARGIN)
    }

    /// Caches `record` for `key` until `life` after `from` (a clock read made before the
    /// store was asked).
    fn remember(&self, key: &StoreKey, record: &Record, from: Instant, life: Duration) {
        if life.is_zero() || !self.is_on() || cost(record) > self.map.shard_bytes() {
            return;
        }
        let slot = Slot::of(key);
        // The entry's life starts at `from`; so does the look for what expired in its shard,
        // rather than at a clock read of its own (what expired since goes at the next look).
        let from = self.map.nanos_at(from);
        let mut table = self.map.shard_at(&slot, from);
        let expires = from.saturating_add(super::map::nanos(life));
        // Evicting is always allowed: the store still holds whatever goes. (The ages of the
        // entries evicted, counted from `from`, are not kept.)
        let _ = table.insert_until(slot, Cached(record.clone()), expires, life, from, true);
    }

    /// What a reserve's answer (to a call made at `asked`) teaches: a completed record is
    /// cached for its [read life](Self::read_life_of); any other answer drops what was cached
    /// for `key`.
    fn heed(&self, key: &StoreKey, answer: &Reservation, asked: Instant) {
        match answer {
            Reservation::Completed(record) if self.reads() => {
                self.remember(key, record, asked, self.read_life_of(record));
            }
            Reservation::Completed(_) => {}
            _ => self.forget(key),
        }
    }

    /// What a completion teaches: a record written is cached for its retention (at most
    /// `max_ttl`) from `asked`; one an earlier attempt of the claim wrote, whose retention
    /// started earlier, like a record read.
    fn heed_completion(
        &self,
        key: &StoreKey,
        done: Completion,
        owned: &Record,
        retention: Duration,
        asked: Instant,
    ) {
        match done {
            Completion::Written => self.remember(key, owned, asked, self.written_life(retention)),
            Completion::AlreadyWritten if self.reads() => {
                let life = self.read_life_of(owned).min(retention);
                self.remember(key, owned, asked, life);
            }
            _ => {}
        }
    }
}

/// An [`IdempotencyStore`] that keeps recently completed records of `St` in a [`LocalCache`]
/// and answers duplicates of them without calling `St`: the one forwarding store of the crate.
/// See [`LocalCache`] for what is cached and until when.
///
/// A layer composes this by itself in front of a store that talks to a server (see
/// [`IdempotencyLayer::local_cache`](crate::IdempotencyLayer::local_cache)); use it directly
/// to call a store outside a layer, or to wrap a store of your own. The [`LocalCache`] is the
/// one place its bounds and lives are set, and its length read or its records cleared.
///
/// Cheap to clone: clones share the cache.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::MemoryStore;
/// use tower_idempotency::store::{CachedStore, LocalCache};
///
/// // `MemoryStore` stands in for a shared store (`RedisStore`, `PostgresStore`).
/// let cache = LocalCache::new().read_ttl(Duration::from_secs(2));
/// let store = CachedStore::with_cache(MemoryStore::new(), cache.clone());
/// assert_eq!(cache.len(), 0);
/// # let _ = store;
/// ```
#[derive(Clone)]
pub struct CachedStore<St> {
    inner: St,
    cache: LocalCache,
}

impl<St> CachedStore<St> {
    /// Wraps `inner` with `cache` (which other stores or layers may share): configure the
    /// cache's bounds and lives on the [`LocalCache`], and keep a clone of it to read its
    /// [`len`](LocalCache::len) or to [`clear`](LocalCache::clear) it.
    pub fn with_cache(inner: St, cache: LocalCache) -> Self {
        CachedStore { inner, cache }
    }
}

/// What the unit tests below configure and read through the store itself.
#[cfg(test)]
impl<St> CachedStore<St> {
    pub(crate) fn new(inner: St) -> Self {
        Self::with_cache(inner, LocalCache::new())
    }

    pub(crate) fn max_entries(mut self, max_entries: usize) -> Self {
        self.cache = self.cache.max_entries(max_entries);
        self
    }

    pub(crate) fn max_bytes(mut self, max_bytes: usize) -> Self {
        self.cache = self.cache.max_bytes(max_bytes);
        self
    }

    pub(crate) fn max_ttl(mut self, max_ttl: Duration) -> Self {
        self.cache = self.cache.max_ttl(max_ttl);
        self
    }

    pub(crate) fn read_ttl(mut self, read_ttl: Duration) -> Self {
        self.cache = self.cache.read_ttl(read_ttl);
        self
    }

    pub(crate) fn inner(&self) -> &St {
        &self.inner
    }

    pub(crate) fn into_inner(self) -> St {
        self.inner
    }

    pub(crate) fn cache(&self) -> &LocalCache {
        &self.cache
    }

    pub(crate) fn len(&self) -> usize {
        self.cache.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }

    pub(crate) fn bytes(&self) -> usize {
        self.cache.bytes()
    }

    pub(crate) fn clear(&self) {
        self.cache.clear()
    }
}

impl<St: fmt::Debug> fmt::Debug for CachedStore<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedStore")
            .field("inner", &self.inner)
            .field("cache", &self.cache)
            .finish()
    }
}

impl<St: IdempotencyStore> CachedStore<St> {
    /// A reserve of several targets through the cache: the cached keys are answered from the
    /// cache, the others sent to the inner store in one call (none when every key is cached);
    /// the answers come back in the order of `targets`.
    async fn reserve_misses(
        &self,
        targets: &[Target],
        claim: &Claim,
        lease: Duration,
    ) -> Result<Vec<Reservation>, StoreError> {
        let mut answers: Vec<Option<Reservation>> = targets
            .iter()
            .map(|target| self.cache.get(&target.key).map(Reservation::Completed))
            .collect();
        let misses: Vec<Target> = targets
            .iter()
            .zip(&answers)
            .filter(|(_, answer)| answer.is_none())
            .map(|(target, _)| target.clone())
            .collect();
        if misses.is_empty() {
            return Ok(answers.into_iter().flatten().collect());
        }
        let count = misses.len();
        let asked = Instant::now();
        let fetched = self.inner.reserve(&misses, claim, lease).await?;
        if fetched.len() != count {
            return Err(StoreError::with_source(
                StoreErrorKind::Corrupt,
                format!(
                    "a batch reserve answered {} times for {count} keys",
                    fetched.len()
                ),
            ));
        }
        let mut fetched = fetched.into_iter();
        for (target, answer) in targets.iter().zip(&mut answers) {
            if answer.is_some() {
                continue;
            }
            let Some(reservation) = fetched.next() else {
                break;
            };
            self.cache.heed(&target.key, &reservation, asked);
            *answer = Some(reservation);
        }
        Ok(answers.into_iter().flatten().collect())
    }

    /// Drops whatever was cached for the keys of `targets` (a claim only releases or renews
    /// keys it acquired from the store, so a record cached for one is stale at best).
    fn forget(&self, targets: &[Target]) {
        for target in targets {
            self.cache.forget(&target.key);
        }
    }
}

impl<St: IdempotencyStore> IdempotencyStore for CachedStore<St> {
    /// As the inner store: a cache miss is a call to it.
    fn in_process(&self) -> bool {
        self.inner.in_process()
    }

    /// As the inner store's.
    fn command_timeout(&self) -> Option<Duration> {
        self.inner.command_timeout()
    }

    /// A live cached record answers [`Reservation::Completed`] without calling the inner
    /// store; otherwise the inner store answers, and a completed record it returns is cached
    /// for [`read_ttl`](LocalCache::read_ttl), no longer than the inner store said it keeps
    /// it, when it said. Of several targets, only those not cached
    /// are sent to the inner store, in one call (none when every key is cached); the answers
    /// come back in the order of `targets`.
    async fn reserve(
        &self,
        targets: &[Target],
        claim: &Claim,
        lease: Duration,
    ) -> Result<Vec<Reservation>, StoreError> {
        let [target] = targets else {
            // Boxed: the single target's future, which every request awaits, stays small.
            return Box::pin(self.reserve_misses(targets, claim, lease)).await;
        };
        if let Some(record) = self.cache.get(&target.key) {
            return Ok(vec![Reservation::Completed(record)]);
        }
        let asked = Instant::now();
        let answers = self.inner.reserve(targets, claim, lease).await?;
        if let Some(answer) = answers.first() {
            self.cache.heed(&target.key, answer, asked);
        }
        Ok(answers)
    }

    /// Always completes in the inner store (one call). A record written
    /// ([`Completion::Written`]) is cached for its retention or
    /// [`max_ttl`](LocalCache::max_ttl), whichever is shorter, counted from before the call;
    /// one found already written by an earlier attempt ([`Completion::AlreadyWritten`]), whose
    /// retention started earlier, like a record read (see [`reserve`](Self::reserve)).
    async fn complete(
        &self,
        targets: &[Target],
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> Result<Vec<Completion>, StoreError> {
        let asked = Instant::now();
        let done = self
            .inner
            .complete(targets, claim, record, retention)
            .await?;
        let owned = record.clone().owned_by(claim.token());
        for (target, completion) in targets.iter().zip(&done) {
            self.cache
                .heed_completion(&target.key, *completion, &owned, retention, asked);
        }
        Ok(done)
    }

    /// Always releases in the inner store (one call), then drops any cached record of the
    /// targets' keys.
    async fn release(&self, targets: &[Target], claim: &Claim) -> Result<usize, StoreError> {
        let answer = self.inner.release(targets, claim).await;
        self.forget(targets);
        answer
    }

    /// Always renews in the inner store (one call), then drops any cached record of the
    /// targets' keys.
    async fn renew(
        &self,
        targets: &[Target],
        claim: &Claim,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let answer = self.inner.renew(targets, claim, lease).await;
        self.forget(targets);
        answer
    }
}

/// As the inner store: the cache answers only keys completed, and sends every order on.
impl<St: OrderedStore> OrderedStore for CachedStore<St> {}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use bytes::Bytes;
    use http::{HeaderMap, StatusCode};

    use super::*;
    use crate::fingerprint::Fingerprint;
    use crate::store::memory::MemoryStore;
    use crate::store::record::{StoredResponse, StoredValue};
    use crate::store::slot::Slot;
    use crate::test_util::store::{Call, Hook, Hooked, OneTarget, completes, reserves};

    const LEASE: Duration = Duration::from_secs(30);
    const RETENTION: Duration = Duration::from_secs(3600);

    /// A memory store that counts the calls made to it, and the keys of the last reserve.
    type Counting = Hooked<MemoryStore, Counts>;

    #[derive(Clone, Default)]
    struct Counts {
        calls: Arc<AtomicUsize>,
        last_batch: Arc<Mutex<Vec<StoreKey>>>,
    }

    impl Counts {
        fn calls(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }
    }

    impl Hook for Counts {
        async fn before(&self, call: Call, targets: &[Target]) -> Result<(), StoreError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if call == Call::Reserve {
                *self.last_batch.lock().unwrap() = targets.iter().map(|t| t.key.clone()).collect();
            }
            Ok(())
        }
    }

    /// The targets of `keys`, none of them ordered (what a batch claims).
    fn keys_of(keys: &[StoreKey]) -> Vec<Target> {
        keys.iter().cloned().map(Target::key).collect()
    }

    fn claim() -> Claim {
        Claim::new(Fingerprint::of_bytes(b"body"))
    }

    fn key(i: usize) -> StoreKey {
        StoreKey::new("cache", None, &i.to_string())
    }

    /// Claims and completes `key` through `store`, with an ack record.
    /// What a new claim of `key` is told.
    async fn told<St: IdempotencyStore>(store: &St, key: &StoreKey) -> Reservation {
        store.reserve_one(key, &claim(), LEASE).await.unwrap()
    }

    async fn complete<St: IdempotencyStore>(store: &St, key: &StoreKey, retention: Duration) {
        let owner = claim();
        reserves(store, key, &owner, LEASE, Reservation::Acquired).await;
        let record = Record::ack(owner.fingerprint());
        completes(store, key, &owner, &record, retention, Completion::Written).await;
    }

    fn replay(body: usize) -> Record {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", "application/json".parse().unwrap());
        Record::replay(
            Fingerprint::of_bytes(b"body"),
            StoredResponse::new(
                StatusCode::CREATED,
                headers,
                Bytes::from(vec![b'x'; body]),
                None,
            ),
        )
    }

    #[tokio::test]
    async fn a_completed_key_is_answered_without_the_inner_store() {
        let inner = Counting::default();
        let store = CachedStore::new(inner.clone());
        let k = key(1);
        let owner = claim();
        store.reserve_one(&k, &owner, LEASE).await.unwrap();
        let record = Record::ack(owner.fingerprint());
        store
            .complete_one(&k, &owner, &record, RETENTION)
            .await
            .unwrap();
        assert_eq!(inner.hook.calls(), 2);
        for _ in 0..3 {
            match told(&store, &k).await {
                // The record as the inner store holds it: owned by the claim that wrote it.
                Reservation::Completed(held) => {
                    assert!(held.is_owned_by(owner.token()));
                    assert_eq!(held, record.clone().owned_by(owner.token()));
                }
                other => panic!("expected a completed record, got {other:?}"),
            }
        }
        assert_eq!(
            inner.hook.calls(),
            2,
            "cache hits never reach the inner store"
        );
        // Completing and releasing still go to the inner store.
        completes(
            &store,
            &k,
            &owner,
            &record,
            RETENTION,
            Completion::AlreadyWritten,
        )
        .await;
        assert_eq!(inner.hook.calls(), 3);
    }

    #[tokio::test]
    async fn an_in_flight_claim_is_never_cached_nor_served() {
        let inner = Counting::default();
        let store = CachedStore::new(inner.clone());
        let (k, owner) = (key(1), claim());
        reserves(&store, &k, &owner, LEASE, Reservation::Acquired).await;
        for _ in 0..3 {
            assert!(matches!(
                told(&store, &k).await,
                Reservation::InFlight { .. }
            ));
        }
        assert!(store.is_empty());
        assert_eq!(
            inner.hook.calls(),
            4,
            "every reserve of an in-flight key asks the store"
        );
        // A completion that lost its claim caches nothing either.
        let stranger = claim();
        let record = Record::ack(stranger.fingerprint());
        completes(&store, &k, &stranger, &record, RETENTION, Completion::Lost).await;
        assert!(store.is_empty());
        assert!(store.renew_one(&k, &owner, LEASE).await.unwrap());
        assert!(matches!(
            told(&store, &k).await,
            Reservation::InFlight { .. }
        ));
    }

    #[tokio::test]
    async fn a_released_key_is_not_served() {
        let inner = Counting::default();
        let store = CachedStore::new(inner.clone());
        let (k, owner) = (key(1), claim());
        store.reserve_one(&k, &owner, LEASE).await.unwrap();
        assert!(store.release_one(&k, &owner).await.unwrap());
        assert!(store.is_empty());
        assert_claimed_anew(&store, &k).await;
    }

    /// A new claim on `k` acquires it (nothing is served from the cache), and lets it go.
    async fn assert_claimed_anew<St: IdempotencyStore>(store: &CachedStore<St>, k: &StoreKey) {
        let next = claim();
        reserves(store, k, &next, LEASE, Reservation::Acquired).await;
        assert!(store.release_one(k, &next).await.unwrap());
    }

    #[tokio::test]
    async fn a_record_read_is_never_served_past_the_expiry_the_store_told() {
        let inner = MemoryStore::new();
        let store = CachedStore::new(inner.clone()).read_ttl(Duration::from_secs(60));
        let k = key(1);
        // Read at once, well within the retention.
        let retention = Duration::from_secs(1);
        complete(&inner, &k, retention).await;
        assert!(matches!(told(&store, &k).await, Reservation::Completed(_)));
        assert_eq!(store.len(), 1, "cached with the expiry the store told");
        tokio::time::sleep(retention + Duration::from_millis(200)).await;
        // The record expired in the store: so did the entry, long before `read_ttl`.
        assert_claimed_anew(&store, &k).await;
    }

    /// A memory store that does not say how long it keeps the records it returns (as Redis).
    type Untold = Hooked<MemoryStore, Untelling>;

    #[derive(Clone, Default)]
    struct Untelling;

    impl Hook for Untelling {
        fn reserved(&self, answers: Vec<Reservation>) -> Result<Vec<Reservation>, StoreError> {
            let untold = |answer| match answer {
                Reservation::Completed(record) => match StoredValue::decode(&record.encode())? {
                    StoredValue::Completed(untold) => Ok(Reservation::Completed(untold)),
                    StoredValue::InFlight { .. } => unreachable!("a record encodes as one"),
                },
                other => Ok(other),
            };
            answers.into_iter().map(untold).collect()
        }
    }

    #[tokio::test]
    async fn a_record_read_without_its_expiry_lives_read_ttl() {
        let inner = Untold::default();
        // Read at once, well within the retention (500 ms); cached for read_ttl (2 s).
        let store = CachedStore::new(inner.clone()).read_ttl(Duration::from_secs(2));
        let k = key(1);
        complete(&inner.store, &k, Duration::from_millis(500)).await;
        let Reservation::Completed(read) = told(&store, &k).await else {
            panic!("completed");
        };
        assert_eq!(read.expires_in(), None, "the store did not tell");
        assert_eq!(store.len(), 1, "cached for read_ttl");
        // 600 ms at least after the completion, past the retention; 1.4 s before read_ttl.
        tokio::time::sleep(Duration::from_millis(600)).await;
        // Gone from the store, still answered from the cache: the event was processed.
        assert!(matches!(told(&store, &k).await, Reservation::Completed(_)));
        // 2.1 s at least after the read: past read_ttl.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_claimed_anew(&store, &k).await;
    }

    #[tokio::test]
    async fn an_answer_showing_the_key_not_completed_drops_a_stale_record() {
        // The store forgets a record this instance completed and caches (evicted to make room,
        // as here, or deleted by hand): the cache is stale until an answer shows it.
        let inner = MemoryStore::new().with_max_entries(1);
        let store = CachedStore::new(inner.clone());
        let k = key(1);
        complete(&store, &k, RETENTION).await;
        assert_eq!(store.len(), 1);
        let filler = claim();
        assert_eq!(
            inner.reserve_one(&key(2), &filler, LEASE).await.unwrap(),
            Reservation::Acquired,
            "the record of `k` was evicted"
        );
        assert!(inner.release_one(&key(2), &filler).await.unwrap());
        // Another instance claims the key again; this one renews it for that claim (as a
        // guard on this instance would): the entry is dropped, and the answer shows the key
        // in flight.
        let other = claim();
        reserves(&inner, &k, &other, LEASE, Reservation::Acquired).await;
        assert!(matches!(told(&store, &k).await, Reservation::Completed(_)));
        assert!(store.renew_one(&k, &other, LEASE).await.unwrap());
        assert!(store.is_empty());
        assert!(matches!(
            told(&store, &k).await,
            Reservation::InFlight { .. }
        ));
    }

    #[tokio::test]
    async fn records_read_from_the_store_live_read_ttl() {
        let inner = Counting::default();
        let store = CachedStore::new(inner.clone()).read_ttl(Duration::from_secs(1));
        let k = key(1);
        complete(&inner.store, &k, RETENTION).await;
        assert!(matches!(told(&store, &k).await, Reservation::Completed(_)));
        assert!(matches!(told(&store, &k).await, Reservation::Completed(_)));
        assert_eq!(inner.hook.calls(), 1, "the second duplicate is a cache hit");
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert!(matches!(told(&store, &k).await, Reservation::Completed(_)));
        assert_eq!(inner.hook.calls(), 2, "expired: asked the store again");

        // A zero read TTL caches only what this instance wrote.
        let store = CachedStore::new(inner.clone()).read_ttl(Duration::ZERO);
        store.reserve_one(&k, &claim(), LEASE).await.unwrap();
        assert!(store.is_empty());
        complete(&store, &key(2), RETENTION).await;
        assert_eq!(store.len(), 1);
    }

    #[tokio::test]
    async fn entries_expire_with_the_retention_or_max_ttl() {
        let inner = Counting::default();
        let store = CachedStore::new(inner.clone()).max_ttl(Duration::from_secs(2));
        // Retention shorter than max_ttl: the entry never outlives the record.
        let short = key(1);
        complete(&store, &short, Duration::from_millis(500)).await;
        // Retention longer than max_ttl: kept max_ttl.
        let long = key(2);
        complete(&store, &long, RETENTION).await;
        assert_eq!(store.len(), 2);
        let calls = inner.hook.calls();
        for k in [&short, &long] {
            assert!(matches!(told(&store, k).await, Reservation::Completed(_)));
        }
        assert_eq!(inner.hook.calls(), calls);

        // Past the short retention (500 ms), 1.3 s before max_ttl (2 s).
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(
            told(&store, &short).await,
            Reservation::Acquired,
            "expired with its retention: the key is free again"
        );
        assert!(matches!(
            told(&store, &long).await,
            Reservation::Completed(_)
        ));
        assert_eq!(inner.hook.calls(), calls + 1);
        // 2.1 s at least after the completion: past max_ttl.
        tokio::time::sleep(Duration::from_millis(1400)).await;
        assert!(matches!(
            told(&store, &long).await,
            Reservation::Completed(_)
        ));
        assert_eq!(
            inner.hook.calls(),
            calls + 2,
            "past max_ttl: asked the store"
        );
    }

    #[tokio::test]
    async fn bounded_by_entries_oldest_first() {
        let inner = Counting::default();
        let store = CachedStore::new(inner.clone()).max_entries(4);
        for i in 0..10 {
            complete(&store, &key(i), RETENTION).await;
            assert!(store.len() <= 4);
        }
        assert_eq!(store.len(), 4);
        assert_eq!(store.bytes(), 4 * LocalCache::ENTRY_BYTES);
        let calls = inner.hook.calls();
        for i in 6..10 {
            store.reserve_one(&key(i), &claim(), LEASE).await.unwrap();
        }
        assert_eq!(inner.hook.calls(), calls, "the newest four are cached");
        for i in 0..6 {
            assert!(matches!(
                told(&store, &key(i)).await,
                Reservation::Completed(_)
            ));
        }
        assert_eq!(inner.hook.calls(), calls + 6, "the oldest six were evicted");

        // Sharded: the bound holds across shards.
        let store = CachedStore::new(MemoryStore::new()).max_entries(1_000);
        for i in 0..5_000 {
            complete(&store, &key(i), RETENTION).await;
        }
        assert!(store.len() <= 1_000);
        assert!(store.len() >= 900, "{}", store.len());
    }

    #[tokio::test]
    async fn bounded_by_bytes_counting_stored_responses() {
        let store = CachedStore::new(MemoryStore::new()).max_bytes(10_000);
        let one = cost(&replay(2_000));
        assert!(one > 2_000 + LocalCache::ENTRY_BYTES);
        for i in 0..10 {
            let (k, owner) = (key(i), claim());
            store.reserve_one(&k, &owner, LEASE).await.unwrap();
            store
                .complete_one(&k, &owner, &replay(2_000), RETENTION)
                .await
                .unwrap();
            assert!(store.bytes() <= 10_000);
        }
        assert_eq!(store.len(), 10_000 / one);
        assert_eq!(store.bytes(), store.len() * one);
        // The newest are kept.
        match told(&store, &key(9)).await {
            Reservation::Completed(record) => {
                assert_eq!(record.response().unwrap().body().len(), 2_000)
            }
            other => panic!("expected a completed record, got {other:?}"),
        }
        // A record larger than the bound is not cached, and evicts nothing.
        let (k, owner) = (key(100), claim());
        store.reserve_one(&k, &owner, LEASE).await.unwrap();
        store
            .complete_one(&k, &owner, &replay(20_000), RETENTION)
            .await
            .unwrap();
        assert_eq!(store.len(), 10_000 / one);
    }

    #[tokio::test]
    async fn zero_entries_turns_the_cache_off() {
        let inner = Counting::default();
        let store = CachedStore::new(inner.clone()).max_entries(0);
        complete(&store, &key(1), RETENTION).await;
        assert!(store.is_empty());
        store.reserve_one(&key(1), &claim(), LEASE).await.unwrap();
        assert_eq!(inner.hook.calls(), 3);
    }

    #[tokio::test]
    async fn batches_send_only_the_misses_and_merge_in_order() {
        let inner = Counting::default();
        let store = CachedStore::new(inner.clone());
        let [done_a, new_b, done_c, busy_d, new_e] = [0, 1, 2, 3, 4].map(key);
        complete(&store, &done_a, RETENTION).await;
        complete(&store, &done_c, RETENTION).await;
        let holder = claim();
        store.reserve_one(&busy_d, &holder, LEASE).await.unwrap();
        let calls = inner.hook.calls();

        let batch = [
            done_a.clone(),
            new_b.clone(),
            done_c.clone(),
            busy_d.clone(),
            new_e.clone(),
        ];
        let mine = claim();
        let answers = store.reserve(&keys_of(&batch), &mine, LEASE).await.unwrap();
        assert!(
            matches!(answers[0], Reservation::Completed(_)),
            "{answers:?}"
        );
        assert_eq!(answers[1], Reservation::Acquired);
        assert!(
            matches!(answers[2], Reservation::Completed(_)),
            "{answers:?}"
        );
        assert!(
            matches!(answers[3], Reservation::InFlight { .. }),
            "{answers:?}"
        );
        assert_eq!(answers[4], Reservation::Acquired);
        assert_eq!(inner.hook.calls(), calls + 1, "one call for the misses");
        assert_eq!(
            *inner.hook.last_batch.lock().unwrap(),
            [new_b.clone(), busy_d.clone(), new_e.clone()]
        );

        // Every key cached: no call at all.
        let done = store
            .complete(
                &keys_of(&[new_b.clone(), new_e.clone()]),
                &mine,
                &Record::ack(mine.fingerprint()),
                RETENTION,
            )
            .await
            .unwrap();
        assert_eq!(done, [Completion::Written, Completion::Written]);
        let calls = inner.hook.calls();
        let answers = store
            .reserve(&keys_of(&[new_e.clone(), done_a, new_b]), &claim(), LEASE)
            .await
            .unwrap();
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, Reservation::Completed(_)))
        );
        assert_eq!(inner.hook.calls(), calls);

        // Records read in a batch are cached.
        store.clear();
        let answers = store
            .reserve(&keys_of(&[new_e.clone(), busy_d.clone()]), &claim(), LEASE)
            .await
            .unwrap();
        assert!(matches!(answers[0], Reservation::Completed(_)));
        assert!(matches!(answers[1], Reservation::InFlight { .. }));
        assert_eq!(store.len(), 1);

        // Releasing or renewing keys drops their entries.
        assert!(
            store
                .renew(&keys_of(std::slice::from_ref(&busy_d)), &holder, LEASE)
                .await
                .unwrap()
        );
        assert_eq!(
            store
                .release(&keys_of(&[busy_d, new_e]), &holder)
                .await
                .unwrap(),
            1
        );
        assert!(store.is_empty());
    }

    #[tokio::test]
    async fn clear_and_into_inner() {
        let store = CachedStore::new(MemoryStore::new());
        complete(&store, &key(1), RETENTION).await;
        assert_eq!(store.len(), 1);
        let clone = store.clone();
        clone.clear();
        assert!(store.is_empty(), "clones share the cache");
        assert_eq!(store.bytes(), 0);
        assert_eq!(store.inner().len(), 1);
        let inner = store.into_inner();
        assert!(matches!(
            told(&inner, &key(1)).await,
            Reservation::Completed(_)
        ));
    }

    #[tokio::test]
    async fn replaced_and_dropped_entries_leave_a_bounded_map() {
        let store = CachedStore::new(MemoryStore::new()).max_entries(100);
        let k = key(1_000_000);
        let record = Record::ack(Fingerprint::NONE);
        let cache = store.cache();
        for _ in 0..10_000 {
            cache.remember(&k, &record, Instant::now(), RETENTION);
        }
        for i in 0..10_000 {
            cache.remember(&key(i), &record, Instant::now(), RETENTION);
            cache.forget(&key(i));
        }
        assert_eq!(store.len(), 1);
        assert_eq!(store.bytes(), LocalCache::ENTRY_BYTES);
    }

    #[tokio::test]
    async fn expired_entries_are_dropped_when_looked_up_or_reached() {
        let store = CachedStore::new(MemoryStore::new()).max_entries(4);
        let record = Record::ack(Fingerprint::NONE);
        let cache = store.cache();
        for i in 0..3 {
            cache.remember(&key(i), &record, Instant::now(), Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(cache.get(&key(0)), None);
        // Any later look at the shard drops the expired entries.
        cache.remember(&key(9), &record, Instant::now(), RETENTION);
        assert_eq!(store.len(), 1);
        assert_eq!(store.bytes(), LocalCache::ENTRY_BYTES);
    }

    /// Was a check of `LocalCache`'s doctest while `is_on` was public.
    #[test]
    fn off_is_off_and_new_is_on() {
        assert!(!LocalCache::off().is_on());
        assert!(LocalCache::new().is_on());
    }

    #[test]
    fn entry_bytes_covers_an_entry_with_the_tables_slack() {
        // A table slot and a queue item: at the fullest (no slack) and at the emptiest the
        // tables get (a table at 7/16 load just after growing, a queue at half capacity and
        // with as many stale items as live ones). The estimate is about the mean of the two.
        let slot = std::mem::size_of::<(Slot, Record, u64, u64, usize)>() + 1;
        let item = std::mem::size_of::<(Slot, u64)>();
        let (fullest, emptiest) = (slot + item, slot * 16 / 7 + item * 4);
        assert!(fullest <= LocalCache::ENTRY_BYTES, "{fullest}");
        assert!(emptiest <= 2 * LocalCache::ENTRY_BYTES, "{emptiest}");
        assert!(
            (fullest + emptiest) / 2 <= LocalCache::ENTRY_BYTES,
            "{fullest}..{emptiest}"
        );
    }

    /// Ordered events go through the cache like keys: a completed one is answered from it,
    /// the others reach the inner store.
    #[tokio::test]
    async fn ordered_events_are_answered_from_the_cache_once_completed() {
        use crate::store::{ObjectKey, Position};
        let inner = MemoryStore::new();
        let store = CachedStore::new(inner.clone());
        let event = |i: usize, at: i128| {
            let object = ObjectKey::new("cache", None, "message");
            Target::ordered(key(i), object, Position::new(at))
        };
        let owner = claim();
        let first = [event(1, 10)];
        let answers = store.reserve(&first, &owner, LEASE).await.unwrap();
        assert_eq!(answers, [Reservation::Acquired]);
        let record = Record::ack(owner.fingerprint());
        let done = store
            .complete(&first, &owner, &record, RETENTION)
            .await
            .unwrap();
        assert_eq!(done, [Completion::Written]);
        assert_eq!(store.len(), 1);
        // A duplicate: from the cache. An older event of the object: stale, from the store.
        let answers = store
            .reserve(&[event(1, 10), event(2, 5)], &claim(), LEASE)
            .await
            .unwrap();
        assert!(
            matches!(answers[0], Reservation::Completed(_)),
            "{answers:?}"
        );
        assert_eq!(
            answers[1],
            Reservation::Stale {
                watermark: Position::new(10)
            }
        );
    }
}
