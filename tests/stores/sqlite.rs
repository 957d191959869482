//! `SqliteStore` on real database files (the bundled libsqlite3: `ON CONFLICT ... DO UPDATE
//! ... WHERE ... RETURNING`, WAL, busy timeouts are the real thing). Every test has its own
//! file in its own temporary directory.
#![cfg(feature = "sqlite")]

use crate::once;
use crate::sql_checks::{self, completed_row, count, in_flight_row};
use crate::store_steps::{
    LEASE, RECORD_RETENTION, RETENTION, claim, claim_and_record, completed_by,
    expired_claim_taken_over, fifty_claims_one_winner, held_by, neither_completes_nor_releases,
    record_expires, records, replays, reserves,
};
use crate::suite;
use tower_idempotency::test_util::store::{self as contract, OneTarget};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::{AssertSqlSafe, Row};
use tower_idempotency::SqliteStore;
use tower_idempotency::store::{Reservation, StoreErrorKind, StoreKey};
use tower_idempotency::test_util::values;

/// A temporary directory, removed on drop.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tower-idem-sqlite-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn db(&self) -> PathBuf {
        self.0.join("idempotency.db")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn open(path: &Path) -> SqliteStore {
    SqliteStore::open(path)
        .await
        .unwrap_or_else(|e| panic!("could not open {}: {e}", path.display()))
}

/// A fresh store on a fresh file; the directory goes with the guard.
pub(crate) async fn fresh() -> (SqliteStore, TempDir) {
    let dir = TempDir::new();
    (open(&dir.db()).await, dir)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

suite::store_smoke!(fresh());
contract::store_contract!(fresh());
once_suite!(fresh());
once_tx_suite!(sqlx::Sqlite, fresh());

#[tokio::test]
async fn absent_in_flight_completed_transitions() {
    let (store, _dir) = fresh().await;
    let key = StoreKey::new("orders", None, "evt_1");
    let first = claim(b"{\"a\":1}");

    reserves(&store, &key, &first, LEASE, Reservation::Acquired).await;
    let row = sqlx::query(
        "SELECT state, token, fingerprint, record, expires_at - created_at AS lease
         FROM idempotency_keys WHERE key = ?1",
    )
    .bind(key.as_str())
    .fetch_one(store.pool())
    .await
    .unwrap();
    in_flight_row(&row, &first);
    assert_eq!(row.get::<i64, _>("lease"), 30_000);

    // The same claim again is still ours; a duplicate sees the first fingerprint.
    let dup = claim(b"{\"a\":1}");
    held_by(&store, &key, &first, &dup, LEASE).await;
    let record = values::owned_by(values::record_ack(first.fingerprint()), first.token());
    neither_completes_nor_releases(&store, &key, &dup, &record, RETENTION).await;

    records(&store, &key, &first, &record, RETENTION).await;
    let row =
        sqlx::query("SELECT state, token, record, expires_at FROM idempotency_keys WHERE key = ?1")
            .bind(key.as_str())
            .fetch_one(store.pool())
            .await
            .unwrap();
    completed_row(&row, &record);
    let left = row.get::<i64, _>("expires_at") - now_ms();
    let retention = RETENTION.as_millis() as i64;
    assert!(left > retention - 10_000 && left <= retention, "{left}");

    // A duplicate after completion gets the record; the key is not claimed again, not
    // released, and completing it again (a retry whose first attempt landed) is reported as
    // done, the record staying as it was.
    completed_by(&store, &key, &first, &dup, &record, LEASE).await;

    let other = StoreKey::new("orders", None, "evt_2");
    let a = claim(b"x");
    store.reserve_one(&other, &a, LEASE).await.unwrap();
    assert!(store.release_one(&other, &a).await.unwrap());
    assert_eq!(count(&store).await, 1);
    reserves(&store, &other, &claim(b"x"), LEASE, Reservation::Acquired).await;
}

#[tokio::test]
async fn expired_rows_are_taken_over_and_the_old_owner_is_refused() {
    // The database's own expiry: no local cache in front (a record read back would be cached
    // for its `read_ttl`, longer than this test's retention).
    let (store, _dir) = fresh().await;
    let key = StoreKey::new("t", None, "lease");
    let expiring = Duration::from_millis(30);
    expired_claim_taken_over(&store, &key, &claim(b"x"), &claim(b"y"), expiring, LEASE).await;

    let key = StoreKey::new("t", None, "record");
    record_expires(&store, &key, &claim(b"x"), LEASE, RECORD_RETENTION).await;
    assert_eq!(count(&store).await, 2, "taken over in place");
}

/// 50 identical claims at once, through two pools on one file (two processes sharing it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_claims_have_exactly_one_winner() {
    let (a, dir) = fresh().await;
    let b = open(&dir.db()).await;
    for round in 0..10 {
        let key = StoreKey::new("race", None, &format!("evt_{round}"));
        if round % 2 == 1 {
            // Odd rounds race for an expired row instead of an absent one.
            a.reserve_one(&key, &claim(b"same"), Duration::from_millis(1))
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        fifty_claims_one_winner(&[a.clone(), b.clone()], &key, LEASE, round).await;
    }
}

#[tokio::test]
async fn completed_keys_survive_an_app_restart() {
    let dir = TempDir::new();
    let key = StoreKey::new("restart", None, "evt_1");
    let first = claim(b"body");
    let mut headers = http::HeaderMap::new();
    headers.insert("content-type", "application/json".parse().unwrap());
    let record = values::owned_by(
        values::record_replay(
            first.fingerprint(),
            http::StatusCode::CREATED,
            headers,
            bytes::Bytes::from_static(b"{\"id\":1}"),
            None,
        ),
        first.token(),
    );
    {
        let store = open(&dir.db()).await;
        claim_and_record(&store, &key, &first, LEASE, &record, RETENTION).await;
        store.pool().close().await;
    }
    // A new process: a new pool on the same file; opening migrates again, harmlessly.
    let store = open(&dir.db()).await;
    replays(&store, &key, &record, LEASE).await;
}

#[tokio::test]
async fn purge_removes_only_expired_rows() {
    let (store, _dir) = fresh().await;
    sqlx::query(
        "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 2500)
         INSERT INTO idempotency_keys
             (key, state, token, fingerprint, record, expires_at, created_at)
         SELECT 'expired-' || n,
                CASE WHEN n % 2 = 0 THEN 'in_flight' ELSE 'completed' END,
                CASE WHEN n % 2 = 0 THEN zeroblob(16) END,
                zeroblob(8),
                CASE WHEN n % 2 = 1 THEN x'020000000000000000' END,
                ?1 - 1000 * n,
                ?1 - 3600000
         FROM g",
    )
    .bind(now_ms())
    .execute(store.pool())
    .await
    .unwrap();
    sql_checks::removes_only_expired_rows(&store).await;
}

#[tokio::test]
async fn custom_table_and_published_schema() {
    let (store, _dir) = fresh().await;
    let pool = store.pool().clone();
    let custom = SqliteStore::new(pool.clone())
        .with_table("webhook_keys")
        .unwrap();
    assert_eq!(custom.table(), "webhook_keys");
    custom.migrate().await.unwrap();
    custom.migrate().await.unwrap();
    let key = StoreKey::new("t", None, "k");
    reserves(&custom, &key, &claim(b"x"), LEASE, Reservation::Acquired).await;
    let index: String = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'webhook_keys'
         AND sql LIKE '%expires_at%'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(index, "webhook_keys_expires_at_idx");
    // The default table is untouched, and the published schema runs as it is.
    let default = SqliteStore::new(pool.clone());
    assert_eq!(count(&default).await, 0);
    sqlx::raw_sql(AssertSqlSafe(default.schema().to_owned()))
        .execute(&pool)
        .await
        .unwrap();
    // That `schema()` of the default table is the published constant: a unit test
    // (`sql::sqlite::tests::a_stores_schema_is_the_constant`), the constant being internal.
}

/// A store whose pool was closed (the application shutting down) answers 503 when failing
/// closed, like a database that is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_pool_is_unavailable_and_fails_closed() {
    let (store, _dir) = fresh().await;
    let pool = store.pool().clone();
    pool.close().await;
    let err = store
        .reserve_one(&StoreKey::new("t", None, "k"), &claim(b"x"), LEASE)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err}");
    let (store, _dir) = fresh().await;
    let pool = store.pool().clone();
    suite::fail_open_processes_without_protection(store, async move || pool.close().await).await;
}

/// A store opened for one process keeps its file to itself: no `-shm` file beside it, and
/// another connection to the file is refused (`SQLITE_BUSY`) while the store holds it.
#[tokio::test]
async fn an_exclusive_store_keeps_its_file_to_itself() {
    let dir = TempDir::new();
    let store = SqliteStore::open_exclusive(dir.db()).await.unwrap();
    assert_eq!(
        store
            .reserve_one(&StoreKey::new("x", None, "k"), &claim(b"x"), LEASE)
            .await
            .unwrap(),
        Reservation::Acquired
    );
    let shm = dir.0.join("idempotency.db-shm");
    assert!(!shm.exists(), "{} exists", shm.display());
    let other = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.db())
        .busy_timeout(Duration::ZERO);
    let read = async || {
        use sqlx::ConnectOptions;
        let mut connection = other.connect().await?;
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM idempotency_keys")
            .fetch_one(&mut connection)
            .await
    };
    assert!(read().await.is_err(), "another connection read the file");
    // Closed, the store lets go of it: the same read finds the claim.
    store.pool().close().await;
    assert_eq!(read().await.unwrap(), 1);
}

/// A file that is not an SQLite database is reported as corrupt, not as a crash.
#[tokio::test]
async fn not_a_database_is_an_error() {
    let dir = TempDir::new();
    std::fs::write(dir.db(), vec![b'x'; 8192]).unwrap();
    let err = SqliteStore::open(dir.db()).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
}
