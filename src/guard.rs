//! [`ClaimGuard`]: the one owner of a request's claim (one key, or the items of a batch), from
//! the reserve to its settlement, whatever happens in between (non-success, `Err`, panic, a
//! dropped future, a response body that fails or is dropped).
//!
//! - It **renews** the lease while its owner is alive: the inner service still running, or its
//!   streamed response still being produced. Renewal starts after a third of the lease (fast
//!   requests never pay for it) and runs on a spawned task every third of the lease, so a slow
//!   handler keeps its claim and a crashed one frees the key within about one lease.
//! - It **settles once**: completes (a record) or releases (nothing), or on partial failure of a
//!   batch both, each store call under the store timeout.
//! - Settling the claim of a succeeded attempt runs to its end even if the request is dropped
//!   (a settlement cut off is run again from the start on a spawned task: completing and
//!   releasing under the same claim are safe to repeat), and store errors are retried with one
//!   [`Backoff`] while the claim is still alive; a guard dropped unsettled releases in the
//!   background with the same policy. The lease TTL is the backstop when everything fails.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};
use std::task::Poll;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

use crate::items::BatchItems;
use crate::observe::{Observer, Stopwatch, StoreOp};
use crate::store::record::Record;
use crate::store::{
    Claim, Completion, IdempotencyStore, Reservation, StoreError, StoreErrorKind, StoreKey,
};

/// Runs `fut` under the store timeout.
///
/// A store that answers on the first poll (the memory store, always) never arms a timer: the
/// deadline is set only if the first poll is pending.
pub(crate) async fn timed<T>(
    timeout: Duration,
    fut: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let mut fut = std::pin::pin!(fut);
    if let Poll::Ready(result) = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await
    {
        return result;
    }
    // Boxed: only calls still pending after their first poll pay for a timer, and the future
    // of every store call stays small.
    match Box::pin(tokio::time::timeout(timeout, fut)).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::new(StoreErrorKind::Timeout)),
    }
}

/// The one retry policy of the guard: 100 ms, doubling, at most 2 s apart.
#[derive(Clone, Copy, Debug)]
struct Backoff {
    next: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(2);

    fn new() -> Self {
        Backoff { next: Self::FIRST }
    }

    /// The pause before the next try.
    fn pause(&mut self) -> Duration {
        let pause = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        pause
    }
}

/// How many times a release is tried in the background before the lease TTL is left to
/// free the key.
const RELEASE_TRIES: usize = 4;

/// The settings of one claim, shared by the guard, its store calls and its renewal task.
struct Common {
    observer: Observer,
    claim: Claim,
    lease: Duration,
    retention: Duration,
    timeout: Duration,
    /// Every key asked for.
    asked: OneOrMany<StoreKey>,
    /// The keys acquired, when not all of them were (set once the reserve answered).
    acquired: OnceLock<Vec<StoreKey>>,
    /// Settled or dropped: the renewal task stops.
    stopped: AtomicBool,
    /// The renewal task was spawned.
    renewing: AtomicBool,
    /// Until when the claim is surely ours (nanoseconds since [`EPOCH`]): the lease from the
    /// reserve or from the last renewal. A failed completion is retried until then.
    alive_until: AtomicU64,
}

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

fn nanos_since_epoch(at: Instant) -> u64 {
    at.saturating_duration_since(*EPOCH).as_nanos() as u64
}

impl Common {
    /// The keys this claim may hold: before the reserve answered, every key asked for; after,
    /// those acquired.
    fn held(&self) -> &[StoreKey] {
        match self.acquired.get() {
            Some(acquired) => acquired,
            None => &self.asked,
        }
    }

    /// The keys `which` names.
    fn keys<'a>(&'a self, which: &'a Which) -> &'a [StoreKey] {
        match which {
            Which::Held => self.held(),
            Which::These(keys) => keys,
        }
    }

    fn alive_until(&self) -> Instant {
        *EPOCH + Duration::from_nanos(self.alive_until.load(Ordering::Acquire))
    }

    fn extend(&self, from: Instant) {
        self.alive_until
            .store(nanos_since_epoch(from + self.lease), Ordering::Release);
    }
}

/// Which keys of a claim a store call is about.
#[derive(Clone)]
enum Which {
    /// Every key the claim holds.
    Held,
    /// These (a subset of the held keys).
    These(Vec<StoreKey>),
}

/// One value without an allocation, or many: the keys of a claim (one, or the items of a
/// batch), and the answers of a store call (one per key).
#[derive(Debug)]
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

/// The store calls of one claim, with the store type erased so that futures and bodies do
/// not carry it. One box per store call.
trait Ops: Send + Sync + 'static {
    fn common(&self) -> &Common;
    fn reserve(self: Arc<Self>, started: Instant) -> BoxFuture<'static, Reserved>;
    fn complete(
        self: Arc<Self>,
        which: Which,
        record: Record,
    ) -> BoxFuture<'static, Result<OneOrMany<Completion>, StoreError>>;
    fn release(self: Arc<Self>, which: Which) -> BoxFuture<'static, Result<usize, StoreError>>;
    fn renew(self: Arc<Self>, started: Instant) -> BoxFuture<'static, Result<bool, StoreError>>;
}

struct StoreClaim<St> {
    common: Common,
    store: St,
}

impl<St: IdempotencyStore> StoreClaim<St> {
    /// Runs one store call under the timeout, and observes it. `started`: when the caller
    /// already read the clock for this call (one read instead of two).
    async fn call<T>(
        &self,
        op: StoreOp,
        started: Option<Instant>,
        fut: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.call_timed(op, started, fut).await.0
    }

    /// [`call`](Self::call), and when the call ended if that was measured.
    async fn call_timed<T>(
        &self,
        op: StoreOp,
        started: Option<Instant>,
        fut: impl Future<Output = Result<T, StoreError>>,
    ) -> (Result<T, StoreError>, Option<Instant>) {
        let observer = &self.common.observer;
        if self.store.in_process() {
            // Not timed (see `IdempotencyStore::in_process`). Its end is still read for the
            // step timed after it (the inner service after a reserve), when there is one: a
            // full memory store making room takes long enough to show otherwise.
            let result = timed(self.common.timeout, fut).await;
            observer.store_call(op, Stopwatch::OFF, result.is_ok());
            let ended = started.and_then(|_| observer.stopwatch().started());
            return (result, ended);
        }
        let timer = match started {
            Some(at) => observer.stopwatch_from(at),
            None => observer.stopwatch(),
        };
        let result = timed(self.common.timeout, fut).await;
        let ended = observer.store_call(op, timer, result.is_ok());
        (result, ended)
    }
}

impl<St: IdempotencyStore> Ops for StoreClaim<St> {
    fn common(&self) -> &Common {
        &self.common
    }

    fn reserve(self: Arc<Self>, started: Instant) -> BoxFuture<'static, Reserved> {
        Box::pin(async move {
            let c = &self.common;
            if let [key] = c.held() {
                let one = self.store.reserve(key, &c.claim, c.lease);
                let (result, ended) = self.call_timed(StoreOp::Reserve, Some(started), one).await;
                return (result.map(OneOrMany::One), ended);
            }
            // Batches are rare: their (large) futures are boxed apart, so that the box of a
            // single-key call stays small.
            let many = Box::pin(self.store.reserve_many(c.held(), &c.claim, c.lease));
            let (result, ended) = self.call_timed(StoreOp::Reserve, Some(started), many).await;
            (result.map(OneOrMany::Many), ended)
        })
    }

    fn complete(
        self: Arc<Self>,
        which: Which,
        record: Record,
    ) -> BoxFuture<'static, Result<OneOrMany<Completion>, StoreError>> {
        Box::pin(async move {
            let c = &self.common;
            let keys = c.keys(&which);
            if let [key] = keys {
                let one = self.store.complete(key, &c.claim, &record, c.retention);
                return self
                    .call(StoreOp::Complete, None, one)
                    .await
                    .map(OneOrMany::One);
            }
            let many = Box::pin(
                self.store
                    .complete_many(keys, &c.claim, &record, c.retention),
            );
            self.call(StoreOp::Complete, None, many)
                .await
                .map(OneOrMany::Many)
        })
    }

    fn release(self: Arc<Self>, which: Which) -> BoxFuture<'static, Result<usize, StoreError>> {
        Box::pin(async move {
            let c = &self.common;
            let keys = c.keys(&which);
            if let [key] = keys {
                let one = self.store.release(key, &c.claim);
                return self
                    .call(StoreOp::Release, None, one)
                    .await
                    .map(usize::from);
            }
            let many = Box::pin(self.store.release_many(keys, &c.claim));
            self.call(StoreOp::Release, None, many).await
        })
    }

    fn renew(self: Arc<Self>, started: Instant) -> BoxFuture<'static, Result<bool, StoreError>> {
        Box::pin(async move {
            let c = &self.common;
            if let [key] = c.held() {
                let one = self.store.renew(key, &c.claim, c.lease);
                return self.call(StoreOp::Renew, Some(started), one).await;
            }
            let many = Box::pin(self.store.renew_many(c.held(), &c.claim, c.lease));
            self.call(StoreOp::Renew, Some(started), many).await
        })
    }
}

/// What a reserve answers, and when it ended if that was measured.
type Reserved = (Result<OneOrMany<Reservation>, StoreError>, Option<Instant>);

/// How a claim ends.
pub(crate) enum Settlement {
    /// The attempt succeeded: write `record` for every held key.
    Success(Record),
    /// The attempt failed: release every held key, except the batch items the handler reported
    /// done ([`BatchItems::mark_done`]), which get an ack record.
    Failure,
}

/// The owner of one request's claim. See the [module docs](self).
pub(crate) struct ClaimGuard {
    ops: Arc<dyn Ops>,
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
    /// A guard for `claim` on `keys`, not yet reserved.
    pub(crate) fn new<St: IdempotencyStore>(
        store: St,
        keys: OneOrMany<StoreKey>,
        claim: Claim,
        lease: Duration,
        retention: Duration,
        timeout: Duration,
        observer: Observer,
    ) -> Self {
        let common = Common {
            observer,
            claim,
            lease,
            retention,
            timeout,
            asked: keys,
            acquired: OnceLock::new(),
            stopped: AtomicBool::new(false),
            renewing: AtomicBool::new(false),
            alive_until: AtomicU64::new(0),
        };
        ClaimGuard {
            ops: Arc::new(StoreClaim { common, store }),
            items: None,
            grpc: false,
            settled: false,
            reserved_at: None,
        }
    }

    /// Marks the request as a gRPC call.
    pub(crate) fn set_grpc(&mut self, grpc: bool) {
        self.grpc = grpc;
    }

    /// Whether the request was a gRPC call.
    pub(crate) fn is_grpc(&self) -> bool {
        self.grpc
    }

    /// Whether the claim is on the items of a batch.
    pub(crate) fn is_batch(&self) -> bool {
        self.items.is_some()
    }

    /// The claim (token and fingerprint).
    pub(crate) fn claim(&self) -> &Claim {
        &self.ops.common().claim
    }

    /// Claims every key (again: keys this claim already holds answer
    /// [`Reservation::Acquired`]). Until [`keep`](Self::keep) or a settlement, dropping the
    /// guard releases them all: a reserve that failed or was cut off may still have landed.
    pub(crate) async fn reserve(&mut self) -> Result<OneOrMany<Reservation>, StoreError> {
        let started = Instant::now();
        let (result, ended) = self.ops.clone().reserve(started).await;
        self.ops.common().extend(started);
        self.reserved_at = ended;
        result
    }

    /// Starts timing the inner service: from the end of the reserve, when that was measured
    /// (one clock read for both).
    pub(crate) fn inner_stopwatch(&self) -> Stopwatch {
        Stopwatch::started_at(self.reserved_at)
    }

    /// Keeps the keys whose reservation `keep` accepts (the acquired ones); the others are not
    /// this claim's to settle.
    pub(crate) fn keep(&mut self, reservations: &[Reservation]) {
        let acquired = |r: &Reservation| matches!(r, Reservation::Acquired);
        if reservations.iter().all(acquired) {
            // Every key asked for is held: nothing to copy.
            return;
        }
        let common = self.ops.common();
        let kept = common
            .asked
            .iter()
            .zip(reservations)
            .filter(|(_, r)| acquired(r))
            .map(|(key, _)| key.clone())
            .collect();
        // Set once: a guard keeps its keys once, after its reserve.
        let _ = common.acquired.set(kept);
    }

    /// Holds nothing any more: what a reserve that surely wrote nothing leaves (the memory
    /// store refusing a new key when full).
    pub(crate) fn forget(mut self) {
        self.settled = true;
    }

    /// Hands the batch items to the guard, for [`Settlement::Failure`].
    pub(crate) fn set_items(&mut self, items: BatchItems) {
        self.items = Some(items);
    }

    /// A handle that starts the renewal of this claim when its owner turns out slow.
    pub(crate) fn renewal(&self) -> Renewal {
        Renewal(self.ops.clone())
    }

    /// Releases every held key now (one try; the background path retries).
    pub(crate) async fn release(mut self) {
        self.settled = true;
        stop(&*self.ops);
        if self.ops.common().held().is_empty() {
            return;
        }
        if let Err(err) = self.ops.clone().release(Which::Held).await {
            tracing::warn!(error = %err, "could not release an idempotency claim; retrying in the background");
            release_in_background(self.ops.clone(), Which::Held, 1);
        }
    }

    /// Settles the claim: records on success, releases on failure (recording the batch items
    /// reported done). Once this is called, the settlement runs to its end even if the
    /// returned future is dropped.
    pub(crate) fn settle(mut self, settlement: Settlement) -> impl Future<Output = ()> + use<> {
        self.settled = true;
        let ops = self.ops.clone();
        let (record, release) = match settlement {
            Settlement::Success(record) => (Some((Which::Held, record)), None),
            Settlement::Failure => match self.items.as_ref().map(BatchItems::done_mask) {
                // Items reported done are recorded, the others released.
                Some(done) if done.contains(&true) => {
                    let (mut keep, mut drop) = (Vec::new(), Vec::new());
                    for (key, done) in ops.common().held().iter().zip(done) {
                        if done { &mut keep } else { &mut drop }.push(key.clone());
                    }
                    let record = Record::ack(ops.common().claim.fingerprint());
                    let release = (!drop.is_empty()).then_some(Which::These(drop));
                    (Some((Which::These(keep), record)), release)
                }
                _ => (None, Some(Which::Held)),
            },
        };
        // Dropped before its end (the request future was dropped), the settlement starts
        // again on a spawned task: writing a record twice or releasing a key twice under the
        // same claim changes nothing, so a new run from the start finishes what this one began.
        // What was decided is prepared here, outside the future, which then holds only that.
        let pending = SettleOnDrop(Some(Settle {
            ops,
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
        stop(&*self.ops);
        if !self.ops.common().held().is_empty() {
            release_in_background(self.ops.clone(), Which::Held, 0);
        }
    }
}

/// Stops the renewal task (at its next tick).
fn stop(ops: &dyn Ops) {
    ops.common().stopped.store(true, Ordering::Release);
}

/// What a settlement does: write `record` for its keys, then release `release`.
struct Settle {
    ops: Arc<dyn Ops>,
    record: Option<(Which, Record)>,
    release: Option<Which>,
}

impl Settle {
    /// Writes the record, retrying store errors while the claim is alive, then releases;
    /// stops the renewal at the end.
    async fn run(&self) {
        let ops = &self.ops;
        if let Some((which, record)) = &self.record {
            complete_with_retries(ops, which, record).await;
        }
        stop(&**ops);
        if let Some(which) = &self.release {
            if let Err(err) = ops.clone().release(which.clone()).await {
                tracing::warn!(error = %err, "could not release an idempotency claim; retrying in the background");
                release_in_background(ops.clone(), which.clone(), 1);
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
        if let (Some(settle), Ok(handle)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            handle.spawn(async move { settle.run().await });
        }
    }
}

async fn complete_with_retries(ops: &Arc<dyn Ops>, which: &Which, record: &Record) {
    let mut backoff = Backoff::new();
    let mut retried = false;
    loop {
        match ops.clone().complete(which.clone(), record.clone()).await {
            Ok(answers) => {
                if answers.contains(&Completion::Lost) {
                    tracing::warn!(
                        "idempotency claim lost before completion (its lease expired without \
                         renewal, or the store lost it); the key was not recorded"
                    );
                    ops.common().observer.lease_lost();
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
                if Instant::now() + pause >= ops.common().alive_until() {
                    return tracing::error!(
                        error = %err,
                        "gave up recording a completed idempotency key: its lease ran out; a \
                         duplicate may run again"
                    );
                }
                tracing::warn!(error = %err, "could not record a completed idempotency key; retrying");
                retried = true;
                // Boxed: a timer is large, and this future lives inline in every request's.
                Box::pin(tokio::time::sleep(pause)).await;
            }
        }
    }
}

/// Releases `keys` from a spawned task, trying up to [`RELEASE_TRIES`] times (`tried` already
/// done). A release of a claim that never landed, or was already released, changes nothing;
/// a reserve still queued in a reconnecting client lands before the later tries.
fn release_in_background(ops: Arc<dyn Ops>, which: Which, tried: usize) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return tracing::warn!(
            "idempotency claim dropped outside a Tokio runtime; it expires with its lease"
        );
    };
    handle.spawn(async move {
        let mut backoff = Backoff::new();
        for attempt in tried..RELEASE_TRIES {
            if attempt > 0 {
                tokio::time::sleep(backoff.pause()).await;
            }
            if ops.clone().release(which.clone()).await.is_ok() {
                return;
            }
        }
        tracing::error!("could not release an idempotency claim; it expires with its lease");
    });
}

/// Starts the renewal of a claim whose owner is still busy after a third of the lease.
#[derive(Clone)]
pub(crate) struct Renewal(Arc<dyn Ops>);

impl Renewal {
    /// The first renewal is due this long after the claim.
    pub(crate) fn interval(&self) -> Duration {
        self.0.common().lease / 3
    }

    /// Spawns the renewal task, once.
    pub(crate) fn start(&self) {
        let common = self.0.common();
        if common.stopped.load(Ordering::Acquire) || common.renewing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        handle.spawn(renew_while_alive(self.0.clone()));
    }
}

async fn renew_while_alive(ops: Arc<dyn Ops>) {
    let every = ops.common().lease / 3;
    loop {
        let c = ops.common();
        if c.stopped.load(Ordering::Acquire) {
            return;
        }
        let started = Instant::now();
        match ops.clone().renew(started).await {
            Ok(true) => c.extend(started),
            Ok(false) if c.stopped.load(Ordering::Acquire) => return,
            Ok(false) => {
                tracing::error!(
                    "idempotency claim lost while its owner was still running (the store lost \
                     it, or a renewal came too late): a duplicate may run meanwhile"
                );
                c.observer.lease_lost();
                return;
            }
            Err(err) => {
                tracing::warn!(error = %err, "could not renew an idempotency claim; retrying")
            }
        }
        tokio::time::sleep(every).await;
    }
}
