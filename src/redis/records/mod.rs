//! The Redis store: [`RedisStore`] (its documentation is on the type), the scripts it runs,
//! durable completion and how fred's errors map to the layer's answers.

pub(crate) mod durable;
pub(crate) mod errors;
pub(crate) mod scripts;

use std::fmt;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use fred::clients::{Client, Pool};
use fred::interfaces::{KeysInterface, LuaInterface};
use fred::types::scripts::Script;
use fred::types::{MultipleKeys, Value};

use self::durable::complete_durably;
use self::errors::store_error;
use self::scripts::{
    COMPLETE, COMPLETE_ORDERED, Keys, RELEASE, RELEASE_ORDERED, RENEW, RENEW_ORDERED,
    RESERVE_ORDERED, completion, evalsha_with_reload, ordered_reservation, pipeline_replies,
    reservation, script_reply, scripts_pipelined, set_nx_get,
};
use crate::order::EqualPositions;
#[cfg(doc)]
use crate::store::StoreErrorKind;
use crate::store::contract::{IdempotencyStore, OrderedStore};
use crate::store::record::{IN_FLIGHT_LEN, OWNER_PREFIX_LEN, Record, StoredValue};
use crate::store::{
    Claim, Completion, Kinds, Order, Reservation, StoreError, StoreKey, Target, merge, millis,
};

/// The Redis store, on [`fred`]: standalone, cluster and sentinel, one round trip per call,
/// batches included.
///
/// [`RedisStore`] wraps an already connected fred client: a [`Pool`] or a
/// [`Client`], for a standalone, clustered or sentinel deployment alike
/// (they are the same types, built from another [`Config`](fred::types::config::Config)).
/// Build and connect the client as your application already does, then hand it over:
///
/// ```no_run
/// use std::time::Duration;
/// use tower_idempotency::RedisStore;
/// use tower_idempotency::fred::prelude::*;
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), fred::error::Error> {
/// let config = Config::from_url("redis://127.0.0.1:6379")?;
/// let pool = Builder::from_config(config)
///     // Keep reconnecting (0 = no limit), 100 ms apart, after Redis restarts or fails over.
///     .set_policy(ReconnectPolicy::new_constant(0, 100))
///     // Do not let commands queue forever while Redis is unreachable.
///     .with_performance_config(|perf| perf.default_command_timeout = Duration::from_secs(2))
///     .with_connection_config(|conn| conn.connection_timeout = Duration::from_secs(2))
///     .build_pool(4)?;
/// pool.init().await?;
///
/// let store = RedisStore::new(pool);
/// // Hand `store` to the idempotency layer.
/// # let _ = store;
/// # Ok(())
/// # }
/// ```
///
/// # What is stored
///
/// One Redis string per key, named `ti:<16 base64url digits>` (see
/// [`StoreKey`](crate::store::StoreKey): the namespace, the optional request scope and the idempotency key hashed with
/// BLAKE3, so no raw user bytes reach Redis). Its value is binary, in the versioned encoding of
/// [`record`](crate::store::record):
///
/// - **in flight**: 25 bytes (tag `0x01`, owner token, request
///   fingerprint), written with `PX <lease>`: if the worker dies, Redis drops the claim when the
///   lease runs out and the sender's next retry is processed again;
/// - **completed**: `Record::encode_for` the claim's token, 12 bytes in ack mode (tag, the
///   first 3 bytes of the owner token as the record's owner tag, fingerprint), or with the
///   stored status, allow-listed headers, body and trailers in replay mode, written with
///   `PX <retention>`: Redis drops the record when the retention period ends. An ack-mode key
///   costs 88 bytes of Redis memory (`MEMORY USAGE`, Redis 7.0, 64-bit: see
///   `tests/stores/redis_store.rs`).
///
/// Nothing else is written: no index, no second key, no background task.
///
/// # The local cache in front of it
///
/// The store talks to Redis and nothing else. A layer puts a bounded
/// [`LocalCache`](crate::store::LocalCache) of completed records in front of it (on by
/// default, see [`IdempotencyLayer::local_cache`](crate::IdempotencyLayer::local_cache)), which
/// answers the duplicates of records this instance completed or read without a command.
/// In-flight claims are never cached.
///
/// # Commands
///
/// - [`reserve`](IdempotencyStore::reserve) is **one command**: `SET key <in flight> NX PX
///   <lease ms> GET`. A nil reply means the claim is ours; otherwise the reply is the value
///   already there (in flight or completed). A duplicate therefore costs one command on an
///   instance whose local cache does not hold its key, even one that never saw it, and none on
///   one whose cache does; a first delivery pays for nothing it does not need. (The record's
///   remaining TTL is not read: the local cache keeps a record it read for its `read_ttl`, 5
///   seconds by default, see [`LocalCache`](crate::store::LocalCache).) `NX` together with
///   `GET` needs **Redis 7.0 or later** (or a compatible server).
/// - [`complete`](IdempotencyStore::complete), [`release`](IdempotencyStore::release) and
///   [`renew`](IdempotencyStore::renew) are one `EVALSHA` each, of a Lua script that compares
///   the owner token (the first 17 bytes of the in-flight value: its tag and the token)
///   before it overwrites the claim with the record, deletes it or extends its lease, so a slow
///   original whose lease expired never touches a newer claim. (`complete` also recognises the
///   record its own claim wrote, by the owner tag in it, and answers
///   [`Completion::AlreadyWritten`] to a retry.) When the server answers `NOSCRIPT` (after a
///   restart, a failover or `SCRIPT FLUSH`), the script is sent again with `EVAL`, which runs it
///   and puts it back in the server's script cache; the following calls are plain `EVALSHA`
///   again. A first delivery therefore costs two commands: `SET` and `EVALSHA`.
///
/// Every command touches exactly one key, so the store works unchanged on Redis Cluster (no hash
/// tags needed, no `CROSSSLOT`).
///
/// ## Batches
///
/// The items of a batch request are claimed and settled by one call of each operation over
/// all their targets ([`reserve`](IdempotencyStore::reserve) and the others). Each sends the
/// same one-key command as for a single key, once per item, all in **one fred pipeline**: every command is written
/// before any reply is awaited, so a batch costs **one round trip** whatever its size (N
/// commands). No multi-key command and no multi-key script is used, so the items of one batch
/// may hash to any slots: a clustered client routes each command of the pipeline to the
/// primary owning its own key and awaits those primaries in parallel (still one round trip,
/// no `CROSSSLOT`); a standalone or sentinel client writes them all on one connection.
///
/// - A first delivery of N new items costs 2 round trips and 2N commands (N `SET`, then N
///   `EVALSHA`); a duplicate batch costs 1 round trip (N `SET`). `tests/stores/redis.rs`
///   counts both, commands with `MONITOR` and round trips through a proxy that holds replies
///   back.
/// - `NOSCRIPT`: the items whose script reply is `NOSCRIPT` are sent again with `EVAL`, all in a
///   second pipeline: one more round trip for the batch, not one per item.
/// - An error reply for any item fails the whole call with the first one (in the batch's
///   order); the other commands of the pipeline did run. After a failed batch `reserve` some
///   items may be claimed: the layer releases them, as after a failed `reserve`.
/// - The pipeline goes through one [`Client`]: a [`Pool`] picks one of its clients for the
///   batch ([`PickClient`]), so the store's client type must implement [`PickClient`].
/// - With [durable completion](Self#durable-completion), a batch `complete` does not pipeline:
///   see there.
///
/// A batch request with one item goes through the single-key path.
///
/// # Ordered events
///
/// For a route that orders events ([`order`](crate::order)), an event and its object live in
/// three keys that carry the object's digits as their hash tag, so that they share one slot of
/// a cluster and one script settles them together:
///
/// - `ti:{O}E`: the event's key (its claim, then its record: the same values as above);
/// - `tl:{O}`: the object's lease, the owner token of the claim whose event of the object is in
///   flight, with the lease's `PX`;
/// - `tw:{O}`: the object's watermark, the highest position processed (16 bytes, compared byte
///   by byte in Lua, never with the locale's `strcoll`), with the retention's `PX`.
///
/// `reserve`, `complete`, `release` and `renew` of ordered targets are one
/// `EVALSHA` each per event (one pipeline per request): an ordered first delivery costs **two
/// round trips**, as an unordered one, and writes the record and the watermark and lets go of
/// the object's lease in the same script. A cluster never answers `CROSSSLOT`: the three keys
/// of an event are in one slot; the events of a batch, in as many slots as they have objects,
/// travel in one pipeline as above. An ordered event's key costs 104 bytes of Redis memory in
/// ack mode (its name is 37 bytes long); a watermark about as much, per object.
///
/// # Redis Cluster and Sentinel
///
/// Nothing changes but the client's configuration: a clustered client
/// (`redis-cluster://host:port?node=host2:port2`, or
/// [`ServerConfig::Clustered`](fred::types::config::ServerConfig::Clustered)) routes each command
/// to the primary that owns its key's hash slot and follows `MOVED` / `ASK` redirections; a
/// sentinel client (`redis-sentinel://host:26379?sentinelServiceName=mymaster&node=host:26380`,
/// or [`ServerConfig::Sentinel`](fred::types::config::ServerConfig::Sentinel)) asks the sentinels
/// for the current primary, and asks again when its connection drops after a failover. Give
/// either a [`ReconnectPolicy`](fred::types::config::ReconnectPolicy), as above: it is what lets
/// the same client find the new primary.
///
/// ```no_run
/// use std::time::Duration;
/// use tower_idempotency::RedisStore;
/// use tower_idempotency::fred::prelude::*;
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), fred::error::Error> {
/// // Any one node is enough: the client discovers the others with `CLUSTER SLOTS`.
/// let config = Config::from_url("redis-cluster://10.0.0.1:6379?node=10.0.0.2:6379")?;
/// // Or, behind Sentinel:
/// // Config::from_url("redis-sentinel://10.0.0.1:26379?sentinelServiceName=mymaster&node=10.0.0.2:26379")?;
/// let pool = Builder::from_config(config)
///     .set_policy(ReconnectPolicy::new_constant(0, 100))
///     .with_performance_config(|perf| perf.default_command_timeout = Duration::from_secs(2))
///     .build_pool(4)?;
/// pool.init().await?;
/// let store = RedisStore::new(pool);
/// # let _ = store;
/// # Ok(())
/// # }
/// ```
///
/// After a failover the new primary's script cache is empty: the first `EVALSHA` there answers
/// `NOSCRIPT` and is sent again as `EVAL` (see above), on the node that owns the key.
///
/// ## What a failover costs
///
/// While a primary is down and until its replica is promoted (a few seconds: the detection
/// timeout, `cluster-node-timeout` or `down-after-milliseconds`, plus the election), the client
/// cannot reach the keys of that primary; a cluster client reconnects as a whole, so commands for
/// the other primaries wait too. What the layer answers meanwhile depends on the timeouts:
///
/// - **store timeout (and fred's `default_command_timeout`) longer than the failover**: calls
///   wait in the client's queue and go to the new primary: requests are slower, none fails, and
///   a claim taken before the failover is completed on the promoted replica (which received it);
/// - **shorter**: reserves fail, answered 503 (the sender retries, nothing is lost); but a
///   completion that fails leaves its claim in place until the lease expires, after the
///   response went out, so a *later* duplicate of that event is processed again.
///
/// Replication in Redis is asynchronous: a write the old primary acknowledged but had not yet
/// sent to its replica is lost when the replica is promoted. For a claim, that opens a short
/// window in which a concurrent duplicate may be processed; for a completed record, a duplicate
/// delivered after the failover is processed again. [Durable
/// completion](RedisStore::durable_completion) closes the second window.
///
/// # Durable completion
///
/// [`RedisStore::durable_completion`]`(replicas, timeout)` makes
/// [`complete`](IdempotencyStore::complete) send `WAIT replicas timeout` right behind the
/// `EVALSHA` that writes the record, pipelined on the same connection of the same client (for a
/// [`Pool`], one of its clients is picked for the pair; in a cluster both are routed by the key's
/// hash slot, so they reach the primary that owns the key). `WAIT` answers once `replicas`
/// replicas have acknowledged every write of that connection, or when `timeout` has passed, with
/// the number that did. The call returns:
///
/// - `Ok(Completion::Written)` (or `AlreadyWritten`, for a retry whose first attempt landed)
///   when the record was written *and* at least `replicas` replicas acknowledged it: a failover
///   to one of them keeps the record;
/// - `Ok(Completion::Lost)` when the claim was no longer ours, as without the option (the
///   `WAIT`'s answer is then ignored);
/// - an error of kind [`StoreErrorKind::NotReplicated`] whose [`source`](std::error::Error::source)
///   is a [`NotReplicated`] when fewer replicas acknowledged in time. The record **was written**
///   on the primary, and stays there; only a failover before the replicas catch up loses it.
///
/// The completion is not over before the replicas have acknowledged. If the primary dies in
/// between, the pipeline fails with its connection (the `WAIT` is never re-sent alone on another
/// connection, where it would count nothing), and the store sends the pair again: after the
/// failover, it reaches the promoted replica, which holds the claim, and writes the record
/// there. If that second attempt finds the claim gone, the first may have written the record
/// after all: the outcome is unknown and reported as an `Unavailable` error. This is why the
/// lease, renewed every third of itself, must outlive a failover (the default 10 s outlives a
/// typical one; raise it where failovers take longer), and why the store timeout should too.
///
/// The layer logs a failed completion and still sends the response: the inner service's effect
/// has happened, and answering an error would only make the sender retry and, if the record is
/// lost, run the effect again. So durable completion does not change any response; it changes
/// what a `2xx` is worth: after a successful durable completion, the record is on the primary
/// and on `replicas` replicas, and a duplicate arriving after a failover is still answered from
/// it. A [`NotReplicated`] in the logs names the events that lack this guarantee.
///
/// A batch (a [`complete`](IdempotencyStore::complete) of several targets) is completed durably one item
/// at a time, not in one pipeline: one durable `complete` per item as above (script and
/// `WAIT`, with the same retries), all started at once (for a [`Pool`], each on a client of
/// its own choosing). Every item is attempted; the call fails with the first error in the
/// batch's order, for example a [`NotReplicated`] for one item while the others were
/// acknowledged. N items cost N pairs: their round trips overlap, but the `WAIT`s sharing a
/// connection are answered one after the other.
///
/// The cost: the pair still takes one round trip, but its answer waits for the replicas'
/// acknowledgement (about one more replication round trip: on loopback, about 0.1 to 0.2 ms
/// at the median, see `docs/operations.md`), and the connection carrying the `WAIT` serves nothing
/// else meanwhile. When the replicas are down or lagging (after a failover, until the old
/// primary returns as a replica), every completion waits the full `timeout`, holds its
/// connection that long and ends in a [`NotReplicated`]: keep `timeout` short (tens of
/// milliseconds), prefer a [`Pool`], and keep the client's `default_command_timeout` well above
/// `timeout`. Claims and releases are never waited for. A primary that does not have the script
/// yet (after its start, or a failover) answers the pair's `EVALSHA` with `NOSCRIPT`, and the
/// pair is sent again with `EVAL`: that first completion waits for its replicas twice, the first
/// time without having written anything. [`RedisStore::load_scripts`] at start-up spares the
/// primaries there then.
///
/// `WAIT` is not consensus. It does not stop a primary from accepting writes, and with several
/// replicas per primary a failover may promote one that had not acknowledged. If the key's slot
/// moves while the pair is in flight (`MOVED`), the store repeats the `WAIT` on the new owner:
/// right after a failover to the replica that has the write, best effort during a live
/// resharding. The `WAIT` is not flagged as a blocking command for fred (its wait is bounded by
/// `timeout`), so fred's `Blocking` policies never interrupt it nor fail other commands for it.
///
/// # When Redis is down
///
/// Every call then fails with a [`StoreError`] of kind [`StoreErrorKind::Unavailable`] (connection
/// refused or lost, command canceled, server loading or read-only) or
/// [`StoreErrorKind::Timeout`], and the layer answers as configured: 503 with `Retry-After`
/// (fail closed, the default) or passing the request through (fail open). No claim is taken, so
/// the sender's retry is processed once Redis is back.
///
/// How fast a call fails is decided by the fred client, configured once for all its commands:
///
/// - a [`ReconnectPolicy`](fred::types::config::ReconnectPolicy) (for example
///   `ReconnectPolicy::new_constant(0, 100)`: retry forever, 100 ms apart) so that the *same*
///   client, and so the same store, recovers by itself when Redis comes back or fails over;
/// - [`PerformanceConfig::default_command_timeout`](fred::types::config::PerformanceConfig):
///   while the client reconnects, commands wait in its queue; this bounds the wait, and a command
///   that exceeds it fails with [`StoreErrorKind::Timeout`] (and, if still queued, is dropped
///   rather than sent late);
/// - [`ConnectionConfig::connection_timeout`](fred::types::config::ConnectionConfig) and
///   `internal_command_timeout` bound each connection attempt when the host does not answer at
///   all (no `RST`), and `max_command_attempts` bounds how often a command caught by a dropped
///   connection is re-sent.
///
/// Beware fred's defaults: without a reconnect policy the client stops for good when its
/// connection drops, and without a command timeout its commands then wait without limit. The
/// layer wraps every store call in its own timeout, so a request is still answered (503 when
/// failing closed), but only a reconnect policy brings the store back.
///
/// Redis out of memory (`OOM`, with `maxmemory-policy noeviction`) is a
/// [`StoreErrorKind::Capacity`] error, answered like any store error. Prefer `noeviction` for a
/// Redis that holds these keys: every key has a TTL, so a `volatile-*` or `allkeys-*` policy may
/// evict a completed record early and let a duplicate through.
///
/// A `SET` whose reply was lost with the connection may be re-sent by the client after it
/// reconnects; [`reserve`](IdempotencyStore::reserve) recognises its own claim (same token) in
/// the reply and still reports [`Reservation::Acquired`].
///
/// An [`IdempotencyStore`] on Redis, through a connected [`fred`] client `C`: a [`Pool`] by
/// default, or a [`Client`]. Cheap to clone: fred clients are handles over shared state.
#[derive(Clone, Debug)]
pub struct RedisStore<C = Pool> {
    client: C,
    durability: Option<Durability<C>>,
    /// The client's `default_command_timeout` when the store was made (`None`: zero, no timeout).
    command_timeout: Option<Duration>,
}

/// The settings of [`RedisStore::durable_completion`].
pub(crate) struct Durability<C> {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
    /// Picks the one client that sends both the write and its `WAIT`.
    pub(crate) pick: fn(&C) -> Client,
}

impl<C: PickClient> Durability<C> {
    /// `WAIT replicas timeout` behind the writes, through one client picked by `C`; `None`
    /// (off) for 0 replicas.
    pub(crate) fn of(replicas: u32, timeout: Duration) -> Option<Self> {
        (replicas > 0).then_some(Durability {
            replicas,
            timeout,
            pick: C::pick_client,
        })
    }
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
/// Needed by batches (a call over several targets sends one
/// [`Pipeline`](fred::clients::Pipeline) per batch, and only a [`Client`] has pipelines) and by [`RedisStore::durable_completion`] (a write and the `WAIT` behind it share
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
/// [`complete`](IdempotencyStore::complete) or a durable inbox write: the write was made on the
/// primary, but fewer replicas than required acknowledged it within the timeout (see
/// [`RedisStore::durable_completion`] and [`RedisInbox::durable`](crate::inbox::RedisInbox::durable)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotReplicated {
    pub(super) acknowledged: u32,
    pub(super) required: u32,
    pub(super) timeout: Duration,
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
            "the write was made on the primary but acknowledged by {} of {} required \
             replicas within {} ms; it may not survive a failover",
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
    /// Its `default_command_timeout` is read now: when it is set and no longer than a layer's
    /// [store timeout](crate::IdempotencyLayer::store_timeout), that layer leaves the timing of
    /// its calls to the client (see [`command_timeout`](IdempotencyStore::command_timeout)).
    /// A timeout raised or removed later with `update_perf_config` is obeyed by the client but
    /// not seen by the layer, whose calls then wait as long as the client lets them: make the
    /// store again after changing it.
    pub fn new(client: C) -> Self {
        let timeout = client.perf_config().default_command_timeout;
        RedisStore {
            client,
            durability: None,
            command_timeout: (!timeout.is_zero()).then_some(timeout),
        }
    }

    /// Durable completion: after writing a completed record, waits until at least `replicas`
    /// replicas have acknowledged it (`WAIT replicas timeout`, pipelined behind the write on the
    /// same connection), and reports an error when fewer did within `timeout`. See [Durable
    /// completion](Self#durable-completion) for the guarantees and the cost.
    ///
    /// `replicas` = 0 turns it off. `timeout` is rounded to whole milliseconds, at least 1
    /// (`WAIT` with 0 would wait forever); keep it well below the client's
    /// `default_command_timeout`. Claims and releases are not waited for.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use tower_idempotency::RedisStore;
    /// # fn docs(pool: fred::clients::Pool) {
    /// // Every primary has one replica: a completed record is on both before the response.
    /// let store = RedisStore::new(pool).durable_completion(1, Duration::from_millis(50));
    /// # }
    /// ```
    pub fn durable_completion(mut self, replicas: u32, timeout: Duration) -> Self
    where
        C: PickClient,
    {
        self.durability = Durability::of(replicas, timeout);
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

    /// Loads every script of the store into the server's script cache (`SCRIPT LOAD`, on
    /// every primary of a cluster).
    ///
    /// Optional: a script missing from the cache is reloaded on first use anyway. Calling this
    /// at start-up saves the first call of each script (single-key or batch) a second round
    /// trip.
    pub async fn load_scripts(&self) -> Result<(), StoreError> {
        for script in scripts::all() {
            let lua = script.lua().cloned().unwrap_or_default();
            let _: Value = self
                .client
                .script_load_cluster(lua)
                .await
                .map_err(store_error)?;
        }
        Ok(())
    }
}

/// The arguments of the `complete` script for `claim`, `record` and `retention`.
///
/// The two byte strings are slices of one buffer: fred clones every argument it sends, and a
/// clone of a slice of a shared buffer only counts a reference, where a clone of bytes made on
/// their own allocates (two allocations per completion instead of four).
fn complete_args(claim: &Claim, record: &Record, retention: Duration) -> Vec<Value> {
    let mut buf = BytesMut::with_capacity(complete_args_len(record));
    put_complete_args(&mut buf, claim, record, retention)
}

/// The name of `key` and the arguments of its `complete` script (see [`complete_args`]), all
/// slices of one buffer: the key's name is cloned too.
fn key_and_complete_args(
    key: &StoreKey,
    claim: &Claim,
    record: &Record,
    retention: Duration,
) -> (Bytes, Vec<Value>) {
    let name = key.as_bytes();
    let mut buf = BytesMut::with_capacity(name.len() + complete_args_len(record));
    buf.put_slice(name);
    let name = buf.split().freeze();
    (name, put_complete_args(&mut buf, claim, record, retention))
}

fn complete_args_len(record: &Record) -> usize {
    OWNER_PREFIX_LEN + record.encoded_len()
}

/// [`complete_args`], written into `buf` (empty, with room for them).
fn put_complete_args(
    buf: &mut BytesMut,
    claim: &Claim,
    record: &Record,
    retention: Duration,
) -> Vec<Value> {
    let token = claim.token();
    StoredValue::put_owner_prefix(token, buf);
    let prefix = buf.split().freeze();
    record.put_for(token, buf);
    vec![
        Value::Bytes(prefix),
        Value::Bytes(buf.split().freeze()),
        Value::Integer(millis(retention)),
    ]
}

/// The name of `key` and its in-flight value for `claim`, slices of one buffer (see
/// [`complete_args`]).
fn key_and_in_flight(key: &StoreKey, claim: &Claim) -> (Bytes, Bytes) {
    let name = key.as_bytes();
    let mut buf = BytesMut::with_capacity(name.len() + IN_FLIGHT_LEN);
    buf.put_slice(name);
    let name = buf.split().freeze();
    StoredValue::put_in_flight(claim.token(), &claim.fingerprint(), &mut buf);
    (name, buf.freeze())
}

/// The arguments of `release` (ordered or not).
fn owner_args(claim: &Claim) -> Vec<Value> {
    vec![Value::Bytes(StoredValue::owner_prefix(claim.token()))]
}

/// The arguments of `renew` (ordered or not).
fn renew_args(claim: &Claim, lease: Duration) -> Vec<Value> {
    vec![
        Value::Bytes(StoredValue::owner_prefix(claim.token())),
        Value::Integer(millis(lease)),
    ]
}

/// The store works with any fred client that can hand out a [`Client`] ([`PickClient`]: a
/// [`Client`] or a [`Pool`]), which pipelines need.
impl<C> IdempotencyStore for RedisStore<C>
where
    C: KeysInterface + LuaInterface + PickClient + 'static,
{
    /// The client's `default_command_timeout`, as it was when the store was made; `None` with
    /// [durable completion](RedisStore::durable_completion) on: a durable completion may take
    /// several round trips in a row (a retry after a lost connection, a `WAIT` sent again to the
    /// key's new node), each under the client's timeout, so the layer keeps its own.
    fn command_timeout(&self) -> Option<Duration> {
        self.command_timeout.filter(|_| self.durability.is_none())
    }

    /// One plain target: `SET key <in flight> NX PX lease GET`, one command. Several plain
    /// targets: that command once per key, all in one pipeline (one round trip); an error
    /// reply for any key fails the call with the first one (in order), the other keys were
    /// claimed or not, and the caller releases what is ours. Ordered targets: one `EVALSHA`
    /// per event (its key, its object's lease and watermark in one slot), all in one pipeline.
    async fn reserve(
        &self,
        targets: &[Target],
        claim: &Claim,
        lease: Duration,
    ) -> Result<Vec<Reservation>, StoreError> {
        if let [Target { key, order: None }] = targets {
            return Ok(vec![self.reserve_key(key, claim, lease).await?]);
        }
        // Boxed: the single key's future, which every request awaits, stays small.
        Box::pin(async move {
            match Kinds::of(targets) {
                Kinds::Plain => self.reserve_keys(targets, claim, lease).await,
                Kinds::Ordered => self.reserve_events(targets, claim, lease).await,
                Kinds::Mixed(plain_at, plain, ordered_at, ordered) => Ok(merge(
                    (plain_at, self.reserve_keys(&plain, claim, lease).await?),
                    (
                        ordered_at,
                        self.reserve_events(&ordered, claim, lease).await?,
                    ),
                )),
            }
        })
        .await
    }

    /// One `EVALSHA` of the `complete` script per key (of `complete_ordered` per event: the
    /// record, the watermark and the object's lease in one script), several in one pipeline:
    /// one round trip (two after a `NOSCRIPT`). With [durable
    /// completion](RedisStore::durable_completion), one durable completion per target instead,
    /// all started at once: every target is attempted, and the first error (in order) is
    /// returned.
    async fn complete(
        &self,
        targets: &[Target],
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> Result<Vec<Completion>, StoreError> {
        if let [Target { key, order: None }] = targets {
            return Ok(vec![
                self.complete_key(key, claim, record, retention).await?,
            ]);
        }
        Box::pin(async move {
            let args = complete_args(claim, record, retention);
            match Kinds::of(targets) {
                Kinds::Plain => self.complete_keys(targets, args).await,
                Kinds::Ordered => self.complete_events(targets, args).await,
                Kinds::Mixed(plain_at, plain, ordered_at, ordered) => Ok(merge(
                    (plain_at, self.complete_keys(&plain, args.clone()).await?),
                    (ordered_at, self.complete_events(&ordered, args).await?),
                )),
            }
        })
        .await
    }

    /// One `EVALSHA` of the `release` script per target (its ordered form for an event), all
    /// in one pipeline: one round trip (two after a `NOSCRIPT`).
    async fn release(&self, targets: &[Target], claim: &Claim) -> Result<usize, StoreError> {
        if let [Target { key, order: None }] = targets {
            let args = || owner_args(claim);
            let released = self.run_counted(&RELEASE, &Keys::One(key), args).await?;
            return Ok(usize::from(released == 1));
        }
        let replies =
            Box::pin(self.by_script(targets, [&RELEASE, &RELEASE_ORDERED], owner_args(claim)))
                .await?;
        Ok(replies.into_iter().filter(|&reply| reply == 1).count())
    }

    /// One `EVALSHA` of the `renew` script per target (its ordered form for an event), all in
    /// one pipeline: one round trip (two after a `NOSCRIPT`). Every key is renewed that is
    /// still ours, even when another is not.
    async fn renew(
        &self,
        targets: &[Target],
        claim: &Claim,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        if let [Target { key, order: None }] = targets {
            let args = || renew_args(claim, lease);
            return Ok(self.run_counted(&RENEW, &Keys::One(key), args).await? == 1);
        }
        let args = renew_args(claim, lease);
        let replies = Box::pin(self.by_script(targets, [&RENEW, &RENEW_ORDERED], args)).await?;
        Ok(replies.into_iter().all(|reply| reply == 1))
    }
}

/// An event, its object's lease and its object's watermark share one hash slot, and one
/// script settles them together.
impl<C> OrderedStore for RedisStore<C> where C: KeysInterface + LuaInterface + PickClient + 'static {}

impl<C> RedisStore<C>
where
    C: KeysInterface + LuaInterface + PickClient + 'static,
{
    /// `SET key <in flight> NX PX lease GET`: one command.
    async fn reserve_key(
        &self,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        let (name, value) = key_and_in_flight(key, claim);
        // One client for the command, as in `run`.
        let held = set_nx_get(&self.client.pick_client(), name, value, millis(lease)).await;
        reservation(held.map_err(store_error)?, claim)
    }

    /// `SET key <in flight> NX PX lease GET` per plain target, all in one pipeline.
    async fn reserve_keys(
        &self,
        targets: &[Target],
        claim: &Claim,
        lease: Duration,
    ) -> Result<Vec<Reservation>, StoreError> {
        if targets.is_empty() {
            return Ok(Vec::new());
        }
        let value = StoredValue::encode_in_flight(claim.token(), &claim.fingerprint());
        let lease = millis(lease);
        let client = self.client.pick_client();
        let pipeline = client.pipeline();
        for target in targets {
            let name = Bytes::copy_from_slice(target.key.as_bytes());
            let _: Value = set_nx_get(&pipeline, name, value.clone(), lease)
                .await
                .map_err(store_error)?;
        }
        let replies = pipeline.try_all::<Value>().await;
        pipeline_replies(replies, targets.len())
            .map_err(store_error)?
            .into_iter()
            .map(|held| reservation(held.map_err(store_error)?, claim))
            .collect()
    }

    /// One `EVALSHA` of the ordered reserve per event: alone, or all in one pipeline.
    async fn reserve_events(
        &self,
        targets: &[Target],
        claim: &Claim,
        lease: Duration,
    ) -> Result<Vec<Reservation>, StoreError> {
        let value = StoredValue::encode_in_flight(claim.token(), &claim.fingerprint());
        let args = |order: &Order| {
            let strict = if order.equal == EqualPositions::Stale {
                "1"
            } else {
                "0"
            };
            vec![
                Value::Bytes(value.clone()),
                Value::Integer(millis(lease)),
                Value::Bytes(bytes::Bytes::copy_from_slice(&order.position.to_bytes())),
                Value::from(strict),
            ]
        };
        let events = targets.iter().filter_map(|t| {
            t.order
                .as_ref()
                .map(|order| (Keys::event(&t.key, order), order))
        });
        let events: Vec<_> = events.map(|(keys, order)| (keys, args(order))).collect();
        if let [(keys, args)] = &events[..] {
            let reply = self.run(&RESERVE_ORDERED, keys, || args.clone()).await?;
            return Ok(vec![ordered_reservation(reply, claim)?]);
        }
        let client = self.client.pick_client();
        scripts_pipelined(&client, &RESERVE_ORDERED, &events)
            .await?
            .into_iter()
            .map(|reply| ordered_reservation(reply, claim))
            .collect()
    }

    /// One `EVALSHA` of the `complete` script, or a durable completion.
    async fn complete_key(
        &self,
        key: &StoreKey,
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> Result<Completion, StoreError> {
        match self.durability {
            None => {
                let call = || {
                    let (name, args) = key_and_complete_args(key, claim, record, retention);
                    (MultipleKeys::from(name), args)
                };
                Ok(completion(script_reply(
                    self.run_call(&COMPLETE, call).await?,
                )?))
            }
            Some(durability) => {
                let keys = Keys::One(key);
                let client = (durability.pick)(&self.client);
                let args = complete_args(claim, record, retention);
                Box::pin(complete_durably(
                    &client, durability, &COMPLETE, &keys, args,
                ))
                .await
            }
        }
    }

    /// The `complete` script on every plain target with the same `args`.
    async fn complete_keys(
        &self,
        targets: &[Target],
        args: Vec<Value>,
    ) -> Result<Vec<Completion>, StoreError> {
        let targets = targets.iter().map(|t| (Keys::One(&t.key), args.clone()));
        self.complete_targets(targets.collect(), &COMPLETE).await
    }

    /// The ordered `complete` script on every event: `args` and the event's position.
    async fn complete_events(
        &self,
        targets: &[Target],
        args: Vec<Value>,
    ) -> Result<Vec<Completion>, StoreError> {
        let events = targets.iter().filter_map(|t| {
            let order = t.order.as_ref()?;
            let mut args = args.clone();
            let position = bytes::Bytes::copy_from_slice(&order.position.to_bytes());
            args.push(Value::Bytes(position));
            Some((Keys::event(&t.key, order), args))
        });
        self.complete_targets(events.collect(), &COMPLETE_ORDERED)
            .await
    }

    /// `scripts[0]` on every plain target and `scripts[1]` on every event, all with `args`;
    /// the integer replies, in order.
    async fn by_script(
        &self,
        targets: &[Target],
        [plain, ordered]: [&Script; 2],
        args: Vec<Value>,
    ) -> Result<Vec<i64>, StoreError> {
        match Kinds::of(targets) {
            Kinds::Plain => {
                self.pipelined(targets.iter().map(|t| Keys::One(&t.key)), plain, args)
                    .await
            }
            Kinds::Ordered => {
                self.pipelined(targets.iter().filter_map(Keys::of_event), ordered, args)
                    .await
            }
            Kinds::Mixed(plain_at, keys, ordered_at, events) => {
                let keys = keys.iter().map(|t| Keys::One(&t.key));
                let keys = self.pipelined(keys, plain, args.clone()).await?;
                let events = events.iter().filter_map(Keys::of_event);
                let events = self.pipelined(events, ordered, args).await?;
                Ok(merge((plain_at, keys), (ordered_at, events)))
            }
        }
    }
    /// Runs `script` on `keys`: its reply.
    async fn run(
        &self,
        script: &Script,
        keys: &Keys<'_>,
        args: impl Fn() -> Vec<Value>,
    ) -> Result<Value, StoreError> {
        self.run_call(script, || (keys.multiple(), args())).await
    }

    /// Runs `script` on the keys and arguments `call` makes: its reply.
    async fn run_call(
        &self,
        script: &Script,
        call: impl Fn() -> (MultipleKeys, Vec<Value>),
    ) -> Result<Value, StoreError> {
        // One client for the command (of a pool, a connected one): the pool itself would pick
        // again at each of the several looks the command takes at its client.
        let client = self.client.pick_client();
        evalsha_with_reload(&client, script, call)
            .await
            .map_err(store_error)
    }

    /// Runs `script` (`complete`, `release` or `renew`, ordered or not) on `keys`: its integer
    /// reply.
    async fn run_counted(
        &self,
        script: &Script,
        keys: &Keys<'_>,
        args: impl Fn() -> Vec<Value>,
    ) -> Result<i64, StoreError> {
        script_reply(self.run(script, keys, args).await?)
    }

    /// `script` on every target with the same `args`: one `EVALSHA` (one round trip) for one
    /// target, one pipeline for more; the integer replies, in order.
    async fn pipelined<'k>(
        &self,
        targets: impl Iterator<Item = Keys<'k>>,
        script: &Script,
        args: Vec<Value>,
    ) -> Result<Vec<i64>, StoreError> {
        let targets: Vec<_> = targets.map(|keys| (keys, args.clone())).collect();
        if let [(keys, args)] = &targets[..] {
            return Ok(vec![self.run_counted(script, keys, || args.clone()).await?]);
        }
        if targets.is_empty() {
            return Ok(Vec::new());
        }
        let client = self.client.pick_client();
        scripts_pipelined(&client, script, &targets)
            .await?
            .into_iter()
            .map(script_reply)
            .collect()
    }

    /// A completion of every target (keys and arguments): pipelined, or one durable completion
    /// each, all started at once (every target is attempted; the first error, in order, is
    /// returned).
    async fn complete_targets(
        &self,
        targets: Vec<(Keys<'_>, Vec<Value>)>,
        script: &Script,
    ) -> Result<Vec<Completion>, StoreError> {
        match self.durability {
            None => {
                let replies = self.pipelined_targets(&targets, script).await?;
                Ok(replies.into_iter().map(completion).collect())
            }
            Some(durability) => {
                let each = targets.into_iter().map(|(keys, args)| {
                    let client = (durability.pick)(&self.client);
                    async move { complete_durably(&client, durability, script, &keys, args).await }
                });
                futures_util::future::join_all(each)
                    .await
                    .into_iter()
                    .collect()
            }
        }
    }

    /// `script` on every target with its own arguments (see [`pipelined`](Self::pipelined)).
    async fn pipelined_targets(
        &self,
        targets: &[(Keys<'_>, Vec<Value>)],
        script: &Script,
    ) -> Result<Vec<i64>, StoreError> {
        match targets {
            [] => Ok(Vec::new()),
            [(keys, args)] => Ok(vec![self.run_counted(script, keys, || args.clone()).await?]),
            _ => {
                let client = self.client.pick_client();
                scripts_pipelined(&client, script, targets)
                    .await?
                    .into_iter()
                    .map(script_reply)
                    .collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;
    use crate::store::StoreErrorKind;

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
}
