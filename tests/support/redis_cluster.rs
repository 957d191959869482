//! A real Redis Cluster for integration tests: three primaries and three replicas, six
//! throw-away `redis-server` processes per [`RedisCluster`].
//!
//! Include it from an integration test with:
//!
//! ```ignore
//! #[path = "support/redis_cluster.rs"]
//! mod redis_cluster;
//!
//! use redis_cluster::RedisCluster;
//! ```
//!
//! and gate the file with `#![cfg(feature = "redis")]` (the helpers build fred clients).
//!
//! [`RedisCluster::start`] runs six `redis-server`s on `127.0.0.1` and free ports (data and
//! cluster bus), `--cluster-enabled yes`, each with its own `nodes.conf` in a temporary
//! directory, no persistence, and a short `cluster-node-timeout` (1 s by default) so that a
//! failover takes about three seconds; then `redis-cli --cluster create ... --cluster-replicas 1`
//! and waits until every node says `cluster_state:ok`, agrees on the slot map, and every replica
//! has its replication link up. Everything is killed when the value is dropped.
//! `redis-server` or `redis-cli` missing is a loud panic, never a skip (Debian: the
//! `redis-server` package, which pulls in `redis-tools`).
//!
//! `shared()` hands the tests that break nothing one set of processes for as long as
//! any of them runs (the behaviour suite uses it), instead of one each.
//!
//! Failures: [`RedisCluster::kill_primary_of`] SIGKILLs the primary owning a key's slot,
//! [`RedisCluster::wait_for_failover`] waits until its replica has taken the slots over and the
//! whole cluster is `ok` again, [`Deployment::restart`] brings a killed node back (it rejoins
//! as a replica), and [`Deployment::freeze`] / [`Deployment::thaw`] stop and resume a node
//! (SIGSTOP / SIGCONT), for example a replica that must not acknowledge writes for a while.
#![allow(dead_code)]

#[path = "redis_nodes.rs"]
mod nodes;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use fred::prelude::*;
use fred::types::config::ServerConfig;

pub use self::nodes::{
    Deployment, Resp, command, command_calls, info_field, must, wait_replicated,
};
use self::nodes::{Process, TempDir, wait_until};

// What the tests that read it name through this deployment.
#[allow(unused_imports)]
pub use self::nodes::COMMAND_TIMEOUT;

/// Replicas per primary.
const REPLICAS: usize = 1;

/// Primaries.
const PRIMARIES: usize = 3;

/// One primary, its replicas and its slot ranges, as a node sees them (`CLUSTER NODES`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shard {
    /// The primary's port.
    pub primary: u16,
    /// The ports of its replicas (not flagged failed).
    pub replicas: Vec<u16>,
    /// Inclusive slot ranges.
    pub slots: Vec<(u16, u16)>,
}

impl Shard {
    /// Whether `slot` is one of this shard's.
    pub fn owns(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
    }

    /// How many slots it owns.
    pub fn slot_count(&self) -> usize {
        self.slots
            .iter()
            .map(|&(a, b)| usize::from(b - a) + 1)
            .sum()
    }
}

/// Six `redis-server` processes forming a cluster of three primaries with one replica each.
pub struct RedisCluster {
    nodes: Vec<Process>,
    /// The replicas each primary killed by `kill_primary_of` had.
    killed_primaries: BTreeMap<u16, Vec<u16>>,
    // Dropped after the nodes (fields drop in order).
    dir: TempDir,
}

impl RedisCluster {
    /// Starts a healthy cluster with `cluster-node-timeout` 1 s. Panics (loudly) when
    /// `redis-server` or `redis-cli` is missing or the cluster does not form.
    pub fn start() -> Self {
        Self::start_with_node_timeout(Duration::from_millis(1000))
    }

    /// Like [`RedisCluster::start`], with another `cluster-node-timeout` (the time before a
    /// silent node is suspected; a failover takes about three times as long).
    pub fn start_with_node_timeout(node_timeout: Duration) -> Self {
        Self::start_with_binaries(
            &nodes::redis_server_binary(),
            &nodes::redis_cli_binary(),
            node_timeout,
        )
    }

    /// Like [`RedisCluster::start_with_node_timeout`], with explicit `redis-server` and
    /// `redis-cli` binaries (by default `$REDIS_SERVER_BIN` / `$REDIS_CLI_BIN`, or from `PATH`).
    pub fn start_with_binaries(binary: &str, cli: &str, node_timeout: Duration) -> Self {
        let dir = TempDir::new("redis-cluster");
        let mut processes = Vec::new();
        for i in 0..PRIMARIES * (1 + REPLICAS) {
            let node_dir = dir.subdir(&format!("node{i}"));
            let log = node_dir.join("redis.log");
            let process = nodes::start_on_free_port(binary, &log, |port| {
                let bus = nodes::free_port();
                let mut args = nodes::server_args(port, &node_dir, &log);
                args.extend(
                    [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        &node_dir.join("nodes.conf").to_string_lossy(),
                        "--cluster-port",
                        &bus.to_string(),
                        "--cluster-node-timeout",
                        &node_timeout.as_millis().to_string(),
                        // A replica may always take over, however long it was cut off.
                        "--cluster-replica-validity-factor",
                        "0",
                    ]
                    .map(String::from),
                );
                args
            });
            processes.push(process);
        }
        let cluster = RedisCluster {
            nodes: processes,
            killed_primaries: BTreeMap::new(),
            dir,
        };
        cluster.create(cli);
        cluster.wait_until_healthy(Duration::from_secs(30));
        cluster
    }

    /// One cluster shared by the tests running at the same time (for tests that do not kill
    /// or freeze nodes): started by the first caller, stopped when the last holder drops it.
    pub fn shared() -> Arc<RedisCluster> {
        static SHARED: Mutex<Weak<RedisCluster>> = Mutex::new(Weak::new());
        // Nobody kills its nodes: a longer node timeout, so that a node starved of CPU on a
        // loaded machine is not failed over under the tests that share it.
        nodes::shared(&SHARED, || {
            RedisCluster::start_with_node_timeout(Duration::from_secs(5))
        })
    }

    fn create(&self, cli: &str) {
        let addrs: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let output = std::process::Command::new(cli)
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &REPLICAS.to_string(), "--cluster-yes"])
            .output();
        let output = match output {
            Ok(output) => output,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                nodes::missing_binary(cli, "redis-tools")
            }
            Err(e) => panic!("could not run `{cli}`: {e}"),
        };
        assert!(
            output.status.success(),
            "`{cli} --cluster create` failed:\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// The ports of all six nodes, running or not.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(Process::port).collect()
    }

    /// A `redis-cluster://` URL naming every node, as `store::connect` reads it.
    pub fn url(&self) -> String {
        nodes::url("redis-cluster", &self.ports(), None)
    }

    /// The ports of the running nodes.
    pub fn running_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.is_running())
            .map(Process::port)
            .collect()
    }

    /// The shards (primaries owning slots) as the node on `port` sees them.
    pub fn shards_seen_by(&self, port: u16) -> Result<Vec<Shard>, String> {
        let reply = command(port, &["CLUSTER", "NODES"]).map_err(|e| e.to_string())?;
        if let Resp::Error(e) = reply {
            return Err(e);
        }
        Ok(parse_cluster_nodes(&reply.text()))
    }

    /// The shards, as the first running node sees them.
    pub fn shards(&self) -> Vec<Shard> {
        let port = *self.running_ports().first().expect("a running node");
        self.shards_seen_by(port)
            .unwrap_or_else(|e| panic!("CLUSTER NODES on {port}: {e}"))
    }

    /// `CLUSTER KEYSLOT key`, asked of a running node.
    pub fn keyslot(&self, key: &str) -> u16 {
        let port = *self.running_ports().first().expect("a running node");
        must(port, &["CLUSTER", "KEYSLOT", key]).integer() as u16
    }

    /// The port of the primary owning `slot`.
    pub fn primary_of_slot(&self, slot: u16) -> u16 {
        self.shards()
            .into_iter()
            .find(|s| s.owns(slot))
            .unwrap_or_else(|| panic!("no primary owns slot {slot}"))
            .primary
    }

    /// The port of the primary owning `key`.
    pub fn master_of(&self, key: &str) -> u16 {
        self.primary_of_slot(self.keyslot(key))
    }

    /// The ports of the primaries.
    pub fn primaries(&self) -> Vec<u16> {
        self.shards().into_iter().map(|s| s.primary).collect()
    }

    /// The replicas of the primary on `primary`.
    pub fn replicas_of(&self, primary: u16) -> Vec<u16> {
        self.shards()
            .into_iter()
            .find(|s| s.primary == primary)
            .map(|s| s.replicas)
            .unwrap_or_default()
    }

    /// The port of the primary owning `key`, and of its first replica.
    pub fn primary_and_replica(&self, key: &str) -> (u16, u16) {
        let primary = self.master_of(key);
        (primary, self.replicas_of(primary)[0])
    }

    /// SIGKILLs the primary owning `key` and returns its port. Does not wait for the failover:
    /// see [`RedisCluster::wait_for_failover`].
    pub fn kill_primary_of(&mut self, key: &str) -> u16 {
        let port = self.master_of(key);
        let replicas = self.replicas_of(port);
        self.killed_primaries.insert(port, replicas);
        self.kill(port);
        port
    }

    /// SIGKILLs the node on `port`.
    pub fn kill(&mut self, port: u16) {
        self.node_mut(port).kill();
    }

    /// Waits until every running node says `cluster_state:ok`, sees every slot owned by a
    /// running primary and no longer sees the killed primary `killed` as one. Returns the port
    /// of the replica of `killed` that took its slots over.
    pub fn wait_for_failover(&self, killed: u16, timeout: Duration) -> u16 {
        let former_replicas = self
            .killed_primaries
            .get(&killed)
            .cloned()
            .unwrap_or_else(|| panic!("{killed} was not a primary killed by kill_primary_of"));
        wait_until(timeout, "the cluster failover", || {
            let running = self.running_ports();
            let mut promoted = None;
            for &port in &running {
                cluster_state_ok(port)?;
                let shards = self.shards_seen_by(port)?;
                if shards.iter().map(Shard::slot_count).sum::<usize>() != 16384 {
                    return Err(format!("node {port} does not see every slot covered"));
                }
                if let Some(dead) = shards.iter().find(|s| !running.contains(&s.primary)) {
                    return Err(format!("node {port} sees {} as a primary", dead.primary));
                }
                match shards.iter().find(|s| former_replicas.contains(&s.primary)) {
                    Some(shard) => promoted = Some(shard.primary),
                    None => return Err(format!("node {port} sees no promoted replica")),
                }
            }
            promoted.ok_or_else(|| "no running node".to_owned())
        })
    }

    /// Waits until every running node says `cluster_state:ok` and sees the same shards, each
    /// primary running with `REPLICAS` running replicas whose replication link is up.
    pub fn wait_until_healthy(&self, timeout: Duration) {
        wait_until(timeout, "a healthy cluster", || {
            let running = self.running_ports();
            let mut seen: Option<Vec<Shard>> = None;
            for &port in &running {
                cluster_state_ok(port)?;
                let mut shards = self.shards_seen_by(port)?;
                for shard in &mut shards {
                    shard.replicas.retain(|r| running.contains(r));
                    shard.replicas.sort_unstable();
                }
                shards.sort_by_key(|s| s.primary);
                match &seen {
                    None => seen = Some(shards),
                    Some(first) if *first != shards => {
                        return Err(format!("nodes disagree: {first:?} / {shards:?}"));
                    }
                    Some(_) => {}
                }
            }
            let shards = seen.ok_or("no running node")?;
            if shards.len() != PRIMARIES {
                return Err(format!("{} primaries: {shards:?}", shards.len()));
            }
            for shard in &shards {
                if !running.contains(&shard.primary) {
                    return Err(format!("primary {} is down", shard.primary));
                }
                if shard.replicas.len() != REPLICAS {
                    return Err(format!(
                        "primary {} has {:?}",
                        shard.primary, shard.replicas
                    ));
                }
                for &replica in &shard.replicas {
                    let link = info_field(replica, "replication", "master_link_status");
                    if link.as_deref() != Some("up") {
                        return Err(format!("replica {replica} link {link:?}"));
                    }
                }
            }
            Ok(())
        });
    }
}

/// Its processes are the six nodes; [`Deployment::restart`] starts a killed node again, with
/// its `nodes.conf`: it rejoins the cluster (as a replica, if its slots were taken over). Use
/// [`RedisCluster::wait_until_healthy`] to wait for its replication link.
impl Deployment for RedisCluster {
    const TO: &'static str = "to the cluster";

    /// A fred config for the cluster, with every node as a seed.
    fn config(&self) -> Config {
        Config {
            server: ServerConfig::new_clustered(
                self.ports().into_iter().map(|p| ("127.0.0.1", p)).collect(),
            ),
            ..Config::default()
        }
    }

    fn processes(&self) -> Vec<&Process> {
        self.nodes.iter().collect()
    }

    fn processes_mut(&mut self) -> Vec<&mut Process> {
        self.nodes.iter_mut().collect()
    }
}

fn cluster_state_ok(port: u16) -> Result<(), String> {
    let info = command(port, &["CLUSTER", "INFO"]).map_err(|e| format!("{port}: {e}"))?;
    if info.text().contains("cluster_state:ok") {
        Ok(())
    } else {
        Err(format!("node {port}: cluster state not ok"))
    }
}

/// Parses `CLUSTER NODES`: the primaries owning slots, their replicas (not failed) and slots.
pub fn parse_cluster_nodes(text: &str) -> Vec<Shard> {
    struct Line {
        id: String,
        port: u16,
        flags: Vec<String>,
        master: String,
        slots: Vec<(u16, u16)>,
    }
    let lines: Vec<Line> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            // 127.0.0.1:30001@40001[,hostname]
            let addr = fields[1].split(['@', ',']).next().unwrap_or("");
            let port = addr
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            let slots = fields[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .map(|s| match s.split_once('-') {
                    Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
                    None => (s.parse().unwrap(), s.parse().unwrap()),
                })
                .collect();
            Line {
                id: fields[0].to_owned(),
                port,
                flags: fields[2].split(',').map(String::from).collect(),
                master: fields[3].to_owned(),
                slots,
            }
        })
        .collect();
    let mut shards: BTreeMap<u16, Shard> = BTreeMap::new();
    for line in lines.iter().filter(|l| !l.slots.is_empty()) {
        let replicas = lines
            .iter()
            .filter(|r| r.master == line.id && !r.flags.iter().any(|f| f == "fail"))
            .map(|r| r.port)
            .collect();
        shards.insert(
            line.port,
            Shard {
                primary: line.port,
                replicas,
                slots: line.slots.clone(),
            },
        );
    }
    shards.into_values().collect()
}
