//! `PostgresStore` against a real PostgreSQL server (never a mock: `ON CONFLICT`, row locks and
//! snapshots must be the real thing). The suite's smoke run and most tests share one server per
//! test binary; the tests that stop the server start their own.
#![cfg(feature = "postgres")]

use crate::once;
use crate::postgres_server;
use crate::sql_checks::{self, completed_row, in_flight_row};
use crate::store_steps::{
    LEASE, RECORD_RETENTION, RETENTION, claim, claim_and_record, completed_by,
    expired_claim_taken_over, fifty_claims_one_winner, held_by, neither_completes_nor_releases,
    record_expires, records, replays, reserves,
};
use crate::suite;
use tower_idempotency::test_util::store::{self as contract, OneTarget};

use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use contract::keys_of;
use http::{HeaderMap, HeaderValue, StatusCode};
use postgres_server::PostgresServer;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Row};
use tower_idempotency::IdempotencyStore;
use tower_idempotency::PostgresStore;
use tower_idempotency::store::record::Record;
use tower_idempotency::store::{CachedStore, LocalCache};
use tower_idempotency::store::{Claim, Reservation, StoreErrorKind, StoreKey};
use tower_idempotency::test_util::values;

/// The server shared by the tests that never stop it. Kept for the whole test process; its
/// watchdog removes it when the process exits.
fn shared_server() -> &'static PostgresServer {
    static SERVER: OnceLock<PostgresServer> = OnceLock::new();
    SERVER.get_or_init(PostgresServer::new)
}

async fn pool(url: &str, max_connections: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(max_connections)
        // Below the layer's 2 s store timeout: a database that is down is "unavailable".
        .acquire_timeout(Duration::from_secs(1))
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("could not connect to {url}: {e}"))
}

/// A pool of `connections` connections opened one at a time, for the tests that race them
/// all at once: that many connection starts at once (one server process each) can outlast the
/// pool's acquire timeout on a loaded machine.
async fn warm_pool(url: &str, connections: u32) -> PgPool {
    let pool = pool(url, connections).await;
    let mut open = Vec::new();
    for _ in 0..connections {
        open.push(pool.acquire().await.expect("open a connection"));
    }
    drop(open);
    pool
}

/// A migrated store on the shared server, in the default table.
async fn shared_store() -> PostgresStore {
    let url = tokio::task::block_in_place(|| shared_server().url());
    let store = PostgresStore::new(warm_pool(&url, 8).await);
    store.migrate().await.unwrap();
    store
}

/// A migrated store on the shared server in a table of its own, so that row counts are exact.
async fn own_table_store(name: &str) -> PostgresStore {
    let url = tokio::task::block_in_place(|| shared_server().url());
    let table = format!("{name}_{}", std::process::id());
    let store = PostgresStore::new(warm_pool(&url, 8).await)
        .with_table(&table)
        .unwrap();
    sqlx::query(AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}")))
        .execute(store.pool())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    store
}

/// A migrated store on the shared server in a table no other test uses.
pub(crate) async fn fresh_table_store() -> PostgresStore {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    own_table_store(&format!("once_{n}")).await
}

suite::store_smoke!(async { (shared_store().await, ()) });
// The `once` suites use fixed keys: each test gets a table of its own.
once_suite!(async { (fresh_table_store().await, ()) });
once_tx_suite!(sqlx::Postgres, async { (fresh_table_store().await, ()) });

/// The contract on the store `store::connect` makes from a `postgres://` URL (migrated).
mod from_url {
    use super::*;

    contract::store_contract!(async {
        let url = tokio::task::block_in_place(|| shared_server().url());
        let store = tower_idempotency::store::connect(&url).await.unwrap();
        assert_eq!(store.backend(), "postgres");
        (store, ())
    });
}
contract::store_contract!(async { (shared_store().await, ()) });

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absent_in_flight_completed_transitions() {
    let store = shared_store().await;
    let key = StoreKey::new(&suite::ns("pg-transitions"), None, "evt_1");
    let first = claim(b"{\"a\":1}");

    reserves(&store, &key, &first, LEASE, Reservation::Acquired).await;
    let row = sqlx::query(
        "SELECT state, token, fingerprint, record,
                extract(epoch FROM expires_at - now())::float8 AS ttl
         FROM idempotency_keys WHERE key = $1",
    )
    .bind(key.as_str())
    .fetch_one(store.pool())
    .await
    .unwrap();
    in_flight_row(&row, &first);
    let ttl: f64 = row.get("ttl");
    assert!(ttl > 25.0 && ttl <= 30.0, "lease {ttl}");

    // The same claim again (a retry of a statement whose reply was lost) is still ours; a
    // duplicate while in flight sees the first fingerprint.
    let dup = claim(b"{\"a\":1}");
    held_by(&store, &key, &first, &dup, LEASE).await;
    // Neither complete nor release with another token touches the claim.
    let record = values::owned_by(values::record_ack(first.fingerprint()), first.token());
    neither_completes_nor_releases(&store, &key, &dup, &record, RETENTION).await;

    records(&store, &key, &first, &record, RETENTION).await;
    let row = sqlx::query(
        "SELECT state, token, record, extract(epoch FROM expires_at - now())::float8 AS ttl
         FROM idempotency_keys WHERE key = $1",
    )
    .bind(key.as_str())
    .fetch_one(store.pool())
    .await
    .unwrap();
    completed_row(&row, &record);
    let ttl: f64 = row.get("ttl");
    let retention = RETENTION.as_secs_f64();
    assert!(
        ttl > retention - 10.0 && ttl <= retention,
        "retention {ttl}"
    );

    // A duplicate after completion gets the record; the key is not claimed again, not
    // released, and completing it again (a retry whose first attempt landed) is reported as
    // done, the record staying as it was.
    completed_by(&store, &key, &first, &dup, &record, LEASE).await;

    // Release of a live claim deletes the row, and the next attempt acquires.
    let other = StoreKey::new(&suite::ns("pg-transitions"), None, "evt_2");
    let a = claim(b"x");
    reserves(&store, &other, &a, LEASE, Reservation::Acquired).await;
    assert!(store.release_one(&other, &a).await.unwrap());
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE key = $1")
        .bind(other.as_str())
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(left, 0);
    reserves(&store, &other, &claim(b"x"), LEASE, Reservation::Acquired).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_rows_are_taken_over_and_the_old_owner_is_refused() {
    // The database's own expiry: no local cache in front (a record read back would be cached
    // for its `read_ttl`, longer than this test's 50 ms retention).
    let store = shared_store().await;
    let ns = suite::ns("pg-expiry");
    // An expired lease.
    let key = StoreKey::new(&ns, None, "lease");
    let expiring = Duration::from_millis(50);
    expired_claim_taken_over(&store, &key, &claim(b"x"), &claim(b"y"), expiring, LEASE).await;
    // An expired record.
    let key = StoreKey::new(&ns, None, "record");
    record_expires(&store, &key, &claim(b"x"), LEASE, RECORD_RETENTION).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_claims_have_exactly_one_winner() {
    let url = tokio::task::block_in_place(|| shared_server().url());
    let store = PostgresStore::new(warm_pool(&url, 50).await);
    store.migrate().await.unwrap();
    let ns = suite::ns("pg-race");
    for round in 0..10 {
        let key = StoreKey::new(&ns, None, &format!("evt_{round}"));
        if round % 2 == 1 {
            // Odd rounds race for an expired row instead of an absent one.
            let dead = claim(b"same");
            store
                .reserve_one(&key, &dead, Duration::from_millis(1))
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        fifty_claims_one_winner(std::slice::from_ref(&store), &key, LEASE, round).await;
    }
}

/// A replay record completed by `claim`.
fn replay_record(claim: &Claim) -> Record {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    values::owned_by(
        values::record_replay(
            claim.fingerprint(),
            StatusCode::CREATED,
            headers,
            Bytes::from_static(b"{\"id\":\"ord_1\"}"),
            Some(trailers),
        ),
        claim.token(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_keys_survive_an_app_restart() {
    let key = StoreKey::new(&suite::ns("pg-app-restart"), None, "evt_1");
    let first = claim(b"body");
    let record = replay_record(&first);
    {
        let store = shared_store().await;
        claim_and_record(&store, &key, &first, LEASE, &record, RETENTION).await;
        store.pool().close().await;
    }
    // A new process: a new pool, a new store, the same database.
    let store = shared_store().await;
    replays(&store, &key, &record, LEASE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_keys_survive_a_database_crash_and_the_store_reconnects() {
    let mut server = tokio::task::block_in_place(PostgresServer::new);
    // What the database itself keeps: no local cache in front of it.
    let store = PostgresStore::new(pool(&server.url(), 4).await);
    store.migrate().await.unwrap();
    // An instance with a local cache (a layer's default), which completed the key itself.
    let cached = CachedStore::with_cache(
        PostgresStore::new(pool(&server.url(), 4).await),
        LocalCache::new(),
    );
    let key = StoreKey::new("restart", None, "evt_1");
    let first = claim(b"body");
    let record = replay_record(&first);
    claim_and_record(&cached, &key, &first, LEASE, &record, RETENTION).await;

    tokio::task::block_in_place(|| server.stop());
    let err = store
        .reserve_one(&key, &claim(b"body"), LEASE)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err}");
    // The caching instance still answers the duplicate of the key it completed.
    replays(&cached, &key, &record, LEASE).await;
    // A new key needs the database.
    let other = StoreKey::new("restart", None, "evt_2");
    let err = cached
        .reserve_one(&other, &claim(b"x"), LEASE)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err}");
    tokio::task::block_in_place(|| server.start());

    // The same store (the same pool) recovers by itself, and the record is still there.
    replays(&store, &key, &record, LEASE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_down_fails_closed_with_503() {
    let mut server = tokio::task::block_in_place(PostgresServer::new);
    let store = PostgresStore::new(pool(&server.url(), 4).await);
    store.migrate().await.unwrap();
    suite::fail_open_processes_without_protection(store, async move || {
        tokio::task::block_in_place(|| server.stop());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_removes_only_expired_rows() {
    let store = own_table_store("purge").await;
    let table = store.table().to_owned();
    // 2500 expired rows: in-flight claims whose worker died and completed records past their
    // retention.
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} (key, state, token, fingerprint, record, expires_at, created_at)
         SELECT 'expired-' || g,
                CASE WHEN g % 2 = 0 THEN 'in_flight' ELSE 'completed' END,
                CASE WHEN g % 2 = 0 THEN decode(repeat('00', 16), 'hex') END,
                decode(repeat('00', 8), 'hex'),
                CASE WHEN g % 2 = 1 THEN decode('02' || repeat('00', 8), 'hex') END,
                now() - interval '1 second' * g,
                now() - interval '1 hour'
         FROM generate_series(1, 2500) AS g"
    )))
    .execute(store.pool())
    .await
    .unwrap();
    sql_checks::removes_only_expired_rows(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_is_idempotent_and_safe_to_run_concurrently() {
    let url = tokio::task::block_in_place(|| shared_server().url());
    let pool = pool(&url, 16).await;
    sqlx::query("CREATE SCHEMA IF NOT EXISTS app")
        .execute(&pool)
        .await
        .unwrap();
    let table = format!("app.keys_{}", std::process::id());
    let store = PostgresStore::new(pool.clone()).with_table(&table).unwrap();
    assert_eq!(store.table(), table);
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.migrate().await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    store.migrate().await.unwrap();
    let key = StoreKey::new("app", None, "k");
    reserves(&store, &key, &claim(b"x"), LEASE, Reservation::Acquired).await;
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexdef FROM pg_indexes WHERE schemaname = 'app' AND tablename = $1",
    )
    .bind(table.trim_start_matches("app."))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(
        indexes.iter().any(|d| d.contains("(expires_at)")),
        "{indexes:?}"
    );

    // The published schema runs as it is (it is what `migrate` runs for the default table).
    // That it names the default table and is the constant of the default table: a unit test
    // (`sql::postgres::tests::a_stores_schema_is_the_constant`), both being internal.
    sqlx::raw_sql(AssertSqlSafe(
        PostgresStore::new(pool.clone()).schema().to_owned(),
    ))
    .execute(&pool)
    .await
    .unwrap();
}

/// A transaction that inserts `winner`'s claim of `key`, not committed yet.
async fn uncommitted_claim(
    store: &PostgresStore,
    key: &StoreKey,
    winner: &Claim,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query(
        "INSERT INTO idempotency_keys (key, state, token, fingerprint, expires_at)
         VALUES ($1, 'in_flight', $2, $3, now() + interval '30 seconds')",
    )
    .bind(key.as_str())
    .bind(&winner.token().as_bytes()[..])
    .bind(&winner.fingerprint().as_bytes()[..])
    .execute(&mut *tx)
    .await
    .unwrap();
    tx
}

/// A claim that waits on another transaction's uncommitted insert of the same key: when that
/// commits, the claim's statement conflicts with a row its snapshot cannot see, reads nothing
/// back, and must claim again (with a fresh snapshot) to report the winner; when it rolls
/// back, the claim wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_racing_an_uncommitted_insert_reports_the_winner() {
    let store = shared_store().await;
    let ns = suite::ns("pg-uncommitted");
    for commit in [true, false] {
        let key = StoreKey::new(&ns, None, &commit.to_string());
        let winner = claim(b"winner");
        let tx = uncommitted_claim(&store, &key, &winner).await;
        let waiting = {
            let store = store.clone();
            let key = key.clone();
            tokio::spawn(async move { store.reserve_one(&key, &claim(b"loser"), LEASE).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "the claim waits for the insert");
        if commit {
            tx.commit().await.unwrap();
            assert_eq!(
                waiting.await.unwrap().unwrap(),
                Reservation::InFlight {
                    fingerprint: winner.fingerprint()
                }
            );
        } else {
            tx.rollback().await.unwrap();
            assert_eq!(waiting.await.unwrap().unwrap(), Reservation::Acquired);
        }
    }
}

/// A batch is claimed in one statement (every key it claims has the same `created_at`, the
/// statement's `now()`), with the answers `reserve` would give key by key, in order: absent,
/// expired, held by another claim, completed, its own claim again, and a key given twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_claimed_in_one_statement_key_by_key() {
    let store = shared_store().await;
    let ns = suite::ns("pg-batch");
    let [absent, expired, held, completed, own] =
        ["absent", "expired", "held", "completed", "own"].map(|k| StoreKey::new(&ns, None, k));
    let (batch, other) = (claim(b"batch"), claim(b"other"));
    store
        .reserve_one(&expired, &other, Duration::from_millis(1))
        .await
        .unwrap();
    store.reserve_one(&held, &other, LEASE).await.unwrap();
    store.reserve_one(&completed, &other, LEASE).await.unwrap();
    let record = values::owned_by(values::record_ack(other.fingerprint()), other.token());
    store
        .complete_one(&completed, &other, &record, RETENTION)
        .await
        .unwrap();
    store.reserve_one(&own, &batch, LEASE).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;

    let keys = [
        absent.clone(),
        expired.clone(),
        held.clone(),
        completed.clone(),
        own.clone(),
        absent.clone(),
    ];
    let answers = store.reserve(&keys_of(&keys), &batch, LEASE).await.unwrap();
    assert_eq!(
        answers,
        [
            Reservation::Acquired,
            Reservation::Acquired,
            Reservation::InFlight {
                fingerprint: other.fingerprint()
            },
            Reservation::Completed(record),
            Reservation::Acquired,
            Reservation::Acquired,
        ]
    );
    let created: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT created_at::text FROM idempotency_keys
         WHERE key = ANY($1) AND token = $2",
    )
    .bind(vec![absent.as_str(), expired.as_str(), own.as_str()])
    .bind(&batch.token().as_bytes()[..])
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(created.len(), 1, "one statement claimed them: {created:?}");
    assert!(
        store
            .reserve(&keys_of(&[]), &batch, LEASE)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A batch waiting on another transaction's uncommitted insert of one of its keys: the key
/// is claimed again with a fresh snapshot and reports the winner; the other keys are ours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_racing_an_uncommitted_insert_reports_the_winner() {
    let store = shared_store().await;
    let ns = suite::ns("pg-batch-uncommitted");
    for commit in [true, false] {
        let free = StoreKey::new(&ns, None, &format!("free-{commit}"));
        let contended = StoreKey::new(&ns, None, &format!("contended-{commit}"));
        let winner = claim(b"winner");
        let tx = uncommitted_claim(&store, &contended, &winner).await;
        let waiting = {
            let (store, keys) = (store.clone(), [free.clone(), contended.clone()]);
            tokio::spawn(async move {
                store
                    .reserve(&keys_of(&keys), &claim(b"loser"), LEASE)
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "the batch waits for the insert");
        let contended_answer = if commit {
            tx.commit().await.unwrap();
            Reservation::InFlight {
                fingerprint: winner.fingerprint(),
            }
        } else {
            tx.rollback().await.unwrap();
            Reservation::Acquired
        };
        assert_eq!(
            waiting.await.unwrap().unwrap(),
            [Reservation::Acquired, contended_answer]
        );
    }
}

/// Many batches over the same keys in opposite orders, all at once: no deadlock (the keys are
/// locked in one order), and each key has exactly one winner per round.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn opposite_batches_never_deadlock() {
    let url = tokio::task::block_in_place(|| shared_server().url());
    let store = PostgresStore::new(warm_pool(&url, 16).await);
    store.migrate().await.unwrap();
    let ns = suite::ns("pg-batch-deadlock");
    for round in 0..5 {
        let keys: Vec<StoreKey> = (0..24)
            .map(|i| StoreKey::new(&ns, None, &format!("{round}-{i}")))
            .collect();
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(16));
        let tasks: Vec<_> = (0..16)
            .map(|t| {
                let (store, barrier) = (store.clone(), barrier.clone());
                let mut mine = keys.clone();
                if t % 2 == 1 {
                    mine.reverse();
                }
                mine.rotate_left(t * 3 % 24);
                tokio::spawn(async move {
                    let claim = claim(b"same");
                    barrier.wait().await;
                    let answers = store.reserve(&keys_of(&mine), &claim, LEASE).await.unwrap();
                    let won: Vec<StoreKey> = mine
                        .iter()
                        .zip(&answers)
                        .filter(|(_, a)| **a == Reservation::Acquired)
                        .map(|(k, _)| k.clone())
                        .collect();
                    assert!(
                        answers.iter().all(|a| *a == Reservation::Acquired
                            || matches!(a, Reservation::InFlight { .. })),
                        "{answers:?}"
                    );
                    won
                })
            })
            .collect();
        let mut winners = std::collections::HashMap::new();
        for task in tasks {
            for key in task.await.unwrap() {
                *winners.entry(key).or_insert(0) += 1;
            }
        }
        assert_eq!(winners.len(), keys.len(), "round {round}");
        assert!(
            winners.values().all(|&n| n == 1),
            "round {round}: {winners:?}"
        );
    }
}
