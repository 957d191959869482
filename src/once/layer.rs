//! [`OnceLayer`]: [`Idempotent::once`] as a tower layer, for any `Service<Req>` that is not
//! HTTP (a job runner's service, a consumer loop written as a service, a client call).
//!
//! Another door onto the same core: each call is one [`Idempotent::once`] on the key a
//! closure reads from the request, with the inner service's call as the closure. So the
//! claim, lease renewal, record on `Ok`, release on `Err` (or a panic, or a dropped future),
//! replay, namespace and bounded wait are `once`'s, on `once`'s store and settings. The `Ok`
//! response is recorded as JSON and a repeat gets it back decoded; the inner service is not
//! called.
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

use super::{Idempotent, OnceError};
use crate::MissingKey;

/// The future of a [`Once`] call: boxed once per call, because it is `once`'s (an `async fn`,
/// whose type cannot be named) with the inner service's future inside.
pub type OnceFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, OnceError<E>>> + Send>>;

/// Wraps a service in [`Once`]: each request runs at most once per key, the key read by
/// `key_of`. Cheap to clone.
///
/// A request without a key (`key_of` answers `None`) is rejected with
/// [`OnceError::MissingKey`] by default, or passed through unprotected with
/// [`missing_key`](Self::missing_key)`(MissingKey::PassThrough)`.
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
pub struct OnceLayer<K> {
    once: Idempotent,
    key_of: Arc<K>,
    missing: MissingKey,
}

impl<K> OnceLayer<K> {
    /// Runs each request through `once`, keyed by `key_of` (a closure
    /// `Fn(&Req) -> Option<String>`).
    pub fn new(once: Idempotent, key_of: K) -> Self {
        OnceLayer {
            once,
            key_of: Arc::new(key_of),
            missing: MissingKey::Reject,
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

impl<K> Clone for OnceLayer<K> {
    fn clone(&self) -> Self {
        OnceLayer {
            once: self.once.clone(),
            key_of: self.key_of.clone(),
            missing: self.missing,
        }
    }
}

impl<K> fmt::Debug for OnceLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OnceLayer")
            .field("once", &self.once)
            .field("missing", &self.missing)
            .finish_non_exhaustive()
    }
}

impl<S, K> Layer<S> for OnceLayer<K> {
    type Service = Once<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        Once {
            inner,
            once: self.once.clone(),
            key_of: self.key_of.clone(),
            missing: self.missing,
        }
    }
}

impl Idempotent {
    /// A [`OnceLayer`] on these settings, keyed by `key_of`.
    ///
    /// ```
    /// use tower::{Service, ServiceExt, service_fn};
    /// use tower_idempotency::{Idempotent, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let layer = Idempotent::new(MemoryStore::new()).layer(|id: &u32| Some(id.to_string()));
    /// let mut service = tower::ServiceBuilder::new()
    ///     .layer(layer)
    ///     .service(service_fn(|id: u32| async move { Ok::<_, std::io::Error>(id + 1) }));
    /// assert_eq!(service.ready().await.unwrap().call(41).await.unwrap(), 42);
    /// # }
    /// ```
    pub fn layer<K>(&self, key_of: K) -> OnceLayer<K> {
        OnceLayer::new(self.clone(), key_of)
    }
}

/// A service whose calls run at most once per key: built by [`OnceLayer`].
///
/// Success is the inner `Result`: an `Ok` response is recorded (as JSON) and replayed to every
/// repeat; an `Err` is returned as [`OnceError::Failed`] and frees the key, so a later call
/// runs again. A repeat while the first call runs gets [`OnceError::InFlight`], or waits
/// for it with [`Idempotent::wait_in_flight`].
pub struct Once<S, K> {
    inner: S,
    once: Idempotent,
    key_of: Arc<K>,
    missing: MissingKey,
}

impl<S, K> Once<S, K> {
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

impl<S: Clone, K> Clone for Once<S, K> {
    fn clone(&self) -> Self {
        Once {
            inner: self.inner.clone(),
            once: self.once.clone(),
            key_of: self.key_of.clone(),
            missing: self.missing,
        }
    }
}

impl<S: fmt::Debug, K> fmt::Debug for Once<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Once")
            .field("inner", &self.inner)
            .field("once", &self.once)
            .field("missing", &self.missing)
            .finish_non_exhaustive()
    }
}

impl<S, K, Req> Service<Req> for Once<S, K>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Serialize + DeserializeOwned + Send + 'static,
    S::Error: Send + 'static,
    K: Fn(&Req) -> Option<String>,
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
        let once = self.once.clone();
        Box::pin(async move { once.once(&key, move || inner.call(req)).await })
    }
}
