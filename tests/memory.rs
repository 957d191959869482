//! The behaviour suite and the store contract on the embedded [`MemoryStore`].

mod contract;
mod once;
mod suite;

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
        use tower_idempotency::IdempotencyStore;
        use tower_idempotency::fingerprint::Fingerprint;
        use tower_idempotency::store::{Claim, StoreKey};
        filler
            .reserve(
                &StoreKey::new("filler", None, "x"),
                &Claim::new(Fingerprint::NONE),
                std::time::Duration::from_secs(60),
            )
            .await
            .unwrap();
    })
    .await;
}

/// A full store evicts under a tracing subscriber that records warnings (the demo's): the
/// "store full" warning, logged while a shard is locked, must not wait for that lock. (Run on
/// a thread of its own: a store that waits for itself blocks it for good.)
#[test]
fn a_full_store_evicts_and_warns_without_waiting_for_itself() {
    use std::time::Duration;
    use tower_idempotency::IdempotencyStore;
    use tower_idempotency::fingerprint::Fingerprint;
    use tower_idempotency::store::record::Record;
    use tower_idempotency::store::{Claim, Reservation, StoreKey};

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
                let claim = Claim::new(Fingerprint::NONE);
                let lease = Duration::from_secs(60);
                assert_eq!(
                    worker.reserve(&key, &claim, lease).await.unwrap(),
                    Reservation::Acquired
                );
                let record = Record::ack(claim.fingerprint()).owned_by(claim.token());
                worker
                    .complete(&key, &claim, &record, Duration::from_secs(3600))
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
