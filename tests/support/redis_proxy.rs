//! A TCP proxy in front of a `redis-server` that counts the client's round trips.
//!
//! Include it next to `examples/provider_sim/redis_server.rs`:
//!
//! ```ignore
//! #[path = "support/redis_proxy.rs"]
//! mod redis_proxy;
//! ```
//!
//! `MONITOR` shows which commands a server received, not how the client waited for their
//! replies: five `SET`s sent one after the other, each after the previous reply, look exactly
//! like five `SET`s written at once in a pipeline. [`RoundTripProxy`] tells them apart. It
//! forwards every command to the server at once, but **withholds the server's replies** until
//! the client has sent nothing for [`RoundTripProxy::start`]'s `idle` period, then lets all the
//! held replies through. A *round* is the list of commands the client sent between two such
//! releases:
//!
//! - a client that waits for a reply before sending its next command is caught with one
//!   command per round (it cannot send the next one before the release);
//! - a pipeline arrives whole before its first reply is let through: one round.
//!
//! So a count of rounds can never be lower than the number of times the client really waited
//! for Redis; it could only come out higher if the client paused for longer than `idle` in the
//! middle of writing one pipeline. Every round costs at least `idle` of wall time: keep the
//! commands measured through it few.
//!
//! The proxy parses the client's RESP arrays only to name the commands (`"SET"`, `"EVALSHA"`).
//! It runs on the test's tokio runtime; its tasks end with the runtime or on drop.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fred::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A proxy on `127.0.0.1:<port>` in front of a Redis server, counting round trips.
pub struct RoundTripProxy {
    port: u16,
    rounds: Arc<Mutex<Rounds>>,
    accept: JoinHandle<()>,
}

/// The commands of the current round and of the closed ones, over every connection.
#[derive(Default)]
struct Rounds {
    current: Vec<String>,
    closed: Vec<Vec<String>>,
}

impl Rounds {
    /// Closes the current round (if the client sent anything in it).
    fn close(&mut self) {
        if !self.current.is_empty() {
            let round = std::mem::take(&mut self.current);
            self.closed.push(round);
        }
    }
}

/// One proxied connection: the replies held back, and when the client last sent anything.
struct Held {
    replies: Vec<u8>,
    last_client_write: Instant,
}

impl RoundTripProxy {
    /// Listens on a free port of 127.0.0.1 and proxies every connection to the Redis server on
    /// `target`, releasing replies once the client has been quiet for `idle`.
    pub async fn start(target: u16, idle: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let rounds = Arc::new(Mutex::new(Rounds::default()));
        let shared = rounds.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(("127.0.0.1", target))
                    .await
                    .expect("the proxy connects to redis-server");
                proxy_connection(client, server, shared.clone(), idle);
            }
        });
        RoundTripProxy {
            port,
            rounds,
            accept,
        }
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A fred client connected through the proxy, with timeouts long enough for the held
    /// replies (5 s), no reconnection.
    pub async fn connect(&self) -> Client {
        let config = Config::from_url(&self.url()).expect("valid proxy url");
        let client = Builder::from_config(config)
            .with_performance_config(|perf| perf.default_command_timeout = Duration::from_secs(5))
            .with_connection_config(|conn| {
                conn.connection_timeout = Duration::from_secs(5);
                conn.internal_command_timeout = Duration::from_secs(5);
            })
            .build()
            .expect("fred client configuration is valid");
        client.init().await.expect("connect through the proxy");
        client
    }

    /// The rounds closed since the last call (each one the names of its commands, in the
    /// order the client sent them), and forgets them. Panics if commands are still waiting
    /// for their replies: call it once the measured calls have returned.
    pub fn take_rounds(&self) -> Vec<Vec<String>> {
        let mut rounds = self.rounds.lock().unwrap();
        assert!(
            rounds.current.is_empty(),
            "commands still unanswered: {:?}",
            rounds.current
        );
        std::mem::take(&mut rounds.closed)
    }
}

impl Drop for RoundTripProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Spawns the three tasks of one connection: client → server (recording the commands),
/// server → held replies, and the releaser.
fn proxy_connection(
    client: TcpStream,
    server: TcpStream,
    rounds: Arc<Mutex<Rounds>>,
    idle: Duration,
) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let held = Arc::new(Mutex::new(Held {
        replies: Vec::new(),
        last_client_write: Instant::now(),
    }));

    let (commands_held, commands_rounds) = (held.clone(), rounds.clone());
    tokio::spawn(async move {
        let mut pending = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            // Recorded before forwarding: no reply can be released before its command counts.
            pending.extend_from_slice(&buf[..n]);
            {
                let mut rounds = commands_rounds.lock().unwrap();
                while let Some((name, used)) = parse_command(&pending) {
                    rounds.current.push(name);
                    pending.drain(..used);
                }
                commands_held.lock().unwrap().last_client_write = Instant::now();
            }
            if server_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    });

    let replies_held = held.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => replies_held
                    .lock()
                    .unwrap()
                    .replies
                    .extend_from_slice(&buf[..n]),
            }
        }
    });

    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let out = {
                let mut rounds = rounds.lock().unwrap();
                let mut held = held.lock().unwrap();
                if held.replies.is_empty() || held.last_client_write.elapsed() < idle {
                    continue;
                }
                rounds.close();
                std::mem::take(&mut held.replies)
            };
            if client_write.write_all(&out).await.is_err() {
                return;
            }
        }
    });
}

/// The upper-case name of the first complete RESP command (`*N` array of bulk strings) in
/// `buf`, and the bytes it takes; `None` until it is complete.
fn parse_command(buf: &[u8]) -> Option<(String, usize)> {
    let (count, mut at) = parse_header(buf, b'*')?;
    let mut name = None;
    for _ in 0..count {
        let (len, start) = parse_header(&buf[at..], b'$')?;
        let start = at + start;
        let end = start + len;
        if buf.len() < end + 2 {
            return None;
        }
        name.get_or_insert_with(|| String::from_utf8_lossy(&buf[start..end]).to_uppercase());
        at = end + 2;
    }
    Some((name.unwrap_or_default(), at))
}

/// `<prefix><number>\r\n` at the start of `buf`: the number and the bytes it takes.
fn parse_header(buf: &[u8], prefix: u8) -> Option<(usize, usize)> {
    assert!(
        buf.first().is_none_or(|&b| b == prefix),
        "unexpected RESP from the client: {:?}",
        String::from_utf8_lossy(&buf[..buf.len().min(32)])
    );
    let end = buf.windows(2).position(|w| w == b"\r\n")?;
    let number = std::str::from_utf8(&buf[1..end]).ok()?.parse().ok()?;
    Some((number, end + 2))
}

#[test]
fn commands_are_named_once_complete() {
    let set = b"*3\r\n$3\r\nset\r\n$1\r\nk\r\n$1\r\nv\r\n";
    assert_eq!(parse_command(set), Some(("SET".to_owned(), set.len())));
    assert_eq!(parse_command(&set[..set.len() - 1]), None);
    assert_eq!(parse_command(b""), None);
    let two = [&set[..], b"*1\r\n$4\r\nPING\r\n"].concat();
    assert_eq!(parse_command(&two), Some(("SET".to_owned(), set.len())));
}
