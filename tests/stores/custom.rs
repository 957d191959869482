//! A store written outside the crate, on its public API only (`examples/custom_store/store.rs`,
//! which docs/guide.md points to): the record-store contract's unordered form, as a third-party
//! crate runs it with the `test-util` feature.

#[path = "../../examples/custom_store/store.rs"]
mod store;

use self::store::MapStore;

tower_idempotency::store_contract!(unordered: async { (MapStore::default(), ()) });
