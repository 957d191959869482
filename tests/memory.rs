//! The behaviour suite and the store contract on the embedded [`MemoryStore`].

mod contract;
mod suite;

use tower_idempotency::MemoryStore;

suite::store_suite!(async { (MemoryStore::new(), ()) });
contract::store_contract!(async { (MemoryStore::new(), ()) });

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
