//! The behaviour of [`Idempotent::once`] on one store, instantiated per backend with
//! [`once_suite!`](crate::once_suite): every test takes a fresh store.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::store::StoreKey;
use tower_idempotency::test_util::store::OneTarget;
use tower_idempotency::test_util::values;
use tower_idempotency::{IdempotencyStore, Idempotent, OnceError};

#[cfg(any(feature = "postgres", feature = "sqlite"))]
#[macro_use]
pub mod tx;

/// Instantiates the `once` suite for one backend: `$make` yields `(store, guard)`.
#[macro_export]
macro_rules! once_suite {
    ($make:expr) => {
        $crate::once_suite!(@tests $make;
            concurrent_calls_run_the_closure_once,
            err_releases_the_key,
            panic_releases_the_key,
            slow_closure_keeps_its_claim,
            crashed_owner_frees_the_key_after_a_lease,
            a_recorded_output_is_forgotten_after_its_retention,
            repeat_replays_the_exact_output,
            reused_key_with_another_payload_is_a_mismatch,
            waiting_repeat_gets_the_recorded_output,
        );
    };
    (@tests $make:expr; $($name:ident),* $(,)?) => {
        mod once_suite {
            use super::*;
            tower_idempotency::suite_cases!($crate::once; $make; $($name),*);
        }
    };
}

/// Polls `done` until it holds, for at most 10 s.
async fn eventually(mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "not reached within 10 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Sixteen tasks with one key: one closure runs, every other call is in flight or replays.
pub async fn concurrent_calls_run_the_closure_once<St: IdempotencyStore>(store: St) {
    let jobs = Idempotent::new(store).namespace("c");
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Notify::new());
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (jobs, runs, gate) = (jobs.clone(), runs.clone(), gate.clone());
        tasks.push(tokio::spawn(async move {
            jobs.once("k", || async {
                runs.fetch_add(1, Ordering::SeqCst);
                gate.notified().await;
                Ok::<_, ()>(7u32)
            })
            .await
        }));
    }
    eventually(|| runs.load(Ordering::SeqCst) == 1).await;
    gate.notify_one();
    for task in tasks {
        match task.await.unwrap() {
            Ok(7) | Err(OnceError::InFlight) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let again = jobs.once("k", || async { Ok::<u32, ()>(0) }).await;
    assert_eq!(again.unwrap(), 7);
}

/// An `Err` records nothing and frees the key at once.
pub async fn err_releases_the_key<St: IdempotencyStore>(store: St) {
    let jobs = Idempotent::new(store);
    let failed = jobs.once("k", || async { Err::<u8, _>("no") }).await;
    assert!(matches!(failed, Err(OnceError::Failed("no"))));
    let again = jobs.once("k", || async { Ok::<u8, ()>(2) }).await;
    assert_eq!(again.unwrap(), 2);
}

/// A panicking closure releases the key (in the background): the next call runs.
pub async fn panic_releases_the_key<St: IdempotencyStore>(store: St) {
    let jobs = Idempotent::new(store).lease(Duration::from_secs(60));
    let panicking = jobs.clone();
    let panicked = tokio::spawn(async move {
        panicking
            .once("k", || async {
                if true {
                    panic!("boom");
                }
                Ok::<u8, ()>(0)
            })
            .await
    });
    assert!(panicked.await.unwrap_err().is_panic());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match jobs.once("k", || async { Ok::<u8, ()>(3) }).await {
            Ok(3) => return,
            Err(OnceError::InFlight) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// A closure that outlives three leases keeps its claim: a repeat meanwhile is in flight.
pub async fn slow_closure_keeps_its_claim<St: IdempotencyStore>(store: St) {
    let lease = Duration::from_millis(600);
    let jobs = Idempotent::new(store).lease(lease);
    let slow = jobs.clone();
    let running = tokio::spawn(async move {
        slow.once("k", || async move {
            tokio::time::sleep(lease * 3).await;
            Ok::<u8, ()>(1)
        })
        .await
    });
    tokio::time::sleep(lease * 2).await;
    let repeat = jobs.once("k", || async { Ok::<u8, ()>(9) }).await;
    assert!(matches!(repeat, Err(OnceError::InFlight)), "{repeat:?}");
    assert_eq!(running.await.unwrap().unwrap(), 1);
}

/// A claim that nobody renews (an owner that crashed after its reserve) is free again after
/// about one lease.
pub async fn crashed_owner_frees_the_key_after_a_lease<St: IdempotencyStore>(store: St) {
    let lease = Duration::from_millis(500);
    let key = StoreKey::new("crash", None, "k");
    store
        .reserve_one(&key, &values::claim(Fingerprint::NONE), lease)
        .await
        .unwrap();
    let jobs = Idempotent::new(store).namespace("crash").lease(lease);
    let early = jobs.once("k", || async { Ok::<u8, ()>(1) }).await;
    assert!(matches!(early, Err(OnceError::InFlight)), "{early:?}");
    tokio::time::sleep(lease + Duration::from_millis(300)).await;
    let late = jobs.once("k", || async { Ok::<u8, ()>(1) }).await;
    assert_eq!(late.unwrap(), 1);
}

/// A recorded output is replayed within the retention, and forgotten after it: the closure
/// runs again.
pub async fn a_recorded_output_is_forgotten_after_its_retention<St: IdempotencyStore>(store: St) {
    let retention = Duration::from_millis(1000);
    let jobs = Idempotent::new(store)
        .namespace("retention")
        .retention(retention);
    let runs = AtomicUsize::new(0);
    let run = || async { Ok::<_, ()>(runs.fetch_add(1, Ordering::SeqCst) + 1) };
    assert_eq!(jobs.once("k", run).await.unwrap(), 1);
    assert_eq!(jobs.once("k", run).await.unwrap(), 1, "replayed");
    tokio::time::sleep(retention + Duration::from_millis(300)).await;
    assert_eq!(jobs.once("k", run).await.unwrap(), 2, "ran again");
}

/// A repeat gets the recorded output back, field for field, without running.
pub async fn repeat_replays_the_exact_output<St: IdempotencyStore>(store: St) {
    type Output = (String, Vec<u64>, Option<bool>);
    let jobs = Idempotent::new(store);
    let first: Output = ("refund ✓".into(), vec![u64::MAX, 0], Some(false));
    let expected = first.clone();
    let got = jobs.once("k", || async { Ok::<_, ()>(first) }).await;
    assert_eq!(got.unwrap(), expected);
    let ran = AtomicUsize::new(0);
    let again: Output = jobs
        .once("k", || async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ()>(Default::default())
        })
        .await
        .unwrap();
    assert_eq!(again, expected);
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

/// A key reused with another payload is a mismatch; the same payload replays.
pub async fn reused_key_with_another_payload_is_a_mismatch<St: IdempotencyStore>(store: St) {
    let jobs = Idempotent::new(store);
    for (cents, expected) in [(500u64, Some(500)), (900, None), (500, Some(500))] {
        let got = jobs
            .once_with("k", &cents, || async { Ok::<_, ()>(cents) })
            .await;
        match (got, expected) {
            (Ok(got), Some(expected)) => assert_eq!(got, expected),
            (Err(OnceError::Mismatch), None) => {}
            (got, _) => panic!("{cents}: unexpected {got:?}"),
        }
    }
}

/// With a bounded wait, a repeat of a running call gets its output once it is recorded.
pub async fn waiting_repeat_gets_the_recorded_output<St: IdempotencyStore>(store: St) {
    let jobs = Idempotent::new(store).wait_in_flight(Duration::from_secs(10));
    let started = Arc::new(tokio::sync::Notify::new());
    let (first, signal) = (jobs.clone(), started.clone());
    let running = tokio::spawn(async move {
        first
            .once("k", || async move {
                signal.notify_one();
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok::<u8, ()>(5)
            })
            .await
    });
    started.notified().await;
    let waited = jobs.once("k", || async { Ok::<u8, ()>(0) }).await;
    assert_eq!(waited.unwrap(), 5);
    assert_eq!(running.await.unwrap().unwrap(), 5);
}
