//! The smoke run of the behaviour suite, the store contract and the scale-out scenarios on [`RedisStore`],
//! against a real `redis-server` started on 127.0.0.1 for each test; and what a batch costs,
//! in commands (`MONITOR`) and in round trips (through `support/redis_proxy.rs`).
#![cfg(feature = "redis")]

use crate::redis_proxy;
use crate::redis_server;
use crate::suite;
use tower_idempotency::store::AnyStore;
use tower_idempotency::test_util::store::{self as contract, OneTarget};

use std::time::Duration;

use contract::keys_of;
use fred::interfaces::ClientLike;
use http::StatusCode;
use redis_proxy::RoundTripProxy;
use redis_server::RedisServer;
use tower_idempotency::IdempotencyStore;
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::store::{CachedStore, LocalCache};
use tower_idempotency::store::{Completion, Reservation, StoreKey};
use tower_idempotency::test_util::values;
use tower_idempotency::{IdempotencyLayer, RedisStore};

use suite::app::{Effects, router};
use suite::{post, send};

suite::store_smoke!(async {
    let server = RedisServer::start();
    let store = RedisStore::new(server.connect().await);
    (store, server)
});

once_suite!(async {
    let server = RedisServer::start();
    let store = RedisStore::new(server.connect().await);
    (store, server)
});

contract::store_contract!(async {
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

/// Two instances of a layer in `namespace` on `server`, each with a client of its own (the
/// scripts loaded): the first with its own local cache, the second with the one returned,
/// which shows what it caches.
pub(crate) async fn two_instances(
    server: &RedisServer,
    namespace: &str,
    effects: &Effects,
) -> (axum::Router, axum::Router, LocalCache) {
    let store = RedisStore::new(server.connect().await);
    store.load_scripts().await.unwrap();
    let first = router(IdempotencyLayer::new(store).namespace(namespace), effects);
    let cache = LocalCache::new();
    let other = RedisStore::new(server.connect().await);
    let layer = IdempotencyLayer::new(other)
        .namespace(namespace)
        .local_cache(cache.clone());
    (first, router(layer, effects), cache)
}

/// What `app` answers `req`, and the commands the server was sent meanwhile (`MONITOR`).
pub(crate) async fn monitored(
    server: &RedisServer,
    app: &axum::Router,
    req: http::Request<axum::body::Body>,
) -> (StatusCode, http::HeaderMap, Vec<String>) {
    let monitor = server.monitor();
    let (status, headers, _) = send(app, req).await;
    (status, headers, monitor.finish())
}

/// Through `app`, a first delivery of `k1` costs `SET` then `EVALSHA`, and its duplicate no
/// command (answered from the local cache): the duplicate's headers.
pub(crate) async fn first_then_cached(server: &RedisServer, app: &axum::Router) -> http::HeaderMap {
    let (status, _, sent) = monitored(server, app, post("/effect", Some("k1"), "{}")).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(sent, ["SET", "EVALSHA"]);
    let (status, headers, sent) = monitored(server, app, post("/effect", Some("k1"), "{}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(sent, Vec::<String>::new());
    headers
}

/// Through the layer, a first delivery costs 2 commands, one round trip each (`SET NX GET`,
/// then `EVALSHA`); a duplicate costs 1 (`SET NX GET`) on an instance whose local cache does
/// not hold the record, even one that never saw the key (nothing more is sent, in the
/// background or later), and none on one that does; as sent by the clients (`MONITOR`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_round_trips_per_first_delivery_one_per_duplicate() {
    let server = RedisServer::start();
    let effects = Effects::default();
    // A second instance on the same Redis, with a cache of its own.
    let (app, other, other_cache) = two_instances(&server, "cost", &effects).await;

    // The instance that completed the key answers its duplicates from its local cache.
    first_then_cached(&server, &app).await;

    // Another instance reads the record once, and caches it at once.
    let monitor = server.monitor();
    let (status, _, _) = send(&other, post("/effect", Some("k1"), "{}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(other_cache.len(), 1, "cached from the reserve's answer");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        monitor.finish(),
        ["SET"],
        "nothing more, even in the background"
    );
    let (status, _, sent) = monitored(&server, &other, post("/effect", Some("k1"), "{}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(sent, Vec::<String>::new());
    assert_eq!(effects.total(), 1);

    // A failed attempt: the claim, then the release script.
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
        // The default store timeout (2 s): the call before the kill must not time out on a
        // loaded machine; the ones after it fail as the client sees the server gone.
        IdempotencyLayer::new(store).namespace("restart"),
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
    // retries do not wait for its 10 s lease.
    let status = retry_while_unavailable(&app, Duration::from_secs(10)).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, headers, _) = send(&app, post("/effect", Some("evt_1"), "{}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(effects.total(), 2);
}

/// Redis hung (SIGSTOP: connected, answering nothing), behind a client whose own command
/// timeout is far longer than the layer's store timeout: the layer's timeout is the one that
/// answers, 503 + Retry-After and nothing processed; once Redis answers again, the sender's
/// retries are processed once (a claim that landed late is released by the layer in the
/// background).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_redis_answers_503_at_the_layers_store_timeout() {
    let layer_timeout = Some(Duration::from_millis(300));
    let client_timeout = Duration::from_secs(60);
    let answered = Duration::from_millis(300)..Duration::from_secs(10);
    hung_redis_is_answered_503(client_timeout, layer_timeout, answered).await;
}

/// A client that times out its own commands within the layer's store timeout (2 s by default):
/// the layer arms no timer of its own (`IdempotencyStore::command_timeout`), and a hung Redis is
/// still answered 503 + Retry-After, at the client's timeout, with nothing processed; the
/// retries after it resumes are processed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_redis_answers_503_at_the_clients_own_command_timeout() {
    let client_timeout = Duration::from_millis(400);
    let answered = Duration::from_millis(400)..Duration::from_millis(1900);
    hung_redis_is_answered_503(client_timeout, None, answered).await;
}

/// A request sent while Redis hangs, behind a client with `client_timeout` and a layer with
/// `layer_timeout` (its default when `None`): 503 + Retry-After within `answered`, nothing
/// processed; after Redis resumes, the sender's retries are processed once.
async fn hung_redis_is_answered_503(
    client_timeout: Duration,
    layer_timeout: Option<Duration>,
    answered: std::ops::Range<Duration>,
) {
    let server = RedisServer::start();
    let mut builder = server.builder();
    builder.with_performance_config(|perf| perf.default_command_timeout = client_timeout);
    let client = builder.build().unwrap();
    client.init().await.unwrap();
    let store = RedisStore::new(client);
    assert_eq!(store.command_timeout(), Some(client_timeout));
    store.load_scripts().await.unwrap();
    let effects = Effects::default();
    let layer = IdempotencyLayer::new(store).namespace("hung");
    let layer = match layer_timeout {
        Some(timeout) => layer.store_timeout(timeout),
        None => layer,
    };
    let app = router(layer, &effects);

    server.freeze();
    let started = tokio::time::Instant::now();
    let sent = send(&app, post("/effect", Some("evt_1"), "{}"));
    // Bounded here too: a call that nothing times out would otherwise hang the test.
    let answer = tokio::time::timeout(answered.end, sent).await;
    let waited = started.elapsed();
    server.thaw();
    let Ok((status, headers, _)) = answer else {
        panic!("no answer within {:?} while Redis hung", answered.end);
    };
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(headers.contains_key("retry-after"));
    assert!(
        answered.contains(&waited),
        "answered after {waited:?}, expected within {answered:?}"
    );
    assert_eq!(effects.total(), 0, "nothing processed while Redis hung");

    let status = retry_while_unavailable(&app, Duration::from_secs(15)).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _, _) = send(&app, post("/effect", Some("evt_1"), "{}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(effects.total(), 1);
}

/// `store::connect` gives the layer a client that times out its commands at the layer's default
/// store timeout (the layer then arms no timer of its own); durable completion, whose calls can
/// chain round trips, leaves the timing to the layer.
#[tokio::test]
async fn connect_reports_the_clients_command_timeout_and_durable_completion_none() {
    let server = RedisServer::start();
    let store = tower_idempotency::store::connect(&server.url())
        .await
        .unwrap();
    let two_seconds = Some(Duration::from_secs(2));
    assert_eq!(store.command_timeout(), two_seconds);
    let AnyStore::Redis(redis) = &store else {
        panic!("{} is not a Redis store", store.backend())
    };
    assert_eq!(redis.command_timeout(), two_seconds);
    let durable = store
        .durable_completion(1, Duration::from_millis(50))
        .unwrap();
    assert_eq!(durable.command_timeout(), None);
}

/// A client without a command timeout (zero) leaves the timing to the layer.
#[tokio::test]
async fn a_client_without_a_command_timeout_reports_none() {
    let server = RedisServer::start();
    let mut builder = server.builder();
    builder.with_performance_config(|perf| perf.default_command_timeout = Duration::ZERO);
    let store = RedisStore::new(builder.build().unwrap());
    assert_eq!(store.command_timeout(), None);
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
    // What the dead instance left behind: its claim, with a 1.5 s lease, never settled.
    let key = StoreKey::new("dead", Some("/effect"), "evt_1");
    let lease = Duration::from_millis(1500);
    let claimed = tokio::time::Instant::now();
    store
        .reserve_one(&key, &values::claim(Fingerprint::NONE), lease)
        .await
        .unwrap();
    let (status, _, _) = send(&app, post("/effect", Some("evt_1"), "{}")).await;
    assert_eq!(status, StatusCode::CONFLICT);
    // The sender retries while it gets 409; once the lease has run out, the event is processed.
    let status = loop {
        let (status, _, _) = send(&app, post("/effect", Some("evt_1"), "{}")).await;
        if status != StatusCode::CONFLICT || claimed.elapsed() > lease * 4 {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status, StatusCode::CREATED);
    assert!(claimed.elapsed() >= lease, "processed while the lease ran");
    let (status, _, _) = send(&app, post("/effect", Some("evt_1"), "{}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(effects.total(), 1);
}

/// How long [`RoundTripProxy`] waits for the client to go quiet before it lets the held replies
/// through: far above the microseconds between the writes of one pipeline.
const QUIET: Duration = Duration::from_millis(250);

/// `n` store keys of one batch, never used before on this server.
fn batch_keys(label: &str, n: usize) -> Vec<StoreKey> {
    (0..n)
        .map(|i| StoreKey::new("batch", None, &format!("{label}-{i}")))
        .collect()
}

/// A batch of N = 5 new items through the store's batch methods: `reserve_many` then
/// `complete_many` cost exactly **2 round trips** and 10 commands (5 `SET`, then 5
/// `EVALSHA`); a duplicate batch costs 1 round trip of 5 `SET`s without the local cache, and
/// none with it.
///
/// Commands are counted with `MONITOR` (what the server received from clients, scripts'
/// inner calls left out). Round trips cannot be read from `MONITOR`: five `SET`s sent one by
/// one, each after the previous reply, look exactly like five pipelined ones. So the client
/// talks to Redis through [`RoundTripProxy`], which forwards commands at once but withholds
/// the replies until the client has been quiet for [`QUIET`]: a client that waits for a reply
/// before its next command shows one command per round, a pipeline shows as one round. No
/// latency is measured and compared: the assertion cannot pass for a client that waits
/// between the commands of a batch, and could only fail spuriously if fred paused for more
/// than 250 ms while writing one pipeline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_five_costs_two_round_trips() {
    const N: usize = 5;
    let server = RedisServer::start();
    let proxy = RoundTripProxy::start(server.port(), QUIET).await;
    // Without the local cache: what the Redis store itself costs.
    let store = RedisStore::new(proxy.connect().await);
    store.load_scripts().await.unwrap();
    let keys = batch_keys("new", N);
    let claim = values::claim(Fingerprint::of_bytes(b"{}"));
    let record = values::owned_by(values::record_ack(claim.fingerprint()), claim.token());
    let retention = Duration::from_secs(3600);
    // Connection set-up and SCRIPT LOAD are not part of the measure.
    let _ = proxy.take_rounds();

    let monitor = server.monitor();
    let reserved = store
        .reserve(&keys_of(&keys), &claim, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(reserved, vec![Reservation::Acquired; N]);
    let completed = store
        .complete(&keys_of(&keys), &claim, &record, retention)
        .await
        .unwrap();
    assert_eq!(completed, vec![Completion::Written; N]);
    let sent = monitor.finish();
    let rounds = proxy.take_rounds();
    println!(
        "batch of {N} new items, reserve_many + complete_many: MONITOR {} lines {sent:?}; \
         {} round trips {rounds:?}",
        sent.len(),
        rounds.len()
    );
    // Every claim, all in one pipeline; then every completion, in another.
    let set = vec!["SET".to_owned(); N];
    let evalsha = vec!["EVALSHA".to_owned(); N];
    assert_eq!(sent, [set.clone(), evalsha.clone()].concat());
    assert_eq!(rounds, [set.clone(), evalsha]);

    // The same batch again (a duplicate delivery): one round trip of N SETs.
    let monitor = server.monitor();
    let again = values::claim(Fingerprint::of_bytes(b"{}"));
    let duplicate = store
        .reserve(&keys_of(&keys), &again, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        duplicate
            .iter()
            .all(|r| matches!(r, Reservation::Completed(_))),
        "{duplicate:?}"
    );
    let sent = monitor.finish();
    let rounds = proxy.take_rounds();
    println!(
        "the same batch again: MONITOR {} lines; {} round trip(s)",
        sent.len(),
        rounds.len()
    );
    assert_eq!(sent, set);
    assert_eq!(rounds, [set]);

    // With a local cache (what a layer puts in front of the store by default), an instance
    // that completed the batch answers its duplicate with no round trip.
    let cached = CachedStore::with_cache(RedisStore::new(proxy.connect().await), LocalCache::new());
    let fresh = batch_keys("cached", N);
    let claim_c = values::claim(Fingerprint::of_bytes(b"{}"));
    let record_c = values::owned_by(values::record_ack(claim_c.fingerprint()), claim_c.token());
    cached
        .reserve(&keys_of(&fresh), &claim_c, Duration::from_secs(30))
        .await
        .unwrap();
    cached
        .complete(&keys_of(&fresh), &claim_c, &record_c, retention)
        .await
        .unwrap();
    let _ = proxy.take_rounds();
    let monitor = server.monitor();
    let duplicate = cached
        .reserve(&keys_of(&fresh), &again, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        duplicate
            .iter()
            .all(|r| matches!(r, Reservation::Completed(_)))
    );
    assert_eq!(monitor.finish(), Vec::<String>::new());
    assert_eq!(proxy.take_rounds(), Vec::<Vec<String>>::new());

    // The control: the single-key method called per key waits for each reply, and the proxy
    // sees it (one round per command).
    for key in batch_keys("one-by-one", 3) {
        store
            .reserve_one(&key, &claim, Duration::from_secs(30))
            .await
            .unwrap();
    }
    let rounds = proxy.take_rounds();
    println!("3 single-key reserves: {} round trips", rounds.len());
    let one = vec!["SET".to_owned()];
    assert_eq!(rounds, vec![one; 3]);
}

/// Releasing and renewing a batch take one round trip each; after `SCRIPT FLUSH` (a restart,
/// a failover) the `NOSCRIPT` replies are sent again as `EVAL`, together: one more round trip
/// for the whole batch, not one per item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_after_noscript_costs_one_more_round_trip() {
    const N: usize = 5;
    let server = RedisServer::start();
    let proxy = RoundTripProxy::start(server.port(), QUIET).await;
    let store = RedisStore::new(proxy.connect().await);
    store.load_scripts().await.unwrap();
    let keys = batch_keys("noscript", N);
    let claim = values::claim(Fingerprint::of_bytes(b"{}"));
    let lease = Duration::from_secs(30);
    store.reserve(&keys_of(&keys), &claim, lease).await.unwrap();
    let _ = proxy.take_rounds();

    assert!(store.renew(&keys_of(&keys), &claim, lease).await.unwrap());
    let evalsha = vec!["EVALSHA".to_owned(); N];
    assert_eq!(proxy.take_rounds(), std::slice::from_ref(&evalsha));

    let flushed = server.raw_command(&["SCRIPT", "FLUSH", "SYNC"]).unwrap();
    assert!(flushed.starts_with("+OK"), "{flushed}");
    assert_eq!(store.release(&keys_of(&keys), &claim).await.unwrap(), N);
    let rounds = proxy.take_rounds();
    println!("release_many of {N} after SCRIPT FLUSH: {rounds:?}");
    assert_eq!(rounds, [evalsha.clone(), vec!["EVAL".to_owned(); N]]);

    // Cached again: one round trip.
    assert_eq!(store.release(&keys_of(&keys), &claim).await.unwrap(), 0);
    assert_eq!(proxy.take_rounds(), [evalsha]);
    // An empty batch sends nothing.
    assert_eq!(
        store.reserve(&keys_of(&[]), &claim, lease).await.unwrap(),
        []
    );
    assert_eq!(store.release(&keys_of(&[]), &claim).await.unwrap(), 0);
    assert!(store.renew(&keys_of(&[]), &claim, lease).await.unwrap());
    assert!(proxy.take_rounds().is_empty());
}

/// Sends `evt_1` as a sender retries, while it is answered 503 or 409, for at most `limit`: the
/// last status.
async fn retry_while_unavailable(app: &axum::Router, limit: Duration) -> StatusCode {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let (status, _, _) = send(app, post("/effect", Some("evt_1"), "{}")).await;
        let retry = [StatusCode::SERVICE_UNAVAILABLE, StatusCode::CONFLICT].contains(&status);
        if !retry || tokio::time::Instant::now() > deadline {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
