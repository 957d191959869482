//! The inbox: its contract and admin contract on every backend (memory, Redis standalone,
//! Cluster and Sentinel, SQLite, PostgreSQL), what only one backend shows, and the admin service
//! and page in an axum app.
//!
//! One test binary: each file is a module, the shared harness is declared once here.

#[path = "../support/postgres_server.rs"]
mod postgres_server;
// The harness re-exports helpers for the tests that kill nodes; the inbox needs only the start.
#[cfg(feature = "redis")]
#[allow(unused_imports)]
#[path = "../support/redis_cluster.rs"]
mod redis_cluster;
// The cluster and sentinel harnesses each include the node helpers: two copies, on purpose.
#[cfg(feature = "redis")]
#[allow(unused_imports, clippy::duplicate_mod)]
#[path = "../support/redis_sentinel.rs"]
mod redis_sentinel;
#[cfg(feature = "redis")]
#[path = "../../examples/provider_sim/redis_server.rs"]
mod redis_server;

mod admin_fixture;
mod admin_page;
mod admin_service;
// Read by the admin service's tests and the SQL inbox's.
#[cfg(any(feature = "admin", all(feature = "sqlite", feature = "postgres")))]
mod logs;
mod memory;
mod redis;
mod sql;
