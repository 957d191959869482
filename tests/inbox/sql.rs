//! The inbox contract on `SqliteInbox` (a temporary file per test) and on `PostgresInbox` (a
//! real server, a table per test: `take` hands out every due entry of its table), and what
//! only the SQL inboxes show: several pools taking at once, the completion in the handler's
//! own transaction.
#![cfg(all(feature = "sqlite", feature = "postgres"))]

use crate::postgres_server;
use tower_idempotency::test_util::inbox as inbox_contract;
use tower_idempotency::test_util::inbox_admin as inbox_admin_contract;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use postgres_server::PostgresServer;
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use tower_idempotency::inbox::{
    AttemptOutcome, Enqueued, InboxAdmin, InboxCounts, InboxEntry, InboxRequest, InboxStore,
    KeyState, PostgresInbox, SqlInbox, SqliteInbox, Worker,
};
use tower_idempotency::order::Position;
use tower_idempotency::store::{ObjectKey, StoreKey};
use tower_idempotency::test_util::values;

const LONG: Duration = Duration::from_secs(60);
const RETENTION: Duration = Duration::from_secs(3600);
const DEADLINE: Duration = Duration::from_secs(20);

fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(unique("tower-idem-inbox-sqlite"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A migrated SQLite inbox on a fresh file (WAL, 5 s busy timeout); the file goes with the
/// guard.
async fn sqlite_inbox() -> (SqliteInbox, TempDir) {
    let dir = TempDir::new();
    let options = SqliteConnectOptions::new()
        .filename(dir.0.join("inbox.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5));
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .unwrap();
    let inbox = SqliteInbox::new(pool);
    inbox.migrate().await.unwrap();
    (inbox, dir)
}

fn shared_server() -> &'static PostgresServer {
    static SERVER: OnceLock<PostgresServer> = OnceLock::new();
    SERVER.get_or_init(PostgresServer::new)
}

async fn pg_pool() -> PgPool {
    let url = tokio::task::block_in_place(|| shared_server().url());
    PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url)
        .await
        .unwrap_or_else(|e| panic!("could not connect to {url}: {e}"))
}

/// A migrated PostgreSQL inbox in a table of its own, on the shared server.
async fn pg_inbox() -> PostgresInbox {
    let inbox = PostgresInbox::new(pg_pool().await)
        .with_table(&unique("inbox"))
        .unwrap();
    inbox.migrate().await.unwrap();
    inbox
}

fn entry(n: usize) -> InboxEntry {
    let key = StoreKey::new("inbox-sql", None, &unique(&format!("evt{n}")));
    values::inbox_entry(key, Bytes::from(format!("{{\"n\":{n}}}")), unique("corr"))
}

mod sqlite {
    use super::*;

    inbox_contract::inbox_contract!(sqlite_inbox());
    inbox_admin_contract::inbox_admin_contract!(sqlite_inbox());
}

mod postgres {
    use super::*;

    inbox_contract::inbox_contract!(async { (pg_inbox().await, ()) });
    inbox_admin_contract::inbox_admin_contract!(async { (pg_inbox().await, ()) });
}

/// The contract through `AnyInbox::on` a store from `connect(url)`: the inbox on the store's own
/// pool, in a table of its own.
mod any {
    use super::*;
    use tower_idempotency::inbox::AnyInbox;
    use tower_idempotency::store::connect;

    mod sqlite {
        use super::*;

        inbox_contract::inbox_contract!(async {
            let dir = TempDir::new();
            let url = format!("sqlite://{}", dir.0.join("any.db").display());
            let store = connect(&url).await.unwrap();
            let inbox = AnyInbox::on(&store, "any_inbox").await.unwrap();
            assert_eq!(inbox.backend(), "sqlite");
            (inbox, dir)
        });
        inbox_admin_contract::inbox_admin_contract!(async {
            let dir = TempDir::new();
            let url = format!("sqlite://{}", dir.0.join("any.db").display());
            let store = connect(&url).await.unwrap();
            let inbox = AnyInbox::on(&store, "any_inbox").await.unwrap();
            (inbox, dir)
        });
    }

    mod postgres {
        use super::*;

        inbox_contract::inbox_contract!(async {
            let url = tokio::task::block_in_place(|| shared_server().url());
            let store = connect(&url).await.unwrap();
            let inbox = AnyInbox::on(&store, &unique("any")).await.unwrap();
            assert_eq!(inbox.backend(), "postgres");
            (inbox, ())
        });
        inbox_admin_contract::inbox_admin_contract!(async {
            let url = tokio::task::block_in_place(|| shared_server().url());
            let store = connect(&url).await.unwrap();
            let inbox = AnyInbox::on(&store, &unique("any")).await.unwrap();
            (inbox, ())
        });
    }
}

/// Two pools on one database (as two processes), four takers each: every entry is taken
/// exactly once, and each completion with its lease's token lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pools_on_postgres_never_take_an_entry_twice() {
    let first = pg_inbox().await;
    let second = PostgresInbox::new(pg_pool().await)
        .with_table(first.table())
        .unwrap();
    const ENTRIES: usize = 300;
    for n in 0..ENTRIES {
        assert_eq!(first.enqueue(entry(n)).await.unwrap(), Enqueued::Queued);
    }
    let mut takers = Vec::new();
    for inbox in [first.clone(), second.clone()] {
        for _ in 0..4 {
            let inbox = inbox.clone();
            takers.push(tokio::spawn(async move {
                let (mut mine, start) = (Vec::new(), Instant::now());
                loop {
                    let taken = inbox.take(7, LONG).await.unwrap();
                    if taken.is_empty() && inbox.counts().await.unwrap().pending == 0 {
                        return mine;
                    }
                    assert!(start.elapsed() < DEADLINE, "the takers do not finish");
                    for lease in taken {
                        assert!(!lease.stale);
                        let key = lease.entry.key.clone();
                        assert!(
                            inbox
                                .complete(&[(key.clone(), lease.token)], RETENTION)
                                .await
                                .unwrap()[0]
                        );
                        mine.push(key);
                    }
                }
            }));
        }
    }
    let (mut all, mut seen) = (0, HashSet::new());
    for taker in takers {
        for key in taker.await.unwrap() {
            all += 1;
            assert!(seen.insert(key.clone()), "{key} was taken twice");
        }
    }
    assert_eq!((all, seen.len()), (ENTRIES, ENTRIES));
    let counts = second.counts().await.unwrap();
    assert_eq!((counts.pending, counts.in_flight, counts.dead), (0, 0, 0));
}

/// The completion in the handler's transaction: rolled back with the effect, the entry is
/// taken again after its lease; committed, the effect and the done key land together.
async fn completion_joins_the_handlers_transaction<DB>(inbox: SqlInbox<DB>, effects: &str)
where
    DB: tower_idempotency::store::sql::Dialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments: sqlx::IntoArguments<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'r> i64: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let run = |sql: String| sqlx::query(AssertSqlSafe(sql));
    run(format!("CREATE TABLE {effects} (event text NOT NULL)"))
        .execute(inbox.pool())
        .await
        .unwrap();
    let first = entry(0);
    inbox.enqueue(first.clone()).await.unwrap();
    let lease = Duration::from_millis(300);
    let taken = inbox.take(10, lease).await.unwrap().pop().unwrap();

    let mut tx = inbox.pool().begin().await.unwrap();
    run(format!("INSERT INTO {effects} (event) VALUES ($1)"))
        .bind(first.key.as_str())
        .execute(&mut *tx)
        .await
        .unwrap();
    let key = &first.key;
    assert!(
        inbox
            .complete_in_tx(&mut tx, key, &taken.token, RETENTION)
            .await
            .unwrap()
    );
    tx.rollback().await.unwrap();
    assert_eq!(
        inbox.enqueue(first.clone()).await.unwrap(),
        Enqueued::Duplicate(KeyState::Running),
        "the rolled-back completion left the entry running"
    );

    let start = Instant::now();
    let again = loop {
        if let Some(again) = inbox.take(10, LONG).await.unwrap().pop() {
            break again;
        }
        assert!(start.elapsed() < DEADLINE, "the entry is not taken again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((&again.entry.key, again.entry.attempts), (key, 2));
    let mut tx = inbox.pool().begin().await.unwrap();
    assert!(
        !inbox
            .complete_in_tx(&mut tx, key, &taken.token, RETENTION)
            .await
            .unwrap(),
        "the first lease's token no longer holds the entry"
    );
    run(format!("INSERT INTO {effects} (event) VALUES ($1)"))
        .bind(key.as_str())
        .execute(&mut *tx)
        .await
        .unwrap();
    assert!(
        inbox
            .complete_in_tx(&mut tx, key, &again.token, RETENTION)
            .await
            .unwrap()
    );
    tx.commit().await.unwrap();
    assert!(
        inbox
            .complete(&[(key.clone(), again.token)], RETENTION)
            .await
            .unwrap()[0],
        "the worker's completion after the handler's is not a lost lease"
    );
    assert!(
        !inbox
            .complete(&[(key.clone(), taken.token)], RETENTION)
            .await
            .unwrap()[0]
    );
    assert_eq!(
        inbox.enqueue(first.clone()).await.unwrap(),
        Enqueued::Duplicate(KeyState::Done)
    );
    let effects: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {effects}")))
        .fetch_one(inbox.pool())
        .await
        .unwrap();
    assert_eq!(effects, 1, "one effect: the rolled-back one is gone");
}

/// A table made before the delivery id, the route and the attempts were kept (with an entry
/// waiting in it): `migrate` adds their columns, again harmlessly, and the entry is taken,
/// found with its attempt, and completed.
async fn migrate_upgrades_an_older_table<DB>(inbox: SqlInbox<DB>, bytes: &str)
where
    DB: tower_idempotency::store::sql::Dialect,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    let table = inbox.table().to_owned();
    let old = entry(0);
    // Written out, not read from schema.sql: the table as it stood before those columns, which
    // a later change to the schema must leave as it is.
    let older = format!(
        "CREATE TABLE {table} (
    key            text    NOT NULL PRIMARY KEY,
    state          text    NOT NULL CHECK (state IN ('queued', 'running', 'dead', 'done')),
    body           {bytes},
    headers        {bytes},
    object         text,
    position       {bytes},
    correlation_id text    NOT NULL,
    attempts       bigint  NOT NULL,
    next_at        bigint  NOT NULL,
    lease_token    {bytes},
    lease_until    bigint,
    last_error     text,
    enqueued_at    bigint  NOT NULL,
    expires_at     bigint,
    CHECK (state = 'done' OR (state = 'running') = (lease_token IS NOT NULL)),
    CHECK ((state = 'done') = (expires_at IS NOT NULL))
);
INSERT INTO {table} (key, state, correlation_id, attempts, next_at, enqueued_at)
VALUES ('{}', 'queued', 'corr-old', 0, 0, 0);",
        old.key.as_str()
    );
    sqlx::raw_sql(AssertSqlSafe(older))
        .execute(inbox.pool())
        .await
        .unwrap();
    inbox.migrate().await.unwrap();
    inbox.migrate().await.unwrap();

    let taken = inbox.take(10, LONG).await.unwrap();
    assert_eq!(taken.len(), 1);
    let lease = &taken[0];
    assert_eq!(lease.entry.key, old.key);
    assert_eq!(
        (lease.entry.id.as_str(), lease.entry.route.as_str()),
        ("", "")
    );
    let running = inbox.find(&old.key).await.unwrap().unwrap();
    assert_eq!(running.state, KeyState::Running);
    assert_eq!(running.history.len(), 1);
    assert!(
        inbox
            .complete(&[(old.key.clone(), lease.token)], RETENTION)
            .await
            .unwrap()[0]
    );
    let done = inbox.find(&old.key).await.unwrap().unwrap();
    assert_eq!(done.state, KeyState::Done);
    assert_eq!(done.entry.correlation_id, "corr-old");
    assert_eq!(done.history.len(), 1);
    assert_eq!(done.history[0].outcome, AttemptOutcome::Succeeded);
    assert!(!inbox.is_paused().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_upgrades_an_older_postgres_table() {
    let inbox = PostgresInbox::new(pg_pool().await)
        .with_table(&unique("older"))
        .unwrap();
    migrate_upgrades_an_older_table(inbox, "bytea").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_upgrades_an_older_sqlite_table() {
    let dir = TempDir::new();
    let url = format!("sqlite://{}?mode=rwc", dir.0.join("older.db").display());
    let pool = SqlitePoolOptions::new().connect(&url).await.unwrap();
    migrate_upgrades_an_older_table(SqliteInbox::new(pool), "BLOB").await;
}

/// An entry whose lease keeps running out is taken over each time: its history keeps the last
/// attempts (the statements bound it), each taken-over one lost, the last one running.
async fn a_history_keeps_the_last_attempts_and_marks_lost_leases<St: InboxAdmin>(inbox: St) {
    let lost = entry(0);
    inbox.enqueue(lost.clone()).await.unwrap();
    // The attempts an entry keeps (`EntryInfo::history`).
    let kept: u32 = 10;
    for n in 0..kept + 2 {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let taken = inbox.take(1, Duration::ZERO).await.unwrap();
        assert_eq!(taken.len(), 1, "take {n}");
    }
    let info = inbox.find(&lost.key).await.unwrap().unwrap();
    assert_eq!(info.state, KeyState::Running);
    let numbers: Vec<u32> = info.history.iter().map(|a| a.number).collect();
    assert_eq!(numbers, (3..=kept + 2).collect::<Vec<_>>());
    let (last, before) = info.history.split_last().unwrap();
    assert_eq!(last.outcome, AttemptOutcome::Running);
    assert!(
        before
            .iter()
            .all(|a| a.outcome == AttemptOutcome::LeaseLost && a.duration.is_none())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_history_keeps_the_last_attempts() {
    a_history_keeps_the_last_attempts_and_marks_lost_leases(pg_inbox().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sqlite_history_keeps_the_last_attempts() {
    let (inbox, _dir) = sqlite_inbox().await;
    a_history_keeps_the_last_attempts_and_marks_lost_leases(inbox).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_in_a_postgres_transaction() {
    let inbox = pg_inbox().await;
    let effects = format!("{}_effects", inbox.table());
    completion_joins_the_handlers_transaction(inbox, &effects).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_in_an_sqlite_transaction() {
    let (inbox, _dir) = sqlite_inbox().await;
    completion_joins_the_handlers_transaction(inbox, "effects").await;
}

/// A done key past its retention is free again: enqueued in place, or purged (and entries are
/// never purged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_done_keys_are_free_again_and_purged() {
    let (inbox, _dir) = sqlite_inbox().await;
    let (again, purged, waiting) = (entry(1), entry(2), entry(3));
    inbox.enqueue(again.clone()).await.unwrap();
    inbox.enqueue(purged.clone()).await.unwrap();
    let short = Duration::from_millis(50);
    for lease in inbox.take(10, LONG).await.unwrap() {
        assert!(
            inbox
                .complete(&[(lease.entry.key.clone(), lease.token)], short)
                .await
                .unwrap()[0]
        );
    }
    inbox.enqueue(waiting.clone()).await.unwrap();
    assert_eq!(
        inbox.enqueue(again.clone()).await.unwrap(),
        Enqueued::Duplicate(KeyState::Done),
        "within its retention"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(inbox.enqueue(again).await.unwrap(), Enqueued::Queued);
    assert_eq!(
        inbox.purge_expired(1000).await.unwrap(),
        1,
        "only the expired done key"
    );
    assert_eq!(inbox.enqueue(purged).await.unwrap(), Enqueued::Queued);
    assert_eq!(inbox.counts().await.unwrap().pending, 3);
}

/// An object's watermark is purged with the done keys once its retention ran out (the table of
/// watermarks does not keep every object ever seen), and one still within it stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_watermarks_are_purged_on_sqlite() {
    let (inbox, _dir) = sqlite_inbox().await;
    expired_watermarks_are_purged(inbox).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_watermarks_are_purged_on_postgres() {
    expired_watermarks_are_purged(pg_inbox().await).await;
}

/// Completes an ordered entry with a short retention and one of another object with a long
/// one, waits for the short one to run out, purges.
async fn expired_watermarks_are_purged<DB>(inbox: SqlInbox<DB>)
where
    DB: tower_idempotency::store::sql::Dialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments: sqlx::IntoArguments<DB>,
    for<'r> i64: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let (short, long) = (Duration::from_millis(50), Duration::from_secs(3600));
    for (n, retention) in [(1, short), (2, long)] {
        let object = ObjectKey::new("inbox-sql", None, &unique(&format!("object{n}")));
        inbox
            .enqueue(ordered(entry(n), object, Position::new(7)))
            .await
            .unwrap();
        let lease = inbox.take(1, LONG).await.unwrap().pop().unwrap();
        assert!(
            inbox
                .complete(&[(lease.entry.key.clone(), lease.token)], retention)
                .await
                .unwrap()[0]
        );
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let purged = inbox.purge_expired(1000).await.unwrap();
    let count = format!("SELECT COUNT(*) FROM {}_objects", inbox.table());
    let left: i64 = sqlx::query_scalar(AssertSqlSafe(count))
        .fetch_one(inbox.pool())
        .await
        .unwrap();
    assert_eq!(
        (purged, left),
        (2, 1),
        "the short-lived done key and watermark went, the long-lived watermark stays"
    );
}

/// `spawn_purge` deletes the expired done keys on its own schedule, and leaves entries alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawned_purge_deletes_expired_done_keys() {
    let (inbox, _dir) = sqlite_inbox().await;
    inbox.enqueue(entry(1)).await.unwrap();
    for lease in inbox.take(10, LONG).await.unwrap() {
        let short = Duration::from_millis(1);
        assert!(
            inbox
                .complete(&[(lease.entry.key.clone(), lease.token)], short)
                .await
                .unwrap()[0]
        );
    }
    inbox.enqueue(entry(2)).await.unwrap();
    let count = format!("SELECT COUNT(*) FROM {}", inbox.table());
    let rows = || async {
        let rows: i64 = sqlx::query_scalar(AssertSqlSafe(count.clone()))
            .fetch_one(inbox.pool())
            .await
            .unwrap();
        rows
    };
    assert_eq!(rows().await, 2, "the done key and the waiting entry");
    let purging = inbox.spawn_purge(Duration::from_millis(20));
    let start = std::time::Instant::now();
    while rows().await != 1 {
        assert!(start.elapsed() < Duration::from_secs(5), "not purged");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    purging.abort();
    assert_eq!(
        inbox.counts().await.unwrap().pending,
        1,
        "the entry is kept"
    );
}

/// A worker whose handler writes its effect and completes its entry in one transaction: each
/// effect lands once (its table's key would refuse a second) and every key is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_handler_completes_in_its_own_transaction() {
    type BoxError = Box<dyn std::error::Error + Send + Sync>;
    let inbox = pg_inbox().await;
    let effects = format!("{}_effects", inbox.table());
    let run = |sql: String| sqlx::query(AssertSqlSafe(sql));
    run(format!("CREATE TABLE {effects} (event text PRIMARY KEY)"))
        .execute(inbox.pool())
        .await
        .unwrap();
    let handler = {
        let (inbox, effects) = (inbox.clone(), effects.clone());
        tower::service_fn(move |request: InboxRequest| {
            let (inbox, insert) = (inbox.clone(), format!("INSERT INTO {effects} VALUES ($1)"));
            async move {
                let mut tx = inbox.pool().begin().await?;
                sqlx::query(AssertSqlSafe(insert))
                    .bind(request.key().as_str())
                    .execute(&mut *tx)
                    .await?;
                let (key, token) = (request.key(), request.token());
                if !inbox.complete_in_tx(&mut tx, key, token, RETENTION).await? {
                    return Err::<(), BoxError>("the lease was lost".into());
                }
                tx.commit().await?;
                Ok(())
            }
        })
    };
    let entries: Vec<InboxEntry> = (0..20).map(entry).collect();
    for entry in &entries {
        inbox.enqueue(entry.clone()).await.unwrap();
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = Worker::new(inbox.clone(), handler)
        .workers(4)
        .poll_interval(Duration::from_millis(5));
    let running = tokio::spawn(worker.run(async {
        stopped.await.ok();
    }));
    let start = Instant::now();
    while inbox.counts().await.unwrap() != InboxCounts::default() {
        assert!(start.elapsed() < DEADLINE, "the entries are not applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send(()).unwrap();
    running.await.unwrap();
    for entry in entries {
        assert_eq!(
            inbox.enqueue(entry).await.unwrap(),
            Enqueued::Duplicate(KeyState::Done)
        );
    }
    let applied: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {effects}")))
        .fetch_one(inbox.pool())
        .await
        .unwrap();
    assert_eq!(applied, 20);
}

/// A worker on a pool of one connection (`SqliteStore::open_exclusive`, `?locking=exclusive`)
/// drains its inbox: its takes go on while the loop counts the gauges (which waits for that one
/// connection), so nothing waits for the pool's acquire timeout.
#[cfg(feature = "metrics")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_on_one_connection_drains_its_inbox() {
    let dir = TempDir::new();
    let options = SqliteConnectOptions::new()
        .filename(dir.0.join("inbox.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal);
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        // A take that kept the connection while the gauges wait for it would show as a stall
        // of this long.
        .acquire_timeout(Duration::from_secs(60))
        .connect_with(options)
        .await
        .unwrap();
    let inbox = SqliteInbox::new(pool);
    inbox.migrate().await.unwrap();
    // Long enough (about 2 s) for the gauges to be counted while takes are in flight.
    for n in 0..1500 {
        inbox.enqueue(entry(n)).await.unwrap();
    }
    let handler = tower::service_fn(|_request: InboxRequest| async {
        tokio::time::sleep(Duration::from_millis(4)).await;
        Ok::<_, std::convert::Infallible>(())
    });
    let worker = Worker::new(inbox.clone(), handler)
        .workers(8)
        .poll_interval(Duration::from_millis(5));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(worker.run(async {
        stopped.await.ok();
    }));
    let start = Instant::now();
    loop {
        let counts = inbox.counts().await.unwrap();
        if counts.pending + counts.in_flight == 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "not drained in 30 s: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send(()).unwrap();
    run.await.unwrap();
}

/// A batch of completions much larger than the pool (a worker sends up to 128 at once; a
/// caller of `complete` may send more): no more transactions at once than the pool has
/// connections, so that none waits for a connection past the pool's acquire timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_completions_larger_than_the_pool_completes_on_postgres() {
    let first = pg_inbox().await;
    let url = tokio::task::block_in_place(|| shared_server().url());
    let one_connection = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_millis(100))
        .connect(&url)
        .await
        .unwrap();
    let narrow = PostgresInbox::new(one_connection)
        .with_table(first.table())
        .unwrap();
    const ENTRIES: usize = 512;
    for n in 0..ENTRIES {
        assert_eq!(first.enqueue(entry(n)).await.unwrap(), Enqueued::Queued);
    }
    let mut leases = Vec::new();
    while leases.len() < ENTRIES {
        let taken = first.take(ENTRIES - leases.len(), LONG).await.unwrap();
        assert!(!taken.is_empty(), "{} of {ENTRIES} taken", leases.len());
        leases.extend(
            taken
                .into_iter()
                .map(|lease| (lease.entry.key, lease.token)),
        );
    }
    let done = narrow.complete(&leases, RETENTION).await.unwrap();
    assert_eq!(done, vec![true; ENTRIES]);
    assert_eq!(first.counts().await.unwrap().pending, 0);
}

/// An entry enqueued, or a retry scheduled, through one pool wakes a worker idle on another
/// (`NOTIFY` at the commit, heard by the other pool's `LISTEN`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_through_another_pool_wakes_an_idle_worker_on_postgres() {
    let first = pg_inbox().await;
    let second = PostgresInbox::new(pg_pool().await)
        .with_table(first.table())
        .unwrap();
    inbox_contract::an_enqueue_elsewhere_wakes_an_idle_worker(first.clone(), second.clone()).await;
    inbox_contract::a_retry_elsewhere_wakes_an_idle_worker(first, second).await;
}

/// Two takes that read before either committed (PostgreSQL's READ COMMITTED): the first holds
/// a newer entry of an object, uncommitted, when an older one of it arrives; the second take
/// still reads the newer as queued, so the older looks like the object's next. It must not
/// take it: its write waits on the in-flight index until the first commits, then it takes
/// again and sees the object in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_racing_an_uncommitted_take_of_the_object_leaves_its_older_entry_on_postgres() {
    let inbox = pg_inbox().await;
    let object = ObjectKey::new("inbox-sql", None, &unique("raced"));
    let position = |n: i64| Position::from_integer_text(&n.to_string()).unwrap();
    let newer = ordered(entry(2), object.clone(), position(2));
    inbox.enqueue(newer).await.unwrap();
    // The first take, as the inbox's own would write it, held open.
    let mut first = inbox.pool().begin().await.unwrap();
    let lease_until = i64::try_from(
        (std::time::SystemTime::now() + LONG)
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let taken = sqlx::query(AssertSqlSafe(format!(
        "UPDATE {} SET state = 'running', attempts = attempts + 1, lease_token = $1,
             lease_until = $2 WHERE state = 'queued'",
        inbox.table()
    )))
    .bind(vec![7_u8; 16])
    .bind(lease_until)
    .execute(&mut *first)
    .await
    .unwrap();
    assert_eq!(taken.rows_affected(), 1);
    let older = ordered(entry(1), object.clone(), position(1));
    inbox.enqueue(older).await.unwrap();
    let second = tokio::spawn({
        let inbox = inbox.clone();
        async move { inbox.take(8, LONG).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.commit().await.unwrap();
    let second = tokio::time::timeout(DEADLINE, second)
        .await
        .expect("the second take ends once the first committed")
        .unwrap()
        .expect("a conflict on the in-flight index is taken again, not an error");
    assert!(
        second.is_empty(),
        "the older entry was taken while its object's newer one was in flight: {:?}",
        second
            .iter()
            .map(|lease| format!("{:?}", &lease.entry.key))
            .collect::<Vec<_>>()
    );
}

/// A schema-qualified table whose `<table>_wake` is past PostgreSQL's 63 bytes for a channel
/// name: enqueues still work, and still wake a worker idle on another pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_table_name_still_enqueues_and_wakes_on_postgres() {
    let pool = pg_pool().await;
    let schema = format!("s{}", unique("long").replace('_', "x"));
    let schema = format!("{schema:x<40}");
    sqlx::query(AssertSqlSafe(format!(
        "CREATE SCHEMA IF NOT EXISTS {schema}"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let table = format!("{schema}.{}", "t".repeat(40));
    let first = PostgresInbox::new(pool).with_table(&table).unwrap();
    first.migrate().await.unwrap();
    let second = PostgresInbox::new(pg_pool().await)
        .with_table(&table)
        .unwrap();
    inbox_contract::an_enqueue_elsewhere_wakes_an_idle_worker(first, second).await;
}

/// Two inboxes built apart on one SQLite database (the route's and the workers', as an app
/// builds them): an enqueue through one wakes a worker idle on the other, in this process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inboxes_built_apart_on_one_sqlite_database_wake_each_other() {
    let (first, dir) = sqlite_inbox().await;
    let second = SqliteInbox::new(first.pool().clone());
    inbox_contract::an_enqueue_elsewhere_wakes_an_idle_worker(first.clone(), second).await;
    // A pool of its own, opened by another spelling of the file's path and other options (the
    // worker's process side, say): still the same database.
    let other_spelling = dir.0.join(".").join("inbox.db");
    let url = format!("sqlite://{}?mode=rwc", other_spelling.display());
    let pool = SqlitePoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .unwrap();
    inbox_contract::an_enqueue_elsewhere_wakes_an_idle_worker(SqliteInbox::new(pool), first).await;
}

/// Issue 55: a take on PostgreSQL reads the due entries through `<table>_take_idx`, in due
/// order, and stops at its limit; with a backlog of 20,000 entries (half of them ordered, 100
/// objects) its plan holds no sort, whose cost would grow with the backlog. The plan is the one
/// the server ran for the inbox's own statement, logged by `auto_explain`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_take_reads_its_index_and_never_sorts_the_backlog() {
    let server = shared_server();
    let url = tokio::task::block_in_place(|| server.url());
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .after_connect(|conn, _| {
            Box::pin(async move {
                let explain = "LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0;";
                sqlx::raw_sql(explain).execute(conn).await.map(drop)
            })
        })
        .connect(&url)
        .await
        .unwrap();
    let table = unique("backlog");
    let inbox = PostgresInbox::new(pool.clone()).with_table(&table).unwrap();
    inbox.migrate().await.unwrap();
    let backlog = format!(
        "INSERT INTO {table} (key, state, body, object, position, correlation_id, attempts,
            next_at, enqueued_at)
         SELECT 'ti:' || lpad(i::text, 16, '0'), 'queued', '\\x7b7d',
            CASE WHEN i % 2 = 0 THEN 'to:' || lpad((i % 100)::text, 16, '0') END,
            decode(lpad(to_hex(i), 32, '0'), 'hex'), 'c', 0, i, i
         FROM generate_series(1, 20000) AS i;
         ANALYZE {table};"
    );
    sqlx::raw_sql(AssertSqlSafe(backlog))
        .execute(&pool)
        .await
        .unwrap();

    let taken = inbox.take(32, LONG).await.unwrap();
    assert_eq!(taken.len(), 32);
    let objects: HashSet<String> = (taken.iter().filter_map(|l| l.entry.order.as_ref()))
        .map(|order| order.object.as_str().to_owned())
        .collect();
    assert_eq!(objects.len(), 16, "one entry per object");

    let log = tokio::task::block_in_place(|| server.log());
    let start = log
        .rfind(&format!(
            "Query Text: WITH chosen AS MATERIALIZED (\n\t    SELECT e.key FROM {table} AS e"
        ))
        .unwrap_or_else(|| {
            panic!(
                "no plan of the take logged: {}",
                &log[log.len().saturating_sub(4000)..]
            )
        });
    let plan = &log[start..];
    let plan = &plan[..plan.find("LOG:").unwrap_or(plan.len())];
    assert!(plan.contains(&format!("{table}_take_idx")), "{plan}");
    assert!(!plan.contains("Sort"), "the take sorts: {plan}");
    assert!(!plan.contains(&format!("Seq Scan on {table} ")), "{plan}");
}

/// A `migrate()` of what exists already says nothing at info: PostgreSQL's "relation ...
/// already exists, skipping" notices (which sqlx logs, one per statement) are not asked for.
#[tokio::test(flavor = "current_thread")]
async fn a_second_migrate_logs_no_notices() {
    let url = shared_server().url();
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .unwrap();
    let inbox = PostgresInbox::new(pool)
        .with_table(&unique("notices"))
        .unwrap();
    inbox.migrate().await.unwrap();
    let (migrated, logged) = crate::logs::logged(inbox.migrate()).await;
    migrated.unwrap();
    assert!(!logged.contains("already exists"), "{logged}");
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
