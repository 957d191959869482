//! Scale-out measurements shared by the cluster and sentinel tests
//! (`#[path = "support/scale_out.rs"] mod scale_out;`):
//!
//! - [`deliver_through_failover`]: deliveries through a failover, by senders that behave like a
//!   webhook provider (every event is delivered until it is answered 2xx, then delivered once
//!   more, as providers do), to an app whose handler counts its effect per event; the
//!   [`Report`] lists lost and doubled effects;
//! - [`lost_write_failover`]: one event across a failover that loses the primary's last,
//!   unreplicated writes, set up on purpose on any [`Topology`];
//! - [`failover_under`]: [`deliver_through_failover`] on a fresh [`Topology`] whose primary
//!   is killed, through a pool that rides through the failover or keeps the defaults;
//! - [`complete_latencies`] and [`summary`]: the latency of `complete`, one call at a time
//!   ([`print_completion_cost`]: plain against durable).
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::post;
use fred::prelude::*;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::store::LocalCache;
use tower_idempotency::store::{StoreErrorKind, StoreKey};
use tower_idempotency::test_util::store::OneTarget;
use tower_idempotency::test_util::values;
use tower_idempotency::{IdempotencyLayer, IdempotencyStore, RedisStore, Scope};

/// The shape of the load.
#[derive(Clone, Debug)]
pub struct Load {
    /// Concurrent senders, each delivering one event at a time.
    pub senders: usize,
    /// How long the handler works before its effect is counted and it answers 201.
    pub handler_time: Duration,
    /// The layer's lease.
    pub lease: Duration,
    /// The layer's store timeout.
    pub store_timeout: Duration,
    /// How long deliveries run before the failover starts.
    pub before: Duration,
    /// How long new events keep coming after the failover has completed.
    pub after: Duration,
    /// How long a sender keeps retrying one event before giving up on it.
    pub give_up_after: Duration,
}

impl Default for Load {
    fn default() -> Self {
        Load {
            senders: 16,
            handler_time: Duration::from_millis(5),
            lease: Duration::from_secs(3),
            store_timeout: Duration::from_secs(2),
            before: Duration::from_millis(700),
            after: Duration::from_millis(1000),
            give_up_after: Duration::from_secs(30),
        }
    }
}

/// What happened to the events.
#[derive(Debug, Default)]
pub struct Report {
    /// Events sent (each until it was answered 2xx, or given up).
    pub events: usize,
    /// Events answered 2xx.
    pub acknowledged: usize,
    /// Deliveries made, redeliveries included.
    pub deliveries: usize,
    /// Statuses of the first round of deliveries, retries included.
    pub statuses: BTreeMap<u16, usize>,
    /// Final statuses of the redelivery of every acknowledged event.
    pub redelivery_statuses: BTreeMap<u16, usize>,
    /// Acknowledged events whose effect never happened.
    pub lost: Vec<String>,
    /// Events whose effect happened more than once.
    pub doubled: Vec<String>,
    /// Events never acknowledged (given up).
    pub unacknowledged: Vec<String>,
    /// How long the failover took (from the kill to a healthy topology, as the fixture saw it).
    pub failover: Duration,
    /// The longest time one event took to be acknowledged.
    pub slowest_event: Duration,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} events, {} acknowledged, {} deliveries; failover {:?}; slowest event {:?}; \
             statuses {:?}; redelivery statuses {:?}; lost {}; doubled {}; unacknowledged {}",
            self.events,
            self.acknowledged,
            self.deliveries,
            self.failover,
            self.slowest_event,
            self.statuses,
            self.redelivery_statuses,
            self.lost.len(),
            self.doubled.len(),
            self.unacknowledged.len(),
        )
    }
}

type Effects = Arc<Mutex<HashMap<String, u32>>>;

async fn handler(
    State((effects, work)): State<(Effects, Duration)>,
    headers: HeaderMap,
) -> StatusCode {
    tokio::time::sleep(work).await;
    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
    *effects.lock().unwrap().entry(key).or_default() += 1;
    StatusCode::CREATED
}

async fn deliver(app: &Router, event: &str) -> StatusCode {
    let request = Request::post("/deliver")
        .header("idempotency-key", event)
        .body(Body::from("{}"))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let _ = response.into_body().collect().await;
    status
}

/// Delivers `event` until it is answered 2xx (retrying 50 ms apart) or `give_up_after` passes.
/// Returns the statuses seen, the last one last.
async fn deliver_until_acknowledged(
    app: &Router,
    event: &str,
    give_up_after: Duration,
) -> Vec<StatusCode> {
    let deadline = Instant::now() + give_up_after;
    let mut statuses = Vec::new();
    loop {
        let status = deliver(app, event).await;
        statuses.push(status);
        if status.is_success() || Instant::now() >= deadline {
            return statuses;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `load` through `store` and calls `failover` (blocking: kill a primary and wait for the
/// new one) in the middle; then redelivers every acknowledged event once and counts effects.
pub async fn deliver_through_failover<St: IdempotencyStore>(
    store: St,
    load: Load,
    failover: impl FnOnce() + Send + 'static,
) -> Report {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let effects = Effects::default();
    let layer = IdempotencyLayer::new(store)
        .namespace(format!("failover-{}", std::process::id()))
        .lease(load.lease)
        .store_timeout(load.store_timeout);
    let app = Router::new()
        .route("/deliver", post(handler))
        .route_layer(layer)
        .with_state((effects.clone(), load.handler_time));

    let producing = Arc::new(AtomicBool::new(true));
    let next = Arc::new(AtomicUsize::new(0));
    let mut senders = Vec::new();
    for _ in 0..load.senders {
        let (app, producing, next) = (app.clone(), producing.clone(), next.clone());
        let give_up_after = load.give_up_after;
        senders.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            while producing.load(Ordering::SeqCst) {
                let event = format!("evt_{}", next.fetch_add(1, Ordering::SeqCst));
                let started = Instant::now();
                let statuses = deliver_until_acknowledged(&app, &event, give_up_after).await;
                outcomes.push((event, statuses, started.elapsed()));
            }
            outcomes
        }));
    }

    tokio::time::sleep(load.before).await;
    let started = Instant::now();
    tokio::task::spawn_blocking(failover).await.unwrap();
    let failover = started.elapsed();
    tokio::time::sleep(load.after).await;
    producing.store(false, Ordering::SeqCst);

    let mut report = Report {
        failover,
        ..Report::default()
    };
    let mut acknowledged = Vec::new();
    for sender in senders {
        for (event, statuses, took) in sender.await.unwrap() {
            report.events += 1;
            report.deliveries += statuses.len();
            report.slowest_event = report.slowest_event.max(took);
            for status in &statuses {
                *report.statuses.entry(status.as_u16()).or_default() += 1;
            }
            if statuses.last().is_some_and(|s| s.is_success()) {
                acknowledged.push(event);
            } else {
                report.unacknowledged.push(event);
            }
        }
    }
    report.acknowledged = acknowledged.len();

    // The provider's duplicate of every acknowledged event, a few at a time. A claim left in
    // flight by a completion that never reached the store answers 409 until its lease expires.
    let give_up_after = load.lease + Duration::from_secs(10);
    let mut redeliveries = Vec::new();
    for chunk in acknowledged.chunks(acknowledged.len().div_ceil(load.senders).max(1)) {
        let (app, chunk) = (app.clone(), chunk.to_vec());
        redeliveries.push(tokio::spawn(async move {
            let mut finals = Vec::new();
            for event in chunk {
                let statuses = deliver_until_acknowledged(&app, &event, give_up_after).await;
                finals.push((statuses.len(), *statuses.last().unwrap()));
            }
            finals
        }));
    }
    for redelivery in redeliveries {
        for (deliveries, status) in redelivery.await.unwrap() {
            report.deliveries += deliveries;
            *report
                .redelivery_statuses
                .entry(status.as_u16())
                .or_default() += 1;
        }
    }

    let effects = effects.lock().unwrap();
    for event in &acknowledged {
        match effects.get(event).copied().unwrap_or(0) {
            0 => report.lost.push(event.clone()),
            1 => {}
            _ => report.doubled.push(event.clone()),
        }
    }
    for event in &report.unacknowledged {
        if effects.get(event).copied().unwrap_or(0) > 1 {
            report.doubled.push(event.clone());
        }
    }
    report
}

/// The latency of `n` sequential `complete` calls through `store` (each on a fresh claim), and
/// how many of them a durable store reported short of replicas (`NotReplicated`: the record
/// was written, the replica did not acknowledge it in time; a measurement, not a failure).
pub async fn complete_latencies<St: IdempotencyStore>(
    store: &St,
    label: &str,
    n: usize,
) -> (Vec<Duration>, usize) {
    let mut times = Vec::with_capacity(n);
    let mut short = 0;
    for i in 0..n {
        let key = StoreKey::new(label, None, &format!("{}-{i}", std::process::id()));
        let claim = values::claim(Fingerprint::of_bytes(b"{}"));
        store
            .reserve_one(&key, &claim, Duration::from_secs(30))
            .await
            .unwrap();
        let record = values::record_ack(claim.fingerprint());
        let started = Instant::now();
        let done = store
            .complete_one(&key, &claim, &record, Duration::from_secs(3600))
            .await;
        times.push(started.elapsed());
        match done {
            Ok(done) => assert!(done.is_recorded()),
            Err(e) if e.kind() == StoreErrorKind::NotReplicated => short += 1,
            Err(e) => panic!("complete failed: {e}"),
        }
    }
    (times, short)
}

/// Mean, median and 99th percentile of `times`, in microseconds.
pub fn summary(times: &[Duration]) -> String {
    let mut sorted = times.to_vec();
    sorted.sort();
    let pct = |p: f64| sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)];
    let mean = sorted.iter().sum::<Duration>() / sorted.len() as u32;
    format!(
        "mean {:>7.1} µs  p50 {:>7.1} µs  p99 {:>7.1} µs",
        mean.as_secs_f64() * 1e6,
        pct(0.5).as_secs_f64() * 1e6,
        pct(0.99).as_secs_f64() * 1e6
    )
}

/// A replicated deployment a scenario can break: a cluster or a sentinel deployment.
pub trait Topology: Send + 'static {
    /// A fred builder for it.
    fn builder(&self) -> Builder;
    /// The port of the primary owning `key`, and of one of its replicas.
    fn primary_and_replica(&self, key: &str) -> (u16, u16);
    /// Stops the process on `port` (SIGSTOP).
    fn freeze(&self, port: u16);
    /// Resumes it (SIGCONT).
    fn thaw(&self, port: u16);
    /// SIGKILLs the primary owning `key`; returns its port.
    fn kill_primary_of(&mut self, key: &str) -> u16;
    /// Waits until a replica of the killed primary has taken over; returns its port.
    fn wait_for_failover(&self, killed: u16) -> u16;
    /// Starts the killed node on `port` again (it comes back as a replica).
    fn restart(&mut self, port: u16);
}

/// The load that rides through a failover (about 3 s): store calls wait for the new primary
/// rather than fail, so completions are not lost while it is elected; and claims outlive it
/// and the store timeout, so that a completion delayed by the failover still finds its claim.
pub fn ride_through_load() -> Load {
    Load {
        store_timeout: Duration::from_secs(10),
        lease: Duration::from_secs(15),
        ..Load::default()
    }
}

/// Runs `load` on `topology` (freshly started) while the primary of a key is killed (in a
/// cluster, of a third of the keys), through a pool of 4 that retries commands for 10 s when
/// `ride_through`, with fred's defaults otherwise; with durable completion (`WAIT 1`, 1 s: a
/// healthy replica on a loaded machine can miss a shorter one, and a record it missed can die
/// with the primary) or not.
pub async fn failover_under<T: Topology>(
    topology: T,
    load: Load,
    durable: bool,
    ride_through: bool,
) -> Report {
    let patience = ride_through.then_some(Duration::from_secs(10));
    let pool = pool_to(&topology, 4, patience).await;
    let mut store = RedisStore::new(pool);
    if durable {
        store = store.durable_completion(1, Duration::from_secs(1));
    }
    let victim = StoreKey::new("anything", None, "x");
    // Kept until the deliveries are over: dropping it stops the servers.
    let topology = Arc::new(Mutex::new(topology));
    let failing = topology.clone();
    let report = deliver_through_failover(store, load, move || {
        let mut topology = failing.lock().unwrap();
        let killed = topology.kill_primary_of(victim.as_str());
        topology.wait_for_failover(killed);
    })
    .await;
    drop(topology);
    report
}

/// A connected pool of `size` clients to `topology`. With `patience`, each command waits up to
/// that long and is sent up to 10 times, so that it rides through a failover; fred's defaults
/// otherwise.
pub async fn pool_to<T: Topology>(topology: &T, size: usize, patience: Option<Duration>) -> Pool {
    let mut builder = topology.builder();
    if let Some(timeout) = patience {
        builder
            .with_performance_config(|perf| perf.default_command_timeout = timeout)
            .with_connection_config(|conn| conn.max_command_attempts = 10);
    }
    let pool = builder.build_pool(size).unwrap();
    pool.init().await.unwrap();
    pool
}

/// Prints the latency of `complete` without and with `WAIT 1`, on loopback, 1000 calls one at
/// a time through `client`, under `label`.
pub async fn print_completion_cost(label: &str, client: Client) {
    let plain = RedisStore::new(client.clone());
    let durable = RedisStore::new(client).durable_completion(1, Duration::from_secs(1));
    plain.load_scripts().await.unwrap();
    let (plain_times, _) = complete_latencies(&plain, "cost-plain", 1000).await;
    let (durable_times, short) = complete_latencies(&durable, "cost-durable", 1000).await;
    println!("{label} complete latency, 1000 sequential calls on loopback (debug build):");
    println!("  plain   {}", summary(&plain_times));
    println!(
        "  durable {} ({short} short of the replica)",
        summary(&durable_times)
    );
}

/// The lease of [`lost_write_failover`]: counted from the claim on the promoted replica (the
/// frozen replica saw no renewal), it must outlive the set-up and the failover.
const LOST_WRITE_LEASE: Duration = Duration::from_secs(12);

/// One event across a failover that loses the primary's last writes, set up on purpose, through
/// the layer and a [`RedisStore`] (durable completion with `WAIT 1` for 3 s, or not). Returns
/// how many times the event's effect ran once its duplicate has been answered 2xx.
///
/// 1. The event is delivered; its claim reaches the replica, the handler waits.
/// 2. The replica is frozen and a 16 MiB value is written, more than the socket buffers hold:
///    the replication stream now queues in the primary's memory.
/// 3. The handler finishes; the layer writes the record, which queues behind the value.
/// 4. Once the primary holds the record, it is killed (its queue dies with it), the replica
///    thawed; it is promoted with the claim but without the record.
/// 5. The provider's duplicate is delivered until answered 2xx (409 while a claim is held).
///
/// Plain, the primary acknowledged the record and the response went out; the record is lost,
/// the claim's lease expires and the duplicate is processed again: 2 effects. Durable, the
/// completion was still waiting in `WAIT` when its connection died: the store sends it again,
/// it reaches the promoted replica, which holds the claim, and writes the record there: the
/// duplicate is answered from it, 1 effect. The lease (12 s) outlives the failover, as it must.
pub async fn lost_write_failover<T: Topology>(topology: T, durable: bool) -> usize {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let namespace = "lost-write";
    let store_key = StoreKey::new(namespace, None, "evt_1");
    let (primary, replica) = topology.primary_and_replica(store_key.as_str());
    let pool = pool_to(&topology, 2, Some(Duration::from_secs(15))).await;
    // Without the local cache: the duplicate must ask Redis, as another instance would (the
    // instance that completed the key would answer it from its cache, record lost or not).
    let mut store = RedisStore::new(pool);
    // Loaded before: the completion's script then writes the record on the primary at once
    // (after a `NOSCRIPT`, the durable pair would first wait out its `WAIT` without writing).
    store.load_scripts().await.unwrap();
    if durable {
        store = store.durable_completion(1, Duration::from_secs(3));
    }
    let effects = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(tokio::sync::Notify::new());
    // Handlers wait until the gate opens.
    let (gate, gate_rx) = tokio::sync::watch::channel(false);
    let app = Router::new()
        .route(
            "/deliver",
            post({
                let (effects, started) = (effects.clone(), started.clone());
                move || async move {
                    started.notify_one();
                    let mut gate = gate_rx.clone();
                    gate.wait_for(|open| *open).await.unwrap();
                    effects.fetch_add(1, Ordering::SeqCst);
                    StatusCode::CREATED
                }
            }),
        )
        .route_layer(
            IdempotencyLayer::new(store)
                .namespace(namespace)
                .scope(Scope::none())
                .local_cache(LocalCache::off())
                // Longer than the failover: the durable completion, sent again to the
                // promoted replica, must still find its claim there.
                .lease(LOST_WRITE_LEASE)
                .store_timeout(Duration::from_secs(15)),
        );
    let first = {
        let app = app.clone();
        tokio::spawn(async move { deliver(&app, "evt_1").await })
    };
    started.notified().await;
    let admin = |port: u16, args: &[&str]| {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let port_args = (port, args);
        async move {
            tokio::task::spawn_blocking(move || {
                let args: Vec<&str> = port_args.1.iter().map(String::as_str).collect();
                admin_command(port_args.0, &args)
            })
            .await
            .unwrap()
        }
    };
    // The replica has processed everything the primary wrote (the claim included).
    let offset = |info: String, field: &str| -> i64 {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {field}"))
    };
    let target = offset(
        admin(primary, &["INFO", "replication"]).await,
        "master_repl_offset",
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while offset(
        admin(replica, &["INFO", "replication"]).await,
        "slave_repl_offset",
    ) < target
    {
        assert!(Instant::now() < deadline, "the replica does not catch up");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    topology.freeze(replica);
    // Same slot as the store key (hash tag), so a cluster primary takes it.
    let filler_key = format!("{{{store_key}}}:filler");
    let filler = "x".repeat(16 << 20);
    admin(primary, &["SET", &filler_key, &filler]).await;
    let queued: u64 = admin(primary, &["INFO", "memory"])
        .await
        .lines()
        .find_map(|l| l.trim().strip_prefix("mem_clients_slaves:"))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(
        queued > 1 << 20,
        "the backlog is not queued in the primary: {queued} bytes"
    );

    // What the primary holds for the key while it is claimed, and then the record: the kill
    // must come after the record was written there (before, the completion would be sent to
    // the promoted replica in both cases), and while a durable completion waits in `WAIT`.
    let value = |port: u16| admin(port, &["GET", store_key.as_str()]);
    let claimed = value(primary).await;
    gate.send_replace(true);
    let deadline = Instant::now() + Duration::from_secs(5);
    while value(primary).await == claimed {
        assert!(
            Instant::now() < deadline,
            "the record never reached the primary"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let topology = Arc::new(Mutex::new(topology));
    let fixture = topology.clone();
    let key = store_key.as_str().to_owned();
    tokio::task::spawn_blocking(move || {
        let mut topology = fixture.lock().unwrap();
        let killed = topology.kill_primary_of(&key);
        assert_eq!(killed, primary);
        topology.thaw(replica);
        topology.wait_for_failover(killed)
    })
    .await
    .unwrap();
    assert_eq!(first.await.unwrap(), StatusCode::CREATED);

    // The provider's duplicate, retried while it is answered 409 (a claim whose lease runs).
    let deadline = Instant::now() + LOST_WRITE_LEASE + Duration::from_secs(15);
    loop {
        let status = deliver(&app, "evt_1").await;
        if status.is_success() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    effects.load(Ordering::SeqCst)
}

/// What became of one inbox event sent across a failover that loses the primary's last,
/// unreplicated writes (see [`inbox_enqueue_across_a_lagging_failover`]).
#[derive(Debug, PartialEq, Eq)]
pub struct InboxFailover {
    /// Whether the first delivery was acknowledged (the route's `202`).
    pub first_acknowledged: bool,
    /// Deliveries until one was acknowledged (the sender retries what was not).
    pub deliveries: usize,
    /// How many times a worker applied the event after the failover.
    pub applied: usize,
}

/// Issue 54's sequence on the inbox, on any [`Topology`]: the replica frozen behind a 16 MiB
/// backlog, one event enqueued (plain: acknowledged at once; durable: `WAIT 1` refused in time,
/// so not acknowledged, as the route answers `503`), the primary killed, the replica promoted;
/// then the sender retries what was not acknowledged (the old primary restarted as a replica,
/// so that a durable write can be confirmed again), and a worker applies what the inbox holds.
pub async fn inbox_enqueue_across_a_lagging_failover<T: Topology>(
    topology: T,
    durable: bool,
) -> InboxFailover {
    use tower_idempotency::inbox::{InboxRequest, InboxStore, RedisInbox, Worker};
    let name = "lagging";
    let tag_key = format!("{{inbox:{name}}}:due");
    let (primary, replica) = topology.primary_and_replica(&tag_key);
    let pool = pool_to(&topology, 2, Some(Duration::from_secs(15))).await;
    let mut inbox = RedisInbox::new(pool, name);
    if durable {
        inbox = inbox.durable(1, Duration::from_secs(1));
    }
    let entry = || {
        let key = StoreKey::new("lagging", None, "evt_1");
        values::inbox_entry(key, bytes::Bytes::from_static(b"{}"), "req-1")
    };
    // The scripts loaded on the primary, and everything so far on the replica.
    let warm = values::inbox_entry(StoreKey::new("lagging", None, "warm"), "{}".into(), "w");
    inbox.enqueue(warm.clone()).await.unwrap();
    let warmed = inbox.take(1, Duration::from_secs(60)).await.unwrap();
    inbox
        .complete(
            &[(warmed[0].entry.key.clone(), warmed[0].token)],
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let blocking = |port: u16, args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            admin_command(port, &args)
        })
    };
    wait_caught_up(primary, replica).await;
    topology.freeze(replica);
    // The backlog fills the replica's socket: what follows stays in the primary's memory.
    let filler = vec![format!("{{inbox:{name}}}:filler"), "x".repeat(16 << 20)];
    blocking(primary, [vec!["SET".to_owned()], filler].concat())
        .await
        .unwrap();

    let first = inbox.enqueue(entry()).await;
    if durable {
        let error = first
            .as_ref()
            .expect_err("the frozen replica acknowledged nothing");
        assert_eq!(error.kind(), StoreErrorKind::NotReplicated, "{error}");
    }
    let first_acknowledged = first.is_ok();
    let topology = Arc::new(Mutex::new(topology));
    let fixture = topology.clone();
    let key = tag_key.clone();
    tokio::task::spawn_blocking(move || {
        let mut topology = fixture.lock().unwrap();
        let killed = topology.kill_primary_of(&key);
        assert_eq!(killed, primary);
        topology.thaw(replica);
        topology.wait_for_failover(killed);
        topology.restart(killed);
    })
    .await
    .unwrap();

    // The sender retries until it is acknowledged.
    let mut deliveries = 1;
    let deadline = Instant::now() + Duration::from_secs(30);
    if !first_acknowledged {
        loop {
            deliveries += 1;
            if inbox.enqueue(entry()).await.is_ok() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "never acknowledged after the failover"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    // A worker applies what the inbox holds.
    let applied = Arc::new(AtomicUsize::new(0));
    let counted = applied.clone();
    let worker = Worker::new(
        inbox.clone(),
        tower::service_fn(move |request: InboxRequest| {
            let counted = counted.clone();
            async move {
                if request.key() == &entry().key {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
                Ok::<_, std::convert::Infallible>(())
            }
        }),
    )
    .lease(Duration::from_secs(5));
    worker
        .run(async {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                let counts = inbox.counts().await.ok();
                if counts.is_some_and(|c| c.pending + c.in_flight == 0) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
    drop(topology);
    InboxFailover {
        first_acknowledged,
        deliveries,
        applied: applied.load(Ordering::SeqCst),
    }
}

/// Waits until `replica` has processed everything `primary` wrote.
async fn wait_caught_up(primary: u16, replica: u16) {
    let offset = |port: u16, field: &'static str| async move {
        let info =
            tokio::task::spawn_blocking(move || admin_command(port, &["INFO", "replication"]))
                .await
                .unwrap();
        info.lines()
            .find_map(|l| l.trim().strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or_else(|| panic!("no {field}"))
    };
    let target = offset(primary, "master_repl_offset").await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while offset(replica, "slave_repl_offset").await < target {
        assert!(Instant::now() < deadline, "the replica does not catch up");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One command over a fresh blocking connection; the reply as text (panics on errors).
fn admin_command(port: u16, args: &[&str]) -> String {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut request = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        request.extend_from_slice(arg.as_bytes());
        request.extend_from_slice(b"\r\n");
    }
    stream.write_all(&request).expect("send");
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).expect("reply");
    assert!(!line.starts_with('-'), "{args:?} on {port}: {line}");
    match line
        .strip_prefix('$')
        .and_then(|n| n.trim().parse::<usize>().ok())
    {
        Some(len) => {
            let mut payload = vec![0; len + 2];
            reader.read_exact(&mut payload).expect("bulk reply");
            String::from_utf8_lossy(&payload[..len]).into_owned()
        }
        None => line,
    }
}

/// The tests of one replicated deployment type, as `#[tokio::test]`s of the file that invokes
/// it: the behaviour suite's smoke run and the store contract on its shared deployment (module
/// `plain`, and `durable` with durable completion), the contract on the store made from its
/// URL (`from_url`), and the failover tests; and its [`Topology`]. `$deployment` has
/// `shared()` (an `Arc` of a running deployment), `start()` (a fresh one), `url()`, the methods of its harness' `Deployment` trait (which the invoking file
/// imports), `primary_and_replica`, `kill_primary_of` and `wait_for_failover`; `$label` names
/// it in what they print.
#[macro_export]
macro_rules! deployment_tests {
    (@suites $module:ident, $make:expr) => {
        mod $module {
            use super::*;

            $crate::suite::store_smoke!($make);
            tower_idempotency::store_contract!($make);
        }
    };
    ($deployment:ty, $label:literal) => {
        // The suite and the contract on one client of the shared deployment.
        scale_out::deployment_tests!(@suites plain, async {
            let deployment = <$deployment>::shared();
            let store = tower_idempotency::RedisStore::new(deployment.connect().await);
            (store, deployment)
        });

        // The suite and the contract on a pool with durable completion: every completed record
        // waits for a replica (in a cluster, of the primary owning its key).
        scale_out::deployment_tests!(@suites durable, async {
            let deployment = <$deployment>::shared();
            let store = tower_idempotency::RedisStore::new(deployment.connect_pool(2).await)
                .durable_completion(1, std::time::Duration::from_secs(1));
            (store, deployment)
        });

        /// The contract on the store `store::connect` makes from the deployment's URL.
        mod from_url {
            use super::*;

            tower_idempotency::store_contract!(async {
                let deployment = <$deployment>::shared();
                let store = tower_idempotency::store::connect(&deployment.url())
                    .await
                    .unwrap();
                assert_eq!(store.backend(), "redis");
                (store, deployment)
            });
        }

        impl scale_out::Topology for $deployment {
            fn builder(&self) -> fred::prelude::Builder {
                Deployment::builder(self)
            }

            fn primary_and_replica(&self, key: &str) -> (u16, u16) {
                <$deployment>::primary_and_replica(self, key)
            }

            fn freeze(&self, port: u16) {
                Deployment::freeze(self, port);
            }

            fn thaw(&self, port: u16) {
                Deployment::thaw(self, port);
            }

            fn kill_primary_of(&mut self, key: &str) -> u16 {
                <$deployment>::kill_primary_of(self, key)
            }

            fn wait_for_failover(&self, killed: u16) -> u16 {
                <$deployment>::wait_for_failover(self, killed, std::time::Duration::from_secs(30))
            }

            fn restart(&mut self, port: u16) {
                Deployment::restart(self, port);
            }
        }

        /// What durable completion costs: `complete` latency without and with `WAIT 1`, on
        /// loopback, one call at a time (printed).
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn durable_completion_cost() {
            let deployment = <$deployment>::shared();
            let client = deployment.connect().await;
            scale_out::print_completion_cost($label, client).await;
        }

        /// Deliveries keep flowing while a primary is killed and a replica takes over: every
        /// event acknowledged 2xx got its effect, and with durable completion none got it
        /// twice.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn failover_under_load_with_durable_completion() {
            let load = scale_out::ride_through_load();
            let report = scale_out::failover_under(<$deployment>::start(), load, true, true).await;
            println!("{} failover, durable completion: {report}", $label);
            assert!(report.lost.is_empty(), "lost: {:?}", report.lost);
            assert!(report.unacknowledged.is_empty(), "{report}");
            assert!(report.doubled.is_empty(), "doubled: {:?}", report.doubled);
        }

        /// The same without durable completion: nothing lost; double effects measured and
        /// printed.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn failover_under_load_without_durable_completion() {
            let load = scale_out::ride_through_load();
            let report = scale_out::failover_under(<$deployment>::start(), load, false, true).await;
            println!("{} failover, plain completion: {report}", $label);
            assert!(report.lost.is_empty(), "lost: {:?}", report.lost);
            assert!(report.unacknowledged.is_empty(), "{report}");
        }

        /// With the defaults instead (store timeout 2 s, fred command timeout 1.5 s, shorter
        /// than the failover), completions attempted during the switch fail: their responses
        /// still go out (the effect happened), their claims stay until the lease expires, and
        /// the provider's duplicate is then processed again, durable completion or not.
        /// Nothing is lost; the double effects are printed.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn failover_with_a_store_timeout_shorter_than_the_failover() {
            for durable in [false, true] {
                let load = scale_out::Load::default();
                let report =
                    scale_out::failover_under(<$deployment>::start(), load, durable, false).await;
                println!(
                    "{} failover, default timeouts, durable completion {durable}: {report}",
                    $label
                );
                assert!(report.lost.is_empty(), "lost: {:?}", report.lost);
                assert!(report.unacknowledged.is_empty(), "{report}");
            }
        }

        /// A failover that loses the primary's last writes, set up on purpose (see
        /// `scale_out::lost_write_failover`): the plain record dies with the primary and the
        /// duplicate is processed again; the durable completion, cut off while waiting, is
        /// sent again to the promoted replica (which holds the claim) and the duplicate is
        /// answered from the record.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn unreplicated_completion_lost_in_failover_plain_vs_durable() {
            let plain = scale_out::lost_write_failover(<$deployment>::start(), false).await;
            let durable = scale_out::lost_write_failover(<$deployment>::start(), true).await;
            println!(
                "{}, one event across a failover that loses unreplicated writes: \
                 {plain} effects plain, {durable} durable",
                $label
            );
            assert_eq!(plain, 2, "the plain record was lost with the primary");
            assert_eq!(durable, 1, "the durable record survived");
        }

        /// An inbox event across a failover that loses the primary's unreplicated writes (see
        /// `scale_out::inbox_enqueue_across_a_lagging_failover`): plain, its `202` went out
        /// and the event died with the primary, never applied; durable, the enqueue was not
        /// acknowledged (503), the sender's retry was, and the event was applied once.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn an_inbox_event_across_a_lagging_failover_plain_vs_durable() {
            let plain =
                scale_out::inbox_enqueue_across_a_lagging_failover(<$deployment>::start(), false)
                    .await;
            let durable =
                scale_out::inbox_enqueue_across_a_lagging_failover(<$deployment>::start(), true)
                    .await;
            println!(
                "{} inbox across a lagging failover: plain {plain:?}, durable {durable:?}",
                $label
            );
            assert!(plain.first_acknowledged);
            assert_eq!(
                plain.applied, 0,
                "the acknowledged entry died with the primary"
            );
            assert!(
                !durable.first_acknowledged,
                "no 202 before the replica had it"
            );
            assert!(durable.deliveries > 1);
            assert_eq!(durable.applied, 1, "the retried event applied once");
        }
    };
}

#[allow(unused_imports)]
pub use deployment_tests;
