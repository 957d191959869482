//! The demo's inbox: `POST /inbox/email` answers at once (202), workers in this process apply
//! the email events later, with retries and dead letters; `GET /inbox`, `GET /inbox/dead` and
//! `POST /inbox/dead/{event_id}/retry` show and steer them.
//!
//! `INBOX_WORKERS` (default 2; 0 receives only), `INBOX_MAX_ATTEMPTS` (5),
//! `INBOX_RETRY_BASE_MS` (200), `INBOX_LEASE_MS` (10 000). The inbox is kept on the demo's
//! store (see `email_inbox.rs`), so that `inbox_worker` processes can apply its entries too.
//!
//! The inbox's admin service is mounted at `/admin/inbox`: its reads are open (a real
//! application puts them behind its login too); its actions (re-queue, discard, pause, resume)
//! are enabled only when `ADMIN_TOKEN` is set, and then each needs `Authorization: Bearer
//! <ADMIN_TOKEN>` or, from a browser, the cookie `admin_token=<ADMIN_TOKEN>`, checked by the
//! application's own middleware (`require_token`), which names the actor for the service's
//! log lines. The page is at `/admin/inbox` (set the cookie in the browser's developer tools
//! to act from it; its forms carry the service's anti-forgery token).

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, COOKIE, WWW_AUTHENTICATE};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};
use tower_idempotency::inbox::{AdminService, AnyInbox, InboxAdmin, InboxLayer, InboxStore};
use tower_idempotency::key::JsonPathKey;
use tower_idempotency::order::{EventOrder, PositionAt};
use tower_idempotency::store::StoreKey;

/// The inbox route's path, and so the scope of its keys.
const ROUTE: &str = "/inbox/email";

use super::email_inbox::{self, Effects, InboxSettings};
use super::{AppState, Error, Settings};

/// The inbox routes, and the workers started in the background.
pub(super) fn routes(
    settings: &Settings,
    state: &AppState,
    inbox: AnyInbox,
) -> Result<Router, Error> {
    let env = InboxSettings::from_env().map_err(|err| -> Error { err })?;
    let order = EventOrder::new(
        JsonPathKey::new("$.message_id")?,
        PositionAt::timestamp("$.occurred_at")?,
    );
    // The door of the inbox: no record store; the inbox's retention is the workers'
    // (`email_inbox::RETENTION`).
    let layer = InboxLayer::new(inbox.clone())
        .namespace(email_inbox::NAMESPACE)
        .body_timeout(settings.body_timeout)
        .key(JsonPathKey::new("$.event_id")?)
        .order(order)
        .keep_headers([CONTENT_TYPE]);
    if env.workers > 0 {
        let effects = match &state.table {
            Some(table) => (**table).clone(),
            None => in_process(state.clone()),
        };
        let worker = env.worker(inbox.clone(), effects);
        tokio::spawn(worker.run(std::future::pending()));
    }
    // Inbox mode never calls the route's handler: the workers apply the entries.
    let unreachable = || async { StatusCode::INTERNAL_SERVER_ERROR };
    Ok(Router::new()
        .route(ROUTE, post(unreachable).route_layer(layer))
        .route("/inbox", get(counts))
        .route("/inbox/dead", get(dead_letters))
        .route("/inbox/dead/{event_id}/retry", post(retry))
        .with_state(inbox.clone())
        .merge(admin(inbox)))
}

/// The header the demo's authentication sets to name who acts (and removes from requests).
const ACTOR: HeaderName = HeaderName::from_static("x-admin-actor");

/// The inbox's admin service at `/admin/inbox`, behind `require_token`.
fn admin(inbox: AnyInbox) -> Router {
    let token: Option<Arc<str>> = std::env::var("ADMIN_TOKEN")
        .ok()
        .filter(|token| !token.is_empty())
        .map(Arc::from);
    let service = AdminService::new(inbox)
        .actions(token.is_some())
        .actor_header(ACTOR)
        // A discarded dead letter's key is kept as long as the workers keep done keys.
        .retention(email_inbox::RETENTION)
        // `GET /admin/inbox/entries/by-id/{event_id}`: the inbox route's keys.
        .route(email_inbox::NAMESPACE, Some(ROUTE));
    Router::new()
        .nest_service("/admin/inbox", service)
        .layer(from_fn_with_state(token, require_token))
}

/// The application's own authentication of the admin service: reads pass; an action needs
/// `Authorization: Bearer <ADMIN_TOKEN>` or the cookie `admin_token=<ADMIN_TOKEN>` (401
/// without), and is then done as the actor `admin-token`. Without `ADMIN_TOKEN` actions pass
/// to the service, which refuses them (403).
async fn require_token(
    State(token): State<Option<Arc<str>>>,
    mut request: Request,
    next: Next,
) -> Response {
    // Only this middleware names the actor.
    request.headers_mut().remove(ACTOR);
    if let (Some(token), false) = (token, request.method() == Method::GET) {
        let headers = request.headers();
        let given = headers.get(AUTHORIZATION).map(HeaderValue::as_bytes);
        let bearer = given.and_then(|value| value.strip_prefix(b"Bearer "));
        let cookie = (headers.get_all(COOKIE).iter())
            .flat_map(|value| value.as_bytes().split(|&b| b == b';'))
            .find_map(|pair| pair.trim_ascii().strip_prefix(b"admin_token="));
        let bearer = bearer.or(cookie);
        if !bearer.is_some_and(|bearer| same(bearer, token.as_bytes())) {
            let challenge = [(WWW_AUTHENTICATE, "Bearer")];
            return (
                StatusCode::UNAUTHORIZED,
                challenge,
                "a bearer token (or the cookie admin_token) is needed\n",
            )
                .into_response();
        }
        let actor = HeaderValue::from_static("admin-token");
        request.headers_mut().insert(ACTOR, actor);
    }
    next.run(request).await
}

/// Whether `a` and `b` are equal, in a time that does not tell where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// The email event's effect in this process, as `/webhooks/email` applies it.
fn in_process(state: AppState) -> Effects {
    Effects::Process(Arc::new(move |event_id, message_id, status| {
        state.record_item(event_id);
        state.set_status(message_id, status);
    }))
}

async fn counts(State(inbox): State<AnyInbox>) -> Response {
    match inbox.counts().await {
        Ok(c) => Json(json!({"pending": c.pending, "in_flight": c.in_flight, "dead": c.dead}))
            .into_response(),
        Err(error) => (StatusCode::SERVICE_UNAVAILABLE, error.to_string()).into_response(),
    }
}

/// The dead letters' event ids, attempts and last errors.
async fn dead_letters(State(inbox): State<AnyInbox>) -> Response {
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
async fn retry(State(inbox): State<AnyInbox>, Path(wanted): Path<String>) -> Response {
    // The delivery's store key: its id within the route's namespace and scope (the route's
    // path, `Scope::path`, the default).
    let key = StoreKey::new(email_inbox::NAMESPACE, Some(ROUTE), &wanted);
    let requeued = inbox.requeue(&key).await.unwrap_or(false);
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
