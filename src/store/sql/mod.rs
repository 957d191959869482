//! The SQL stores, on [`sqlx`]: `PostgresStore` (feature `postgres`) and `SqliteStore`
//! (feature `sqlite`). Claims and records survive restarts of the application and of the
//! database, and are shared by every process that uses the same database.
//!
//! ```no_run
//! # #[cfg(feature = "sqlite")]
//! # #[tokio::main]
//! # async fn main() -> Result<(), tower_idempotency::store::StoreError> {
//! use std::time::Duration;
//! use tower_idempotency::store::sql::SqliteStore;
//!
//! // Opens (creating it if missing) the database file and creates the table.
//! let store = SqliteStore::open("idempotency.db").await?;
//! // Deletes expired claims and records every ten minutes.
//! let _purge = store.spawn_purge(Duration::from_secs(600));
//! // Hand `store` to the idempotency layer.
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```
//!
//! # The table
//!
//! One row per key, in a table named [`DEFAULT_TABLE`] unless configured otherwise
//! (`with_table`). The key is the row's `PRIMARY KEY`, so the database itself guarantees that
//! a key has at most one row:
//!
//! | column | PostgreSQL | SQLite | meaning |
//! |---|---|---|---|
//! | `key` | `text PRIMARY KEY` | `TEXT PRIMARY KEY` | the [`StoreKey`](super::StoreKey) (hashed: no raw user bytes) |
//! | `state` | `text` | `TEXT` | `in_flight` or `completed` |
//! | `token` | `bytea` | `BLOB` | the owner token (16 bytes) while in flight, `NULL` once completed |
//! | `fingerprint` | `bytea` | `BLOB` | the request [fingerprint](crate::fingerprint::Fingerprint) |
//! | `record` | `bytea` | `BLOB` | `NULL` while in flight, then [`Record::encode`](crate::record::Record::encode) |
//! | `expires_at` | `timestamptz` | `INTEGER` (ms since the Unix epoch) | end of the lease, then of the retention |
//! | `created_at` | `timestamptz` | `INTEGER` (ms since the Unix epoch) | when the current claim was taken |
//!
//! plus an index on `expires_at` for the purge. A row whose `expires_at` has passed counts as
//! absent: the next claim takes it over in place, and `purge_expired` deletes it.
//!
//! # Statements
//!
//! - **reserve** is one atomic `INSERT ... ON CONFLICT (key) DO UPDATE ... WHERE <the row
//!   there has expired> RETURNING`: the row is inserted, or an expired one is taken over in
//!   place, or nothing is written and the live row is read back (in the same statement on
//!   PostgreSQL, with a data-modifying CTE; by a following `SELECT` on SQLite). Never a
//!   `SELECT` then an `INSERT`: two concurrent claims of one key can never both win.
//! - **complete** is one `UPDATE ... WHERE key = $1 AND state = 'in_flight' AND token = $2 AND
//!   expires_at > now`, and **release** the same `DELETE`: a slow original whose lease expired
//!   never touches a newer holder's row.
//! - **purge** deletes expired rows in batches.
//!
//! # Expired rows
//!
//! The database does not drop rows by itself: call `purge_expired` from a scheduled job, or
//! let `spawn_purge` run it periodically in the background. Expired rows left behind are
//! harmless to correctness (they count as absent), they only take space.

use std::time::Duration;

pub use sqlx;

#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

#[cfg(feature = "postgres")]
pub use self::postgres::PostgresStore;
#[cfg(feature = "sqlite")]
pub use self::sqlite::SqliteStore;

use super::{Claim, Completion, Reservation, StoreError, StoreErrorKind};
use crate::fingerprint::Fingerprint;
use crate::record::StoredValue;

/// The default name of the table holding claims and records.
pub const DEFAULT_TABLE: &str = "idempotency_keys";

/// The default number of rows one purge statement deletes (see `purge_expired`).
pub const DEFAULT_PURGE_BATCH: u32 = 1000;

/// The longest lease or retention written: longer durations are cut to this (100 years), so
/// that timestamps never overflow.
pub const MAX_TTL: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How often a claim is attempted again when the row it conflicted with vanished before it
/// could be read (released or expired in between).
const RESERVE_ATTEMPTS: usize = 3;

/// `d` in milliseconds, capped at [`MAX_TTL`].
fn millis(d: Duration) -> i64 {
    d.min(MAX_TTL).as_millis() as i64
}

/// Checks a table name: an SQL identifier (`[A-Za-z_][A-Za-z0-9_]*`, at most 40 characters so
/// that the index name derived from it fits PostgreSQL's 63), optionally schema-qualified.
///
/// Panics with a message naming the offending table otherwise: a table name is static
/// configuration, and it is written into statements unquoted.
fn validate_table(table: &str, allow_schema: bool) {
    let parts: Vec<&str> = table.split('.').collect();
    let valid_part = |part: &&str| {
        !part.is_empty()
            && part.len() <= 40
            && part
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    };
    let shape = parts.len() == 1 || (allow_schema && parts.len() == 2);
    assert!(
        shape && parts.iter().all(valid_part),
        "invalid idempotency table name {table:?}: expected an SQL identifier \
         ([A-Za-z_][A-Za-z0-9_]*, at most 40 characters){}",
        if allow_schema {
            ", optionally schema-qualified"
        } else {
            ""
        }
    );
}

/// The unqualified name of `table`, for the names of its index.
fn bare_name(table: &str) -> &str {
    table.rsplit('.').next().unwrap_or(table)
}

/// What [`store_error`] asks a backend about a database error code.
type ClassifyCode = fn(&str) -> StoreErrorKind;

/// Maps an sqlx error to a [`StoreError`], asking `classify` about database error codes.
fn store_error(error: sqlx::Error, classify: ClassifyCode) -> StoreError {
    let kind = match &error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => StoreErrorKind::Unavailable,
        sqlx::Error::Database(db) => db
            .code()
            .map_or(StoreErrorKind::Other, |code| classify(&code)),
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. } => StoreErrorKind::Corrupt,
        _ => StoreErrorKind::Other,
    };
    StoreError::with_source(kind, error)
}

/// The reservation reported for a live row held by someone else.
fn held(state: &str, fingerprint: &[u8], record: Option<&[u8]>) -> Result<Reservation, StoreError> {
    let corrupt = |why: &str| StoreError::with_source(StoreErrorKind::Corrupt, why.to_owned());
    match (state, record) {
        ("in_flight", _) => {
            let fingerprint: [u8; Fingerprint::LEN] = fingerprint
                .try_into()
                .map_err(|_| corrupt("fingerprint column has the wrong length"))?;
            Ok(Reservation::InFlight {
                fingerprint: Fingerprint::from_bytes(fingerprint),
            })
        }
        ("completed", Some(record)) => match StoredValue::decode(record)? {
            StoredValue::Completed(record) => Ok(Reservation::Completed(record)),
            StoredValue::InFlight { .. } => Err(corrupt("record column holds an in-flight value")),
        },
        ("completed", None) => Err(corrupt("completed row without a record")),
        _ => Err(corrupt("unknown state")),
    }
}

/// What a `complete` that updated no row means: the key holds this claim's own record (a
/// retried completion whose first attempt landed), or the claim was lost.
fn completion_after_miss(record: Option<&[u8]>, claim: &Claim) -> Result<Completion, StoreError> {
    let Some(record) = record else {
        return Ok(Completion::Lost);
    };
    Ok(match StoredValue::decode(record)? {
        StoredValue::Completed(record) if record.is_owned_by(claim.token()) => {
            Completion::AlreadyWritten
        }
        _ => Completion::Lost,
    })
}

/// The error when a claim kept conflicting with a row that vanished before it could be read.
fn unsettled() -> StoreError {
    StoreError::with_source(
        StoreErrorKind::Other,
        "the key kept changing while it was being claimed",
    )
}

/// Runs `delete_batch(batch)` until it deletes fewer than `batch` rows; returns the total.
async fn purge_in_batches<F, Fut>(batch: u32, mut delete_batch: F) -> Result<u64, StoreError>
where
    F: FnMut(i64) -> Fut,
    Fut: Future<Output = Result<u64, StoreError>>,
{
    let batch = batch.max(1);
    let mut total = 0;
    loop {
        let deleted = delete_batch(i64::from(batch)).await?;
        total += deleted;
        if deleted < u64::from(batch) {
            return Ok(total);
        }
    }
}

/// Spawns a task running `purge` every `every` (the first run immediately), logging its
/// outcome; it runs until aborted or until the runtime shuts down.
fn spawn_purge_task<F, Fut>(
    every: Duration,
    backend: &'static str,
    purge: F,
) -> tokio::task::JoinHandle<()>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = Result<u64, StoreError>> + Send,
{
    let every = every.max(Duration::from_millis(1));
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match purge().await {
                Ok(deleted) => {
                    tracing::debug!(backend, deleted, "purged expired idempotency keys")
                }
                Err(error) => {
                    tracing::warn!(backend, %error, "purging expired idempotency keys failed")
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_are_capped() {
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
        assert_eq!(millis(Duration::MAX), MAX_TTL.as_millis() as i64);
    }

    #[test]
    fn table_names_are_identifiers() {
        validate_table("idempotency_keys", false);
        validate_table("_t1", false);
        validate_table("app.idempotency_keys", true);
        assert_eq!(bare_name("app.keys"), "keys");
        assert_eq!(bare_name("keys"), "keys");
        for bad in [
            "",
            "1abc",
            "a-b",
            "a b",
            "t; DROP TABLE x",
            "\"quoted\"",
            "a.b.c",
            ".a",
            &"x".repeat(41),
        ] {
            let result = std::panic::catch_unwind(|| validate_table(bad, true));
            assert!(result.is_err(), "{bad:?} accepted");
        }
        assert!(std::panic::catch_unwind(|| validate_table("app.keys", false)).is_err());
    }

    #[test]
    fn held_rows_decode_or_are_corrupt() {
        let fp = Fingerprint::of_bytes(b"x");
        assert_eq!(
            held("in_flight", fp.as_bytes(), None).unwrap(),
            Reservation::InFlight { fingerprint: fp }
        );
        let record = crate::record::Record::ack(fp);
        assert_eq!(
            held("completed", fp.as_bytes(), Some(&record.encode())).unwrap(),
            Reservation::Completed(record)
        );
        for (state, fp_bytes, record) in [
            ("in_flight", &b"short"[..], None),
            ("completed", fp.as_bytes(), None),
            ("completed", fp.as_bytes(), Some(&b"\xff"[..])),
            ("other", fp.as_bytes(), None),
        ] {
            let err = held(state, fp_bytes, record).unwrap_err();
            assert_eq!(err.kind(), StoreErrorKind::Corrupt);
        }
    }

    #[tokio::test]
    async fn purge_loops_until_a_short_batch() {
        let mut left = 25u64;
        let mut calls = 0;
        let total = purge_in_batches(10, |n| {
            calls += 1;
            let deleted = left.min(n as u64);
            left -= deleted;
            async move { Ok(deleted) }
        })
        .await
        .unwrap();
        assert_eq!((total, calls), (25, 3));
    }
}
