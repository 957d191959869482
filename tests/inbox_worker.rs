//! `examples/inbox_worker.rs` as real processes on a real store: one receiver, two workers, a
//! worker SIGKILLed while it holds an entry. Every event's effect is applied exactly once
//! (duplicates acknowledged, not applied; the killed worker's entry taken over after its lease),
//! and the inbox ends with nothing pending or in flight. On SQLite (a temp file; the effect in
//! the handler's transaction with `complete_in_tx`) and on a real `redis-server` (an `INCR`).
//!
//! `cargo test --test NAME` does not build the examples: `cargo build --all-features --example
//! inbox_worker` first (a plain `cargo test --all-features` builds them).

#[path = "support/harness.rs"]
mod harness;
#[path = "../examples/provider_sim/redis_server.rs"]
mod redis_server;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fred::prelude::KeysInterface;
use harness::{Example, Http, example_path, start_example};
use redis_server::RedisServer;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
use tower_idempotency::inbox::{InboxCounts, InboxStore, RedisInbox, SqliteInbox};

/// The workers' lease: a killed worker's entries come back after about this long.
const LEASE_MS: &str = "1000";
/// How long the slow event's handler sleeps: far longer than it takes to kill its worker.
const SLOW_MS: u64 = 5000;
const DEADLINE: Duration = Duration::from_secs(30);
const EVENTS: usize = 20;

/// A worker process, SIGKILLed when dropped.
struct WorkerProcess(Child);

impl WorkerProcess {
    fn start(envs: &[(&str, &str)]) -> Self {
        let mut command = Command::new(example_path("inbox_worker"));
        command
            .arg("worker")
            .env_remove("REDIS_URL")
            .env_remove("DATABASE_URL")
            .env("LEASE_MS", LEASE_MS)
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        for (k, v) in envs {
            command.env(k, v);
        }
        let mut child = command.spawn().unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert_eq!(first.trim(), "worker ready");
        WorkerProcess(child)
    }

    /// SIGKILL: no shutdown, no settlement, the lease left to run out.
    fn kill(&mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What the test reads from the shared store: the inbox's counts, each event's applications.
trait Probe {
    async fn counts(&self) -> InboxCounts;
    async fn applied(&self, event_id: &str) -> i64;
}

struct Sqlite {
    inbox: SqliteInbox,
}

impl Probe for Sqlite {
    async fn counts(&self) -> InboxCounts {
        self.inbox.counts().await.unwrap()
    }

    async fn applied(&self, event_id: &str) -> i64 {
        // Every process creates the table at start; the receiver is started first.
        sqlx::query_scalar("SELECT applied FROM effects WHERE event_id = $1")
            .bind(event_id)
            .fetch_optional(self.inbox.pool())
            .await
            .unwrap()
            .unwrap_or(0)
    }
}

struct Redis {
    inbox: RedisInbox<fred::clients::Client>,
}

impl Probe for Redis {
    async fn counts(&self) -> InboxCounts {
        self.inbox.counts().await.unwrap()
    }

    async fn applied(&self, event_id: &str) -> i64 {
        let key = format!("inbox_worker:effect:{event_id}");
        let value: Option<i64> = self.inbox.client().get(key).await.unwrap();
        value.unwrap_or(0)
    }
}

/// A temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn post(http: &Http, event_id: &str, extra: &str) -> (u16, bool) {
    let body = format!(r#"{{"event_id":"{event_id}"{extra}}}"#);
    let request_id = format!("req-{event_id}");
    let (status, headers, _) = http
        .send_raw("POST", "/inbox", &[("x-request-id", &request_id)], &body)
        .await;
    let replayed = headers
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    (status.as_u16(), replayed)
}

/// The scenario on any shared store: `env` names it to every process; `first_workers` is the
/// number of entries the worker that is killed runs at once.
async fn receivers_and_workers_apart(env: (&str, &str), probe: impl Probe, first_workers: &str) {
    let receiver: Example = start_example("inbox_worker", &[("ROLE", "receiver"), env]);
    let http = Http::new(&receiver);
    let mut doomed = WorkerProcess::start(&[env, ("WORKERS", first_workers)]);

    // The slow event goes to the only worker running: the one about to be killed.
    let slow = format!(r#","delay_ms":{SLOW_MS}"#);
    assert_eq!(post(&http, "ev_slow", &slow).await, (202, false));
    let start = Instant::now();
    while probe.counts().await.in_flight == 0 {
        assert!(
            start.elapsed() < DEADLINE,
            "the first worker never took ev_slow"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _survivor = WorkerProcess::start(&[env, ("WORKERS", "2")]);

    let ids: Vec<String> = (0..EVENTS).map(|i| format!("ev_{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            post(&http, id, "").await,
            (202, false),
            "{id}: first delivery"
        );
        if i % 4 == 0 {
            let (status, replayed) = post(&http, id, "").await;
            assert!(
                replayed && status < 300,
                "{id}: a duplicate is acknowledged"
            );
        }
    }
    let (status, replayed) = post(&http, "ev_slow", &slow).await;
    assert!(replayed && status < 300, "a duplicate of a running key");

    doomed.kill();
    let killed = Instant::now();
    assert_eq!(
        probe.applied("ev_slow").await,
        0,
        "the killed worker was still sleeping in ev_slow"
    );

    let mut all = ids.clone();
    all.push("ev_slow".to_owned());
    loop {
        let counts = probe.counts().await;
        let mut missing = 0;
        for id in &all {
            missing += usize::from(probe.applied(id).await == 0);
        }
        if missing == 0 && counts.pending == 0 && counts.in_flight == 0 {
            break;
        }
        assert!(
            killed.elapsed() < DEADLINE,
            "after the kill: {missing} events not applied, {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "ev_slow applied {:?} after its worker was killed",
        killed.elapsed()
    );

    // Duplicates of done keys: acknowledged, nothing queued again.
    for id in ["ev_0", "ev_slow"] {
        let (status, replayed) = post(&http, id, "").await;
        assert!(replayed && status < 300, "{id}: a duplicate of a done key");
    }
    let counts = probe.counts().await;
    assert_eq!((counts.pending, counts.in_flight, counts.dead), (0, 0, 0));
    for id in &all {
        assert_eq!(probe.applied(id).await, 1, "{id} applied once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_receiver_and_workers_in_separate_processes() {
    let dir = TempDir(std::env::temp_dir().join(format!("inbox_worker_{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let file = dir.0.join("inbox.db");
    let url = format!("sqlite://{}", file.display());
    let options = SqliteConnectOptions::new()
        .filename(&file)
        .create_if_missing(true)
        .busy_timeout(Duration::from_secs(10));
    let pool = SqlitePool::connect_with(options).await.unwrap();
    let probe = Sqlite {
        inbox: SqliteInbox::new(pool),
    };
    // The killed worker runs two entries at once: it may die inside another entry's
    // transaction too, which then rolls back.
    receivers_and_workers_apart(("DATABASE_URL", &url), probe, "2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_receiver_and_workers_in_separate_processes() {
    let server = RedisServer::start();
    let probe = Redis {
        inbox: RedisInbox::new(server.connect().await, "events"),
    };
    // One entry at a time in the killed worker: it dies sleeping in ev_slow, before its INCR
    // (an INCR then a kill before `complete` would apply an event twice on Redis).
    receivers_and_workers_apart(("REDIS_URL", &server.url()), probe, "1").await;
}
