//! The fault harness, small: the provider simulator (`examples/provider_sim/sim.rs`) sends 200
//! events at least once each, over two app instances sharing one real `redis-server`, with
//! handler 500s, panics, handlers slower than the lease, client disconnects and a Redis kill and
//! restart; no event may be lost and no double effect may lack a documented cause.
//!
//! The full run is `cargo run --release --all-features --example provider_sim -- --events 10000`.
#![cfg(feature = "redis")]

#[path = "../../examples/provider_sim/sim.rs"]
mod provider_sim;

use provider_sim::{SimConfig, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_effect_under_at_least_once_delivery_with_faults() {
    let mut config = SimConfig::new(200);
    config.seed = 0xfa17;
    config.concurrency = 64;
    // More of the rare faults than in the long run, so that 200 events meet each of them.
    config.p_slow = 0.02;
    config.p_disconnect = 0.05;
    let report = run(config).await;
    println!("{}", report.table());
    report
        .check()
        .unwrap_or_else(|problems| panic!("{problems}\n{}", report.table()));

    assert_eq!(report.events, 200);
    assert!(
        report.deliveries > report.events,
        "some events are delivered more than once"
    );
    assert!(
        report.injected_fail > 0 && report.injected_panic > 0 && report.injected_disconnect > 0
    );
    assert!(
        report.redis_down.is_some(),
        "Redis was killed and restarted"
    );
    // Every acknowledged event took effect at least once.
    assert!(report.effects >= report.events - report.undelivered);
}
