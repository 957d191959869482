//! [`Idempotency`]: the middleware service. Uncovered methods take a fast path straight to the
//! inner service; covered requests are buffered (bounded), keyed, claimed, and only then
//! handed to the instance that `poll_ready` made ready.
//!
//! ```
//! use std::convert::Infallible;
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::{BodyExt, Full};
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_idempotency::IdempotencyLayer;
//! use tower_idempotency::store::MemoryStore;
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
use std::time::Instant;

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use tower_service::Service;

use crate::body::{Collected, RequestBody, ResponseBody};
use crate::fingerprint::Fingerprint;
use crate::future::{Prelude, ResponseFuture};
use crate::key::{ExtractKey, KeyInput};
use crate::layer::{Config, FailureMode, MissingKey, OnMismatch, Settings};
use crate::lease::{Lease, timed};
use crate::observe::StoreOp;
use crate::outcome::Outcome;
use crate::record::Record;
use crate::rejection::Rejection;
use crate::store::{BoxError, Claim, IdempotencyStore, Reservation, StoreKey};

/// The header set on every answer the layer gives in place of the inner service to a duplicate.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// The middleware service built by [`IdempotencyLayer`](crate::IdempotencyLayer).
pub struct Idempotency<S, St, K> {
    inner: S,
    config: Arc<Config<St, K>>,
}

impl<S, St, K> Idempotency<S, St, K> {
    pub(crate) fn from_config(inner: S, config: Arc<Config<St, K>>) -> Self {
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

impl<S: Clone, St, K> Clone for Idempotency<S, St, K> {
    fn clone(&self) -> Self {
        Idempotency {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S: fmt::Debug, St, K> fmt::Debug for Idempotency<S, St, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .field("namespace", &self.config.settings.observer.namespace())
            .finish_non_exhaustive()
    }
}

impl<S, St, K, ReqBody, ResBody> Service<Request<ReqBody>> for Idempotency<S, St, K>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    St: IdempotencyStore,
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
        if !settings.covers(req.method()) {
            // Fast path: nothing to buffer, key or claim.
            return ResponseFuture::pass_through(self.inner.call(req.map(RequestBody::streaming)));
        }
        let span = settings.observer.span(req.method());
        let timer = {
            let _entered = span.enter();
            settings.observer.stopwatch()
        };
        let grpc = is_grpc(req.headers());
        if content_length(req.headers()).is_some_and(|len| len > settings.body_limit as u64) {
            let rejection = Rejection::PayloadTooLarge {
                limit: settings.body_limit,
            };
            return ResponseFuture::ready(reject(rejection, grpc), settings.clone(), span, timer);
        }
        // Clone-and-swap: the instance `poll_ready` made ready is the one that will be called.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let (parts, body) = req.into_parts();
        let prelude = prelude(self.config.clone(), parts, body, grpc);
        ResponseFuture::new(Box::pin(prelude), inner, settings.clone(), span, timer)
    }
}

pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|ct| ct.as_bytes().starts_with(b"application/grpc"))
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

pub(crate) fn reject<B>(rejection: Rejection, grpc: bool) -> Response<ResponseBody<B>> {
    let outcome = match &rejection {
        Rejection::InFlight { .. } => Outcome::InFlight,
        Rejection::Mismatch => Outcome::Mismatch,
        Rejection::StoreUnavailable { .. } => Outcome::StoreError,
        other => Outcome::Rejected(other.code()),
    };
    let mut response = if grpc {
        rejection.into_grpc_response()
    } else {
        rejection.into_response()
    };
    response.extensions_mut().insert(outcome);
    response
}

/// Reads a body in full, within `limit` bytes.
async fn collect_body<B>(body: B, limit: usize) -> Result<Collected, Rejection>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    let mut collected = Collected::default();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|err| {
            let err: BoxError = err.into();
            tracing::debug!(error = %err, "request body could not be read");
            Rejection::BodyUnreadable
        })?;
        if collected.push(frame) > limit {
            return Err(Rejection::PayloadTooLarge { limit });
        }
    }
    Ok(collected)
}

/// Everything before the inner call: read the body, derive the key, claim it.
async fn prelude<St, K, B, ResBody>(
    config: Arc<Config<St, K>>,
    mut parts: http::request::Parts,
    body: B,
    grpc: bool,
) -> Prelude<B, ResBody>
where
    St: IdempotencyStore,
    K: ExtractKey,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let settings = &config.settings;
    let buffer = settings.fingerprint || config.extractor.needs_body();

    let (body, data) = if buffer {
        let read = collect_body(body, settings.body_limit);
        let collected = match settings.body_timeout {
            Some(limit) => match tokio::time::timeout(limit, read).await {
                Ok(result) => result,
                Err(_) => Err(Rejection::BodyTimeout),
            },
            None => read.await,
        };
        match collected {
            Ok(collected) => {
                let (data, trailers) = collected.into_parts();
                (RequestBody::buffered(data.clone(), trailers), Some(data))
            }
            Err(rejection) => return Prelude::Respond(reject(rejection, grpc)),
        }
    } else {
        (RequestBody::limited(body, settings.body_limit), None)
    };

    let key = match config
        .extractor
        .extract_key(&KeyInput::new(&parts, data.as_ref()))
    {
        Ok(Some(key)) => key,
        Ok(None) => match settings.missing_key {
            MissingKey::Reject => return Prelude::Respond(reject(Rejection::MissingKey, grpc)),
            MissingKey::PassThrough => {
                return Prelude::Call {
                    request: Request::from_parts(parts, body),
                    lease: None,
                    outcome: Outcome::PassThrough,
                };
            }
        },
        Err(err) => return Prelude::Respond(reject(Rejection::MalformedKey(err), grpc)),
    };

    let fingerprint = match (&data, settings.fingerprint) {
        (Some(data), true) => Fingerprint::of_bytes(data),
        _ => Fingerprint::NONE,
    };
    let scope = settings.scope.of(&parts);
    let store_key = StoreKey::new(
        settings.observer.namespace(),
        scope.as_deref(),
        key.as_str(),
    );
    tracing::Span::current().record("key", store_key.as_str());
    parts.extensions.insert(key);
    // Until the reserve's answer is in, the claim may land without us knowing: if this future
    // is dropped (the client went away) or the reserve fails, the guard undoes it.
    let unsettled = UnsettledReserve::new(
        config.store.clone(),
        store_key,
        Claim::new(fingerprint),
        settings.store_timeout,
    );

    let deadline = settings.wait_in_flight.map(|wait| Instant::now() + wait);
    let mut pause = std::time::Duration::from_millis(10);
    let mut reserved_at;
    let reservation = loop {
        reserved_at = Instant::now();
        let timer = settings.observer.stopwatch_since(reserved_at);
        let (store_key, claim) = unsettled.parts();
        let result = timed(
            settings.store_timeout,
            config.store.reserve(store_key, claim, settings.lease),
        )
        .await;
        settings
            .observer
            .store_call(StoreOp::Reserve, timer, result.is_ok());
        match result {
            Ok(Reservation::InFlight { fingerprint: held })
                if held.matches(&fingerprint)
                    && deadline.is_some_and(|d| Instant::now() + pause < d) =>
            {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_millis(250));
            }
            other => break other,
        }
    };

    match reservation {
        Ok(Reservation::Acquired) => {
            let (store_key, claim) = unsettled.settle();
            let mut lease = Lease::new(
                config.store.clone(),
                store_key,
                claim,
                // The lease runs from (at the latest) the reserve that took it.
                reserved_at + settings.lease,
                settings.retention,
                settings.store_timeout,
                settings.observer.clone(),
            );
            lease.set_grpc(grpc);
            Prelude::Call {
                request: Request::from_parts(parts, body),
                lease: Some(lease),
                outcome: Outcome::First,
            }
        }
        Ok(Reservation::InFlight { fingerprint: held }) => {
            unsettled.settle();
            if !held.matches(&fingerprint) && settings.on_mismatch == OnMismatch::Reject {
                return Prelude::Respond(reject(Rejection::Mismatch, grpc));
            }
            Prelude::Respond(reject(
                Rejection::InFlight {
                    retry_after: settings.in_flight_retry_after,
                },
                grpc,
            ))
        }
        Ok(Reservation::Completed(record)) => {
            unsettled.settle();
            if !record.fingerprint().matches(&fingerprint) {
                if settings.on_mismatch == OnMismatch::Reject {
                    return Prelude::Respond(reject(Rejection::Mismatch, grpc));
                }
                tracing::warn!("idempotency key reused with a different payload; acknowledged");
            }
            Prelude::Respond(duplicate(record, settings, grpc))
        }
        Err(err) => {
            // A reserve that timed out or lost its connection may still be applied later (a
            // client that queues and retries commands across a reconnect): dropping the
            // unsettled guard undoes it, token-checked, so it cannot block the sender's retries
            // until the lease expires.
            drop(unsettled);
            store_failure(err, settings, parts, body, grpc)
        }
    }
}

/// A claim whose reserve has been sent but whose answer has not been acted on. Dropped
/// unsettled, it releases the claim in the background, at once and again a few times with
/// growing delays (a release of a claim that never landed, or was already released, changes
/// nothing; a reserve still queued in a reconnecting client lands before the later releases).
struct UnsettledReserve<St: IdempotencyStore> {
    store: St,
    timeout: std::time::Duration,
    claim: Option<(StoreKey, Claim)>,
}

impl<St: IdempotencyStore> UnsettledReserve<St> {
    fn new(store: St, key: StoreKey, claim: Claim, timeout: std::time::Duration) -> Self {
        UnsettledReserve {
            store,
            timeout,
            claim: Some((key, claim)),
        }
    }

    fn parts(&self) -> (&StoreKey, &Claim) {
        let (key, claim) = self.claim.as_ref().expect("settled reserve");
        (key, claim)
    }

    /// The answer is in: nothing to undo.
    fn settle(mut self) -> (StoreKey, Claim) {
        self.claim.take().expect("settled twice")
    }
}

impl<St: IdempotencyStore> Drop for UnsettledReserve<St> {
    fn drop(&mut self) {
        let Some((key, claim)) = self.claim.take() else {
            return;
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, timeout) = (self.store.clone(), self.timeout);
        handle.spawn(async move {
            for factor in [0, 1, 4, 16] {
                tokio::time::sleep(timeout * factor).await;
                if let Ok(true) = timed(timeout, store.release(&key, &claim)).await {
                    return;
                }
            }
        });
    }
}

fn store_failure<B, ResBody>(
    err: crate::store::StoreError,
    settings: &Settings,
    parts: http::request::Parts,
    body: RequestBody<B>,
    grpc: bool,
) -> Prelude<B, ResBody> {
    match settings.failure_mode {
        FailureMode::Closed => {
            tracing::error!(error = %err, "idempotency store error; failing closed");
            Prelude::Respond(reject(
                Rejection::StoreUnavailable {
                    retry_after: settings.store_retry_after,
                },
                grpc,
            ))
        }
        FailureMode::Open => {
            tracing::error!(error = %err, "idempotency store error; failing open");
            Prelude::Call {
                request: Request::from_parts(parts, body),
                lease: None,
                outcome: Outcome::FailOpen,
            }
        }
    }
}

/// The answer to a duplicate of a completed key: the replay when one was recorded, else the
/// acknowledgement.
fn duplicate<B>(record: Record, settings: &Settings, grpc: bool) -> Response<ResponseBody<B>> {
    let mut response = match record.into_response() {
        Some(stored) => {
            let (status, headers, body, trailers) = stored.into_parts();
            let mut response = Response::new(ResponseBody::buffered(body, trailers));
            *response.status_mut() = status;
            *response.headers_mut() = headers;
            response
        }
        None if grpc => {
            // No reply was recorded (it exceeded the response buffer limit). An empty OK
            // response would fail a unary client ("missing response message") and pass an
            // empty stream off as the original one: answer ALREADY_EXISTS, which tells the
            // client that the call already took effect.
            let mut response = Response::new(ResponseBody::buffered(Bytes::new(), None));
            let headers = response.headers_mut();
            headers.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            );
            headers.insert("grpc-status", HeaderValue::from_static("6"));
            headers.insert(
                "grpc-message",
                HeaderValue::from_static(
                    "this call already succeeded; its reply was too large to keep for replay",
                ),
            );
            response
        }
        None => {
            let (status, content_type, body) = settings.ack.parts();
            let mut response = Response::new(ResponseBody::buffered(body.clone(), None));
            *response.status_mut() = status;
            response
                .headers_mut()
                .insert(http::header::CONTENT_TYPE, content_type.clone());
            response
        }
    };
    response
        .headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response.extensions_mut().insert(Outcome::Replayed);
    response
}
