//! The SQL backend, on `sqlx`: the record store ([`SqlStore`] over a sealed [`Dialect`]: PostgreSQL
//! and SQLite) and the inbox ([`SqlInbox`](crate::inbox::SqlInbox)), one table each: two kinds
//! of one [`SqlTable`]. The public paths are [`store::sql`](crate::sql) and
//! [`inbox`](crate::inbox).

use std::time::Duration;

pub use sqlx;

pub(crate) mod inbox;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod query;
mod records;
pub(crate) mod run;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;
pub(crate) mod statements;
mod table;

pub use self::records::SqlStore;
pub use self::table::SqlTable;

use crate::fingerprint::Fingerprint;
use crate::store::record::StoredValue;
use crate::store::{Claim, Completion, Reservation, StoreError, StoreErrorKind};
use crate::{ConfigError, ConfigErrorKind};

/// The default name of the table holding claims and records.
pub(crate) const DEFAULT_TABLE: &str = "idempotency_keys";

/// The default number of rows one purge statement deletes (see `purge_expired`).
pub(crate) const DEFAULT_PURGE_BATCH: u32 = 1000;

/// The longest lease or retention written: longer durations are cut to this (100 years), so
/// that timestamps never overflow.
pub(crate) const MAX_TTL: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A database an [`SqlStore`] runs on: [`sqlx::Postgres`] (feature `postgres`) or
/// [`sqlx::Sqlite`] (feature `sqlite`).
///
/// Sealed: what a dialect supplies (the clock, the shape of a claim, row locks, column types,
/// error codes) is private to this crate.
pub trait Dialect: dialect::Sealed {}

pub(crate) mod dialect {
    use super::query::Backend;
    use crate::store::StoreErrorKind;

    /// What a listener calls with each message's text (`None`: messages may have been lost).
    pub type Heard = Box<dyn Fn(Option<&str>) + Send + Sync>;

    /// What differs between the databases of the SQL stores. The statements themselves are
    /// written once (`Statements`); the parameters are `$1`, `$2`, ... in both.
    pub trait Sealed: Backend {
        /// The backend's name in log events.
        const BACKEND: &'static str;
        /// Whether a table name may be schema-qualified (`app.idempotency_keys`).
        const QUALIFIED_TABLES: bool;
        /// Appended to the purge's `SELECT` of expired rows (row locks), and to the inbox's
        /// `SELECT` of the entries it takes.
        const PURGE_LOCKS: &'static str;
        /// The column type of bytes (`bytea`, `BLOB`).
        const BYTES: &'static str;
        /// Whether the database runs one writing transaction at a time (SQLite): then several
        /// writes gain from sharing one transaction, where a server runs them side by side.
        const ONE_WRITER: bool;
        /// Whether the database carries messages between processes ([`notify`](Self::notify),
        /// [`listen`](Self::listen)).
        const NOTIFIES: bool;
        /// Whether the database takes `ALTER TABLE .. ADD COLUMN IF NOT EXISTS` (PostgreSQL);
        /// where it does not (SQLite), a migration reads the table's columns first.
        const ADD_COLUMN_IF_NOT_EXISTS: bool;

        /// The current time, in a statement whose bound clock (if the dialect has one, see
        /// [`clock`](Self::clock)) is parameter `$clock`.
        fn now(clock: usize) -> String;
        /// `time` plus the milliseconds in the expression `millis`.
        fn plus_millis(time: &str, millis: &str) -> String;
        /// The function of the greater of two values (`greatest`, `max`).
        const GREATEST: &'static str;
        /// The function of where a text first starts in another, from 1, 0 if nowhere
        /// (`strpos`, `instr`): `FIND_TEXT(haystack, needle)`.
        const FIND_TEXT: &'static str;
        /// The template of the reserve statement, from the `claim` (which returns one row
        /// when it wrote) and the `read_live` of the row holding the key (see
        /// `statements::render`); `None`: the claim alone, followed by the read when it
        /// returned no row.
        const RESERVE: Option<&'static str>;
        /// The template of the statement claiming a batch of keys at once (see
        /// `Statements::reserve_many`); `None`: one reserve per key.
        const RESERVE_MANY: Option<&'static str>;
        /// The template of the script `migrate` runs: the `{schema}` of the `{table}`, made
        /// safe to run from several processes at once.
        const MIGRATE: &'static str;
        /// The whole milliseconds from `now` to `time` (rounded down), as a 64-bit integer.
        fn millis_until(time: &str, now: &str) -> String;
        /// The value of the bound clock, bound after every statement's own parameters; `None`
        /// when the statements read the database's clock.
        fn clock() -> Option<i64>;
        /// The `CREATE TABLE` and `CREATE INDEX` statements of `table`.
        fn schema(table: &str) -> String;
        /// How many rows a statement wrote.
        fn rows_affected(done: &Self::QueryResult) -> u64;
        /// The kind of a database error, by its code.
        fn classify(code: &str) -> StoreErrorKind;
        /// `statement` (whose `RETURNING` has the column `at`, a time in milliseconds) made to
        /// tell every process listening on `channel` of each row it returns, when it commits;
        /// `None` where the database carries no such message (SQLite: the process tells its
        /// own workers).
        fn notify(statement: &str, channel: &str) -> Option<String>;
        /// A task that calls `heard` with each message's text on `channel` (`None` after a
        /// lost connection came back: messages may have been missed), on a connection of its
        /// own from `pool`; `None` where the database carries no such message.
        fn listen(
            pool: &sqlx::Pool<Self>,
            channel: &str,
            heard: Heard,
        ) -> Option<tokio::task::JoinHandle<()>>;
        /// Where the database carries no messages (SQLite), what names the database of `pool`
        /// alike for every pool of this process on it (its file's canonical path), so that
        /// inboxes built apart on it share their announcements; `None` where it does.
        fn place(pool: &sqlx::Pool<Self>) -> Option<String>;
    }
}

/// How often a claim is attempted again when the row it conflicted with vanished before it
/// could be read (released or expired in between).
const RESERVE_ATTEMPTS: usize = 3;

/// `d` in milliseconds, capped at [`MAX_TTL`].
pub(crate) fn millis(d: Duration) -> i64 {
    crate::store::millis(d.min(MAX_TTL))
}

/// Why a table name was refused: it is not an SQL identifier (a [`ConfigError`] of kind
/// [`Table`](ConfigErrorKind::Table), from `with_table`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct InvalidTable {
    table: String,
    allow_schema: bool,
}

impl std::fmt::Display for InvalidTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "invalid idempotency table name {:?}: expected an SQL identifier \
             ([A-Za-z_][A-Za-z0-9_]*, at most 40 characters){}",
            self.table,
            if self.allow_schema {
                ", optionally schema-qualified"
            } else {
                ""
            }
        )
    }
}

impl std::error::Error for InvalidTable {}

impl From<InvalidTable> for ConfigError {
    fn from(why: InvalidTable) -> Self {
        ConfigError::new(ConfigErrorKind::Table, why)
    }
}

/// Checks a table name: an SQL identifier (`[A-Za-z_][A-Za-z0-9_]*`, at most 40 characters so
/// that the index name derived from it fits PostgreSQL's 63), optionally schema-qualified. A
/// table name is written into statements unquoted.
pub(crate) fn validate_table(table: &str, allow_schema: bool) -> Result<(), InvalidTable> {
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
    if shape && parts.iter().all(valid_part) {
        Ok(())
    } else {
        Err(InvalidTable {
            table: table.to_owned(),
            allow_schema,
        })
    }
}

/// The schema of a record store on `table` (`queries/records/schema.sql`), with a dialect's
/// columns of the keys table and of the objects table (fragments of `queries/`).
fn schema(table: &str, columns: &str, objects: &str) -> String {
    let names = [
        ("table", table),
        ("index", bare_name(table)),
        ("columns", &statements::file(columns)),
        ("objects", &statements::file(objects)),
    ];
    statements::substitute(
        statements::ddl(include_str!("queries/records/schema.sql")),
        &names,
    )
}

/// The unqualified name of `table`, for the names of its index.
pub(crate) fn bare_name(table: &str) -> &str {
    table.rsplit('.').next().unwrap_or(table)
}

/// Maps an sqlx error to a [`StoreError`], asking `classify` about database error codes.
pub(crate) fn store_error(error: sqlx::Error, classify: fn(&str) -> StoreErrorKind) -> StoreError {
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
pub(crate) async fn purge_in_batches<F, Fut>(
    batch: u32,
    mut delete_batch: F,
) -> Result<u64, StoreError>
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

/// Spawns a Tokio task that runs `purge` on a clone of `owner` every `every` (the first time
/// right away) and logs what it deleted (`debug`) or why it could not (`warn`), for `what` on
/// `backend`.
pub(crate) fn spawn_purge_every<T, F, Fut>(
    every: Duration,
    backend: &'static str,
    what: &'static str,
    owner: T,
    purge: F,
) -> tokio::task::JoinHandle<()>
where
    T: Clone + Send + 'static,
    F: Fn(T) -> Fut + Send + 'static,
    Fut: Future<Output = Result<u64, StoreError>> + Send,
{
    let every = every.max(Duration::from_millis(1));
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match purge(owner.clone()).await {
                Ok(deleted) => tracing::debug!(backend, deleted, "purged expired {what}"),
                Err(error) => tracing::warn!(backend, %error, "purging expired {what} failed"),
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
        validate_table("idempotency_keys", false).unwrap();
        validate_table("_t1", false).unwrap();
        validate_table("app.idempotency_keys", true).unwrap();
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
            let err = validate_table(bad, true).unwrap_err();
            assert!(
                err.to_string().contains("invalid idempotency table name"),
                "{err}"
            );
        }
        assert!(validate_table("app.keys", false).is_err());
    }

    #[test]
    fn held_rows_decode_or_are_corrupt() {
        let fp = Fingerprint::of_bytes(b"x");
        assert_eq!(
            held("in_flight", fp.as_bytes(), None).unwrap(),
            Reservation::InFlight { fingerprint: fp }
        );
        let record = crate::store::record::Record::ack(fp);
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

    #[test]
    fn a_missed_completion_is_already_written_only_with_its_own_record() {
        let claim = Claim::new(Fingerprint::of_bytes(b"x"));
        let other = Claim::new(Fingerprint::of_bytes(b"x"));
        let record = crate::store::record::Record::ack(claim.fingerprint());
        let own = record.encode_for(claim.token());
        assert_eq!(
            completion_after_miss(Some(&own), &claim).unwrap(),
            Completion::AlreadyWritten
        );
        assert_eq!(
            completion_after_miss(Some(&own), &other).unwrap(),
            Completion::Lost
        );
        assert_eq!(
            completion_after_miss(None, &claim).unwrap(),
            Completion::Lost
        );
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
