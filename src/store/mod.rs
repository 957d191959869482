//! Where claims and records live: the values the [`IdempotencyStore`](crate::IdempotencyStore)
//! trait speaks in, the local cache that composes with any store, and the backends.
//!
//! # The state machine of one key
//!
//! A store keeps, per scoped and hashed key ([`StoreKey`]), one of two states:
//!
//! - **in flight**: an owner [`Token`] and the request [`Fingerprint`], until the lease expires
//!   (renewed by its live owner);
//! - **completed**: a [`Record`](record::Record) (the fingerprint plus, in replay mode, the
//!   stored response), until the retention period expires.
//!
//! ```text
//! absent --reserve (atomic, one round trip)--> in_flight(token, fingerprint, lease expiry)
//! in_flight --complete, token still ours--> completed(record, retention)
//! in_flight --release, token still ours--> absent
//! in_flight --renew, token still ours--> in_flight (lease from now)
//! in_flight --lease expired (owner died: no renewal)--> absent
//! completed --retention expired--> absent
//! ```
//!
//! Every backend makes [`reserve`](crate::IdempotencyStore::reserve) atomic (one `SET NX`,
//! one `INSERT ... ON CONFLICT`, one critical section) and compares the owner token in
//! `complete`, `release` and `renew`, so that a slow original whose lease expired never
//! overwrites or deletes a newer holder's claim.
//!
//! # Ordered events
//!
//! On a route that orders events ([`order`](crate::order)) every event names an object
//! ([`ObjectKey`]) and a [`Position`]. The store keeps per object the highest position of an
//! event processed successfully (its **watermark**, written in the same atomic step that
//! records the event's key, with the same retention) and a short **object lease**, so that
//! events of one object are handled one at a time. A store that keeps them implements
//! [`OrderedStore`](crate::OrderedStore), and settles a [`Target`] with an [`Order`] together
//! with its object:
//!
//! - `reserve`: the key as for a plain target; then, if another event of the object is in
//!   flight, [`Reservation::ObjectBusy`] (nothing written); else the key and the object lease
//!   are taken, and the answer is [`Reservation::Acquired`], or [`Reservation::Stale`] when
//!   the position is below the watermark (or equal to it, with
//!   [`EqualPositions::Stale`] in the order);
//! - `complete`: the record, the watermark raised to the position if it is higher, the
//!   object lease let go: all or nothing;
//! - `release`, `renew`: the key and the object lease, token-checked.
//!
//! The layer builds the claims and records a store receives; a test that calls a store itself
//! builds them with `test_util::values` (feature `test-util`):
//!
//! ```
//! use std::time::Duration;
//! use tower_idempotency::{IdempotencyStore, MemoryStore};
//! use tower_idempotency::fingerprint::Fingerprint;
//! use tower_idempotency::store::{Completion, Reservation, StoreKey, Target};
//! use tower_idempotency::test_util::values;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store = MemoryStore::new();
//! let key = [Target::key(StoreKey::new("docs", None, "evt_1"))];
//! let claim = values::claim(Fingerprint::of_bytes(b"{}"));
//! let lease = Duration::from_secs(30);
//!
//! assert!(matches!(store.reserve(&key, &claim, lease).await.unwrap()[0], Reservation::Acquired));
//! // A second claim on the same key sees the first one in flight.
//! let other = values::claim(Fingerprint::of_bytes(b"{}"));
//! assert!(matches!(store.reserve(&key, &other, lease).await.unwrap()[0], Reservation::InFlight { .. }));
//!
//! let record = values::owned_by(values::record_ack(claim.fingerprint()), claim.token());
//! let retention = Duration::from_secs(3600);
//! assert_eq!(store.complete(&key, &claim, &record, retention).await.unwrap(), [Completion::Written]);
//! // Completing is safe to retry.
//! assert_eq!(store.complete(&key, &claim, &record, retention).await.unwrap(), [Completion::AlreadyWritten]);
//! assert!(matches!(store.reserve(&key, &other, lease).await.unwrap()[0], Reservation::Completed(_)));
//! # }
//! ```
//!
//! # Which store
//!
//! [`MemoryStore`](crate::MemoryStore) (always there), [`RedisStore`](crate::RedisStore)
//! (feature `redis`), [`PostgresStore`](crate::PostgresStore) and
//! [`SqliteStore`](crate::SqliteStore) (features `postgres`, `sqlite`; [`sql`] for the table and
//! the statements), or one chosen at run time from a URL with [`connect`]. A layer puts a
//! [`LocalCache`] of completed records in front of a store that talks to a server (see
//! [`IdempotencyLayer::local_cache`](crate::IdempotencyLayer::local_cache)); [`CachedStore`]
//! is that composition, for use outside a layer.

mod any;
mod cache;
pub(crate) mod contract;
mod error;
mod map;
pub(crate) mod memory;
pub mod record;
mod slot;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "postgres", feature = "sqlite"))))]
pub mod sql {
    //! The SQL stores, on [`sqlx`]: [`PostgresStore`](crate::PostgresStore) (feature `postgres`)
    //! and [`SqliteStore`](crate::SqliteStore) (feature `sqlite`). Claims and records survive restarts of the application and of the
    //! database, and are shared by every process that uses the same database.
    //!
    //! ```no_run
    //! # #[cfg(feature = "sqlite")]
    //! # #[tokio::main]
    //! # async fn main() -> Result<(), tower_idempotency::store::StoreError> {
    //! use std::time::Duration;
    //! use tower_idempotency::SqliteStore;
    //!
    //! // Opens (creating it if missing) the database file and creates the table.
    //! let store = SqliteStore::open("idempotency.db").await?;
    //! // Deletes expired claims and records every ten minutes.
    //! let _purge = store.spawn_purge(Duration::from_secs(600));
    //! // Hand `store` to the idempotency layer.
    //! # Ok(())
    //! # }
    //! # #[cfg(not(feature = "sqlite"))]
    //! # fn main() {}
    //! ```
    //!
    //! Both are one implementation, [`SqlStore`], over a [`Dialect`]: `PostgresStore` is
    //! `SqlStore<sqlx::Postgres>` and `SqliteStore` is `SqlStore<sqlx::Sqlite>`. The statements
    //! are the same; a dialect supplies only what differs (the clock, how a claim reads back the
    //! row that holds the key, row locks, column types and error codes). `SqlStore` is itself a
    //! name of [`SqlTable`], the type it shares with the inbox's
    //! [`SqlInbox`](crate::inbox::SqlInbox): building, `with_table`, `migrate` and the purge
    //! are written once for both.
    //!
    //! # The table
    //!
    //! One row per key, in a table named `idempotency_keys` unless configured otherwise
    //! (`with_table`). The key is the row's `PRIMARY KEY`, so the database itself guarantees that
    //! a key has at most one row:
    //!
    //! | column | PostgreSQL | SQLite | meaning |
    //! |---|---|---|---|
    //! | `key` | `text PRIMARY KEY` | `TEXT PRIMARY KEY` | the [`StoreKey`](super::StoreKey) (hashed: no raw user bytes) |
    //! | `state` | `text` | `TEXT` | `in_flight` or `completed` |
    //! | `token` | `bytea` | `BLOB` | the owner token (16 bytes) while in flight, `NULL` once completed |
    //! | `fingerprint` | `bytea` | `BLOB` | the request [fingerprint](crate::fingerprint::Fingerprint) |
    //! | `record` | `bytea` | `BLOB` | `NULL` while in flight, then `Record::encode_for`: the record with the owner tag of the claim that completed it |
    //! | `expires_at` | `timestamptz` | `INTEGER` (ms since the Unix epoch) | end of the lease, then of the retention |
    //! | `created_at` | `timestamptz` | `INTEGER` (ms since the Unix epoch) | when the current claim was taken |
    //!
    //! plus an index on `expires_at` for the purge. A row whose `expires_at` has passed counts as
    //! absent: the next claim takes it over in place, and `purge_expired` deletes it.
    //!
    //! Routes that order events ([`order`](crate::order)) also use a table of objects,
    //! `<table>_objects`, one row per object:
    //!
    //! | column | PostgreSQL | SQLite | meaning |
    //! |---|---|---|---|
    //! | `object` | `text PRIMARY KEY` | `TEXT PRIMARY KEY` | the [`ObjectKey`](crate::store::ObjectKey) (hashed) |
    //! | `token` | `bytea` | `BLOB` | the owner token of the claim whose event of the object is in flight, or `NULL` |
    //! | `lease_until` | `timestamptz` | `INTEGER` | the end of that claim's object lease |
    //! | `watermark` | `bytea` | `BLOB` | the highest position processed (16 bytes, big-endian with the sign bit flipped: byte order is position order) |
    //! | `watermark_until` | `timestamptz` | `INTEGER` | the end of the watermark's retention |
    //! | `expires_at` | `timestamptz` | `INTEGER` | the later of the two: when the row may be purged |
    //!
    //! # Statements
    //!
    //! *now* is the database server's `now()` on PostgreSQL, and this host's clock (bound to the
    //! statement) on SQLite.
    //!
    //! - **reserve** is one atomic `INSERT ... ON CONFLICT (key) DO UPDATE ... WHERE <the row
    //!   there has expired, or is this claim's own (a retried reserve)> RETURNING`: the row is
    //!   inserted, or taken over in place, or nothing is written and the live row is read back
    //!   (in the same statement on PostgreSQL, with a data-modifying CTE; by a following `SELECT`
    //!   on SQLite). Never a `SELECT` then an `INSERT`: two concurrent claims of one key can never
    //!   both win.
    //! - **complete** is one `UPDATE ... WHERE key = $1 AND state = 'in_flight' AND token = $2 AND
    //!   expires_at > now`. When it updates no row, a `SELECT` of the key's live completed record
    //!   tells a retried completion whose first attempt landed (the record carries this claim's
    //!   owner tag: `AlreadyWritten`) from a lost claim (`Lost`).
    //! - **release** is the same `DELETE`, and **renew** the same `UPDATE` of `expires_at` alone
    //!   (to now plus the lease): a slow original whose lease expired never touches a newer
    //!   holder's row, nor revives its own.
    //! - **reserve_many** is, on PostgreSQL, the same claim for every key of the batch in one
    //!   statement (the keys inserted in sorted order, so that overlapping batches lock rows in one
    //!   order and never deadlock; each key is still claimed atomically on its own). The other
    //!   batch methods, and every batch method on SQLite, run one statement per key, in order.
    //! - **purge** deletes expired rows in batches, of both tables.
    //! - **ordered events** (`reserve_ordered` and the others) run in one transaction per event:
    //!   the key's statement as above, then the object's (an `INSERT ... ON CONFLICT ... DO UPDATE
    //!   ... WHERE` that takes the object's lease only when it is free, expired or already this
    //!   claim's, and returns the live watermark; an update that raises the watermark only when the
    //!   position is higher; an update that lets go of the lease only for its token). A claim that
    //!   finds the object busy rolls back, leaving no trace of its key. The statements on a key come
    //!   before those on its object in every transaction, so two never wait for each other in a
    //!   circle.
    //!
    //! # Expired rows
    //!
    //! The database does not drop rows by itself: call `purge_expired` from a scheduled job, or
    //! let `spawn_purge` run it periodically in the background. Expired rows left behind are
    //! harmless to correctness (they count as absent), they only take space.

    pub use crate::sql::{Dialect, SqlStore, SqlTable, sqlx};
}
mod token;

use std::fmt;

pub use self::any::{AnyStore, ConnectError, connect};
pub use self::cache::{CachedStore, LocalCache};
pub(crate) use self::error::BoxError;
pub use self::error::{StoreError, StoreErrorKind};
pub use self::memory::WhenFull;
pub use self::token::Token;
use crate::fingerprint::Fingerprint;
use crate::order::{EqualPositions, Position};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use crate::redis::records::{NotReplicated, PickClient};

/// The prefix of every event key this crate writes to a shared store.
pub(crate) const KEY_PREFIX: &str = "ti:";

/// The length of every store key: the prefix and 16 base64url digits.
pub(crate) const STORE_KEY_LEN: usize = KEY_PREFIX.len() + DIGITS;

/// The base64url digits of a hashed key: 96 bits of a BLAKE3.
const DIGITS: usize = 16;

/// The 16 base64url digits of the BLAKE3 of `parts`, each length-prefixed so that ("a", "bc")
/// and ("ab", "c") never collide (`None` is its own value, apart from the empty string).
///
/// BLAKE3 rather than SHA-256: as collision-resistant, and each 64 bytes of the hashed input
/// (the parts and their 8-byte prefixes) is one compression of 7 rounds where SHA-256 runs 64,
/// which matters on a CPU without the SHA extensions (docs/performance.md, "Where the
/// figures in the code went").
fn hash_digits(parts: &[Option<&str>]) -> [u8; DIGITS] {
    // The parts of a usual key fit one stack buffer, hashed in one call; the incremental
    // hasher's per-update work is left to the long ones.
    let mut buf = [0u8; 128];
    let total: usize = parts.iter().map(|part| 8 + part.map_or(0, str::len)).sum();
    if total > buf.len() {
        let mut hasher = blake3::Hasher::new();
        framed(parts, |bytes| {
            hasher.update(bytes);
        });
        return digits_of(hasher.finalize());
    }
    let mut len = 0;
    framed(parts, |bytes| {
        buf[len..len + bytes.len()].copy_from_slice(bytes);
        len += bytes.len();
    });
    digits_of(blake3::hash(&buf[..len]))
}

/// Hands `sink` the hashed bytes of `parts` in order: before each part, its length plus one as
/// 8 big-endian bytes (0 for `None`).
fn framed(parts: &[Option<&str>], mut sink: impl FnMut(&[u8])) {
    for part in parts {
        sink(&part.map_or(0, |part| part.len() as u64 + 1).to_be_bytes());
        sink(part.map_or(&[][..], str::as_bytes));
    }
}

/// The first 96 bits of `digest` in base64url.
fn digits_of(digest: blake3::Hash) -> [u8; DIGITS] {
    let mut out = [0u8; DIGITS];
    crate::util::write_base64url(&mut out, &digest.as_bytes()[..12]);
    out
}

/// A scoped, hashed key as written to a store.
///
/// Built from the layer's namespace, the optional per-request scope (for example a tenant) and
/// the idempotency key itself, hashed with BLAKE3 so that no raw user bytes reach the store:
/// `ti:` and the first 96 bits of the digest in base64url, 19 characters in all. The key is
/// that short on purpose: a completed ack-mode key costs 88 bytes of Redis memory
/// (`MEMORY USAGE`), where a readable `idem:<namespace>:<hex>` key would cost 136. The
/// namespace is in the hash (and in every log line and metric), not in the key text. 96 bits
/// make an accidental collision negligible (about 10⁻¹¹ with a billion live keys).
///
/// The key is held inline: building, cloning and dropping one never allocates.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StoreKey([u8; STORE_KEY_LEN]);

impl StoreKey {
    /// Builds the store key of `key` within `namespace` and the optional request `scope`.
    pub fn new(namespace: &str, scope: Option<&str>, key: &str) -> Self {
        // Three parts; the pinned digits of the tests below keep stored records findable.
        let digits = hash_digits(&[Some(namespace), scope, Some(key)]);
        let mut out = [0u8; STORE_KEY_LEN];
        out[..KEY_PREFIX.len()].copy_from_slice(KEY_PREFIX.as_bytes());
        out[KEY_PREFIX.len()..].copy_from_slice(&digits);
        StoreKey(out)
    }

    /// The key's bytes (ASCII), for stores that index them without going through `&str`.
    pub(crate) fn as_bytes(&self) -> &[u8; STORE_KEY_LEN] {
        &self.0
    }

    /// The key a store wrote as [`as_str`](Self::as_str), read back; `None` if it is not one.
    pub(crate) fn from_stored(stored: &[u8]) -> Option<Self> {
        let bytes: [u8; STORE_KEY_LEN] = stored.try_into().ok()?;
        bytes
            .starts_with(KEY_PREFIX.as_bytes())
            .then_some(StoreKey(bytes))
    }

    /// The key printed as [`as_str`](Self::as_str) (`ti:` and 16 base64url digits, as in the
    /// inbox's log lines and `Debug` output) read back; `None` for any other text. An operator
    /// can re-queue a dead letter from the key its log line shows; from the delivery's id, the
    /// key is [`StoreKey::new`] with the route's namespace (and scope).
    ///
    /// ```
    /// use tower_idempotency::store::StoreKey;
    ///
    /// let key = StoreKey::new("email", None, "evt_1");
    /// assert_eq!(StoreKey::parse(&key.to_string()), Some(key));
    /// assert_eq!(StoreKey::parse("evt_1"), None);
    /// ```
    pub fn parse(printed: &str) -> Option<Self> {
        let digits = printed.strip_prefix(KEY_PREFIX)?;
        let base64url = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
        let valid = digits.len() == DIGITS && digits.bytes().all(base64url);
        valid.then(|| Self::from_stored(printed.as_bytes()))?
    }

    /// The 16 hashed digits, without the prefix.
    pub(crate) fn digits(&self) -> &str {
        &self.as_str()[KEY_PREFIX.len()..]
    }

    /// The key as written to the store.
    pub fn as_str(&self) -> &str {
        // ASCII by construction: the prefix and base64url digits.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl fmt::Debug for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("StoreKey").field(&self.as_str()).finish()
    }
}

impl fmt::Display for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The object an ordered event is about (a message, a payment), scoped and hashed like a
/// [`StoreKey`] but apart from every event key: `to:` and 16 base64url digits.
///
/// Stores keep two things per object under it: the watermark (the highest position processed)
/// and the object lease (the event of the object in flight). The Redis store writes the
/// object's digits as the hash tag of both and of the keys of its events, so that one script
/// settles an event and its object atomically, on one node of a cluster.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey([u8; STORE_KEY_LEN]);

/// The prefix of an object key.
pub(crate) const OBJECT_PREFIX: &str = "to:";

impl ObjectKey {
    /// The key of `object` within `namespace` and the optional request `scope`.
    pub fn new(namespace: &str, scope: Option<&str>, object: &str) -> Self {
        // A fourth part: no object key is ever the key of an event.
        let digits = hash_digits(&[Some(namespace), scope, Some(object), Some("object")]);
        let mut out = [0u8; STORE_KEY_LEN];
        out[..OBJECT_PREFIX.len()].copy_from_slice(OBJECT_PREFIX.as_bytes());
        out[OBJECT_PREFIX.len()..].copy_from_slice(&digits);
        ObjectKey(out)
    }

    /// The key's bytes (ASCII).
    pub(crate) fn as_bytes(&self) -> &[u8; STORE_KEY_LEN] {
        &self.0
    }

    /// The key a store wrote as [`as_str`](Self::as_str), read back; `None` if it is not one.
    #[cfg_attr(
        not(any(feature = "redis", feature = "sqlite", feature = "postgres")),
        allow(dead_code)
    )]
    pub(crate) fn from_stored(stored: &[u8]) -> Option<Self> {
        let bytes: [u8; STORE_KEY_LEN] = stored.try_into().ok()?;
        bytes
            .starts_with(OBJECT_PREFIX.as_bytes())
            .then_some(ObjectKey(bytes))
    }

    /// The key printed as [`as_str`](Self::as_str) (`to:` and 16 base64url digits) read back;
    /// `None` for any other text.
    #[cfg_attr(not(feature = "admin"), allow(dead_code))]
    pub(crate) fn parse(printed: &str) -> Option<Self> {
        let digits = printed.strip_prefix(OBJECT_PREFIX)?;
        let base64url = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
        let valid = digits.len() == DIGITS && digits.bytes().all(base64url);
        valid.then(|| Self::from_stored(printed.as_bytes()))?
    }

    /// The 16 hashed digits, without the prefix.
    #[cfg(any(test, feature = "redis"))]
    pub(crate) fn digits(&self) -> &str {
        &self.as_str()[OBJECT_PREFIX.len()..]
    }

    /// The key as written to the store.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl fmt::Debug for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ObjectKey").field(&self.as_str()).finish()
    }
}

/// What one store call acts on, target by target: a key, and for an event of an ordered route
/// its [`Order`] (its object, its position, and how an equal position is judged).
///
/// A claim names its targets once and every call of it (reserve, complete, release, renew)
/// takes the same slice, or the part of it the claim holds. A target holds its keys inline:
/// building, cloning and dropping one never allocates.
///
/// ```
/// use tower_idempotency::order::{EqualPositions, Position};
/// use tower_idempotency::store::{ObjectKey, StoreKey, Target};
///
/// let plain = Target::key(StoreKey::new("orders", None, "ord_1"));
/// assert!(plain.order.is_none());
/// let event = Target::ordered(
///     StoreKey::new("email", None, "evt_2"),
///     ObjectKey::new("email", None, "msg_1"),
///     Position::new(2),
/// )
/// .equal_positions(EqualPositions::Stale);
/// assert_eq!(event.order.map(|o| o.equal), Some(EqualPositions::Stale));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The key claimed and recorded.
    pub key: StoreKey,
    /// For an ordered event, its object and position: the store settles them with the key, in
    /// the same atomic step. Only an [`OrderedStore`](crate::OrderedStore) is handed one.
    pub order: Option<Order>,
}

impl Target {
    /// A target of `key` alone.
    pub fn key(key: StoreKey) -> Self {
        Target { key, order: None }
    }

    /// The target of an ordered event: its `key`, the `object` it is about and its
    /// `position`; an equal position is processed ([`EqualPositions::Process`], the default:
    /// see [`equal_positions`](Self::equal_positions)).
    pub fn ordered(key: StoreKey, object: ObjectKey, position: Position) -> Self {
        let order = Order {
            object,
            position,
            equal: EqualPositions::default(),
        };
        Target {
            key,
            order: Some(order),
        }
    }

    /// Sets how a reserve judges a position equal to the object's watermark (a target without
    /// an order is left as it is).
    pub fn equal_positions(mut self, equal: EqualPositions) -> Self {
        if let Some(order) = &mut self.order {
            order.equal = equal;
        }
        self
    }
}

/// The order part of a [`Target`]: where an event stands among its object's events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Order {
    /// The object the event is about.
    pub object: ObjectKey,
    /// Where the event stands among its object's events.
    pub position: Position,
    /// Whether a reserve answers [`Reservation::Stale`] to a position equal to the object's
    /// watermark (the route's [`EventOrder::equal_positions`](crate::order::EventOrder::equal_positions)).
    /// Read by [`reserve`](crate::IdempotencyStore::reserve) only: it travels with the target
    /// so that one call's targets need nothing beside them.
    pub equal: EqualPositions,
}

/// The targets of one call as a backend with a path per kind sees them: every one plain,
/// every one ordered, or some of each (which no layer sends, but the contract allows).
#[cfg(any(feature = "redis", feature = "postgres", feature = "sqlite"))]
// The SQL stores take a mixed slice one target at a time and never split it.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) enum Kinds {
    /// No target has an order (an empty slice included).
    Plain,
    /// Every target has one.
    Ordered,
    /// The indexes of the plain targets and those targets, then the same of the ordered ones.
    Mixed(Vec<usize>, Vec<Target>, Vec<usize>, Vec<Target>),
}

#[cfg(any(feature = "redis", feature = "postgres", feature = "sqlite"))]
impl Kinds {
    /// What kinds of target `targets` holds.
    pub(crate) fn of(targets: &[Target]) -> Kinds {
        let ordered = targets.iter().filter(|t| t.order.is_some()).count();
        if ordered == 0 {
            return Kinds::Plain;
        }
        if ordered == targets.len() {
            return Kinds::Ordered;
        }
        let (mut plain, mut events) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
        for (i, target) in targets.iter().enumerate() {
            let (at, of) = if target.order.is_some() {
                (&mut events.0, &mut events.1)
            } else {
                (&mut plain.0, &mut plain.1)
            };
            at.push(i);
            of.push(target.clone());
        }
        Kinds::Mixed(plain.0, plain.1, events.0, events.1)
    }
}

/// The answers of a mixed call put back in the order of its targets: `plain` answered the
/// targets at `plain_at`, `ordered` those at `ordered_at`.
#[cfg(feature = "redis")]
pub(crate) fn merge<T>(
    (plain_at, plain): (Vec<usize>, Vec<T>),
    (ordered_at, ordered): (Vec<usize>, Vec<T>),
) -> Vec<T> {
    let mut out: Vec<(usize, T)> = plain_at.into_iter().zip(plain).collect();
    out.extend(ordered_at.into_iter().zip(ordered));
    out.sort_by_key(|(at, _)| *at);
    out.into_iter().map(|(_, answer)| answer).collect()
}

/// One attempt's claim on a key: its owner token and the request fingerprint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    token: Token,
    fingerprint: Fingerprint,
}

impl Claim {
    /// A claim with a fresh random token.
    pub(crate) fn new(fingerprint: Fingerprint) -> Self {
        Claim {
            token: Token::random(),
            fingerprint,
        }
    }

    /// A claim with an explicit token (for tests: `test_util::values::claim_with_token`).
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn with_token(token: Token, fingerprint: Fingerprint) -> Self {
        Claim { token, fingerprint }
    }

    /// The owner token.
    pub fn token(&self) -> &Token {
        &self.token
    }

    /// The fingerprint of the request that made the claim.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }
}

/// What a reserve found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reservation {
    /// The key was absent (or its lease had expired): the claim is ours (and, for an ordered
    /// event, its object's lease too).
    Acquired,
    /// Another attempt holds the key and has not finished.
    InFlight {
        /// The fingerprint of the request holding the key.
        fingerprint: Fingerprint,
    },
    /// The key was completed earlier; here is its record.
    Completed(record::Record),
    /// Ordered events only: another event of the same object is in flight. Nothing was
    /// claimed.
    ObjectBusy,
    /// Ordered events only: the claim is ours, as with [`Acquired`](Self::Acquired), but the
    /// event's position is below the watermark of its object (or equal, with
    /// [`EqualPositions::Stale`]): a newer event of the
    /// object was already processed.
    Stale {
        /// The object's watermark.
        watermark: Position,
    },
}

impl Reservation {
    /// Whether the claim is ours ([`Acquired`](Self::Acquired) or [`Stale`](Self::Stale)).
    pub(crate) fn is_ours(&self) -> bool {
        matches!(self, Reservation::Acquired | Reservation::Stale { .. })
    }
}

/// What a completion did. Completing is safe to retry: a retry whose first attempt did land
/// reports [`Completion::AlreadyWritten`], not a lost claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Completion {
    /// The record replaced our in-flight claim.
    Written,
    /// The key already holds the record this claim wrote (an earlier attempt of the same
    /// completion landed): nothing was changed.
    AlreadyWritten,
    /// The key is not held by this claim (its lease expired and another attempt took it, or it
    /// was released): nothing was written.
    Lost,
}

impl Completion {
    /// Whether the key now holds this claim's record ([`Written`](Self::Written) or
    /// [`AlreadyWritten`](Self::AlreadyWritten)).
    pub fn is_recorded(self) -> bool {
        matches!(self, Completion::Written | Completion::AlreadyWritten)
    }
}

/// A duration as whole milliseconds for a store that counts them (`PX`, SQL intervals): at
/// least 1 (Redis refuses `PX 0`), at most `i64::MAX`.
#[cfg(any(feature = "redis", feature = "postgres", feature = "sqlite"))]
pub(crate) fn millis(duration: std::time::Duration) -> i64 {
    duration.as_millis().clamp(1, i64::MAX as u128) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_printed_store_key_parses_back_and_nothing_else_does() {
        let key = StoreKey::new("email", Some("tenant"), "evt_1");
        assert_eq!(StoreKey::parse(key.as_str()), Some(key.clone()));
        assert_eq!(StoreKey::parse(&format!("{key:?}")), None, "the Debug form");
        let object = ObjectKey::new("email", None, "m_1");
        for not_a_key in [
            "",
            "ti:",
            "evt_1",
            object.as_str(),
            &key.as_str()[..STORE_KEY_LEN - 1],
            &format!("{key}x"),
            "ti:AAAAAAAAAAAAAAA=",
            "ti:AAAAAAAAAAAAAA\u{e9}",
            "ti:AAAAAAAA AAAAAAA",
        ] {
            assert_eq!(StoreKey::parse(not_a_key), None, "{not_a_key:?}");
        }
        assert!(StoreKey::parse("ti:AAAAAAAA-_zz0099").is_some());
    }

    #[test]
    fn store_keys_are_scoped_hashed_and_short() {
        let a = StoreKey::new("kalipto", None, "pd_1");
        assert!(a.as_str().starts_with("ti:"));
        assert_eq!(a.as_str().len(), STORE_KEY_LEN);
        assert!(
            a.digits()
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        assert!(!a.as_str().contains("pd_1"));
        assert_ne!(a, StoreKey::new("other", None, "pd_1"));
        assert_ne!(a, StoreKey::new("kalipto", Some("tenant-a"), "pd_1"));
        assert_ne!(
            StoreKey::new("n", Some("a"), "bc"),
            StoreKey::new("n", Some("ab"), "c")
        );
        assert_ne!(
            StoreKey::new("n", Some(""), "k"),
            StoreKey::new("n", None, "k")
        );
        assert_eq!(a, StoreKey::new("kalipto", None, "pd_1"));
        // Pinned: a new release must find the records an older one wrote.
        assert_eq!(a.as_str(), "ti:zjuBx5YDr79cKPTM");
    }

    #[test]
    fn both_paths_hash_the_length_prefixed_parts() {
        // The bytes each path must hash, built apart from either: an 8-byte big-endian prefix
        // (length + 1, or 0 for `None`) before each part.
        fn reference(parts: &[Option<&str>]) -> [u8; DIGITS] {
            let mut bytes = Vec::new();
            for part in parts {
                let prefix = part.map_or(0, |part| part.len() as u64 + 1);
                bytes.extend_from_slice(&prefix.to_be_bytes());
                bytes.extend_from_slice(part.map_or(&[][..], str::as_bytes));
            }
            digits_of(blake3::hash(&bytes))
        }
        // Totals of 127, 128 (the buffer's size, still buffered) and 129 bytes (incremental),
        // a long key, and `None` and empty parts.
        let (k95, k96, k97, long) = (
            "k".repeat(95),
            "k".repeat(96),
            "k".repeat(97),
            "k".repeat(255),
        );
        for parts in [
            [Some("kalipto"), None, Some("pd_1")],
            [Some("n"), Some(""), Some("")],
            [Some(""), None, Some(k95.as_str())],
            [Some(""), None, Some(k96.as_str())],
            [Some(""), None, Some(k97.as_str())],
            [Some("kalipto"), Some("tenant"), Some(long.as_str())],
        ] {
            assert_eq!(hash_digits(&parts), reference(&parts));
        }
        assert_ne!(
            StoreKey::new("n", None, &long),
            StoreKey::new("n", None, &long[1..])
        );
    }

    #[test]
    fn object_keys_never_meet_event_keys() {
        let event = StoreKey::new("email", None, "msg_1");
        let object = ObjectKey::new("email", None, "msg_1");
        assert!(object.as_str().starts_with("to:"));
        assert_ne!(event.digits(), object.digits());
        assert_eq!(object, ObjectKey::new("email", None, "msg_1"));
        assert_ne!(object, ObjectKey::new("email", Some("t"), "msg_1"));
    }

    #[test]
    #[cfg(any(feature = "redis", feature = "postgres", feature = "sqlite"))]
    fn durations_become_positive_milliseconds() {
        use std::time::Duration;
        assert_eq!(millis(Duration::from_secs(30)), 30_000);
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_micros(10)), 1);
        assert_eq!(millis(Duration::MAX), i64::MAX);
    }
}
