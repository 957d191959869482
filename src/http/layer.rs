//! [`Door`], the builder of [`IdempotencyLayer`] and [`InboxLayer`](crate::inbox::InboxLayer):
//! plain data, configured with by-value builder methods, shared by the services it makes
//! through one `Arc` made when it is applied.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, Method, StatusCode};
use tower_layer::Layer;

use crate::claim::guard::ClaimStore;
use crate::claim::observe::OutcomeEvent;
use crate::http::classify::Classifier;
use crate::http::config::{
    AckResponse, FailureMode, MissingKey, Mode, OnMismatch, Scope, Settings,
};
use crate::http::phase::Config;
use crate::http::rejection::RenderRejection;
use crate::http::service::Idempotency;
use crate::inbox::route::InboxRoute;
use crate::key::{ExtractKey, HeaderKey};
use crate::order::EventOrder;
use crate::store::LocalCache;
use crate::verify::VerifyRequest;
use crate::{IdempotencyStore, OrderedStore};

/// Makes the wrapped service idempotent: see the [crate docs](crate) for the behaviour and
/// every status code.
///
/// `St` is the store's type, `K` the key extractor (default: the `Idempotency-Key` header).
/// The layer keeps the store's type only as a mark, for what a store must be able to do
/// ([`order`](Door::order) asks for an [`OrderedStore`]); the services it makes do not carry
/// it. Start from a profile, [`webhook`](Door::webhook) or [`api`](Door::api), or from
/// [`new`](Door::new), then set what differs. The services it makes share one `Arc` of its
/// configuration.
///
/// The methods are those of [`Door`], the builder this layer shares with the
/// [`InboxLayer`](crate::inbox::InboxLayer).
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, routing::post};
/// use tower_idempotency::{IdempotencyLayer, MemoryStore, MissingKey};
/// use tower_idempotency::key::{ExtractKey, HeaderKey, JsonPathKey};
///
/// let store = MemoryStore::new();
/// // A webhook: keyed by the delivery id header, else the event id in the body.
/// let kalipto = IdempotencyLayer::webhook(store.clone())
///     .namespace("kalipto")
///     .key(HeaderKey::new("X-Kalipto-Delivery-Id")?.or(JsonPathKey::new("$.event.id")?))
///     .retention(Duration::from_secs(7 * 24 * 3600))
///     .missing_key(MissingKey::Reject);
/// // An API route: `Idempotency-Key`, the original response replayed, 422 on reuse.
/// let orders = IdempotencyLayer::api(store).namespace("orders");
///
/// let app: Router = Router::new()
///     .route("/webhooks/kalipto", post(|| async { "ok" }).route_layer(kalipto))
///     .route("/orders", post(|| async { "created" }).route_layer(orders));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type IdempotencyLayer<St, K = HeaderKey> = Door<Records<St>, K>;

/// The one builder of both layers of the crate: [`IdempotencyLayer`] (`Door<Records<St>, K>`,
/// the synchronous route on a record store) and [`InboxLayer`](crate::inbox::InboxLayer)
/// (`Door<Inbox, K>`, the inbox's door). Write one of those two names; this type exists so that
/// what both routes share (the read, verify and key phases, the answers, the observer) is
/// set the same way on both, while what only one of them has (a lease, a retention, a replay
/// mode; the inbox's first answer and kept headers) is set on that one only, checked by the
/// compiler:
///
/// ```compile_fail,E0599
/// use std::time::Duration;
/// use tower_idempotency::inbox::{InboxLayer, MemoryInbox};
///
/// // An inbox route holds no record: the inbox keeps its keys, so there is no lease to set.
/// let door = InboxLayer::new(MemoryInbox::default()).lease(Duration::from_secs(5));
/// ```
///
/// `M` is the route's kind, `K` the key extractor. The kind is only a mark: the services a
/// door makes do not carry it. Plain data while it is built; the services it makes share one
/// `Arc` of it.
pub struct Door<M, K = HeaderKey> {
    config: Config<K>,
    /// The route's kind: a mark, neither owned nor borrowed (the layer stays `Send + Sync`).
    kind: PhantomData<fn() -> M>,
}

/// The kind of [`IdempotencyLayer`]'s door: a synchronous route whose claims are records in a
/// store of type `St` (a mark: the store itself is in the door's configuration).
pub struct Records<St>(PhantomData<fn() -> St>);

/// The kind of [`InboxLayer`](crate::inbox::InboxLayer)'s door: deliveries are stored in an
/// inbox and answered at once.
pub struct Inbox(());

/// The kinds of door that can order events: a record store that keeps each event's object
/// ([`OrderedStore`]), and every inbox.
pub trait Orders: sealed::Sealed {}

impl<St: OrderedStore> Orders for Records<St> {}
impl Orders for Inbox {}

mod sealed {
    pub trait Sealed {}
    impl<St: crate::OrderedStore> Sealed for super::Records<St> {}
    impl Sealed for super::Inbox {}
}

impl<M, K> Door<M, K> {
    /// A door on `config` (the layers' constructors).
    pub(crate) fn from_config(config: Config<K>) -> Self {
        Door {
            config,
            kind: PhantomData,
        }
    }
}

impl<M, K: Clone> Clone for Door<M, K> {
    fn clone(&self) -> Self {
        Door {
            config: self.config.clone(),
            kind: PhantomData,
        }
    }
}

impl<M, K> fmt::Debug for Door<M, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.config.settings;
        let name = if self.config.inbox.is_some() {
            "InboxLayer"
        } else {
            "IdempotencyLayer"
        };
        f.debug_struct(name)
            .field("namespace", &s.claim.policy.observer.namespace())
            .field("scope", &s.intake.scope)
            .field("body_limit", &s.intake.body_limit)
            .field("lease", &s.claim.policy.lease)
            .field("retention", &s.claim.policy.retention)
            .field("mode", &s.reply.mode)
            .field("verifies", &s.intake.verifier.is_some())
            .field("order", &s.order)
            .finish_non_exhaustive()
    }
}

impl<St: IdempotencyStore> Door<Records<St>, HeaderKey> {
    /// A layer on `store`, keyed by the `Idempotency-Key` header, with the defaults: 1 MiB body
    /// limit, 10 s lease (renewed while the handler runs), 72 h retention, 2 s store timeout,
    /// missing key → 400, ack mode, mismatch → 422, fail closed, POST/PUT/PATCH/DELETE (every
    /// non-safe method) covered, keys scoped by namespace `default` and the request path, and a
    /// [`LocalCache`] of completed records in front of a store that talks to a server (see
    /// [`local_cache`](Self::local_cache)).
    pub fn new(store: St) -> Self {
        Door::from_config(Config {
            claims: ClaimStore::new(store),
            extractor: HeaderKey::idempotency_key(),
            settings: Arc::new(Settings::default()),
            inbox: None,
        })
    }

    /// A layer for a **webhook route**: a provider never sends another event under the same id
    /// on purpose, and a 4xx makes it retry for days or disable the endpoint. So a duplicate
    /// is acknowledged ([`Mode::Ack`]), and so is a payload mismatch under a known id
    /// ([`OnMismatch::Ack`]: `Idempotent-Replayed: true`, logged at warn, counted as
    /// `mismatch_acked`), never a 4xx. Retention 72 h; set the key with [`key`](Self::key) (the
    /// provider's delivery id header, or the event id in the body) and the retention with
    /// [`retention`](Self::retention) to the provider's retry window.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    /// use tower_idempotency::key::HeaderKey;
    ///
    /// let github = IdempotencyLayer::webhook(MemoryStore::new())
    ///     .namespace("github")
    ///     .key(HeaderKey::new("X-GitHub-Delivery")?)
    ///     .retention(Duration::from_secs(7 * 24 * 3600));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn webhook(store: St) -> Self {
        Self::new(store)
            .mode(Mode::Ack)
            .on_mismatch(OnMismatch::Ack)
    }

    /// A layer for an **API route** (`POST /payments`): keyed by the `Idempotency-Key`
    /// header, the retry of a request gets the original response again ([`Mode::Replay`]),
    /// and a key reused with another payload is a client error (422, [`OnMismatch::Reject`]),
    /// as the IETF draft and Stripe do. Retention 24 h.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    ///
    /// let payments = IdempotencyLayer::api(MemoryStore::new()).namespace("payments");
    /// ```
    pub fn api(store: St) -> Self {
        Self::new(store)
            .mode(Mode::Replay)
            .on_mismatch(OnMismatch::Reject)
            .retention(Duration::from_secs(24 * 3600))
    }

    /// A layer for a **Standard Webhooks** sender (<https://www.standardwebhooks.com>): the
    /// webhook profile, every request verified by `scheme` (its `webhook-signature` over
    /// `webhook-id.webhook-timestamp.body`, the timestamp within the tolerance) before its key
    /// is claimed, and keyed by the id that was signed: `svix-id` when the sender uses the
    /// `svix-*` headers (Svix by default, and the services built on it), else `webhook-id`,
    /// the family [`StandardWebhooks`](crate::verify::StandardWebhooks) verifies.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    /// use tower_idempotency::verify::StandardWebhooks;
    ///
    /// let secrets = StandardWebhooks::new(["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"])?;
    /// let layer = IdempotencyLayer::standard_webhooks(MemoryStore::new(), secrets).namespace("payments");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "verify")]
    #[cfg_attr(docsrs, doc(cfg(feature = "verify")))]
    pub fn standard_webhooks(
        store: St,
        scheme: crate::verify::StandardWebhooks,
    ) -> IdempotencyLayer<St, crate::key::Fallback<HeaderKey, HeaderKey>> {
        use crate::verify::StandardWebhooks;
        // The verifier picks `svix-*` as soon as one of them is there, so a verified request
        // with `svix-id` was verified by it, and one without by `webhook-id`.
        let svix = HeaderKey::from_name(HeaderName::from_static(StandardWebhooks::SVIX_ID_HEADER));
        let webhook = HeaderKey::from_name(HeaderName::from_static(StandardWebhooks::ID_HEADER));
        Self::webhook(store).key(svix.or(webhook)).verify(scheme)
    }
}

impl<M, K> Door<M, K> {
    /// Sets where the key comes from: a [`HeaderKey`], a [`JsonPathKey`](crate::key::JsonPathKey),
    /// a fallback chain, a closure, …
    pub fn key<K2: ExtractKey>(self, extractor: K2) -> Door<M, K2> {
        let Config {
            claims,
            settings,
            inbox,
            ..
        } = self.config;
        Door::from_config(Config {
            claims,
            extractor,
            settings,
            inbox,
        })
    }

    /// The same layer with its configuration changed by `f`.
    fn with(mut self, f: impl FnOnce(&mut Config<K>)) -> Self {
        f(&mut self.config);
        self
    }

    /// The same layer with its settings changed by `f`: in place while the layer is being
    /// built, on a copy once a service shares them.
    fn with_settings(self, f: impl FnOnce(&mut Settings)) -> Self
    where
        K: Clone,
    {
        self.with(|config| f(Arc::make_mut(&mut config.settings)))
    }
}

impl<M, K: Clone> Door<M, K> {
    /// The same configuration as a door of another kind (an inbox's door is built from a
    /// record door's settings).
    pub(crate) fn into_kind<M2>(self) -> Door<M2, K> {
        Door {
            config: self.config,
            kind: PhantomData,
        }
    }

    /// Inbox mode on `route` (what [`InboxLayer`](crate::inbox::InboxLayer) is built on).
    pub(crate) fn with_inbox(self, route: InboxRoute) -> Self {
        self.with(|config| config.inbox = Some(route))
    }

    /// The inbox route changed by `f` (no-op outside inbox mode).
    pub(crate) fn with_inbox_route(self, f: impl FnOnce(&mut InboxRoute)) -> Self {
        self.with(|config| {
            if let Some(route) = config.inbox.as_mut() {
                f(route);
            }
        })
    }

    /// Verifies every covered request with `verifier` (a built-in scheme of
    /// [`verify`](crate::verify), or a closure) **before its key is extracted or claimed**: a
    /// request that fails gets `401` (gRPC `UNAUTHENTICATED`), outcome `unverified`, and never
    /// touches the store nor the inner service, so a forged request under a genuine delivery
    /// id can neither hold that id's claim nor learn whether it exists. The body is then always
    /// read (bounded), since the signature covers it.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    /// use tower_idempotency::key::HeaderKey;
    /// use tower_idempotency::verify::HubSignature256;
    ///
    /// let github = IdempotencyLayer::webhook(MemoryStore::new())
    ///     .namespace("github")
    ///     .key(HeaderKey::new("X-GitHub-Delivery")?)
    ///     .verify(HubSignature256::new(["It's a Secret to Everybody"])?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn verify(self, verifier: impl VerifyRequest) -> Self {
        let verifier: Arc<dyn VerifyRequest> = Arc::new(verifier);
        self.with_settings(|s| s.intake.verifier = Some(verifier))
    }

    /// Sets the namespace that keeps this layer's keys apart from other layers' (and other
    /// applications') on a shared store. Any text: it is hashed into store keys, and appears
    /// as is in logs and metric labels, so prefer a short name (`kalipto`, `orders`). Behind an
    /// [`InboxLayer`](crate::inbox::InboxLayer), workers see it as
    /// [`InboxRequest::route`](crate::inbox::InboxRequest::route).
    pub fn namespace(self, namespace: impl Into<String>) -> Self {
        let namespace = namespace.into();
        self.with_settings(|s| s.claim.policy.observer.set_namespace(&namespace))
    }

    /// Sets the per-request part of the scope (default: [`Scope::path`]).
    pub fn scope(self, scope: Scope) -> Self {
        self.with_settings(|s| s.intake.scope = scope)
    }

    /// Sets the request body limit (default 1 MiB). Larger bodies get 413.
    pub fn body_limit(self, bytes: usize) -> Self {
        self.with_settings(|s| s.intake.body_limit = bytes)
    }

    /// Sets a timeout for reading the request body (default: none). A body that trickles in
    /// slower gets 408, and no claim is taken.
    pub fn body_timeout(self, timeout: Duration) -> Self {
        self.with_settings(|s| s.intake.body_timeout = Some(timeout))
    }

    /// Sets the timeout of each store call (default 2 s). A timeout is a store error: behind an
    /// [`InboxLayer`](crate::inbox::InboxLayer), an enqueue that takes longer is answered 503.
    ///
    /// A store whose client already times out each command within it (a Redis client's
    /// `default_command_timeout`, see
    /// [`IdempotencyStore::command_timeout`](crate::IdempotencyStore::command_timeout)) is left
    /// to its client's timer: the layer arms none of its own for it.
    pub fn store_timeout(self, timeout: Duration) -> Self {
        self.with_settings(|s| s.claim.policy.store_timeout = timeout)
    }

    /// Sets the `Retry-After` of 503 store-unavailable answers (default 5 s), the store being
    /// the record store or the inbox.
    pub fn store_retry_after(self, after: Duration) -> Self {
        self.with_settings(|s| s.claim.store_retry_after = after)
    }

    /// Protects (or, behind an [`InboxLayer`](crate::inbox::InboxLayer), enqueues) only
    /// requests with these methods (default: every method but GET, HEAD, OPTIONS and TRACE);
    /// others pass through.
    pub fn methods(self, methods: impl IntoIterator<Item = Method>) -> Self {
        let methods = methods.into_iter().collect();
        self.with_settings(|s| s.intake.methods = Some(methods))
    }

    /// Sets the acknowledgement of [`Mode::Ack`], and behind an
    /// [`InboxLayer`](crate::inbox::InboxLayer) the answer to a duplicate (default
    /// `200 {"ok":true,"duplicate":true}`).
    pub fn ack_response(self, ack: AckResponse) -> Self {
        self.with_settings(|s| s.reply.ack = ack)
    }

    /// Calls `hook` once per covered request with its [`Outcome`](crate::Outcome), status
    /// and duration: to count, log or alert in the application's own terms.
    pub fn on_outcome(self, hook: impl Fn(&OutcomeEvent<'_>) + Send + Sync + 'static) -> Self {
        let hook = Arc::new(hook);
        self.with_settings(|s| s.claim.policy.observer.set_hook(hook))
    }

    /// Sets the interval of the log lines of problems an outsider can cause at will (default
    /// 10 s): a forged signature, a missing or malformed key or order, a body too large or too
    /// slow, a key reused with another payload, a store that refuses or fails. Each is logged
    /// at most once per outcome and reason in an interval, and the next line says in its
    /// `suppressed` field how many were left out since; metrics and the outcome hook still see
    /// every request. `Duration::ZERO` logs every one.
    pub fn log_interval(self, interval: Duration) -> Self {
        self.with_settings(|s| s.claim.policy.observer.set_log_interval(interval))
    }

    /// Sets how the layer's own answers (400, 409, 413, 422, 503, …) are rendered (default
    /// [`ProblemJson`](crate::http::rejection::ProblemJson)): see [`rejection`](crate::http::rejection).
    pub fn render_rejection(self, render: impl RenderRejection) -> Self {
        let render: Arc<dyn RenderRejection> = Arc::new(render);
        self.with_settings(|s| s.reply.render_rejection = render)
    }
}

impl<St, K: Clone> Door<Records<St>, K> {
    /// Sets the local cache of completed records in front of the store, which answers the
    /// duplicates of records this instance completed (or read) without a round trip. On by
    /// default for a store that talks to a server (a [`LocalCache::new`], one per layer), off
    /// for the memory store. Give several layers clones of one [`LocalCache`] to share its
    /// bounds; [`LocalCache::off`] turns it off. See [`LocalCache`] for what is cached, for how
    /// long, and what an operator who deletes keys by hand must know.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    /// use tower_idempotency::store::LocalCache;
    ///
    /// let cache = LocalCache::new().max_entries(10_000).read_ttl(Duration::from_secs(1));
    /// let orders = IdempotencyLayer::api(MemoryStore::new()).local_cache(cache.clone());
    /// let refunds = IdempotencyLayer::api(MemoryStore::new()).local_cache(cache);
    /// # let _ = (orders, refunds);
    /// ```
    pub fn local_cache(self, cache: LocalCache) -> Self {
        self.with(|config| config.claims = config.claims.with_cache(Some(cache)))
    }

    /// Sets the lease: how long a claim blocks duplicates if its holder dies without finishing
    /// (default 10 s). A live holder's claim is renewed every third of the
    /// lease for as long as the inner service runs and its response streams, so the lease
    /// need not cover the slowest handler: it bounds how long a crashed worker's key stays
    /// blocked. Keep it a few times the store's worst latency, so a renewal is never late.
    pub fn lease(self, lease: Duration) -> Self {
        self.with_settings(|s| s.claim.policy.lease = lease)
    }

    /// Sets how long completed keys are kept (default 72 h): at least the sender's retry
    /// window. An inbox's door ([`InboxLayer`](crate::inbox::InboxLayer)) has none: the
    /// workers mark keys done, with the retention of
    /// [`Worker::retention`](crate::inbox::Worker::retention).
    pub fn retention(self, retention: Duration) -> Self {
        self.with_settings(|s| s.claim.policy.retention = retention)
    }

    /// Sets what happens to requests without a key (default [`MissingKey::Reject`]).
    pub fn missing_key(self, policy: MissingKey) -> Self {
        self.with_settings(|s| s.intake.missing_key = policy)
    }

    /// Sets how duplicates of completed keys are answered (default [`Mode::Ack`]).
    pub fn mode(self, mode: Mode) -> Self {
        self.with_settings(|s| s.reply.mode = mode)
    }

    /// Sets the response headers kept for replay (default: `content-type`,
    /// `content-language`, `location`, `etag`, `last-modified`). Other headers, such as
    /// `set-cookie`, are never stored.
    pub fn replay_headers(self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        let names = names.into_iter().collect();
        self.with_settings(|s| s.reply.replay_headers = names)
    }

    /// Sets what a key reused with a different payload gets (default [`OnMismatch::Reject`]).
    pub fn on_mismatch(self, on_mismatch: OnMismatch) -> Self {
        self.with_settings(|s| s.claim.on_mismatch = on_mismatch)
    }

    /// Sets what happens when the store is down (default [`FailureMode::Closed`]).
    pub fn failure_mode(self, mode: FailureMode) -> Self {
        self.with_settings(|s| s.claim.failure_mode = mode)
    }

    /// Sets the `Retry-After` of 409 in-flight answers (default 1 s).
    pub fn in_flight_retry_after(self, after: Duration) -> Self {
        self.with_settings(|s| s.claim.in_flight_retry_after = after)
    }

    /// Lets a duplicate wait up to `max` for an in-flight original to finish, then get its
    /// answer (the ack or the replay) instead of a 409. Off by default.
    pub fn wait_for_in_flight(self, max: Duration) -> Self {
        self.with_settings(|s| s.claim.policy.wait_in_flight = Some(max))
    }

    /// Turns the payload fingerprint on (default) or off. Off: a reused key is never a
    /// mismatch, and header-keyed requests are streamed to the inner service unbuffered.
    pub fn fingerprint(self, on: bool) -> Self {
        self.with_settings(|s| s.intake.fingerprint = on)
    }

    /// Sets how much of a response is held in memory before it is sent (default 64 KiB).
    /// Responses up to this size are recorded before the client sees them, and can be
    /// replayed; larger ones are streamed and recorded (ack only) when their stream ends. A
    /// duplicate of a gRPC call whose reply was larger gets `ALREADY_EXISTS`, since there is no
    /// reply to replay.
    pub fn response_buffer_limit(self, bytes: usize) -> Self {
        self.with_settings(|s| s.reply.response_buffer_limit = bytes)
    }

    /// Sets which responses count as success (default: 2xx). gRPC responses are always judged
    /// by their final `grpc-status`.
    pub fn success_when(
        self,
        classify: impl Fn(StatusCode, &HeaderMap) -> bool + Send + Sync + 'static,
    ) -> Self {
        let classifier = Classifier::new(classify);
        self.with_settings(|s| s.reply.classifier = classifier)
    }
}

impl<M: Orders, K: Clone> Door<M, K> {
    /// Orders the events of each object (see [`order`](crate::order)): a stale event (older
    /// than what was processed for its object) is acknowledged without the inner service, and
    /// events of one object are handled one at a time. Behind an
    /// [`InboxLayer`](crate::inbox::InboxLayer), the inbox hands an object's entries to workers
    /// one at a time, in position order, and an event older than what its object applied is
    /// answered stale at the door.
    ///
    /// A record store must keep each event's object with its key: it must be an
    /// [`OrderedStore`] (every store of this crate is). A layer on a store that is not does not
    /// compile:
    ///
    /// ```compile_fail,E0599
    /// use std::time::Duration;
    /// use tower_idempotency::key::JsonPathKey;
    /// use tower_idempotency::order::{EventOrder, PositionAt};
    /// use tower_idempotency::store::{Claim, Completion, Reservation, StoreError, Target};
    /// use tower_idempotency::store::record::Record;
    /// use tower_idempotency::{IdempotencyLayer, IdempotencyStore, MemoryStore};
    ///
    /// /// A store that keeps keys only: it does not implement `OrderedStore`.
    /// #[derive(Clone)]
    /// struct KeysOnly(MemoryStore);
    ///
    /// impl IdempotencyStore for KeysOnly {
    ///     async fn reserve(&self, t: &[Target], c: &Claim, l: Duration) -> Result<Vec<Reservation>, StoreError> {
    ///         self.0.reserve(t, c, l).await
    ///     }
    ///     async fn complete(&self, t: &[Target], c: &Claim, r: &Record, d: Duration) -> Result<Vec<Completion>, StoreError> {
    ///         self.0.complete(t, c, r, d).await
    ///     }
    ///     async fn release(&self, t: &[Target], c: &Claim) -> Result<usize, StoreError> {
    ///         self.0.release(t, c).await
    ///     }
    ///     async fn renew(&self, t: &[Target], c: &Claim, l: Duration) -> Result<bool, StoreError> {
    ///         self.0.renew(t, c, l).await
    ///     }
    /// }
    ///
    /// let order = EventOrder::new(JsonPathKey::new("$.object_id")?, PositionAt::sequence("$.sequence")?);
    /// let layer = IdempotencyLayer::webhook(KeysOnly(MemoryStore::new())).order(order);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn order(self, order: EventOrder) -> Self {
        let order = Arc::new(order);
        self.with_settings(|s| s.order = Some(order))
    }
}

impl<M, S, K: Clone> Layer<S> for Door<M, K> {
    type Service = Idempotency<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency::from_config(inner, Arc::new(self.config.clone()))
    }
}
