//! The demo's inbox: `POST /inbox/email` answers at once (202), workers in this process apply
//! the email events later, with retries and dead letters; `GET /inbox`, `GET /inbox/dead` and
//! `POST /inbox/dead/{event_id}/retry` show and steer them.
//!
//! `INBOX_WORKERS` (default 2; 0 receives only), `INBOX_MAX_ATTEMPTS` (5),
//! `INBOX_RETRY_BASE_MS` (200), `INBOX_LEASE_MS` (10 000). The inbox is held in memory, whatever
//! the record store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{StatusCode, header::CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};
use tower_idempotency::inbox::{
    Backoff, InboxRequest, InboxRoute, InboxStore, MemoryInbox, Worker,
};
use tower_idempotency::key::JsonPathKey;
use tower_idempotency::order::{EventOrder, TimestampAt};
use tower_idempotency::store::AnyStore;

use super::{AppState, Error, Settings, webhook_layer};

/// What `INBOX_*` sets.
struct InboxSettings {
    workers: usize,
    max_attempts: u32,
    retry_base: Duration,
    lease: Duration,
}

impl InboxSettings {
    fn from_env() -> Result<Self, Error> {
        let number = |name: &str, default: u64| -> Result<u64, Error> {
            match std::env::var(name).ok().filter(|v| !v.is_empty()) {
                Some(value) => Ok(value.parse()?),
                None => Ok(default),
            }
        };
        Ok(InboxSettings {
            workers: usize::try_from(number("INBOX_WORKERS", 2)?)?,
            max_attempts: u32::try_from(number("INBOX_MAX_ATTEMPTS", 5)?)?,
            retry_base: Duration::from_millis(number("INBOX_RETRY_BASE_MS", 200)?),
            lease: Duration::from_millis(number("INBOX_LEASE_MS", 10_000)?),
        })
    }
}

/// The inbox routes, and the workers started in the background.
pub(super) fn routes(
    store: &AnyStore,
    settings: &Settings,
    state: &AppState,
) -> Result<Router, Error> {
    let env = InboxSettings::from_env()?;
    let inbox = MemoryInbox::default();
    let order = EventOrder::new(
        JsonPathKey::new("$.message_id")?,
        TimestampAt::new("$.occurred_at")?,
    );
    let layer = webhook_layer(store, settings, "inbox-email", 72)
        .key(JsonPathKey::new("$.event_id")?)
        .order(order)
        .inbox(InboxRoute::new(inbox.clone()).keep_headers([CONTENT_TYPE]));
    if env.workers > 0 {
        let worker = Worker::new(inbox.clone(), apply(state.clone()))
            .namespace("inbox-email")
            .workers(env.workers)
            .lease(env.lease)
            .retention(Duration::from_secs(72 * 3600))
            .retry(Backoff::new(env.retry_base).max_attempts(env.max_attempts));
        tokio::spawn(worker.run(std::future::pending()));
    }
    // Inbox mode never calls the route's handler: the workers apply the entries.
    let unreachable = || async { StatusCode::INTERNAL_SERVER_ERROR };
    Ok(Router::new()
        .route("/inbox/email", post(unreachable).route_layer(layer))
        .route("/inbox", get(counts))
        .route("/inbox/dead", get(dead_letters))
        .route("/inbox/dead/{event_id}/retry", post(retry))
        .with_state(inbox))
}

/// The workers' handler: the email event's effect, as `/webhooks/email` applies it.
/// `demo_fail_attempts: N` fails the first N attempts, `demo_delay_ms: N` sleeps first.
fn apply(
    state: AppState,
) -> impl tower::Service<InboxRequest, Response = (), Error = String, Future: Send> + Clone + Send {
    // Attempts per event id in this process, across re-queues: "the first N attempts fail".
    let attempts = Arc::new(Mutex::new(HashMap::<String, u64>::new()));
    tower::service_fn(move |request: InboxRequest| {
        let (state, attempts) = (state.clone(), attempts.clone());
        async move {
            let event: Value = serde_json::from_slice(request.body()).unwrap_or_default();
            if let Some(ms) = event["demo_delay_ms"].as_u64() {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            let fail = event["demo_fail_attempts"].as_u64().unwrap_or(0);
            let id = event["event_id"].as_str().unwrap_or_default().to_owned();
            let attempt = {
                let mut attempts = attempts.lock().unwrap();
                let count = attempts.entry(id).or_default();
                *count += 1;
                *count
            };
            if attempt <= fail {
                return Err(format!("demo failure: attempt {attempt} of {fail} failing"));
            }
            let (Some(event_id), Some(message_id), Some(kind)) = (
                event["event_id"].as_str(),
                event["message_id"].as_str(),
                event["type"].as_str(),
            ) else {
                return Err("event_id, message_id and type are required".to_owned());
            };
            state.record_item(event_id);
            state.set_status(message_id, kind);
            Ok(())
        }
    })
}

async fn counts(State(inbox): State<MemoryInbox>) -> Response {
    match inbox.counts().await {
        Ok(c) => Json(json!({"pending": c.pending, "in_flight": c.in_flight, "dead": c.dead}))
            .into_response(),
        Err(error) => (StatusCode::SERVICE_UNAVAILABLE, error.to_string()).into_response(),
    }
}

/// The dead letters' event ids, attempts and last errors.
async fn dead_letters(State(inbox): State<MemoryInbox>) -> Response {
    match inbox.dead_letters(1_000).await {
        Ok(dead) => {
            let listed: Vec<Value> = dead
                .iter()
                .map(|letter| {
                    json!({
                        "event_id": event_id(&letter.entry.body),
                        "attempts": letter.entry.attempts,
                        "last_error": letter.last_error,
                    })
                })
                .collect();
            Json(Value::from(listed)).into_response()
        }
        Err(error) => (StatusCode::SERVICE_UNAVAILABLE, error.to_string()).into_response(),
    }
}

/// Re-queues the dead letter of `event_id`: 202, or 404 when it is not dead.
async fn retry(State(inbox): State<MemoryInbox>, Path(wanted): Path<String>) -> Response {
    let dead = inbox.dead_letters(usize::MAX).await.unwrap_or_default();
    let found = dead
        .iter()
        .find(|letter| event_id(&letter.entry.body) == Some(wanted.clone()));
    let requeued = match found {
        Some(letter) => inbox.requeue(&letter.entry.key).await.unwrap_or(false),
        None => false,
    };
    match requeued {
        true => (
            StatusCode::ACCEPTED,
            Json(json!({"ok": true, "requeued": wanted})),
        )
            .into_response(),
        false => (
            StatusCode::NOT_FOUND,
            Json(json!({"error": "no such dead letter"})),
        )
            .into_response(),
    }
}

fn event_id(body: &[u8]) -> Option<String> {
    let event: Value = serde_json::from_slice(body).ok()?;
    event["event_id"].as_str().map(str::to_owned)
}
