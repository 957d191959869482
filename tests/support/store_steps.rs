//! Steps on one key that the backends' own tests (Redis, PostgreSQL, SQLite) take alike
//! (`#[path = "../support/store_steps.rs"] mod store_steps;`), between their checks of what
//! each backend stored; and the lease, the retentions and the claims they take them with.

use std::time::Duration;

use tower_idempotency::IdempotencyStore;
use tower_idempotency::fingerprint::Fingerprint;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use tower_idempotency::store::Completion;
use tower_idempotency::store::record::Record;
use tower_idempotency::store::{Claim, Reservation, StoreKey};
use tower_idempotency::test_util::store::OneTarget;
pub use tower_idempotency::test_util::store::reserves;
use tower_idempotency::test_util::values;

/// The lease of the backends' claims.
pub const LEASE: Duration = Duration::from_secs(30);
/// The retention of the backends' records.
pub const RETENTION: Duration = Duration::from_secs(72 * 3600);
/// The retention of a record that must expire during a test: long enough that the next
/// reserve still finds it on a loaded machine, short enough to wait out.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub const RECORD_RETENTION: Duration = Duration::from_secs(1);

/// A claim of a request whose body is `body`.
pub fn claim(body: &[u8]) -> Claim {
    values::claim(Fingerprint::of_bytes(body))
}

/// A duplicate of `key` (another claim of the request `record` answered) is answered `record`.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub async fn replays<St: IdempotencyStore>(
    store: &St,
    key: &StoreKey,
    record: &Record,
    lease: Duration,
) {
    let dup = values::claim(values::fingerprint_of(record));
    reserves(
        store,
        key,
        &dup,
        lease,
        Reservation::Completed(record.clone()),
    )
    .await;
}

/// Whether `claim` completing `key` with `record`, kept for `retention`, is recorded.
async fn completion_recorded<St: IdempotencyStore>(
    store: &St,
    key: &StoreKey,
    claim: &Claim,
    record: &Record,
    retention: Duration,
) -> bool {
    store
        .complete_one(key, claim, record, retention)
        .await
        .unwrap()
        .is_recorded()
}

/// `claim` completes `key` with `record`, kept for `retention`: the completion is recorded.
pub async fn records<St: IdempotencyStore>(
    store: &St,
    key: &StoreKey,
    claim: &Claim,
    record: &Record,
    retention: Duration,
) {
    assert!(
        completion_recorded(store, key, claim, record, retention).await,
        "{key:?} not recorded"
    );
}

/// Once `first` completed `key` with `record`: `dup` is answered the record (the key is not
/// claimed again), `first` no longer releases it, and `first` completing it again (a retry
/// whose first attempt landed) is told so, the record staying as it was.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub async fn completed_by<St: IdempotencyStore>(
    store: &St,
    key: &StoreKey,
    first: &Claim,
    dup: &Claim,
    record: &Record,
    lease: Duration,
) {
    let completed = Reservation::Completed(record.clone());
    reserves(store, key, dup, lease, completed.clone()).await;
    assert!(!store.release_one(key, first).await.unwrap());
    assert_eq!(
        store.complete_one(key, first, record, lease).await.unwrap(),
        Completion::AlreadyWritten
    );
    reserves(store, key, dup, lease, completed).await;
}

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
    records(store, key, claim, record, retention).await;
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
    reserves(store, key, first, lease, Reservation::Acquired).await;
    let in_flight = Reservation::InFlight {
        fingerprint: first.fingerprint(),
    };
    reserves(store, key, dup, lease, in_flight).await;
}

/// `old` claims `key` for `expiring` (short), and the claim expires: `new` claims the key,
/// `old` neither completes nor releases it, and another claim sees `new`'s in flight.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub async fn expired_claim_taken_over<St: IdempotencyStore>(
    store: &St,
    key: &StoreKey,
    old: &Claim,
    new: &Claim,
    expiring: Duration,
    lease: Duration,
) {
    store.reserve_one(key, old, expiring).await.unwrap();
    tokio::time::sleep(expiring * 2).await;
    reserves(store, key, new, lease, Reservation::Acquired).await;
    let record = values::record_ack(old.fingerprint());
    neither_completes_nor_releases(store, key, old, &record, lease).await;
    let another = values::claim(Fingerprint::of_bytes(b"another"));
    let in_flight = Reservation::InFlight {
        fingerprint: new.fingerprint(),
    };
    reserves(store, key, &another, lease, in_flight).await;
}

/// `first` claims `key` and records it for `retention` (short): a duplicate is answered the
/// record until it expires, then claims the key anew.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub async fn record_expires<St: IdempotencyStore>(
    store: &St,
    key: &StoreKey,
    first: &Claim,
    lease: Duration,
    retention: Duration,
) {
    let record = values::owned_by(values::record_ack(first.fingerprint()), first.token());
    claim_and_record(store, key, first, lease, &record, retention).await;
    let dup = || values::claim(first.fingerprint());
    reserves(store, key, &dup(), lease, Reservation::Completed(record)).await;
    tokio::time::sleep(retention + Duration::from_millis(200)).await;
    reserves(store, key, &dup(), lease, Reservation::Acquired).await;
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
        !completion_recorded(store, key, claim, record, retention).await,
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
pub async fn fifty_claims_one_winner<St: IdempotencyStore>(
    stores: &[St],
    key: &StoreKey,
    lease: Duration,
    round: usize,
) {
    let claim = || values::claim(Fingerprint::of_bytes(b"same"));
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
