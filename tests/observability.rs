//! Each outcome emits its span fields, event and counter with the right labels; no captured log
//! line ever holds a raw key, a body or a token.
#![cfg(feature = "metrics")]

mod suite;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use suite::app::{Effects, router};
use suite::{post, send};
use tower_idempotency::IdempotencyStore;
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::store::StoreKey;
use tower_idempotency::test_util::store::{Hooked, OneTarget};
use tower_idempotency::test_util::values;
use tower_idempotency::{FailureMode, IdempotencyLayer, MemoryStore, Outcome, OutcomeEvent};

const SECRET_KEY: &str = "whsec-delivery-7Hq2";
const SECRET_BODY: &str = r#"{"card":"4242424242424242"}"#;

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Captures every log line up to `level` on this thread while the guard lives.
fn capture_logs(level: tracing::Level) -> (Capture, tracing::subscriber::DefaultGuard) {
    let capture = Capture::default();
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (capture, tracing::subscriber::set_default(subscriber))
}

type Counters = Vec<(String, Vec<(String, String)>, u64)>;

/// One snapshot of `recorder`, a value per metric that `measure` reads (a snapshot drains
/// histograms: take one per check).
fn snapshot(recorder: &DebuggingRecorder, measure: fn(DebugValue) -> Option<u64>) -> Counters {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let value = measure(value)?;
            let key = key.key();
            let labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            Some((key.name().to_owned(), labels, value))
        })
        .collect()
}

fn counters(recorder: &DebuggingRecorder) -> Counters {
    snapshot(recorder, |value| match value {
        DebugValue::Counter(n) => Some(n),
        _ => None,
    })
}

/// Histogram samples taken, by metric name and labels.
fn histograms(recorder: &DebuggingRecorder) -> Counters {
    snapshot(recorder, |value| match value {
        DebugValue::Histogram(values) => Some(values.len() as u64),
        _ => None,
    })
}

fn count(counters: &Counters, name: &str, labels: &[(&str, &str)]) -> u64 {
    counters
        .iter()
        .filter(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, _, v)| v)
        .sum()
}

#[tokio::test(flavor = "current_thread")]
async fn every_outcome_is_traced_and_counted_without_secrets() {
    let (capture, _tracing) = capture_logs(tracing::Level::TRACE);
    let recorder = DebuggingRecorder::new();
    let _metrics = metrics::set_default_local_recorder(&recorder);

    let hooked: Arc<Mutex<Vec<Outcome>>> = Arc::default();
    let hook = hooked.clone();
    let store = MemoryStore::new();
    let effects = Effects::default();
    let app = router(
        IdempotencyLayer::new(store.clone())
            .namespace("obs")
            .on_outcome(move |event: &OutcomeEvent<'_>| {
                assert_eq!(event.namespace, "obs");
                hook.lock().unwrap().push(event.outcome);
            }),
        &effects,
    );

    // first, replayed, mismatch
    assert_eq!(
        send(&app, post("/effect", Some(SECRET_KEY), SECRET_BODY))
            .await
            .0,
        StatusCode::CREATED
    );
    assert_eq!(
        send(&app, post("/effect", Some(SECRET_KEY), SECRET_BODY))
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(
        send(&app, post("/effect", Some(SECRET_KEY), "{}")).await.0,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    // released
    let mut failing = post("/effect", Some("fails"), SECRET_BODY);
    failing
        .headers_mut()
        .insert("x-demo-fail", "true".parse().unwrap());
    assert_eq!(
        send(&app, failing).await.0,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    // rejected (missing key)
    assert_eq!(
        send(&app, post("/effect", None, SECRET_BODY)).await.0,
        StatusCode::BAD_REQUEST
    );
    // in flight: a claim held elsewhere
    let held = StoreKey::new("obs", Some("/effect"), "held");
    store
        .reserve_one(
            &held,
            &values::claim(Fingerprint::of_bytes(b"{}")),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert_eq!(
        send(&app, post("/effect", Some("held"), "{}")).await.0,
        StatusCode::CONFLICT
    );

    // store_error and fail_open: a full store
    let full = MemoryStore::new().with_max_entries(1);
    full.reserve_one(
        &StoreKey::new("x", None, "x"),
        &values::claim(Fingerprint::NONE),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let closed = router(
        IdempotencyLayer::new(full.clone()).namespace("obs"),
        &effects,
    );
    assert_eq!(
        send(&closed, post("/effect", Some("k"), "{}")).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let open = router(
        IdempotencyLayer::new(full)
            .namespace("obs")
            .failure_mode(FailureMode::Open),
        &effects,
    );
    assert_eq!(
        send(&open, post("/effect", Some("k"), "{}")).await.0,
        StatusCode::CREATED
    );
    // Let background releases run.
    tokio::time::sleep(Duration::from_millis(20)).await;

    let c = counters(&recorder);
    let requests = "idempotency_requests_total";
    for (outcome, reason) in [
        ("first", "none"),
        ("replayed", "none"),
        ("mismatch", "none"),
        ("released", "none"),
        ("rejected", "missing_key"),
        ("in_flight", "none"),
        ("store_error", "none"),
    ] {
        assert_eq!(
            count(
                &c,
                requests,
                &[
                    ("namespace", "obs"),
                    ("outcome", outcome),
                    ("reason", reason)
                ]
            ),
            1,
            "{outcome} counted once: {c:?}"
        );
    }
    // fail_open: processed, and the inner outcome of the unprotected request is fail_open.
    assert_eq!(count(&c, requests, &[("outcome", "fail_open")]), 1, "{c:?}");
    assert!(
        count(
            &c,
            "idempotency_store_errors_total",
            &[("operation", "reserve")]
        ) >= 2
    );
    assert_eq!(
        *hooked.lock().unwrap(),
        [
            Outcome::First,
            Outcome::Replayed,
            Outcome::Mismatch,
            Outcome::Released,
            Outcome::Rejected("missing_key"),
            Outcome::InFlight,
        ]
    );

    let logs = capture.text();
    for outcome in [
        "first",
        "replayed",
        "mismatch",
        "released",
        "rejected",
        "in_flight",
        "store_error",
        "fail_open",
    ] {
        assert!(
            logs.contains(&format!("outcome=\"{outcome}\""))
                || logs.contains(&format!("outcome={outcome}")),
            "{outcome} not logged:\n{logs}"
        );
    }
    assert!(
        logs.contains("WARN") && logs.contains("ERROR"),
        "mismatch warns, store errors are errors"
    );
    assert!(
        logs.contains("key=\"ti:"),
        "the hashed key is in the span:\n{logs}"
    );
    assert!(!logs.contains(SECRET_KEY), "raw key leaked:\n{logs}");
    assert!(!logs.contains("4242424242424242"), "body leaked:\n{logs}");
    assert!(
        !logs.to_lowercase().contains("token("),
        "token leaked:\n{logs}"
    );
}

/// The memory store behind a wall: a store that, like any store talking to a server, does not
/// answer in process.
type Remote = Hooked<MemoryStore>;

/// A store that talks to a server has its calls timed; the memory store, which answers in
/// process, has not (a sample would cost more than the call), while the handler is timed on
/// both and a failed call of either is counted (see the test above).
#[tokio::test(flavor = "current_thread")]
async fn store_calls_are_timed_unless_the_store_answers_in_process() {
    assert!(MemoryStore::new().in_process());
    assert!(!Remote::default().in_process());
    // Every callsite enabled on this thread too (tests run in parallel, and a callsite's
    // interest is cached for every thread).
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(std::io::sink)
        .finish();
    let _tracing = tracing::subscriber::set_default(subscriber);
    let recorder = DebuggingRecorder::new();
    let _metrics = metrics::set_default_local_recorder(&recorder);
    let effects = Effects::default();
    let local = router(
        IdempotencyLayer::new(MemoryStore::new()).namespace("local"),
        &effects,
    );
    let remote = router(
        IdempotencyLayer::new(Remote::default()).namespace("remote"),
        &effects,
    );
    for app in [&local, &remote] {
        for _ in 0..2 {
            send(app, post("/effect", Some("k"), "{}")).await;
        }
    }

    let h = histograms(&recorder);
    let samples = |name: &str, labels: &[(&str, &str)]| count(&h, name, labels);
    let store = "idempotency_store_duration_seconds";
    let inner = "idempotency_inner_duration_seconds";
    // Remote: two reserves, one complete; the handler ran once.
    assert_eq!(
        samples(store, &[("namespace", "remote"), ("operation", "reserve")]),
        2
    );
    assert_eq!(
        samples(store, &[("namespace", "remote"), ("operation", "complete")]),
        1
    );
    assert_eq!(samples(inner, &[("namespace", "remote")]), 1);
    // Local: no store samples, the handler still timed.
    assert_eq!(samples(store, &[("namespace", "local")]), 0);
    assert_eq!(samples(inner, &[("namespace", "local")]), 1);
}

/// The number of lines of `text` holding `message`, and the sum of their `suppressed` fields.
fn lines_and_suppressed(text: &str, message: &str) -> (u64, u64) {
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(message)).collect();
    let suppressed = lines
        .iter()
        .map(|line| {
            let field = line
                .split("suppressed=")
                .nth(1)
                .expect("a suppressed field");
            let digits: String = field.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u64>().unwrap()
        })
        .sum();
    (lines.len() as u64, suppressed)
}

/// A flood of refusals an outsider can cause (here a store full of in-flight claims, and
/// malformed keys) writes a line per outcome and interval, whose `suppressed` fields account
/// for every one left out; metrics count every one.
#[tokio::test(flavor = "current_thread")]
async fn a_flood_of_refusals_is_logged_throttled_and_counted_whole() {
    let (capture, _tracing) = capture_logs(tracing::Level::DEBUG);
    let recorder = DebuggingRecorder::new();
    let _metrics = metrics::set_default_local_recorder(&recorder);

    // One entry, held by a claim that never settles: every new key is refused.
    let store = MemoryStore::new().with_max_entries(1);
    let filler = StoreKey::new("flood", None, "filler");
    let claim = values::claim(Fingerprint::NONE);
    store
        .reserve_one(&filler, &claim, Duration::from_secs(600))
        .await
        .unwrap();
    let interval = Duration::from_millis(500);
    let layer = IdempotencyLayer::new(store)
        .namespace("flood")
        .log_interval(interval);
    let app = router(layer, &Effects::default());

    let too_long = "k".repeat(300);
    let started = std::time::Instant::now();
    for i in 0..1000 {
        let request = post("/effect", Some(&format!("flood-{i}")), "{}");
        assert_eq!(send(&app, request).await.0, StatusCode::SERVICE_UNAVAILABLE);
        let malformed = post("/effect", Some(&too_long), "{}");
        assert_eq!(send(&app, malformed).await.0, StatusCode::BAD_REQUEST);
    }
    let elapsed = started.elapsed();
    // One more of each once an interval has passed: its line reports what was left out.
    tokio::time::sleep(interval + Duration::from_millis(100)).await;
    let request = post("/effect", Some("after-the-flood"), "{}");
    assert_eq!(send(&app, request).await.0, StatusCode::SERVICE_UNAVAILABLE);
    let malformed = post("/effect", Some(&too_long), "{}");
    assert_eq!(send(&app, malformed).await.0, StatusCode::BAD_REQUEST);

    let text = capture.text();
    let most = 2 + elapsed.as_millis() as u64 / interval.as_millis() as u64;
    for message in [
        "idempotency store unavailable",
        "idempotency request rejected",
    ] {
        let (lines, suppressed) = lines_and_suppressed(&text, message);
        assert!(
            lines >= 2 && lines <= most,
            "{message}: {lines} lines in {elapsed:?}"
        );
        assert!(lines < 100, "{message}: {lines} lines");
        assert_eq!(
            lines + suppressed,
            1001,
            "{message}: every one is accounted for"
        );
    }
    let counters = counters(&recorder);
    let refused = [("namespace", "flood"), ("outcome", "store_error")];
    assert_eq!(
        count(&counters, "idempotency_requests_total", &refused),
        1001
    );
    let rejected = [("namespace", "flood"), ("outcome", "rejected")];
    assert_eq!(
        count(&counters, "idempotency_requests_total", &rejected),
        1001
    );
}

/// The inbox metrics of one namespace, read by polling a `DebuggingRecorder`. A snapshot drains
/// it (counters and gauges read 0 until recorded again), so counters are summed over the
/// snapshots and the gauges are those of the last snapshot that saw them set.
#[derive(Default)]
struct Polled {
    counters: std::collections::HashMap<String, u64>,
    gauges: std::collections::HashMap<String, f64>,
}

impl Polled {
    /// Takes a snapshot; true when it saw the gauges set since the previous one (a worker
    /// sets all four at once, and `pending` is never read back as 0 then unless it is 0).
    fn poll(&mut self, recorder: &DebuggingRecorder, namespace: &str) -> bool {
        let mut gauges = std::collections::HashMap::new();
        for (key, _, _, value) in recorder.snapshotter().snapshot().into_vec() {
            let key = key.key();
            if !key
                .labels()
                .any(|l| l.key() == "namespace" && l.value() == namespace)
            {
                continue;
            }
            let name = key.name().to_owned();
            match value {
                DebugValue::Counter(n) => *self.counters.entry(name).or_default() += n,
                DebugValue::Gauge(value) => drop(gauges.insert(name, value.0)),
                DebugValue::Histogram(_) => {}
            }
        }
        let set = gauges.values().any(|v| *v != 0.0);
        if set {
            self.gauges = gauges;
        }
        set
    }

    fn gauge(&self, name: &str) -> Option<f64> {
        self.gauges.get(name).copied()
    }

    fn counter(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or_default()
    }
}

/// Polls `recorder` until a measurement satisfies `done` (10 s at most).
async fn poll_until(
    recorder: &DebuggingRecorder,
    polled: &mut Polled,
    namespace: &str,
    what: &str,
    done: impl Fn(&Polled) -> bool,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !(polled.poll(recorder, namespace) && done(polled)) {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {:?}",
            polled.gauges
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A `Worker` on a `MemoryInbox` exports what the dashboard's inbox row and the inbox alerts
/// read: attempts, retries and dead letters counted, and the pending, in flight, dead and
/// oldest-age gauges, all under the worker's namespace.
#[tokio::test(flavor = "current_thread")]
async fn a_worker_exports_the_inbox_counters_and_gauges() {
    use bytes::Bytes;
    use std::time::SystemTime;
    use tower_idempotency::inbox::Worker;
    use tower_idempotency::inbox::{Backoff, InboxEntry, InboxRequest, InboxStore, MemoryInbox};

    let recorder = DebuggingRecorder::new();
    let _metrics = metrics::set_default_local_recorder(&recorder);
    let inbox = MemoryInbox::new(100);
    let entry = |id: &str, body: &'static str| {
        values::inbox_entry(StoreKey::new("obs-inbox", None, id), Bytes::from(body), id)
    };
    // An older event that arrives while a newer one of its object runs, applied first: the
    // older is settled as stale.
    let object = tower_idempotency::store::ObjectKey::new("obs-inbox", None, "m_1");
    let position = tower_idempotency::order::Position::new;
    let ordered = |mut entry: InboxEntry, object, position| {
        entry.order = Some(tower_idempotency::inbox::EntryOrder {
            object,
            position,
            equal: tower_idempotency::order::EqualPositions::Process,
        });
        entry
    };
    let newer = ordered(entry("newer", "ok"), object.clone(), position(2));
    inbox.enqueue(newer).await.unwrap();
    let taken = inbox.take(1, Duration::from_secs(60)).await.unwrap();
    let older = ordered(entry("older", "ok"), object, position(1));
    inbox.enqueue(older).await.unwrap();
    let (key, token) = (&taken[0].entry.key, &taken[0].token);
    assert!(
        inbox
            .complete(&[(key.clone(), *token)], Duration::from_secs(60))
            .await
            .unwrap()[0]
    );
    inbox.enqueue(entry("ok", "ok")).await.unwrap();
    inbox.enqueue(entry("fails", "fail")).await.unwrap();
    // Due in an hour, stored two minutes ago: it stays pending and is the oldest entry.
    let mut later = entry("later", "ok");
    later.next_attempt_at = SystemTime::now() + Duration::from_secs(3600);
    later.enqueued_at = SystemTime::now() - Duration::from_secs(120);
    inbox.enqueue(later).await.unwrap();
    let (logs, _logging) = capture_logs(tracing::Level::INFO);

    let handler = tower::service_fn(|request: InboxRequest| async move {
        match &request.body()[..] {
            b"fail" => Err("the handler failed"),
            _ => Ok(()),
        }
    });
    let worker = Worker::new(inbox.clone(), handler)
        .namespace("obs-inbox")
        .retry(Backoff::new(Duration::from_millis(1)).max_attempts(2))
        .poll_interval(Duration::from_millis(5));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut polled = Polled::default();
    let watch = async {
        // Before the worker takes anything: four pending.
        poll_until(&recorder, &mut polled, "obs-inbox", "first", |p| {
            p.gauge("idempotency_inbox_pending").is_some()
        })
        .await;
        assert_eq!(polled.gauge("idempotency_inbox_pending"), Some(4.0));
        // Measured at most once a second: wait for the settled inbox.
        poll_until(&recorder, &mut polled, "obs-inbox", "settled", |p| {
            p.gauge("idempotency_inbox_dead") == Some(1.0)
        })
        .await;
        stop.send(()).unwrap();
    };
    tokio::join!(worker.run(async { stopped.await.unwrap() }), watch);
    polled.poll(&recorder, "obs-inbox");

    assert_eq!(polled.gauge("idempotency_inbox_pending"), Some(1.0));
    assert_eq!(polled.gauge("idempotency_inbox_in_flight"), Some(0.0));
    let age = polled
        .gauge("idempotency_inbox_oldest_age_seconds")
        .unwrap();
    assert!((120.0..3600.0).contains(&age), "oldest age {age}");
    // ok once; fails twice (a retry, then a dead letter); later not yet due.
    assert_eq!(polled.counter("idempotency_inbox_attempts_total"), 3);
    assert_eq!(polled.counter("idempotency_inbox_retries_total"), 1);
    assert_eq!(polled.counter("idempotency_inbox_dead_letters_total"), 1);
    assert_eq!(polled.counter("idempotency_inbox_stale_total"), 1);
    let counts = inbox.counts().await.unwrap();
    assert_eq!((counts.pending, counts.in_flight, counts.dead), (1, 0, 1));
    // The dead letter is an error line saying what to find and re-queue; the stale settlement
    // a line of its own.
    let logs = logs.text();
    let dead = logs
        .lines()
        .find(|line| line.contains("inbox: entry made a dead letter"))
        .unwrap_or_else(|| panic!("no dead letter line: {logs}"));
    assert!(dead.contains("ERROR"), "{dead}");
    let fails = StoreKey::new("obs-inbox", None, "fails");
    for part in [
        format!("key={fails}"),
        "correlation_id=fails".to_owned(),
        "attempts=2".to_owned(),
        "last_error=the handler failed".to_owned(),
    ] {
        assert!(dead.contains(&part), "{part} in {dead}");
    }
    let older = StoreKey::new("obs-inbox", None, "older");
    assert!(
        logs.lines()
            .any(|line| line.contains("stale entry settled")
                && line.contains(&format!("key={older}"))),
        "{logs}"
    );
}

/// While every worker is busy with a handler that does not end, the gauges still move: the
/// oldest entry's age grows (what IdempotencyInboxOldestEntryTooOld reads) and in flight shows
/// the busy worker.
#[tokio::test(flavor = "current_thread")]
async fn the_inbox_gauges_keep_moving_while_every_worker_is_busy() {
    use bytes::Bytes;
    use tower_idempotency::inbox::{InboxRequest, InboxStore, MemoryInbox, Worker};

    let recorder = DebuggingRecorder::new();
    let _metrics = metrics::set_default_local_recorder(&recorder);
    let inbox = MemoryInbox::new(100);
    for id in ["stuck", "behind"] {
        let key = StoreKey::new("obs-busy", None, id);
        inbox
            .enqueue(values::inbox_entry(key, Bytes::new(), id))
            .await
            .unwrap();
    }
    let gate = Arc::new(tokio::sync::Notify::new());
    let release = gate.clone();
    let handler = tower::service_fn(move |_request: InboxRequest| {
        let gate = gate.clone();
        async move {
            gate.notified().await;
            Ok::<(), std::convert::Infallible>(())
        }
    });
    let worker = Worker::new(inbox.clone(), handler)
        .namespace("obs-busy")
        .workers(1)
        .poll_interval(Duration::from_millis(5));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut polled = Polled::default();
    let watch = async {
        poll_until(&recorder, &mut polled, "obs-busy", "busy and aging", |p| {
            let age = p.gauge("idempotency_inbox_oldest_age_seconds");
            age.is_some_and(|age| age >= 1.5)
        })
        .await;
        assert_eq!(polled.gauge("idempotency_inbox_in_flight"), Some(1.0));
        assert_eq!(polled.gauge("idempotency_inbox_pending"), Some(1.0));
        // Both entries run, one after the other, then the worker stops.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        release.notify_one();
        while inbox.counts().await.unwrap().pending > 0 {
            assert!(std::time::Instant::now() < deadline, "the second never ran");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        release.notify_one();
        stop.send(()).unwrap();
    };
    tokio::join!(worker.run(async { stopped.await.unwrap() }), watch);
    assert_eq!(inbox.counts().await.unwrap().in_flight, 0);
}
