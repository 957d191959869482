//! The layer's own answers: RFC 9457 `application/problem+json` responses for HTTP, and
//! trailers-only responses with a proper `grpc-status` for gRPC requests.
//!
//! | rejection | HTTP | gRPC |
//! |---|---|---|
//! | [`Rejection::PayloadTooLarge`] | 413 | `RESOURCE_EXHAUSTED` (8) |
//! | [`Rejection::BodyTimeout`] | 408 | `DEADLINE_EXCEEDED` (4) |
//! | [`Rejection::BodyUnreadable`] | 400 | `INVALID_ARGUMENT` (3) |
//! | [`Rejection::MissingKey`] | 400 | `INVALID_ARGUMENT` (3) |
//! | [`Rejection::MalformedKey`] | 400 | `INVALID_ARGUMENT` (3) |
//! | [`Rejection::InFlight`] | 409 + `Retry-After` | `ABORTED` (10) |
//! | [`Rejection::Mismatch`] | 422 | `FAILED_PRECONDITION` (9) |
//! | [`Rejection::StoreUnavailable`] | 503 + `Retry-After` | `UNAVAILABLE` (14) |
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
//!             return ProblemJson.render(rejection, grpc);
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

use crate::body::ResponseBody;
use crate::key::KeyError;

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
#[derive(Clone, Copy, Debug, Default)]
pub struct ProblemJson;

impl RenderRejection for ProblemJson {
    fn render(&self, rejection: &Rejection, grpc: bool) -> Response<Bytes> {
        if grpc {
            rejection.grpc_response()
        } else {
            rejection.http_response()
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
    /// The request carries no idempotency key and the layer requires one.
    MissingKey {
        /// Where the key was expected (`in the X-GitHub-Delivery header`), when the key
        /// extractor says.
        expected: Option<String>,
    },
    /// The key is malformed: too long, control characters, body not JSON, wrong JSON type.
    MalformedKey(KeyError),
    /// Another request with the same key is still being processed.
    InFlight {
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
            | Rejection::MalformedKey(_) => StatusCode::BAD_REQUEST,
            Rejection::InFlight { .. } => StatusCode::CONFLICT,
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
            Rejection::MissingKey { .. } => "missing_key",
            Rejection::MalformedKey(_) => "malformed_key",
            Rejection::InFlight { .. } => "in_flight",
            Rejection::Mismatch => "mismatch",
            Rejection::StoreUnavailable { .. } => "store_unavailable",
        }
    }

    /// The gRPC status code of the rejection.
    pub fn grpc_code(&self) -> u8 {
        match self {
            Rejection::PayloadTooLarge { .. } => 8,
            Rejection::BodyTimeout => 4,
            Rejection::BodyUnreadable
            | Rejection::MissingKey { .. }
            | Rejection::MalformedKey(_) => 3,
            Rejection::InFlight { .. } => 10,
            Rejection::Mismatch => 9,
            Rejection::StoreUnavailable { .. } => 14,
        }
    }

    fn title(&self) -> &'static str {
        match self {
            Rejection::PayloadTooLarge { .. } => "Request body too large",
            Rejection::BodyTimeout => "Request body timed out",
            Rejection::BodyUnreadable => "Request body unreadable",
            Rejection::MissingKey { .. } => "Idempotency key missing",
            Rejection::MalformedKey(_) => "Idempotency key malformed",
            Rejection::InFlight { .. } => "Request in progress",
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
            Rejection::MalformedKey(err) => err.to_string(),
            Rejection::InFlight { .. } => {
                "a request with the same idempotency key is still being processed; retry later"
                    .to_owned()
            }
            Rejection::Mismatch => "the idempotency key was already used with a different \
                                    request payload"
                .to_owned(),
            Rejection::StoreUnavailable { .. } => "the idempotency store is unavailable, so the \
                                                   request was not processed; retry later"
                .to_owned(),
        }
    }

    /// The name of the variant, as rustdoc anchors it (`#variant.MissingKey`).
    fn variant(&self) -> &'static str {
        match self {
            Rejection::PayloadTooLarge { .. } => "PayloadTooLarge",
            Rejection::BodyTimeout => "BodyTimeout",
            Rejection::BodyUnreadable => "BodyUnreadable",
            Rejection::MissingKey { .. } => "MissingKey",
            Rejection::MalformedKey(_) => "MalformedKey",
            Rejection::InFlight { .. } => "InFlight",
            Rejection::Mismatch => "Mismatch",
            Rejection::StoreUnavailable { .. } => "StoreUnavailable",
        }
    }

    /// The problem `type`: the documentation of the rejection's variant.
    pub fn type_uri(&self) -> String {
        format!(
            "https://docs.rs/tower-idempotency/latest/tower_idempotency/rejection/enum.Rejection.html#variant.{}",
            self.variant()
        )
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            Rejection::InFlight { retry_after } | Rejection::StoreUnavailable { retry_after } => {
                Some(*retry_after)
            }
            _ => None,
        }
    }

    /// The problem document (RFC 9457) of the rejection.
    pub fn problem_json(&self) -> String {
        let status = self.status();
        serde_json::json!({
            "type": self.type_uri(),
            "title": self.title(),
            "status": status.as_u16(),
            "detail": self.detail(),
            "code": self.code(),
        })
        .to_string()
    }

    /// The HTTP response: problem+json, with `Retry-After` where retrying helps.
    pub fn into_response<B>(self) -> Response<ResponseBody<B>> {
        self.http_response()
            .map(|body| ResponseBody::buffered(body, None))
    }

    /// The gRPC response: a trailers-only response (HTTP 200, `grpc-status` and `grpc-message`
    /// in the headers), which every gRPC client decodes as a status.
    pub fn into_grpc_response<B>(self) -> Response<ResponseBody<B>> {
        self.grpc_response()
            .map(|body| ResponseBody::buffered(body, None))
    }

    fn http_response(&self) -> Response<Bytes> {
        let mut response = Response::new(Bytes::from(self.problem_json()));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(after) = self.retry_after() {
            headers.insert(RETRY_AFTER, retry_after_value(after));
        }
        response
    }

    fn grpc_response(&self) -> Response<Bytes> {
        let mut response = Response::new(Bytes::new());
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert(
            "grpc-status",
            HeaderValue::from(i32::from(self.grpc_code())),
        );
        let mut message = self.detail();
        if let Some(after) = self.retry_after() {
            message.push_str(&format!(" (retry after {} s)", retry_secs(after)));
            headers.insert("retry-after", retry_after_value(after));
        }
        if let Ok(value) = HeaderValue::from_str(&percent_encode(&message)) {
            headers.insert("grpc-message", value);
        }
        response
    }
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

    #[test]
    fn problem_json_has_the_rfc_9457_members() {
        let doc: serde_json::Value = serde_json::from_str(
            &Rejection::InFlight {
                retry_after: Duration::from_millis(1500),
            }
            .problem_json(),
        )
        .unwrap();
        assert_eq!(doc["status"], 409);
        assert_eq!(doc["code"], "in_flight");
        assert!(
            doc["type"]
                .as_str()
                .unwrap()
                .ends_with("enum.Rejection.html#variant.InFlight")
        );
        assert!(doc["title"].is_string() && doc["detail"].is_string());
    }

    #[test]
    fn retry_after_rounds_up() {
        let response = Rejection::StoreUnavailable {
            retry_after: Duration::from_millis(1500),
        }
        .into_response::<()>();
        assert_eq!(response.headers()[RETRY_AFTER], "2");
    }

    #[test]
    fn grpc_rejection_is_trailers_only() {
        let response = Rejection::PayloadTooLarge { limit: 10 }.into_grpc_response::<()>();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["grpc-status"], "8");
        assert_eq!(percent_encode("a%b\u{e9}"), "a%25b%C3%A9");
    }
}
