//! The demo's inbox routes (`POST /inbox/email`, `GET /inbox`, `GET /inbox/dead`,
//! `POST /inbox/dead/{event_id}/retry`) driven over real HTTP on loopback, on the memory store.

use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::{Value, json};

#[path = "support/harness.rs"]
mod harness;

use harness::{Http, start_demo};

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

fn email(event: &str, extra: Value) -> String {
    let mut body = json!({
        "event_id": event,
        "message_id": format!("msg-{event}"),
        "type": "email.delivered",
        "occurred_at": "2026-12-02T10:00:00Z",
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body.to_string()
}

/// 202 at once, a duplicate 200 with `Idempotent-Replayed`, both carrying the request's
/// `X-Request-Id` as `Idempotency-Correlation-Id`; a worker applies the event once.
#[tokio::test]
async fn inbox_answers_at_once_and_a_worker_applies_once() {
    let demo = start_demo(&[]);
    let http = Http::new(&demo);
    let body = email("evt_inbox_1", json!({"demo_delay_ms": 300}));
    let request_id = [("X-Request-Id", "req-inbox-1")];
    let (status, headers, _) = http.send("POST", "/inbox/email", &request_id, &body).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(headers["idempotency-correlation-id"], "req-inbox-1");
    let (status, headers, _) = http.send("POST", "/inbox/email", &request_id, &body).await;
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
    let (status, _, _) = http.send("POST", "/inbox/email", &[], &body).await;
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
    let (status, _, _) = http.send("POST", "/inbox/email", &[], &body).await;
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
    let (status, _, _) = http
        .send("POST", "/inbox/dead/evt_inbox_dead/retry", &[], "")
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    until(&http, "/effects", |e| e["by_key"]["evt_inbox_dead"] == 1).await;
    let (status, _, _) = http
        .send("POST", "/inbox/dead/evt_inbox_dead/retry", &[], "")
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "no longer dead");
}

/// `INBOX_WORKERS=0` receives only: entries wait, nothing is applied.
#[tokio::test]
async fn receive_only_keeps_entries_pending() {
    let demo = start_demo(&[("INBOX_WORKERS", "0")]);
    let http = Http::new(&demo);
    let (status, _, _) = http
        .send("POST", "/inbox/email", &[], &email("evt_wait", json!({})))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (_, _, counts) = http.send("GET", "/inbox", &[], "").await;
    assert_eq!(counts, json!({"pending": 1, "in_flight": 0, "dead": 0}));
    assert_eq!(http.effects().await["total"], 0);
}
