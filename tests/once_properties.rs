//! A property of [`Idempotent::once`]: N keys, each called several times from several tasks,
//! some failing first, on two instances sharing one store: every key's closure succeeds
//! exactly once, and every caller gets that one output.

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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    #[test]
    fn every_key_succeeds_exactly_once(fail_first in prop::collection::vec(0usize..3, 1..6), callers in 2usize..5) {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        runtime.block_on(async {
            let store = MemoryStore::new();
            let instances = [Idempotent::new(store.clone()), Idempotent::new(store)];
            let tries = Arc::new((0..fail_first.len()).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
            let wins = Arc::new((0..fail_first.len()).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
            let mut tasks = Vec::new();
            for (key, fails) in fail_first.iter().enumerate() {
                for caller in 0..callers {
                    let jobs = instances[caller % 2].clone();
                    tasks.push((key, tokio::spawn(until_done(jobs, key, tries.clone(), wins.clone(), *fails))));
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
        });
    }
}
