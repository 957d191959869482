//! [`AnyStore`] and [`connect`]: a store chosen at run time from a URL, for applications that
//! take their store from the environment (`REDIS_URL`, `DATABASE_URL`) and should not be
//! generic over it.

use std::fmt;
use std::time::Duration;

use super::record::Record;
use super::{Claim, Completion, LocalCache, Reservation, StoreError, Target};
use crate::claim::guard::ClaimStore;
use crate::store::contract::{IdempotencyStore, OrderedStore};
use crate::store::memory::MemoryStore;

crate::util::run_time_backends!(
    /// A store chosen at run time: one type for every backend, so that an application picks its
    /// store from configuration without being generic over it. Built by [`connect`] (or from a
    /// store with `From`).
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    /// use tower_idempotency::store::AnyStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let url = std::env::var("IDEMPOTENCY_STORE").unwrap_or_else(|_| "memory:".to_owned());
    /// let store: AnyStore = tower_idempotency::store::connect(&url).await?;
    /// assert_eq!(store.backend(), "memory");
    /// let layer = IdempotencyLayer::webhook(store).namespace("github");
    /// # let _ = layer;
    /// // Or from a store built by hand:
    /// let store = AnyStore::from(MemoryStore::new());
    /// # let _ = store;
    /// # Ok(()) }
    /// ```
    ///
    /// Match it to reach the backend's own store, to build on the same connections (an inbox,
    /// the application's own transactions):
    ///
    /// ```no_run
    /// use tower_idempotency::store::AnyStore;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = tower_idempotency::store::connect("postgres://app@localhost/app").await?;
    /// if let AnyStore::Postgres(postgres) = &store {
    ///     let pool = postgres.pool().clone();
    ///     # let _ = pool;
    /// }
    /// # Ok(()) }
    /// ```
    AnyStore {
        memory: MemoryStore,
        redis: crate::redis::records::RedisStore,
        postgres: crate::sql::postgres::PostgresStore,
        sqlite: crate::sql::sqlite::SqliteStore,
    }
);

impl AnyStore {
    /// The backend's name: `memory`, `redis`, `postgres` or `sqlite`.
    pub fn backend(&self) -> &'static str {
        self.name()
    }
}

impl AnyStore {
    /// Turns on durable completion ([`RedisStore::durable_completion`](crate::RedisStore)) when
    /// the backend is Redis: a completed record is acknowledged by `replicas` replicas (within
    /// `timeout`) before the response. An error for another backend, or without the `redis`
    /// feature.
    pub fn durable_completion(
        self,
        replicas: u32,
        timeout: Duration,
    ) -> Result<Self, ConnectError> {
        match self {
            #[cfg(feature = "redis")]
            AnyStore::Redis(store) => Ok(store.durable_completion(replicas, timeout).into()),
            _ if cfg!(feature = "redis") => Err(ConnectError::Backend(
                "durable completion is a Redis store's setting; this store is not one".into(),
            )),
            _ => {
                let _ = (replicas, timeout);
                Err(ConnectError::FeatureOff {
                    backend: "Redis",
                    feature: "redis",
                })
            }
        }
    }
}

/// Why [`connect`] could not give a store.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL's scheme is none of `memory:`, `redis://`, `rediss://`, `redis-cluster://`,
    /// `redis-sentinel://`, `postgres://`, `postgresql://`, `sqlite://`.
    UnknownScheme(String),
    /// The URL names a backend whose crate feature is off.
    FeatureOff {
        /// The backend.
        backend: &'static str,
        /// The feature to turn on.
        feature: &'static str,
    },
    /// The backend could not be reached or set up (the URL is malformed, the server refused,
    /// the table could not be created).
    Backend(super::BoxError),
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectError::UnknownScheme(scheme) => write!(
                f,
                "unknown idempotency store URL scheme {scheme:?}: expected memory:, redis://, \
                 rediss://, redis-cluster://, redis-sentinel://, postgres:// or sqlite://"
            ),
            ConnectError::FeatureOff { backend, feature } => write!(
                f,
                "the {backend} store needs the crate feature `{feature}` \
                 (tower-idempotency = {{ features = [\"{feature}\"] }})"
            ),
            ConnectError::Backend(err) => write!(f, "could not open the idempotency store: {err}"),
        }
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConnectError::Backend(err) => Some(&**err),
            _ => None,
        }
    }
}

#[cfg(any(feature = "redis", feature = "postgres"))]
/// How long a connection attempt and a command may take: below the layer's store timeout
/// (2 s), so that a store that is down is reported as unavailable rather than waited for.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How many connections a Redis store opens: one carries the most commands per write, which
/// costs Redis and the client the least CPU per request (see the crate's benchmarks).
#[cfg(feature = "redis")]
const REDIS_CONNECTIONS: usize = 1;

#[cfg(any(feature = "postgres", feature = "sqlite"))]
/// How often the SQL stores' expired rows are purged.
const PURGE_EVERY: Duration = Duration::from_secs(600);

/// Opens the store a URL names, with the settings this crate recommends:
///
/// | URL | store | feature |
/// |---|---|---|
/// | `memory:` | [`MemoryStore::new`] | none |
/// | `redis://host:6379`, `rediss://..` | [`RedisStore`](crate::RedisStore) on a connected fred pool of one client | `redis` |
/// | `redis-cluster://host:port?node=host2:port2` | the same, clustered | `redis` |
/// | `redis-sentinel://host:26379?sentinelServiceName=mymaster` | the same, behind Sentinel | `redis` |
/// | `postgres://user@host/db` | [`PostgresStore`](crate::PostgresStore), tables migrated | `postgres` |
/// | `sqlite://receiver.db` (or `sqlite:receiver.db`) | [`SqliteStore::open`](crate::SqliteStore::open) | `sqlite` |
/// | `sqlite://receiver.db?locking=exclusive` | [`SqliteStore::open_exclusive`](crate::SqliteStore::open_exclusive): one process | `sqlite` |
///
/// Redis clients reconnect forever (exponential backoff up to 2 s) and time commands out
/// after 2 s; the SQL pools give up acquiring a connection after 1 s; the SQL stores purge
/// their expired rows every 10 minutes on a spawned task. For other settings, build the store
/// yourself and wrap it with `AnyStore::from`.
///
/// A URL whose backend's feature is off is a [`ConnectError::FeatureOff`] naming the feature.
pub async fn connect(url: &str) -> Result<AnyStore, ConnectError> {
    let scheme = url.split(':').next().unwrap_or_default();
    match scheme {
        "memory" => Ok(MemoryStore::new().into()),
        "redis" | "rediss" | "redis-cluster" | "redis-sentinel" => redis(url).await,
        "postgres" | "postgresql" => postgres(url).await,
        "sqlite" => sqlite(url).await,
        other => Err(ConnectError::UnknownScheme(other.to_owned())),
    }
}

#[cfg(feature = "redis")]
async fn redis(url: &str) -> Result<AnyStore, ConnectError> {
    use fred::prelude::*;
    let backend = |err: fred::error::Error| ConnectError::Backend(err.into());
    let config = Config::from_url(url).map_err(backend)?;
    let pool = Builder::from_config(config)
        .with_connection_config(|c| c.connection_timeout = CONNECT_TIMEOUT)
        .with_performance_config(|p| p.default_command_timeout = 2 * CONNECT_TIMEOUT)
        .set_policy(ReconnectPolicy::new_exponential(0, 100, 2_000, 2))
        .build_pool(REDIS_CONNECTIONS)
        .map_err(backend)?;
    pool.init().await.map_err(backend)?;
    let store = crate::redis::records::RedisStore::new(pool);
    // Saves the first call of each script a round trip (`NOSCRIPT`, then `EVAL`).
    store
        .load_scripts()
        .await
        .map_err(|err| ConnectError::Backend(err.into()))?;
    Ok(store.into())
}

#[cfg(not(feature = "redis"))]
async fn redis(_url: &str) -> Result<AnyStore, ConnectError> {
    Err(ConnectError::FeatureOff {
        backend: "Redis",
        feature: "redis",
    })
}

#[cfg(feature = "postgres")]
async fn postgres(url: &str) -> Result<AnyStore, ConnectError> {
    use super::sql::sqlx::postgres::PgPoolOptions;
    let pool = PgPoolOptions::new()
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect(url)
        .await
        .map_err(|err| ConnectError::Backend(err.into()))?;
    let store = crate::sql::postgres::PostgresStore::new(pool);
    store
        .migrate()
        .await
        .map_err(|err| ConnectError::Backend(err.into()))?;
    drop(store.spawn_purge(PURGE_EVERY));
    Ok(store.into())
}

#[cfg(not(feature = "postgres"))]
async fn postgres(_url: &str) -> Result<AnyStore, ConnectError> {
    Err(ConnectError::FeatureOff {
        backend: "PostgreSQL",
        feature: "postgres",
    })
}

#[cfg(feature = "sqlite")]
async fn sqlite(url: &str) -> Result<AnyStore, ConnectError> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .unwrap_or(url);
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let exclusive = match query {
        "" => false,
        "locking=exclusive" => true,
        other => {
            return Err(ConnectError::Backend(
                format!("unknown SQLite URL option {other:?}: expected locking=exclusive").into(),
            ));
        }
    };
    let opened = if exclusive {
        crate::sql::sqlite::SqliteStore::open_exclusive(path).await
    } else {
        crate::sql::sqlite::SqliteStore::open(path).await
    };
    let store = opened.map_err(|err| ConnectError::Backend(err.into()))?;
    drop(store.spawn_purge(PURGE_EVERY));
    Ok(store.into())
}

#[cfg(not(feature = "sqlite"))]
async fn sqlite(_url: &str) -> Result<AnyStore, ConnectError> {
    Err(ConnectError::FeatureOff {
        backend: "SQLite",
        feature: "sqlite",
    })
}

/// Forwards a call to the backend's store.
macro_rules! dispatch {
    ($self:expr, $store:ident => $call:expr) => {
        match $self {
            AnyStore::Memory($store) => $call,
            #[cfg(feature = "redis")]
            AnyStore::Redis($store) => $call,
            #[cfg(feature = "postgres")]
            AnyStore::Postgres($store) => $call,
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite($store) => $call,
        }
    };
}

/// Forwards an async call to the backend's store. The calls of the server stores are boxed:
/// unboxed, every call's future would be as large as the largest backend's (sqlx's and
/// fred's run to kilobytes), and a memory store call, which finishes in process, would copy
/// that much on every request; a server store's call pays one allocation beside its round trip.
macro_rules! dispatch_async {
    ($self:expr, $store:ident => $call:expr) => {
        match $self {
            AnyStore::Memory($store) => $call,
            #[cfg(feature = "redis")]
            AnyStore::Redis($store) => Box::pin(async move { $call }).await,
            #[cfg(feature = "postgres")]
            AnyStore::Postgres($store) => Box::pin(async move { $call }).await,
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite($store) => Box::pin(async move { $call }).await,
        }
    };
}

impl AnyStore {
    /// Claims on the backend's store itself (see [`ClaimStore::on`]).
    pub(crate) fn claims(&self, cache: Option<LocalCache>) -> ClaimStore {
        dispatch!(self, s => ClaimStore::on(s.clone(), cache))
    }
}

/// Every call goes to the backend's store.
impl IdempotencyStore for AnyStore {
    async fn reserve(
        &self,
        targets: &[Target],
        claim: &Claim,
        lease: Duration,
    ) -> Result<Vec<Reservation>, StoreError> {
        dispatch_async!(self, s => s.reserve(targets, claim, lease).await)
    }

    async fn complete(
        &self,
        targets: &[Target],
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> Result<Vec<Completion>, StoreError> {
        dispatch_async!(self, s => s.complete(targets, claim, record, retention).await)
    }

    async fn release(&self, targets: &[Target], claim: &Claim) -> Result<usize, StoreError> {
        dispatch_async!(self, s => s.release(targets, claim).await)
    }

    async fn renew(
        &self,
        targets: &[Target],
        claim: &Claim,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        dispatch_async!(self, s => s.renew(targets, claim, lease).await)
    }

    fn in_process(&self) -> bool {
        dispatch!(self, s => s.in_process())
    }

    fn command_timeout(&self) -> Option<Duration> {
        dispatch!(self, s => s.command_timeout())
    }
}

/// Every backend orders events.
impl OrderedStore for AnyStore {}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn schemes_are_recognised_and_features_named() {
        assert_eq!(connect("memory:").await.unwrap().backend(), "memory");
        let err = connect("mysql://x").await.unwrap_err();
        assert!(
            matches!(err, ConnectError::UnknownScheme(ref s) if s == "mysql"),
            "{err}"
        );
        assert!(err.to_string().contains("redis://"));
        #[cfg(not(feature = "redis"))]
        {
            let err = connect("redis://127.0.0.1:1").await.unwrap_err();
            assert!(err.to_string().contains("`redis`"), "{err}");
        }
        #[cfg(not(feature = "postgres"))]
        assert!(matches!(
            connect("postgres://x").await,
            Err(ConnectError::FeatureOff {
                feature: "postgres",
                ..
            })
        ));
        #[cfg(not(feature = "sqlite"))]
        assert!(matches!(
            connect("sqlite://x.db").await,
            Err(ConnectError::FeatureOff {
                feature: "sqlite",
                ..
            })
        ));
    }
}
