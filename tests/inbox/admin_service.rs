//! The inbox's admin service (`inbox::AdminService`) over a real `MemoryInbox`, mounted in an
//! axum app under `/admin/inbox` and served alone at the root: every endpoint, every refusal,
//! read-only by default, bodies hidden unless shown.
#![cfg(feature = "admin")]

use std::time::Duration;

use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tower::ServiceExt;
use tower_idempotency::inbox::{AdminService, InboxAdmin, InboxStore, MemoryInbox};
use tower_idempotency::store::ObjectKey;

use crate::admin_fixture::{self, Deliveries};

const ROUTE: &str = "inbox-email";
const SCOPE: &str = "/inbox/email";
const LEASE: Duration = Duration::from_secs(30);

/// The deliveries of the route.
const EMAIL: Deliveries = Deliveries {
    route: ROUTE,
    scope: SCOPE,
    more: "",
    why: "upstream timeout",
};

/// The service mounted as an application mounts it.
fn app(service: AdminService<MemoryInbox>) -> Router {
    Router::new().nest_service("/admin/inbox", service)
}

async fn send(
    app: &Router,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> (StatusCode, HeaderMap, Value) {
    let (status, headers, bytes) = admin_fixture::send(app, method, path, headers, body).await;
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, headers, json)
}

async fn get(app: &Router, path: &str) -> (StatusCode, Value) {
    let (status, headers, json) = send(app, "GET", path, &[], Bytes::new()).await;
    assert_content_type(status, &headers);
    (status, json)
}

async fn post(app: &Router, path: &str) -> (StatusCode, Value) {
    let (status, headers, json) = send(app, "POST", path, &[], Bytes::new()).await;
    assert_content_type(status, &headers);
    (status, json)
}

/// JSON when it answers, problem+json when it refuses.
fn assert_content_type(status: StatusCode, headers: &HeaderMap) {
    let wanted = match status.is_success() {
        true => "application/json",
        false => "application/problem+json",
    };
    assert_eq!(headers["content-type"], wanted, "{status}");
}

/// Asserts a problem document of `status` and `code`.
fn refused((status, doc): (StatusCode, Value), wanted: StatusCode, code: &str) {
    assert_eq!(status, wanted, "{doc}");
    assert_eq!(doc["code"], code, "{doc}");
    assert_eq!(doc["status"], wanted.as_u16());
}

#[tokio::test]
async fn reads_counts_pages_and_entries_with_their_attempts() {
    let inbox = EMAIL
        .inbox(&["evt_dead"], &["evt_1", "evt_2", "evt_3"])
        .await;
    let app = app(AdminService::new(inbox.clone()).route(ROUTE, Some(SCOPE)));

    let (status, counts) = get(&app, "/admin/inbox/counts").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(counts["pending"], 3);
    assert_eq!(
        (counts["in_flight"].clone(), counts["dead"].clone()),
        (json!(0), json!(1))
    );
    assert!(counts["oldest_age_ms"].is_u64(), "{counts}");
    assert_eq!(counts["paused"], false);

    // Page by page, one at a time, every queued entry once.
    let mut seen = Vec::new();
    let mut path = "/admin/inbox/entries?state=queued&limit=1".to_owned();
    loop {
        let (status, page) = get(&app, &path).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let entries = page["entries"].as_array().unwrap();
        assert!(entries.len() <= 1);
        seen.extend(entries.iter().map(|e| e["id"].as_str().unwrap().to_owned()));
        let Some(next) = page["next"].as_str() else {
            break;
        };
        path = format!("/admin/inbox/entries?state=queued&limit=1&cursor={next}");
    }
    seen.sort();
    assert_eq!(seen, ["evt_1", "evt_2", "evt_3"]);

    // The dead letter, by its error, its key and its delivery id: the same entry.
    let (_, page) = get(&app, "/admin/inbox/entries?error=upstream+timeout").await;
    assert_eq!(page["entries"].as_array().unwrap().len(), 1, "{page}");
    let listed = &page["entries"][0];
    let dead_key = EMAIL.key("evt_dead");
    assert_eq!(listed["key"], dead_key.as_str());
    assert_eq!(listed["state"], "dead");
    assert_eq!(listed["route"], ROUTE);
    assert_eq!(listed["correlation_id"], "corr-evt_dead");
    assert_eq!(listed["attempts"], 1);
    assert_eq!(listed["last_error"], "upstream timeout");
    assert_eq!(listed["until"], Value::Null);
    let attempt = &listed["history"][0];
    assert_eq!(attempt["number"], 1);
    assert_eq!(attempt["outcome"], "failed");
    assert_eq!(attempt["error"], "upstream timeout");
    assert!(
        attempt["started_at"].is_u64() && attempt["duration_ms"].is_u64(),
        "{attempt}"
    );
    assert!(
        attempt["worker"].as_str().unwrap().contains('/'),
        "{attempt}"
    );
    // Bodies are hidden unless shown.
    assert!(
        listed.get("body").is_none() && listed.get("headers").is_none(),
        "{listed}"
    );
    let (status, found) = get(&app, &format!("/admin/inbox/entries/{dead_key}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(&found, listed);
    let (status, by_id) = get(&app, "/admin/inbox/entries/by-id/evt_dead").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(&by_id, listed);

    // Every filter the listing takes, together.
    let object = ObjectKey::new(ROUTE, None, "msg-1");
    let query = format!(
        "state=dead&id_prefix=evt_d&route={ROUTE}&correlation_id=corr-evt_dead&error=timeout&object={}",
        object.as_str()
    );
    let (status, page) = get(&app, &format!("/admin/inbox/entries?{query}")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(
        page,
        json!({"entries": [], "next": null}),
        "no entry of that object"
    );
}

#[tokio::test]
async fn shows_bodies_only_when_enabled() {
    let inbox = MemoryInbox::default();
    EMAIL.enqueue(&inbox, "evt_body").await;
    let shown = app(AdminService::new(inbox.clone()).show_bodies(true));
    let (_, entry) = get(
        &shown,
        &format!("/admin/inbox/entries/{}", EMAIL.key("evt_body")),
    )
    .await;
    assert_eq!(entry["body"], "{\"event_id\":\"evt_body\"}");
    assert_eq!(entry["body_bytes"], 23);
    assert_eq!(entry["headers"], json!({}));
    // A listing reads the bodies for the service that shows them, and only for it.
    let (_, listed) = get(&shown, "/admin/inbox/entries").await;
    assert_eq!(listed["entries"][0]["body"], "{\"event_id\":\"evt_body\"}");
    let hidden = app(AdminService::new(inbox.clone()));
    let (_, listed) = get(&hidden, "/admin/inbox/entries").await;
    assert_eq!(listed["entries"][0]["key"], EMAIL.key("evt_body").as_str());
    assert!(listed["entries"][0].get("body").is_none(), "{listed}");
}

#[tokio::test]
async fn read_only_refuses_every_action_and_changes_nothing() {
    let inbox = MemoryInbox::default();
    EMAIL.kill(&inbox, &["evt_x"]).await;
    let app = app(AdminService::new(inbox.clone()));
    let dead = EMAIL.key("evt_x");
    for path in [
        format!("/admin/inbox/entries/{dead}/requeue"),
        format!("/admin/inbox/entries/{dead}/discard"),
        "/admin/inbox/requeue".to_owned(),
        "/admin/inbox/pause".to_owned(),
        "/admin/inbox/resume".to_owned(),
    ] {
        refused(
            post(&app, &path).await,
            StatusCode::FORBIDDEN,
            "admin_actions_disabled",
        );
    }
    assert_eq!(inbox.counts().await.unwrap().dead, 1);
    assert!(!inbox.is_paused().await.unwrap());
}

/// The actor in an action's log line is the one the configured header names.
#[tokio::test]
async fn an_action_is_logged_with_the_actor_the_header_names() {
    // Actions stay off: the refusal is logged with its actor.
    let service = AdminService::new(MemoryInbox::default())
        .actor_header(http::HeaderName::from_static("x-user"));
    let app = app(service);
    let headers = [("x-user", "alice@example.com")];
    let pause = send(&app, "POST", "/admin/inbox/pause", &headers, Bytes::new());
    let ((status, _, _), logged) = crate::logs::logged(pause).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(logged.contains("actions disabled"), "{logged}");
    assert!(logged.contains("alice@example.com"), "{logged}");
}

/// A discarded dead letter's key is kept done for the service's retention: a redelivery is a
/// duplicate within it, and is queued again after it.
#[tokio::test]
async fn a_discarded_key_is_kept_done_for_the_retention() {
    use tower_idempotency::inbox::{Enqueued, KeyState};
    use tower_idempotency::test_util::values;

    let inbox = MemoryInbox::default();
    EMAIL.kill(&inbox, &["evt_gone"]).await;
    let retention = Duration::from_millis(1000);
    let app = app(AdminService::new(inbox.clone())
        .actions(true)
        .retention(retention));
    let gone = EMAIL.key("evt_gone");
    let (status, _) = post(&app, &format!("/admin/inbox/entries/{gone}/discard")).await;
    assert_eq!(status, StatusCode::OK);
    let redelivery = || values::inbox_entry(gone.clone(), Bytes::new(), "corr");
    assert_eq!(
        inbox.enqueue(redelivery()).await.unwrap(),
        Enqueued::Duplicate(KeyState::Done)
    );
    tokio::time::sleep(retention + Duration::from_millis(200)).await;
    assert_eq!(inbox.enqueue(redelivery()).await.unwrap(), Enqueued::Queued);
}

#[tokio::test]
async fn actions_requeue_discard_and_pause() {
    let inbox = MemoryInbox::default();
    let ids: Vec<String> = (0..25).map(|n| format!("evt_bulk_{n:02}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    EMAIL.kill(&inbox, &ids).await;
    EMAIL.kill(&inbox, &["evt_one", "evt_gone"]).await;
    let service = AdminService::new(inbox.clone())
        .actions(true)
        .retention(Duration::from_secs(60));
    let app = app(service);

    let one = EMAIL.key("evt_one");
    let (status, answer) = post(&app, &format!("/admin/inbox/entries/{one}/requeue")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer, json!({"key": one.as_str(), "requeued": true}));
    let again = post(&app, &format!("/admin/inbox/entries/{one}/requeue")).await;
    refused(again, StatusCode::NOT_FOUND, "admin_not_found");

    let gone = EMAIL.key("evt_gone");
    let (status, answer) = post(&app, &format!("/admin/inbox/entries/{gone}/discard")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer, json!({"key": gone.as_str(), "discarded": true}));
    let (_, entry) = get(&app, &format!("/admin/inbox/entries/{gone}")).await;
    assert_eq!(
        entry["state"], "done",
        "kept as done: a redelivery is a duplicate"
    );

    // The rest, 10 at a time, until `next` is null.
    let (mut requeued, mut calls, mut cursor) = (0, 0, String::new());
    loop {
        let path = format!("/admin/inbox/requeue?id_prefix=evt_bulk_&limit=10{cursor}");
        let (status, answer) = post(&app, &path).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        requeued += answer["requeued"].as_u64().unwrap();
        calls += 1;
        match answer["next"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => break,
        }
    }
    assert_eq!((requeued, calls >= 3), (25, true));
    let counts = inbox.counts().await.unwrap();
    assert_eq!((counts.pending, counts.dead), (26, 0));

    let (status, answer) = post(&app, "/admin/inbox/pause").await;
    assert_eq!((status, answer), (StatusCode::OK, json!({"paused": true})));
    assert!(
        inbox.take(10, LEASE).await.unwrap().is_empty(),
        "paused: nothing taken"
    );
    assert_eq!(get(&app, "/admin/inbox/counts").await.1["paused"], true);
    let (status, answer) = post(&app, "/admin/inbox/resume").await;
    assert_eq!((status, answer), (StatusCode::OK, json!({"paused": false})));
    assert!(!inbox.take(10, LEASE).await.unwrap().is_empty());
}

#[tokio::test]
async fn refusals_are_problem_documents_with_the_right_status() {
    let inbox = MemoryInbox::default();
    EMAIL.enqueue(&inbox, "evt_q").await;
    let app = app(AdminService::new(inbox.clone()).actions(true));
    let queued = EMAIL.key("evt_q");
    let bad = StatusCode::BAD_REQUEST;
    for path in [
        "/admin/inbox/entries/evt_q",
        "/admin/inbox/entries?state=gone",
        "/admin/inbox/entries?limit=501",
        "/admin/inbox/entries?limit=0",
        "/admin/inbox/entries?object=msg-1",
        "/admin/inbox/entries?cursor=ti:nonsense",
        "/admin/inbox/entries?stat=dead",
        "/admin/inbox/counts?verbose=1",
    ] {
        refused(get(&app, path).await, bad, "admin_bad_parameter");
    }
    refused(
        post(&app, "/admin/inbox/requeue?limit=1001").await,
        bad,
        "admin_bad_parameter",
    );
    refused(
        post(&app, "/admin/inbox/entries/evt_q/requeue").await,
        bad,
        "admin_bad_parameter",
    );

    let missing = StatusCode::NOT_FOUND;
    refused(
        get(&app, "/admin/inbox/nothing").await,
        missing,
        "admin_not_found",
    );
    let unknown = EMAIL.key("evt_never");
    let path = format!("/admin/inbox/entries/{unknown}");
    refused(get(&app, &path).await, missing, "admin_not_found");
    let no_route = get(&app, "/admin/inbox/entries/by-id/evt_q").await;
    refused(no_route, missing, "admin_not_found");
    let path = format!("/admin/inbox/entries/{queued}/requeue");
    refused(post(&app, &path).await, missing, "admin_not_found");
    let path = format!("/admin/inbox/entries/{queued}/discard");
    refused(post(&app, &path).await, missing, "admin_not_found");

    let (status, headers, doc) = send(&app, "POST", "/admin/inbox/counts", &[], Bytes::new()).await;
    refused(
        (status, doc),
        StatusCode::METHOD_NOT_ALLOWED,
        "admin_method_not_allowed",
    );
    assert_eq!(headers["allow"], "GET");
    let (status, headers, doc) = send(&app, "GET", "/admin/inbox/pause", &[], Bytes::new()).await;
    refused(
        (status, doc),
        StatusCode::METHOD_NOT_ALLOWED,
        "admin_method_not_allowed",
    );
    assert_eq!(headers["allow"], "POST");

    let large = Bytes::from(vec![b'x'; 64 * 1024 + 1]);
    let (status, _, doc) = send(&app, "POST", "/admin/inbox/pause", &[], large.clone()).await;
    refused(
        (status, doc),
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    );
    let declared = [("content-length", "1000000")];
    let (status, _, doc) = send(&app, "POST", "/admin/inbox/pause", &declared, Bytes::new()).await;
    refused(
        (status, doc),
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    );
    assert!(!inbox.is_paused().await.unwrap(), "refused: not paused");
    let small = Bytes::from_static(b"{\"why\":\"deploy\"}");
    let (status, _, _) = send(&app, "POST", "/admin/inbox/pause", &[], small).await;
    assert_eq!(status, StatusCode::OK, "a small body is read and ignored");

    // A cursor the service sealed but the memory inbox cannot read: the store's error, 503.
    let garbage = "not-a-key";
    let check = xxhash_rust::xxh3::xxh3_64(garbage.as_bytes()) as u32;
    let path = format!("/admin/inbox/entries?cursor={garbage}.{check:08x}");
    let (status, doc) = get(&app, &path).await;
    refused(
        (status, doc),
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
    );
}

/// Served alone, the same paths from the root; and without an `Err`, whatever the body type.
#[tokio::test]
async fn answers_at_the_root_of_a_server() {
    let inbox = MemoryInbox::default();
    EMAIL.enqueue(&inbox, "evt_root").await;
    let service = AdminService::new(inbox);
    let request = Request::get("/counts")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = service.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let counts: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(counts["pending"], 1);
    let request = Request::get("/").body(Full::new(Bytes::new())).unwrap();
    let response = service.oneshot(request).await.unwrap();
    // `/` is the page (tests/inbox/admin_page.rs).
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"],
        "text/html; charset=utf-8"
    );
}
