//! Where claims and records live: the [`IdempotencyStore`] trait and its backends.
//!
//! A store keeps, per scoped and hashed key, one of two states (see the state machine in the
//! crate docs):
//!
//! - **in flight**: an owner [`Token`] and the request [`Fingerprint`], until the lease expires;
//! - **completed**: a [`Record`] (the fingerprint plus, in replay mode, the stored response),
//!   until the retention period expires.
//!
//! Every backend must make [`reserve`](IdempotencyStore::reserve) atomic (one `SET NX`, one
//! `INSERT ... ON CONFLICT DO NOTHING`, one critical section) and must compare the owner token
//! in [`complete`](IdempotencyStore::complete) and [`release`](IdempotencyStore::release), so that
//! a slow original whose lease expired never overwrites or deletes a newer holder's claim.
//!
//! ```
//! use std::time::Duration;
//! use tower_idempotency::store::{Claim, Completion, IdempotencyStore, MemoryStore, Reservation, StoreKey};
//! use tower_idempotency::record::Record;
//! use tower_idempotency::fingerprint::Fingerprint;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store = MemoryStore::new();
//! let key = StoreKey::new("docs", None, "evt_1");
//! let claim = Claim::new(Fingerprint::of_bytes(b"{}"));
//! let lease = Duration::from_secs(30);
//!
//! assert!(matches!(store.reserve(&key, &claim, lease).await.unwrap(), Reservation::Acquired));
//! // A second claim on the same key sees the first one in flight.
//! let other = Claim::new(Fingerprint::of_bytes(b"{}"));
//! assert!(matches!(store.reserve(&key, &other, lease).await.unwrap(), Reservation::InFlight { .. }));
//!
//! let record = Record::ack(claim.fingerprint()).owned_by(claim.token());
//! let retention = Duration::from_secs(3600);
//! assert_eq!(store.complete(&key, &claim, &record, retention).await.unwrap(), Completion::Written);
//! // Completing is safe to retry.
//! assert_eq!(store.complete(&key, &claim, &record, retention).await.unwrap(), Completion::AlreadyWritten);
//! assert!(matches!(store.reserve(&key, &other, lease).await.unwrap(), Reservation::Completed(_)));
//! # }
//! ```

pub mod cache;
mod error;
pub use self::error::BoxError;
pub mod memory;
pub mod record;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
mod slot;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "postgres", feature = "sqlite"))))]
pub mod sql;
mod token;

use std::fmt;
use std::future::Future;
use std::time::Duration;

use sha2::{Digest, Sha256};

pub use self::cache::CachedStore;
pub use self::error::{StoreError, StoreErrorKind};
pub use self::memory::{DEFAULT_MAX_ENTRIES, MemoryStore};
use self::record::Record;
pub use self::token::Token;
use crate::fingerprint::Fingerprint;

/// The prefix of every key this crate writes to a shared store.
pub const KEY_PREFIX: &str = "ti:";

/// The length of every store key: the prefix and 16 base64url digits.
pub const STORE_KEY_LEN: usize = KEY_PREFIX.len() + 16;

/// A scoped, hashed key as written to a store.
///
/// Built from the layer's namespace, the optional per-request scope (for example a tenant) and
/// the idempotency key itself, hashed with SHA-256 so that no raw user bytes reach the store:
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
        let mut hasher = Sha256::new();
        // Length-prefix each part so that ("a", "bc") and ("ab", "c") never collide.
        for part in [Some(namespace), scope, Some(key)] {
            match part {
                Some(part) => {
                    hasher.update((part.len() as u64 + 1).to_be_bytes());
                    hasher.update(part.as_bytes());
                }
                None => hasher.update(0u64.to_be_bytes()),
            }
        }
        let digest = hasher.finalize();
        let mut out = [0u8; STORE_KEY_LEN];
        out[..KEY_PREFIX.len()].copy_from_slice(KEY_PREFIX.as_bytes());
        crate::util::write_base64url(&mut out[KEY_PREFIX.len()..], &digest[..12]);
        StoreKey(out)
    }

    /// The key's bytes (ASCII), for stores that index them without going through `&str`.
    pub(crate) fn as_bytes(&self) -> &[u8; STORE_KEY_LEN] {
        &self.0
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

/// One attempt's claim on a key: its owner token and the request fingerprint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    token: Token,
    fingerprint: Fingerprint,
}

impl Claim {
    /// A claim with a fresh random token.
    pub fn new(fingerprint: Fingerprint) -> Self {
        Claim {
            token: Token::random(),
            fingerprint,
        }
    }

    /// A claim with an explicit token (for store implementations and tests).
    pub fn with_token(token: Token, fingerprint: Fingerprint) -> Self {
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

/// What [`IdempotencyStore::reserve`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reservation {
    /// The key was absent (or its lease had expired): the claim is ours.
    Acquired,
    /// Another attempt holds the key and has not finished.
    InFlight {
        /// The fingerprint of the request holding the key.
        fingerprint: Fingerprint,
    },
    /// The key was completed earlier; here is its record.
    Completed(Record),
}

/// What [`IdempotencyStore::complete`] did. Completing is safe to retry: a retry whose first
/// attempt did land reports [`Completion::AlreadyWritten`], not a lost claim.
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

/// A store of claims and records. Implemented by [`MemoryStore`], the Redis store (feature
/// `redis`) and the SQL stores (features `postgres`, `sqlite`).
///
/// Implementations must be cheap to clone (an `Arc` or a client handle inside): the layer clones
/// the store into every response future.
///
/// The `*_many` methods act on the items of one batch request, all under one claim (one
/// token). Their default implementations call the single-key method once per key, in order;
/// shared stores override them to spend one round trip for the whole batch.
pub trait IdempotencyStore: Clone + Send + Sync + 'static {
    /// Atomically claims `key` for `claim` with a lease of `lease`, or reports what holds it.
    ///
    /// Must be a single atomic step: two concurrent calls for one key never both get
    /// [`Reservation::Acquired`] while the first lease is alive. A key already held by the same
    /// claim (a retried call) is [`Reservation::Acquired`] again.
    fn reserve(
        &self,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> impl Future<Output = Result<Reservation, StoreError>> + Send;

    /// Replaces our in-flight claim with the completed `record`, kept for `retention`.
    ///
    /// Writes nothing and answers [`Completion::Lost`] when the key is no longer held by
    /// `claim`'s token (the lease expired and another attempt took it, or it was released), and
    /// [`Completion::AlreadyWritten`] when it already holds the record of this claim.
    fn complete(
        &self,
        key: &StoreKey,
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> impl Future<Output = Result<Completion, StoreError>> + Send;

    /// Deletes our in-flight claim so that a retry is processed again.
    ///
    /// Returns `Ok(false)` and deletes nothing when the key is not held by `claim`'s token.
    fn release(
        &self,
        key: &StoreKey,
        claim: &Claim,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Extends our in-flight claim to `lease` from now: what keeps a slow handler's claim alive.
    ///
    /// Returns `Ok(false)` and changes nothing when the key is not held by `claim`'s token.
    fn renew(
        &self,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Whether this store answers every call in this process, without I/O (the
    /// [`MemoryStore`]). The layer does not time such calls: they take
    /// nanoseconds (microseconds when a full memory store makes room), and a latency sample
    /// (two clock reads and a histogram update) would cost more than the call and tell an
    /// operator little (no `idempotency_store_duration_seconds` sample, no `store_ms` span
    /// field). Their failures are still counted, and the inner service's timer still starts
    /// after the reserve.
    ///
    /// The default, `false`, is right for any store that talks to a server. A store that wraps
    /// another answers as the wrapped one does (as [`CachedStore`] does).
    fn in_process(&self) -> bool {
        false
    }

    /// How long `key` still holds the completed `record`, counted from a moment during the
    /// call: `None` when it holds something else or nothing (the record expired, was deleted or
    /// replaced), or when the store cannot tell.
    ///
    /// This is what lets a [`LocalCache`](cache::LocalCache) keep a record it *read* from the
    /// store no longer than the store keeps it. The default answers `None`, and the cache then
    /// never keeps a record read from this store (records this instance wrote are kept: their
    /// expiry is known). The memory, Redis and SQL stores answer from the store, in one round
    /// trip that the cache makes in the background, off the request's path.
    fn remaining(
        &self,
        key: &StoreKey,
        record: &Record,
    ) -> impl Future<Output = Result<Option<Duration>, StoreError>> + Send {
        let _ = (key, record);
        async { Ok(None) }
    }

    /// [`reserve`](Self::reserve) of every key, one answer per key, in order. Not atomic as a
    /// whole: each key is claimed atomically on its own. After an error some keys may be held
    /// by `claim`: the caller releases them.
    fn reserve_many(
        &self,
        keys: &[StoreKey],
        claim: &Claim,
        lease: Duration,
    ) -> impl Future<Output = Result<Vec<Reservation>, StoreError>> + Send {
        async move {
            let mut out = Vec::with_capacity(keys.len());
            for key in keys {
                out.push(self.reserve(key, claim, lease).await?);
            }
            Ok(out)
        }
    }

    /// [`complete`](Self::complete) of every key with the same `record`, one answer per key.
    fn complete_many(
        &self,
        keys: &[StoreKey],
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> impl Future<Output = Result<Vec<Completion>, StoreError>> + Send {
        async move {
            let mut out = Vec::with_capacity(keys.len());
            for key in keys {
                out.push(self.complete(key, claim, record, retention).await?);
            }
            Ok(out)
        }
    }

    /// [`release`](Self::release) of every key; returns how many were released.
    fn release_many(
        &self,
        keys: &[StoreKey],
        claim: &Claim,
    ) -> impl Future<Output = Result<usize, StoreError>> + Send {
        async move {
            let mut released = 0;
            for key in keys {
                released += usize::from(self.release(key, claim).await?);
            }
            Ok(released)
        }
    }

    /// [`renew`](Self::renew) of every key; `Ok(true)` when every one was still ours.
    fn renew_many(
        &self,
        keys: &[StoreKey],
        claim: &Claim,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        async move {
            let mut all = true;
            for key in keys {
                all &= self.renew(key, claim, lease).await?;
            }
            Ok(all)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_keys_are_scoped_hashed_and_short() {
        let a = StoreKey::new("kalipto", None, "pd_1");
        assert!(a.as_str().starts_with("ti:"));
        assert_eq!(a.as_str().len(), STORE_KEY_LEN);
        assert!(
            a.as_str()[3..]
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
    }
}
