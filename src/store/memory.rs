//! The embedded store: [`MemoryStore`], one process, no server; bounded, with expiry and
//! eviction of the oldest records when full ([`WhenFull`]).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque, hash_map};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::slot::{Slot, SlotHasher};
use super::{
    Claim, Completion, IdempotencyStore, Reservation, StoreError, StoreErrorKind, StoreKey, Token,
};
use crate::fingerprint::Fingerprint;
use crate::store::record::Record;

/// The default bound on the number of keys a [`MemoryStore`] keeps: a million, 100–170 MB of
/// ack-mode records (measured under load: 100–170 bytes per retained key, expiry queues
/// included, depending on how full the tables are since they last doubled). With the default
/// 72 h retention that keeps every record of about 4 first deliveries per second, sustained;
/// above that, the oldest records are evicted (see [`WhenFull`]).
pub const DEFAULT_MAX_ENTRIES: usize = 1_000_000;

/// The default bound on the bytes a [`MemoryStore`] accounts for: 256 MiB (an entry counts
/// [`ENTRY_BYTES`], plus the response of a replay-mode record).
pub const DEFAULT_MAX_BYTES: usize = 256 * 1024 * 1024;

/// What one entry is accounted as, before any stored response: the entry, its expiry item and
/// the table's slack, as measured (100–170 bytes).
pub const ENTRY_BYTES: usize = 128;

/// What a full [`MemoryStore`] does with a new key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WhenFull {
    /// Evict the completed records nearest to their expiry (the oldest), never an in-flight
    /// claim, and take the new key (the default). A warning is logged (at most once a minute),
    /// evictions are counted, and [`MemoryStore::effective_retention`] says how old the oldest
    /// record kept is: when it falls below the sender's retry window, a late redelivery of an
    /// evicted event would be processed again, so give the store more room or use Redis.
    #[default]
    EvictOldest,
    /// Refuse the new key with a [`StoreErrorKind::Capacity`] error (503 and `Retry-After` when
    /// failing closed): no record is ever forgotten early, but new events wait until records
    /// expire.
    Refuse,
}

/// How many evictions one claim may make before it gives up (the others raced it for room).
const MAX_EVICTIONS_PER_CLAIM: usize = 8;

/// How many expiry items of one queue an eviction looks at for a completed record.
const EVICTION_SCAN: usize = 64;

/// How many independently locked parts the key space is split into: concurrent requests on a
/// multi-threaded runtime rarely wait for each other, and growing one part's table moves only a
/// sixteenth of the keys at a time.
const SHARDS: usize = 16;

/// How many distinct TTLs a shard keeps a first-in, first-out expiry queue for. A layer uses two
/// (its lease and its retention); TTLs beyond these go to a heap.
const MAX_QUEUES: usize = 8;

/// The embedded store: one process, no server. The default of the demo and of tests.
///
/// - Claims are atomic (one critical section per call).
/// - Leases and records expire; expired entries are evicted as time passes (every call evicts
///   the expired entries of the part of the key space it touches), so memory follows the live
///   key count.
/// - Memory is bounded: at most [`max_entries`](MemoryStore::with_max_entries) live keys
///   (default [`DEFAULT_MAX_ENTRIES`]; ack-mode records cost 100–170 bytes each) and at most
///   [`max_bytes`](MemoryStore::with_max_bytes) accounted bytes (default
///   [`DEFAULT_MAX_BYTES`]; replay-mode records count their response on top). When full, the
///   completed records nearest to expiry are evicted to make room, never an in-flight claim
///   ([`WhenFull::EvictOldest`], the default), or the new key is refused
///   ([`WhenFull::Refuse`]). Watch [`effective_retention`](MemoryStore::effective_retention)
///   (and the `idempotency_memory_effective_retention_seconds` gauge with the `metrics`
///   feature): it must stay above the sender's retry window.
/// - It is fast: the key space is split into 16 independently locked shards; expiries wait in
///   first-in, first-out queues, one per TTL, so a claim or a record costs O(1) whatever the
///   number of keys held.
///
/// It forgets everything on restart and is not shared between processes: use the Redis or SQL
/// stores when either matters.
///
/// ```
/// use tower_idempotency::store::MemoryStore;
///
/// use tower_idempotency::store::memory::WhenFull;
///
/// let store = MemoryStore::new()
///     .with_max_entries(10_000)
///     .with_max_bytes(16 * 1024 * 1024)
///     .when_full(WhenFull::EvictOldest);
/// assert_eq!(store.len(), 0);
/// assert_eq!(store.effective_retention(), None);
/// ```
#[derive(Clone, Debug)]
pub struct MemoryStore {
    shared: Arc<Shared>,
    max_entries: usize,
    max_bytes: usize,
    when_full: WhenFull,
}

#[derive(Debug)]
struct Shared {
    shards: Box<[Shard]>,
    /// Entries held across all shards (live, or expired and not yet evicted).
    len: AtomicUsize,
    /// Bytes accounted for those entries.
    bytes: AtomicUsize,
    /// Records evicted early to make room.
    evictions: AtomicU64,
    /// When the last "store full" warning was logged (seconds since `epoch`, plus one).
    warned_at: AtomicU64,
    /// Expiry instants are kept as nanoseconds since this instant.
    epoch: Instant,
    hasher: SlotHasher,
}

/// One lock's worth of the key space, on its own cache line.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Shard(Mutex<Inner>);

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<Slot, Entry, SlotHasher>,
    expiries: Expiries,
}

/// When each entry expires, as `(nanoseconds, slot)` items.
#[derive(Debug, Default)]
struct Expiries {
    /// Items in insertion order, one queue per TTL: `now + ttl` grows with `now`, so each
    /// queue is sorted and its head is the next to expire.
    queues: Vec<Queue>,
    /// Items of TTLs beyond the first [`MAX_QUEUES`].
    heap: BinaryHeap<Reverse<(u64, Slot)>>,
}

#[derive(Debug)]
struct Queue {
    ttl: Duration,
    items: VecDeque<(u64, Slot)>,
}

#[derive(Debug)]
struct Entry {
    /// Nanoseconds since the store's epoch.
    expires: u64,
    state: State,
}

#[derive(Debug)]
enum State {
    InFlight {
        token: Token,
        fingerprint: Fingerprint,
    },
    Completed(Record),
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store bounded to [`DEFAULT_MAX_ENTRIES`] keys.
    pub fn new() -> Self {
        MemoryStore {
            shared: Arc::new(Shared {
                shards: (0..SHARDS).map(|_| Shard::default()).collect(),
                len: AtomicUsize::new(0),
                bytes: AtomicUsize::new(0),
                evictions: AtomicU64::new(0),
                warned_at: AtomicU64::new(0),
                epoch: Instant::now(),
                hasher: SlotHasher::default(),
            }),
            max_entries: DEFAULT_MAX_ENTRIES,
            max_bytes: DEFAULT_MAX_BYTES,
            when_full: WhenFull::EvictOldest,
        }
    }

    /// Sets the bound on live keys (in flight and completed).
    pub fn with_max_entries(mut self, max_entries: usize) -> Self {
        self.max_entries = max_entries.max(1);
        self
    }

    /// Sets the bound on accounted bytes ([`ENTRY_BYTES`] per key, plus stored responses).
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes.max(ENTRY_BYTES);
        self
    }

    /// Sets what a full store does with a new key (default [`WhenFull::EvictOldest`]).
    pub fn when_full(mut self, when_full: WhenFull) -> Self {
        self.when_full = when_full;
        self
    }

    /// The bytes accounted for the live keys.
    pub fn bytes(&self) -> usize {
        self.shared.bytes.load(Ordering::Relaxed)
    }

    /// How many completed records were evicted before their expiry to make room.
    pub fn evictions(&self) -> u64 {
        self.shared.evictions.load(Ordering::Relaxed)
    }

    /// How old the oldest completed record kept is: how far back a duplicate is still
    /// recognised. `None` when no record is held. Once the store is full and evicting, this is
    /// the retention actually given, shorter than the configured one.
    pub fn effective_retention(&self) -> Option<Duration> {
        let shared = &*self.shared;
        let mut oldest: Option<u64> = None;
        for shard in shared.shards.iter() {
            let mut inner = lock(shard);
            let now = shared.now();
            let evicted = inner.evict_expired(now);
            shared.len.fetch_sub(evicted.0, Ordering::Relaxed);
            shared.bytes.fetch_sub(evicted.1, Ordering::Relaxed);
            if let Some(found) = inner.oldest_completed() {
                oldest = Some(oldest.map_or(found.completed_at, |o| o.min(found.completed_at)));
            }
        }
        oldest.map(|at| Duration::from_nanos(shared.now().saturating_sub(at)))
    }

    /// The index of the shard of `slot`.
    fn shard_index(&self, slot: &Slot) -> usize {
        // Bits the map's own hash of the slot does not use (the bucket index comes from the low
        // bits, the control tag from the top seven).
        (self.shared.hasher.hash_one(slot) >> 32) as usize % SHARDS
    }

    /// The number of live (unexpired) keys.
    pub fn len(&self) -> usize {
        self.evict_all();
        self.shared.len.load(Ordering::Relaxed)
    }

    /// Whether the store holds no live key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Locks the shard of `slot`, evicts what has expired there, and returns it with the time.
    fn shard(&self, slot: &Slot) -> (MutexGuard<'_, Inner>, u64) {
        let shared = &*self.shared;
        let mut inner = lock(&shared.shards[self.shard_index(slot)]);
        // Read under the lock, so that each shard's clock, and each of its queues, is sorted.
        let now = shared.now();
        let (evicted, bytes) = inner.evict_expired(now);
        shared.len.fetch_sub(evicted, Ordering::Relaxed);
        shared.bytes.fetch_sub(bytes, Ordering::Relaxed);
        (inner, now)
    }

    fn evict_all(&self) {
        let shared = &*self.shared;
        for shard in shared.shards.iter() {
            let mut inner = lock(shard);
            let (evicted, bytes) = inner.evict_expired(shared.now());
            shared.len.fetch_sub(evicted, Ordering::Relaxed);
            shared.bytes.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    /// Counts a new entry in, within the bounds.
    fn admit(&self) -> Result<(), StoreError> {
        let shared = &*self.shared;
        if shared.len.fetch_add(1, Ordering::Relaxed) >= self.max_entries {
            shared.len.fetch_sub(1, Ordering::Relaxed);
            return Err(StoreError::new(StoreErrorKind::Capacity));
        }
        if shared.bytes.fetch_add(ENTRY_BYTES, Ordering::Relaxed) + ENTRY_BYTES > self.max_bytes {
            shared.bytes.fetch_sub(ENTRY_BYTES, Ordering::Relaxed);
            shared.len.fetch_sub(1, Ordering::Relaxed);
            return Err(StoreError::new(StoreErrorKind::Capacity));
        }
        Ok(())
    }

    /// Evicts the completed record nearest to its expiry across the whole store (each shard
    /// offers its own, the earliest goes). Never an in-flight claim. `false` when no record
    /// could be evicted. Only a full store pays for this.
    fn evict_oldest(&self) -> bool {
        let shared = &*self.shared;
        for _ in 0..4 {
            let mut best: Option<(usize, Oldest)> = None;
            for (index, shard) in shared.shards.iter().enumerate() {
                if let Some(found) = lock(shard).oldest_completed() {
                    if best.as_ref().is_none_or(|(_, b)| found.expires < b.expires) {
                        best = Some((index, found));
                    }
                }
            }
            let Some((index, oldest)) = best else {
                return false;
            };
            let mut inner = lock(&shared.shards[index]);
            // Still there and unchanged? Another claim may have evicted it meanwhile.
            let current = inner
                .entries
                .get(&oldest.slot)
                .is_some_and(|e| e.expires == oldest.expires);
            if !current {
                continue;
            }
            let Some(entry) = inner.entries.remove(&oldest.slot) else {
                continue;
            };
            inner.expiries.retire(oldest.expires, &oldest.slot);
            drop(inner);
            shared.len.fetch_sub(1, Ordering::Relaxed);
            shared
                .bytes
                .fetch_sub(state_bytes(&entry.state), Ordering::Relaxed);
            shared.evictions.fetch_add(1, Ordering::Relaxed);
            let age = Duration::from_nanos(shared.now().saturating_sub(oldest.completed_at));
            self.report_eviction(age);
            return true;
        }
        false
    }

    fn report_eviction(&self, age: Duration) {
        let shared = &*self.shared;
        #[cfg(feature = "metrics")]
        {
            metrics::counter!("idempotency_memory_evictions_total").increment(1);
            metrics::gauge!("idempotency_memory_effective_retention_seconds")
                .set(age.as_secs_f64());
        }
        let second = shared.epoch.elapsed().as_secs() + 1;
        let last = shared.warned_at.load(Ordering::Relaxed);
        if (last == 0 || second >= last + 60)
            && shared
                .warned_at
                .compare_exchange(last, second, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                effective_retention_s = age.as_secs(),
                evictions = shared.evictions.load(Ordering::Relaxed),
                "idempotency memory store full: evicting the oldest completed records; \
                 duplicates older than the effective retention are no longer recognised"
            );
        }
    }
}

/// What an entry is accounted as.
fn state_bytes(state: &State) -> usize {
    match state {
        State::InFlight { .. } => ENTRY_BYTES,
        State::Completed(record) => ENTRY_BYTES + record_bytes(record),
    }
}

/// The bytes of a record's stored response (0 for an ack record).
fn record_bytes(record: &Record) -> usize {
    let headers = |h: &http::HeaderMap| -> usize {
        h.iter()
            .map(|(name, value)| name.as_str().len() + value.len())
            .sum()
    };
    record.response().map_or(0, |r| {
        r.body().len() + headers(r.headers()) + r.trailers().map_or(0, headers)
    })
}

/// A completed record found for eviction.
struct Oldest {
    slot: Slot,
    expires: u64,
    /// When it was completed (its expiry less its TTL), in the store's nanoseconds.
    completed_at: u64,
}

fn lock(shard: &Shard) -> MutexGuard<'_, Inner> {
    // A panic while holding the lock cannot leave an entry half-written (every critical section
    // writes whole entries), so a poisoned lock is safe to keep using.
    shard.0.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn now(&self) -> u64 {
        nanos(self.epoch.elapsed())
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

impl Inner {
    /// Removes the entries that expired at or before `now`; returns how many.
    ///
    /// Afterwards every entry of the shard is live: an entry's current expiry item is due when
    /// the entry expires.
    fn evict_expired(&mut self, now: u64) -> (usize, usize) {
        let entries = &mut self.entries;
        let (mut evicted, mut bytes) = (0, 0);
        // An expiry item is current when its entry still expires at that instant; entries that
        // were re-set or removed since leave stale items, skipped here.
        self.expiries.pop_due(now, |at, slot| {
            if entries.get(slot).is_some_and(|e| e.expires == at) {
                if let Some(entry) = entries.remove(slot) {
                    evicted += 1;
                    bytes += state_bytes(&entry.state);
                }
            }
        });
        // Drop stale items once they outnumber the entries (many keys released or completed
        // long before their lease ran out), so that memory follows the live key count.
        if self.expiries.len() > 2 * entries.len() + 1024 {
            self.expiries
                .retain(|at, slot| entries.get(slot).is_some_and(|e| e.expires == at));
        }
        (evicted, bytes)
    }

    /// The completed record of this shard nearest to its expiry, among the first
    /// [`EVICTION_SCAN`] items of each expiry queue (a queue is sorted by expiry; in-flight
    /// claims, found in the lease's queue, are skipped).
    fn oldest_completed(&self) -> Option<Oldest> {
        let mut best: Option<Oldest> = None;
        for queue in &self.expiries.queues {
            let found = queue.items.iter().take(EVICTION_SCAN).find(|(at, slot)| {
                *slot != Slot::RETIRED
                    && self
                        .entries
                        .get(slot)
                        .is_some_and(|e| e.expires == *at && matches!(e.state, State::Completed(_)))
            });
            if let Some(&(expires, slot)) = found {
                if best.as_ref().is_none_or(|b| expires < b.expires) {
                    let completed_at = expires.saturating_sub(nanos(queue.ttl));
                    best = Some(Oldest {
                        slot,
                        expires,
                        completed_at,
                    });
                }
            }
        }
        best
    }
}

impl Expiries {
    fn len(&self) -> usize {
        self.queues.iter().map(|q| q.items.len()).sum::<usize>() + self.heap.len()
    }

    /// Schedules the expiry of `slot` at `expires` (`ttl` from now).
    fn schedule(&mut self, ttl: Duration, expires: u64, slot: Slot) {
        let queues = self.queues.len();
        match self.queues.iter_mut().find(|q| q.ttl == ttl) {
            Some(queue) => queue.items.push_back((expires, slot)),
            None if queues < MAX_QUEUES => self.queues.push(Queue {
                ttl,
                items: VecDeque::from([(expires, slot)]),
            }),
            None => self.heap.push(Reverse((expires, slot))),
        }
    }

    /// Hands every item due at `now` to `expire`, except retired ones.
    fn pop_due(&mut self, now: u64, mut expire: impl FnMut(u64, &Slot)) {
        for queue in &mut self.queues {
            while let Some(&(at, slot)) = queue.items.front().filter(|(at, _)| *at <= now) {
                queue.items.pop_front();
                if slot != Slot::RETIRED {
                    expire(at, &slot);
                }
            }
        }
        while let Some(&Reverse((at, slot))) =
            self.heap.peek().filter(|Reverse((at, _))| *at <= now)
        {
            self.heap.pop();
            if slot != Slot::RETIRED {
                expire(at, &slot);
            }
        }
    }

    /// Keeps the items `keep` accepts (never retired ones), in order; drops emptied queues.
    fn retain(&mut self, mut keep: impl FnMut(u64, &Slot) -> bool) {
        let mut keep = |at: u64, slot: &Slot| *slot != Slot::RETIRED && keep(at, slot);
        for queue in &mut self.queues {
            queue.items.retain(|(at, slot)| keep(*at, slot));
        }
        self.heap.retain(|Reverse((at, slot))| keep(*at, slot));
        self.queues.retain(|q| !q.items.is_empty());
    }

    /// Retires the item `(expires, slot)` of an entry about to be re-set or removed, so that
    /// its eviction, much later, does not have to look the key up in the map (a cache miss on
    /// a large store). The item was pushed moments ago: it is searched for near the tail of
    /// its queue, which is still in cache. One that is not found is checked against the map
    /// when it is due, as any other.
    fn retire(&mut self, expires: u64, slot: &Slot) {
        for queue in &mut self.queues {
            let items = &mut queue.items;
            let (Some(first), Some(last)) = (items.front(), items.back()) else {
                continue;
            };
            if expires < first.0 || expires > last.0 {
                continue;
            }
            // Gallop back from the tail to bracket the first item at `expires`...
            let (mut lo, mut hi, mut step) = (0, items.len(), 1);
            while step <= items.len() {
                let probe = items.len() - step;
                if items[probe].0 < expires {
                    lo = probe + 1;
                    break;
                }
                hi = probe;
                step *= 2;
            }
            // ... then binary-search the bracket.
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if items[mid].0 < expires {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            // Items rarely share an instant, unless TTLs so long that they all saturate: bound
            // the scan (an item not retired is checked against the map when due, as any other).
            let found = items
                .range_mut(lo..)
                .take_while(|(at, _)| *at == expires)
                .take(16)
                .find(|(_, s)| s == slot);
            if let Some(item) = found {
                item.1 = Slot::RETIRED;
                return;
            }
        }
    }
}

impl IdempotencyStore for MemoryStore {
    /// `true`: every call is a map operation under a shard lock.
    fn in_process(&self) -> bool {
        true
    }

    async fn remaining(
        &self,
        key: &StoreKey,
        record: &Record,
    ) -> Result<Option<Duration>, StoreError> {
        let slot = Slot::of(key);
        let (guard, now) = self.shard(&slot);
        // Expired entries were just evicted: an entry found is live.
        Ok(guard
            .entries
            .get(&slot)
            .and_then(|entry| match &entry.state {
                State::Completed(held) if held == record => {
                    Some(Duration::from_nanos(entry.expires.saturating_sub(now)))
                }
                _ => None,
            }))
    }

    async fn reserve(
        &self,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        let slot = Slot::of(key);
        let mut evicted_all = false;
        let mut evictions = 0;
        loop {
            let (mut guard, now) = self.shard(&slot);
            let Inner { entries, expiries } = &mut *guard;
            // One probe: the expired entries of the shard were evicted, so any entry is live.
            let vacant = match entries.entry(slot) {
                hash_map::Entry::Occupied(entry) => {
                    return Ok(match &entry.get().state {
                        // Our own claim (a retried reserve): ours still, as the Redis store
                        // answers.
                        State::InFlight { token, .. } if token == claim.token() => {
                            Reservation::Acquired
                        }
                        State::InFlight { fingerprint, .. } => Reservation::InFlight {
                            fingerprint: *fingerprint,
                        },
                        State::Completed(record) => Reservation::Completed(record.clone()),
                    });
                }
                hash_map::Entry::Vacant(vacant) => vacant,
            };
            match self.admit() {
                Ok(()) => {
                    let expires = now.saturating_add(nanos(lease));
                    expiries.schedule(lease, expires, slot);
                    vacant.insert(Entry {
                        expires,
                        state: State::InFlight {
                            token: *claim.token(),
                            fingerprint: claim.fingerprint(),
                        },
                    });
                    return Ok(Reservation::Acquired);
                }
                Err(_) if !evicted_all => {
                    // Other shards may hold expired entries that nothing has touched since:
                    // evict them, then look again, before evicting live records.
                    drop(guard);
                    self.evict_all();
                    evicted_all = true;
                }
                Err(full)
                    if self.when_full == WhenFull::Refuse
                        || evictions == MAX_EVICTIONS_PER_CLAIM =>
                {
                    return Err(full);
                }
                Err(full) => {
                    drop(guard);
                    if !self.evict_oldest() {
                        // Every key is an in-flight claim: nothing may be evicted.
                        return Err(full);
                    }
                    evictions += 1;
                }
            }
        }
    }

    async fn complete(
        &self,
        key: &StoreKey,
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> Result<Completion, StoreError> {
        let slot = Slot::of(key);
        let (mut guard, now) = self.shard(&slot);
        let Inner { entries, expiries } = &mut *guard;
        let Some(entry) = entries.get_mut(&slot) else {
            return Ok(Completion::Lost);
        };
        match &entry.state {
            State::InFlight { token, .. } if token == claim.token() => {}
            State::Completed(held) if held.is_owned_by(claim.token()) => {
                return Ok(Completion::AlreadyWritten);
            }
            _ => return Ok(Completion::Lost),
        }
        expiries.retire(entry.expires, &slot);
        entry.expires = now.saturating_add(nanos(retention));
        entry.state = State::Completed(record.clone().owned_by(claim.token()));
        expiries.schedule(retention, entry.expires, slot);
        // A success is always recorded, even past the byte bound: the next claims make room.
        self.shared
            .bytes
            .fetch_add(record_bytes(record), Ordering::Relaxed);
        Ok(Completion::Written)
    }

    async fn release(&self, key: &StoreKey, claim: &Claim) -> Result<bool, StoreError> {
        let slot = Slot::of(key);
        let (mut guard, _) = self.shard(&slot);
        let Inner { entries, expiries } = &mut *guard;
        let hash_map::Entry::Occupied(entry) = entries.entry(slot) else {
            return Ok(false);
        };
        if !owns(entry.get(), claim) {
            return Ok(false);
        }
        expiries.retire(entry.get().expires, &slot);
        let removed = entry.remove();
        self.shared.len.fetch_sub(1, Ordering::Relaxed);
        self.shared
            .bytes
            .fetch_sub(state_bytes(&removed.state), Ordering::Relaxed);
        Ok(true)
    }

    async fn renew(
        &self,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let slot = Slot::of(key);
        let (mut guard, now) = self.shard(&slot);
        let Inner { entries, expiries } = &mut *guard;
        let Some(entry) = entries.get_mut(&slot).filter(|e| owns(e, claim)) else {
            return Ok(false);
        };
        expiries.retire(entry.expires, &slot);
        entry.expires = now.saturating_add(nanos(lease));
        expiries.schedule(lease, entry.expires, slot);
        Ok(true)
    }
}

/// Whether `claim` holds the (live) `entry`.
fn owns(entry: &Entry, claim: &Claim) -> bool {
    matches!(&entry.state, State::InFlight { token, .. } if token == claim.token())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim() -> Claim {
        Claim::new(Fingerprint::of_bytes(b"body"))
    }

    fn key(i: usize) -> StoreKey {
        StoreKey::new("t", None, &i.to_string())
    }

    fn items(store: &MemoryStore) -> usize {
        store
            .shared
            .shards
            .iter()
            .map(|shard| {
                let inner = lock(shard);
                inner.expiries.len()
            })
            .sum()
    }

    #[tokio::test]
    async fn expired_entries_are_evicted() {
        let store = MemoryStore::new();
        let lease = Duration::from_millis(20);
        for i in 0..100 {
            store.reserve(&key(i), &claim(), lease).await.unwrap();
        }
        assert_eq!(store.len(), 100);
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert_eq!(store.len(), 0);
        assert_eq!(items(&store), 0);
    }

    #[tokio::test]
    async fn many_ttls_expire_in_order_through_queues_and_heap() {
        let store = MemoryStore::new();
        // More distinct TTLs than a shard has queues: the rest go through the heap.
        for i in 0..(4 * MAX_QUEUES) {
            let ttl = Duration::from_millis(10 + (i % (2 * MAX_QUEUES)) as u64);
            store.reserve(&key(i), &claim(), ttl).await.unwrap();
        }
        let long = key(1_000);
        store
            .reserve(&long, &claim(), Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(store.len(), 4 * MAX_QUEUES + 1);
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(store.len(), 1);
        assert!(matches!(
            store
                .reserve(&long, &claim(), Duration::from_secs(60))
                .await,
            Ok(Reservation::InFlight { .. })
        ));
    }

    #[tokio::test]
    async fn stale_expiry_items_are_dropped() {
        let store = MemoryStore::new();
        let lease = Duration::from_secs(60);
        // Claims released at once leave an expiry item each, due in a minute.
        for i in 0..20_000 {
            let claim = claim();
            store.reserve(&key(i), &claim, lease).await.unwrap();
            assert!(store.release(&key(i), &claim).await.unwrap());
        }
        assert_eq!(store.len(), 0);
        assert!(items(&store) <= SHARDS * 1025, "{} items", items(&store));
    }

    #[tokio::test]
    async fn a_completed_key_outlives_its_lease_and_expires_with_its_retention() {
        let store = MemoryStore::new();
        let (k, first) = (key(1), claim());
        store
            .reserve(&k, &first, Duration::from_millis(20))
            .await
            .unwrap();
        let record = Record::ack(first.fingerprint());
        assert_eq!(
            store
                .complete(&k, &first, &record, Duration::from_millis(80))
                .await
                .unwrap(),
            Completion::Written
        );
        tokio::time::sleep(Duration::from_millis(40)).await;
        // The lease's expiry item is due, but the entry was re-set: it stays.
        assert_eq!(store.len(), 1);
        assert!(matches!(
            store.reserve(&k, &claim(), Duration::from_secs(1)).await,
            Ok(Reservation::Completed(_))
        ));
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(store.len(), 0);
    }

    #[tokio::test]
    async fn bound_refuses_new_keys_but_keeps_records() {
        let store = MemoryStore::new()
            .with_max_entries(2)
            .when_full(WhenFull::Refuse);
        let lease = Duration::from_secs(30);
        let a = StoreKey::new("t", None, "a");
        let first = claim();
        store.reserve(&a, &first, lease).await.unwrap();
        store
            .complete(&a, &first, &Record::ack(first.fingerprint()), lease)
            .await
            .unwrap();
        store
            .reserve(&StoreKey::new("t", None, "b"), &claim(), lease)
            .await
            .unwrap();
        let err = store
            .reserve(&StoreKey::new("t", None, "c"), &claim(), lease)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Capacity);
        assert!(matches!(
            store.reserve(&a, &claim(), lease).await.unwrap(),
            Reservation::Completed(_)
        ));
    }

    #[tokio::test]
    async fn a_full_store_evicts_the_oldest_records_never_a_claim() {
        let store = MemoryStore::new().with_max_entries(4);
        let (lease, retention) = (Duration::from_secs(30), Duration::from_secs(3600));
        // Two in-flight claims and two records, the older first.
        let held: Vec<Claim> = (0..2).map(|_| claim()).collect();
        for (i, c) in held.iter().enumerate() {
            store.reserve(&key(100 + i), c, lease).await.unwrap();
        }
        for i in 0..2 {
            let c = claim();
            store.reserve(&key(i), &c, lease).await.unwrap();
            store
                .complete(&key(i), &c, &Record::ack(c.fingerprint()), retention)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(store.effective_retention().unwrap() >= Duration::from_millis(5));
        // Full: a new key evicts the oldest record (key 0), then the next one (key 1).
        assert_eq!(
            store.reserve(&key(2), &claim(), lease).await.unwrap(),
            Reservation::Acquired
        );
        assert_eq!(store.evictions(), 1);
        assert_eq!(
            store.reserve(&key(0), &claim(), lease).await.unwrap(),
            Reservation::Acquired,
            "the evicted record is forgotten"
        );
        assert_eq!(store.evictions(), 2);
        assert_eq!(store.len(), 4);
        // Only in-flight claims are left: the next key is refused, the claims stay.
        let err = store.reserve(&key(3), &claim(), lease).await.unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Capacity);
        for (i, c) in held.iter().enumerate() {
            assert!(store.renew(&key(100 + i), c, lease).await.unwrap());
        }
        assert_eq!(store.effective_retention(), None);
    }

    #[tokio::test]
    async fn the_byte_bound_counts_stored_responses() {
        use crate::store::record::StoredResponse;
        let store = MemoryStore::new().with_max_bytes(3 * ENTRY_BYTES + 800);
        let (lease, retention) = (Duration::from_secs(30), Duration::from_secs(3600));
        let big = claim();
        store.reserve(&key(0), &big, lease).await.unwrap();
        let response = StoredResponse::new(
            http::StatusCode::OK,
            http::HeaderMap::new(),
            bytes::Bytes::from(vec![b'x'; 900]),
            None,
        );
        let record = Record::replay(big.fingerprint(), response);
        store
            .complete(&key(0), &big, &record, retention)
            .await
            .unwrap();
        assert_eq!(store.bytes(), ENTRY_BYTES + 900);
        store.reserve(&key(1), &claim(), lease).await.unwrap();
        // A third key does not fit the bytes (3 * 128 + 900 > 3 * 128 + 800): the big record goes.
        store.reserve(&key(2), &claim(), lease).await.unwrap();
        assert_eq!(store.evictions(), 1);
        assert_eq!(store.bytes(), 2 * ENTRY_BYTES);
        assert_eq!(store.len(), 2);
    }

    #[tokio::test]
    async fn a_full_store_takes_new_keys_once_others_expired() {
        let store = MemoryStore::new().with_max_entries(50);
        for i in 0..50 {
            store
                .reserve(&key(i), &claim(), Duration::from_millis(10))
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The expired entries sit in shards this claim does not touch: evicted before refusing.
        for i in 50..100 {
            store
                .reserve(&key(i), &claim(), Duration::from_secs(60))
                .await
                .unwrap();
        }
        assert_eq!(store.len(), 50);
    }

    #[tokio::test]
    async fn completed_and_released_claims_retire_their_lease_items() {
        let store = MemoryStore::new();
        let lease = Duration::from_secs(60);
        let claims: Vec<_> = (0..2_000).map(|_| claim()).collect();
        for (i, claim) in claims.iter().enumerate() {
            store.reserve(&key(i), claim, lease).await.unwrap();
        }
        // In any order, as concurrent requests finish.
        for (i, claim) in claims.iter().enumerate().rev() {
            if i % 2 == 0 {
                let record = Record::ack(claim.fingerprint());
                assert_eq!(
                    store
                        .complete(&key(i), claim, &record, lease * 2)
                        .await
                        .unwrap(),
                    Completion::Written
                );
            } else {
                assert!(store.release(&key(i), claim).await.unwrap());
            }
        }
        let retired = store
            .shared
            .shards
            .iter()
            .map(|shard| {
                let inner = lock(shard);
                inner
                    .expiries
                    .queues
                    .iter()
                    .flat_map(|q| q.items.iter())
                    .filter(|(_, slot)| *slot == Slot::RETIRED)
                    .count()
            })
            .sum::<usize>();
        assert_eq!(retired, 2_000);
        assert_eq!(store.len(), 1_000);
        for i in (0..2_000).step_by(2) {
            assert!(matches!(
                store.reserve(&key(i), &claim(), lease).await,
                Ok(Reservation::Completed(_))
            ));
        }
    }

    #[tokio::test]
    async fn tokens_are_compared_in_full() {
        // Tokens are public (`Claim::with_token`): two that share a prefix are two owners.
        let store = MemoryStore::new();
        let token = |last| {
            let mut bytes = [0u8; 16];
            bytes[15] = last;
            Token::from_bytes(bytes)
        };
        let (first, second) = (
            Claim::with_token(token(1), Fingerprint::NONE),
            Claim::with_token(token(2), Fingerprint::NONE),
        );
        let (k, lease) = (key(1), Duration::from_secs(60));
        assert_eq!(
            store.reserve(&k, &first, lease).await.unwrap(),
            Reservation::Acquired
        );
        assert!(matches!(
            store.reserve(&k, &second, lease).await.unwrap(),
            Reservation::InFlight { .. }
        ));
        assert!(!store.release(&k, &second).await.unwrap());
        let record = Record::ack(Fingerprint::NONE);
        assert_eq!(
            store.complete(&k, &second, &record, lease).await.unwrap(),
            Completion::Lost
        );
        assert_eq!(
            store.complete(&k, &first, &record, lease).await.unwrap(),
            Completion::Written
        );
        // A retried completion recognises its own record (by the first 3 bytes of its random
        // token); another claim's is still lost.
        assert_eq!(
            store.complete(&k, &first, &record, lease).await.unwrap(),
            Completion::AlreadyWritten
        );
        assert_eq!(
            store.complete(&k, &claim(), &record, lease).await.unwrap(),
            Completion::Lost
        );
    }

    #[test]
    fn keys_spread_over_the_shards() {
        let store = MemoryStore::new();
        let mut counts = [0usize; SHARDS];
        for i in 0..16_000 {
            let slot = Slot::of(&key(i));
            counts[(store.shared.hasher.hash_one(slot) >> 32) as usize % SHARDS] += 1;
        }
        assert!(
            counts.iter().all(|&n| (800..1200).contains(&n)),
            "{counts:?}"
        );
    }

    #[tokio::test]
    async fn expired_lease_can_be_taken_over_and_old_owner_is_refused() {
        let store = MemoryStore::new();
        let key = StoreKey::new("t", None, "k");
        let old = claim();
        store
            .reserve(&key, &old, Duration::from_millis(10))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let new = claim();
        assert_eq!(
            store
                .reserve(&key, &new, Duration::from_secs(5))
                .await
                .unwrap(),
            Reservation::Acquired
        );
        let record = Record::ack(old.fingerprint());
        assert_eq!(
            store
                .complete(&key, &old, &record, Duration::from_secs(5))
                .await
                .unwrap(),
            Completion::Lost
        );
        assert!(!store.release(&key, &old).await.unwrap());
        assert!(store.release(&key, &new).await.unwrap());
    }
}

#[cfg(test)]
mod renew_tests {
    use super::*;

    #[tokio::test]
    async fn renewal_keeps_a_claim_past_its_first_lease_and_only_for_its_owner() {
        let store = MemoryStore::new();
        let k = StoreKey::new("t", None, "renew");
        let owner = Claim::new(Fingerprint::NONE);
        let lease = Duration::from_millis(40);
        store.reserve(&k, &owner, lease).await.unwrap();
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(store.renew(&k, &owner, lease).await.unwrap());
        }
        // 80 ms after the claim, two leases: still held.
        let other = Claim::new(Fingerprint::NONE);
        assert!(matches!(
            store.reserve(&k, &other, lease).await.unwrap(),
            Reservation::InFlight { .. }
        ));
        assert!(!store.renew(&k, &other, lease).await.unwrap());
        // Without renewal it expires within one lease.
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(!store.renew(&k, &owner, lease).await.unwrap());
        assert_eq!(
            store.reserve(&k, &other, lease).await.unwrap(),
            Reservation::Acquired
        );
    }
}
