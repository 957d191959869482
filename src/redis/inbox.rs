//! [`RedisInbox`]: the inbox on Redis, every operation one Lua script over keys that share the
//! inbox's hash tag.

mod admin;
mod reply;

use self::reply::{Row, any_flag, corrupt, enqueue_wrote, flag, one, one_or_two, rows};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use fred::clients::Pool;
use fred::interfaces::{KeysInterface, LuaInterface};
use fred::types::Value;
use fred::types::scripts::Script;
use futures_util::future::join_all;

use crate::inbox::admin::DeadLetter;
use crate::inbox::admin::{history, worker_id};
use crate::inbox::codec::{decode_headers, encode_headers};
use crate::inbox::entry::{EntryOrder, InboxEntry, Lease};
use crate::inbox::store::{Enqueued, Failure, InboxCounts, InboxStore, KeyState};
use crate::inbox::wake::{Announcer, Wakeups};
use crate::order::{EqualPositions, Position};
use crate::redis::records::durable::script_replicated;
use crate::redis::records::errors::store_error;
use crate::redis::records::scripts::{Keys, LESS_LUA, bytes_of, evalsha_with_reload, unexpected};
use crate::redis::records::{Durability, PickClient};
use crate::store::{ObjectKey, StoreError, StoreErrorKind, StoreKey, Token, millis};

/// The most entries one [`RedisInbox`] `take` hands out (a larger `max` is cut to this): a take
/// is one script, which holds the server while it runs (and numbers its leases in two bytes).
pub(crate) const MAX_TAKE: usize = 1_000;

/// This process as its attempts name it ([`worker_id`]), as a history line keeps it: sent with
/// every take.
static WORKER: LazyLock<String> = LazyLock::new(|| history::worker_field(worker_id()));

/// `enqueue`: KEYS = due, entry (what decides a duplicate is declared, so that a slot being
/// migrated redirects the script rather than hide a key); ARGV[1] = prefix, [2] = key,
/// [3] = body, [4] = correlation id, [5] = enqueued (µs), then pairs of a name and a value for
/// what is not the default: `w` durable (first when present: a duplicate then writes `<prefix>fence`
/// for the `WAIT` behind it to count), `h` headers (none), `a` attempts (0), `n` next attempt (the
/// enqueue time), `o` object and `p` position (unordered), `eq` when a position equal to the
/// watermark is stale (processed), `i` delivery id and `r` route (empty), `cap` capacity
/// (unbounded). Returns 0 when
/// queued, 1 to 4 for a duplicate (queued, running, dead, done), 5 when full, `{6, watermark}`
/// for an ordered entry stale against its object's watermark (not stored). A queued entry is
/// announced on `<prefix>wake` (`PUBLISH` of its due time) to every process's idle workers
/// when one waits: a take that came back short left `<prefix>idle`, which the first enqueue
/// due now after it deletes as it publishes (one due later publishes and leaves it, since the
/// worker only notes the time and waits on). While every worker is busy (their takes full)
/// nothing is published: a message costs Redis a write to every subscribed process, where the
/// check costs a `DEL`.
///
/// Every argument handed to Lua and every hash field stored costs Redis work, so a first
/// delivery sends 8 strings (the other key names are built in the script from the prefix, as
/// `take` builds them) and stores 3 fields (a worker reads an absent field as its default).
static ENQUEUE_LUA: LazyLock<String> =
    LazyLock::new(|| LESS_LUA.to_owned() + include_str!("inbox/lua/enqueue.lua"));

/// An entry's attempts (`y`), in the stored form of `admin::history`: one line per attempt,
/// oldest first, each `number TAB start TAB duration TAB outcome TAB worker TAB error`, times in
/// µs. `pushed` appends a running attempt's line, marks the one before it lost when it still
/// ran (its lease ran out) and keeps the last 10 (`KEPT_ATTEMPTS`); `ended` ends the last
/// attempt, if running, at `now` as `s` or `f` with `err` (cleaned and cut by the caller), or
/// answers nil.
const HISTORY_LUA: &str = include_str!("inbox/lua/history.lua");

/// `take`: KEYS = due, leased; ARGV[1] = prefix, [2] = now (µs), [3] = lease end (µs), [4] =
/// max, [5] = a random token whose 14th and 15th bytes each lease replaces with its index, [6] =
/// this process's worker id (no tabs or line breaks). Takes nothing while `<prefix>paused`
/// exists (and leaves no `idle` mark: `resume` publishes). Appends an attempt to the history
/// (`y`) of each entry it takes, started now. Scans
/// the due set in time order, skipping an ordered entry that is not its object's next: the
/// object's entry in flight (`c:<object>`, while it is running, its lease live or not), else
/// its first by position; taking fewer than `max` leaves `<prefix>idle` for the next enqueue
/// to publish (see `enqueue`); returns one row per entry taken: key, stale (0/1), token, then
/// the fields `Row::entry` reads (headers, object, position, correlation id, attempts, next
/// attempt, enqueued, delivery id, route).
///
/// Every string handed to Lua costs Redis work, more for a long one: the scan asks for as many
/// due entries as it still wants (more only when it passed some over), one token is sent, not
/// one per entry it may take, and the bodies are read after the script, with one `MGET`.
static TAKE_LUA: LazyLock<String> =
    LazyLock::new(|| LESS_LUA.to_owned() + HISTORY_LUA + include_str!("inbox/lua/take.lua"));

/// `renew`: KEYS = entry, due, leased; ARGV[1] = key, [2] = token, [3] = lease end (µs). 1
/// while the token holds the entry, or completed it (`complete_with`: its handler may still
/// run, and must not be cancelled as if the lease were lost).
const RENEW_LUA: &str = include_str!("inbox/lua/renew.lua");

/// `complete`, any number of leases of one partition: KEYS = due, leased, live; ARGV[1] =
/// prefix, [2] = retention (ms), [3] = `w` when durable (else empty), [4] = now (µs), then a
/// key and its lease's token for each lease. For each lease still held by its token: makes the
/// entry done (see `FINISH_ONE_LUA`) and raises its object's watermark (kept for the
/// retention). Returns 1 (completed) or 0 (not held) per lease; 1 also for a lease that
/// completed it already (its handler's [`RedisInbox::complete_with`], or this completion sent
/// again, after a `NotReplicated` when durable: the done entry keeps the token, and the fence
/// makes the `WAIT` behind count the first write).
///
/// A script has a fixed cost before it does anything, and every string handed to it one more:
/// a worker sends the completions that gathered while the last ones were in flight as one
/// script, each one key and one token.
static COMPLETE_LUA: LazyLock<String> =
    LazyLock::new(|| completing(include_str!("inbox/lua/complete.lua")));

/// `drop_payload` deletes what a done entry no longer keeps (its body, headers and next attempt
/// time): the first writes of a completion, since Redis refuses a script whose first write may
/// grow memory past `maxmemory`, and a full inbox must still drain. `finish_one` then
/// completes the entry of `key` whose fields `f` (state, token, object, position, history)
/// showed it held: the entry becomes done (state `k`, its token field `mark`: `1`, or the
/// lease's token for a completion that must find its own when sent again; its attempt ended as
/// a success at `now`) with the retention's `PEXPIRE`, and its object's next entry may go with
/// the watermark raised. The caller removes it from the sets.
const FINISH_ONE_LUA: &str = include_str!("inbox/lua/finish_one.lua");

/// A script that completes entries (`complete`, `complete_with`): `script` after the functions
/// it calls (`less`, `release`, `history`, `finish_one`).
fn completing(script: &str) -> String {
    LESS_LUA.to_owned() + RELEASE_LUA + HISTORY_LUA + FINISH_ONE_LUA + script
}

/// `complete_with`: KEYS = due, leased, live, entry; ARGV[1] = prefix, [2] = retention (ms),
/// [3] = key, [4] = token, [5] = `w` when durable (else empty), [6] = now (µs), then the writes,
/// each its number of strings and those strings (a command and its arguments). When the lease
/// is still the token's: drops the entry's body and headers (the first writes, see
/// `FINISH_ONE_LUA`), runs the writes, then completes as `complete` does. Returns 1 (written), 2
/// (done by this token already: a repeat, nothing written again but the fence when durable) or
/// 0 (not held).
static COMPLETE_WITH_LUA: LazyLock<String> =
    LazyLock::new(|| completing(include_str!("inbox/lua/complete_with.lua")));

/// Lets go of an object's entry in flight (`c:<object>`, which `take` sets) when it is `key`.
const RELEASE_LUA: &str = include_str!("inbox/lua/release.lua");

/// `fail`: KEYS = entry, due, leased, live, dead; ARGV[1] = prefix, [2] = key, [3] = token,
/// [4] = `r` (retry) or `d` (dead), [5] = retry time (µs), [6] = now (µs), [7] = the error as
/// the attempt's line keeps it (cut, cleaned), [8] = a dead letter's whole error when it is not
/// that. The attempt ends failed at `now`. Either way the entry
/// is no longer its object's entry in flight: a retry waits its turn in position order. A
/// retry is announced at its time, an ordered dead letter at once (its object's next may go),
/// so that the workers of every process hear them, not only the one that settled.
static FAIL_LUA: LazyLock<String> =
    LazyLock::new(|| RELEASE_LUA.to_owned() + HISTORY_LUA + include_str!("inbox/lua/fail.lua"));

/// `dead_letters`: KEYS = dead; ARGV[1] = prefix, [2] = limit (at least 1). One row per dead
/// letter, oldest enqueued first: key, last error, then the fields `Row::entry` reads.
const DEAD_LUA: &str = include_str!("inbox/lua/dead.lua");

/// `counts`: KEYS = leased, live, dead; ARGV[1] = prefix, [2] = now (µs). Returns in flight,
/// live (pending and in flight), dead, and the oldest live entry's enqueue time (or nil).
const COUNTS_LUA: &str = include_str!("inbox/lua/counts.lua");

static ENQUEUE: LazyLock<Script> = LazyLock::new(|| Script::from_lua(ENQUEUE_LUA.as_str()));
static TAKE: LazyLock<Script> = LazyLock::new(|| Script::from_lua(TAKE_LUA.as_str()));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::from_lua(RENEW_LUA));
static COMPLETE: LazyLock<Script> = LazyLock::new(|| Script::from_lua(COMPLETE_LUA.as_str()));
static COMPLETE_WITH: LazyLock<Script> =
    LazyLock::new(|| Script::from_lua(COMPLETE_WITH_LUA.as_str()));
static FAIL: LazyLock<Script> = LazyLock::new(|| Script::from_lua(FAIL_LUA.as_str()));
static DEAD: LazyLock<Script> = LazyLock::new(|| Script::from_lua(DEAD_LUA));
static COUNTS: LazyLock<Script> = LazyLock::new(|| Script::from_lua(COUNTS_LUA));

/// An inbox on Redis, through a connected [`fred`] client `C` (a [`Pool`] by default, or a
/// [`Client`](fred::clients::Client)), shared by any number of receivers and workers.
///
/// Every operation is **one `EVALSHA`** of a Lua script (sent again as `EVAL` on `NOSCRIPT`,
/// as [`RedisStore`](crate::RedisStore) does), so each is atomic on the server: `enqueue` checks
/// the key and stores the entry in one step, `take` hands an entry to one worker only (then
/// reads the bodies of what it took with one `MGET`), and `renew`, `complete` and `fail`
/// compare the lease's token before they write; `complete`, which a [`Worker`] sends its
/// gathered completions through, is one script per partition for all of them.
///
/// [`Worker`]: crate::inbox::Worker
///
/// # Keys
///
/// Every key of the inbox named `N` starts with the hash tag `{inbox:N}`, so all of them are in
/// one hash slot: the scripts never answer `CROSSSLOT` on Redis Cluster. To spread one inbox
/// over several primaries, [`partitions`](Self::partitions) gives it `n` hash tags
/// `{inbox:N:<p>}`, each with the keys below:
///
/// - `{inbox:N}:e:<key>`: a hash, the entry (kept headers, object and position, correlation
///   id, delivery id and route, attempts, next attempt, enqueue time; a field at its default is
///   left out) with its state (queued, running, dead, done), its lease's token, a dead letter's
///   error, and its last 10 attempts (one line each:
///   started, how long, how it ended, the worker, the error); `{inbox:N}:b:<key>`: its body, a
///   string of its own (so that the hash of small fields stays in Redis's compact encoding);
/// - a done entry is the same hash, kept with the retention's `PX` (what makes a later delivery
///   a duplicate, and what an operator [finds](crate::inbox::InboxAdmin::find) of it: correlation id,
///   delivery id, route, order, attempts), without its body, headers and next attempt; its token
///   field holds `1`, or the token of the lease that completed it when that was
///   [`complete_with`](RedisInbox::complete_with) or a [durable](RedisInbox::durable)
///   completion (so that the same completion sent again finds its own). A
///   [discarded](crate::inbox::InboxAdmin::discard) dead letter becomes one too;
/// - `{inbox:N}:fence`: written by a [durable](RedisInbox::durable) script that found its work
///   done already (a duplicate, a repeat), so that the `WAIT` behind it counts what it found;
/// - `{inbox:N}:due`: a sorted set of the queued and running entries, by next attempt time or
///   lease end, what `take` scans; `{inbox:N}:leased`: the running ones, by lease end;
///   `{inbox:N}:live`: the entries that are not dead, by enqueue time; `{inbox:N}:dead`: the dead
///   letters, by enqueue time;
/// - `{inbox:N}:o:<object>`: an object's entries that are neither done nor dead, by position;
///   `{inbox:N}:c:<object>`: the key of its entry in flight, until that one settles (no other
///   entry of the object is taken meanwhile); `{inbox:N}:w:<object>`: its watermark, the
///   highest position completed (with the retention's `PX`).
///
/// - `{inbox:N}:idle`: left by a take that found fewer entries than it asked for (its worker is
///   about to wait), deleted by the next enqueue, which then publishes.
/// - `{inbox:N}:paused`: present while the inbox is [paused](crate::inbox::InboxAdmin::pause) (in every
///   partition); `take` checks it in its script and hands out nothing.
///
/// Channels: `{inbox:N}:wake`, on which `enqueue` (while a worker waits: `:idle`), `requeue` and
/// a retry's `fail` publish their entry's due time (a `PUBLISH` in the script; an ordered dead
/// letter publishes "now"); [`wakeups`](InboxStore::wakeups) subscribes to it with one
/// subscriber connection per process (made from the client's configuration, resubscribed after
/// a reconnection), held while a worker waits.
///
/// # Operators
///
/// [`InboxAdmin`](crate::inbox::InboxAdmin) reads the entry hashes: `find` one (in the key's
/// partition, else in each of the others, since an ordered entry is in its object's), `list`
/// through a `SCAN` of each partition's node (`MATCH {inbox:N}:e:*`, on Redis Cluster the node
/// that holds the partition's slot), filtering what it read. A listing costs a pass over the
/// node's keyspace, the inbox's and others': as any `SCAN`, it sees every entry present from
/// its start to its end at least once, and a page holds fewer entries than asked (even none)
/// where the node holds mostly other keys. Keep listings to a cluster that is not resharding.
///
/// Times are the clients' clocks in microseconds since the epoch (as [`MemoryInbox`] uses its
/// own clock, and as the attempts' start and duration are kept): keep the hosts' clocks in sync (NTP), since a skew between two workers shifts
/// when one sees the other's lease run out.
///
/// # Bound
///
/// Unbounded by default (Redis's `maxmemory` with `noeviction` bounds it: an `OOM` is a
/// [`StoreErrorKind::Capacity`] error); [`capacity`](Self::capacity) bounds the entries, dead
/// letters included; done keys are bounded by their retention only.
///
/// `take` scans the due entries in time order and passes over those that wait behind another
/// entry of their object (as [`MemoryInbox`] does): cheap while few wait so, linear in them.
///
/// ```no_run
/// use std::convert::Infallible;
/// use axum::{Router, routing::post};
/// use tower_idempotency::fred::prelude::*;
/// use tower_idempotency::inbox::{InboxLayer, InboxRequest, RedisInbox, Worker};
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = Builder::from_config(Config::from_url("redis://127.0.0.1:6379")?).build_pool(4)?;
/// pool.init().await?;
/// let inbox = RedisInbox::new(pool, "webhooks").capacity(1_000_000);
/// // The door stores each delivery in Redis and answers at once...
/// let door = InboxLayer::new(inbox.clone()).namespace("webhooks");
/// let app: Router = Router::new().route("/webhooks", post(|| async { "" }).route_layer(door));
/// // ...and workers, in this process or any other on the same Redis, apply them.
/// let handler = tower::service_fn(|request: InboxRequest| async move {
///     println!("applying {}", request.key());
///     Ok::<_, Infallible>(())
/// });
/// tokio::spawn(Worker::new(inbox, handler).workers(4).run(std::future::pending::<()>()));
/// # let _ = app;
/// # Ok(())
/// # }
/// ```
///
/// [`MemoryInbox`]: crate::inbox::MemoryInbox
#[derive(Clone, Debug)]
pub struct RedisInbox<C = Pool> {
    client: C,
    name: Arc<str>,
    /// One key prefix per partition, each its own hash tag.
    prefixes: Arc<[Box<str>]>,
    capacity: u64,
    /// The partition the next `take` starts from, so that no partition waits behind another.
    next: Arc<AtomicUsize>,
    /// This process's workers' subscriptions, fed by one subscriber connection.
    announcer: Announcer,
    /// Whether the writes an answer or a settlement relies on wait for replicas.
    durability: Option<Durability<C>>,
}

impl<C> RedisInbox<C>
where
    C: LuaInterface + 'static,
{
    /// The inbox `name` on `client`: its keys start with `{inbox:<name>}:`.
    ///
    /// ```no_run
    /// # async fn example(client: tower_idempotency::fred::clients::Client) {
    /// let inbox = tower_idempotency::inbox::RedisInbox::new(client, "payments");
    /// assert_eq!(inbox.prefix(), "{inbox:payments}:");
    /// # }
    /// ```
    pub fn new(client: C, name: &str) -> Self {
        RedisInbox {
            client,
            name: name.into(),
            prefixes: Arc::from(vec![format!("{{inbox:{name}}}:").into_boxed_str()]),
            capacity: 0,
            next: Arc::default(),
            announcer: Announcer::new(),
            durability: None,
        }
    }

    /// Spreads the inbox over `n` partitions (1 to 255; 1, the default, keeps every key under
    /// `{inbox:<name>}`), each its own hash tag `{inbox:<name>:<p>}`, so that on Redis Cluster the
    /// entries live on several primaries. An ordered entry goes to its object's partition (an
    /// object's entries, queue and watermark stay in one slot, so order holds), an unordered one
    /// to its key's. Every operation on an entry is still one script on one slot; `take`,
    /// `counts` and `dead_letters` ask every partition (at once), `requeue` each in turn.
    ///
    /// The number is part of the layout: entries stored under another number are not found.
    /// On an ordered route a key is deduplicated within its object's partition, so a key that
    /// came back with another object (not a redelivery) would count as new there.
    ///
    /// ```no_run
    /// # async fn example(client: tower_idempotency::fred::clients::Client) {
    /// let inbox = tower_idempotency::inbox::RedisInbox::new(client, "payments").partitions(8);
    /// assert_eq!(inbox.prefix(), "{inbox:payments:0}:");
    /// # }
    /// ```
    pub fn partitions(mut self, n: u8) -> Self {
        let name = &self.name;
        self.prefixes = match n {
            0 | 1 => Arc::from(vec![format!("{{inbox:{name}}}:").into_boxed_str()]),
            n => (0..n)
                .map(|p| format!("{{inbox:{name}:{p}}}:").into_boxed_str())
                .collect(),
        };
        self
    }

    /// Bounds the entries (pending, in flight and dead) to `max_entries`: past it, an enqueue
    /// fails with [`StoreErrorKind::Capacity`] (the route answers 503 + `Retry-After`). On a
    /// [partitioned](Self::partitions) inbox each partition holds its share (rounded up).
    ///
    /// ```no_run
    /// # async fn example(client: tower_idempotency::fred::clients::Client) {
    /// let inbox = tower_idempotency::inbox::RedisInbox::new(client, "payments").capacity(10_000);
    /// # }
    /// ```
    pub fn capacity(mut self, max_entries: u64) -> Self {
        self.capacity = max_entries;
        self
    }

    /// Durable writes: every write that an answer or a settlement relies on (the enqueue
    /// before the route's `202`, [`complete`](InboxStore::complete), [`fail`](InboxStore::fail),
    /// [`requeue`](crate::inbox::InboxAdmin::requeue), [`complete_with`](Self::complete_with)) waits until at
    /// least `replicas` replicas acknowledged it (`WAIT replicas timeout`, pipelined behind the
    /// script on the same connection), and is an error
    /// ([`NotReplicated`](crate::store::NotReplicated)) when fewer did within `timeout`. The
    /// route then answers `503` + `Retry-After` instead of a `202` that a failover could take
    /// back; the sender's retry finds the entry stored and is acknowledged once the replicas
    /// have it (a duplicate is made to wait for them too). As
    /// [`RedisStore::durable_completion`](crate::RedisStore::durable_completion), whose setting
    /// [`AnyInbox::on`](crate::inbox::AnyInbox::on) carries over. Takes and renewals are not waited
    /// for (a lost one is a lease that runs out), but they share the client's connections with
    /// the writes that are: while the replicas lag, a renewal may queue behind `WAIT`s, each up
    /// to `timeout`, so keep `timeout` well under a third of the workers' lease (or give the
    /// workers a client of their own). After a failover the new primary has no scripts cached:
    /// the first call of each script there waits twice (`NOSCRIPT`, then `EVAL`).
    ///
    /// `replicas` = 0 turns it off. `timeout` is rounded to whole milliseconds, at least 1.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn example(pool: tower_idempotency::fred::clients::Pool) {
    /// let inbox = tower_idempotency::inbox::RedisInbox::new(pool, "payments")
    ///     .durable(1, Duration::from_millis(50));
    /// # }
    /// ```
    pub fn durable(mut self, replicas: u32, timeout: Duration) -> Self
    where
        C: PickClient,
    {
        self.durability = Durability::of(replicas, timeout);
        self
    }

    /// The prefix of every key of this inbox (of its first partition when it has several),
    /// its hash tag included.
    ///
    /// ```no_run
    /// # async fn example(client: tower_idempotency::fred::clients::Client) {
    /// let inbox = tower_idempotency::inbox::RedisInbox::new(client, "a");
    /// assert!(inbox.prefix().starts_with("{inbox:a}"));
    /// # }
    /// ```
    pub fn prefix(&self) -> &str {
        &self.prefixes[0]
    }

    /// The fred client.
    ///
    /// ```no_run
    /// # async fn example(client: tower_idempotency::fred::clients::Client) {
    /// let inbox = tower_idempotency::inbox::RedisInbox::new(client, "a");
    /// let _client = inbox.client();
    /// # }
    /// ```
    pub fn client(&self) -> &C {
        &self.client
    }

    /// The hash tag of the partition the entry leased under `token` is in (`{inbox:<name>}`, or
    /// `{inbox:<name>:<p>}` when [partitioned](Self::partitions)); `None` for a token that is
    /// not of one of this inbox's partitions (a worker's
    /// [`InboxRequest::token`](crate::inbox::InboxRequest::token) always is). The
    /// keys of the [writes](RedisWrites) completed with the entry
    /// ([`complete_with`](Self::complete_with)) carry it, so that they live in the entry's hash
    /// slot: `format!("app:status:{tag}:{message_id}")`. An ordered entry is in its object's
    /// partition, so the writes of one object's entries always share one tag.
    ///
    /// ```no_run
    /// # fn example(inbox: tower_idempotency::inbox::RedisInbox, request: &tower_idempotency::inbox::InboxRequest) {
    /// let tag = inbox.hash_tag(request.token()).unwrap();
    /// assert_eq!(tag, "{inbox:payments}");
    /// # }
    /// ```
    pub fn hash_tag(&self, token: &Token) -> Option<&str> {
        let p = self.partition_of_token(token)?;
        let prefix = &self.prefixes[p];
        Some(&prefix[..prefix.len() - 1])
    }

    fn entry_key(&self, p: usize, key: &StoreKey) -> String {
        concat(&[&self.prefixes[p], "e:", key.as_str()])
    }

    fn body_key(&self, p: usize, key: &StoreKey) -> String {
        concat(&[&self.prefixes[p], "b:", key.as_str()])
    }

    fn set(&self, p: usize, name: &str) -> String {
        concat(&[&self.prefixes[p], name])
    }

    /// The keys of a script on one entry: the entry's, then the sets `sets` of its partition.
    fn entry_keys(&self, p: usize, key: &StoreKey, sets: &[&str]) -> Vec<String> {
        let mut keys = Vec::with_capacity(1 + sets.len());
        keys.push(self.entry_key(p, key));
        keys.extend(sets.iter().map(|name| self.set(p, name)));
        keys
    }

    /// The partition of an entry: its object's when ordered, else its key's.
    fn partition_of(&self, entry: &InboxEntry) -> usize {
        let n = self.prefixes.len();
        if n == 1 {
            return 0;
        }
        let hashed = match &entry.order {
            Some(order) => order.object.as_str(),
            None => entry.key.as_str(),
        };
        usize::from(fred::util::redis_keyslot(hashed.as_bytes())) % n
    }

    /// The partition an unordered entry of `key` is in (an ordered one is in its object's).
    fn partition_of_key(&self, key: &StoreKey) -> usize {
        let n = self.prefixes.len();
        if n == 1 {
            return 0;
        }
        usize::from(fred::util::redis_keyslot(key.as_str().as_bytes())) % n
    }

    /// The partition a lease's token was handed out from (see `take_from`).
    fn partition_of_token(&self, token: &Token) -> Option<usize> {
        let p = usize::from(token.as_bytes()[15]);
        (p < self.prefixes.len()).then_some(p)
    }

    async fn run(
        &self,
        script: &Script,
        keys: Vec<String>,
        args: impl Fn() -> Vec<Value>,
    ) -> Result<Value, StoreError> {
        let keys = Keys::Tagged(keys);
        evalsha_with_reload(&self.client, script, || (keys.multiple(), args()))
            .await
            .map_err(store_error)
    }

    async fn run_flag(
        &self,
        script: &Script,
        keys: Vec<String>,
        args: impl Fn() -> Vec<Value>,
    ) -> Result<bool, StoreError> {
        flag(self.run(script, keys, args).await?)
    }

    /// [`run`](Self::run) for a write that an answer or a settlement relies on: with
    /// [durability](Self::durable), the script and a `WAIT` on one connection, whose count
    /// matters when `wrote` says the reply is of a script that wrote (one that wrote nothing,
    /// a refusal, is not made to fail on another write's replication).
    async fn run_written(
        &self,
        script: &Script,
        keys: Vec<String>,
        args: impl Fn() -> Vec<Value>,
        wrote: fn(&Value) -> bool,
    ) -> Result<Value, StoreError> {
        match self.durability {
            Some(durability) => {
                let client = (durability.pick)(&self.client);
                let keys = Keys::Tagged(keys);
                script_replicated(&client, durability, script, &keys, &args(), wrote).await
            }
            None => self.run(script, keys, args).await,
        }
    }

    /// The scripts' durable flag: `w` when the writes wait for replicas.
    fn durable_flag(&self) -> Value {
        Value::from(if self.durability.is_some() { "w" } else { "" })
    }
}

impl<C> RedisInbox<C>
where
    C: LuaInterface + KeysInterface + Send + Sync + 'static,
{
    /// Takes up to `max` due entries from partition `p`. Each lease's token ends with the
    /// partition's number, so that its settlements go to that partition's slot.
    async fn take_from(
        &self,
        p: usize,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<Lease>, StoreError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let now = SystemTime::now();
        // A lease ending now would leave the entry in the range the script scans.
        let lease = lease.max(Duration::from_millis(1));
        // The script numbers the leases in bytes 13 and 14 (from 0); the rest stays random.
        let mut seed = *Token::random().as_bytes();
        seed[15] = p as u8;
        let seed = Token::from_bytes(seed);
        let keys = vec![self.set(p, "due"), self.set(p, "leased")];
        let args = || {
            vec![
                Value::from(&*self.prefixes[p]),
                Value::Integer(micros(now)),
                Value::Integer(micros(now + lease)),
                Value::Integer(max as i64),
                token_value(&seed),
                Value::from(WORKER.as_str()),
            ]
        };
        let leases = rows(self.run(&TAKE, keys, args).await?, "take")?
            .into_iter()
            .map(|row| {
                let mut row = Row::new(row, "take")?;
                let key = row.key()?;
                let stale = row.int()? == 1;
                let token = row.token()?;
                let entry = row.entry(key, Bytes::new())?;
                Ok(Lease {
                    entry,
                    token,
                    stale,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        self.read_bodies(p, leases).await
    }

    /// Fills in the bodies of the entries just taken: one `MGET` of their `b:` keys, which only
    /// a completion by the lease's holder deletes. An entry whose body is gone all the same
    /// (deleted by hand, evicted) is made a dead letter saying so, not handed out.
    async fn read_bodies(&self, p: usize, leases: Vec<Lease>) -> Result<Vec<Lease>, StoreError> {
        if leases.is_empty() {
            return Ok(leases);
        }
        let names: Vec<String> = leases
            .iter()
            .map(|lease| self.body_key(p, &lease.entry.key))
            .collect();
        let bodies: Vec<Option<Bytes>> = self.client.mget(names).await.map_err(store_error)?;
        if bodies.len() != leases.len() {
            return Err(corrupt("MGET answered another number of bodies"));
        }
        let mut complete = Vec::with_capacity(leases.len());
        for (mut lease, body) in leases.into_iter().zip(bodies) {
            match body {
                Some(body) => {
                    lease.entry.body = body;
                    complete.push(lease);
                }
                None => {
                    let error = "inbox: the entry's body is missing".to_owned();
                    tracing::warn!(key = %lease.entry.key, "{error}: made a dead letter");
                    self.fail(&lease.entry.key, &lease.token, Failure::Dead(error))
                        .await?;
                }
            }
        }
        Ok(complete)
    }

    /// Completes `leases[i]` for each `i` of `indices`, all from partition `p`: one script.
    async fn complete_in(
        &self,
        p: usize,
        leases: &[(StoreKey, Token)],
        indices: &[usize],
        retention: Duration,
    ) -> Result<Vec<bool>, StoreError> {
        let keys = vec![
            self.set(p, "due"),
            self.set(p, "leased"),
            self.set(p, "live"),
        ];
        let now = micros(SystemTime::now());
        let args = || {
            let mut args = Vec::with_capacity(4 + 2 * indices.len());
            args.push(Value::from(&*self.prefixes[p]));
            args.push(Value::Integer(millis(retention)));
            args.push(self.durable_flag());
            args.push(Value::Integer(now));
            for &i in indices {
                let (key, token) = &leases[i];
                args.push(Value::from(key.as_str()));
                args.push(token_value(token));
            }
            args
        };
        let flags = rows(
            self.run_written(&COMPLETE, keys, args, any_flag).await?,
            "complete",
        )?;
        if flags.len() != indices.len() {
            return Err(corrupt("complete answered another number of flags"));
        }
        flags.into_iter().map(flag).collect()
    }

    /// Applies `writes` and completes the entry of `key` in **one token-checked script**: both
    /// when the lease is still `token`'s (a worker's
    /// [`InboxRequest::key`](crate::inbox::InboxRequest::key) and
    /// [`InboxRequest::token`](crate::inbox::InboxRequest::token)), neither when it is not
    /// (`Ok(false)`: another worker took the entry over; the handler should then return an
    /// error). The Redis
    /// counterpart of [`SqlInbox::complete_in_tx`](crate::inbox::SqlInbox::complete_in_tx): the effect
    /// and the entry's completion happen together, exactly once, whatever happens around them:
    /// a worker paused in the middle of its handler and resumed after its lease (its script
    /// finds the lease gone and writes nothing), a worker killed after the script (the key is
    /// done; nobody runs the entry again), a script sent again by the client after a reconnection
    /// (it finds the key done by this token and writes nothing again: `Ok(true)`), and with
    /// [durability](Self::durable), a failover (the script's writes are on the replicas before
    /// it returns). The worker's own completion afterwards finds the key done by the same
    /// lease and changes nothing.
    ///
    /// Every key the writes name must carry the entry's [hash tag](Self::hash_tag): on Redis
    /// Cluster a key of another slot works only while that slot lives on the same node, and
    /// fails in the middle of the script once a reshard moves it. The done key keeps the lease's
    /// token for the retention (16 bytes where a plain [`complete`](InboxStore::complete) keeps
    /// 1). A write that Redis refuses (a command against a key of the wrong type) fails the call
    /// after the writes before it were made and before the completion, as Redis does not roll a
    /// script back: name writes that cannot fail. The entry is deleted before the writes run,
    /// so that an inbox over `maxmemory` still drains (Redis refuses a script whose first write
    /// may grow memory).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use tower_idempotency::inbox::{InboxRequest, RedisInbox, RedisWrites};
    ///
    /// # async fn handler(inbox: RedisInbox, request: InboxRequest) -> Result<(), Box<dyn std::error::Error>> {
    /// let tag = inbox.hash_tag(request.token()).ok_or("not this inbox's lease")?;
    /// let writes = RedisWrites::new()
    ///     .command(["HINCRBY", format!("app:applied:{tag}").as_str(), "evt_1", "1"])
    ///     .command(["SET", format!("app:status:{tag}:m_1").as_str(), "delivered"]);
    /// let retention = Duration::from_secs(7 * 24 * 3600);
    /// if !inbox.complete_with(request.key(), request.token(), writes, retention).await? {
    ///     return Err("lease lost: nothing written".into());
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn complete_with(
        &self,
        key: &StoreKey,
        token: &Token,
        writes: RedisWrites,
        retention: Duration,
    ) -> Result<bool, StoreError> {
        let Some(p) = self.partition_of_token(token) else {
            return Ok(false);
        };
        let keys = vec![
            self.set(p, "due"),
            self.set(p, "leased"),
            self.set(p, "live"),
            self.entry_key(p, key),
        ];
        let now = micros(SystemTime::now());
        let args = || {
            let mut args = Vec::with_capacity(6 + writes.args.len());
            args.push(Value::from(&*self.prefixes[p]));
            args.push(Value::Integer(millis(retention)));
            args.push(Value::from(key.as_str()));
            args.push(token_value(token));
            args.push(self.durable_flag());
            args.push(Value::Integer(now));
            args.extend(writes.args.iter().cloned());
            args
        };
        match self
            .run_written(&COMPLETE_WITH, keys, args, one_or_two)
            .await?
        {
            Value::Integer(1 | 2) => Ok(true),
            Value::Integer(0) => Ok(false),
            other => Err(unexpected("complete_with", &other)),
        }
    }

    async fn dead_in(&self, p: usize, limit: i64) -> Result<Vec<DeadLetter>, StoreError> {
        let args = || vec![Value::from(&*self.prefixes[p]), Value::Integer(limit)];
        rows(
            self.run(&DEAD, vec![self.set(p, "dead")], args).await?,
            "dead_letters",
        )?
        .into_iter()
        .map(|row| {
            let mut row = Row::new(row, "dead_letters")?;
            let key = row.key()?;
            let last_error = row.text()?;
            // Empty for a dead letter made because its body was gone.
            let body = row.optional()?.unwrap_or_default();
            let entry = row.entry(key, body)?;
            Ok(DeadLetter { entry, last_error })
        })
        .collect()
    }

    /// Partition `p`'s in flight, live and dead counts and its oldest live entry's enqueue time.
    async fn counts_in(
        &self,
        p: usize,
        now: SystemTime,
    ) -> Result<(u64, u64, u64, Option<SystemTime>), StoreError> {
        let keys = vec![
            self.set(p, "leased"),
            self.set(p, "live"),
            self.set(p, "dead"),
        ];
        let args = || vec![Value::from(&*self.prefixes[p]), Value::Integer(micros(now))];
        let mut row = Row::new(self.run(&COUNTS, keys, args).await?, "counts")?;
        let (in_flight, live, dead) = (row.count()?, row.count()?, row.count()?);
        Ok((in_flight, live, dead, row.optional_int()?.map(from_micros)))
    }
}

/// Redis writes made with an entry's completion, in one token-checked script: see
/// [`RedisInbox::complete_with`]. Each is a command and its arguments, run by the script with
/// `redis.call`, in order.
///
/// ```
/// use tower_idempotency::inbox::RedisWrites;
///
/// let writes = RedisWrites::new()
///     .command(["SET", "app:status:{inbox:email}:m_1", "delivered"])
///     .command(["HINCRBY", "app:applied:{inbox:email}", "evt_1", "1"]);
/// # let _ = writes;
/// ```
#[derive(Clone, Debug, Default)]
pub struct RedisWrites {
    /// Each command's number of strings, then those strings.
    args: Vec<Value>,
}

impl RedisWrites {
    /// No writes: [`complete_with`](RedisInbox::complete_with) then completes alone.
    pub fn new() -> Self {
        RedisWrites::default()
    }

    /// Adds a command: its name, then its arguments (`["SET", key, value]`). Every key it names
    /// must carry the entry's [hash tag](RedisInbox::hash_tag). An empty command is ignored;
    /// keep a command to a few thousand arguments (Lua unpacks them onto its stack, which
    /// holds about 8,000).
    pub fn command<I, A>(mut self, command: I) -> Self
    where
        I: IntoIterator<Item = A>,
        A: AsRef<[u8]>,
    {
        let at = self.args.len();
        self.args.push(Value::Integer(0));
        self.args.extend(
            command
                .into_iter()
                .map(|arg| Value::Bytes(Bytes::copy_from_slice(arg.as_ref()))),
        );
        let n = self.args.len() - at - 1;
        if n == 0 {
            self.args.truncate(at);
        } else {
            self.args[at] = Value::Integer(n as i64);
        }
        self
    }
}

impl<C> InboxStore for RedisInbox<C>
where
    C: LuaInterface + KeysInterface + Send + Sync + 'static,
{
    async fn enqueue(&self, entry: InboxEntry) -> Result<Enqueued, StoreError> {
        let p = self.partition_of(&entry);
        // A partition holds its share of the bound.
        let capacity = self.capacity.div_ceil(self.prefixes.len() as u64);
        let enqueued_at = micros(entry.enqueued_at);
        let args = || {
            let mut args = vec![
                Value::from(&*self.prefixes[p]),
                Value::from(entry.key.as_str()),
                Value::Bytes(entry.body.clone()),
                Value::from(entry.correlation_id.as_str()),
                Value::Integer(enqueued_at),
            ];
            if self.durability.is_some() {
                args.extend([Value::from("w"), Value::from("1")]);
            }
            optional_fields(&entry, enqueued_at, capacity, &mut args);
            args
        };
        let keys = vec![self.set(p, "due"), self.entry_key(p, &entry.key)];
        match self
            .run_written(&ENQUEUE, keys, args, enqueue_wrote)
            .await?
        {
            Value::Integer(0) => Ok(Enqueued::Queued),
            Value::Integer(1) => Ok(Enqueued::Duplicate(KeyState::Queued)),
            Value::Integer(2) => Ok(Enqueued::Duplicate(KeyState::Running)),
            Value::Integer(3) => Ok(Enqueued::Duplicate(KeyState::Dead)),
            Value::Integer(4) => Ok(Enqueued::Duplicate(KeyState::Done)),
            Value::Integer(5) => Err(StoreError::new(StoreErrorKind::Capacity)),
            Value::Array(stale) => match <[Value; 2]>::try_from(stale) {
                Ok([Value::Integer(6), watermark]) => bytes_of(watermark)
                    .and_then(|w| <[u8; Position::LEN]>::try_from(&w[..]).ok())
                    .map(|w| Enqueued::Stale(Position::from_bytes(w)))
                    .ok_or_else(|| corrupt("enqueue answered a watermark of another size")),
                _ => Err(corrupt("enqueue answered an unexpected array")),
            },
            other => Err(unexpected("enqueue", &other)),
        }
    }

    /// One partition: one script. Several: every partition asked for its share at once, then
    /// those with entries left asked in turn for what is still missing.
    async fn take(&self, max: usize, lease: Duration) -> Result<Vec<Lease>, StoreError> {
        let max = max.min(MAX_TAKE);
        let n = self.prefixes.len();
        let first = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let order: Vec<usize> = (0..n).map(|i| (first + i) % n).collect();
        let share = |i: usize| max / n + usize::from(i < max % n);
        let asked = order
            .iter()
            .enumerate()
            .map(|(i, &p)| self.take_from(p, share(i), lease));
        let mut taken = Vec::with_capacity(max);
        let mut full = Vec::new();
        for (i, leases) in join_all(asked).await.into_iter().enumerate() {
            let leases = leases?;
            // A partition that gave all it was asked (or was asked nothing) may have more.
            // Each is asked again while the take is short, so a take that comes back short
            // has looked at every partition last with a short take, which left each one's
            // `idle` mark: an enqueue to any partition then wakes this worker.
            if leases.len() == share(i) {
                full.push(order[i]);
            }
            taken.extend(leases);
        }
        for p in full {
            if taken.len() == max {
                break;
            }
            taken.extend(self.take_from(p, max - taken.len(), lease).await?);
        }
        Ok(taken)
    }

    async fn renew(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let Some(p) = self.partition_of_token(token) else {
            return Ok(false);
        };
        let keys = self.entry_keys(p, key, &["due", "leased"]);
        let until = micros(SystemTime::now() + lease);
        let args = || {
            vec![
                Value::from(key.as_str()),
                token_value(token),
                Value::Integer(until),
            ]
        };
        self.run_flag(&RENEW, keys, args).await
    }

    /// One script per partition the leases came from (per 1000 of them: a script holds
    /// the server while it runs), all at once.
    async fn complete(
        &self,
        leases: &[(StoreKey, Token)],
        retention: Duration,
    ) -> Result<Vec<bool>, StoreError> {
        let mut done = vec![false; leases.len()];
        // The leases of each partition, by their index in `leases`; a token from no partition
        // of this inbox is not held.
        let mut by_partition: Vec<Vec<usize>> = vec![Vec::new(); self.prefixes.len()];
        for (i, (_, token)) in leases.iter().enumerate() {
            if let Some(p) = self.partition_of_token(token) {
                by_partition[p].push(i);
            }
        }
        let scripts: Vec<(usize, &[usize])> = by_partition
            .iter()
            .enumerate()
            .flat_map(|(p, indices)| indices.chunks(MAX_TAKE).map(move |chunk| (p, chunk)))
            .collect();
        let asked = scripts
            .iter()
            .map(|&(p, chunk)| self.complete_in(p, leases, chunk, retention));
        for (&(_, chunk), flags) in scripts.iter().zip(join_all(asked).await) {
            for (&i, flag) in chunk.iter().zip(flags?) {
                done[i] = flag;
            }
        }
        Ok(done)
    }

    async fn fail(
        &self,
        key: &StoreKey,
        token: &Token,
        failure: Failure,
    ) -> Result<bool, StoreError> {
        let Some(p) = self.partition_of_token(token) else {
            return Ok(false);
        };
        let keys = self.entry_keys(p, key, &["due", "leased", "live", "dead"]);
        // The attempt keeps its error cut and cleaned; a dead letter keeps it whole.
        let (mode, at, error) = match &failure {
            Failure::RetryAt(at, error) => ("r", micros(*at), error),
            Failure::Dead(error) => ("d", 0, error),
        };
        let kept = history::error_field(error);
        let whole = (mode == "d" && kept != *error).then_some(error.as_str());
        let now = micros(SystemTime::now());
        let args = || {
            let mut args = vec![
                Value::from(&*self.prefixes[p]),
                Value::from(key.as_str()),
                token_value(token),
                Value::from(mode),
                Value::Integer(at),
                Value::Integer(now),
                Value::from(kept.as_str()),
            ];
            args.extend(whole.map(Value::from));
            args
        };
        flag(self.run_written(&FAIL, keys, args, one).await?)
    }

    async fn counts(&self) -> Result<InboxCounts, StoreError> {
        let now = SystemTime::now();
        let asked = (0..self.prefixes.len()).map(|p| self.counts_in(p, now));
        let (mut in_flight, mut live, mut dead, mut oldest) = (0, 0, 0, None::<SystemTime>);
        for counts in join_all(asked).await {
            let (f, l, d, o) = counts?;
            (in_flight, live, dead) = (in_flight + f, live + l, dead + d);
            oldest = match (oldest, o) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        Ok(InboxCounts {
            pending: live.saturating_sub(in_flight),
            in_flight,
            dead,
            oldest_age: oldest.map(|at| now.duration_since(at).unwrap_or_default()),
        })
    }

    /// Every process's enqueues and re-queues: the scripts `PUBLISH` on `<prefix>wake` of each
    /// partition, and one subscriber connection of this process (made like the client's,
    /// resubscribed after a reconnection) relays them while a worker waits.
    fn wakeups(&self) -> Wakeups {
        let channels = self.prefixes.iter().map(|p| concat(&[p, "wake"])).collect();
        let client = self.client.clone();
        self.announcer.subscribe_relayed(move |announcer| {
            Some(tokio::spawn(crate::redis::relay::relay(
                client, channels, announcer,
            )))
        })
    }
}

/// The `enqueue` arguments after the first four: a name and a value for each field of `entry`
/// that is not its default, and the capacity when there is one.
fn optional_fields(entry: &InboxEntry, enqueued_at: i64, capacity: u64, args: &mut Vec<Value>) {
    if capacity > 0 {
        args.extend([
            "cap".into(),
            Value::Integer(capacity.min(i64::MAX as u64) as i64),
        ]);
    }
    if !entry.headers.is_empty() {
        args.extend(["h".into(), Value::Bytes(encode_headers(&entry.headers))]);
    }
    if entry.attempts != 0 {
        args.extend(["a".into(), Value::Integer(i64::from(entry.attempts))]);
    }
    let next = micros(entry.next_attempt_at);
    if next != enqueued_at {
        args.extend(["n".into(), Value::Integer(next)]);
    }
    if !entry.id.is_empty() {
        args.extend(["i".into(), Value::from(entry.id.as_str())]);
    }
    if !entry.route.is_empty() {
        args.extend(["r".into(), Value::from(entry.route.as_str())]);
    }
    if let Some(order) = &entry.order {
        let position = Bytes::copy_from_slice(&order.position.to_bytes());
        args.extend([
            "o".into(),
            Value::from(order.object.as_str()),
            "p".into(),
            Value::Bytes(position),
        ]);
        if order.equal == EqualPositions::Stale {
            args.extend(["eq".into(), "1".into()]);
        }
    }
}

/// `parts` end to end, in one allocation: key names are built on every call, where `format!`
/// cost five times as much.
fn concat(parts: &[&str]) -> String {
    let mut name = String::with_capacity(parts.iter().map(|part| part.len()).sum());
    parts.iter().for_each(|part| name.push_str(part));
    name
}

/// `at` in whole microseconds since the epoch (0 before it): exact in Lua's doubles and in
/// sorted-set scores until the year 2255.
fn micros(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_micros().min(i64::MAX as u128) as i64)
}

fn from_micros(micros: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(micros.max(0) as u64)
}

fn token_value(token: &Token) -> Value {
    Value::Bytes(Bytes::copy_from_slice(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_count_their_commands() {
        let writes = RedisWrites::new()
            .command(["SET", "app:status:{inbox:email}:m_1", "delivered"])
            .command(["HINCRBY", "app:applied:{inbox:email}", "evt_1", "1"]);
        // Each command is its number of strings, then those strings.
        let (mut commands, mut at) = (0, 0);
        while let Some(Value::Integer(n)) = writes.args.get(at) {
            at += 1 + *n as usize;
            commands += 1;
        }
        assert_eq!(at, writes.args.len());
        assert_eq!(commands, 2);
    }

    #[test]
    fn times_keep_their_microseconds() {
        let at = UNIX_EPOCH + Duration::from_micros(1_764_745_000_123_456);
        assert_eq!(from_micros(micros(at)), at);
        assert_eq!(micros(UNIX_EPOCH - Duration::from_secs(1)), 0);
    }

    #[test]
    fn every_key_of_an_inbox_is_in_one_slot() {
        let prefix = "{inbox:webhooks}:";
        let key = StoreKey::new("n", None, "k");
        let names = [
            format!("{prefix}e:{key}"),
            format!("{prefix}due"),
            format!("{prefix}o:to:abc"),
        ];
        let slot = fred::util::redis_keyslot(names[0].as_bytes());
        assert!(
            names
                .iter()
                .all(|name| fred::util::redis_keyslot(name.as_bytes()) == slot)
        );
    }
}
