//! [`Worker`]: a `tower::Service` driven by a loop that takes entries, runs them under a
//! renewed lease and settles them.

use std::future::{Future, poll_fn};
use std::panic::AssertUnwindSafe;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant, SystemTime};

use futures_util::FutureExt;
use futures_util::future::{Either, select};
use tokio::task::JoinSet;
use tower_service::Service;
use tracing::Instrument;

use super::completions::Completions;
use super::entry::{InboxRequest, Lease};
use super::idle::{Idle, Tell};
use super::metrics;
use super::retry::{Backoff, Decision, RetryPolicy};
use super::store::{Failure, InboxStore};
use crate::claim::lease::{LeaseEnd, Lost, Renewed, keep};
use crate::store::{BoxError, StoreKey, Token};

/// How often the inbox's gauges are set, at most (and at least, while the worker runs).
const MEASURE_EVERY: Duration = Duration::from_secs(1);

/// The shortest lease a worker holds: renewed every third of it, with a sixth of it to spare
/// before it ends, a shorter one would cancel handlers for the timer's own delays.
const MIN_LEASE: Duration = Duration::from_millis(100);

/// The longest lease and poll interval: a year (far longer ones would pass what an `Instant`
/// holds).
const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// Runs inbox entries through a service: up to `workers` at a time, each under a lease
/// renewed while it runs; success marks the key done, failure (an `Err`, a panic) asks the
/// retry policy for a retry time or a dead letter.
///
/// The service is any `tower::Service<InboxRequest>`: wrap it in tower's timeout, concurrency
/// limit or tracing layers as for a request path. A timeout's error is a failure like another.
///
/// Completions go to the store through one task of the worker's: the first alone, then those
/// that finished while the previous batch was in flight, as one
/// [`complete`](InboxStore::complete) (one script per partition on Redis, one
/// transaction on SQLite). An idle worker's completion waits for nothing.
///
/// An idle worker does not poll: it waits for the store's [`wakeups`](InboxStore::wakeups)
/// (an enqueue in any process on Redis and PostgreSQL, in this one in memory and on SQLite),
/// for what its own settlements tell it (a retry's time, its object's next entry after an
/// ordered one), and at most the [poll interval](Self::poll_interval) (5 s) for the rest.
pub struct Worker<St, S, P = Backoff> {
    store: Arc<St>,
    service: S,
    policy: Arc<P>,
    settings: Settings,
}

#[derive(Clone, Debug)]
struct Settings {
    namespace: Arc<str>,
    workers: usize,
    lease: Duration,
    retention: Duration,
    /// `None`: as the store announces or not (see `Idle::new`).
    poll: Option<Duration>,
}

impl<St, S> Worker<St, S> {
    /// A worker over `store` calling `service`: 1 entry at a time, a 30 s lease, keys kept
    /// 7 days once done, the default [`Backoff`]; idle, it waits for the store's wake-ups
    /// (see [`poll_interval`](Self::poll_interval)).
    pub fn new(store: St, service: S) -> Self {
        Worker {
            store: Arc::new(store),
            service,
            policy: Arc::new(Backoff::default()),
            settings: Settings {
                namespace: Arc::from("default"),
                workers: 1,
                lease: Duration::from_secs(30),
                retention: Duration::from_secs(7 * 24 * 3600),
                poll: None,
            },
        }
    }
}

impl<St, S, P> Worker<St, S, P> {
    /// The namespace of the worker's metrics (`default`): the route's, for one view of both.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.settings.namespace = Arc::from(namespace.into());
        self
    }

    /// Runs up to `n` entries at once (at least 1).
    pub fn workers(mut self, n: usize) -> Self {
        self.settings.workers = n.max(1);
        self
    }

    /// The lease each entry is held under; renewed every third of it while the handler runs,
    /// and taken by another worker about one lease after this one died. A handler whose lease
    /// is lost (a renewal refused, or none through by a sixth of a lease before it ends) is
    /// cancelled, its attempt failed, so that it never runs beside the worker taking over.
    /// Kept between 100 ms and a year.
    ///
    /// The lease is checked before every poll of the handler, by this host's monotonic clock
    /// with the same margin: a process paused past its lease (stopped, a VM paused, a long
    /// collection) drops the handler when it wakes and never runs a step of it after the lease
    /// ended. A pause in the middle of a step (a write sent, the process stopped before it
    /// lands) cannot be caught that way: only a fenced write is safe against it. On SQL, that
    /// is the completion in the handler's transaction (`SqlInbox::complete_in_tx`); on Redis,
    /// the effect and the completion in one token-checked script (`RedisInbox::complete_with`).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.settings.lease = lease.clamp(MIN_LEASE, MAX_WAIT);
        self
    }

    /// How long a done key stays known (the provider's retry horizon).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.settings.retention = retention;
        self
    }

    /// How long an idle worker waits at most before it looks for due entries again.
    ///
    /// On a store that announces its arrivals ([`InboxStore::wakeups`]: every built-in one),
    /// an idle worker takes as soon as an entry is enqueued or a retry it scheduled is due, and
    /// this is only the fallback for what nobody announces: a lease that ran out in a crashed
    /// process, an announcement lost while a connection was down, an entry enqueued by another
    /// process on SQLite. Default 5 s there; 50 ms on a store that announces nothing. At most
    /// a year.
    pub fn poll_interval(mut self, poll: Duration) -> Self {
        self.settings.poll = Some(poll.min(MAX_WAIT));
        self
    }

    /// The retry policy (which decides; the worker executes).
    pub fn retry<Q>(self, policy: Q) -> Worker<St, S, Q> {
        Worker {
            store: self.store,
            service: self.service,
            policy: Arc::new(policy),
            settings: self.settings,
        }
    }
}

impl<St, S, P> Worker<St, S, P>
where
    St: InboxStore,
    S: Service<InboxRequest> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    P: RetryPolicy,
{
    /// Takes and runs entries until `shutdown` completes, then finishes what runs and returns:
    /// nothing new is taken after `shutdown`.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        // The service is held by value and only cloned between awaits: it need not be `Sync`.
        let Worker {
            store,
            service,
            policy,
            settings,
        } = self;
        let (completions, completing) = Completions::new(store.clone(), settings.retention);
        let completing = tokio::spawn(completing);
        // Subscribed before the first take: nothing enqueued after it goes unheard.
        let (mut idle, tell) = Idle::new(store.wakeups(), settings.poll);
        let run = Run {
            #[cfg(feature = "admin")]
            stats: crate::stats::route(&settings.namespace),
            store,
            completions,
            policy,
            settings,
            tell,
        };
        metrics::register(&run.settings.namespace);
        let mut shutdown = pin!(shutdown);
        let mut running = JoinSet::new();
        let mut measured: Option<Instant> = None;
        // When the last take was asked: its leases end no earlier than a lease after it.
        let mut asked = tokio::time::Instant::now();
        // Whether a take returned more entries than asked (said once a run).
        let mut overfull = false;
        loop {
            while running.try_join_next().is_some() {}
            run.measure(&mut measured).await;
            // More may run than `workers` after a store handed out more than asked.
            let free = run.settings.workers.saturating_sub(running.len());
            let leases = match free {
                0 => Vec::new(),
                _ => {
                    idle.before_take();
                    asked = tokio::time::Instant::now();
                    let taken = run.take(free).await;
                    idle.took(taken.is_some());
                    let taken = taken.unwrap_or_default();
                    // A store that breaks `take`'s bound: its extra entries are leased to this
                    // worker all the same, so they run too (dropped, each would wait for its
                    // lease to run out); nothing more is taken until the running fall below
                    // `workers`.
                    if taken.len() > free && !overfull {
                        overfull = true;
                        tracing::warn!(
                            asked = free,
                            taken = taken.len(),
                            "inbox: the store's take returned more entries than asked; \
                             running them all"
                        );
                    }
                    taken
                }
            };
            if !leases.is_empty() {
                // A take in flight when the shutdown came may return entries enqueued after it
                // (a store's take takes time): they are handed back, due now, not started.
                if shutdown.as_mut().now_or_never().is_some() {
                    run.hand_back(leases).await;
                    break;
                }
                for lease in leases {
                    let span = tracing::info_span!(
                        "inbox.entry",
                        correlation_id = %lease.entry.correlation_id,
                        attempt = lease.entry.attempts,
                    );
                    let settled = run.clone().settle(service.clone(), lease, asked);
                    running.spawn(settled.instrument(span));
                }
                continue;
            }
            let waiting = pin!(wait_for_room(&mut running, free, &mut idle));
            if let Either::Right(_) = select(waiting, shutdown.as_mut()).await {
                break;
            }
        }
        while running.join_next().await.is_some() {}
        // The last handle: the task ends once what was sent is completed.
        drop(run);
        let _ = completing.await;
    }
}

impl<St: InboxStore, P> Run<St, P> {
    /// Sets the inbox's gauges, at most once every [`MEASURE_EVERY`] (counting may scan the
    /// inbox).
    async fn measure(&self, last: &mut Option<Instant>) {
        let recent = last.is_some_and(|at| at.elapsed() < MEASURE_EVERY);
        if !cfg!(feature = "metrics") || recent {
            return;
        }
        *last = Some(Instant::now());
        if let Ok(counts) = self.store.counts().await {
            metrics::gauges(&self.settings.namespace, &counts);
        }
    }

    /// Up to `free` due entries, each under a new lease; `None` when the store failed.
    async fn take(&self, free: usize) -> Option<Vec<Lease>> {
        match self.store.take(free, self.settings.lease).await {
            Ok(leases) => Some(leases),
            Err(error) => {
                tracing::warn!(%error, "inbox: taking entries failed");
                None
            }
        }
    }
}

impl<St: InboxStore, P> Run<St, P> {
    /// Makes entries taken but not started due again now (their attempt stays counted).
    async fn hand_back(&self, leases: Vec<Lease>) {
        for lease in leases {
            let why = "the worker shut down before starting it".to_owned();
            let failure = Failure::RetryAt(SystemTime::now(), why);
            let handed = self
                .store
                .fail(&lease.entry.key, &lease.token, failure)
                .await;
            report("hand back", handed);
        }
    }
}

impl<St, P> Clone for Run<St, P> {
    fn clone(&self) -> Self {
        Run {
            #[cfg(feature = "admin")]
            stats: self.stats.clone(),
            store: self.store.clone(),
            completions: self.completions.clone(),
            policy: self.policy.clone(),
            settings: self.settings.clone(),
            tell: self.tell.clone(),
        }
    }
}

/// Waits for a running entry to end when none is free (at most a second, so that the gauges
/// keep moving while every handler hangs), else until an entry may be due.
async fn wait_for_room(running: &mut JoinSet<()>, free: usize, idle: &mut Idle) {
    if free == 0 {
        let _ = tokio::time::timeout(MEASURE_EVERY, running.join_next()).await;
    } else {
        idle.wait().await;
    }
}

/// One entry's run: what it needs of the worker.
struct Run<St, P> {
    store: Arc<St>,
    /// Where a completion goes: batched with those of the other running entries.
    completions: Completions,
    policy: Arc<P>,
    settings: Settings,
    /// Tells the loop when an entry this run settled makes another due.
    tell: Tell,
    /// The namespace's figures for the admin page.
    #[cfg(feature = "admin")]
    stats: Arc<crate::stats::RouteStats>,
}

impl<St: InboxStore, P: RetryPolicy> Run<St, P> {
    async fn settle<S>(self, service: S, lease: Lease, asked: tokio::time::Instant)
    where
        S: Service<InboxRequest> + Send,
        S::Future: Send,
        S::Error: Into<BoxError>,
    {
        let ordered = lease.entry.order.is_some();
        let retry = if lease.stale {
            // Its object moved past it while it waited (a newer event applied first).
            tracing::info!(key = %lease.entry.key, "inbox: stale entry settled without the handler");
            metrics::stale(&self.settings.namespace);
            #[cfg(feature = "admin")]
            self.stats.count(crate::stats::Count::Stale);
            let (key, token) = (lease.entry.key, lease.token);
            report("complete", self.completions.complete(key, token).await);
            None
        } else {
            self.attempt(service, lease, asked).await
        };
        // Settled, an ordered entry lets its object's next one go; a retry is due at its time.
        // The loop hears it even when the store announces nothing of the kind.
        if ordered {
            let _ = self.tell.send(SystemTime::now());
        }
        if let Some(at) = retry {
            let _ = self.tell.send(at);
        }
    }

    /// Runs the handler and settles its outcome; the retry's time when one was scheduled.
    async fn attempt<S>(
        &self,
        service: S,
        lease: Lease,
        asked: tokio::time::Instant,
    ) -> Option<SystemTime>
    where
        S: Service<InboxRequest> + Send,
        S::Future: Send,
        S::Error: Into<BoxError>,
    {
        let (key, token) = (lease.entry.key.clone(), lease.token);
        let attempts = lease.entry.attempts;
        metrics::attempt(&self.settings.namespace);
        #[cfg(feature = "admin")]
        let started = Instant::now();
        let outcome = self
            .call(service, InboxRequest::new(lease.entry, token), asked)
            .await;
        #[cfg(feature = "admin")]
        (self.stats).latency(crate::stats::Latency::Worker, started.elapsed());
        let error = match outcome {
            Ok(()) => {
                report("complete", self.completions.complete(key, token).await);
                return None;
            }
            Err(error) => error,
        };
        tracing::warn!(%error, attempts, "inbox: attempt failed");
        let failure = match self.policy.decide(attempts) {
            Decision::RetryAfter(delay) => {
                metrics::retry(&self.settings.namespace);
                Failure::RetryAt(SystemTime::now() + delay, error)
            }
            Decision::DeadLetter => {
                metrics::dead_letter(&self.settings.namespace);
                // A person has to act: the line says what to find and re-queue (its span,
                // `inbox.entry`, carries the correlation id: no copy of it per attempt).
                tracing::error!(
                    %key,
                    attempts,
                    last_error = %error,
                    "inbox: entry made a dead letter"
                );
                Failure::Dead(error)
            }
        };
        let retry = match &failure {
            Failure::RetryAt(at, _) => Some(*at),
            Failure::Dead(_) => None,
        };
        let settled = self.store.fail(&key, &token, failure).await;
        let kept = matches!(settled, Ok(true));
        report("settle", settled);
        retry.filter(|_| kept)
    }

    /// Calls the service with the lease renewed meanwhile; a panic is a failure.
    async fn call<S>(
        &self,
        mut service: S,
        request: InboxRequest,
        asked: tokio::time::Instant,
    ) -> Result<(), String>
    where
        S: Service<InboxRequest> + Send,
        S::Future: Send,
        S::Error: Into<BoxError>,
    {
        let (key, token) = (request.key().clone(), *request.token());
        let attempt = async move {
            poll_fn(|cx| service.poll_ready(cx)).await?;
            service.call(request).await.map(drop)
        };
        let end = LeaseEnd::new(asked, self.settings.lease);
        let attempt = pin!(AssertUnwindSafe(attempt).catch_unwind());
        let attempt = pin!(leased(attempt, &end));
        let held = pin!(hold(&*self.store, &key, &token, self.settings.lease, &end));
        let why = match select(attempt, held).await {
            Either::Left((Some(Ok(Ok(()))), _)) => return Ok(()),
            Either::Left((Some(Ok(Err(error))), _)) => return Err(error.into().to_string()),
            Either::Left((Some(Err(_panic)), _)) => return Err("the handler panicked".to_owned()),
            Either::Left((None, _)) => "its lease ran out before the handler's next step",
            Either::Right((why, _)) => why,
        };
        // The handler is dropped here, at its next await (or before it, unpolled): another
        // worker may take the entry over, and two handlers of one entry (or of one object) must
        // not overlap.
        tracing::warn!(why, "inbox: lease lost; the handler is cancelled");
        Err(format!("the handler was cancelled: {why}"))
    }
}

/// Polls `handler` only while its lease lasts: `None`, the handler left unpolled, once the
/// lease's end is near. A process paused past its lease (stopped, a VM paused, a long
/// collection) may wake with the handler's own timer due: without this check the handler would
/// run one more step, a write perhaps, before [`hold`] is polled and finds the lease gone.
fn leased<'a, F>(mut handler: F, end: &'a LeaseEnd) -> impl Future<Output = Option<F::Output>> + 'a
where
    F: Future + Unpin + 'a,
{
    poll_fn(move |cx| {
        if end.near() {
            return Poll::Ready(None);
        }
        Pin::new(&mut handler).poll(cx).map(Some)
    })
}

/// Renews the lease of `key` every third of `lease` while the handler runs, with the one lease
/// keeper fenced by `end`; says why the lease is no longer this worker's: taken over (a renewal
/// refused), or about to run out with no renewal through (the store unreachable). It returns a
/// sixth of a lease before the lease ends by this host's clock, so that the handler is
/// cancelled before another worker can take the entry over. The lease is counted from when the
/// take was sent (the store began it later), and each renewal's from when it was sent.
async fn hold<St: InboxStore>(
    store: &St,
    key: &StoreKey,
    token: &Token,
    lease: Duration,
    end: &LeaseEnd,
) -> &'static str {
    let first = tokio::time::Instant::now() + lease / 3;
    let renew = |_sent| async move {
        match store.renew(key, token, lease).await {
            Ok(true) => Renewed::Held,
            Ok(false) => Renewed::Gone,
            Err(error) => {
                tracing::warn!(%error, "inbox: renewing a lease failed");
                Renewed::Failed
            }
        }
    };
    match keep(lease, first, Some(end), renew).await {
        Lost::TakenOver | Lost::Stopped => "its lease was taken over by another worker",
        Lost::RanOut => "its lease could not be renewed before it ran out",
    }
}

/// Logs a settlement refused (the lease was taken over) or failed (the lease is the backstop:
/// the entry runs again after it).
fn report(what: &str, settled: Result<bool, impl std::fmt::Display>) {
    match settled {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            what,
            "inbox: lease lost before settling; another worker has it"
        ),
        Err(error) => {
            tracing::warn!(what, %error, "inbox: settling failed; retried after the lease")
        }
    }
}
