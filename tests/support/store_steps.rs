//! Steps on one key that the backends' own tests (Redis, PostgreSQL, SQLite) take alike
//! (`#[path = "../support/store_steps.rs"] mod store_steps;`), between their checks of what
//! each backend stored.

use std::time::Duration;

use tower_idempotency::IdempotencyStore;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::store::record::Record;
use tower_idempotency::store::{Claim, Reservation, StoreKey};
use tower_idempotency::test_util::store::OneTarget;

/// Claims `key` for `claim` (whatever the answer) and completes it with `record`, kept for
/// `retention`: the completion must be recorded.
pub async fn claim_and_record<St: IdempotencyStore>(
    store: &St,
    key: &StoreKey,
    claim: &Claim,
    lease: Duration,
    record: &Record,
    retention: Duration,
) {
    store.reserve_one(key, claim, lease).await.unwrap();
    assert!(
        store
            .complete_one(key, claim, record, retention)
            .await
            .unwrap()
            .is_recorded(),
        "{key:?} not recorded"
    );
}

/// While `first` holds `key`: `first` again (a retry whose answer was lost) is still
/// acquired, and `dup` sees the key in flight with `first`'s fingerprint.
pub async fn held_by<St: IdempotencyStore>(
    store: &St,
    key: &StoreKey,
    first: &Claim,
    dup: &Claim,
    lease: Duration,
) {
    assert_eq!(
        store.reserve_one(key, first, lease).await.unwrap(),
        Reservation::Acquired
    );
    assert_eq!(
        store.reserve_one(key, dup, lease).await.unwrap(),
        Reservation::InFlight {
            fingerprint: first.fingerprint()
        }
    );
}

/// `claim`, which does not hold `key` (it never did, or lost it), neither completes it with
/// `record` nor releases it.
pub async fn neither_completes_nor_releases<St: IdempotencyStore>(
    store: &St,
    key: &StoreKey,
    claim: &Claim,
    record: &Record,
    retention: Duration,
) {
    assert!(
        !store
            .complete_one(key, claim, record, retention)
            .await
            .unwrap()
            .is_recorded(),
        "{key:?} recorded by a claim that does not hold it"
    );
    assert!(
        !store.release_one(key, claim).await.unwrap(),
        "{key:?} released by a claim that does not hold it"
    );
}

/// Fifty claims of `key` with one payload at once (behind a barrier; claim `i` through
/// `stores[i % stores.len()]`): exactly one is acquired, every other sees the key in flight
/// with that payload's fingerprint. `round` names the race in a failure.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub async fn fifty_claims_one_winner<St: IdempotencyStore>(
    stores: &[St],
    key: &StoreKey,
    lease: Duration,
    round: usize,
) {
    let claim = || Claim::new(Fingerprint::of_bytes(b"same"));
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(50));
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let store = stores[i % stores.len()].clone();
            let key = key.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                store.reserve_one(&key, &claim(), lease).await
            })
        })
        .collect();
    let mut acquired = 0;
    for task in tasks {
        match task.await.unwrap().unwrap() {
            Reservation::Acquired => acquired += 1,
            Reservation::InFlight { fingerprint } => {
                assert_eq!(fingerprint, Fingerprint::of_bytes(b"same"))
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(acquired, 1, "round {round}");
}
