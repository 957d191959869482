//! The embedded store: [`MemoryStore`], one process, no server; bounded, with expiry and
//! eviction of the oldest records when full ([`WhenFull`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::map::{Evicted, ExpiringMap, Full, Table, Weigh};
use super::slot::Slot;
use super::{
    Claim, Completion, Order, Reservation, StoreError, StoreErrorKind, StoreKey, Target, Token,
};
use crate::fingerprint::Fingerprint;
use crate::order::Position;
use crate::store::contract::{IdempotencyStore, OrderedStore};
use crate::store::record::Record;

/// What a full [`MemoryStore`] does with a new key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WhenFull {
    /// Evict the completed records nearest to their expiry (the oldest), never an in-flight
    /// claim, and take the new key (the default); refuse it only when every entry is an
    /// in-flight claim. A warning is logged (at most once a minute), evictions are counted,
    /// and [`MemoryStore::effective_retention`] says how old the oldest record kept is: a
    /// duplicate of an evicted key is processed again, so when it falls below the sender's
    /// retry window, give the store more room or use Redis.
    #[default]
    EvictOldest,
    /// Refuse the new key with a [`StoreErrorKind::Capacity`] error (503 and `Retry-After` when
    /// failing closed): no record is ever forgotten early, but new events wait until records
    /// expire.
    Refuse,
}

/// The embedded store: one process, no server. The default of the demo and of tests.
///
/// - Claims are atomic (one critical section per call; an ordered event, its object's lease
///   and its object's watermark in one critical section over their shards).
/// - Leases and records expire; expired entries are dropped as time passes (every call drops
///   the expired entries of the part of the key space it touches), so memory follows the live
///   key count.
/// - Memory is bounded: at most [`with_max_entries`](MemoryStore::with_max_entries) live keys
///   (default 1,000,000; ack-mode records cost 100–170
///   bytes each) and at most [`with_max_bytes`](MemoryStore::with_max_bytes) accounted bytes
///   (default 256 MiB; replay-mode records count their
///   response on top). Ordered routes count their per-object state against the same bounds
///   (an object's lease while one of its events is in flight, its watermark afterwards).
/// - When full ([`WhenFull::EvictOldest`], the default), the completed records (and
///   watermarks) nearest to expiry are evicted to make room, for as long as there are any,
///   each eviction in O(1); an in-flight claim or an object's lease never is. Only a store
///   whose entries are all in flight refuses a new key ([`StoreErrorKind::Capacity`]: 503 and
///   `Retry-After` when failing closed), and it takes new keys again as soon as a claim
///   settles. With [`WhenFull::Refuse`], every new key is refused while the store is full.
///   The bounds are split evenly between up to 16 shards (one shard below 128 entries), each
///   of which makes room by itself: a shard's share fills a little before the whole does.
/// - **An evicted key is forgotten**: a duplicate of it is processed again, like one that
///   arrives after its retention, and an event older than an evicted watermark is not found
///   stale. Size the bound for every first delivery of the sender's retry window: at least
///   peak first deliveries per second × retry window in seconds (keys of a batch count one
///   each, ordered events one more per object), plus the claims in flight. Watch
///   [`effective_retention`](Self::effective_retention) (and the
///   `idempotency_memory_effective_retention_seconds` gauge with the `metrics` feature): it is
///   how far back duplicates are still recognised, and must stay above that window;
///   [`evictions`](Self::evictions) (and `idempotency_memory_evictions_total`) counts every
///   record forgotten early.
/// - It is fast: the key space is split into up to 16 independently locked shards, each with
///   its share of both bounds; expiries wait in first-in, first-out queues, one per time to
///   live, so a claim or a record costs O(1) whatever the number of keys held (the map is the
///   crate's one bounded, expiring map, which the local cache uses too).
///
/// It forgets everything on restart and is not shared between processes: use the Redis or SQL
/// stores when either matters.
///
/// ```
/// use tower_idempotency::MemoryStore;
/// use tower_idempotency::store::WhenFull;
///
/// let store = MemoryStore::new()
///     .with_max_entries(10_000)
///     .with_max_bytes(16 * 1024 * 1024)
///     .when_full(WhenFull::EvictOldest);
/// assert_eq!(store.len(), 0);
/// assert_eq!(store.effective_retention(), None);
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    shared: Arc<Shared>,
    when_full: WhenFull,
}

struct Shared {
    map: ExpiringMap<State>,
    max_entries: usize,
    max_bytes: usize,
    /// When the last "store full" warning was logged (seconds since `epoch`, plus one).
    warned_at: AtomicU64,
    /// Evictions so far, for that warning: it is logged under a shard's lock, where reading
    /// the shards' own counters would wait for that lock forever.
    evicted: AtomicU64,
    /// Whether the eviction counter was registered (at zero) with the recorder.
    #[cfg(feature = "metrics")]
    counted: std::sync::atomic::AtomicBool,
    epoch: Instant,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("max_entries", &self.shared.max_entries)
            .field("max_bytes", &self.shared.max_bytes)
            .field("when_full", &self.when_full)
            .finish_non_exhaustive()
    }
}

/// What one slot holds.
enum State {
    /// An event's key, claimed.
    InFlight {
        token: Token,
        fingerprint: Fingerprint,
    },
    /// An event's key, completed.
    Completed(Record),
    /// An object's lease: the claim whose event of the object is in flight.
    ObjectLease(Token),
    /// An object's watermark: the highest position processed.
    Watermark(Position),
}

impl Weigh for State {
    fn bytes(&self) -> usize {
        match self {
            State::Completed(record) => MemoryStore::ENTRY_BYTES + record_bytes(record),
            _ => MemoryStore::ENTRY_BYTES,
        }
    }

    /// Records and watermarks may go early when the store is full (both only make a late
    /// redelivery be processed again); a claim or an object's lease never.
    fn evictable(&self) -> bool {
        matches!(self, State::Completed(_) | State::Watermark(_))
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

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// The default bound on the number of keys: a million, 100–170 MB of ack-mode records
    /// (measured under load: 100–170 bytes per retained key, expiry queues included, depending
    /// on how full the tables are since they last doubled). With the default 72 h retention
    /// that keeps every record of about 4 first deliveries per second, sustained; above that,
    /// the oldest records are evicted (see [`WhenFull`]).
    pub(crate) const DEFAULT_MAX_ENTRIES: usize = 1_000_000;

    /// The default bound on the bytes accounted for: 256 MiB (an entry counts
    /// 128 bytes, plus the response of a replay-mode record).
    pub(crate) const DEFAULT_MAX_BYTES: usize = 256 * 1024 * 1024;

    /// What one entry is accounted as, before any stored response: the entry, its expiry item
    /// and the table's slack, as measured (100–170 bytes).
    pub(crate) const ENTRY_BYTES: usize = 128;

    /// An empty store within 1,000,000 keys and
    /// 256 MiB bytes.
    pub fn new() -> Self {
        Self::with_bounds(Self::DEFAULT_MAX_ENTRIES, Self::DEFAULT_MAX_BYTES)
    }

    fn with_bounds(max_entries: usize, max_bytes: usize) -> Self {
        MemoryStore {
            shared: Arc::new(Shared {
                map: ExpiringMap::new(max_entries, max_bytes),
                max_entries,
                max_bytes,
                warned_at: AtomicU64::new(0),
                evicted: AtomicU64::new(0),
                #[cfg(feature = "metrics")]
                counted: std::sync::atomic::AtomicBool::new(false),
                epoch: Instant::now(),
            }),
            when_full: WhenFull::EvictOldest,
        }
    }

    /// Sets the bound on live keys (in flight and completed; at least 1). Starts a new, empty
    /// store: call it when building the store, before cloning it.
    pub fn with_max_entries(self, max_entries: usize) -> Self {
        let bytes = self.shared.max_bytes;
        Self::with_bounds(max_entries.max(1), bytes).when_full(self.when_full)
    }

    /// Sets the bound on accounted bytes (128 bytes per key, plus
    /// stored responses). Starts a new, empty store, like
    /// [`with_max_entries`](Self::with_max_entries).
    pub fn with_max_bytes(self, max_bytes: usize) -> Self {
        let entries = self.shared.max_entries;
        Self::with_bounds(entries, max_bytes.max(Self::ENTRY_BYTES)).when_full(self.when_full)
    }

    /// Sets what a full store does with a new key (default [`WhenFull::EvictOldest`]).
    pub fn when_full(mut self, when_full: WhenFull) -> Self {
        self.when_full = when_full;
        self
    }

    /// The bytes accounted for the live keys.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.shared.map.for_each_shard(|_, _| {});
        self.shared.map.bytes()
    }

    /// How many completed records (and watermarks) were evicted before their expiry to make
    /// room.
    pub fn evictions(&self) -> u64 {
        self.shared.map.evictions()
    }

    /// How old the oldest completed record kept is: how far back a duplicate is still
    /// recognised. `None` when no record is held. Once the store is full and evicting, this is
    /// the retention actually given, shorter than the configured one.
    pub fn effective_retention(&self) -> Option<Duration> {
        self.shared.map.oldest_evictable_age()
    }

    /// The number of live (unexpired) keys, objects' leases and watermarks included.
    pub fn len(&self) -> usize {
        self.shared.map.for_each_shard(|_, _| {});
        self.shared.map.len()
    }

    /// Whether the store holds no live key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sets `slot` to `state` for `life`, making room as [`WhenFull`] says.
    fn insert(
        &self,
        table: &mut Table<State>,
        slot: Slot,
        state: State,
        life: Duration,
        now: u64,
    ) -> Result<(), StoreError> {
        let evict = self.when_full == WhenFull::EvictOldest;
        match table.insert(slot, state, life, now, evict) {
            Ok(evicted) => {
                self.report(&evicted);
                Ok(())
            }
            Err(Full(evicted)) => {
                self.report(&evicted);
                Err(StoreError::new(StoreErrorKind::Capacity))
            }
        }
    }

    /// Counts and logs evictions (a warning at most once a minute). The first call of a store
    /// (with or without evictions) registers the eviction counter at zero, so that it is
    /// exported before the first eviction (an alert on its increase then sees that one). The
    /// effective retention gauge has no value until something was evicted. It runs under the
    /// lock of the shard that evicted, so it locks no shard.
    fn report(&self, evicted: &[Evicted]) {
        #[cfg(feature = "metrics")]
        if !self.shared.counted.load(Ordering::Relaxed) {
            self.shared.counted.store(true, Ordering::Relaxed);
            metrics::counter!("idempotency_memory_evictions_total").increment(0);
        }
        let Some(youngest) = evicted.iter().map(|e| e.age).min() else {
            return;
        };
        #[cfg(feature = "metrics")]
        {
            metrics::counter!("idempotency_memory_evictions_total").increment(evicted.len() as u64);
            metrics::gauge!("idempotency_memory_effective_retention_seconds")
                .set(youngest.as_secs_f64());
        }
        let shared = &*self.shared;
        let evictions = shared
            .evicted
            .fetch_add(evicted.len() as u64, Ordering::Relaxed)
            + evicted.len() as u64;
        let second = shared.epoch.elapsed().as_secs() + 1;
        let last = shared.warned_at.load(Ordering::Relaxed);
        if (last == 0 || second >= last + 60)
            && shared
                .warned_at
                .compare_exchange(last, second, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                effective_retention_s = youngest.as_secs(),
                evictions,
                "idempotency memory store full: evicting the oldest completed records; \
                 duplicates older than the effective retention are no longer recognised"
            );
        }
    }

    /// What `table` holds for the key `slot` that `claim` finds: `None` when the claim may take
    /// it (absent, expired, or this claim's own, a retried reserve).
    fn held(table: &Table<State>, slot: &Slot, claim: &Claim, now: u64) -> Option<Reservation> {
        let (state, left) = table.get_with_life(slot, now)?;
        match state {
            State::InFlight { token, .. } if token == claim.token() => None,
            State::InFlight { fingerprint, .. } => Some(Reservation::InFlight {
                fingerprint: *fingerprint,
            }),
            State::Completed(record) => {
                Some(Reservation::Completed(record.clone().expiring_in(left)))
            }
            // Not a key's slot: no key maps to it (see `Slot`).
            State::ObjectLease(_) | State::Watermark(_) => None,
        }
    }

    /// Claims one plain key under its shard's lock.
    fn reserve_key(
        &self,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        let slot = Slot::of(key);
        let (mut table, now) = self.shared.map.shard(&slot);
        if let Some(held) = Self::held(&table, &slot, claim, now) {
            return Ok(held);
        }
        self.insert(&mut table, slot, in_flight(claim), lease, now)?;
        Ok(Reservation::Acquired)
    }

    /// Claims one ordered event under the locks of its three slots.
    fn reserve_event(
        &self,
        key: &StoreKey,
        order: &Order,
        claim: &Claim,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        let (key, lease_slot, mark) = slots(key, order);
        let (mut locked, now) = self.shared.map.lock(&[key, lease_slot, mark]);
        if let Some(held) = Self::held(locked.table(&key), &key, claim, now) {
            return Ok(held);
        }
        let own_lease = match locked.table(&lease_slot).get(&lease_slot, now) {
            Some(State::ObjectLease(token)) if token != claim.token() => {
                return Ok(Reservation::ObjectBusy);
            }
            Some(State::ObjectLease(_)) => true,
            _ => false,
        };
        let watermark = match locked.table(&mark).get(&mark, now) {
            Some(State::Watermark(position)) => Some(*position),
            _ => None,
        };
        let state = State::ObjectLease(*claim.token());
        self.insert(locked.table(&lease_slot), lease_slot, state, lease, now)?;
        let state = in_flight(claim);
        if let Err(full) = self.insert(locked.table(&key), key, state, lease, now) {
            if !own_lease {
                locked.table(&lease_slot).remove(&lease_slot);
            }
            return Err(full);
        }
        Ok(match watermark {
            Some(watermark) if order.equal.is_stale(order.position, watermark) => {
                Reservation::Stale { watermark }
            }
            _ => Reservation::Acquired,
        })
    }

    /// Completes one ordered event, its watermark and its object's lease under their locks.
    fn complete_event(
        &self,
        key: &StoreKey,
        order: &Order,
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> Completion {
        let (key, lease_slot, mark) = slots(key, order);
        let (mut locked, now) = self.shared.map.lock(&[key, lease_slot, mark]);
        let done = complete_in(locked.table(&key), &key, claim, record, retention, now);
        if done == Completion::Written {
            let higher = match locked.table(&mark).get(&mark, now) {
                Some(State::Watermark(position)) => order.position > *position,
                _ => true,
            };
            if higher {
                let state = State::Watermark(order.position);
                // A watermark that does not fit is as if evicted: its record is written.
                let _ = self.insert(locked.table(&mark), mark, state, retention, now);
            }
        }
        release_lease(locked.table(&lease_slot), &lease_slot, claim, now);
        done
    }
}

/// The slots of an ordered event: its key, its object's lease and its object's watermark.
fn slots(key: &StoreKey, order: &Order) -> (Slot, Slot, Slot) {
    (
        Slot::of(key),
        Slot::object_lease(&order.object),
        Slot::watermark(&order.object),
    )
}

fn in_flight(claim: &Claim) -> State {
    State::InFlight {
        token: *claim.token(),
        fingerprint: claim.fingerprint(),
    }
}

/// Whether `claim` holds the live key of `slot`.
fn owns(table: &Table<State>, slot: &Slot, claim: &Claim, now: u64) -> bool {
    matches!(table.get(slot, now), Some(State::InFlight { token, .. }) if token == claim.token())
}

/// Writes `record` in place of `claim`'s claim on `slot`.
fn complete_in(
    table: &mut Table<State>,
    slot: &Slot,
    claim: &Claim,
    record: &Record,
    retention: Duration,
    now: u64,
) -> Completion {
    match table.get(slot, now) {
        Some(State::InFlight { token, .. }) if token == claim.token() => {}
        Some(State::Completed(held)) if held.is_owned_by(claim.token()) => {
            return Completion::AlreadyWritten;
        }
        _ => return Completion::Lost,
    }
    let state = State::Completed(record.clone().owned_by(claim.token()));
    // In place of the claim: always set, even past the byte bound (the next claims make room).
    match table.insert(*slot, state, retention, now, false) {
        Ok(_) => Completion::Written,
        Err(Full(_)) => Completion::Lost,
    }
}

/// Lets go of the object's lease of `slot` when `claim` holds it.
fn release_lease(table: &mut Table<State>, slot: &Slot, claim: &Claim, now: u64) {
    if matches!(table.get(slot, now), Some(State::ObjectLease(token)) if token == claim.token()) {
        table.remove(slot);
    }
}

/// Extends the object's lease of `slot` when `claim` holds it.
fn renew_lease(table: &mut Table<State>, slot: &Slot, claim: &Claim, lease: Duration, now: u64) {
    if matches!(table.get(slot, now), Some(State::ObjectLease(token)) if token == claim.token()) {
        table.extend(slot, lease, now);
    }
}

impl IdempotencyStore for MemoryStore {
    /// `true`: every call is a map operation under a shard lock.
    fn in_process(&self) -> bool {
        true
    }

    /// Each target under the locks it needs: a plain key under its shard's, an ordered event
    /// under those of its key, its object's lease and its object's watermark.
    async fn reserve(
        &self,
        targets: &[Target],
        claim: &Claim,
        lease: Duration,
    ) -> Result<Vec<Reservation>, StoreError> {
        targets
            .iter()
            .map(|target| match &target.order {
                None => self.reserve_key(&target.key, claim, lease),
                Some(order) => self.reserve_event(&target.key, order, claim, lease),
            })
            .collect()
    }

    async fn complete(
        &self,
        targets: &[Target],
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> Result<Vec<Completion>, StoreError> {
        Ok(targets
            .iter()
            .map(|target| match &target.order {
                None => {
                    let slot = Slot::of(&target.key);
                    let (mut table, now) = self.shared.map.shard(&slot);
                    complete_in(&mut table, &slot, claim, record, retention, now)
                }
                Some(order) => self.complete_event(&target.key, order, claim, record, retention),
            })
            .collect())
    }

    async fn release(&self, targets: &[Target], claim: &Claim) -> Result<usize, StoreError> {
        let mut released = 0;
        for target in targets {
            let key = Slot::of(&target.key);
            let Some(order) = &target.order else {
                let (mut table, now) = self.shared.map.shard(&key);
                if owns(&table, &key, claim, now) {
                    table.remove(&key);
                    released += 1;
                }
                continue;
            };
            let lease_slot = Slot::object_lease(&order.object);
            let (mut locked, now) = self.shared.map.lock(&[key, lease_slot]);
            if owns(locked.table(&key), &key, claim, now) {
                locked.table(&key).remove(&key);
                released += 1;
            }
            release_lease(locked.table(&lease_slot), &lease_slot, claim, now);
        }
        Ok(released)
    }

    async fn renew(
        &self,
        targets: &[Target],
        claim: &Claim,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let mut all = true;
        for target in targets {
            let key = Slot::of(&target.key);
            let Some(order) = &target.order else {
                let (mut table, now) = self.shared.map.shard(&key);
                all &= owns(&table, &key, claim, now) && table.extend(&key, lease, now);
                continue;
            };
            let lease_slot = Slot::object_lease(&order.object);
            let (mut locked, now) = self.shared.map.lock(&[key, lease_slot]);
            let table = locked.table(&key);
            all &= owns(table, &key, claim, now) && table.extend(&key, lease, now);
            renew_lease(locked.table(&lease_slot), &lease_slot, claim, lease, now);
        }
        Ok(all)
    }
}

/// Every ordered event's key, object lease and watermark are settled under their three locks.
impl OrderedStore for MemoryStore {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::order::Position;
    use crate::store::ObjectKey;
    use crate::test_util::store::{OneTarget, completes, reserves};

    fn claim() -> Claim {
        Claim::new(Fingerprint::of_bytes(b"body"))
    }

    fn key(i: usize) -> StoreKey {
        StoreKey::new("t", None, &i.to_string())
    }

    #[tokio::test]
    async fn expired_entries_are_dropped() {
        let store = MemoryStore::new();
        // Long enough that a loaded machine reserves and counts them all before the first
        // expires (`len` drops expired entries).
        let lease = Duration::from_millis(500);
        for i in 0..100 {
            store.reserve_one(&key(i), &claim(), lease).await.unwrap();
        }
        assert_eq!(store.len(), 100);
        tokio::time::sleep(lease + Duration::from_millis(100)).await;
        assert_eq!(store.len(), 0);
        assert_eq!(store.bytes(), 0);
    }

    #[tokio::test]
    async fn a_completed_key_outlives_its_lease_and_expires_with_its_retention() {
        let store = MemoryStore::new();
        let (k, first) = (key(1), claim());
        let (lease, retention) = (Duration::from_millis(100), Duration::from_secs(1));
        store.reserve_one(&k, &first, lease).await.unwrap();
        let record = Record::ack(first.fingerprint());
        completes(&store, &k, &first, &record, retention, Completion::Written).await;
        // Past the lease (by 200 ms at least), well within the retention (700 ms to spare).
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The lease's expiry item is due, but the entry was set again: it stays.
        assert_eq!(store.len(), 1);
        assert!(matches!(
            store
                .reserve_one(&k, &claim(), Duration::from_secs(1))
                .await,
            Ok(Reservation::Completed(_))
        ));
        // 1.1 s at least after the completion: past the retention.
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert_eq!(store.len(), 0);
    }

    #[tokio::test]
    async fn bound_refuses_new_keys_but_keeps_records() {
        let store = MemoryStore::new()
            .with_max_entries(2)
            .when_full(WhenFull::Refuse);
        let lease = Duration::from_secs(30);
        let first = claim();
        store.reserve_one(&key(0), &first, lease).await.unwrap();
        store
            .complete_one(&key(0), &first, &Record::ack(first.fingerprint()), lease)
            .await
            .unwrap();
        store.reserve_one(&key(1), &claim(), lease).await.unwrap();
        let err = store
            .reserve_one(&key(2), &claim(), lease)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Capacity);
        assert!(matches!(
            store.reserve_one(&key(0), &claim(), lease).await.unwrap(),
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
            store.reserve_one(&key(100 + i), c, lease).await.unwrap();
        }
        for i in 0..2 {
            let c = claim();
            store.reserve_one(&key(i), &c, lease).await.unwrap();
            store
                .complete_one(&key(i), &c, &Record::ack(c.fingerprint()), retention)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(store.effective_retention().unwrap() >= Duration::from_millis(5));
        // Full: a new key evicts the oldest record (key 0), then the next one (key 1).
        reserves(&store, &key(2), &claim(), lease, Reservation::Acquired).await;
        assert_eq!(store.evictions(), 1);
        assert_eq!(
            store.reserve_one(&key(0), &claim(), lease).await.unwrap(),
            Reservation::Acquired,
            "the evicted record is forgotten"
        );
        assert_eq!(store.evictions(), 2);
        assert_eq!(store.len(), 4);
        // Only in-flight claims are left: the next key is refused, the claims stay.
        let err = store
            .reserve_one(&key(3), &claim(), lease)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Capacity);
        for (i, c) in held.iter().enumerate() {
            assert!(store.renew_one(&key(100 + i), c, lease).await.unwrap());
        }
        assert_eq!(store.effective_retention(), None);
    }

    #[tokio::test]
    async fn the_byte_bound_counts_stored_responses() {
        use crate::store::record::StoredResponse;
        let entry = MemoryStore::ENTRY_BYTES;
        let store = MemoryStore::new().with_max_bytes(3 * entry + 800);
        let (lease, retention) = (Duration::from_secs(30), Duration::from_secs(3600));
        let big = claim();
        store.reserve_one(&key(0), &big, lease).await.unwrap();
        let response = StoredResponse::new(
            http::StatusCode::OK,
            http::HeaderMap::new(),
            bytes::Bytes::from(vec![b'x'; 900]),
            None,
        );
        let record = Record::replay(big.fingerprint(), response);
        store
            .complete_one(&key(0), &big, &record, retention)
            .await
            .unwrap();
        assert_eq!(store.bytes(), entry + 900);
        store.reserve_one(&key(1), &claim(), lease).await.unwrap();
        // A third key does not fit the bytes (3 * 128 + 900 > 3 * 128 + 800): the big record goes.
        store.reserve_one(&key(2), &claim(), lease).await.unwrap();
        assert_eq!(store.evictions(), 1);
        assert_eq!(store.bytes(), 2 * entry);
        assert_eq!(store.len(), 2);
    }

    #[tokio::test]
    async fn a_full_store_takes_new_keys_once_others_expired() {
        let store = MemoryStore::new().with_max_entries(50);
        for i in 0..50 {
            store
                .reserve_one(&key(i), &claim(), Duration::from_millis(10))
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        for i in 50..100 {
            store
                .reserve_one(&key(i), &claim(), Duration::from_secs(60))
                .await
                .unwrap();
        }
        assert_eq!(store.len(), 50);
    }

    #[tokio::test]
    async fn tokens_are_compared_in_full() {
        // Tokens can be chosen (`Token::from_bytes`; `test_util::values::claim_with_token` in
        // tests): two that share a prefix are two owners.
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
        reserves(&store, &k, &first, lease, Reservation::Acquired).await;
        assert!(matches!(
            store.reserve_one(&k, &second, lease).await.unwrap(),
            Reservation::InFlight { .. }
        ));
        assert!(!store.release_one(&k, &second).await.unwrap());
        let record = Record::ack(Fingerprint::NONE);
        completes(&store, &k, &second, &record, lease, Completion::Lost).await;
        completes(&store, &k, &first, &record, lease, Completion::Written).await;
        // A retried completion recognises its own record (by the first 3 bytes of its random
        // token); another claim's is still lost.
        completes(
            &store,
            &k,
            &first,
            &record,
            lease,
            Completion::AlreadyWritten,
        )
        .await;
        completes(&store, &k, &claim(), &record, lease, Completion::Lost).await;
    }

    #[tokio::test]
    async fn renewal_keeps_a_claim_past_its_first_lease_and_only_for_its_owner() {
        let store = MemoryStore::new();
        let k = key(7);
        let owner = Claim::new(Fingerprint::NONE);
        // Renewed every 100 ms: each renewal comes 400 ms before the lease would run out.
        let lease = Duration::from_millis(500);
        store.reserve_one(&k, &owner, lease).await.unwrap();
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(store.renew_one(&k, &owner, lease).await.unwrap());
        }
        // 1 s at least after the claim, two leases: still held.
        let other = Claim::new(Fingerprint::NONE);
        assert!(matches!(
            store.reserve_one(&k, &other, lease).await.unwrap(),
            Reservation::InFlight { .. }
        ));
        assert!(!store.renew_one(&k, &other, lease).await.unwrap());
        // Without renewal it expires within one lease.
        tokio::time::sleep(lease + Duration::from_millis(200)).await;
        assert!(!store.renew_one(&k, &owner, lease).await.unwrap());
        reserves(&store, &k, &other, lease, Reservation::Acquired).await;
    }

    /// An object's lease that did not fit is not left behind by the event it was for, and a
    /// full store refuses the event, not half of it.
    #[tokio::test]
    async fn a_full_store_refuses_an_ordered_event_whole() {
        let store = MemoryStore::new()
            .with_max_entries(2)
            .when_full(WhenFull::Refuse);
        let lease = Duration::from_secs(30);
        let event = |i: usize, object: &str| {
            Target::ordered(key(i), ObjectKey::new("t", None, object), Position::new(1))
        };
        let first = claim();
        let answers = store
            .reserve(&[event(0, "a")], &first, lease)
            .await
            .unwrap();
        assert_eq!(answers, [Reservation::Acquired]);
        assert_eq!(store.len(), 2, "the key and the object's lease");
        let err = store
            .reserve(&[event(1, "b")], &claim(), lease)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Capacity);
        assert_eq!(store.len(), 2);
        assert_eq!(store.release(&[event(0, "a")], &first).await.unwrap(), 1);
        assert_eq!(store.len(), 0, "the key and its object's lease are gone");
    }
}
