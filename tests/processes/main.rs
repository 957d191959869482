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
// The demo's inbox shared by several processes: every store (each test picks one or more)
// and the demo's own features. A macro, so that the list is written once for both modules.
macro_rules! with_every_store {
    ($($module:item)*) => {
        $(
            #[cfg(all(
                feature = "redis",
                feature = "sqlite",
                feature = "postgres",
                feature = "metrics",
                feature = "verify",
                feature = "admin"
            ))]
            $module
        )*
    };
}
with_every_store! {
    mod inbox_admin_processes;
    mod inbox_worker;
}
mod stream_consumer;
