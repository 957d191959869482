//! A real Redis Sentinel deployment for integration tests: one primary, one replica and three
//! sentinels (quorum 2), five throw-away processes per [`RedisSentinel`].
//!
//! Include it from an integration test with:
//!
//! ```ignore
//! #[path = "support/redis_sentinel.rs"]
//! mod redis_sentinel;
//!
//! use redis_sentinel::RedisSentinel;
//! ```
//!
//! and gate the file with `#![cfg(feature = "redis")]` (the helpers build fred clients).
//!
//! [`RedisSentinel::start`] runs, on `127.0.0.1` and free ports, a primary, a replica of it
//! (`--replicaof`), and three sentinels (`redis-server <conf> --sentinel`, so no separate
//! `redis-sentinel` binary is needed) monitoring the service [`SERVICE`] with quorum 2,
//! `down-after-milliseconds` 1000 and `failover-timeout` 3000; then waits until every sentinel
//! knows the replica and the two other sentinels, which a failover needs. Nothing is persisted;
//! everything is killed when the value is dropped. `redis-server` missing is a loud panic, never
//! a skip.
//!
//! `shared()` hands the tests that break nothing one set of processes for as long as
//! any of them runs (the behaviour suite uses it), instead of one each.
//!
//! Failures: [`RedisSentinel::kill_master`] SIGKILLs the current primary,
//! [`RedisSentinel::wait_for_failover`] waits until every sentinel names the promoted replica
//! and it runs as a primary, [`Deployment::restart`] brings a killed node back (the sentinels
//! turn it into a replica of the new primary), and [`Deployment::freeze`] /
//! [`Deployment::thaw`] stop and resume a node (SIGSTOP / SIGCONT).
#![allow(dead_code)]

#[path = "redis_nodes.rs"]
mod nodes;

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use fred::prelude::*;
use fred::types::config::ServerConfig;

pub use self::nodes::{
    Deployment, Resp, command, command_calls, info_field, must, wait_replicated,
};
use self::nodes::{Process, TempDir, wait_until};

/// The name of the monitored service (`sentinelServiceName`).
pub const SERVICE: &str = "mymaster";

// What the tests that read it name through this deployment.
#[allow(unused_imports)]
pub use self::nodes::COMMAND_TIMEOUT;

/// Sentinel's `down-after-milliseconds`: how long the primary may be silent before it is
/// considered down.
pub const DOWN_AFTER: Duration = Duration::from_millis(1000);

/// `down-after-milliseconds` of the [shared](RedisSentinel::shared) deployment, which nobody
/// kills: longer, so that a primary starved of CPU on a loaded machine is not failed over under
/// the tests that share it.
const SHARED_DOWN_AFTER: Duration = Duration::from_secs(5);

/// A primary, its replica, and three sentinels.
pub struct RedisSentinel {
    /// Data nodes: the initial primary, then the initial replica.
    data: Vec<Process>,
    sentinels: Vec<Process>,
    // Dropped after the processes (fields drop in order).
    dir: TempDir,
}

impl RedisSentinel {
    /// Starts the deployment and waits until it can fail over. Panics (loudly) when
    /// `redis-server` is missing or the deployment does not come up.
    pub fn start() -> Self {
        Self::start_with_binary(&nodes::redis_server_binary())
    }

    /// Like [`RedisSentinel::start`], with an explicit `redis-server` binary (by default
    /// `$REDIS_SERVER_BIN`, or from `PATH`), which also runs the sentinels.
    pub fn start_with_binary(binary: &str) -> Self {
        Self::start_with(binary, DOWN_AFTER)
    }

    /// Like [`RedisSentinel::start_with_binary`], with another `down-after-milliseconds`.
    fn start_with(binary: &str, down_after: Duration) -> Self {
        let dir = TempDir::new("redis-sentinel");
        let data_node = |name: &str, replica_of: Option<u16>| {
            let node_dir = dir.subdir(name);
            let log = node_dir.join("redis.log");
            nodes::start_on_free_port(binary, &log, |port| {
                let mut args = nodes::server_args(port, &node_dir, &log);
                if let Some(primary) = replica_of {
                    args.extend([
                        "--replicaof".into(),
                        "127.0.0.1".into(),
                        primary.to_string(),
                    ]);
                }
                args
            })
        };
        let primary = data_node("primary", None);
        let replica = data_node("replica", Some(primary.port()));
        let primary_port = primary.port();
        wait_until(
            Duration::from_secs(20),
            "the replica's link",
            || match info_field(replica.port(), "replication", "master_link_status").as_deref() {
                Some("up") => Ok(()),
                other => Err(format!("master_link_status {other:?}")),
            },
        );

        let mut sentinels = Vec::new();
        for i in 0..3 {
            let sentinel_dir = dir.subdir(&format!("sentinel{i}"));
            let log = sentinel_dir.join("sentinel.log");
            let conf = sentinel_dir.join("sentinel.conf");
            let process = nodes::start_on_free_port(binary, &log, |port| {
                // Sentinel rewrites its configuration file: it must be writable, one each.
                let text = format!(
                    "port {port}\n\
                     bind 127.0.0.1\n\
                     daemonize no\n\
                     dir {dir}\n\
                     logfile {log}\n\
                     sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2\n\
                     sentinel down-after-milliseconds {SERVICE} {down}\n\
                     sentinel failover-timeout {SERVICE} 3000\n\
                     sentinel parallel-syncs {SERVICE} 1\n",
                    dir = sentinel_dir.display(),
                    log = log.display(),
                    down = down_after.as_millis(),
                );
                std::fs::write(&conf, text).expect("write sentinel.conf");
                vec![conf.to_string_lossy().into_owned(), "--sentinel".into()]
            });
            sentinels.push(process);
        }
        let deployment = RedisSentinel {
            data: vec![primary, replica],
            sentinels,
            dir,
        };
        deployment.wait_until_ready(Duration::from_secs(30));
        deployment
    }

    /// One deployment shared by the tests running at the same time (for tests that do not
    /// kill or freeze anything): started by the first caller, stopped when the last holder
    /// drops it.
    pub fn shared() -> Arc<RedisSentinel> {
        static SHARED: Mutex<Weak<RedisSentinel>> = Mutex::new(Weak::new());
        nodes::shared(&SHARED, || {
            RedisSentinel::start_with(&nodes::redis_server_binary(), SHARED_DOWN_AFTER)
        })
    }

    /// Waits until every running sentinel knows the replica(s) and the other two sentinels, and
    /// agrees on the primary.
    pub fn wait_until_ready(&self, timeout: Duration) {
        wait_until(timeout, "the sentinels to know each other", || {
            let primary = self.master_port_from(self.sentinels[0].port())?;
            for sentinel in self.running_sentinels() {
                let reply = command(sentinel, &["SENTINEL", "MASTER", SERVICE])
                    .map_err(|e| e.to_string())?;
                let fields = reply.fields();
                let field = |name: &str| {
                    fields
                        .iter()
                        .find_map(|(k, v)| (k == name).then(|| v.clone()))
                        .unwrap_or_default()
                };
                if field("flags") != "master" {
                    return Err(format!("sentinel {sentinel}: flags {}", field("flags")));
                }
                if field("port") != primary.to_string() {
                    return Err(format!("sentinel {sentinel} names {}", field("port")));
                }
                if field("num-other-sentinels") != "2" {
                    return Err(format!(
                        "sentinel {sentinel} knows {} others",
                        field("num-other-sentinels")
                    ));
                }
                if field("num-slaves") == "0" {
                    return Err(format!("sentinel {sentinel} knows no replica"));
                }
            }
            Ok(())
        });
    }

    /// The ports of the three sentinels.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(Process::port).collect()
    }

    /// A `redis-sentinel://` URL naming the sentinels and the service, as `store::connect`
    /// reads it.
    pub fn url(&self) -> String {
        let service = format!("sentinelServiceName={SERVICE}");
        nodes::url("redis-sentinel", &self.sentinel_ports(), Some(&service))
    }

    fn running_sentinels(&self) -> Vec<u16> {
        self.sentinels
            .iter()
            .filter(|s| s.is_running())
            .map(Process::port)
            .collect()
    }

    /// The ports of the data nodes (the initial primary, then the initial replica).
    pub fn data_ports(&self) -> Vec<u16> {
        self.data.iter().map(Process::port).collect()
    }

    fn master_port_from(&self, sentinel: u16) -> Result<u16, String> {
        let reply = command(sentinel, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE])
            .map_err(|e| e.to_string())?;
        match &reply {
            Resp::Array(Some(addr)) if addr.len() == 2 => Ok(addr[1].integer() as u16),
            other => Err(format!("unexpected reply {other:?}")),
        }
    }

    /// The port of the primary, as the first running sentinel names it.
    pub fn master_port(&self) -> u16 {
        let sentinel = *self
            .running_sentinels()
            .first()
            .expect("a running sentinel");
        self.master_port_from(sentinel)
            .unwrap_or_else(|e| panic!("GET-MASTER-ADDR-BY-NAME: {e}"))
    }

    /// The port of a running data node that is not the primary.
    pub fn replica_port(&self) -> u16 {
        let primary = self.master_port();
        self.data
            .iter()
            .find(|n| n.is_running() && n.port() != primary)
            .map(Process::port)
            .expect("a running replica")
    }

    /// The ports of the primary and of a running replica: those of every key (one primary
    /// owns them all).
    pub fn primary_and_replica(&self, _key: &str) -> (u16, u16) {
        (self.master_port(), self.replica_port())
    }

    /// [`RedisSentinel::kill_master`]: the primary owns every key.
    pub fn kill_primary_of(&mut self, _key: &str) -> u16 {
        self.kill_master()
    }

    /// SIGKILLs the current primary and returns its port. Does not wait for the failover: see
    /// [`RedisSentinel::wait_for_failover`].
    pub fn kill_master(&mut self) -> u16 {
        let port = self.master_port();
        self.node_mut(port).kill();
        port
    }

    /// Waits until every running sentinel names a primary other than `old`, the same one, and
    /// that node runs as a primary. Returns its port.
    pub fn wait_for_failover(&self, old: u16, timeout: Duration) -> u16 {
        wait_until(timeout, "the sentinel failover", || {
            let mut named = None;
            for sentinel in self.running_sentinels() {
                let port = self.master_port_from(sentinel)?;
                if port == old {
                    return Err(format!("sentinel {sentinel} still names {old}"));
                }
                if named.is_some_and(|n| n != port) {
                    return Err("the sentinels disagree".into());
                }
                named = Some(port);
            }
            let port = named.ok_or("no running sentinel")?;
            match info_field(port, "replication", "role").as_deref() {
                Some("master") => Ok(port),
                other => Err(format!("{port} has role {other:?}")),
            }
        })
    }
}

/// Its processes are the data nodes and the sentinels; [`Deployment::restart`] starts a killed
/// one again (the sentinels make a data node a replica of the current primary within a few
/// seconds).
impl Deployment for RedisSentinel {
    const TO: &'static str = "through the sentinels";

    /// A fred config that finds the primary through the three sentinels.
    fn config(&self) -> Config {
        Config {
            server: ServerConfig::new_sentinel(
                self.sentinel_ports()
                    .into_iter()
                    .map(|p| ("127.0.0.1", p))
                    .collect(),
                SERVICE,
            ),
            ..Config::default()
        }
    }

    fn processes(&self) -> Vec<&Process> {
        self.data.iter().chain(&self.sentinels).collect()
    }

    fn processes_mut(&mut self) -> Vec<&mut Process> {
        self.data.iter_mut().chain(&mut self.sentinels).collect()
    }
}
