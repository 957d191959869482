//! [`OnceLayer`]: [`Idempotent::once`] as a tower layer, for any `Service<Req>` that is not
//! HTTP (a job runner's service, a consumer loop written as a service, a client call).
//!
//! Another door onto the same core: each call is one [`Idempotent::once`] on the key a
//! closure reads from the request, with the inner service's call as the closure. So the
//! claim, lease renewal, record on `Ok`, release on `Err` (or a panic, or a dropped future),
//! replay, namespace and bounded wait are `once`'s, on `once`'s store and settings. The `Ok`
//! response is recorded as JSON and a repeat gets it back decoded; the inner service is not
//! called. With [`OnceLayer::fingerprint`], a key reused with another request (another
//! fingerprint of the part of it the closure picks) gets [`OnceError::Mismatch`].
//!
//! ```
//! use tower::{Service, ServiceExt, service_fn};
//! use tower_idempotency::{Idempotent, MemoryStore};
//! use tower_idempotency::once::OnceLayer;
//!
//! #[derive(Clone)]
//! struct Job { id: Option<String>, cents: u64 }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let refunds = Idempotent::new(MemoryStore::new()).namespace("refunds");
//! let layer = OnceLayer::new(refunds, |job: &Job| job.id.clone());
//! let mut service = tower::ServiceBuilder::new()
//!     .layer(layer)
//!     .service(service_fn(|job: Job| async move { Ok::<_, std::io::Error>(job.cents * 2) }));
//!
//! let job = Job { id: Some("refund-7".into()), cents: 500 };
//! assert_eq!(service.ready().await?.call(job.clone()).await?, 1000);
//! // The repeat replays the recorded 1000: the inner service is not called.
//! let changed = Job { cents: 1, ..job };
//! assert_eq!(service.ready().await?.call(changed).await?, 1000);
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use serde::Serialize;
use serde::de::DeserializeOwned;
use tower_layer::Layer;
use tower_service::Service;

use super::{Idempotent, OnceError, fingerprint_json};
use crate::MissingKey;
use crate::fingerprint::Fingerprint;

/// What a [`OnceLayer`] fingerprints of a request, to tell a key reused with another request
/// ([`OnceError::Mismatch`]): implemented by [`NoFingerprint`] (the default: nothing) and by
/// every closure `Fn(&Req) -> P` where `P: Serialize` (the JSON of `P`, hashed, as
/// [`Idempotent::once_with`] does with its payload).
///
/// ```
/// use tower_idempotency::once::{FingerprintRequest, NoFingerprint};
///
/// let of_amount = |job: &(String, u64)| job.1;
/// let job = ("refund-7".to_owned(), 500);
/// assert_ne!(of_amount.fingerprint(&job).unwrap(), NoFingerprint.fingerprint(&job).unwrap());
/// ```
pub trait FingerprintRequest<Req> {
    /// The fingerprint of `req`; an error when what was picked cannot be encoded as JSON.
    fn fingerprint(&self, req: &Req) -> Result<Fingerprint, serde_json::Error>;
}

/// The default of [`OnceLayer`]: requests are not fingerprinted, and a key reused with another
/// request replays the first response.
///
/// ```
/// use tower_idempotency::once::{FingerprintRequest, NoFingerprint};
/// use tower_idempotency::fingerprint::Fingerprint;
///
/// assert_eq!(NoFingerprint.fingerprint(&"anything").unwrap(), Fingerprint::NONE);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct NoFingerprint;

impl<Req> FingerprintRequest<Req> for NoFingerprint {
    fn fingerprint(&self, _: &Req) -> Result<Fingerprint, serde_json::Error> {
        Ok(Fingerprint::NONE)
    }
}

impl<Req, F, P> FingerprintRequest<Req> for F
where
    F: Fn(&Req) -> P,
    P: Serialize,
{
    fn fingerprint(&self, req: &Req) -> Result<Fingerprint, serde_json::Error> {
        fingerprint_json(&self(req))
    }
}

/// The future of a [`Once`] call: boxed once per call, because it is `once`'s (an `async fn`,
/// whose type cannot be named) with the inner service's future inside.
pub type OnceFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, OnceError<E>>> + Send>>;

/// Wraps a service in [`Once`]: each request runs at most once per key, the key read by
/// `key_of`. Cheap to clone.
///
/// A request without a key (`key_of` answers `None`) is rejected with
/// [`OnceError::MissingKey`] by default, or passed through unprotected with
/// [`missing_key`](Self::missing_key)`(MissingKey::PassThrough)`. Requests are not
/// fingerprinted unless [`fingerprint`](Self::fingerprint) says what to fingerprint.
///
/// ```
/// use tower_idempotency::{Idempotent, MemoryStore, MissingKey};
/// use tower_idempotency::once::OnceLayer;
///
/// let jobs = Idempotent::new(MemoryStore::new()).namespace("emails");
/// let layer = OnceLayer::new(jobs, |msg: &(String, String)| Some(msg.0.clone()))
///     .missing_key(MissingKey::PassThrough);
/// # let _ = layer;
/// ```
pub struct OnceLayer<K, P = NoFingerprint> {
    once: Idempotent,
    key_of: Arc<K>,
    fingerprint: Arc<P>,
    missing: MissingKey,
}

impl<K> OnceLayer<K> {
    /// Runs each request through `once`, keyed by `key_of` (a closure
    /// `Fn(&Req) -> Option<String>`).
    pub fn new(once: Idempotent, key_of: K) -> Self {
        OnceLayer {
            once,
            key_of: Arc::new(key_of),
            fingerprint: Arc::new(NoFingerprint),
            missing: MissingKey::Reject,
        }
    }
}

impl<K, P> OnceLayer<K, P> {
    /// Fingerprints each request with `fingerprint_of` (a closure `Fn(&Req) -> T` where
    /// `T: Serialize`, see [`FingerprintRequest`]), stored with its key: a key reused with a
    /// request of another fingerprint gets [`OnceError::Mismatch`] and the inner service is
    /// not called (Powertools' payload validation). Pick the fields that make the request
    /// what it is; leave out those that may differ between two deliveries of it (a delivery
    /// time, an attempt count).
    ///
    /// ```
    /// use tower::{Service, ServiceExt, service_fn};
    /// use tower_idempotency::{Idempotent, MemoryStore, OnceError};
    /// use tower_idempotency::once::OnceLayer;
    ///
    /// #[derive(Clone)]
    /// struct Refund { id: String, cents: u64, attempt: u32 }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let refunds = Idempotent::new(MemoryStore::new()).namespace("refunds");
    /// let layer = OnceLayer::new(refunds, |r: &Refund| Some(r.id.clone()))
    ///     .fingerprint(|r: &Refund| r.cents);
    /// let mut service = tower::ServiceBuilder::new()
    ///     .layer(layer)
    ///     .service(service_fn(|r: Refund| async move { Ok::<_, std::io::Error>(r.cents) }));
    /// let first = Refund { id: "r-1".into(), cents: 500, attempt: 1 };
    /// assert_eq!(service.ready().await.unwrap().call(first.clone()).await.unwrap(), 500);
    /// // Another delivery of the same refund replays...
    /// let again = Refund { attempt: 2, ..first.clone() };
    /// assert_eq!(service.ready().await.unwrap().call(again).await.unwrap(), 500);
    /// // ...the same id with another amount is a mismatch.
    /// let other = Refund { cents: 900, ..first };
    /// let reused = service.ready().await.unwrap().call(other).await;
    /// assert!(matches!(reused, Err(OnceError::Mismatch)));
    /// # }
    /// ```
    pub fn fingerprint<Q>(self, fingerprint_of: Q) -> OnceLayer<K, Q> {
        OnceLayer {
            once: self.once,
            key_of: self.key_of,
            fingerprint: Arc::new(fingerprint_of),
            missing: self.missing,
        }
    }

    /// What to do with a request that has no key: [`MissingKey::Reject`] (the default)
    /// answers [`OnceError::MissingKey`] without calling the inner service;
    /// [`MissingKey::PassThrough`] calls it unprotected (nothing claimed or recorded).
    pub fn missing_key(mut self, missing: MissingKey) -> Self {
        self.missing = missing;
        self
    }
}

impl<K, P> Clone for OnceLayer<K, P> {
    fn clone(&self) -> Self {
        OnceLayer {
            once: self.once.clone(),
            key_of: self.key_of.clone(),
            fingerprint: self.fingerprint.clone(),
            missing: self.missing,
        }
    }
}

impl<K, P> fmt::Debug for OnceLayer<K, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OnceLayer")
            .field("once", &self.once)
            .field("missing", &self.missing)
            .finish_non_exhaustive()
    }
}

impl<S, K, P> Layer<S> for OnceLayer<K, P> {
    type Service = Once<S, K, P>;

    fn layer(&self, inner: S) -> Self::Service {
        Once {
            inner,
            once: self.once.clone(),
            key_of: self.key_of.clone(),
            fingerprint: self.fingerprint.clone(),
            missing: self.missing,
        }
    }
}

/// A service whose calls run at most once per key: built by [`OnceLayer`].
///
/// Success is the inner `Result`: an `Ok` response is recorded (as JSON) and replayed to every
/// repeat; an `Err` is returned as [`OnceError::Failed`] and frees the key, so a later call
/// runs again. A repeat while the first call runs gets [`OnceError::InFlight`], or waits
/// for it with [`Idempotent::wait_in_flight`]. With [`OnceLayer::fingerprint`], a key reused
/// with a request of another fingerprint gets [`OnceError::Mismatch`].
pub struct Once<S, K, P = NoFingerprint> {
    inner: S,
    once: Idempotent,
    key_of: Arc<K>,
    fingerprint: Arc<P>,
    missing: MissingKey,
}

impl<S, K, P> Once<S, K, P> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes the middleware, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, K, P> Clone for Once<S, K, P> {
    fn clone(&self) -> Self {
        Once {
            inner: self.inner.clone(),
            once: self.once.clone(),
            key_of: self.key_of.clone(),
            fingerprint: self.fingerprint.clone(),
            missing: self.missing,
        }
    }
}

impl<S: fmt::Debug, K, P> fmt::Debug for Once<S, K, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Once")
            .field("inner", &self.inner)
            .field("once", &self.once)
            .field("missing", &self.missing)
            .finish_non_exhaustive()
    }
}

impl<S, K, P, Req> Service<Req> for Once<S, K, P>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Serialize + DeserializeOwned + Send + 'static,
    S::Error: Send + 'static,
    K: Fn(&Req) -> Option<String>,
    P: FingerprintRequest<Req>,
    Req: Send + 'static,
{
    type Response = S::Response;
    type Error = OnceError<S::Error>;
    type Future = OnceFuture<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(OnceError::Failed)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        // Clone-and-swap: the instance `poll_ready` made ready is the one that will be called.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let Some(key) = (self.key_of)(&req) else {
            return match self.missing {
                MissingKey::Reject => Box::pin(async { Err(OnceError::MissingKey) }),
                MissingKey::PassThrough => {
                    let call = inner.call(req);
                    Box::pin(async move { call.await.map_err(OnceError::Failed) })
                }
            };
        };
        let fingerprint = match self.fingerprint.fingerprint(&req) {
            Ok(fingerprint) => fingerprint,
            Err(err) => return Box::pin(async { Err(OnceError::Encode(err)) }),
        };
        let once = self.once.clone();
        Box::pin(async move {
            let call = move || inner.call(req);
            once.once_fingerprinted(&key, fingerprint, call).await
        })
    }
}
