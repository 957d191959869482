//! The Redis store, on [`fred`]: standalone, cluster and sentinel, one round trip per call,
//! batches included.
//!
//! [`RedisStore`] wraps an already connected fred client: a [`Pool`] or a
//! [`Client`], for a standalone, clustered or sentinel deployment alike
//! (they are the same types, built from another [`Config`](fred::types::config::Config)).
//! Build and connect the client as your application already does, then hand it over:
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_idempotency::store::redis::RedisStore;
//! use tower_idempotency::fred::prelude::*;
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
//! - **completed**: [`Record::encode_for`] the claim's token, 12 bytes in ack mode (tag, the
//!   first 3 bytes of the owner token as the record's owner tag, fingerprint), or with the
//!   stored status, allow-listed headers, body and trailers in replay mode, written with
//!   `PX <retention>`: Redis drops the record when the retention period ends. An ack-mode key
//!   costs 88 bytes of Redis memory (`MEMORY USAGE`, Redis 7.0, 64-bit: see
//!   `tests/redis_store.rs`).
//!
//! Nothing else is written: no index, no second key, no background task.
//!
//! # Local cache
//!
//! The store keeps the records this instance completed or read in a bounded
//! [`LocalCache`] (on by default), and answers their duplicates without a command. In-flight
//! claims are never cached. See [`RedisStore::local_cache`] and [the cache's
//! docs](crate::store::cache) for how long entries live and what deleting keys by hand implies.
//!
//! # Commands
//!
//! - [`reserve`](IdempotencyStore::reserve) is **one** command,
//!   `SET key <in flight> NX PX <lease ms> GET`: a nil reply means the claim is ours; otherwise
//!   the reply is the value already there (in flight or completed). A duplicate costs one
//!   command, or none when the [local cache](RedisStore::local_cache) holds its record. `NX`
//!   together with `GET` needs **Redis 7.0 or later** (or a compatible server).
//! - [`remaining`](IdempotencyStore::remaining), which the local cache calls in the background
//!   when a reserve read a completed record (once per cache miss, not on the request's path),
//!   is one `EVALSHA` of a script that reads the head of the value (`GETRANGE`) and, when it is
//!   that record's, its `PTTL`: the cache then keeps the record no longer than Redis does.
//! - [`complete`](IdempotencyStore::complete), [`release`](IdempotencyStore::release) and
//!   [`renew`](IdempotencyStore::renew) are one `EVALSHA` each, of a Lua script that compares
//!   the owner token (the first 17 bytes of the in-flight value, [`StoredValue::owner_prefix`])
//!   before it overwrites the claim with the record, deletes it or extends its lease, so a slow
//!   original whose lease expired never touches a newer claim. (`complete` also recognises the
//!   record its own claim wrote, by the owner tag in it, and answers
//!   [`Completion::AlreadyWritten`] to a retry.) When the server answers `NOSCRIPT` (after a
//!   restart, a failover or `SCRIPT FLUSH`), the script is sent again with `EVAL`, which runs it
//!   and puts it back in the server's script cache; the following calls are plain `EVALSHA`
//!   again. A first delivery therefore costs two commands: `SET` and `EVALSHA`.
//!
//! Every command touches exactly one key, so the store works unchanged on Redis Cluster (no hash
//! tags needed, no `CROSSSLOT`).
//!
//! ## Batches
//!
//! The items of a batch request are claimed and settled with the batch methods
//! ([`reserve_many`](IdempotencyStore::reserve_many),
//! [`complete_many`](IdempotencyStore::complete_many),
//! [`release_many`](IdempotencyStore::release_many),
//! [`renew_many`](IdempotencyStore::renew_many)). Each sends the same one-key command as its
//! single-key method, once per item, all in **one fred pipeline**: every command is written
//! before any reply is awaited, so a batch costs **one round trip** whatever its size (N
//! commands). No multi-key command and no multi-key script is used, so the items of one batch
//! may hash to any slots: a clustered client routes each command of the pipeline to the
//! primary owning its own key and awaits those primaries in parallel (still one round trip,
//! no `CROSSSLOT`); a standalone or sentinel client writes them all on one connection.
//!
//! - A first delivery of N new items costs 2 round trips and 2N commands (N `SET`, then N
//!   `EVALSHA`); a duplicate batch costs 1 round trip (N `SET`), and then, for the items the
//!   local cache did not hold, one `remaining` call each in the background. `tests/redis.rs`
//!   counts both, commands with `MONITOR` and round trips through a proxy that holds replies
//!   back.
//! - `NOSCRIPT`: the items whose script reply is `NOSCRIPT` are sent again with `EVAL`, all in a
//!   second pipeline: one more round trip for the batch, not one per item.
//! - An error reply for any item fails the whole call with the first one (in the batch's
//!   order); the other commands of the pipeline did run. After a failed `reserve_many` some
//!   items may be claimed: the layer releases them, as after a failed `reserve`.
//! - The pipeline goes through one [`Client`]: a [`Pool`] picks one of its clients for the
//!   batch ([`PickClient`]), so the store's client type must implement [`PickClient`].
//! - With [durable completion](#durable-completion), `complete_many` does not pipeline: see
//!   there.
//!
//! A batch request with one item goes through the single-key methods.
//!
//! # Redis Cluster and Sentinel
//!
//! Nothing changes but the client's configuration: a clustered client
//! (`redis-cluster://host:port?node=host2:port2`, or
//! [`ServerConfig::Clustered`](fred::types::config::ServerConfig::Clustered)) routes each command
//! to the primary that owns its key's hash slot and follows `MOVED` / `ASK` redirections; a
//! sentinel client (`redis-sentinel://host:26379?sentinelServiceName=mymaster&node=host:26380`,
//! or [`ServerConfig::Sentinel`](fred::types::config::ServerConfig::Sentinel)) asks the sentinels
//! for the current primary, and asks again when its connection drops after a failover. Give
//! either a [`ReconnectPolicy`](fred::types::config::ReconnectPolicy), as above: it is what lets
//! the same client find the new primary.
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_idempotency::store::redis::RedisStore;
//! use tower_idempotency::fred::prelude::*;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), fred::error::Error> {
//! // Any one node is enough: the client discovers the others with `CLUSTER SLOTS`.
//! let config = Config::from_url("redis-cluster://10.0.0.1:6379?node=10.0.0.2:6379")?;
//! // Or, behind Sentinel:
//! // Config::from_url("redis-sentinel://10.0.0.1:26379?sentinelServiceName=mymaster&node=10.0.0.2:26379")?;
//! let pool = Builder::from_config(config)
//!     .set_policy(ReconnectPolicy::new_constant(0, 100))
//!     .with_performance_config(|perf| perf.default_command_timeout = Duration::from_secs(2))
//!     .build_pool(4)?;
//! pool.init().await?;
//! let store = RedisStore::new(pool);
//! # let _ = store;
//! # Ok(())
//! # }
//! ```
//!
//! After a failover the new primary's script cache is empty: the first `EVALSHA` there answers
//! `NOSCRIPT` and is sent again as `EVAL` (see above), on the node that owns the key.
//!
//! ## What a failover costs
//!
//! While a primary is down and until its replica is promoted (a few seconds: the detection
//! timeout, `cluster-node-timeout` or `down-after-milliseconds`, plus the election), the client
//! cannot reach the keys of that primary; a cluster client reconnects as a whole, so commands for
//! the other primaries wait too. What the layer answers meanwhile depends on the timeouts:
//!
//! - **store timeout (and fred's `default_command_timeout`) longer than the failover**: calls
//!   wait in the client's queue and go to the new primary: requests are slower, none fails, and
//!   a claim taken before the failover is completed on the promoted replica (which received it);
//! - **shorter**: reserves fail, answered 503 (the sender retries, nothing is lost); but a
//!   completion that fails leaves its claim in place until the lease expires, after the
//!   response went out, so a *later* duplicate of that event is processed again.
//!
//! Replication in Redis is asynchronous: a write the old primary acknowledged but had not yet
//! sent to its replica is lost when the replica is promoted. For a claim, that opens a short
//! window in which a concurrent duplicate may be processed; for a completed record, a duplicate
//! delivered after the failover is processed again. [Durable
//! completion](RedisStore::durable_completion) closes the second window.
//!
//! # Durable completion
//!
//! [`RedisStore::durable_completion`]`(replicas, timeout)` makes
//! [`complete`](IdempotencyStore::complete) send `WAIT replicas timeout` right behind the
//! `EVALSHA` that writes the record, pipelined on the same connection of the same client (for a
//! [`Pool`], one of its clients is picked for the pair; in a cluster both are routed by the key's
//! hash slot, so they reach the primary that owns the key). `WAIT` answers once `replicas`
//! replicas have acknowledged every write of that connection, or when `timeout` has passed, with
//! the number that did. The call returns:
//!
//! - `Ok(Completion::Written)` (or `AlreadyWritten`, for a retry whose first attempt landed)
//!   when the record was written *and* at least `replicas` replicas acknowledged it: a failover
//!   to one of them keeps the record;
//! - `Ok(Completion::Lost)` when the claim was no longer ours, as without the option (the
//!   `WAIT`'s answer is then ignored);
//! - an error of kind [`StoreErrorKind::NotReplicated`] whose [`source`](std::error::Error::source)
//!   is a [`NotReplicated`] when fewer replicas acknowledged in time. The record **was written**
//!   on the primary, and stays there; only a failover before the replicas catch up loses it.
//!
//! The completion is not over before the replicas have acknowledged. If the primary dies in
//! between, the pipeline fails with its connection (the `WAIT` is never re-sent alone on another
//! connection, where it would count nothing), and the store sends the pair again: after the
//! failover, it reaches the promoted replica, which holds the claim, and writes the record
//! there. If that second attempt finds the claim gone, the first may have written the record
//! after all: the outcome is unknown and reported as an `Unavailable` error. This is why the
//! lease, renewed every third of itself, must outlive a failover (the default 10 s outlives a
//! typical one; raise it where failovers take longer), and why the store timeout should too.
//!
//! The layer logs a failed completion and still sends the response: the inner service's effect
//! has happened, and answering an error would only make the sender retry and, if the record is
//! lost, run the effect again. So durable completion does not change any response; it changes
//! what a `2xx` is worth: after a successful durable completion, the record is on the primary
//! and on `replicas` replicas, and a duplicate arriving after a failover is still answered from
//! it. A [`NotReplicated`] in the logs names the events that lack this guarantee.
//!
//! A batch ([`complete_many`](IdempotencyStore::complete_many)) is completed durably one item
//! at a time, not in one pipeline: one durable `complete` per item as above (script and
//! `WAIT`, with the same retries), all started at once (for a [`Pool`], each on a client of
//! its own choosing). Every item is attempted; the call fails with the first error in the
//! batch's order, for example a [`NotReplicated`] for one item while the others were
//! acknowledged. N items cost N pairs: their round trips overlap, but the `WAIT`s sharing a
//! connection are answered one after the other.
//!
//! The cost: the pair still takes one round trip, but its answer waits for the replicas'
//! acknowledgement (about one more replication round trip: on loopback, about 0.1 to 0.2 ms
//! at the median, see `docs/operations.md`), and the connection carrying the `WAIT` serves nothing
//! else meanwhile. When the replicas are down or lagging (after a failover, until the old
//! primary returns as a replica), every completion waits the full `timeout`, holds its
//! connection that long and ends in a [`NotReplicated`]: keep `timeout` short (tens of
//! milliseconds), prefer a [`Pool`], and keep the client's `default_command_timeout` well above
//! `timeout`. Claims and releases are never waited for.
//!
//! `WAIT` is not consensus. It does not stop a primary from accepting writes, and with several
//! replicas per primary a failover may promote one that had not acknowledged. If the key's slot
//! moves while the pair is in flight (`MOVED`), the store repeats the `WAIT` on the new owner:
//! right after a failover to the replica that has the write, best effort during a live
//! resharding. The `WAIT` is not flagged as a blocking command for fred (its wait is bounded by
//! `timeout`), so fred's `Blocking` policies never interrupt it nor fail other commands for it.
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

use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

use fred::clients::{Client, Pool};
use fred::error::{Error as FredError, ErrorKind as FredErrorKind};
use fred::interfaces::{ClientLike, ClusterInterface, KeysInterface, LuaInterface};
use fred::types::config::{Options, Server};
use fred::types::scripts::Script;
use fred::types::{ClusterHash, CustomCommand, Expiration, SetOptions, Value};

use super::cache::LocalCache;
use super::{
    Claim, Completion, IdempotencyStore, Reservation, StoreError, StoreErrorKind, StoreKey,
};
use crate::store::record::{Record, StoredValue, encoded_owner};

/// `complete`: KEYS[1] = key, ARGV[1] = owner prefix (17 bytes), ARGV[2] = encoded record,
/// ARGV[3] = retention in milliseconds, ARGV[4] = owner tag (8 bytes). Returns 1 when the
/// record was written, 2 when the key already holds a record of this owner (a retried
/// completion whose first attempt landed), 0 otherwise.
const COMPLETE_LUA: &str = r#"local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
if string.sub(v, 1, 17) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
local tag = string.byte(v, 1)
if (tag == 4 or tag == 5) and string.sub(v, 2, 1 + string.len(ARGV[4])) == ARGV[4] then
  return 2
end
return 0
"#;

/// `renew`: KEYS[1] = key, ARGV[1] = owner prefix (17 bytes), ARGV[2] = lease in
/// milliseconds. Returns 1 when the claim's lease was extended, 0 otherwise.
const RENEW_LUA: &str = r#"local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 17) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
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

/// `remaining`: KEYS[1] = key, ARGV[1] = the head of a completed record (tag, owner tag,
/// fingerprint). Returns the key's time to live in milliseconds when its value starts with
/// that head (read with `GETRANGE`: a replay record's body is not copied), a negative number
/// otherwise (-3; or -1 from `PTTL` for a key someone made persistent by hand).
const REMAINING_LUA: &str = r#"local head = redis.call('GETRANGE', KEYS[1], 0, string.len(ARGV[1]) - 1)
if head == ARGV[1] then
  return redis.call('PTTL', KEYS[1])
end
return -3
"#;

static COMPLETE: LazyLock<Script> = LazyLock::new(|| Script::from_lua(COMPLETE_LUA));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::from_lua(RELEASE_LUA));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::from_lua(RENEW_LUA));
static REMAINING: LazyLock<Script> = LazyLock::new(|| Script::from_lua(REMAINING_LUA));

/// An [`IdempotencyStore`] on Redis, through a connected [`fred`] client `C`: a [`Pool`] by
/// default, or a [`Client`]; standalone, clustered or sentinel.
///
/// Cheap to clone: fred clients are handles over shared state. See the [module
/// docs](self) for what is stored, which commands are sent and what happens when Redis is down.
#[derive(Clone, Debug)]
pub struct RedisStore<C = Pool> {
    client: C,
    durability: Option<Durability<C>>,
    cache: LocalCache,
}

/// The settings of [`RedisStore::durable_completion`].
struct Durability<C> {
    replicas: u32,
    timeout: Duration,
    /// Picks the one client that sends both the write and its `WAIT`.
    pick: fn(&C) -> Client,
}

impl<C> Clone for Durability<C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<C> Copy for Durability<C> {}

impl<C> fmt::Debug for Durability<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Durability")
            .field("replicas", &self.replicas)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// A fred client type that can hand out one [`Client`], so that a sequence of commands travels
/// through one client: a [`Client`] is itself, a [`Pool`] picks one of its clients (a connected
/// one when it can).
///
/// Needed by the batch methods ([`reserve_many`](IdempotencyStore::reserve_many) and the
/// others send one [`Pipeline`](fred::clients::Pipeline) per batch, and only a [`Client`] has
/// pipelines) and by [`RedisStore::durable_completion`] (a write and the `WAIT` behind it share
/// a connection).
pub trait PickClient {
    /// One client, for a command sequence that must go through one client.
    fn pick_client(&self) -> Client;
}

impl PickClient for Client {
    fn pick_client(&self) -> Client {
        self.clone()
    }
}

impl PickClient for Pool {
    fn pick_client(&self) -> Client {
        self.next_connected().clone()
    }
}

/// The error behind a [`StoreErrorKind::NotReplicated`] from a durable
/// [`complete`](IdempotencyStore::complete): the record was written on the primary, but fewer
/// replicas than required acknowledged it within the timeout (see
/// [`RedisStore::durable_completion`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotReplicated {
    acknowledged: u32,
    required: u32,
    timeout: Duration,
}

impl NotReplicated {
    /// How many replicas acknowledged the record (`WAIT`'s reply).
    pub fn acknowledged(&self) -> u32 {
        self.acknowledged
    }

    /// How many were required.
    pub fn required(&self) -> u32 {
        self.required
    }

    /// How long the primary waited for them.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

impl fmt::Display for NotReplicated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the completed record was written on the primary but acknowledged by {} of {} \
             required replicas within {} ms; it may not survive a failover",
            self.acknowledged,
            self.required,
            self.timeout.as_millis()
        )
    }
}

impl std::error::Error for NotReplicated {}

impl<C> RedisStore<C>
where
    C: KeysInterface + LuaInterface + 'static,
{
    /// A store over `client`, which should already be connected (`init().await`).
    ///
    /// Commands use the client's own configuration (timeouts, retries, reconnection policy).
    pub fn new(client: C) -> Self {
        RedisStore {
            client,
            durability: None,
            cache: LocalCache::new(),
        }
    }

    /// Sets the local cache of completed records this store answers duplicates from without a
    /// round trip: on by default ([`LocalCache::new`]); [`LocalCache::off`] turns it off. See
    /// [the cache's docs](crate::store::cache) for what is cached, for how long, and what an
    /// operator who deletes keys by hand must know. Clones of the store share the cache.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use tower_idempotency::store::cache::LocalCache;
    /// # use tower_idempotency::store::redis::RedisStore;
    /// # fn docs(pool: fred::clients::Pool) {
    /// let store = RedisStore::new(pool)
    ///     .local_cache(LocalCache::new().max_entries(10_000).read_ttl(Duration::from_secs(1)));
    /// # }
    /// ```
    pub fn local_cache(mut self, cache: LocalCache) -> Self {
        self.cache = cache;
        self
    }

    /// The local cache of completed records.
    pub fn cache(&self) -> &LocalCache {
        &self.cache
    }

    /// Durable completion: after writing a completed record, waits until at least `replicas`
    /// replicas have acknowledged it (`WAIT replicas timeout`, pipelined behind the write on the
    /// same connection), and reports an error when fewer did within `timeout`. See [Durable
    /// completion](self#durable-completion) for the guarantees and the cost.
    ///
    /// `replicas` = 0 turns it off. `timeout` is rounded to whole milliseconds, at least 1
    /// (`WAIT` with 0 would wait forever); keep it well below the client's
    /// `default_command_timeout`. Claims and releases are not waited for.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use tower_idempotency::store::redis::RedisStore;
    /// # fn docs(pool: fred::clients::Pool) {
    /// // Every primary has one replica: a completed record is on both before the response.
    /// let store = RedisStore::new(pool).durable_completion(1, Duration::from_millis(50));
    /// # }
    /// ```
    pub fn durable_completion(mut self, replicas: u32, timeout: Duration) -> Self
    where
        C: PickClient,
    {
        self.durability = (replicas > 0).then_some(Durability {
            replicas,
            timeout,
            pick: C::pick_client,
        });
        self
    }

    /// The `(replicas, timeout)` of [`durable_completion`](Self::durable_completion), if on.
    pub fn durability(&self) -> Option<(u32, Duration)> {
        self.durability.map(|d| (d.replicas, d.timeout))
    }

    /// The underlying fred client.
    pub fn client(&self) -> &C {
        &self.client
    }

    /// Returns the underlying fred client.
    pub fn into_inner(self) -> C {
        self.client
    }

    /// Loads the `complete`, `release`, `renew` and `remaining` scripts into the server's
    /// script cache (`SCRIPT LOAD`, on every primary of a cluster).
    ///
    /// Optional: a script missing from the cache is reloaded on first use anyway. Calling this
    /// at start-up only saves the first call of each script (single-key or batch) a second
    /// round trip.
    pub async fn load_scripts(&self) -> Result<(), StoreError> {
        for script in [&*COMPLETE, &*RELEASE, &*RENEW, &*REMAINING] {
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
        args: impl Fn() -> Vec<Value>,
    ) -> Result<i64, StoreError> {
        let reply = evalsha_with_reload(&self.client, script, key, args)
            .await
            .map_err(store_error)?;
        script_reply(reply)
    }
}

/// The integer reply of the `complete`, `release` and `renew` scripts.
fn script_reply(reply: Value) -> Result<i64, StoreError> {
    match reply {
        Value::Integer(n @ 0..=2) => Ok(n),
        other => Err(StoreError::with_source(
            StoreErrorKind::Corrupt,
            format!("unexpected script reply of type {:?}", other.kind()),
        )),
    }
}

/// The [`Completion`] of a `complete` script's reply.
fn completion(reply: i64) -> Completion {
    match reply {
        1 => Completion::Written,
        2 => Completion::AlreadyWritten,
        _ => Completion::Lost,
    }
}

/// One [`Reservation`] per key from the replies of `SET NX GET`, in order, or the first
/// error (in key order).
fn reservations(
    replies: Vec<Result<Value, FredError>>,
    claim: &Claim,
) -> Result<Vec<Reservation>, StoreError> {
    replies
        .into_iter()
        .map(|reply| reservation(reply.map_err(store_error)?, claim))
        .collect()
}

/// The [`Reservation`] a `SET key <claim> NX PX lease GET` reply means for `claim`.
fn reservation(reply: Value, claim: &Claim) -> Result<Reservation, StoreError> {
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

/// The arguments of the `complete` script for `claim`, `record` and `retention`.
fn complete_args(claim: &Claim, record: &Record, retention: Duration) -> Vec<Value> {
    vec![
        Value::Bytes(StoredValue::owner_prefix(claim.token())),
        Value::Bytes(record.encode_for(claim.token())),
        Value::Integer(millis(retention)),
        Value::Bytes(encoded_owner(claim.token())),
    ]
}

/// The store's own calls, without the local cache.
impl<C> RedisStore<C>
where
    C: KeysInterface + LuaInterface + PickClient + 'static,
{
    async fn reserve_uncached(
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
        reservation(reply, claim)
    }

    async fn complete_uncached(
        &self,
        key: &StoreKey,
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> Result<Completion, StoreError> {
        let args = || complete_args(claim, record, retention);
        match self.durability {
            None => self.run_script(&COMPLETE, key, args).await.map(completion),
            Some(durability) => {
                let client = (durability.pick)(&self.client);
                Box::pin(complete_durably(&client, durability, key, args())).await
            }
        }
    }

    async fn release_uncached(&self, key: &StoreKey, claim: &Claim) -> Result<bool, StoreError> {
        let args = || vec![Value::Bytes(StoredValue::owner_prefix(claim.token()))];
        Ok(self.run_script(&RELEASE, key, args).await? == 1)
    }

    async fn renew_uncached(
        &self,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let args = || {
            vec![
                Value::Bytes(StoredValue::owner_prefix(claim.token())),
                Value::Integer(millis(lease)),
            ]
        };
        Ok(self.run_script(&RENEW, key, args).await? == 1)
    }

    /// One `SET key <in flight> NX PX <lease ms> GET` per key, all in one pipeline: one round
    /// trip. An error reply for any key fails the call with the first one (in key order); the
    /// other keys were claimed or not, and the caller releases what is ours.
    async fn reserve_many_uncached(
        &self,
        keys: &[StoreKey],
        claim: &Claim,
        lease: Duration,
    ) -> Result<Vec<Reservation>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let value = StoredValue::encode_in_flight(claim.token(), &claim.fingerprint());
        let lease = millis(lease);
        let client = self.client.pick_client();
        let pipeline = client.pipeline();
        for key in keys {
            // Queued in memory: the reply is `QUEUED`, the answer comes with the pipeline's.
            let _: Value = set_nx_get(&pipeline, key, value.clone(), lease)
                .await
                .map_err(store_error)?;
        }
        let replies =
            pipeline_replies(pipeline.try_all::<Value>().await, keys.len()).map_err(store_error)?;
        reservations(replies, claim)
    }

    /// One `EVALSHA` of the `complete` script per key, all in one pipeline: one round trip
    /// (two after a `NOSCRIPT`). With [durable completion](RedisStore::durable_completion),
    /// one durable [`complete`](IdempotencyStore::complete) per key instead, all started at
    /// once: every key is attempted, and the first error (in key order) is returned.
    async fn complete_many_uncached(
        &self,
        keys: &[StoreKey],
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> Result<Vec<Completion>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let args = complete_args(claim, record, retention);
        match self.durability {
            None => {
                let client = self.client.pick_client();
                let replies = scripts_pipelined(&client, &COMPLETE, keys, &args).await?;
                Ok(replies.into_iter().map(completion).collect())
            }
            Some(durability) => {
                let each = keys.iter().map(|key| {
                    let client = (durability.pick)(&self.client);
                    let args = args.clone();
                    async move { complete_durably(&client, durability, key, args).await }
                });
                futures_util::future::join_all(each)
                    .await
                    .into_iter()
                    .collect()
            }
        }
    }

    /// One `EVALSHA` of the `release` script per key, all in one pipeline: one round trip (two
    /// after a `NOSCRIPT`).
    async fn release_many_uncached(
        &self,
        keys: &[StoreKey],
        claim: &Claim,
    ) -> Result<usize, StoreError> {
        if keys.is_empty() {
            return Ok(0);
        }
        let args = [Value::Bytes(StoredValue::owner_prefix(claim.token()))];
        let client = self.client.pick_client();
        let replies = scripts_pipelined(&client, &RELEASE, keys, &args).await?;
        Ok(replies.into_iter().filter(|&reply| reply == 1).count())
    }

    /// One `EVALSHA` of the `renew` script per key, all in one pipeline: one round trip (two
    /// after a `NOSCRIPT`). Every key is renewed that is still ours, even when another is not.
    async fn renew_many_uncached(
        &self,
        keys: &[StoreKey],
        claim: &Claim,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        if keys.is_empty() {
            return Ok(true);
        }
        let args = [
            Value::Bytes(StoredValue::owner_prefix(claim.token())),
            Value::Integer(millis(lease)),
        ];
        let client = self.client.pick_client();
        let replies = scripts_pipelined(&client, &RENEW, keys, &args).await?;
        Ok(replies.into_iter().all(|reply| reply == 1))
    }
}

/// The store works with any fred client that can hand out a [`Client`] ([`PickClient`]: a
/// [`Client`] or a [`Pool`]), which the batch methods need for their pipelines. Every call goes
/// through the [local cache](RedisStore::local_cache) first.
impl<C> IdempotencyStore for RedisStore<C>
where
    C: KeysInterface + LuaInterface + PickClient + 'static,
{
    /// `EVALSHA` of a script that reads the key and, when it holds `record`, its `PTTL`: one
    /// round trip, made by the local cache in the background.
    async fn remaining(
        &self,
        key: &StoreKey,
        record: &Record,
    ) -> Result<Option<Duration>, StoreError> {
        let args = || vec![Value::Bytes(record.encoded_head())];
        let reply = evalsha_with_reload(&self.client, &REMAINING, key, args)
            .await
            .map_err(store_error)?;
        match reply {
            Value::Integer(ms) => Ok(u64::try_from(ms).ok().map(Duration::from_millis)),
            other => Err(StoreError::with_source(
                StoreErrorKind::Corrupt,
                format!("unexpected script reply of type {:?}", other.kind()),
            )),
        }
    }

    async fn reserve(
        &self,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        let store = self.reserve_uncached(key, claim, lease);
        self.cache.reserve(key, self, store).await
    }

    async fn complete(
        &self,
        key: &StoreKey,
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> Result<Completion, StoreError> {
        let store = self.complete_uncached(key, claim, record, retention);
        self.cache
            .complete(key, claim, record, retention, self, store)
            .await
    }

    async fn release(&self, key: &StoreKey, claim: &Claim) -> Result<bool, StoreError> {
        let store = self.release_uncached(key, claim);
        self.cache
            .forgetting(std::slice::from_ref(key), store)
            .await
    }

    async fn renew(
        &self,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let store = self.renew_uncached(key, claim, lease);
        self.cache
            .forgetting(std::slice::from_ref(key), store)
            .await
    }

    async fn reserve_many(
        &self,
        keys: &[StoreKey],
        claim: &Claim,
        lease: Duration,
    ) -> Result<Vec<Reservation>, StoreError> {
        let store = |misses: Vec<StoreKey>| async move {
            self.reserve_many_uncached(&misses, claim, lease).await
        };
        self.cache.reserve_many(keys, self, store).await
    }

    async fn complete_many(
        &self,
        keys: &[StoreKey],
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> Result<Vec<Completion>, StoreError> {
        let store = self.complete_many_uncached(keys, claim, record, retention);
        self.cache
            .complete_many(keys, claim, record, retention, self, store)
            .await
    }

    async fn release_many(&self, keys: &[StoreKey], claim: &Claim) -> Result<usize, StoreError> {
        let store = self.release_many_uncached(keys, claim);
        self.cache.forgetting(keys, store).await
    }

    async fn renew_many(
        &self,
        keys: &[StoreKey],
        claim: &Claim,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let store = self.renew_many_uncached(keys, claim, lease);
        self.cache.forgetting(keys, store).await
    }
}

/// `SET key value NX PX lease GET`: nil when the key was absent (and is now ours), else the
/// value already there.
///
/// fred's command futures are large (about 10 KiB): each is boxed where it is made, so that
/// the futures around it stay small and are never copied whole.
async fn set_nx_get<X: KeysInterface>(
    client: &X,
    key: &StoreKey,
    value: bytes::Bytes,
    lease_ms: i64,
) -> Result<Value, FredError> {
    Box::pin(client.set(
        key.as_str(),
        value,
        Some(Expiration::PX(lease_ms)),
        Some(SetOptions::NX),
        true,
    ))
    .await
}

/// `EVALSHA`, and on `NOSCRIPT` the same call as `EVAL`, which also puts the script back in the
/// cache of the server that owns the key. `args` makes the arguments: once, and again only for
/// the `EVAL` (a copy kept for a rare retry would cost an allocation per argument).
async fn evalsha_with_reload<X: LuaInterface>(
    client: &X,
    script: &Script,
    key: &StoreKey,
    args: impl Fn() -> Vec<Value>,
) -> Result<Value, FredError> {
    // Boxed where made, like the `SET` of `set_nx_get`.
    let result =
        Box::pin(client.evalsha(script.sha1().clone(), key.as_str(), Value::Array(args()))).await;
    match result {
        Err(error) if is_noscript(&error) => {
            let lua = script.lua().cloned().unwrap_or_default();
            Box::pin(client.eval(lua, key.as_str(), Value::Array(args()))).await
        }
        result => result,
    }
}

/// `script` on every key (with the same `args`), in one pipeline on `client`: one reply per
/// key, in order. The keys whose reply is `NOSCRIPT` are sent again with `EVAL`, in a second
/// pipeline (which also puts the script back in the cache of each server that lacked it).
/// An error reply for any key fails the call with the first one (in key order).
async fn scripts_pipelined(
    client: &Client,
    script: &Script,
    keys: &[StoreKey],
    args: &[Value],
) -> Result<Vec<i64>, StoreError> {
    let mut replies = script_pipeline(client, script, true, keys.iter(), args)
        .await
        .map_err(store_error)?;
    let missing: Vec<usize> = (0..replies.len())
        .filter(|&i| matches!(&replies[i], Err(e) if is_noscript(e)))
        .collect();
    if !missing.is_empty() {
        let retried = script_pipeline(
            client,
            script,
            false,
            missing.iter().map(|&i| &keys[i]),
            args,
        )
        .await
        .map_err(store_error)?;
        for (i, reply) in missing.into_iter().zip(retried) {
            replies[i] = reply;
        }
    }
    replies
        .into_iter()
        .map(|reply| script_reply(reply.map_err(store_error)?))
        .collect()
}

/// `EVALSHA` (or `EVAL`) of `script` on each of `keys`, in one pipeline on `client`: one
/// reply per key, or the error that failed the pipeline as a whole.
async fn script_pipeline<'k>(
    client: &Client,
    script: &Script,
    by_hash: bool,
    keys: impl ExactSizeIterator<Item = &'k StoreKey>,
    args: &[Value],
) -> Result<Vec<Result<Value, FredError>>, FredError> {
    let expected = keys.len();
    let pipeline = client.pipeline();
    for key in keys {
        let slot = fred::util::redis_keyslot(key.as_str().as_bytes());
        let (cmd, script_args) = script_command(script, by_hash, key, args, slot);
        // Queued in memory: the reply is `QUEUED`, the answer comes with the pipeline's.
        let () = pipeline.custom(cmd, script_args).await?;
    }
    pipeline_replies(pipeline.try_all::<Value>().await, expected)
}

/// The replies of a pipeline of `expected` commands
/// ([`Pipeline::try_all`](fred::clients::Pipeline::try_all)), one per command, or the error
/// that failed the pipeline as a whole (fred then answers with that one error).
fn pipeline_replies(
    replies: Vec<Result<Value, FredError>>,
    expected: usize,
) -> Result<Vec<Result<Value, FredError>>, FredError> {
    if replies.len() == expected {
        return Ok(replies);
    }
    Err(replies
        .into_iter()
        .find_map(Result::err)
        .unwrap_or_else(|| FredError::new(FredErrorKind::Protocol, "missing pipeline replies")))
}

/// Whether a script call failed because the server's script cache lacks the script.
fn is_noscript(error: &FredError) -> bool {
    error.details().starts_with("NOSCRIPT")
}

/// `EVALSHA sha 1 key args..` (or `EVAL lua 1 key args..`) as a custom command routed by
/// `slot`, the key's: fred's pipelines have no Lua interface.
fn script_command(
    script: &Script,
    by_hash: bool,
    key: &StoreKey,
    args: &[Value],
    slot: u16,
) -> (CustomCommand, Vec<Value>) {
    let (name, body) = if by_hash {
        ("EVALSHA", script.sha1().clone())
    } else {
        ("EVAL", script.lua().cloned().unwrap_or_default())
    };
    let mut script_args = Vec::with_capacity(3 + args.len());
    script_args.push(Value::from(body));
    script_args.push(Value::Integer(1));
    script_args.push(Value::from(key.as_str()));
    script_args.extend_from_slice(args);
    let cmd = CustomCommand::new_static(name, ClusterHash::Custom(slot), false);
    (cmd, script_args)
}

/// `complete` with [`Durability`]: the script and a `WAIT` pipelined on one connection of
/// `client` (the script sent again as `EVAL` on `NOSCRIPT`), then the `WAIT` repeated on the
/// new owner if the key's slot moved meanwhile.
///
/// fred answers a pipeline as a whole: when its connection closes with the `WAIT` in flight
/// (which is never re-sent alone, see [`wait_options`]) the pipeline fails, while fred may
/// still re-send the script on the next connection without telling anyone. The pair is then
/// sent once more; if the script then finds the claim gone, it may be our own re-sent script
/// that completed it, so the outcome is unknown and reported as an error.
async fn complete_durably<C>(
    client: &Client,
    durability: Durability<C>,
    key: &StoreKey,
    args: Vec<Value>,
) -> Result<Completion, StoreError> {
    let slot = fred::util::redis_keyslot(key.as_str().as_bytes());
    let owner = slot_owner(client, slot);
    let mut aborted: Option<FredError> = None;
    for _ in 0..2 {
        let mut pair =
            script_then_wait(client, &COMPLETE, true, key, &args, slot, durability).await;
        if matches!(&pair, Ok((Err(e), _)) if is_noscript(e)) {
            pair = script_then_wait(client, &COMPLETE, false, key, &args, slot, durability).await;
        }
        let (written, mut acknowledged) = match pair {
            Ok(replies) => replies,
            Err(error) => {
                let timed_out = *error.kind() == FredErrorKind::Timeout;
                aborted = Some(error);
                if timed_out {
                    break;
                }
                continue;
            }
        };
        // An interrupted first attempt that did land shows as 2 (our own record): the WAIT
        // behind the retry still counts it, since it covers every write of the connection
        // and the replicas receive writes in order.
        let outcome = completion(script_reply(written.map_err(store_error)?)?);
        if outcome == Completion::Lost {
            return Ok(Completion::Lost);
        }
        if slot_owner(client, slot) != owner {
            // The write was redirected (MOVED) after the WAIT had left for the former owner.
            acknowledged = wait_for_replicas(client, slot, durability).await;
        }
        let acknowledged = match acknowledged.map_err(store_error)? {
            Value::Integer(n) => u32::try_from(n).unwrap_or(0),
            other => {
                return Err(StoreError::with_source(
                    StoreErrorKind::Corrupt,
                    format!("unexpected WAIT reply of type {:?}", other.kind()),
                ));
            }
        };
        if acknowledged < durability.replicas {
            return Err(StoreError::with_source(
                StoreErrorKind::NotReplicated,
                NotReplicated {
                    acknowledged,
                    required: durability.replicas,
                    timeout: durability.timeout,
                },
            ));
        }
        return Ok(outcome);
    }
    let error = aborted.unwrap_or_else(FredError::new_canceled);
    Err(store_error(error))
}

/// The replies of a script and the `WAIT` behind it, or the error that failed the pipeline.
type ScriptAndWait = Result<(Result<Value, FredError>, Result<Value, FredError>), FredError>;

/// `EVALSHA` (or `EVAL`) of `script` on `key`, then `WAIT`, in one pipeline: one round trip,
/// both on the connection `client` has to the node owning `slot`.
async fn script_then_wait<C>(
    client: &Client,
    script: &Script,
    by_hash: bool,
    key: &StoreKey,
    args: &[Value],
    slot: u16,
    durability: Durability<C>,
) -> ScriptAndWait {
    // fred's pipelines have no Lua interface: the script goes as a custom command, routed by
    // the key's slot like the WAIT behind it.
    let (cmd, script_args) = script_command(script, by_hash, key, args, slot);
    let pipeline = client.pipeline();
    let () = pipeline.custom(cmd, script_args).await?;
    let (cmd, wait_args) = wait_command(slot, durability);
    let () = pipeline
        .with_options(&wait_options())
        .custom(cmd, wait_args)
        .await?;
    let mut replies = pipeline.try_all::<Value>().await.into_iter();
    match (replies.next(), replies.next()) {
        (Some(written), Some(acknowledged)) => Ok((written, acknowledged)),
        (Some(Err(error)), None) => Err(error),
        _ => Err(FredError::new(
            FredErrorKind::Protocol,
            "missing pipeline replies",
        )),
    }
}

/// A lone `WAIT` to the current owner of `slot`.
async fn wait_for_replicas<C>(
    client: &Client,
    slot: u16,
    durability: Durability<C>,
) -> Result<Value, FredError> {
    let (cmd, args) = wait_command(slot, durability);
    client.with_options(&wait_options()).custom(cmd, args).await
}

/// `WAIT replicas timeout`, routed like the key (a cluster client would otherwise hash its
/// first argument). Not flagged blocking for fred: its wait is bounded by `timeout`, and fred's
/// `Blocking::Interrupt` / `Blocking::Error` policies must not cut it short or fail the other
/// commands sharing the connection.
fn wait_command<C>(slot: u16, durability: Durability<C>) -> (CustomCommand, Vec<Value>) {
    let cmd = CustomCommand::new_static("WAIT", ClusterHash::Custom(slot), false);
    let args = vec![
        Value::Integer(i64::from(durability.replicas)),
        Value::Integer(millis(durability.timeout)),
    ];
    (cmd, args)
}

/// A `WAIT` must never be re-sent alone on a new connection, where it would count the
/// acknowledgements of nothing (a new connection has written nothing): one write attempt only,
/// so that it fails when its connection closes.
fn wait_options() -> Options {
    Options {
        max_attempts: Some(1),
        ..Options::default()
    }
}

/// The primary `client` currently routes `slot` to (`None` unless clustered).
fn slot_owner(client: &Client, slot: u16) -> Option<Server> {
    if !client.is_clustered() {
        return None;
    }
    client
        .cached_cluster_state()
        .and_then(|state| state.get_server(slot).cloned())
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
    fn durable_completion_settings() {
        let store = RedisStore::new(Client::default());
        assert_eq!(store.durability(), None);
        let store = store.durable_completion(2, Duration::from_millis(50));
        assert_eq!(store.durability(), Some((2, Duration::from_millis(50))));
        // Cloned along with the store; zero replicas turns it off.
        assert_eq!(store.clone().durability(), store.durability());
        let store = store.durable_completion(0, Duration::from_millis(50));
        assert_eq!(store.durability(), None);
        assert!(format!("{store:?}").contains("RedisStore"));
    }

    #[test]
    fn wait_is_routed_like_the_key_and_never_waits_forever() {
        let durability = Durability::<Client> {
            replicas: 1,
            timeout: Duration::ZERO,
            pick: Client::pick_client,
        };
        let (cmd, args) = wait_command(4242, durability);
        assert_eq!(&*cmd.cmd, "WAIT");
        assert_eq!(cmd.cluster_hash, ClusterHash::Custom(4242));
        assert!(!cmd.blocking);
        // `WAIT 1 0` would block until a replica answers: the timeout is at least 1 ms.
        assert_eq!(args, [Value::Integer(1), Value::Integer(1)]);
        assert_eq!(wait_options().max_attempts, Some(1));
    }

    #[test]
    fn not_replicated_says_what_was_missing() {
        let error = NotReplicated {
            acknowledged: 0,
            required: 1,
            timeout: Duration::from_millis(50),
        };
        assert_eq!((error.acknowledged(), error.required()), (0, 1));
        assert_eq!(error.timeout(), Duration::from_millis(50));
        let text = error.to_string();
        assert!(text.contains("0 of 1") && text.contains("50 ms"), "{text}");
        let store_error = StoreError::with_source(StoreErrorKind::Unavailable, error.clone());
        let source = store_error.source().unwrap();
        assert_eq!(source.downcast_ref::<NotReplicated>(), Some(&error));
    }

    #[test]
    fn batch_scripts_are_routed_by_each_key() {
        let key = StoreKey::new("unit", None, "item");
        let slot = fred::util::redis_keyslot(key.as_str().as_bytes());
        let args = [Value::Integer(7)];
        let (cmd, sent) = script_command(&RENEW, true, &key, &args, slot);
        assert_eq!(&*cmd.cmd, "EVALSHA");
        assert_eq!(cmd.cluster_hash, ClusterHash::Custom(slot));
        assert!(!cmd.blocking);
        assert_eq!(
            sent,
            [
                Value::from(RENEW.sha1().clone()),
                Value::Integer(1),
                Value::from(key.as_str()),
                Value::Integer(7),
            ]
        );
        let (cmd, sent) = script_command(&RENEW, false, &key, &args, slot);
        assert_eq!(&*cmd.cmd, "EVAL");
        assert_eq!(sent[0], Value::from(RENEW_LUA));
    }

    #[test]
    fn a_pipeline_that_failed_as_a_whole_is_one_error() {
        let ok = || Ok(Value::Integer(1));
        let replies = pipeline_replies(vec![ok(), ok()], 2).unwrap();
        assert_eq!(replies.len(), 2);
        // Per-command errors stay with their command.
        let noscript = FredError::new(FredErrorKind::Unknown, "NOSCRIPT No matching script.");
        let replies = pipeline_replies(vec![ok(), Err(noscript)], 2).unwrap();
        assert!(matches!(&replies[1], Err(e) if is_noscript(e)));
        // fred answers a failed pipeline with its one error.
        let closed = FredError::new(FredErrorKind::Canceled, "Connection closed");
        let error = pipeline_replies(vec![Err(closed)], 3).unwrap_err();
        assert_eq!(*error.kind(), FredErrorKind::Canceled);
        let error = pipeline_replies(vec![ok()], 3).unwrap_err();
        assert_eq!(*error.kind(), FredErrorKind::Protocol);
    }

    #[test]
    fn scripts_hash_like_the_server() {
        // The SHA-1 Redis computes for the script text is what EVALSHA sends.
        assert_eq!(COMPLETE.sha1().len(), 40);
        assert_ne!(COMPLETE.sha1(), RELEASE.sha1());
    }
}
