//! [`InboxStore`]: the queue contract, beside the record contract ([`IdempotencyStore`]).
//!
//! [`IdempotencyStore`]: crate::IdempotencyStore

use std::future::Future;
use std::time::{Duration, SystemTime};

use super::entry::{InboxEntry, Lease};
use super::wake::Wakeups;
use crate::order::Position;
use crate::store::{StoreError, StoreKey, Token};

/// What became of an enqueue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Enqueued {
    /// The key was absent: it is `queued` and the entry is stored, in one atomic step.
    Queued,
    /// The key was already known: nothing was stored.
    Duplicate(KeyState),
    /// The entry is ordered and its object's watermark (carried here) is at or past its
    /// position: a newer event of the object was applied already. Nothing was stored (a
    /// worker would settle it without the handler); the route answers it as a stale event.
    Stale(Position),
}

/// The state of a key an inbox knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyState {
    /// Its entry waits for a worker (first time or a retry).
    Queued,
    /// A worker holds its entry under a lease.
    Running,
    /// Its entry ran out of attempts and is kept as a dead letter.
    Dead,
    /// Its entry was applied; the key is kept for the retention.
    Done,
}

/// How a failed attempt is settled (the retry policy decides, the worker tells the store).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Take it again at this time.
    RetryAt(SystemTime, String),
    /// No attempts left: keep it as a dead letter with this error.
    Dead(String),
}

/// The counts an operator watches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InboxCounts {
    /// Entries waiting (first attempt or retry).
    pub pending: u64,
    /// Entries under a live lease.
    pub in_flight: u64,
    /// Dead letters.
    pub dead: u64,
    /// Age of the oldest entry that is not dead, if any.
    pub oldest_age: Option<Duration>,
}

/// A store of inbox entries. The key's claim and its entry change together: `enqueue` is one
/// atomic step, and `complete` marks the key done as it removes the entry.
///
/// Every settlement (`renew`, `complete`, `fail`) is checked against the lease's token: a
/// worker whose lease ran out and was taken by another can no longer renew, complete or fail
/// the entry, and gets `false`.
///
/// On ordered entries the store hands out an object's entries one at a time, in position
/// order: at most one entry of an object is in flight. While one is taken (until it is
/// completed or failed; past its lease it is the one taken over), no other entry of its object
/// is taken, not even one that arrived later with a lower position; with none in flight, the
/// object's first entry by position that is neither done nor dead is the one that can be
/// taken. An entry at or below its object's watermark is stale: refused at the door by
/// `enqueue`, or, when the watermark passed it while it waited, handed out marked stale.
pub trait InboxStore: Send + Sync + 'static {
    /// Stores `entry` if its key is absent; a known key (queued, running, dead or done) is a
    /// duplicate and stores nothing; an ordered entry at or below its object's watermark is
    /// [`Stale`](Enqueued::Stale) and stores nothing; a full store is an error
    /// (`StoreErrorKind::Capacity`).
    fn enqueue(
        &self,
        entry: InboxEntry,
    ) -> impl Future<Output = Result<Enqueued, StoreError>> + Send;

    /// Takes up to `max` due entries (their next attempt time passed, or their lease ran
    /// out), each under a new lease of `lease`, its attempt counted. Never more than `max`:
    /// the [`Worker`](super::Worker) asks for as many as it has room to run. (One handed more
    /// runs them all, since each is leased to it, and says so once in a warning.)
    fn take(
        &self,
        max: usize,
        lease: Duration,
    ) -> impl Future<Output = Result<Vec<Lease>, StoreError>> + Send;

    /// Extends the lease of `key` held by `token`; `false` if it is no longer held by it.
    fn renew(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Completes each lease of `leases`: marks its key done for `retention`, removes its entry
    /// and moves its object's watermark; one flag per lease, in order, `false` (and nothing
    /// changed for it) where the lease is not its token's. One lease is one completion
    /// (`&[(key, token)]`). An error leaves unknown which were completed; each of them is then
    /// done or runs again after its lease.
    ///
    /// The [`Worker`](super::Worker) sends through this, at most 128 at a time, the completions
    /// that gathered while the previous ones were in flight, so a store completes several in one
    /// round trip where it can (Redis: one script per partition; SQLite: one transaction). A
    /// worker whose batch fails as a whole completes its leases again one by one.
    fn complete(
        &self,
        leases: &[(StoreKey, Token)],
        retention: Duration,
    ) -> impl Future<Output = Result<Vec<bool>, StoreError>> + Send;

    /// Schedules a retry or keeps the entry as a dead letter; `false` (and nothing changed)
    /// if the lease is not `token`'s.
    fn fail(
        &self,
        key: &StoreKey,
        token: &Token,
        failure: Failure,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Pending, in flight, dead, and the oldest entry's age.
    fn counts(&self) -> impl Future<Output = Result<InboxCounts, StoreError>> + Send;

    /// A subscription to this inbox's announcements of what arrives (enqueues, re-queues and
    /// retries, each with the time its entry is due), which a [`Worker`](super::Worker) takes
    /// before its first take: idle, it waits for the next announcement rather than asking the
    /// store again. Called inside a Tokio runtime. The default announces nothing: the worker
    /// then polls.
    ///
    /// The built-in inboxes announce through an [`Announcer`](super::Announcer): to the
    /// workers of every process on Redis (`PUBLISH`) and PostgreSQL (`NOTIFY`), to those of
    /// the enqueuing process in memory and on SQLite.
    fn wakeups(&self) -> Wakeups {
        Wakeups::none()
    }
}
