//! The inbox contract every queue backend must honour, called on the store and through a
//! `Worker` (no HTTP): enqueue atomic with the claim, duplicates, retries with backoff, lease
//! take-over, order per object, shutdown (dead letters and their re-queue, which needs
//! `InboxAdmin`, are the admin contract's).
//!
//! Each store's test file instantiates it with `inbox_contract!(async { (store, guard) })`.

#![allow(dead_code)]

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::inbox::{
    Backoff, Enqueued, Failure, InboxCounts, InboxEntry, InboxRequest, InboxStore, KeyState, Lease,
    Wakeups, Worker,
};
use crate::order::{EqualPositions, Position};
use crate::store::{ObjectKey, StoreError, StoreErrorKind, StoreKey, Token};
use bytes::Bytes;

pub const RETENTION: Duration = Duration::from_secs(3600);
pub const LONG: Duration = Duration::from_secs(60);
pub const DEADLINE: Duration = Duration::from_secs(10);

/// A name no other test (nor an earlier run against the same server) uses.
pub fn fresh(test: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{test}-{}-{}-{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// An entry of its own (a fresh key and correlation id).
pub(crate) fn entry(test: &str) -> InboxEntry {
    let key = StoreKey::new("inbox-contract", None, &fresh(test));
    InboxEntry::new(key, Bytes::from_static(b"{\"event\":1}"), fresh("corr"))
}

fn ordered(object: &ObjectKey, position: i64) -> InboxEntry {
    entry("ordered").ordered(
        object.clone(),
        Position::from_integer_text(&position.to_string()).unwrap(),
    )
}

/// Polls `check` until it holds, failing after the deadline.
async fn eventually<F: std::future::Future<Output = bool>>(
    what: &str,
    mut check: impl FnMut() -> F,
) {
    let start = Instant::now();
    while !check().await {
        assert!(
            start.elapsed() < DEADLINE,
            "not within {DEADLINE:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls `take` until it hands out entries, failing after the deadline.
async fn take_within<St: InboxStore>(store: &St, what: &str) -> Vec<crate::inbox::Lease> {
    let start = Instant::now();
    loop {
        let taken = store.take(10, LONG).await.unwrap();
        if !taken.is_empty() {
            return taken;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "not within {DEADLINE:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The one entry due now.
pub(crate) async fn take_one<St: InboxStore>(store: &St, what: &str) -> crate::inbox::Lease {
    store.take(10, LONG).await.unwrap().pop().expect(what)
}

/// Asserts that the holder of `token` completes `key` alone, its key then done for
/// `retention`.
pub(crate) async fn completes<St: InboxStore>(
    store: &St,
    key: &StoreKey,
    token: Token,
    retention: Duration,
) {
    let done = store.complete(&[(key.clone(), token)], retention).await;
    assert!(done.unwrap()[0], "the lease's holder completes {key}");
}

/// A handler that says when it starts and waits for a permit of its gate.
#[derive(Clone)]
pub(crate) struct Gated {
    started: Arc<tokio::sync::Notify>,
    gate: Arc<tokio::sync::Semaphore>,
    pub(crate) calls: Arc<AtomicU32>,
}

impl Default for Gated {
    fn default() -> Self {
        Gated {
            started: Arc::new(tokio::sync::Notify::new()),
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
            calls: Arc::new(AtomicU32::new(0)),
        }
    }
}

impl Gated {
    fn handler(
        &self,
    ) -> impl tower::Service<InboxRequest, Response = (), Error = Infallible, Future: Send>
    + Clone
    + Send
    + 'static {
        let gated = self.clone();
        tower::service_fn(move |_request: InboxRequest| {
            let gated = gated.clone();
            async move {
                gated.calls.fetch_add(1, Ordering::SeqCst);
                gated.started.notify_one();
                let _permit = gated.gate.acquire().await.unwrap();
                Ok(())
            }
        })
    }

    pub(crate) async fn started(&self) {
        let started = self.started.notified();
        tokio::time::timeout(DEADLINE, started)
            .await
            .expect("the handler starts");
    }
}

/// Runs `worker` until the returned sender is used.
fn spawn<St, S, P>(
    worker: Worker<St, S, P>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
)
where
    St: InboxStore,
    S: tower::Service<InboxRequest> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<crate::store::BoxError>,
    P: crate::inbox::RetryPolicy,
{
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(worker.run(async {
        stopped.await.ok();
    }));
    (stop, run)
}

/// Stops a worker [`spawn`] started and waits until its `run` returns (within the deadline).
pub(crate) async fn stop_worker(
    stop: tokio::sync::oneshot::Sender<()>,
    run: tokio::task::JoinHandle<()>,
) {
    stop.send(()).unwrap();
    tokio::time::timeout(DEADLINE, run)
        .await
        .expect("run returns")
        .unwrap();
}

/// A worker on `store` whose handler passes its gate at once, idle (its fallback poll a
/// minute, so that only a wake-up starts an entry soon) and subscribed when this returns.
pub(crate) async fn idle_worker<St: InboxStore>(
    store: St,
) -> (
    Gated,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let gated = Gated::default();
    gated.gate.add_permits(10);
    let worker = Worker::new(store, gated.handler()).poll_interval(Duration::from_secs(60));
    let (stop, run) = spawn(worker);
    // Idle: its first take found nothing; its subscription in place.
    tokio::time::sleep(Duration::from_millis(500)).await;
    (gated, stop, run)
}

/// Two concurrent enqueues of one delivery store one entry, many times over.
pub async fn enqueue_is_atomic_with_the_claim<St: InboxStore + Clone>(store: St) {
    for _ in 0..50 {
        let entry = entry("atomic");
        let (a, b) = (store.clone(), store.clone());
        let (e1, e2) = (entry.clone(), entry.clone());
        let (r1, r2) = tokio::join!(
            tokio::spawn(async move { a.enqueue(e1).await.unwrap() }),
            tokio::spawn(async move { b.enqueue(e2).await.unwrap() }),
        );
        let mut results = [r1.unwrap(), r2.unwrap()];
        results.sort_by_key(|r| matches!(r, Enqueued::Duplicate(_)));
        assert_eq!(
            results,
            [Enqueued::Queued, Enqueued::Duplicate(KeyState::Queued)],
            "of two concurrent enqueues of one delivery, one is queued and one a duplicate"
        );
    }
    let taken = store.take(1_000, LONG).await.unwrap();
    assert_eq!(taken.len(), 50, "one entry per delivery");
}

/// A duplicate of a queued, running or done key is acknowledged and stores nothing.
pub async fn duplicates_never_enqueue<St: InboxStore>(store: St) {
    let first = entry("duplicates");
    assert_eq!(
        store.enqueue(first.clone()).await.unwrap(),
        Enqueued::Queued,
        "a new key is queued"
    );
    assert_eq!(
        store.enqueue(first.clone()).await.unwrap(),
        Enqueued::Duplicate(KeyState::Queued),
        "a queued key is a duplicate, answered queued"
    );
    let lease = take_one(&store, "the entry is due").await;
    assert_eq!(lease.entry.attempts, 1, "the first take counts attempt 1");
    assert_eq!(
        store.enqueue(first.clone()).await.unwrap(),
        Enqueued::Duplicate(KeyState::Running),
        "a taken key is a duplicate, answered running"
    );
    completes(&store, &first.key, lease.token, RETENTION).await;
    a_redelivery_enqueues_nothing(&store, &first, KeyState::Done, 0).await;
}

/// Asserts that a delivery of `entry`'s key, now `state`, is a duplicate answered so, that it
/// enqueued nothing (a take finds nothing), and that the inbox counts nothing pending or in
/// flight and `dead` dead letters.
async fn a_redelivery_enqueues_nothing<St: InboxStore>(
    store: &St,
    entry: &InboxEntry,
    state: KeyState,
    dead: u64,
) {
    assert_eq!(
        store.enqueue(entry.clone()).await.unwrap(),
        Enqueued::Duplicate(state),
        "a delivery of a {state:?} key is a duplicate, answered {state:?}"
    );
    assert!(
        store.take(10, LONG).await.unwrap().is_empty(),
        "a duplicate of a {state:?} key enqueued nothing"
    );
    let counts = store.counts().await.unwrap();
    assert_eq!(
        (counts.pending, counts.in_flight, counts.dead),
        (0, 0, dead),
        "(pending, in flight, dead) after a duplicate of a {state:?} key"
    );
}

/// A failing handler (an error, then a panic) is retried with growing delays, then applied.
pub async fn retries_with_backoff<St: InboxStore + Clone>(store: St) {
    let first = entry("retries");
    store.enqueue(first.clone()).await.unwrap();
    let starts = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let seen = starts.clone();
    let handler = tower::service_fn(move |_request: InboxRequest| {
        let attempt = {
            let mut starts = seen.lock().unwrap();
            starts.push(Instant::now());
            starts.len()
        };
        async move {
            match attempt {
                1 => Err("first attempt fails".to_owned()),
                2 => panic!("second attempt panics"),
                _ => Ok(()),
            }
        }
    });
    let worker = Worker::new(store.clone(), handler)
        .retry(Backoff::new(Duration::from_millis(200)).max_attempts(5))
        .poll_interval(Duration::from_millis(5));
    let (stop, run) = spawn(worker);
    eventually("the entry is applied", || {
        let store = store.clone();
        let first = first.clone();
        async move { store.enqueue(first).await.unwrap() == Enqueued::Duplicate(KeyState::Done) }
    })
    .await;
    stop.send(()).unwrap();
    run.await.unwrap();
    let starts = starts.lock().unwrap().clone();
    assert_eq!(
        starts.len(),
        3,
        "an error and a panic are failures, then success"
    );
    // Equal jitter: at least half of 200 ms, then half of 400 ms.
    assert!(
        starts[1] - starts[0] >= Duration::from_millis(100),
        "{:?}",
        starts[1] - starts[0]
    );
    assert!(
        starts[2] - starts[1] >= Duration::from_millis(200),
        "{:?}",
        starts[2] - starts[1]
    );
}

/// A failed attempt scheduled later is not taken before its time.
pub async fn a_retry_waits_for_its_time<St: InboxStore>(store: St) {
    let first = entry("retry-at");
    store.enqueue(first.clone()).await.unwrap();
    let lease = take_one(&store, "the entry is due").await;
    let at = SystemTime::now() + Duration::from_millis(300);
    assert!(
        store
            .fail(
                &first.key,
                &lease.token,
                Failure::RetryAt(at, "later".into())
            )
            .await
            .unwrap()
    );
    assert!(
        store.take(10, LONG).await.unwrap().is_empty(),
        "not before its time"
    );
    take_within(&store, "the retry is due").await;
    assert!(
        SystemTime::now() >= at,
        "a retry is taken at its time, not before"
    );
}

/// A worker that stopped renewing loses its entry after its lease, and can no longer renew,
/// fail or complete it.
pub async fn a_dead_workers_lease_is_taken_over<St: InboxStore>(store: St) {
    let first = entry("takeover");
    store.enqueue(first.clone()).await.unwrap();
    let lease = Duration::from_millis(300);
    let dead = store.take(10, lease).await.unwrap().pop().unwrap();
    assert!(
        store.take(10, lease).await.unwrap().is_empty(),
        "held while the lease lasts"
    );
    let next = take_within(&store, "taken again after the lease")
        .await
        .pop()
        .unwrap();
    assert_eq!(next.entry.attempts, 2, "the dead worker's attempt counts");
    assert!(
        !store.renew(&first.key, &dead.token, LONG).await.unwrap(),
        "a lease taken over cannot be renewed"
    );
    assert!(
        !store
            .complete(&[(first.key.clone(), dead.token)], RETENTION)
            .await
            .unwrap()[0],
        "a lease taken over cannot complete"
    );
    assert!(
        !store
            .fail(&first.key, &dead.token, Failure::Dead("late".into()))
            .await
            .unwrap(),
        "a lease taken over cannot fail"
    );
    completes(&store, &first.key, next.token, RETENTION).await;
}

/// An object's entries run one at a time in position order; one behind a failing entry
/// waits while other objects go on; one older than what was applied comes back stale.
pub async fn order_per_object_with_a_failing_entry_in_front<St: InboxStore>(store: St) {
    let (x, y) = (
        ObjectKey::new("inbox-contract", None, &fresh("x")),
        ObjectKey::new("inbox-contract", None, &fresh("y")),
    );
    let (x2, x1, y1) = (ordered(&x, 2), ordered(&x, 1), ordered(&y, 1));
    for entry in [&x2, &x1, &y1] {
        store.enqueue(entry.clone()).await.unwrap();
    }
    let mut taken = store.take(10, LONG).await.unwrap();
    taken.sort_by_key(|lease| lease.entry.key == y1.key);
    let keys: Vec<_> = taken.iter().map(|lease| lease.entry.key.clone()).collect();
    assert_eq!(
        keys,
        [x1.key.clone(), y1.key.clone()],
        "x's first position and y"
    );
    let later = SystemTime::now() + Duration::from_millis(300);
    assert!(
        store
            .fail(
                &x1.key,
                &taken[0].token,
                Failure::RetryAt(later, "down".into())
            )
            .await
            .unwrap()
    );
    assert!(
        store
            .complete(&[(y1.key.clone(), taken[1].token)], RETENTION)
            .await
            .unwrap()[0]
    );
    assert!(
        store.take(10, LONG).await.unwrap().is_empty(),
        "x2 waits behind failing x1"
    );
    let retried = take_within(&store, "x1 is retried").await;
    assert_eq!(retried.len(), 1, "x1 alone is due again");
    assert_eq!(retried[0].entry.key, x1.key, "x1 again, before x2");
    assert!(
        store
            .complete(&[(x1.key.clone(), retried[0].token)], RETENTION)
            .await
            .unwrap()[0]
    );
    let next = take_one(&store, "x2 after x1").await;
    assert_eq!(
        (next.entry.key.clone(), next.stale),
        (x2.key.clone(), false)
    );
    completes(&store, &x2.key, next.token, RETENTION).await;
    let two = Position::from_integer_text("2").unwrap();
    assert_eq!(
        store.enqueue(ordered(&x, 0)).await.unwrap(),
        Enqueued::Stale(two),
        "x0 is behind x's watermark"
    );
}

/// An object's watermark lasts for the retention of the last completion of one of its entries,
/// as the done key does: an older entry within it comes back stale; after it, the object starts
/// again from the next completion (and a store does not keep every object it ever saw).
pub async fn a_watermark_lasts_for_the_retention<St: InboxStore>(store: St) {
    let object = ObjectKey::new("inbox-contract", None, &fresh("fading"));
    let retention = Duration::from_millis(600);
    let run = |position: i64, retention: Duration| {
        let (store, entry) = (&store, ordered(&object, position));
        async move {
            store.enqueue(entry.clone()).await.unwrap();
            let lease = take_one(store, "the object's entry").await;
            assert_eq!(lease.entry.key, entry.key);
            assert!(
                store
                    .complete(&[(entry.key.clone(), lease.token)], retention)
                    .await
                    .unwrap()[0]
            );
            lease.stale
        }
    };
    assert!(!run(5, retention).await);
    let last = Instant::now();
    // Behind the watermark while it lasts: stale at the door, not stored.
    let five = Position::from_integer_text("5").unwrap();
    assert_eq!(
        store.enqueue(ordered(&object, 1)).await.unwrap(),
        Enqueued::Stale(five)
    );
    // Past the retention of that last completion.
    tokio::time::sleep((retention * 2).saturating_sub(last.elapsed())).await;
    assert!(!run(0, RETENTION).await, "the watermark ran out");
    assert!(
        !run(3, RETENTION).await,
        "the new watermark is 0: the expired 5 counts as none"
    );
}

/// A `take` that passes over entries waiting behind their object's first looks further: the
/// entry due after thirty of them is found by a take of one.
pub async fn a_take_looks_past_the_entries_that_wait<St: InboxStore>(store: St) {
    let object = ObjectKey::new("inbox-contract", None, &fresh("queue"));
    store.enqueue(ordered(&object, 0)).await.unwrap();
    let first = take_one(&store, "the object's first entry").await;
    for position in 1..=30 {
        store.enqueue(ordered(&object, position)).await.unwrap();
    }
    let free = entry("unordered");
    store.enqueue(free.clone()).await.unwrap();
    let taken = store.take(1, LONG).await.unwrap();
    let keys: Vec<_> = taken.iter().map(|lease| lease.entry.key.clone()).collect();
    assert_eq!(keys, [free.key], "the thirty wait behind the running one");
    completes(&store, &first.entry.key, first.token, RETENTION).await;
}

/// `complete` of several leases settles each on its own: one flag per lease, in order; a
/// token that does not hold its entry changes nothing (its entry stays in flight and its
/// object's watermark does not move); each ordered entry raises its own object's watermark.
pub async fn complete_settles_each_lease_on_its_own<St: InboxStore>(store: St) {
    let (x, y, z) = (
        ObjectKey::new("inbox-contract", None, &fresh("many-x")),
        ObjectKey::new("inbox-contract", None, &fresh("many-y")),
        ObjectKey::new("inbox-contract", None, &fresh("many-z")),
    );
    let entries = [
        entry("many"),
        ordered(&z, 9),
        entry("many"),
        ordered(&x, 5),
        ordered(&y, 7),
    ];
    for entry in &entries {
        store.enqueue(entry.clone()).await.unwrap();
    }
    let mut taken = Vec::new();
    while taken.len() < entries.len() {
        taken.extend(take_within(&store, "the five entries").await);
    }
    let lease = |entry: &InboxEntry| {
        let lease = taken.iter().find(|l| l.entry.key == entry.key).unwrap();
        (entry.key.clone(), lease.token)
    };
    let [a, b, c, x5, y7] = &entries;
    // b's token with its first byte changed (its last, a Redis partition's number, kept).
    let mut forged = *lease(b).1.as_bytes();
    forged[0] ^= 0xff;
    let wrong = (b.key.clone(), Token::from_bytes(forged));
    let batch = [lease(a), wrong, lease(c), lease(x5), lease(y7)];
    let flags = store.complete(&batch, RETENTION).await.unwrap();
    assert_eq!(
        flags,
        [true, false, true, true, true],
        "one flag per lease, in order: false for the forged token only"
    );
    assert!(
        store.complete(&[], RETENTION).await.unwrap().is_empty(),
        "no lease, no flag"
    );
    let counts = store.counts().await.unwrap();
    assert_eq!(
        (counts.pending, counts.in_flight),
        (0, 1),
        "only b is left, in flight"
    );
    for done in [a, c, x5, y7] {
        assert_eq!(
            store.enqueue(done.clone()).await.unwrap(),
            Enqueued::Duplicate(KeyState::Done),
            "each entry completed in the batch is done"
        );
    }
    // b again, due now: not stale, so the forged completion left z's watermark as it was.
    let (b_key, b_token) = lease(b);
    let again = Failure::RetryAt(SystemTime::now(), "again".to_owned());
    assert!(store.fail(&b_key, &b_token, again).await.unwrap());
    let retried = take_one(&store, "b, due again").await;
    assert_eq!(retried.entry.key, b.key);
    assert!(!retried.stale, "z's watermark did not move");
    completes(&store, &b_key, retried.token, RETENTION).await;
    // Each object's watermark moved: an older entry of x is stale (at the door), a newer one
    // of y is not.
    let five = Position::from_integer_text("5").unwrap();
    assert_eq!(
        store.enqueue(ordered(&x, 1)).await.unwrap(),
        Enqueued::Stale(five)
    );
    let next = ordered(&y, 8);
    store.enqueue(next.clone()).await.unwrap();
    let lease = take_one(&store, "the object's next entry").await;
    assert_eq!(lease.entry.key, next.key);
    assert!(!lease.stale);
    completes(&store, &next.key, lease.token, RETENTION).await;
}

/// A worker running many entries at once applies each of them once and marks each done (its
/// completions go to the store together while others are in flight, and two takes may be in
/// flight at once). What each completion answered reaches only the log: this checks the
/// outcome in the store.
pub async fn a_busy_worker_completes_every_entry_once<St: InboxStore + Clone>(store: St) {
    let entries: Vec<_> = (0..60).map(|_| entry("busy")).collect();
    for entry in &entries {
        store.enqueue(entry.clone()).await.unwrap();
    }
    let calls = Arc::new(Mutex::new(std::collections::HashMap::<StoreKey, u32>::new()));
    let seen = calls.clone();
    let handler = tower::service_fn(move |request: InboxRequest| {
        let seen = seen.clone();
        async move {
            *seen
                .lock()
                .unwrap()
                .entry(request.key().clone())
                .or_default() += 1;
            Ok::<_, Infallible>(())
        }
    });
    let worker = Worker::new(store.clone(), handler)
        .workers(16)
        .poll_interval(Duration::from_millis(5));
    let (stop, run) = spawn(worker);
    let total = entries.len();
    eventually("every entry is applied", || {
        let n = calls.lock().unwrap().len();
        async move { n == total }
    })
    .await;
    stop_worker(stop, run).await;
    for entry in &entries {
        assert_eq!(
            calls.lock().unwrap()[&entry.key],
            1,
            "each entry applied once: {}",
            entry.key
        );
        assert_eq!(
            store.enqueue(entry.clone()).await.unwrap(),
            Enqueued::Duplicate(KeyState::Done),
            "expected {} marked done (kept for the retention) once the worker returned",
            entry.key
        );
    }
}

/// Shutdown finishes the entry that runs and takes nothing new.
pub async fn shutdown_finishes_what_runs<St: InboxStore + Clone>(store: St) {
    let (first, second) = (entry("shutdown"), entry("shutdown"));
    store.enqueue(first.clone()).await.unwrap();
    let gated = Gated::default();
    let worker = Worker::new(store.clone(), gated.handler())
        .workers(2)
        .poll_interval(Duration::from_millis(5));
    let (stop, run) = spawn(worker);
    gated.started().await;
    stop.send(()).unwrap();
    // Whatever the loop does next, it must not take this one.
    store.enqueue(second.clone()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    gated.gate.add_permits(10);
    tokio::time::timeout(DEADLINE, run)
        .await
        .expect("run returns")
        .unwrap();
    assert_eq!(
        gated.calls.load(Ordering::SeqCst),
        1,
        "only the entry running at shutdown ran"
    );
    assert_eq!(
        store.enqueue(first).await.unwrap(),
        Enqueued::Duplicate(KeyState::Done),
        "the entry running at shutdown is finished and marked done"
    );
    assert_eq!(
        store.enqueue(second).await.unwrap(),
        Enqueued::Duplicate(KeyState::Queued),
        "the entry enqueued after shutdown is not taken: still queued"
    );
}

/// A handler that outlives several leases keeps its entry: the worker renews the lease.
pub async fn a_running_entry_is_renewed<St: InboxStore + Clone>(store: St) {
    let first = entry("renewed");
    store.enqueue(first.clone()).await.unwrap();
    let gated = Gated::default();
    let worker = Worker::new(store.clone(), gated.handler()).lease(Duration::from_secs(1));
    let (stop, run) = spawn(worker);
    gated.started().await;
    // Two and a half leases: without renewal the entry would be due again.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(
        store.take(10, LONG).await.unwrap().is_empty(),
        "still held by the running worker"
    );
    gated.gate.add_permits(1);
    stop_worker(stop, run).await;
    assert_eq!(
        store.enqueue(first).await.unwrap(),
        Enqueued::Duplicate(KeyState::Done),
        "the entry renewed past two and a half leases is completed by the worker"
    );
}

/// A worker settles a stale entry (behind its object's watermark) without its handler.
pub async fn a_worker_settles_a_stale_entry_without_the_handler<St: InboxStore + Clone>(store: St) {
    let object = ObjectKey::new("inbox-contract", None, &fresh("stale"));
    let (newer, older) = (ordered(&object, 2), ordered(&object, 1));
    store.enqueue(newer.clone()).await.unwrap();
    let gated = Gated::default();
    let worker =
        Worker::new(store.clone(), gated.handler()).poll_interval(Duration::from_millis(5));
    let (stop, run) = spawn(worker);
    let done = |entry: InboxEntry| {
        let store = store.clone();
        async move { store.enqueue(entry).await.unwrap() == Enqueued::Duplicate(KeyState::Done) }
    };
    // The older event arrives while the newer one runs: stored, and stale once it is applied.
    gated.started().await;
    assert_eq!(
        store.enqueue(older.clone()).await.unwrap(),
        Enqueued::Queued
    );
    gated.gate.add_permits(10);
    eventually("the newer event is applied", || done(newer.clone())).await;
    eventually("the older event is settled", || done(older.clone())).await;
    stop.send(()).unwrap();
    run.await.unwrap();
    assert_eq!(
        gated.calls.load(Ordering::SeqCst),
        1,
        "only the newer event ran"
    );
}

/// `entry` with a route's rule that an entry at its object's watermark is stale.
fn equal_stale(mut entry: InboxEntry) -> InboxEntry {
    if let Some(order) = &mut entry.order {
        order.equal = EqualPositions::Stale;
    }
    entry
}

/// An entry behind its object's watermark is stale at the door: nothing is stored. One at the
/// watermark's position is stale only when its route says equal positions are
/// ([`EqualPositions::Stale`]); by default it is queued and taken as new (coarse positions,
/// such as whole seconds, give distinct events one position).
pub async fn an_entry_behind_the_watermark_is_stale_at_the_door<St: InboxStore>(store: St) {
    let object = ObjectKey::new("inbox-contract", None, &fresh("door"));
    let newer = ordered(&object, 2);
    store.enqueue(newer.clone()).await.unwrap();
    let lease = take_one(&store, "the newer entry").await;
    completes(&store, &newer.key, lease.token, RETENTION).await;
    let two = Position::from_integer_text("2").unwrap();
    assert_eq!(
        store.enqueue(ordered(&object, 1)).await.unwrap(),
        Enqueued::Stale(two),
        "a position behind the watermark is stale"
    );
    assert_eq!(
        store
            .enqueue(equal_stale(ordered(&object, 2)))
            .await
            .unwrap(),
        Enqueued::Stale(two),
        "a position at the watermark is stale when equal positions are"
    );
    assert_eq!(
        store.enqueue(newer).await.unwrap(),
        Enqueued::Duplicate(KeyState::Done)
    );
    let counts = store.counts().await.unwrap();
    assert_eq!((counts.pending, counts.in_flight), (0, 0), "nothing stored");
    let equal = ordered(&object, 2);
    assert_eq!(
        store.enqueue(equal.clone()).await.unwrap(),
        Enqueued::Queued,
        "a position at the watermark is processed by default"
    );
    let lease = take_one(&store, "the entry at the watermark").await;
    assert_eq!(lease.entry.key, equal.key);
    assert!(!lease.stale, "an entry at the watermark is new by default");
    completes(&store, &equal.key, lease.token, RETENTION).await;
    assert_eq!(
        store.enqueue(ordered(&object, 3)).await.unwrap(),
        Enqueued::Queued
    );
}

/// Completing an entry that was handed out stale leaves its object's watermark where the
/// newer entry put it: a stale completion never lowers it, so an entry between the two
/// positions is still stale at the door.
pub async fn a_stale_completion_leaves_the_watermark<St: InboxStore>(store: St) {
    let object = ObjectKey::new("inbox-contract", None, &fresh("kept-mark"));
    let (newer, older) = (ordered(&object, 5), ordered(&object, 3));
    store.enqueue(newer.clone()).await.unwrap();
    let held = take_one(&store, "the newer entry").await;
    assert_eq!(
        store.enqueue(older.clone()).await.unwrap(),
        Enqueued::Queued,
        "the older entry waits while the newer one runs"
    );
    completes(&store, &newer.key, held.token, RETENTION).await;
    let stale = take_one(&store, "the older entry").await;
    assert_eq!(stale.entry.key, older.key);
    assert!(stale.stale, "the older entry comes back stale");
    completes(&store, &older.key, stale.token, RETENTION).await;
    let five = Position::from_integer_text("5").unwrap();
    assert_eq!(
        store.enqueue(ordered(&object, 4)).await.unwrap(),
        Enqueued::Stale(five),
        "the stale entry's completion left the watermark at 5"
    );
}

/// Entries that wait while their object's watermark reaches their position are handed out
/// stale only under the rule their route gave them: the one whose equal positions are stale is
/// settled without the handler, the other is applied.
pub async fn an_entry_the_watermark_reaches_while_it_waits_keeps_its_rule<St: InboxStore>(
    store: St,
) {
    let object = ObjectKey::new("inbox-contract", None, &fresh("reached"));
    let first = ordered(&object, 5);
    store.enqueue(first.clone()).await.unwrap();
    let held = take_one(&store, "the first entry").await;
    let (process, strict) = (ordered(&object, 5), equal_stale(ordered(&object, 5)));
    for waiting in [&process, &strict] {
        assert_eq!(
            store.enqueue(waiting.clone()).await.unwrap(),
            Enqueued::Queued,
            "the watermark is not at 5 yet"
        );
    }
    completes(&store, &first.key, held.token, RETENTION).await;
    let mut seen = Vec::new();
    for _ in 0..2 {
        let lease = take_one(&store, "an entry at the watermark").await;
        let is_strict = lease.entry.key == strict.key;
        assert_eq!(
            lease.stale, is_strict,
            "an entry the watermark reached is stale only when its equal positions are"
        );
        assert_eq!(
            lease.entry.order.as_ref().map(|order| order.equal),
            Some(if is_strict {
                EqualPositions::Stale
            } else {
                EqualPositions::Process
            }),
            "a taken entry keeps its rule"
        );
        completes(&store, &lease.entry.key, lease.token, RETENTION).await;
        seen.push(lease.entry.key);
    }
    seen.sort();
    let mut expected = vec![process.key, strict.key];
    expected.sort();
    assert_eq!(seen, expected);
}

/// An older event that arrives while a newer one of its object is in flight is not taken
/// until the newer one settles, by the store alone and by a second worker racing for it; then
/// it comes back stale and is settled without the handler, so the newer state stays. Past its
/// lease, the entry in flight is the one taken over, not the older one that waits.
pub async fn a_newer_entry_in_flight_holds_back_an_older_one<St: InboxStore + Clone>(store: St) {
    let object = ObjectKey::new("inbox-contract", None, &fresh("in-flight"));
    let (newer, older) = (ordered(&object, 1402), ordered(&object, 1401));
    store.enqueue(newer.clone()).await.unwrap();
    let short = Duration::from_millis(300);
    let held = store
        .take(10, short)
        .await
        .unwrap()
        .pop()
        .expect("the newer entry");
    assert_eq!(held.entry.key, newer.key);
    store.enqueue(older.clone()).await.unwrap();
    assert!(
        store.take(10, LONG).await.unwrap().is_empty(),
        "the older entry waits while the newer one is in flight"
    );
    let again = take_within(&store, "the entry in flight is taken over after its lease").await;
    let keys: Vec<_> = again.iter().map(|lease| &lease.entry.key).collect();
    assert_eq!(
        keys,
        [&newer.key],
        "the newer one is taken over, not the older one"
    );
    assert!(
        store
            .complete(&[(newer.key.clone(), again[0].token)], RETENTION)
            .await
            .unwrap()[0]
    );
    let next = take_one(&store, "the older entry after the newer one").await;
    assert_eq!(
        (next.entry.key.clone(), next.stale),
        (older.key.clone(), true)
    );
    completes(&store, &older.key, next.token, RETENTION).await;

    // The same through two workers racing for the older entry.
    let object = ObjectKey::new("inbox-contract", None, &fresh("in-flight-workers"));
    let (newer, older) = (ordered(&object, 1402), ordered(&object, 1401));
    let gated = Gated::default();
    let worker = || {
        Worker::new(store.clone(), gated.handler())
            .workers(2)
            .poll_interval(Duration::from_millis(5))
    };
    let (stop_a, run_a) = spawn(worker());
    let (stop_b, run_b) = spawn(worker());
    store.enqueue(newer.clone()).await.unwrap();
    gated.started().await;
    store.enqueue(older.clone()).await.unwrap();
    // Many polls of both workers.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        gated.calls.load(Ordering::SeqCst),
        1,
        "no worker starts the older entry while the newer one runs"
    );
    gated.gate.add_permits(10);
    let done = |entry: InboxEntry| {
        let store = store.clone();
        async move { store.enqueue(entry).await.unwrap() == Enqueued::Duplicate(KeyState::Done) }
    };
    eventually("the older entry is settled", || done(older.clone())).await;
    for (stop, run) in [(stop_a, run_a), (stop_b, run_b)] {
        stop_worker(stop, run).await;
    }
    assert_eq!(
        gated.calls.load(Ordering::SeqCst),
        1,
        "the older entry was settled stale, without the handler"
    );
}

/// A store whose renewals fail (its server unreachable for them alone): everything else goes
/// to the store it wraps, so another worker on that store can take a lease over.
#[derive(Clone)]
struct Unrenewable<St>(St);

impl<St: InboxStore> InboxStore for Unrenewable<St> {
    async fn enqueue(&self, entry: InboxEntry) -> Result<Enqueued, StoreError> {
        self.0.enqueue(entry).await
    }
    async fn take(&self, max: usize, lease: Duration) -> Result<Vec<Lease>, StoreError> {
        self.0.take(max, lease).await
    }
    async fn renew(&self, _: &StoreKey, _: &Token, _: Duration) -> Result<bool, StoreError> {
        Err(StoreError::new(StoreErrorKind::Unavailable))
    }
    async fn complete(
        &self,
        leases: &[(StoreKey, Token)],
        retention: Duration,
    ) -> Result<Vec<bool>, StoreError> {
        self.0.complete(leases, retention).await
    }
    async fn fail(
        &self,
        key: &StoreKey,
        token: &Token,
        failure: Failure,
    ) -> Result<bool, StoreError> {
        self.0.fail(key, token, failure).await
    }
    async fn counts(&self) -> Result<InboxCounts, StoreError> {
        self.0.counts().await
    }
    fn wakeups(&self) -> Wakeups {
        self.0.wakeups()
    }
}

/// A worker whose lease cannot be renewed cancels its handler before the lease runs out, so
/// that the worker that takes the entry over never runs beside it: the first attempt's
/// handler (which would hang for ever) is dropped before any other attempt starts, and the
/// entry is applied once, by a later attempt.
pub async fn a_handler_is_cancelled_before_its_lease_can_be_taken_over<St: InboxStore + Clone>(
    store: St,
) {
    struct Cancelled(Arc<Mutex<Vec<&'static str>>>);
    impl Drop for Cancelled {
        fn drop(&mut self) {
            self.0.lock().unwrap().push("first cancelled");
        }
    }
    let events = Arc::new(Mutex::new(Vec::new()));
    let handler = {
        let events = events.clone();
        tower::service_fn(move |_request: InboxRequest| {
            let events = events.clone();
            async move {
                let first = {
                    let mut seen = events.lock().unwrap();
                    let first = seen.is_empty();
                    seen.push(if first {
                        "first started"
                    } else {
                        "again started"
                    });
                    first
                };
                if first {
                    let _cancelled = Cancelled(events.clone());
                    std::future::pending::<()>().await;
                }
                Ok::<_, Infallible>(())
            }
        })
    };
    // A sixth of it (the margin before the lease ends) is far past a timer's delay on a
    // loaded machine.
    let lease = Duration::from_secs(3);
    let unrenewable = Worker::new(Unrenewable(store.clone()), handler.clone())
        .lease(lease)
        .retry(Backoff::new(Duration::from_millis(10)))
        .poll_interval(Duration::from_millis(20));
    let (stop_a, run_a) = spawn(unrenewable);
    let entry = entry("unrenewable");
    store.enqueue(entry.clone()).await.unwrap();
    eventually("the first attempt starts", || {
        let started = !events.lock().unwrap().is_empty();
        async move { started }
    })
    .await;
    let (stop_b, run_b) = spawn(
        Worker::new(store.clone(), handler)
            .lease(lease)
            .poll_interval(Duration::from_millis(20)),
    );
    let done = || {
        let (store, entry) = (store.clone(), entry.clone());
        async move { store.enqueue(entry).await.unwrap() == Enqueued::Duplicate(KeyState::Done) }
    };
    eventually("the entry is applied by a later attempt", done).await;
    assert_eq!(
        *events.lock().unwrap(),
        ["first started", "first cancelled", "again started"],
        "the first attempt ends before another starts"
    );
    for (stop, run) in [(stop_a, run_a), (stop_b, run_b)] {
        stop_worker(stop, run).await;
    }
}

/// A handler whose process is paused past its lease (stopped, a VM paused, a long
/// collection) never runs a step after it: the worker taking the entry over applies it, and
/// the paused handler, woken with its next step ready, is dropped before that step.
///
/// The pause is played in-process: on a current-thread runtime of its own, the handler blocks
/// its thread in one poll until another worker has taken the entry over and applied it, which
/// freezes that worker's timers and renewals as a stopped process's; then it wakes itself and
/// would write its effect on its next poll.
pub async fn a_paused_handler_never_runs_a_step_past_its_lease<St: InboxStore + Clone>(store: St) {
    let events = Arc::new(Mutex::new(Vec::<&'static str>::new()));
    let applied = |events: &Arc<Mutex<Vec<&'static str>>>| {
        events
            .lock()
            .unwrap()
            .contains(&"applied by the worker taking over")
    };
    let paused = {
        let events = events.clone();
        tower::service_fn(move |_request: InboxRequest| {
            let events = events.clone();
            let mut woke = false;
            std::future::poll_fn(move |cx| {
                if woke {
                    events.lock().unwrap().push("applied after the pause");
                    return std::task::Poll::Ready(Ok::<_, Infallible>(()));
                }
                events.lock().unwrap().push("paused");
                let start = Instant::now();
                while !applied(&events) && start.elapsed() < DEADLINE {
                    std::thread::sleep(Duration::from_millis(10));
                }
                woke = true;
                cx.waker().wake_by_ref();
                std::task::Poll::Pending
            })
        })
    };
    let entry = entry("paused");
    store.enqueue(entry.clone()).await.unwrap();
    let worker = Worker::new(store.clone(), paused)
        .lease(Duration::from_millis(300))
        .poll_interval(Duration::from_millis(20));
    let (stop_paused, stopped) = tokio::sync::oneshot::channel::<()>();
    let (ended, paused_run) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(worker.run(async {
            stopped.await.ok();
        }));
        let _ = ended.send(());
    });
    eventually("the first worker's handler is paused", || {
        let started = !events.lock().unwrap().is_empty();
        async move { started }
    })
    .await;
    let taker = {
        let events = events.clone();
        tower::service_fn(move |_request: InboxRequest| {
            events
                .lock()
                .unwrap()
                .push("applied by the worker taking over");
            std::future::ready(Ok::<_, Infallible>(()))
        })
    };
    let (stop_taker, taker_run) =
        spawn(Worker::new(store.clone(), taker).poll_interval(Duration::from_millis(20)));
    let done = || {
        let (store, entry) = (store.clone(), entry.clone());
        async move { store.enqueue(entry).await.unwrap() == Enqueued::Duplicate(KeyState::Done) }
    };
    eventually("the worker taking over applies the entry", done).await;
    stop_worker(stop_taker, taker_run).await;
    // The paused worker finishes what runs (its handler resumed) before its run returns. The
    // store is not used after it: its runtime may have opened connections that end with it.
    stop_paused.send(()).unwrap();
    tokio::time::timeout(DEADLINE, paused_run)
        .await
        .expect("the paused worker's run returns")
        .unwrap();
    thread.join().unwrap();
    assert_eq!(
        *events.lock().unwrap(),
        ["paused", "applied by the worker taking over"],
        "the paused handler's next step never ran"
    );
}

/// A small deterministic generator (xorshift64*), so that a failing scenario is replayed from
/// the seed its message prints.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// What the handlers of a scenario saw: each object's state (the position last applied), the
/// entries running per object, and every overlap of two entries of one object.
#[derive(Default)]
struct Applied {
    state: std::collections::HashMap<ObjectKey, Position>,
    running: std::collections::HashMap<ObjectKey, StoreKey>,
    overlaps: Vec<String>,
}

/// Objects with several positions each, enqueued in the order and with the gaps `seed`
/// draws, applied by 4 workers (two `Worker`s of 2) whose handler sleeps what `seed` draws and
/// writes the position as the object's state, as a naive handler does: every object ends at its
/// highest position, and no handler starts while another of its object runs.
pub async fn arrivals_in_any_order_end_at_the_highest_position<St: InboxStore + Clone>(
    store: St,
    seed: u64,
) {
    let mut rng = Rng::new(seed);
    let objects: Vec<_> = (0..3)
        .map(|_| ObjectKey::new("inbox-contract", None, &fresh("arrivals")))
        .collect();
    let mut entries: Vec<_> = objects
        .iter()
        .flat_map(|object| (1..=5).map(|position| ordered(object, position)))
        .collect();
    for i in (1..entries.len()).rev() {
        entries.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let delays: std::collections::HashMap<StoreKey, u64> = entries
        .iter()
        .map(|entry| (entry.key.clone(), rng.below(15)))
        .collect();
    let (applied, delays) = (Arc::new(Mutex::new(Applied::default())), Arc::new(delays));
    let handler = {
        let applied = applied.clone();
        tower::service_fn(move |request: InboxRequest| {
            let (applied, delays) = (applied.clone(), delays.clone());
            async move {
                let order = request.order().expect("ordered").clone();
                {
                    let mut seen = applied.lock().unwrap();
                    if let Some(other) = seen
                        .running
                        .insert(order.object.clone(), request.key().clone())
                    {
                        seen.overlaps
                            .push(format!("{} started while {other} ran", request.key()));
                    }
                }
                tokio::time::sleep(Duration::from_millis(delays[request.key()])).await;
                let mut seen = applied.lock().unwrap();
                seen.running.remove(&order.object);
                seen.state.insert(order.object, order.position);
                Ok::<_, Infallible>(())
            }
        })
    };
    let worker = || {
        Worker::new(store.clone(), handler.clone())
            .workers(2)
            .poll_interval(Duration::from_millis(5))
    };
    let (stop_a, run_a) = spawn(worker());
    let (stop_b, run_b) = spawn(worker());
    for entry in &entries {
        store.enqueue(entry.clone()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(rng.below(5))).await;
    }
    for entry in &entries {
        let (store, entry) = (store.clone(), entry.clone());
        // Done, or refused at the door once its object went past it.
        eventually(&format!("seed {seed}: every entry is settled"), move || {
            let (store, entry) = (store.clone(), entry.clone());
            async move {
                matches!(
                    store.enqueue(entry).await.unwrap(),
                    Enqueued::Duplicate(KeyState::Done) | Enqueued::Stale(_)
                )
            }
        })
        .await;
    }
    for (stop, run) in [(stop_a, run_a), (stop_b, run_b)] {
        stop_worker(stop, run).await;
    }
    let applied = applied.lock().unwrap();
    assert_eq!(
        applied.overlaps,
        Vec::<String>::new(),
        "seed {seed}: one entry per object at a time"
    );
    let highest = Position::from_integer_text("5").unwrap();
    for object in &objects {
        assert_eq!(
            applied.state.get(object),
            Some(&highest),
            "seed {seed}: {} ends at 5",
            object.as_str()
        );
    }
}

/// [`arrivals_in_any_order_end_at_the_highest_position`] over a few seeds drawn from the clock
/// (each failure names its seed).
pub async fn random_arrivals_end_at_the_highest_position<St: InboxStore + Clone>(store: St) {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    for round in 0..3 {
        arrivals_in_any_order_end_at_the_highest_position(store.clone(), nanos ^ round).await;
    }
}

/// An idle worker takes an entry as soon as it is enqueued, and its retry as soon as it is
/// due, without polling: its fallback poll is a minute, far past the deadline.
pub async fn an_idle_worker_is_woken_not_polled<St: InboxStore + Clone>(store: St) {
    assert!(
        store.wakeups().is_announced(),
        "the store announces its enqueues"
    );
    let starts = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let seen = starts.clone();
    let handler = tower::service_fn(move |_request: InboxRequest| {
        let seen = seen.clone();
        async move {
            let mut seen = seen.lock().unwrap();
            seen.push(Instant::now());
            match seen.len() {
                1 => Err("the first attempt fails"),
                _ => Ok(()),
            }
        }
    });
    let worker = Worker::new(store.clone(), handler)
        .poll_interval(Duration::from_secs(60))
        .retry(Backoff::new(Duration::from_millis(200)));
    let (stop, run) = spawn(worker);
    // Idle: its first take found nothing, it waits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let first = entry("woken");
    let enqueued = Instant::now();
    store.enqueue(first.clone()).await.unwrap();
    let started = |n: usize| {
        let starts = starts.clone();
        async move { starts.lock().unwrap().len() >= n }
    };
    eventually("the enqueue wakes the worker", || started(1)).await;
    eventually("the retry wakes the worker at its time", || started(2)).await;
    let starts = starts.lock().unwrap().clone();
    let (woken, retried) = (starts[0] - enqueued, starts[1] - starts[0]);
    assert!(
        woken < Duration::from_secs(2),
        "started {woken:?} after the enqueue"
    );
    assert!(
        retried >= Duration::from_millis(100) && retried < Duration::from_secs(3),
        "retried {retried:?} after the failure (backoff 100-200 ms)"
    );
    stop_worker(stop, run).await;
}

/// A retry scheduled through `other` (the worker of another process that failed the entry)
/// wakes a worker idle on `worker_side` at the retry's time, though its fallback poll is a
/// minute: retries (and a shutting-down worker's hand-backs) are announced as enqueues are.
pub async fn a_retry_elsewhere_wakes_an_idle_worker<St: InboxStore + Clone>(
    worker_side: St,
    other: St,
) {
    let first = entry("retried-elsewhere");
    other.enqueue(first.clone()).await.unwrap();
    let lease = take_within(&other, "the first attempt, elsewhere")
        .await
        .pop()
        .unwrap();
    assert_eq!(lease.entry.key, first.key);
    // Idle: the entry is leased elsewhere.
    let (gated, stop, run) = idle_worker(worker_side).await;
    let due = Duration::from_millis(300);
    let failed = Instant::now();
    let retry = Failure::RetryAt(SystemTime::now() + due, "failed elsewhere".to_owned());
    assert!(other.fail(&first.key, &lease.token, retry).await.unwrap());
    gated.started().await;
    let woken = failed.elapsed();
    assert!(
        woken >= due - Duration::from_millis(50) && woken < due + Duration::from_secs(1),
        "started {woken:?} after a retry due in {due:?}"
    );
    stop_worker(stop, run).await;
}

/// [`a_retry_elsewhere_wakes_an_idle_worker`] through one store.
pub async fn a_retry_is_announced<St: InboxStore + Clone>(store: St) {
    a_retry_elsewhere_wakes_an_idle_worker(store.clone(), store).await;
}

/// A worker idle on `worker_side` takes an entry enqueued through `other` (another client or
/// pool: what another process sees) within a second, though its fallback poll is a minute.
pub async fn an_enqueue_elsewhere_wakes_an_idle_worker<St: InboxStore + Clone>(
    worker_side: St,
    other: St,
) {
    let (gated, stop, run) = idle_worker(worker_side).await;
    let enqueued = Instant::now();
    other.enqueue(entry("elsewhere")).await.unwrap();
    gated.started().await;
    let woken = enqueued.elapsed();
    assert!(
        woken < Duration::from_secs(1),
        "started {woken:?} after the enqueue"
    );
    stop_worker(stop, run).await;
}

/// `at` cut to whole milliseconds: every backend keeps an entry's times at least that finely
/// (the SQL ones keep milliseconds).
pub(crate) fn whole_ms(at: SystemTime) -> SystemTime {
    let since = at.duration_since(SystemTime::UNIX_EPOCH).unwrap();
    SystemTime::UNIX_EPOCH + Duration::from_millis(since.as_millis() as u64)
}

/// A retention short enough to wait past: long enough that a check made right away, and one
/// made a second in, are well within it.
pub(crate) const SHORT_RETENTION: Duration = Duration::from_secs(2);

/// An entry comes back from `take` as it was enqueued: its body byte for byte, its kept
/// headers, delivery id, route, object and position, correlation id and enqueue time (what the
/// handler and the oldest entry's age read), its attempt counted.
pub async fn take_returns_the_entry_as_enqueued<St: InboxStore>(store: St) {
    let object = ObjectKey::new("inbox-contract", None, &fresh("contents"));
    let mut sent = ordered(&object, 5).with_delivery("email", "evt_contents");
    sent.body = Bytes::from_static(b"{\"event\":\"email.bounced\"}\n\xff\x00");
    sent.headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    sent.headers.insert(
        "x-event-type",
        http::HeaderValue::from_static("email.bounced"),
    );
    // Three seconds ago, not now: a store that stamps its own time is seen.
    let enqueued_at = whole_ms(SystemTime::now() - Duration::from_secs(3));
    sent.enqueued_at = enqueued_at;
    sent.next_attempt_at = enqueued_at;
    assert_eq!(
        store.enqueue(sent.clone()).await.unwrap(),
        Enqueued::Queued,
        "a new key is queued"
    );
    let lease = take_one(&store, "the entry is due").await;
    let got = &lease.entry;
    assert_eq!(got.key, sent.key, "the entry enqueued is the one taken");
    assert_eq!(got.body, sent.body, "the body comes back byte for byte");
    assert_eq!(got.headers, sent.headers, "the kept headers come back");
    assert_eq!(
        (got.id.as_str(), got.route.as_str()),
        ("evt_contents", "email"),
        "the delivery id and route come back"
    );
    assert_eq!(got.order, sent.order, "the object and position come back");
    assert_eq!(
        got.correlation_id, sent.correlation_id,
        "the correlation id comes back"
    );
    assert_eq!(
        got.enqueued_at, enqueued_at,
        "the entry's own enqueue time is kept (to the millisecond), not the store's clock"
    );
    assert_eq!(got.attempts, 1, "the first attempt is counted by the take");
    assert!(!lease.stale, "no watermark: not stale");
}

/// A dead letter (failed with `Failure::Dead`) is kept: never taken again, its key a
/// duplicate (`Dead`) to a later delivery, which stores nothing, and counted as dead.
pub async fn a_dead_letter_is_kept_and_never_taken_again<St: InboxStore>(store: St) {
    let first = entry("dead-kept");
    store.enqueue(first.clone()).await.unwrap();
    let lease = take_one(&store, "the entry is due").await;
    assert!(
        store
            .fail(&first.key, &lease.token, Failure::Dead("poison".into()))
            .await
            .unwrap(),
        "the lease's holder settles it as dead"
    );
    assert!(
        store.take(10, LONG).await.unwrap().is_empty(),
        "a dead letter is not taken"
    );
    a_redelivery_enqueues_nothing(&store, &first, KeyState::Dead, 1).await;
}

/// An ordered entry that becomes a dead letter leaves its object's queue: the object's next
/// entry is taken (not stale: nothing of the object was applied), so a poison event does not
/// hold its object for ever.
pub async fn a_dead_letter_does_not_block_its_object<St: InboxStore>(store: St) {
    let object = ObjectKey::new("inbox-contract", None, &fresh("poison"));
    let (first, second) = (ordered(&object, 1), ordered(&object, 2));
    for entry in [&first, &second] {
        store.enqueue(entry.clone()).await.unwrap();
    }
    let taken = store.take(10, LONG).await.unwrap();
    let keys: Vec<_> = taken.iter().map(|lease| &lease.entry.key).collect();
    assert_eq!(keys, [&first.key], "the object's first position only");
    assert!(
        store
            .fail(&first.key, &taken[0].token, Failure::Dead("poison".into()))
            .await
            .unwrap(),
        "the lease's holder settles it as dead"
    );
    let next = take_one(&store, "the object's next entry, after its dead letter").await;
    assert_eq!(
        (next.entry.key.clone(), next.stale),
        (second.key.clone(), false),
        "the next position is taken, not stale, once the first is dead"
    );
    completes(&store, &second.key, next.token, RETENTION).await;
}

/// A done key is kept for its retention and forgotten after it: a delivery of it right away
/// and a second in is a duplicate; one after the retention is queued again (a store does not
/// keep every key it ever saw).
pub async fn a_done_key_is_forgotten_after_its_retention<St: InboxStore>(store: St) {
    let first = entry("done-expires");
    store.enqueue(first.clone()).await.unwrap();
    let lease = take_one(&store, "the entry is due").await;
    let asked = Instant::now();
    completes(&store, &first.key, lease.token, SHORT_RETENTION).await;
    kept_for_its_retention(&store, &first, asked, Instant::now(), "completed").await;
}

/// Asserts what the key of `entry`, made done for [`SHORT_RETENTION`] by a call asked at
/// `asked` that returned at `settled` (`how`: completed, discarded), answers: a duplicate at
/// once and a second in, then, past the retention counted from `settled`, a new delivery.
pub(crate) async fn kept_for_its_retention<St: InboxStore>(
    store: &St,
    entry: &InboxEntry,
    asked: Instant,
    settled: Instant,
    how: &str,
) {
    assert_eq!(
        store.enqueue(entry.clone()).await.unwrap(),
        Enqueued::Duplicate(KeyState::Done),
        "a {how} key is a duplicate (done) right away"
    );
    tokio::time::sleep(Duration::from_secs(1).saturating_sub(asked.elapsed())).await;
    assert_eq!(
        store.enqueue(entry.clone()).await.unwrap(),
        Enqueued::Duplicate(KeyState::Done),
        "a {how} key is still a duplicate a second into its {SHORT_RETENTION:?} retention"
    );
    let past = SHORT_RETENTION + Duration::from_millis(300);
    tokio::time::sleep(past.saturating_sub(settled.elapsed())).await;
    assert_eq!(
        store.enqueue(entry.clone()).await.unwrap(),
        Enqueued::Queued,
        "a {how} key is forgotten after its {SHORT_RETENTION:?} retention: a delivery is new again"
    );
}

/// Many takes at once over a backlog never hand one entry out twice: every key is taken at
/// most once (and each of them once in all), round after round.
pub async fn concurrent_takes_never_hand_out_one_entry_twice<St: InboxStore + Clone>(store: St) {
    for round in 0..10 {
        let entries: Vec<_> = (0..12).map(|_| entry("race")).collect();
        for entry in &entries {
            store.enqueue(entry.clone()).await.unwrap();
        }
        let takers: Vec<_> = (0..8)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move {
                    let mut keys = Vec::new();
                    for _ in 0..3 {
                        let taken = store.take(2, LONG).await.unwrap();
                        keys.extend(taken.into_iter().map(|lease| lease.entry.key));
                    }
                    keys
                })
            })
            .collect();
        let mut seen = std::collections::HashMap::<StoreKey, u32>::new();
        for taker in takers {
            for key in taker.await.unwrap() {
                *seen.entry(key).or_default() += 1;
            }
        }
        let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            twice.is_empty(),
            "round {round}: every key is taken at most once, these more: {twice:?}"
        );
        for key in store.take(100, LONG).await.unwrap() {
            *seen.entry(key.entry.key).or_default() += 1;
        }
        for entry in &entries {
            assert_eq!(
                seen.get(&entry.key),
                Some(&1),
                "round {round}: every entry is taken once in all: {}",
                entry.key
            );
        }
    }
}

/// An ordered entry that becomes a dead letter lets its object's next entry go: the store
/// announces it, so a worker idle meanwhile (its fallback poll a minute) starts that next
/// entry within a second or two, as it would a new enqueue.
pub async fn an_ordered_dead_letter_wakes_an_idle_worker<St: InboxStore + Clone>(store: St) {
    let object = ObjectKey::new("inbox-contract", None, &fresh("dead-wakes"));
    let (first, second) = (ordered(&object, 1), ordered(&object, 2));
    store.enqueue(first.clone()).await.unwrap();
    let lease = take_one(&store, "the object's first entry").await;
    assert_eq!(lease.entry.key, first.key, "the object's first entry");
    store.enqueue(second.clone()).await.unwrap();
    // Idle: the second waits behind the first, leased here.
    let (gated, stop, run) = idle_worker(store.clone()).await;
    assert_eq!(
        gated.calls.load(Ordering::SeqCst),
        0,
        "the next entry waits while the first is in flight"
    );
    let buried = Instant::now();
    assert!(
        store
            .fail(&first.key, &lease.token, Failure::Dead("poison".into()))
            .await
            .unwrap(),
        "the lease's holder settles it as dead"
    );
    gated.started().await;
    let woken = buried.elapsed();
    assert!(
        woken < Duration::from_secs(2),
        "the idle worker started the object's next entry {woken:?} after its first became a \
         dead letter (expected within 2 s: the dead letter is announced)"
    );
    stop_worker(stop, run).await;
}

/// A take hands out at most `max` entries, however many are due (a worker asks for as many as
/// it has room to run); the rest are left for the next takes.
pub async fn a_take_hands_out_at_most_max<St: InboxStore>(store: St) {
    let entries: Vec<_> = (0..5).map(|_| entry("at-most")).collect();
    for entry in &entries {
        store.enqueue(entry.clone()).await.unwrap();
    }
    let mut taken = std::collections::HashSet::new();
    for max in [2, 1, 2] {
        let leases = store.take(max, LONG).await.unwrap();
        assert!(
            leases.len() <= max,
            "a take of at most {max} handed out {}",
            leases.len()
        );
        taken.extend(leases.into_iter().map(|lease| lease.entry.key));
    }
    taken.extend(
        store
            .take(10, LONG)
            .await
            .unwrap()
            .into_iter()
            .map(|lease| lease.entry.key),
    );
    assert_eq!(
        taken.len(),
        entries.len(),
        "the entries left by a take are handed out by the next ones"
    );
}

/// The inbox queue contract as `#[tokio::test]`s, one per case, in a module of the calling file
/// (feature `test-util`; see [`test_util`](crate::test_util)).
///
/// `$make` is an `async` expression whose output is `(inbox, guard)`: a fresh
/// [`InboxStore`](crate::inbox::InboxStore) (cheap to clone) and whatever must live as long as
/// the test. Every case runs on a multi-threaded runtime with two workers.
#[macro_export]
macro_rules! inbox_contract {
    ($make:expr) => {
        $crate::inbox_contract!(@tests $make;
            enqueue_is_atomic_with_the_claim,
            duplicates_never_enqueue,
            retries_with_backoff,
            a_retry_waits_for_its_time,
            a_dead_workers_lease_is_taken_over,
            order_per_object_with_a_failing_entry_in_front,
            shutdown_finishes_what_runs,
            a_running_entry_is_renewed,
            a_worker_settles_a_stale_entry_without_the_handler,
            an_entry_behind_the_watermark_is_stale_at_the_door,
            an_entry_the_watermark_reaches_while_it_waits_keeps_its_rule,
            a_stale_completion_leaves_the_watermark,
            a_watermark_lasts_for_the_retention,
            a_take_looks_past_the_entries_that_wait,
            complete_settles_each_lease_on_its_own,
            a_busy_worker_completes_every_entry_once,
            a_newer_entry_in_flight_holds_back_an_older_one,
            random_arrivals_end_at_the_highest_position,
            an_idle_worker_is_woken_not_polled,
            a_handler_is_cancelled_before_its_lease_can_be_taken_over,
            a_paused_handler_never_runs_a_step_past_its_lease,
            a_retry_is_announced,
            take_returns_the_entry_as_enqueued,
            a_dead_letter_is_kept_and_never_taken_again,
            a_dead_letter_does_not_block_its_object,
            a_done_key_is_forgotten_after_its_retention,
            concurrent_takes_never_hand_out_one_entry_twice,
            an_ordered_dead_letter_wakes_an_idle_worker,
            a_take_hands_out_at_most_max,
        );
    };
    (@tests $make:expr; $($name:ident),* $(,)?) => {
        mod inbox_contract_tests {
            use super::*;
            $crate::suite_cases!($crate::test_util::inbox; $make; $($name),*);
        }
    };
}

pub use crate::inbox_contract;
