//! The inbox contract on the memory inbox, and what only the memory inbox shows (its bound).

use tower_idempotency::test_util::inbox as inbox_contract;
use tower_idempotency::test_util::inbox_admin as inbox_admin_contract;

use bytes::Bytes;
use tower_idempotency::inbox::{InboxStore, KeyState, MemoryInbox};
use tower_idempotency::store::{StoreErrorKind, StoreKey};
use tower_idempotency::test_util::values;

inbox_contract::inbox_contract!(async { (MemoryInbox::new(10_000), ()) });
inbox_admin_contract::inbox_admin_contract!(async { (MemoryInbox::new(10_000), ()) });

/// The contract through `AnyInbox::on` a memory store.
mod any {
    use super::*;

    inbox_contract::inbox_contract!(async {
        let store = tower_idempotency::store::connect("memory:").await.unwrap();
        let inbox = tower_idempotency::inbox::AnyInbox::on(&store, "any")
            .await
            .unwrap();
        assert_eq!(inbox.backend(), "memory");
        (inbox, ())
    });
    inbox_admin_contract::inbox_admin_contract!(async {
        let store = tower_idempotency::store::connect("memory:").await.unwrap();
        let inbox = tower_idempotency::inbox::AnyInbox::on(&store, "any")
            .await
            .unwrap();
        (inbox, ())
    });
}

/// A full memory inbox refuses a new entry (the route answers 503) and drops none.
#[tokio::test]
async fn a_full_memory_inbox_refuses_and_drops_nothing() {
    let inbox = MemoryInbox::new(2);
    let entry = |n: u32| {
        values::inbox_entry(
            StoreKey::new("full", None, &n.to_string()),
            Bytes::new(),
            "c",
        )
    };
    inbox.enqueue(entry(1)).await.unwrap();
    inbox.enqueue(entry(2)).await.unwrap();
    let error = inbox.enqueue(entry(3)).await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Capacity);
    assert_eq!(inbox.counts().await.unwrap().pending, 2);
}

/// A worker tells its handler which attempt it runs: the first, then the second after the
/// first failed; the entry is done after it.
#[tokio::test]
async fn a_handler_is_told_which_attempt_it_runs() {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;
    use tower_idempotency::inbox::{Backoff, InboxRequest, Worker};

    let inbox = MemoryInbox::default();
    let entry = values::inbox_entry(StoreKey::new("attempts", None, "a"), Bytes::new(), "c");
    inbox.enqueue(entry.clone()).await.unwrap();
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let seen = attempts.clone();
    let handler = tower::service_fn(move |request: InboxRequest| {
        let attempt = request.attempt();
        seen.lock().unwrap().push(attempt);
        async move {
            match attempt {
                1 => Err("the first attempt fails".to_owned()),
                _ => Ok(()),
            }
        }
    });
    let worker = Worker::new(inbox.clone(), handler)
        .retry(Backoff::new(Duration::from_millis(1)))
        .poll_interval(Duration::from_millis(5));
    while_running(
        |stop| worker.run(stop),
        until(&inbox, &entry, KeyState::Done),
    )
    .await;
    assert_eq!(*attempts.lock().unwrap(), [1, 2]);
}

/// A worker follows the retry policy it is given, here a closure of its own: two retries,
/// then a dead letter after the third attempt (the default backoff would run five).
#[tokio::test]
async fn a_custom_retry_policy_decides_when_an_entry_is_dead() {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;
    use tower_idempotency::inbox::{Decision, InboxRequest, Worker};

    let inbox = MemoryInbox::default();
    let entry = values::inbox_entry(StoreKey::new("policy", None, "a"), Bytes::new(), "c");
    inbox.enqueue(entry.clone()).await.unwrap();
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let seen = attempts.clone();
    let handler = tower::service_fn(move |request: InboxRequest| {
        seen.lock().unwrap().push(request.attempt());
        async move { Err::<(), _>("always fails".to_owned()) }
    });
    let policy = |attempts: u32| match attempts {
        1 | 2 => Decision::RetryAfter(Duration::from_millis(1)),
        _ => Decision::DeadLetter,
    };
    let worker = Worker::new(inbox.clone(), handler)
        .retry(policy)
        .poll_interval(Duration::from_millis(5));
    while_running(
        |stop| worker.run(stop),
        until(&inbox, &entry, KeyState::Dead),
    )
    .await;
    assert_eq!(*attempts.lock().unwrap(), [1, 2, 3]);
}

/// A lease left behind by a crashed worker is announced by nobody: an idle worker finds its
/// entry at its poll interval, here 100 ms, well before the default 5 s.
#[tokio::test]
async fn an_idle_worker_looks_again_at_its_poll_interval() {
    use std::time::Duration;
    use tower_idempotency::inbox::{InboxRequest, Worker};

    let inbox = MemoryInbox::default();
    let entry = values::inbox_entry(StoreKey::new("poll", None, "a"), Bytes::new(), "c");
    inbox.enqueue(entry.clone()).await.unwrap();
    let started = tokio::time::Instant::now();
    // The crashed worker's lease: it runs out after 1 s, and no one says so.
    let taken = inbox.take(1, Duration::from_secs(1)).await.unwrap();
    assert_eq!(taken.len(), 1);
    let handler =
        tower::service_fn(|_: InboxRequest| async move { Ok::<(), std::convert::Infallible>(()) });
    let worker = Worker::new(inbox.clone(), handler).poll_interval(Duration::from_millis(100));
    let done = until(&inbox, &entry, KeyState::Done);
    while_running(|stop| worker.run(stop), done).await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(1),
        "taken under the lease: {waited:?}"
    );
    assert!(
        waited < Duration::from_millis(3_500),
        "not polled: {waited:?}"
    );
}

/// Enqueues `entry` again until the inbox says its key is in `state` (at most 10 s).
async fn until(
    inbox: &MemoryInbox,
    entry: &tower_idempotency::inbox::InboxEntry,
    state: tower_idempotency::inbox::KeyState,
) {
    use std::time::Duration;
    use tower_idempotency::inbox::Enqueued;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while inbox.enqueue(entry.clone()).await.unwrap() != Enqueued::Duplicate(state) {
        assert!(tokio::time::Instant::now() < deadline, "never {state:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Runs a worker (`run`, handed its shutdown signal) while `until` runs, then shuts it down
/// and waits for it to end.
async fn while_running<W, U>(
    run: impl FnOnce(futures_util::future::BoxFuture<'static, ()>) -> W,
    until: U,
) -> U::Output
where
    W: std::future::Future<Output = ()> + Send + 'static,
    U: std::future::Future,
{
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(run(Box::pin(async {
        let _ = stopped.await;
    })));
    let output = until.await;
    stop.send(()).unwrap();
    worker.await.unwrap();
    output
}

/// A key a worker applied is kept done for the worker's retention, then forgotten: a later
/// delivery of it is queued again.
#[tokio::test]
async fn a_done_key_is_kept_for_the_workers_retention() {
    use std::time::Duration;
    use tower_idempotency::inbox::{Enqueued, InboxRequest, Worker};

    let inbox = MemoryInbox::default();
    let entry = values::inbox_entry(StoreKey::new("retention", None, "a"), Bytes::new(), "c");
    inbox.enqueue(entry.clone()).await.unwrap();
    let handler = tower::service_fn(|_: InboxRequest| async { Ok::<_, String>(()) });
    let retention = Duration::from_millis(1000);
    let worker = Worker::new(inbox.clone(), handler)
        .retention(retention)
        .poll_interval(Duration::from_millis(5));
    while_running(
        |stop| worker.run(stop),
        until(&inbox, &entry, KeyState::Done),
    )
    .await;
    tokio::time::sleep(retention + Duration::from_millis(200)).await;
    assert_eq!(inbox.enqueue(entry).await.unwrap(), Enqueued::Queued);
}

/// A worker with two workers runs two entries at once.
#[tokio::test]
async fn workers_run_that_many_entries_at_once() {
    use std::sync::Arc;
    use std::time::Duration;
    use tower_idempotency::inbox::{InboxRequest, Worker};

    let inbox = MemoryInbox::default();
    let entries: Vec<_> = (0..2)
        .map(|n| {
            values::inbox_entry(
                StoreKey::new("workers", None, &n.to_string()),
                Bytes::new(),
                "c",
            )
        })
        .collect();
    for entry in &entries {
        inbox.enqueue(entry.clone()).await.unwrap();
    }
    // Each handler waits (at most 2 s) until two run at once.
    let (running, _) = tokio::sync::watch::channel(0usize);
    let running = Arc::new(running);
    let together = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (started, seen) = (running.clone(), together.clone());
    let handler = tower::service_fn(move |_: InboxRequest| {
        let (running, together) = (started.clone(), seen.clone());
        async move {
            running.send_modify(|n| *n += 1);
            let mut started = running.subscribe();
            let both = tokio::time::timeout(Duration::from_secs(2), started.wait_for(|n| *n >= 2));
            let both = both.await.is_ok();
            together.lock().unwrap().push(both);
            Ok::<_, String>(())
        }
    });
    let worker = Worker::new(inbox.clone(), handler)
        .workers(2)
        .poll_interval(Duration::from_millis(5));
    let all_done = async {
        for entry in &entries {
            until(&inbox, entry, KeyState::Done).await;
        }
    };
    while_running(|stop| worker.run(stop), all_done).await;
    assert_eq!(*together.lock().unwrap(), [true, true], "two ran at once");
}

/// Signatures as the senders compute them.
#[cfg(feature = "verify")]
#[path = "../support/signing.rs"]
mod signing;

mod route {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use axum::Router;
    use axum::body::Body;
    use axum::routing::post;
    use http::{Request, StatusCode};
    use tower::ServiceExt;
    use tower_idempotency::Outcome;
    use tower_idempotency::inbox::{InboxLayer, InboxStore, MemoryInbox};
    use tower_idempotency::key::JsonPathKey;

    fn app(inbox: MemoryInbox, calls: Arc<AtomicU32>) -> Router {
        let layer = InboxLayer::new(inbox)
            .namespace("inbox-route")
            .key(JsonPathKey::new("$.event_id").unwrap())
            .keep_headers([http::header::CONTENT_TYPE]);
        let handler = post(move || {
            calls.fetch_add(1, Ordering::SeqCst);
            async { "inner" }
        });
        Router::new().route("/inbox", handler.route_layer(layer))
    }

    fn delivery(event: &str, request_id: Option<&str>) -> Request<Body> {
        let mut request = Request::post("/inbox").header("content-type", "application/json");
        if let Some(id) = request_id {
            request = request.header("x-request-id", id);
        }
        request
            .body(Body::from(format!(r#"{{"event_id":"{event}"}}"#)))
            .unwrap()
    }

    /// First delivery 202 (queued, entry stored), duplicate acked with `Idempotent-Replayed`,
    /// both with the correlation id; the inner service is never called.
    #[tokio::test]
    async fn first_is_queued_and_a_duplicate_is_acked_without_the_handler() {
        let (inbox, calls) = (MemoryInbox::default(), Arc::new(AtomicU32::new(0)));
        let app = app(inbox.clone(), calls.clone());
        let first = app
            .clone()
            .oneshot(delivery("evt_1", Some("req-42")))
            .await
            .unwrap();
        assert_eq!(first.status(), StatusCode::ACCEPTED);
        assert_eq!(first.extensions().get::<Outcome>(), Some(&Outcome::Queued));
        assert_eq!(first.headers()["idempotency-correlation-id"], "req-42");
        let again = app.clone().oneshot(delivery("evt_1", None)).await.unwrap();
        assert_eq!(again.status(), StatusCode::OK);
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        let generated = again.headers()["idempotency-correlation-id"]
            .to_str()
            .unwrap();
        assert_eq!(generated.len(), 32, "generated when the request has none");
        assert_eq!(
            calls.load(Ordering::SeqCst),
            0,
            "the handler is the workers' job"
        );
        let taken = inbox
            .take(10, std::time::Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(taken.len(), 1, "one entry for two deliveries");
        let entry = &taken[0].entry;
        assert_eq!(&entry.body[..], br#"{"event_id":"evt_1"}"#);
        assert_eq!(
            (entry.correlation_id.as_str(), entry.headers.len()),
            ("req-42", 1)
        );
        assert_eq!(
            (entry.id.as_str(), entry.route.as_str()),
            ("evt_1", "inbox-route"),
            "the delivery's key as derived and its route"
        );
        let key = tower_idempotency::store::StoreKey::new("inbox-route", Some("/inbox"), "evt_1");
        assert_eq!(entry.key, key);
    }

    /// An ordered door needs no record store: the first event of an object is queued, an older
    /// one after a newer was applied is answered stale (200, `Idempotent-Stale`), not queued.
    #[tokio::test]
    async fn an_ordered_door_answers_an_older_event_stale() {
        use tower_idempotency::order::{EventOrder, PositionAt};
        let inbox = MemoryInbox::default();
        let order = EventOrder::new(
            JsonPathKey::new("$.message_id").unwrap(),
            PositionAt::sequence("$.seq").unwrap(),
        );
        let door = InboxLayer::new(inbox.clone())
            .namespace("ordered-door")
            .key(JsonPathKey::new("$.event_id").unwrap())
            .order(order);
        let app = Router::new().route("/inbox", post(|| async { "inner" }).route_layer(door));
        let send = |event: &str, seq: u32| {
            let body = format!(r#"{{"event_id":"{event}","message_id":"m1","seq":{seq}}}"#);
            Request::post("/inbox").body(Body::from(body)).unwrap()
        };
        let newer = app.clone().oneshot(send("evt_2", 2)).await.unwrap();
        assert_eq!(newer.status(), StatusCode::ACCEPTED);
        let lease = inbox
            .take(10, std::time::Duration::from_secs(60))
            .await
            .unwrap()
            .pop()
            .unwrap();
        let retention = std::time::Duration::from_secs(60);
        assert!(
            inbox
                .complete(&[(lease.entry.key.clone(), lease.token)], retention)
                .await
                .unwrap()[0]
        );
        let older = app.oneshot(send("evt_1", 1)).await.unwrap();
        assert_eq!(older.status(), StatusCode::OK);
        assert_eq!(older.headers()["idempotent-stale"], "true");
        assert_eq!(inbox.counts().await.unwrap().pending, 0, "not queued");
    }

    /// The door built the earlier way (`IdempotencyLayer::inbox(InboxRoute::new(inbox))`, kept
    /// hidden for code written against it, the team's queue benchmark among them) is the door
    /// `InboxLayer::new` makes: keyed by `Idempotency-Key`, 202 then a replayed ack, in the
    /// layer's namespace.
    #[tokio::test]
    #[allow(deprecated)]
    async fn the_earlier_inbox_route_builds_the_same_door() {
        use tower_idempotency::inbox::InboxRoute;
        use tower_idempotency::{IdempotencyLayer, MemoryStore};
        let inbox = MemoryInbox::default();
        let layer = IdempotencyLayer::new(MemoryStore::new())
            .namespace("earlier-route")
            .inbox(InboxRoute::new(inbox.clone()));
        let app = Router::new().route("/inbox", post(|| async { "inner" }).route_layer(layer));
        let send = || {
            Request::post("/inbox")
                .header("idempotency-key", "evt_1")
                .body(Body::from("{}"))
                .unwrap()
        };
        let first = app.clone().oneshot(send()).await.unwrap();
        assert_eq!(first.status(), StatusCode::ACCEPTED);
        let again = app.oneshot(send()).await.unwrap();
        assert_eq!(again.status(), StatusCode::OK);
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        let lease = inbox
            .take(10, std::time::Duration::from_secs(60))
            .await
            .unwrap()
            .pop()
            .expect("one entry queued");
        assert_eq!(
            (lease.entry.route.as_str(), lease.entry.id.as_str()),
            ("earlier-route", "evt_1")
        );
    }

    /// An event at its object's watermark is queued by the door by default (two events of one
    /// second share a position) and handed out new; with `EqualPositions::Stale` it is answered
    /// stale: the route's rule reaches the inbox.
    #[tokio::test]
    async fn an_ordered_door_follows_its_rule_for_equal_positions() {
        use tower_idempotency::order::{EqualPositions, EventOrder, PositionAt};
        let retention = std::time::Duration::from_secs(60);
        for (equal, stale) in [
            (EqualPositions::Process, false),
            (EqualPositions::Stale, true),
        ] {
            let inbox = MemoryInbox::default();
            let order = EventOrder::new(
                JsonPathKey::new("$.message_id").unwrap(),
                PositionAt::unix_seconds("$.created").unwrap(),
            )
            .equal_positions(equal);
            let door = InboxLayer::new(inbox.clone())
                .namespace("equal-door")
                .key(JsonPathKey::new("$.event_id").unwrap())
                .order(order);
            let app = Router::new().route("/inbox", post(|| async { "inner" }).route_layer(door));
            let send = |event: &str| {
                let body =
                    format!(r#"{{"event_id":"{event}","message_id":"m1","created":1700000000}}"#);
                Request::post("/inbox").body(Body::from(body)).unwrap()
            };
            let first = app.clone().oneshot(send("evt_1")).await.unwrap();
            assert_eq!(first.status(), StatusCode::ACCEPTED);
            let lease = inbox.take(10, retention).await.unwrap().pop().unwrap();
            assert!(
                inbox
                    .complete(&[(lease.entry.key.clone(), lease.token)], retention)
                    .await
                    .unwrap()[0]
            );
            let second = app.oneshot(send("evt_2")).await.unwrap();
            if stale {
                assert_eq!(second.status(), StatusCode::OK, "{equal:?}");
                assert_eq!(second.headers()["idempotent-stale"], "true");
                assert_eq!(inbox.counts().await.unwrap().pending, 0, "not queued");
            } else {
                assert_eq!(second.status(), StatusCode::ACCEPTED, "{equal:?}: queued");
                let lease = inbox.take(10, retention).await.unwrap().pop().unwrap();
                assert!(
                    !lease.stale,
                    "the second event of the same second is applied"
                );
            }
        }
    }

    /// A first delivery gets the door's `accepted` answer, a duplicate its `ack_response`.
    #[tokio::test]
    async fn a_first_delivery_and_a_duplicate_get_the_configured_answers() {
        use http::HeaderValue;
        use tower_idempotency::AckResponse;
        let inbox = MemoryInbox::default();
        let door = InboxLayer::new(inbox.clone())
            .namespace("inbox-answers")
            .key(JsonPathKey::new("$.event_id").unwrap())
            .accepted(AckResponse::new(
                StatusCode::CREATED,
                HeaderValue::from_static("text/plain"),
                "stored",
            ))
            .ack_response(AckResponse::new(
                StatusCode::OK,
                HeaderValue::from_static("text/plain"),
                "stored before",
            ));
        let app = Router::new().route("/inbox", post(|| async { "inner" }).route_layer(door));
        let answer = |response: http::Response<Body>| async move {
            let status = response.status();
            let content_type = response.headers()["content-type"].clone();
            let body = axum::body::to_bytes(response.into_body(), 1024)
                .await
                .unwrap();
            (status, content_type, body)
        };
        let first = app.clone().oneshot(delivery("evt_1", None)).await.unwrap();
        assert_eq!(
            answer(first).await,
            (
                StatusCode::CREATED,
                HeaderValue::from_static("text/plain"),
                "stored".into()
            )
        );
        let again = app.oneshot(delivery("evt_1", None)).await.unwrap();
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(
            answer(again).await,
            (
                StatusCode::OK,
                HeaderValue::from_static("text/plain"),
                "stored before".into()
            )
        );
        assert_eq!(inbox.counts().await.unwrap().pending, 1);
    }

    /// The correlation id comes from the header the door was given, not `X-Request-Id`.
    #[tokio::test]
    async fn the_correlation_id_comes_from_the_configured_header() {
        let inbox = MemoryInbox::default();
        let door = InboxLayer::new(inbox.clone())
            .namespace("inbox-correlation")
            .key(JsonPathKey::new("$.event_id").unwrap())
            .correlation_header(http::HeaderName::from_static("x-trace-id"));
        let app = Router::new().route("/inbox", post(|| async { "inner" }).route_layer(door));
        let mut request = delivery("evt_1", Some("req-42"));
        request
            .headers_mut()
            .insert("x-trace-id", "trace-7".parse().unwrap());
        let first = app.oneshot(request).await.unwrap();
        assert_eq!(first.status(), StatusCode::ACCEPTED);
        assert_eq!(first.headers()["idempotency-correlation-id"], "trace-7");
        let taken = inbox
            .take(10, std::time::Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(taken[0].entry.correlation_id, "trace-7");
    }

    /// The Standard Webhooks door: a forged delivery is 401 and queues nothing; a signed one
    /// is queued under its `svix-id`.
    #[cfg(feature = "verify")]
    #[tokio::test]
    async fn a_standard_webhooks_door_queues_only_signed_deliveries_by_their_id() {
        use crate::memory::signing;
        use tower_idempotency::verify::StandardWebhooks;

        let inbox = MemoryInbox::default();
        let scheme = StandardWebhooks::new([signing::STANDARD_SECRET]).unwrap();
        let door = InboxLayer::standard_webhooks(inbox.clone(), scheme).namespace("standard");
        let app = Router::new().route("/inbox", post(|| async { "inner" }).route_layer(door));
        let body = r#"{"type":"payment.succeeded"}"#;
        let t = signing::now();
        let delivery = |signature: &str| {
            Request::post("/inbox")
                .header("svix-id", "msg_1")
                .header("svix-timestamp", t.to_string())
                .header("svix-signature", signature)
                .body(Body::from(body))
                .unwrap()
        };
        let forged = signing::standard(signing::STANDARD_SECRET, "msg_1", t, "{}");
        let refused = app.clone().oneshot(delivery(&forged)).await.unwrap();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(inbox.counts().await.unwrap().pending, 0);
        let signed = signing::standard(signing::STANDARD_SECRET, "msg_1", t, body);
        let queued = app.oneshot(delivery(&signed)).await.unwrap();
        assert_eq!(queued.status(), StatusCode::ACCEPTED);
        let taken = inbox
            .take(10, std::time::Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(taken[0].entry.id, "msg_1");
    }

    /// A full inbox: 503 + `Retry-After` as problem+json, nothing acknowledged.
    #[tokio::test]
    async fn a_full_inbox_is_503_with_retry_after() {
        let (inbox, calls) = (MemoryInbox::new(1), Arc::new(AtomicU32::new(0)));
        let app = app(inbox.clone(), calls);
        let first = app.clone().oneshot(delivery("evt_1", None)).await.unwrap();
        assert_eq!(first.status(), StatusCode::ACCEPTED);
        let full = app.oneshot(delivery("evt_2", None)).await.unwrap();
        assert_eq!(full.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(full.headers().contains_key("retry-after"));
        assert_eq!(full.headers()["content-type"], "application/problem+json");
        assert_eq!(inbox.counts().await.unwrap().pending, 1);
    }
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config {
        cases: 24,
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    })]

    /// Random arrival orders and handler delays, 4 workers: every object ends at its highest
    /// position, and no handler starts while another of its object runs.
    #[test]
    fn arrivals_in_any_order_end_at_the_highest_position(seed in proptest::prelude::any::<u64>()) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(inbox_contract::arrivals_in_any_order_end_at_the_highest_position(
            MemoryInbox::new(10_000),
            seed,
        ));
    }
}

/// In memory a listing pages through the inbox by key: every entry once, never twice.
#[tokio::test]
async fn a_memory_listing_never_repeats_an_entry() {
    use tower_idempotency::inbox::{Filter, InboxAdmin};
    let inbox = MemoryInbox::default();
    for n in 0..25 {
        let key = StoreKey::new("listing", None, &n.to_string());
        inbox
            .enqueue(values::inbox_entry(key, Bytes::new(), "c"))
            .await
            .unwrap();
    }
    let (mut listed, mut cursor) = (Vec::new(), None::<String>);
    loop {
        let page = inbox
            .list(&Filter::default(), cursor.as_deref(), 4)
            .await
            .unwrap();
        listed.extend(page.entries.into_iter().map(|info| info.entry.key));
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let unique: std::collections::HashSet<_> = listed.iter().collect();
    assert_eq!((listed.len(), unique.len()), (25, 25));
}

/// A store whose `take` hands out more entries than asked (it breaks `InboxStore::take`'s
/// bound): everything else goes to the memory inbox it wraps.
#[derive(Clone)]
struct Greedy(MemoryInbox);

impl InboxStore for Greedy {
    async fn enqueue(
        &self,
        entry: tower_idempotency::inbox::InboxEntry,
    ) -> Result<tower_idempotency::inbox::Enqueued, tower_idempotency::store::StoreError> {
        self.0.enqueue(entry).await
    }
    async fn take(
        &self,
        max: usize,
        lease: std::time::Duration,
    ) -> Result<Vec<tower_idempotency::inbox::Lease>, tower_idempotency::store::StoreError> {
        self.0.take(max + 4, lease).await
    }
    async fn renew(
        &self,
        key: &StoreKey,
        token: &tower_idempotency::store::Token,
        lease: std::time::Duration,
    ) -> Result<bool, tower_idempotency::store::StoreError> {
        self.0.renew(key, token, lease).await
    }
    async fn complete(
        &self,
        leases: &[(StoreKey, tower_idempotency::store::Token)],
        retention: std::time::Duration,
    ) -> Result<Vec<bool>, tower_idempotency::store::StoreError> {
        self.0.complete(leases, retention).await
    }
    async fn fail(
        &self,
        key: &StoreKey,
        token: &tower_idempotency::store::Token,
        failure: tower_idempotency::inbox::Failure,
    ) -> Result<bool, tower_idempotency::store::StoreError> {
        self.0.fail(key, token, failure).await
    }
    async fn counts(
        &self,
    ) -> Result<tower_idempotency::inbox::InboxCounts, tower_idempotency::store::StoreError> {
        self.0.counts().await
    }
    fn wakeups(&self) -> tower_idempotency::inbox::Wakeups {
        self.0.wakeups()
    }
}

/// A worker whose store's `take` returns more entries than asked neither panics nor loses
/// them: it runs every entry it was handed, once, and its run returns at shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_returning_more_than_asked_runs_every_entry_once() {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;
    use tower_idempotency::inbox::{InboxRequest, Worker};

    let inbox = MemoryInbox::default();
    let entries: Vec<_> = (0..6)
        .map(|n| {
            let key = StoreKey::new("greedy", None, &n.to_string());
            values::inbox_entry(key, Bytes::new(), "c")
        })
        .collect();
    for entry in &entries {
        inbox.enqueue(entry.clone()).await.unwrap();
    }
    let calls = Arc::new(Mutex::new(HashMap::<StoreKey, u32>::new()));
    let seen = calls.clone();
    let handler = tower::service_fn(move |request: InboxRequest| {
        *seen
            .lock()
            .unwrap()
            .entry(request.key().clone())
            .or_default() += 1;
        async { Ok::<_, std::convert::Infallible>(()) }
    });
    // One worker: its first take asks for one entry and gets five.
    let worker = Worker::new(Greedy(inbox.clone()), handler)
        .workers(1)
        .poll_interval(Duration::from_millis(5));
    let applied = async {
        for entry in &entries {
            until(&inbox, entry, KeyState::Done).await;
        }
    };
    while_running(|stop| worker.run(stop), applied).await;
    let calls = calls.lock().unwrap();
    for entry in &entries {
        assert_eq!(
            calls.get(&entry.key),
            Some(&1),
            "every entry handed out runs once: {}",
            entry.key
        );
    }
}
