//! The service's answers: its JSON, and its refusals as problem documents.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{ALLOW, CONTENT_TYPE};
use http::{HeaderValue, Method, Response, StatusCode};
use http_body_util::Full;
use serde_json::{Map, Value, json};

use super::params::{seal_cursor, state_name};
use crate::http::rejection::{DEFAULT_TYPE_BASE, Problem, Rejection, problem_response};
use crate::inbox::{Attempt, AttemptOutcome, EntryInfo, InboxCounts, Page};
use crate::store::StoreError;

/// Why the service answers with a problem document.
#[derive(Debug)]
pub(super) enum Refusal {
    /// A query parameter, a key or a cursor is malformed (400).
    BadParameter(String),
    /// A `POST` while actions are disabled (403).
    ActionsDisabled,
    /// A `POST` that needs a valid anti-forgery token (a browser's, or one with a body that is
    /// not JSON) without one (403).
    Forgery,
    /// No endpoint at this path (404).
    NoPath,
    /// The inbox knows no entry of this key or id (404).
    NoEntry,
    /// The key's entry is not a dead letter (404).
    NotDead,
    /// The endpoint takes another method (405).
    Method { allow: Method },
    /// The request body is over the limit (413).
    TooLarge { limit: usize },
    /// The request body could not be read (400).
    Unreadable,
    /// The inbox failed (503).
    Store(StoreError),
}

impl From<StoreError> for Refusal {
    fn from(error: StoreError) -> Self {
        Refusal::Store(error)
    }
}

/// The problem codes of the service's own refusals (each a section of docs/problems.md).
pub(super) const CODES: [&str; 5] = [
    "admin_bad_parameter",
    "admin_actions_disabled",
    "admin_not_found",
    "admin_method_not_allowed",
    "admin_forgery",
];

impl Refusal {
    /// The problem+json answer.
    pub(super) fn response(self) -> Response<Full<Bytes>> {
        let (status, code, title, detail) = match self {
            Refusal::BadParameter(detail) => {
                (StatusCode::BAD_REQUEST, CODES[0], "Bad parameter", detail)
            }
            Refusal::ActionsDisabled => (
                StatusCode::FORBIDDEN,
                CODES[1],
                "Actions disabled",
                "this admin service is read-only: its actions are not enabled".to_owned(),
            ),
            Refusal::Forgery => (
                StatusCode::FORBIDDEN,
                CODES[4],
                "Anti-forgery token missing or invalid",
                "a browser's POST, or one with a body that is not JSON, needs the page's token \
                 (form field `csrf` or header `x-csrf-token`): reload the page and try again; \
                 a script without a browser sends no body, or a JSON one"
                    .to_owned(),
            ),
            Refusal::NoPath => not_found("no such endpoint"),
            Refusal::NoEntry => not_found("the inbox knows no entry of this key"),
            Refusal::NotDead => not_found("the entry of this key is not a dead letter"),
            Refusal::Method { allow } => {
                let detail = format!("this endpoint answers {allow} only");
                let problem = problem(
                    StatusCode::METHOD_NOT_ALLOWED,
                    CODES[3],
                    "Method not allowed",
                    detail,
                );
                let mut response = problem;
                if let Ok(allow) = HeaderValue::from_str(allow.as_str()) {
                    response.headers_mut().insert(ALLOW, allow);
                }
                return response;
            }
            Refusal::TooLarge { limit } => return layer(Rejection::PayloadTooLarge { limit }),
            Refusal::Unreadable => return layer(Rejection::BodyUnreadable),
            Refusal::Store(error) => {
                // Reads too: a store failing behind the page is seen in the log, not only as a
                // 503 in a browser.
                tracing::warn!(%error, "inbox admin: the inbox could not be read or written");
                let retry_after = Duration::from_secs(1);
                return layer(Rejection::StoreUnavailable { retry_after });
            }
        };
        problem(status, code, title, detail)
    }
}

fn not_found(detail: &str) -> (StatusCode, &'static str, &'static str, String) {
    (
        StatusCode::NOT_FOUND,
        CODES[2],
        "Not found",
        detail.to_owned(),
    )
}

fn problem(
    status: StatusCode,
    code: &'static str,
    title: &'static str,
    detail: String,
) -> Response<Full<Bytes>> {
    let problem = Problem {
        status,
        code,
        title,
        detail,
    };
    problem_response(problem, DEFAULT_TYPE_BASE).map(Full::new)
}

/// A refusal the layer also gives, as the layer words it.
fn layer(rejection: Rejection) -> Response<Full<Bytes>> {
    rejection.http_response(DEFAULT_TYPE_BASE).map(Full::new)
}

/// 200 with `answer`.
pub(super) fn ok(answer: &Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(answer.to_string())));
    let json = HeaderValue::from_static("application/json");
    response.headers_mut().insert(CONTENT_TYPE, json);
    response
}

/// `GET /counts`.
pub(super) fn counts(counts: &InboxCounts, paused: bool) -> Value {
    json!({
        "pending": counts.pending,
        "in_flight": counts.in_flight,
        "dead": counts.dead,
        "oldest_age_ms": counts.oldest_age.map(millis),
        "paused": paused,
    })
}

/// `GET /entries`: the page, its `next` sealed.
pub(super) fn page(page: &Page, bodies: bool) -> Value {
    let entries: Vec<Value> = page
        .entries
        .iter()
        .map(|info| entry(info, bodies))
        .collect();
    json!({"entries": entries, "next": page.next.as_deref().map(seal_cursor)})
}

/// One entry as the module's documentation shows it.
pub(super) fn entry(info: &EntryInfo, bodies: bool) -> Value {
    let entry = &info.entry;
    let order = entry.order.as_ref();
    let mut out = json!({
        "key": entry.key.as_str(),
        "id": entry.id,
        "route": entry.route,
        "state": state_name(info.state),
        "correlation_id": entry.correlation_id,
        "attempts": entry.attempts,
        "enqueued_at": at(entry.enqueued_at),
        "next_attempt_at": at(entry.next_attempt_at),
        "until": info.until.map(at),
        "last_error": info.last_error,
        "object": order.map(|order| order.object.as_str()),
        "position": order.map(|order| order.position.to_string()),
        "history": info.history.iter().map(attempt).collect::<Vec<_>>(),
    });
    if bodies {
        let headers: Map<String, Value> = (entry.headers.iter())
            .map(|(name, value)| {
                let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
                (name.as_str().to_owned(), Value::from(value))
            })
            .collect();
        out["body"] = std::str::from_utf8(&entry.body).map_or(Value::Null, Value::from);
        out["body_bytes"] = Value::from(entry.body.len());
        out["headers"] = Value::Object(headers);
    }
    out
}

fn attempt(attempt: &Attempt) -> Value {
    let (outcome, error) = match &attempt.outcome {
        AttemptOutcome::Running => ("running", None),
        AttemptOutcome::Succeeded => ("succeeded", None),
        AttemptOutcome::Failed(error) => ("failed", Some(error.as_str())),
        AttemptOutcome::LeaseLost => ("lease_lost", None),
    };
    json!({
        "number": attempt.number,
        "started_at": at(attempt.started_at),
        "duration_ms": attempt.duration.map(millis),
        "outcome": outcome,
        "error": error,
        "worker": attempt.worker,
    })
}

/// Milliseconds since the Unix epoch.
fn at(time: SystemTime) -> u64 {
    millis(time.duration_since(UNIX_EPOCH).unwrap_or_default())
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/problems.md, where every problem `type` points, has a section for each code.
    #[test]
    fn every_refusal_is_documented() {
        let docs = include_str!("../../../docs/problems.md");
        for code in CODES {
            assert!(
                docs.contains(&format!("\n## {code}\n")),
                "no section for {code}"
            );
        }
    }
}
