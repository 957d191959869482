//! The Redis store, on [`fred`]: standalone, cluster and sentinel, one round trip per call.
//!
//! [`RedisStore`] wraps an already connected fred client: a [`Pool`] or a
//! [`Client`](fred::clients::Client), for a standalone, clustered or sentinel deployment alike
//! (they are the same types, built from another [`Config`](fred::types::config::Config)).
//! Build and connect the client as your application already does, then hand it over:
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_idempotency::store::redis::RedisStore;
//! use tower_idempotency::store::redis::fred::prelude::*;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), fred::error::Error> {
//! let config = Config::from_url("redis://127.0.0.1:6379")?;
//! let pool = Builder::from_config(config)
//!     // Keep reconnecting (0 = no limit), 100 ms apart, after Redis restarts or fails over.
//!     .set_policy(ReconnectPolicy::new_constant(0, 100))
//!     // Do not let commands queue forever while Redis is unreachable.
//!     .with_performance_config(|perf| perf.default_command_timeout = Duration::from_secs(2))
//!     .with_connection_config(|conn| conn.connection_timeout = Duration::from_secs(2))
//!     .build_pool(4)?;
//! pool.init().await?;
//!
//! let store = RedisStore::new(pool);
//! // Hand `store` to the idempotency layer.
//! # let _ = store;
//! # Ok(())
//! # }
//! ```
//!
//! # What is stored
//!
//! One Redis string per key, named `ti:<16 base64url digits>` (see
//! [`StoreKey`]: the namespace, the optional request scope and the idempotency key hashed with
//! SHA-256, so no raw user bytes reach Redis). Its value is binary, in the versioned encoding of
//! [`crate::record`]:
//!
//! - **in flight**: [`StoredValue::encode_in_flight`], 25 bytes (tag, owner token, request
//!   fingerprint), written with `PX <lease>`: if the worker dies, Redis drops the claim when the
//!   lease runs out and the sender's next retry is processed again;
//! - **completed**: [`Record::encode`], 9 bytes in ack mode (tag and fingerprint), or the
//!   stored status, allow-listed headers, body and trailers in replay mode, written with
//!   `PX <retention>`: Redis drops the record when the retention period ends.
//!
//! Nothing else is written: no index, no second key, no background task.
//!
//! # Commands
//!
//! - [`reserve`](IdempotencyStore::reserve) is **one** command,
//!   `SET key <in flight> NX PX <lease ms> GET`: a nil reply means the claim is ours; otherwise
//!   the reply is the value already there (in flight or completed). A duplicate costs one
//!   command. `NX` together with `GET` needs **Redis 7.0 or later** (or a compatible server).
//! - [`complete`](IdempotencyStore::complete) and [`release`](IdempotencyStore::release) are
//!   one `EVALSHA` each, of a Lua script that compares the owner token (the first 17 bytes of the
//!   in-flight value, [`StoredValue::owner_prefix`]) before it overwrites the claim with the
//!   record or deletes it, so a slow original whose lease expired never touches a newer claim.
//!   When the server answers `NOSCRIPT` (after a restart, a failover or `SCRIPT FLUSH`), the
//!   script is sent again with `EVAL`, which runs it and puts it back in the server's script
//!   cache; the following calls are plain `EVALSHA` again. A first delivery therefore costs two
//!   commands: `SET` and `EVALSHA`.
//!
//! Every command touches exactly one key, so the store works unchanged on Redis Cluster (no hash
//! tags needed, no `CROSSSLOT`).
//!
//! # When Redis is down
//!
//! Every call then fails with a [`StoreError`] of kind [`StoreErrorKind::Unavailable`] (connection
//! refused or lost, command canceled, server loading or read-only) or
//! [`StoreErrorKind::Timeout`], and the layer answers as configured: 503 with `Retry-After`
//! (fail closed, the default) or passing the request through (fail open). No claim is taken, so
//! the sender's retry is processed once Redis is back.
//!
//! How fast a call fails is decided by the fred client, configured once for all its commands:
//!
//! - a [`ReconnectPolicy`](fred::types::config::ReconnectPolicy) (for example
//!   `ReconnectPolicy::new_constant(0, 100)`: retry forever, 100 ms apart) so that the *same*
//!   client, and so the same store, recovers by itself when Redis comes back or fails over;
//! - [`PerformanceConfig::default_command_timeout`](fred::types::config::PerformanceConfig):
//!   while the client reconnects, commands wait in its queue; this bounds the wait, and a command
//!   that exceeds it fails with [`StoreErrorKind::Timeout`] (and, if still queued, is dropped
//!   rather than sent late);
//! - [`ConnectionConfig::connection_timeout`](fred::types::config::ConnectionConfig) and
//!   `internal_command_timeout` bound each connection attempt when the host does not answer at
//!   all (no `RST`), and `max_command_attempts` bounds how often a command caught by a dropped
//!   connection is re-sent.
//!
//! Beware fred's defaults: without a reconnect policy the client stops for good when its
//! connection drops, and without a command timeout its commands then wait without limit. The
//! layer wraps every store call in its own timeout, so a request is still answered (503 when
//! failing closed), but only a reconnect policy brings the store back.
//!
//! Redis out of memory (`OOM`, with `maxmemory-policy noeviction`) is a
//! [`StoreErrorKind::Capacity`] error, answered like any store error. Prefer `noeviction` for a
//! Redis that holds these keys: every key has a TTL, so a `volatile-*` or `allkeys-*` policy may
//! evict a completed record early and let a duplicate through.
//!
//! A `SET` whose reply was lost with the connection may be re-sent by the client after it
//! reconnects; [`reserve`](IdempotencyStore::reserve) recognises its own claim (same token) in
//! the reply and still reports [`Reservation::Acquired`].

use std::sync::LazyLock;
use std::time::Duration;

pub use fred;
use fred::clients::Pool;
use fred::error::{Error as FredError, ErrorKind as FredErrorKind};
use fred::interfaces::{KeysInterface, LuaInterface};
use fred::types::scripts::Script;
use fred::types::{Expiration, SetOptions, Value};

use super::{Claim, IdempotencyStore, Reservation, StoreError, StoreErrorKind, StoreKey};
use crate::record::{Record, StoredValue};

/// `complete`: KEYS[1] = key, ARGV[1] = owner prefix (17 bytes), ARGV[2] = encoded record,
/// ARGV[3] = retention in milliseconds. Returns 1 when the record was written, 0 otherwise.
const COMPLETE_LUA: &str = r#"local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 17) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"#;

/// `release`: KEYS[1] = key, ARGV[1] = owner prefix (17 bytes). Returns 1 when the claim was
/// deleted, 0 otherwise.
const RELEASE_LUA: &str = r#"local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 17) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"#;

static COMPLETE: LazyLock<Script> = LazyLock::new(|| Script::from_lua(COMPLETE_LUA));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::from_lua(RELEASE_LUA));

/// An [`IdempotencyStore`] on Redis, through a connected [`fred`] client `C`: a [`Pool`] by
/// default, or a [`Client`](fred::clients::Client); standalone, clustered or sentinel.
///
/// Cheap to clone: fred clients are handles over shared state. See the [module
/// docs](self) for what is stored, which commands are sent and what happens when Redis is down.
#[derive(Clone, Debug)]
pub struct RedisStore<C = Pool> {
    client: C,
}

impl<C> RedisStore<C>
where
    C: KeysInterface + LuaInterface + 'static,
{
    /// A store over `client`, which should already be connected (`init().await`).
    ///
    /// Commands use the client's own configuration (timeouts, retries, reconnection policy).
    pub fn new(client: C) -> Self {
        RedisStore { client }
    }

    /// The underlying fred client.
    pub fn client(&self) -> &C {
        &self.client
    }

    /// Returns the underlying fred client.
    pub fn into_inner(self) -> C {
        self.client
    }

    /// Loads the `complete` and `release` scripts into the server's script cache (`SCRIPT
    /// LOAD`, on every primary of a cluster).
    ///
    /// Optional: a script missing from the cache is reloaded on first use anyway. Calling this
    /// at start-up only saves the first `complete` / `release` a second round trip.
    pub async fn load_scripts(&self) -> Result<(), StoreError> {
        for script in [&*COMPLETE, &*RELEASE] {
            let lua = script.lua().cloned().unwrap_or_default();
            let _: Value = self
                .client
                .script_load_cluster(lua)
                .await
                .map_err(store_error)?;
        }
        Ok(())
    }

    async fn run_script(
        &self,
        script: &Script,
        key: &StoreKey,
        args: Vec<Value>,
    ) -> Result<bool, StoreError> {
        let reply = evalsha_with_reload(&self.client, script, key, args)
            .await
            .map_err(store_error)?;
        match reply {
            Value::Integer(1) => Ok(true),
            Value::Integer(0) => Ok(false),
            other => Err(StoreError::with_source(
                StoreErrorKind::Corrupt,
                format!("unexpected script reply of type {:?}", other.kind()),
            )),
        }
    }
}

impl<C> IdempotencyStore for RedisStore<C>
where
    C: KeysInterface + LuaInterface + 'static,
{
    async fn reserve(
        &self,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        let value = StoredValue::encode_in_flight(claim.token(), &claim.fingerprint());
        let lease = millis(lease);
        let reply = set_nx_get(&self.client, key, value, lease)
            .await
            .map_err(store_error)?;
        let old = match reply {
            Value::Null => return Ok(Reservation::Acquired),
            Value::Bytes(bytes) => bytes,
            Value::String(s) => s.into_inner(),
            other => {
                return Err(StoreError::with_source(
                    StoreErrorKind::Corrupt,
                    format!("unexpected SET reply of type {:?}", other.kind()),
                ));
            }
        };
        Ok(match StoredValue::decode(&old)? {
            // Our own claim: the client retried a SET whose reply was lost with the connection.
            StoredValue::InFlight { token, .. } if token == *claim.token() => Reservation::Acquired,
            StoredValue::InFlight { fingerprint, .. } => Reservation::InFlight { fingerprint },
            StoredValue::Completed(record) => Reservation::Completed(record),
        })
    }

    async fn complete(
        &self,
        key: &StoreKey,
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> Result<bool, StoreError> {
        let args = vec![
            Value::Bytes(StoredValue::owner_prefix(claim.token())),
            Value::Bytes(record.encode()),
            Value::Integer(millis(retention)),
        ];
        self.run_script(&COMPLETE, key, args).await
    }

    async fn release(&self, key: &StoreKey, claim: &Claim) -> Result<bool, StoreError> {
        let args = vec![Value::Bytes(StoredValue::owner_prefix(claim.token()))];
        self.run_script(&RELEASE, key, args).await
    }
}

/// `SET key value NX PX lease GET`: nil when the key was absent (and is now ours), else the
/// value already there.
async fn set_nx_get<X: KeysInterface>(
    client: &X,
    key: &StoreKey,
    value: bytes::Bytes,
    lease_ms: i64,
) -> Result<Value, FredError> {
    client
        .set(
            key.as_str(),
            value,
            Some(Expiration::PX(lease_ms)),
            Some(SetOptions::NX),
            true,
        )
        .await
}

/// `EVALSHA`, and on `NOSCRIPT` the same call as `EVAL`, which also puts the script back in the
/// cache of the server that owns the key.
async fn evalsha_with_reload<X: LuaInterface>(
    client: &X,
    script: &Script,
    key: &StoreKey,
    args: Vec<Value>,
) -> Result<Value, FredError> {
    let result = client
        .evalsha(
            script.sha1().clone(),
            key.as_str(),
            Value::Array(args.clone()),
        )
        .await;
    match result {
        Err(error) if error.details().starts_with("NOSCRIPT") => {
            let lua = script.lua().cloned().unwrap_or_default();
            client.eval(lua, key.as_str(), Value::Array(args)).await
        }
        result => result,
    }
}

/// A duration as whole milliseconds for `PX`, at least 1 (Redis refuses `PX 0`).
fn millis(duration: Duration) -> i64 {
    duration.as_millis().clamp(1, i64::MAX as u128) as i64
}

/// Server errors that mean "not now": the server is loading, busy, read-only or without a
/// primary, or the cluster is reconfiguring.
const TRANSIENT_SERVER_ERRORS: [&str; 7] = [
    "LOADING",
    "BUSY",
    "MASTERDOWN",
    "READONLY",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "NOREPLICAS",
];

fn error_kind(error: &FredError) -> StoreErrorKind {
    let details = error.details();
    let prefix = details.split_whitespace().next().unwrap_or("");
    match error.kind() {
        FredErrorKind::IO
        | FredErrorKind::Canceled
        | FredErrorKind::Routing
        | FredErrorKind::Cluster
        | FredErrorKind::Sentinel
        | FredErrorKind::Backpressure => StoreErrorKind::Unavailable,
        FredErrorKind::Timeout => StoreErrorKind::Timeout,
        FredErrorKind::Parse => StoreErrorKind::Corrupt,
        _ if TRANSIENT_SERVER_ERRORS.contains(&prefix) => StoreErrorKind::Unavailable,
        _ if prefix == "OOM" => StoreErrorKind::Capacity,
        // The client was never initialized, has quit, or gave up reconnecting.
        FredErrorKind::Unknown
            if details.starts_with("Client is not initialized")
                || details.starts_with("Failed to send command to router") =>
        {
            StoreErrorKind::Unavailable
        }
        _ => StoreErrorKind::Other,
    }
}

fn store_error(error: FredError) -> StoreError {
    StoreError::with_source(error_kind(&error), error)
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn durations_become_positive_milliseconds() {
        assert_eq!(millis(Duration::from_secs(30)), 30_000);
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_micros(10)), 1);
        assert_eq!(millis(Duration::MAX), i64::MAX);
    }

    #[test]
    fn errors_map_to_store_error_kinds() {
        let cases = [
            (
                FredErrorKind::IO,
                "Connection reset",
                StoreErrorKind::Unavailable,
            ),
            (
                FredErrorKind::Canceled,
                "Connection closed",
                StoreErrorKind::Unavailable,
            ),
            (
                FredErrorKind::Timeout,
                "Request timed out.",
                StoreErrorKind::Timeout,
            ),
            (
                FredErrorKind::Parse,
                "Cannot parse",
                StoreErrorKind::Corrupt,
            ),
            (
                FredErrorKind::Unknown,
                "LOADING Redis is loading",
                StoreErrorKind::Unavailable,
            ),
            (
                FredErrorKind::Unknown,
                "READONLY You can't write",
                StoreErrorKind::Unavailable,
            ),
            (
                FredErrorKind::Unknown,
                "OOM command not allowed",
                StoreErrorKind::Capacity,
            ),
            (
                FredErrorKind::Unknown,
                "Client is not initialized.",
                StoreErrorKind::Unavailable,
            ),
            (
                FredErrorKind::Unknown,
                "ERR syntax error",
                StoreErrorKind::Other,
            ),
            (
                FredErrorKind::InvalidArgument,
                "WRONGTYPE Operation",
                StoreErrorKind::Other,
            ),
        ];
        for (kind, details, expected) in cases {
            let error = store_error(FredError::new(kind, details));
            assert_eq!(error.kind(), expected, "{details}");
            let source = error.source().expect("the fred error is the source");
            assert!(source.to_string().contains(details));
        }
    }

    #[test]
    fn scripts_hash_like_the_server() {
        // The SHA-1 Redis computes for the script text is what EVALSHA sends.
        assert_eq!(COMPLETE.sha1().len(), 40);
        assert_ne!(COMPLETE.sha1(), RELEASE.sha1());
    }
}
