//! A server as a child process on `127.0.0.1`: a free port, a fresh temporary directory, its
//! log, its kill and stop signals, and the waits for it to come up, first and after a kill.
//!
//! The plumbing under the throw-away servers: the provider simulator's `redis-server`
//! (`redis_server.rs` includes this file as `redis_server::process`) and, in the integration
//! tests, the Redis Cluster and Sentinel nodes (`tests/support/redis_nodes.rs`, through
//! `redis_server`) and the PostgreSQL server (`tests/support/postgres_server.rs` includes it
//! too: it does not need Redis). The standard library only.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A free port: bind port 0, read it, drop the listener.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|addr| addr.port())
        .expect("bind 127.0.0.1:0")
}

/// A fresh, empty directory `tower-idem-{prefix}-{pid}-{n}` under the system's temp dir (what a
/// dead process of the same pid left there is removed first). The name is kept short: a
/// server's Unix socket in it (PostgreSQL's `.s.PGSQL.<port>`) must fit in 107 bytes with the
/// temp dir's path.
pub fn unique_temp_dir(prefix: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tower-idem-{prefix}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a temp dir");
    dir
}

/// The log file at `path`, for failure messages.
pub fn read_log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| format!("(no log: {e})"))
}

/// SIGKILL (no shutdown, no save), then reaps the process, if `child` holds one.
pub fn kill(child: &mut Option<Child>) {
    if let Some(mut child) = child.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Sends `signal` (`-STOP`, `-CONT`) to `child` with `kill`.
pub fn signal(child: &Child, signal: &str) {
    let pid = child.id();
    let status = Command::new("kill")
        .arg(signal)
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {pid} failed");
}

/// Waits until `ready()` says the freshly spawned `child` serves, asking every `every` for
/// `timeout` at most: `Ok(child)`, or `Err` saying why not, to follow the server's name: it
/// `exited with ..`, or it `did not {what} within ..` (it is then killed).
pub fn wait_ready(
    mut child: Child,
    timeout: Duration,
    every: Duration,
    what: &str,
    mut ready: impl FnMut() -> bool,
) -> Result<Child, String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("exited with {status}"));
        }
        if ready() {
            return Ok(child);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("did not {what} within {timeout:?}"));
        }
        std::thread::sleep(every);
    }
}

/// Runs `start`, a server's start on the port it had, until it succeeds: every 100 ms (the
/// old socket may linger for a moment) for `timeout` at most, then panics naming `what`.
pub fn start_again(timeout: Duration, what: &str, mut start: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + timeout;
    loop {
        match start() {
            Ok(()) => return,
            Err(e) if Instant::now() >= deadline => panic!("could not restart {what}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}
