//! The behaviour suite and the store contract on the embedded [`MemoryStore`].

use crate::suite;
use tower_idempotency::test_util::store::{self as contract, OneTarget};

use tower_idempotency::MemoryStore;

suite::store_suite!(async { (MemoryStore::new(), ()) });
contract::store_contract!(async { (MemoryStore::new(), ()) });
once_suite!(async { (MemoryStore::new(), ()) });

/// A full memory store fails claims like a store that is down: 503 when failing closed.
#[tokio::test]
async fn full_store_fails_closed_or_open() {
    let store = MemoryStore::new().with_max_entries(1);
    let filler = store.clone();
    suite::fail_open_processes_without_protection(store, async move || {
        use tower_idempotency::fingerprint::Fingerprint;
        use tower_idempotency::store::StoreKey;
        use tower_idempotency::test_util::values;
        filler
            .reserve_one(
                &StoreKey::new("filler", None, "x"),
                &values::claim(Fingerprint::NONE),
                std::time::Duration::from_secs(60),
            )
            .await
            .unwrap();
    })
    .await;
}

/// A store that refuses a claim is answered 503 with the `Retry-After` the layer was given.
#[tokio::test]
async fn a_refused_claim_is_told_the_configured_retry_after() {
    use std::time::Duration;
    use tower_idempotency::fingerprint::Fingerprint;
    use tower_idempotency::store::StoreKey;
    use tower_idempotency::test_util::values;

    let store = MemoryStore::new().with_max_entries(1);
    store
        .reserve_one(
            &StoreKey::new("filler", None, "x"),
            &values::claim(Fingerprint::NONE),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let effects = suite::app::Effects::default();
    let layer = suite::layer(store, "retry-after").store_retry_after(Duration::from_secs(42));
    let app = suite::app::router(layer, &effects);
    let (status, headers, body) = suite::send(&app, suite::post("/effect", Some("k1"), "{}")).await;
    assert_eq!(status, http::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers["retry-after"], "42");
    suite::assert_problem(&headers, &body, 503, "store_unavailable");
    assert_eq!(effects.total(), 0);
}

/// A `once` whose claim the store answers later than the store timeout fails with a store
/// error, the closure never run; within the (default, 2 s) timeout it is waited for.
#[tokio::test(start_paused = true)]
async fn a_once_slower_than_its_store_timeout_is_a_store_error() {
    use std::time::Duration;
    use tower_idempotency::test_util::store::{Call, Hook, Hooked};
    use tower_idempotency::{Idempotent, OnceError};

    /// Answers each claim a second after it landed.
    #[derive(Clone)]
    struct SlowClaims;
    impl Hook for SlowClaims {
        async fn after(&self, call: Call) {
            if call == Call::Reserve {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
    let slow = || Hooked {
        store: MemoryStore::new(),
        hook: SlowClaims,
    };
    let jobs = Idempotent::new(slow()).store_timeout(Duration::from_millis(100));
    let timed_out = jobs.once("k", || async { Ok::<u8, ()>(1) }).await;
    assert!(
        matches!(timed_out, Err(OnceError::Store(_))),
        "{timed_out:?}"
    );
    let patient = Idempotent::new(slow());
    let waited = patient.once("k", || async { Ok::<u8, ()>(1) }).await;
    assert_eq!(waited.unwrap(), 1);
}

/// A `once` whose holder is gone without releasing its claim blocks its key for the lease, and
/// no longer.
#[tokio::test]
async fn a_once_claim_left_behind_blocks_its_key_for_the_lease() {
    use crate::hooks::Unreleased;
    use std::time::Duration;
    use tower_idempotency::test_util::store::Hooked;
    use tower_idempotency::{Idempotent, OnceError};
    let lease = Duration::from_millis(1000);
    let store = Hooked {
        store: MemoryStore::new(),
        hook: Unreleased,
    };
    let jobs = Idempotent::new(store).lease(lease);
    let (started, running) = tokio::sync::oneshot::channel();
    let holder = tokio::spawn({
        let jobs = jobs.clone();
        async move {
            let _ = jobs
                .once("k", || async move {
                    let _ = started.send(());
                    std::future::pending::<Result<u8, ()>>().await
                })
                .await;
        }
    });
    running.await.unwrap();
    holder.abort();
    let _ = holder.await;
    let early = jobs.once("k", || async { Ok::<u8, ()>(1) }).await;
    assert!(matches!(early, Err(OnceError::InFlight)), "{early:?}");
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    let late = jobs.once("k", || async { Ok::<u8, ()>(1) }).await;
    assert_eq!(late.unwrap(), 1);
}

/// A full store evicts under a tracing subscriber that records warnings (the demo's): the
/// "store full" warning, logged while a shard is locked, must not wait for that lock. (Run on
/// a thread of its own: a store that waits for itself blocks it for good.)
#[test]
fn a_full_store_evicts_and_warns_without_waiting_for_itself() {
    use std::time::Duration;
    use tower_idempotency::fingerprint::Fingerprint;
    use tower_idempotency::store::{Reservation, StoreKey};
    use tower_idempotency::test_util::values;

    let store = MemoryStore::new().with_max_entries(2);
    let (done, finished) = std::sync::mpsc::channel();
    let worker = store.clone();
    std::thread::spawn(move || {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_writer(std::io::sink)
            .finish();
        let _default = tracing::subscriber::set_default(subscriber);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            for i in 0..20 {
                let key = StoreKey::new("evict", None, &format!("k{i}"));
                let claim = values::claim(Fingerprint::NONE);
                let lease = Duration::from_secs(60);
                assert_eq!(
                    worker.reserve_one(&key, &claim, lease).await.unwrap(),
                    Reservation::Acquired
                );
                let record =
                    values::owned_by(values::record_ack(claim.fingerprint()), claim.token());
                worker
                    .complete_one(&key, &claim, &record, Duration::from_secs(3600))
                    .await
                    .unwrap();
            }
        });
        let _ = done.send(());
    });
    assert!(
        finished.recv_timeout(Duration::from_secs(10)).is_ok(),
        "the store waited for itself (or panicked)"
    );
    assert!(store.evictions() >= 18, "{}", store.evictions());
    assert!(store.len() <= 2);
}

mod bounded {
    //! A bounded store evicts the completed records nearest to expiry for as long as it holds
    //! any; only a store full of in-flight claims refuses, and only until they settle.

    use std::time::{Duration, Instant};

    use tower_idempotency::fingerprint::Fingerprint;
    use tower_idempotency::order::Position;
    use tower_idempotency::store::{
        Claim, Completion, ObjectKey, Reservation, StoreError, StoreErrorKind, StoreKey, Target,
    };
    use tower_idempotency::test_util::store::OneTarget;
    use tower_idempotency::test_util::values;
    use tower_idempotency::{IdempotencyStore, MemoryStore};

    const LEASE: Duration = Duration::from_secs(60);
    const RETENTION: Duration = Duration::from_secs(3600);

    fn key(i: usize) -> StoreKey {
        StoreKey::new("fill", None, &format!("k{i}"))
    }

    /// Reserves the key `i` under a new claim.
    async fn reserve_new(store: &MemoryStore, i: usize) -> Result<Reservation, StoreError> {
        store
            .reserve_one(&key(i), &values::claim(Fingerprint::NONE), LEASE)
            .await
    }

    /// Completes the keys `from..from + count`; every one must be taken as new.
    async fn complete_new_keys(store: &MemoryStore, from: usize, count: usize) {
        for i in from..from + count {
            let claim = values::claim(Fingerprint::NONE);
            let answer = store.reserve_one(&key(i), &claim, LEASE).await;
            assert_eq!(answer.unwrap(), Reservation::Acquired, "key {i} refused");
            let record = values::record_ack(claim.fingerprint());
            let done = store
                .complete_one(&key(i), &claim, &record, RETENTION)
                .await;
            assert_eq!(done.unwrap(), Completion::Written, "key {i}");
        }
    }

    /// The value of the metric `name` in `recorder`, as a float (counter or gauge).
    #[cfg(feature = "metrics")]
    fn metric(recorder: &metrics_util::debugging::DebuggingRecorder, name: &str) -> Option<f64> {
        use metrics_util::debugging::DebugValue;
        let snapshot = recorder.snapshotter().snapshot().into_vec();
        snapshot.into_iter().find_map(|(key, _, _, value)| {
            (key.key().name() == name).then_some(())?;
            match value {
                DebugValue::Counter(n) => Some(n as f64),
                DebugValue::Gauge(g) => Some(g.into_inner()),
                DebugValue::Histogram(_) => None,
            }
        })
    }

    /// 10× the bound of completed keys, then 10× more: all taken as new, every eviction
    /// counted, the retention reported that of the records really kept (the eviction counter
    /// and the effective-retention gauge too, with `metrics`), and a duplicate of an evicted
    /// key taken as new.
    #[tokio::test]
    async fn a_full_store_keeps_evicting_for_as_long_as_records_exist() {
        #[cfg(feature = "metrics")]
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        #[cfg(feature = "metrics")]
        let _metrics = metrics::set_default_local_recorder(&recorder);
        let bound = 1000;
        let store = MemoryStore::new().with_max_entries(bound);
        complete_new_keys(&store, 0, 10 * bound).await;
        assert!(store.len() <= bound);
        assert_eq!(store.evictions(), (10 * bound - store.len()) as u64);
        let second = Instant::now();
        complete_new_keys(&store, 10 * bound, 10 * bound).await;
        let kept = store.len();
        assert!(kept <= bound && kept > bound / 2, "{kept}");
        assert_eq!(store.evictions(), (20 * bound - kept) as u64);
        // Each shard took 10 times its share since `second`: what it keeps is from then.
        let retention = store.effective_retention().expect("records are kept");
        assert!(retention <= second.elapsed(), "{retention:?}");
        #[cfg(feature = "metrics")]
        {
            let evictions = metric(&recorder, "idempotency_memory_evictions_total");
            assert_eq!(evictions, Some(store.evictions() as f64));
            let gauge = metric(&recorder, "idempotency_memory_effective_retention_seconds");
            let gauge = gauge.expect("the gauge is set once evicting");
            assert!(gauge <= second.elapsed().as_secs_f64(), "{gauge}");
        }
        // The first key's record was evicted long ago: its duplicate is new, and it evicts one
        // more record.
        assert_eq!(reserve_new(&store, 0).await.unwrap(), Reservation::Acquired);
        assert_eq!(store.evictions(), (20 * bound + 1 - kept) as u64);
        // A key still kept is still a duplicate.
        let answer = reserve_new(&store, 20 * bound - 1).await;
        assert!(matches!(answer.unwrap(), Reservation::Completed(_)));
    }

    /// A store whose every entry is an in-flight claim refuses a new key, and takes new keys
    /// again as soon as a claim settles, completed or released. (A bound this small is one
    /// shard: exact.)
    #[tokio::test]
    async fn a_store_full_of_claims_refuses_until_they_settle() {
        let bound = 60;
        let store = MemoryStore::new().with_max_entries(bound);
        let claims: Vec<Claim> = (0..bound)
            .map(|_| values::claim(Fingerprint::NONE))
            .collect();
        for (i, claim) in claims.iter().enumerate() {
            let answer = store.reserve_one(&key(i), claim, LEASE).await.unwrap();
            assert_eq!(answer, Reservation::Acquired);
        }
        let refused = reserve_new(&store, bound).await;
        assert_eq!(refused.unwrap_err().kind(), StoreErrorKind::Capacity);
        // One claim completes: its record may go, so the new key is taken.
        let record = values::record_ack(claims[0].fingerprint());
        let done = store
            .complete_one(&key(0), &claims[0], &record, RETENTION)
            .await;
        assert_eq!(done.unwrap(), Completion::Written);
        assert_eq!(
            reserve_new(&store, bound).await.unwrap(),
            Reservation::Acquired
        );
        assert_eq!(store.evictions(), 1);
        // Full of claims again; one is released: room for one more.
        let refused = reserve_new(&store, bound + 1).await;
        assert_eq!(refused.unwrap_err().kind(), StoreErrorKind::Capacity);
        assert!(store.release_one(&key(1), &claims[1]).await.unwrap());
        let taken = reserve_new(&store, bound + 1).await;
        assert_eq!(taken.unwrap(), Reservation::Acquired);
        // Every claim settles: the store takes 10 times its bound again.
        for (i, claim) in claims.iter().enumerate().skip(2) {
            let record = values::record_ack(claim.fingerprint());
            store
                .complete_one(&key(i), claim, &record, RETENTION)
                .await
                .unwrap();
        }
        complete_new_keys(&store, 10 * bound, 10 * bound).await;
        assert!(store.len() <= bound);
    }

    fn event(i: usize, object: usize, position: i128) -> Target {
        Target::ordered(
            StoreKey::new("ordered", None, &format!("e{i}")),
            ObjectKey::new("ordered", None, &format!("o{object}")),
            Position::new(position),
        )
    }

    /// Reserves and completes `event`, which must be taken as new.
    async fn complete_event(store: &MemoryStore, event: Target) {
        let claim = values::claim(Fingerprint::NONE);
        let events = [event];
        let answers = store
            .reserve(&events, &claim, LEASE)
            .await
            .unwrap_or_else(|err| panic!("{:?} refused: {err}", events[0].key));
        assert_eq!(answers, [Reservation::Acquired]);
        let record = values::record_ack(claim.fingerprint());
        let done = store.complete(&events, &claim, &record, RETENTION);
        assert_eq!(done.await.unwrap(), [Completion::Written]);
    }

    /// The ordered route's per-object state is bounded the same way: events of 20× as many
    /// objects as the bound are all taken (records and watermarks evicted, nearest to expiry
    /// first); an object whose watermark was evicted takes an older event as new.
    #[tokio::test]
    async fn ordered_objects_are_bounded_and_evicted_the_same_way() {
        let bound = 300;
        let store = MemoryStore::new().with_max_entries(bound);
        for i in 0..20 * bound {
            complete_event(&store, event(i, i, 10)).await;
        }
        assert!(store.len() <= bound);
        assert_eq!(store.evictions(), (2 * 20 * bound - store.len()) as u64);
        // Object 0's watermark (10) was evicted: an older event of it is taken as new.
        complete_event(&store, event(20 * bound, 0, 5)).await;
        // The last object's watermark is kept: an older event of it is stale.
        let claim = values::claim(Fingerprint::NONE);
        let stale = [event(20 * bound + 1, 20 * bound - 1, 5)];
        let answers = store.reserve(&stale, &claim, LEASE).await.unwrap();
        assert!(
            matches!(answers[..], [Reservation::Stale { .. }]),
            "{answers:?}"
        );
    }

    /// Objects' leases are never evicted: a store full of events in flight refuses the next
    /// one whole, and takes events again once those settle.
    #[tokio::test]
    async fn a_store_full_of_ordered_claims_refuses_until_they_settle() {
        let bound = 60;
        let store = MemoryStore::new().with_max_entries(bound);
        // Each event in flight holds its key and its object's lease.
        let held: Vec<(Target, Claim)> = (0..bound / 2)
            .map(|i| (event(i, i, 1), values::claim(Fingerprint::NONE)))
            .collect();
        for (event, claim) in &held {
            let events = std::slice::from_ref(event);
            let answers = store.reserve(events, claim, LEASE).await.unwrap();
            assert_eq!(answers, [Reservation::Acquired]);
        }
        assert_eq!(store.len(), bound);
        let next = [event(bound, bound, 1)];
        let claim = values::claim(Fingerprint::NONE);
        let refused = store.reserve(&next, &claim, LEASE).await;
        assert_eq!(refused.unwrap_err().kind(), StoreErrorKind::Capacity);
        assert_eq!(store.len(), bound, "nothing of the refused event is left");
        for (event, claim) in &held {
            let record = values::record_ack(claim.fingerprint());
            let events = std::slice::from_ref(event);
            let done = store.complete(events, claim, &record, RETENTION);
            assert_eq!(done.await.unwrap(), [Completion::Written]);
        }
        for i in 0..10 * bound {
            complete_event(&store, event(bound + i, bound + i, 1)).await;
        }
        assert!(store.len() <= bound);
    }
}
