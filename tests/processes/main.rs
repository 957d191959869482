//! The built example binaries driven as processes over loopback: the demo (and its inbox, its
//! admin panel in headless Chromium), `inbox_worker` processes beside it, the Redis Streams
//! consumer, and the fault harness (two instances, one Redis killed and restarted).
//!
//! One test binary: each file is a module, the shared harness is declared once here.

#[path = "../support/browser.rs"]
mod browser;
#[path = "../support/harness.rs"]
mod harness;
#[path = "../support/postgres_server.rs"]
mod postgres_server;
// The fault harness's provider simulator includes its own copy (`examples/provider_sim/sim.rs`).
#[cfg(feature = "redis")]
#[allow(clippy::duplicate_mod)]
#[path = "../../examples/provider_sim/redis_server.rs"]
mod redis_server;
#[path = "../support/signing.rs"]
mod signing;

mod browser_panel;
mod demo;
mod demo_inbox;
mod faults;
mod inbox_admin_processes;
mod inbox_worker;
mod stream_consumer;
