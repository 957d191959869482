//! A webhook receiver that applies every delivery exactly once.
//!
//! ```text
//! cargo run --example webhook_receiver --features metrics,verify,admin     # the memory store
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example webhook_receiver --all-features
//! ```
//!
//! Binds `127.0.0.1:3000`, or `BIND` (`BIND=127.0.0.1:0` picks a free port); the first line on
//! stdout is `listening on http://ADDR`, the second names the store. The store is the embedded
//! memory store, or the one `REDIS_URL` names (`redis://127.0.0.1:6379`, `redis-cluster://..`,
//! `redis-sentinel://..`), or `DATABASE_URL` (`postgres://user@host/db`, `sqlite://receiver.db`):
//! see `tower_idempotency::store::connect`.
//!
//! Routes (all `POST` routes are protected; each shares the one store and the one effect
//! counter):
//! - `POST /webhooks/kalipto`: keyed by `X-Kalipto-Delivery-Id`; kept 7 days. Verified
//!   (`X-Hub-Signature-256`) when `KALIPTO_WEBHOOK_SECRET` is set.
//! - `POST /webhooks/meta`: **one key per message**: every WhatsApp message id (wamid) and
//!   Instagram mid of the batch is claimed and recorded on its own, and the handler applies only
//!   the new ones; a batch without message ids (WhatsApp status callbacks: sent, delivered,
//!   read) falls back to `X-Kalipto-Delivery-Id`. Kept 72 hours. Verified
//!   (`X-Hub-Signature-256`, the app secret) when `META_APP_SECRET` is set.
//! - `POST /webhooks/sangho`: keyed by `Sangho-Event-ID`, else the body's `$.id`; kept 72
//!   hours (Sangho never redelivers after 48). Verified (`Sangho-Signature: t=..,v1=..`, 5
//!   minutes) when `SANGHO_WEBHOOK_SECRET` is set.
//! - `POST /webhooks/standard`: a Standard Webhooks sender (`webhook-*` headers, or `svix-*` as
//!   Svix, Clerk and Resend send them): keyed by the signed `svix-id` or `webhook-id`, verified
//!   with the `whsec_` secrets and `whpk_` public keys of `STANDARD_WEBHOOKS_SECRET`
//!   (space-separated; default the specification's test secret
//!   `whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw`).
//! - `POST /webhooks/github`: keyed by `X-GitHub-Delivery`, verified (`X-Hub-Signature-256`)
//!   with `GITHUB_WEBHOOK_SECRET` (default GitHub's documented test secret, `It's a Secret to
//!   Everybody`).
//! - `POST /webhooks/email`: keyed by `$.event_id`, **ordered**: per `$.message_id`, by
//!   `$.occurred_at` (RFC 3339). An event older than the newest one processed for its message
//!   is acknowledged as stale (`Idempotent-Stale: true`) without the handler: it has no effect,
//!   and the message's status never moves back. A body without `message_id` or `occurred_at`
//!   is 400; the handler answers 422 without `type`.
//! - `POST /api/orders`: the API profile (replay mode, `Idempotency-Key`, 422 when a key is
//!   reused with another payload); answers 201 with an order id.
//! - `GET /effects`: `{"total": N, "by_key": {"<id>": count}}` of side effects performed
//!   (`by_key` holds message ids for Meta batches, delivery or event ids elsewhere).
//! - `GET /messages/{message_id}`: `{"message_id": .., "status": ..}`, the status the newest
//!   processed email event set.
//! - `GET /metrics`: Prometheus text with the layer's `idempotency_*` metrics.
//! - `POST /inbox/email`: the body of `/webhooks/email` in **inbox mode**: 202 at once (200 with
//!   `Idempotent-Replayed: true` on a duplicate), both with `Idempotency-Correlation-Id` (the
//!   request's `X-Request-Id`, else generated); workers in this process apply it later, in
//!   order per message, with retries (`demo_fail_attempts: N` in the body fails the first N
//!   attempts, `demo_delay_ms: N` sleeps first). `GET /inbox`, `GET /inbox/dead` and
//!   `POST /inbox/dead/{event_id}/retry` show and re-queue; `INBOX_WORKERS` (2; 0 receives
//!   only), `INBOX_MAX_ATTEMPTS` (5), `INBOX_RETRY_BASE_MS` (200), `INBOX_LEASE_MS` (10 000).
//!   The inbox is kept on the store (see examples/webhook_receiver/email_inbox.rs); with
//!   `DATABASE_URL` the workers' effects are rows of the demo tables, written in the
//!   transaction that marks the entry done, with `REDIS_URL` two Redis hashes written by the
//!   script that marks it done, and `GET /effects` / `GET /messages/{id}` read them too, so
//!   `inbox_worker` processes can apply the entries.
//! - `/admin/inbox/...`: the inbox's admin service (`tower_idempotency::inbox::AdminService`):
//!   `GET /admin/inbox/counts`, `GET /admin/inbox/entries?correlation_id=..`, ... are open;
//!   its actions (`POST /admin/inbox/requeue`, `/pause`, `/resume`, ...) are enabled only when
//!   `ADMIN_TOKEN` is set, and then need `Authorization: Bearer <ADMIN_TOKEN>` (or, from a
//!   browser, the cookie `admin_token=<ADMIN_TOKEN>`). `GET /admin/inbox` is its page.
//!
//! Logs go to stderr through `tracing-subscriber`; `RUST_LOG` is respected (default `info`).
//!
//! `IDEMPOTENCY_LEASE_MS` sets the lease (default 10 s; renewed while a handler runs).
//! `MEMORY_MAX_ENTRIES` bounds the embedded memory store (default 1 000 000 keys; past it the
//! records nearest to expiry are evicted, as `idempotency_memory_*` shows).
//! `REDIS_WAIT_REPLICAS=N` (with `REDIS_WAIT_TIMEOUT_MS`, default 50) turns on durable writes:
//! a record, and an inbox entry before its `202`, is acknowledged by N replicas before the
//! response (503 + `Retry-After` when fewer did in time).
//!
//! The server's defences, what a production server should set too (see `serve.rs` and
//! docs/operations.md): a connection that has not delivered a complete request head (HTTP/1) or
//! HEADERS frame (HTTP/2) within `HEADER_TIMEOUT_MS` (default 10 000) of its opening is
//! closed, whatever it sent (on a kept-alive HTTP/1 connection, the next head is due within
//! that of the request before); a connection with no request in flight for `IDLE_TIMEOUT_MS`
//! (default 30 000) is shut down, and HTTP/2 keep-alive pings at that interval close a peer that
//! stops answering; at most `MAX_CONNECTIONS` (default 1024) are served at once, the newest
//! beyond it closed on accept; a request body slower than `BODY_TIMEOUT_MS` (default 10 000) is
//! 408 (and its claim is never taken); after a failed `accept` (out of file descriptors, say)
//! the loop pauses instead of spinning.
//!
//! On every webhook route, `x-demo-fail: true` makes the handler answer 500 (no effect) and
//! `x-demo-delay-ms: N` makes it sleep N ms first, so retries and concurrent duplicates can be
//! seen with curl. On `/webhooks/meta`, `x-demo-fail-item: <message id>` applies the batch's
//! new messages in order and fails (500) at that one: the messages applied before it are
//! reported done and recorded, so the retry applies only the rest.

/// The email inbox's store and effects, shared with `inbox_worker`.
#[path = "webhook_receiver/email_inbox.rs"]
mod email_inbox;
#[path = "webhook_receiver/inbox.rs"]
mod inbox;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::FromRequestParts;
use axum::extract::{Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::{Value, json};
use tower_idempotency::key::{ExtractKey, HeaderKey, JsonPathKey};
use tower_idempotency::order::{EventOrder, PositionAt};
use tower_idempotency::store::{AnyStore, connect};
use tower_idempotency::verify::{HubSignature256, StandardWebhooks, StripeSignature};
use tower_idempotency::{BatchItems, IdempotencyKey, IdempotencyLayer, MemoryStore};

/// The serving loop and its bounds on connections.
#[path = "webhook_receiver/serve.rs"]
mod serve;

/// The Standard Webhooks secret of the specification's test vector: the default of
/// `STANDARD_WEBHOOKS_SECRET`, for trying the route by hand.
const TEST_STANDARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// GitHub's documented test secret: the default of `GITHUB_WEBHOOK_SECRET`.
const TEST_GITHUB_SECRET: &str = "It's a Secret to Everybody";

/// The receiver's visible state: side effects performed, and message statuses; with
/// `DATABASE_URL` or `REDIS_URL`, also the effects the inbox's workers store (in any process).
/// Cloned for every request (axum's `State`): each part behind an `Arc`, so that a clone copies
/// no connection handle of the inbox's.
#[derive(Clone, Default)]
struct AppState {
    effects: Arc<Mutex<Effects>>,
    messages: Arc<Mutex<HashMap<String, String>>>,
    table: Option<Arc<email_inbox::Effects>>,
}

#[derive(Default)]
struct Effects {
    total: u64,
    by_key: BTreeMap<String, u64>,
    next_order: u64,
}

impl AppState {
    fn record(&self, key: &IdempotencyKey) {
        let mut effects = self.effects.lock().unwrap();
        effects.total += 1;
        for part in key.parts() {
            *effects.by_key.entry(part.to_owned()).or_default() += 1;
        }
    }

    /// The status an email event of type `kind` (`email.delivered`) gives its message.
    fn set_status<'a>(&self, message_id: &str, kind: &'a str) -> &'a str {
        let status = email_inbox::status_of(kind);
        let mut messages = self.messages.lock().unwrap();
        messages.insert(message_id.to_owned(), status.to_owned());
        status
    }

    /// One effect per message of a batch.
    fn record_item(&self, item: &str) {
        let mut effects = self.effects.lock().unwrap();
        effects.total += 1;
        *effects.by_key.entry(item.to_owned()).or_default() += 1;
    }
}

/// `x-demo-delay-ms`, `x-demo-fail` and `x-demo-fail-item`, for trying retries and concurrency
/// by hand: read from the request's headers where they are, not from a copy of them all.
#[derive(Default)]
struct Demo {
    delay_ms: Option<u64>,
    fail: bool,
    fail_item: Option<HeaderValue>,
}

impl<S: Sync> FromRequestParts<S> for Demo {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        // One pass over the request's few headers, the first of each name counting: cheaper
        // than three lookups, each of which hashes its name.
        let mut demo = Demo::default();
        let (mut delay, mut fail) = (None, None);
        for (name, value) in &parts.headers {
            let Some(knob) = name.as_str().strip_prefix("x-demo-") else {
                continue;
            };
            match knob {
                "delay-ms" => _ = delay.get_or_insert(value),
                "fail" => _ = fail.get_or_insert(value),
                "fail-item" if demo.fail_item.is_none() => demo.fail_item = Some(value.clone()),
                _ => {}
            }
        }
        demo.delay_ms = delay.and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        demo.fail = fail.is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
        Ok(demo)
    }
}

impl Demo {
    /// Sleeps `x-demo-delay-ms`, then answers 500 if `x-demo-fail` is set.
    async fn behave(&self) -> Option<Response> {
        if let Some(ms) = self.delay_ms {
            tokio::time::sleep(Duration::from_millis(ms.min(60_000))).await;
        }
        self.fail.then(|| {
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(json!({"error": "x-demo-fail was set"})),
            )
                .into_response()
        })
    }
}

async fn webhook(
    State(state): State<AppState>,
    Extension(key): Extension<IdempotencyKey>,
    demo: Demo,
) -> Response {
    if let Some(failure) = demo.behave().await {
        return failure;
    }
    state.record(&key);
    Json(json!({"ok": true})).into_response()
}

/// Meta: applies each new message of the batch once; a status callback (no message id, keyed
/// by its delivery id) is one effect.
async fn meta(
    State(state): State<AppState>,
    Extension(key): Extension<IdempotencyKey>,
    items: Option<Extension<BatchItems>>,
    demo: Demo,
) -> Response {
    if let Some(failure) = demo.behave().await {
        return failure;
    }
    let Some(Extension(items)) = items else {
        state.record(&key);
        return Json(json!({"ok": true})).into_response();
    };
    let fail_at = demo.fail_item.as_ref().map(HeaderValue::as_bytes);
    let mut applied = 0;
    for item in items.new_items() {
        if fail_at == Some(item.as_bytes()) {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(json!({"error": "x-demo-fail-item was set", "applied": applied})),
            )
                .into_response();
        }
        state.record_item(item);
        // Reported as it goes: recorded even if a later message fails.
        items.mark_done(item);
        applied += 1;
    }
    Json(json!({"ok": true, "applied": applied})).into_response()
}

/// An email status event, in order for its message (the layer keeps older ones away): the
/// message takes the status the event names.
async fn email(
    State(state): State<AppState>,
    Extension(key): Extension<IdempotencyKey>,
    demo: Demo,
    body: Bytes,
) -> Response {
    if let Some(failure) = demo.behave().await {
        return failure;
    }
    // The layer already read `message_id` and `occurred_at` (a 400 without them).
    let event: Value = serde_json::from_slice(&body).unwrap_or_default();
    let (Some(message_id), Some(kind)) = (event["message_id"].as_str(), event["type"].as_str())
    else {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"error": "message_id and type are required"})),
        )
            .into_response();
    };
    state.record(&key);
    let status = state.set_status(message_id, kind);
    Json(json!({"ok": true, "status": status})).into_response()
}

async fn message(State(state): State<AppState>, Path(message_id): Path<String>) -> Response {
    let stored = match &state.table {
        Some(table) => match table.status(&message_id).await {
            Ok(status) => status,
            Err(err) => return table_error(&*err),
        },
        None => None,
    };
    let status = stored.or_else(|| state.messages.lock().unwrap().get(&message_id).cloned());
    match status {
        Some(status) => Json(json!({"message_id": message_id, "status": status})).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({"error": "unknown message"})),
        )
            .into_response(),
    }
}

async fn create_order(
    State(state): State<AppState>,
    Extension(key): Extension<IdempotencyKey>,
    demo: Demo,
) -> Response {
    if let Some(failure) = demo.behave().await {
        return failure;
    }
    state.record(&key);
    let order_id = {
        let mut effects = state.effects.lock().unwrap();
        effects.next_order += 1;
        format!("ord_{:06}", effects.next_order)
    };
    (
        StatusCode::CREATED,
        [("location", format!("/api/orders/{order_id}"))],
        Json(json!({"order_id": order_id})),
    )
        .into_response()
}

/// The effects of this process, and those the inbox's workers wrote in the demo tables.
async fn effects(State(state): State<AppState>) -> Response {
    let stored = match &state.table {
        Some(table) => match table.applied().await {
            Ok(rows) => rows,
            Err(err) => return table_error(&*err),
        },
        None => Vec::new(),
    };
    let effects = state.effects.lock().unwrap();
    let (mut total, mut by_key) = (effects.total, effects.by_key.clone());
    for (event_id, applied) in stored {
        let applied = u64::try_from(applied).unwrap_or_default();
        total += applied;
        *by_key.entry(event_id).or_default() += applied;
    }
    Json(json!({"total": total, "by_key": by_key})).into_response()
}

/// 503: the demo tables could not be read.
fn table_error(err: &(dyn std::error::Error + Send + Sync)) -> Response {
    let error = format!("the demo tables could not be read: {err}");
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({"error": error})),
    )
        .into_response()
}

/// What the environment sets.
struct Settings {
    lease: Duration,
    body_timeout: Duration,
    limits: serve::Limits,
    standard_secrets: Vec<String>,
    github_secret: String,
    kalipto_secret: Option<String>,
    meta_secret: Option<String>,
    sangho_secret: Option<String>,
}

type Error = Box<dyn std::error::Error>;

impl Settings {
    fn from_env() -> Result<Self, Error> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let millis = |name: &str, default: u64| -> Result<Duration, Error> {
            let ms = var(name).map(|v| v.parse()).transpose()?.unwrap_or(default);
            Ok(Duration::from_millis(ms))
        };
        let standard =
            var("STANDARD_WEBHOOKS_SECRET").unwrap_or_else(|| TEST_STANDARD_SECRET.into());
        Ok(Settings {
            lease: millis("IDEMPOTENCY_LEASE_MS", 10_000)?,
            body_timeout: millis("BODY_TIMEOUT_MS", 10_000)?,
            limits: serve::Limits {
                header_timeout: millis("HEADER_TIMEOUT_MS", 10_000)?,
                idle_timeout: millis("IDLE_TIMEOUT_MS", 30_000)?,
                max_connections: match var("MAX_CONNECTIONS").map(|v| v.parse()).transpose()? {
                    Some(0) => return Err("MAX_CONNECTIONS must be at least 1".into()),
                    max => max.unwrap_or(1024),
                },
            },
            standard_secrets: standard.split_whitespace().map(str::to_owned).collect(),
            github_secret: var("GITHUB_WEBHOOK_SECRET")
                .unwrap_or_else(|| TEST_GITHUB_SECRET.into()),
            kalipto_secret: var("KALIPTO_WEBHOOK_SECRET"),
            meta_secret: var("META_APP_SECRET"),
            sangho_secret: var("SANGHO_WEBHOOK_SECRET"),
        })
    }
}

/// A webhook layer on `store` with the demo's common settings.
fn webhook_layer(
    store: &AnyStore,
    settings: &Settings,
    namespace: &str,
    hours: u64,
) -> IdempotencyLayer<AnyStore> {
    IdempotencyLayer::webhook(store.clone())
        .namespace(namespace)
        .lease(settings.lease)
        .body_timeout(settings.body_timeout)
        .retention(Duration::from_secs(hours * 3600))
}

/// `X-Hub-Signature-256` with `secret`, when one is set.
fn hub<K: Clone>(
    layer: IdempotencyLayer<AnyStore, K>,
    secret: Option<&str>,
) -> Result<IdempotencyLayer<AnyStore, K>, Error> {
    Ok(match secret {
        Some(secret) => layer.verify(HubSignature256::new([secret])?),
        None => layer,
    })
}

/// The receiver's routes, every webhook protected on `store`.
fn app(
    store: AnyStore,
    inbox: tower_idempotency::inbox::AnyInbox,
    metrics: PrometheusHandle,
    settings: &Settings,
) -> Result<Router, Error> {
    let delivery_id = || HeaderKey::new("X-Kalipto-Delivery-Id");
    // Kalipto retries within 9 hours; ids are kept 7 days.
    let kalipto = webhook_layer(&store, settings, "kalipto", 7 * 24).key(delivery_id()?);
    let kalipto = hub(kalipto, settings.kalipto_secret.as_deref())?;
    // Meta: deduplicate at the message level; status callbacks carry no message id.
    let messages = JsonPathKey::each_of([
        "$.entry[*].changes[*].value.messages[*].id",
        "$.entry[*].messaging[*].message.mid",
    ])?;
    let meta_layer = webhook_layer(&store, settings, "meta", 72).key(messages.or(delivery_id()?));
    let meta_layer = hub(meta_layer, settings.meta_secret.as_deref())?;
    // Sangho never redelivers after 48 hours; ids are kept 72.
    let sangho_key = HeaderKey::new("Sangho-Event-ID")?.or(JsonPathKey::new("$.id")?);
    let mut sangho = webhook_layer(&store, settings, "sangho", 72).key(sangho_key);
    if let Some(secret) = &settings.sangho_secret {
        sangho = sangho.verify(StripeSignature::new("Sangho-Signature", [secret])?);
    }
    let standard = IdempotencyLayer::standard_webhooks(
        store.clone(),
        StandardWebhooks::new(&settings.standard_secrets)?,
    )
    .namespace("standard")
    .lease(settings.lease)
    .body_timeout(settings.body_timeout);
    let github = webhook_layer(&store, settings, "github", 7 * 24)
        .key(HeaderKey::new("X-GitHub-Delivery")?)
        .verify(HubSignature256::new([&settings.github_secret])?);
    // Email events, in order per message, by when they occurred.
    let email_order = EventOrder::new(
        JsonPathKey::new("$.message_id")?,
        PositionAt::timestamp("$.occurred_at")?,
    );
    let email_layer = webhook_layer(&store, settings, "email", 72)
        .key(JsonPathKey::new("$.event_id")?)
        .order(email_order);
    let state = AppState {
        table: email_inbox::shared_effects(&inbox).map(Arc::new),
        ..AppState::default()
    };
    let inbox_routes = inbox::routes(settings, &state, inbox)?;
    let orders = IdempotencyLayer::api(store)
        .namespace("orders")
        .lease(settings.lease)
        .body_timeout(settings.body_timeout);

    Ok(Router::new()
        .route("/webhooks/kalipto", post(webhook).route_layer(kalipto))
        .route("/webhooks/meta", post(meta).route_layer(meta_layer))
        .route("/webhooks/sangho", post(webhook).route_layer(sangho))
        .route("/webhooks/standard", post(webhook).route_layer(standard))
        .route("/webhooks/github", post(webhook).route_layer(github))
        .route("/webhooks/email", post(email).route_layer(email_layer))
        .route("/api/orders", post(create_order).route_layer(orders))
        .route("/effects", get(effects))
        .route("/messages/{message_id}", get(message))
        .route(
            "/metrics",
            get(move || std::future::ready(metrics.render())),
        )
        .with_state(state)
        .merge(inbox_routes))
}

/// The store the environment names: `REDIS_URL`, else `DATABASE_URL`, else the memory store.
async fn store_from_env() -> Result<AnyStore, Error> {
    let url = std::env::var("REDIS_URL").or_else(|_| std::env::var("DATABASE_URL"));
    let Ok(url) = url else {
        let store = match std::env::var("MEMORY_MAX_ENTRIES") {
            Ok(entries) => {
                let entries = entries
                    .parse()
                    .map_err(|err| format!("MEMORY_MAX_ENTRIES={entries:?}: {err}"))?;
                MemoryStore::new().with_max_entries(entries)
            }
            Err(_) => MemoryStore::new(),
        };
        return Ok(store.into());
    };
    email_inbox::durable_from_env(connect(&url).await?).map_err(|err| -> Error { err })
}

/// Prometheus text on `/metrics`: histograms with buckets (what `histogram_quantile` in
/// docs/operations.md and the dashboard read, and what aggregates across instances), from
/// 100 µs to 10 s. The recorder keeps samples until they are drained: drained every 5 s, so
/// memory stays flat when nobody scrapes.
fn metrics() -> Result<PrometheusHandle, Error> {
    let metrics = PrometheusBuilder::new()
        .set_buckets(&[
            0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
            2.5, 5.0, 10.0,
        ])?
        .install_recorder()?;
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(metrics)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // The error's message (a store URL whose feature is off names the feature), not its
        // `Debug` form.
        Err(err) => {
            eprintln!("webhook_receiver: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Error> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // `info`: no line per first delivery (those are `debug`); duplicates,
                // conflicts, releases, stale events and store errors are logged.
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();

    let bind: SocketAddr = std::env::var("BIND")
        .unwrap_or_else(|_| "127.0.0.1:3000".to_owned())
        .parse()?;
    let settings = Settings::from_env()?;
    // The recorder first: what the store and the layers register goes to it.
    let metrics = metrics()?;
    let store = store_from_env().await?;
    let backend = store.backend();
    let inbox = email_inbox::inbox_on(&store)
        .await
        .map_err(|err| -> Error { err })?;
    let router = app(store, inbox, metrics, &settings)?;
    let listener = tokio::net::TcpListener::bind(bind).await?;
    println!("listening on http://{}", listener.local_addr()?);
    println!("store: {backend}");
    serve::serve(listener, router, settings.limits).await;
    Ok(())
}
