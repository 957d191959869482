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
use super::metrics;
use super::retry::{Backoff, Decision, RetryPolicy};
use super::store::{Failure, InboxStore};
use crate::store::BoxError;

/// How often the inbox's gauges are set, at most (and about as often while the worker runs,
/// or once per poll interval when that is longer and the inbox is idle).
const MEASURE_EVERY: Duration = Duration::from_secs(1);

/// Takes in flight at once: a second one starts for the slots that freed up while the first
/// was on its way, so that a worker bound by round trips rather than CPU keeps its slots full.
const TAKES_IN_FLIGHT: usize = 2;

/// Runs inbox entries through a service: up to `workers` at a time, each under a lease
/// renewed while it runs; success marks the key done, failure (an `Err`, a panic) asks the
/// retry policy for a retry time or a dead letter.
///
/// The service is any `tower::Service<InboxRequest>`: wrap it in tower's timeout, concurrency
/// limit or tracing layers as for a request path. A timeout's error is a failure like another.
///
/// Completions go to the store through one task of the worker's: the first alone, then those
/// that finished while the previous batch was in flight, as one
/// [`complete_many`](InboxStore::complete_many) (one script per partition on Redis, one
/// transaction on SQLite). An idle worker's completion waits for nothing. Up to two takes are
/// in flight at once, the second for the slots that freed up while the first was on its way.
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
    poll: Duration,
}

impl<St, S> Worker<St, S> {
    /// A worker over `store` calling `service`: 1 entry at a time, a 30 s lease, keys kept
    /// 7 days once done, the default [`Backoff`], polled every 50 ms when idle.
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
                poll: Duration::from_millis(50),
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
    /// and taken by another worker about one lease after this one died.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.settings.lease = lease;
        self
    }

    /// How long a done key stays known (the provider's retry horizon).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.settings.retention = retention;
        self
    }

    /// How long an idle worker waits before looking for due entries again.
    pub fn poll_interval(mut self, poll: Duration) -> Self {
        self.settings.poll = poll;
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
        let run = Run {
            store,
            completions,
            policy,
            settings,
        };
        metrics::register(&run.settings.namespace);
        let mut shutdown = pin!(shutdown);
        let mut running = JoinSet::new();
        let mut measured: Option<Instant> = None;
        // Each take is a task of its own, so that it goes on while the loop awaits something
        // else (the gauges' count may need the connection a take holds).
        let mut takes = JoinSet::new();
        // The slots the takes in flight were asked to fill.
        let mut asked = 0;
        // The last take found nothing due: the next waits for the poll interval.
        let mut idle = false;
        // The poll interval after an empty take, else the gauges' second.
        let mut wait = pin!(tokio::time::sleep(MEASURE_EVERY));
        loop {
            while running.try_join_next().is_some() {}
            run.measure(&mut measured).await;
            let busy = running.len() + asked;
            let free = run.settings.workers.saturating_sub(busy);
            if free > 0 && !idle && takes.len() < TAKES_IN_FLIGHT {
                asked += free;
                let taker = run.clone();
                takes.spawn(async move { taker.take(free).await });
            }
            match next_event(&mut takes, &mut running, shutdown.as_mut(), wait.as_mut()).await {
                Event::Taken(n, leases) => {
                    asked -= n;
                    idle = leases.is_empty();
                    if idle {
                        wait.as_mut()
                            .reset((Instant::now() + run.settings.poll).into());
                    }
                    for lease in leases {
                        let span = tracing::info_span!(
                            "inbox.entry",
                            correlation_id = %lease.entry.correlation_id,
                            attempt = lease.entry.attempts,
                        );
                        running.spawn(run.clone().settle(service.clone(), lease).instrument(span));
                    }
                }
                Event::Ended => {}
                Event::Tick => {
                    idle = false;
                    wait.as_mut().reset((Instant::now() + MEASURE_EVERY).into());
                }
                Event::Shutdown => break,
            }
        }
        // Nothing new is started: a take in flight when the shutdown came may return entries
        // (enqueued after it, even): they are handed back, due now.
        while let Some(taken) = takes.join_next().await {
            if let Ok((_, leases)) = taken {
                run.hand_back(leases).await;
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

    /// Up to `free` due entries, each under a new lease (none when the store fails or
    /// panics), with `free`.
    async fn take(&self, free: usize) -> (usize, Vec<Lease>) {
        let taken = AssertUnwindSafe(self.store.take(free, self.settings.lease))
            .catch_unwind()
            .await;
        let leases = match taken {
            Ok(Ok(leases)) => leases,
            Ok(Err(error)) => {
                tracing::warn!(%error, "inbox: taking entries failed");
                Vec::new()
            }
            Err(_panic) => {
                tracing::warn!("inbox: the store panicked while taking entries");
                Vec::new()
            }
        };
        (free, leases)
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
            store: self.store.clone(),
            completions: self.completions.clone(),
            policy: self.policy.clone(),
            settings: self.settings.clone(),
        }
    }
}

/// What the worker's loop woke up for.
enum Event {
    /// A take returned: the slots it was asked to fill, and what it took.
    Taken(usize, Vec<Lease>),
    /// A running entry ended.
    Ended,
    /// The poll interval or the gauges' second passed.
    Tick,
    /// The shutdown future completed.
    Shutdown,
}

/// The next event of the loop; the shutdown first, so that nothing new is taken after it.
async fn next_event(
    takes: &mut JoinSet<(usize, Vec<Lease>)>,
    running: &mut JoinSet<()>,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
    mut wait: Pin<&mut tokio::time::Sleep>,
) -> Event {
    poll_fn(|cx| {
        if shutdown.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Event::Shutdown);
        }
        match takes.poll_join_next(cx) {
            Poll::Ready(Some(Ok((n, leases)))) => return Poll::Ready(Event::Taken(n, leases)),
            // A take's task only ends without its answer when the runtime shuts down.
            Poll::Ready(Some(Err(_))) => return Poll::Ready(Event::Shutdown),
            _ => {}
        }
        if let Poll::Ready(Some(_)) = running.poll_join_next(cx) {
            return Poll::Ready(Event::Ended);
        }
        if wait.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Event::Tick);
        }
        Poll::Pending
    })
    .await
}

/// One entry's run: what it needs of the worker.
struct Run<St, P> {
    store: Arc<St>,
    /// Where a completion goes: batched with those of the other running entries.
    completions: Completions,
    policy: Arc<P>,
    settings: Settings,
}

impl<St: InboxStore, P: RetryPolicy> Run<St, P> {
    async fn settle<S>(self, service: S, lease: Lease)
    where
        S: Service<InboxRequest> + Send,
        S::Future: Send,
        S::Error: Into<BoxError>,
    {
        let (key, token) = (lease.entry.key.clone(), lease.token);
        if lease.stale {
            tracing::debug!("inbox: stale entry settled without the handler");
            let done = self.completions.complete(key, token).await;
            return report("complete", done);
        }
        let attempts = lease.entry.attempts;
        metrics::attempt(&self.settings.namespace);
        let outcome = self
            .call(service, InboxRequest::new(lease.entry, token))
            .await;
        let settled = match outcome {
            Ok(()) => self.completions.complete(key, token).await,
            Err(error) => {
                tracing::warn!(%error, attempts, "inbox: attempt failed");
                let failure = match self.policy.decide(attempts) {
                    Decision::RetryAfter(delay) => {
                        metrics::retry(&self.settings.namespace);
                        Failure::RetryAt(SystemTime::now() + delay, error)
                    }
                    Decision::DeadLetter => {
                        metrics::dead_letter(&self.settings.namespace);
                        Failure::Dead(error)
                    }
                };
                self.store.fail(&key, &token, failure).await
            }
        };
        report("settle", settled);
    }

    /// Calls the service with the lease renewed meanwhile; a panic is a failure.
    async fn call<S>(&self, mut service: S, request: InboxRequest) -> Result<(), String>
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
        let attempt = pin!(AssertUnwindSafe(attempt).catch_unwind());
        let renew = pin!(async {
            loop {
                tokio::time::sleep(self.settings.lease / 3).await;
                match self.store.renew(&key, &token, self.settings.lease).await {
                    Ok(true) => {}
                    // Lost to another worker: its settlement will be refused; let it run.
                    Ok(false) => std::future::pending::<()>().await,
                    Err(error) => tracing::warn!(%error, "inbox: renewing a lease failed"),
                }
            }
        });
        match select(attempt, renew).await {
            Either::Left((Ok(Ok(())), _)) => Ok(()),
            Either::Left((Ok(Err(error)), _)) => Err(error.into().to_string()),
            Either::Left((Err(_panic), _)) => Err("the handler panicked".to_owned()),
            Either::Right(_) => Err("the lease's renewal ended".to_owned()),
        }
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
