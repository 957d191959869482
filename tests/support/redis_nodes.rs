//! Plumbing shared by the multi-process Redis fixtures (`redis_cluster.rs` and
//! `redis_sentinel.rs`): `redis-server` child processes on free ports, killed on drop (the
//! standalone server's [`Process`], from `redis_server.rs`), their arguments and directories,
//! and a small blocking RESP client for administration that must not go through the client
//! under test.
//!
//! Included by the fixtures themselves (`#[path = "redis_nodes.rs"] mod nodes;`), not by test
//! files; a test binary with these fixtures declares `redis_server` too. Like
//! `redis_server.rs`, a missing binary is a loud panic, never a skip.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::redis_server::{self, process};
// The processes themselves are `redis_server`'s; each fixture uses a part of them.
#[allow(unused_imports)]
pub use crate::redis_server::{Process, missing_binary, process::free_port, start_on_free_port};

/// `$REDIS_SERVER_BIN`, or `redis-server` from `PATH`.
pub fn redis_server_binary() -> String {
    std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into())
}

/// `$REDIS_CLI_BIN`, or `redis-cli` from `PATH`.
pub fn redis_cli_binary() -> String {
    std::env::var("REDIS_CLI_BIN").unwrap_or_else(|_| "redis-cli".into())
}

/// A temporary directory, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A fresh, unique directory under the system's temp dir.
    pub fn new(prefix: &str) -> Self {
        TempDir(process::unique_temp_dir(prefix))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// A subdirectory, created.
    pub fn subdir(&self, name: &str) -> PathBuf {
        let dir = self.0.join(name);
        std::fs::create_dir_all(&dir).expect("create a temp subdir");
        dir
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Polls `check` every 50 ms until it returns `Some`, or panics after `timeout` with `what` and
/// the last `Err` it gave.
pub fn wait_until<T>(
    timeout: Duration,
    what: &str,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(value) => return value,
            Err(why) if Instant::now() >= deadline => {
                panic!("timed out after {timeout:?} waiting for {what}: {why}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// A RESP2 reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Integer(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Resp>>),
}

impl Resp {
    /// The reply as text: a simple string, a bulk string (lossy) or an integer.
    pub fn text(&self) -> String {
        match self {
            Resp::Simple(s) | Resp::Error(s) => s.clone(),
            Resp::Bulk(Some(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
            Resp::Integer(n) => n.to_string(),
            other => panic!("not a text reply: {other:?}"),
        }
    }

    /// The reply as an integer (an integer reply, or a number in a string).
    pub fn integer(&self) -> i64 {
        match self {
            Resp::Integer(n) => *n,
            other => other
                .text()
                .parse()
                .unwrap_or_else(|_| panic!("not an integer reply: {other:?}")),
        }
    }

    /// The elements of an array reply.
    pub fn array(&self) -> &[Resp] {
        match self {
            Resp::Array(Some(items)) => items,
            other => panic!("not an array reply: {other:?}"),
        }
    }

    /// A flat `[field, value, field, value ...]` array (as `SENTINEL MASTER` answers) as pairs.
    pub fn fields(&self) -> Vec<(String, String)> {
        self.array()
            .chunks(2)
            .map(|pair| (pair[0].text(), pair[1].text()))
            .collect()
    }
}

/// Sends one command over a fresh connection to `127.0.0.1:port` and reads its reply.
pub fn command(port: u16, args: &[&str]) -> std::io::Result<Resp> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(300))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut request = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        request.extend_from_slice(arg.as_bytes());
        request.extend_from_slice(b"\r\n");
    }
    stream.write_all(&request)?;
    read_reply(&mut BufReader::new(stream))
}

/// Like [`command`], but panics on an I/O error or an error reply.
pub fn must(port: u16, args: &[&str]) -> Resp {
    match command(port, args) {
        Ok(Resp::Error(e)) => panic!("{args:?} on port {port} answered {e}"),
        Ok(reply) => reply,
        Err(e) => panic!("{args:?} on port {port} failed: {e}"),
    }
}

/// `INFO <section>` of the server on `port` as `field -> value` pairs.
pub fn info(port: u16, section: &str) -> std::io::Result<Vec<(String, String)>> {
    let reply = command(port, &["INFO", section])?;
    Ok(reply
        .text()
        .lines()
        .filter_map(|line| line.trim().split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect())
}

/// One field of `INFO <section>`.
pub fn info_field(port: u16, section: &str, field: &str) -> Option<String> {
    info(port, section)
        .ok()?
        .into_iter()
        .find_map(|(k, v)| (k == field).then_some(v))
}

/// Waits until the replica on `replica` has processed everything the primary on `primary` had
/// written when called (its `slave_repl_offset` reaches the primary's `master_repl_offset`).
/// A `WAIT` on an administration connection would not do: it only waits for that connection's
/// own writes.
pub fn wait_replicated(primary: u16, replica: u16, timeout: Duration) {
    let offset = |port: u16, field: &str| -> Result<i64, String> {
        info_field(port, "replication", field)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("no {field} on {port}"))
    };
    let target = offset(primary, "master_repl_offset").unwrap_or_else(|e| panic!("{e}"));
    wait_until(timeout, "the replica to catch up", || {
        let done = offset(replica, "slave_repl_offset")?;
        if done >= target {
            Ok(())
        } else {
            Err(format!("replica {replica} at {done} of {target}"))
        }
    });
}

fn read_reply(reader: &mut impl BufRead) -> std::io::Result<Resp> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed before the reply",
        ));
    }
    let line = line.trim_end_matches(['\r', '\n']);
    let (kind, rest) = line.split_at(1);
    let number = || -> std::io::Result<i64> {
        rest.parse()
            .map_err(|_| std::io::Error::other(format!("bad RESP length {rest:?}")))
    };
    Ok(match kind {
        "+" => Resp::Simple(rest.to_owned()),
        "-" => Resp::Error(rest.to_owned()),
        ":" => Resp::Integer(number()?),
        "$" => match number()? {
            -1 => Resp::Bulk(None),
            len => {
                let mut payload = vec![0; len as usize + 2];
                reader.read_exact(&mut payload)?;
                payload.truncate(len as usize);
                Resp::Bulk(Some(payload))
            }
        },
        "*" => match number()? {
            -1 => Resp::Array(None),
            len => {
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(read_reply(reader)?);
                }
                Resp::Array(Some(items))
            }
        },
        other => {
            return Err(std::io::Error::other(format!(
                "unknown RESP type {other:?}"
            )));
        }
    })
}

/// How long a fred client of a test deployment (a cluster, a sentinel set-up) lets a command
/// wait.
pub const COMMAND_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(1500);

/// A fred builder for `config` that reconnects forever, 50 ms apart, and fails commands after
/// [`COMMAND_TIMEOUT`] (change it with `with_performance_config`): what a test of a failover
/// needs from its clients.
pub fn failover_builder(config: fred::prelude::Config) -> fred::prelude::Builder {
    let mut builder = fred::prelude::Builder::from_config(config);
    builder
        .set_policy(fred::prelude::ReconnectPolicy::new_constant(0, 50))
        .with_performance_config(|perf| perf.default_command_timeout = COMMAND_TIMEOUT)
        .with_connection_config(|conn| {
            conn.connection_timeout = std::time::Duration::from_secs(1);
            conn.internal_command_timeout = std::time::Duration::from_secs(1);
            conn.max_command_attempts = 3;
        });
    builder
}

/// A connected client of `builder`; `to` says what it connects to, should it fail.
pub async fn connect(builder: fred::prelude::Builder, to: &str) -> fred::prelude::Client {
    use fred::prelude::ClientLike;
    let client = builder.build().expect("valid fred config");
    client
        .init()
        .await
        .unwrap_or_else(|err| panic!("connect {to}: {err}"));
    client
}

/// A connected pool of `size` clients of `builder`.
pub async fn connect_pool(
    builder: fred::prelude::Builder,
    size: usize,
    to: &str,
) -> fred::prelude::Pool {
    use fred::prelude::ClientLike;
    let pool = builder.build_pool(size).expect("valid fred config");
    pool.init()
        .await
        .unwrap_or_else(|err| panic!("connect {to}: {err}"));
    pool
}

/// What the cluster and the sentinel deployments do alike: find a process by port, stop,
/// resume and restart it, and connect fred clients (through [`failover_builder`]).
pub trait Deployment {
    /// What a failed connection says it was connecting to (`"to the cluster"`).
    const TO: &'static str;

    /// A fred config for the deployment.
    fn config(&self) -> fred::prelude::Config;

    /// Every process of the deployment, running or not.
    fn processes(&self) -> Vec<&Process>;

    /// The same, to kill or restart one.
    fn processes_mut(&mut self) -> Vec<&mut Process>;

    /// The process on `port`.
    fn node(&self, port: u16) -> &Process {
        self.processes()
            .into_iter()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no process on port {port}"))
    }

    /// The process on `port`, to kill or restart it.
    fn node_mut(&mut self, port: u16) -> &mut Process {
        self.processes_mut()
            .into_iter()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no process on port {port}"))
    }

    /// Starts the killed process on `port` again (see each deployment for what it becomes).
    fn restart(&mut self, port: u16) {
        self.node_mut(port).restart();
    }

    /// Stops the process on `port` (SIGSTOP): its connections stay open, it answers nothing.
    fn freeze(&self, port: u16) {
        self.node(port).freeze();
    }

    /// Resumes a frozen process (SIGCONT).
    fn thaw(&self, port: u16) {
        self.node(port).thaw();
    }

    /// A fred builder for the deployment (see [`failover_builder`]).
    fn builder(&self) -> fred::prelude::Builder {
        failover_builder(self.config())
    }

    /// A connected client (see [`Deployment::builder`]).
    fn connect(&self) -> impl std::future::Future<Output = fred::prelude::Client> {
        connect(self.builder(), Self::TO)
    }

    /// A connected pool of `size` clients.
    fn connect_pool(&self, size: usize) -> impl std::future::Future<Output = fred::prelude::Pool> {
        connect_pool(self.builder(), size, Self::TO)
    }
}

/// The arguments of a `redis-server` on `port` of loopback that keeps its files in `dir` and
/// logs to `log`, persists nothing, and lets a replica sync at once.
pub fn server_args(port: u16, dir: &Path, log: &Path) -> Vec<String> {
    let mut args = redis_server::server_args(port, dir, log);
    // Replicas sync at once rather than after the default 5 s.
    args.extend(["--repl-diskless-sync-delay", "0"].map(String::from));
    args
}

/// The deployment in `slot`, shared by the tests running at the same time: started by the
/// first caller with `start`, stopped when the last holder drops it.
pub fn shared<T>(
    slot: &std::sync::Mutex<std::sync::Weak<T>>,
    start: impl FnOnce() -> T,
) -> std::sync::Arc<T> {
    let mut shared = slot.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(deployment) = shared.upgrade() {
        return deployment;
    }
    let deployment = std::sync::Arc::new(start());
    *shared = std::sync::Arc::downgrade(&deployment);
    deployment
}

/// How many times the server on `port` ran `command` (`INFO commandstats`).
pub fn command_calls(port: u16, command: &str) -> u64 {
    let info = must(port, &["INFO", "commandstats"]).text();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.trim().strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map(|n| n.parse().unwrap())
        .unwrap_or(0)
}

/// A `scheme` URL of the servers on `ports` of loopback: the first as its host, the others as
/// `node` parameters, then `more` (`name=value`).
pub fn url(scheme: &str, ports: &[u16], more: Option<&str>) -> String {
    let params: Vec<String> = ports[1..]
        .iter()
        .map(|p| format!("node=127.0.0.1:{p}"))
        .chain(more.map(str::to_owned))
        .collect();
    format!("{scheme}://127.0.0.1:{}?{}", ports[0], params.join("&"))
}
