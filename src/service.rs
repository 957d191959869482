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
use crate::classify::is_grpc;
use crate::config::{Config, FailureMode, MissingKey, OnMismatch, Settings};
use crate::fingerprint::Fingerprint;
use crate::future::{Prelude, ResponseFuture};
use crate::guard::OneOrMany;
use crate::items::BatchItems;
use crate::key::{ExtractKey, IdempotencyKey, KeyInput};
use crate::outcome::Outcome;
use crate::rejection::Rejection;
use crate::store::record::Record;
use crate::store::{BoxError, Claim, Reservation, StoreErrorKind, StoreKey};

/// `Idempotent-Replayed`: the header set (to `true`) on every answer the layer gives in place
/// of the inner service to a duplicate.
pub const IDEMPOTENT_REPLAYED: http::HeaderName =
    http::HeaderName::from_static("idempotent-replayed");

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
            .field("namespace", &self.config.settings.observer.namespace())
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
        if !settings.covers(req.method()) {
            // Fast path: nothing to buffer, key or claim.
            return ResponseFuture::pass_through(self.inner.call(req.map(RequestBody::streaming)));
        }
        let span = settings.observer.span(req.method());
        let timer = {
            let _entered = span.enter();
            settings.observer.request_stopwatch()
        };
        let grpc = is_grpc(req.headers());
        if content_length(req.headers()).is_some_and(|len| len > settings.body_limit as u64) {
            let rejection = Rejection::PayloadTooLarge {
                limit: settings.body_limit,
            };
            return ResponseFuture::ready(
                reject(settings, rejection, grpc),
                settings.clone(),
                span,
                timer,
            );
        }
        // Clone-and-swap: the instance `poll_ready` made ready is the one that will be called.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let (parts, body) = req.into_parts();
        let prelude = prelude(self.config.clone(), parts, body, grpc);
        ResponseFuture::new(Box::pin(prelude), inner, settings.clone(), span, timer)
    }
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

pub(crate) fn reject<B>(
    settings: &Settings,
    rejection: Rejection,
    grpc: bool,
) -> Response<ResponseBody<B>> {
    let outcome = match &rejection {
        Rejection::InFlight { .. } => Outcome::InFlight,
        Rejection::Mismatch => Outcome::Mismatch,
        Rejection::StoreUnavailable { .. } => Outcome::StoreError,
        other => Outcome::Rejected(other.code()),
    };
    let mut response = settings
        .render_rejection
        .render(&rejection, grpc)
        .map(|body| ResponseBody::buffered(body, None));
    let extensions = response.extensions_mut();
    extensions.insert(outcome);
    extensions.insert(rejection);
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

/// Everything before the inner call: read the body, derive the key, claim it. An async block
/// rather than an async fn: the block holds the request head once, where an async fn would keep
/// its arguments and their moved copies side by side.
#[expect(clippy::manual_async_fn, reason = "an async fn's future is larger")]
fn prelude<K, B, ResBody>(
    config: Arc<Config<K>>,
    mut parts: http::request::Parts,
    body: B,
    grpc: bool,
) -> impl Future<Output = Prelude<B, ResBody>> + use<K, B, ResBody>
where
    K: ExtractKey,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    async move {
        let settings = &config.settings;
        let buffer = settings.fingerprint || config.extractor.needs_body();

        let (body, data) = if buffer {
            let read = collect_body(body, settings.body_limit);
            let collected = match settings.body_timeout {
                // Boxed: a timer is large, and most layers have none; the request's future stays
                // small (below the allocator's per-thread cache size).
                Some(limit) => match Box::pin(tokio::time::timeout(limit, read)).await {
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
                Err(rejection) => return Prelude::Respond(reject(settings, rejection, grpc)),
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
                MissingKey::Reject => {
                    let expected = config.extractor.expected();
                    return Prelude::Respond(reject(
                        settings,
                        Rejection::MissingKey { expected },
                        grpc,
                    ));
                }
                MissingKey::PassThrough => {
                    return Prelude::Call {
                        request: Request::from_parts(parts, body),
                        guard: None,
                        outcome: Outcome::PassThrough,
                    };
                }
            },
            Err(err) => {
                return Prelude::Respond(reject(settings, Rejection::MalformedKey(err), grpc));
            }
        };

        // Items of a batch are keyed one by one: an item may come again in another batch, so a
        // payload fingerprint means nothing for them.
        let fingerprint = match (&data, settings.fingerprint && !key.is_items()) {
            (Some(data), true) => Fingerprint::of_bytes(data),
            _ => Fingerprint::NONE,
        };
        let scope = settings.scope.of(&parts);
        let namespace = settings.observer.namespace();
        // One store key per item of a batch keyed per item; otherwise one for the whole key (a
        // composite key is one key: its sorted, joined values).
        let store_keys = if key.is_items() {
            OneOrMany::Many(
                key.parts()
                    .map(|part| StoreKey::new(namespace, scope.as_deref(), part))
                    .collect(),
            )
        } else {
            OneOrMany::One(StoreKey::new(namespace, scope.as_deref(), key.as_str()))
        };
        if let [store_key] = &*store_keys {
            tracing::Span::current().record("key", store_key.as_str());
        }
        let items = key
            .is_items()
            .then(|| key.parts().map(str::to_owned).collect::<Vec<_>>());
        // Until the reserve's answer is in, the claim may land without us knowing: if this future
        // is dropped (the client went away) or the reserve fails, the guard undoes it.
        let mut guard = (config.open_claim)(store_keys, Claim::new(fingerprint), settings);
        guard.set_grpc(grpc);

        let deadline = settings.wait_in_flight.map(|wait| Instant::now() + wait);
        let mut pause = std::time::Duration::from_millis(10);
        let reservations = loop {
            match guard.reserve().await {
                // A duplicate of a request in flight may wait for it (a batch retries its own
                // claims: they answer "acquired" again).
                Ok(answers)
                    if in_flight(&answers).is_some_and(|held| held.matches(&fingerprint))
                        && deadline.is_some_and(|d| Instant::now() + pause < d) =>
                {
                    Box::pin(tokio::time::sleep(pause)).await;
                    pause = (pause * 2).min(std::time::Duration::from_millis(250));
                }
                other => break other,
            }
        };

        let answers = match reservations {
            Ok(answers) => answers,
            Err(err) => {
                if err.kind() == StoreErrorKind::Capacity && items.is_none() {
                    // Refused before anything was written.
                    guard.forget();
                } else {
                    // A reserve that timed out or lost its connection may still be applied later
                    // (a client that queues and retries commands across a reconnect): dropping the
                    // guard undoes it, token-checked, so it cannot block the sender's retries until
                    // the lease expires.
                    drop(guard);
                }
                return store_failure(err, settings, parts, body, key, grpc);
            }
        };

        if let Some(held) = in_flight(&answers) {
            let mismatch =
                !held.matches(&fingerprint) && settings.on_mismatch == OnMismatch::Reject;
            // Let go of what this request claimed, so the other holder's items are not blocked.
            guard.keep(&answers);
            guard.release().await;
            if mismatch {
                return Prelude::Respond(reject(settings, Rejection::Mismatch, grpc));
            }
            return Prelude::Respond(reject(
                settings,
                Rejection::InFlight {
                    retry_after: settings.in_flight_retry_after,
                },
                grpc,
            ));
        }

        let acquired = answers
            .iter()
            .filter(|a| matches!(a, Reservation::Acquired))
            .count();
        if acquired == 0 {
            guard.keep(&answers);
            drop(guard);
            // Every key (every item) was completed earlier: a duplicate.
            let Some(Reservation::Completed(record)) = answers.into_iter().next() else {
                unreachable!("neither acquired nor in flight is completed");
            };
            let mut outcome = Outcome::Replayed;
            if !record.fingerprint().matches(&fingerprint) {
                if settings.on_mismatch == OnMismatch::Reject {
                    return Prelude::Respond(reject(settings, Rejection::Mismatch, grpc));
                }
                outcome = Outcome::MismatchAcked;
            }
            return Prelude::Respond(duplicate(record, settings, grpc, outcome));
        }

        if let Some(ids) = items {
            let (mut new, mut before) = (Vec::new(), Vec::new());
            for (id, answer) in ids.into_iter().zip(answers.iter()) {
                match answer {
                    Reservation::Acquired => new.push(id),
                    _ => before.push(id),
                }
            }
            let batch = BatchItems::new(new, before);
            parts.extensions.insert(batch.clone());
            guard.set_items(batch);
        }
        guard.keep(&answers);
        // The key goes to the inner service only: a duplicate or a rejection never reads it.
        parts.extensions.insert(key);
        Prelude::Call {
            request: Request::from_parts(parts, body),
            guard: Some(guard),
            outcome: Outcome::First,
        }
    }
}

/// The fingerprint of the first key held by another attempt, if any.
fn in_flight(answers: &[Reservation]) -> Option<Fingerprint> {
    answers.iter().find_map(|a| match a {
        Reservation::InFlight { fingerprint } => Some(*fingerprint),
        _ => None,
    })
}

fn store_failure<B, ResBody>(
    err: crate::store::StoreError,
    settings: &Settings,
    mut parts: http::request::Parts,
    body: RequestBody<B>,
    key: IdempotencyKey,
    grpc: bool,
) -> Prelude<B, ResBody> {
    match settings.failure_mode {
        FailureMode::Closed => {
            tracing::error!(error = %err, "idempotency store error; failing closed");
            Prelude::Respond(reject(
                settings,
                Rejection::StoreUnavailable {
                    retry_after: settings.store_retry_after,
                },
                grpc,
            ))
        }
        FailureMode::Open => {
            tracing::error!(error = %err, "idempotency store error; failing open");
            parts.extensions.insert(key);
            Prelude::Call {
                request: Request::from_parts(parts, body),
                guard: None,
                outcome: Outcome::FailOpen,
            }
        }
    }
}

/// The answer to a duplicate of a completed key: the replay when one was recorded, else the
/// acknowledgement.
fn duplicate<B>(
    record: Record,
    settings: &Settings,
    grpc: bool,
    outcome: Outcome,
) -> Response<ResponseBody<B>> {
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
    response.extensions_mut().insert(outcome);
    response
}
