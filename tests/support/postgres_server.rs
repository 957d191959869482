//! A real PostgreSQL server for integration tests: one throw-away cluster per
//! [`PostgresServer`].
//!
//! Include it from any integration test with:
//!
//! ```ignore
//! #[path = "support/postgres_server.rs"]
//! mod postgres_server;
//!
//! use postgres_server::PostgresServer;
//! ```
//!
//! [`PostgresServer::new`] runs `initdb` into a fresh temporary directory, starts `postgres`
//! on `127.0.0.1` and a free port (its Unix socket in the same directory), waits until it
//! accepts connections (`pg_isready`) and creates the database [`DATABASE`]. Trust
//! authentication, user `postgres`: [`PostgresServer::url`] needs no password.
//!
//! The binaries are found in `$PG_BIN_DIR`, else in the newest `/usr/lib/postgresql/<ver>/bin`
//! (Debian's `postgresql` package), else on `PATH`. If they cannot be found the harness
//! **panics**: a missing server is a test failure, never a silent skip (`scripts/test`
//! installs the package).
//!
//! PostgreSQL refuses to run as root: when the tests run as root, `initdb`, `postgres` and
//! `pg_ctl` run as the `postgres` system user (created by the package; created here with
//! `useradd` if missing), and the temporary directory is handed over to it.
//!
//! [`stop`](PostgresServer::stop) shuts the server down in `immediate` mode (like a crash: no
//! checkpoint, the WAL is replayed on the next start) and [`start`](PostgresServer::start)
//! starts it again on the same port and data directory, so tests can check that data survives
//! a restart and what a store does while its database is down. The server is stopped and its
//! directory removed when the value is dropped; a watchdog process does the same if the test
//! process exits without dropping it (a server kept in a `static`).
#![allow(dead_code)]

// The process plumbing of the Redis servers: a copy of its own, PostgreSQL not needing Redis.
#[allow(clippy::duplicate_mod)]
#[path = "../../examples/provider_sim/process.rs"]
mod process;

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use process::free_port;

/// The database every server creates, and that [`PostgresServer::url`] names.
pub const DATABASE: &str = "idem";

/// How long to wait for a server to accept connections after it was started.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// A PostgreSQL server process on `127.0.0.1`, stopped and deleted on drop.
pub struct PostgresServer {
    bin_dir: PathBuf,
    /// The temporary directory: `data/` (the cluster), the socket and `postgres.log`.
    dir: PathBuf,
    port: u16,
    /// The uid and gid to run the binaries as (`None`: as ourselves).
    run_as: Option<(u32, u32)>,
    child: Option<Child>,
    watchdog: Option<Child>,
}

impl PostgresServer {
    /// Creates a cluster, starts the server on a free port, waits until it accepts connections
    /// and creates the database [`DATABASE`].
    ///
    /// Panics (loudly) if the PostgreSQL binaries are not installed or the server does not
    /// come up.
    pub fn new() -> Self {
        let bin_dir = bin_dir();
        let run_as = run_as();
        let dir = unique_temp_dir();
        let mut server = PostgresServer {
            bin_dir,
            dir,
            port: 0,
            run_as,
            child: None,
            watchdog: None,
        };
        server.init_db();
        server.spawn_watchdog();
        let mut last_error = String::new();
        // A free port may be taken by another process before postgres binds it: try others.
        for _ in 0..10 {
            server.port = free_port();
            match server.spawn_and_wait() {
                Ok(()) => {
                    server.run_ok(
                        Command::new(server.bin("createdb"))
                            .args(["-h", "127.0.0.1", "-p", &server.port.to_string()])
                            .args(["-U", "postgres", DATABASE]),
                        "createdb",
                    );
                    return server;
                }
                Err(e) => last_error = e,
            }
        }
        panic!(
            "could not start postgres after 10 attempts: {last_error}\n{}",
            server.log()
        );
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:<port>/idem`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{DATABASE}", self.port)
    }

    /// Whether the server process is running (started and not stopped).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Stops the server in `immediate` mode (all connections cut, no checkpoint: like a crash)
    /// and waits for the process to exit. Committed data survives (it is in the WAL).
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SIGQUIT: immediate shutdown. The postmaster takes its backends down and exits.
        let _ = Command::new("kill")
            .args(["-QUIT", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Starts the server again on the same port and data directory (stopping it first if it
    /// runs) and waits until it accepts connections.
    pub fn start(&mut self) {
        self.stop();
        let what = format!("postgres on port {}", self.port);
        process::start_again(STARTUP_TIMEOUT, &what, || {
            self.spawn_and_wait()
                .map_err(|e| format!("{e}\n{}", self.log()))
        });
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default()
    }

    fn bin(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// A command that runs as the server's user, from its directory.
    fn prepare(&self, command: &mut Command) {
        command.current_dir(&self.dir);
        if let Some((uid, gid)) = self.run_as {
            command.uid(uid).gid(gid);
        }
    }

    fn run_ok(&self, command: &mut Command, what: &str) {
        self.prepare(command);
        let output = command
            .output()
            .unwrap_or_else(|e| panic!("could not run {what}: {e}"));
        assert!(
            output.status.success(),
            "{what} failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    fn init_db(&self) {
        self.run_ok(
            Command::new(self.bin("initdb"))
                .arg("-D")
                .arg(self.data_dir())
                .args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"]),
            "initdb",
        );
    }

    /// Spawns `postgres` and waits until `pg_isready` says it accepts connections.
    fn spawn_and_wait(&mut self) -> Result<(), String> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("postgres.log"))
            .map_err(|e| format!("cannot open the log: {e}"))?;
        let log_err = log.try_clone().map_err(|e| e.to_string())?;
        let mut command = Command::new(self.bin("postgres"));
        command
            .arg("-D")
            .arg(self.data_dir())
            .arg("-k")
            .arg(&self.dir)
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            // Throw-away data: no fsync (a crash of the server loses nothing, since the WAL is
            // in the kernel's page cache; only an OS crash would). `synchronous_commit` stays
            // on: off, an immediate stop loses the last commits, and the tests check they
            // survive.
            .args(["-c", "fsync=off"])
            .args(["-c", "full_page_writes=off", "-c", "shared_buffers=16MB"])
            .args(["-c", "max_connections=300"])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        self.prepare(&mut command);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("could not run {}: {e}", self.bin("postgres").display()));
        let every = Duration::from_millis(50);
        let what = "accept connections";
        let child = process::wait_ready(child, STARTUP_TIMEOUT, every, what, || {
            Command::new(self.bin("pg_isready"))
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
                .args(["-U", "postgres", "-d", "postgres"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .map_err(|e| format!("postgres {e}"))?;
        self.child = Some(child);
        Ok(())
    }

    /// A shell process that waits for this test process to exit, then kills the postmaster
    /// named in `postmaster.pid` (whichever one runs by then) and removes the directory.
    fn spawn_watchdog(&mut self) {
        let script = r#"while kill -0 "$0" 2>/dev/null; do sleep 0.5; done
pid=$(head -n 1 "$1/data/postmaster.pid" 2>/dev/null)
[ -n "$pid" ] && kill -QUIT "$pid" 2>/dev/null && sleep 1 && kill -KILL "$pid" 2>/dev/null
rm -rf "$1""#;
        let watchdog = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg(std::process::id().to_string())
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("could not spawn the postgres watchdog (sh)");
        self.watchdog = Some(watchdog);
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
        if !self.dir.as_os_str().is_empty() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// The directory of the PostgreSQL binaries. Panics when there is none.
fn bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("PG_BIN_DIR") {
        let dir = PathBuf::from(dir);
        assert!(
            dir.join("initdb").exists(),
            "PG_BIN_DIR={} has no initdb",
            dir.display()
        );
        return dir;
    }
    // Debian: /usr/lib/postgresql/<major>/bin, newest first.
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let major = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((major, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return bin;
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("initdb").exists() && dir.join("postgres").exists() {
                return dir;
            }
        }
    }
    panic!(
        "PostgreSQL server binaries (initdb, postgres) not found: install Debian's `postgresql` \
         package (`apt-get install postgresql`, as scripts/test does) or set PG_BIN_DIR. \
         The PostgreSQL tests never skip."
    );
}

/// The uid and gid of the `postgres` user when running as root (creating the user if needed);
/// `None` otherwise.
fn run_as() -> Option<(u32, u32)> {
    if id(&["-u"]) != Some(0) {
        return None;
    }
    if id(&["-u", "postgres"]).is_none() {
        let _ = Command::new("useradd")
            .args(["--system", "--no-create-home", "--user-group", "postgres"])
            .status();
    }
    let uid = id(&["-u", "postgres"]).expect(
        "running as root, and there is no `postgres` user to run PostgreSQL as \
         (useradd failed): install Debian's `postgresql` package",
    );
    let gid = id(&["-g", "postgres"]).expect("the postgres user has no group");
    Some((uid, gid))
}

fn id(args: &[&str]) -> Option<u32> {
    let output = Command::new("id").args(args).output().ok()?;
    if !output.status.success() {
        return None;
    }
    String::from_utf8(output.stdout).ok()?.trim().parse().ok()
}

/// A fresh directory under the system temp dir, owned by the user the server runs as.
fn unique_temp_dir() -> PathBuf {
    let dir = process::unique_temp_dir("pg");
    if let Some((uid, gid)) = run_as() {
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown the postgres temp dir");
    }
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).expect("chmod the temp dir");
    dir
}
