//! The one harness that starts the example binaries for every test file: the built example,
//! `BIND=127.0.0.1:0`, its `listening on http://ADDR` first line, the rest of its stdout kept,
//! killed when dropped; `inbox_worker` processes, once `worker ready`; and an HTTP client for
//! the examples that listen.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// A running example binary, killed when dropped.
pub struct Example {
    pub child: Child,
    /// `http://ADDR`, from its first line.
    pub base: String,
    stdout: BufReader<ChildStdout>,
}

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Example {
    /// The next line the binary prints after its first, trimmed.
    pub fn next_line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().to_owned()
    }
}

/// The path of the built example `name` (`cargo test` builds the examples).
pub fn example_path(name: &str) -> std::path::PathBuf {
    // target/debug/deps/<test>-<hash> → target/debug/examples/<name>
    let exe = std::env::current_exe().unwrap();
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.exists(),
        "build the examples first: {}",
        path.display()
    );
    path
}

/// Starts the example `name` with `envs` (and without the caller's `REDIS_URL` and
/// `DATABASE_URL`, unless `envs` sets them), once it is listening.
pub fn start_example(name: &str, envs: &[(&str, &str)]) -> Example {
    spawn_listening(Command::new(example_path(name)), envs)
}

/// [`start_example`] with at most `limit` open file descriptors (through `prlimit`).
pub fn start_example_with_fd_limit(name: &str, limit: u64, envs: &[(&str, &str)]) -> Example {
    let mut command = Command::new("prlimit");
    command
        .arg(format!("--nofile={limit}"))
        .arg(example_path(name));
    spawn_listening(command, envs)
}

/// Spawns `command` with `envs` (and without the caller's `REDIS_URL` and `DATABASE_URL`,
/// unless `envs` sets them), its stdout piped; returns it with its first line.
fn spawn(mut command: Command, envs: &[(&str, &str)]) -> (Child, BufReader<ChildStdout>, String) {
    command
        .env_remove("REDIS_URL")
        .env_remove("DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (k, v) in envs {
        command.env(k, v);
    }
    let mut child = command.spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    (child, stdout, first)
}

fn spawn_listening(mut command: Command, envs: &[(&str, &str)]) -> Example {
    command.env("BIND", "127.0.0.1:0");
    let (child, stdout, first) = spawn(command, envs);
    let base = first
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .to_owned();
    Example {
        child,
        base,
        stdout,
    }
}

/// The demo receiver (`examples/webhook_receiver.rs`).
pub fn start_demo(envs: &[(&str, &str)]) -> Example {
    start_example("webhook_receiver", envs)
}

/// A running `inbox_worker` example (`examples/inbox_worker.rs`), SIGKILLed when dropped.
pub struct Worker(Child);

impl Worker {
    /// SIGKILL: no shutdown, no settlement, the lease left to run out.
    pub fn kill(&mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts an `inbox_worker` process with `envs` (and without the caller's `REDIS_URL` and
/// `DATABASE_URL`, unless `envs` sets them), once it printed `worker ready`.
pub fn start_worker(envs: &[(&str, &str)]) -> Worker {
    let (child, _, first) = spawn(Command::new(example_path("inbox_worker")), envs);
    assert_eq!(first.trim(), "worker ready");
    Worker(child)
}

/// An HTTP/1.1 client of one example.
pub struct Http {
    pub client: Client<HttpConnector, Full<Bytes>>,
    pub base: String,
}

impl Http {
    pub fn new(example: &Example) -> Self {
        Http {
            client: Client::builder(TokioExecutor::new()).build_http(),
            base: example.base.clone(),
        }
    }

    /// Sends a request (`content-type: application/json` unless `headers` set one) and returns
    /// the status, the headers and the raw body.
    pub async fn send_raw(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (StatusCode, HeaderMap, Bytes) {
        let mut builder = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        {
            builder = builder.header("content-type", "application/json");
        }
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let request = builder
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        let response = tokio::time::timeout(Duration::from_secs(10), self.client.request(request))
            .await
            .unwrap()
            .unwrap();
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        (parts.status, parts.headers, bytes)
    }

    /// [`send_raw`](Self::send_raw), the body as JSON (`null` when it is not).
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (StatusCode, HeaderMap, Value) {
        let (status, headers, bytes) = self.send_raw(method, path, headers, body).await;
        (
            status,
            headers,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// [`send`](Self::send) of a `POST`.
    pub async fn post(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (StatusCode, HeaderMap, Value) {
        self.send("POST", path, headers, body).await
    }

    /// `GET /effects` of the demo.
    pub async fn effects(&self) -> Value {
        self.send("GET", "/effects", &[], "").await.2
    }

    /// `GET /metrics`: Prometheus text.
    pub async fn metrics(&self) -> String {
        let (_, _, text) = self.send_raw("GET", "/metrics", &[], "").await;
        String::from_utf8_lossy(&text).into_owned()
    }
}

/// The body of the demo's email event `event` (`email.delivered`, message `msg-{event}`), with
/// the members of `extra` added or replaced.
pub fn email(event: &str, extra: Value) -> String {
    let mut body = serde_json::json!({
        "event_id": event,
        "message_id": format!("msg-{event}"),
        "type": "email.delivered",
        "occurred_at": "2026-12-02T10:00:00Z",
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body.to_string()
}
