//! The checks shared by the PostgreSQL and SQLite tests
//! (`#[path = "../support/sql_checks.rs"] mod sql_checks;`): what a key's row holds once
//! claimed ([`in_flight_row`]) and once completed ([`completed_row`]), each file reading the
//! row in its own SQL; the purge, each file seeding its own expired rows in its own SQL, then
//! handing the store to [`removes_only_expired_rows`]; [`count`] counts a store's rows.

use std::time::Duration;

use sqlx::AssertSqlSafe;
use sqlx::{ColumnIndex, Decode, Row, Type};
use tower_idempotency::store::record::Record;
use tower_idempotency::store::sql::{Dialect, SqlStore};
use tower_idempotency::store::{Claim, Reservation, StoreKey};
use tower_idempotency::test_util::store::OneTarget;
use tower_idempotency::test_util::values;

use crate::store_steps::{LEASE, RETENTION, claim};

/// `row`, a key's `state`, `token`, `fingerprint` and `record` columns, is `claim`'s claim in
/// flight: its token and fingerprint, no record.
pub fn in_flight_row<R: Row>(row: &R, claim: &Claim)
where
    for<'r> &'r str: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> &'r [u8]: Decode<'r, R::Database> + Type<R::Database>,
    &'static str: ColumnIndex<R>,
{
    assert_eq!(row.get::<&str, _>("state"), "in_flight");
    assert_eq!(row.get::<&[u8], _>("token"), claim.token().as_bytes());
    assert_eq!(
        row.get::<&[u8], _>("fingerprint"),
        claim.fingerprint().as_bytes()
    );
    assert_eq!(row.get::<Option<&[u8]>, _>("record"), None);
}

/// `row`, a key's `state`, `token` and `record` columns, is completed with `record`: no token
/// left, the record encoded.
pub fn completed_row<R: Row>(row: &R, record: &Record)
where
    for<'r> &'r str: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> &'r [u8]: Decode<'r, R::Database> + Type<R::Database>,
    &'static str: ColumnIndex<R>,
{
    assert_eq!(row.get::<&str, _>("state"), "completed");
    assert_eq!(row.get::<Option<&[u8]>, _>("token"), None);
    assert_eq!(row.get::<&[u8], _>("record"), &record.encode()[..]);
}

/// How many rows `store`'s table holds.
pub async fn count<DB: Dialect>(store: &SqlStore<DB>) -> i64
where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {}",
        store.table()
    )))
    .fetch_one(store.pool())
    .await
    .unwrap()
}

/// On a table holding 2500 expired rows (and nothing else): 30 live rows are added (15 in
/// flight, 15 completed); one purge removes the 2500 and keeps the 30, unchanged; a second
/// finds nothing; the background purge then removes 20 claims as their 1 ms leases expire.
pub async fn removes_only_expired_rows<DB: Dialect>(store: &SqlStore<DB>)
where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let mut live = Vec::new();
    for i in 0..30 {
        let key = StoreKey::new("purge", None, &i.to_string());
        let c = claim(b"live");
        store.reserve_one(&key, &c, LEASE).await.unwrap();
        if i % 2 == 1 {
            store
                .complete_one(&key, &c, &values::record_ack(c.fingerprint()), RETENTION)
                .await
                .unwrap();
        }
        live.push(key);
    }
    assert_eq!(count(store).await, 2530);

    assert_eq!(store.purge_expired(1000).await.unwrap(), 2500);
    assert_eq!(count(store).await, 30);
    assert_eq!(store.purge_expired(1000).await.unwrap(), 0);
    for (i, key) in live.iter().enumerate() {
        let found = store
            .reserve_one(key, &claim(b"live"), LEASE)
            .await
            .unwrap();
        if i % 2 == 1 {
            assert!(matches!(found, Reservation::Completed(_)), "{found:?}");
        } else {
            assert!(matches!(found, Reservation::InFlight { .. }), "{found:?}");
        }
    }

    // The background purge removes rows as they expire.
    for i in 0..20 {
        let key = StoreKey::new("purge-bg", None, &i.to_string());
        store
            .reserve_one(&key, &claim(b"x"), Duration::from_millis(1))
            .await
            .unwrap();
    }
    let purge = store.spawn_purge(Duration::from_millis(50));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while count(store).await > 30 {
        assert!(tokio::time::Instant::now() < deadline, "not purged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    purge.abort();
    assert_eq!(count(store).await, 30);
}
