//! [`RedisStore`] behind Redis Sentinel: a primary, its replica and three sentinels (quorum 2)
//! on 127.0.0.1 (see `support/redis_sentinel.rs`); the client finds the primary through the
//! sentinels.
//!
//! The suite's smoke run and the store contract run twice on a shared deployment (plain, and
//! with durable completion); the other tests start their own because they kill, restart or
//! freeze nodes.
//! Figures (latency, failover report) are printed: run with `--nocapture`.
#![cfg(feature = "redis")]

use crate::redis_sentinel;
use crate::scale_out;
use tower_idempotency::test_util::store::OneTarget;

use std::error::Error as _;
use std::time::{Duration, Instant};

use redis_sentinel::{Deployment, RedisSentinel, command_calls, must};
use tower_idempotency::RedisStore;
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::store::NotReplicated;
use tower_idempotency::store::{Claim, Reservation, StoreErrorKind, StoreKey};
use tower_idempotency::test_util::values;

const LEASE: Duration = Duration::from_secs(30);
const RETENTION: Duration = Duration::from_secs(3600);

/// `redis-server` missing: a loud failure, never a skip.
#[test]
#[should_panic(expected = "NOT FOUND")]
fn a_missing_redis_server_is_a_loud_failure() {
    RedisSentinel::start_with_binary("/nonexistent/redis-server");
}

fn claim() -> Claim {
    values::claim(Fingerprint::of_bytes(b"{}"))
}

fn key(label: &str) -> StoreKey {
    StoreKey::new("sentinel", None, label)
}

fn not_replicated(error: &tower_idempotency::store::StoreError) -> &NotReplicated {
    assert_eq!(error.kind(), StoreErrorKind::NotReplicated, "{error}");
    error
        .source()
        .and_then(|s| s.downcast_ref::<NotReplicated>())
        .unwrap_or_else(|| panic!("not a NotReplicated: {error}"))
}

/// Durable completion reports a replica that did not acknowledge: the record is written on
/// the primary all the same. Through a pool, the `WAIT` runs on the client that wrote (another
/// client's connection, with nothing unacknowledged, would answer 1 at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_completion_reports_replicas_that_did_not_acknowledge() {
    let deployment = RedisSentinel::start();
    // Long enough for a healthy replica on a loaded 2-core CI machine (200 ms was not, for the
    // same test on the cluster); each completion while the replica is frozen waits it out.
    let timeout = Duration::from_secs(1);
    // Commands may take longer than the `WAIT` (the fixture's 1.5 s would be close to it).
    let pool = scale_out::pool_to(&deployment, 3, Some(Duration::from_secs(5))).await;
    let store = RedisStore::new(pool.clone()).durable_completion(1, timeout);
    assert_eq!(store.durability(), Some((1, timeout)));

    let healthy = key("healthy");
    let c = claim();
    store.reserve_one(&healthy, &c, LEASE).await.unwrap();
    let record = values::record_ack(c.fingerprint());
    assert!(
        store
            .complete_one(&healthy, &c, &record, RETENTION)
            .await
            .unwrap()
            .is_recorded()
    );

    let claims: Vec<(StoreKey, Claim)> = (0..9)
        .map(|i| (key(&format!("frozen-{i}")), claim()))
        .collect();
    for (k, c) in &claims {
        store.reserve_one(k, c, LEASE).await.unwrap();
    }
    let replica = deployment.replica_port();
    deployment.freeze(replica);
    let mut results = Vec::new();
    for (k, c) in &claims {
        let started = Instant::now();
        let record = values::record_ack(c.fingerprint());
        let result = store.complete_one(k, c, &record, RETENTION).await;
        results.push((result, started.elapsed()));
    }
    // A lease lost meanwhile is still `Ok(false)`, as without the option.
    let lost = store
        .complete_one(&key("never-claimed"), &claim(), &record, RETENTION)
        .await;
    deployment.thaw(replica);
    // The thawed replica catches up before the next checks count on its acknowledgement.
    redis_sentinel::wait_replicated(deployment.master_port(), replica, Duration::from_secs(10));
    assert!(!lost.unwrap().is_recorded());
    for (result, took) in results {
        let error = result.expect_err("the frozen replica acknowledged nothing");
        let shortfall = not_replicated(&error);
        assert_eq!((shortfall.acknowledged(), shortfall.required()), (0, 1));
        assert_eq!(shortfall.timeout(), timeout);
        assert!(took >= timeout, "{took:?}");
        assert!(error.to_string().contains("0 of 1"), "{error}");
    }
    for (k, _) in &claims {
        assert!(
            matches!(
                store.reserve_one(k, &claim(), LEASE).await.unwrap(),
                Reservation::Completed(_)
            ),
            "written on the primary"
        );
    }

    // More replicas than exist: never enough (the one there acknowledges within the timeout).
    let greedy = RedisStore::new(pool).durable_completion(2, timeout);
    let (k, c) = (key("greedy"), claim());
    greedy.reserve_one(&k, &c, LEASE).await.unwrap();
    let record = values::record_ack(c.fingerprint());
    let error = greedy
        .complete_one(&k, &c, &record, RETENTION)
        .await
        .unwrap_err();
    let shortfall = not_replicated(&error);
    assert_eq!((shortfall.acknowledged(), shortfall.required()), (1, 2));

    // 0 replicas turns the option off.
    let off = RedisStore::new(deployment.connect().await).durable_completion(0, timeout);
    assert_eq!(off.durability(), None);
}

/// After a failover the promoted replica's script cache is empty: `EVALSHA` answers
/// `NOSCRIPT` and the store sends `EVAL` there. A claim taken before the failover is completed
/// after it, through the same client, which found the new primary through the sentinels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_reloaded_on_the_promoted_replica() {
    let mut deployment = RedisSentinel::start();
    let client = deployment.connect().await;
    let plain = RedisStore::new(client.clone());
    let durable = RedisStore::new(client).durable_completion(1, Duration::from_millis(100));
    plain.load_scripts().await.unwrap();
    let (a, b) = (claim(), claim());
    plain.reserve_one(&key("a"), &a, LEASE).await.unwrap();
    plain.reserve_one(&key("b"), &b, LEASE).await.unwrap();
    let primary = deployment.master_port();
    let replica = deployment.replica_port();
    // Both claims reached the replica before the kill.
    redis_sentinel::wait_replicated(primary, replica, Duration::from_secs(5));

    let killed = deployment.kill_master();
    assert_eq!(killed, primary);
    let promoted = deployment.wait_for_failover(killed, Duration::from_secs(30));
    assert_eq!(promoted, replica);

    let record = values::record_ack(a.fingerprint());
    let deadline = Instant::now() + Duration::from_secs(10);
    let done = loop {
        match plain.complete_one(&key("a"), &a, &record, RETENTION).await {
            Ok(done) => break done,
            Err(e) if Instant::now() < deadline => {
                eprintln!("complete failed, retrying: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("complete kept failing: {e}"),
        }
    };
    assert!(done.is_recorded());
    assert_eq!(command_calls(promoted, "eval"), 1, "NOSCRIPT, then EVAL");

    // Durable: the same fallback; the promoted primary has no replica, so WAIT falls short.
    must(promoted, &["SCRIPT", "FLUSH", "SYNC"]);
    let record = values::record_ack(b.fingerprint());
    let error = durable
        .complete_one(&key("b"), &b, &record, RETENTION)
        .await
        .unwrap_err();
    assert_eq!(not_replicated(&error).acknowledged(), 0);
    assert_eq!(command_calls(promoted, "eval"), 2);
    for k in [key("a"), key("b")] {
        assert!(matches!(
            plain.reserve_one(&k, &claim(), LEASE).await.unwrap(),
            Reservation::Completed(_)
        ));
    }
}

scale_out::deployment_tests!(RedisSentinel, "sentinel");
