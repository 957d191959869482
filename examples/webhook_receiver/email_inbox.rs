//! The demo's email inbox, shared by the demo (`webhook_receiver`: the receiver and, unless
//! `INBOX_WORKERS=0`, workers in its process) and `inbox_worker` (the same workers without an
//! HTTP server): where the entries are kept, and what applying one does.
//!
//! The inbox is kept on the demo's store, over its connections (`AnyInbox::on`): `REDIS_URL` (a
//! `RedisInbox` named `inbox_email`), else `DATABASE_URL` (a `PostgresInbox` or `SqliteInbox`
//! in the table `inbox_email`, beside the demo tables `demo_effects` and `demo_messages`), else
//! memory.
//!
//! An event's effect (its event id counted, its message's status set) goes where every process
//! that should see it can read it, written together with the entry's completion, so that every
//! event is applied **exactly once** whatever happens to a worker (killed, paused past its
//! lease, cut off by a failover with `REDIS_WAIT_REPLICAS`):
//! - on SQL, rows of the demo tables written in the transaction that marks the entry done
//!   (`complete_in_tx`);
//! - on Redis, two hashes in the inbox's hash slot, written by the script that marks the entry
//!   done (`RedisInbox::complete_with`): `demo:effects:{inbox:inbox_email}` (event id →
//!   applications) and `demo:status:{inbox:inbox_email}` (message id → status);
//! - on memory, the demo process's own state.
//!
//! The demo's `GET /effects` and `GET /messages/{id}` read them, so what separate
//! `inbox_worker` processes applied can be checked over HTTP.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tower_idempotency::inbox::{AnyInbox, Backoff, InboxRequest, Worker};
use tower_idempotency::store::AnyStore;

/// The Redis hashes of the effects, in the inbox's hash slot: event id → applications, and
/// message id → status.
#[cfg(feature = "redis")]
const REDIS_EFFECTS: [&str; 2] = ["demo:effects:", "demo:status:"];

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The Redis inbox's name, the SQL inbox's table.
pub(crate) const INBOX_NAME: &str = "inbox_email";

/// The namespace of the inbox route's keys and of the workers' metrics.
pub(crate) const NAMESPACE: &str = "inbox-email";

/// How long a done event id dedups: the email provider retries within 72 hours.
pub(crate) const RETENTION: Duration = Duration::from_secs(72 * 3600);

/// How often the done keys past their retention are deleted from a SQL inbox.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
const PURGE_EVERY: Duration = Duration::from_secs(300);

/// The demo tables: applications per event id, and each message's status.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
const TABLES: [&str; 2] = [
    "CREATE TABLE IF NOT EXISTS demo_effects (event_id TEXT PRIMARY KEY, applied BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS demo_messages (message_id TEXT PRIMARY KEY, status TEXT NOT NULL)",
];

/// The email inbox on the demo's store, over its connections (`AnyInbox::on`); on SQL the
/// demo tables are created and a task purges the expired done keys.
pub(crate) async fn inbox_on(store: &AnyStore) -> Result<AnyInbox, BoxError> {
    let inbox = AnyInbox::on(store, INBOX_NAME).await?;
    #[cfg(feature = "postgres")]
    if let AnyInbox::Postgres(postgres) = &inbox {
        for table in TABLES {
            sqlx::query(table).execute(postgres.pool()).await?;
        }
        drop(postgres.spawn_purge(PURGE_EVERY));
    }
    #[cfg(feature = "sqlite")]
    if let AnyInbox::Sqlite(sqlite) = &inbox {
        for table in TABLES {
            sqlx::query(table).execute(sqlite.pool()).await?;
        }
        drop(sqlite.spawn_purge(PURGE_EVERY));
    }
    Ok(inbox)
}

/// `store` with durable writes when `REDIS_WAIT_REPLICAS=N` is set (and `REDIS_WAIT_TIMEOUT_MS`,
/// default 50): records, and the inbox built on it, wait for N replicas before answering.
pub(crate) fn durable_from_env(store: AnyStore) -> Result<AnyStore, BoxError> {
    let Some(replicas) = std::env::var("REDIS_WAIT_REPLICAS").ok() else {
        return Ok(store);
    };
    let replicas = replicas
        .parse()
        .map_err(|err| format!("REDIS_WAIT_REPLICAS={replicas:?}: {err}"))?;
    let timeout = std::env::var("REDIS_WAIT_TIMEOUT_MS")
        .ok()
        .map_or(Ok(50), |ms| ms.parse())
        .map_err(|err| format!("REDIS_WAIT_TIMEOUT_MS: {err}"))?;
    Ok(store.durable_completion(replicas, Duration::from_millis(timeout))?)
}

/// Effects every process can read, written with the entry's completion: rows of the demo
/// tables on SQL, hashes in the inbox's slot on Redis; `None` on memory.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "redis")),
    allow(unused_variables)
)]
pub(crate) fn shared_effects(inbox: &AnyInbox) -> Option<Effects> {
    #[cfg(feature = "redis")]
    if let AnyInbox::Redis(redis) = inbox {
        return Some(Effects::Redis(redis.clone()));
    }
    #[cfg(feature = "sqlite")]
    if let AnyInbox::Sqlite(sqlite) = inbox {
        return Some(Effects::Sqlite(sqlite.clone()));
    }
    #[cfg(feature = "postgres")]
    if let AnyInbox::Postgres(postgres) = inbox {
        return Some(Effects::Postgres(postgres.clone()));
    }
    None
}

/// An effect in this process: `(event_id, message_id, status)`.
pub(crate) type ApplyInProcess = dyn Fn(&str, &str, &str) + Send + Sync;

/// Where applying an email event leaves its effect (the event id counted, the message's
/// status set).
#[derive(Clone)]
pub(crate) enum Effects {
    /// In this process: `apply(event_id, message_id, status)`.
    #[allow(dead_code)] // `inbox_worker` has no process state to show.
    Process(Arc<ApplyInProcess>),
    /// Hashes in the inbox's slot, in the script that completes the entry.
    #[cfg(feature = "redis")]
    Redis(tower_idempotency::inbox::RedisInbox),
    /// Rows of the demo tables, in the transaction that completes the entry.
    #[cfg(feature = "sqlite")]
    Sqlite(tower_idempotency::inbox::SqliteInbox),
    /// Rows of the demo tables, in the transaction that completes the entry.
    #[cfg(feature = "postgres")]
    Postgres(tower_idempotency::inbox::PostgresInbox),
}

/// The status an email event of type `kind` (`email.delivered`) gives its message.
pub(crate) fn status_of(kind: &str) -> &str {
    kind.strip_prefix("email.").unwrap_or(kind)
}

/// What `INBOX_*` sets.
pub(crate) struct InboxSettings {
    /// Entries run at once (`INBOX_WORKERS`, 2; 0 receives only).
    pub(crate) workers: usize,
    max_attempts: u32,
    retry_base: Duration,
    lease: Duration,
}

impl InboxSettings {
    pub(crate) fn from_env() -> Result<Self, BoxError> {
        let number = |name: &str, default: u64| -> Result<u64, BoxError> {
            match std::env::var(name).ok().filter(|v| !v.is_empty()) {
                Some(value) => Ok(value
                    .parse()
                    .map_err(|err| format!("{name}={value:?}: {err}"))?),
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

    /// The workers on `inbox`, applying events to `effects`, as these settings say.
    pub(crate) fn worker(
        self,
        inbox: AnyInbox,
        effects: Effects,
    ) -> Worker<
        AnyInbox,
        impl tower::Service<InboxRequest, Response = (), Error = String, Future: Send> + Clone + Send,
    > {
        Worker::new(inbox, apply(effects))
            .namespace(NAMESPACE)
            .workers(self.workers.max(1))
            .lease(self.lease)
            .retention(RETENTION)
            .retry(Backoff::new(self.retry_base).max_attempts(self.max_attempts))
    }
}

/// The workers' handler: `demo_delay_ms: N` sleeps first, `demo_fail_attempts: N` fails the
/// first N attempts of the event in this process (across re-queues), then the effect.
fn apply(
    effects: Effects,
) -> impl tower::Service<InboxRequest, Response = (), Error = String, Future: Send> + Clone + Send {
    let attempts = Arc::new(Mutex::new(HashMap::<String, u64>::new()));
    tower::service_fn(move |request: InboxRequest| {
        let (effects, attempts) = (effects.clone(), attempts.clone());
        async move {
            let event: Value = serde_json::from_slice(request.body()).unwrap_or_default();
            if let Some(ms) = event["demo_delay_ms"].as_u64() {
                tokio::time::sleep(Duration::from_millis(ms.min(60_000))).await;
            }
            let (Some(event_id), Some(message_id), Some(kind)) = (
                event["event_id"].as_str(),
                event["message_id"].as_str(),
                event["type"].as_str(),
            ) else {
                return Err("event_id, message_id and type are required".to_owned());
            };
            let fail = event["demo_fail_attempts"].as_u64().unwrap_or(0);
            let attempt = {
                let mut attempts = attempts.lock().unwrap();
                let count = attempts.entry(event_id.to_owned()).or_default();
                *count += 1;
                *count
            };
            if attempt <= fail {
                return Err(format!("demo failure: attempt {attempt} of {fail} failing"));
            }
            effects
                .apply(&request, event_id, message_id, status_of(kind))
                .await
                .map_err(|err| err.to_string())
        }
    })
}

/// The demo tables' writes and the entry's completion in one transaction (one body for both
/// databases: a macro, as sqlx's executor bounds do not read well generically).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
macro_rules! in_transaction {
    ($inbox:expr, $request:expr, $event_id:expr, $message_id:expr, $status:expr) => {{
        let mut tx = $inbox.pool().begin().await?;
        // `applied` counts: a second application shows as 2, not as a no-op.
        sqlx::query(
            "INSERT INTO demo_effects (event_id, applied) VALUES ($1, 1) \
             ON CONFLICT (event_id) DO UPDATE SET applied = demo_effects.applied + 1",
        )
        .bind($event_id)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO demo_messages (message_id, status) VALUES ($1, $2) \
             ON CONFLICT (message_id) DO UPDATE SET status = excluded.status",
        )
        .bind($message_id)
        .bind($status)
        .execute(&mut *tx)
        .await?;
        let request = $request;
        let done = $inbox
            .complete_in_tx(&mut tx, request.key(), request.token(), RETENTION)
            .await?;
        if !done {
            // Another worker holds the entry now: the effect rolls back with `tx`.
            return Err("lease lost before the effect committed".into());
        }
        tx.commit().await?;
    }};
}

impl Effects {
    // Only the shared effects complete the entry themselves.
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "postgres", feature = "redis")),
        allow(unused_variables)
    )]
    async fn apply(
        &self,
        request: &InboxRequest,
        event_id: &str,
        message_id: &str,
        status: &str,
    ) -> Result<(), BoxError> {
        match self {
            Effects::Process(apply) => apply(event_id, message_id, status),
            #[cfg(feature = "redis")]
            Effects::Redis(inbox) => {
                let tag = inbox
                    .hash_tag(request.token())
                    .ok_or("not this inbox's lease")?;
                let [effects, statuses] = REDIS_EFFECTS.map(|prefix| format!("{prefix}{tag}"));
                let writes = tower_idempotency::inbox::RedisWrites::new()
                    .command(["HINCRBY", effects.as_str(), event_id, "1"])
                    .command(["HSET", statuses.as_str(), message_id, status]);
                let (key, token) = (request.key(), request.token());
                if !inbox.complete_with(key, token, writes, RETENTION).await? {
                    // Another worker holds the entry now: nothing was written.
                    return Err("lease lost before the effect was written".into());
                }
            }
            #[cfg(feature = "sqlite")]
            Effects::Sqlite(inbox) => in_transaction!(inbox, request, event_id, message_id, status),
            #[cfg(feature = "postgres")]
            Effects::Postgres(inbox) => {
                in_transaction!(inbox, request, event_id, message_id, status)
            }
        }
        Ok(())
    }
}

// Read by the demo's `GET /effects` and `GET /messages/{id}`; `inbox_worker` only writes.
#[allow(dead_code)]
impl Effects {
    /// Applications per event id in the demo tables or hashes; empty when the effects are in
    /// the process.
    pub(crate) async fn applied(&self) -> Result<Vec<(String, i64)>, BoxError> {
        const SELECT: &str = "SELECT event_id, applied FROM demo_effects";
        Ok(match self {
            #[cfg(feature = "redis")]
            Effects::Redis(inbox) => {
                let effects = format!("{}{}", REDIS_EFFECTS[0], redis_tag(inbox));
                let all: HashMap<String, i64> = redis_read(inbox, "HGETALL", vec![effects]).await?;
                all.into_iter().collect()
            }
            #[cfg(feature = "sqlite")]
            Effects::Sqlite(inbox) => sqlx::query_as(SELECT).fetch_all(inbox.pool()).await?,
            #[cfg(feature = "postgres")]
            Effects::Postgres(inbox) => sqlx::query_as(SELECT).fetch_all(inbox.pool()).await?,
            _ => Vec::new(),
        })
    }

    /// The status of `message_id` in the demo tables or hashes; `None` when absent or kept in
    /// the process.
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "postgres", feature = "redis")),
        allow(unused_variables)
    )]
    pub(crate) async fn status(&self, message_id: &str) -> Result<Option<String>, BoxError> {
        const SELECT: &str = "SELECT status FROM demo_messages WHERE message_id = $1";
        let row: Option<(String,)> = match self {
            #[cfg(feature = "redis")]
            Effects::Redis(inbox) => {
                let statuses = format!("{}{}", REDIS_EFFECTS[1], redis_tag(inbox));
                let args = vec![statuses, message_id.to_owned()];
                let status: Option<String> = redis_read(inbox, "HGET", args).await?;
                status.map(|status| (status,))
            }
            #[cfg(feature = "sqlite")]
            Effects::Sqlite(inbox) => {
                sqlx::query_as(SELECT)
                    .bind(message_id)
                    .fetch_optional(inbox.pool())
                    .await?
            }
            #[cfg(feature = "postgres")]
            Effects::Postgres(inbox) => {
                sqlx::query_as(SELECT)
                    .bind(message_id)
                    .fetch_optional(inbox.pool())
                    .await?
            }
            _ => None,
        };
        Ok(row.map(|(status,)| status))
    }
}

/// The demo inbox's hash tag (it has one partition): `{inbox:inbox_email}`.
#[cfg(feature = "redis")]
fn redis_tag(inbox: &tower_idempotency::inbox::RedisInbox) -> &str {
    inbox.prefix().trim_end_matches(':')
}

/// A read of the effects' hashes (routed by their first key, in the inbox's slot).
#[cfg(feature = "redis")]
async fn redis_read<R>(
    inbox: &tower_idempotency::inbox::RedisInbox,
    command: &'static str,
    args: Vec<String>,
) -> Result<R, BoxError>
where
    R: tower_idempotency::fred::types::FromValue,
{
    use tower_idempotency::fred::interfaces::ClientLike;
    use tower_idempotency::fred::types::{ClusterHash, CustomCommand};
    let command = CustomCommand::new_static(command, ClusterHash::FirstKey, false);
    Ok(inbox.client().custom(command, args).await?)
}
