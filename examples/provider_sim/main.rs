//! A webhook provider simulator: at-least-once delivery with injected faults against two app
//! instances sharing one real `redis-server`; checks that every event takes effect exactly
//! once, and prints the figures.
//!
//! ```text
//! cargo run --release --all-features --example provider_sim -- --events 10000
//! cargo run --all-features --example provider_sim -- --events 2000 --seed 7 --no-persistence
//! ```
//!
//! Needs `redis-server` (7.0 or later) on `PATH`, or `REDIS_SERVER_BIN`. Options:
//!
//! - `--events N` (default 10000): unique events;
//! - `--seed S`: seed of the delivery and fault choices;
//! - `--concurrency N` (default 128): events in progress at once;
//! - `--lease-ms N` (default 250), `--minute-ms N` (default 2: one Kalipto backoff minute);
//! - `--outage-ms N` (default 300), `--no-redis-kill`;
//! - `--complete-delay-ms N`: delay every completion by N ms before it reaches Redis, like a
//!   store whose calls start on a later poll (shows what a cancelled request does to them);
//! - `--no-persistence`: Redis without AOF; its restart then forgets every record, and the
//!   duplicates delivered after it are processed again (their own row of the table: the
//!   store's durability is part of the guarantee).
//!
//! Exits with status 1 when an invariant is broken. The core lives in
//! `examples/provider_sim/sim.rs` (with the `redis-server` it starts in `redis_server.rs`), which
//! `tests/processes/faults.rs` and the Redis tests include too.

#[cfg(feature = "redis")]
#[path = "sim.rs"]
mod provider_sim;

#[cfg(feature = "redis")]
#[tokio::main(flavor = "multi_thread")]
async fn main() {
    use std::time::Duration;

    let mut config = provider_sim::SimConfig::new(10_000);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> u64 {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| usage(&format!("{name} needs a number")))
        };
        match arg.as_str() {
            "--events" => config.events = number("--events") as usize,
            "--seed" => config.seed = number("--seed"),
            "--concurrency" => config.concurrency = number("--concurrency").max(1) as usize,
            "--lease-ms" => config.lease = Duration::from_millis(number("--lease-ms")),
            "--minute-ms" => config.minute = Duration::from_millis(number("--minute-ms")),
            "--outage-ms" => config.redis_outage = Duration::from_millis(number("--outage-ms")),
            "--no-redis-kill" => config.redis_kill_at = None,
            "--no-persistence" => config.persistence = false,
            "--complete-delay-ms" => {
                config.complete_delay = Duration::from_millis(number("--complete-delay-ms"))
            }
            "-h" | "--help" => usage(""),
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    let report = provider_sim::run(config).await;
    println!("{}", report.table());
    match report.check() {
        Ok(()) => println!("invariants hold: no event lost, no unexplained double effect"),
        Err(problems) => {
            eprintln!("INVARIANT BROKEN: {problems}");
            std::process::exit(1);
        }
    }
}

#[cfg(feature = "redis")]
fn usage(problem: &str) -> ! {
    if !problem.is_empty() {
        eprintln!("provider_sim: {problem}");
    }
    eprintln!(
        "usage: provider_sim [--events N] [--seed S] [--concurrency N] [--lease-ms N] \
         [--minute-ms N] [--outage-ms N] [--no-redis-kill] [--no-persistence] \
         [--complete-delay-ms N]"
    );
    std::process::exit(2);
}

#[cfg(not(feature = "redis"))]
fn main() {
    eprintln!("provider_sim needs the `redis` feature (`--all-features` or `--features redis`)");
    std::process::exit(2);
}
