//! The layer's own answers: RFC 9457 `application/problem+json` responses for HTTP, and
//! trailers-only responses with a proper `grpc-status` for gRPC requests.
//!
//! | rejection | HTTP | gRPC |
//! |---|---|---|
//! | [`Rejection::PayloadTooLarge`] | 413 | `RESOURCE_EXHAUSTED` (8) |
//! | [`Rejection::BodyTimeout`] | 408 | `DEADLINE_EXCEEDED` (4) |
//! | [`Rejection::BodyUnreadable`] | 400 | `INVALID_ARGUMENT` (3) |
//! | [`Rejection::Unverified`] | 401 | `UNAUTHENTICATED` (16) |
//! | [`Rejection::MissingKey`] | 400 | `INVALID_ARGUMENT` (3) |
//! | [`Rejection::MalformedKey`] | 400 | `INVALID_ARGUMENT` (3) |
//! | [`Rejection::MalformedOrder`] | 400 | `INVALID_ARGUMENT` (3) |
//! | [`Rejection::InFlight`] | 409 + `Retry-After` | `ABORTED` (10) |
//! | [`Rejection::ObjectInFlight`] | 409 + `Retry-After` | `ABORTED` (10) |
//! | [`Rejection::Mismatch`] | 422 | `FAILED_PRECONDITION` (9) |
//! | [`Rejection::StoreUnavailable`] | 503 + `Retry-After` | `UNAVAILABLE` (14) |
//!
//! The problem document's `type` is a URL of the page that explains each rejection
//! (`docs/problems.md` in the repository, one anchor per code): set another base with
//! [`ProblemJson::with_type_base`] to point at your own API's documentation.
//!
//! ```
//! use http::StatusCode;
//! use tower_idempotency::rejection::Rejection;
//!
//! let rejection = Rejection::PayloadTooLarge { limit: 1024 };
//! assert_eq!(rejection.status(), StatusCode::PAYLOAD_TOO_LARGE);
//! assert_eq!(rejection.code(), "payload_too_large");
//! ```
//!
//! The answers are rendered by a [`RenderRejection`], [`ProblemJson`] by default; set your own
//! with [`IdempotencyLayer::render_rejection`](crate::IdempotencyLayer::render_rejection) to
//! answer in your API's error format. Every answer carries the [`Rejection`] in its response
//! extensions, for logging or metrics in an outer middleware.
//!
//! ```
//! use bytes::Bytes;
//! use http::{Response, header::CONTENT_TYPE};
//! use tower_idempotency::{IdempotencyLayer, MemoryStore};
//! use tower_idempotency::rejection::{ProblemJson, RenderRejection, Rejection};
//!
//! // Our API answers errors as `{"error": {"code": .., "message": ..}}`; gRPC stays standard.
//! let layer = IdempotencyLayer::api(MemoryStore::new()).render_rejection(
//!     |rejection: &Rejection, grpc: bool| -> Response<Bytes> {
//!         if grpc {
//!             return ProblemJson::default().render(rejection, grpc);
//!         }
//!         let body = serde_json::json!({
//!             "error": {"code": rejection.code(), "message": rejection.detail()}
//!         });
//!         let mut response = Response::new(Bytes::from(body.to_string()));
//!         *response.status_mut() = rejection.status();
//!         response.headers_mut().insert(CONTENT_TYPE, "application/json".parse().unwrap());
//!         response
//!     },
//! );
//! ```

use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

use crate::key::KeyError;
use crate::verify::VerifyError;

/// Where the problem types are explained by default: one anchor per rejection code.
pub(crate) const DEFAULT_TYPE_BASE: &str =
    "https://github.com/tower-idempotency/tower-idempotency/blob/main/docs/problems.md#";

/// Renders the layer's own answers. Implemented by [`ProblemJson`] (the default) and by every
/// `Fn(&Rejection, bool) -> Response<Bytes>` closure.
///
/// `grpc` is true when the request was a gRPC call: the answer should then be a gRPC status
/// (a trailers-only response), since a gRPC client cannot read an HTTP error body. The layer
/// keeps `Retry-After` as rendered, and adds the [`Rejection`] to the response extensions.
pub trait RenderRejection: Send + Sync + 'static {
    /// The response for `rejection`.
    fn render(&self, rejection: &Rejection, grpc: bool) -> Response<Bytes>;
}

impl<F> RenderRejection for F
where
    F: Fn(&Rejection, bool) -> Response<Bytes> + Send + Sync + 'static,
{
    fn render(&self, rejection: &Rejection, grpc: bool) -> Response<Bytes> {
        self(rejection, grpc)
    }
}

/// The default [`RenderRejection`]: RFC 9457 `application/problem+json` for HTTP (with
/// `Retry-After` for 409 and 503), a trailers-only response with `grpc-status` and
/// `grpc-message` for gRPC.
///
/// By default a problem's `type` is
/// `https://github.com/tower-idempotency/tower-idempotency/blob/main/docs/problems.md#`
/// followed by the rejection's code; [`with_type_base`](Self::with_type_base) changes the base.
///
/// ```
/// use tower_idempotency::rejection::{ProblemJson, Rejection, RenderRejection};
///
/// let ours = ProblemJson::with_type_base("https://api.example.com/problems/");
/// let response = ours.render(&Rejection::Mismatch, false);
/// let doc: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
/// assert_eq!(doc["type"], "https://api.example.com/problems/mismatch");
/// ```
#[derive(Clone, Debug, Default)]
pub struct ProblemJson {
    /// `None`: `DEFAULT_TYPE_BASE`.
    type_base: Option<std::sync::Arc<str>>,
}

impl ProblemJson {
    /// Problem documents whose `type` is `base` followed by the rejection's code.
    pub fn with_type_base(base: impl Into<String>) -> Self {
        ProblemJson {
            type_base: Some(base.into().into()),
        }
    }
}

impl RenderRejection for ProblemJson {
    fn render(&self, rejection: &Rejection, grpc: bool) -> Response<Bytes> {
        if grpc {
            rejection.grpc_response()
        } else {
            let base = self.type_base.as_deref().unwrap_or(DEFAULT_TYPE_BASE);
            rejection.http_response(base)
        }
    }
}

/// Why the layer answered instead of the inner service.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Rejection {
    /// The body is larger than the layer's limit (by `Content-Length`, or while reading).
    PayloadTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The body did not arrive within the body read timeout.
    BodyTimeout,
    /// Reading the body failed (the client reset the stream, a malformed chunked encoding).
    BodyUnreadable,
    /// The request's signature did not verify (missing, malformed, not matching, or a
    /// timestamp outside the tolerance): no key was extracted, nothing was claimed.
    Unverified(VerifyError),
    /// The request carries no idempotency key and the layer requires one.
    MissingKey {
        /// Where the key was expected (`in the X-GitHub-Delivery header`), when the key
        /// extractor says.
        expected: Option<String>,
    },
    /// The key is malformed: too long, control characters, body not JSON, wrong JSON type.
    MalformedKey(KeyError),
    /// On a route that orders events: the event's object or position is missing or malformed.
    MalformedOrder(KeyError),
    /// Another request with the same key is still being processed.
    InFlight {
        /// When to retry.
        retry_after: Duration,
    },
    /// On a route that orders events: another event of the same object is still being
    /// processed.
    ObjectInFlight {
        /// When to retry.
        retry_after: Duration,
    },
    /// The key was used before with a different payload.
    Mismatch,
    /// The store could not be reached or timed out; the layer fails closed.
    StoreUnavailable {
        /// When to retry.
        retry_after: Duration,
    },
}

impl Rejection {
    /// The HTTP status of the rejection.
    pub fn status(&self) -> StatusCode {
        match self {
            Rejection::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Rejection::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Rejection::BodyUnreadable
            | Rejection::MissingKey { .. }
            | Rejection::MalformedKey(_)
            | Rejection::MalformedOrder(_) => StatusCode::BAD_REQUEST,
            Rejection::Unverified(_) => StatusCode::UNAUTHORIZED,
            Rejection::InFlight { .. } | Rejection::ObjectInFlight { .. } => StatusCode::CONFLICT,
            Rejection::Mismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Rejection::StoreUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// A stable machine-readable code, also sent as the `code` member of the problem document
    /// and used as the `reason` label of metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Rejection::PayloadTooLarge { .. } => "payload_too_large",
            Rejection::BodyTimeout => "body_timeout",
            Rejection::BodyUnreadable => "body_unreadable",
            Rejection::Unverified(_) => "unverified",
            Rejection::MissingKey { .. } => "missing_key",
            Rejection::MalformedKey(_) => "malformed_key",
            Rejection::MalformedOrder(_) => "malformed_order",
            Rejection::InFlight { .. } => "in_flight",
            Rejection::ObjectInFlight { .. } => "object_in_flight",
            Rejection::Mismatch => "mismatch",
            Rejection::StoreUnavailable { .. } => "store_unavailable",
        }
    }

    /// The gRPC status code of the rejection.
    pub(crate) fn grpc_code(&self) -> u8 {
        match self {
            Rejection::PayloadTooLarge { .. } => 8,
            Rejection::BodyTimeout => 4,
            Rejection::BodyUnreadable
            | Rejection::MissingKey { .. }
            | Rejection::MalformedKey(_)
            | Rejection::MalformedOrder(_) => 3,
            Rejection::Unverified(_) => 16,
            Rejection::InFlight { .. } | Rejection::ObjectInFlight { .. } => 10,
            Rejection::Mismatch => 9,
            Rejection::StoreUnavailable { .. } => 14,
        }
    }

    fn title(&self) -> &'static str {
        match self {
            Rejection::PayloadTooLarge { .. } => "Request body too large",
            Rejection::BodyTimeout => "Request body timed out",
            Rejection::BodyUnreadable => "Request body unreadable",
            Rejection::Unverified(_) => "Request signature not verified",
            Rejection::MissingKey { .. } => "Idempotency key missing",
            Rejection::MalformedKey(_) => "Idempotency key malformed",
            Rejection::MalformedOrder(_) => "Event order unreadable",
            Rejection::InFlight { .. } => "Request in progress",
            Rejection::ObjectInFlight { .. } => "Another event of the object in progress",
            Rejection::Mismatch => "Idempotency key reused with a different payload",
            Rejection::StoreUnavailable { .. } => "Idempotency store unavailable",
        }
    }

    /// What went wrong, for the `detail` member (never echoes the key or the body).
    pub fn detail(&self) -> String {
        match self {
            Rejection::PayloadTooLarge { limit } => {
                format!("the request body is larger than the limit of {limit} bytes")
            }
            Rejection::BodyTimeout => {
                "the request body did not arrive within the read timeout".to_owned()
            }
            Rejection::BodyUnreadable => "the request body could not be read".to_owned(),
            Rejection::MissingKey { expected: None } => {
                "the request carries no idempotency key".to_owned()
            }
            Rejection::MissingKey {
                expected: Some(expected),
            } => format!("the request carries no idempotency key; it was expected {expected}"),
            Rejection::Unverified(err) => format!("the request was not verified: {err}"),
            Rejection::MalformedKey(err) => err.to_string(),
            Rejection::MalformedOrder(err) => err.to_string(),
            Rejection::InFlight { .. } => {
                "a request with the same idempotency key is still being processed; retry later"
                    .to_owned()
            }
            Rejection::ObjectInFlight { .. } => "another event of the same object is still being \
                                                 processed; retry later"
                .to_owned(),
            Rejection::Mismatch => "the idempotency key was already used with a different \
                                    request payload"
                .to_owned(),
            Rejection::StoreUnavailable { .. } => "the idempotency store is unavailable, so the \
                                                   request was not processed; retry later"
                .to_owned(),
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            Rejection::InFlight { retry_after }
            | Rejection::ObjectInFlight { retry_after }
            | Rejection::StoreUnavailable { retry_after } => Some(*retry_after),
            _ => None,
        }
    }

    /// The problem document (RFC 9457) of the rejection, its `type` under `type_base`.
    #[cfg(test)]
    pub(crate) fn problem_json(&self, type_base: &str) -> String {
        problem_document(self.problem(), type_base)
    }

    /// The HTTP response: problem+json (its `type` under `type_base`), with `Retry-After`
    /// where retrying helps.
    pub(crate) fn http_response(&self, type_base: &str) -> Response<Bytes> {
        let mut response = problem_response(self.problem(), type_base);
        if let Some(after) = self.retry_after() {
            response
                .headers_mut()
                .insert(RETRY_AFTER, retry_after_value(after));
        }
        response
    }

    fn problem(&self) -> Problem {
        Problem {
            status: self.status(),
            code: self.code(),
            title: self.title(),
            detail: self.detail(),
        }
    }

    /// The gRPC response: a trailers-only response (HTTP 200, `grpc-status` and `grpc-message`
    /// in the headers), which every gRPC client decodes as a status.
    pub(crate) fn grpc_response(&self) -> Response<Bytes> {
        let mut message = self.detail();
        let after = self.retry_after();
        if let Some(after) = after {
            message.push_str(&format!(" (retry after {} s)", retry_secs(after)));
        }
        let mut response = grpc_status(self.grpc_code(), &message);
        if let Some(after) = after {
            response
                .headers_mut()
                .insert("retry-after", retry_after_value(after));
        }
        response
    }
}

/// What a problem document (RFC 9457) says: the crate's one form of it, for the layer's
/// rejections and the inbox's admin service alike.
pub(crate) struct Problem {
    pub(crate) status: StatusCode,
    /// A stable code: the document's `code`, and the anchor of its `type`.
    pub(crate) code: &'static str,
    pub(crate) title: &'static str,
    /// What was wrong with this request (never a key or a body).
    pub(crate) detail: String,
}

/// The problem document of `problem`, its `type` the code under `type_base`.
pub(crate) fn problem_document(problem: Problem, type_base: &str) -> String {
    serde_json::json!({
        "type": format!("{type_base}{}", problem.code),
        "title": problem.title,
        "status": problem.status.as_u16(),
        "detail": problem.detail,
        "code": problem.code,
    })
    .to_string()
}

/// The `application/problem+json` response of `problem`.
pub(crate) fn problem_response(problem: Problem, type_base: &str) -> Response<Bytes> {
    let status = problem.status;
    let mut response = Response::new(Bytes::from(problem_document(problem, type_base)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}

/// A trailers-only gRPC response with status `code` and `message` (percent-encoded): the
/// layer's every gRPC answer that is not a replay.
pub(crate) fn grpc_status(code: u8, message: &str) -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from(i32::from(code)));
    if let Ok(value) = HeaderValue::from_str(&percent_encode(message)) {
        headers.insert("grpc-message", value);
    }
    response
}

fn retry_secs(after: Duration) -> u64 {
    // Retry-After is in whole seconds; never advertise 0 for a real wait.
    after.as_secs() + u64::from(after.subsec_nanos() > 0)
}

fn retry_after_value(after: Duration) -> HeaderValue {
    HeaderValue::from(retry_secs(after))
}

/// Percent-encodes a `grpc-message` as the gRPC HTTP/2 protocol asks.
fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/problems.md`, where every problem `type` points, has a section for every code
    /// and a table row with its HTTP status and gRPC code.
    #[test]
    fn every_problem_type_is_documented() {
        use crate::key::KeyErrorKind;
        use crate::verify::VerifyError;
        const GRPC: [&str; 17] = [
            "OK",
            "CANCELLED",
            "UNKNOWN",
            "INVALID_ARGUMENT",
            "DEADLINE_EXCEEDED",
            "NOT_FOUND",
            "ALREADY_EXISTS",
            "PERMISSION_DENIED",
            "RESOURCE_EXHAUSTED",
            "FAILED_PRECONDITION",
            "ABORTED",
            "OUT_OF_RANGE",
            "UNIMPLEMENTED",
            "INTERNAL",
            "UNAVAILABLE",
            "DATA_LOSS",
            "UNAUTHENTICATED",
        ];
        let docs = include_str!("../../docs/problems.md");
        let wait = Duration::from_secs(1);
        let key = || KeyError::new(KeyErrorKind::Empty, "empty");
        let every = [
            Rejection::PayloadTooLarge { limit: 1 },
            Rejection::BodyTimeout,
            Rejection::BodyUnreadable,
            Rejection::Unverified(VerifyError::no_match()),
            Rejection::MissingKey { expected: None },
            Rejection::MalformedKey(key()),
            Rejection::MalformedOrder(key()),
            Rejection::InFlight { retry_after: wait },
            Rejection::ObjectInFlight { retry_after: wait },
            Rejection::Mismatch,
            Rejection::StoreUnavailable { retry_after: wait },
        ];
        for rejection in every {
            // A new variant stops this from compiling until it is listed: the reminder to add
            // it to `every` too.
            match rejection {
                Rejection::PayloadTooLarge { .. }
                | Rejection::BodyTimeout
                | Rejection::BodyUnreadable
                | Rejection::Unverified(_)
                | Rejection::MissingKey { .. }
                | Rejection::MalformedKey(_)
                | Rejection::MalformedOrder(_)
                | Rejection::InFlight { .. }
                | Rejection::ObjectInFlight { .. }
                | Rejection::Mismatch
                | Rejection::StoreUnavailable { .. } => {}
            }
            let code = rejection.code();
            assert!(
                docs.contains(&format!("\n## {code}\n")),
                "no section for {code}"
            );
            let row = format!(
                "| [`{code}`](#{code}) | {} | `{}` |",
                rejection.status().as_u16(),
                GRPC[usize::from(rejection.grpc_code())]
            );
            assert!(docs.contains(&row), "no row {row}");
        }
    }

    #[test]
    fn problem_json_has_the_rfc_9457_members() {
        let doc: serde_json::Value = serde_json::from_str(
            &Rejection::InFlight {
                retry_after: Duration::from_millis(1500),
            }
            .problem_json(DEFAULT_TYPE_BASE),
        )
        .unwrap();
        assert_eq!(doc["status"], 409);
        assert_eq!(doc["code"], "in_flight");
        assert_eq!(doc["type"], format!("{DEFAULT_TYPE_BASE}in_flight"));
        assert!(doc["title"].is_string() && doc["detail"].is_string());
    }

    #[test]
    fn retry_after_rounds_up() {
        let response = Rejection::StoreUnavailable {
            retry_after: Duration::from_millis(1500),
        }
        .http_response(DEFAULT_TYPE_BASE);
        assert_eq!(response.headers()[RETRY_AFTER], "2");
    }

    #[test]
    fn grpc_rejection_is_trailers_only() {
        let response = Rejection::PayloadTooLarge { limit: 10 }.grpc_response();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["grpc-status"], "8");
        assert_eq!(percent_encode("a%b\u{e9}"), "a%25b%C3%A9");
    }
}
