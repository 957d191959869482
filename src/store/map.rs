//! [`ExpiringMap`]: the one bounded, expiring, sharded map of the crate. The [`MemoryStore`]
//! keeps its claims, records and object watermarks in one; the [`LocalCache`] keeps its copies
//! of completed records in another.
//!
//! What both need, and what this map gives:
//!
//! - **keys that are already hashes**: a [`Slot`] (the 16 base64url digits of a store key, as
//!   two words), indexed with a cheap seeded hash ([`SlotHasher`]);
//! - **expiry in O(1)**: every entry has an expiry instant; expiry items wait in first-in,
//!   first-out queues, one per time to live (a layer uses a few: its lease, its retention, the
//!   cache's lives), so each queue is sorted by construction and its head is the next to
//!   expire; rare other lives go to a heap. Every lock of a shard that may add to it first
//!   drops what expired there, so memory follows the live entries (a lookup that finds
//!   nothing, and a removal, may skip it);
//! - **bounds on entries and on bytes**, each shard holding an equal share of both, so that a
//!   full shard makes room by itself under its own lock: the entry nearest to its expiry among
//!   those its value allows to be evicted ([`Weigh::evictable`]: the memory store never evicts
//!   an in-flight claim; the cache evicts anything), for as long as the shard holds one.
//!   Evictable and kept entries wait in queues of their own, so the head of an evictable
//!   queue, once what was removed or set again is dropped from it, is the one to evict: an
//!   eviction costs O(1), amortised. Small bounds use fewer shards, so that they stay exact;
//! - **several entries changed at once**: [`ExpiringMap::lock`] locks the shards of several
//!   slots in index order (never a deadlock), for the memory store's ordered events (an
//!   event, its object's lock and its object's watermark, in one step).
//!
//! Concurrent requests on a multi-threaded runtime rarely wait for each other: at most 16
//! independently locked shards, each on its own cache line.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque, hash_map};
use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::slot::{Slot, SlotHasher};

/// At most this many independently locked shards.
const MAX_SHARDS: usize = 16;

/// A shard is only split off for at least this many entries and this many bytes, so that
/// small maps keep their bounds exact and can hold large values.
const MIN_SHARD_ENTRIES: usize = 64;
const MIN_SHARD_BYTES: usize = 1024 * 1024;

/// How many distinct lives a shard keeps a first-in, first-out queue for, among its evictable
/// entries and among its kept ones; others go to a heap.
const MAX_QUEUES: usize = 8;

/// What the map needs to know of a value.
pub(super) trait Weigh {
    /// The bytes the value is accounted as (on top of nothing: include the entry itself).
    fn bytes(&self) -> usize;
    /// Whether the value may be evicted before its expiry to make room. It must not change
    /// while the value is in the map (the map files the entry by it).
    fn evictable(&self) -> bool;
}

/// A sharded map from slots to values that expire, within bounds on entries and bytes. See
/// the [module docs](self).
pub(super) struct ExpiringMap<V> {
    shards: Box<[Shard<V>]>,
    /// Each shard's share of the bounds (rounded down: the shares never exceed the bounds).
    shard_entries: usize,
    shard_bytes: usize,
    hasher: SlotHasher,
    /// Expiry instants are nanoseconds since this instant.
    epoch: Instant,
}

/// One lock's worth of the slots, on its own cache line.
#[repr(align(64))]
struct Shard<V>(Mutex<Table<V>>);

/// The entries of one shard.
pub(super) struct Table<V> {
    entries: HashMap<Slot, Entry<V>, SlotHasher>,
    expiries: Expiries,
    /// Bytes accounted for `entries`.
    bytes: usize,
    /// Entries evicted before their expiry, since the map was made.
    evictions: u64,
    /// The shard's share of the bounds.
    max_entries: usize,
    max_bytes: usize,
}

struct Entry<V> {
    value: V,
    /// Nanoseconds since the map's epoch.
    expires: u64,
    /// The life it was given (how long before `expires` it was set), in nanoseconds: its
    /// queue.
    life: u64,
    cost: usize,
}

/// The map is full: nothing could be evicted to make room (or eviction was not allowed), or
/// not enough (the bytes of the evictable entries left are too few). Holds the entries
/// evicted trying, which are gone.
#[derive(Debug)]
pub(super) struct Full(pub(super) Vec<Evicted>);

/// An entry evicted to make room: how long it had been in the map.
#[derive(Clone, Copy, Debug)]
pub(super) struct Evicted {
    pub(super) age: Duration,
}

impl<V: Weigh> ExpiringMap<V> {
    /// A map of at most `max_entries` entries and `max_bytes` accounted bytes.
    pub(super) fn new(max_entries: usize, max_bytes: usize) -> Self {
        let shards = (max_entries / MIN_SHARD_ENTRIES)
            .min(max_bytes / MIN_SHARD_BYTES)
            .clamp(1, MAX_SHARDS);
        let (shard_entries, shard_bytes) = (max_entries / shards, max_bytes / shards);
        let hasher = SlotHasher::default();
        ExpiringMap {
            shards: (0..shards)
                .map(|_| {
                    Shard(Mutex::new(Table {
                        entries: HashMap::with_hasher(hasher),
                        expiries: Expiries::default(),
                        bytes: 0,
                        evictions: 0,
                        max_entries: shard_entries,
                        max_bytes: shard_bytes,
                    }))
                })
                .collect(),
            shard_entries,
            shard_bytes,
            hasher,
            epoch: Instant::now(),
        }
    }

    /// Whether the map can hold anything at all.
    pub(super) fn holds_anything(&self) -> bool {
        self.shard_entries > 0
    }

    /// The largest value (in accounted bytes) one shard can hold.
    pub(super) fn shard_bytes(&self) -> usize {
        self.shard_bytes
    }

    /// Now, in the map's nanoseconds.
    pub(super) fn now(&self) -> u64 {
        self.nanos_at(Instant::now())
    }

    /// `at`, in the map's nanoseconds.
    pub(super) fn nanos_at(&self, at: Instant) -> u64 {
        nanos(at.saturating_duration_since(self.epoch))
    }

    fn index(&self, slot: &Slot) -> usize {
        // Bits the table's own hash of the slot does not use (the bucket index comes from the
        // low bits, the control tag from the top seven).
        (self.hasher.hash_one(slot) >> 32) as usize % self.shards.len()
    }

    /// Locks the shard of `slot` after dropping what expired there; returns it with the time
    /// read under the lock (so that each shard's clock, and each of its queues, is sorted).
    pub(super) fn shard(&self, slot: &Slot) -> (MutexGuard<'_, Table<V>>, u64) {
        let mut table = lock(&self.shards[self.index(slot)]);
        let now = self.now();
        table.expire(now);
        (table, now)
    }

    /// Locks the shard of `slot` as it is, without reading the clock or dropping what expired:
    /// for a removal, which needs neither (what expired there goes at the next look).
    pub(super) fn shard_as_is(&self, slot: &Slot) -> MutexGuard<'_, Table<V>> {
        lock(&self.shards[self.index(slot)])
    }

    /// Locks the shard of `slot` after dropping what expired there by `now`, a time the caller
    /// read earlier, instead of reading the clock under the lock: for an entry set from that
    /// same earlier read. What expires between `now` and the present stays until the next
    /// look (lookups check the expiry themselves).
    pub(super) fn shard_at(&self, slot: &Slot, now: u64) -> MutexGuard<'_, Table<V>> {
        let mut table = lock(&self.shards[self.index(slot)]);
        table.expire(now);
        table
    }

    /// Locks the shard of `slot` as [`shard`](Self::shard) does when it holds an entry for
    /// `slot` (live or not); `None` when it holds none, without reading the clock or dropping
    /// what expired: a lookup that misses needs neither.
    pub(super) fn shard_holding(&self, slot: &Slot) -> Option<(MutexGuard<'_, Table<V>>, u64)> {
        let mut table = lock(&self.shards[self.index(slot)]);
        if !table.entries.contains_key(slot) {
            return None;
        }
        let now = self.now();
        table.expire(now);
        Some((table, now))
    }

    /// Locks the shards of every slot of `slots`, each once, in index order (so that two
    /// callers never wait for each other in a circle), after dropping what expired there.
    pub(super) fn lock(&self, slots: &[Slot]) -> (Locked<'_, V>, u64) {
        let mut indexes: Vec<usize> = slots.iter().map(|slot| self.index(slot)).collect();
        indexes.sort_unstable();
        indexes.dedup();
        let mut guards = Vec::with_capacity(indexes.len());
        for index in indexes {
            guards.push((index, lock(&self.shards[index])));
        }
        let now = self.now();
        for (_, table) in &mut guards {
            table.expire(now);
        }
        (Locked { map: self, guards }, now)
    }

    /// Runs `f` on every shard in turn, each locked after dropping what expired there.
    pub(super) fn for_each_shard(&self, mut f: impl FnMut(&mut Table<V>, u64)) {
        for shard in self.shards.iter() {
            let mut table = lock(shard);
            let now = self.now();
            table.expire(now);
            f(&mut table, now);
        }
    }

    /// The number of entries held (live, or expired and not yet dropped).
    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).entries.len()).sum()
    }

    /// The bytes accounted for the entries held.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> usize {
        self.shards.iter().map(|s| lock(s).bytes).sum()
    }

    /// The entries evicted early, in all.
    pub(super) fn evictions(&self) -> u64 {
        self.shards.iter().map(|s| lock(s).evictions).sum()
    }

    /// Drops every entry.
    pub(super) fn clear(&self) {
        for shard in self.shards.iter() {
            let mut table = lock(shard);
            table.entries.clear();
            table.expiries = Expiries::default();
            table.bytes = 0;
        }
    }

    /// The age of the oldest evictable entry: how far back the map still remembers. `None`
    /// when it holds no evictable entry.
    pub(super) fn oldest_evictable_age(&self) -> Option<Duration> {
        let mut oldest: Option<u64> = None;
        self.for_each_shard(|table, _| {
            if let Some((_, expires, life)) = table.oldest_evictable() {
                let set_at = expires.saturating_sub(nanos(life));
                oldest = Some(oldest.map_or(set_at, |o| o.min(set_at)));
            }
        });
        oldest.map(|at| Duration::from_nanos(self.now().saturating_sub(at)))
    }
}

/// The shards of several slots, locked at once ([`ExpiringMap::lock`]).
pub(super) struct Locked<'a, V> {
    map: &'a ExpiringMap<V>,
    guards: Vec<(usize, MutexGuard<'a, Table<V>>)>,
}

impl<V: Weigh> Locked<'_, V> {
    /// The table holding `slot` (which must be one of the slots locked).
    pub(super) fn table(&mut self, slot: &Slot) -> &mut Table<V> {
        let index = self.map.index(slot);
        let at = self
            .guards
            .binary_search_by_key(&index, |(i, _)| *i)
            .unwrap_or_else(|_| unreachable!("a slot outside the locked shards"));
        &mut self.guards[at].1
    }
}

impl<V: Weigh> Table<V> {
    /// The live value of `slot`.
    pub(super) fn get(&self, slot: &Slot, now: u64) -> Option<&V> {
        self.entries
            .get(slot)
            .filter(|e| e.expires > now)
            .map(|e| &e.value)
    }

    /// The live value of `slot` and how long it has left.
    pub(super) fn get_with_life(&self, slot: &Slot, now: u64) -> Option<(&V, Duration)> {
        self.entries
            .get(slot)
            .filter(|e| e.expires > now)
            .map(|e| (&e.value, Duration::from_nanos(e.expires - now)))
    }

    /// Sets `slot` to `value` for `life` from `now`, in place of any entry it holds. A new
    /// entry must fit the shard's bounds: when it does not, the entries nearest to expiry
    /// that may be evicted make room if `evict` allows, else (or when nothing may go) the
    /// answer is [`Full`] and nothing changes. An entry replaced in place is always set, even
    /// past the byte bound (the next insertions make room). Returns the entries evicted.
    pub(super) fn insert(
        &mut self,
        slot: Slot,
        value: V,
        life: Duration,
        now: u64,
        evict: bool,
    ) -> Result<Vec<Evicted>, Full> {
        self.insert_until(
            slot,
            value,
            now.saturating_add(nanos(life)),
            life,
            now,
            evict,
        )
    }

    /// [`insert`](Self::insert) with the expiry given (`life` then names its queue: an entry
    /// set a little earlier than `now`, from a clock read made before the caller's own work).
    pub(super) fn insert_until(
        &mut self,
        slot: Slot,
        value: V,
        expires: u64,
        life: Duration,
        now: u64,
        evict: bool,
    ) -> Result<Vec<Evicted>, Full> {
        let cost = value.bytes();
        let mut evicted = Vec::new();
        // With room for a new entry, nothing needs to know whether `slot` holds one yet: one
        // lookup, the insertion's own.
        let room = self.entries.len() < self.max_entries && self.bytes + cost <= self.max_bytes;
        if !room && !self.entries.contains_key(&slot) {
            if self.max_entries == 0 || cost > self.max_bytes {
                return Err(Full(evicted));
            }
            // Each eviction is O(1), amortised, and an entry is evicted at most once: however
            // many one insertion takes, the cost per insertion stays O(1) on average.
            while self.entries.len() >= self.max_entries || self.bytes + cost > self.max_bytes {
                match evict.then(|| self.evict_oldest(now)).flatten() {
                    Some(one) => evicted.push(one),
                    None => return Err(Full(evicted)),
                }
            }
        }
        let evictable = value.evictable();
        let entry = Entry {
            value,
            expires,
            life: nanos(life),
            cost,
        };
        if let Some(old) = self.entries.insert(slot, entry) {
            self.expiries.lane(old.value.evictable()).retire(
                old.expires,
                Duration::from_nanos(old.life),
                &slot,
            );
            self.bytes -= old.cost;
        }
        self.bytes += cost;
        self.expiries.schedule(evictable, life, expires, slot);
        Ok(evicted)
    }

    /// Gives the live entry of `slot` a new life from `now`, keeping its value: `false` when
    /// there is none.
    pub(super) fn extend(&mut self, slot: &Slot, life: Duration, now: u64) -> bool {
        let Some(entry) = self.entries.get_mut(slot).filter(|e| e.expires > now) else {
            return false;
        };
        let evictable = entry.value.evictable();
        self.expiries
            .lane(evictable)
            .retire(entry.expires, Duration::from_nanos(entry.life), slot);
        entry.expires = now.saturating_add(nanos(life));
        entry.life = nanos(life);
        self.expiries
            .schedule(evictable, life, entry.expires, *slot);
        true
    }

    /// Removes the entry of `slot`; returns its value.
    pub(super) fn remove(&mut self, slot: &Slot) -> Option<V> {
        let entry = self.entries.remove(slot)?;
        self.expiries.lane(entry.value.evictable()).retire(
            entry.expires,
            Duration::from_nanos(entry.life),
            slot,
        );
        self.bytes -= entry.cost;
        Some(entry.value)
    }

    /// Drops the entries that expired at or before `now`.
    fn expire(&mut self, now: u64) {
        let Table {
            entries,
            expiries,
            bytes,
            ..
        } = self;
        // An expiry item is current when its entry still expires at that instant; entries that
        // were set again or removed since leave stale items, skipped here.
        expiries.pop_due(now, |at, slot| {
            if let hash_map::Entry::Occupied(entry) = entries.entry(*slot) {
                if entry.get().expires == at {
                    *bytes -= entry.remove().cost;
                }
            }
        });
        // Drop stale items once they outnumber the entries (many entries removed or set again
        // long before their time), so that memory follows the live entries.
        if expiries.len() > 2 * entries.len() + 1024 {
            expiries.retain(|at, slot| entries.get(slot).is_some_and(|e| e.expires == at));
        }
    }

    /// Evicts the evictable entry of this shard nearest to its expiry.
    fn evict_oldest(&mut self, now: u64) -> Option<Evicted> {
        let entries = &self.entries;
        let current = |at: u64, slot: &Slot| entries.get(slot).is_some_and(|e| e.expires == at);
        let found = self.expiries.evictable.oldest(current);
        if let Some((head, _, _)) = found {
            self.expiries.evictable.pop(head);
        }
        // The lookup and the pop take heads off: look at what is first now.
        self.expiries.heads_changed();
        let (_, expires, slot) = found?;
        let entry = self.entries.remove(&slot)?;
        self.bytes -= entry.cost;
        self.evictions += 1;
        let set_at = expires.saturating_sub(entry.life);
        Some(Evicted {
            age: Duration::from_nanos(now.saturating_sub(set_at)),
        })
    }

    /// The evictable entry nearest to its expiry (the earliest head of the evictable queues
    /// and heap, after dropping the items of entries removed or set again since): its slot,
    /// expiry and life.
    fn oldest_evictable(&mut self) -> Option<(Slot, u64, Duration)> {
        let entries = &self.entries;
        let current = |at: u64, slot: &Slot| entries.get(slot).is_some_and(|e| e.expires == at);
        let found = self.expiries.evictable.oldest(current);
        // The lookup takes stale heads off: look at what is first now.
        self.expiries.heads_changed();
        let (_, expires, slot) = found?;
        let life = self.entries.get(&slot).map_or(0, |e| e.life);
        Some((slot, expires, Duration::from_nanos(life)))
    }

    /// The number of entries of this shard.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The expiry items this shard keeps (for tests: stale items are dropped in time).
    #[cfg(test)]
    pub(super) fn expiry_items(&self) -> usize {
        self.expiries.len()
    }
}

fn lock<V>(shard: &Shard<V>) -> MutexGuard<'_, Table<V>> {
    // Every critical section leaves whole entries behind, so a poisoned lock is safe to use.
    shard.0.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// When each entry expires, as `(nanoseconds, slot)` items: the evictable entries' apart from
/// the others', so that the head of an evictable queue is always one that may go.
#[derive(Default)]
struct Expiries {
    evictable: Lane,
    kept: Lane,
    /// No head of a queue or of a heap is due before this instant (a lower bound: zero, or
    /// an item since retired or dropped, only costs a look at the heads): every lock of a
    /// shard looks for what expired, and nothing usually has.
    due: u64,
}

impl Expiries {
    fn lane(&mut self, evictable: bool) -> &mut Lane {
        if evictable {
            &mut self.evictable
        } else {
            &mut self.kept
        }
    }

    fn len(&self) -> usize {
        self.evictable.len() + self.kept.len()
    }

    /// Schedules the expiry of `slot` at `expires` (`life` after it was set), in the lane of
    /// an `evictable` entry or of a kept one.
    fn schedule(&mut self, evictable: bool, life: Duration, expires: u64, slot: Slot) {
        self.due = self.due.min(expires);
        self.lane(evictable).schedule(life, expires, slot);
    }

    fn pop_due(&mut self, now: u64, mut expire: impl FnMut(u64, &Slot)) {
        if now < self.due {
            return;
        }
        self.evictable.pop_due(now, &mut expire);
        self.kept.pop_due(now, expire);
        self.heads_changed();
    }

    /// Sets [`due`](Self::due) to the earliest head again, after heads were popped: an item
    /// behind a head may be due before it (a queue is sorted only as far as its writers'
    /// clocks agree), and must not wait for the head it followed.
    fn heads_changed(&mut self) {
        self.due = self.evictable.earliest().min(self.kept.earliest());
    }

    fn retain(&mut self, mut keep: impl FnMut(u64, &Slot) -> bool) {
        self.evictable.retain(&mut keep);
        self.kept.retain(keep);
        self.heads_changed();
    }
}

/// The expiry items of one kind of entry (evictable or kept).
#[derive(Default)]
struct Lane {
    /// Items in insertion order, one queue per life: `now + life` grows with `now`, so each
    /// queue is sorted and its head is the next to expire.
    queues: Vec<Queue>,
    /// Items of lives beyond the first [`MAX_QUEUES`].
    heap: BinaryHeap<Reverse<(u64, Slot)>>,
}

struct Queue {
    life: Duration,
    items: VecDeque<(u64, Slot)>,
}

/// Where the head of a lane was found: a queue (its index) or the heap.
#[derive(Clone, Copy)]
enum Head {
    Queue(usize),
    Heap,
}

impl Lane {
    fn len(&self) -> usize {
        self.queues.iter().map(|q| q.items.len()).sum::<usize>() + self.heap.len()
    }

    /// The earliest instant at the head of a queue or of the heap (`u64::MAX` when there is
    /// none): a queue is sorted as far as its writers' clocks were, so what waits behind its
    /// head waits for it (see [`pop_due`](Self::pop_due)).
    fn earliest(&self) -> u64 {
        let heads = self.queues.iter().filter_map(|q| q.items.front());
        let heap = self.heap.peek().map(|Reverse(item)| item);
        heads
            .chain(heap)
            .map(|(at, _)| *at)
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Schedules the expiry of `slot` at `expires` (`life` after it was set).
    fn schedule(&mut self, life: Duration, expires: u64, slot: Slot) {
        let queues = self.queues.len();
        match self.queues.iter_mut().find(|q| q.life == life) {
            Some(queue) => queue.items.push_back((expires, slot)),
            None if queues < MAX_QUEUES => self.queues.push(Queue {
                life,
                items: VecDeque::from([(expires, slot)]),
            }),
            None => self.heap.push(Reverse((expires, slot))),
        }
    }

    /// The earliest head of the lane's queues and heap whose entry is `current` (still
    /// expires at that instant), after popping the heads that are not (retired, removed or
    /// set again since): each item is popped once, so this is O(1) amortised.
    fn oldest(&mut self, current: impl Fn(u64, &Slot) -> bool) -> Option<(Head, u64, Slot)> {
        let live = |&(at, slot): &(u64, Slot)| slot != Slot::RETIRED && current(at, &slot);
        let mut best: Option<(Head, u64, Slot)> = None;
        for (index, queue) in self.queues.iter_mut().enumerate() {
            while queue.items.front().is_some_and(|item| !live(item)) {
                queue.items.pop_front();
            }
            if let Some(&(at, slot)) = queue.items.front() {
                if best.is_none_or(|(_, b, _)| at < b) {
                    best = Some((Head::Queue(index), at, slot));
                }
            }
        }
        while self.heap.peek().is_some_and(|Reverse(item)| !live(item)) {
            self.heap.pop();
        }
        if let Some(&Reverse((at, slot))) = self.heap.peek() {
            if best.is_none_or(|(_, b, _)| at < b) {
                best = Some((Head::Heap, at, slot));
            }
        }
        best
    }

    /// Pops the head found by [`oldest`](Self::oldest).
    fn pop(&mut self, head: Head) {
        match head {
            Head::Queue(index) => {
                self.queues[index].items.pop_front();
            }
            Head::Heap => {
                self.heap.pop();
            }
        }
    }
    /// Hands every item due at `now` to `expire`, except retired ones. A queue is only sorted
    /// as far as its writers' clocks were (an entry set from an earlier clock read): an item
    /// due behind one that is not stays until that one is due, and is skipped by lookups,
    /// which check the expiry themselves.
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

    /// Retires the item `(expires, slot)` of an entry about to be set again or removed, so
    /// that its turn, much later, does not have to look the slot up in the map (a cache miss
    /// on a large map). The item was usually pushed moments ago: it is searched for near the
    /// tail of its life's queue, which is still in cache. One that is not found (in the heap,
    /// or pushed long ago) is checked against the map when it is due, as any other.
    fn retire(&mut self, expires: u64, life: Duration, slot: &Slot) {
        let Some(queue) = self.queues.iter_mut().find(|q| q.life == life) else {
            return;
        };
        let items = &mut queue.items;
        let (Some(first), Some(last)) = (items.front(), items.back()) else {
            return;
        };
        if expires < first.0 || expires > last.0 {
            return;
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
        // Items rarely share an instant, unless lives so long that they all saturate: bound
        // the scan (an item not retired is checked against the map when due, as any other).
        let found = items
            .range_mut(lo..)
            .take_while(|(at, _)| *at == expires)
            .take(16)
            .find(|(_, s)| s == slot);
        if let Some(item) = found {
            item.1 = Slot::RETIRED;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreKey;

    #[derive(Debug, PartialEq)]
    struct Value {
        bytes: usize,
        evictable: bool,
    }

    impl Weigh for Value {
        fn bytes(&self) -> usize {
            self.bytes
        }
        fn evictable(&self) -> bool {
            self.evictable
        }
    }

    fn slot(i: usize) -> Slot {
        Slot::of(&StoreKey::new("map", None, &i.to_string()))
    }

    fn value(evictable: bool) -> Value {
        Value {
            bytes: 100,
            evictable,
        }
    }

    const LONG: Duration = Duration::from_secs(60);

    #[test]
    fn small_bounds_are_exact() {
        let map: ExpiringMap<Value> = ExpiringMap::new(3, 1 << 30);
        assert_eq!(map.shards.len(), 1);
        let (mut table, now) = map.shard(&slot(0));
        for i in 0..3 {
            table
                .insert(slot(i), value(false), LONG, now, true)
                .unwrap();
        }
        // Nothing may be evicted: full.
        assert!(
            table
                .insert(slot(3), value(false), LONG, now, true)
                .is_err()
        );
        // Replacing in place is always allowed.
        table
            .insert(slot(1), value(true), LONG, now, false)
            .unwrap();
        // Evicting is allowed and slot 1 may go: the new entry takes its place.
        let evicted = table.insert(slot(4), value(true), LONG, now, true).unwrap();
        assert_eq!(evicted.len(), 1);
        assert!(table.get(&slot(1), now).is_none());
        assert_eq!(table.len(), 3);
        assert_eq!(table.evictions, 1);
    }

    /// An entry behind the head of its queue that expires before it (its life counted from an
    /// earlier clock read) is dropped when it expires, also once the head it followed was
    /// evicted.
    #[test]
    fn an_entry_behind_an_evicted_head_expires_in_time() {
        let map: ExpiringMap<Value> = ExpiringMap::new(3, 1 << 30);
        assert_eq!(map.shards.len(), 1);
        let (mut table, now) = map.shard(&slot(0));
        let short = Duration::from_nanos(5);
        table
            .insert(slot(9), value(true), short, now, true)
            .unwrap();
        // One life, one queue: slot 1 follows slot 0 and expires a microsecond before it.
        table
            .insert(slot(0), value(true), LONG, now + 1000, true)
            .unwrap();
        table.insert(slot(1), value(true), LONG, now, true).unwrap();
        // Slot 9 expires: the heads are looked at again (slot 0 heads its queue).
        table.expire(now + 10);
        assert_eq!(table.len(), 2);
        table
            .insert(slot(2), value(true), 2 * LONG, now, true)
            .unwrap();
        // Full: another entry evicts the earliest head, slot 0.
        let evicted = table.insert(slot(3), value(true), 2 * LONG, now, true);
        assert_eq!(evicted.unwrap().len(), 1);
        assert!(table.get(&slot(0), now).is_none());
        table.expire(now + nanos(LONG));
        assert!(
            !table.entries.contains_key(&slot(1)),
            "slot 1 expired: dropped"
        );
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn entries_expire_and_memory_follows() {
        let map: ExpiringMap<Value> = ExpiringMap::new(1000, 1 << 30);
        // Long enough that a loaded machine inserts and counts them all before the first
        // expires.
        let short = Duration::from_millis(300);
        for i in 0..100 {
            let (mut table, now) = map.shard(&slot(i));
            table
                .insert(slot(i), value(true), short, now, true)
                .unwrap();
        }
        assert_eq!(map.len(), 100);
        std::thread::sleep(Duration::from_millis(400));
        map.for_each_shard(|_, _| {});
        assert_eq!(map.len(), 0);
        assert_eq!(map.bytes(), 0);
        let mut items = 0;
        map.for_each_shard(|table, _| items += table.expiry_items());
        assert_eq!(items, 0);
    }

    #[test]
    fn extending_and_removing_retire_their_items() {
        let map: ExpiringMap<Value> = ExpiringMap::new(1000, 1 << 30);
        let (mut table, now) = map.shard(&slot(0));
        table
            .insert(slot(0), value(false), LONG, now, true)
            .unwrap();
        assert!(table.extend(&slot(0), Duration::from_secs(120), now));
        assert!(!table.extend(&slot(9), LONG, now));
        assert_eq!(table.remove(&slot(0)), Some(value(false)));
        assert_eq!(table.bytes, 0);
        // Both items were found and retired: evicting finds nothing.
        assert!(table.oldest_evictable().is_none());
    }

    #[test]
    fn many_lives_expire_in_order_through_queues_and_heap() {
        let map: ExpiringMap<Value> = ExpiringMap::new(1000, 1 << 30);
        let (mut table, now) = map.shard(&slot(0));
        for i in 0..(MAX_QUEUES + 4) {
            let life = Duration::from_millis(10 + i as u64);
            table.insert(slot(i), value(true), life, now, true).unwrap();
        }
        assert!(!table.expiries.evictable.heap.is_empty());
        table.expire(now + nanos(Duration::from_millis(15)));
        assert_eq!(table.len(), MAX_QUEUES + 4 - 6);
        table.expire(now + nanos(Duration::from_secs(1)));
        assert_eq!(table.len(), 0);
    }

    /// A full shard keeps evicting for as long as it holds an evictable entry, however many it
    /// evicted before, through queues and heap alike, the oldest first; it refuses only when
    /// every entry is kept. Its expiry items follow its entries.
    #[test]
    fn a_full_shard_evicts_for_as_long_as_something_may_go() {
        let map: ExpiringMap<Value> = ExpiringMap::new(64, 1 << 30);
        let (mut table, now) = map.shard(&slot(0));
        for i in 0..8 {
            table
                .insert(slot(i), value(false), LONG, now, true)
                .unwrap();
        }
        for i in 8..10_000 {
            // Claimed (kept), then completed in place (evictable), a second apart, under lives
            // that overflow the queues into the heap.
            let life = LONG + Duration::from_millis((i % (2 * MAX_QUEUES)) as u64);
            let at = now + i as u64 * 1_000_000_000;
            let evicted = table.insert(slot(i), value(false), LONG, at, true).unwrap();
            assert!(evicted.len() <= 1, "{i}: {evicted:?}");
            table.insert(slot(i), value(true), life, at, false).unwrap();
        }
        assert_eq!(table.len(), 64);
        assert_eq!(table.evictions, 10_000 - 64);
        for i in 0..8 {
            assert!(table.get(&slot(i), now).is_some(), "kept entry {i} evicted");
        }
        // The 56 evictable entries left are the newest.
        for i in 10_000 - 56..10_000 {
            assert!(table.get(&slot(i), now).is_some(), "{i} evicted too early");
        }
        // The claims' items, retired in place, go at the next lock (nothing is due yet).
        table.expire(now);
        assert!(
            table.expiry_items() <= 2 * 64 + 1024,
            "{}",
            table.expiry_items()
        );
        // Only kept entries: full.
        for i in 10_000 - 56..10_000 {
            table.remove(&slot(i));
            table
                .insert(slot(i), value(false), LONG, now, true)
                .unwrap();
        }
        assert!(table.insert(slot(1), value(false), LONG, now, true).is_ok());
        assert!(
            table
                .insert(slot(20_000), value(false), LONG, now, true)
                .is_err()
        );
        assert!(table.oldest_evictable().is_none());
    }

    #[test]
    fn several_shards_lock_in_order() {
        let map: ExpiringMap<Value> = ExpiringMap::new(1 << 20, 1 << 30);
        assert_eq!(map.shards.len(), MAX_SHARDS);
        let slots: Vec<Slot> = (0..8).map(slot).collect();
        let (mut locked, now) = map.lock(&slots);
        for s in &slots {
            locked
                .table(s)
                .insert(*s, value(true), LONG, now, true)
                .unwrap();
        }
        drop(locked);
        assert_eq!(map.len(), 8);
        let age = map.oldest_evictable_age().unwrap();
        assert!(age < Duration::from_secs(5));
    }
}
