//! [`AdminService`]: an inbox's admin side as JSON over HTTP, and its page (feature `admin`).

mod csrf;
mod html;
mod json;
mod page;
mod panel;
mod params;
mod route;

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use futures_util::future::BoxFuture;
use http::{HeaderMap, HeaderName, Method, Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Full};

use super::admin::InboxAdmin;
use crate::store::StoreKey;

use self::json::Refusal;
use self::route::Endpoint;

/// The most bytes of a request body the service reads (and ignores): beyond, 413.
const BODY_LIMIT: usize = 64 * 1024;

/// The operator's side of an inbox ([`InboxAdmin`]) as a `tower::Service`
/// speaking JSON, to mount behind the application's own authentication (feature `admin`).
///
/// It is read-only unless [`actions`](AdminService::actions) are enabled, shows no delivery
/// body unless [`show_bodies`](AdminService::show_bodies) is, and logs every action (at
/// `info`, with the actor a header of the application's names) and never a body. Its paths are
/// relative to where it is mounted: axum's `nest_service` strips the prefix, and at the root of
/// a server it answers the same paths.
///
/// ```
/// use std::time::Duration;
/// use axum::Router;
/// use http::HeaderName;
/// use tower_idempotency::inbox::{AdminService, MemoryInbox};
///
/// let inbox = MemoryInbox::default();
/// let admin = AdminService::new(inbox.clone())
///     .actions(true) // POSTs are refused with 403 without this
///     .actor_header(HeaderName::from_static("x-user"))
///     .retention(Duration::from_secs(72 * 3600)) // the workers' retention
///     .route("inbox-email", Some("/inbox/email")); // find by delivery id on this route
/// // Behind the application's own authentication (a layer that sets `x-user`, say):
/// let app: Router = Router::new().nest_service("/admin/inbox", admin);
/// # let _ = app;
/// ```
///
/// # Endpoints
///
/// | method and path | what | answer |
/// |---|---|---|
/// | `GET /?…` | the page (below): the index (`?<filter>`), an entry (`?entry={key}`) | HTML |
/// | `POST /` | a form of the page (`do`, `csrf`) | 303 back to the page |
/// | `GET /counts` | the inbox's counts | `{"pending", "in_flight", "dead", "oldest_age_ms", "paused"}` |
/// | `GET /entries?…` | a page of entries matching the filter | `{"entries": [entry…], "next"}` |
/// | `GET /entries/{key}` | the entry of a printed store key (`ti:…`) | entry |
/// | `GET /entries/by-id/{id}` | the entry of a delivery id, on the configured routes | entry |
/// | `POST /entries/{key}/requeue` | re-queues a dead letter | `{"key", "requeued": true}` |
/// | `POST /entries/{key}/discard` | drops a dead letter, its key kept as done | `{"key", "discarded": true}` |
/// | `POST /requeue?…` | re-queues one page of the matching dead letters | `{"requeued", "next"}` |
/// | `POST /pause`, `POST /resume` | stops, restarts taking in every worker process | `{"paused"}` |
///
/// The filter's query parameters (each optional; empty ones count as absent, unknown ones are
/// a 400): `state` (`queued`, `running`, `dead`, `done`), `id_prefix` (of the delivery id),
/// `route` (the route's namespace), `object` (a printed object key, `to:…`),
/// `correlation_id`, `error` (text in the last error), `cursor` (a `next` from the previous
/// answer) and `limit` (listing: 1 to 500, default 50; bulk re-queue: 1 to 1000, default 500).
/// A bulk re-queue reads one page of dead letters and re-queues them: call it again with its
/// `next` until `next` is `null`.
///
/// Times are milliseconds since the Unix epoch (`…_at`), durations milliseconds (`…_ms`); an
/// entry:
///
/// ```json
/// {
///   "key": "ti:2c9Tq8rKDn0xWb1A", "id": "evt_1", "route": "inbox-email",
///   "state": "queued", "correlation_id": "req-1", "attempts": 2,
///   "enqueued_at": 1764669600000, "next_attempt_at": 1764669600412,
///   "until": 1764669600412, "last_error": "demo failure",
///   "object": "to:Qm3h0cPzqLk1XyZa", "position": "1764669600000000000",
///   "history": [
///     {"number": 1, "started_at": 1764669600003, "duration_ms": 2, "outcome": "failed",
///      "error": "demo failure", "worker": "host/4242"},
///     {"number": 2, "started_at": 1764669600210, "duration_ms": 1, "outcome": "failed",
///      "error": "demo failure", "worker": "host/4242"}
///   ]
/// }
/// ```
///
/// `until` is when a queued entry is due, when a running one's lease ends, until when a done
/// key is kept (`null` for a dead letter); `object` and `position` are `null` off ordered
/// routes; an attempt's `outcome` is `running`, `succeeded`, `failed` or `lease_lost`, its
/// `error` `null` unless failed. With [`show_bodies`](AdminService::show_bodies), an entry
/// also has `"body"` (the text, or `null` when it is not UTF-8), `"body_bytes"` and
/// `"headers"` (the ones the route keeps).
///
/// # The page
///
/// `GET /` is a page for people: server-rendered HTML with nothing loaded from elsewhere,
/// complete without JavaScript. It shows per route this process's figures of the last 15
/// minutes (received, first, duplicates, rejected by reason, stale, queued, the handler's and
/// the workers' p50 and p95), the inbox's counts from the store, and the entries with the
/// filter above, each with its page (state, attempts, last error). With actions enabled it
/// has forms (redrive one or all matching, discard, pause, resume), each a `POST /` carrying
/// an anti-forgery token.
///
/// Every `POST` from a browser (a request with an `Origin`, `Sec-Fetch-Site` or `Cookie`
/// header), and every `POST` with a body of any type but JSON (another site's page may send a
/// form, a multipart form, plain text or a ping without a CORS preflight, even from a browser
/// that sends none of those headers), needs that token, in the form's `csrf` field or the
/// `x-csrf-token` header, or is refused (403 `admin_forgery`). A client that sends none of
/// these headers and no body type or JSON (curl without `-d`, a JSON client with a bearer
/// token) needs none. See
/// [`csrf_secret`](AdminService::csrf_secret).
///
/// Every refusal is an `application/problem+json` document (see `docs/problems.md`):
/// 400 `admin_bad_parameter` (a parameter, key or cursor), 403 `admin_actions_disabled` or
/// `admin_forgery`,
/// 404 `admin_not_found` (an unknown path or key, or a key that is not a dead letter),
/// 405 `admin_method_not_allowed` (with `Allow`), 413 `payload_too_large` (a request body
/// over 64 KiB: bodies are read, and ignored unless a form's; 400 `body_unreadable` when
/// reading fails),
/// 503 `store_unavailable`.
///
/// A cheap `Clone` (the inbox handle and its settings); every answer is a response, never an
/// `Err`.
#[derive(Clone)]
pub struct AdminService<I> {
    inbox: I,
    settings: Arc<Settings>,
}

/// What the builder sets, shared by the clones.
#[derive(Clone, Debug)]
struct Settings {
    actions: bool,
    show_bodies: bool,
    actor_header: Option<HeaderName>,
    retention: Duration,
    /// The routes (namespace, scope) whose delivery ids `by-id` finds.
    routes: Vec<(String, Option<String>)>,
    /// The key of the page's anti-forgery tokens.
    csrf: csrf::Csrf,
}

impl<I> fmt::Debug for AdminService<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminService")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl<I: InboxAdmin + Clone> AdminService<I> {
    /// The admin service of `inbox`: read-only, bodies hidden, no route to find ids on, a
    /// discard keeping the key 72 hours.
    pub fn new(inbox: I) -> Self {
        AdminService {
            inbox,
            settings: Arc::new(Settings {
                actions: false,
                show_bodies: false,
                actor_header: None,
                retention: crate::defaults::RETENTION,
                routes: Vec::new(),
                csrf: csrf::Csrf::random(),
            }),
        }
    }

    /// Whether the `POST` endpoints act (re-queue, discard, pause, resume); without, each
    /// answers 403. Default `false`.
    pub fn actions(mut self, enabled: bool) -> Self {
        self.settings_mut().actions = enabled;
        self
    }

    /// Whether entries carry their body and kept headers. Default `false`.
    pub fn show_bodies(mut self, enabled: bool) -> Self {
        self.settings_mut().show_bodies = enabled;
        self
    }

    /// The request header that names the actor in each action's log line (set by the
    /// application's authentication, say); without it, or when a request lacks it, the actor
    /// is `unknown`.
    pub fn actor_header(mut self, header: HeaderName) -> Self {
        self.settings_mut().actor_header = Some(header);
        self
    }

    /// How long a discarded dead letter's key is kept as done, so that a later delivery of it
    /// is a duplicate: the retention of the inbox's done keys, i.e. the
    /// [`Worker`](super::Worker)'s `retention` (what the provider's retries need). Default
    /// 72 hours.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.settings_mut().retention = retention;
        self
    }

    /// A route whose delivery ids `GET /entries/by-id/{id}` finds: its namespace and scope, as
    /// its keys are built ([`StoreKey::new`]`(namespace, scope, id)`). Routes are tried in the
    /// order they were added; the first that knows the id answers.
    pub fn route(mut self, namespace: impl Into<String>, scope: Option<&str>) -> Self {
        let route = (namespace.into(), scope.map(str::to_owned));
        self.settings_mut().routes.push(route);
        self
    }

    /// The secret the page's anti-forgery tokens are made with: the same in every process
    /// behind one address, so that a form served by one is accepted by another. Default: a
    /// random one of this service's own (enough behind sticky sessions or with one process).
    pub fn csrf_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.settings_mut().csrf = csrf::Csrf::shared(secret.as_ref());
        self
    }

    fn settings_mut(&mut self) -> &mut Settings {
        Arc::make_mut(&mut self.settings)
    }

    /// The answer to `request`.
    async fn answer<B>(self, request: Request<B>) -> Response<Full<Bytes>>
    where
        B: Body + Send + 'static,
        B::Data: Send,
    {
        let (parts, body) = request.into_parts();
        let endpoint = match route::resolve(&parts.method, parts.uri.path()) {
            Ok(endpoint) => endpoint,
            Err(refusal) => return refusal.response(),
        };
        let actor = self.actor(&parts.headers);
        let mut form = Vec::new();
        if parts.method == Method::POST {
            if !self.settings.actions {
                tracing::info!(
                    actor,
                    action = endpoint.name(),
                    "inbox admin: refused, actions disabled"
                );
                return Refusal::ActionsDisabled.response();
            }
            match self.read_post(&parts.headers, body).await {
                Ok(fields) => form = fields,
                Err(refusal) => {
                    if let Refusal::Forgery = refusal {
                        let action = endpoint.name();
                        tracing::warn!(actor, action, "inbox admin: refused, forgery suspected");
                    }
                    return refusal.response();
                }
            }
        }
        let query = parts.uri.query().unwrap_or_default();
        let answer = match endpoint {
            Endpoint::Page => self.page(query).await,
            Endpoint::Act => self.act(&form, query, &actor).await,
            endpoint => self
                .run(endpoint, query, &actor)
                .await
                .map(|a| json::ok(&a)),
        };
        answer.unwrap_or_else(Refusal::response)
    }

    /// A `POST`'s form fields (none unless it is a form), once its anti-forgery token is
    /// checked: a browser's, or one with a body that is not JSON, needs one (see
    /// [`csrf::needs_token`]), in the form's `csrf` field or the `x-csrf-token` header.
    async fn read_post<B>(
        &self,
        headers: &HeaderMap,
        body: B,
    ) -> Result<Vec<(String, String)>, Refusal>
    where
        B: Body + Send,
        B::Data: Send,
    {
        let body = read(headers, body).await?;
        let form = if csrf::content_type_is(headers, "application/x-www-form-urlencoded") {
            params::form(&body)?
        } else {
            Vec::new()
        };
        if csrf::needs_token(headers) {
            let header = headers.get("x-csrf-token").and_then(|v| v.to_str().ok());
            let field = form
                .iter()
                .find(|(name, _)| name == "csrf")
                .map(|(_, v)| v.as_str());
            let valid = header
                .or(field)
                .is_some_and(|token| self.settings.csrf.check(token));
            if !valid {
                return Err(Refusal::Forgery);
            }
        }
        Ok(form)
    }

    /// Who acts, as the actor header names them.
    fn actor(&self, headers: &HeaderMap) -> String {
        let named = (self.settings.actor_header.as_ref())
            .and_then(|header| headers.get(header))
            .and_then(|value| value.to_str().ok())
            .filter(|actor| !actor.is_empty());
        // Bounded: a log line is not a place for a header of any size.
        named.map_or_else(
            || "unknown".to_owned(),
            |actor| actor.chars().take(128).collect(),
        )
    }

    /// Runs `endpoint`: its JSON answer.
    async fn run(
        &self,
        endpoint: Endpoint,
        query: &str,
        actor: &str,
    ) -> Result<serde_json::Value, Refusal> {
        let inbox = &self.inbox;
        let bodies = self.settings.show_bodies;
        match endpoint {
            // The page's, answered by `page` and `act`.
            Endpoint::Page | Endpoint::Act => Err(Refusal::NoPath),
            Endpoint::Counts => {
                params::none(query)?;
                let counts = inbox.counts().await?;
                Ok(json::counts(&counts, inbox.is_paused().await?))
            }
            Endpoint::List => {
                let (mut filter, cursor, limit) = params::listing(query, params::LIST)?;
                filter.with_bodies = bodies;
                let page = inbox.list(&filter, cursor.as_deref(), limit).await?;
                Ok(json::page(&page, bodies))
            }
            Endpoint::Find(key) => {
                params::none(query)?;
                let info = inbox.find(&key).await?.ok_or(Refusal::NoEntry)?;
                Ok(json::entry(&info, bodies))
            }
            Endpoint::FindById(id) => {
                params::none(query)?;
                for (namespace, scope) in &self.settings.routes {
                    let key = StoreKey::new(namespace, scope.as_deref(), &id);
                    if let Some(info) = inbox.find(&key).await? {
                        return Ok(json::entry(&info, bodies));
                    }
                }
                Err(Refusal::NoEntry)
            }
            Endpoint::RequeueMatching => {
                self.logged(
                    "requeue_matching",
                    actor,
                    self.requeue_matching(query, actor),
                )
                .await
            }
            Endpoint::Requeue(key) => {
                self.logged(
                    "requeue",
                    actor,
                    self.on_dead_letter(key, Fate::Requeue, query, actor),
                )
                .await
            }
            Endpoint::Discard(key) => {
                self.logged(
                    "discard",
                    actor,
                    self.on_dead_letter(key, Fate::Discard, query, actor),
                )
                .await
            }
            Endpoint::Pause => {
                self.logged("pause", actor, self.set_paused(true, query, actor))
                    .await
            }
            Endpoint::Resume => {
                self.logged("resume", actor, self.set_paused(false, query, actor))
                    .await
            }
        }
    }

    /// `action`'s answer, its failure in the store logged (its success is logged by itself).
    async fn logged<T>(
        &self,
        action: &'static str,
        actor: &str,
        answer: impl Future<Output = Result<T, Refusal>>,
    ) -> Result<T, Refusal> {
        let answer = answer.await;
        if let Err(Refusal::Store(error)) = &answer {
            tracing::warn!(actor, action, %error, "inbox admin: action failed in the store");
        }
        answer
    }

    /// `POST /requeue`: one page of the matching dead letters re-queued.
    async fn requeue_matching(
        &self,
        query: &str,
        actor: &str,
    ) -> Result<serde_json::Value, Refusal> {
        let (filter, cursor, limit) = params::listing(query, params::REQUEUE)?;
        let done = (self.inbox)
            .requeue_matching(&filter, cursor.as_deref(), limit)
            .await?;
        tracing::info!(
            actor,
            action = "requeue_matching",
            filter = %params::describe(&filter),
            requeued = done.requeued,
            more = done.next.is_some(),
            "inbox admin: dead letters re-queued"
        );
        let next = done.next.as_deref().map(params::seal_cursor);
        Ok(serde_json::json!({"requeued": done.requeued, "next": next}))
    }

    /// `POST /entries/{key}/requeue` and `/discard`: 404 when `key` is not a dead letter.
    async fn on_dead_letter(
        &self,
        key: StoreKey,
        fate: Fate,
        query: &str,
        actor: &str,
    ) -> Result<serde_json::Value, Refusal> {
        params::none(query)?;
        let (done, action, field) = match fate {
            Fate::Requeue => (self.inbox.requeue(&key).await?, "requeue", "requeued"),
            Fate::Discard => {
                let retention = self.settings.retention;
                (
                    self.inbox.discard(&key, retention).await?,
                    "discard",
                    "discarded",
                )
            }
        };
        let result = if done { field } else { "not_dead" };
        tracing::info!(actor, action, key = %key, result, "inbox admin: dead letter");
        match done {
            true => Ok(serde_json::json!({"key": key.as_str(), field: true})),
            false => Err(Refusal::NotDead),
        }
    }

    /// `POST /pause` and `/resume`: taking stopped or restarted in every worker process.
    async fn set_paused(
        &self,
        paused: bool,
        query: &str,
        actor: &str,
    ) -> Result<serde_json::Value, Refusal> {
        params::none(query)?;
        match paused {
            true => self.inbox.pause().await?,
            false => self.inbox.resume().await?,
        }
        let (action, result) = if paused {
            ("pause", "paused")
        } else {
            ("resume", "resumed")
        };
        tracing::info!(actor, action, result, "inbox admin: taking {result}");
        Ok(serde_json::json!({"paused": paused}))
    }
}

/// What an action does to a dead letter.
#[derive(Clone, Copy)]
enum Fate {
    Requeue,
    Discard,
}

/// Reads `body` (a form's, or one the endpoints ignore): 413 beyond [`BODY_LIMIT`], by
/// `Content-Length` or as it is read.
async fn read<B>(headers: &HeaderMap, body: B) -> Result<Bytes, Refusal>
where
    B: Body + Send,
    B::Data: Send,
{
    let declared = (headers.get(http::header::CONTENT_LENGTH))
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > BODY_LIMIT as u64) {
        return Err(Refusal::TooLarge { limit: BODY_LIMIT });
    }
    let mut body = std::pin::pin!(body);
    let mut read = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| Refusal::Unreadable)?;
        if let Ok(mut data) = frame.into_data() {
            if read.len() + data.remaining() > BODY_LIMIT {
                return Err(Refusal::TooLarge { limit: BODY_LIMIT });
            }
            while data.has_remaining() {
                let chunk = data.chunk();
                read.extend_from_slice(chunk);
                let n = chunk.len();
                data.advance(n);
            }
        }
    }
    Ok(Bytes::from(read))
}

impl<I, B> tower_service::Service<Request<B>> for AdminService<I>
where
    I: InboxAdmin + Clone,
    B: Body + Send + 'static,
    B::Data: Send,
{
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    // Boxed: the answer awaits the inbox's calls, whose futures have no names.
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Always ready: every call works on a handle of the inbox of its own.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.answer(request).await) })
    }
}
