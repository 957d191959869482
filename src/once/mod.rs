//! [`Idempotent::once`]: run an async closure at most once per key, outside HTTP (a job
//! retried by its queue, a consumer that gets a message again, a cron run overlapping the last).
//!
//! A door onto the same core as the HTTP layer: the claim is the crate's one claim guard (atomic reserve, lease renewed while the closure runs, token-checked record
//! on `Ok`, release on `Err`, a panic or a dropped future), and the output is kept in the
//! record the stores already hold (a stored response whose body is the output as JSON).
//!
//! - A repeat returns the recorded output without running the closure.
//! - A repeat while the first call runs gets [`OnceError::InFlight`], or waits for it,
//!   bounded, with [`Idempotent::wait_in_flight`].
//! - [`Idempotent::once_with`] fingerprints a payload: a key reused with another payload gets
//!   [`OnceError::Mismatch`].
//! - A store error is [`OnceError::Store`]: the closure never runs unclaimed.
//! - Every call runs in a span `idempotent.once` naming the namespace and the hashed key
//!   (never the key itself).
//! - `Idempotent::once_in_tx` (features `postgres`, `sqlite`) hands the closure an SQL
//!   transaction and writes the record in it: the effect and the record commit together, or
//!   neither does.
//! - [`OnceLayer`] does the same for any non-HTTP `tower::Service<Req>`: keyed by a closure
//!   over the request, success by the inner `Result`, the `Ok` response recorded and replayed,
//!   and with [`OnceLayer::fingerprint`] a key reused with another request a mismatch.
//!
//! ```
//! use std::time::Duration;
//! use tower_idempotency::{Idempotent, MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let refunds = Idempotent::new(MemoryStore::new())
//!     .namespace("refunds")
//!     .retention(Duration::from_secs(7 * 24 * 3600));
//! let first: Result<u64, _> = refunds
//!     .once("refund-42", || async { Ok::<_, std::io::Error>(4200) })
//!     .await;
//! // The second call replays the recorded output; its closure does not run.
//! let again: Result<u64, _> = refunds
//!     .once("refund-42", || async { Ok::<_, std::io::Error>(0) })
//!     .await;
//! assert_eq!(first.unwrap(), 4200);
//! assert_eq!(again.unwrap(), 4200);
//! # }
//! ```
//!
//! The longer story: `docs/once.md`.

mod error;
mod layer;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod tx;

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

pub use self::error::OnceError;
pub use self::layer::{FingerprintRequest, NoFingerprint, Once, OnceFuture, OnceLayer};
use crate::IdempotencyStore;
use crate::claim::guard::{ClaimGuard, ClaimStore, Ending, OneOrMany};
use crate::claim::lease::renewed;
use crate::claim::policy::Policy;
use crate::fingerprint::Fingerprint;
use crate::store::record::{Record, StoredResponse};
use crate::store::{Claim, Reservation, StoreError, StoreErrorKind, StoreKey, Target};

/// Runs closures at most once per key on one store. Cheap to clone; configure it once and
/// share it (two instances on one store see each other's claims).
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::{Idempotent, MemoryStore};
///
/// let jobs = Idempotent::new(MemoryStore::new())
///     .namespace("nightly-report")
///     .lease(Duration::from_secs(30))
///     .wait_in_flight(Duration::from_secs(5));
/// # let _ = jobs;
/// ```
#[derive(Clone)]
pub struct Idempotent {
    claims: ClaimStore,
    policy: Policy,
    namespace: String,
}

impl std::fmt::Debug for Idempotent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotent")
            .field("namespace", &self.namespace)
            .field("lease", &self.policy.lease)
            .field("retention", &self.policy.retention)
            .finish_non_exhaustive()
    }
}

impl Idempotent {
    /// Runs closures on `store` (behind a local cache of completed keys when the store talks
    /// to a server), in the namespace `"default"`.
    pub fn new<St: IdempotencyStore>(store: St) -> Self {
        Idempotent {
            claims: ClaimStore::new(store),
            policy: Policy::default(),
            namespace: "default".to_owned(),
        }
    }

    /// The namespace of the keys (keys are hashed with it: two namespaces never collide).
    pub fn namespace(mut self, namespace: &str) -> Self {
        namespace.clone_into(&mut self.namespace);
        self.policy.observer.set_namespace(namespace);
        self
    }

    /// How long a recorded output is kept and replayed.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.policy.retention = retention;
        self
    }

    /// The lease of a claim: renewed every third of it while the closure runs, so a crashed
    /// owner's key is free again within about one lease.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.policy.lease = lease;
        self
    }

    /// The timeout of each store call. A store whose client already times out each command
    /// within it (its [`command_timeout`](crate::IdempotencyStore::command_timeout)) is left to
    /// its client's timer.
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.policy.store_timeout = timeout;
        self
    }

    /// A repeat while the first call runs waits up to `wait` for its output instead of
    /// failing with [`OnceError::InFlight`] (and runs the closure itself if the first call
    /// failed and released the key meanwhile).
    pub fn wait_in_flight(mut self, wait: Duration) -> Self {
        self.policy.wait_in_flight = Some(wait);
        self
    }

    /// Runs `f` unless `key` already succeeded, and returns its output, or the recorded one.
    ///
    /// ```
    /// use tower_idempotency::{Idempotent, MemoryStore, OnceError};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let jobs = Idempotent::new(MemoryStore::new());
    /// // An `Err` records nothing: the next call runs again.
    /// let failed = jobs.once("job-1", || async { Err::<u8, _>("busy") }).await;
    /// assert!(matches!(failed, Err(OnceError::Failed("busy"))));
    /// assert_eq!(jobs.once("job-1", || async { Ok::<u8, &str>(1) }).await.unwrap(), 1);
    /// # }
    /// ```
    pub async fn once<T, E, F, Fut>(&self, key: &str, f: F) -> Result<T, OnceError<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.once_fingerprinted(key, Fingerprint::NONE, f).await
    }

    /// [`once`](Self::once), with `payload` fingerprinted: a key already used with another
    /// payload gets [`OnceError::Mismatch`] (Powertools' payload validation).
    ///
    /// ```
    /// use tower_idempotency::{Idempotent, MemoryStore, OnceError};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let refunds = Idempotent::new(MemoryStore::new());
    /// let ok = refunds.once_with("r-1", &("order-7", 500), || async { Ok::<_, ()>(()) });
    /// ok.await.unwrap();
    /// let reused = refunds.once_with("r-1", &("order-7", 900), || async { Ok::<_, ()>(()) });
    /// assert!(matches!(reused.await, Err(OnceError::Mismatch)));
    /// # }
    /// ```
    pub async fn once_with<P, T, E, F, Fut>(
        &self,
        key: &str,
        payload: &P,
        f: F,
    ) -> Result<T, OnceError<E>>
    where
        P: Serialize + ?Sized,
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let fingerprint = fingerprint_json(payload).map_err(OnceError::Encode)?;
        self.once_fingerprinted(key, fingerprint, f).await
    }

    /// [`once`](Self::once) with the payload's `fingerprint` (`NONE`: no payload).
    async fn once_fingerprinted<T, E, F, Fut>(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        f: F,
    ) -> Result<T, OnceError<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let claimed = |guard| run_claimed(guard, f);
        self.run(self.store_key(key), fingerprint, claimed).await
    }

    /// The store key of `key` in this namespace.
    fn store_key(&self, key: &str) -> StoreKey {
        StoreKey::new(&self.namespace, None, key)
    }

    /// The one path of every door of `once`: claims `store_key`, hands a claim that is ours to
    /// `claimed` (which runs the closure and settles the claim), and answers every other
    /// reservation (a replay, a mismatch, in flight) itself.
    async fn run<T, E, C, Fut>(
        &self,
        store_key: StoreKey,
        fingerprint: Fingerprint,
        claimed: C,
    ) -> Result<T, OnceError<E>>
    where
        T: DeserializeOwned,
        C: FnOnce(ClaimGuard) -> Fut,
        Fut: Future<Output = Result<T, OnceError<E>>>,
    {
        let span = tracing::info_span!(
            "idempotent.once",
            namespace = %self.namespace,
            key = %store_key.digits(),
        );
        async move {
            let targets = OneOrMany::One(Target::key(store_key));
            let mut guard = self
                .claims
                .open(targets, Claim::new(fingerprint), &self.policy);
            match self.reserve(&mut guard, &fingerprint).await? {
                Reservation::Acquired | Reservation::Stale { .. } => claimed(guard).await,
                Reservation::Completed(record) => replay(&record, &fingerprint),
                Reservation::InFlight { fingerprint: held } if !held.matches(&fingerprint) => {
                    Err(OnceError::Mismatch)
                }
                Reservation::InFlight { .. } | Reservation::ObjectBusy => Err(OnceError::InFlight),
            }
        }
        .instrument(span)
        .await
    }

    /// The reserve, repeated while another call holds the key and the wait allows it. The
    /// guard keeps the claim only when it is ours.
    async fn reserve<E>(
        &self,
        guard: &mut ClaimGuard,
        fingerprint: &Fingerprint,
    ) -> Result<Reservation, OnceError<E>> {
        let answer = match guard
            .reserve_waiting(self.policy.wait_in_flight, fingerprint)
            .await
        {
            Ok(answers) => answers.into_iter().next(),
            Err(err) => return Err(OnceError::Store(err)),
        };
        let Some(answer) = answer else {
            return Err(OnceError::Store(StoreError::new(StoreErrorKind::Corrupt)));
        };
        guard.keep(std::slice::from_ref(&answer));
        Ok(answer)
    }
}

/// Runs `f` under the claim `guard` holds: renews it once a third of the lease has passed,
/// records the output on `Ok`, releases on `Err` (and, through the guard's drop, on a panic or
/// a dropped future).
async fn run_claimed<T, E, F, Fut>(guard: ClaimGuard, f: F) -> Result<T, OnceError<E>>
where
    T: Serialize,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let output = renewed(&guard.renewal(), f()).await;
    let value = match output {
        Ok(value) => value,
        Err(err) => {
            guard.release().await;
            return Err(OnceError::Failed(err));
        }
    };
    let stored = match encode(&value) {
        Ok(stored) => stored,
        Err(err) => {
            guard.release().await;
            return Err(OnceError::Encode(err));
        }
    };
    guard
        .settle(Ending::Succeeded(Some(Box::new(stored))))
        .await;
    Ok(value)
}

/// The fingerprint of a payload (of `once_with`, of a request picked by `OnceLayer`): its
/// JSON, hashed.
fn fingerprint_json<P: Serialize + ?Sized>(payload: &P) -> Result<Fingerprint, serde_json::Error> {
    Ok(Fingerprint::of_bytes(&serde_json::to_vec(payload)?))
}

/// The output as the record keeps it: a stored response (200, no headers) whose body is the
/// output as JSON.
fn encode<T: Serialize>(value: &T) -> Result<StoredResponse, serde_json::Error> {
    let body = Bytes::from(serde_json::to_vec(value)?);
    Ok(StoredResponse::new(
        StatusCode::OK,
        HeaderMap::new(),
        body,
        None,
    ))
}

/// The recorded output of a completed key.
fn replay<T: DeserializeOwned, E>(
    record: &Record,
    fingerprint: &Fingerprint,
) -> Result<T, OnceError<E>> {
    if !record.fingerprint().matches(fingerprint) {
        return Err(OnceError::Mismatch);
    }
    let Some(response) = record.response() else {
        // Recorded by something else than `once` (an HTTP layer in ack mode, on the same key).
        return Err(OnceError::NoOutput);
    };
    serde_json::from_slice(response.body()).map_err(OnceError::Decode)
}
