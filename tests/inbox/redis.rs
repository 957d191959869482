//! The inbox contract on [`RedisInbox`], against a real `redis-server` started on 127.0.0.1
//! for each test, and what only a shared inbox shows: two instances (two clients) on one
//! server never hand one entry to both, and see each other's keys as duplicates. The contract
//! runs again on a shared Redis Cluster (three primaries), where every script touches one hash
//! slot, and through Sentinel (a primary, a replica, three sentinels).
#![cfg(feature = "redis")]

use crate::redis_cluster::{self, Deployment as _};
use crate::redis_sentinel::{self, Deployment as _};
use crate::redis_server;
use tower_idempotency::test_util::inbox as inbox_contract;
use tower_idempotency::test_util::inbox_admin as inbox_admin_contract;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use redis_server::RedisServer;
use tower_idempotency::inbox::{
    Enqueued, InboxAdmin, InboxEntry, InboxStore, KeyState, RedisInbox, RedisWrites,
};
use tower_idempotency::order::Position;
use tower_idempotency::store::{ObjectKey, StoreErrorKind, StoreKey};
use tower_idempotency::test_util::values;

/// An inbox name no other test on the same server uses.
fn fresh_name() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "t{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// An inbox of its own on a server of its own.
async fn standalone() -> (RedisInbox<fred::clients::Client>, RedisServer) {
    let server = RedisServer::start();
    let inbox = RedisInbox::new(server.connect().await, &fresh_name());
    (inbox, server)
}

inbox_contract::inbox_contract!(standalone());
inbox_admin_contract::inbox_admin_contract!(standalone());

/// The contract on a clustered client: no script answers `CROSSSLOT`.
mod cluster {
    use super::*;

    async fn clustered() -> (
        RedisInbox<fred::clients::Client>,
        std::sync::Arc<redis_cluster::RedisCluster>,
    ) {
        let cluster = redis_cluster::RedisCluster::shared();
        let inbox = RedisInbox::new(cluster.connect().await, &fresh_name());
        (inbox, cluster)
    }

    inbox_contract::inbox_contract!(clustered());
    inbox_admin_contract::inbox_admin_contract!(clustered());
}

/// The contract on an inbox of four partitions, on one server and on the cluster, where its
/// partitions are four hash slots.
mod partitioned {
    use super::*;

    async fn partitioned() -> (RedisInbox<fred::clients::Client>, RedisServer) {
        let server = RedisServer::start();
        let inbox = RedisInbox::new(server.connect().await, &fresh_name()).partitions(4);
        (inbox, server)
    }

    inbox_contract::inbox_contract!(partitioned());
    inbox_admin_contract::inbox_admin_contract!(partitioned());

    mod cluster {
        use super::*;

        async fn clustered() -> (
            RedisInbox<fred::clients::Client>,
            std::sync::Arc<redis_cluster::RedisCluster>,
        ) {
            let cluster = redis_cluster::RedisCluster::shared();
            let inbox = RedisInbox::new(cluster.connect().await, &fresh_name()).partitions(4);
            (inbox, cluster)
        }

        inbox_contract::inbox_contract!(clustered());
        inbox_admin_contract::inbox_admin_contract!(clustered());
    }
}

/// On a cluster a partitioned inbox spreads its objects over its partitions' slots, keeps each
/// object's entries in one of them and in order, and takes from every partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_inbox_spreads_objects_over_slots_and_keeps_their_order() {
    let cluster = redis_cluster::RedisCluster::shared();
    let name = fresh_name();
    let inbox = RedisInbox::new(cluster.connect().await, &name).partitions(4);
    const OBJECTS: u32 = 16;
    for n in 0..3 * OBJECTS {
        let object = ObjectKey::new("inbox-redis", None, &format!("obj-{}", n % OBJECTS));
        let ordered = ordered(entry(n), object, Position::new(i128::from(n)));
        assert_eq!(inbox.enqueue(ordered).await.unwrap(), Enqueued::Queued);
    }
    let client = cluster.connect().await;
    let mut live = Vec::new();
    let mut slots = HashSet::new();
    for p in 0..4 {
        let set = format!("{{inbox:{name}:{p}}}:live");
        slots.insert(fred::util::redis_keyslot(set.as_bytes()));
        let zcard = fred::types::CustomCommand::new_static(
            "ZCARD",
            fred::types::ClusterHash::FirstKey,
            false,
        );
        let count: u64 = fred::interfaces::ClientLike::custom(&client, zcard, vec![set.clone()])
            .await
            .unwrap();
        live.push(count);
    }
    assert_eq!(slots.len(), 4, "four hash slots");
    assert_eq!(live.iter().sum::<u64>(), u64::from(3 * OBJECTS));
    assert!(
        live.iter().filter(|&&n| n > 0).count() >= 2,
        "objects spread: {live:?}"
    );
    // Taken and completed round after round: an object's entries come one at a time, in order.
    let mut last = std::collections::HashMap::new();
    let mut applied = 0;
    while applied < 3 * OBJECTS {
        let leases = inbox.take(100, Duration::from_secs(30)).await.unwrap();
        assert!(!leases.is_empty(), "entries left but none taken");
        let mut objects = HashSet::new();
        for lease in leases {
            let order = lease.entry.order.clone().unwrap();
            assert!(
                objects.insert(order.object.clone()),
                "one entry per object at a time"
            );
            if let Some(previous) = last.insert(order.object.clone(), order.position) {
                assert!(previous < order.position, "in position order");
            }
            let lease = [(lease.entry.key.clone(), lease.token)];
            let done = inbox.complete(&lease, Duration::from_secs(60));
            assert!(done.await.unwrap()[0]);
            applied += 1;
        }
    }
    assert_eq!(inbox.counts().await.unwrap().pending, 0);
}

/// The contract through `AnyInbox::on` a store from `connect(url)`, on the store's client.
mod any {
    use super::*;
    use tower_idempotency::inbox::AnyInbox;

    async fn any() -> (AnyInbox, RedisServer) {
        let server = RedisServer::start();
        let store = tower_idempotency::store::connect(&server.url())
            .await
            .unwrap();
        let inbox = AnyInbox::on(&store, &fresh_name()).await.unwrap();
        assert_eq!(inbox.backend(), "redis");
        (inbox, server)
    }

    inbox_contract::inbox_contract!(any());
    inbox_admin_contract::inbox_admin_contract!(any());
}

/// The contract through Sentinel: the client finds the primary by asking the sentinels.
mod sentinel {
    use super::*;

    async fn sentinel() -> (
        RedisInbox<fred::clients::Client>,
        std::sync::Arc<redis_sentinel::RedisSentinel>,
    ) {
        let deployment = redis_sentinel::RedisSentinel::shared();
        let inbox = RedisInbox::new(deployment.connect().await, &fresh_name());
        (inbox, deployment)
    }

    inbox_contract::inbox_contract!(sentinel());
    inbox_admin_contract::inbox_admin_contract!(sentinel());

    /// The contract with durable writes, through a pool: every write an answer or a
    /// settlement relies on waits for the replica, and the contract holds unchanged.
    mod durable {
        use super::*;

        async fn durable() -> (RedisInbox, std::sync::Arc<redis_sentinel::RedisSentinel>) {
            let deployment = redis_sentinel::RedisSentinel::shared();
            let inbox = RedisInbox::new(deployment.connect_pool(2).await, &fresh_name())
                .durable(1, Duration::from_secs(1));
            (inbox, deployment)
        }

        inbox_contract::inbox_contract!(durable());
        inbox_admin_contract::inbox_admin_contract!(durable());
    }

    /// `AnyInbox::on` a store with durable completion makes a durable inbox: an enqueue
    /// while the replica is frozen is refused as not replicated, and stored on the primary.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_inbox_on_a_durable_store_waits_for_the_replica() {
        let deployment = redis_sentinel::RedisSentinel::start();
        let store: tower_idempotency::store::AnyStore =
            tower_idempotency::RedisStore::new(deployment.connect_pool(2).await).into();
        let store = store
            .durable_completion(1, Duration::from_millis(300))
            .unwrap();
        let inbox = tower_idempotency::inbox::AnyInbox::on(&store, &fresh_name())
            .await
            .unwrap();
        assert_eq!(inbox.enqueue(entry(1)).await.unwrap(), Enqueued::Queued);
        let replica = deployment.replica_port();
        deployment.freeze(replica);
        let refused = inbox.enqueue(entry(2)).await;
        // A duplicate of what the replica does not have yet waits for it too.
        let duplicate = inbox.enqueue(entry(2)).await;
        deployment.thaw(replica);
        let error = refused.unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::NotReplicated, "{error}");
        assert_eq!(duplicate.unwrap_err().kind(), StoreErrorKind::NotReplicated);
        // Caught up, the sender's retry is acknowledged: the entry was stored.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match inbox.enqueue(entry(2)).await {
                Ok(enqueued) => {
                    assert_eq!(enqueued, Enqueued::Duplicate(KeyState::Queued));
                    break;
                }
                Err(error) => assert!(std::time::Instant::now() < deadline, "{error}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A durable fenced completion, or a durable complete, sent again after `NotReplicated`
    /// through another client of the pool, is not acknowledged before the replica has the
    /// first one (the repeat writes the fence, so its `WAIT` counts it); caught up, it is.
    /// A requeue that finds nothing to do is not failed by another write's replication.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_durable_repeat_waits_for_the_first_write_to_replicate() {
        let deployment = redis_sentinel::RedisSentinel::start();
        let inbox = RedisInbox::new(deployment.connect_pool(2).await, &fresh_name())
            .durable(1, Duration::from_millis(300));
        for n in 0..2 {
            inbox.enqueue(entry(n)).await.unwrap();
        }
        let leases = inbox.take(2, Duration::from_secs(60)).await.unwrap();
        let retention = Duration::from_secs(60);
        let replica = deployment.replica_port();
        deployment.freeze(replica);
        let (fenced, plain) = (&leases[0], &leases[1]);
        let writes = || {
            let tag = inbox.hash_tag(&fenced.token).unwrap();
            RedisWrites::new().command(["SET", format!("app:{tag}:x").as_str(), "1"])
        };
        let (key, token) = (&fenced.entry.key, &fenced.token);
        let mut repeats = Vec::new();
        for _ in 0..3 {
            repeats.push(inbox.complete_with(key, token, writes(), retention).await);
        }
        let mut completes = Vec::new();
        for _ in 0..3 {
            completes.push(
                inbox
                    .complete(&[(plain.entry.key.clone(), plain.token)], retention)
                    .await
                    .map(|flags| flags[0]),
            );
        }
        let nothing = inbox.requeue(&entry(9).key).await;
        deployment.thaw(replica);
        for result in repeats.into_iter().chain(completes) {
            let error = result.expect_err("the frozen replica acknowledged nothing");
            assert_eq!(error.kind(), StoreErrorKind::NotReplicated, "{error}");
        }
        assert!(!nothing.unwrap(), "nothing to requeue, and no error");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let again = inbox.complete_with(key, token, writes(), retention).await;
            let plain_again = inbox
                .complete(&[(plain.entry.key.clone(), plain.token)], retention)
                .await
                .map(|flags| flags[0]);
            match (again, plain_again) {
                (Ok(fenced), Ok(plain)) => {
                    assert!(fenced && plain, "completed by these leases");
                    break;
                }
                (a, b) => assert!(std::time::Instant::now() < deadline, "{a:?} {b:?}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// One `complete` of leases from several partitions completes each in its own partition
/// (one script per partition), and leaves nothing pending or in flight.
#[tokio::test]
async fn complete_spans_the_partitions() {
    let server = RedisServer::start();
    let inbox = RedisInbox::new(server.connect().await, &fresh_name()).partitions(4);
    for n in 0..16 {
        inbox.enqueue(entry(n)).await.unwrap();
    }
    let taken = inbox.take(16, Duration::from_secs(60)).await.unwrap();
    assert_eq!(taken.len(), 16);
    let partitions: HashSet<u8> = taken.iter().map(|l| l.token.as_bytes()[15]).collect();
    assert!(
        partitions.len() > 1,
        "16 keys over 4 partitions: {partitions:?}"
    );
    let leases: Vec<_> = taken
        .iter()
        .map(|lease| (lease.entry.key.clone(), lease.token))
        .collect();
    let flags = inbox
        .complete(&leases, Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(flags, vec![true; 16]);
    let counts = inbox.counts().await.unwrap();
    assert_eq!((counts.pending, counts.in_flight, counts.dead), (0, 0, 0));
    for lease in &taken {
        assert_eq!(
            inbox.enqueue(lease.entry.clone()).await.unwrap(),
            Enqueued::Duplicate(KeyState::Done)
        );
    }
}

/// The first entry `inbox` hands out now, under a minute's lease.
async fn take_one<C>(inbox: &RedisInbox<C>) -> tower_idempotency::inbox::Lease
where
    C: fred::interfaces::LuaInterface + fred::interfaces::KeysInterface + Send + Sync + 'static,
{
    inbox
        .take(1, Duration::from_secs(60))
        .await
        .unwrap()
        .pop()
        .expect("an entry is due")
}

fn entry(n: u32) -> InboxEntry {
    let key = StoreKey::new("inbox-redis", None, &format!("evt-{n}"));
    values::inbox_entry(
        key,
        Bytes::from(format!("{{\"n\":{n}}}")),
        format!("req-{n}"),
    )
}

/// Two instances, each with its own client, take from one inbox at once: every entry goes to
/// exactly one of them; and an entry enqueued through one is a duplicate through the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_never_hand_one_entry_to_both() {
    let server = RedisServer::start();
    let name = fresh_name();
    let a = RedisInbox::new(server.connect().await, &name);
    let b = RedisInbox::new(server.connect().await, &name);
    const N: u32 = 300;
    for n in 0..N {
        assert_eq!(a.enqueue(entry(n)).await.unwrap(), Enqueued::Queued);
        assert_eq!(
            b.enqueue(entry(n)).await.unwrap(),
            Enqueued::Duplicate(KeyState::Queued),
            "a duplicate across instances"
        );
    }
    let take_all = |inbox: RedisInbox<fred::clients::Client>| {
        tokio::spawn(async move {
            let mut keys = Vec::new();
            loop {
                let taken = inbox.take(7, Duration::from_secs(60)).await.unwrap();
                if taken.is_empty() {
                    return keys;
                }
                keys.extend(taken.into_iter().map(|lease| lease.entry.key));
                // An entry handed out again would make this loop endless: fail instead.
                assert!(keys.len() <= N as usize, "more entries taken than enqueued");
            }
        })
    };
    let (from_a, from_b) = tokio::join!(take_all(a.clone()), take_all(b.clone()));
    let (from_a, from_b) = (from_a.unwrap(), from_b.unwrap());
    let mut seen = HashSet::new();
    for key in from_a.iter().chain(&from_b) {
        assert!(seen.insert(key.clone()), "{key} was handed out twice");
    }
    assert_eq!(seen.len(), N as usize, "every entry was taken once");
    assert_eq!(
        b.enqueue(entry(0)).await.unwrap(),
        Enqueued::Duplicate(KeyState::Running)
    );
    let counts = a.counts().await.unwrap();
    assert_eq!((counts.pending, counts.in_flight), (0, u64::from(N)));
}

/// What is stored comes back as it was: body, kept headers, order, correlation id, enqueue
/// time (to the microsecond).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_comes_back_as_it_was_stored() {
    let server = RedisServer::start();
    let inbox = RedisInbox::new(server.connect().await, &fresh_name());
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.append("x-event", HeaderValue::from_static("one"));
    headers.append("x-event", HeaderValue::from_static("two"));
    let object = ObjectKey::new("inbox-redis", Some("tenant"), "obj");
    let position = Position::from_integer_text("-170141183460469231731687303715884105728").unwrap();
    let mut stored = entry(1);
    stored.headers = headers.clone();
    stored.order = Some(tower_idempotency::inbox::EntryOrder {
        object: object.clone(),
        position,
        equal: tower_idempotency::order::EqualPositions::Stale,
    });
    inbox.enqueue(stored.clone()).await.unwrap();
    let lease = take_one(&inbox).await;
    let taken = lease.entry;
    assert_eq!(taken.key, stored.key);
    assert_eq!(taken.body, stored.body);
    assert_eq!(taken.headers, headers);
    assert_eq!(taken.order, stored.order);
    assert_eq!(taken.correlation_id, stored.correlation_id);
    assert_eq!(taken.attempts, 1);
    let micros = |at: std::time::SystemTime| {
        at.duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros()
    };
    assert_eq!(micros(taken.enqueued_at), micros(stored.enqueued_at));
    assert!(!lease.stale);
}

/// A bounded inbox refuses a new entry past its capacity (dead letters count) and drops none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_redis_inbox_refuses_and_drops_nothing() {
    let server = RedisServer::start();
    let inbox = RedisInbox::new(server.connect().await, &fresh_name()).capacity(2);
    inbox.enqueue(entry(1)).await.unwrap();
    inbox.enqueue(entry(2)).await.unwrap();
    let error = inbox.enqueue(entry(3)).await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Capacity);
    assert_eq!(
        inbox.enqueue(entry(1)).await.unwrap(),
        Enqueued::Duplicate(KeyState::Queued),
        "a duplicate is still acknowledged when full"
    );
    assert_eq!(inbox.counts().await.unwrap().pending, 2);
}

/// Every script is sent again when the server forgot it (`SCRIPT FLUSH`, a failover).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_reloaded_after_a_flush() {
    let server = RedisServer::start();
    let client = server.connect().await;
    let inbox = RedisInbox::new(client.clone(), &fresh_name());
    inbox.enqueue(entry(1)).await.unwrap();
    redis_server::script_flush(&client).await;
    let lease = take_one(&inbox).await;
    redis_server::script_flush(&client).await;
    assert!(
        inbox
            .complete(
                &[(lease.entry.key.clone(), lease.token)],
                Duration::from_secs(60)
            )
            .await
            .unwrap()[0]
    );
}

/// An entry stored with attempts already made and its next attempt later than its enqueue
/// time (the fields `enqueue` sends only when they are not the default) keeps both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_and_a_later_next_attempt_are_kept() {
    let server = RedisServer::start();
    let inbox = RedisInbox::new(server.connect().await, &fresh_name());
    let now = std::time::SystemTime::now();
    let mut later = entry(1);
    later.attempts = 3;
    later.next_attempt_at = now + Duration::from_secs(3600);
    let mut due = entry(2);
    due.attempts = 2;
    due.next_attempt_at = now - Duration::from_secs(1);
    due.enqueued_at = now - Duration::from_secs(10);
    inbox.enqueue(later).await.unwrap();
    inbox.enqueue(due.clone()).await.unwrap();
    let taken = inbox.take(10, Duration::from_secs(60)).await.unwrap();
    assert_eq!(taken.len(), 1, "the entry due in an hour is not taken");
    let taken = &taken[0].entry;
    assert_eq!(taken.key, due.key);
    assert_eq!(taken.attempts, 3, "two before, this one");
    let micros = |at: std::time::SystemTime| {
        at.duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros()
    };
    assert_eq!(micros(taken.next_attempt_at), micros(due.next_attempt_at));
    assert_eq!(micros(taken.enqueued_at), micros(due.enqueued_at));
    let counts = inbox.counts().await.unwrap();
    assert_eq!((counts.pending, counts.in_flight), (1, 1));
}

/// An entry as earlier versions stored it, every field written (headers empty, attempts 0,
/// next attempt), is taken and completed like a new one: pending entries survive an upgrade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_stored_with_every_field_is_read() {
    let server = RedisServer::start();
    let client = server.connect().await;
    let inbox = RedisInbox::new(client.clone(), &fresh_name());
    let key = entry(7).key;
    let (prefix, name) = (inbox.prefix().to_owned(), key.as_str().to_owned());
    let at = "1764745000123456";
    let entry_key = format!("{prefix}e:{name}");
    let fields = ["s", "q", "h", "", "c", "req-7", "a", "0", "n", at, "e", at];
    let _: i64 =
        redis_server::raw(&client, "HSET", &[&[&entry_key[..]][..], &fields].concat()).await;
    let _: String = redis_server::raw(&client, "SET", &[&format!("{prefix}b:{name}"), "{}"]).await;
    for set in ["due", "live"] {
        let _: i64 =
            redis_server::raw(&client, "ZADD", &[&format!("{prefix}{set}"), at, &name]).await;
    }
    let lease = take_one(&inbox).await;
    assert_eq!(lease.entry.key, key);
    assert_eq!(lease.entry.correlation_id, "req-7");
    assert_eq!(lease.entry.attempts, 1);
    assert!(lease.entry.headers.is_empty());
    assert!(
        inbox
            .complete(&[(key.clone(), lease.token)], Duration::from_secs(60))
            .await
            .unwrap()[0]
    );
    assert_eq!(
        inbox.enqueue(entry(7)).await.unwrap(),
        Enqueued::Duplicate(KeyState::Done)
    );
}

/// An entry whose body is gone (deleted by hand, evicted) is not handed out without it: the
/// take makes it a dead letter saying so, and hands out the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_without_its_body_becomes_a_dead_letter() {
    let server = RedisServer::start();
    let client = server.connect().await;
    let inbox = RedisInbox::new(client.clone(), &fresh_name());
    let (lost, kept) = (entry(1), entry(2));
    inbox.enqueue(lost.clone()).await.unwrap();
    inbox.enqueue(kept.clone()).await.unwrap();
    let body = format!("{}b:{}", inbox.prefix(), lost.key.as_str());
    let _: i64 = redis_server::raw(&client, "DEL", &[&body]).await;
    let taken = inbox.take(10, Duration::from_secs(60)).await.unwrap();
    let keys: Vec<_> = taken.iter().map(|lease| lease.entry.key.clone()).collect();
    assert_eq!(keys, [kept.key]);
    assert_eq!(taken[0].entry.body, kept.body);
    let dead = inbox.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].entry.key, lost.key);
    assert!(
        dead[0].last_error.contains("body is missing"),
        "{}",
        dead[0].last_error
    );
}

/// An entry enqueued, or a retry scheduled, through one client wakes a worker idle on another
/// (its `PUBLISH` reaches the other's subscriber), on one server and on a partitioned inbox in
/// a cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_through_another_client_wakes_an_idle_worker() {
    let server = RedisServer::start();
    let name = fresh_name();
    let (a, b) = (
        RedisInbox::new(server.connect().await, &name),
        RedisInbox::new(server.connect().await, &name),
    );
    inbox_contract::an_enqueue_elsewhere_wakes_an_idle_worker(a.clone(), b.clone()).await;
    inbox_contract::a_retry_elsewhere_wakes_an_idle_worker(a, b).await;
    let cluster = redis_cluster::RedisCluster::shared();
    let name = fresh_name();
    let (a, b) = (
        RedisInbox::new(cluster.connect().await, &name).partitions(4),
        RedisInbox::new(cluster.connect().await, &name).partitions(4),
    );
    inbox_contract::an_enqueue_elsewhere_wakes_an_idle_worker(a.clone(), b.clone()).await;
    inbox_contract::a_retry_elsewhere_wakes_an_idle_worker(a, b).await;
}

/// A user that may run the scripts but not `PUBLISH` (an ACL without the command, or without
/// the channel: Redis 7 gives new users no channels) still enqueues and re-queues: the
/// wake-up is a courtesy (workers then wait for their poll), never a reason to answer an
/// error for an entry that was stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_publish_still_enqueues() {
    let server = RedisServer::start();
    let acl = [
        "ACL",
        "SETUSER",
        "nopublish",
        "on",
        ">secret",
        "~*",
        "+@all",
        "-publish",
    ];
    let reply = server.raw_command(&acl).unwrap();
    assert!(reply.starts_with("+OK"), "{reply}");
    let url = format!("redis://nopublish:secret@127.0.0.1:{}", server.port());
    let client =
        fred::types::Builder::from_config(fred::types::config::Config::from_url(&url).unwrap())
            .build()
            .unwrap();
    fred::interfaces::ClientLike::init(&client).await.unwrap();
    let inbox = RedisInbox::new(client, &fresh_name());
    let queued = inbox
        .enqueue(entry(1))
        .await
        .expect("stored, so acknowledged");
    assert_eq!(queued, Enqueued::Queued);
    let lease = take_one(&inbox).await;
    let failure = tower_idempotency::inbox::Failure::Dead("no".to_owned());
    assert!(
        inbox
            .fail(&lease.entry.key.clone(), &lease.token, failure)
            .await
            .unwrap()
    );
    assert!(inbox.requeue(&lease.entry.key).await.expect("re-queued"));
}

/// An enqueue publishes a wake-up only while a worker waits (a take came back short since the
/// last published enqueue): a message costs Redis a write to every subscribed process, which
/// busy workers do not need. On one partition, and on four, where a short take has looked at
/// every partition and marked each: there the first enqueue to each partition publishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_publishes_only_while_a_worker_waits() {
    let server = RedisServer::start();
    let published = || {
        let info = server.raw_command(&["INFO", "commandstats"]).unwrap();
        redis_server::parse_command_calls(&info, "publish")
    };
    let long = Duration::from_secs(60);
    for partitions in [1_u8, 4] {
        let inbox = RedisInbox::new(server.connect().await, &fresh_name()).partitions(partitions);
        let first = 100 * u32::from(partitions);
        let enqueue = |from: u32, n: u32| {
            let inbox = inbox.clone();
            async move {
                for i in from..from + n {
                    inbox.enqueue(entry(i)).await.unwrap();
                }
            }
        };
        server.raw_command(&["CONFIG", "RESETSTAT"]).unwrap();
        enqueue(first, 1).await;
        assert_eq!(published(), 0, "no worker took yet: nobody waits");
        assert_eq!(
            inbox.take(100, long).await.unwrap().len(),
            1,
            "short: it waits"
        );
        enqueue(first + 1, 20).await;
        let woken = published();
        assert!(
            (1..=u64::from(partitions)).contains(&woken),
            "{partitions} partitions: {woken} wake-ups for 20 enqueues to a waiting worker"
        );
        // As many asked as there are: full, the worker does not wait.
        assert_eq!(inbox.take(20, long).await.unwrap().len(), 20);
        enqueue(first + 21, 20).await;
        if partitions == 1 {
            assert_eq!(published(), woken, "a full take leaves nothing to wake");
        }
        // Short again: it waits, and the next enqueue wakes it.
        assert!(inbox.take(100, long).await.unwrap().len() < 100);
        let before = published();
        enqueue(first + 41, 1).await;
        assert_eq!(
            published(),
            before + 1,
            "{partitions} partitions: woken again"
        );
        // An entry due later is told to the waiting worker, and leaves the mark for an entry
        // due now: that one still wakes it.
        assert!(inbox.take(100, long).await.unwrap().len() < 100);
        let mut later = entry(first + 42);
        later.next_attempt_at = std::time::SystemTime::now() + Duration::from_secs(3600);
        inbox.enqueue(later).await.unwrap();
        assert_eq!(
            published(),
            before + 2,
            "{partitions} partitions: told of the later one"
        );
        enqueue(first + 43, 1).await;
        assert_eq!(
            published(),
            before + 3,
            "{partitions} partitions: woken for the one due now"
        );
    }
}

/// What an effect key of the tests below holds (`None` when absent).
async fn read(client: &fred::clients::Client, key: &str) -> Option<String> {
    fred::interfaces::KeysInterface::get(client, key)
        .await
        .unwrap()
}

/// The effect of one email event, fenced: its id counted and its message's status set, in the
/// entry's hash slot.
fn email_writes(tag: &str, event: &str, message: &str, status: &str) -> RedisWrites {
    RedisWrites::new()
        .command(["INCR", format!("app:applied:{tag}:{event}").as_str()])
        .command([
            "SET",
            format!("app:status:{tag}:{message}").as_str(),
            status,
        ])
}

/// The pause sequence of issue 54 on the fenced completion: worker 1 takes `ev_1` and stalls
/// past its lease; worker 2 takes it over and completes it with its effect; the newer `ev_2` of
/// the same message is applied; worker 1 resumes and sends its effect and completion: nothing
/// is written, `ev_1` counted once and the message left at `ev_2`'s state. The script sent
/// again (a client's re-send after a reconnection) writes nothing twice; the worker's own
/// completion after the handler's is no lost lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_completion_writes_once_and_never_after_its_lease() {
    let server = RedisServer::start();
    let client = server.connect().await;
    let inbox = RedisInbox::new(client.clone(), &fresh_name());
    let message = ObjectKey::new("inbox-redis", None, "m_1");
    let ev = |n: u32| ordered(entry(n), message.clone(), Position::new(i128::from(n)));
    inbox.enqueue(ev(1)).await.unwrap();
    inbox.enqueue(ev(2)).await.unwrap();
    let retention = Duration::from_secs(60);

    let stalled = inbox
        .take(1, Duration::from_millis(50))
        .await
        .unwrap()
        .pop()
        .unwrap();
    let tag = inbox.hash_tag(&stalled.token).unwrap().to_owned();
    assert_eq!(format!("{tag}:"), inbox.prefix());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let taken_over = take_one(&inbox).await;
    assert_eq!(taken_over.entry.key, stalled.entry.key, "ev_1 again");
    let writes = email_writes(&tag, "ev_1", "m_1", "sent");
    let (key, token) = (&taken_over.entry.key, &taken_over.token);
    assert!(
        inbox
            .complete_with(key, token, writes.clone(), retention)
            .await
            .unwrap()
    );
    // Sent again: done by this token already, nothing written twice.
    assert!(
        inbox
            .complete_with(key, token, writes, retention)
            .await
            .unwrap()
    );
    // Its handler may still run: a renewal finds the lease its own, not taken over.
    assert!(inbox.renew(key, token, retention).await.unwrap());
    // The worker's own completion after the handler's finds the key done by its lease.
    assert!(
        inbox
            .complete(&[(key.clone(), *token)], retention)
            .await
            .unwrap()[0]
    );

    let newer = take_one(&inbox).await;
    assert_eq!(newer.entry.key, ev(2).key);
    let writes = email_writes(&tag, "ev_2", "m_1", "delivered");
    assert!(
        inbox
            .complete_with(&newer.entry.key, &newer.token, writes, retention)
            .await
            .unwrap()
    );

    // Worker 1 resumes: its lease is gone, so is its write.
    let late = email_writes(&tag, "ev_1", "m_1", "sent");
    let (key, token) = (&stalled.entry.key, &stalled.token);
    assert!(
        !inbox
            .complete_with(key, token, late, retention)
            .await
            .unwrap()
    );
    assert!(
        !inbox
            .complete(&[(key.clone(), *token)], retention)
            .await
            .unwrap()[0]
    );
    assert_eq!(
        read(&client, &format!("app:applied:{tag}:ev_1"))
            .await
            .as_deref(),
        Some("1")
    );
    assert_eq!(
        read(&client, &format!("app:applied:{tag}:ev_2"))
            .await
            .as_deref(),
        Some("1")
    );
    assert_eq!(
        read(&client, &format!("app:status:{tag}:m_1"))
            .await
            .as_deref(),
        Some("delivered")
    );
    assert_eq!(
        inbox.enqueue(ev(1)).await.unwrap(),
        Enqueued::Duplicate(KeyState::Done)
    );
    assert_eq!(inbox.counts().await.unwrap().pending, 0);
}

/// On a partitioned inbox in a cluster, the writes go to the entry's slot under its
/// partition's tag (a script reaching another slot would be refused); a token of no partition
/// of the inbox has no tag and completes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_share_the_entry_partition_in_a_cluster() {
    let cluster = redis_cluster::RedisCluster::shared();
    let client = cluster.connect().await;
    let inbox = RedisInbox::new(client.clone(), &fresh_name()).partitions(4);
    for n in 0..8 {
        inbox.enqueue(entry(n)).await.unwrap();
    }
    let mut tags = HashSet::new();
    for lease in inbox.take(8, Duration::from_secs(30)).await.unwrap() {
        let tag = inbox.hash_tag(&lease.token).unwrap().to_owned();
        let id = lease.entry.correlation_id.clone();
        let writes = RedisWrites::new().command(["SET", format!("app:{tag}:{id}").as_str(), "1"]);
        let (key, token) = (&lease.entry.key, &lease.token);
        assert!(
            inbox
                .complete_with(key, token, writes, Duration::from_secs(60))
                .await
                .unwrap()
        );
        assert_eq!(
            read(&client, &format!("app:{tag}:{id}")).await.as_deref(),
            Some("1")
        );
        tags.insert(tag);
    }
    assert!(tags.len() >= 2, "entries spread over partitions: {tags:?}");
    let foreign = tower_idempotency::store::Token::from_bytes([0xff; 16]);
    assert_eq!(inbox.hash_tag(&foreign), None);
    let key = entry(0).key;
    let none = RedisWrites::new();
    assert!(
        !inbox
            .complete_with(&key, &foreign, none, Duration::from_secs(60))
            .await
            .unwrap()
    );
}

/// An inbox over `maxmemory` (`noeviction`) still drains through the fenced completion: the
/// script deletes the entry before the handler's writes (Redis refuses a script whose first
/// write may grow memory), and the writes and the completion both land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_completion_drains_an_inbox_over_maxmemory() {
    use fred::interfaces::ClientLike;
    use fred::types::{ClusterHash, CustomCommand};
    let server = RedisServer::start();
    let client = server.connect().await;
    let inbox = RedisInbox::new(client.clone(), &fresh_name());
    inbox.enqueue(entry(1)).await.unwrap();
    let lease = take_one(&inbox).await;
    let config = CustomCommand::new_static("CONFIG", ClusterHash::Random, false);
    let full: Vec<&str> = vec!["SET", "maxmemory", "1"];
    let () = client.custom(config.clone(), full).await.unwrap();
    // Full indeed: a plain write is refused.
    let refused = inbox.enqueue(entry(2)).await.unwrap_err();
    assert_eq!(refused.kind(), StoreErrorKind::Capacity, "{refused}");
    let tag = inbox.hash_tag(&lease.token).unwrap().to_owned();
    let applied = format!("app:applied:{tag}");
    let writes = RedisWrites::new().command(["HINCRBY", applied.as_str(), "evt-1", "1"]);
    let (key, token) = (&lease.entry.key, &lease.token);
    let done = inbox
        .complete_with(key, token, writes, Duration::from_secs(60))
        .await;
    let room: Vec<&str> = vec!["SET", "maxmemory", "0"];
    let () = client.custom(config, room).await.unwrap();
    assert!(done.unwrap(), "completed over maxmemory");
    let count: Option<String> = fred::interfaces::ClientLike::custom(
        &client,
        CustomCommand::new_static("HGET", ClusterHash::FirstKey, false),
        vec![applied, "evt-1".to_owned()],
    )
    .await
    .unwrap();
    assert_eq!(count.as_deref(), Some("1"));
    assert_eq!(
        inbox.enqueue(entry(1)).await.unwrap(),
        Enqueued::Duplicate(KeyState::Done)
    );
}

/// A listing goes on after the last key it listed, not after a count of keys: an entry that
/// vanishes from a `SCAN` batch between two pages (a done key whose retention ended) makes
/// no other entry of that batch go unlisted.
#[tokio::test]
async fn a_listing_misses_nothing_when_a_listed_key_expires() {
    use tower_idempotency::inbox::Filter;
    let (inbox, _server) = standalone().await;
    let route = fresh_name();
    let mut all = HashSet::new();
    for n in 0..20 {
        let id = format!("evt_{n}");
        let key = StoreKey::new(&route, None, &id);
        let mut entry = values::inbox_entry(key.clone(), Bytes::new(), "c");
        (entry.route, entry.id) = (route.clone(), id);
        inbox.enqueue(entry).await.unwrap();
        all.insert(key);
    }
    let mut filter = Filter::default();
    filter.route = Some(route.clone());
    // One server of its own, its keys in few batches of the scan. A page takes whole batches,
    // so the first one holds 1 to 3 entries: how SCAN groups the keys is the server's (its
    // buckets, the other keys among them), and this test is about what the next pages list.
    let first = inbox.list(&filter, None, 3).await.unwrap();
    assert!(
        (1..=3).contains(&first.entries.len()),
        "{}",
        first.entries.len()
    );
    let mut seen: HashSet<StoreKey> = first.entries.iter().map(|i| i.entry.key.clone()).collect();
    // The first key listed is taken, completed with a retention of a millisecond, and gone.
    let gone = first.entries[0].entry.key.clone();
    let lease = loop {
        let taken = inbox.take(20, Duration::from_secs(60)).await.unwrap();
        let mut found = None;
        for lease in taken {
            if lease.entry.key == gone {
                found = Some(lease);
            } else {
                let back = tower_idempotency::inbox::Failure::RetryAt(
                    std::time::SystemTime::now(),
                    "not this one".to_owned(),
                );
                inbox
                    .fail(&lease.entry.key, &lease.token, back)
                    .await
                    .unwrap();
            }
        }
        if let Some(lease) = found {
            break lease;
        }
    };
    let retention = Duration::from_millis(1);
    assert!(
        inbox
            .complete(&[(gone.clone(), lease.token)], retention)
            .await
            .unwrap()[0]
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(inbox.find(&gone).await.unwrap().is_none(), "expired");
    let mut cursor = first.next;
    while let Some(at) = cursor {
        let page = inbox.list(&filter, Some(&at), 3).await.unwrap();
        seen.extend(page.entries.iter().map(|i| i.entry.key.clone()));
        cursor = page.next;
    }
    let missed: Vec<_> = all.difference(&seen).collect();
    assert!(missed.is_empty(), "never listed: {missed:?}");
}

/// `entry` ordered among the events of `object` at `position`.
fn ordered(mut entry: InboxEntry, object: ObjectKey, position: Position) -> InboxEntry {
    entry.order = Some(tower_idempotency::inbox::EntryOrder {
        object,
        position,
        equal: tower_idempotency::order::EqualPositions::Process,
    });
    entry
}
