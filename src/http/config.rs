//! The configuration of a layer: the settings every service and future of one
//! [`IdempotencyLayer`](crate::IdempotencyLayer) shares, and the public policy types its
//! builder methods take. A leaf: it names the plug-in traits and value types it holds, and
//! builds nothing.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderName, HeaderValue, Method, StatusCode};

use crate::claim::policy::Policy;
use crate::defaults;
use crate::http::classify::Classifier;
use crate::http::rejection::{ProblemJson, RenderRejection};
use crate::order::EventOrder;
use crate::verify::VerifyRequest;

/// What to do with a covered request that carries no key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MissingKey {
    /// Answer 400 problem+json (the default): a request that should be protected is not
    /// processed unprotected. On a [`OnceLayer`](crate::once::OnceLayer):
    /// [`OnceError::MissingKey`](crate::OnceError::MissingKey).
    #[default]
    Reject,
    /// Pass the request to the inner service without protection.
    PassThrough,
}

/// How a duplicate of a completed key is answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// The configured acknowledgement (default `200 {"ok":true,"duplicate":true}`): what
    /// webhook senders need. Records cost a few bytes.
    #[default]
    Ack,
    /// The original status, allow-listed headers, body and trailers: what API clients need
    /// (the retry of a `POST /orders` gets the same order id). Responses larger than the
    /// response buffer limit are recorded as ack only. gRPC replies up to that limit are
    /// always recorded for replay, since a gRPC client cannot decode an HTTP acknowledgement;
    /// duplicates of a larger gRPC reply get `ALREADY_EXISTS`.
    Replay,
}

/// What to do when a key is reused with a different payload fingerprint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnMismatch {
    /// Answer 422 problem+json (the default, as the IETF draft and Stripe do).
    #[default]
    Reject,
    /// Answer like a duplicate and log a warning (some webhook senders change a timestamp
    /// field between retries).
    Ack,
}

/// What to do when the store cannot be reached or times out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailureMode {
    /// Answer 503 with `Retry-After` (the default): the sender retries later, nothing is
    /// processed unprotected.
    #[default]
    Closed,
    /// Pass the request to the inner service without protection, logging an error.
    Open,
}

/// The per-request part of the key scope, on top of the layer's namespace.
///
/// The default is [`Scope::path`]: one layer on a router never mixes the keys of two routes.
#[derive(Clone)]
pub struct Scope(ScopeKind);

type ScopeFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

#[derive(Clone)]
enum ScopeKind {
    None,
    Path,
    Header(HeaderName),
    Fn(ScopeFn),
}

impl Scope {
    /// No per-request scope: keys are scoped by the namespace only.
    pub fn none() -> Self {
        Scope(ScopeKind::None)
    }

    /// The request path (without the query): the default.
    pub fn path() -> Self {
        Scope(ScopeKind::Path)
    }

    /// The value of a header, such as a tenant id (`x-tenant-id`). Requests without it share
    /// the "no tenant" scope. An error when `name` is not a valid header name.
    pub fn header(name: &str) -> Result<Self, crate::ConfigError> {
        let name = HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
            .map_err(|_| crate::key::InvalidHeaderName::new(name))?;
        Ok(Scope(ScopeKind::Header(name)))
    }

    /// Any function of the request head.
    pub fn from_fn(f: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        Scope(ScopeKind::Fn(Arc::new(f)))
    }

    /// The scope of one request, borrowed from it when possible (it is only hashed).
    pub(crate) fn of<'a>(&self, parts: &'a Parts) -> Option<Cow<'a, str>> {
        match &self.0 {
            ScopeKind::None => None,
            ScopeKind::Path => Some(Cow::Borrowed(parts.uri.path())),
            ScopeKind::Header(name) => parts
                .headers
                .get(name)
                .map(|v| String::from_utf8_lossy(v.as_bytes())),
            ScopeKind::Fn(f) => f(parts).map(Cow::Owned),
        }
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            ScopeKind::None => f.write_str("Scope::none()"),
            ScopeKind::Path => f.write_str("Scope::path()"),
            ScopeKind::Header(name) => write!(f, "Scope::header({name:?})"),
            ScopeKind::Fn(_) => f.write_str("Scope::from_fn(..)"),
        }
    }
}

/// The answer to a duplicate in [`Mode::Ack`].
#[derive(Clone, Debug)]
pub struct AckResponse {
    status: StatusCode,
    content_type: HeaderValue,
    body: Bytes,
}

impl AckResponse {
    /// An acknowledgement with `status`, `content_type` and `body`.
    pub fn new(status: StatusCode, content_type: HeaderValue, body: impl Into<Bytes>) -> Self {
        AckResponse {
            status,
            content_type,
            body: body.into(),
        }
    }

    pub(crate) fn parts(&self) -> (StatusCode, &HeaderValue, &Bytes) {
        (self.status, &self.content_type, &self.body)
    }
}

impl Default for AckResponse {
    /// `200 application/json {"ok":true,"duplicate":true}`.
    fn default() -> Self {
        AckResponse::new(
            StatusCode::OK,
            HeaderValue::from_static("application/json"),
            Bytes::from_static(br#"{"ok":true,"duplicate":true}"#),
        )
    }
}

/// Everything but the store and the key extractor; shared by every service and future of a
/// layer. Grouped by who reads it: the intake, the claim, the reply (and the order, which all
/// three read).
#[derive(Clone, Default)]
pub(crate) struct Settings {
    /// What the phases before the claim read: which requests, how they are read, verified
    /// and keyed (`phase::mod`, `phase::key`).
    pub(crate) intake: Intake,
    /// Orders the events of each object.
    pub(crate) order: Option<Arc<EventOrder>>,
    /// What the claim phase reads: the claims' policy, and how it answers what it meets
    /// (`phase::claim`, and the inbox's enqueue).
    pub(crate) claim: ClaimRules,
    /// What the settlement and the answers read (`phase::settle`, `answer`).
    pub(crate) reply: Replies,
}

/// How a request is met before its claim.
#[derive(Clone)]
pub(crate) struct Intake {
    /// Checks each request's signature before its key is extracted.
    pub(crate) verifier: Option<Arc<dyn VerifyRequest>>,
    pub(crate) scope: Scope,
    pub(crate) body_limit: usize,
    pub(crate) body_timeout: Option<Duration>,
    pub(crate) missing_key: MissingKey,
    pub(crate) methods: Option<Vec<Method>>,
    /// Whether a payload is fingerprinted (a mismatch under a known key is then detected).
    pub(crate) fingerprint: bool,
}

impl Intake {
    /// Whether requests with `method` are protected.
    pub(crate) fn covers(&self, method: &Method) -> bool {
        match &self.methods {
            Some(methods) => methods.contains(method),
            None => !matches!(
                *method,
                Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
            ),
        }
    }
}

impl Default for Intake {
    fn default() -> Self {
        Intake {
            verifier: None,
            scope: Scope::path(),
            body_limit: defaults::BODY_LIMIT,
            body_timeout: None,
            missing_key: MissingKey::Reject,
            methods: None,
            fingerprint: true,
        }
    }
}

/// What a claim needs, and how the claim phase answers what it meets.
#[derive(Clone)]
pub(crate) struct ClaimRules {
    /// Lease, retention, store timeout, wait, observer.
    pub(crate) policy: Policy,
    pub(crate) on_mismatch: OnMismatch,
    pub(crate) failure_mode: FailureMode,
    pub(crate) in_flight_retry_after: Duration,
    pub(crate) store_retry_after: Duration,
}

impl Default for ClaimRules {
    fn default() -> Self {
        ClaimRules {
            policy: Policy::default(),
            on_mismatch: OnMismatch::Reject,
            failure_mode: FailureMode::Closed,
            in_flight_retry_after: Duration::from_secs(1),
            store_retry_after: Duration::from_secs(5),
        }
    }
}

/// What the answers are made of.
#[derive(Clone)]
pub(crate) struct Replies {
    pub(crate) mode: Mode,
    pub(crate) ack: AckResponse,
    pub(crate) replay_headers: Vec<HeaderName>,
    pub(crate) response_buffer_limit: usize,
    pub(crate) classifier: Classifier,
    pub(crate) render_rejection: Arc<dyn RenderRejection>,
}

impl Default for Replies {
    fn default() -> Self {
        Replies {
            mode: Mode::Ack,
            ack: AckResponse::default(),
            replay_headers: [
                "content-type",
                "content-language",
                "location",
                "etag",
                "last-modified",
            ]
            .into_iter()
            .map(HeaderName::from_static)
            .collect(),
            response_buffer_limit: defaults::RESPONSE_BUFFER_LIMIT,
            classifier: Classifier::default(),
            render_rejection: Arc::new(ProblemJson::default()),
        }
    }
}

impl Settings {
    /// Whether covered requests are read whole before their key is extracted: to fingerprint
    /// them, to verify them, or because the key or the order is in the body.
    pub(crate) fn buffers(&self, key_needs_body: bool) -> bool {
        self.intake.fingerprint
            || key_needs_body
            || self.intake.verifier.is_some()
            || self.order.as_ref().is_some_and(|order| order.needs_body())
    }
}
