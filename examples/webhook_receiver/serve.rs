//! How the demo serves connections, with the bounds a production server needs too:
//!
//! - **Header deadline.** A connection that has not delivered a complete request head
//!   (HTTP/1) or HEADERS frame (HTTP/2) within `header_timeout` of its accept is dropped,
//!   whatever it sent: nothing, one byte, part of the HTTP/2 preface, the preface and a
//!   SETTINGS frame, a dripped head. The deadline is disarmed when the service is first called,
//!   which is the only point both protocols share (hyper-util's automatic protocol choice runs
//!   no timer while it reads the preface, and HTTP/2 has no header timeout at all). Later
//!   HTTP/1 heads are due within `header_timeout` of the previous request's end, on the same
//!   timer (hyper's own header read timeout would arm a timer per request).
//! - **Idle deadline.** A connection with no request in flight for `idle_timeout` is shut down
//!   gracefully (HTTP/2: GOAWAY). HTTP/2 keep-alive pings every `idle_timeout` close a peer
//!   that stops answering, even while a request runs.
//! - **Connection limit.** At most `max_connections` are served at once; a connection beyond
//!   that is accepted and closed at once (a fast close the client sees, rather than a backlog
//!   that starves everyone), counted by `demo_connections_shed_total` and logged at most once
//!   per 10 s with the count.
//! - **Accept back-off.** After a failed `accept` (out of file descriptors, say) the loop pauses,
//!   10 ms doubling to 1 s, instead of spinning.
//! - **Shutdown.** On Ctrl-C, accepting stops and requests in flight finish (up to 10 s): a
//!   claim is never left to expire because the process stopped mid-request.

use std::convert::Infallible;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;
use tower::Service;

/// The bounds on connections (`HEADER_TIMEOUT_MS`, `IDLE_TIMEOUT_MS`, `MAX_CONNECTIONS`).
pub struct Limits {
    /// From accept to the first complete request head.
    pub header_timeout: Duration,
    /// Without a request in flight, before the connection is shut down.
    pub idle_timeout: Duration,
    /// Connections served at once; the newest beyond it are closed on accept.
    pub max_connections: u32,
}

/// How long an HTTP/2 keep-alive ping may go unanswered.
const PING_TIMEOUT: Duration = Duration::from_secs(20);
/// At most one log line about shed connections per this interval.
const SHED_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// How long shutdown waits for requests in flight.
const DRAIN: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` within `limits` until Ctrl-C, then lets requests in flight
/// finish (up to 10 s).
pub async fn serve(listener: TcpListener, router: Router, limits: Limits) {
    let limits = Arc::new(limits);
    let builder = Arc::new(builder(&limits));
    let slots = Arc::new(Semaphore::new(limits.max_connections as usize));
    let (stop, stopped) = watch::channel(false);
    let mut acceptor = Acceptor::new(listener);
    let mut shed = Shed::default();
    let mut shutdown = pin!(tokio::signal::ctrl_c());
    loop {
        let stream = tokio::select! {
            stream = acceptor.next() => stream,
            _ = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            drop(stream);
            shed.note(limits.max_connections);
            continue;
        };
        let (builder, router, limits) = (builder.clone(), router.clone(), limits.clone());
        tokio::spawn(connection(
            stream,
            builder,
            router,
            limits,
            stopped.clone(),
            slot,
        ));
    }
    drop(acceptor);
    tracing::info!("shutting down: waiting for requests in flight");
    stop.send_replace(true);
    // Every connection holds a slot until it ends: all slots back means all done.
    let all = slots.acquire_many(limits.max_connections);
    if tokio::time::timeout(DRAIN, all).await.is_err() {
        tracing::warn!("requests still in flight after 10 s; stopping anyway");
    }
}

/// hyper-util's builder for both protocols, with HTTP/2's keep-alive pings. HTTP/1 has no
/// timer of hyper's: the connection's deadline bounds its later heads too ([`Activity::check`]).
fn builder(limits: &Limits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.idle_timeout)
        .keep_alive_timeout(PING_TIMEOUT);
    builder
}

/// The listener, pausing after a failed `accept` rather than spinning.
struct Acceptor {
    listener: TcpListener,
    pause: Duration,
}

impl Acceptor {
    const FIRST_PAUSE: Duration = Duration::from_millis(10);

    fn new(listener: TcpListener) -> Self {
        Acceptor {
            listener,
            pause: Self::FIRST_PAUSE,
        }
    }

    /// The next connection (cancel-safe).
    async fn next(&mut self) -> TcpStream {
        loop {
            match self.listener.accept().await {
                Ok((stream, _)) => {
                    self.pause = Self::FIRST_PAUSE;
                    return stream;
                }
                Err(err) => {
                    // Logged once a pause, not once an attempt.
                    let pause_ms = self.pause.as_millis() as u64;
                    tracing::warn!(error = %err, pause_ms, "accept failed; pausing");
                    tokio::time::sleep(self.pause).await;
                    self.pause = (self.pause * 2).min(Duration::from_secs(1));
                }
            }
        }
    }
}

/// Connections closed on accept because every slot was taken: counted each, logged rate-limited.
#[derive(Default)]
struct Shed {
    unlogged: u64,
    logged_at: Option<Instant>,
}

impl Shed {
    fn note(&mut self, max_connections: u32) {
        metrics::counter!("demo_connections_shed_total").increment(1);
        self.unlogged += 1;
        if self
            .logged_at
            .is_none_or(|at| at.elapsed() >= SHED_LOG_INTERVAL)
        {
            tracing::warn!(
                shed = self.unlogged,
                max_connections,
                "connections over MAX_CONNECTIONS closed on accept (one line per 10 s at most)"
            );
            self.unlogged = 0;
            self.logged_at = Some(Instant::now());
        }
    }
}

/// One connection, served until it ends, its header or idle deadline passes, or shutdown.
///
/// The deadline is one timer, reset only when it fires: requests do not wake this driver (they
/// mark their start and end in [`Activity`] with a few atomic operations), so a connection
/// that serves requests back to back costs no more than hyper's own driving. When the timer
/// fires, the deadline is worked out from what the requests did meanwhile ([`Activity::check`]);
/// only a deadline that passed while a request was in flight asks that request's end to wake
/// the driver.
async fn connection(
    stream: TcpStream,
    builder: Arc<auto::Builder<TokioExecutor>>,
    router: Router,
    limits: Arc<Limits>,
    mut stopped: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
) {
    let activity = Arc::new(Activity::new(Instant::now()));
    let service = activity.clone().service(router);
    let mut conn = pin!(builder.serve_connection_with_upgrades(TokioIo::new(stream), service));
    let mut deadline = pin!(tokio::time::sleep_until(
        activity.opened + limits.header_timeout
    ));
    let mut busy = false;
    let mut closing = false;
    loop {
        tokio::select! {
            // In this order: the connection first (most wake-ups are its), and no random
            // start to draw on every wake-up.
            biased;
            result = conn.as_mut() => {
                if let Err(err) = result {
                    tracing::debug!(error = %err, "connection closed with an error");
                }
                return;
            }
            () = &mut deadline, if !busy && !closing => match activity.check(&limits) {
                Check::Until(at) => deadline.as_mut().reset(at),
                Check::Busy => busy = true,
                Check::NoHead => {
                    tracing::debug!("no request head within HEADER_TIMEOUT_MS: connection dropped");
                    return;
                }
                Check::Idle => {
                    tracing::debug!(
                        "idle for IDLE_TIMEOUT_MS (HTTP/1: no next head within HEADER_TIMEOUT_MS): \
                         connection shut down"
                    );
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            },
            // The deadline passed while a request was in flight: its end says when it ran out.
            () = activity.ended.notified(), if busy => {
                busy = false;
                deadline.as_mut().reset(Instant::now());
            }
            _ = stopped.wait_for(|stop| *stop), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    }
}

/// What the connection's requests are doing, shared by its service and its driver.
struct Activity {
    opened: Instant,
    /// Set when the service is first called: a complete request head arrived.
    started: AtomicBool,
    in_flight: AtomicUsize,
    /// A request came over HTTP/2: no head deadline after the first (its requests are frames
    /// of one connection, which keep-alive pings watch), only the idle one.
    http2: AtomicBool,
    /// When the last request ended, in nanoseconds since `opened`.
    last_end: AtomicU64,
    /// The driver waits for the end of the requests in flight (set by [`check`](Self::check)).
    waiting: AtomicBool,
    /// Notified when a request ends while the driver waits.
    ended: Notify,
}

/// What the driver does when its timer fires.
enum Check {
    /// Not yet: the deadline moved (requests came and went) to this instant.
    Until(Instant),
    /// Requests are in flight: no deadline until they end.
    Busy,
    /// No complete request head within `header_timeout` of the opening.
    NoHead,
    /// No request in flight for `idle_timeout` (HTTP/1: no next head within `header_timeout`).
    Idle,
}

impl Activity {
    fn new(opened: Instant) -> Self {
        Activity {
            opened,
            started: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            http2: AtomicBool::new(false),
            last_end: AtomicU64::new(0),
            waiting: AtomicBool::new(false),
            ended: Notify::new(),
        }
    }

    /// The connection's deadline as of now: the header deadline until a request arrived, then
    /// `idle_timeout` after the last request ended (HTTP/1: the next head is due within
    /// `header_timeout` of it, if that is sooner, as hyper's header read timeout would have it);
    /// none while one runs.
    fn check(&self, limits: &Limits) -> Check {
        if !self.started.load(Ordering::SeqCst) {
            return Check::NoHead;
        }
        // Announced before looking: a request that ends after the look sees it and notifies
        // (a notification without a waiter is kept for the next wait).
        self.waiting.store(true, Ordering::SeqCst);
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return Check::Busy;
        }
        self.waiting.store(false, Ordering::SeqCst);
        let ended = self.opened + Duration::from_nanos(self.last_end.load(Ordering::SeqCst));
        let quiet = if self.http2.load(Ordering::Relaxed) {
            limits.idle_timeout
        } else {
            limits.idle_timeout.min(limits.header_timeout)
        };
        let idle_at = ended + quiet;
        if idle_at > Instant::now() {
            Check::Until(idle_at)
        } else {
            Check::Idle
        }
    }

    /// `router` as a hyper service that reports each request's start and end.
    fn service(
        self: Arc<Self>,
        router: Router,
    ) -> impl hyper::service::Service<
        Request<Incoming>,
        Response = Response<Body>,
        Error = Infallible,
        Future: Send + 'static,
    > + Clone {
        hyper::service::service_fn(move |request: Request<Incoming>| {
            if request.version() == axum::http::Version::HTTP_2 {
                self.http2.store(true, Ordering::Relaxed);
            }
            let running = Running::start(self.clone());
            let response = router.clone().call(request);
            async move {
                let response = response.await;
                drop(running);
                response
            }
        })
    }
}

/// One request in flight, from the service call to its response (or its drop).
struct Running(Arc<Activity>);

impl Running {
    fn start(activity: Arc<Activity>) -> Self {
        activity.started.store(true, Ordering::SeqCst);
        activity.in_flight.fetch_add(1, Ordering::SeqCst);
        Running(activity)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let activity = &self.0;
        let since_open = activity.opened.elapsed().as_nanos() as u64;
        activity.last_end.fetch_max(since_open, Ordering::SeqCst);
        activity.in_flight.fetch_sub(1, Ordering::SeqCst);
        if activity.waiting.swap(false, Ordering::SeqCst) {
            activity.ended.notify_one();
        }
    }
}
