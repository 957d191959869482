//! The purge checks shared by the PostgreSQL and SQLite tests
//! (`#[path = "support/sql_purge.rs"] mod sql_purge;`): each file seeds its own expired rows
//! in its own SQL, then hands the store to [`removes_only_expired_rows`].

use std::time::Duration;

use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::store::record::Record;
use tower_idempotency::store::sql::{Dialect, SqlStore};
use tower_idempotency::store::{Claim, Reservation, StoreKey};
use tower_idempotency::test_util::store::OneTarget;

const LEASE: Duration = Duration::from_secs(30);
const RETENTION: Duration = Duration::from_secs(72 * 3600);

/// On a table holding 2500 expired rows (and nothing else), `count` counting its rows: 30 live
/// rows are added (15 in flight, 15 completed); one purge removes the 2500 and keeps the 30,
/// unchanged; a second finds nothing; the background purge then removes 20 claims as their
/// 1 ms leases expire.
pub async fn removes_only_expired_rows<DB: Dialect>(
    store: &SqlStore<DB>,
    count: impl AsyncFn() -> i64,
) {
    let claim = |body: &[u8]| Claim::new(Fingerprint::of_bytes(body));
    let mut live = Vec::new();
    for i in 0..30 {
        let key = StoreKey::new("purge", None, &i.to_string());
        let c = claim(b"live");
        store.reserve_one(&key, &c, LEASE).await.unwrap();
        if i % 2 == 1 {
            store
                .complete_one(&key, &c, &Record::ack(c.fingerprint()), RETENTION)
                .await
                .unwrap();
        }
        live.push(key);
    }
    assert_eq!(count().await, 2530);

    assert_eq!(store.purge_expired(1000).await.unwrap(), 2500);
    assert_eq!(count().await, 30);
    assert_eq!(store.purge_expired(1000).await.unwrap(), 0);
    for (i, key) in live.iter().enumerate() {
        let found = store
            .reserve_one(key, &claim(b"live"), LEASE)
            .await
            .unwrap();
        if i % 2 == 1 {
            assert!(matches!(found, Reservation::Completed(_)), "{found:?}");
        } else {
            assert!(matches!(found, Reservation::InFlight { .. }), "{found:?}");
        }
    }

    // The background purge removes rows as they expire.
    for i in 0..20 {
        let key = StoreKey::new("purge-bg", None, &i.to_string());
        store
            .reserve_one(&key, &claim(b"x"), Duration::from_millis(1))
            .await
            .unwrap();
    }
    let purge = store.spawn_purge(Duration::from_millis(50));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while count().await > 30 {
        assert!(tokio::time::Instant::now() < deadline, "not purged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    purge.abort();
    assert_eq!(count().await, 30);
}
