//! The behaviour suite every store must pass, driven through a real axum `Router`.
//!
//! Each store's test file instantiates it with `store_suite!(async { (store, guard) })`, where
//! `guard` keeps whatever the store needs (a redis-server) alive for the test.

#![allow(dead_code)]

pub mod app;
pub mod order;
// The schemes the verification tests sign with are the `verify` feature's.
#[cfg(feature = "verify")]
pub mod verify;

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_idempotency::key::{ExtractKey, FieldsFingerprintKey, HeaderKey, JsonPathKey};
use tower_idempotency::{
    AckResponse, FailureMode, IdempotencyLayer, IdempotencyStore, MissingKey, Mode, OnMismatch,
    Outcome, Scope,
};

use self::app::{Effects, router};

/// A request to `path` with key header `key` and `body`.
pub fn post(path: &str, key: Option<&str>, body: &'static str) -> Request<Body> {
    let mut builder = Request::post(path).header("content-type", "application/json");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder.body(Body::from(body)).unwrap()
}

/// Sends `req` and returns status, headers and body.
pub async fn send(app: &Router, req: Request<Body>) -> (StatusCode, http::HeaderMap, Bytes) {
    let response = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, body)
}

/// `POST /effect` with `key` and the demo header `name: value` (`x-demo-delay-ms`,
/// `x-demo-hold`), sent in a task of its own: a request still running while the test goes on.
pub fn spawn_effect(
    app: &Router,
    key: &'static str,
    name: &'static str,
    value: &'static str,
) -> tokio::task::JoinHandle<(StatusCode, http::HeaderMap, Bytes)> {
    let app = app.clone();
    tokio::spawn(async move {
        let mut req = post("/effect", Some(key), "{}");
        req.headers_mut().insert(name, value.parse().unwrap());
        send(&app, req).await
    })
}

fn problem(body: &Bytes) -> serde_json::Value {
    serde_json::from_slice(body).expect("problem+json body")
}

/// The problem document in `body` says `why` in its `detail`.
fn assert_detail(body: &Bytes, why: &str) {
    let doc = problem(body);
    assert!(doc["detail"].as_str().unwrap().contains(why), "{doc}");
}

/// What `app` answers `req` is a replay acknowledged `200` (`idempotent-replayed: true`).
async fn assert_acked(app: &Router, req: Request<Body>) {
    let (status, headers, _) = send(app, req).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-replayed"], "true");
}

pub fn assert_problem(headers: &http::HeaderMap, body: &Bytes, status: u16, code: &str) {
    assert_eq!(headers["content-type"], "application/problem+json");
    let doc = problem(body);
    assert_eq!(doc["status"], status, "{doc}");
    assert_eq!(doc["code"], code, "{doc}");
    assert!(doc["detail"].as_str().is_some_and(|d| !d.is_empty()));
}

/// A unique namespace per test, so tests sharing a store never see each other's keys.
pub fn ns(test: &str) -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!(
        "{test}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// `layer` in front of the suite's app, and the effects its handlers count.
fn served<St: 'static, K: ExtractKey + Clone>(layer: IdempotencyLayer<St, K>) -> (Effects, Router) {
    let effects = Effects::default();
    let app = router(layer, &effects);
    (effects, app)
}

pub fn layer<St: IdempotencyStore>(store: St, test: &str) -> IdempotencyLayer<St> {
    IdempotencyLayer::new(store).namespace(ns(test))
}

pub async fn safe_methods_pass_through<St: IdempotencyStore>(store: St) {
    let (_effects, app) = served(layer(store, "safe"));
    let (status, _, body) = send(&app, Request::get("/echo").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "get ok");
    // Unknown paths stay 404 (route_layer), even for covered methods without a key.
    let (status, _, _) = send(&app, post("/nowhere", None, "{}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

pub async fn first_time_is_the_inner_response_unchanged<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(layer(store, "first"));
    let (status, headers, body) = send(&app, post("/effect", Some("k1"), "{}")).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["x-handler"], "effect");
    assert!(headers.get("idempotent-replayed").is_none());
    assert_eq!(body, "effect 1");
    assert_eq!(effects.total(), 1);
}

pub async fn duplicate_of_completed_key_is_acknowledged<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(layer(store, "dup"));
    send(&app, post("/effect", Some("k1"), r#"{"a":1}"#)).await;
    let response = app
        .clone()
        .oneshot(post("/effect", Some("k1"), r#"{"a":1}"#))
        .await
        .unwrap();
    assert_eq!(
        response.extensions().get::<Outcome>(),
        Some(&Outcome::Replayed)
    );
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    assert_eq!(parts.status, StatusCode::OK);
    assert_eq!(parts.headers["idempotent-replayed"], "true");
    assert_eq!(parts.headers["content-type"], "application/json");
    assert_eq!(body, r#"{"ok":true,"duplicate":true}"#);
    assert_eq!(effects.total(), 1);
}

pub async fn body_over_limit_is_413<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(layer(store, "limit").body_limit(16));
    // By Content-Length.
    let (status, headers, body) = send(
        &app,
        post(
            "/effect",
            Some("k1"),
            r#"{"much":"too long for the limit"}"#,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_problem(&headers, &body, 413, "payload_too_large");
    // While reading a chunked body without Content-Length.
    let chunks = futures_util::stream::iter(
        ["0123456789", "0123456789"]
            .map(|c| Ok::<_, std::io::Error>(Bytes::from_static(c.as_bytes()))),
    );
    let req = Request::post("/effect")
        .header("idempotency-key", "k2")
        .body(Body::from_stream(chunks))
        .unwrap();
    let (status, headers, body) = send(&app, req).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_problem(&headers, &body, 413, "payload_too_large");
    assert_eq!(effects.total(), 0);
}

pub async fn missing_key_is_400_or_passes_through<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(layer(store.clone(), "missing"));
    let (status, headers, body) = send(&app, post("/effect", None, "{}")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_problem(&headers, &body, 400, "missing_key");
    assert_eq!(effects.total(), 0);

    let app = router(
        layer(store, "missing-pass").missing_key(MissingKey::PassThrough),
        &effects,
    );
    let (status, _, _) = send(&app, post("/effect", None, "{}")).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _, _) = send(&app, post("/effect", None, "{}")).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(effects.total(), 2, "unprotected requests are all processed");
}

pub async fn malformed_keys_are_400_saying_why<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(layer(store, "malformed"));
    let long = "k".repeat(256);
    let (status, headers, body) = send(&app, post("/effect", Some(&long), "{}")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_problem(&headers, &body, 400, "malformed_key");
    assert_detail(&body, "256 bytes");
    // The longest allowed key is fine.
    let (status, _, _) = send(&app, post("/effect", Some(&"k".repeat(255)), "{}")).await;
    assert_eq!(status, StatusCode::CREATED);
    // A tab is a control character.
    let (status, _, body) = send(&app, post("/effect", Some("a\tb"), "{}")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_detail(&body, "control");
    // Non-ASCII bytes.
    let req = Request::post("/effect")
        .header(
            "idempotency-key",
            http::HeaderValue::from_bytes(b"caf\xe9").unwrap(),
        )
        .body(Body::from("{}"))
        .unwrap();
    let (status, _, body) = send(&app, req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_detail(&body, "visible ASCII");
    // Twice the header.
    let req = Request::post("/effect")
        .header("idempotency-key", "a")
        .header("idempotency-key", "b")
        .body(Body::from("{}"))
        .unwrap();
    let (status, _, body) = send(&app, req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_detail(&body, "more than once");
    // The body is not echoed, the key is not echoed.
    assert!(!String::from_utf8_lossy(&body).contains("\"a\""));
    assert_eq!(effects.total(), 1);
}

pub async fn duplicate_in_flight_is_409_with_retry_after<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(layer(store, "inflight"));
    let slow = spawn_effect(&app, "k1", "x-demo-hold", "1");
    effects.wait_started(1).await;
    let (status, headers, body) = send(&app, post("/effect", Some("k1"), "{}")).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(headers["retry-after"], "1");
    assert_problem(&headers, &body, 409, "in_flight");
    effects.open_gate();
    let (status, _, _) = slow.await.unwrap();
    assert_eq!(status, StatusCode::CREATED);
    assert_acked(&app, post("/effect", Some("k1"), "{}")).await;
    assert_eq!(effects.total(), 1);
}

pub async fn an_in_flight_duplicate_is_told_the_configured_retry_after<St: IdempotencyStore>(
    store: St,
) {
    let (effects, app) =
        served(layer(store, "inflight-after").in_flight_retry_after(Duration::from_secs(7)));
    let slow = spawn_effect(&app, "k1", "x-demo-hold", "1");
    effects.wait_started(1).await;
    let (status, headers, _) = send(&app, post("/effect", Some("k1"), "{}")).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(headers["retry-after"], "7");
    effects.open_gate();
    slow.await.unwrap();
}

pub async fn wait_for_in_flight_then_answer<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(layer(store, "wait").wait_for_in_flight(Duration::from_secs(3)));
    let slow = spawn_effect(&app, "k1", "x-demo-delay-ms", "200");
    effects.wait_started(1).await;
    assert_acked(&app, post("/effect", Some("k1"), "{}")).await;
    slow.await.unwrap();
    assert_eq!(effects.total(), 1);
}

pub async fn key_reused_with_other_payload_is_422<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(layer(store.clone(), "mismatch"));
    send(&app, post("/effect", Some("k1"), r#"{"amount":1}"#)).await;
    let (status, headers, body) = send(&app, post("/effect", Some("k1"), r#"{"amount":2}"#)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_problem(&headers, &body, 422, "mismatch");

    let app = router(
        layer(store, "mismatch-ack").on_mismatch(OnMismatch::Ack),
        &effects,
    );
    send(&app, post("/effect", Some("k1"), r#"{"amount":1}"#)).await;
    assert_acked(&app, post("/effect", Some("k1"), r#"{"amount":2}"#)).await;
    assert_eq!(effects.total(), 2);
}

pub async fn fingerprint_off_never_mismatches<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(layer(store, "nofp").fingerprint(false));
    send(&app, post("/effect", Some("k1"), r#"{"amount":1}"#)).await;
    assert_acked(&app, post("/effect", Some("k1"), r#"{"amount":2}"#)).await;
    assert_eq!(effects.total(), 1);
}

pub async fn hundred_concurrent_duplicates_run_once<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(layer(store, "hundred"));
    let mut tasks = Vec::new();
    for _ in 0..100 {
        tasks.push(spawn_effect(&app, "same", "x-demo-delay-ms", "100"));
    }
    let (mut created, mut conflict, mut acked) = (0, 0, 0);
    for task in tasks {
        let (status, headers, _) = task.await.unwrap();
        match status {
            StatusCode::CREATED => created += 1,
            StatusCode::CONFLICT => conflict += 1,
            StatusCode::OK => {
                assert_eq!(headers["idempotent-replayed"], "true");
                acked += 1
            }
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(created, 1);
    assert_eq!(created + conflict + acked, 100);
    assert_eq!(effects.total(), 1, "the inner handler ran exactly once");
}

pub async fn a_key_is_processed_again_after_its_retention<St: IdempotencyStore>(store: St) {
    let retention = Duration::from_millis(1000);
    let (effects, app) = served(layer(store, "retention").retention(retention));
    send(&app, post("/effect", Some("k1"), "{}")).await;
    assert_acked(&app, post("/effect", Some("k1"), "{}")).await;
    tokio::time::sleep(retention + Duration::from_millis(200)).await;
    let (status, headers, body) = send(&app, post("/effect", Some("k1"), "{}")).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(headers.get("idempotent-replayed").is_none());
    assert_eq!(body, "effect 2");
    assert_eq!(effects.total(), 2);
}

pub async fn failed_attempt_is_processed_again<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(layer(store, "retry"));
    let mut req = post("/effect", Some("k1"), "{}");
    req.headers_mut()
        .insert("x-demo-fail", "true".parse().unwrap());
    let (status, _, _) = send(&app, req).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let (status, headers, body) = send(&app, post("/effect", Some("k1"), "{}")).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "the retry after an error is processed"
    );
    assert!(headers.get("idempotent-replayed").is_none());
    assert_eq!(body, "effect 2");
    assert_eq!(effects.total(), 2);
}

pub async fn dropped_future_releases_the_claim<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(layer(store, "dropped"));
    let task = spawn_effect(&app, "k1", "x-demo-delay-ms", "10000");
    effects.wait_started(1).await;
    task.abort(); // the client disconnected
    let _ = task.await;
    // The release runs in a spawned task: give it a moment, far less than the 10 s lease.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        let (status, _, _) = send(&app, post("/effect", Some("k1"), "{}")).await;
        if status == StatusCode::CREATED {
            break;
        }
        assert_eq!(status, StatusCode::CONFLICT);
        assert!(tokio::time::Instant::now() < deadline, "claim not released");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(effects.completed(), 1);
}

pub async fn panic_in_handler_releases_the_claim<St: IdempotencyStore>(store: St) {
    let (_effects, app) = served(layer(store, "panic"));
    let mut req = post("/effect", Some("k1"), "{}");
    req.headers_mut()
        .insert("x-demo-panic", "true".parse().unwrap());
    let app2 = app.clone();
    let joined = tokio::spawn(async move { send(&app2, req).await }).await;
    assert!(joined.unwrap_err().is_panic());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        let (status, _, _) = send(&app, post("/effect", Some("k1"), "{}")).await;
        if status == StatusCode::CREATED {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "claim not released");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub async fn slow_handler_keeps_its_claim_by_renewal<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(
        layer(store, "lease")
            .lease(Duration::from_secs(1))
            .mode(Mode::Replay),
    );
    // Four leases long: only renewal keeps the claim. (A lease of a second: a renewal that a
    // loaded machine delays by a few hundred ms still comes in time.)
    let slow = spawn_effect(&app, "k1", "x-demo-delay-ms", "4000");
    effects.wait_started(1).await;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Past the first lease, the claim is still held: a duplicate meanwhile is a 409.
        let (status, headers, body) = send(&app, post("/effect", Some("k1"), "{}")).await;
        assert_eq!(status, StatusCode::CONFLICT);
        assert!(headers.contains_key("retry-after"));
        assert_problem(&headers, &body, 409, "in_flight");
    }
    let (status, _, body) = slow.await.unwrap();
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(body, "effect 1");
    // The slow original recorded its response: the retry gets it replayed.
    let (status, headers, body) = send(&app, post("/effect", Some("k1"), "{}")).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(body, "effect 1");
    assert_eq!(effects.total(), 1);
}

pub async fn replay_mode_replays_status_headers_body_and_trailers<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(layer(store, "replay").mode(Mode::Replay));
    let first = app
        .clone()
        .oneshot(post("/trailers", Some("k1"), "{}"))
        .await
        .unwrap();
    let (first_parts, first_body) = first.into_parts();
    let first_body = first_body.collect().await.unwrap();
    let first_trailers = first_body.trailers().cloned();
    assert!(first_trailers.is_some());
    let second = app
        .clone()
        .oneshot(post("/trailers", Some("k1"), "{}"))
        .await
        .unwrap();
    let (parts, body) = second.into_parts();
    let body = body.collect().await.unwrap();
    assert_eq!(parts.status, first_parts.status);
    assert_eq!(parts.headers["idempotent-replayed"], "true");
    assert_eq!(parts.headers["content-type"], "text/plain");
    assert_eq!(parts.headers["location"], "/orders/1");
    assert!(
        parts.headers.get("set-cookie").is_none(),
        "not allow-listed"
    );
    assert_eq!(body.trailers().cloned(), first_trailers);
    assert_eq!(body.to_bytes(), first_body.to_bytes());
    assert_eq!(effects.total(), 1);
}

pub async fn a_replay_keeps_the_configured_headers<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(
        layer(store, "replay-headers")
            .mode(Mode::Replay)
            .replay_headers([http::HeaderName::from_static("x-handler")]),
    );
    send(&app, post("/effect", Some("k1"), "{}")).await;
    let (status, headers, body) = send(&app, post("/effect", Some("k1"), "{}")).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(headers["x-handler"], "effect", "kept by the setting");
    assert_eq!(body, "effect 1");
    assert_eq!(effects.total(), 1);
}

pub async fn a_duplicate_gets_the_configured_acknowledgement<St: IdempotencyStore>(store: St) {
    let ack = AckResponse::new(
        StatusCode::ACCEPTED,
        http::HeaderValue::from_static("text/plain"),
        "seen it",
    );
    let (effects, app) = served(layer(store, "ack-response").ack_response(ack));
    send(&app, post("/effect", Some("k1"), "{}")).await;
    let (status, headers, body) = send(&app, post("/effect", Some("k1"), "{}")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(headers["content-type"], "text/plain");
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(body, "seen it");
    assert_eq!(effects.total(), 1);
}

pub async fn a_response_the_application_calls_success_is_recorded<St: IdempotencyStore>(store: St) {
    // A 500 counted as success: its key is done, the retry is a duplicate.
    let (effects, app) = served(
        layer(store, "success-when")
            .success_when(|status, _| status.is_success() || status.is_server_error()),
    );
    let mut failing = post("/effect", Some("k1"), "{}");
    failing
        .headers_mut()
        .insert("x-demo-fail", "1".parse().unwrap());
    let (status, _, _) = send(&app, failing).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_acked(&app, post("/effect", Some("k1"), "{}")).await;
    assert_eq!(effects.total(), 1, "the retry did not run again");
}

pub async fn the_api_profile_replays_and_rejects_a_reused_key<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(IdempotencyLayer::api(store).namespace(ns("api")));
    let (status, _, body) = send(&app, post("/effect", Some("k1"), r#"{"a":1}"#)).await;
    assert_eq!(
        (status, body.as_ref()),
        (StatusCode::CREATED, &b"effect 1"[..])
    );
    let (status, headers, body) = send(&app, post("/effect", Some("k1"), r#"{"a":1}"#)).await;
    assert_eq!(status, StatusCode::CREATED, "the response replayed");
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(body, "effect 1");
    let (_, headers, body) = send(&app, post("/effect", Some("k1"), r#"{"a":2}"#)).await;
    assert_problem(&headers, &body, 422, "mismatch");
    assert_eq!(effects.total(), 1);
}

pub async fn the_webhook_profile_acknowledges_a_reused_id_with_another_payload<
    St: IdempotencyStore,
>(
    store: St,
) {
    let (effects, app) = served(IdempotencyLayer::webhook(store).namespace(ns("webhook")));
    let (status, _, _) = send(&app, post("/effect", Some("evt_1"), r#"{"a":1}"#)).await;
    assert_eq!(status, StatusCode::CREATED);
    // A sender never reuses an id on purpose: a 4xx would only make it retry.
    assert_acked(&app, post("/effect", Some("evt_1"), r#"{"a":2}"#)).await;
    assert_eq!(effects.total(), 1);
}

pub async fn failing_response_body_is_not_recorded<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(layer(store, "bodyfail"));
    let response = app
        .clone()
        .oneshot(post("/broken-body", Some("k1"), "{}"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.into_body().collect().await.is_err());
    let response = app
        .clone()
        .oneshot(post("/broken-body", Some("k1"), "{}"))
        .await
        .unwrap();
    assert!(response.headers().get("idempotent-replayed").is_none());
    assert_eq!(effects.total(), 2, "the retry ran again");
}

pub async fn large_streamed_response_is_recorded_at_its_end<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(layer(store, "large").response_buffer_limit(1024));
    let (status, _, body) = send(&app, post("/large", Some("k1"), "{}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body.len(), 64 * 1024);
    // Recorded when the stream ended, in the background of the body's last poll.
    assert_acked(&app, post("/large", Some("k1"), "{}")).await;
    assert_eq!(effects.total(), 1);
}

pub async fn scopes_keep_routes_and_tenants_apart<St: IdempotencyStore>(store: St) {
    let effects = Effects::default();
    // Default scope: the path. The same key on two routes is two keys.
    let app = router(layer(store.clone(), "scope-path"), &effects);
    send(&app, post("/effect", Some("k1"), "{}")).await;
    let (status, _, _) = send(&app, post("/trailers", Some("k1"), "{}")).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(effects.total(), 2);

    let app = router(
        layer(store, "scope-tenant").scope(Scope::header("x-tenant-id").unwrap()),
        &effects,
    );
    for tenant in ["a", "b", "a"] {
        let mut req = post("/effect", Some("k1"), "{}");
        req.headers_mut()
            .insert("x-tenant-id", tenant.parse().unwrap());
        send(&app, req).await;
    }
    assert_eq!(
        effects.total(),
        4,
        "tenant a and tenant b each processed once"
    );
}

pub async fn no_scope_or_a_scope_function_keeps_apart_what_it_says<St: IdempotencyStore>(
    store: St,
) {
    let effects = Effects::default();
    // No scope: the same key on two routes is one key.
    let app = router(
        layer(store.clone(), "scope-none").scope(Scope::none()),
        &effects,
    );
    send(&app, post("/effect", Some("k1"), "{}")).await;
    assert_acked(&app, post("/trailers", Some("k1"), "{}")).await;
    assert_eq!(effects.total(), 1);

    // A function of the head: the query, which the default scope (the path) leaves out.
    let by_query = Scope::from_fn(|parts| parts.uri.query().map(str::to_owned));
    let app = router(layer(store, "scope-fn").scope(by_query), &effects);
    for query in ["t=a", "t=b", "t=a"] {
        send(&app, post(&format!("/effect?{query}"), Some("k1"), "{}")).await;
    }
    assert_eq!(effects.total(), 3, "t=a and t=b each processed once");
}

pub async fn only_the_configured_methods_are_protected<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(layer(store, "methods").methods([http::Method::PUT]));
    // POST is no longer covered: no key needed, and a repeated key runs again.
    let (status, _, _) = send(&app, post("/effect", None, "{}")).await;
    assert_eq!(status, StatusCode::CREATED);
    for _ in 0..2 {
        let (status, headers, _) = send(&app, post("/effect", Some("k1"), "{}")).await;
        assert_eq!(status, StatusCode::CREATED);
        assert!(headers.get("idempotent-replayed").is_none());
    }
    assert_eq!(effects.total(), 3);
    // PUT is.
    let put = |key: Option<&str>| {
        let mut builder = Request::put("/effect");
        if let Some(key) = key {
            builder = builder.header("idempotency-key", key);
        }
        builder.body(Body::from("{}")).unwrap()
    };
    let (status, headers, body) = send(&app, put(None)).await;
    assert_problem(&headers, &body, 400, "missing_key");
    assert_eq!(status, StatusCode::BAD_REQUEST);
    send(&app, put(Some("k2"))).await;
    assert_acked(&app, put(Some("k2"))).await;
    assert_eq!(effects.total(), 4);
}

pub async fn json_path_key_from_body<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(layer(store, "json").key(JsonPathKey::new("$.event.id").unwrap()));
    let (status, _, _) = send(&app, post("/effect", None, r#"{"event":{"id":"e1"}}"#)).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, headers, _) =
        send(&app, post("/effect", None, r#"{"event": {"id": "e1"}}"#)).await;
    // Same id, different bytes: a different payload fingerprint.
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{headers:?}");
    assert_acked(&app, post("/effect", None, r#"{"event":{"id":"e1"}}"#)).await;
    let (status, _, body) = send(&app, post("/effect", None, "not json")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_detail(&body, "not valid JSON");
    assert_eq!(effects.total(), 1);
}

const WHATSAPP_BATCH: &str = r#"{"object":"whatsapp_business_account","entry":[{"id":"1","changes":[{"field":"messages","value":{"messages":[{"id":"wamid.A","type":"text"},{"id":"wamid.B","type":"image"}]}}]}]}"#;
const WHATSAPP_BATCH_REVERSED: &str = r#"{"object":"whatsapp_business_account","entry":[{"id":"1","changes":[{"field":"messages","value":{"messages":[{"id":"wamid.B","type":"image"},{"id":"wamid.A","type":"text"}]}}]}]}"#;

const WHATSAPP_BATCH_A_ONLY: &str = r#"{"object":"whatsapp_business_account","entry":[{"id":"1","changes":[{"field":"messages","value":{"messages":[{"id":"wamid.A","type":"text"}]}}]}]}"#;

pub async fn whatsapp_batch_is_one_composite_key<St: IdempotencyStore>(store: St) {
    let effects = Effects::default();
    let path = JsonPathKey::new("$.entry[*].changes[*].value.messages[*].id").unwrap();
    let app = router(layer(store.clone(), "wa").key(path.clone()), &effects);
    let (status, _, _) = send(&app, post("/effect", None, WHATSAPP_BATCH)).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_acked(&app, post("/effect", None, WHATSAPP_BATCH)).await;
    // The same ids in another order: the same key; other bytes, so a payload mismatch.
    let (status, _, _) = send(&app, post("/effect", None, WHATSAPP_BATCH_REVERSED)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    // A batch of only one of those ids is another key: the batch is one key as a whole.
    let (status, headers, _) = send(&app, post("/effect", None, WHATSAPP_BATCH_A_ONLY)).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(headers.get("idempotent-replayed").is_none());
    let lenient = router(
        layer(store, "wa-nofp").key(path).fingerprint(false),
        &effects,
    );
    send(&lenient, post("/effect", None, WHATSAPP_BATCH)).await;
    assert_acked(&lenient, post("/effect", None, WHATSAPP_BATCH_REVERSED)).await;
    assert_eq!(effects.total(), 3);
}

/// A WhatsApp-style batch body with these message ids.
pub fn batch(ids: &[&str]) -> String {
    let messages: Vec<serde_json::Value> = ids
        .iter()
        .map(|id| serde_json::json!({"id": id, "type": "text"}))
        .collect();
    serde_json::json!({"entry": [{"changes": [{"value": {"messages": messages}}]}]}).to_string()
}

fn post_batch(ids: &[&str], headers: &[(&str, &str)]) -> Request<Body> {
    let mut builder = Request::post("/items").header("content-type", "application/json");
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    builder.body(Body::from(batch(ids))).unwrap()
}

fn items_layer<St: IdempotencyStore>(store: St, test: &str) -> IdempotencyLayer<St, JsonPathKey> {
    IdempotencyLayer::webhook(store)
        .namespace(ns(test))
        .key(JsonPathKey::each("$.entry[*].changes[*].value.messages[*].id").unwrap())
}

pub async fn batch_items_are_processed_once_each<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(items_layer(store, "items"));
    for (ids, replayed) in [
        (&["A", "B"][..], false),
        (&["B", "C"][..], false),
        (&["A"][..], true),
        (&["B", "A"][..], true),
        (&["C", "B", "A"][..], true),
    ] {
        let (status, headers, body) = send(&app, post_batch(ids, &[])).await;
        if replayed {
            assert_eq!(status, StatusCode::OK, "{ids:?}");
            assert_eq!(headers["idempotent-replayed"], "true", "{ids:?}");
        } else {
            assert_eq!(status, StatusCode::CREATED, "{ids:?}");
            assert!(headers.get("idempotent-replayed").is_none(), "{ids:?}");
        }
        if ids == ["B", "C"] {
            assert_eq!(body, "C", "only the new item is applied");
        }
    }
    for id in ["A", "B", "C"] {
        assert_eq!(effects.item(id), 1, "{id}: {:?}", effects.items());
    }
}

/// The handler is told which items an earlier request applied (`done_before`),
/// so that it can skip them in the payload it walks.
pub async fn items_from_several_paths_form_one_item_set<St: IdempotencyStore>(store: St) {
    let key = JsonPathKey::each_of([
        "$.entry[*].changes[*].value.messages[*].id",
        "$.entry[*].messaging[*].message.mid",
    ])
    .unwrap();
    let (effects, app) = served(
        IdempotencyLayer::webhook(store)
            .namespace(ns("each-of"))
            .key(key),
    );
    let meta = |body: &'static str| {
        Request::post("/items")
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap()
    };
    // A WhatsApp message and an Instagram one in one body, then the Instagram one again with
    // a new one.
    let both = r#"{"entry":[{"changes":[{"value":{"messages":[{"id":"wa_1"}]}}]},{"messaging":[{"message":{"mid":"ig_1"}}]}]}"#;
    let (status, _, _) = send(&app, meta(both)).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!((effects.item("wa_1"), effects.item("ig_1")), (1, 1));
    let again =
        r#"{"entry":[{"messaging":[{"message":{"mid":"ig_1"}},{"message":{"mid":"ig_2"}}]}]}"#;
    let (status, _, applied) = send(&app, meta(again)).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(applied, "ig_2", "ig_1 was done before");
    assert_eq!(
        (
            effects.item("wa_1"),
            effects.item("ig_1"),
            effects.item("ig_2")
        ),
        (1, 1, 1)
    );
}

pub async fn batch_handler_sees_the_items_done_before<St: IdempotencyStore>(store: St) {
    let (_effects, app) = served(items_layer(store, "items-done-before"));
    let (status, headers, _) = send(&app, post_batch(&["A", "B"], &[])).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        headers["x-done-before"], "",
        "nothing was done before the first batch"
    );
    let (status, headers, body) = send(&app, post_batch(&["B", "C", "A"], &[])).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(body, "C");
    let mut done: Vec<&str> = headers["x-done-before"]
        .to_str()
        .unwrap()
        .split(',')
        .collect();
    done.sort_unstable();
    assert_eq!(done, ["A", "B"]);
}

pub async fn batch_item_in_flight_elsewhere_is_409_and_releases_its_claims<St: IdempotencyStore>(
    store: St,
) {
    let (effects, app) = served(items_layer(store, "items-409"));
    let slow = {
        let app = app.clone();
        tokio::spawn(
            async move { send(&app, post_batch(&["A", "B"], &[("x-demo-hold", "1")])).await },
        )
    };
    effects.wait_started(1).await;
    let (status, headers, body) = send(&app, post_batch(&["B", "C"], &[])).await;
    assert_problem(&headers, &body, 409, "in_flight");
    assert_eq!(status, StatusCode::CONFLICT);
    // C was claimed by the refused request and released at once: free for another batch.
    let (status, _, body) = send(&app, post_batch(&["C"], &[])).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(body, "C");
    effects.open_gate();
    assert_eq!(slow.await.unwrap().0, StatusCode::CREATED);
    let (status, _, body) = send(&app, post_batch(&["B", "C"], &[])).await;
    assert_eq!(status, StatusCode::OK, "{body:?}");
    for id in ["A", "B", "C"] {
        assert_eq!(effects.item(id), 1, "{id}: {:?}", effects.items());
    }
}

pub async fn batch_partial_failure_records_the_items_done<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(items_layer(store, "items-partial"));
    let (status, _, _) = send(
        &app,
        post_batch(&["P1", "P2", "P3"], &[("x-fail-item", "P2")]),
    )
    .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(effects.item("P1"), 1);
    // The retry runs only what was not done.
    let (status, _, body) = send(&app, post_batch(&["P1", "P2", "P3"], &[])).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(body, "P2,P3");
    for id in ["P1", "P2", "P3"] {
        assert_eq!(effects.item(id), 1, "{id}: {:?}", effects.items());
    }
}

pub async fn overlapping_batches_racing_apply_each_item_once<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(items_layer(store, "items-race"));
    let batches: [&[&str]; 4] = [
        &["a", "b", "c"],
        &["b", "c", "d"],
        &["c", "d", "e"],
        &["a", "e"],
    ];
    let mut tasks = Vec::new();
    for ids in batches {
        for _ in 0..3 {
            let app = app.clone();
            tasks.push(tokio::spawn(async move {
                // A sender retries on 409 until the batch is acknowledged.
                for _ in 0..400 {
                    let (status, _, _) = send(&app, post_batch(ids, &[])).await;
                    match status {
                        StatusCode::CREATED | StatusCode::OK => return,
                        StatusCode::CONFLICT => tokio::time::sleep(Duration::from_millis(5)).await,
                        other => panic!("unexpected {other}"),
                    }
                }
                panic!("the batch never went through");
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    for id in ["a", "b", "c", "d", "e"] {
        assert_eq!(effects.item(id), 1, "{id}: {:?}", effects.items());
    }
}

pub async fn too_many_items_is_400<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(items_layer(store, "items-max"));
    // One more than the most ids a key may hold (1000, documented on `IdempotencyKey::items`).
    let ids: Vec<String> = (0..=1000).map(|i| format!("m{i}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let (status, headers, body) = send(&app, post_batch(&ids, &[])).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_problem(&headers, &body, 400, "malformed_key");
    assert_eq!(effects.total(), 0);
}

pub async fn numeric_ids_keep_every_digit<St: IdempotencyStore>(store: St) {
    let (effects, app) =
        served(layer(store, "numeric").key(JsonPathKey::new("$.delivery.id").unwrap()));
    let body_a = r#"{"delivery":{"id":9007199254740993,"attempt":2}}"#;
    let body_b = r#"{"delivery":{"id":9007199254740992,"attempt":2}}"#;
    let (status, _, _) = send(&app, post("/effect", None, body_a)).await;
    assert_eq!(status, StatusCode::CREATED);
    // 2^53 + 1 and 2^53 are equal as f64: they must still be two keys.
    let (status, _, _) = send(&app, post("/effect", None, body_b)).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(effects.total(), 2);
}

pub async fn bad_json_bodies_are_400_saying_why<St: IdempotencyStore>(store: St) {
    let (effects, app) =
        served(layer(store, "badjson").key(JsonPathKey::new("$.event.id").unwrap()));
    let cases: Vec<(Body, &str)> = vec![
        (
            Body::from(r#"{"event":{"id":{"nested":1}}}"#),
            "is an object",
        ),
        (Body::from(r#"{"event":{"id":[1,2]}}"#), "is an array"),
        (Body::from(r#"{"event":{"id":true}}"#), "is a boolean"),
        (Body::from(r#"{"event":{"id":""}}"#), "empty"),
        (
            Body::from(&b"{\"event\":{\"id\":\"\xff\xfe\"}}"[..]),
            "not valid JSON",
        ),
        (
            Body::from("[".repeat(10_000) + &"]".repeat(10_000)),
            "not valid JSON",
        ),
        (Body::from("{\"event\":"), "not valid JSON"),
    ];
    for (body, why) in cases {
        let req = Request::post("/effect").body(body).unwrap();
        let (status, headers, body) = send(&app, req).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{why}");
        assert_problem(&headers, &body, 400, "malformed_key");
        let detail = problem(&body)["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains(why), "{detail} should say {why}");
    }
    // No match: the missing-key policy.
    let (status, _, body) = send(&app, post("/effect", None, r#"{"other":1}"#)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(problem(&body)["code"], "missing_key");
    assert_eq!(effects.total(), 0);
}

pub async fn header_else_body_fallback_is_one_key<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(
        layer(store, "sangho").key(
            HeaderKey::new("Sangho-Event-ID")
                .unwrap()
                .or(JsonPathKey::new("$.id").unwrap()),
        ),
    );
    let body = r#"{"id":"evt_1QbR8m2eZvKYlo2C","type":"payment_intent.succeeded"}"#;
    let req = Request::post("/effect")
        .header("Sangho-Event-ID", "evt_1QbR8m2eZvKYlo2C")
        .body(Body::from(body))
        .unwrap();
    let (status, _, _) = send(&app, req).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_acked(&app, post("/effect", None, body)).await;
    assert_eq!(effects.total(), 1);
}

pub async fn fields_fingerprint_key_ignores_other_fields<St: IdempotencyStore>(store: St) {
    let effects = Effects::default();
    let key = FieldsFingerprintKey::new(["$.message_id", "$.type", "$.occurred_at"]).unwrap();
    let app = router(
        layer(store, "fields").key(key).on_mismatch(OnMismatch::Ack),
        &effects,
    );
    let first = r#"{"message_id":"msg_7f31","type":"email.opened","occurred_at":"2026-10-29T14:05:00Z","user_agent":"Mozilla/5.0"}"#;
    let again = r#"{"occurred_at": "2026-10-29T14:05:00Z", "type": "email.opened", "message_id": "msg_7f31", "user_agent": "other client"}"#;
    let other =
        r#"{"message_id":"msg_7f31","type":"email.clicked","occurred_at":"2026-10-29T14:05:00Z"}"#;
    assert_eq!(
        send(&app, post("/effect", None, first)).await.0,
        StatusCode::CREATED
    );
    assert_eq!(
        send(&app, post("/effect", None, again)).await.0,
        StatusCode::OK
    );
    assert_eq!(
        send(&app, post("/effect", None, other)).await.0,
        StatusCode::CREATED
    );
    assert_eq!(effects.total(), 2);
}

pub async fn fail_open_processes_without_protection<St: IdempotencyStore>(
    store: St,
    break_store: impl AsyncFnOnce(),
) {
    let effects = Effects::default();
    let closed = router(layer(store.clone(), "closed"), &effects);
    let open = router(
        layer(store, "open").failure_mode(FailureMode::Open),
        &effects,
    );
    break_store().await;
    let (status, headers, body) = send(&closed, post("/effect", Some("k1"), "{}")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers["retry-after"], "5");
    assert_problem(&headers, &body, 503, "store_unavailable");
    assert_eq!(effects.total(), 0, "nothing processed while failing closed");
    let (status, _, _) = send(&open, post("/effect", Some("k1"), "{}")).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(effects.total(), 1);
}

/// Instantiates the suite for one store. `$make` is an async block yielding `(store, guard)`.
#[macro_export]
macro_rules! store_suite {
    ($make:expr) => {
        $crate::store_suite!(@tests $make;
            safe_methods_pass_through,
            first_time_is_the_inner_response_unchanged,
            duplicate_of_completed_key_is_acknowledged,
            body_over_limit_is_413,
            missing_key_is_400_or_passes_through,
            malformed_keys_are_400_saying_why,
            duplicate_in_flight_is_409_with_retry_after,
            an_in_flight_duplicate_is_told_the_configured_retry_after,
            wait_for_in_flight_then_answer,
            key_reused_with_other_payload_is_422,
            fingerprint_off_never_mismatches,
            hundred_concurrent_duplicates_run_once,
            failed_attempt_is_processed_again,
            a_key_is_processed_again_after_its_retention,
            dropped_future_releases_the_claim,
            panic_in_handler_releases_the_claim,
            slow_handler_keeps_its_claim_by_renewal,
            replay_mode_replays_status_headers_body_and_trailers,
            a_replay_keeps_the_configured_headers,
            a_duplicate_gets_the_configured_acknowledgement,
            a_response_the_application_calls_success_is_recorded,
            the_api_profile_replays_and_rejects_a_reused_key,
            the_webhook_profile_acknowledges_a_reused_id_with_another_payload,
            failing_response_body_is_not_recorded,
            large_streamed_response_is_recorded_at_its_end,
            scopes_keep_routes_and_tenants_apart,
            no_scope_or_a_scope_function_keeps_apart_what_it_says,
            only_the_configured_methods_are_protected,
            json_path_key_from_body,
            whatsapp_batch_is_one_composite_key,
            batch_items_are_processed_once_each,
            items_from_several_paths_form_one_item_set,
            batch_handler_sees_the_items_done_before,
            batch_item_in_flight_elsewhere_is_409_and_releases_its_claims,
            batch_partial_failure_records_the_items_done,
            overlapping_batches_racing_apply_each_item_once,
            too_many_items_is_400,
            numeric_ids_keep_every_digit,
            bad_json_bodies_are_400_saying_why,
            header_else_body_fallback_is_one_key,
            fields_fingerprint_key_ignores_other_fields,
        );
        $crate::store_suite!(@every_store $make);
    };
    (@every_store $make:expr) => {
        $crate::store_suite!(@verified $make;
            forged_requests_are_401_and_claim_nothing,
            svix_headers_are_verified_and_keyed_by_svix_id,
            either_of_two_secrets_verifies,
            a_forged_flood_never_blocks_the_genuine_delivery,
            a_replay_under_a_new_delivery_id_is_a_duplicate,
            a_header_fallback_cannot_rekey_a_signed_body,
        );
        $crate::store_suite!(@tests_in order $make;
            a_stale_event_is_acknowledged_without_the_handler,
            one_event_of_an_object_at_a_time,
            a_stale_event_passed_on_is_marked,
            random_interleavings_keep_each_object_in_order,
        );
    };
    (@verified $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[cfg(feature = "verify")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let (store, _guard) = $make.await;
                $crate::suite::verify::$name(store).await;
            }
        )*
    };
    (@tests_in $module:ident $make:expr; $($name:ident),* $(,)?) => {
        tower_idempotency::suite_cases!($crate::suite::$module; $make; $($name),*);
    };
    (@tests $make:expr; $($name:ident),* $(,)?) => {
        tower_idempotency::suite_cases!($crate::suite; $make; $($name),*);
    };
}

/// Instantiates the smoke run of the suite for one backend: the behaviours that touch every
/// store operation (claim, record, release, renewal, in-flight conflict, concurrent winners,
/// per-item batches). The whole suite runs once, on the memory store; every backend also
/// passes the store contract (`tests/contract`), which checks each operation directly.
#[macro_export]
macro_rules! store_smoke {
    ($make:expr) => {
        $crate::store_suite!(@tests $make;
            duplicate_of_completed_key_is_acknowledged,
            duplicate_in_flight_is_409_with_retry_after,
            hundred_concurrent_duplicates_run_once,
            failed_attempt_is_processed_again,
            slow_handler_keeps_its_claim_by_renewal,
            replay_mode_replays_status_headers_body_and_trailers,
            batch_items_are_processed_once_each,
            batch_partial_failure_records_the_items_done,
            overlapping_batches_racing_apply_each_item_once,
        );
        $crate::store_suite!(@every_store $make);
    };
}

#[allow(unused_imports)]
pub use store_smoke;
#[allow(unused_imports)]
pub use store_suite;
