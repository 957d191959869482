//! [`MemoryInbox`]: the inbox in one process, every operation one critical section; bounded.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use super::admin::DeadLetter;
use super::admin::{AttemptOutcome, EntryInfo, Filter, InboxAdmin, Page, history, worker_id};
use super::entry::{InboxEntry, Lease};
use super::store::{Enqueued, Failure, InboxCounts, InboxStore, KeyState};
use super::wake::{Announcer, Wakeups};
use crate::order::Position;
use crate::store::{ObjectKey, StoreError, StoreErrorKind, StoreKey, Token};

/// The default bound on entries (dead letters included) and on done keys, each.
const DEFAULT_CAPACITY: usize = 100_000;

/// An inbox held in memory: for one process, tests and the demo.
///
/// Bounded: past `capacity` entries, or `capacity` done keys still within their retention, an
/// enqueue fails with [`StoreErrorKind::Capacity`] (the route answers 503 + `Retry-After`);
/// no entry is ever dropped to make room. Cloning shares the inbox. Its enqueues and re-queues
/// are announced to the workers of the process ([`InboxStore::wakeups`]).
///
/// ```
/// use bytes::Bytes;
/// use http::{Request, StatusCode};
/// use http_body_util::Full;
/// use tower::{ServiceExt, service_fn};
/// use tower_idempotency::inbox::{InboxLayer, InboxStore, MemoryInbox};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let inbox = MemoryInbox::new(1_000);
/// let door = InboxLayer::new(inbox.clone());
/// let route = tower::Layer::layer(&door, service_fn(|_: Request<_>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::new())))
/// }));
/// let delivery = || {
///     let body = Full::new(Bytes::from_static(b"{}"));
///     Request::post("/webhooks").header("idempotency-key", "evt_1").body(body).unwrap()
/// };
/// // Stored and answered at once; the repeat is a duplicate, stored once.
/// let first = route.clone().oneshot(delivery()).await.unwrap();
/// assert_eq!(first.status(), StatusCode::ACCEPTED);
/// let repeat = route.clone().oneshot(delivery()).await.unwrap();
/// assert_eq!(repeat.headers()["idempotent-replayed"], "true");
/// assert_eq!(inbox.counts().await.unwrap().pending, 1);
/// # })
/// ```
#[derive(Clone, Debug)]
pub struct MemoryInbox {
    state: Arc<Mutex<State>>,
    capacity: usize,
    announcer: Announcer,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<StoreKey, Slot>,
    /// Pending entries by next attempt time and leased ones by lease end: what `take` scans.
    due: BTreeSet<(SystemTime, StoreKey)>,
    done: HashMap<StoreKey, Done>,
    objects: HashMap<ObjectKey, Object>,
    /// Taking is paused ([`InboxAdmin::pause`]).
    paused: bool,
}

#[derive(Debug)]
struct Slot {
    entry: InboxEntry,
    phase: Phase,
    /// The attempts, in the stored form the backends share.
    history: String,
}

/// A done key: until when it is kept, and what an operator finds of its entry meanwhile.
#[derive(Debug)]
struct Done {
    until: SystemTime,
    /// The entry without its body and headers.
    entry: InboxEntry,
    history: String,
}

#[derive(Debug)]
enum Phase {
    Pending,
    Leased { token: Token, until: SystemTime },
    Dead { error: String },
}

/// An object's watermark (until when it lasts: the retention of the last completion of one of
/// its entries, as the done keys), its entries that are neither done nor dead, in position
/// order, and the one of them a worker took last, until it settles.
#[derive(Debug, Default)]
struct Object {
    watermark: Option<(Position, SystemTime)>,
    queue: BTreeSet<(Position, StoreKey)>,
    /// The entry in flight: while it is leased (or its lease ran out and nobody settled it),
    /// it is the only entry of the object that can be taken, whatever arrives before it.
    current: Option<StoreKey>,
}

impl Object {
    fn watermark(&self, now: SystemTime) -> Option<Position> {
        self.watermark
            .and_then(|(mark, until)| (until > now).then_some(mark))
    }

    /// Raises the watermark to `position` (an expired one counts as none) and makes it last
    /// until `until`, the retention of this completion (as Redis's `SET .. PX`).
    fn raise(&mut self, position: Position, until: SystemTime, now: SystemTime) {
        let mark = self
            .watermark(now)
            .map_or(position, |mark| mark.max(position));
        self.watermark = Some((mark, until));
    }

    /// Neither an entry waits nor a watermark lasts: nothing to keep.
    fn is_spent(&self, now: SystemTime) -> bool {
        self.queue.is_empty() && self.watermark(now).is_none()
    }
}

impl MemoryInbox {
    /// An inbox of at most `capacity` entries and `capacity` done keys
    /// ([`MemoryInbox::default`]: 100,000 of each).
    pub fn new(capacity: usize) -> Self {
        MemoryInbox {
            state: Arc::default(),
            capacity,
            announcer: Announcer::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves consistent data: each operation
        // checks before it writes.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// An inbox of at most 100,000 entries and 100,000 done keys.
impl Default for MemoryInbox {
    fn default() -> Self {
        MemoryInbox::new(DEFAULT_CAPACITY)
    }
}

impl State {
    fn known(&mut self, key: &StoreKey, now: SystemTime) -> Option<KeyState> {
        if let Some(slot) = self.entries.get(key) {
            return Some(match slot.phase {
                Phase::Pending => KeyState::Queued,
                Phase::Leased { .. } => KeyState::Running,
                Phase::Dead { .. } => KeyState::Dead,
            });
        }
        match self.done.get(key) {
            Some(done) if done.until > now => Some(KeyState::Done),
            Some(_) => {
                self.done.remove(key);
                None
            }
            None => None,
        }
    }

    fn purge_done(&mut self, now: SystemTime) {
        self.done.retain(|_, done| done.until > now);
        self.objects.retain(|_, object| !object.is_spent(now));
    }

    /// Puts `entry` in its object's queue and the due set (pending, due at `at`).
    fn schedule(&mut self, entry: InboxEntry, at: SystemTime, history: String) {
        if let Some(order) = &entry.order {
            let object = self.objects.entry(order.object.clone()).or_default();
            object.queue.insert((order.position, entry.key.clone()));
        }
        self.due.insert((at, entry.key.clone()));
        let key = entry.key.clone();
        let slot = Slot {
            entry,
            phase: Phase::Pending,
            history,
        };
        self.entries.insert(key, slot);
    }

    /// The time under which `key` sits in the due set, if it does.
    fn due_at(slot: &Slot) -> Option<SystemTime> {
        match slot.phase {
            Phase::Pending => Some(slot.entry.next_attempt_at),
            Phase::Leased { until, .. } => Some(until),
            Phase::Dead { .. } => None,
        }
    }

    /// Takes `key`'s slot out of the due set and its object's queue, if `token` holds it.
    fn settle(&mut self, key: &StoreKey, token: &Token) -> Option<Slot> {
        let slot = self.entries.get(key)?;
        if !matches!(&slot.phase, Phase::Leased { token: held, .. } if held == token) {
            return None;
        }
        let slot = self.entries.remove(key)?;
        if let Some(at) = Self::due_at(&slot) {
            self.due.remove(&(at, key.clone()));
        }
        if let Some(order) = &slot.entry.order {
            if let Some(object) = self.objects.get_mut(&order.object) {
                object.queue.remove(&(order.position, key.clone()));
                if object.current.as_ref() == Some(key) {
                    object.current = None;
                }
            }
        }
        Some(slot)
    }

    /// Marks `entry`'s key done until `until`, keeping the entry (without body and headers) and
    /// its attempts for operators.
    fn done_with(&mut self, mut entry: InboxEntry, history: String, until: SystemTime) {
        entry.body = bytes::Bytes::new();
        entry.headers = http::HeaderMap::new();
        let key = entry.key.clone();
        self.done.insert(
            key,
            Done {
                until,
                entry,
                history,
            },
        );
    }

    /// What an operator sees of `key`, if the inbox knows it.
    fn info(&self, key: &StoreKey, now: SystemTime) -> Option<EntryInfo> {
        if let Some(slot) = self.entries.get(key) {
            let (state, until, dead) = match &slot.phase {
                Phase::Pending => (KeyState::Queued, Some(slot.entry.next_attempt_at), None),
                Phase::Leased { until, .. } => (KeyState::Running, Some(*until), None),
                Phase::Dead { error } => (KeyState::Dead, None, Some(error.clone())),
            };
            return Some(EntryInfo::of(
                slot.entry.clone(),
                state,
                until,
                &slot.history,
                dead,
            ));
        }
        let done = self.done.get(key).filter(|done| done.until > now)?;
        let (entry, until) = (done.entry.clone(), Some(done.until));
        Some(EntryInfo::of(
            entry,
            KeyState::Done,
            until,
            &done.history,
            None,
        ))
    }

    /// The watermark of `entry`'s object when the entry is stale against it (the take's rule
    /// for a stale entry).
    fn stale_at_door(&self, entry: &InboxEntry, now: SystemTime) -> Option<Position> {
        let order = entry.order.as_ref()?;
        let mark = self.objects.get(&order.object)?.watermark(now)?;
        order.equal.is_stale(order.position, mark).then_some(mark)
    }

    /// Whether `key` may run now: unordered, or its object's entry in flight (taken over once
    /// its lease ran out), or, with none in flight, its object's first waiting entry; and stale
    /// if it is stale against its object's watermark.
    fn runnable(&self, slot: &Slot, now: SystemTime) -> Option<bool> {
        let Some(order) = &slot.entry.order else {
            return Some(false);
        };
        let object = self.objects.get(&order.object)?;
        let next = match &object.current {
            Some(current) => current,
            None => &object.queue.first()?.1,
        };
        (*next == slot.entry.key).then(|| {
            object
                .watermark(now)
                .is_some_and(|mark| order.equal.is_stale(order.position, mark))
        })
    }

    /// Up to `max` due entries that may run now, each with its due time and whether it is
    /// stale, read in due order only as far as needed (a take costs what it passes over, not
    /// the backlog). One entry per object: once one is chosen, its object's others wait, as
    /// they would once it is taken.
    fn choose(&self, max: usize, now: SystemTime) -> Vec<(SystemTime, StoreKey, bool)> {
        let mut chosen = Vec::new();
        let mut objects = std::collections::HashSet::new();
        for (at, key) in self.due.iter().take_while(|(at, _)| *at <= now) {
            if chosen.len() == max {
                break;
            }
            let Some(slot) = self.entries.get(key) else {
                continue;
            };
            let object = slot.entry.order.as_ref().map(|order| &order.object);
            if object.is_some_and(|object| objects.contains(object)) {
                continue;
            }
            let Some(stale) = self.runnable(slot, now) else {
                continue;
            };
            objects.extend(object);
            chosen.push((*at, key.clone(), stale));
        }
        chosen
    }

    fn take(&mut self, max: usize, lease: Duration, now: SystemTime) -> Vec<Lease> {
        if self.paused {
            return Vec::new();
        }
        let chosen = self.choose(max, now);
        let mut taken = Vec::with_capacity(chosen.len());
        for (at, key, stale) in chosen {
            let Some(slot) = self.entries.get(&key) else {
                continue;
            };
            let token = Token::random();
            let until = now + lease;
            if let Some(order) = &slot.entry.order {
                let object = self.objects.get_mut(&order.object).expect("checked above");
                object.current = Some(key.clone());
            }
            let slot = self.entries.get_mut(&key).expect("checked above");
            slot.entry.attempts += 1;
            slot.phase = Phase::Leased { token, until };
            let started = history::started(slot.entry.attempts, now, worker_id());
            slot.history = history::push(&slot.history, &started);
            let entry = slot.entry.clone();
            self.due.remove(&(at, key.clone()));
            self.due.insert((until, key));
            taken.push(Lease {
                entry,
                token,
                stale,
            });
        }
        taken
    }
}

impl InboxStore for MemoryInbox {
    async fn enqueue(&self, entry: InboxEntry) -> Result<Enqueued, StoreError> {
        let now = SystemTime::now();
        let mut state = self.lock();
        if let Some(known) = state.known(&entry.key, now) {
            return Ok(Enqueued::Duplicate(known));
        }
        if let Some(mark) = state.stale_at_door(&entry, now) {
            return Ok(Enqueued::Stale(mark));
        }
        if state.done.len() >= self.capacity {
            state.purge_done(now);
        }
        if state.entries.len() >= self.capacity || state.done.len() >= self.capacity {
            return Err(StoreError::new(StoreErrorKind::Capacity));
        }
        let at = entry.next_attempt_at;
        state.schedule(entry, at, String::new());
        drop(state);
        self.announcer.announce(at);
        Ok(Enqueued::Queued)
    }

    async fn take(&self, max: usize, lease: Duration) -> Result<Vec<Lease>, StoreError> {
        Ok(self.lock().take(max, lease, SystemTime::now()))
    }

    async fn renew(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let mut state = self.lock();
        let Some(slot) = state.entries.get_mut(key) else {
            return Ok(false);
        };
        let Phase::Leased { token: held, until } = &mut slot.phase else {
            return Ok(false);
        };
        if held != token {
            return Ok(false);
        }
        let (old, new) = (*until, SystemTime::now() + lease);
        *until = new;
        state.due.remove(&(old, key.clone()));
        state.due.insert((new, key.clone()));
        Ok(true)
    }

    /// Every lease under one lock.
    async fn complete(
        &self,
        leases: &[(StoreKey, Token)],
        retention: Duration,
    ) -> Result<Vec<bool>, StoreError> {
        let now = SystemTime::now();
        let mut state = self.lock();
        let done = leases
            .iter()
            .map(|(key, token)| {
                let Some(slot) = state.settle(key, token) else {
                    return false;
                };
                if let Some(order) = &slot.entry.order {
                    let object = state.objects.entry(order.object.clone()).or_default();
                    object.raise(order.position, now + retention, now);
                }
                // Past the bound the key is still marked: an applied entry must never run
                // again within its retention, and the entry it replaces is gone.
                let history = history::end(&slot.history, now, AttemptOutcome::Succeeded);
                state.done_with(slot.entry, history, now + retention);
                true
            })
            .collect();
        Ok(done)
    }

    async fn fail(
        &self,
        key: &StoreKey,
        token: &Token,
        failure: Failure,
    ) -> Result<bool, StoreError> {
        let mut state = self.lock();
        let Some(mut slot) = state.settle(key, token) else {
            return Ok(false);
        };
        let error = match &failure {
            Failure::RetryAt(_, error) | Failure::Dead(error) => error.clone(),
        };
        let now = SystemTime::now();
        slot.history = history::end(&slot.history, now, AttemptOutcome::Failed(error));
        // Announced like an enqueue: a retry at its time; a dead letter now when its object's
        // next entry may go.
        let announce = match failure {
            Failure::RetryAt(at, _error) => {
                slot.entry.next_attempt_at = at;
                state.schedule(slot.entry, at, slot.history);
                Some(at)
            }
            Failure::Dead(error) => {
                let ordered = slot.entry.order.is_some();
                slot.phase = Phase::Dead { error };
                state.entries.insert(key.clone(), slot);
                ordered.then_some(now)
            }
        };
        drop(state);
        if let Some(at) = announce {
            self.announcer.announce(at);
        }
        Ok(true)
    }

    async fn counts(&self) -> Result<InboxCounts, StoreError> {
        let now = SystemTime::now();
        let state = self.lock();
        let mut counts = InboxCounts::default();
        let mut oldest: Option<SystemTime> = None;
        for slot in state.entries.values() {
            match slot.phase {
                Phase::Pending => counts.pending += 1,
                Phase::Leased { until, .. } if until > now => counts.in_flight += 1,
                // A lease that ran out waits for the next worker.
                Phase::Leased { .. } => counts.pending += 1,
                Phase::Dead { .. } => {
                    counts.dead += 1;
                    continue;
                }
            }
            let at = slot.entry.enqueued_at;
            oldest = Some(oldest.map_or(at, |seen| seen.min(at)));
        }
        counts.oldest_age = oldest.map(|at| now.duration_since(at).unwrap_or_default());
        Ok(counts)
    }

    fn wakeups(&self) -> Wakeups {
        self.announcer.subscribe()
    }
}

impl InboxAdmin for MemoryInbox {
    async fn find(&self, key: &StoreKey) -> Result<Option<EntryInfo>, StoreError> {
        Ok(self.lock().info(key, SystemTime::now()))
    }

    async fn list(
        &self,
        filter: &Filter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let now = SystemTime::now();
        let state = self.lock();
        let after = cursor.map(StoreKey::parse);
        let after = match after {
            Some(None) => return Err(StoreError::new(StoreErrorKind::Other)),
            Some(Some(key)) => Some(key),
            None => None,
        };
        // By store key, from the cursor: the keys whose entries match all but the error text,
        // found without building what an operator sees of them (the lock is held), sorted.
        let after = |key: &StoreKey| {
            after
                .as_ref()
                .is_none_or(|after| key.as_str() > after.as_str())
        };
        let live = state.entries.iter().filter(|(key, slot)| {
            let kept = match slot.phase {
                Phase::Pending => KeyState::Queued,
                Phase::Leased { .. } => KeyState::Running,
                Phase::Dead { .. } => KeyState::Dead,
            };
            after(key) && filter.matches_entry(&slot.entry, kept)
        });
        let done = state.done.iter().filter(|(key, done)| {
            done.until > now && after(key) && filter.matches_entry(&done.entry, KeyState::Done)
        });
        let mut keys: Vec<&StoreKey> = live
            .map(|(key, _)| key)
            .chain(done.map(|(key, _)| key))
            .collect();
        keys.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
        let mut entries = Vec::new();
        let mut next = None;
        for key in keys {
            if entries.len() == limit {
                next = entries
                    .last()
                    .map(|info: &EntryInfo| info.entry.key.to_string());
                break;
            }
            if let Some(info) = state.info(key, now).filter(|info| filter.matches(info)) {
                entries.push(filter.listed(info));
            }
        }
        Ok(Page::new(entries, next))
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        let state = self.lock();
        let mut dead: Vec<DeadLetter> = state
            .entries
            .values()
            .filter_map(|slot| match &slot.phase {
                Phase::Dead { error } => Some(DeadLetter {
                    entry: slot.entry.clone(),
                    last_error: error.clone(),
                }),
                _ => None,
            })
            .collect();
        dead.sort_by_key(|letter| letter.entry.enqueued_at);
        dead.truncate(limit);
        Ok(dead)
    }

    async fn requeue(&self, key: &StoreKey) -> Result<bool, StoreError> {
        let mut state = self.lock();
        if !matches!(
            state.entries.get(key),
            Some(Slot {
                phase: Phase::Dead { .. },
                ..
            })
        ) {
            return Ok(false);
        }
        let mut slot = state.entries.remove(key).expect("checked above");
        let now = SystemTime::now();
        slot.entry.attempts = 0;
        slot.entry.next_attempt_at = now;
        state.schedule(slot.entry, now, slot.history);
        drop(state);
        self.announcer.announce(now);
        Ok(true)
    }

    async fn discard(&self, key: &StoreKey, retention: Duration) -> Result<bool, StoreError> {
        let now = SystemTime::now();
        let mut state = self.lock();
        let Some(Slot {
            phase: Phase::Dead { .. },
            ..
        }) = state.entries.get(key)
        else {
            return Ok(false);
        };
        let slot = state.entries.remove(key).expect("checked above");
        if let Some(order) = &slot.entry.order {
            if let Some(object) = state.objects.get_mut(&order.object) {
                object.queue.remove(&(order.position, key.clone()));
            }
        }
        state.done_with(slot.entry, slot.history, now + retention);
        Ok(true)
    }

    async fn pause(&self) -> Result<(), StoreError> {
        self.lock().paused = true;
        Ok(())
    }

    async fn resume(&self) -> Result<(), StoreError> {
        self.lock().paused = false;
        self.announcer.announce(SystemTime::now());
        Ok(())
    }

    async fn is_paused(&self) -> Result<bool, StoreError> {
        Ok(self.lock().paused)
    }
}
