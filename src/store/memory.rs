use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{
    Claim, IdempotencyStore, Reservation, STORE_KEY_LEN, StoreError, StoreErrorKind, StoreKey,
    Token,
};
use crate::fingerprint::Fingerprint;
use crate::record::Record;

/// The default bound on the number of keys a [`MemoryStore`] keeps: a million, about 180 MB of
/// ack-mode records (measured: 182 bytes per retained key). With the default 72 h retention
/// that allows about 4 first deliveries per second, sustained.
pub const DEFAULT_MAX_ENTRIES: usize = 1_000_000;

/// The embedded store: one process, no server. The default of the demo and of tests.
///
/// - Claims are atomic (one critical section per call).
/// - Leases and records expire; expired entries are evicted as time passes (every call pops the
///   expired heads of an expiry heap), so memory follows the live key count.
/// - Memory is bounded: at most [`max_entries`](MemoryStore::with_max_entries) live keys
///   (default [`DEFAULT_MAX_ENTRIES`]; ack-mode records cost about 182 bytes each, replay-mode
///   records their response on top). A claim beyond that bound is refused with a
///   [`StoreErrorKind::Capacity`] error, which the layer answers like any store error (503 and
///   `Retry-After` when failing closed): a completed record is never evicted early, because
///   forgetting it would let a duplicate through.
///
/// It forgets everything on restart and is not shared between processes: use the Redis or SQL
/// stores when either matters.
///
/// ```
/// use tower_idempotency::store::MemoryStore;
///
/// let store = MemoryStore::new().with_max_entries(10_000);
/// assert_eq!(store.len(), 0);
/// ```
#[derive(Clone, Debug)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
    max_entries: usize,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<Slot, Entry>,
    /// Expiry instants with the generation of the entry they belong to; stale heads are skipped.
    expiries: BinaryHeap<Reverse<(Instant, u64, Slot)>>,
    next_generation: u64,
}

/// A store key as an inline array: copied into the map and the expiry heap without a heap
/// allocation (a `StoreKey` clone is one), which matters on every claim and record.
type Slot = [u8; STORE_KEY_LEN];

fn slot(key: &StoreKey) -> Slot {
    // Every `StoreKey` is `STORE_KEY_LEN` bytes long (`StoreKey::new` is its only constructor).
    let bytes = key.as_str().as_bytes();
    debug_assert_eq!(bytes.len(), STORE_KEY_LEN);
    let mut slot = [0u8; STORE_KEY_LEN];
    let len = bytes.len().min(STORE_KEY_LEN);
    slot[..len].copy_from_slice(&bytes[..len]);
    slot
}

#[derive(Debug)]
struct Entry {
    state: State,
    expires_at: Instant,
    generation: u64,
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
            inner: Arc::default(),
            max_entries: DEFAULT_MAX_ENTRIES,
        }
    }

    /// Sets the bound on live keys (in flight and completed).
    pub fn with_max_entries(mut self, max_entries: usize) -> Self {
        self.max_entries = max_entries.max(1);
        self
    }

    /// The number of live (unexpired) keys.
    pub fn len(&self) -> usize {
        let mut inner = self.lock();
        inner.evict_expired(Instant::now());
        inner.entries.len()
    }

    /// Whether the store holds no live key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave an entry half-written (every critical
        // section writes whole entries), so a poisoned lock is safe to keep using.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Inner {
    fn evict_expired(&mut self, now: Instant) {
        while let Some(Reverse((at, generation, _))) = self.expiries.peek() {
            if *at > now {
                break;
            }
            let generation = *generation;
            let Some(Reverse((_, _, key))) = self.expiries.pop() else {
                break;
            };
            if self
                .entries
                .get(&key)
                .is_some_and(|e| e.generation == generation)
            {
                self.entries.remove(&key);
            }
        }
        // Stale heap items (entries re-set or removed) are dropped as they reach the head; keep
        // the heap from growing far past the live set when many entries are re-set early.
        if self.expiries.len() > 2 * self.entries.len() + 1024 {
            let entries = &self.entries;
            self.expiries.retain(|Reverse((_, generation, key))| {
                entries
                    .get(key)
                    .is_some_and(|e| e.generation == *generation)
            });
        }
    }

    fn set(&mut self, key: &StoreKey, state: State, ttl: Duration, now: Instant) {
        let generation = self.next_generation;
        self.next_generation += 1;
        let expires_at = now + ttl;
        let key = slot(key);
        self.expiries.push(Reverse((expires_at, generation, key)));
        self.entries.insert(
            key,
            Entry {
                state,
                expires_at,
                generation,
            },
        );
    }

    /// The live entry of `key` if `token` owns it.
    fn owned(&self, key: &StoreKey, token: &Token, now: Instant) -> bool {
        matches!(
            self.entries.get(&slot(key)),
            Some(Entry { state: State::InFlight { token: t, .. }, expires_at, .. })
                if t == token && *expires_at > now
        )
    }
}

impl IdempotencyStore for MemoryStore {
    async fn reserve(
        &self,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.evict_expired(now);
        if let Some(entry) = inner.entries.get(&slot(key)).filter(|e| e.expires_at > now) {
            return Ok(match &entry.state {
                // Our own claim (a retried reserve): ours still, as the Redis store answers.
                State::InFlight { token, .. } if token == claim.token() => Reservation::Acquired,
                State::InFlight { fingerprint, .. } => Reservation::InFlight {
                    fingerprint: *fingerprint,
                },
                State::Completed(record) => Reservation::Completed(record.clone()),
            });
        }
        if inner.entries.len() >= self.max_entries && !inner.entries.contains_key(&slot(key)) {
            return Err(StoreError::new(StoreErrorKind::Capacity));
        }
        let state = State::InFlight {
            token: *claim.token(),
            fingerprint: claim.fingerprint(),
        };
        inner.set(key, state, lease, now);
        Ok(Reservation::Acquired)
    }

    async fn complete(
        &self,
        key: &StoreKey,
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut inner = self.lock();
        if !inner.owned(key, claim.token(), now) {
            return Ok(false);
        }
        inner.set(key, State::Completed(record.clone()), retention, now);
        Ok(true)
    }

    async fn release(&self, key: &StoreKey, claim: &Claim) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut inner = self.lock();
        if !inner.owned(key, claim.token(), now) {
            return Ok(false);
        }
        inner.entries.remove(&slot(key));
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim() -> Claim {
        Claim::new(Fingerprint::of_bytes(b"body"))
    }

    #[tokio::test]
    async fn expired_entries_are_evicted() {
        let store = MemoryStore::new();
        let lease = Duration::from_millis(20);
        for i in 0..100 {
            let key = StoreKey::new("t", None, &i.to_string());
            store.reserve(&key, &claim(), lease).await.unwrap();
        }
        assert_eq!(store.len(), 100);
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert_eq!(store.len(), 0);
        assert!(store.lock().expiries.is_empty());
    }

    #[tokio::test]
    async fn bound_refuses_new_keys_but_keeps_records() {
        let store = MemoryStore::new().with_max_entries(2);
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
        assert!(
            !store
                .complete(&key, &old, &record, Duration::from_secs(5))
                .await
                .unwrap()
        );
        assert!(!store.release(&key, &old).await.unwrap());
        assert!(store.release(&key, &new).await.unwrap());
    }
}
