//! The demo receiver (`examples/webhook_receiver.rs`) driven over real HTTP on loopback.
//!
//! `cargo test` builds the examples; this test starts the built binary with `BIND=127.0.0.1:0`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

struct Demo {
    child: Child,
    base: String,
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_demo(envs: &[(&str, &str)]) -> Demo {
    // target/debug/deps/demo-<hash> → target/debug/examples/webhook_receiver
    let exe = std::env::current_exe().unwrap();
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .join("examples")
        .join(format!("webhook_receiver{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.exists(),
        "build the examples first: {}",
        path.display()
    );
    let mut command = Command::new(path);
    command
        .env("BIND", "127.0.0.1:0")
        .env_remove("REDIS_URL")
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
    let base = first
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .to_owned();
    Demo { child, base }
}

struct Http {
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    base: String,
}

impl Http {
    fn new(demo: &Demo) -> Self {
        Http {
            client: Client::builder(TokioExecutor::new()).build_http(),
            base: demo.base.clone(),
        }
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (StatusCode, http::HeaderMap, Value) {
        let mut builder = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("content-type", "application/json");
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let request = builder
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        let response = tokio::time::timeout(Duration::from_secs(10), self.client.request(request))
            .await
            .unwrap()
            .unwrap();
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (parts.status, parts.headers, value)
    }

    async fn effects(&self) -> Value {
        self.send("GET", "/effects", &[], "").await.2
    }

    /// `GET /metrics`: Prometheus text.
    #[cfg(feature = "metrics")]
    async fn metrics(&self) -> String {
        let response = self
            .client
            .get(format!("{}/metrics", self.base).parse().unwrap())
            .await
            .unwrap();
        let text = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8_lossy(&text).into_owned()
    }
}

#[tokio::test]
async fn kalipto_retry_after_error_and_duplicates() {
    let demo = start_demo(&[]);
    let http = Http::new(&demo);
    let id = [("X-Kalipto-Delivery-Id", "pd_01JD8Q4M7T0XK3")];
    let fail = [
        ("X-Kalipto-Delivery-Id", "pd_01JD8Q4M7T0XK3"),
        ("x-demo-fail", "true"),
    ];
    let (status, _, _) = http.send("POST", "/webhooks/kalipto", &fail, "{}").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(http.effects().await["total"], 0);
    let (status, headers, _) = http.send("POST", "/webhooks/kalipto", &id, "{}").await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers.get("idempotent-replayed").is_none());
    let (status, headers, body) = http.send("POST", "/webhooks/kalipto", &id, "{}").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(body, json!({"ok": true, "duplicate": true}));
    assert_eq!(
        http.effects().await,
        json!({"total": 1, "by_key": {"pd_01JD8Q4M7T0XK3": 1}})
    );
    // Missing key: 400 problem+json.
    let (status, headers, body) = http.send("POST", "/webhooks/kalipto", &[], "{}").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(headers["content-type"], "application/problem+json");
    assert_eq!(body["code"], "missing_key");
}

#[tokio::test]
async fn concurrent_duplicates_get_409_then_ack() {
    let demo = start_demo(&[]);
    let http = std::sync::Arc::new(Http::new(&demo));
    let slow = {
        let http = http.clone();
        tokio::spawn(async move {
            http.send(
                "POST",
                "/webhooks/kalipto",
                &[
                    ("X-Kalipto-Delivery-Id", "pd_slow"),
                    ("x-demo-delay-ms", "500"),
                ],
                "{}",
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let (status, headers, body) = http
        .send(
            "POST",
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
    let fixtures: Value = serde_json::from_str(include_str!("fixtures/webhooks.json")).unwrap();
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
        let (status, _, _) = http.send("POST", "/webhooks/meta", &[], body).await;
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
        .send(
            "POST",
            "/webhooks/sangho",
            &[("Sangho-Event-ID", "evt_1QbR8m2eZvKYlo2C")],
            &sangho,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers.get("idempotent-replayed").is_none());
    let (status, headers, _) = http.send("POST", "/webhooks/sangho", &[], &sangho).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-replayed"], "true");

    let key = [("Idempotency-Key", "order-1")];
    let (status, headers, first) = http
        .send("POST", "/api/orders", &key, r#"{"sku":"a"}"#)
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(headers.get("idempotent-replayed").is_none());
    let (status, headers, again) = http
        .send("POST", "/api/orders", &key, r#"{"sku":"a"}"#)
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(
        headers["location"],
        format!("/api/orders/{}", first["order_id"].as_str().unwrap())
    );
    assert_eq!(again, first, "the retry gets the same order id");
    let (status, _, body) = http
        .send("POST", "/api/orders", &key, r#"{"sku":"b"}"#)
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["code"], "mismatch");
    assert_eq!(http.effects().await["total"], 5);
}

#[tokio::test]
async fn email_status_never_moves_back() {
    let demo = start_demo(&[]);
    let http = Http::new(&demo);
    let event = |id: &str, kind: &str| {
        json!({"event_id": id, "message_id": "msg_7f31", "type": kind, "occurred_at": "2026-10-29T14:00:00Z"})
            .to_string()
    };
    let status_of =
        async || http.send("GET", "/messages/msg_7f31", &[], "").await.2["status"].clone();
    for (id, kind, expected) in [
        ("evt_1", "email.received", "received"),
        ("evt_3", "email.delivered", "delivered"),
        // Out of order: processed arrives after delivered; acknowledged, not applied.
        ("evt_2", "email.processed", "delivered"),
        // A redelivery of the delivered event is a duplicate.
        ("evt_3", "email.delivered", "delivered"),
    ] {
        let (status, _, _) = http
            .send("POST", "/webhooks/email", &[], &event(id, kind))
            .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(status_of().await, expected, "after {id} {kind}");
    }
    assert_eq!(http.effects().await["total"], 3);
    let (status, _, _) = http.send("GET", "/messages/unknown", &[], "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// `GET /metrics` exposes the layer's counters in Prometheus text.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn metrics_endpoint_counts_outcomes() {
    let demo = start_demo(&[]);
    let http = Http::new(&demo);
    let id = [("X-Kalipto-Delivery-Id", "pd_metrics")];
    http.send("POST", "/webhooks/kalipto", &id, "{}").await;
    http.send("POST", "/webhooks/kalipto", &id, "{}").await;
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
    let url = format!("sqlite://{}", path.display());
    let demo = start_demo(&[("DATABASE_URL", &url)]);
    let http = Http::new(&demo);
    let id = [("X-Kalipto-Delivery-Id", "pd_store_metrics")];
    let (status, _, _) = http.send("POST", "/webhooks/kalipto", &id, "{}").await;
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
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

/// With `DATABASE_URL=sqlite://...` the demo's records survive a restart of the receiver.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_records_survive_a_receiver_restart() {
    let path = std::env::temp_dir().join(format!("demo-{}.db", std::process::id()));
    let url = format!("sqlite://{}", path.display());
    let id = [("X-Kalipto-Delivery-Id", "pd_restart")];
    {
        let demo = start_demo(&[("DATABASE_URL", &url)]);
        let http = Http::new(&demo);
        let (status, headers, _) = http.send("POST", "/webhooks/kalipto", &id, "{}").await;
        assert_eq!(status, StatusCode::OK);
        assert!(headers.get("idempotent-replayed").is_none());
    }
    let demo = start_demo(&[("DATABASE_URL", &url)]);
    let http = Http::new(&demo);
    let (status, headers, _) = http.send("POST", "/webhooks/kalipto", &id, "{}").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(
        http.effects().await["total"],
        0,
        "no effect after the restart"
    );
    drop(demo);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
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
        let (status, headers, _) = http
            .send("POST", "/webhooks/meta", &[], &whatsapp(ids))
            .await;
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
    let (status, _, _) = http.send("POST", "/webhooks/meta", &[], &body).await;
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
    let (status, headers, _) = http.send("POST", "/webhooks/meta", &delivery, &body).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers.get("idempotent-replayed").is_none());
    let (status, headers, _) = http.send("POST", "/webhooks/meta", &delivery, &body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(by_key(&http.effects().await, "dlv_status_1"), 1);
    // Without the header there is nothing to key it by: 400 naming both places.
    let (status, _, problem) = http.send("POST", "/webhooks/meta", &[], &body).await;
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
        .send(
            "POST",
            "/webhooks/meta",
            &[("x-demo-fail-item", "wamid.P2")],
            &body,
        )
        .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let effects = http.effects().await;
    assert_eq!(by_key(&effects, "wamid.P1"), 1);
    assert_eq!(by_key(&effects, "wamid.P2"), 0);
    let (status, headers, reply) = http.send("POST", "/webhooks/meta", &[], &body).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers.get("idempotent-replayed").is_none());
    assert_eq!(reply["applied"], 2, "P2 and P3 only");
    let effects = http.effects().await;
    for id in ["wamid.P1", "wamid.P2", "wamid.P3"] {
        assert_eq!(by_key(&effects, id), 1, "{id}: {effects}");
    }
    let (_, headers, _) = http.send("POST", "/webhooks/meta", &[], &body).await;
    assert_eq!(headers["idempotent-replayed"], "true");
}

/// Integer ids keep every digit: two ids past 2^64 are two events; `1e2` is not an id.
#[tokio::test]
async fn numeric_ids_are_exact() {
    let demo = start_demo(&[]);
    let http = Http::new(&demo);
    for id in ["18446744073709551616", "18446744073709551617"] {
        let body = format!(r#"{{"id":{id},"type":"payment.succeeded"}}"#);
        let (status, headers, _) = http.send("POST", "/webhooks/sangho", &[], &body).await;
        assert_eq!(status, StatusCode::OK, "{id}");
        assert!(headers.get("idempotent-replayed").is_none(), "{id}");
    }
    let effects = http.effects().await;
    assert_eq!(by_key(&effects, "18446744073709551616"), 1, "{effects}");
    assert_eq!(by_key(&effects, "18446744073709551617"), 1, "{effects}");
    // `100` and `"100"` are one key; `1e2` is a 400 saying why.
    let (status, _, _) = http
        .send("POST", "/webhooks/sangho", &[], r#"{"id":100}"#)
        .await;
    assert_eq!(status, StatusCode::OK);
    let (_, headers, _) = http
        .send("POST", "/webhooks/sangho", &[], r#"{"id":"100"}"#)
        .await;
    assert_eq!(headers["idempotent-replayed"], "true");
    let (status, _, problem) = http
        .send("POST", "/webhooks/sangho", &[], r#"{"id":1e2}"#)
        .await;
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
        .send(
            "POST",
            "/webhooks/sangho",
            &[],
            r#"{"id":"evt_reser","type":"payment.succeeded","amount":1200}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, headers, body) = http
        .send(
            "POST",
            "/webhooks/sangho",
            &[],
            "{\n  \"amount\": 1200,\n  \"type\": \"payment.succeeded\",\n  \"id\": \"evt_reser\"\n}",
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(body, json!({"ok": true, "duplicate": true}));
    assert_eq!(by_key(&http.effects().await, "evt_reser"), 1);
}

/// A handler four times slower than the lease keeps its claim (renewed while it runs): a
/// duplicate meanwhile gets 409, and the event takes effect once.
#[tokio::test]
async fn slow_handler_keeps_its_lease() {
    let demo = start_demo(&[("IDEMPOTENCY_LEASE_MS", "300")]);
    let http = std::sync::Arc::new(Http::new(&demo));
    let id = ("X-Kalipto-Delivery-Id", "pd_slow_lease");
    let slow = {
        let http = http.clone();
        tokio::spawn(async move {
            http.send(
                "POST",
                "/webhooks/kalipto",
                &[id, ("x-demo-delay-ms", "1200")],
                "{}",
            )
            .await
        })
    };
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (status, _, body) = http.send("POST", "/webhooks/kalipto", &[id], "{}").await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
    }
    assert_eq!(slow.await.unwrap().0, StatusCode::OK);
    let (status, headers, _) = http.send("POST", "/webhooks/kalipto", &[id], "{}").await;
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
    let (status, headers, body) = http.send("POST", "/webhooks/kalipto", &[id], "{}").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(headers.contains_key("retry-after"));
    // The sender retries until the dead receiver's lease has run out.
    let processed = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (status, headers, body) = http.send("POST", "/webhooks/kalipto", &[id], "{}").await;
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
    let (status, headers, _) = http.send("POST", "/webhooks/kalipto", &[id], "{}").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(by_key(&http.effects().await, "pd_killed"), 1);
    drop(second);
    remove();
}
