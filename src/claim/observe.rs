//! What operators see: one `tracing` span per covered request, outcome events at the right
//! levels, metrics through the `metrics` facade (feature `metrics`), and an optional hook.
//!
//! Nothing here ever logs a body, a raw key or an owner token: the key appears only as its
//! store key (`ti:<hash>`), a BLAKE3 prefix that cannot be reversed.
//!
//! # Metrics (feature `metrics`)
//!
//! The metrics are listed once, in the crate's documentation (its table of metrics); the
//! inbox's, in [`crate::inbox`]'s guide (docs/inbox.md, "What to watch").
//!
//! A layer registers each metric once, at its first sample, with the recorder in charge then,
//! and keeps the handle: install the recorder before the layer serves its first request (a
//! test with a local recorder builds and calls its layer inside that recorder's scope).
//!
//! ```
//! use tower_idempotency::{IdempotencyLayer, MemoryStore, OutcomeEvent};
//!
//! let layer = IdempotencyLayer::new(MemoryStore::new())
//!     .namespace("kalipto")
//!     .on_outcome(|event: &OutcomeEvent<'_>| {
//!         if event.outcome.as_str() == "store_error" {
//!             eprintln!("{} store error after {:?}", event.namespace, event.elapsed);
//!         }
//!     });
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::StatusCode;

use crate::claim::outcome::Outcome;
use crate::claim::throttle::LogThrottle;

/// What the outcome hook receives, once per covered request.
#[derive(Debug)]
#[non_exhaustive]
pub struct OutcomeEvent<'a> {
    /// The layer's namespace.
    pub namespace: &'a str,
    /// What the layer did.
    pub outcome: Outcome,
    /// The status sent (for gRPC, the HTTP status: see `grpc-status` in the response).
    pub status: Option<StatusCode>,
    /// Time from the call to the response head.
    pub elapsed: Duration,
}

type Hook = Arc<dyn Fn(&OutcomeEvent<'_>) + Send + Sync>;

/// The observability settings of one layer.
#[derive(Clone)]
pub(crate) struct Observer {
    namespace: Arc<str>,
    hook: Option<Hook>,
    /// The lines of problems an outsider can cause, at most one per outcome and reason per
    /// interval.
    throttle: Arc<LogThrottle>,
    #[cfg(feature = "metrics")]
    metrics: Arc<MetricKeys>,
    /// The namespace's figures for the admin page, resolved once (not per request).
    #[cfg(feature = "admin")]
    stats: Arc<crate::stats::RouteStats>,
}

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observer")
            .field("namespace", &self.namespace)
            .field("hook", &self.hook.is_some())
            .finish()
    }
}

/// A store operation, as labelled in metrics.
#[derive(Clone, Copy, Debug)]
pub(crate) enum StoreOp {
    Reserve,
    Complete,
    Release,
    Renew,
}

impl StoreOp {
    #[cfg(feature = "metrics")]
    const ALL: [StoreOp; 4] = [
        StoreOp::Reserve,
        StoreOp::Complete,
        StoreOp::Release,
        StoreOp::Renew,
    ];

    fn as_str(self) -> &'static str {
        match self {
            StoreOp::Reserve => "reserve",
            StoreOp::Complete => "complete",
            StoreOp::Release => "release",
            StoreOp::Renew => "renew",
        }
    }
}

/// Times one step, but reads the clock only when something will use the measure: metrics, the
/// outcome hook, or a subscriber interested in this request's span or in trace events. Two
/// clock reads per step add up on a path this short.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stopwatch(Option<Instant>);

impl Stopwatch {
    /// A stopwatch that measures nothing.
    pub(crate) const OFF: Stopwatch = Stopwatch(None);

    /// The time since the start, if measured.
    pub(crate) fn elapsed(&self) -> Option<Duration> {
        self.0.map(|started| started.elapsed())
    }

    /// A stopwatch started at `at`, if measured (the end of an earlier step: one clock read
    /// serves both).
    pub(crate) fn started_at(at: Option<Instant>) -> Self {
        Stopwatch(at)
    }

    /// When it started, if it measures.
    pub(crate) fn started(&self) -> Option<Instant> {
        self.0
    }
}

impl Observer {
    pub(crate) fn new(namespace: &str) -> Self {
        Observer {
            namespace: namespace.into(),
            hook: None,
            throttle: Arc::default(),
            #[cfg(feature = "metrics")]
            metrics: Arc::new(MetricKeys::new(namespace)),
            #[cfg(feature = "admin")]
            stats: crate::stats::route(namespace),
        }
    }

    pub(crate) fn set_namespace(&mut self, namespace: &str) {
        self.namespace = namespace.into();
        #[cfg(feature = "metrics")]
        {
            self.metrics = Arc::new(MetricKeys::new(namespace));
        }
        #[cfg(feature = "admin")]
        {
            self.stats = crate::stats::route(namespace);
        }
    }

    pub(crate) fn namespace(&self) -> &str {
        &self.namespace
    }

    pub(crate) fn set_hook(&mut self, hook: Hook) {
        self.hook = Some(hook);
    }

    pub(crate) fn set_log_interval(&mut self, interval: Duration) {
        self.throttle = Arc::new(LogThrottle::new(interval));
    }

    /// Starts timing a step (see [`Stopwatch`]).
    pub(crate) fn stopwatch(&self) -> Stopwatch {
        Stopwatch(self.measures().then(Instant::now))
    }

    /// Starts timing a whole request. Only the outcome hook reads its duration.
    pub(crate) fn request_stopwatch(&self) -> Stopwatch {
        Stopwatch(self.hook.is_some().then(Instant::now))
    }

    /// A stopwatch started at `started` (a clock read the caller needed anyway).
    pub(crate) fn stopwatch_from(&self, started: Instant) -> Stopwatch {
        Stopwatch(self.measures().then_some(started))
    }

    fn measures(&self) -> bool {
        cfg!(feature = "metrics")
            || cfg!(feature = "admin")
            || self.hook.is_some()
            || tracing::enabled!(tracing::Level::TRACE)
            || !tracing::Span::current().is_disabled()
    }

    /// The span of one covered request. Fields are filled in as the request progresses.
    pub(crate) fn span(&self, method: &http::Method) -> tracing::Span {
        tracing::info_span!(
            "idempotency",
            namespace = %self.namespace,
            method = %method,
            key = tracing::field::Empty,
            correlation_id = tracing::field::Empty,
            outcome = tracing::field::Empty,
            store_ms = tracing::field::Empty,
        )
    }

    /// Records the outcome of one covered request: span field, event, metric, hook.
    pub(crate) fn outcome(&self, outcome: Outcome, status: Option<StatusCode>, timer: Stopwatch) {
        if let Some(span) = request_span() {
            span.record("outcome", outcome.as_str());
        }
        self.log(outcome, status.map(|s| s.as_u16()));
        #[cfg(feature = "metrics")]
        {
            self.metrics.announce();
            let reason = outcome.reason();
            self.metrics.count_outcome(&self.namespace, outcome, reason);
        }
        #[cfg(feature = "admin")]
        self.stats.outcome(outcome);
        if let Some(hook) = &self.hook {
            hook(&OutcomeEvent {
                namespace: &self.namespace,
                outcome,
                status,
                elapsed: timer.elapsed().unwrap_or_default(),
            });
        }
    }

    /// Logs one outcome. What an outsider can cause at will (a refusal before the claim, a
    /// mismatch, a store that refuses or fails) is throttled: at most one line per outcome and
    /// reason per interval, with the count of the lines left out since the previous one.
    fn log(&self, outcome: Outcome, status: Option<u16>) {
        let (name, reason) = (outcome.as_str(), outcome.reason());
        if let Outcome::Replayed | Outcome::InFlight | Outcome::ObjectInFlight | Outcome::Released =
            outcome
        {
            return tracing::info!(outcome = name, status, "idempotency outcome");
        }
        let throttled = matches!(
            outcome,
            Outcome::StoreError
                | Outcome::FailOpen
                | Outcome::Mismatch
                | Outcome::MismatchAcked
                | Outcome::Unverified(_)
                | Outcome::Rejected(_)
        );
        if !throttled {
            return tracing::debug!(outcome = name, reason, status, "idempotency outcome");
        }
        let Some(suppressed) = self.throttle.admit((name, reason)) else {
            return;
        };
        match outcome {
            Outcome::StoreError | Outcome::FailOpen => tracing::error!(
                outcome = name,
                status,
                suppressed,
                "idempotency store unavailable"
            ),
            Outcome::Mismatch => tracing::warn!(
                outcome = name,
                status,
                suppressed,
                "idempotency key reused with a different payload"
            ),
            Outcome::MismatchAcked => tracing::warn!(
                outcome = name,
                status,
                suppressed,
                "idempotency key reused with a different payload; acknowledged as a duplicate"
            ),
            Outcome::Unverified(_) => tracing::warn!(
                outcome = name,
                reason,
                status,
                suppressed,
                "request signature not verified; nothing claimed"
            ),
            _ => tracing::debug!(
                outcome = name,
                reason,
                status,
                suppressed,
                "idempotency request rejected"
            ),
        }
    }

    /// Records the latency (and failure) of one store call; returns when it ended, if
    /// measured.
    pub(crate) fn store_call(&self, op: StoreOp, timer: Stopwatch, ok: bool) -> Option<Instant> {
        let ended = timer.0.map(|_| Instant::now());
        let elapsed = timer.0.zip(ended).map(|(started, ended)| ended - started);
        if let (StoreOp::Reserve, Some(elapsed)) = (op, elapsed) {
            if let Some(span) = request_span() {
                span.record("store_ms", millis(elapsed));
            }
        }
        tracing::trace!(
            operation = op.as_str(),
            ?elapsed,
            ok,
            "idempotency store call"
        );
        #[cfg(feature = "metrics")]
        {
            let keys = &self.metrics.store[op as usize];
            if let Some(elapsed) = elapsed {
                keys.duration.record(elapsed);
            }
            if !ok {
                keys.errors.increment();
            }
        }
        ended
    }

    /// Counts a claim found lost before its owner finished (a renewal or a completion that
    /// found another owner or none).
    pub(crate) fn lease_lost(&self) {
        #[cfg(feature = "metrics")]
        self.metrics.lease_lost.increment();
    }

    /// Records how long the inner service took to answer.
    pub(crate) fn inner_duration(&self, timer: Stopwatch) {
        #[cfg(any(feature = "metrics", feature = "admin"))]
        if let Some(elapsed) = timer.elapsed() {
            #[cfg(feature = "metrics")]
            self.metrics.inner.record(elapsed);
            #[cfg(feature = "admin")]
            self.stats.latency(crate::stats::Latency::Handler, elapsed);
        }
        #[cfg(not(any(feature = "metrics", feature = "admin")))]
        let _ = timer;
    }
}

/// The current span (the request's, where the layer records its fields), unless no subscriber
/// can have enabled it: request spans are at `INFO`, so under a coarser filter (`warn`, as the
/// benchmarks and many deployments run) a field costs one atomic load instead of a look-up of
/// the current span through the dispatcher.
pub(crate) fn request_span() -> Option<tracing::Span> {
    (tracing::level_filters::LevelFilter::current() >= tracing::Level::INFO)
        .then(tracing::Span::current)
}

/// `elapsed` in milliseconds, to the microsecond (`0.034`, not `0.034251000000000004`).
fn millis(elapsed: Duration) -> f64 {
    elapsed.as_micros() as f64 / 1e3
}

/// The metrics of one layer, built once: a key built per call (the `metrics` macros with a
/// dynamic label) costs an allocation and a hash each time, even with no recorder installed.
/// Each metric's handle is registered at its first sample, with the recorder in charge at that
/// moment, and kept: a layer counts into the recorder that was installed when it first
/// counted (its first request, in practice), which saves a registry lookup (a hash and a
/// locked map) per sample, four per first delivery. The cost of keeping handles: a recorder
/// that deletes metrics that stayed idle (`metrics-exporter-prometheus` with an idle timeout)
/// leaves a kept handle counting into a metric no longer exported; do not give this crate's
/// metrics an idle timeout.
#[cfg(feature = "metrics")]
struct MetricKeys {
    store: [StoreKeys; 4],
    lease_lost: MetricKey,
    inner: MetricKey,
    /// Whether the counters of rare events have been registered at zero (see
    /// [`announce`](Self::announce)).
    announced: std::sync::atomic::AtomicBool,
    /// `idempotency_requests_total` of every outcome without a reason (those with one, rejected
    /// and unverified, are built per call: rare).
    outcomes: [(Outcome, MetricKey); 12],
}

#[cfg(feature = "metrics")]
struct StoreKeys {
    duration: MetricKey,
    errors: MetricKey,
}

/// One metric: its key, and its handle once registered (a key is used as a counter or as a
/// histogram, never both).
#[cfg(feature = "metrics")]
struct MetricKey {
    key: metrics::Key,
    counter: std::sync::OnceLock<metrics::Counter>,
    histogram: std::sync::OnceLock<metrics::Histogram>,
}

#[cfg(feature = "metrics")]
static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

#[cfg(feature = "metrics")]
impl MetricKey {
    fn new(name: &'static str, labels: &[(&'static str, &str)]) -> Self {
        let labels = labels
            .iter()
            .map(|(key, value)| metrics::Label::new(*key, value.to_string()))
            .collect::<Vec<_>>();
        // Retained (labels shared behind an `Arc`): a recorder that retains the key it is
        // handed on every call (`metrics-exporter-prometheus` does) then bumps a reference count
        // instead of copying the labels.
        MetricKey {
            key: metrics::Key::from_parts(name, labels).to_retained(),
            counter: std::sync::OnceLock::new(),
            histogram: std::sync::OnceLock::new(),
        }
    }

    fn increment(&self) {
        self.add(1);
    }

    /// Adds `n`, to the counter registered with the recorder in charge at the first sample.
    fn add(&self, n: u64) {
        let register = || metrics::with_recorder(|r| r.register_counter(&self.key, &METADATA));
        self.counter.get_or_init(register).increment(n);
    }

    /// Records `elapsed`, in the histogram registered at the first sample.
    fn record(&self, elapsed: Duration) {
        let register = || metrics::with_recorder(|r| r.register_histogram(&self.key, &METADATA));
        self.histogram
            .get_or_init(register)
            .record(elapsed.as_secs_f64());
    }
}

#[cfg(feature = "metrics")]
impl MetricKeys {
    fn new(namespace: &str) -> Self {
        let store = StoreOp::ALL.map(|op| StoreKeys {
            duration: MetricKey::new(
                "idempotency_store_duration_seconds",
                &[("namespace", namespace), ("operation", op.as_str())],
            ),
            errors: MetricKey::new(
                "idempotency_store_errors_total",
                &[("namespace", namespace), ("operation", op.as_str())],
            ),
        });
        let outcomes = [
            Outcome::First,
            Outcome::Released,
            Outcome::Replayed,
            Outcome::InFlight,
            Outcome::Mismatch,
            Outcome::MismatchAcked,
            Outcome::StoreError,
            Outcome::FailOpen,
            Outcome::PassThrough,
            Outcome::Stale,
            Outcome::ObjectInFlight,
            Outcome::Queued,
        ]
        .map(|outcome| (outcome, Self::outcome_key(namespace, outcome, "none")));
        MetricKeys {
            store,
            lease_lost: MetricKey::new("idempotency_lease_lost_total", &[("namespace", namespace)]),
            inner: MetricKey::new(
                "idempotency_inner_duration_seconds",
                &[("namespace", namespace)],
            ),
            announced: std::sync::atomic::AtomicBool::new(false),
            outcomes,
        }
    }

    /// Registers, once per layer, the counters of events that may never happen (a lost lease,
    /// a failed store call) at zero, so that they are exported from the first request on:
    /// `rate()` and `increase()` over a counter that appears only with its first event miss
    /// that event, and an alert on it would never fire for the first one. Done at the first
    /// covered request rather than when the layer is built, since the application may install
    /// its recorder after building its layers.
    fn announce(&self) {
        use std::sync::atomic::Ordering;
        if self.announced.load(Ordering::Relaxed) || self.announced.swap(true, Ordering::Relaxed) {
            return;
        }
        self.lease_lost.add(0);
        for keys in &self.store {
            keys.errors.add(0);
        }
    }

    fn outcome_key(namespace: &str, outcome: Outcome, reason: &str) -> MetricKey {
        MetricKey::new(
            "idempotency_requests_total",
            &[
                ("namespace", namespace),
                ("outcome", outcome.as_str()),
                ("reason", reason),
            ],
        )
    }

    fn count_outcome(&self, namespace: &str, outcome: Outcome, reason: &str) {
        match self.outcomes.iter().find(|(o, _)| *o == outcome) {
            Some((_, key)) => key.increment(),
            None => Self::outcome_key(namespace, outcome, reason).increment(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_are_shown_to_the_microsecond() {
        let elapsed = Duration::from_nanos(34_251);
        assert_eq!(format!("{}", millis(elapsed)), "0.034");
        assert_eq!(
            format!("{}", millis(Duration::from_micros(1_234_567))),
            "1234.567"
        );
    }
}

#[cfg(all(test, feature = "metrics"))]
mod metric_tests {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use super::*;

    fn counted(recorder: &DebuggingRecorder) -> u64 {
        recorder
            .snapshotter()
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(_, _, _, value)| match value {
                DebugValue::Counter(n) => n,
                _ => 0,
            })
            .sum()
    }

    /// A metric counts into the recorder in charge at its first sample, and stays there: its
    /// handle is registered once, not looked up per sample.
    #[test]
    fn samples_go_to_the_recorder_of_the_first_sample() {
        let key = MetricKey::new("kept_total", &[("namespace", "test")]);
        let (first, second) = (DebuggingRecorder::new(), DebuggingRecorder::new());
        metrics::with_local_recorder(&first, || {
            key.increment();
            key.increment();
        });
        metrics::with_local_recorder(&second, || key.increment());
        // No recorder in charge at all: still the first one's handle.
        key.increment();
        assert_eq!(counted(&first), 4);
        assert_eq!(counted(&second), 0);
        // A metric first sampled under the second recorder counts there.
        let other = MetricKey::new("other_total", &[("namespace", "test")]);
        metrics::with_local_recorder(&second, || other.add(5));
        other.increment();
        assert_eq!(counted(&second), 6);
    }
}
