//! [`Idempotent::once_in_tx`] on one SQL store, instantiated per backend with
//! [`once_tx_suite!`](crate::once_tx_suite): the effect (a row in a table of effects, written
//! in the closure's transaction) and the record commit together or not at all. Every test
//! takes a fresh store in a table of its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use sqlx::{AssertSqlSafe, Transaction};
use tower_idempotency::store::sql::{Dialect, SqlStore};
use tower_idempotency::{Idempotent, OnceError};

/// Instantiates the transaction suite for one backend: `$make` yields `(store, guard)`, a
/// migrated store in a table no other test uses; `$db` is its database.
#[macro_export]
macro_rules! once_tx_suite {
    ($db:ty, $make:expr) => {
        $crate::once_tx_suite!(@tests $db, $make;
            effect_and_record_commit_together,
            err_rolls_back_the_effect_and_frees_the_key,
            panic_rolls_back_the_effect_and_frees_the_key,
            concurrent_call_does_not_run_while_the_first_holds_the_key,
            repeat_after_commit_replays_without_running,
            slow_closure_keeps_its_claim_in_its_transaction,
            another_store_never_records_and_rolls_back,
            reused_key_with_another_payload_is_a_mismatch,
            claim_lost_before_the_record_rolls_back_the_effect,
        );
    };
    (@tests $db:ty, $make:expr; $($name:ident),* $(,)?) => {
        mod once_tx_suite {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let (store, _guard) = $make.await;
                    once::tx::$name::<$db>(store).await;
                }
            )*
        }
    };
}

/// The effects table of a test: one row per effect applied, with the key it was applied for.
pub trait Effects: Dialect + Sized {
    /// Creates the table `<store's table>_effects`.
    fn create(store: &SqlStore<Self>) -> BoxFuture<'_, ()>;
    /// Applies the effect of `key` in `tx`.
    fn apply<'t>(
        tx: &'t mut Transaction<'static, Self>,
        table: &'t str,
        key: &'t str,
    ) -> BoxFuture<'t, Result<(), sqlx::Error>>;
    /// How many effects of `key` are committed.
    fn count<'a>(store: &'a SqlStore<Self>, key: &'a str) -> BoxFuture<'a, i64>;
    /// Deletes every claim and record of the store's table.
    fn delete_claims(store: &SqlStore<Self>) -> BoxFuture<'_, ()>;
}

/// The same text for both databases (both take `$1` parameters); only the types differ.
macro_rules! effects_on {
    ($db:ty) => {
        impl Effects for $db {
            fn create(store: &SqlStore<Self>) -> BoxFuture<'_, ()> {
                let sql = format!(
                    "CREATE TABLE IF NOT EXISTS {} (key TEXT NOT NULL)",
                    effects(store)
                );
                Box::pin(async move {
                    sqlx::query(AssertSqlSafe(sql))
                        .execute(store.pool())
                        .await
                        .unwrap();
                })
            }

            fn apply<'t>(
                tx: &'t mut Transaction<'static, Self>,
                table: &'t str,
                key: &'t str,
            ) -> BoxFuture<'t, Result<(), sqlx::Error>> {
                let sql = format!("INSERT INTO {table} (key) VALUES ($1)");
                Box::pin(async move {
                    sqlx::query(AssertSqlSafe(sql))
                        .bind(key)
                        .execute(&mut **tx)
                        .await
                        .map(drop)
                })
            }

            fn delete_claims(store: &SqlStore<Self>) -> BoxFuture<'_, ()> {
                let sql = format!("DELETE FROM {}", store.table());
                Box::pin(async move {
                    sqlx::query(AssertSqlSafe(sql))
                        .execute(store.pool())
                        .await
                        .unwrap();
                })
            }

            fn count<'a>(store: &'a SqlStore<Self>, key: &'a str) -> BoxFuture<'a, i64> {
                let sql = format!("SELECT count(*) FROM {} WHERE key = $1", effects(store));
                Box::pin(async move {
                    sqlx::query_scalar(AssertSqlSafe(sql))
                        .bind(key)
                        .fetch_one(store.pool())
                        .await
                        .unwrap()
                })
            }
        }
    };
}

#[cfg(feature = "postgres")]
effects_on!(sqlx::Postgres);
#[cfg(feature = "sqlite")]
effects_on!(sqlx::Sqlite);

fn effects<DB: Dialect>(store: &SqlStore<DB>) -> String {
    format!("{}_effects", store.table())
}

/// The store's `Idempotent`, and its effects table created.
async fn jobs<DB: Effects>(store: &SqlStore<DB>) -> Idempotent {
    DB::create(store).await;
    Idempotent::new(store.clone()).namespace("tx")
}

/// Applies the effect of `key` in `tx`, failing with the error's text (what the closures
/// under test answer).
async fn applied<DB: Effects>(
    tx: &mut Transaction<'static, DB>,
    table: &str,
    key: &str,
) -> Result<(), String> {
    DB::apply(tx, table, key).await.map_err(|e| e.to_string())
}

/// A `once_in_tx` on `key` whose closure applies the effect, then answers `answer`. (What
/// the closure's future holds must be owned or `'static`, as with sqlx's
/// `Connection::transaction`.)
async fn apply_once<DB: Effects>(
    jobs: &Idempotent,
    store: &SqlStore<DB>,
    key: &'static str,
    answer: Result<u64, &'static str>,
) -> Result<u64, OnceError<String>> {
    let table = effects(store);
    jobs.once_in_tx(key, store, |tx| {
        Box::pin(async move {
            applied(tx, &table, key).await?;
            answer.map_err(str::to_owned)
        })
    })
    .await
}

/// Calls `attempt` until it is no longer `InFlight` (a release in the background), for at
/// most 10 s.
async fn until_free<F, Fut>(mut attempt: F) -> Result<u64, OnceError<String>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<u64, OnceError<String>>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match attempt().await {
            Err(OnceError::InFlight) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            other => return other,
        }
    }
}

/// `Ok`: the effect is committed, and so is the record: another instance (its own local
/// cache) replays the output instead of applying the effect again.
pub async fn effect_and_record_commit_together<DB: Effects>(store: SqlStore<DB>) {
    let jobs = jobs(&store).await;
    assert_eq!(apply_once(&jobs, &store, "k", Ok(7)).await.unwrap(), 7);
    assert_eq!(DB::count(&store, "k").await, 1);
    let other = Idempotent::new(store.clone()).namespace("tx");
    assert_eq!(apply_once(&other, &store, "k", Ok(0)).await.unwrap(), 7);
    assert_eq!(DB::count(&store, "k").await, 1);
}

/// `Err` after the effect was written: the effect is rolled back with the record, and the key
/// is free at once, so the retry applies it (once).
pub async fn err_rolls_back_the_effect_and_frees_the_key<DB: Effects>(store: SqlStore<DB>) {
    let jobs = jobs(&store).await;
    let failed = apply_once(&jobs, &store, "k", Err("declined")).await;
    assert!(
        matches!(&failed, Err(OnceError::Failed(e)) if e == "declined"),
        "{failed:?}"
    );
    assert_eq!(DB::count(&store, "k").await, 0);
    assert_eq!(apply_once(&jobs, &store, "k", Ok(2)).await.unwrap(), 2);
    assert_eq!(DB::count(&store, "k").await, 1);
}

/// A panic after the effect was written: the transaction is rolled back and the key released
/// in the background; the retry applies the effect (once).
pub async fn panic_rolls_back_the_effect_and_frees_the_key<DB: Effects>(store: SqlStore<DB>) {
    let jobs = jobs(&store).await.lease(Duration::from_secs(60));
    let (panicking, on) = (jobs.clone(), store.clone());
    let panicked = tokio::spawn(async move {
        let table = effects(&on);
        panicking
            .once_in_tx("k", &on, |tx| {
                Box::pin(async move {
                    DB::apply(tx, &table, "k").await.unwrap();
                    if true {
                        panic!("boom");
                    }
                    Ok::<u64, ()>(0)
                })
            })
            .await
    });
    assert!(panicked.await.unwrap_err().is_panic());
    assert_eq!(DB::count(&store, "k").await, 0);
    let retried = until_free(|| apply_once(&jobs, &store, "k", Ok(3))).await;
    assert_eq!(retried.unwrap(), 3);
    assert_eq!(DB::count(&store, "k").await, 1);
}

/// While the first call holds the key (its closure waiting, its transaction open), a second
/// call with the key, from another instance, is in flight and does not run its closure.
pub async fn concurrent_call_does_not_run_while_the_first_holds_the_key<DB: Effects>(
    store: SqlStore<DB>,
) {
    let jobs = jobs(&store).await;
    let (started, gate) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let (first, on, signal, wait) = (jobs.clone(), store.clone(), started.clone(), gate.clone());
    let running = tokio::spawn(async move {
        let table = effects(&on);
        first
            .once_in_tx("k", &on, |tx| {
                Box::pin(async move {
                    signal.notify_one();
                    // Waits before writing: on SQLite a write would hold the database's
                    // write lock, and the second claim would wait for it instead of answering.
                    wait.notified().await;
                    applied(tx, &table, "k").await?;
                    Ok::<u64, String>(1)
                })
            })
            .await
    });
    started.notified().await;
    let second = Idempotent::new(store.clone()).namespace("tx");
    let ran = AtomicUsize::new(0);
    let repeat = second
        .once_in_tx("k", &store, |_tx| {
            ran.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok::<u64, String>(9) })
        })
        .await;
    assert!(matches!(repeat, Err(OnceError::InFlight)), "{repeat:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    gate.notify_one();
    assert_eq!(running.await.unwrap().unwrap(), 1);
    assert_eq!(DB::count(&store, "k").await, 1);
}

/// A repeat after the commit replays the recorded output, field for field, without running.
pub async fn repeat_after_commit_replays_without_running<DB: Effects>(store: SqlStore<DB>) {
    type Output = (String, Vec<i64>, Option<bool>);
    let jobs = jobs(&store).await;
    let expected: Output = ("refund ✓".into(), vec![i64::MIN, 0], Some(true));
    let (table, first) = (effects(&store), expected.clone());
    let got = jobs
        .once_in_tx("k", &store, |tx| {
            Box::pin(async move {
                applied(tx, &table, "k").await?;
                Ok::<_, String>(first)
            })
        })
        .await;
    assert_eq!(got.unwrap(), expected);
    let ran = AtomicUsize::new(0);
    let again: Output = jobs
        .once_in_tx("k", &store, |_tx| {
            ran.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok::<_, String>(Default::default()) })
        })
        .await
        .unwrap();
    assert_eq!(again, expected);
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    assert_eq!(DB::count(&store, "k").await, 1);
}

/// A closure that outlives three leases with its transaction open keeps its claim (renewed
/// on another connection): a repeat meanwhile is in flight, and the effect is applied once.
pub async fn slow_closure_keeps_its_claim_in_its_transaction<DB: Effects>(store: SqlStore<DB>) {
    let lease = Duration::from_millis(600);
    let jobs = jobs(&store).await.lease(lease);
    let (slow, on) = (jobs.clone(), store.clone());
    let running = tokio::spawn(async move {
        let table = effects(&on);
        slow.once_in_tx("k", &on, |tx| {
            Box::pin(async move {
                tokio::time::sleep(lease * 3).await;
                applied(tx, &table, "k").await?;
                Ok::<u64, String>(1)
            })
        })
        .await
    });
    tokio::time::sleep(lease * 2).await;
    let repeat = apply_once(&jobs, &store, "k", Ok(9)).await;
    assert!(matches!(repeat, Err(OnceError::InFlight)), "{repeat:?}");
    assert_eq!(running.await.unwrap().unwrap(), 1);
    assert_eq!(DB::count(&store, "k").await, 1);
}

/// `once_in_tx` given another store than the one its claim is on (another table): the
/// completion finds no claim of its own, so the transaction, effect included, is rolled back.
pub async fn another_store_never_records_and_rolls_back<DB: Effects>(store: SqlStore<DB>) {
    let jobs = jobs(&store).await;
    let other_table = format!("{}_other", store.table());
    let other = store.clone().with_table(&other_table).unwrap();
    other.migrate().await.unwrap();
    DB::create(&other).await;
    let table = effects(&other);
    let lost = jobs
        .once_in_tx("k", &other, |tx| {
            Box::pin(async move {
                applied(tx, &table, "k").await?;
                Ok::<u64, String>(1)
            })
        })
        .await;
    assert!(matches!(lost, Err(OnceError::Lost)), "{lost:?}");
    assert_eq!(DB::count(&other, "k").await, 0);
    // The claim was released: the right store applies the effect.
    assert_eq!(apply_once(&jobs, &store, "k", Ok(4)).await.unwrap(), 4);
    assert_eq!(DB::count(&store, "k").await, 1);
}

/// `once_in_tx_with`: a key reused with another payload is a mismatch and its effect is not
/// applied; the same payload replays.
pub async fn reused_key_with_another_payload_is_a_mismatch<DB: Effects>(store: SqlStore<DB>) {
    let jobs = jobs(&store).await;
    for (cents, expected) in [(500u64, Some(500)), (900, None), (500, Some(500))] {
        let table = effects(&store);
        let got = jobs
            .once_in_tx_with("k", &cents, &store, move |tx| {
                Box::pin(async move {
                    applied(tx, &table, "k").await?;
                    Ok::<_, String>(cents)
                })
            })
            .await;
        match (got, expected) {
            (Ok(got), Some(expected)) => assert_eq!(got, expected),
            (Err(OnceError::Mismatch), None) => {}
            (got, _) => panic!("{cents}: unexpected {got:?}"),
        }
    }
    assert_eq!(DB::count(&store, "k").await, 1);
}

/// The claim's row vanishes while the closure runs (what a lease taken over after it ran out
/// looks like to its first owner): the completion finds no claim of its own, so the effect is
/// rolled back with it and the call is `Lost`.
pub async fn claim_lost_before_the_record_rolls_back_the_effect<DB: Effects>(store: SqlStore<DB>) {
    let jobs = jobs(&store).await;
    let (table, on) = (effects(&store), store.clone());
    let lost = jobs
        .once_in_tx("k", &store, move |tx| {
            Box::pin(async move {
                // On another connection, before this transaction writes (SQLite's write lock).
                DB::delete_claims(&on).await;
                applied(tx, &table, "k").await?;
                Ok::<u64, String>(1)
            })
        })
        .await;
    assert!(matches!(lost, Err(OnceError::Lost)), "{lost:?}");
    assert_eq!(DB::count(&store, "k").await, 0);
}
