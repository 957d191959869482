//! The life of one covered request, in the order it happens, each phase a short function with
//! one job and a verdict between them:
//!
//! 1. **read**: the body, bounded by the layer's limit and timeout
//!    ([`read_request`](crate::http::body::read_request)), when something needs it (the fingerprint,
//!    the verifier, a key or an order in the body);
//! 2. **verify**: the signature over the exact bytes ([`verify`]), before anything else
//!    looks at the request: an unverified request never reaches the key, the store or the
//!    inner service;
//! 3. **key**: the idempotency key, the fingerprint and, on ordered routes, each event's
//!    object and position ([`key::derive`]), as the store will see them ([`Targets`]);
//! 4. **claim**: the atomic reserve, and what its answers mean ([`claim::claim`]): call the
//!    inner service, or answer now (a duplicate, a conflict, a stale event, a store failure);
//! 5. **call**: the inner service, driven by the [`ResponseFuture`](crate::ResponseFuture)
//!    while the claim's lease is renewed;
//! 6. **settle**: success or failure decided by the one classifier, then the claim recorded or
//!    released ([`settle::finish`], and the streamed body for responses too large to hold).
//!
//! Phases 1 to 4 make the [`Prelude`]: one future, boxed once per request (small enough for
//! the allocator's per-thread cache); the request they claim travels in a box of its own
//! ([`claim::Claiming`]), so that no async step keeps a copy of it.
//!
//! [`Targets`]: crate::claim::guard::Targets

pub(crate) mod claim;
pub(crate) mod enqueue;
pub(crate) mod key;
pub(crate) mod settle;

use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;

use crate::claim::guard::{ClaimGuard, ClaimStore};
use crate::claim::outcome::Outcome;
use crate::http::answer::reject;
use crate::http::body::{RequestBody, ResponseBody, read_request};
use crate::http::config::{Intake, MissingKey, Settings};
use crate::http::rejection::Rejection;
use crate::inbox::route::InboxRoute;
use crate::key::ExtractKey;
use crate::store::BoxError;

/// What the phases of a request read from its layer: the claims (on the layer's store), the
/// key extractor and the settings. The layer builds it; the service hands it to every request.
#[derive(Clone)]
pub(crate) struct Config<K> {
    pub(crate) claims: ClaimStore,
    pub(crate) extractor: K,
    pub(crate) settings: Arc<Settings>,
    /// Inbox mode: enqueue in place of claim and call.
    pub(crate) inbox: Option<InboxRoute>,
}

/// What the phases before the call decided: answer now, or call the inner service.
pub(crate) enum Prelude<B, ResBody> {
    Respond(Response<ResponseBody<ResBody>>),
    Call {
        request: Request<RequestBody<B>>,
        /// The claim to settle once the inner service answered: `None` when the request runs
        /// unprotected (pass-through, fail open).
        guard: Option<ClaimGuard>,
        /// The outcome when the inner service succeeds: `First`, `Stale` (a stale event
        /// passed on), `PassThrough`, `FailOpen`.
        outcome: Outcome,
    },
}

impl<B, ResBody> Prelude<B, ResBody> {
    /// Answers `rejection`.
    pub(crate) fn reject(settings: &Settings, rejection: Rejection, grpc: bool) -> Self {
        Prelude::Respond(reject(settings, rejection, grpc))
    }

    /// Calls the inner service with `parts` and `body`, unprotected.
    fn unprotected(parts: Parts, body: RequestBody<B>, outcome: Outcome) -> Self {
        Prelude::Call {
            request: Request::from_parts(parts, body),
            guard: None,
            outcome,
        }
    }
}

/// Phases 1 to 4: read, verify, key, claim. An async block rather than an async fn: the block
/// holds what it was handed once, where an async fn would keep its arguments and their moved
/// copies side by side.
#[expect(clippy::manual_async_fn, reason = "an async fn's future is larger")]
pub(crate) fn prelude<K, B, ResBody>(
    config: Arc<Config<K>>,
    parts: Parts,
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
        // Inbox mode stores the body: it is read whole.
        let needs_body = config.extractor.needs_body() || config.inbox.is_some();
        let (body, data) = match read(settings, needs_body, body).await {
            Ok(read) => read,
            Err(rejection) => return Prelude::reject(settings, rejection, grpc),
        };
        if let Err(rejection) = verify(&settings.intake, &parts, data.as_ref()) {
            return Prelude::reject(settings, rejection, grpc);
        }
        let derived = match key::derive(&config.extractor, settings, &parts, data.as_ref()) {
            Ok(Some(derived)) => derived,
            Ok(None) => return missing_key(settings, &config.extractor, parts, body, grpc),
            Err(rejection) => return Prelude::reject(settings, rejection, grpc),
        };
        if let (Some(route), Some(data)) = (&config.inbox, data) {
            // Boxed: awaited inline, the enqueue's future (its entry, its timer) would size
            // the prelude of every route, inbox or not, past the allocator's per-thread cache.
            return Box::pin(enqueue::enqueue(
                route, settings, &parts, data, derived, grpc,
            ))
            .await;
        }
        let request = Box::new(claim::Claiming {
            parts,
            body,
            derived,
        });
        claim::claim(&config.claims, settings, request, grpc).await
    }
}

/// Phase 1: the body the inner service will get and, when it had to be read whole, its bytes.
async fn read<B>(
    settings: &Settings,
    key_needs_body: bool,
    body: B,
) -> Result<(RequestBody<B>, Option<Bytes>), Rejection>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    if !settings.buffers(key_needs_body) {
        return Ok((RequestBody::limited(body, settings.intake.body_limit), None));
    }
    let collected = read_request(
        body,
        settings.intake.body_limit,
        settings.intake.body_timeout,
    )
    .await?;
    let (data, trailers) = collected.into_boxed_parts();
    Ok((
        RequestBody::buffered_boxed(data.clone(), trailers),
        Some(data),
    ))
}

/// Phase 2: the signature, over the exact bytes that arrived. Why it failed is logged at
/// debug, without the signature, the secret or the body (the outcome's line, at warn, is
/// throttled: anyone can send forgeries).
fn verify(intake: &Intake, parts: &Parts, data: Option<&Bytes>) -> Result<(), Rejection> {
    let Some(verifier) = &intake.verifier else {
        return Ok(());
    };
    let body = data.map_or(&[][..], |data| &data[..]);
    verifier.verify(parts, body).map_err(|err| {
        tracing::debug!(reason = err.kind().code(), detail = %err, "request signature not verified");
        Rejection::Unverified(err)
    })
}

/// A request without a key: rejected, or passed through unprotected, as configured.
fn missing_key<K: ExtractKey, B, ResBody>(
    settings: &Settings,
    extractor: &K,
    parts: Parts,
    body: RequestBody<B>,
    grpc: bool,
) -> Prelude<B, ResBody> {
    match settings.intake.missing_key {
        MissingKey::Reject => {
            let expected = extractor.expected();
            Prelude::reject(settings, Rejection::MissingKey { expected }, grpc)
        }
        MissingKey::PassThrough => Prelude::unprotected(parts, body, Outcome::PassThrough),
    }
}
