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
    /// The entry is ordered and stale against its object's watermark (carried here; see
    /// [`EqualPositions::is_stale`](crate::order::EqualPositions::is_stale)): a newer event of the
    /// object was applied already. Nothing was stored (a
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
    /// Entries waiting for a take: first attempts and retries, due or not yet, and entries
    /// whose lease ran out unsettled.
    pub pending: u64,
    /// Entries under a lease that has not ended.
    pub in_flight: u64,
    /// Dead letters.
    pub dead: u64,
    /// Age of the oldest entry that is not dead (pending or in flight), from its
    /// `enqueued_at`, if any.
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
///
/// # What the built-in inboxes do, which a store of your own does too
///
/// The contract suites (`inbox_contract!`, `inbox_admin_contract!`, feature `test-util`) check
/// most of this; the rest is
/// what the worker, the admin panel and the gauges read, so a store that differs misleads them.
///
/// - **Clones.** The trait does not ask for `Clone`, but the door and the workers must reach
///   one inbox, so a store is usually cloned for each (and the contract suites clone it): a
///   clone is the same inbox (its state shared, as the built-in ones share a mutex, a client
///   or a pool), and cheap.
/// - **Enqueue** keeps the entry as given: its `enqueued_at` and `next_attempt_at` (to the
///   millisecond at least; an entry due later is not taken before), not the store's clock,
///   since the oldest entry's age and the handler read them. A known key is a
///   [`Duplicate`](Enqueued::Duplicate) before anything else is checked (its object's watermark
///   included): what the sender is told of a delivery it repeats does not change as the object
///   moves on.
/// - **Take** hands out due entries earliest due first (by next attempt time, or lease end for
///   one taken over; the built-in ones break ties by key), so an old entry is not starved by
///   newer ones; at most `max`; and never one entry to two takes at once. A Redis inbox of
///   several partitions keeps that order within each partition and shares a take out among
///   them in turn, so across partitions an entry due later may come first.
/// - **Settling after the lease ran out.** The lease's end is when another take may take the
///   entry over, not when the token stops holding it: until a take does, `renew`, `complete`
///   and `fail` by the token's holder succeed (a settlement sent as the lease ended still
///   counts). After a take-over they answer `false`.
/// - **A repeated completion** by the same lease answers `true` on SQLite and PostgreSQL, and
///   on Redis when the first was durable (`RedisInbox::durable`) or a `complete_with` (the
///   done key keeps the token, so that a completion sent again after an error is
///   recognised); `false` in memory and after a plain Redis completion. Nothing relies on
///   either: the key is done both ways.
/// - **Dead letters** ([`Failure::Dead`]) are kept until an operator re-queues or discards
///   them: never taken, a later delivery of their key is `Duplicate(Dead)`, and an ordered one
///   leaves its object's queue (the object's next entry may go). "Oldest" for
///   [`dead_letters`](crate::inbox::InboxAdmin::dead_letters) is the earliest `enqueued_at`.
/// - **Counts.** `pending` is every entry waiting for a take, due or not (a retry scheduled
///   later counts) and every entry whose lease ran out unsettled; `in_flight` those under a
///   lease that has not ended; `dead` the dead letters; `oldest_age` the age (from
///   `enqueued_at`) of the oldest entry that is pending or in flight, never a dead letter's.
/// - **Done keys** are kept for the retention their completion (or discard) was given, then
///   forgotten: a delivery after it is new again.
/// - **Capacity.** No bound is required. A bounded store refuses a new entry with
///   `StoreErrorKind::Capacity` (the route answers 503) and never drops one to make room
///   ([`MemoryInbox`](super::MemoryInbox) always is; a Redis inbox given a
///   `RedisInbox::capacity`; the SQL ones are bounded by their database).
/// - **Announcements** ([`wakeups`](Self::wakeups)): what a worker could take sooner than its
///   fallback poll is announced: each enqueue (at its due time), each retry (at its time),
///   each re-queue of a dead letter, an ordered entry that becomes a dead letter (now: its
///   object's next may go), and a resume. A lease that runs out is not announced.
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

    /// Pending (due or not, and leases that ran out), in flight, dead, and the age of the
    /// oldest entry that is not dead (see [`InboxCounts`]).
    fn counts(&self) -> impl Future<Output = Result<InboxCounts, StoreError>> + Send;

    /// A subscription to this inbox's announcements of what may be taken (enqueues, retries
    /// and re-queues, each with the time its entry is due; an ordered dead letter and a resume,
    /// now), which a [`Worker`](super::Worker) takes
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
