//! A real `redis-server`, one throw-away process per [`RedisServer`]: the provider simulator's
//! (`sim.rs`), and the integration tests' too.
//!
//! The example owns it (an example depends on the crate only); a test binary declares it once,
//! in its `main.rs`, and its files `use crate::redis_server`:
//!
//! ```ignore
//! #[cfg(feature = "redis")]
//! #[path = "../../examples/provider_sim/redis_server.rs"]
//! mod redis_server;
//! ```
//!
//! The harness uses `fred`, an optional dependency: gate the declaration and the files that
//! use it with `feature = "redis"`.
//!
//! [`RedisServer::start`] runs `redis-server` (or `$REDIS_SERVER_BIN`) on `127.0.0.1` and a free
//! port, without persistence (`--save "" --appendonly no`), in its own temporary directory, and
//! returns once it answers `PING`. The process is killed when the value is dropped. If
//! `redis-server` cannot be found the harness **panics**: a missing server is a test failure,
//! never a silent skip. In CI it is installed by `scripts/test`; locally, `apt-get install
//! redis-server` (Redis 7.0 or later, for `SET ... NX GET`).
//!
//! Helpers: [`RedisServer::connect`] builds a fred client that reconnects by itself and fails
//! fast while the server is down; [`command_calls`], [`reset_stats`], [`memory_usage`],
//! [`script_flush`] and [`raw`] send the introspection commands used by the tests
//! (`INFO commandstats`, `CONFIG RESETSTAT`, `MEMORY USAGE`, `SCRIPT FLUSH`) through fred's
//! `custom` interface. Note that `INFO commandstats` also counts the commands Lua scripts run
//! (`redis.call('SET', ..)` inside `EVALSHA` adds to `cmdstat_set`); [`RedisServer::monitor`]
//! records only what clients sent.
#![allow(dead_code)]

#[path = "process.rs"]
pub mod process;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use process::{free_port, read_log, unique_temp_dir};

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};

/// How long a fred client made by [`RedisServer::connect`] lets a command wait (queued while
/// reconnecting, or unanswered) before failing it with a timeout.
pub const COMMAND_TIMEOUT: Duration = Duration::from_millis(1500);

/// How long to wait for a freshly started server to answer `PING`.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

/// A `redis-server` child process on `127.0.0.1`, in a temporary directory of its own; killed
/// and the directory removed on drop.
pub struct RedisServer {
    process: Process,
    dir: PathBuf,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers `PING`.
    ///
    /// Panics (loudly) if `redis-server` is not installed or does not come up.
    pub fn start() -> Self {
        let binary = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
        Self::start_with_binary(&binary)
    }

    /// Like [`RedisServer::start`], with an explicit path to the `redis-server` binary.
    pub fn start_with_binary(binary: &str) -> Self {
        let dir = unique_temp_dir("redis");
        let log = dir.join("redis.log");
        let process = start_on_free_port(binary, &log, |port| server_args(port, &dir, &log));
        RedisServer { process, dir }
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.process.port()
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port())
    }

    /// Whether the server process is running (started and not killed).
    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// Kills the server with SIGKILL (no shutdown, no save) and waits for the process to exit.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Stops the process (SIGSTOP) without killing it: its sockets stay open but nothing is
    /// read or answered, like a hung server. [`RedisServer::thaw`] resumes it.
    pub fn freeze(&self) {
        self.process.freeze();
    }

    /// Resumes a process stopped by [`RedisServer::freeze`] (SIGCONT).
    pub fn thaw(&self) {
        self.process.thaw();
    }

    /// Starts the server again on the same port (killing it first if it still runs) and waits
    /// until it answers `PING`. Its data set starts empty: nothing is persisted.
    pub fn restart(&mut self) {
        self.process.restart();
    }

    /// A connected fred client for this server, built to survive restarts and to fail fast
    /// while the server is down:
    ///
    /// - `ReconnectPolicy::new_constant(0, 50)`: reconnect forever, every 50 ms (plus jitter);
    /// - `default_command_timeout` = [`COMMAND_TIMEOUT`]: commands queued while disconnected
    ///   fail with a timeout instead of waiting for the server;
    /// - `connection_timeout` and `internal_command_timeout` = 1 s;
    /// - `max_command_attempts` = 2.
    pub async fn connect(&self) -> Client {
        let client = self
            .builder()
            .build()
            .expect("fred client configuration is valid");
        client
            .init()
            .await
            .unwrap_or_else(|e| panic!("could not connect to {}: {e}", self.url()));
        client
    }

    /// A connected fred pool of `size` clients, configured like [`RedisServer::connect`].
    pub async fn connect_pool(&self, size: usize) -> Pool {
        let pool = self
            .builder()
            .build_pool(size)
            .expect("fred pool configuration is valid");
        pool.init()
            .await
            .unwrap_or_else(|e| panic!("could not connect to {}: {e}", self.url()));
        pool
    }

    /// The fred builder behind [`RedisServer::connect`].
    pub fn builder(&self) -> Builder {
        let config = Config::from_url(&self.url()).expect("valid redis url");
        let mut builder = Builder::from_config(config);
        builder
            .set_policy(ReconnectPolicy::new_constant(0, 50))
            .with_performance_config(|perf| perf.default_command_timeout = COMMAND_TIMEOUT)
            .with_connection_config(|conn| {
                conn.connection_timeout = Duration::from_secs(1);
                conn.internal_command_timeout = Duration::from_secs(1);
                conn.max_command_attempts = 2;
            });
        builder
    }

    /// Sends one command over a fresh TCP connection and returns the raw RESP reply. For
    /// administration that must not go through the client under test.
    pub fn raw_command(&self, args: &[&str]) -> std::io::Result<String> {
        raw_command(self.addr(), args)
    }

    /// Starts a `MONITOR` on a raw connection of its own: everything clients send from now on
    /// is recorded, until [`Monitor::finish`]. Unlike `INFO commandstats`, this tells the
    /// commands a client sent from the ones a Lua script ran.
    pub fn monitor(&self) -> Monitor {
        let stream = TcpStream::connect(self.addr()).expect("connect for MONITOR");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("set read timeout");
        let mut writer = stream.try_clone().expect("clone the MONITOR stream");
        writer
            .write_all(b"*1\r\n$7\r\nMONITOR\r\n")
            .expect("send MONITOR");
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).expect("MONITOR reply");
        assert!(line.starts_with("+OK"), "MONITOR answered {line:?}");
        Monitor {
            reader,
            addr: self.addr(),
        }
    }

    fn addr(&self) -> SocketAddr {
        self.process.addr()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.process.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The arguments of a `redis-server` on `127.0.0.1:port` without persistence, its files in
/// `dir`, its log in `log`.
pub fn server_args(port: u16, dir: &Path, log: &Path) -> Vec<String> {
    [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--dir",
        &dir.to_string_lossy(),
        "--logfile",
        &log.to_string_lossy(),
    ]
    .map(String::from)
    .to_vec()
}

/// The panic for a binary that is not installed: a failure, not a skip.
pub fn missing_binary(binary: &str, package: &str) -> ! {
    panic!(
        "\n\n*** `{binary}` NOT FOUND: the Redis integration tests need real Redis binaries \
         (7.0 or later) on PATH, or REDIS_SERVER_BIN (REDIS_CLI_BIN) set to one. Install them \
         (e.g. `apt-get install {package}`); scripts/test (which .ci/run runs) installs them. \
         This is a failure, not a skip. ***\n"
    )
}

/// A `redis-server` child process (a standalone server, a cluster node or a sentinel) on
/// `127.0.0.1:port`, killed on drop. Its arguments are kept, so it can be killed and started
/// again on the same port.
pub struct Process {
    binary: String,
    args: Vec<String>,
    port: u16,
    log: PathBuf,
    child: Option<Child>,
}

impl Process {
    /// Starts `binary args...`, which must listen on `port`, and waits until it answers `PING`.
    /// `Err` when it exits or stays silent (for example: the port was taken meanwhile).
    pub fn start(binary: &str, args: Vec<String>, port: u16, log: PathBuf) -> Result<Self, String> {
        let mut process = Process {
            binary: binary.to_owned(),
            args,
            port,
            log,
            child: None,
        };
        process.spawn_and_wait()?;
        Ok(process)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether it runs (started and not killed).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILL (no shutdown, no save), then reaps the process.
    pub fn kill(&mut self) {
        process::kill(&mut self.child);
    }

    /// Starts it again with the same arguments on the same port (killing it first if it runs).
    pub fn restart(&mut self) {
        self.kill();
        let what = format!("{} on port {}", self.binary, self.port);
        process::start_again(STARTUP_TIMEOUT, &what, || self.spawn_and_wait());
    }

    /// Stops the process (SIGSTOP) without killing it: its sockets stay open but nothing is
    /// read or answered, like a frozen or partitioned host. [`Process::thaw`] resumes it.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Resumes a process stopped by [`Process::freeze`] (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    /// Its log file, for failure messages.
    pub fn log(&self) -> String {
        read_log(&self.log)
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    fn signal(&self, signal: &str) {
        process::signal(self.child.as_ref().expect("the process runs"), signal);
    }

    fn spawn_and_wait(&mut self) -> Result<(), String> {
        let child = Command::new(&self.binary)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                missing_binary(&self.binary, "redis-server")
            }
            Err(e) => panic!("could not run `{}`: {e}", self.binary),
        };
        let addr = self.addr();
        let every = Duration::from_millis(20);
        let child = process::wait_ready(child, STARTUP_TIMEOUT, every, "answer PING", || {
            raw_command(addr, &["PING"]).is_ok_and(|reply| reply.starts_with("+PONG"))
        })
        .map_err(|e| {
            let log = read_log(&self.log);
            format!("{} on port {} {e}; log:\n{log}", self.binary, self.port)
        })?;
        self.child = Some(child);
        Ok(())
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            // A frozen process still dies of SIGKILL; resume it anyway so nothing lingers.
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .stderr(Stdio::null())
                .status();
        }
        self.kill();
    }
}

/// Starts a process on a free port, trying other ports when one is taken between the look-up
/// and the bind. `args` builds the arguments for a port.
pub fn start_on_free_port(binary: &str, log: &Path, args: impl Fn(u16) -> Vec<String>) -> Process {
    let mut last_error = String::new();
    for _ in 0..10 {
        let port = free_port();
        match Process::start(binary, args(port), port, log.to_owned()) {
            Ok(process) => return process,
            Err(e) => last_error = e,
        }
    }
    panic!("could not start {binary} after 10 attempts: {last_error}");
}

/// A running `MONITOR` (see [`RedisServer::monitor`]).
pub struct Monitor {
    reader: BufReader<TcpStream>,
    addr: SocketAddr,
}

impl Monitor {
    /// Stops monitoring and returns the commands clients sent since [`RedisServer::monitor`],
    /// one entry per command, as the upper-case command name (`"SET"`, `"EVALSHA"`).
    /// Commands run by Lua scripts are left out.
    pub fn finish(mut self) -> Vec<String> {
        static MARKERS: AtomicU64 = AtomicU64::new(0);
        let marker = format!(
            "monitor-end-{}-{}",
            std::process::id(),
            MARKERS.fetch_add(1, Ordering::Relaxed)
        );
        // Everything sent before the marker is in the stream before the marker.
        raw_command(self.addr, &["ECHO", &marker]).expect("send the MONITOR end marker");
        let mut commands = Vec::new();
        loop {
            let mut line = String::new();
            let n = self
                .reader
                .read_line(&mut line)
                .expect("read MONITOR output");
            assert!(n > 0, "MONITOR stream closed before the end marker");
            if line.contains(&marker) {
                return commands;
            }
            // +1700000000.123456 [0 127.0.0.1:53214] "SET" "key" ...   (clients)
            // +1700000000.123456 [0 lua] "GET" "key"                    (scripts)
            let Some((source, rest)) = line.split_once("] ") else {
                continue;
            };
            if source.ends_with(" lua") {
                continue;
            }
            if let Some(name) = rest.split('"').nth(1) {
                commands.push(name.to_ascii_uppercase());
            }
        }
    }
}

/// The number of calls of `command` (lower case, e.g. `"set"`, `"evalsha"`) since the last
/// `CONFIG RESETSTAT`, from `INFO commandstats`; 0 when it was not called.
pub async fn command_calls<C: ClientLike>(client: &C, command: &str) -> u64 {
    let info: String = raw(client, "INFO", &["commandstats"]).await;
    parse_command_calls(&info, command)
}

/// Parses `cmdstat_<command>:calls=N,...` out of an `INFO commandstats` reply.
pub fn parse_command_calls(info: &str, command: &str) -> u64 {
    let prefix = format!("cmdstat_{}:", command.to_ascii_lowercase());
    info.lines()
        .find_map(|line| line.trim().strip_prefix(prefix.as_str()))
        .and_then(|stats| {
            stats
                .split(',')
                .find_map(|field| field.strip_prefix("calls="))
        })
        .map(|n| n.parse().expect("calls is a number"))
        .unwrap_or(0)
}

/// `CONFIG RESETSTAT`: zeroes the `INFO commandstats` counters.
pub async fn reset_stats<C: ClientLike>(client: &C) {
    let _: Value = raw(client, "CONFIG", &["RESETSTAT"]).await;
}

/// `MEMORY USAGE key SAMPLES 0`: the bytes Redis uses for `key` and its value, or `None` when
/// the key does not exist.
pub async fn memory_usage<C: ClientLike>(client: &C, key: &str) -> Option<u64> {
    raw(client, "MEMORY", &["USAGE", key, "SAMPLES", "0"]).await
}

/// `SCRIPT FLUSH SYNC`: empties the server's Lua script cache.
pub async fn script_flush<C: ClientLike>(client: &C) {
    let _: Value = raw(client, "SCRIPT", &["FLUSH", "SYNC"]).await;
}

/// Sends `command args...` through `client`'s `custom` interface and converts the reply.
/// Panics on error.
pub async fn raw<C: ClientLike, R: FromValue>(
    client: &C,
    command: &'static str,
    args: &[&str],
) -> R {
    let cmd = CustomCommand::new_static(command, ClusterHash::Random, false);
    let owned: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    client
        .custom(cmd, owned)
        .await
        .unwrap_or_else(|e| panic!("{command} {args:?} failed: {e}"))
}

/// One command in RESP over a fresh connection; returns the first reply line (and the bulk
/// payload, if any).
fn raw_command(addr: SocketAddr, args: &[&str]) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(request.as_bytes())?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    if let Some(len) = line.strip_prefix('$') {
        if let Ok(len) = len.trim().parse::<usize>() {
            let mut payload = vec![0; len + 2];
            reader.read_exact(&mut payload)?;
            line.push_str(&String::from_utf8_lossy(&payload));
        }
    }
    Ok(line)
}
