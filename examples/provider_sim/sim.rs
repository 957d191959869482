//! A webhook provider simulator: at-least-once delivery with injected faults, against two app
//! instances sharing one real `redis-server`, checking that the receiver's effects are
//! exactly-once.
//!
//! Used by the `provider_sim` example (`cargo run --all-features --example provider_sim --
//! --events 10000`) and by `tests/processes/faults.rs` (a smaller run), which includes it with
//!
//! ```ignore
//! #[path = "../../examples/provider_sim/sim.rs"]
//! mod provider_sim;
//! ```
//!
//! # What it does
//!
//! - Starts one `redis-server` on 127.0.0.1 (by default with `appendonly yes` and
//!   `appendfsync always`, so that a SIGKILL loses no acknowledged write) and two app instances:
//!   two axum servers on `127.0.0.1:0`, each with its own fred pool and [`RedisStore`]. Each app
//!   is `IdempotencyLayer` (keyed by `X-Kalipto-Delivery-Id`) over tower-http's
//!   `CatchPanicLayer` over the handler, so a panic becomes a 500 that releases the claim.
//! - Sends `events` unique events. Each event is delivered one to three times (a duplicate is
//!   either concurrent with the first delivery or comes later), each delivery to a random
//!   instance, over HTTP/1 on loopback. Every non-2xx answer (and every dropped connection) is
//!   retried on the Kalipto schedule (1, 5, 30, 120 and 360 minutes), compressed to
//!   milliseconds: at most 1 + 5 attempts per delivery.
//! - Injects faults per attempt: the handler answers 500, panics, or runs longer than the lease;
//!   the client disconnects mid-request (the connection is closed after a random delay, so the
//!   server drops the request future); Redis is killed (SIGKILL) and restarted in the middle of
//!   the run.
//! - Counts each effect (the handler's work, applied once it succeeded) per event, and checks:
//!   no event acknowledged (2xx) without an effect ("lost"), no 2xx before the first effect,
//!   and no double effect without a documented cause. The documented causes, each counted in
//!   its own row: a lease that expired before the success was recorded (a handler slower than
//!   the lease; a retry after the expiry is processed again), a success whose record could not
//!   be written because Redis was down (the claim expires with its lease), and, only in runs
//!   without persistence, records forgotten by a Redis restart. A store wrapper ([`Tracked`])
//!   logs every `complete`, which is what ties a double effect to its cause; a completion
//!   abandoned because the request future was dropped is *not* a documented cause.
#![allow(dead_code)]

#[path = "redis_server.rs"]
mod redis_server;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::Semaphore;
use tower_http::catch_panic::CatchPanicLayer;
use tower_idempotency::IdempotencyStore;
use tower_idempotency::key::HeaderKey;
use tower_idempotency::store::record::Record;
use tower_idempotency::store::{Claim, Completion, Reservation, StoreError, StoreKey, Target};
use tower_idempotency::{IdempotencyLayer, RedisStore};

pub use self::redis_server::RedisServer;

/// The layer's namespace in both app instances.
pub const NAMESPACE: &str = "kalipto";
/// The webhook route.
pub const PATH: &str = "/webhooks/kalipto";
/// The key header.
pub const KEY_HEADER: &str = "x-kalipto-delivery-id";
/// Kalipto's retry schedule, in minutes after the previous attempt.
pub const KALIPTO_BACKOFF_MINUTES: [u64; 5] = [1, 5, 30, 120, 360];

const FAULT_HEADER: &str = "x-sim-fault";
const WORK_HEADER: &str = "x-sim-work-us";
const INJECTED_PANIC: &str = "provider_sim: injected handler panic";

/// The knobs of one run.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Unique events to send.
    pub events: usize,
    /// Seed of the fault and delivery choices (timing still varies between runs).
    pub seed: u64,
    /// Events in progress at once.
    pub concurrency: usize,
    /// The layer's lease.
    pub lease: Duration,
    /// The layer's store timeout.
    pub store_timeout: Duration,
    /// One Kalipto "minute", compressed.
    pub minute: Duration,
    /// Handler work before its effect, in microseconds (uniform in the range).
    pub work_us: (u64, u64),
    /// Probability that an attempt's handler answers 500.
    pub p_fail: f64,
    /// Probability that an attempt's handler panics.
    pub p_panic: f64,
    /// Probability that an attempt's handler runs 1.6 × the lease before its effect.
    pub p_slow: f64,
    /// Probability that the client of an attempt disconnects mid-request.
    pub p_disconnect: f64,
    /// Probability that a duplicate delivery is sent concurrently with the first (else later).
    pub p_concurrent: f64,
    /// The latest a later duplicate delivery starts after the first one.
    pub later_max: Duration,
    /// Kill Redis once this fraction of the events has started (`None`: never).
    pub redis_kill_at: Option<f64>,
    /// How long Redis stays down.
    pub redis_outage: Duration,
    /// Run Redis with `appendonly yes` and `appendfsync always` (the default). Without it a
    /// restart empties the store, and the records of completed events are forgotten.
    pub persistence: bool,
    /// How long the provider waits for one answer before giving up on the attempt.
    pub request_timeout: Duration,
    /// A delay before each `complete` reaches Redis (default zero); see [`Tracked`].
    pub complete_delay: Duration,
}

impl SimConfig {
    /// The defaults for `events` events: 10 % handler 500s, 3 % panics, 0.5 % handlers slower
    /// than a 250 ms lease, 3 % client disconnects, Redis killed at 40 % of the run for 300 ms,
    /// one Kalipto minute = 2 ms.
    pub fn new(events: usize) -> Self {
        SimConfig {
            events,
            seed: 0x5eed,
            concurrency: 128,
            lease: Duration::from_millis(250),
            store_timeout: Duration::from_millis(200),
            minute: Duration::from_millis(2),
            work_us: (200, 3_000),
            p_fail: 0.10,
            p_panic: 0.03,
            p_slow: 0.005,
            p_disconnect: 0.03,
            p_concurrent: 0.5,
            later_max: Duration::from_millis(800),
            redis_kill_at: Some(0.4),
            redis_outage: Duration::from_millis(300),
            persistence: true,
            request_timeout: Duration::from_secs(10),
            complete_delay: Duration::ZERO,
        }
    }

    /// The compressed retry delays.
    pub fn backoff(&self) -> Vec<Duration> {
        KALIPTO_BACKOFF_MINUTES
            .iter()
            .map(|m| self.minute * (*m as u32))
            .collect()
    }
}

/// A small deterministic generator (SplitMix64): no dependency, reproducible choices.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` and `stream` (one stream per event).
    pub fn new(seed: u64, stream: u64) -> Self {
        let mut rng = Rng(seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        rng.next_u64();
        rng
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[lo, hi]`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// The fault injected into one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    None,
    Fail,
    Panic,
    Slow,
    Disconnect,
}

impl Fault {
    fn header(self) -> Option<&'static str> {
        match self {
            Fault::Fail => Some("fail"),
            Fault::Panic => Some("panic"),
            Fault::Slow => Some("slow"),
            Fault::None | Fault::Disconnect => None,
        }
    }
}

/// One effect: an event applied by a handler.
#[derive(Clone, Copy, Debug)]
struct Effect {
    instance: usize,
    started: Instant,
    applied: Instant,
}

/// The application's side effects, per event key.
#[derive(Clone, Default)]
struct Ledger(Arc<Mutex<HashMap<String, Vec<Effect>>>>);

impl Ledger {
    fn apply(&self, key: &str, effect: Effect) {
        self.0
            .lock()
            .unwrap()
            .entry(key.to_owned())
            .or_default()
            .push(effect);
    }

    fn effects(&self, key: &str) -> Vec<Effect> {
        self.0.lock().unwrap().get(key).cloned().unwrap_or_default()
    }
}

/// What happened to the `complete` calls of one key.
#[derive(Clone, Copy, Debug, Default)]
pub struct KeyLog {
    /// Records written.
    pub recorded: u32,
    /// `complete` found the claim gone: the lease had expired.
    pub lease_lost: u32,
    /// `complete` failed or timed out (a store error).
    pub write_failed: u32,
    /// `complete` was dropped before the store timeout: the request future was cancelled
    /// after the inner service succeeded. Not a documented cause of double effects.
    pub cancelled: u32,
}

/// A store that delegates to `St` and logs the result of every `complete`, so that the harness
/// can tell which successes were not recorded.
///
/// `complete_delay` makes every `complete` wait before it reaches the store, like a store whose
/// calls only start on a later poll (a pooled SQL connection): it widens the window in which a
/// cancelled request future can abandon a completion.
#[derive(Clone)]
pub struct Tracked<St> {
    inner: St,
    log: Arc<Mutex<HashMap<StoreKey, KeyLog>>>,
    store_timeout: Duration,
    complete_delay: Duration,
}

impl<St> Tracked<St> {
    fn new(
        inner: St,
        log: Arc<Mutex<HashMap<StoreKey, KeyLog>>>,
        store_timeout: Duration,
        complete_delay: Duration,
    ) -> Self {
        Tracked {
            inner,
            log,
            store_timeout,
            complete_delay,
        }
    }
}

/// Logs the result of a `complete`, or, when it is dropped unfinished, whether the layer's
/// store timeout dropped it (a store error) or the request future was cancelled.
struct CompleteGuard {
    log: Arc<Mutex<HashMap<StoreKey, KeyLog>>>,
    key: StoreKey,
    result: Option<Result<bool, ()>>,
    started: Instant,
    store_timeout: Duration,
}

impl Drop for CompleteGuard {
    fn drop(&mut self) {
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let entry = log.entry(self.key.clone()).or_default();
        match self.result {
            Some(Ok(true)) => entry.recorded += 1,
            Some(Ok(false)) => entry.lease_lost += 1,
            Some(Err(())) => entry.write_failed += 1,
            // The layer's timeout fires at the store timeout; allow for timer granularity.
            None if self.started.elapsed() + Duration::from_millis(5) >= self.store_timeout => {
                entry.write_failed += 1
            }
            None => entry.cancelled += 1,
        }
    }
}

impl<St: IdempotencyStore> IdempotencyStore for Tracked<St> {
    async fn reserve(
        &self,
        targets: &[Target],
        claim: &Claim,
        lease: Duration,
    ) -> Result<Vec<Reservation>, StoreError> {
        self.inner.reserve(targets, claim, lease).await
    }

    /// Logged under the first target's key: the simulator's routes claim one key each.
    async fn complete(
        &self,
        targets: &[Target],
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> Result<Vec<Completion>, StoreError> {
        let Some(first) = targets.first() else {
            return Ok(Vec::new());
        };
        let mut guard = CompleteGuard {
            log: self.log.clone(),
            key: first.key.clone(),
            result: None,
            started: Instant::now(),
            store_timeout: self.store_timeout,
        };
        if !self.complete_delay.is_zero() {
            tokio::time::sleep(self.complete_delay).await;
        }
        let result = self.inner.complete(targets, claim, record, retention).await;
        guard.result = Some(
            result
                .as_ref()
                .map(|done| !done.contains(&Completion::Lost))
                .map_err(|_| ()),
        );
        result
    }

    async fn release(&self, targets: &[Target], claim: &Claim) -> Result<usize, StoreError> {
        self.inner.release(targets, claim).await
    }

    async fn renew(
        &self,
        targets: &[Target],
        claim: &Claim,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.inner.renew(targets, claim, lease).await
    }
}

#[derive(Clone)]
struct AppState {
    instance: usize,
    ledger: Ledger,
    slow: Duration,
    cancelled: Arc<AtomicUsize>,
}

/// Counts handlers whose future was dropped before they finished: the server cancelled them
/// because the client disconnected (proof that the disconnects are real).
struct CancelGuard {
    cancelled: Arc<AtomicUsize>,
    finished: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.finished && !std::thread::panicking() {
            self.cancelled.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The receiver's handler: some work, then the injected fault, then the effect (applied in
/// the same poll as the response is returned: there is no await between them).
async fn webhook(State(app): State<AppState>, headers: HeaderMap, _body: Bytes) -> Response {
    let started = Instant::now();
    let mut guard = CancelGuard {
        cancelled: app.cancelled.clone(),
        finished: false,
    };
    let key = headers
        .get(KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let work = headers
        .get(WORK_HEADER)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    tokio::time::sleep(Duration::from_micros(work)).await;
    match headers.get(FAULT_HEADER).and_then(|v| v.to_str().ok()) {
        Some("fail") => {
            guard.finished = true;
            return (StatusCode::INTERNAL_SERVER_ERROR, "injected failure").into_response();
        }
        Some("panic") => panic!("{INJECTED_PANIC}"),
        Some("slow") => tokio::time::sleep(app.slow).await,
        _ => {}
    }
    guard.finished = true;
    app.ledger.apply(
        &key,
        Effect {
            instance: app.instance,
            started,
            applied: Instant::now(),
        },
    );
    (StatusCode::OK, "applied").into_response()
}

fn app(
    instance: usize,
    store: Tracked<RedisStore<fred::clients::Pool>>,
    config: &SimConfig,
    ledger: &Ledger,
    cancelled: &Arc<AtomicUsize>,
) -> Router {
    let layer = IdempotencyLayer::new(store)
        .namespace(NAMESPACE)
        .key(HeaderKey::new(KEY_HEADER).unwrap())
        .lease(config.lease)
        .store_timeout(config.store_timeout);
    Router::new()
        // CatchPanicLayer inside the idempotency layer: a panic is a 500, which releases.
        .route(PATH, post(webhook).layer(CatchPanicLayer::new()))
        .route_layer(layer)
        .with_state(AppState {
            instance,
            ledger: ledger.clone(),
            slow: config.lease * 8 / 5,
            cancelled: cancelled.clone(),
        })
}

/// What one attempt got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Status { status: u16, replayed: bool },
    Disconnected,
    TransportError,
}

/// The answer `response` gives, once its body is read: a body cut short is a transport error.
async fn read_answer(response: http::Response<hyper::body::Incoming>) -> Answer {
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key("idempotent-replayed");
    match response.into_body().collect().await {
        Ok(_) => Answer::Status { status, replayed },
        Err(_) => Answer::TransportError,
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    deliveries: u64,
    attempts: u64,
    ok_first: u64,
    ok_replayed: u64,
    conflict_409: u64,
    unavailable_503: u64,
    server_error_500: u64,
    other_status: u64,
    disconnects: u64,
    transport_errors: u64,
    injected_fail: u64,
    injected_panic: u64,
    injected_slow: u64,
    injected_disconnect: u64,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.deliveries += o.deliveries;
        self.attempts += o.attempts;
        self.ok_first += o.ok_first;
        self.ok_replayed += o.ok_replayed;
        self.conflict_409 += o.conflict_409;
        self.unavailable_503 += o.unavailable_503;
        self.server_error_500 += o.server_error_500;
        self.other_status += o.other_status;
        self.disconnects += o.disconnects;
        self.transport_errors += o.transport_errors;
        self.injected_fail += o.injected_fail;
        self.injected_panic += o.injected_panic;
        self.injected_slow += o.injected_slow;
        self.injected_disconnect += o.injected_disconnect;
    }

    fn count(&mut self, answer: Answer) {
        match answer {
            Answer::Status { status, replayed } => match status {
                200..=299 if replayed => self.ok_replayed += 1,
                200..=299 => self.ok_first += 1,
                409 => self.conflict_409 += 1,
                500 => self.server_error_500 += 1,
                503 => self.unavailable_503 += 1,
                _ => self.other_status += 1,
            },
            Answer::Disconnected => self.disconnects += 1,
            Answer::TransportError => self.transport_errors += 1,
        }
    }
}

/// What the provider saw of one event.
#[derive(Debug)]
struct EventOutcome {
    key: String,
    tally: Tally,
    /// When each 2xx answer arrived.
    acks: Vec<Instant>,
    /// The answers of each delivery, in order: a status, `disconnect` or `transport`.
    history: Vec<Vec<String>>,
}

/// The provider: an HTTP client and the two instances' addresses.
struct Provider {
    client: Client<HttpConnector, Full<Bytes>>,
    addrs: [SocketAddr; 2],
    config: SimConfig,
}

impl Provider {
    fn request(
        &self,
        addr: SocketAddr,
        key: &str,
        body: &Bytes,
        fault: Fault,
        work_us: u64,
    ) -> Request<Full<Bytes>> {
        let mut builder = Request::post(format!("http://{addr}{PATH}"))
            .header("content-type", "application/json")
            .header(KEY_HEADER, key)
            .header(WORK_HEADER, work_us.to_string());
        if let Some(fault) = fault.header() {
            builder = builder.header(FAULT_HEADER, fault);
        }
        builder.body(Full::new(body.clone())).unwrap()
    }

    /// One attempt over a pooled connection.
    async fn send(&self, request: Request<Full<Bytes>>) -> Answer {
        let response =
            tokio::time::timeout(self.config.request_timeout, self.client.request(request));
        match response.await {
            Ok(Ok(response)) => read_answer(response).await,
            _ => Answer::TransportError,
        }
    }

    /// One attempt over a connection of its own, closed after `abort_after` if no answer came:
    /// a real client disconnect, seen by the server as EOF mid-request.
    async fn send_and_disconnect(
        &self,
        addr: SocketAddr,
        request: Request<Full<Bytes>>,
        abort_after: Duration,
    ) -> Answer {
        let Ok(stream) = tokio::net::TcpStream::connect(addr).await else {
            return Answer::TransportError;
        };
        let Ok((mut sender, conn)) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
        else {
            return Answer::TransportError;
        };
        let conn = tokio::spawn(conn);
        let answer = match tokio::time::timeout(abort_after, sender.send_request(request)).await {
            Ok(Ok(response)) => read_answer(response).await,
            Ok(Err(_)) => Answer::TransportError,
            Err(_) => Answer::Disconnected,
        };
        drop(sender);
        // Dropping the connection task closes the socket.
        conn.abort();
        answer
    }

    /// One delivery: attempts until a 2xx, on the compressed Kalipto schedule.
    async fn deliver(&self, key: &str, body: &Bytes, mut rng: Rng, out: &Mutex<EventOutcome>) {
        let config = &self.config;
        let delays = std::iter::once(Duration::ZERO).chain(config.backoff());
        let mut tally = Tally {
            deliveries: 1,
            ..Tally::default()
        };
        let mut history = Vec::new();
        for delay in delays {
            tokio::time::sleep(delay).await;
            let addr = self.addrs[rng.range(0, 1) as usize];
            let roll = rng.unit();
            let fault = if roll < config.p_fail {
                Fault::Fail
            } else if roll < config.p_fail + config.p_panic {
                Fault::Panic
            } else if roll < config.p_fail + config.p_panic + config.p_slow {
                Fault::Slow
            } else if roll < config.p_fail + config.p_panic + config.p_slow + config.p_disconnect {
                Fault::Disconnect
            } else {
                Fault::None
            };
            let work_us = match fault {
                // A longer handler, so that most disconnects land while it works.
                Fault::Disconnect => rng.range(5_000, 20_000),
                _ => rng.range(config.work_us.0, config.work_us.1),
            };
            let request = self.request(addr, key, body, fault, work_us);
            tally.attempts += 1;
            let answer = match fault {
                Fault::Disconnect => {
                    tally.injected_disconnect += 1;
                    // Mostly while the handler works; sometimes before it starts, or after it
                    // answered.
                    let abort_after = Duration::from_micros(rng.range(0, work_us + 5_000));
                    self.send_and_disconnect(addr, request, abort_after).await
                }
                _ => {
                    match fault {
                        Fault::Fail => tally.injected_fail += 1,
                        Fault::Panic => tally.injected_panic += 1,
                        Fault::Slow => tally.injected_slow += 1,
                        _ => {}
                    }
                    self.send(request).await
                }
            };
            tally.count(answer);
            history.push(match answer {
                Answer::Status { status, .. } => status.to_string(),
                Answer::Disconnected => "disconnect".to_owned(),
                Answer::TransportError => "transport".to_owned(),
            });
            if let Answer::Status { status, .. } = answer {
                if (200..300).contains(&status) {
                    out.lock().unwrap().acks.push(Instant::now());
                    break;
                }
            }
        }
        let mut out = out.lock().unwrap();
        out.tally.add(&tally);
        out.history.push(history);
    }

    /// One event: one to three deliveries, a duplicate concurrent with the first or later.
    async fn event(&self, index: usize) -> EventOutcome {
        let config = &self.config;
        let mut rng = Rng::new(config.seed, index as u64);
        let key = format!("evt_{:x}_{index}", config.seed);
        let body = Bytes::from(format!(
            r#"{{"id":"{key}","type":"payment.succeeded","amount":{}}}"#,
            rng.range(100, 100_000)
        ));
        let roll = rng.unit();
        let deliveries = if roll < 0.5 {
            1
        } else if roll < 0.8 {
            2
        } else {
            3
        };
        let out = Mutex::new(EventOutcome {
            key: key.clone(),
            tally: Tally::default(),
            acks: Vec::new(),
            history: Vec::new(),
        });
        let mut runs = Vec::new();
        for d in 0..deliveries {
            let offset = if d == 0 {
                Duration::ZERO
            } else if rng.unit() < config.p_concurrent {
                Duration::from_micros(rng.range(0, 2_000))
            } else {
                Duration::from_micros(rng.range(20_000, config.later_max.as_micros() as u64))
            };
            let delivery_rng = Rng::new(rng.next_u64(), d as u64);
            let (key, body, out) = (&key, &body, &out);
            runs.push(async move {
                tokio::time::sleep(offset).await;
                self.deliver(key, body, delivery_rng, out).await;
            });
        }
        futures_util::future::join_all(runs).await;
        out.into_inner().unwrap()
    }
}

/// The figures of one run.
#[derive(Clone, Debug, Default)]
pub struct SimReport {
    /// The configuration, for the header line.
    pub summary: String,
    /// Unique events sent.
    pub events: u64,
    /// Deliveries (1 to 3 per event).
    pub deliveries: u64,
    /// HTTP attempts.
    pub attempts: u64,
    /// Attempts beyond the first of each delivery.
    pub retries: u64,
    /// 2xx answers from the handler itself.
    pub ok_first: u64,
    /// 2xx answers given by the layer to duplicates (`Idempotent-Replayed: true`).
    pub ok_replayed: u64,
    /// 409 answers (duplicate while in flight).
    pub conflict_409: u64,
    /// 503 answers (store unavailable).
    pub unavailable_503: u64,
    /// 500 answers (injected failures and caught panics).
    pub server_error_500: u64,
    /// Any other status (none expected).
    pub other_status: u64,
    /// Attempts the client abandoned mid-request.
    pub disconnects: u64,
    /// Handlers the server cancelled (future dropped) after their client disconnected.
    pub handlers_cancelled: u64,
    /// Attempts that failed at the transport (connection refused, reset, timeout).
    pub transport_errors: u64,
    /// Injected faults, by kind.
    pub injected_fail: u64,
    /// Injected panics.
    pub injected_panic: u64,
    /// Injected handlers slower than the lease.
    pub injected_slow: u64,
    /// Injected client disconnects.
    pub injected_disconnect: u64,
    /// Effects applied in all.
    pub effects: u64,
    /// Events applied exactly once.
    pub exactly_once: u64,
    /// Extra effects explained by a lease that expired before the success was recorded.
    pub double_lease_expiry: u64,
    /// Of those, the ones where the handler itself ran longer than the lease.
    pub double_lease_expiry_slow_handler: u64,
    /// Extra effects explained by a success whose record could not be written (store down).
    pub double_record_failed: u64,
    /// Extra effects explained by a Redis restart without persistence (records forgotten);
    /// only counted when the run disables persistence.
    pub double_store_reset: u64,
    /// Extra effects with no documented explanation (must be 0).
    pub double_unexplained: u64,
    /// Events acknowledged with a 2xx that have no effect (must be 0).
    pub lost: u64,
    /// 2xx answers received before the event's first effect (must be 0).
    pub ack_before_effect: u64,
    /// Events whose every delivery exhausted its attempts without a 2xx.
    pub undelivered: u64,
    /// Undelivered events that nevertheless have an effect.
    pub undelivered_with_effect: u64,
    /// Successes not recorded because the lease had expired (`complete` found another owner or
    /// nothing).
    pub completes_lease_lost: u64,
    /// Successes not recorded because the store failed or timed out.
    pub completes_failed: u64,
    /// Completions abandoned because the request future was dropped (client disconnect).
    pub completes_cancelled: u64,
    /// When Redis was killed and back, from the start of the run.
    pub redis_down: Option<(Duration, Duration)>,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Examples of unexplained events, for the failure message.
    pub unexplained_examples: Vec<String>,
    /// Examples of undelivered events: the answers each delivery got.
    pub undelivered_examples: Vec<String>,
    /// Examples of unexpected statuses.
    pub other_status_examples: Vec<String>,
}

impl SimReport {
    /// `Err` with the reasons when an invariant is broken: an event lost, a 2xx before the
    /// effect, an unexplained double effect, or an unexpected status.
    pub fn check(&self) -> Result<(), String> {
        let mut problems = Vec::new();
        if self.lost > 0 {
            problems.push(format!(
                "{} events acknowledged without an effect",
                self.lost
            ));
        }
        if self.ack_before_effect > 0 {
            problems.push(format!(
                "{} 2xx answers before the first effect",
                self.ack_before_effect
            ));
        }
        if self.double_unexplained > 0 {
            problems.push(format!(
                "{} unexplained double effects: {:?}",
                self.double_unexplained, self.unexplained_examples
            ));
        }
        if self.other_status > 0 {
            problems.push(format!(
                "{} unexpected statuses: {:?}",
                self.other_status, self.other_status_examples
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }

    /// The report as a Markdown table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "{}", self.summary);
        let _ = writeln!(out);
        let _ = writeln!(out, "| figure | count |");
        let _ = writeln!(out, "|---|---:|");
        let mut row = |name: &str, value: String| {
            let _ = writeln!(out, "| {name} | {value} |");
        };
        row("events sent", self.events.to_string());
        row("deliveries (1 to 3 per event)", self.deliveries.to_string());
        row("HTTP attempts", self.attempts.to_string());
        row(
            "retries (attempts after a non-2xx or a disconnect)",
            self.retries.to_string(),
        );
        row(
            "injected: handler 500 / panic / slower than lease / client disconnect",
            format!(
                "{} / {} / {} / {}",
                self.injected_fail,
                self.injected_panic,
                self.injected_slow,
                self.injected_disconnect
            ),
        );
        row("2xx processed by the handler", self.ok_first.to_string());
        row(
            "2xx duplicate acks (Idempotent-Replayed)",
            self.ok_replayed.to_string(),
        );
        row("409 in flight", self.conflict_409.to_string());
        row("503 store unavailable", self.unavailable_503.to_string());
        row(
            "500 (injected failures and caught panics)",
            self.server_error_500.to_string(),
        );
        row(
            "client disconnects (no answer)",
            self.disconnects.to_string(),
        );
        row(
            "handlers cancelled by the server after a disconnect",
            self.handlers_cancelled.to_string(),
        );
        row("transport errors", self.transport_errors.to_string());
        row("other statuses", self.other_status.to_string());
        row("effects", self.effects.to_string());
        row("events applied exactly once", self.exactly_once.to_string());
        row(
            "double effects: lease expired before the success was recorded (documented)",
            format!(
                "{} ({} with the handler itself slower than the lease)",
                self.double_lease_expiry, self.double_lease_expiry_slow_handler
            ),
        );
        row(
            "double effects: record not written, Redis down (documented)",
            self.double_record_failed.to_string(),
        );
        if self.double_store_reset > 0 {
            row(
                "double effects: records forgotten, Redis restarted without persistence",
                self.double_store_reset.to_string(),
            );
        }
        row(
            "double effects: unexplained",
            self.double_unexplained.to_string(),
        );
        row("lost (2xx without an effect)", self.lost.to_string());
        row(
            "2xx before the first effect",
            self.ack_before_effect.to_string(),
        );
        row(
            "undelivered (every attempt failed; never acknowledged)",
            format!(
                "{} ({} with an effect)",
                self.undelivered, self.undelivered_with_effect
            ),
        );
        row(
            "successes not recorded: lease lost / store error / cancelled with the request",
            format!(
                "{} / {} / {}",
                self.completes_lease_lost, self.completes_failed, self.completes_cancelled
            ),
        );
        for example in &self.undelivered_examples {
            row(
                "undelivered example (answers per delivery)",
                example.clone(),
            );
        }
        if let Some((down, up)) = self.redis_down {
            row(
                "Redis killed / back at",
                format!("{:.2} s / {:.2} s", down.as_secs_f64(), up.as_secs_f64()),
            );
        }
        row("wall time", format!("{:.1} s", self.elapsed.as_secs_f64()));
        out
    }
}

/// Silences the panics the harness injects (they are expected), and only those.
fn silence_injected_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied());
            if message.is_some_and(|m| m.contains(INJECTED_PANIC)) {
                return;
            }
            default(info);
        }));
    });
}

/// Starts `redis-server`, with persistence through a wrapper script that appends
/// `--appendonly yes --appendfsync always` to the harness's arguments (later arguments win).
fn start_redis(persistence: bool) -> (RedisServer, Option<std::path::PathBuf>) {
    if !persistence {
        return (RedisServer::start(), None);
    }
    use std::os::unix::fs::PermissionsExt;
    static N: AtomicUsize = AtomicUsize::new(0);
    let real = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
    let dir = std::env::temp_dir().join(format!(
        "provider-sim-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create the wrapper directory");
    let script = dir.join("redis-server-aof");
    std::fs::write(
        &script,
        format!("#!/bin/sh\nexec '{real}' \"$@\" --appendonly yes --appendfsync always\n"),
    )
    .expect("write the redis-server wrapper");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
        .expect("make the wrapper executable");
    let server = RedisServer::start_with_binary(script.to_str().expect("UTF-8 temp path"));
    (server, Some(dir))
}

async fn serve(router: Router) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    (addr, task)
}

/// Runs the simulation and returns its figures. Needs a multi-threaded Tokio runtime.
pub async fn run(config: SimConfig) -> SimReport {
    silence_injected_panics();
    let persistence = config.persistence;
    let (server, wrapper_dir) = tokio::task::spawn_blocking(move || start_redis(persistence))
        .await
        .unwrap();
    let ledger = Ledger::default();
    let cancelled = Arc::new(AtomicUsize::new(0));
    let log = Arc::new(Mutex::new(HashMap::new()));
    let mut servers = Vec::new();
    let mut addrs = Vec::new();
    for instance in 0..2 {
        let store = Tracked::new(
            RedisStore::new(server.connect_pool(2).await),
            log.clone(),
            config.store_timeout,
            config.complete_delay,
        );
        let (addr, task) = serve(app(instance, store, &config, &ledger, &cancelled)).await;
        addrs.push(addr);
        servers.push(task);
    }
    let server = Arc::new(Mutex::new(server));
    let provider = Arc::new(Provider {
        client: Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(5))
            .build_http(),
        addrs: [addrs[0], addrs[1]],
        config: config.clone(),
    });

    let started = Instant::now();
    let begun = Arc::new(AtomicUsize::new(0));
    // The Redis fault: kill once a fraction of the events has started, restart after the outage.
    let chaos = config.redis_kill_at.map(|fraction| {
        let (server, begun) = (server.clone(), begun.clone());
        let threshold = ((config.events as f64 * fraction) as usize).max(1);
        let outage = config.redis_outage;
        tokio::spawn(async move {
            while begun.load(Ordering::Relaxed) < threshold {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let s = server.clone();
            tokio::task::spawn_blocking(move || s.lock().unwrap().kill())
                .await
                .unwrap();
            let down = started.elapsed();
            tokio::time::sleep(outage).await;
            tokio::task::spawn_blocking(move || server.lock().unwrap().restart())
                .await
                .unwrap();
            (down, started.elapsed())
        })
    });

    let permits = Arc::new(Semaphore::new(config.concurrency));
    let mut tasks = Vec::with_capacity(config.events);
    for index in 0..config.events {
        let permit = permits.clone().acquire_owned().await.unwrap();
        begun.fetch_add(1, Ordering::Relaxed);
        let provider = provider.clone();
        tasks.push(tokio::spawn(async move {
            let outcome = provider.event(index).await;
            drop(permit);
            outcome
        }));
    }
    let mut outcomes = Vec::with_capacity(config.events);
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    let redis_down = match chaos {
        Some(task) => Some(task.await.unwrap()),
        None => None,
    };
    // Let abandoned handlers and background releases settle before counting.
    tokio::time::sleep(config.lease * 2).await;
    let elapsed = started.elapsed();

    let mut report = SimReport {
        summary: format!(
            "provider_sim: {} events, seed {:#x}, 2 instances, lease {:?}, store timeout {:?}, \
             backoff {:?}, Redis {} killed at {:.0}% for {:?}",
            config.events,
            config.seed,
            config.lease,
            config.store_timeout,
            config.backoff(),
            if config.persistence {
                "(appendonly, appendfsync always)"
            } else {
                "(no persistence)"
            },
            config.redis_kill_at.unwrap_or(0.0) * 100.0,
            config.redis_outage,
        ),
        events: config.events as u64,
        handlers_cancelled: cancelled.load(Ordering::Relaxed) as u64,
        redis_down,
        elapsed,
        ..SimReport::default()
    };
    let mut tally = Tally::default();
    let log = log.lock().unwrap().clone();
    for outcome in &outcomes {
        tally.add(&outcome.tally);
        for answer in outcome.history.iter().flatten() {
            let expected = ["200", "409", "500", "503", "disconnect"];
            if !expected.contains(&answer.as_str()) && report.other_status_examples.len() < 5 {
                report
                    .other_status_examples
                    .push(format!("{}: {answer}", outcome.key));
            }
        }
        let effects = ledger.effects(&outcome.key);
        let store_key = StoreKey::new(NAMESPACE, Some(PATH), &outcome.key);
        let key_log = log.get(&store_key).copied().unwrap_or_default();
        report.completes_lease_lost += u64::from(key_log.lease_lost);
        report.completes_failed += u64::from(key_log.write_failed);
        report.completes_cancelled += u64::from(key_log.cancelled);
        report.effects += effects.len() as u64;
        let first_effect = effects.iter().map(|e| e.applied).min();
        let acked = !outcome.acks.is_empty();
        if acked && effects.is_empty() {
            report.lost += 1;
        }
        report.ack_before_effect += outcome
            .acks
            .iter()
            .filter(|ack| first_effect.is_none_or(|first| **ack < first))
            .count() as u64;
        if !acked {
            report.undelivered += 1;
            if report.undelivered_examples.len() < 5 {
                report
                    .undelivered_examples
                    .push(format!("{}: {:?}", outcome.key, outcome.history));
            }
            if !effects.is_empty() {
                report.undelivered_with_effect += 1;
            }
        }
        match effects.len() {
            0 => {}
            1 => report.exactly_once += 1,
            n => {
                let mut extra = (n - 1) as u64;
                // A success whose lease expired before it was recorded (its completion found
                // the claim gone) lets a later attempt through. Usually the handler itself
                // outlived the lease; under load the store or the scheduler can add the rest.
                let lease = extra.min(u64::from(key_log.lease_lost));
                extra -= lease;
                let overran = effects
                    .iter()
                    .filter(|e| e.applied.duration_since(e.started) >= config.lease)
                    .count() as u64;
                report.double_lease_expiry_slow_handler += lease.min(overran);
                let store = extra.min(u64::from(key_log.write_failed));
                extra -= store;
                // Without persistence, a restart forgets the records written before the kill.
                let reset = match redis_down {
                    Some((down, up)) if !config.persistence => {
                        let before = effects
                            .iter()
                            .filter(|e| e.applied < started + down)
                            .count() as u64;
                        let after =
                            effects.iter().filter(|e| e.started >= started + up).count() as u64;
                        extra.min(before.min(after))
                    }
                    _ => 0,
                };
                extra -= reset;
                report.double_lease_expiry += lease;
                report.double_record_failed += store;
                report.double_store_reset += reset;
                report.double_unexplained += extra;
                if extra > 0 && report.unexplained_examples.len() < 5 {
                    report.unexplained_examples.push(format!(
                        "{}: {} effects {:?}, completes {:?}",
                        outcome.key,
                        n,
                        effects
                            .iter()
                            .map(|e| (
                                e.instance,
                                e.started.duration_since(started),
                                e.applied.duration_since(e.started)
                            ))
                            .collect::<Vec<_>>(),
                        key_log
                    ));
                }
            }
        }
    }
    report.deliveries = tally.deliveries;
    report.attempts = tally.attempts;
    report.retries = tally.attempts - tally.deliveries;
    report.ok_first = tally.ok_first;
    report.ok_replayed = tally.ok_replayed;
    report.conflict_409 = tally.conflict_409;
    report.unavailable_503 = tally.unavailable_503;
    report.server_error_500 = tally.server_error_500;
    report.other_status = tally.other_status;
    report.disconnects = tally.disconnects;
    report.transport_errors = tally.transport_errors;
    report.injected_fail = tally.injected_fail;
    report.injected_panic = tally.injected_panic;
    report.injected_slow = tally.injected_slow;
    report.injected_disconnect = tally.injected_disconnect;

    for task in servers {
        task.abort();
    }
    drop(server);
    if let Some(dir) = wrapper_dir {
        let _ = std::fs::remove_dir_all(dir);
    }
    report
}
