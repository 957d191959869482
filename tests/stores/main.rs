//! The stores: the behaviour suite (`store_suite!`), the store contract and the `once` suites on
//! every backend (memory; a `redis-server`, a Redis Cluster, a Sentinel deployment; PostgreSQL;
//! SQLite files), the local cache in front of them, and what only one backend can show.
//!
//! One test binary: each file is a module, the shared harness is declared once here.

#[macro_use]
#[path = "../suite/mod.rs"]
mod suite;
#[macro_use]
#[path = "../once/mod.rs"]
mod once;
#[cfg(feature = "redis")]
#[macro_use]
#[path = "../support/scale_out.rs"]
mod scale_out;

#[path = "../support/postgres_server.rs"]
mod postgres_server;
#[cfg(feature = "redis")]
#[path = "../support/redis_cluster.rs"]
mod redis_cluster;
#[cfg(feature = "redis")]
#[path = "../support/redis_proxy.rs"]
mod redis_proxy;
// The cluster and sentinel harnesses each include the node helpers: two copies, on purpose.
#[path = "../support/hooks.rs"]
mod hooks;
#[cfg(feature = "redis")]
#[allow(clippy::duplicate_mod)]
#[path = "../support/redis_sentinel.rs"]
mod redis_sentinel;
#[cfg(feature = "redis")]
#[path = "../../examples/provider_sim/redis_server.rs"]
mod redis_server;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[path = "../support/sql_checks.rs"]
mod sql_checks;
#[cfg(any(feature = "redis", feature = "sqlite", feature = "postgres"))]
#[path = "../support/store_steps.rs"]
mod store_steps;

mod cache;
mod cluster;
mod custom;
mod memory;
mod once_layer;
mod once_properties;
mod postgres;
mod redis;
mod redis_store;
mod sentinel;
mod sqlite;
