//! The behaviour suite and the scale-out scenarios on [`RedisStore`], against a real
//! `redis-server` started on 127.0.0.1 for each test.
#![cfg(feature = "redis")]

#[path = "support/redis_server.rs"]
mod redis_server;
mod suite;

use std::time::Duration;

use http::StatusCode;
use redis_server::RedisServer;
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::store::{Claim, IdempotencyStore, StoreKey};
use tower_idempotency::{IdempotencyLayer, RedisStore};

use suite::app::{Effects, router};
use suite::{post, send};

suite::store_suite!(async {
    let server = RedisServer::start();
    let store = RedisStore::new(server.connect().await);
    (store, server)
});

/// Redis stopped: 503 with `Retry-After` when failing closed, processed when failing open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_down_fails_closed_or_open() {
    let mut server = RedisServer::start();
    let store = RedisStore::new(server.connect().await);
    suite::fail_open_processes_without_protection(store, async || server.kill()).await;
}

/// Through the layer, a first delivery costs 2 commands (SET NX GET, EVALSHA) and a duplicate
/// costs 1 (SET NX GET), as sent by the client (`MONITOR`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_commands_per_first_delivery_one_per_duplicate() {
    let server = RedisServer::start();
    let store = RedisStore::new(server.connect().await);
    store.load_scripts().await.unwrap();
    let effects = Effects::default();
    let app = router(IdempotencyLayer::new(store).namespace("cost"), &effects);

    let monitor = server.monitor();
    let (status, _, _) = send(&app, post("/effect", Some("k1"), "{}")).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(monitor.finish(), ["SET", "EVALSHA"]);

    let monitor = server.monitor();
    let (status, _, _) = send(&app, post("/effect", Some("k1"), "{}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(monitor.finish(), ["SET"]);

    // A failed attempt: SET, then the release script.
    let monitor = server.monitor();
    let mut req = post("/effect", Some("k2"), "{}");
    req.headers_mut()
        .insert("x-demo-fail", "true".parse().unwrap());
    let (status, _, _) = send(&app, req).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(monitor.finish(), ["SET", "EVALSHA"]);
}

/// Two app instances (two clients, two routers) on one Redis: 50 concurrent deliveries of one
/// event spread over both give one effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_fifty_concurrent_deliveries_one_effect() {
    let server = RedisServer::start();
    let effects = Effects::default();
    let a = router(
        IdempotencyLayer::new(RedisStore::new(server.connect_pool(2).await)).namespace("shared"),
        &effects,
    );
    let b = router(
        IdempotencyLayer::new(RedisStore::new(server.connect_pool(2).await)).namespace("shared"),
        &effects,
    );
    let mut tasks = Vec::new();
    for i in 0..50 {
        let app = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            let mut req = post("/effect", Some("evt_shared"), r#"{"id":"evt_shared"}"#);
            req.headers_mut()
                .insert("x-demo-delay-ms", "200".parse().unwrap());
            send(&app, req).await.0
        }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    let created = statuses
        .iter()
        .filter(|s| **s == StatusCode::CREATED)
        .count();
    assert_eq!(created, 1, "{statuses:?}");
    assert!(
        statuses
            .iter()
            .all(|s| [StatusCode::CREATED, StatusCode::CONFLICT, StatusCode::OK].contains(s))
    );
    assert_eq!(effects.total(), 1);
}

/// Redis killed mid-test: 503 + Retry-After and nothing recorded; Redis restarted: the same
/// app, without a restart, processes the retries exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_then_retries_are_processed_once() {
    let mut server = RedisServer::start();
    let store = RedisStore::new(server.connect().await);
    let effects = Effects::default();
    let app = router(
        IdempotencyLayer::new(store)
            .namespace("restart")
            .store_timeout(Duration::from_millis(500)),
        &effects,
    );
    let (status, _, _) = send(&app, post("/effect", Some("before"), "{}")).await;
    assert_eq!(status, StatusCode::CREATED);

    server.kill();
    let (status, headers, body) = send(&app, post("/effect", Some("evt_1"), "{}")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(headers.contains_key("retry-after"));
    assert!(String::from_utf8_lossy(&body).contains("store_unavailable"));
    assert_eq!(effects.total(), 1, "nothing processed while Redis is down");

    server.restart();
    // The sender retries every non-2xx. The reserve that timed out may have been applied when
    // the client reconnected; the layer releases it in the background (token-checked), so the
    // retries do not wait for its 30 s lease.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        let (status, _, _) = send(&app, post("/effect", Some("evt_1"), "{}")).await;
        let retry = [StatusCode::SERVICE_UNAVAILABLE, StatusCode::CONFLICT].contains(&status);
        if !retry || tokio::time::Instant::now() > deadline {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status, StatusCode::CREATED);
    let (status, headers, _) = send(&app, post("/effect", Some("evt_1"), "{}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(effects.total(), 2);
}

/// An app instance that died while holding a claim leaves a lease: duplicates get 409 until
/// it expires, then the event is processed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_of_a_dead_instance_expires_then_processed_once() {
    let server = RedisServer::start();
    let store = RedisStore::new(server.connect().await);
    let effects = Effects::default();
    let app = router(
        IdempotencyLayer::new(store.clone())
            .namespace("dead")
            .fingerprint(false),
        &effects,
    );
    // What the dead instance left behind: its claim, with a 400 ms lease, never settled.
    let key = StoreKey::new("dead", Some("/effect"), "evt_1");
    store
        .reserve(
            &key,
            &Claim::new(Fingerprint::NONE),
            Duration::from_millis(400),
        )
        .await
        .unwrap();
    let (status, _, _) = send(&app, post("/effect", Some("evt_1"), "{}")).await;
    assert_eq!(status, StatusCode::CONFLICT);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, _, _) = send(&app, post("/effect", Some("evt_1"), "{}")).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _, _) = send(&app, post("/effect", Some("evt_1"), "{}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(effects.total(), 1);
}
