//! The demo's inbox with receivers and workers as separate real processes on one real store:
//! the demo (`webhook_receiver`, `INBOX_WORKERS=0`) receives `POST /inbox/email`,
//! `examples/inbox_worker.rs` processes apply the entries, one of them SIGKILLed while it holds
//! an entry; and the demo killed with entries pending, then started again.
//!
//! On SQLite (one file, every process) and PostgreSQL the effect is a row of the demo tables
//! written in the transaction that marks the entry done; on Redis two hashes written by the
//! script that marks it done (`RedisInbox::complete_with`). Either is read back through the
//! demo's `GET /effects`: every event is applied **exactly once**.
//!
//! `cargo test --test NAME` does not build the examples: `cargo build --all-features --example
//! webhook_receiver --example inbox_worker` first (a plain `cargo test --all-features` builds
//! them).

use crate::harness;
use crate::postgres_server;
use crate::redis_server;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use harness::{Http, Worker, email, start_demo, start_worker};
use postgres_server::PostgresServer;
use redis_server::RedisServer;
use serde_json::{Value, json};

/// The workers' lease: a killed worker's entries come back after about this long.
const LEASE_MS: &str = "1000";
/// How long the slow event's handler sleeps: far longer than it takes to kill its worker.
const SLOW_MS: u64 = 5000;
const DEADLINE: Duration = Duration::from_secs(30);
const EVENTS: usize = 20;

/// The shared store, and where the workers' effects can be read.
enum Shared {
    /// A SQLite file in a temporary directory (removed on drop).
    Sqlite(PathBuf),
    Postgres(PostgresServer),
    Redis(RedisServer),
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Shared::Sqlite(dir) = self {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Shared {
    fn sqlite(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("inbox_worker_{test}_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Shared::Sqlite(dir)
    }

    /// The variable that names the store to every process.
    fn env(&self) -> (&'static str, String) {
        match self {
            Shared::Sqlite(dir) => (
                "DATABASE_URL",
                format!("sqlite://{}", dir.join("inbox.db").display()),
            ),
            Shared::Postgres(server) => ("DATABASE_URL", server.url()),
            Shared::Redis(server) => ("REDIS_URL", server.url()),
        }
    }
}

/// How many times each of `ids` is counted in the demo's `GET /effects`.
async fn applied_in(demo: &Http, ids: &[String]) -> Vec<i64> {
    let effects = demo.effects().await;
    let count = |id: &String| effects["by_key"][id].as_i64().unwrap_or(0);
    ids.iter().map(count).collect()
}

/// An `inbox_worker` process on `store`, with `workers` workers.
fn worker(store: &Shared, workers: &str) -> Worker {
    let (name, url) = store.env();
    start_worker(&[
        (name, &url),
        ("INBOX_WORKERS", workers),
        ("INBOX_LEASE_MS", LEASE_MS),
    ])
}

/// The demo on `store`, with `workers` inbox workers in its process.
fn demo(store: &Shared, workers: &str) -> (harness::Example, Http) {
    let (name, url) = store.env();
    let demo = start_demo(&[
        (name, &url),
        ("INBOX_WORKERS", workers),
        ("INBOX_LEASE_MS", LEASE_MS),
    ]);
    let http = Http::new(&demo);
    (demo, http)
}

/// `POST /inbox/email` of the event `id` (its own message), with `extra` body fields: the
/// status and whether it was acknowledged as a replay.
async fn post(http: &Http, id: &str, extra: Value) -> (u16, bool) {
    let request_id = format!("req-{id}");
    let (status, headers, _) = http
        .send_raw(
            "POST",
            "/inbox/email",
            &[("x-request-id", &request_id)],
            &email(id, extra),
        )
        .await;
    let replayed = headers
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    (status.as_u16(), replayed)
}

/// The demo's `GET /inbox`: pending, in flight, dead.
async fn counts(http: &Http) -> (u64, u64, u64) {
    let (_, _, body) = http.send("GET", "/inbox", &[], "").await;
    let count = |name: &str| body[name].as_u64().unwrap();
    (count("pending"), count("in_flight"), count("dead"))
}

/// Every duplicate of a known key is acknowledged, and not queued again.
async fn assert_duplicates_acknowledged(http: &Http, ids: &[&str]) {
    for id in ids {
        let (status, replayed) = post(http, id, json!({})).await;
        assert!(
            replayed && status < 300,
            "{id}: a duplicate is acknowledged"
        );
    }
}

/// A receiver and two workers apart; the worker holding the slow event is SIGKILLed.
/// `first_workers` is how many entries the killed worker runs at once.
async fn receiver_and_workers_apart(store: Shared, first_workers: &str) {
    let (_receiver, http) = demo(&store, "0");
    let mut doomed = worker(&store, first_workers);

    // The slow event goes to the only worker running: the one about to be killed.
    let slow = json!({"demo_delay_ms": SLOW_MS});
    assert_eq!(post(&http, "ev_slow", slow.clone()).await, (202, false));
    let start = Instant::now();
    while counts(&http).await.1 == 0 {
        assert!(
            start.elapsed() < DEADLINE,
            "the first worker never took ev_slow"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _survivor = worker(&store, "2");

    let mut ids: Vec<String> = (0..EVENTS).map(|i| format!("ev_{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            post(&http, id, json!({})).await,
            (202, false),
            "{id}: first delivery"
        );
        if i % 4 == 0 {
            assert_duplicates_acknowledged(&http, &[id]).await;
        }
    }
    let (status, replayed) = post(&http, "ev_slow", slow).await;
    assert!(replayed && status < 300, "a duplicate of a running key");

    doomed.kill();
    let killed = Instant::now();
    let slow_id = ["ev_slow".to_owned()];
    let applied = applied_in(&http, &slow_id).await;
    assert_eq!(
        applied,
        [0],
        "the killed worker was still sleeping in ev_slow"
    );

    ids.push("ev_slow".to_owned());
    let applied = until_applied(&http, &ids, killed).await;
    eprintln!(
        "ev_slow applied {:?} after its worker was killed",
        killed.elapsed()
    );
    assert!(
        applied.iter().all(|&n| n == 1),
        "each applied once: {ids:?} {applied:?}"
    );

    assert_duplicates_acknowledged(&http, &["ev_0", "ev_slow"]).await;
    assert_eq!(counts(&http).await, (0, 0, 0));
    assert_eq!(applied_in(&http, &ids).await, applied);
}

/// Polls until every one of `ids` is applied and nothing is pending or in flight.
async fn until_applied(http: &Http, ids: &[String], since: Instant) -> Vec<i64> {
    loop {
        let applied = applied_in(http, ids).await;
        let (pending, in_flight, dead) = counts(http).await;
        let missing = applied.iter().filter(|&&n| n == 0).count();
        if missing == 0 && pending == 0 && in_flight == 0 {
            return applied;
        }
        assert!(
            since.elapsed() < DEADLINE,
            "{missing} events not applied; pending {pending}, in flight {in_flight}, dead {dead}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The demo receives with no workers, is killed with its entries pending, and is started
/// again with workers: every entry is applied, once, by the new process.
async fn receiver_restarted_with_entries_pending(store: Shared) {
    let ids: Vec<String> = (0..EVENTS).map(|i| format!("ev_restart_{i}")).collect();
    {
        let (_receiver, http) = demo(&store, "0");
        for id in &ids {
            assert_eq!(post(&http, id, json!({})).await, (202, false), "{id}");
        }
        assert_duplicates_acknowledged(&http, &[&ids[0], &ids[7]]).await;
        assert_eq!(counts(&http).await, (EVENTS as u64, 0, 0));
    } // SIGKILLed here.
    let (_receiver, http) = demo(&store, "2");
    let start = Instant::now();
    loop {
        let applied = applied_in(&http, &ids).await;
        if applied.iter().all(|&n| n > 0) && counts(&http).await == (0, 0, 0) {
            assert!(
                applied.iter().all(|&n| n == 1),
                "each applied once: {applied:?}"
            );
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "not applied after the restart: {applied:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_duplicates_acknowledged(&http, &[&ids[0], &ids[EVENTS - 1]]).await;
    assert_eq!(counts(&http).await, (0, 0, 0));
}

/// On SQL the demo reads the status the workers' transaction wrote.
async fn message_status(http: &Http, message_id: &str) -> Value {
    let (_, _, body) = http
        .send("GET", &format!("/messages/{message_id}"), &[], "")
        .await;
    body["status"].clone()
}

// The killed worker runs two entries at once on SQL: it may die inside another entry's
// transaction too, which then rolls back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_receiver_and_workers_in_separate_processes() {
    receiver_and_workers_apart(Shared::sqlite("apart"), "2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_receiver_and_workers_in_separate_processes() {
    receiver_and_workers_apart(Shared::Postgres(PostgresServer::new()), "2").await;
}

// One entry at a time in the killed worker on Redis: it dies sleeping in ev_slow, before its
// INCR (an INCR then a kill before `complete` would apply an event twice on Redis).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_receiver_and_workers_in_separate_processes() {
    receiver_and_workers_apart(Shared::Redis(RedisServer::start()), "1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_receiver_restarted_with_entries_pending() {
    receiver_restarted_with_entries_pending(Shared::sqlite("restart")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_receiver_restarted_with_entries_pending() {
    receiver_restarted_with_entries_pending(Shared::Postgres(PostgresServer::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_receiver_restarted_with_entries_pending() {
    receiver_restarted_with_entries_pending(Shared::Redis(RedisServer::start())).await;
}

/// A status written by an `inbox_worker` process is what the demo's `GET /messages/{id}`
/// answers, and its `GET /effects` counts the event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_demo_reads_what_a_worker_process_wrote() {
    let store = Shared::sqlite("reads");
    let (_receiver, http) = demo(&store, "0");
    let _worker = worker(&store, "1");
    assert_eq!(post(&http, "ev_read", json!({})).await, (202, false));
    let ids = ["ev_read".to_owned()];
    until_applied(&http, &ids, Instant::now()).await;
    assert_eq!(message_status(&http, "msg-ev_read").await, "delivered");
}

/// The demo with its own workers, on `store` (the memory store when `None`): an older event of
/// a message that arrives while a newer one is being applied waits for it, then is settled
/// stale, never applied, and the message ends at the newer status.
async fn an_older_event_never_overwrites_a_newer_one(store: Option<Shared>) {
    let envs = store.as_ref().map(Shared::env);
    let envs: Vec<(&str, &str)> = envs
        .iter()
        .map(|(name, url)| (*name, url.as_str()))
        .collect();
    let demo = start_demo(&envs);
    let http = Http::new(&demo);
    let newer = json!({
        "message_id": "m",
        "type": "email.delivered",
        "occurred_at": "2026-12-04T14:02:00Z",
        "demo_delay_ms": 1000,
    });
    assert_eq!(post(&http, "ev_delivered", newer).await, (202, false));
    let start = Instant::now();
    while counts(&http).await.1 == 0 {
        assert!(
            start.elapsed() < DEADLINE,
            "the newer event is never in flight"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let older = json!({
        "message_id": "m",
        "type": "email.sent",
        "occurred_at": "2026-12-04T14:01:00Z",
        "demo_delay_ms": 1500,
    });
    assert_eq!(post(&http, "ev_sent", older).await, (202, false));
    while counts(&http).await != (0, 0, 0) {
        assert!(start.elapsed() < DEADLINE, "the events are never settled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(message_status(&http, "m").await, "delivered");
    let ids = ["ev_delivered".to_owned(), "ev_sent".to_owned()];
    assert_eq!(
        applied_in(&http, &ids).await,
        [1, 0],
        "the older event is never applied"
    );

    // An older event that arrives once the newer one was applied is stale at the door:
    // answered as on the synchronous route, not queued.
    let late = json!({
        "event_id": "ev_queued",
        "message_id": "m",
        "type": "email.queued",
        "occurred_at": "2026-12-04T14:00:00Z",
    });
    let (status, headers, body) = http
        .send_raw("POST", "/inbox/email", &[], &late.to_string())
        .await;
    assert_eq!(status.as_u16(), 200, "{body:?}");
    assert_eq!(headers["idempotent-stale"], "true");
    assert!(headers.get("idempotent-replayed").is_none());
    assert_eq!(counts(&http).await, (0, 0, 0), "not queued");
    assert_eq!(message_status(&http, "m").await, "delivered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_an_older_event_never_overwrites_a_newer_one() {
    an_older_event_never_overwrites_a_newer_one(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_an_older_event_never_overwrites_a_newer_one() {
    an_older_event_never_overwrites_a_newer_one(Some(Shared::sqlite("older"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_older_event_never_overwrites_a_newer_one() {
    an_older_event_never_overwrites_a_newer_one(Some(Shared::Postgres(PostgresServer::new())))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_an_older_event_never_overwrites_a_newer_one() {
    an_older_event_never_overwrites_a_newer_one(Some(Shared::Redis(RedisServer::start()))).await;
}
