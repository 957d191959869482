//! [`Idempotency`]: the middleware service. Uncovered methods take a fast path straight to the
//! inner service; covered requests go through the [phases](crate::http::phase) of a request (read,
//! verify, key, claim) and only then to the instance that `poll_ready` made ready.
//!
//! ```
//! use std::convert::Infallible;
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::{BodyExt, Full};
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_idempotency::IdempotencyLayer;
//! use tower_idempotency::MemoryStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let svc = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::new(MemoryStore::new()))
//!     .service_fn(|_req: Request<_>| async {
//!         Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
//!     });
//!
//! let request = || Request::post("/orders").header("idempotency-key", "k1").body(Full::new(Bytes::new())).unwrap();
//! let first = svc.clone().oneshot(request()).await.unwrap();
//! assert_eq!(first.status(), StatusCode::OK);
//! let repeat = svc.clone().oneshot(request()).await.unwrap();
//! assert_eq!(repeat.headers()["idempotent-replayed"], "true");
//! # }
//! ```

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, Request, Response};
use http_body::Body;
use tower_service::Service;

use crate::http::answer::reject;
use crate::http::body::{RequestBody, ResponseBody};
use crate::http::classify::says_grpc;
use crate::http::future::ResponseFuture;
use crate::http::phase::{Config, prelude};
use crate::http::rejection::Rejection;
use crate::key::ExtractKey;
use crate::store::BoxError;
use crate::util::in_box;

/// The middleware service built by [`IdempotencyLayer`](crate::IdempotencyLayer).
pub struct Idempotency<S, K> {
    inner: S,
    config: Arc<Config<K>>,
}

impl<S, K> Idempotency<S, K> {
    pub(crate) fn from_config(inner: S, config: Arc<Config<K>>) -> Self {
        Idempotency { inner, config }
    }

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

impl<S: Clone, K> Clone for Idempotency<S, K> {
    fn clone(&self) -> Self {
        Idempotency {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S: fmt::Debug, K> fmt::Debug for Idempotency<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .field(
                "namespace",
                &self.config.settings.claim.policy.observer.namespace(),
            )
            .finish_non_exhaustive()
    }
}

impl<S, K, ReqBody, ResBody> Service<Request<ReqBody>> for Idempotency<S, K>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    K: ExtractKey,
    ReqBody: Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let settings = &self.config.settings;
        if !settings.intake.covers(req.method()) {
            // Fast path: nothing to buffer, verify, key or claim.
            return ResponseFuture::pass_through(self.inner.call(req.map(RequestBody::streaming)));
        }
        let span = settings.claim.policy.observer.span(req.method());
        let timer = {
            let _entered = span.enter();
            settings.claim.policy.observer.request_stopwatch()
        };
        let (grpc, length) = intake(req.headers());
        if length.is_some_and(|len| len > settings.intake.body_limit as u64) {
            let rejection = Rejection::PayloadTooLarge {
                limit: settings.intake.body_limit,
            };
            let response = reject(settings, rejection, grpc);
            return ResponseFuture::ready(response, settings.clone(), span, timer);
        }
        // Clone-and-swap: the instance `poll_ready` made ready is the one that will be called.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let (parts, body) = req.into_parts();
        let prelude = in_box(|| prelude(self.config.clone(), parts, body, grpc));
        ResponseFuture::new(prelude, inner, settings.clone(), span, timer)
    }
}

/// Whether a request's head says gRPC (its first `content-type`) and its first
/// `content-length`, as `HeaderMap::get` finds them, in one pass over its few headers rather
/// than a lookup each (each hashes its name).
fn intake(headers: &HeaderMap) -> (bool, Option<u64>) {
    let (mut content_type, mut length) = (None, None);
    for (name, value) in headers {
        if *name == CONTENT_TYPE {
            content_type.get_or_insert(value);
        } else if *name == CONTENT_LENGTH {
            length.get_or_insert(value);
        }
    }
    let length = length.and_then(|value| value.to_str().ok()?.parse().ok());
    (content_type.is_some_and(says_grpc), length)
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    /// The one pass finds what `HeaderMap::get` finds: the first value of each name.
    #[test]
    fn intake_reads_the_first_content_type_and_length() {
        assert_eq!(intake(&HeaderMap::new()), (false, None));
        let mut headers = HeaderMap::new();
        headers.insert("x-other", HeaderValue::from_static("1"));
        headers.append(CONTENT_LENGTH, HeaderValue::from_static("12"));
        headers.append(CONTENT_LENGTH, HeaderValue::from_static("99999"));
        headers.append(
            CONTENT_TYPE,
            HeaderValue::from_static("application/grpc+proto"),
        );
        headers.append(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        assert_eq!(intake(&headers), (true, Some(12)));
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        headers.append(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert(CONTENT_LENGTH, HeaderValue::from_static("twelve"));
        assert_eq!(intake(&headers), (false, None));
    }
}
