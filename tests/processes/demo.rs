//! The demo receiver (`examples/webhook_receiver.rs`) driven over real HTTP on loopback.
//!
//! `cargo test` builds the examples; this test starts the built binary with `BIND=127.0.0.1:0`.
#![cfg(all(feature = "metrics", feature = "verify", feature = "admin"))]

use std::time::Duration;

use http::StatusCode;
use serde_json::{Value, json};

use crate::harness;
#[cfg(feature = "redis")]
use crate::redis_server;
use crate::signing;

use harness::{Http, start_demo};

#[tokio::test]
async fn kalipto_retry_after_error_and_duplicates() {
    let demo = start_demo(&[]);
    let http = Http::new(&demo);
    let id = [("X-Kalipto-Delivery-Id", "pd_01JD8Q4M7T0XK3")];
    let fail = [
        ("X-Kalipto-Delivery-Id", "pd_01JD8Q4M7T0XK3"),
        ("x-demo-fail", "true"),
    ];
    let (status, _, _) = http.post("/webhooks/kalipto", &fail, "{}").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(http.effects().await["total"], 0);
    let (status, headers, _) = http.post("/webhooks/kalipto", &id, "{}").await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers.get("idempotent-replayed").is_none());
    let (status, headers, body) = http.post("/webhooks/kalipto", &id, "{}").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(body, json!({"ok": true, "duplicate": true}));
    assert_eq!(
        http.effects().await,
        json!({"total": 1, "by_key": {"pd_01JD8Q4M7T0XK3": 1}})
    );
    // Missing key: 400 problem+json.
    let (status, headers, body) = http.post("/webhooks/kalipto", &[], "{}").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(headers["content-type"], "application/problem+json");
    assert_eq!(body["code"], "missing_key");
}

/// A duplicate that arrives while the first delivery's handler runs (3 s) gets 409; the first
/// is then processed, once.
#[tokio::test]
async fn concurrent_duplicates_get_409_then_ack() {
    let demo = start_demo(&[]);
    let http = std::sync::Arc::new(Http::new(&demo));
    let slow = {
        let http = http.clone();
        tokio::spawn(async move {
            http.post(
                "/webhooks/kalipto",
                &[
                    ("X-Kalipto-Delivery-Id", "pd_slow"),
                    ("x-demo-delay-ms", "3000"),
                ],
                "{}",
            )
            .await
        })
    };
    // The demo shows nothing of a request in flight (a probe on the key would claim it), so a
    // margin of seconds on both sides: 1 s for the slow request to claim the key (another
    // process, over a fresh connection), 2 s left of its handler for the duplicate to arrive.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let (status, headers, body) = http
        .post(
            "/webhooks/kalipto",
            &[("X-Kalipto-Delivery-Id", "pd_slow")],
            "{}",
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(headers.contains_key("retry-after"));
    assert_eq!(body["code"], "in_flight");
    assert_eq!(slow.await.unwrap().0, StatusCode::OK);
    assert_eq!(http.effects().await["total"], 1);
}

#[tokio::test]
async fn meta_batches_sangho_fallback_and_orders() {
    let demo = start_demo(&[]);
    let http = Http::new(&demo);
    let fixtures: Value = serde_json::from_str(include_str!("../fixtures/webhooks.json")).unwrap();
    let case = |name: &str| {
        fixtures["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap()
            .clone()
    };
    let whatsapp = case("whatsapp-batch-two-messages")["body"].to_string();
    let instagram = case("instagram-messaging")["body"].to_string();
    for body in [&whatsapp, &whatsapp, &instagram, &instagram] {
        let (status, _, _) = http.post("/webhooks/meta", &[], body).await;
        assert_eq!(status, StatusCode::OK);
    }
    let effects = http.effects().await;
    // One effect per message id: two WhatsApp messages, one Instagram message.
    assert_eq!(effects["total"], 3);
    assert_eq!(
        effects["by_key"]["wamid.HBgLMTU1NTAxMjM0NTYVAgASGBQzQTdGNkY5"],
        1
    );
    assert_eq!(
        effects["by_key"]["wamid.HBgLMTU1NTAxMjM0NTYVAgASGBQzQUJDMTIz"],
        1
    );
    assert_eq!(
        effects["by_key"]["aWdfZAG1faXRlbToxOklHTWVzc2FnZAUlEOjE3ODQx"],
        1
    );

    let sangho = case("sangho-header")["body"].to_string();
    let (status, headers, _) = http
        .post(
            "/webhooks/sangho",
            &[("Sangho-Event-ID", "evt_1QbR8m2eZvKYlo2C")],
            &sangho,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers.get("idempotent-replayed").is_none());
    let (status, headers, _) = http.post("/webhooks/sangho", &[], &sangho).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-replayed"], "true");

    let key = [("Idempotency-Key", "order-1")];
    let (status, headers, first) = http.post("/api/orders", &key, r#"{"sku":"a"}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(headers.get("idempotent-replayed").is_none());
    let (status, headers, again) = http.post("/api/orders", &key, r#"{"sku":"a"}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(
        headers["location"],
        format!("/api/orders/{}", first["order_id"].as_str().unwrap())
    );
    assert_eq!(again, first, "the retry gets the same order id");
    let (status, _, body) = http.post("/api/orders", &key, r#"{"sku":"b"}"#).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["code"], "mismatch");
    assert_eq!(http.effects().await["total"], 5);
}

fn email(id: &str, kind: &str, at: &str) -> String {
    json!({"event_id": id, "message_id": "msg_7f31", "type": kind, "occurred_at": at}).to_string()
}

/// The email route orders events per message by `occurred_at`: `delivered`@14:02 then
/// `processed`@14:01 → the second is 200 stale, with no effect, the status stays delivered;
/// then `failed`@14:03 is processed; a redelivery of any of them is a duplicate.
async fn email_events_in_order(http: &Http, other: &Http) {
    // A message's status is the state of the receiver that applied its event (the demo keeps
    // it in memory); the watermark that keeps the order is in the store.
    let status_at = async |http: &Http| {
        http.send("GET", "/messages/msg_7f31", &[], "").await.2["status"].clone()
    };
    let status_of = async || status_at(http).await;
    let (status, _, _) = http
        .post(
            "/webhooks/email",
            &[],
            &email("evt_3", "email.delivered", "2026-10-29T14:02:00Z"),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(status_of().await, "delivered");
    // The older event, at the other instance: stale.
    let (status, headers, body) = other
        .post(
            "/webhooks/email",
            &[],
            &email("evt_2", "email.processed", "2026-10-29T14:01:00Z"),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-stale"], "true");
    assert!(headers.get("idempotent-replayed").is_none());
    assert_eq!(body, json!({"ok": true, "stale": true}));
    assert_eq!(status_of().await, "delivered");
    let (status, _, _) = other
        .post(
            "/webhooks/email",
            &[],
            &email("evt_4", "email.failed", "2026-10-29T16:03:00+02:00"),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(status_at(other).await, "failed");
    for (id, kind, at) in [
        ("evt_3", "email.delivered", "2026-10-29T14:02:00Z"),
        ("evt_2", "email.processed", "2026-10-29T14:01:00Z"),
        ("evt_4", "email.failed", "2026-10-29T16:03:00+02:00"),
    ] {
        let (status, headers, _) = http
            .post("/webhooks/email", &[], &email(id, kind, at))
            .await;
        assert_eq!(status, StatusCode::OK, "{id}");
        assert_eq!(headers["idempotent-replayed"], "true", "{id}");
    }
}

#[tokio::test]
async fn email_events_never_move_a_status_back() {
    let demo = start_demo(&[]);
    let http = Http::new(&demo);
    email_events_in_order(&http, &http).await;
    // Two effects (delivered, failed): the stale event had none.
    let effects = http.effects().await;
    assert_eq!(effects["total"], 2);
    assert_eq!(by_key(&effects, "evt_2"), 0);
    // What the layer checks first: the object and the position (400), then the handler (422).
    let (status, _, body) = http
        .post(
            "/webhooks/email",
            &[],
            r#"{"event_id":"e","occurred_at":"2026-10-29T14:00:00Z"}"#,
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("malformed_order"))
    );
    let (status, _, body) = http
        .post(
            "/webhooks/email",
            &[],
            r#"{"event_id":"e","message_id":"m","occurred_at":"yesterday"}"#,
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("malformed_order"))
    );
    let (status, _, _) = http
        .post(
            "/webhooks/email",
            &[],
            r#"{"event_id":"e","message_id":"m","occurred_at":"2026-10-29T14:00:00Z"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    // Any content type: the body is JSON whatever the header says.
    let (status, _, _) = http
        .post(
            "/webhooks/email",
            &[("content-type", "text/plain")],
            &email("evt_9", "email.opened", "2026-10-29T18:00:00Z"),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = http.send("GET", "/messages/unknown", &[], "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// The watermark is in the store: a receiver restarted on the same store still finds an
/// older event of the message stale (no effect at the new process).
#[cfg(any(feature = "sqlite", feature = "redis"))]
async fn a_stale_event_stays_stale_after_a_restart(envs: &[(&str, &str)]) {
    {
        let demo = start_demo(envs);
        let http = Http::new(&demo);
        let delivered = email("evt_r2", "email.delivered", "2026-10-29T14:02:00Z");
        let (status, headers, _) = http.post("/webhooks/email", &[], &delivered).await;
        assert_eq!(status, StatusCode::OK);
        assert!(headers.get("idempotent-stale").is_none());
    }
    let demo = start_demo(envs);
    let http = Http::new(&demo);
    let processed = email("evt_r1", "email.processed", "2026-10-29T14:01:00Z");
    let (status, headers, _) = http.post("/webhooks/email", &[], &processed).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-stale"], "true");
    assert_eq!(
        http.effects().await["total"],
        0,
        "a stale event had an effect"
    );
}

/// Removes the SQLite database at `path` and its `-wal` and `-shm` files, if there are any.
/// Called before a test too: the files are named by process id, and ones left by an earlier run
/// killed mid-test with the same id would turn a first delivery into a replay.
#[cfg(feature = "sqlite")]
fn remove_sqlite_files(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_watermark_survives_a_receiver_restart_on_sqlite() {
    let path = std::env::temp_dir().join(format!("demo-order-{}.db", std::process::id()));
    remove_sqlite_files(&path);
    let url = format!("sqlite://{}", path.display());
    a_stale_event_stays_stale_after_a_restart(&[("DATABASE_URL", &url)]).await;
    remove_sqlite_files(&path);
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_watermark_survives_a_receiver_restart_on_redis() {
    let server = redis_server::RedisServer::start();
    let url = server.url();
    a_stale_event_stays_stale_after_a_restart(&[("REDIS_URL", &url)]).await;
}

/// The same on Redis, across two receivers: the watermark is in Redis, not in either process.
#[cfg(feature = "redis")]
#[tokio::test]
async fn email_order_holds_across_two_receivers_on_redis() {
    let server = redis_server::RedisServer::start();
    let url = server.url();
    let (a, b) = (
        start_demo(&[("REDIS_URL", &url)]),
        start_demo(&[("REDIS_URL", &url)]),
    );
    let (http_a, http_b) = (Http::new(&a), Http::new(&b));
    email_events_in_order(&http_a, &http_b).await;
    let total = |e: Value| e["total"].as_u64().unwrap();
    assert_eq!(
        total(http_a.effects().await) + total(http_b.effects().await),
        2
    );
}

/// The store is named on the second line of the demo's output.
#[tokio::test]
async fn startup_names_the_store() {
    let mut demo = start_demo(&[]);
    assert_eq!(demo.next_line(), "store: memory");
}

/// `GET /metrics` exposes the layer's counters in Prometheus text.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn metrics_endpoint_counts_outcomes() {
    let demo = start_demo(&[]);
    let http = Http::new(&demo);
    let id = [("X-Kalipto-Delivery-Id", "pd_metrics")];
    http.post("/webhooks/kalipto", &id, "{}").await;
    http.post("/webhooks/kalipto", &id, "{}").await;
    let text = http.metrics().await;
    for outcome in ["first", "replayed"] {
        let line = text
            .lines()
            .find(|l| {
                l.starts_with("idempotency_requests_total{")
                    && l.contains("namespace=\"kalipto\"")
                    && l.contains(&format!("outcome=\"{outcome}\""))
            })
            .unwrap_or_else(|| panic!("no {outcome} counter in:\n{text}"));
        assert!(line.ends_with(" 1"), "{line}");
    }
    // Bucketed histograms: what `histogram_quantile` in docs/operations.md reads.
    assert!(
        text.lines().any(
            |l| l.starts_with("idempotency_inner_duration_seconds_bucket{")
                && l.contains("namespace=\"kalipto\"")
                && l.contains("le=\"0.001\"")
        ),
        "no handler latency buckets in:\n{text}"
    );
    // The embedded memory store answers in process: its calls are not timed.
    assert!(
        !text.contains("idempotency_store_duration_seconds"),
        "memory store calls timed:\n{text}"
    );
    assert!(!text.contains("pd_metrics"), "no raw key in metrics");
}

/// On a store that does I/O (here SQLite through `DATABASE_URL`), store calls are timed:
/// `GET /metrics` has the reserve and complete latency buckets that docs/operations.md's
/// `histogram_quantile` query reads.
#[cfg(all(feature = "metrics", feature = "sqlite"))]
#[tokio::test]
async fn metrics_endpoint_has_store_latency_buckets_for_a_server_side_store() {
    let path = std::env::temp_dir().join(format!("demo-metrics-{}.db", std::process::id()));
    remove_sqlite_files(&path);
    let url = format!("sqlite://{}", path.display());
    let demo = start_demo(&[("DATABASE_URL", &url)]);
    let http = Http::new(&demo);
    let id = [("X-Kalipto-Delivery-Id", "pd_store_metrics")];
    let (status, _, _) = http.post("/webhooks/kalipto", &id, "{}").await;
    assert_eq!(status, StatusCode::OK);
    let text = http.metrics().await;
    for operation in ["reserve", "complete"] {
        assert!(
            text.lines().any(
                |l| l.starts_with("idempotency_store_duration_seconds_bucket{")
                    && l.contains("namespace=\"kalipto\"")
                    && l.contains(&format!("operation=\"{operation}\""))
                    && l.contains("le=\"10\"")
                    && l.ends_with(" 1")
            ),
            "no {operation} latency buckets in:\n{text}"
        );
    }
    drop(demo);
    remove_sqlite_files(&path);
}

/// With `DATABASE_URL=sqlite://...` the demo's records survive a restart of the receiver.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_records_survive_a_receiver_restart() {
    let path = std::env::temp_dir().join(format!("demo-{}.db", std::process::id()));
    remove_sqlite_files(&path);
    let url = format!("sqlite://{}", path.display());
    let id = [("X-Kalipto-Delivery-Id", "pd_restart")];
    {
        let demo = start_demo(&[("DATABASE_URL", &url)]);
        let http = Http::new(&demo);
        let (status, headers, _) = http.post("/webhooks/kalipto", &id, "{}").await;
        assert_eq!(status, StatusCode::OK);
        assert!(headers.get("idempotent-replayed").is_none());
    }
    let demo = start_demo(&[("DATABASE_URL", &url)]);
    let http = Http::new(&demo);
    let (status, headers, _) = http.post("/webhooks/kalipto", &id, "{}").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(
        http.effects().await["total"],
        0,
        "no effect after the restart"
    );
    drop(demo);
    remove_sqlite_files(&path);
}

/// A WhatsApp batch body with these message ids.
fn whatsapp(ids: &[&str]) -> String {
    let messages: Vec<Value> = ids
        .iter()
        .map(|id| json!({"from": "15550123456", "id": id, "type": "text", "text": {"body": "hi"}}))
        .collect();
    json!({
        "object": "whatsapp_business_account",
        "entry": [{"id": "102290129340398", "changes": [{
            "field": "messages",
            "value": {"messaging_product": "whatsapp", "messages": messages}
        }]}]
    })
    .to_string()
}

fn by_key(effects: &Value, id: &str) -> u64 {
    effects["by_key"][id].as_u64().unwrap_or(0)
}

/// Meta asks for deduplication at the message level: overlapping batches apply each message
/// once, and a batch whose messages come in another order is a plain redelivery.
#[tokio::test]
async fn meta_overlapping_batches_apply_each_message_once() {
    let demo = start_demo(&[]);
    let http = Http::new(&demo);
    for (ids, replayed) in [
        (&["wamid.A", "wamid.B"][..], false),
        (&["wamid.B", "wamid.C"][..], false),
        (&["wamid.A"][..], true),
        (&["wamid.B", "wamid.A"][..], true),
    ] {
        let (status, headers, _) = http.post("/webhooks/meta", &[], &whatsapp(ids)).await;
        assert_eq!(status, StatusCode::OK, "{ids:?}");
        assert_eq!(
            headers.get("idempotent-replayed").is_some(),
            replayed,
            "{ids:?}"
        );
    }
    let effects = http.effects().await;
    for id in ["wamid.A", "wamid.B", "wamid.C"] {
        assert_eq!(by_key(&effects, id), 1, "{id}: {effects}");
    }
    assert_eq!(effects["total"], 3);
}

/// A body with WhatsApp messages and Instagram messaging entries: every id is an item.
#[tokio::test]
async fn meta_whatsapp_and_instagram_ids_of_one_body_are_all_items() {
    let demo = start_demo(&[]);
    let http = Http::new(&demo);
    let body = json!({
        "object": "page",
        "entry": [
            {"id": "1", "changes": [{"value": {"messages": [{"id": "wamid.W1"}]}}]},
            {"id": "2", "messaging": [{"message": {"mid": "mid.I1"}}, {"message": {"mid": "mid.I2"}}]}
        ]
    })
    .to_string();
    let (status, _, _) = http.post("/webhooks/meta", &[], &body).await;
    assert_eq!(status, StatusCode::OK);
    let effects = http.effects().await;
    for id in ["wamid.W1", "mid.I1", "mid.I2"] {
        assert_eq!(by_key(&effects, id), 1, "{id}: {effects}");
    }
}

/// WhatsApp status callbacks (sent, delivered, read) have no message id: they are keyed by
/// the delivery id header, processed once, and a redelivery is acknowledged.
#[tokio::test]
async fn meta_status_callbacks_fall_back_to_the_delivery_id() {
    let demo = start_demo(&[]);
    let http = Http::new(&demo);
    let body = json!({
        "object": "whatsapp_business_account",
        "entry": [{"id": "1", "changes": [{"field": "messages", "value": {
            "statuses": [{"id": "wamid.S1", "status": "delivered", "timestamp": "1730000000"}]
        }}]}]
    })
    .to_string();
    let delivery = [("X-Kalipto-Delivery-Id", "dlv_status_1")];
    let (status, headers, _) = http.post("/webhooks/meta", &delivery, &body).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers.get("idempotent-replayed").is_none());
    let (status, headers, _) = http.post("/webhooks/meta", &delivery, &body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(by_key(&http.effects().await, "dlv_status_1"), 1);
    // Without the header there is nothing to key it by: 400 naming both places.
    let (status, _, problem) = http.post("/webhooks/meta", &[], &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(problem["code"], "missing_key");
    let detail = problem["detail"].as_str().unwrap();
    assert!(detail.contains("x-kalipto-delivery-id"), "{detail}");
    assert!(detail.contains("messages[*].id"), "{detail}");
}

/// A batch whose handler fails part-way: the messages it reported done are recorded, so the
/// sender's retry applies only the rest.
#[tokio::test]
async fn meta_partial_failure_retries_only_the_rest() {
    let demo = start_demo(&[]);
    let http = Http::new(&demo);
    let body = whatsapp(&["wamid.P1", "wamid.P2", "wamid.P3"]);
    let (status, _, _) = http
        .post("/webhooks/meta", &[("x-demo-fail-item", "wamid.P2")], &body)
        .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let effects = http.effects().await;
    assert_eq!(by_key(&effects, "wamid.P1"), 1);
    assert_eq!(by_key(&effects, "wamid.P2"), 0);
    let (status, headers, reply) = http.post("/webhooks/meta", &[], &body).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers.get("idempotent-replayed").is_none());
    assert_eq!(reply["applied"], 2, "P2 and P3 only");
    let effects = http.effects().await;
    for id in ["wamid.P1", "wamid.P2", "wamid.P3"] {
        assert_eq!(by_key(&effects, id), 1, "{id}: {effects}");
    }
    let (_, headers, _) = http.post("/webhooks/meta", &[], &body).await;
    assert_eq!(headers["idempotent-replayed"], "true");
}

/// Integer ids keep every digit: two ids past 2^64 are two events; `1e2` is not an id.
#[tokio::test]
async fn numeric_ids_are_exact() {
    let demo = start_demo(&[]);
    let http = Http::new(&demo);
    for id in ["18446744073709551616", "18446744073709551617"] {
        let body = format!(r#"{{"id":{id},"type":"payment.succeeded"}}"#);
        let (status, headers, _) = http.post("/webhooks/sangho", &[], &body).await;
        assert_eq!(status, StatusCode::OK, "{id}");
        assert!(headers.get("idempotent-replayed").is_none(), "{id}");
    }
    let effects = http.effects().await;
    assert_eq!(by_key(&effects, "18446744073709551616"), 1, "{effects}");
    assert_eq!(by_key(&effects, "18446744073709551617"), 1, "{effects}");
    // `100` and `"100"` are one key; `1e2` is a 400 saying why.
    let (status, _, _) = http.post("/webhooks/sangho", &[], r#"{"id":100}"#).await;
    assert_eq!(status, StatusCode::OK);
    let (_, headers, _) = http.post("/webhooks/sangho", &[], r#"{"id":"100"}"#).await;
    assert_eq!(headers["idempotent-replayed"], "true");
    let (status, _, problem) = http.post("/webhooks/sangho", &[], r#"{"id":1e2}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(problem["code"], "malformed_key");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("an id must be a string or an integer"),
        "{problem}"
    );
}

/// A redelivery whose JSON was re-serialized (other whitespace, member order) is a plain
/// duplicate on a webhook route: acknowledged, never a 4xx.
#[tokio::test]
async fn reserialized_redelivery_is_acknowledged() {
    let demo = start_demo(&[]);
    let http = Http::new(&demo);
    let (status, _, _) = http
        .post(
            "/webhooks/sangho",
            &[],
            r#"{"id":"evt_reser","type":"payment.succeeded","amount":1200}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, headers, body) = http
        .post("/webhooks/sangho",
            &[],
            "{\n  \"amount\": 1200,\n  \"type\": \"payment.succeeded\",\n  \"id\": \"evt_reser\"\n}",
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(body, json!({"ok": true, "duplicate": true}));
    assert_eq!(by_key(&http.effects().await, "evt_reser"), 1);
}

/// A handler more than four times slower than the lease keeps its claim (renewed while it
/// runs): a duplicate meanwhile gets 409, and the event takes effect once.
#[tokio::test]
async fn slow_handler_keeps_its_lease() {
    // A 1 s lease (renewed every third of it) and a 4.5 s handler: without renewal the claim
    // would expire 1 s after it was taken, and the duplicates at 2 s and 3 s would take it.
    let demo = start_demo(&[("IDEMPOTENCY_LEASE_MS", "1000")]);
    let http = std::sync::Arc::new(Http::new(&demo));
    let id = ("X-Kalipto-Delivery-Id", "pd_slow_lease");
    let sent = tokio::time::Instant::now();
    let slow = {
        let http = http.clone();
        tokio::spawn(async move {
            http.post(
                "/webhooks/kalipto",
                &[id, ("x-demo-delay-ms", "4500")],
                "{}",
            )
            .await
        })
    };
    // At 1, 2 and 3 s after the slow request was sent (not after each other's answer, so a
    // slow answer does not push the next one later): the first leaves the slow request 1 s to
    // claim the key, the last arrives 1.5 s before its handler ends.
    for second in 1..=3 {
        tokio::time::sleep_until(sent + Duration::from_secs(second)).await;
        let (status, _, body) = http.post("/webhooks/kalipto", &[id], "{}").await;
        assert_eq!(
            status,
            StatusCode::CONFLICT,
            "duplicate at {:?}: {body}",
            sent.elapsed()
        );
    }
    assert_eq!(slow.await.unwrap().0, StatusCode::OK);
    let (status, headers, _) = http.post("/webhooks/kalipto", &[id], "{}").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(by_key(&http.effects().await, "pd_slow_lease"), 1);
}

/// A receiver killed (`SIGKILL`) in the middle of a request leaves its claim in the shared
/// store: another receiver on that store answers the sender's retries 409 until the lease
/// runs out (nobody renews it any more), then processes the event, once.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_killed_receiver_frees_its_key_within_the_lease() {
    use bytes::Bytes;
    use http::Request;
    use http_body_util::Full;

    let path = std::env::temp_dir().join(format!("demo-killed-{}.db", std::process::id()));
    let remove = || {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    };
    remove();
    let url = format!("sqlite://{}", path.display());
    // A lease long enough that the second receiver surely starts within it, on a loaded
    // machine too.
    let envs = [
        ("DATABASE_URL", url.as_str()),
        ("IDEMPOTENCY_LEASE_MS", "6000"),
    ];
    let id = ("X-Kalipto-Delivery-Id", "pd_killed");

    let mut first = start_demo(&envs);
    let http = Http::new(&first);
    let stuck = {
        let request = Request::post(format!("{}/webhooks/kalipto", http.base))
            .header(id.0, id.1)
            .header("x-demo-delay-ms", "30000")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        // Never answered: the receiver dies first (the request fails, as the sender sees it).
        tokio::spawn(http.client.request(request))
    };
    // Past a first renewal (every third of the lease: at 2 s), then the receiver dies.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let killed_at = std::time::Instant::now();
    assert!(stuck.await.unwrap().is_err(), "the dead receiver answered");

    let second = start_demo(&envs);
    let http = Http::new(&second);
    let (status, headers, body) = http.post("/webhooks/kalipto", &[id], "{}").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(headers.contains_key("retry-after"));
    // The sender retries until the dead receiver's lease has run out.
    let processed = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (status, headers, body) = http.post("/webhooks/kalipto", &[id], "{}").await;
        match status {
            StatusCode::CONFLICT => {
                assert!(killed_at.elapsed() < Duration::from_secs(12), "never freed");
            }
            StatusCode::OK => break headers,
            other => panic!("unexpected {other}: {body}"),
        }
    };
    assert!(
        processed.get("idempotent-replayed").is_none(),
        "processed, not acknowledged as a duplicate"
    );
    assert!(killed_at.elapsed() < Duration::from_millis(6000 + 3000));
    let (status, headers, _) = http.post("/webhooks/kalipto", &[id], "{}").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(by_key(&http.effects().await, "pd_killed"), 1);
    drop(second);
    remove();
}

/// `POST /webhooks/standard`: a signed delivery is processed once, its redelivery (fresh
/// timestamp, fresh signature) acknowledged; forgeries and stale timestamps are 401 with no
/// effect; and the genuine delivery sent while forged ones flood in is processed, in every
/// round.
#[tokio::test]
async fn standard_webhooks_are_verified_before_they_are_claimed() {
    let demo = start_demo(&[]);
    let http = std::sync::Arc::new(Http::new(&demo));
    let body = r#"{"type":"invoice.paid"}"#;
    let send = async |http: &Http, id: &str, t: u64, signature: &str| {
        let t = t.to_string();
        let headers = [
            ("webhook-id", id),
            ("webhook-timestamp", t.as_str()),
            ("webhook-signature", signature),
        ];
        http.post("/webhooks/standard", &headers, body).await
    };
    let t = signing::now();
    let signed = signing::standard(signing::STANDARD_SECRET, "msg_1", t, body);
    let (status, headers, _) = send(&http, "msg_1", t, &signed).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers.get("idempotent-replayed").is_none());
    let again = signing::standard(signing::STANDARD_SECRET, "msg_1", t + 60, body);
    let (status, headers, _) = send(&http, "msg_1", t + 60, &again).await;
    assert_eq!(
        (status, headers["idempotent-replayed"].to_str().unwrap()),
        (StatusCode::OK, "true")
    );
    for (signature, at) in [
        ("v1,".to_owned(), t),
        ("v1,AAAA".to_owned(), t),
        (
            signing::standard(
                "whsec_QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=",
                "msg_1",
                t,
                body,
            ),
            t,
        ),
        (
            signing::standard(signing::STANDARD_SECRET, "msg_1", t - 600, body),
            t - 600,
        ),
        (
            signing::standard(signing::STANDARD_SECRET, "msg_1", t + 600, body),
            t + 600,
        ),
    ] {
        let (status, headers, problem) = send(&http, "msg_1", at, &signature).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{signature}");
        assert_eq!(problem["code"], "unverified");
        assert!(
            headers.get("idempotent-replayed").is_none(),
            "a forgery is never acknowledged"
        );
    }
    // A flood of forged deliveries under each genuine id, concurrent with the genuine one.
    const ROUNDS: usize = 10;
    let mut affected = 0;
    for round in 0..ROUNDS {
        let id = format!("msg_flood_{round}");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let forgers: Vec<_> = (0..4)
            .map(|_| {
                let (http, id, stop) = (http.clone(), id.clone(), stop.clone());
                tokio::spawn(async move {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let (status, _, _) = send(&http, &id, signing::now(), "v1,Zm9yZ2Vk").await;
                        assert_eq!(status, StatusCode::UNAUTHORIZED);
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(5)).await;
        let t = signing::now();
        let signature = signing::standard(signing::STANDARD_SECRET, &id, t, body);
        let (status, headers, _) = send(&http, &id, t, &signature).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for forger in forgers {
            forger.await.unwrap();
        }
        if status != StatusCode::OK || headers.contains_key("idempotent-replayed") {
            affected += 1;
        }
    }
    assert_eq!(
        affected, 0,
        "rounds where the genuine delivery was not processed"
    );
    let effects = http.effects().await;
    assert_eq!(effects["total"], 1 + ROUNDS as u64);
    assert_eq!(by_key(&effects, "msg_1"), 1);
}

/// `POST /webhooks/standard` with Svix's header names (`svix-id`, `svix-timestamp`,
/// `svix-signature`), as Svix, Clerk and Resend send: processed once, keyed by `svix-id`, its
/// redelivery a duplicate; a forgery is 401.
#[tokio::test]
async fn svix_headers_reach_the_standard_webhooks_route() {
    let demo = start_demo(&[]);
    let http = Http::new(&demo);
    let body = r#"{"type":"email.delivered"}"#;
    let send = async |id: &str, t: u64, signature: &str| {
        let t = t.to_string();
        let headers = [
            ("svix-id", id),
            ("svix-timestamp", t.as_str()),
            ("svix-signature", signature),
        ];
        http.post("/webhooks/standard", &headers, body).await
    };
    let t = signing::now();
    let signed = signing::standard(signing::STANDARD_SECRET, "msg_svix", t, body);
    let (status, headers, _) = send("msg_svix", t, &signed).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers.get("idempotent-replayed").is_none());
    let again = signing::standard(signing::STANDARD_SECRET, "msg_svix", t + 60, body);
    let (status, headers, _) = send("msg_svix", t + 60, &again).await;
    assert_eq!(
        (status, headers["idempotent-replayed"].to_str().unwrap()),
        (StatusCode::OK, "true")
    );
    let (status, _, problem) = send("msg_svix", t, "v1,Zm9yZ2Vk").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(problem["code"], "unverified");
    let effects = http.effects().await;
    assert_eq!(effects["total"], 1);
    assert_eq!(by_key(&effects, "msg_svix"), 1);
}

/// `POST /webhooks/github`: `X-Hub-Signature-256` with the test secret, keyed by the delivery
/// id; a tampered body is 401, and `/metrics` counts it as `unverified`.
#[tokio::test]
async fn github_deliveries_are_verified() {
    let demo = start_demo(&[]);
    let http = Http::new(&demo);
    let body = r#"{"action":"opened","number":1}"#;
    let signature = signing::hub(signing::GITHUB_SECRET, body);
    let headers = [
        ("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
        ("X-Hub-Signature-256", signature.as_str()),
    ];
    let (status, _, _) = http.post("/webhooks/github", &headers, body).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = http
        .post(
            "/webhooks/github",
            &headers,
            r#"{"action":"closed","number":1}"#,
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, _) = http.post("/webhooks/github", &headers[..1], body).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(http.effects().await["total"], 1);
    let text = http.metrics().await;
    assert!(
        text.lines()
            .any(|l| l.starts_with("idempotency_requests_total{")
                && l.contains("namespace=\"github\"")
                && l.contains("outcome=\"unverified\"")
                && l.contains("reason=\"signature_mismatch\"")),
        "{text}"
    );
}

/// The secret the README's signed requests tell the reader to start the demo with.
const README_SANGHO_SECRET: &str = "sangho_test_secret";

/// The README's signed-request block (the `sh` block after its `readme-signed-requests`
/// marker), aimed at `base` instead of `localhost:3000`.
fn readme_signed_requests(base: &str) -> String {
    let readme = include_str!("../../README.md");
    let (_, after) = readme
        .split_once("<!-- readme-signed-requests")
        .expect("README.md has lost its readme-signed-requests marker");
    let (_, block) = after.split_once("```sh\n").unwrap();
    let (block, _) = block.split_once("```").unwrap();
    block.replace("localhost:3000", base)
}

/// Runs `script` with bash, failing on the first failing command; its stdout.
fn bash(script: &str) -> String {
    let output = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("set -euo pipefail\n{script}"))
        .output()
        .expect("bash");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// How often `needle` (lowercase) occurs in `text`, ignoring ASCII case.
fn occurrences(text: &str, needle: &str) -> usize {
    text.to_ascii_lowercase().matches(needle).count()
}

/// The README's copy-paste signed requests (Standard Webhooks, GitHub, Stripe-style), run as
/// written with bash, openssl, python3 and curl: each is accepted once (200, one effect), and
/// sent again is acknowledged as a duplicate.
#[tokio::test]
async fn the_readme_signed_requests_are_accepted_once() {
    let demo = start_demo(&[("SANGHO_WEBHOOK_SECRET", README_SANGHO_SECRET)]);
    let http = Http::new(&demo);
    let script = readme_signed_requests(&demo.base);
    let first = bash(&script);
    assert_eq!(occurrences(&first, "http/1.1 200"), 3, "{first}");
    assert_eq!(occurrences(&first, "idempotent-replayed:"), 0, "{first}");
    let effects = http.effects().await;
    assert_eq!(effects["total"], 3, "{effects}");
    for id in ["msg_1", "72d3162e-cc78-11e3-81ab-4c9367dc0958", "evt_1"] {
        assert_eq!(by_key(&effects, id), 1, "{id}: {effects}");
    }
    let again = bash(&script);
    assert_eq!(occurrences(&again, "http/1.1 200"), 3, "{again}");
    assert_eq!(
        occurrences(&again, "idempotent-replayed: true"),
        3,
        "{again}"
    );
    assert_eq!(http.effects().await["total"], 3);
}

/// The secrets that turn verification on for Sangho, Kalipto and Meta.
const OPTIONAL_SECRETS: [(&str, &str); 3] = [
    ("SANGHO_WEBHOOK_SECRET", "whsec_sangho_test"),
    ("KALIPTO_WEBHOOK_SECRET", "kalipto-secret"),
    ("META_APP_SECRET", "meta-secret"),
];

/// Routes verify only when their secret is set: Sangho's Stripe-style `Sangho-Signature`, and
/// `X-Hub-Signature-256` on Kalipto's and Meta's.
#[tokio::test]
async fn optional_secrets_turn_verification_on() {
    let demo = start_demo(&OPTIONAL_SECRETS);
    let http = Http::new(&demo);
    let body = r#"{"id":"evt_1","type":"charge.succeeded"}"#;
    let unsigned = [("Sangho-Event-ID", "evt_1")];
    assert_eq!(
        http.post("/webhooks/sangho", &unsigned, body).await.0,
        StatusCode::UNAUTHORIZED
    );
    let signature = signing::stripe("whsec_sangho_test", signing::now(), body);
    let signed = [
        ("Sangho-Event-ID", "evt_1"),
        ("Sangho-Signature", signature.as_str()),
    ];
    assert_eq!(
        http.post("/webhooks/sangho", &signed, body).await.0,
        StatusCode::OK
    );
    let old = signing::stripe("whsec_sangho_test", signing::now() - 600, body);
    let stale = [
        ("Sangho-Event-ID", "evt_1"),
        ("Sangho-Signature", old.as_str()),
    ];
    assert_eq!(
        http.post("/webhooks/sangho", &stale, body).await.0,
        StatusCode::UNAUTHORIZED
    );
    let kalipto = signing::hub("kalipto-secret", "{}");
    let id = ("X-Kalipto-Delivery-Id", "pd_signed");
    assert_eq!(
        http.post("/webhooks/kalipto", &[id], "{}").await.0,
        StatusCode::UNAUTHORIZED
    );
    let headers = [id, ("X-Hub-Signature-256", kalipto.as_str())];
    assert_eq!(
        http.post("/webhooks/kalipto", &headers, "{}").await.0,
        StatusCode::OK
    );
    let meta = r#"{"entry":[{"changes":[{"value":{"messages":[{"id":"wamid.S"}]}}]}]}"#;
    assert_eq!(
        http.post("/webhooks/meta", &[], meta).await.0,
        StatusCode::UNAUTHORIZED
    );
    let signature = signing::hub("meta-secret", meta);
    let headers = [("X-Hub-Signature-256", signature.as_str())];
    assert_eq!(
        http.post("/webhooks/meta", &headers, meta).await.0,
        StatusCode::OK
    );
    assert_eq!(http.effects().await["total"], 3);
}

/// Connections that send nothing are closed after `HEADER_TIMEOUT_MS`, and a body withheld is
/// 408 after `BODY_TIMEOUT_MS`, its connection closed: neither holds the server's memory or
/// file descriptors for longer (over real sockets).
#[tokio::test]
async fn silent_connections_and_withheld_bodies_are_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let demo = start_demo(&[("HEADER_TIMEOUT_MS", "400"), ("BODY_TIMEOUT_MS", "400")]);
    let addr = demo.base.trim_start_matches("http://").to_owned();
    let started = std::time::Instant::now();
    let mut silent = Vec::new();
    for _ in 0..100 {
        silent.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    for mut stream in silent {
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "a silent connection was kept open: {read:?}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "closed late: {:?}",
        started.elapsed()
    );

    let head = "POST /webhooks/kalipto HTTP/1.1\r\nhost: x\r\nx-kalipto-delivery-id: pd_withheld\r\n\
                content-type: application/json\r\ncontent-length: 1048575\r\n\r\n";
    let mut withheld = Vec::new();
    for _ in 0..20 {
        let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(&[b'x'; 4096]).await.unwrap();
        withheld.push(stream);
    }
    for mut stream in withheld {
        let mut reply = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut reply)).await;
        assert!(read.is_ok(), "a withheld body's connection was kept open");
        let reply = String::from_utf8_lossy(&reply);
        assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
        assert!(reply.contains("body_timeout"), "{reply}");
    }
    // Nothing was claimed: the delivery is processed when it comes whole.
    let http = Http::new(&demo);
    let (status, headers, _) = http
        .post(
            "/webhooks/kalipto",
            &[("X-Kalipto-Delivery-Id", "pd_withheld")],
            "{}",
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers.get("idempotent-replayed").is_none());
}

/// `DATABASE_URL=sqlite://..?locking=exclusive` keeps no `-shm` file to map: removing or
/// truncating the files next to the database under the running receiver cannot crash it.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn an_exclusive_sqlite_store_maps_no_shared_memory_file() {
    let path = std::env::temp_dir().join(format!("demo-exclusive-{}.db", std::process::id()));
    remove_sqlite_files(&path);
    let url = format!("sqlite://{}?locking=exclusive", path.display());
    let mut demo = start_demo(&[("DATABASE_URL", &url)]);
    assert_eq!(demo.next_line(), "store: sqlite");
    let http = Http::new(&demo);
    let id = [("X-Kalipto-Delivery-Id", "pd_exclusive")];
    assert_eq!(
        http.post("/webhooks/kalipto", &id, "{}").await.0,
        StatusCode::OK
    );
    let shm = format!("{}-shm", path.display());
    assert!(!std::path::Path::new(&shm).exists(), "a -shm file exists");
    // What made a shared-mode receiver die of SIGBUS: a -shm file truncated under it.
    std::fs::write(&shm, b"").unwrap();
    let other = [("X-Kalipto-Delivery-Id", "pd_exclusive_2")];
    assert_eq!(
        http.post("/webhooks/kalipto", &other, "{}").await.0,
        StatusCode::OK
    );
    let (status, headers, _) = http.post("/webhooks/kalipto", &id, "{}").await;
    assert_eq!(
        (status, headers["idempotent-replayed"].to_str().unwrap()),
        (StatusCode::OK, "true")
    );
    assert!(
        demo.child.try_wait().unwrap().is_none(),
        "the receiver died"
    );
    drop(demo);
    remove_sqlite_files(&path);
}

#[cfg(feature = "redis")]
/// The metric names the operator's files in `ops/` (the Grafana dashboard and the Prometheus
/// alerting rules) query.
fn metric_names_in_ops() -> std::collections::BTreeSet<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut names = std::collections::BTreeSet::new();
    for file in [
        "ops/grafana/tower-idempotency.json",
        "ops/prometheus/alerts.yml",
    ] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("idempotency_") {
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            rest = &rest[at + name.len()..];
            names.insert(name);
        }
    }
    names
}

#[cfg(feature = "redis")]
/// The metric names of a Prometheus text exposition (samples, not comments).
fn exported(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| line.split(['{', ' ']).next().unwrap_or_default().to_owned())
        .collect()
}

/// Every metric the dashboard and the alerting rules name is in the demo's `/metrics`: on
/// Redis after one first delivery and one duplicate (the store's and the handler's latency,
/// the outcomes, and the counters of lost leases and failed store calls, exported at zero from
/// the first request on), and on a memory store small enough to evict (its eviction counter
/// and its effective retention).
#[cfg(feature = "redis")]
#[tokio::test]
async fn every_metric_the_dashboard_and_the_alerts_name_is_exported() {
    let wanted = metric_names_in_ops();
    assert!(wanted.len() >= 7, "{wanted:?}");

    let server = redis_server::RedisServer::start();
    let url = server.url();
    let on_redis = start_demo(&[("REDIS_URL", &url)]);
    let http = Http::new(&on_redis);
    let id = [("X-Kalipto-Delivery-Id", "pd_exported")];
    for _ in 0..2 {
        let (status, _, _) = http.post("/webhooks/kalipto", &id, "{}").await;
        assert_eq!(status, StatusCode::OK);
    }
    let mut found = exported(&http.metrics().await);

    let small = start_demo(&[("MEMORY_MAX_ENTRIES", "4")]);
    let http = Http::new(&small);
    for i in 0..40 {
        let id = format!("pd_evicted_{i}");
        let headers = [("X-Kalipto-Delivery-Id", id.as_str())];
        let (status, _, _) = http.post("/webhooks/kalipto", &headers, "{}").await;
        assert_eq!(status, StatusCode::OK);
    }
    let memory = http.metrics().await;
    found.extend(exported(&memory));

    let missing: Vec<_> = wanted.difference(&found).collect();
    assert!(
        missing.is_empty(),
        "named in ops/ but not exported by the demo: {missing:?}\nexported: {found:?}"
    );
    // Counted at zero, not yet at one: nothing was lost, nothing failed.
    assert!(
        memory
            .lines()
            .any(|l| l.starts_with("idempotency_lease_lost_total{") && l.ends_with(" 0")),
        "{memory}"
    );
}

/// A signed route of the demo: its path, its delivery-id header, the signed headers, the body.
type Route<'a> = (&'a str, &'a str, Vec<(&'a str, String)>, &'a str);

/// A body and signature captured once, sent again under three new delivery ids, to every
/// signed route of the demo: one effect per route. GitHub, Kalipto and Meta sign the body
/// only and Sangho `t.body`, so the replays verify and are acknowledged as duplicates (the
/// signed content was claimed with the first delivery); Standard Webhooks signs its id, so a
/// replay under another id is 401. Before the signed content was claimed, each replay ran.
#[tokio::test]
async fn a_captured_request_replayed_under_new_ids_runs_once() {
    let demo = start_demo(&OPTIONAL_SECRETS);
    let http = Http::new(&demo);
    let t = signing::now();
    let body = r#"{"id":"evt_cap","type":"charge.succeeded"}"#;
    let status_callback = r#"{"entry":[{"changes":[{"value":{"statuses":[{"id":"wamid.C"}]}}]}]}"#;
    // Each route: its path, its delivery-id header, the signed headers, the body.
    let routes: [Route; 5] = [
        (
            "/webhooks/github",
            "X-GitHub-Delivery",
            vec![(
                "X-Hub-Signature-256",
                signing::hub(signing::GITHUB_SECRET, body),
            )],
            body,
        ),
        (
            "/webhooks/sangho",
            "Sangho-Event-ID",
            vec![(
                "Sangho-Signature",
                signing::stripe("whsec_sangho_test", t, body),
            )],
            body,
        ),
        (
            "/webhooks/kalipto",
            "X-Kalipto-Delivery-Id",
            vec![("X-Hub-Signature-256", signing::hub("kalipto-secret", body))],
            body,
        ),
        (
            "/webhooks/meta",
            "X-Kalipto-Delivery-Id",
            vec![(
                "X-Hub-Signature-256",
                signing::hub("meta-secret", status_callback),
            )],
            status_callback,
        ),
        (
            "/webhooks/standard",
            "webhook-id",
            vec![
                ("webhook-timestamp", t.to_string()),
                (
                    "webhook-signature",
                    signing::standard(signing::STANDARD_SECRET, "cap-0", t, body),
                ),
            ],
            body,
        ),
    ];
    for (round, (path, id_header, signed, body)) in routes.iter().enumerate() {
        for (i, id) in ["cap-0", "cap-1", "cap-2", "cap-3"].into_iter().enumerate() {
            let mut headers: Vec<(&str, &str)> = vec![(id_header, id)];
            headers.extend(signed.iter().map(|(name, value)| (*name, value.as_str())));
            let (status, response, _) = http.post(path, &headers, body).await;
            let replayed = response
                .get("idempotent-replayed")
                .map(|v| v.to_str().unwrap());
            match (i, *path) {
                (0, _) => assert_eq!((status, replayed), (StatusCode::OK, None), "{path}"),
                (_, "/webhooks/standard") => {
                    assert_eq!(status, StatusCode::UNAUTHORIZED, "{path} {id}")
                }
                _ => assert_eq!(
                    (status, replayed),
                    (StatusCode::OK, Some("true")),
                    "{path} {id}"
                ),
            }
        }
        assert_eq!(http.effects().await["total"], round as u64 + 1, "{path}");
    }
}
