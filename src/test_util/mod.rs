//! The contract suites the crate's own backends pass, for a third-party backend to run on itself
//! (feature `test-util`), and constructors of the values the layer builds and a store only
//! receives (claims, records, inbox entries), for tests that drive a store directly.
//!
//! Each suite is a macro that writes one `#[tokio::test]` per case into the calling test file.
//! It takes an expression that makes a fresh backend: an `async` block whose output is the
//! backend and a guard kept alive for the test (a server process, a temporary directory, `()`).
//! The test crate needs `tokio` with its `macros` and `rt-multi-thread` features, as any
//! `#[tokio::test]` does.
//!
//! - [`store_contract!`](crate::store_contract): the record-store contract
//!   ([`IdempotencyStore`](crate::IdempotencyStore): atomic claims, token checks, take-over of
//!   expired claims, renewal, concurrent winners, retry-safe completion, batches, and on an
//!   [`OrderedStore`](crate::OrderedStore) the order of events per object).
//! - [`inbox_contract!`](crate::inbox_contract): the queue contract ([`InboxStore`]: enqueue
//!   atomic with the claim, duplicates, retries, lease take-over, order per object, wake-ups)
//!   through a real [`Worker`](crate::inbox::Worker).
//! - [`inbox_admin_contract!`](crate::inbox_admin_contract): the admin contract
//!   ([`InboxAdmin`]: find, dead letters and their re-queue, list, re-queue all matching,
//!   discard, pause, the attempt history).
//! - [`values`]: the claims, records and inbox entries the layer builds, for a test
//!   that calls a store's methods itself (`values::claim(fingerprint)`,
//!   `values::record_ack(fingerprint)`, `values::owned_by(record, claim.token())`,
//!   `values::inbox_entry(key, body, correlation_id)`, ...).
//!
//! ```ignore
//! // tests/contract.rs of a crate with its own backends
//! tower_idempotency::store_contract!(async { (MyStore::connect("...").await, ()) });
//! tower_idempotency::inbox_contract!(async { (MyInbox::connect("...").await, ()) });
//! tower_idempotency::inbox_admin_contract!(async { (MyInbox::connect("...").await, ()) });
//! ```
//!
//! [`InboxStore`]: crate::inbox::InboxStore
//! [`InboxAdmin`]: crate::inbox::InboxAdmin

// The cases are public so that the macros can name them from the caller's crate; they are not
// an API of their own.
#[doc(hidden)]
pub mod inbox;
#[doc(hidden)]
pub mod inbox_admin;
#[doc(hidden)]
pub mod store;
pub mod values;

/// One `#[tokio::test]` per case named, each running `$suite::<case>` on the store of a fresh
/// `(store, guard)` made by `$make` (on a multi-threaded runtime with two workers): what every
/// contract macro writes, and the crate's own test suites with it.
#[doc(hidden)]
#[macro_export]
macro_rules! suite_cases {
    ($suite:path; $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                use $suite as cases;
                let (store, _guard) = $make.await;
                cases::$name(store).await;
            }
        )*
    };
}
