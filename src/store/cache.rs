//! [`LocalCache`]: a bounded in-process cache of completed records in front of a shared store,
//! so that an instance answers repeated duplicates without a round trip. The Redis and SQL
//! stores hold one by default (`local_cache` on each); [`CachedStore`] puts one in front of any
//! other store.
//!
//! A completed record never changes until it expires (see the state machine in the crate
//! docs), so it can be copied. An in-flight claim can change at any moment (completed,
//! released, expired, taken over): it is never cached, and neither is the absence of a key.
//!
//! # What is cached, and until when
//!
//! - **Records this instance completed** ([`Completion::Written`]): until the record's
//!   retention ends in the store, or [`max_ttl`](CachedStore::max_ttl) (default
//!   [`DEFAULT_MAX_TTL`], 10 minutes), whichever comes first. The clock starts before the
//!   store is asked, so the entry does not outlive the record.
//! - **Records read from the store** (a [`reserve`](IdempotencyStore::reserve) that found the
//!   key completed) and retried completions ([`Completion::AlreadyWritten`]): their retention
//!   started elsewhere, so the cache asks the store how long each has left
//!   ([`IdempotencyStore::remaining`]: one round trip, on a spawned task, off the request's
//!   path) and keeps it that long, and at most [`read_ttl`](CachedStore::read_ttl) (default
//!   [`DEFAULT_READ_TTL`], 5 seconds). Until the answer is in, duplicates of the record still
//!   ask the store; a store that cannot tell (the trait's default) has its reads never
//!   cached, and neither are reads made outside a Tokio runtime (there is no task to ask on).
//!   Entries end a millisecond before the store's (which counts whole milliseconds), so no
//!   entry outlives its record's expiry in the store. What no cache can see is
//!   a record the store drops *before* its expiry (evicted, deleted by hand): that one may
//!   still be answered up to `read_ttl` later (see below); set `read_ttl` to zero to never
//!   cache a record you did not write.
//! - A cache hit answers [`Reservation::Completed`] with no call to the inner store. A miss
//!   asks the inner store, as without the cache. Batches ([`reserve_many`]) send only the keys
//!   the cache does not hold, in one call, and merge the answers in order.
//! - [`complete`](IdempotencyStore::complete), [`release`](IdempotencyStore::release) and
//!   [`renew`](IdempotencyStore::renew) always go to the inner store. A reserve answer that
//!   shows a key is not completed (acquired, in flight) drops whatever the cache held for it,
//!   and so does every release and renewal (a claim only releases or renews keys it acquired
//!   from the inner store, so a record cached for one is stale at best).
//!
//! Exactly-once is unchanged: every claim is still taken by the inner store, atomically, and
//! only a completed record, which the inner store answered or was told to write, is ever
//! served from the cache, so a duplicate is never answered 2xx before the first attempt has
//! succeeded.
//!
//! # Deleting keys by hand
//!
//! Deleting a completed key from the shared store (to have an event processed again) is not
//! seen by an instance that cached it until its entry expires: at most
//! [`max_ttl`](CachedStore::max_ttl) for a key it completed itself, at most
//! [`read_ttl`](CachedStore::read_ttl) for one it read. Wait that long before redelivering, or
//! call [`clear`](CachedStore::clear) on every instance (from an admin endpoint, say).
//!
//! # Memory
//!
//! The cache holds at most [`max_entries`](CachedStore::max_entries) records (default
//! [`DEFAULT_MAX_ENTRIES`]) and at most [`max_bytes`](CachedStore::max_bytes) accounted bytes
//! (default [`DEFAULT_MAX_BYTES`]): an entry counts [`ENTRY_BYTES`], plus the stored response
//! of a replay-mode record (body, headers and trailers). When full, the entries cached first
//! are evicted first. The key space is split into up to 16 independently locked shards, each
//! with its share of both bounds; a record larger than a shard's share of the bytes is not
//! cached. Expired entries are dropped lazily: when looked up, or when they reach the front of
//! their shard's queue. Every operation is O(1).
//!
//! ```
//! use std::time::Duration;
//! use tower_idempotency::fingerprint::Fingerprint;
//! use tower_idempotency::record::Record;
//! use tower_idempotency::store::{CachedStore, Claim, Completion, IdempotencyStore};
//! use tower_idempotency::store::{MemoryStore, Reservation, StoreKey};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // In production the inner store is shared (Redis and SQL stores have a cache of their own:
//! // `CachedStore` is for other stores).
//! let store = CachedStore::new(MemoryStore::new())
//!     .max_entries(50_000)
//!     .max_bytes(32 * 1024 * 1024)
//!     .max_ttl(Duration::from_secs(300))
//!     .read_ttl(Duration::from_secs(2));
//!
//! let key = StoreKey::new("docs", None, "evt_1");
//! let lease = Duration::from_secs(30);
//! let first = Claim::new(Fingerprint::of_bytes(b"{}"));
//! assert_eq!(store.reserve(&key, &first, lease).await.unwrap(), Reservation::Acquired);
//! // In flight: never cached.
//! let second = Claim::new(Fingerprint::of_bytes(b"{}"));
//! let answer = store.reserve(&key, &second, lease).await.unwrap();
//! assert!(matches!(answer, Reservation::InFlight { .. }));
//! assert_eq!(store.len(), 0);
//!
//! let record = Record::ack(first.fingerprint());
//! let retention = Duration::from_secs(72 * 3600);
//! let done = store.complete(&key, &first, &record, retention).await.unwrap();
//! assert_eq!(done, Completion::Written);
//! // Completed: duplicates are answered from the cache, without asking the inner store.
//! assert_eq!(store.len(), 1);
//! let answer = store.reserve(&key, &second, lease).await.unwrap();
//! assert!(matches!(answer, Reservation::Completed(_)));
//!
//! store.clear();
//! assert!(store.is_empty());
//! # }
//! ```
//!
//! [`reserve_many`]: IdempotencyStore::reserve_many

use std::collections::{HashMap, VecDeque, hash_map};
use std::fmt;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::record::Record;
use super::slot::{Slot, SlotHasher};
use super::{
    Claim, Completion, IdempotencyStore, Reservation, StoreError, StoreErrorKind, StoreKey,
};

/// The default bound on the number of cached records: 100 000, about 20 MB of ack-mode
/// records ([`ENTRY_BYTES`] each). At 160 first deliveries a second, that is every record of
/// the last 10 minutes ([`DEFAULT_MAX_TTL`]); above that rate the oldest go first, and the
/// duplicates that come in bursts, seconds after the first delivery, are still answered from
/// the cache.
pub const DEFAULT_MAX_ENTRIES: usize = 100_000;

/// The default bound on the bytes the cache accounts for: 64 MiB. It is what bounds a cache
/// of replay-mode records, which carry the response body: 100 000 responses of 1 KiB would
/// take about 150 MB.
pub const DEFAULT_MAX_BYTES: usize = 64 * 1024 * 1024;

/// The default longest life of a cached record: 10 minutes.
///
/// The duplicates worth saving a round trip for come soon after the first delivery: a sender
/// that timed out and retried, an at-least-once queue redelivering, the first retries of a
/// webhook provider's schedule (Standard Webhooks retries after 5 seconds, then 5 minutes). A
/// duplicate arriving later costs one round trip, as without the cache. And it bounds how long
/// an instance that completed a key answers it as a duplicate after the key was deleted from
/// the shared store by hand.
pub const DEFAULT_MAX_TTL: Duration = Duration::from_secs(600);

/// The default longest life of a record read from the store rather than written by this
/// instance: 5 seconds (and never past the record's expiry in the store, which the cache asks
/// the store for). This is how late a duplicate may be answered after the record was deleted
/// from the store by hand. Short enough to be harmless, long enough to absorb a burst of
/// duplicates with one round trip.
pub const DEFAULT_READ_TTL: Duration = Duration::from_secs(5);

/// How much earlier than the store a cached record expires: stores count time in whole
/// milliseconds (Redis, SQL), rounded down from a clock read after the cache's own, so the
/// cache ends its entries this much sooner and never after the store.
const CLOCK_MARGIN: Duration = Duration::from_millis(1);

/// What one cached record is accounted as, before any stored response: its slot in the
/// shard's table (key, record, expiry) and in its eviction queue, with the tables' slack.
pub const ENTRY_BYTES: usize = 192;

/// What a replay-mode record's stored response is accounted as, on top of its body and header
/// bytes: the boxed response and its header maps.
const RESPONSE_BYTES: usize = 256;

/// What each stored header (or trailer) is accounted as, on top of its name and value bytes.
const HEADER_BYTES: usize = 64;

/// At most this many independently locked shards.
const MAX_SHARDS: usize = 16;

/// A shard is only split off for at least this many entries and this many bytes, so that
/// small caches keep their bounds exact and can hold large records.
const MIN_SHARD_ENTRIES: usize = 64;
const MIN_SHARD_BYTES: usize = 1024 * 1024;

/// An [`IdempotencyStore`] that keeps recently completed records of `St` in a bounded local
/// cache and answers duplicates of them without calling `St`. See the
/// [module docs](crate::store::cache) for what is cached and until when.
///
/// Cheap to clone: clones share the cache. The builder methods
/// [`max_entries`](Self::max_entries) and [`max_bytes`](Self::max_bytes) start a new, empty
/// cache: call them when building the store, before cloning it.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::IdempotencyLayer;
/// use tower_idempotency::store::{CachedStore, MemoryStore};
///
/// // `MemoryStore` stands in for a shared store (`RedisStore`, `PostgresStore`).
/// let store = CachedStore::new(MemoryStore::new()).read_ttl(Duration::from_secs(2));
/// let layer = IdempotencyLayer::new(store.clone());
/// # let _ = layer;
/// assert_eq!(store.len(), 0);
/// ```
#[derive(Clone)]
pub struct CachedStore<St> {
    inner: St,
    cache: LocalCache,
}

impl<St> CachedStore<St> {
    /// Wraps `inner` with a cache of at most [`DEFAULT_MAX_ENTRIES`] records and
    /// [`DEFAULT_MAX_BYTES`] bytes, kept at most [`DEFAULT_MAX_TTL`] ([`DEFAULT_READ_TTL`] for
    /// records read from `inner`).
    pub fn new(inner: St) -> Self {
        Self::with_cache(inner, LocalCache::new())
    }

    /// Wraps `inner` with `cache` (which clones of other stores may share).
    pub fn with_cache(inner: St, cache: LocalCache) -> Self {
        CachedStore { inner, cache }
    }

    /// Sets the bound on the number of cached records (default [`DEFAULT_MAX_ENTRIES`]); zero
    /// turns the cache off. Starts a new, empty cache.
    pub fn max_entries(mut self, max_entries: usize) -> Self {
        self.cache = self.cache.max_entries(max_entries);
        self
    }

    /// Sets the bound on the accounted bytes (default [`DEFAULT_MAX_BYTES`]): [`ENTRY_BYTES`]
    /// per record, plus the stored response of replay-mode records. Starts a new, empty cache.
    pub fn max_bytes(mut self, max_bytes: usize) -> Self {
        self.cache = self.cache.max_bytes(max_bytes);
        self
    }

    /// Sets the longest time a record is cached (default [`DEFAULT_MAX_TTL`]); see
    /// [`LocalCache::max_ttl`].
    pub fn max_ttl(mut self, max_ttl: Duration) -> Self {
        self.cache = self.cache.max_ttl(max_ttl);
        self
    }

    /// Sets how long a record read from the inner store is cached at most (default
    /// [`DEFAULT_READ_TTL`]); see [`LocalCache::read_ttl`].
    pub fn read_ttl(mut self, read_ttl: Duration) -> Self {
        self.cache = self.cache.read_ttl(read_ttl);
        self
    }

    /// The wrapped store.
    pub fn inner(&self) -> &St {
        &self.inner
    }

    /// The cache.
    pub fn cache(&self) -> &LocalCache {
        &self.cache
    }

    /// Unwraps the store, dropping this handle on the cache.
    pub fn into_inner(self) -> St {
        self.inner
    }

    /// The number of records held, including expired ones not yet dropped (they are dropped
    /// lazily, see the [module docs](crate::store::cache)).
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// Whether the cache holds no record.
    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }

    /// The bytes accounted for the records held ([`ENTRY_BYTES`] each, plus stored responses).
    pub fn bytes(&self) -> usize {
        self.cache.bytes()
    }

    /// Forgets every cached record (of every clone of this store); see [`LocalCache::clear`].
    pub fn clear(&self) {
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

/// The local cache of completed records itself: what [`CachedStore`] puts in front of any
/// store, and what the Redis and SQL stores hold by default (`RedisStore::local_cache`,
/// `SqlStore::local_cache`). See the [module docs](self) for what is cached and until when.
///
/// Cheap to clone: clones share the records. The builder methods
/// [`max_entries`](Self::max_entries) and [`max_bytes`](Self::max_bytes) start a new, empty
/// cache.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::store::cache::LocalCache;
///
/// let cache = LocalCache::new()
///     .max_entries(50_000)
///     .max_ttl(Duration::from_secs(300))
///     .read_ttl(Duration::from_secs(2));
/// assert!(cache.is_empty());
/// assert!(!LocalCache::off().is_on());
/// ```
#[derive(Clone)]
pub struct LocalCache {
    cache: Arc<Cache>,
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
            .field("max_entries", &self.cache.max_entries)
            .field("max_bytes", &self.cache.max_bytes)
            .field("max_ttl", &self.max_ttl)
            .field("read_ttl", &self.read_ttl)
            .field("shards", &self.cache.shards.len())
            .finish()
    }
}

impl LocalCache {
    /// A cache of at most [`DEFAULT_MAX_ENTRIES`] records and [`DEFAULT_MAX_BYTES`] bytes,
    /// kept at most [`DEFAULT_MAX_TTL`] ([`DEFAULT_READ_TTL`] for records read from the store).
    pub fn new() -> Self {
        LocalCache {
            cache: Arc::new(Cache::new(DEFAULT_MAX_ENTRIES, DEFAULT_MAX_BYTES)),
            max_ttl: DEFAULT_MAX_TTL,
            read_ttl: DEFAULT_READ_TTL,
        }
    }

    /// No cache: every call goes to the store.
    pub fn off() -> Self {
        Self::new().max_entries(0)
    }

    /// Whether the cache can hold records (it is not [`off`](Self::off)).
    pub fn is_on(&self) -> bool {
        self.cache.max_entries > 0 && !self.cache.shards.is_empty()
    }

    /// Sets the bound on the number of cached records (default [`DEFAULT_MAX_ENTRIES`]); zero
    /// turns the cache off. Starts a new, empty cache.
    pub fn max_entries(mut self, max_entries: usize) -> Self {
        self.cache = Arc::new(Cache::new(max_entries, self.cache.max_bytes));
        self
    }

    /// Sets the bound on the accounted bytes (default [`DEFAULT_MAX_BYTES`]): [`ENTRY_BYTES`]
    /// per record, plus the stored response of replay-mode records. Starts a new, empty cache.
    pub fn max_bytes(mut self, max_bytes: usize) -> Self {
        self.cache = Arc::new(Cache::new(self.cache.max_entries, max_bytes));
        self
    }

    /// Sets the longest time a record is cached (default [`DEFAULT_MAX_TTL`]). A record this
    /// instance completed is cached for its retention or `max_ttl`, whichever is shorter; this
    /// is also how long a key deleted from the store by hand may still be answered as a
    /// duplicate by this instance.
    pub fn max_ttl(mut self, max_ttl: Duration) -> Self {
        self.max_ttl = max_ttl;
        self
    }

    /// Sets how long a record read from the store (not written by this instance) is cached at
    /// most (default [`DEFAULT_READ_TTL`], never more than [`max_ttl`](Self::max_ttl), never
    /// past the record's expiry in the store): how late a duplicate may be answered after the
    /// record was deleted from the store by hand. Zero caches only the records this instance
    /// wrote.
    pub fn read_ttl(mut self, read_ttl: Duration) -> Self {
        self.read_ttl = read_ttl;
        self
    }

    /// The number of records held, including expired ones not yet dropped (they are dropped
    /// lazily, see the [module docs](crate::store::cache)).
    pub fn len(&self) -> usize {
        self.cache.shards.iter().map(|s| lock(s).map.len()).sum()
    }

    /// Whether the cache holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes accounted for the records held ([`ENTRY_BYTES`] each, plus stored responses).
    pub fn bytes(&self) -> usize {
        self.cache.shards.iter().map(|s| lock(s).bytes).sum()
    }

    /// Forgets every cached record (of every clone of this cache): the next duplicate of each
    /// key asks the store. What an operator who deleted keys from the shared store by hand
    /// calls on every instance.
    pub fn clear(&self) {
        for shard in self.cache.shards.iter() {
            let mut state = lock(shard);
            state.map.clear();
            state.queue.clear();
            state.bytes = 0;
        }
    }

    /// The longest life of a record read from the store.
    fn read_life(&self) -> Duration {
        self.read_ttl.min(self.max_ttl)
    }

    /// Whether records read from the store are cached at all: checked before anything is
    /// copied for [`learn`](Self::learn).
    fn learns(&self) -> bool {
        self.read_life() > CLOCK_MARGIN && self.is_on()
    }

    /// The life of a record this instance wrote with `retention`, from before the write.
    fn written_life(&self, retention: Duration) -> Duration {
        retention.min(self.max_ttl).saturating_sub(CLOCK_MARGIN)
    }

    /// Caches `record` for `key` until `life` after `from`.
    fn remember(&self, key: &StoreKey, record: &Record, from: Instant, life: Duration) {
        if life.is_zero() {
            return;
        }
        // Past what `Instant` can hold: a century is as good as forever.
        let expires = from
            .checked_add(life)
            .unwrap_or_else(|| from + Duration::from_secs(100 * 365 * 24 * 3600));
        // `from` is a clock read already made: it serves to find expired entries to drop.
        self.cache.insert_at(key, record, expires, from);
    }

    /// Caches the records of `found`, read from `source`, for as long as `source` still keeps
    /// each (and at most the [read life](Self::read_ttl)): asks it how long each has left
    /// ([`IdempotencyStore::remaining`]) on a spawned task, one key after the other, off the
    /// request's path. Until that answer is in, duplicates of these keys still ask the store;
    /// a key the store no longer holds as that record, or a store that cannot tell, is not
    /// cached. Outside a Tokio runtime nothing is cached.
    fn learn<St: IdempotencyStore>(&self, source: &St, found: Vec<(StoreKey, Record)>) {
        let cap = self.read_life();
        if found.is_empty() || !self.learns() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (cache, source) = (self.clone(), source.clone());
        runtime.spawn(async move {
            for (key, record) in found {
                // Learnt meanwhile (a burst of duplicates, each a miss): nothing to ask.
                if cache.cache.get(&key).is_some() {
                    continue;
                }
                // Before the store is asked: the entry ends no later than the record.
                let asked = Instant::now();
                // An answer later than the longest it could be cached for is of no use.
                match tokio::time::timeout(cap, source.remaining(&key, &record)).await {
                    Ok(Ok(Some(left))) => {
                        let life = left.min(cap).saturating_sub(CLOCK_MARGIN);
                        cache.remember(&key, &record, asked, life);
                    }
                    Ok(Ok(None)) => {}
                    Ok(Err(err)) => {
                        tracing::debug!(error = %err, "could not read how long a record has left; not cached");
                    }
                    Err(_) => tracing::debug!("no answer in time on how long a record has left; not cached"),
                }
            }
        });
    }

    /// A reserve through the cache: a live cached record answers [`Reservation::Completed`]
    /// and `store` (the store's own reserve, on `source`) is never polled; otherwise a
    /// completed record it answers is [learnt](Self::learn) from `source`.
    pub(crate) async fn reserve<St: IdempotencyStore>(
        &self,
        key: &StoreKey,
        source: &St,
        store: impl Future<Output = Result<Reservation, StoreError>>,
    ) -> Result<Reservation, StoreError> {
        if let Some(record) = self.cache.get(key) {
            return Ok(Reservation::Completed(record));
        }
        let answer = store.await?;
        match &answer {
            Reservation::Completed(record) if self.learns() => {
                self.learn(source, vec![(key.clone(), record.clone())]);
            }
            Reservation::Completed(_) => {}
            _ => self.cache.forget(key),
        }
        Ok(answer)
    }

    /// A completion through the cache: `store` (on `source`) always runs. A record it wrote
    /// is cached for its retention (at most `max_ttl`), counted from before the call; one an
    /// earlier attempt of the claim wrote, whose retention started earlier, is
    /// [learnt](Self::learn).
    pub(crate) async fn complete<St: IdempotencyStore>(
        &self,
        key: &StoreKey,
        claim: &Claim,
        record: &Record,
        retention: Duration,
        source: &St,
        store: impl Future<Output = Result<Completion, StoreError>>,
    ) -> Result<Completion, StoreError> {
        let asked = Instant::now();
        let done = store.await?;
        let owned = || record.clone().owned_by(claim.token());
        match done {
            Completion::Written => {
                self.remember(key, &owned(), asked, self.written_life(retention))
            }
            Completion::AlreadyWritten => self.learn(source, vec![(key.clone(), owned())]),
            Completion::Lost => {}
        }
        Ok(done)
    }

    /// A release or renewal through the cache: `store` always runs, then whatever was cached
    /// for `keys` is dropped (a claim only releases or renews keys it acquired from the store,
    /// so a record cached for one is stale at best).
    pub(crate) async fn forgetting<T>(
        &self,
        keys: &[StoreKey],
        store: impl Future<Output = T>,
    ) -> T {
        let answer = store.await;
        for key in keys {
            self.cache.forget(key);
        }
        answer
    }

    /// A batch reserve through the cache: the cached keys are answered from the cache, the
    /// others sent to `store` in one call (none when every key is cached); the answers come
    /// back in the order of `keys`.
    pub(crate) async fn reserve_many<St, F, Fut>(
        &self,
        keys: &[StoreKey],
        source: &St,
        store: F,
    ) -> Result<Vec<Reservation>, StoreError>
    where
        St: IdempotencyStore,
        F: FnOnce(Vec<StoreKey>) -> Fut,
        Fut: Future<Output = Result<Vec<Reservation>, StoreError>>,
    {
        let mut answers: Vec<Option<Reservation>> = keys
            .iter()
            .map(|key| self.cache.get(key).map(Reservation::Completed))
            .collect();
        let misses: Vec<StoreKey> = keys
            .iter()
            .zip(&answers)
            .filter(|(_, answer)| answer.is_none())
            .map(|(key, _)| key.clone())
            .collect();
        if misses.is_empty() {
            return Ok(answers.into_iter().flatten().collect());
        }
        let count = misses.len();
        let fetched = store(misses).await?;
        if fetched.len() != count {
            return Err(StoreError::with_source(
                StoreErrorKind::Corrupt,
                format!(
                    "reserve_many answered {} reservations for {count} keys",
                    fetched.len()
                ),
            ));
        }
        let mut fetched = fetched.into_iter();
        let (learns, mut found) = (self.learns(), Vec::new());
        for (key, answer) in keys.iter().zip(&mut answers) {
            if answer.is_some() {
                continue;
            }
            let Some(reservation) = fetched.next() else {
                break;
            };
            match &reservation {
                Reservation::Completed(record) if learns => {
                    found.push((key.clone(), record.clone()));
                }
                Reservation::Completed(_) => {}
                _ => self.cache.forget(key),
            }
            *answer = Some(reservation);
        }
        self.learn(source, found);
        Ok(answers.into_iter().flatten().collect())
    }

    /// A batch completion through the cache: `store` always runs (one call); each record it
    /// wrote is learnt.
    pub(crate) async fn complete_many<St: IdempotencyStore>(
        &self,
        keys: &[StoreKey],
        claim: &Claim,
        record: &Record,
        retention: Duration,
        source: &St,
        store: impl Future<Output = Result<Vec<Completion>, StoreError>>,
    ) -> Result<Vec<Completion>, StoreError> {
        let asked = Instant::now();
        let done = store.await?;
        let owned = record.clone().owned_by(claim.token());
        let mut found = Vec::new();
        for (key, completion) in keys.iter().zip(&done) {
            match completion {
                Completion::Written => {
                    self.remember(key, &owned, asked, self.written_life(retention))
                }
                Completion::AlreadyWritten => found.push((key.clone(), owned.clone())),
                Completion::Lost => {}
            }
        }
        self.learn(source, found);
        Ok(done)
    }
}

/// The records, split into independently locked shards.
struct Cache {
    shards: Box<[Shard]>,
    /// The bounds asked for: each shard has an equal share.
    max_entries: usize,
    max_bytes: usize,
    /// Each shard's share of the bounds.
    shard_entries: usize,
    shard_bytes: usize,
    hasher: SlotHasher,
}

/// One lock's worth of the key space, on its own cache line.
#[derive(Default)]
#[repr(align(64))]
struct Shard(Mutex<ShardState>);

#[derive(Default)]
struct ShardState {
    map: HashMap<Slot, Entry, SlotHasher>,
    /// Slots in the order they were cached, each with the generation of its entry: the front is
    /// evicted first. An item whose entry was replaced or removed since (another generation,
    /// or none) is stale and skipped.
    queue: VecDeque<(Slot, u64)>,
    /// Bytes accounted for the entries of `map`.
    bytes: usize,
    /// The generation of the next entry cached.
    next: u64,
}

struct Entry {
    record: Record,
    expires: Instant,
    generation: u64,
    cost: usize,
}

impl Cache {
    fn new(max_entries: usize, max_bytes: usize) -> Self {
        let shards = (max_entries / MIN_SHARD_ENTRIES)
            .min(max_bytes / MIN_SHARD_BYTES)
            .clamp(1, MAX_SHARDS);
        Cache {
            shards: (0..shards).map(|_| Shard::default()).collect(),
            max_entries,
            max_bytes,
            // Rounded down: the sum of the shares never exceeds the bounds.
            shard_entries: max_entries / shards,
            shard_bytes: max_bytes / shards,
            hasher: SlotHasher::default(),
        }
    }

    fn shard(&self, slot: &Slot) -> &Shard {
        // The middle bits of a hash seeded apart from the shards' tables.
        let index = (self.hasher.hash_one(slot) >> 32) as usize % self.shards.len();
        &self.shards[index]
    }

    /// The live record cached for `key`; an expired one is dropped.
    fn get(&self, key: &StoreKey) -> Option<Record> {
        let slot = Slot::of(key);
        let mut state = lock(self.shard(&slot));
        let entry = state.map.get(&slot)?;
        if entry.expires > Instant::now() {
            return Some(entry.record.clone());
        }
        state.remove(&slot);
        None
    }

    /// Caches `record` for `key` until `expires`, in place of any entry for `key`, evicting
    /// the oldest entries of the shard to make room.
    #[cfg(test)]
    fn insert(&self, key: &StoreKey, record: &Record, expires: Instant) {
        self.insert_at(key, record, expires, Instant::now());
    }

    /// [`insert`](Self::insert), with the time taken as `now` to tell expired entries (a clock
    /// read the caller already made; one a little early only keeps an expired entry a little
    /// longer in the queue: reads check expiry themselves).
    fn insert_at(&self, key: &StoreKey, record: &Record, expires: Instant, now: Instant) {
        let slot = Slot::of(key);
        let cost = cost(record);
        let mut state = lock(self.shard(&slot));
        if self.shard_entries == 0 || cost > self.shard_bytes {
            state.remove(&slot);
            return;
        }
        // Make room, dropping on the way the stale items and expired entries at the front (one
        // probe of the table per item: the entries are cold in a full cache).
        while let Some(&(front, generation)) = state.queue.front() {
            let full =
                state.map.len() >= self.shard_entries || state.bytes + cost > self.shard_bytes;
            let ShardState { map, bytes, .. } = &mut *state;
            match map.entry(front) {
                hash_map::Entry::Occupied(entry) if entry.get().generation == generation => {
                    if !full && entry.get().expires > now {
                        break;
                    }
                    *bytes -= entry.remove().cost;
                }
                // Stale: its entry was replaced or removed since.
                _ => {}
            }
            state.queue.pop_front();
        }
        let generation = state.next;
        state.next += 1;
        // One probe: an entry this replaces leaves a stale queue item behind. (Counted as an
        // entry while making room above: at worst one more entry was evicted.)
        let replaced = state.map.insert(
            slot,
            Entry {
                record: record.clone(),
                expires,
                generation,
                cost,
            },
        );
        if let Some(replaced) = replaced {
            state.bytes -= replaced.cost;
        }
        state.queue.push_back((slot, generation));
        state.bytes += cost;
        // Drop stale items once they outnumber the entries (many entries replaced or dropped
        // long before their turn to be evicted), so that memory follows the entry count.
        if state.queue.len() > 2 * state.map.len() + 64 {
            let ShardState { map, queue, .. } = &mut *state;
            queue.retain(|(slot, generation)| {
                map.get(slot).is_some_and(|e| e.generation == *generation)
            });
        }
    }

    /// Drops the entry for `key`, if any.
    fn forget(&self, key: &StoreKey) {
        let slot = Slot::of(key);
        lock(self.shard(&slot)).remove(&slot);
    }
}

impl ShardState {
    /// Removes the entry of `slot` (its queue item becomes stale).
    fn remove(&mut self, slot: &Slot) {
        if let Some(entry) = self.map.remove(slot) {
            self.bytes -= entry.cost;
        }
    }
}

/// What `record` is accounted as.
fn cost(record: &Record) -> usize {
    let headers = |h: &http::HeaderMap| -> usize {
        h.iter()
            .map(|(name, value)| HEADER_BYTES + name.as_str().len() + value.len())
            .sum()
    };
    ENTRY_BYTES
        + record.response().map_or(0, |r| {
            RESPONSE_BYTES + r.body().len() + headers(r.headers()) + r.trailers().map_or(0, headers)
        })
}

fn lock(shard: &Shard) -> MutexGuard<'_, ShardState> {
    // Every critical section leaves whole entries behind, so a poisoned lock is safe to use.
    shard.0.lock().unwrap_or_else(|e| e.into_inner())
}

impl<St: IdempotencyStore> IdempotencyStore for CachedStore<St> {
    /// As the inner store: a cache miss is a call to it.
    fn in_process(&self) -> bool {
        self.inner.in_process()
    }

    /// Asks the inner store.
    async fn remaining(
        &self,
        key: &StoreKey,
        record: &Record,
    ) -> Result<Option<Duration>, StoreError> {
        self.inner.remaining(key, record).await
    }

    /// A live cached record answers [`Reservation::Completed`] without calling the inner
    /// store; otherwise the inner store answers, and a completed record it returns is cached
    /// for as long as the inner store keeps it, at most [`read_ttl`](CachedStore::read_ttl)
    /// (once a background [`remaining`](IdempotencyStore::remaining) call told how long).
    async fn reserve(
        &self,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        let store = self.inner.reserve(key, claim, lease);
        self.cache.reserve(key, &self.inner, store).await
    }

    /// Always completes in the inner store. A record written ([`Completion::Written`]) is
    /// cached for its retention or [`max_ttl`](CachedStore::max_ttl), whichever is shorter,
    /// counted from before the call; one found already written by an earlier attempt
    /// ([`Completion::AlreadyWritten`]), whose retention started earlier, like a record read
    /// (see [`reserve`](Self::reserve)).
    async fn complete(
        &self,
        key: &StoreKey,
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> Result<Completion, StoreError> {
        let store = self.inner.complete(key, claim, record, retention);
        self.cache
            .complete(key, claim, record, retention, &self.inner, store)
            .await
    }

    /// Always releases in the inner store, then drops any cached record of `key`.
    async fn release(&self, key: &StoreKey, claim: &Claim) -> Result<bool, StoreError> {
        let store = self.inner.release(key, claim);
        self.cache
            .forgetting(std::slice::from_ref(key), store)
            .await
    }

    /// Always renews in the inner store, then drops any cached record of `key`.
    async fn renew(
        &self,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let store = self.inner.renew(key, claim, lease);
        self.cache
            .forgetting(std::slice::from_ref(key), store)
            .await
    }

    /// Answers the cached keys from the cache and sends only the others to the inner store's
    /// `reserve_many`, in one call (none when every key is cached); the answers come back in
    /// the order of `keys`.
    async fn reserve_many(
        &self,
        keys: &[StoreKey],
        claim: &Claim,
        lease: Duration,
    ) -> Result<Vec<Reservation>, StoreError> {
        let store = |misses: Vec<StoreKey>| async move {
            self.inner.reserve_many(&misses, claim, lease).await
        };
        self.cache.reserve_many(keys, &self.inner, store).await
    }

    /// Always completes in the inner store (one call), then caches each key's record as
    /// [`complete`](IdempotencyStore::complete) does.
    async fn complete_many(
        &self,
        keys: &[StoreKey],
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> Result<Vec<Completion>, StoreError> {
        let store = self.inner.complete_many(keys, claim, record, retention);
        self.cache
            .complete_many(keys, claim, record, retention, &self.inner, store)
            .await
    }

    /// Always releases in the inner store (one call), then drops any cached record of the
    /// keys.
    async fn release_many(&self, keys: &[StoreKey], claim: &Claim) -> Result<usize, StoreError> {
        let store = self.inner.release_many(keys, claim);
        self.cache.forgetting(keys, store).await
    }

    /// Always renews in the inner store (one call), then drops any cached record of the keys.
    async fn renew_many(
        &self,
        keys: &[StoreKey],
        claim: &Claim,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let store = self.inner.renew_many(keys, claim, lease);
        self.cache.forgetting(keys, store).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use bytes::Bytes;
    use http::{HeaderMap, StatusCode};

    use super::*;
    use crate::fingerprint::Fingerprint;
    use crate::store::MemoryStore;
    use crate::store::record::StoredResponse;

    const LEASE: Duration = Duration::from_secs(30);
    const RETENTION: Duration = Duration::from_secs(3600);

    /// A memory store that counts the calls made to it, and the keys of the last batch call.
    #[derive(Clone, Default)]
    struct Counting {
        store: MemoryStore,
        calls: Arc<AtomicUsize>,
        last_batch: Arc<Mutex<Vec<StoreKey>>>,
    }

    impl Counting {
        fn calls(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }

        fn count(&self) {
            self.calls.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Lets the background tasks that learn how long read records have left run (the
    /// stores of these tests answer at once).
    async fn learnt() {
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    }

    impl IdempotencyStore for Counting {
        /// Not counted: the cache asks it in the background, apart from the requests.
        async fn remaining(
            &self,
            key: &StoreKey,
            record: &Record,
        ) -> Result<Option<Duration>, StoreError> {
            self.store.remaining(key, record).await
        }

        async fn reserve(
            &self,
            key: &StoreKey,
            claim: &Claim,
            lease: Duration,
        ) -> Result<Reservation, StoreError> {
            self.count();
            self.store.reserve(key, claim, lease).await
        }

        async fn complete(
            &self,
            key: &StoreKey,
            claim: &Claim,
            record: &Record,
            retention: Duration,
        ) -> Result<Completion, StoreError> {
            self.count();
            self.store.complete(key, claim, record, retention).await
        }

        async fn release(&self, key: &StoreKey, claim: &Claim) -> Result<bool, StoreError> {
            self.count();
            self.store.release(key, claim).await
        }

        async fn renew(
            &self,
            key: &StoreKey,
            claim: &Claim,
            lease: Duration,
        ) -> Result<bool, StoreError> {
            self.count();
            self.store.renew(key, claim, lease).await
        }

        async fn reserve_many(
            &self,
            keys: &[StoreKey],
            claim: &Claim,
            lease: Duration,
        ) -> Result<Vec<Reservation>, StoreError> {
            self.count();
            *self.last_batch.lock().unwrap() = keys.to_vec();
            self.store.reserve_many(keys, claim, lease).await
        }
    }

    fn claim() -> Claim {
        Claim::new(Fingerprint::of_bytes(b"body"))
    }

    fn key(i: usize) -> StoreKey {
        StoreKey::new("cache", None, &i.to_string())
    }

    /// Claims and completes `key` through `store`, with an ack record.
    async fn complete<St: IdempotencyStore>(store: &St, key: &StoreKey, retention: Duration) {
        let owner = claim();
        assert_eq!(
            store.reserve(key, &owner, LEASE).await.unwrap(),
            Reservation::Acquired
        );
        let record = Record::ack(owner.fingerprint());
        assert_eq!(
            store
                .complete(key, &owner, &record, retention)
                .await
                .unwrap(),
            Completion::Written
        );
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
        store.reserve(&k, &owner, LEASE).await.unwrap();
        let record = Record::ack(owner.fingerprint());
        store
            .complete(&k, &owner, &record, RETENTION)
            .await
            .unwrap();
        assert_eq!(inner.calls(), 2);
        for _ in 0..3 {
            match store.reserve(&k, &claim(), LEASE).await.unwrap() {
                // The record as the inner store holds it: owned by the claim that wrote it.
                Reservation::Completed(held) => {
                    assert!(held.is_owned_by(owner.token()));
                    assert_eq!(held, record.clone().owned_by(owner.token()));
                }
                other => panic!("expected a completed record, got {other:?}"),
            }
        }
        assert_eq!(inner.calls(), 2, "cache hits never reach the inner store");
        // Completing and releasing still go to the inner store.
        assert_eq!(
            store
                .complete(&k, &owner, &record, RETENTION)
                .await
                .unwrap(),
            Completion::AlreadyWritten
        );
        assert_eq!(inner.calls(), 3);
    }

    #[tokio::test]
    async fn an_in_flight_claim_is_never_cached_nor_served() {
        let inner = Counting::default();
        let store = CachedStore::new(inner.clone());
        let (k, owner) = (key(1), claim());
        assert_eq!(
            store.reserve(&k, &owner, LEASE).await.unwrap(),
            Reservation::Acquired
        );
        for _ in 0..3 {
            assert!(matches!(
                store.reserve(&k, &claim(), LEASE).await.unwrap(),
                Reservation::InFlight { .. }
            ));
        }
        assert!(store.is_empty());
        assert_eq!(
            inner.calls(),
            4,
            "every reserve of an in-flight key asks the store"
        );
        // A completion that lost its claim caches nothing either.
        let stranger = claim();
        let record = Record::ack(stranger.fingerprint());
        assert_eq!(
            store
                .complete(&k, &stranger, &record, RETENTION)
                .await
                .unwrap(),
            Completion::Lost
        );
        assert!(store.is_empty());
        assert!(store.renew(&k, &owner, LEASE).await.unwrap());
        assert!(matches!(
            store.reserve(&k, &claim(), LEASE).await.unwrap(),
            Reservation::InFlight { .. }
        ));
    }

    #[tokio::test]
    async fn a_released_key_is_not_served() {
        let inner = Counting::default();
        let store = CachedStore::new(inner.clone());
        let (k, owner) = (key(1), claim());
        store.reserve(&k, &owner, LEASE).await.unwrap();
        assert!(store.release(&k, &owner).await.unwrap());
        assert!(store.is_empty());
        assert_claimed_anew(&store, &k).await;
    }

    /// A new claim on `k` acquires it (nothing is served from the cache), and lets it go.
    async fn assert_claimed_anew<St: IdempotencyStore>(store: &CachedStore<St>, k: &StoreKey) {
        let next = claim();
        assert_eq!(
            store.reserve(k, &next, LEASE).await.unwrap(),
            Reservation::Acquired
        );
        assert!(store.release(k, &next).await.unwrap());
    }

    #[tokio::test]
    async fn a_record_read_is_never_served_past_its_expiry_in_the_store() {
        let inner = MemoryStore::new();
        let store = CachedStore::new(inner.clone()).read_ttl(Duration::from_secs(60));
        let k = key(1);
        complete(&inner, &k, Duration::from_millis(300)).await;
        assert!(matches!(
            store.reserve(&k, &claim(), LEASE).await.unwrap(),
            Reservation::Completed(_)
        ));
        learnt().await;
        assert_eq!(store.len(), 1, "learnt in the background");
        tokio::time::sleep(Duration::from_millis(400)).await;
        // The record expired in the store: so did the entry, long before `read_ttl`.
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
            inner.reserve(&key(2), &filler, LEASE).await.unwrap(),
            Reservation::Acquired,
            "the record of `k` was evicted"
        );
        assert!(inner.release(&key(2), &filler).await.unwrap());
        // Another instance claims the key again; this one renews it for that claim (as a
        // guard on this instance would): the entry is dropped, and the answer shows the key
        // in flight.
        let other = claim();
        assert_eq!(
            inner.reserve(&k, &other, LEASE).await.unwrap(),
            Reservation::Acquired
        );
        assert!(matches!(
            store.reserve(&k, &claim(), LEASE).await.unwrap(),
            Reservation::Completed(_)
        ));
        assert!(store.renew(&k, &other, LEASE).await.unwrap());
        assert!(store.is_empty());
        assert!(matches!(
            store.reserve(&k, &claim(), LEASE).await.unwrap(),
            Reservation::InFlight { .. }
        ));
    }

    #[tokio::test]
    async fn records_read_from_the_store_live_read_ttl() {
        let inner = Counting::default();
        let store = CachedStore::new(inner.clone()).read_ttl(Duration::from_millis(300));
        let k = key(1);
        complete(&inner.store, &k, RETENTION).await;
        assert!(matches!(
            store.reserve(&k, &claim(), LEASE).await.unwrap(),
            Reservation::Completed(_)
        ));
        learnt().await;
        assert!(matches!(
            store.reserve(&k, &claim(), LEASE).await.unwrap(),
            Reservation::Completed(_)
        ));
        assert_eq!(inner.calls(), 1, "the second duplicate is a cache hit");
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(matches!(
            store.reserve(&k, &claim(), LEASE).await.unwrap(),
            Reservation::Completed(_)
        ));
        assert_eq!(inner.calls(), 2, "expired: asked the store again");

        // A zero read TTL caches only what this instance wrote.
        let store = CachedStore::new(inner.clone()).read_ttl(Duration::ZERO);
        store.reserve(&k, &claim(), LEASE).await.unwrap();
        assert!(store.is_empty());
        complete(&store, &key(2), RETENTION).await;
        assert_eq!(store.len(), 1);
    }

    #[tokio::test]
    async fn entries_expire_with_the_retention_or_max_ttl() {
        let inner = Counting::default();
        let store = CachedStore::new(inner.clone()).max_ttl(Duration::from_millis(600));
        // Retention shorter than max_ttl: the entry never outlives the record.
        let short = key(1);
        complete(&store, &short, Duration::from_millis(300)).await;
        // Retention longer than max_ttl: kept max_ttl.
        let long = key(2);
        complete(&store, &long, RETENTION).await;
        assert_eq!(store.len(), 2);
        let calls = inner.calls();
        for k in [&short, &long] {
            assert!(matches!(
                store.reserve(k, &claim(), LEASE).await.unwrap(),
                Reservation::Completed(_)
            ));
        }
        assert_eq!(inner.calls(), calls);

        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(
            store.reserve(&short, &claim(), LEASE).await.unwrap(),
            Reservation::Acquired,
            "expired with its retention: the key is free again"
        );
        assert!(matches!(
            store.reserve(&long, &claim(), LEASE).await.unwrap(),
            Reservation::Completed(_)
        ));
        assert_eq!(inner.calls(), calls + 1);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(matches!(
            store.reserve(&long, &claim(), LEASE).await.unwrap(),
            Reservation::Completed(_)
        ));
        assert_eq!(inner.calls(), calls + 2, "past max_ttl: asked the store");
    }

    #[tokio::test]
    async fn bounded_by_entries_oldest_first() {
        let inner = Counting::default();
        let store = CachedStore::new(inner.clone()).max_entries(4);
        assert_eq!(store.cache.cache.shards.len(), 1);
        for i in 0..10 {
            complete(&store, &key(i), RETENTION).await;
            assert!(store.len() <= 4);
        }
        assert_eq!(store.len(), 4);
        assert_eq!(store.bytes(), 4 * ENTRY_BYTES);
        let calls = inner.calls();
        for i in 6..10 {
            store.reserve(&key(i), &claim(), LEASE).await.unwrap();
        }
        assert_eq!(inner.calls(), calls, "the newest four are cached");
        for i in 0..6 {
            assert!(matches!(
                store.reserve(&key(i), &claim(), LEASE).await.unwrap(),
                Reservation::Completed(_)
            ));
        }
        assert_eq!(inner.calls(), calls + 6, "the oldest six were evicted");

        // Sharded: the bound holds across shards.
        let store = CachedStore::new(MemoryStore::new()).max_entries(1_000);
        assert!(store.cache.cache.shards.len() > 1);
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
        assert!(one > 2_000 + ENTRY_BYTES);
        for i in 0..10 {
            let (k, owner) = (key(i), claim());
            store.reserve(&k, &owner, LEASE).await.unwrap();
            store
                .complete(&k, &owner, &replay(2_000), RETENTION)
                .await
                .unwrap();
            assert!(store.bytes() <= 10_000);
        }
        assert_eq!(store.len(), 10_000 / one);
        assert_eq!(store.bytes(), store.len() * one);
        // The newest are kept.
        match store.reserve(&key(9), &claim(), LEASE).await.unwrap() {
            Reservation::Completed(record) => {
                assert_eq!(record.response().unwrap().body().len(), 2_000)
            }
            other => panic!("expected a completed record, got {other:?}"),
        }
        // A record larger than the bound is not cached, and evicts nothing.
        let (k, owner) = (key(100), claim());
        store.reserve(&k, &owner, LEASE).await.unwrap();
        store
            .complete(&k, &owner, &replay(20_000), RETENTION)
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
        store.reserve(&key(1), &claim(), LEASE).await.unwrap();
        assert_eq!(inner.calls(), 3);
    }

    #[tokio::test]
    async fn batches_send_only_the_misses_and_merge_in_order() {
        let inner = Counting::default();
        let store = CachedStore::new(inner.clone());
        let [done_a, new_b, done_c, busy_d, new_e] = [0, 1, 2, 3, 4].map(key);
        complete(&store, &done_a, RETENTION).await;
        complete(&store, &done_c, RETENTION).await;
        let holder = claim();
        store.reserve(&busy_d, &holder, LEASE).await.unwrap();
        let calls = inner.calls();

        let batch = [
            done_a.clone(),
            new_b.clone(),
            done_c.clone(),
            busy_d.clone(),
            new_e.clone(),
        ];
        let mine = claim();
        let answers = store.reserve_many(&batch, &mine, LEASE).await.unwrap();
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
        assert_eq!(inner.calls(), calls + 1, "one call for the misses");
        assert_eq!(
            *inner.last_batch.lock().unwrap(),
            [new_b.clone(), busy_d.clone(), new_e.clone()]
        );

        // Every key cached: no call at all.
        let done = store
            .complete_many(
                &[new_b.clone(), new_e.clone()],
                &mine,
                &Record::ack(mine.fingerprint()),
                RETENTION,
            )
            .await
            .unwrap();
        assert_eq!(done, [Completion::Written, Completion::Written]);
        let calls = inner.calls();
        let answers = store
            .reserve_many(&[new_e.clone(), done_a, new_b], &claim(), LEASE)
            .await
            .unwrap();
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, Reservation::Completed(_)))
        );
        assert_eq!(inner.calls(), calls);

        // Records read in a batch are cached (once the store told how long they have left).
        store.clear();
        let answers = store
            .reserve_many(&[new_e.clone(), busy_d.clone()], &claim(), LEASE)
            .await
            .unwrap();
        assert!(matches!(answers[0], Reservation::Completed(_)));
        assert!(matches!(answers[1], Reservation::InFlight { .. }));
        learnt().await;
        assert_eq!(store.len(), 1);

        // Releasing or renewing keys drops their entries.
        assert!(
            store
                .renew_many(std::slice::from_ref(&busy_d), &holder, LEASE)
                .await
                .unwrap()
        );
        assert_eq!(
            store.release_many(&[busy_d, new_e], &holder).await.unwrap(),
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
            inner.reserve(&key(1), &claim(), LEASE).await.unwrap(),
            Reservation::Completed(_)
        ));
    }

    #[tokio::test]
    async fn replaced_and_dropped_entries_leave_a_bounded_queue() {
        let store = CachedStore::new(MemoryStore::new()).max_entries(100);
        let k = key(1_000_000);
        let record = Record::ack(Fingerprint::NONE);
        let far = Instant::now() + RETENTION;
        for _ in 0..10_000 {
            store.cache.cache.insert(&k, &record, far);
        }
        for i in 0..10_000 {
            store.cache.cache.insert(&key(i), &record, far);
            store.cache.cache.forget(&key(i));
        }
        assert_eq!(store.len(), 1);
        let queued: usize = store
            .cache
            .cache
            .shards
            .iter()
            .map(|s| lock(s).queue.len())
            .sum();
        assert!(queued <= 2 + 64 + 1, "{queued} queue items");
        assert_eq!(store.bytes(), ENTRY_BYTES);
    }

    #[tokio::test]
    async fn expired_entries_are_dropped_when_looked_up_or_reached() {
        let store = CachedStore::new(MemoryStore::new()).max_entries(4);
        let record = Record::ack(Fingerprint::NONE);
        let soon = Instant::now() + Duration::from_millis(50);
        for i in 0..3 {
            store.cache.cache.insert(&key(i), &record, soon);
        }
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(store.cache.cache.get(&key(0)), None);
        assert_eq!(store.len(), 2);
        // The next insert drops the expired entries at the front of the queue.
        store
            .cache
            .cache
            .insert(&key(9), &record, Instant::now() + RETENTION);
        assert_eq!(store.len(), 1);
        assert_eq!(store.bytes(), ENTRY_BYTES);
    }

    #[test]
    fn entry_bytes_covers_an_entry_with_the_tables_slack() {
        // A table slot and a queue item: at the fullest (no slack) and at the emptiest the
        // tables get (a table at 7/16 load just after growing, a queue at half capacity and
        // with as many stale items as live ones). The estimate is about the mean of the two.
        let slot = std::mem::size_of::<(Slot, Entry)>() + 1;
        let item = std::mem::size_of::<(Slot, u64)>();
        let (fullest, emptiest) = (slot + item, slot * 16 / 7 + item * 4);
        assert!(fullest <= ENTRY_BYTES, "{fullest}");
        assert!(emptiest <= 2 * ENTRY_BYTES, "{emptiest}");
        assert!(
            (fullest + emptiest) / 2 <= ENTRY_BYTES,
            "{fullest}..{emptiest}"
        );
    }

    #[test]
    fn shards_keep_both_bounds() {
        let cache = Cache::new(DEFAULT_MAX_ENTRIES, DEFAULT_MAX_BYTES);
        assert_eq!(cache.shards.len(), MAX_SHARDS);
        assert!(cache.shard_entries * MAX_SHARDS <= DEFAULT_MAX_ENTRIES);
        assert_eq!(cache.shard_bytes, 4 * 1024 * 1024);
        let small = Cache::new(100, 1 << 30);
        assert_eq!(small.shards.len(), 1);
        assert_eq!(small.shard_entries, 100);
        let little_bytes = Cache::new(DEFAULT_MAX_ENTRIES, 3 * 1024 * 1024);
        assert_eq!(little_bytes.shards.len(), 3);
        assert!(little_bytes.shard_bytes * 3 <= 3 * 1024 * 1024);
        let mut counts = [0usize; MAX_SHARDS];
        for i in 0..16_000 {
            let slot = Slot::of(&key(i));
            counts[(cache.hasher.hash_one(slot) >> 32) as usize % MAX_SHARDS] += 1;
        }
        assert!(
            counts.iter().all(|&n| (800..1200).contains(&n)),
            "{counts:?}"
        );
    }
}
