//! [`OnceLayer`] around a plain `tower::Service<Req>`, on the memory store and (features
//! `redis`, `sqlite`, `postgres`) on a real `redis-server`, on SQLite (a file per test) and on
//! a real PostgreSQL (a table per test): concurrent calls with one key call the inner service
//! once, an `Err` frees the key, a repeat replays the exact recorded response, a key reused
//! with another request fingerprint is a mismatch, a request without a key is rejected or
//! passed through, and the instance `poll_ready` made ready is
//! the one called.

use std::future::Ready;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tower::util::ServiceFn;
use tower::{BoxError, Layer, Service, ServiceExt, service_fn};
use tower_idempotency::once::{Once, OnceLayer};
use tower_idempotency::{IdempotencyStore, Idempotent, MemoryStore, MissingKey, OnceError};

/// Instantiates the layer suite for one backend: `$make` yields `(store, guard)`.
macro_rules! once_layer_suite {
    ($make:expr) => {
        once_layer_suite!(@tests $make;
            concurrent_calls_call_the_inner_service_once,
            err_releases_the_key,
            repeat_replays_the_exact_response,
            reused_key_with_another_request_is_a_mismatch,
            missing_key_is_rejected,
            missing_key_passes_through,
            the_ready_instance_is_the_one_called,
        );
    };
    (@tests $make:expr; $($name:ident),* $(,)?) => {
        tower_idempotency::suite_cases!(crate::once_layer; $make; $($name),*);
    };
}

/// The service the layer wraps is reachable: borrowed, changed in place, and given back.
#[test]
fn the_inner_service_is_borrowed_changed_and_given_back() {
    let mut once = layer(MemoryStore::new(), "inner").layer(String::from("inner"));
    assert_eq!(once.get_ref(), "inner");
    once.get_mut().push_str(" changed");
    assert_eq!(once.into_inner(), "inner changed");
}

/// A job the services under test run: the key, and what it should answer.
#[derive(Clone, Debug)]
struct Job {
    id: Option<String>,
    amount: u64,
}

impl Job {
    fn keyed(id: &str, amount: u64) -> Self {
        Job {
            id: Some(id.to_owned()),
            amount,
        }
    }

    fn unkeyed(amount: u64) -> Self {
        Job { id: None, amount }
    }
}

/// A response with enough shapes in it to show the replay is the recorded value, not a
/// default or a re-run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Receipt {
    amount: u64,
    note: String,
    lines: Vec<(String, i64)>,
    refund: Option<f64>,
}

fn receipt(amount: u64) -> Receipt {
    Receipt {
        amount,
        note: format!("paid {amount} \u{e9}\"\n"),
        lines: vec![("fee".into(), -3), ("net".into(), amount as i64 - 3)],
        refund: Some(0.25),
    }
}

fn key_of(job: &Job) -> Option<String> {
    job.id.clone()
}

/// The layer over `store`, in its own namespace.
fn layer<St: IdempotencyStore>(
    store: St,
    namespace: &str,
) -> OnceLayer<fn(&Job) -> Option<String>> {
    OnceLayer::new(Idempotent::new(store).namespace(namespace), key_of)
}

/// What the inner services under test answer, at once.
type Answer = Ready<Result<Receipt, BoxError>>;

/// An inner service that counts its calls, and answers its `n`-th (from 0) with
/// `answer(n, job)`.
fn counted(
    answer: impl Fn(usize, Job) -> Result<Receipt, BoxError> + Clone,
) -> (
    Arc<AtomicUsize>,
    ServiceFn<impl FnMut(Job) -> Answer + Clone>,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let inner = service_fn(move |job: Job| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        std::future::ready(answer(n, job))
    });
    (calls, inner)
}

/// What `service` answers `job` once it is ready.
async fn call<S: Service<Job, Error: std::fmt::Debug>>(
    service: &mut S,
    job: Job,
) -> Result<S::Response, S::Error> {
    service.ready().await.unwrap().call(job).await
}

/// Polls `done` until it holds, for at most 10 s.
async fn eventually(mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "not reached within 10 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Sixteen tasks with one key: the inner service is called once, every other call is in
/// flight or gets its response.
async fn concurrent_calls_call_the_inner_service_once<St: IdempotencyStore>(store: St) {
    let calls = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Notify::new());
    let inner = {
        let (calls, gate) = (calls.clone(), gate.clone());
        service_fn(move |job: Job| {
            let (calls, gate) = (calls.clone(), gate.clone());
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                gate.notified().await;
                Ok::<_, BoxError>(receipt(job.amount))
            }
        })
    };
    let service = layer(store, "concurrent").layer(inner);
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let service = service.clone();
        tasks.push(tokio::spawn(service.oneshot(Job::keyed("k", 7))));
    }
    eventually(|| calls.load(Ordering::SeqCst) == 1).await;
    gate.notify_one();
    let mut answered = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(got) => {
                assert_eq!(got, receipt(7));
                answered += 1;
            }
            Err(OnceError::InFlight) => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    assert!(answered >= 1);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let again = service.oneshot(Job::keyed("k", 0)).await.unwrap();
    assert_eq!(again, receipt(7));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// An inner `Err` is `OnceError::Failed` and records nothing: the next call runs, and its
/// response is the one replayed after.
async fn err_releases_the_key<St: IdempotencyStore>(store: St) {
    let (calls, inner) = counted(|n, job| match n {
        0 => Err("down".into()),
        _ => Ok(receipt(job.amount)),
    });
    let mut service = layer(store, "err").layer(inner);
    let failed = call(&mut service, Job::keyed("k", 1)).await;
    assert!(matches!(failed, Err(OnceError::Failed(ref e)) if e.to_string() == "down"));
    let ran = call(&mut service, Job::keyed("k", 2)).await;
    assert_eq!(ran.unwrap(), receipt(2));
    let replayed = call(&mut service, Job::keyed("k", 3)).await;
    assert_eq!(replayed.unwrap(), receipt(2));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A repeat, through another service instance built from another layer on the same store,
/// gets the exact recorded response; other keys are not affected.
async fn repeat_replays_the_exact_response<St: IdempotencyStore + Clone>(store: St) {
    let (calls, inner) = counted(|_, job| Ok(receipt(job.amount)));
    let first = layer(store.clone(), "replay").layer(inner.clone());
    let second = layer(store, "replay").layer(inner);
    let recorded = first.oneshot(Job::keyed("k", 42)).await.unwrap();
    assert_eq!(recorded, receipt(42));
    let replayed = second.clone().oneshot(Job::keyed("k", 9)).await.unwrap();
    assert_eq!(replayed, recorded);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let other = second.oneshot(Job::keyed("k2", 9)).await.unwrap();
    assert_eq!(other, receipt(9));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// With a fingerprint of the amount, a key reused with another amount is a mismatch and the
/// inner service is not called; the same request again replays.
async fn reused_key_with_another_request_is_a_mismatch<St: IdempotencyStore>(store: St) {
    let (calls, inner) = counted(|_, job| Ok(receipt(job.amount)));
    let service = layer(store, "mismatch")
        .fingerprint(|job: &Job| job.amount)
        .layer(inner);
    for (amount, expected) in [(500, Some(500)), (900, None), (500, Some(500))] {
        let got = service.clone().oneshot(Job::keyed("k", amount)).await;
        match (got, expected) {
            (Ok(got), Some(expected)) => assert_eq!(got, receipt(expected)),
            (Err(OnceError::Mismatch), None) => {}
            (got, _) => panic!("{amount}: unexpected {got:?}"),
        }
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// By default a request without a key is `OnceError::MissingKey` and the inner service is
/// not called.
async fn missing_key_is_rejected<St: IdempotencyStore>(store: St) {
    let (calls, inner) = counted(|_, job| Ok(receipt(job.amount)));
    let service = layer(store, "missing").layer(inner);
    let answer = service.oneshot(Job::unkeyed(1)).await;
    assert!(matches!(answer, Err(OnceError::MissingKey)), "{answer:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// With `MissingKey::PassThrough`, a request without a key calls the inner service every
/// time, and nothing is recorded (its error is still `Failed`).
async fn missing_key_passes_through<St: IdempotencyStore>(store: St) {
    let (calls, inner) = counted(|n, job| match n {
        2 => Err("down".into()),
        _ => Ok(receipt(job.amount + n as u64)),
    });
    let layer = layer(store, "pass").missing_key(MissingKey::PassThrough);
    let mut service = layer.layer(inner);
    for n in 0..2 {
        let answer = call(&mut service, Job::unkeyed(10)).await;
        assert_eq!(answer.unwrap(), receipt(10 + n));
    }
    let failed = call(&mut service, Job::unkeyed(10)).await;
    assert!(matches!(failed, Err(OnceError::Failed(_))), "{failed:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// `tower_test::mock` panics when an unready clone is called: the layer calls the instance
/// `poll_ready` made ready (clone-and-swap), and a replay does not call it at all.
async fn the_ready_instance_is_the_one_called<St: IdempotencyStore>(store: St) {
    let (mock, mut handle) = tower_test::mock::pair::<Job, Receipt>();
    let mut service: Once<_, _> = layer(store, "ready").layer(mock);
    handle.allow(1);
    let call = service.ready().await.unwrap().call(Job::keyed("k", 5));
    let mut answer = tokio::spawn(call);
    // Calling an unready clone panics in the task: its end, not the request, comes first.
    tokio::select! {
        request = handle.next_request() => {
            let (job, respond) = request.unwrap();
            respond.send_response(receipt(job.amount));
        }
        ended = &mut answer => panic!("ended before calling the inner service: {ended:?}"),
    }
    assert_eq!(answer.await.unwrap().unwrap(), receipt(5));
    // The repeat: ready again (one more call allowed), answered from the record; were the
    // mock called, its request would come before the answer (which would then never come).
    handle.allow(1);
    let replay = service.ready().await.unwrap().call(Job::keyed("k", 6));
    tokio::select! {
        replayed = replay => assert_eq!(replayed.unwrap(), receipt(5)),
        _ = handle.next_request() => panic!("the inner service was called on a replay"),
    }
}

mod on_memory {
    use super::MemoryStore;

    once_layer_suite!(async { (MemoryStore::new(), ()) });
}

#[cfg(feature = "redis")]
use crate::redis_server;

#[cfg(feature = "redis")]
mod on_redis {
    use tower_idempotency::RedisStore;

    use super::redis_server::RedisServer;

    once_layer_suite!(async {
        let server = RedisServer::start();
        let store = RedisStore::new(server.connect().await);
        (store, server)
    });
}

#[cfg(feature = "sqlite")]
mod on_sqlite {
    // A file of its own per test (see `sqlite.rs`).
    once_layer_suite!(crate::sqlite::fresh());
}

#[cfg(feature = "postgres")]
mod on_postgres {
    // A table of its own per test, on the binary's shared server (see `postgres.rs`).
    once_layer_suite!(async { (crate::postgres::fresh_table_store().await, ()) });
}
