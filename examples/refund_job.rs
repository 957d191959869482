//! A background refund job that a scheduler runs twice at once, and once more after a crash:
//! the refund is paid once, and every run gets the same refund id back.
//!
//! `cargo run --example refund_job`

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tower_idempotency::{Idempotent, MemoryStore, OnceError};

/// The payment provider's refund call: counts what it pays.
async fn pay_refund(paid: &AtomicU32, order: &str) -> Result<String, std::io::Error> {
    tokio::time::sleep(Duration::from_millis(200)).await;
    let n = paid.fetch_add(1, Ordering::SeqCst) + 1;
    Ok(format!("re_{order}_{n}"))
}

/// One run of the job, as the scheduler starts it.
async fn run_job(jobs: &Idempotent, paid: &AtomicU32, run: &str) {
    let outcome = jobs.once("order-7", || pay_refund(paid, "order-7")).await;
    match outcome {
        Ok(refund) => println!("{run}: refund {refund}"),
        Err(OnceError::InFlight) => println!("{run}: another run is refunding; skipped"),
        Err(err) => println!("{run}: failed: {err}"),
    }
}

#[tokio::main]
async fn main() {
    let paid = Arc::new(AtomicU32::new(0));
    let lease = Duration::from_millis(500);
    let jobs = Idempotent::new(MemoryStore::new())
        .namespace("refunds")
        .lease(lease);

    // A run that "crashes" mid-refund: its future is dropped before the refund is paid (a
    // killed worker leaves its claim to expire with the lease; a dropped one releases it).
    let crashing = jobs.clone();
    let slow_paid = paid.clone();
    let crashed = tokio::spawn(async move {
        crashing
            .once("order-7", || async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                pay_refund(&slow_paid, "order-7").await
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    crashed.abort();
    let _ = crashed.await;
    tokio::time::sleep(Duration::from_millis(50)).await;

    // The scheduler fires twice at once: one pays, the other is told a run is in flight.
    tokio::join!(
        run_job(&jobs, &paid, "run 1"),
        run_job(&jobs, &paid, "run 2")
    );
    // A run after both: the recorded refund id, nothing paid again.
    run_job(&jobs, &paid, "run 3").await;
    println!("refunds paid: {}", paid.load(Ordering::SeqCst));
    assert_eq!(paid.load(Ordering::SeqCst), 1);
}
