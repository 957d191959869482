//! The inbox contract on the memory inbox, and what only the memory inbox shows (its bound).

#[path = "contract/inbox.rs"]
mod inbox_contract;

use bytes::Bytes;
use tower_idempotency::inbox::{InboxEntry, InboxStore, MemoryInbox};
use tower_idempotency::store::{StoreErrorKind, StoreKey};

inbox_contract::inbox_contract!(async { (MemoryInbox::new(10_000), ()) });

/// A full memory inbox refuses a new entry (the route answers 503) and drops none.
#[tokio::test]
async fn a_full_memory_inbox_refuses_and_drops_nothing() {
    let inbox = MemoryInbox::new(2);
    let entry = |n: u32| {
        InboxEntry::new(
            StoreKey::new("full", None, &n.to_string()),
            Bytes::new(),
            "c",
        )
    };
    inbox.enqueue(entry(1)).await.unwrap();
    inbox.enqueue(entry(2)).await.unwrap();
    let error = inbox.enqueue(entry(3)).await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Capacity);
    assert_eq!(inbox.counts().await.unwrap().pending, 2);
}
