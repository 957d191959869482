//! Phase 4 of a route in inbox mode: **enqueue** in place of claim and call. The key becomes
//! `queued` in the same atomic step that stores the entry; the sender is answered at once.

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Response};

use super::Prelude;
use super::key::Derived;
use crate::claim::guard::{OneOrMany, Targets};
use crate::claim::outcome::Outcome;
use crate::http::answer::{IDEMPOTENT_REPLAYED, reject};
use crate::http::config::{AckResponse, Settings};
use crate::http::rejection::Rejection;
use crate::inbox::route::InboxRoute;
use crate::inbox::{Enqueued, IDEMPOTENCY_CORRELATION_ID, InboxEntry};
use crate::key::{KeyError, KeyErrorKind};
use crate::store::{StoreErrorKind, Target, Token};

/// The longest correlation id taken from a request header; a longer one is replaced.
const MAX_CORRELATION_LEN: usize = 200;

/// Stores the delivery as an entry and answers: the accepted answer, the duplicate's ack, or
/// 503 + `Retry-After` when the inbox could not take it (nothing acknowledged that was not
/// stored).
pub(crate) async fn enqueue<B, ResBody>(
    route: &InboxRoute,
    settings: &Settings,
    parts: &Parts,
    data: Bytes,
    derived: Derived,
    grpc: bool,
) -> Prelude<B, ResBody> {
    let correlation = correlation_id(route, parts);
    if let Some(span) = crate::claim::observe::request_span() {
        span.record("correlation_id", correlation.as_str());
    }
    let id = derived.key.as_str();
    let namespace = settings.claim.policy.observer.namespace();
    let entry = match entry_of(route, parts, data, derived.targets, &correlation) {
        Ok(entry) => Ok(entry.with_delivery(namespace, id)),
        Err(rejection) => Err(rejection),
    };
    let entry = match entry {
        Ok(entry) => entry,
        Err(rejection) => return Prelude::reject(settings, rejection, grpc),
    };
    let position = entry.order.as_ref().map(|order| order.position);
    let enqueued =
        match tokio::time::timeout(settings.claim.policy.store_timeout, route.enqueue(entry)).await
        {
            Ok(result) => result,
            Err(_elapsed) => Err(crate::store::StoreError::new(StoreErrorKind::Timeout)),
        };
    let mut response = match enqueued {
        Ok(Enqueued::Queued) => answer(&route.accepted, Outcome::Queued),
        // Older than what its object's entries already applied: answered as on the synchronous
        // route, not queued.
        Ok(Enqueued::Stale(watermark)) => {
            let position = position.unwrap_or(watermark);
            crate::http::answer::stale(settings, grpc, position, watermark)
        }
        Ok(Enqueued::Duplicate(_)) => {
            let mut response = answer(&settings.reply.ack, Outcome::Replayed);
            let replayed = HeaderValue::from_static("true");
            response.headers_mut().insert(IDEMPOTENT_REPLAYED, replayed);
            response
        }
        Err(error) => {
            tracing::warn!(%error, "inbox: the entry could not be stored");
            let retry_after = settings.claim.store_retry_after;
            reject(settings, Rejection::StoreUnavailable { retry_after }, grpc)
        }
    };
    if let Ok(value) = HeaderValue::from_str(&correlation) {
        response
            .headers_mut()
            .insert(IDEMPOTENCY_CORRELATION_ID, value);
    }
    Prelude::Respond(response)
}

/// The entry of one delivery: one key (an inbox route takes no batches), ordered or not.
fn entry_of(
    route: &InboxRoute,
    parts: &Parts,
    data: Bytes,
    targets: Targets,
    correlation: &str,
) -> Result<InboxEntry, Rejection> {
    let mut headers = HeaderMap::new();
    for name in &route.keep_headers {
        for value in parts.headers.get_all(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    let entry = |key| InboxEntry::new(key, data.clone(), correlation).with_headers(headers.clone());
    let one = match targets {
        OneOrMany::One(target) => Some(target),
        OneOrMany::Many(mut events) if events.len() == 1 && events[0].order.is_some() => {
            events.pop()
        }
        OneOrMany::Many(_) => None,
    };
    match one {
        Some(Target {
            key,
            order: Some(order),
        }) => Ok(entry(key).ordered_by(order)),
        Some(target) => Ok(entry(target.key)),
        None => Err(Rejection::MalformedKey(KeyError::new(
            KeyErrorKind::TooManyParts,
            "an inbox route takes one key per delivery, not a batch",
        ))),
    }
}

/// The request's correlation header when it is short visible text, else a generated id.
fn correlation_id(route: &InboxRoute, parts: &Parts) -> String {
    let given = parts.headers.get(&route.correlation_header);
    match given.and_then(|value| value.to_str().ok()) {
        Some(text) if !text.is_empty() && text.len() <= MAX_CORRELATION_LEN => text.to_owned(),
        // 32 hex digits in one allocation (not a `format!` per byte).
        _ => crate::util::hex(Token::random().as_bytes()),
    }
}

/// An answer of the inbox with `outcome` in its extensions.
fn answer<ResBody>(
    ack: &AckResponse,
    outcome: Outcome,
) -> Response<crate::http::body::ResponseBody<ResBody>> {
    let (status, content_type, body) = ack.parts();
    let mut response = Response::new(crate::http::body::ResponseBody::buffered(
        body.clone(),
        None,
    ));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, content_type.clone());
    response.extensions_mut().insert(outcome);
    response
}
