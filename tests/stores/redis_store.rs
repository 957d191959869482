//! `RedisStore` against a real `redis-server` (never a mock: NX, PX and Lua must be the real
//! thing). Every test starts its own server, so killing one never disturbs another.
#![cfg(feature = "redis")]

use crate::redis_server;
use crate::store_steps::{
    LEASE, RETENTION, claim, claim_and_record, fifty_claims_one_winner, held_by,
    neither_completes_nor_releases, records, reserves,
};

use std::time::{Duration, Instant};

use bytes::Bytes;
use fred::prelude::*;
use http::{HeaderMap, HeaderValue, StatusCode};
use redis_server::RedisServer;
use tower_idempotency::IdempotencyStore;
use tower_idempotency::RedisStore;
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::fred;
use tower_idempotency::store::{Claim, Completion, Reservation, StoreErrorKind, StoreKey, Token};
use tower_idempotency::test_util::store::OneTarget;
use tower_idempotency::test_util::values;

/// A fresh server, a client of it, and a store on that client.
async fn started() -> (RedisServer, Client, RedisStore<Client>) {
    let server = RedisServer::start();
    let client = server.connect().await;
    let store = RedisStore::new(client.clone());
    (server, client, store)
}

/// What the store keeps for an in-flight `claim` (the internal encoding, pinned here): tag
/// `0x01`, the owner's 16-byte token, the request's 8-byte fingerprint.
fn in_flight_value(claim: &Claim) -> Bytes {
    let mut value = vec![0x01];
    value.extend_from_slice(claim.token().as_bytes());
    value.extend_from_slice(claim.fingerprint().as_bytes());
    Bytes::from(value)
}

async fn get_raw(client: &Client, key: &StoreKey) -> Option<Bytes> {
    client.get(key.as_str()).await.unwrap()
}

async fn pttl(client: &Client, key: &StoreKey) -> i64 {
    client.pttl(key.as_str()).await.unwrap()
}

/// The calls of every command since `CONFIG RESETSTAT`, except the introspection commands the
/// test itself sends (`INFO`, `CONFIG`, and `MONITOR` / `ECHO` from [`RedisServer::monitor`]).
async fn store_command_total(client: &Client) -> u64 {
    let info: String = redis_server::raw(client, "INFO", &["commandstats"]).await;
    info.lines()
        .filter_map(|line| line.trim().strip_prefix("cmdstat_"))
        .filter(|line| {
            !["info:", "config", "monitor:", "echo:"]
                .iter()
                .any(|own| line.starts_with(own))
        })
        .filter_map(|line| line.split_once(':'))
        .map(|(name, _)| redis_server::parse_command_calls(&info, name))
        .sum()
}

#[tokio::test]
async fn absent_in_flight_completed_transitions() {
    let (_server, client, store) = started().await;
    let key = StoreKey::new("orders", None, "evt_1");
    let first = claim(b"{\"a\":1}");

    reserves(&store, &key, &first, LEASE, Reservation::Acquired).await;
    // Stored: the 25-byte in-flight value, with the lease as its TTL.
    assert_eq!(
        get_raw(&client, &key).await.unwrap(),
        in_flight_value(&first)
    );
    let ttl = pttl(&client, &key).await;
    assert!(ttl > 25_000 && ttl <= 30_000, "lease PTTL {ttl}");
    assert!(key.as_str().starts_with("ti:"));
    // The same claim again (a client retrying a SET whose reply was lost) is still ours; a
    // duplicate while in flight sees the first fingerprint.
    let dup = claim(b"{\"a\":1}");
    held_by(&store, &key, &first, &dup, LEASE).await;

    // What the store writes: the record with the owner tag of the claim that completed it.
    let record = values::owned_by(values::record_ack(first.fingerprint()), first.token());
    records(&store, &key, &first, &record, RETENTION).await;
    assert_eq!(get_raw(&client, &key).await.unwrap(), record.encode());
    let ttl = pttl(&client, &key).await;
    assert!(
        ttl > RETENTION.as_millis() as i64 - 10_000 && ttl <= RETENTION.as_millis() as i64,
        "retention PTTL {ttl}"
    );

    // A duplicate after completion gets the record; the key is not re-claimed.
    reserves(
        &store,
        &key,
        &dup,
        LEASE,
        Reservation::Completed(record.clone()),
    )
    .await;
    assert_eq!(get_raw(&client, &key).await.unwrap(), record.encode());

    // Release after completion is refused: the key is no longer in flight.
    assert!(!store.release_one(&key, &first).await.unwrap());
    // A second completion by the same claim (a retry whose first attempt landed) is told so,
    // and changes nothing: neither the record nor its retention.
    assert_eq!(
        store
            .complete_one(&key, &first, &record, LEASE)
            .await
            .unwrap(),
        Completion::AlreadyWritten
    );
    assert_eq!(get_raw(&client, &key).await.unwrap(), record.encode());
    assert!(pttl(&client, &key).await > LEASE.as_millis() as i64);
    // Another claim's completion is lost: a late finisher learns that it lost its lease.
    assert_eq!(
        store
            .complete_one(
                &key,
                &dup,
                &values::record_ack(dup.fingerprint()),
                RETENTION
            )
            .await
            .unwrap(),
        Completion::Lost
    );
    assert_eq!(get_raw(&client, &key).await.unwrap(), record.encode());

    // Release of a live claim deletes it, and the next attempt acquires.
    let other = StoreKey::new("orders", None, "evt_2");
    let a = claim(b"x");
    reserves(&store, &other, &a, LEASE, Reservation::Acquired).await;
    assert!(store.release_one(&other, &a).await.unwrap());
    assert_eq!(get_raw(&client, &other).await, None);
    let b = claim(b"x");
    reserves(&store, &other, &b, LEASE, Reservation::Acquired).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_reserves_have_exactly_one_winner() {
    let server = RedisServer::start();
    let pool = server.connect_pool(8).await;
    let store: RedisStore = RedisStore::new(pool);
    for round in 0..5 {
        let key = StoreKey::new("race", None, &format!("evt_{round}"));
        fifty_claims_one_winner(std::slice::from_ref(&store), &key, LEASE, round).await;
    }
}

#[tokio::test]
async fn wrong_token_changes_nothing() {
    let (_server, client, store) = started().await;
    let key = StoreKey::new("tokens", None, "evt_1");
    let owner = claim(b"body");
    // Another claim of the same request: a token of its own (random).
    let intruder = values::claim(owner.fingerprint());

    store.reserve_one(&key, &owner, LEASE).await.unwrap();
    let before = get_raw(&client, &key).await.unwrap();
    let ttl_before = pttl(&client, &key).await;

    let record = values::record_ack(owner.fingerprint());
    neither_completes_nor_releases(&store, &key, &intruder, &record, RETENTION).await;
    assert_eq!(get_raw(&client, &key).await.unwrap(), before);
    let ttl_after = pttl(&client, &key).await;
    assert!(ttl_after <= ttl_before && ttl_after > ttl_before - 5_000);

    // Absent key: complete and release report false and create nothing.
    let absent = StoreKey::new("tokens", None, "never");
    neither_completes_nor_releases(&store, &absent, &owner, &record, RETENTION).await;
    assert_eq!(get_raw(&client, &absent).await, None);

    // The owner still completes.
    records(&store, &key, &owner, &record, RETENTION).await;
}

#[tokio::test]
async fn expired_lease_lets_a_new_claim_in_and_refuses_the_old_owner() {
    let (_server, client, store) = started().await;
    let key = StoreKey::new("lease", None, "evt_1");
    let old = claim(b"body");

    reserves(
        &store,
        &key,
        &old,
        Duration::from_millis(100),
        Reservation::Acquired,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(get_raw(&client, &key).await, None, "PX expired the lease");

    let new = claim(b"body");
    reserves(&store, &key, &new, LEASE, Reservation::Acquired).await;
    let record = values::record_ack(old.fingerprint());
    neither_completes_nor_releases(&store, &key, &old, &record, RETENTION).await;
    assert_eq!(get_raw(&client, &key).await.unwrap(), in_flight_value(&new));
    records(&store, &key, &new, &record, RETENTION).await;

    // Completed records expire with their retention too.
    let short = StoreKey::new("lease", None, "evt_2");
    let c = claim(b"body");
    let (record, retention) = (
        values::record_ack(c.fingerprint()),
        Duration::from_millis(100),
    );
    claim_and_record(&store, &short, &c, LEASE, &record, retention).await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    reserves(
        &store,
        &short,
        &claim(b"body"),
        LEASE,
        Reservation::Acquired,
    )
    .await;
}

#[tokio::test]
async fn replay_records_round_trip() {
    let (_server, client, store) = started().await;

    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.append("x-multi", HeaderValue::from_static("a"));
    headers.append("x-multi", HeaderValue::from_static("b"));
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let bodies = [
        Bytes::from_static(b"{\"order\":\"ord_1\"}"),
        // Not UTF-8: values travel as bytes, never as strings.
        Bytes::from_static(&[0xff, 0x00, 0xfe, b'\r', b'\n', 0x80]),
        Bytes::new(),
        Bytes::from(vec![b'x'; 256 * 1024]),
    ];
    for (i, body) in bodies.into_iter().enumerate() {
        let key = StoreKey::new("replay", Some("tenant-a"), &format!("evt_{i}"));
        let first = claim(&body);
        reserves(&store, &key, &first, LEASE, Reservation::Acquired).await;
        let record = values::owned_by(
            values::record_replay(
                first.fingerprint(),
                StatusCode::CREATED,
                headers.clone(),
                body,
                (i % 2 == 0).then(|| trailers.clone()),
            ),
            first.token(),
        );
        records(&store, &key, &first, &record, RETENTION).await;
        reserves(
            &store,
            &key,
            &claim(b"dup"),
            LEASE,
            Reservation::Completed(record),
        )
        .await;
    }

    // An ack record whose 12 bytes (tag, owner tag, fingerprint) happen to be valid UTF-8
    // still decodes.
    let key = StoreKey::new("replay", None, "ack");
    let fp = Fingerprint::from_bytes(*b"01234567");
    let c = values::claim_with_token(Token::from_bytes(*b"0123456789abcdef"), fp);
    claim_and_record(&store, &key, &c, LEASE, &values::record_ack(fp), RETENTION).await;
    let stored = get_raw(&client, &key).await.unwrap();
    assert!(std::str::from_utf8(&stored).is_ok(), "{stored:?}");
    reserves(
        &store,
        &key,
        &claim(b"dup"),
        LEASE,
        Reservation::Completed(values::owned_by(values::record_ack(fp), c.token())),
    )
    .await;
}

#[tokio::test]
async fn undecodable_values_are_corrupt_errors() {
    let (_server, client, store) = started().await;
    let key = StoreKey::new("corrupt", None, "evt_1");
    let _: () = client
        .set(key.as_str(), "not ours", None, None, false)
        .await
        .unwrap();
    let err = store
        .reserve_one(&key, &claim(b"x"), LEASE)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt);
    // Token-checked scripts leave foreign values alone.
    assert!(!store.release_one(&key, &claim(b"x")).await.unwrap());
    assert_eq!(
        get_raw(&client, &key).await.unwrap(),
        Bytes::from_static(b"not ours")
    );
}

#[tokio::test]
async fn first_delivery_costs_two_commands_and_a_duplicate_one() {
    let (server, client, store) = started().await;

    // Warm the script cache once, as any running process has.
    let warm = StoreKey::new("cost", None, "warm-up");
    let c = claim(b"w");
    let record = values::record_ack(c.fingerprint());
    claim_and_record(&store, &warm, &c, LEASE, &record, RETENTION).await;
    let r = claim(b"w2");
    let warm2 = StoreKey::new("cost", None, "warm-up-2");
    store.reserve_one(&warm2, &r, LEASE).await.unwrap();
    assert!(store.release_one(&warm2, &r).await.unwrap());

    const N: u64 = 20;
    redis_server::reset_stats(&client).await;
    let monitor = server.monitor();
    for i in 0..N {
        let key = StoreKey::new("cost", None, &format!("evt_{i}"));
        let c = claim(b"payload");
        reserves(&store, &key, &c, LEASE, Reservation::Acquired).await;
        let record = values::record_ack(c.fingerprint());
        records(&store, &key, &c, &record, RETENTION).await;
    }
    let sent = monitor.finish();
    let set = redis_server::command_calls(&client, "set").await;
    let evalsha = redis_server::command_calls(&client, "evalsha").await;
    let get = redis_server::command_calls(&client, "get").await;
    let eval = redis_server::command_calls(&client, "eval").await;
    let total = store_command_total(&client).await;
    println!(
        "{N} first deliveries: client sent {} commands {:?}...; commandstats: SET {set} \
         (incl. {N} inside the script), EVALSHA {evalsha}, GET {get} (inside the script), \
         EVAL {eval}, all {total}",
        sent.len(),
        &sent[..4]
    );
    // What the client sent: exactly SET, then EVALSHA, per first delivery.
    assert_eq!(sent.len() as u64, 2 * N, "{sent:?}");
    assert!(
        sent.chunks(2)
            .all(|two| two == ["SET".to_owned(), "EVALSHA".to_owned()]),
        "{sent:?}"
    );
    // commandstats also counts what the script runs: GET, then SET.
    assert_eq!(evalsha, N);
    assert_eq!(eval, 0);
    assert_eq!(set, 2 * N);
    assert_eq!(get, N);
    assert_eq!(total, 4 * N, "no hidden SCRIPT LOAD / EXISTS / PING / PTTL");

    // A store behind a local cache (a layer's default) answers the duplicates of records it
    // read once from its cache.
    let store = tower_idempotency::store::CachedStore::with_cache(
        store,
        tower_idempotency::store::LocalCache::new(),
    );
    for i in 0..N {
        let key = StoreKey::new("cost", None, &format!("evt_{i}"));
        let answer = store.reserve_one(&key, &claim(b"payload"), LEASE).await;
        assert!(matches!(answer.unwrap(), Reservation::Completed(_)));
    }
    let monitor = server.monitor();
    for i in 0..N {
        let key = StoreKey::new("cost", None, &format!("evt_{i}"));
        let answer = store.reserve_one(&key, &claim(b"payload"), LEASE).await;
        assert!(matches!(answer.unwrap(), Reservation::Completed(_)));
    }
    assert_eq!(monitor.finish(), Vec::<String>::new());

    // Another instance, without a local cache: one command (SET) per duplicate.
    let other = RedisStore::new(client.clone());
    redis_server::reset_stats(&client).await;
    let monitor = server.monitor();
    for i in 0..N {
        let key = StoreKey::new("cost", None, &format!("evt_{i}"));
        assert!(matches!(
            other
                .reserve_one(&key, &claim(b"payload"), LEASE)
                .await
                .unwrap(),
            Reservation::Completed(_)
        ));
    }
    let sent = monitor.finish();
    let set = redis_server::command_calls(&client, "set").await;
    let total = store_command_total(&client).await;
    println!(
        "{N} duplicates: client sent {} commands; commandstats: SET {set}, all {total}",
        sent.len()
    );
    assert_eq!(sent, vec!["SET".to_owned(); N as usize]);
    assert_eq!(set, N);
    assert_eq!(total, N);

    // A failed attempt: the claim (SET), then EVALSHA (release).
    let monitor = server.monitor();
    let key = StoreKey::new("cost", None, "failed");
    let c = claim(b"payload");
    store.reserve_one(&key, &c, LEASE).await.unwrap();
    assert!(store.release_one(&key, &c).await.unwrap());
    assert_eq!(monitor.finish(), ["SET", "EVALSHA"]);
}

/// `MEMORY USAGE` of a completed key in ack mode: 88 bytes (measured on Redis 7.0, jemalloc,
/// 64-bit), the floor for any string value under a key of that length.
///
/// It is all allocator size classes around a 19-byte key and a 12-byte value (tag, 3-byte
/// owner tag, 8-byte fingerprint): the key's sds (3-byte header + 19 + 1, in a 32-byte class),
/// the `dictEntry` (24) and the value, an embedded string object (16-byte header + 3 + 12 + 1
/// bytes, in a 32-byte class): 88 bytes. One byte more would move the value to the 48-byte
/// class (104 bytes). (The entry in the expires dict is not counted by `MEMORY USAGE`.)
#[tokio::test]
async fn an_ack_record_is_one_small_string() {
    let (_server, client, store) = started().await;
    let key = StoreKey::new("kalipto", None, "pd_01J9Z6V4Q8K3N2M5T7R1W0XYZA");
    let c = claim(b"{\"id\":\"pd_01J9Z6V4Q8K3N2M5T7R1W0XYZA\"}");
    store.reserve_one(&key, &c, LEASE).await.unwrap();
    let in_flight = redis_server::memory_usage(&client, key.as_str())
        .await
        .unwrap();
    let record = values::record_ack(c.fingerprint());
    records(&store, &key, &c, &record, RETENTION).await;
    let completed = redis_server::memory_usage(&client, key.as_str())
        .await
        .unwrap();
    let encoding: String = redis_server::raw(&client, "OBJECT", &["ENCODING", key.as_str()]).await;

    // The floor for any string value under this key: a 1-byte non-numeric value.
    let floor_key = StoreKey::new("kalipto", None, "floor");
    let _: () = client
        .set(floor_key.as_str(), "x", None, None, false)
        .await
        .unwrap();
    let floor = redis_server::memory_usage(&client, floor_key.as_str())
        .await
        .unwrap();
    let value_len = get_raw(&client, &key).await.unwrap().len();
    println!(
        "MEMORY USAGE {key} ({} bytes): in flight {in_flight} bytes, ack record {completed} \
         bytes ({encoding}, {value_len}-byte value); a 1-byte value under a key of the same \
         length: {floor} bytes",
        key.as_str().len()
    );
    assert_eq!(value_len, 12);
    assert_eq!(encoding, "embstr");
    assert!(completed <= 100, "ack record uses {completed} bytes");
    assert_eq!(
        completed, floor,
        "an ack record costs no more than the smallest value"
    );
}

#[tokio::test]
async fn scripts_are_reloaded_after_noscript() {
    let (_server, client, store) = started().await;
    store.load_scripts().await.unwrap();

    redis_server::script_flush(&client).await;
    redis_server::reset_stats(&client).await;
    let key = StoreKey::new("noscript", None, "evt_1");
    let c = claim(b"x");
    store.reserve_one(&key, &c, LEASE).await.unwrap();
    let record = values::owned_by(values::record_ack(c.fingerprint()), c.token());
    records(&store, &key, &c, &record, RETENTION).await;
    assert_eq!(get_raw(&client, &key).await.unwrap(), record.encode());
    assert_eq!(redis_server::command_calls(&client, "eval").await, 1);

    // The script is cached again: the next complete is one EVALSHA, no EVAL.
    redis_server::reset_stats(&client).await;
    let key = StoreKey::new("noscript", None, "evt_2");
    let c = claim(b"x");
    let record = values::record_ack(c.fingerprint());
    claim_and_record(&store, &key, &c, LEASE, &record, RETENTION).await;
    assert_eq!(redis_server::command_calls(&client, "evalsha").await, 1);
    assert_eq!(redis_server::command_calls(&client, "eval").await, 0);

    // Release recovers the same way.
    redis_server::script_flush(&client).await;
    let key = StoreKey::new("noscript", None, "evt_3");
    let c = claim(b"x");
    store.reserve_one(&key, &c, LEASE).await.unwrap();
    assert!(store.release_one(&key, &c).await.unwrap());
    assert_eq!(get_raw(&client, &key).await, None);
}

#[tokio::test]
async fn redis_down_is_an_error_in_bounded_time_and_the_same_client_recovers() {
    let (mut server, _client, store) = started().await;
    let key = StoreKey::new("down", None, "evt_1");
    let c = claim(b"x");
    store.reserve_one(&key, &c, LEASE).await.unwrap();

    server.kill();
    let started = Instant::now();
    let err = tokio::time::timeout(
        Duration::from_secs(5),
        store.reserve_one(&key, &claim(b"x"), LEASE),
    )
    .await
    .expect("the store answers within 5 s while Redis is down")
    .expect_err("Redis is down");
    println!(
        "reserve while down: {:?} after {:?}: {err}",
        err.kind(),
        started.elapsed()
    );
    assert!(
        matches!(
            err.kind(),
            StoreErrorKind::Unavailable | StoreErrorKind::Timeout
        ),
        "{err}"
    );
    let started = Instant::now();
    let err = tokio::time::timeout(
        Duration::from_secs(5),
        store.complete_one(&key, &c, &values::record_ack(c.fingerprint()), RETENTION),
    )
    .await
    .expect("the store answers within 5 s while Redis is down")
    .expect_err("Redis is down");
    println!(
        "complete while down: {:?} after {:?}: {err}",
        err.kind(),
        started.elapsed()
    );
    assert!(matches!(
        err.kind(),
        StoreErrorKind::Unavailable | StoreErrorKind::Timeout
    ));

    server.restart();
    // The same client reconnects by itself; the restarted server is empty (no persistence).
    let deadline = Instant::now() + Duration::from_secs(10);
    let c = claim(b"x");
    loop {
        match store.reserve_one(&key, &c, LEASE).await {
            Ok(reservation) => {
                assert_eq!(reservation, Reservation::Acquired);
                break;
            }
            Err(e) if Instant::now() < deadline => {
                println!("not back yet: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("the client did not recover after the restart: {e}"),
        }
    }
    // The script cache of the new process is empty: complete reloads it.
    let record = values::record_ack(c.fingerprint());
    records(&store, &key, &c, &record, RETENTION).await;
}

#[tokio::test]
async fn a_busy_server_is_unavailable() {
    let server = RedisServer::start();
    let store = RedisStore::new(server.connect().await);
    let key = StoreKey::new("busy", None, "evt_1");
    // Past 100 ms, a running script makes the server answer BUSY to everyone else.
    let reply = server
        .raw_command(&["CONFIG", "SET", "busy-reply-threshold", "100"])
        .unwrap();
    assert!(reply.starts_with("+OK"), "{reply}");
    let busy = {
        let port = server.port();
        std::thread::spawn(move || {
            // Spins until killed (SCRIPT KILL: it writes nothing), however slow the machine.
            let spin = "while true do redis.call('TIME') end return 1";
            let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            let request = format!(
                "*3\r\n$4\r\nEVAL\r\n${}\r\n{spin}\r\n$1\r\n0\r\n",
                spin.len()
            );
            std::io::Write::write_all(&mut stream, request.as_bytes()).unwrap();
            let mut reply = [0u8; 16];
            let _ = std::io::Read::read(&mut stream, &mut reply);
        })
    };
    // Wait until the server is busy before asking the store.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !server
        .raw_command(&["PING"])
        .is_ok_and(|reply| reply.starts_with("-BUSY"))
    {
        assert!(Instant::now() < deadline, "the server never became busy");
        std::thread::sleep(Duration::from_millis(20));
    }
    let err = store
        .reserve_one(&key, &claim(b"x"), LEASE)
        .await
        .expect_err("the server is busy");
    println!("busy server: {:?}: {err}", err.kind());
    assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err}");
    let reply = server.raw_command(&["SCRIPT", "KILL"]).unwrap();
    assert!(reply.starts_with("+OK"), "{reply}");
    busy.join().unwrap();
    // Nothing was claimed; once the script ends, the key is free.
    reserves(&store, &key, &claim(b"x"), LEASE, Reservation::Acquired).await;
}

#[tokio::test]
async fn a_pool_and_a_client_are_both_stores() {
    fn assert_store<S: IdempotencyStore>(_: &S) {}
    let server = RedisServer::start();
    let pool: RedisStore = RedisStore::new(server.connect_pool(2).await);
    let client: RedisStore<Client> = RedisStore::new(server.connect().await);
    assert_store(&pool);
    assert_store(&client);

    let key = StoreKey::new("both", None, "evt_1");
    let c = claim(b"x");
    reserves(&pool, &key, &c, LEASE, Reservation::Acquired).await;
    records(
        &client,
        &key,
        &c,
        &values::record_ack(c.fingerprint()),
        RETENTION,
    )
    .await;
    reserves(
        &pool,
        &key,
        &claim(b"x"),
        LEASE,
        Reservation::Completed(values::owned_by(
            values::record_ack(c.fingerprint()),
            c.token(),
        )),
    )
    .await;
    assert!(client.client().is_connected());
    let _pool: &Pool = pool.client();
}

#[test]
fn commandstats_are_parsed() {
    let info = "# Commandstats\r\n\
        cmdstat_set:calls=12,usec=40,usec_per_call=3.33,rejected_calls=0,failed_calls=0\r\n\
        cmdstat_evalsha:calls=3,usec=9,usec_per_call=3.00,rejected_calls=0,failed_calls=1\r\n";
    assert_eq!(redis_server::parse_command_calls(info, "set"), 12);
    assert_eq!(redis_server::parse_command_calls(info, "evalsha"), 3);
    assert_eq!(redis_server::parse_command_calls(info, "eval"), 0);
}

#[test]
#[should_panic(expected = "NOT FOUND")]
fn a_missing_redis_server_is_a_loud_failure() {
    let _ = redis_server::RedisServer::start_with_binary("/nonexistent/redis-server");
}
