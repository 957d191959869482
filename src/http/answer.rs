//! The layer's own answers, in place of the inner service's: a rejection (rendered by the
//! layer's [`RenderRejection`](crate::http::rejection::RenderRejection)), a duplicate (the
//! acknowledgement or the replay) and a stale event's acknowledgement. Each carries its
//! [`Outcome`] in the response extensions (and a rejection its [`Rejection`]).

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Response, StatusCode};

use crate::claim::outcome::Outcome;
use crate::http::body::ResponseBody;
use crate::http::config::Settings;
use crate::http::rejection::{Rejection, grpc_status};
use crate::order::{IDEMPOTENT_STALE, Position};
use crate::store::record::Record;

/// `Idempotent-Replayed`: the header set (to `true`) on every answer the layer gives in place
/// of the inner service to a duplicate.
pub(crate) const IDEMPOTENT_REPLAYED: http::HeaderName =
    http::HeaderName::from_static("idempotent-replayed");

/// The `grpc-status` of a duplicate whose reply could not be kept: `ALREADY_EXISTS`.
const GRPC_ALREADY_EXISTS: u8 = 6;

/// The `grpc-status` of a stale event: `FAILED_PRECONDITION` (a gRPC client cannot read an
/// empty `OK` as the reply of a unary call).
const GRPC_FAILED_PRECONDITION: u8 = 9;

/// The answer to `rejection`, as the layer renders rejections.
pub(crate) fn reject<B>(
    settings: &Settings,
    rejection: Rejection,
    grpc: bool,
) -> Response<ResponseBody<B>> {
    let outcome = match &rejection {
        Rejection::InFlight { .. } => Outcome::InFlight,
        Rejection::ObjectInFlight { .. } => Outcome::ObjectInFlight,
        Rejection::Mismatch => Outcome::Mismatch,
        Rejection::StoreUnavailable { .. } => Outcome::StoreError,
        Rejection::Unverified(err) => Outcome::Unverified(err.kind().code()),
        other => Outcome::Rejected(other.code()),
    };
    let mut response = settings
        .reply
        .render_rejection
        .render(&rejection, grpc)
        .map(|body| ResponseBody::buffered(body, None));
    let extensions = response.extensions_mut();
    extensions.insert(outcome);
    extensions.insert(rejection);
    response
}

/// The answer to a duplicate of a completed key: the replay when one was recorded, else the
/// acknowledgement; `Idempotent-Replayed: true` either way.
pub(crate) fn duplicate<B>(
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
        // No reply was recorded (it exceeded the response buffer limit). An empty OK response
        // would fail a unary client ("missing response message") and pass an empty stream off
        // as the original one: ALREADY_EXISTS tells the client the call already took effect.
        None if grpc => grpc_status(
            GRPC_ALREADY_EXISTS,
            "this call already succeeded; its reply was too large to keep for replay",
        )
        .map(|body| ResponseBody::buffered(body, None)),
        None => {
            let (status, content_type, body) = settings.reply.ack.parts();
            let mut response = Response::new(ResponseBody::buffered(body.clone(), None));
            *response.status_mut() = status;
            response
                .headers_mut()
                .insert(CONTENT_TYPE, content_type.clone());
            response
        }
    };
    response
        .headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response.extensions_mut().insert(outcome);
    response
}

/// The answer to a stale event: `200 {"ok":true,"stale":true}` with `Idempotent-Stale: true`
/// (`FAILED_PRECONDITION` for gRPC), logged at info with the positions.
pub(crate) fn stale<B>(
    settings: &Settings,
    grpc: bool,
    position: Position,
    watermark: Position,
) -> Response<ResponseBody<B>> {
    // Positions as the route reads them: RFC 3339 for timestamps, else the number.
    let show = |at: Position| match settings.order.as_deref() {
        Some(order) => order.show(at),
        None => at.to_string(),
    };
    tracing::info!(
        namespace = settings.claim.policy.observer.namespace(),
        position = %show(position),
        watermark = %show(watermark),
        "stale event: older than what was processed for its object; acknowledged"
    );
    let mut response = if grpc {
        let message = "this event is older than the newest one processed for its object";
        grpc_status(GRPC_FAILED_PRECONDITION, message)
    } else {
        let mut response = Response::new(Bytes::from_static(br#"{"ok":true,"stale":true}"#));
        *response.status_mut() = StatusCode::OK;
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    }
    .map(|body| ResponseBody::buffered(body, None));
    response
        .headers_mut()
        .insert(IDEMPOTENT_STALE, HeaderValue::from_static("true"));
    response.extensions_mut().insert(Outcome::Stale);
    response
}
