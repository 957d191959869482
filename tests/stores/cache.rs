//! [`CachedStore`] in front of the memory store and of a real `redis-server`: the store
//! contract and the behaviour suite through the cache; and, on Redis (feature `redis`),
//! exactly-once across two caching instances sharing one server, what a cache hit costs in
//! commands (`MONITOR`), and what deleting a key by hand does.

use crate::suite;
use tower_idempotency::test_util::store as contract;

use tower_idempotency::MemoryStore;
use tower_idempotency::store::{CachedStore, LocalCache};

/// A new cache in front of `store`.
fn cached_store<St>(store: St) -> CachedStore<St> {
    CachedStore::with_cache(store, LocalCache::new())
}

/// The store contract and the behaviour suite, through a cache in front of the memory store.
mod on_memory {
    use super::{MemoryStore, cached_store, contract, suite};

    suite::store_smoke!(async { (cached_store(MemoryStore::new()), ()) });
    contract::store_contract!(async { (cached_store(MemoryStore::new()), ()) });
}

#[cfg(feature = "redis")]
use crate::redis_server;

#[cfg(feature = "redis")]
mod on_redis {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tower_idempotency::IdempotencyStore;
    use tower_idempotency::fingerprint::Fingerprint;
    use tower_idempotency::store::{Claim, Completion, Reservation, StoreKey};
    use tower_idempotency::test_util::values;

    use super::contract::{OneTarget, keys_of};

    const LEASE: Duration = Duration::from_secs(30);
    const RETENTION: Duration = Duration::from_secs(3600);

    fn claim() -> Claim {
        values::claim(Fingerprint::of_bytes(b"{}"))
    }

    use http::StatusCode;
    use tower_idempotency::RedisStore;

    use super::redis_server::RedisServer;
    use super::suite::app::Effects;
    use super::suite::{post, send};
    use super::*;
    use crate::redis::{first_then_cached, two_instances};

    /// Waits until `store` caches `n` records (a record read from Redis comes with how long it
    /// has left, and is cached at once; this only waits for what runs in the background).
    async fn cached(store: &LocalCache, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while store.len() < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "never cached {n} records"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    type Instance = CachedStore<RedisStore<fred::prelude::Client>>;

    /// One caching instance on `server`: its own client, its own cache.
    async fn instance(server: &RedisServer) -> Instance {
        instance_with(server, LocalCache::new()).await
    }

    /// One caching instance on `server` with `cache`: its own client.
    async fn instance_with(server: &RedisServer, cache: LocalCache) -> Instance {
        let store = RedisStore::new(server.connect().await);
        store.load_scripts().await.unwrap();
        CachedStore::with_cache(store, cache)
    }

    suite::store_smoke!(async {
        let server = RedisServer::start();
        let store = cached_store(RedisStore::new(server.connect().await));
        (store, server)
    });

    contract::store_contract!(async {
        let server = RedisServer::start();
        let store = cached_store(RedisStore::new(server.connect().await));
        (store, server)
    });

    /// What each key went through, across both instances.
    #[derive(Default)]
    struct Ledger {
        /// Claims holding each key right now (must never exceed one).
        holding: HashMap<String, usize>,
        /// Claims that acquired each key.
        acquired: HashMap<String, usize>,
        /// Completions started (before the store is asked) and written, per key.
        completing: HashMap<String, usize>,
        written: HashMap<String, usize>,
        /// Answers served as completed, per key.
        seen_completed: HashMap<String, usize>,
    }

    /// Two caching instances sharing one redis-server, 8 workers per key spread over both,
    /// each retrying until it sees the key completed. The first holder of every third key
    /// fails (releases). Every key is held by one claim at a time, written exactly once, and
    /// never answered as completed before its completion was started.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_caching_instances_stay_exactly_once() {
        let server = RedisServer::start();
        let instances = [instance(&server).await, instance(&server).await];
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let keys: Vec<String> = (0..24).map(|i| format!("evt_{i}")).collect();
        let mut tasks = Vec::new();
        for (i, id) in keys.iter().enumerate() {
            for worker in 0..8 {
                let store = instances[worker % 2].clone();
                let (id, ledger) = (id.clone(), ledger.clone());
                let fail_first = i % 3 == 0;
                tasks.push(tokio::spawn(async move {
                    let key = StoreKey::new("exactly-once", None, &id);
                    loop {
                        let mine = claim();
                        match store.reserve_one(&key, &mine, LEASE).await.unwrap() {
                            Reservation::Acquired => {
                                let first = {
                                    let mut l = ledger.lock().unwrap();
                                    let holding = l.holding.entry(id.clone()).or_default();
                                    assert_eq!(*holding, 0, "{id} held twice");
                                    *holding += 1;
                                    let acquired = l.acquired.entry(id.clone()).or_default();
                                    *acquired += 1;
                                    *acquired == 1
                                };
                                tokio::time::sleep(Duration::from_millis(3)).await;
                                if fail_first && first {
                                    *ledger.lock().unwrap().holding.get_mut(&id).unwrap() -= 1;
                                    assert!(store.release_one(&key, &mine).await.unwrap());
                                    continue;
                                }
                                {
                                    let mut l = ledger.lock().unwrap();
                                    *l.completing.entry(id.clone()).or_default() += 1;
                                    *l.holding.get_mut(&id).unwrap() -= 1;
                                }
                                let record = values::record_ack(mine.fingerprint());
                                let done = store
                                    .complete_one(&key, &mine, &record, RETENTION)
                                    .await
                                    .unwrap();
                                assert_eq!(done, Completion::Written);
                                *ledger.lock().unwrap().written.entry(id).or_default() += 1;
                                return;
                            }
                            Reservation::InFlight { .. } => {
                                tokio::time::sleep(Duration::from_millis(1)).await;
                            }
                            Reservation::Completed(_) => {
                                let mut l = ledger.lock().unwrap();
                                assert_eq!(
                                    l.completing.get(&id),
                                    Some(&1),
                                    "{id} answered completed before its completion started"
                                );
                                *l.seen_completed.entry(id).or_default() += 1;
                                return;
                            }
                            other => panic!("unexpected {other:?}"),
                        }
                    }
                }));
            }
        }
        for task in tasks {
            task.await.unwrap();
        }
        {
            let l = ledger.lock().unwrap();
            for (i, id) in keys.iter().enumerate() {
                assert_eq!(l.written.get(id), Some(&1), "{id} written once");
                let acquired = if i % 3 == 0 { 2 } else { 1 };
                assert_eq!(l.acquired.get(id), Some(&acquired), "{id}");
                assert_eq!(l.seen_completed.get(id), Some(&7), "{id}");
            }
        }
        // Both instances now answer every key as completed.
        for store in &instances {
            for id in &keys {
                let key = StoreKey::new("exactly-once", None, id);
                assert!(matches!(
                    store.reserve_one(&key, &claim(), LEASE).await.unwrap(),
                    Reservation::Completed(_)
                ));
            }
        }
    }

    /// After instance A completes a key, B answers it as completed: first from Redis (one
    /// `SET NX GET`), then from its cache (no command). A answers from its cache at once. In
    /// a batch, only the keys not cached are sent.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cache_hit_sends_no_command() {
        let server = RedisServer::start();
        let b_cache = LocalCache::new();
        let (a, b) = (
            instance(&server).await,
            instance_with(&server, b_cache.clone()).await,
        );
        let key = StoreKey::new("cost", None, "evt_1");

        let monitor = server.monitor();
        let owner = claim();
        assert_eq!(
            a.reserve_one(&key, &owner, LEASE).await.unwrap(),
            Reservation::Acquired
        );
        let record = values::record_ack(owner.fingerprint());
        assert_eq!(
            a.complete_one(&key, &owner, &record, RETENTION)
                .await
                .unwrap(),
            Completion::Written
        );
        assert_eq!(monitor.finish(), ["SET", "EVALSHA"]);

        // A completed it: a hit at once.
        let monitor = server.monitor();
        for _ in 0..3 {
            assert!(matches!(
                a.reserve_one(&key, &claim(), LEASE).await.unwrap(),
                Reservation::Completed(_)
            ));
        }
        assert_eq!(monitor.finish(), Vec::<String>::new());

        // B: from Redis once (one command, nothing in the background), then from its cache.
        let monitor = server.monitor();
        match b.reserve_one(&key, &claim(), LEASE).await.unwrap() {
            Reservation::Completed(held) => assert!(held.is_owned_by(owner.token())),
            other => panic!("expected a completed record, got {other:?}"),
        }
        assert_eq!(b_cache.len(), 1, "cached from the reserve's answer");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(monitor.finish(), ["SET"]);
        let monitor = server.monitor();
        for _ in 0..3 {
            assert!(matches!(
                b.reserve_one(&key, &claim(), LEASE).await.unwrap(),
                Reservation::Completed(_)
            ));
        }
        assert_eq!(monitor.finish(), Vec::<String>::new());

        // A batch of a cached key and a new one: one SET, for the new one.
        let other = StoreKey::new("cost", None, "evt_2");
        let mine = claim();
        let monitor = server.monitor();
        let answers = b
            .reserve(&keys_of(&[key.clone(), other.clone()]), &mine, LEASE)
            .await
            .unwrap();
        assert_eq!(monitor.finish(), ["SET"]);
        assert!(
            matches!(answers[0], Reservation::Completed(_)),
            "{answers:?}"
        );
        assert_eq!(answers[1], Reservation::Acquired);
        // Renewing and releasing always go to Redis.
        let monitor = server.monitor();
        assert!(b.renew_one(&other, &mine, LEASE).await.unwrap());
        assert!(b.release_one(&other, &mine).await.unwrap());
        assert_eq!(monitor.finish(), ["EVALSHA", "EVALSHA"]);
    }

    /// Through the layer: a duplicate answered on the instance that completed the key costs no
    /// command; on the other instance, one, then none.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn through_the_layer_a_duplicate_costs_no_command() {
        let server = RedisServer::start();
        let effects = Effects::default();
        // The layer's own cache (one per layer unless shared): `b_cache` shows what B cached.
        let (a, b, b_cache) = two_instances(&server, "layer", &effects).await;

        let headers = first_then_cached(&server, &a).await;
        assert_eq!(headers["idempotent-replayed"], "true");

        // B: one command (`SET`), then nothing.
        for expected in [vec!["SET"], vec![]] {
            let monitor = server.monitor();
            let (status, headers, _) = send(&b, post("/effect", Some("k1"), "{}")).await;
            assert_eq!(status, StatusCode::OK);
            assert_eq!(headers["idempotent-replayed"], "true");
            cached(&b_cache, 1).await;
            assert_eq!(monitor.finish(), expected);
        }
        assert_eq!(effects.total(), 1);
    }

    /// A record read from Redis is cached for `read_ttl` (Redis's reserve does not say how
    /// long the record has left): B reads a record of A's that expires in 1 s, answers it
    /// from its cache a little past that (the event was processed: only the retention is
    /// longer), and claims the key once its `read_ttl` (3 s here) is over.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_record_read_is_cached_for_read_ttl() {
        let server = RedisServer::start();
        let a = instance(&server).await;
        let b_cache = LocalCache::new().read_ttl(Duration::from_secs(3));
        let b = instance_with(&server, b_cache.clone()).await;
        let key = StoreKey::new("expiry", None, "evt_1");
        let owner = claim();
        a.reserve_one(&key, &owner, LEASE).await.unwrap();
        let record = values::record_ack(owner.fingerprint());
        // B reads the record at once, well within its retention.
        let retention = Duration::from_secs(1);
        assert_eq!(
            a.complete_one(&key, &owner, &record, retention)
                .await
                .unwrap(),
            Completion::Written
        );
        assert!(matches!(
            b.reserve_one(&key, &claim(), LEASE).await.unwrap(),
            Reservation::Completed(_)
        ));
        cached(&b_cache, 1).await;

        // Past the retention; 1.8 s before B's read_ttl runs out.
        tokio::time::sleep(retention + Duration::from_millis(200)).await;
        let monitor = server.monitor();
        assert!(matches!(
            b.reserve_one(&key, &claim(), LEASE).await.unwrap(),
            Reservation::Completed(_)
        ));
        assert_eq!(
            monitor.finish(),
            Vec::<String>::new(),
            "expired in Redis, still a cache hit within read_ttl"
        );

        // 3.2 s at least after B's read: past read_ttl.
        tokio::time::sleep(Duration::from_millis(2000)).await;
        let next = claim();
        assert_eq!(
            b.reserve_one(&key, &next, LEASE).await.unwrap(),
            Reservation::Acquired,
            "past read_ttl: asked Redis, which no longer holds the key"
        );
        assert!(b.release_one(&key, &next).await.unwrap());
    }

    /// A key deleted from Redis by hand is still answered as completed by an instance that
    /// cached it: until `read_ttl` on one that read it, until `max_ttl` (or `clear`) on the one
    /// that wrote it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_deleted_by_hand_is_seen_after_read_ttl_or_clear() {
        let server = RedisServer::start();
        let writer_cache = LocalCache::new();
        let writer = instance_with(&server, writer_cache.clone()).await;
        // Long enough that the reader still holds it after the `DEL` on a loaded machine.
        let reader_cache = LocalCache::new().read_ttl(Duration::from_millis(1500));
        let reader = instance_with(&server, reader_cache.clone()).await;
        let key = StoreKey::new("by-hand", None, "evt_1");
        let owner = claim();
        writer.reserve_one(&key, &owner, LEASE).await.unwrap();
        writer
            .complete_one(
                &key,
                &owner,
                &values::record_ack(owner.fingerprint()),
                RETENTION,
            )
            .await
            .unwrap();
        assert!(matches!(
            reader.reserve_one(&key, &claim(), LEASE).await.unwrap(),
            Reservation::Completed(_)
        ));
        cached(&reader_cache, 1).await;

        let reply = server.raw_command(&["DEL", key.as_str()]).unwrap();
        assert!(reply.starts_with(":1"), "{reply}");
        for store in [&writer, &reader] {
            assert!(matches!(
                store.reserve_one(&key, &claim(), LEASE).await.unwrap(),
                Reservation::Completed(_)
            ));
        }

        // 1.7 s at least after the reader's read: past its read_ttl.
        tokio::time::sleep(Duration::from_millis(1700)).await;
        let again = claim();
        assert_eq!(
            reader.reserve_one(&key, &again, LEASE).await.unwrap(),
            Reservation::Acquired,
            "the reader forgot it after read_ttl"
        );
        assert!(matches!(
            writer.reserve_one(&key, &claim(), LEASE).await.unwrap(),
            Reservation::Completed(_)
        ));
        writer_cache.clear();
        assert!(matches!(
            writer.reserve_one(&key, &claim(), LEASE).await.unwrap(),
            Reservation::InFlight { .. }
        ));
    }
}
