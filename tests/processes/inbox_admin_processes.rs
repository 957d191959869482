//! **Runs only with the SQL and Redis inboxes' admin side** (features `redis`, `sqlite`,
//! `postgres`, built by others in parallel with the admin service): pausing through the demo's
//! admin service (`POST /admin/inbox/pause`) stops the workers of **every process** on a real
//! PostgreSQL, the demo's own and an `examples/inbox_worker.rs` process, within a second, and
//! `POST /admin/inbox/resume` restarts both.
//!
//! `cargo test --test NAME` does not build the examples: `cargo build --all-features --example
//! webhook_receiver --example inbox_worker` first.

use crate::harness;
use crate::postgres_server;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use harness::{Http, email, start_demo, start_worker};
use http::StatusCode;
use postgres_server::PostgresServer;
use serde_json::{Value, json};

const TOKEN: &str = "processes-admin-token";
const BEARER: (&str, &str) = ("Authorization", "Bearer processes-admin-token");
const DEADLINE: Duration = Duration::from_secs(20);

async fn deliver(http: &Http, id: &str, extra: Value) {
    let (status, _, _) = http
        .send("POST", "/inbox/email", &[], &email(id, extra))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{id}");
}

async fn applied(http: &Http) -> u64 {
    http.effects().await["total"].as_u64().unwrap_or(0)
}

async fn until_applied(http: &Http, total: u64) {
    let start = Instant::now();
    while applied(http).await < total {
        assert!(start.elapsed() < DEADLINE, "{total} not applied in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn pause_stops_every_worker_process_and_resume_restarts_them() {
    let postgres = PostgresServer::new();
    let url = postgres.url();
    let envs = [
        ("DATABASE_URL", url.as_str()),
        ("INBOX_WORKERS", "1"),
        ("ADMIN_TOKEN", TOKEN),
    ];
    let demo = start_demo(&envs);
    let http = Http::new(&demo);
    let _worker = start_worker(&[("DATABASE_URL", &url), ("INBOX_WORKERS", "2")]);
    // Both sides work before the pause.
    for n in 0..4 {
        deliver(&http, &format!("evt_before_{n}"), json!({})).await;
    }
    until_applied(&http, 4).await;

    let (status, _, answer) = http.send("POST", "/admin/inbox/pause", &[BEARER], "").await;
    assert_eq!((status, answer), (StatusCode::OK, json!({"paused": true})));
    // "Within a second": whatever a process needs to see the pause, it had.
    tokio::time::sleep(Duration::from_secs(1)).await;
    const HELD: u64 = 20;
    for n in 0..HELD {
        deliver(
            &http,
            &format!("evt_held_{n}"),
            json!({"demo_delay_ms": 300}),
        )
        .await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, _, counts) = http.send("GET", "/admin/inbox/counts", &[], "").await;
    assert_eq!(counts["pending"], HELD, "{counts}");
    assert_eq!(counts["in_flight"], 0, "no process took any: {counts}");
    assert_eq!(counts["paused"], true, "{counts}");
    assert_eq!(applied(&http).await, 4);

    let resumed = Instant::now();
    let resumed_at = std::time::SystemTime::now() - Duration::from_millis(1);
    let resumed_ms = resumed_at
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let (status, _, answer) = http
        .send("POST", "/admin/inbox/resume", &[BEARER], "")
        .await;
    assert_eq!((status, answer), (StatusCode::OK, json!({"paused": false})));
    while applied(&http).await == 4 {
        assert!(
            resumed.elapsed() < Duration::from_secs(2),
            "nothing applied after resume"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    until_applied(&http, 4 + HELD).await;

    // Both processes took entries after the resume: their attempts name two workers (host/pid).
    let (_, _, page) = http
        .send("GET", "/admin/inbox/entries?state=done&limit=500", &[], "")
        .await;
    let workers: HashSet<&str> = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|entry| entry["history"].as_array().unwrap())
        .filter(|attempt| attempt["outcome"] == "succeeded")
        .filter(|attempt| attempt["started_at"].as_u64().unwrap() as u128 >= resumed_ms)
        .map(|attempt| attempt["worker"].as_str().unwrap())
        .collect();
    assert!(
        workers.len() >= 2,
        "every process applies again: {workers:?}"
    );
}
