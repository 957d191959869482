//! A property of [`Idempotent::once`]: N keys, each called several times from several tasks,
//! some failing first, on two instances sharing one store: every key's closure succeeds
//! exactly once, and every caller gets that one output. On the memory store (the two
//! instances share it by clone) and, with the features `redis`, `sqlite` and `postgres`, on a
//! real `redis-server`, one SQLite file and a real PostgreSQL (each instance with a client or
//! pool of its own, behind its own local cache).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tower_idempotency::{Idempotent, MemoryStore, OnceError};

/// Calls `once` on `key` until it answers an output (a failure or a call in flight: again).
async fn until_done(
    jobs: Idempotent,
    key: usize,
    tries: Arc<Vec<AtomicUsize>>,
    wins: Arc<Vec<AtomicUsize>>,
    fail_first: usize,
) -> usize {
    loop {
        let attempt = || async {
            let n = tries[key].fetch_add(1, Ordering::SeqCst);
            tokio::task::yield_now().await;
            if n < fail_first {
                return Err("failing first");
            }
            wins[key].fetch_add(1, Ordering::SeqCst);
            Ok(n)
        };
        match jobs.once(&format!("key-{key}"), attempt).await {
            Ok(output) => return output,
            Err(OnceError::Failed(_) | OnceError::InFlight) => {
                tokio::time::sleep(Duration::from_millis(1)).await
            }
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
}

/// The cases: how many times each key fails first (one entry per key), and how many callers
/// each key has.
fn cases() -> impl Strategy<Value = (Vec<usize>, usize)> {
    (prop::collection::vec(0usize..3, 1..6), 2usize..5)
}

/// Every key called by `callers` tasks, alternating between the two `instances`: each key's
/// closure succeeds once, and every caller of a key gets the same output.
async fn every_key_once(instances: [Idempotent; 2], fail_first: &[usize], callers: usize) {
    let tries = Arc::new(
        (0..fail_first.len())
            .map(|_| AtomicUsize::new(0))
            .collect::<Vec<_>>(),
    );
    let wins = Arc::new(
        (0..fail_first.len())
            .map(|_| AtomicUsize::new(0))
            .collect::<Vec<_>>(),
    );
    let mut tasks = Vec::new();
    for (key, fails) in fail_first.iter().enumerate() {
        for caller in 0..callers {
            let jobs = instances[caller % 2].clone();
            let task = until_done(jobs, key, tries.clone(), wins.clone(), *fails);
            tasks.push((key, tokio::spawn(task)));
        }
    }
    let mut outputs = vec![None; fail_first.len()];
    for (key, task) in tasks {
        let output = task.await.unwrap();
        assert_eq!(*outputs[key].get_or_insert(output), output, "key {key}");
    }
    for (key, win) in wins.iter().enumerate() {
        assert_eq!(win.load(Ordering::SeqCst), 1, "key {key}");
    }
    // The output is the try that succeeded: after the failures.
    for (key, output) in outputs.into_iter().enumerate() {
        assert!(output.unwrap() >= fail_first[key], "key {key}");
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// On the memory store: the two instances share a fresh store (by clone) per case.
#[test]
fn every_key_succeeds_exactly_once() {
    every_case_on(&runtime(), |_| {
        let store = MemoryStore::new();
        [Idempotent::new(store.clone()), Idempotent::new(store)]
    });
}

#[cfg(feature = "redis")]
use crate::redis_server;

/// The same property on one real `redis-server` for all cases (a namespace per case), with
/// two clients: what two processes sharing a Redis see.
#[cfg(feature = "redis")]
#[test]
fn every_key_succeeds_exactly_once_on_redis() {
    use tower_idempotency::RedisStore;

    let runtime = runtime();
    let server = redis_server::RedisServer::start();
    let clients = runtime.block_on(async { [server.connect().await, server.connect().await] });
    every_case_on(&runtime, |namespace| {
        clients
            .clone()
            .map(|client| Idempotent::new(RedisStore::new(client)).namespace(namespace))
    });
}

/// Runs the property for 16 cases, each in a namespace of its own, on the two instances
/// `instances(namespace)` builds.
fn every_case_on(runtime: &tokio::runtime::Runtime, instances: impl Fn(&str) -> [Idempotent; 2]) {
    use proptest::test_runner::{Config, TestRunner};

    let case = AtomicUsize::new(0);
    let mut runner = TestRunner::new(Config::with_cases(16));
    let outcome = runner.run(&cases(), |(fail_first, callers)| {
        let namespace = format!("case-{}", case.fetch_add(1, Ordering::SeqCst));
        runtime.block_on(every_key_once(instances(&namespace), &fail_first, callers));
        Ok(())
    });
    if let Err(err) = outcome {
        panic!("{err}");
    }
}

/// The same property on one SQLite file opened twice (two pools: what two processes sharing
/// the file see).
#[cfg(feature = "sqlite")]
#[test]
fn every_key_succeeds_exactly_once_on_sqlite() {
    use tower_idempotency::SqliteStore;

    let runtime = runtime();
    let dir = std::env::temp_dir().join(format!("tower-idem-once-prop-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("once.db");
    let stores = runtime.block_on(async {
        let first = SqliteStore::open(&path).await.unwrap();
        [first, SqliteStore::open(&path).await.unwrap()]
    });
    every_case_on(&runtime, |namespace| {
        stores
            .clone()
            .map(|store| Idempotent::new(store).namespace(namespace))
    });
    drop(stores);
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "postgres")]
use crate::postgres_server;

/// The same property on one real PostgreSQL server, with two pools (two processes), in a
/// table of this test's own.
#[cfg(feature = "postgres")]
#[test]
fn every_key_succeeds_exactly_once_on_postgres() {
    use tower_idempotency::PostgresStore;

    let runtime = runtime();
    let server = postgres_server::PostgresServer::new();
    let url = server.url();
    let stores = runtime.block_on(async {
        let mut stores = Vec::new();
        for _ in 0..2 {
            let pool = sqlx::PgPool::connect(&url).await.unwrap();
            stores.push(PostgresStore::new(pool).with_table("once_prop").unwrap());
        }
        stores[0].migrate().await.unwrap();
        [stores[0].clone(), stores[1].clone()]
    });
    every_case_on(&runtime, |namespace| {
        stores
            .clone()
            .map(|store| Idempotent::new(store).namespace(namespace))
    });
}
