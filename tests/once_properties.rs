//! A property of [`Idempotent::once`]: N keys, each called several times from several tasks,
//! some failing first, on two instances sharing one store: every key's closure succeeds
//! exactly once, and every caller gets that one output. On the memory store (the two
//! instances share it by clone) and, with the feature `redis`, on a real `redis-server` (each
//! instance with a client of its own, behind its own local cache).

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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    #[test]
    fn every_key_succeeds_exactly_once((fail_first, callers) in cases()) {
        runtime().block_on(async {
            let store = MemoryStore::new();
            let instances = [Idempotent::new(store.clone()), Idempotent::new(store)];
            every_key_once(instances, &fail_first, callers).await;
        });
    }
}

#[cfg(feature = "redis")]
#[path = "../examples/provider_sim/redis_server.rs"]
mod redis_server;

/// The same property on one real `redis-server` for all cases (a namespace per case), with
/// two clients: what two processes sharing a Redis see.
#[cfg(feature = "redis")]
#[test]
fn every_key_succeeds_exactly_once_on_redis() {
    use proptest::test_runner::{Config, TestRunner};
    use tower_idempotency::RedisStore;

    let runtime = runtime();
    let server = redis_server::RedisServer::start();
    let clients = runtime.block_on(async { [server.connect().await, server.connect().await] });
    let case = AtomicUsize::new(0);
    let mut runner = TestRunner::new(Config::with_cases(16));
    let outcome = runner.run(&cases(), |(fail_first, callers)| {
        let namespace = format!("case-{}", case.fetch_add(1, Ordering::SeqCst));
        let instances = clients
            .clone()
            .map(|client| Idempotent::new(RedisStore::new(client)).namespace(&namespace));
        runtime.block_on(every_key_once(instances, &fail_first, callers));
        Ok(())
    });
    if let Err(err) = outcome {
        panic!("{err}");
    }
}
