//! [`ClaimGuard`]: the one owner of a request's claim (one key, the items of a batch, or
//! ordered events), from the reserve to its settlement, whatever happens in between
//! (non-success, `Err`, panic, a dropped future, a response body that fails or is dropped);
//! and [`ClaimStore`], where a layer's store type ends.
//!
//! - It **renews** the lease while its owner is alive: the inner service still running, or its
//!   streamed response still being produced. Renewal starts after a third of the lease (fast
//!   requests never pay for it) and runs on a spawned task every third of the lease, so a slow
//!   handler keeps its claim and a crashed one frees the key within about one lease.
//! - It **settles once**: completes (a record) or releases (nothing), or on partial failure of a
//!   batch both, each store call under the store timeout. [`ClaimGuard::settle`] turns how the
//!   attempt ended ([`Ending`]) into those store calls, for the response future and the
//!   streamed body alike.
//! - Settling the claim of a succeeded attempt runs to its end even if the request is dropped
//!   (a settlement cut off is run again from the start on a spawned task: completing and
//!   releasing under the same claim are safe to repeat), and store errors are retried with one
//!   [`Backoff`] while the claim is still alive; a guard dropped unsettled releases in the
//!   background with the same policy. The lease TTL is the backstop when everything fails.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

use crate::IdempotencyStore;
use crate::claim::backoff::Backoff;
use crate::claim::items::BatchItems;
use crate::claim::lease::{self, Lost, Renewed};
use crate::claim::observe::{Observer, Stopwatch, StoreOp};
use crate::claim::policy::Policy;
use crate::fingerprint::Fingerprint;
use crate::store::record::{Record, StoredResponse};
use crate::store::{
    AnyStore, CachedStore, Claim, Completion, LocalCache, Reservation, StoreError, StoreErrorKind,
    StoreKey, Target,
};
use crate::util::in_box;

/// Runs `fut` under the store timeout, or as it is when `timeout` is `None` (the store's client
/// times its own commands no later, see [`IdempotencyStore::command_timeout`]).
///
/// A store that answers on the first poll (the memory store, always) never arms a timer: the
/// deadline is set only if the first poll is pending.
///
/// `fut` is pinned by its caller and taken by reference, as by every step between the guard's
/// call and here: an `async fn` keeps a future passed by value in its own state as well as in
/// the state of the `async fn` it hands it to, so each step taking it by value held one more
/// copy, and the completion's box outgrew the allocator's per-thread cache.
pub(crate) async fn timed<F, T>(
    timeout: Option<Duration>,
    mut fut: Pin<&mut F>,
) -> Result<T, StoreError>
where
    F: Future<Output = Result<T, StoreError>>,
{
    let Some(timeout) = timeout else {
        return fut.await;
    };
    if let Some(result) = crate::util::ready_now(fut.as_mut()).await {
        return result;
    }
    // Only calls still pending after their first poll pay for a timer.
    match tokio::time::timeout(timeout, fut).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::new(StoreErrorKind::Timeout)),
    }
}

/// The guard's retries of a store call: 100 ms, doubling, at most 2 s apart.
fn retries() -> Backoff {
    Backoff::new(Duration::from_millis(100), Duration::from_secs(2))
}

/// How many times a release is tried in the background before the lease TTL is left to
/// free the key.
const RELEASE_TRIES: usize = 4;

/// One value without an allocation, or many: the targets of a claim (one key, or the items of
/// a batch, or ordered events).
#[derive(Clone, Debug)]
pub(crate) enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

impl<T> std::ops::Deref for OneOrMany<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            OneOrMany::One(one) => std::slice::from_ref(one),
            OneOrMany::Many(many) => many,
        }
    }
}

impl<T> IntoIterator for OneOrMany<T> {
    type Item = T;
    type IntoIter = std::iter::Chain<std::option::IntoIter<T>, std::vec::IntoIter<T>>;

    fn into_iter(self) -> Self::IntoIter {
        match self {
            OneOrMany::One(one) => Some(one).into_iter().chain(Vec::new()),
            OneOrMany::Many(many) => None.into_iter().chain(many),
        }
    }
}

/// What a claim is on: one key without an allocation, or several targets (the keys of a
/// batch's items, ordered events).
pub(crate) type Targets = OneOrMany<Target>;

impl Targets {
    /// The targets whose flag in `keep` is set, in order.
    fn select(&self, keep: &[bool]) -> Targets {
        let kept = self.iter().zip(keep).filter(|(_, keep)| **keep);
        OneOrMany::Many(kept.map(|(target, _)| target.clone()).collect())
    }

    /// The one key of a single-key claim or of a single ordered event (what the request's
    /// span names).
    pub(crate) fn single_key(&self) -> Option<&StoreKey> {
        match &self[..] {
            [target] if matches!(self, OneOrMany::One(_)) || target.order.is_some() => {
                Some(&target.key)
            }
            _ => None,
        }
    }
}

/// The state of one claim, shared by the guard, its settlement and its background tasks
/// (renewal, release): the one allocation of a claim.
struct ClaimState {
    /// The layer's store, shared by every claim the layer opens.
    store: Arc<dyn ErasedStore>,
    observer: Observer,
    claim: Claim,
    lease: Duration,
    retention: Duration,
    /// The store timeout the layer arms itself: `None` when the store's client times its
    /// commands no later ([`IdempotencyStore::command_timeout`]).
    timeout: Option<Duration>,
    /// Every target asked for.
    asked: Targets,
    /// The targets acquired, when not all of them were (set once the reserve answered).
    acquired: OnceLock<Targets>,
    /// Settled or dropped: the renewal task stops.
    stopped: AtomicBool,
    /// The renewal task was spawned.
    renewing: AtomicBool,
    /// Whether a settlement ends well within the lease: each of its store calls is bounded by
    /// the store timeout (twice that for a script sent again after `NOSCRIPT`), and twice the
    /// store timeout is shorter than the lease. Such a settlement needs no renewal timer of
    /// the request's (its retries start the renewal themselves).
    quick_settle: bool,
    /// The settlement began, and it is quick: the request no longer arms a renewal timer.
    settling: AtomicBool,
    /// Until when the claim is surely ours (nanoseconds since [`EPOCH`]): the lease from the
    /// reserve or from the last renewal. A failed completion is retried until then.
    alive_until: AtomicU64,
}

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

fn nanos_since_epoch(at: Instant) -> u64 {
    at.saturating_duration_since(*EPOCH).as_nanos() as u64
}

impl ClaimState {
    /// The targets this claim may hold: before the reserve answered, every one asked for;
    /// after, those acquired.
    fn held(&self) -> &Targets {
        self.acquired.get().unwrap_or(&self.asked)
    }

    /// The targets `subset` names.
    fn targets<'a>(&'a self, subset: &'a Subset) -> &'a Targets {
        match subset {
            Subset::Held => self.held(),
            Subset::These(targets) => targets,
        }
    }

    fn alive_until(&self) -> Instant {
        *EPOCH + Duration::from_nanos(self.alive_until.load(Ordering::Acquire))
    }

    fn extend(&self, from: Instant) {
        self.alive_until
            .store(nanos_since_epoch(from + self.lease), Ordering::Release);
    }

    /// Claims every held target; `started`: when the caller read the clock for this call.
    fn reserve(&self, started: Instant) -> BoxFuture<'_, Reserved> {
        self.store.reserve(self, self.held(), started)
    }

    /// Records `record` for the targets of `subset`.
    fn complete<'a>(
        &'a self,
        subset: &'a Subset,
        record: &'a Record,
    ) -> BoxFuture<'a, Result<Vec<Completion>, StoreError>> {
        self.store.complete(self, self.targets(subset), record)
    }

    /// Releases the targets of `subset`.
    fn release<'a>(&'a self, subset: &'a Subset) -> BoxFuture<'a, Result<usize, StoreError>> {
        self.store.release(self, self.targets(subset))
    }

    /// Extends the lease of every held target; `started`: when the caller read the clock.
    fn renew(&self, started: Instant) -> BoxFuture<'_, Result<bool, StoreError>> {
        self.store.renew(self, self.held(), started)
    }

    /// Stops the renewal task (at its next tick).
    fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
    }
}

/// Which targets of a claim a store call is about.
#[derive(Clone)]
enum Subset {
    /// Every target the claim holds.
    Held,
    /// These (some of the held targets).
    These(Targets),
}

/// What a reserve answers, and when it ended if that was measured.
type Reserved = (Result<Vec<Reservation>, StoreError>, Option<Instant>);

/// The crate's one erasure of a record store's type, so that services, futures, bodies and
/// background tasks do not carry it: the four operations of the record contract over a claim's
/// targets, each under the claim's store timeout and observed, one box per store call. Built
/// once per layer (or `Idempotent`), shared by every claim it opens.
trait ErasedStore: Send + Sync + 'static {
    /// The store timeout the layer arms itself for a configured `timeout` (see
    /// [`layer_timeout`]).
    fn timeout(&self, timeout: Duration) -> Option<Duration>;

    /// The same record store behind `cache` instead (`None`, or a cache that is off: none).
    fn with_cache(&self, cache: Option<LocalCache>) -> ClaimStore;

    fn reserve<'a>(
        &'a self,
        state: &'a ClaimState,
        targets: &'a [Target],
        started: Instant,
    ) -> BoxFuture<'a, Reserved>;

    fn complete<'a>(
        &'a self,
        state: &'a ClaimState,
        targets: &'a [Target],
        record: &'a Record,
    ) -> BoxFuture<'a, Result<Vec<Completion>, StoreError>>;

    fn release<'a>(
        &'a self,
        state: &'a ClaimState,
        targets: &'a [Target],
    ) -> BoxFuture<'a, Result<usize, StoreError>>;

    fn renew<'a>(
        &'a self,
        state: &'a ClaimState,
        targets: &'a [Target],
        started: Instant,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
}

/// A record store `St` as the layer calls it: `front`, the store itself or the store behind
/// the layer's local cache; `store`, the store as given, which [`ErasedStore::with_cache`]
/// puts behind another cache.
struct Erased<St, Front> {
    store: St,
    front: Front,
}

impl<St: IdempotencyStore, Front: IdempotencyStore> Erased<St, Front> {
    /// Runs one store call under the timeout, and observes it. `started`: when the caller
    /// already read the clock for this call (one read instead of two).
    async fn call<F, T>(
        &self,
        state: &ClaimState,
        op: StoreOp,
        started: Option<Instant>,
        fut: Pin<&mut F>,
    ) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        self.call_timed(state, op, started, fut).await.0
    }

    /// [`call`](Self::call), and when the call ended if that was measured.
    async fn call_timed<F, T>(
        &self,
        state: &ClaimState,
        op: StoreOp,
        started: Option<Instant>,
        fut: Pin<&mut F>,
    ) -> (Result<T, StoreError>, Option<Instant>)
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        let observer = &state.observer;
        if self.front.in_process() {
            // Not timed (see `IdempotencyStore::in_process`). Its end is still read for the
            // step timed after it (the inner service after a reserve), when there is one: a
            // full memory store making room takes long enough to show otherwise.
            let result = timed(state.timeout, fut).await;
            observer.store_call(op, Stopwatch::OFF, result.is_ok());
            let ended = started.and_then(|_| observer.stopwatch().started());
            return (result, ended);
        }
        let timer = match started {
            Some(at) => observer.stopwatch_from(at),
            None => observer.stopwatch(),
        };
        let result = timed(state.timeout, fut).await;
        let ended = observer.store_call(op, timer, result.is_ok());
        (result, ended)
    }
}

impl<St: IdempotencyStore, Front: IdempotencyStore> ErasedStore for Erased<St, Front> {
    fn timeout(&self, timeout: Duration) -> Option<Duration> {
        layer_timeout(&self.front, timeout)
    }

    fn with_cache(&self, cache: Option<LocalCache>) -> ClaimStore {
        ClaimStore::on(self.store.clone(), cache)
    }

    fn reserve<'a>(
        &'a self,
        state: &'a ClaimState,
        targets: &'a [Target],
        started: Instant,
    ) -> BoxFuture<'a, Reserved> {
        in_box(|| async move {
            let call = pin!(self.front.reserve(targets, &state.claim, state.lease));
            self.call_timed(state, StoreOp::Reserve, Some(started), call)
                .await
        })
    }

    fn complete<'a>(
        &'a self,
        state: &'a ClaimState,
        targets: &'a [Target],
        record: &'a Record,
    ) -> BoxFuture<'a, Result<Vec<Completion>, StoreError>> {
        in_box(|| async move {
            let call = pin!(
                self.front
                    .complete(targets, &state.claim, record, state.retention)
            );
            self.call(state, StoreOp::Complete, None, call).await
        })
    }

    fn release<'a>(
        &'a self,
        state: &'a ClaimState,
        targets: &'a [Target],
    ) -> BoxFuture<'a, Result<usize, StoreError>> {
        in_box(|| async move {
            let call = pin!(self.front.release(targets, &state.claim));
            self.call(state, StoreOp::Release, None, call).await
        })
    }

    fn renew<'a>(
        &'a self,
        state: &'a ClaimState,
        targets: &'a [Target],
        started: Instant,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        in_box(|| async move {
            let call = pin!(self.front.renew(targets, &state.claim, state.lease));
            self.call(state, StoreOp::Renew, Some(started), call).await
        })
    }
}

/// Where a layer's store type ends: the record store (behind its local cache, when it has
/// one) with its type erased, built once per layer, on which each request opens a
/// [`ClaimGuard`]. Cheap to clone (an `Arc`).
#[derive(Clone)]
pub(crate) struct ClaimStore(Arc<dyn ErasedStore>);

impl ClaimStore {
    /// Claims on `store`, behind a [`LocalCache::new`] when the store talks to a server (it is
    /// not [`in_process`](IdempotencyStore::in_process)).
    pub(crate) fn new<St: IdempotencyStore>(store: St) -> Self {
        let cache = (!store.in_process()).then(LocalCache::new);
        Self::on(store, cache)
    }

    /// Claims on `store`, behind `cache` when there is one and it is on.
    ///
    /// An [`AnyStore`] hides its backend's type already: its backend's store is the one erased
    /// here, so that each call goes through one indirection (and one boxed future), not two.
    pub(crate) fn on<St: IdempotencyStore>(store: St, cache: Option<LocalCache>) -> Self {
        if let Some(any) = (&store as &dyn std::any::Any).downcast_ref::<AnyStore>() {
            return any.claims(cache);
        }
        match cache.filter(LocalCache::is_on) {
            Some(cache) => ClaimStore(Arc::new(Erased {
                front: CachedStore::with_cache(store.clone(), cache),
                store,
            })),
            None => ClaimStore(Arc::new(Erased {
                front: store.clone(),
                store,
            })),
        }
    }

    /// The same store behind `cache` instead (`None`, or a cache that is off: none).
    pub(crate) fn with_cache(&self, cache: Option<LocalCache>) -> Self {
        self.0.with_cache(cache)
    }

    /// A guard for `claim` on `targets`, not yet reserved.
    pub(crate) fn open(&self, targets: Targets, claim: Claim, policy: &Policy) -> ClaimGuard {
        let state = ClaimState {
            store: self.0.clone(),
            observer: policy.observer.clone(),
            claim,
            lease: policy.lease,
            retention: policy.retention,
            timeout: self.0.timeout(policy.store_timeout),
            asked: targets,
            acquired: OnceLock::new(),
            stopped: AtomicBool::new(false),
            renewing: AtomicBool::new(false),
            quick_settle: policy.store_timeout.saturating_mul(2) < policy.lease,
            settling: AtomicBool::new(false),
            alive_until: AtomicU64::new(0),
        };
        ClaimGuard {
            state: Arc::new(state),
            items: None,
            grpc: false,
            settled: false,
            reserved_at: None,
        }
    }
}

/// The store timeout the layer has to arm itself: none when the store's client already times
/// out each command within it.
fn layer_timeout<St: IdempotencyStore>(store: &St, timeout: Duration) -> Option<Duration> {
    match store.command_timeout() {
        Some(own) if own <= timeout => None,
        _ => Some(timeout),
    }
}

/// How an attempt ended, as far as its claim is concerned.
pub(crate) enum Ending {
    /// It succeeded: record every held target, with the response to replay when there is one
    /// (a batch records acks only).
    Succeeded(Option<Box<StoredResponse>>),
    /// It failed: release every held target, except the batch items the handler reported done
    /// ([`BatchItems::mark_done`]) and the stale ones acknowledged, which get an ack record.
    Failed,
}

/// The owner of one request's claim. See the [module docs](self).
pub(crate) struct ClaimGuard {
    state: Arc<ClaimState>,
    /// The batch items handed to the inner service, for partial failures.
    items: Option<BatchItems>,
    /// The request was a gRPC call (success is its final `grpc-status`).
    grpc: bool,
    settled: bool,
    /// When the last reserve ended, if that was measured.
    reserved_at: Option<Instant>,
}

impl std::fmt::Debug for ClaimGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimGuard")
            .field("settled", &self.settled)
            .finish_non_exhaustive()
    }
}

impl ClaimGuard {
    /// Marks the request as a gRPC call.
    pub(crate) fn set_grpc(&mut self, grpc: bool) {
        self.grpc = grpc;
    }

    /// Whether the request was a gRPC call.
    pub(crate) fn is_grpc(&self) -> bool {
        self.grpc
    }

    /// Claims every target (again: targets this claim already holds answer as acquired).
    /// Until [`keep`](Self::keep) or a settlement, dropping the guard releases them all: a
    /// reserve that failed or was cut off may still have landed.
    pub(crate) async fn reserve(&mut self) -> Result<Vec<Reservation>, StoreError> {
        let started = Instant::now();
        let (result, ended) = self.state.reserve(started).await;
        self.state.extend(started);
        self.reserved_at = ended;
        result
    }

    /// The reserve, repeated while another attempt holds one of the targets (a key held by
    /// an attempt with the same `fingerprint`, or a busy object) and `wait` allows another try:
    /// the one wait for an attempt in flight, of every door. Pauses start at 10 ms and double
    /// up to 250 ms; the last answers are returned as they are, busy or not.
    pub(crate) async fn reserve_waiting(
        &mut self,
        wait: Option<Duration>,
        fingerprint: &Fingerprint,
    ) -> Result<Vec<Reservation>, StoreError> {
        let deadline = wait.map(|wait| Instant::now() + wait);
        let mut pauses = Backoff::new(Duration::from_millis(10), Duration::from_millis(250));
        loop {
            let answers = self.reserve().await?;
            let busy = answers.iter().any(|answer| match answer {
                Reservation::InFlight { fingerprint: held } => held.matches(fingerprint),
                Reservation::ObjectBusy => true,
                _ => false,
            });
            let pause = pauses.pause();
            if !(busy && deadline.is_some_and(|d| Instant::now() + pause < d)) {
                return Ok(answers);
            }
            // Boxed: the timer would otherwise sit in every caller's future, waiting or not.
            Box::pin(tokio::time::sleep(pause)).await;
        }
    }

    /// Starts timing the inner service: from the end of the reserve, when that was measured
    /// (one clock read for both).
    pub(crate) fn inner_stopwatch(&self) -> Stopwatch {
        Stopwatch::started_at(self.reserved_at)
    }

    /// Keeps the targets whose reservation is this claim's (acquired, or acquired and stale);
    /// the others are not this claim's to settle.
    pub(crate) fn keep(&mut self, reservations: &[Reservation]) {
        if reservations.iter().all(Reservation::is_ours) {
            // Every target asked for is held: nothing to copy.
            return;
        }
        let state = &self.state;
        let mask: Vec<bool> = reservations.iter().map(Reservation::is_ours).collect();
        // Set once: a guard keeps its targets once, after its reserve.
        let _ = state.acquired.set(state.asked.select(&mask));
    }

    /// Holds nothing any more: what a reserve that surely wrote nothing leaves (the memory
    /// store refusing a new key when full).
    pub(crate) fn forget(mut self) {
        self.settled = true;
    }

    /// The claim (its token and fingerprint).
    #[cfg(any(feature = "postgres", feature = "sqlite"))] // For `once_in_tx` only.
    pub(crate) fn claim(&self) -> &Claim {
        &self.state.claim
    }

    /// The claim was settled by a statement the guard did not run (a completion in the
    /// caller's transaction, committed): nothing more to write; the renewal stops.
    #[cfg(any(feature = "postgres", feature = "sqlite"))] // For `once_in_tx` only.
    pub(crate) fn settled_outside(mut self) {
        self.settled = true;
        self.state.stop();
    }

    /// Hands the batch items to the guard, for [`Ending::Failed`].
    pub(crate) fn set_items(&mut self, items: BatchItems) {
        self.items = Some(items);
    }

    /// A handle that starts the renewal of this claim when its owner turns out slow.
    pub(crate) fn renewal(&self) -> Renewal {
        Renewal(self.state.clone())
    }

    /// Releases every held target now (one try; the background path retries).
    pub(crate) async fn release(mut self) {
        self.settled = true;
        self.state.stop();
        if self.state.held().is_empty() {
            return;
        }
        if let Err(err) = self.state.release(&Subset::Held).await {
            tracing::warn!(error = %err, "could not release an idempotency claim; retrying in the background");
            release_in_background(self.state.clone(), Subset::Held, 1);
        }
    }

    /// Settles the claim as `ending` says: records on success, releases on failure (recording
    /// the batch items reported done). Once this is called, the settlement runs to its end
    /// even if the returned future is dropped.
    pub(crate) fn settle(mut self, ending: Ending) -> impl Future<Output = ()> + use<> {
        self.settled = true;
        let claim = self.state.clone();
        let state = &*claim;
        if state.quick_settle {
            state.settling.store(true, Ordering::Relaxed);
        }
        // Owned by the claim, so that a store keeping `record.encode()` as it is (one outside
        // the crate) recognises a retried completion with `is_owned_by`.
        let token = state.claim.token();
        let ack = || Record::ack(state.claim.fingerprint()).owned_by(token);
        let (record, release) = match ending {
            Ending::Succeeded(response) => {
                let record = match response {
                    Some(response) if self.items.is_none() => {
                        Record::replay(state.claim.fingerprint(), *response).owned_by(token)
                    }
                    _ => ack(),
                };
                (Some((Subset::Held, record)), None)
            }
            Ending::Failed => match self.items.as_ref().map(BatchItems::done_mask) {
                // Items reported done are recorded, the others released.
                Some(done) if done.contains(&true) => {
                    let held = state.held();
                    let undone: Vec<bool> = done.iter().map(|d| !d).collect();
                    let release = undone
                        .contains(&true)
                        .then(|| Subset::These(held.select(&undone)));
                    (Some((Subset::These(held.select(&done)), ack())), release)
                }
                _ => (None, Some(Subset::Held)),
            },
        };
        // Dropped before its end (the request future was dropped), the settlement starts
        // again on a spawned task: writing a record twice or releasing a key twice under the
        // same claim changes nothing, so a new run from the start finishes what this one began.
        // What was decided is prepared here, outside the future, which then holds only that.
        let pending = SettleOnDrop(Some(Settle {
            claim,
            record,
            release,
        }));
        async move {
            if let Some(settle) = &pending.0 {
                settle.run().await;
            }
            pending.disarm();
        }
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        self.state.stop();
        if !self.state.held().is_empty() {
            release_in_background(self.state.clone(), Subset::Held, 0);
        }
    }
}

/// What a settlement does: write `record` for its targets, then release `release`.
struct Settle {
    claim: Arc<ClaimState>,
    record: Option<(Subset, Record)>,
    release: Option<Subset>,
}

impl Settle {
    /// Writes the record, retrying store errors while the claim is alive, then releases;
    /// stops the renewal at the end.
    async fn run(&self) {
        let claim = &self.claim;
        if let Some((subset, record)) = &self.record {
            complete_with_retries(claim, subset, record).await;
        }
        claim.stop();
        if let Some(subset) = &self.release {
            if let Err(err) = claim.release(subset).await {
                tracing::warn!(error = %err, "could not release an idempotency claim; retrying in the background");
                release_in_background(claim.clone(), subset.clone(), 1);
            }
        }
    }
}

/// A settlement that runs again, from the start, on a spawned task if it is dropped before
/// its end (outside a Tokio runtime, the lease TTL frees the keys).
struct SettleOnDrop(Option<Settle>);

impl SettleOnDrop {
    /// The settlement ran to its end: nothing to do on drop.
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for SettleOnDrop {
    fn drop(&mut self) {
        // The runtime is looked up only for a settlement cut off: a disarmed one (every
        // settlement that ran to its end) needs none.
        let Some(settle) = self.0.take() else {
            return;
        };
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move { settle.run().await });
        }
    }
}

async fn complete_with_retries(claim: &Arc<ClaimState>, subset: &Subset, record: &Record) {
    let mut backoff = retries();
    let mut retried = false;
    loop {
        match claim.complete(subset, record).await {
            Ok(answers) => {
                if answers.contains(&Completion::Lost) {
                    tracing::warn!(
                        "idempotency claim lost before completion (its lease expired without \
                         renewal, or the store lost it); the key was not recorded"
                    );
                    claim.observer.lease_lost();
                } else if retried {
                    tracing::info!("idempotency key recorded on a retry");
                }
                return;
            }
            Err(err) if err.kind() == StoreErrorKind::NotReplicated => {
                // Written on the primary: writing again would change nothing.
                return tracing::error!(error = %err, "idempotency record not replicated");
            }
            Err(err) => {
                let pause = backoff.pause();
                if Instant::now() + pause >= claim.alive_until() {
                    return tracing::error!(
                        error = %err,
                        "gave up recording a completed idempotency key: its lease ran out; a \
                         duplicate may run again"
                    );
                }
                tracing::warn!(error = %err, "could not record a completed idempotency key; retrying");
                // The claim is kept while the record is retried (a quick settlement had no
                // renewal timer of the request's to start it).
                Renewal(claim.clone()).start();
                retried = true;
                // Boxed: a timer is large, and this future lives inline in every request's.
                Box::pin(tokio::time::sleep(pause)).await;
            }
        }
    }
}

/// Releases `subset` from a spawned task, trying up to [`RELEASE_TRIES`] times (`tried`
/// already done). A release of a claim that never landed, or was already released, changes
/// nothing; a reserve still queued in a reconnecting client lands before the later tries.
fn release_in_background(claim: Arc<ClaimState>, subset: Subset, tried: usize) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return tracing::warn!(
            "idempotency claim dropped outside a Tokio runtime; it expires with its lease"
        );
    };
    handle.spawn(async move {
        let mut backoff = retries();
        for attempt in tried..RELEASE_TRIES {
            if attempt > 0 {
                tokio::time::sleep(backoff.pause()).await;
            }
            if claim.release(&subset).await.is_ok() {
                return;
            }
        }
        tracing::error!("could not release an idempotency claim; it expires with its lease");
    });
}

/// Starts the renewal of a claim whose owner is still busy after a third of the lease.
#[derive(Clone)]
pub(crate) struct Renewal(Arc<ClaimState>);

impl Renewal {
    /// The first renewal is due this long after the claim.
    pub(crate) fn interval(&self) -> Duration {
        self.0.lease / 3
    }

    /// Whether the request should still time its renewal: not once a quick settlement began
    /// (see `ClaimState::quick_settle`).
    pub(crate) fn timed_by_request(&self) -> bool {
        !self.0.settling.load(Ordering::Relaxed)
    }

    /// Stops the renewal (at its next tick), before a settlement the guard does not run:
    /// a renewal that meets the claim already completed then ends quietly.
    #[cfg(any(feature = "postgres", feature = "sqlite"))] // For `once_in_tx` only.
    pub(crate) fn stop(&self) {
        self.0.stop();
    }

    /// Spawns the renewal task, once.
    pub(crate) fn start(&self) {
        let state = &self.0;
        if state.stopped.load(Ordering::Acquire) || state.renewing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        handle.spawn(renew_while_alive(self.0.clone()));
    }
}

async fn renew_while_alive(state: Arc<ClaimState>) {
    let lease = state.lease;
    // Started a third of a lease after the claim: the first renewal is due now.
    let renew = |sent: tokio::time::Instant| {
        let state = &state;
        async move {
            if state.stopped.load(Ordering::Acquire) {
                return Renewed::Stopped;
            }
            let started = sent.into_std();
            match state.renew(started).await {
                Ok(true) => {
                    state.extend(started);
                    Renewed::Held
                }
                Ok(false) if state.stopped.load(Ordering::Acquire) => Renewed::Stopped,
                Ok(false) => Renewed::Gone,
                Err(err) => {
                    tracing::warn!(error = %err, "could not renew an idempotency claim; retrying");
                    Renewed::Failed
                }
            }
        }
    };
    // Unfenced: the owner, a request or a job, cannot be interrupted; a lost claim is said.
    if lease::keep(lease, tokio::time::Instant::now(), None, renew).await == Lost::TakenOver {
        tracing::error!(
            "idempotency claim lost while its owner was still running (the store lost it, or a \
             renewal came too late): a duplicate may run meanwhile"
        );
        state.observer.lease_lost();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::layer_timeout;
    use crate::MemoryStore;
    use crate::store::{CachedStore, LocalCache};
    use crate::test_util::store::{Hook, Hooked};

    /// A store that reports a client command timeout (`.0`).
    #[derive(Clone)]
    struct Timed(Option<Duration>);

    impl Hook for Timed {
        fn command_timeout(&self) -> Option<Duration> {
            self.0
        }
    }

    #[test]
    fn the_layer_times_a_call_unless_the_client_does_so_no_later() {
        let ms = Duration::from_millis;
        let store = |own| Hooked {
            store: MemoryStore::new(),
            hook: Timed(own),
        };
        assert_eq!(layer_timeout(&store(Some(ms(2000))), ms(2000)), None);
        assert_eq!(layer_timeout(&store(Some(ms(500))), ms(2000)), None);
        assert_eq!(
            layer_timeout(&store(Some(ms(2001))), ms(2000)),
            Some(ms(2000))
        );
        assert_eq!(layer_timeout(&store(None), ms(2000)), Some(ms(2000)));
        assert_eq!(layer_timeout(&MemoryStore::new(), ms(2000)), Some(ms(2000)));
        // Through the local cache, as the layer calls it.
        let cached = CachedStore::with_cache(store(Some(ms(400))), LocalCache::new());
        assert_eq!(layer_timeout(&cached, ms(2000)), None);
    }
}
