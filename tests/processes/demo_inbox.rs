//! The demo's inbox routes (`POST /inbox/email`, `GET /inbox`, `GET /inbox/dead`,
//! `POST /inbox/dead/{event_id}/retry`) and its admin service (`/admin/inbox`) driven over real
//! HTTP on loopback, on the memory store.
#![cfg(all(feature = "metrics", feature = "verify", feature = "admin"))]

use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::{Value, json};

use crate::harness;

use harness::{Http, email, start_demo};

const DEADLINE: Duration = Duration::from_secs(10);

/// Polls `GET path` until `check` holds on its JSON, failing after the deadline.
async fn until(http: &Http, path: &str, check: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let (_, _, body) = http.send("GET", path, &[], "").await;
        if check(&body) {
            return body;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{path} not within {DEADLINE:?}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// 202 at once, a duplicate 200 with `Idempotent-Replayed`, both carrying the request's
/// `X-Request-Id` as `Idempotency-Correlation-Id`; a worker applies the event once.
#[tokio::test]
async fn inbox_answers_at_once_and_a_worker_applies_once() {
    let demo = start_demo(&[]);
    let http = Http::new(&demo);
    let body = email("evt_inbox_1", json!({"demo_delay_ms": 300}));
    let request_id = [("X-Request-Id", "req-inbox-1")];
    let (status, headers, _) = http.post("/inbox/email", &request_id, &body).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(headers["idempotency-correlation-id"], "req-inbox-1");
    let (status, headers, _) = http.post("/inbox/email", &request_id, &body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(headers["idempotency-correlation-id"], "req-inbox-1");
    until(&http, "/effects", |e| e["by_key"]["evt_inbox_1"] == 1).await;
    let (_, _, message) = http.send("GET", "/messages/msg-evt_inbox_1", &[], "").await;
    assert_eq!(message["status"], "delivered");
    until(&http, "/inbox", |c| {
        *c == json!({"pending": 0, "in_flight": 0, "dead": 0})
    })
    .await;
    // A duplicate after the effect: still acknowledged, never applied again.
    let (status, _, _) = http.post("/inbox/email", &[], &body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(http.effects().await["by_key"]["evt_inbox_1"], 1);
}

/// Failing attempts are retried, the last one makes a dead letter with its error; re-queued,
/// it is applied.
#[tokio::test]
async fn failures_become_a_dead_letter_that_can_be_requeued() {
    let envs = [("INBOX_MAX_ATTEMPTS", "2"), ("INBOX_RETRY_BASE_MS", "50")];
    let demo = start_demo(&envs);
    let http = Http::new(&demo);
    let body = email("evt_inbox_dead", json!({"demo_fail_attempts": 2}));
    let (status, _, _) = http.post("/inbox/email", &[], &body).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let dead = until(&http, "/inbox/dead", |d| {
        d.as_array().is_some_and(|d| !d.is_empty())
    })
    .await;
    assert_eq!(dead[0]["event_id"], "evt_inbox_dead");
    assert_eq!(dead[0]["attempts"], 2);
    assert!(
        dead[0]["last_error"]
            .as_str()
            .unwrap()
            .contains("demo failure"),
        "{dead}"
    );
    assert_eq!(http.send("GET", "/inbox", &[], "").await.2["dead"], 1);
    assert!(http.effects().await["by_key"]["evt_inbox_dead"].is_null());
    let metrics = http.metrics().await;
    let line = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .map(str::to_owned)
    };
    let dead_line = line("idempotency_inbox_dead_letters_total{namespace=\"inbox-email\"}");
    assert_eq!(
        dead_line.as_deref().map(|l| l.ends_with(" 1")),
        Some(true),
        "{metrics}"
    );
    let attempts = line("idempotency_inbox_attempts_total{namespace=\"inbox-email\"}");
    assert_eq!(
        attempts.as_deref().map(|l| l.ends_with(" 2")),
        Some(true),
        "{metrics}"
    );
    assert!(metrics.contains("outcome=\"queued\""), "{metrics}");
    let (status, _, _) = http.post("/inbox/dead/evt_inbox_dead/retry", &[], "").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    until(&http, "/effects", |e| e["by_key"]["evt_inbox_dead"] == 1).await;
    let (status, _, _) = http.post("/inbox/dead/evt_inbox_dead/retry", &[], "").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "no longer dead");
}

/// `INBOX_WORKERS=0` receives only: entries wait, nothing is applied.
#[tokio::test]
async fn receive_only_keeps_entries_pending() {
    let demo = start_demo(&[("INBOX_WORKERS", "0")]);
    let http = Http::new(&demo);
    let (status, _, _) = http
        .post("/inbox/email", &[], &email("evt_wait", json!({})))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (_, _, counts) = http.send("GET", "/inbox", &[], "").await;
    assert_eq!(counts, json!({"pending": 1, "in_flight": 0, "dead": 0}));
    assert_eq!(http.effects().await["total"], 0);
}

// The inbox's admin service, mounted by the demo at `/admin/inbox`.

const TOKEN: &str = "demo-admin-token";
const BEARER: (&str, &str) = ("Authorization", "Bearer demo-admin-token");

/// An event that failed twice then succeeded, found by the acknowledgement's correlation id
/// (and by its event id) with its three attempts; without `ADMIN_TOKEN` the service is
/// read-only.
#[tokio::test]
async fn admin_finds_an_entry_by_correlation_id_with_its_attempts() {
    let demo = start_demo(&[("INBOX_RETRY_BASE_MS", "20")]);
    let http = Http::new(&demo);
    let body = email("evt_admin_history", json!({"demo_fail_attempts": 2}));
    let (status, headers, _) = http.post("/inbox/email", &[], &body).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let correlation = headers["idempotency-correlation-id"]
        .to_str()
        .unwrap()
        .to_owned();
    until(&http, "/effects", |e| e["by_key"]["evt_admin_history"] == 1).await;

    let path = format!("/admin/inbox/entries?correlation_id={correlation}");
    let page = until(&http, &path, |p| p["entries"][0]["state"] == "done").await;
    let entries = page["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{page}");
    let outcomes: Vec<&Value> = entries[0]["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|attempt| &attempt["outcome"])
        .collect();
    assert_eq!(outcomes, ["failed", "failed", "succeeded"], "{page}");
    let first = &entries[0]["history"][0];
    assert!(
        first["error"].as_str().unwrap().contains("demo failure"),
        "{first}"
    );
    assert_eq!(entries[0]["correlation_id"], correlation.as_str());
    assert!(entries[0].get("body").is_none(), "bodies hidden");
    let (status, _, by_id) = http
        .send(
            "GET",
            "/admin/inbox/entries/by-id/evt_admin_history",
            &[],
            "",
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(by_id, entries[0]);

    let (status, _, problem) = http.post("/admin/inbox/pause", &[BEARER], "").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "no ADMIN_TOKEN: read-only");
    assert_eq!(problem["code"], "admin_actions_disabled");
}

/// 1,000 dead letters re-queued by repeated bulk calls until `next` is null, then applied.
#[tokio::test]
async fn admin_requeues_a_thousand_dead_letters() {
    let envs = [("INBOX_MAX_ATTEMPTS", "1"), ("ADMIN_TOKEN", TOKEN)];
    let demo = start_demo(&envs);
    let http = Http::new(&demo);
    let events: Vec<String> = (0..1000).map(|n| format!("evt_redrive_{n:04}")).collect();
    for chunk in events.chunks(50) {
        let sent = chunk.iter().map(|event| {
            let body = email(event, json!({"demo_fail_attempts": 1}));
            let http = &http;
            async move { http.post("/inbox/email", &[], &body).await.0 }
        });
        for status in futures_util::future::join_all(sent).await {
            assert_eq!(status, StatusCode::ACCEPTED);
        }
    }
    until(&http, "/admin/inbox/counts", |c| c["dead"] == 1000).await;

    let (status, _, _) = http.post("/admin/inbox/requeue", &[], "").await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "actions need the bearer token"
    );
    let (mut requeued, mut calls, mut path) = (0, 0, "/admin/inbox/requeue".to_owned());
    loop {
        let (status, _, answer) = http.post(&path, &[BEARER], "").await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        requeued += answer["requeued"].as_u64().unwrap();
        calls += 1;
        match answer["next"].as_str() {
            Some(next) => path = format!("/admin/inbox/requeue?cursor={next}"),
            None => break,
        }
    }
    assert_eq!(requeued, 1000, "in {calls} calls");
    until(&http, "/effects", |e| e["total"] == 1000).await;
    let counts = until(&http, "/admin/inbox/counts", |c| c["pending"] == 0).await;
    assert_eq!(
        (counts["dead"].clone(), counts["in_flight"].clone()),
        (json!(0), json!(0))
    );
}

/// Paused, the workers take nothing; resumed, they apply what waited within a second or two.
#[tokio::test]
async fn admin_pause_stops_the_workers_and_resume_restarts_them() {
    let demo = start_demo(&[("ADMIN_TOKEN", TOKEN)]);
    let http = Http::new(&demo);
    let (status, _, answer) = http.post("/admin/inbox/pause", &[BEARER], "").await;
    assert_eq!((status, answer), (StatusCode::OK, json!({"paused": true})));
    for n in 0..5 {
        let body = email(&format!("evt_paused_{n}"), json!({}));
        let (status, _, _) = http.post("/inbox/email", &[], &body).await;
        assert_eq!(status, StatusCode::ACCEPTED);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, _, counts) = http.send("GET", "/admin/inbox/counts", &[], "").await;
    assert_eq!(counts["pending"], 5, "{counts}");
    assert_eq!(counts["in_flight"], 0, "{counts}");
    assert_eq!(counts["paused"], true, "{counts}");
    assert_eq!(http.effects().await["total"], 0);

    let resumed = Instant::now();
    let (status, _, answer) = http.post("/admin/inbox/resume", &[BEARER], "").await;
    assert_eq!((status, answer), (StatusCode::OK, json!({"paused": false})));
    until(&http, "/effects", |e| e["total"] == 5).await;
    assert!(
        resumed.elapsed() < Duration::from_secs(2),
        "{:?}",
        resumed.elapsed()
    );
}
