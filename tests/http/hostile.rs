//! Hostile input, over real loopback HTTP/1.1 where framing matters: oversized bodies (with and
//! without `Content-Length`), a body that trickles, JSON nested 10 000 deep, huge keys, keys with
//! non-UTF-8 and control bytes, and 1000 concurrent 1 MiB bodies. Every one is answered with a
//! clear 4xx (problem+json when the layer answers), the handler never runs, nothing panics, and
//! memory stays bounded (the 1000-body test prints its `VmHWM` figure; run it with
//! `--nocapture`). Also: a client that disconnects while its success is being recorded.
//!
//! Raw requests are written on a `TcpStream` so that the test controls every byte and the
//! framing; the rest go through hyper's client.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::key::{ExtractKey, FieldsFingerprintKey, JsonPathKey, from_body_fn};
use tower_idempotency::store::{Reservation, StoreError, StoreKey, Target};
use tower_idempotency::test_util::store::{Call, Hook, Hooked, OneTarget};
use tower_idempotency::test_util::values;
use tower_idempotency::{IdempotencyLayer, MemoryStore};

/// One app on `127.0.0.1:0`: `POST /hook` counts its calls, and holds the request for
/// `x-hold-ms` milliseconds when asked.
struct App {
    addr: std::net::SocketAddr,
    calls: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for App {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl App {
    async fn start<St: 'static, K: ExtractKey + Clone>(layer: IdempotencyLayer<St, K>) -> App {
        async fn hook(
            State(calls): State<Arc<AtomicUsize>>,
            headers: HeaderMap,
            body: Bytes,
        ) -> String {
            calls.fetch_add(1, Ordering::SeqCst);
            if let Some(ms) = headers
                .get("x-hold-ms")
                .and_then(|v| v.to_str().ok()?.parse().ok())
            {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            format!("got {} bytes", body.len())
        }
        let calls = Arc::new(AtomicUsize::new(0));
        let router = Router::new()
            .route("/hook", post(hook))
            .route_layer(layer)
            .with_state(calls.clone());
        // A backlog above the 1000 connections opened at once (tokio's `bind` uses 1024, and a
        // full accept queue drops or resets connections).
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(4096).unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        App { addr, calls, task }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }
}

/// A response read off the wire.
#[derive(Debug)]
struct Raw {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    /// The problem+json document, checked to be one.
    fn problem(&self) -> serde_json::Value {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{}",
            self.head
        );
        serde_json::from_slice(&self.body).expect("a problem+json body")
    }
}

/// Parses one HTTP/1.1 response (`Content-Length` framed, or read to EOF).
fn parse(bytes: &[u8]) -> Raw {
    let end = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no response head in {:?}", String::from_utf8_lossy(bytes)));
    let head = String::from_utf8_lossy(&bytes[..end]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line in {head:?}"));
    let mut raw = Raw {
        status,
        head,
        body: bytes[end + 4..].to_vec(),
    };
    if let Some(len) = raw.header("content-length").and_then(|l| l.parse().ok()) {
        raw.body.truncate(len);
    }
    raw
}

/// Writes `request` on a fresh connection (stopping quietly if the server closes it early) and
/// reads the response until the server closes the connection.
async fn raw_exchange(addr: std::net::SocketAddr, request: Vec<u8>) -> Raw {
    raw_trickle(addr, vec![(request, Duration::ZERO)]).await
}

/// Like [`raw_exchange`], writing each part after its delay.
async fn raw_trickle(addr: std::net::SocketAddr, parts: Vec<(Vec<u8>, Duration)>) -> Raw {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let write = tokio::spawn(async move {
        for (bytes, delay) in parts {
            tokio::time::sleep(delay).await;
            if writer.write_all(&bytes).await.is_err() {
                return;
            }
        }
        // Keep the write side open: the server must answer before we give up.
        tokio::time::sleep(Duration::from_secs(10)).await;
    });
    let mut response = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 8192];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => response.extend_from_slice(&buf[..n]),
            }
        }
    });
    read.await.expect("the server answered within 10 s");
    write.abort();
    parse(&response)
}

/// What the server at `addr` answers a request with the header `lines` and no body.
async fn bodiless(addr: std::net::SocketAddr, lines: &[&[u8]]) -> Raw {
    let mut lines = lines.to_vec();
    lines.push(b"Content-Length: 0");
    raw_exchange(addr, head(&lines)).await
}

/// A request head: `POST /hook`, `Connection: close`, the given header lines.
fn head(lines: &[&[u8]]) -> Vec<u8> {
    let mut out = b"POST /hook HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n".to_vec();
    for line in lines {
        out.extend_from_slice(line);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

fn json_id_layer(limit: usize) -> IdempotencyLayer<MemoryStore, JsonPathKey> {
    IdempotencyLayer::new(MemoryStore::new())
        .namespace("hostile")
        .body_limit(limit)
        .key(JsonPathKey::new("$.id").unwrap())
}

#[tokio::test]
async fn body_over_the_limit_with_content_length_is_413_before_it_is_read() {
    let app = App::start(
        IdempotencyLayer::new(MemoryStore::new())
            .namespace("hostile")
            .body_limit(64 * 1024),
    )
    .await;
    // The head alone decides: the 1 GB body is never sent, let alone read. A client that
    // asks `Expect: 100-continue` gets the 413 instead of a `100 Continue`.
    let raw = raw_exchange(
        app.addr,
        head(&[
            b"Idempotency-Key: big-1",
            b"Content-Length: 1000000000",
            b"Expect: 100-continue",
        ]),
    )
    .await;
    assert_eq!(raw.status, 413, "{}", raw.head);
    assert_eq!(raw.problem()["code"], "payload_too_large");

    // One byte over, sent in full by hyper's client.
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = Request::post(app.url())
        .header("idempotency-key", "big-2")
        .body(Full::new(Bytes::from(vec![b'x'; 64 * 1024 + 1])))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(app.calls(), 0);
}

#[tokio::test]
async fn chunked_body_over_the_limit_is_413_while_it_is_read() {
    let app = App::start(json_id_layer(16 * 1024)).await;
    // No Content-Length: the layer counts while reading, and stops at the limit. The client
    // sends 5 × 4 KiB and stops (no last chunk): the answer must not wait for the rest.
    let mut request = head(&[
        b"Transfer-Encoding: chunked",
        b"Content-Type: application/json",
    ]);
    for _ in 0..5 {
        request.extend_from_slice(&chunk(&[b' '; 4096]));
    }
    let raw = raw_exchange(app.addr, request).await;
    assert_eq!(raw.status, 413, "{}", raw.head);
    let problem = raw.problem();
    assert_eq!(problem["code"], "payload_too_large");
    assert_eq!(problem["status"], 413);
    assert_eq!(app.calls(), 0);
}

#[tokio::test]
async fn trickling_body_is_408_and_takes_no_claim() {
    let app = App::start(
        IdempotencyLayer::new(MemoryStore::new())
            .namespace("hostile")
            .body_timeout(Duration::from_millis(300)),
    )
    .await;
    let body = br#"{"id":"evt_slowloris"}"#;
    // One byte every 100 ms: 2.2 s for the body, against a 300 ms read timeout.
    let mut parts = vec![(
        head(&[
            b"Idempotency-Key: evt_slowloris",
            format!("Content-Length: {}", body.len()).as_bytes(),
        ]),
        Duration::ZERO,
    )];
    parts.extend(body.iter().map(|b| (vec![*b], Duration::from_millis(100))));
    let started = Instant::now();
    let raw = raw_trickle(app.addr, parts).await;
    assert_eq!(raw.status, 408, "{}", raw.head);
    assert!(raw.problem()["detail"].as_str().is_some());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "answered at the timeout, not at the end of the body"
    );
    assert_eq!(app.calls(), 0);

    // No claim was taken: the retry with a normal body is processed at once (no 409).
    let mut request = head(&[
        b"Idempotency-Key: evt_slowloris",
        format!("Content-Length: {}", body.len()).as_bytes(),
    ]);
    request.extend_from_slice(body);
    let raw = raw_exchange(app.addr, request).await;
    assert_eq!(raw.status, 200, "{}", raw.head);
    assert_eq!(app.calls(), 1);
}

#[tokio::test]
async fn json_nested_ten_thousand_deep_is_400_not_a_stack_overflow() {
    let deep_array = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let deep_object = format!(r#"{}1{}"#, r#"{"a":"#.repeat(10_000), "}".repeat(10_000));
    let deep_id = format!(r#"{{"id":"evt_1","x":{deep_array}}}"#);
    #[allow(unused_mut)]
    let mut extractors: Vec<Arc<dyn ExtractKey>> = vec![
        Arc::new(JsonPathKey::new("$.id").unwrap()),
        Arc::new(FieldsFingerprintKey::new(["$.id", "$.x"]).unwrap()),
    ];
    // A descendant path queries the parsed body (the `jsonpath` feature).
    #[cfg(feature = "jsonpath")]
    extractors.push(Arc::new(JsonPathKey::new("$..id").unwrap()));
    for extractor in extractors {
        let app = App::start(
            IdempotencyLayer::new(MemoryStore::new())
                .namespace("hostile")
                .key(extractor),
        )
        .await;
        for body in [&deep_array, &deep_object, &deep_id] {
            let mut request = head(&[
                b"Content-Type: application/json",
                format!("Content-Length: {}", body.len()).as_bytes(),
            ]);
            request.extend_from_slice(body.as_bytes());
            let raw = raw_exchange(app.addr, request).await;
            assert_eq!(raw.status, 400, "{}", raw.head);
            let problem = raw.problem();
            assert_eq!(problem["code"], "malformed_key");
            assert!(
                problem["detail"]
                    .as_str()
                    .unwrap()
                    .contains("not valid JSON"),
                "{problem}"
            );
        }
        assert_eq!(app.calls(), 0);
    }
}

#[tokio::test]
async fn key_of_10_kib_is_400_and_a_half_megabyte_head_is_431_from_hyper() {
    let app = App::start(IdempotencyLayer::new(MemoryStore::new()).namespace("hostile")).await;
    let key = "k".repeat(10 * 1024);
    let raw = bodiless(app.addr, &[format!("Idempotency-Key: {key}").as_bytes()]).await;
    assert_eq!(raw.status, 400, "{}", raw.head);
    let problem = raw.problem();
    assert_eq!(problem["code"], "malformed_key");
    assert!(
        problem["detail"].as_str().unwrap().contains("10240 bytes"),
        "{problem}"
    );
    // A key is never echoed back.
    assert!(!String::from_utf8_lossy(&raw.body).contains("kkkk"));

    // A head past hyper's buffer (about 400 KiB by default) never reaches the layer: hyper
    // answers 431 Request Header Fields Too Large itself, with an empty body.
    let key = "k".repeat(512 * 1024);
    let raw = bodiless(app.addr, &[format!("Idempotency-Key: {key}").as_bytes()]).await;
    assert_eq!(raw.status, 431, "{}", raw.head);
    assert_eq!(app.calls(), 0);
}

#[tokio::test]
async fn non_utf8_and_control_bytes_in_keys_are_400() {
    let app = App::start(
        IdempotencyLayer::new(MemoryStore::new())
            .namespace("hostile")
            .key(
                tower_idempotency::key::HeaderKey::idempotency_key()
                    .or(JsonPathKey::new("$.id").unwrap()),
            ),
    )
    .await;
    // Bytes hyper lets through (tab, obs-text) reach the layer, which says what is wrong.
    let cases: [(&[u8], &str); 5] = [
        (b"Idempotency-Key: caf\xe9", "not visible ASCII"),
        (b"Idempotency-Key: \xff\xfe\xfd", "not visible ASCII"),
        (b"Idempotency-Key: caf\xc3\xa9", "not visible ASCII"),
        (b"Idempotency-Key: a\tb", "control character"),
        (b"Idempotency-Key: \t", "empty"),
    ];
    for (line, why) in cases {
        let raw = raw_exchange(
            app.addr,
            head(&[line, b"Content-Length: 2"])
                .into_iter()
                .chain(*b"{}")
                .collect(),
        )
        .await;
        assert_eq!(raw.status, 400, "{line:?}: {}", raw.head);
        let problem = raw.problem();
        assert_eq!(problem["code"], "malformed_key", "{line:?}");
        assert!(
            problem["detail"].as_str().unwrap().contains(why),
            "{line:?}: {problem}"
        );
    }
    // A key sent twice is ambiguous.
    let raw = bodiless(app.addr, &[b"Idempotency-Key: a", b"Idempotency-Key: b"]).await;
    assert_eq!(raw.status, 400, "{}", raw.head);
    assert!(
        raw.problem()["detail"]
            .as_str()
            .unwrap()
            .contains("more than once")
    );

    // Other control bytes are not valid in a header at all: hyper refuses the request with a
    // bare 400 before any service sees it.
    for line in [
        &b"Idempotency-Key: a\x01b"[..],
        b"Idempotency-Key: a\x7fb",
        b"Idempotency-Key: a\x00b",
    ] {
        let raw = bodiless(app.addr, &[line]).await;
        assert_eq!(raw.status, 400, "{line:?}: {}", raw.head);
    }

    // In a JSON key: escaped control characters (C0, DEL, C1) and invalid UTF-8.
    let bodies: [&[u8]; 5] = [
        br#"{"id":"a\u0001b"}"#,
        br#"{"id":"a\u007fb"}"#,
        br#"{"id":"a\u0085b"}"#,
        br#"{"id":"line\nbreak"}"#,
        b"{\"id\":\"caf\xe9\"}",
    ];
    for body in bodies {
        let mut request = head(&[
            b"Content-Type: application/json",
            format!("Content-Length: {}", body.len()).as_bytes(),
        ]);
        request.extend_from_slice(body);
        let raw = raw_exchange(app.addr, request).await;
        assert_eq!(raw.status, 400, "{body:?}: {}", raw.head);
        assert_eq!(raw.problem()["code"], "malformed_key", "{body:?}");
    }
    assert_eq!(app.calls(), 0);
}

/// A memory store whose `complete` takes 300 ms to reach the store, like a store call that
/// must first acquire a pooled connection.
type SlowComplete = Hooked<MemoryStore, Slow>;

#[derive(Clone, Default)]
struct Slow;

impl Hook for Slow {
    async fn before(&self, call: Call, _: &[Target]) -> Result<(), StoreError> {
        if call == Call::Complete {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        Ok(())
    }
}

/// A client that disconnects after the handler succeeded, while the key is being recorded:
/// the server drops the request future, but the record is still written, so the retry is a
/// duplicate (found by the provider simulator with a slow `complete`: before the fix, the
/// record was abandoned, the claim expired with its lease, and the retry ran the effect again).
#[tokio::test]
async fn client_disconnect_while_recording_still_records_the_key() {
    let store = SlowComplete::default();
    // A lease far longer than the 300 ms the record takes: the record never finds its claim
    // expired, however slow the machine.
    let app = App::start(
        IdempotencyLayer::new(store.clone())
            .namespace("hostile")
            .lease(Duration::from_secs(2)),
    )
    .await;
    let mut request = head(&[b"Idempotency-Key: evt_gone", b"Content-Length: 2"]);
    request.extend_from_slice(b"{}");
    let mut stream = TcpStream::connect(app.addr).await.unwrap();
    stream.write_all(&request).await.unwrap();
    // The handler answers at once; the record takes 300 ms. Leave in the middle: as soon as
    // the handler has run (the server shares this thread, so it is now waiting on the record).
    let waiting = Instant::now();
    while app.calls() == 0 {
        assert!(
            waiting.elapsed() < Duration::from_secs(5),
            "the handler never ran"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(app.calls(), 1);
    drop(stream);
    // Past the lease: an abandoned claim would have expired by now.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let key = StoreKey::new("hostile", Some("/hook"), "evt_gone");
    let probe = values::claim(Fingerprint::of_bytes(b"{}"));
    let found = store
        .store
        .reserve_one(&key, &probe, Duration::from_secs(1))
        .await
        .unwrap();
    assert!(matches!(found, Reservation::Completed(_)), "{found:?}");

    let raw = raw_exchange(app.addr, request).await;
    assert_eq!(raw.status, 200, "{}", raw.head);
    assert_eq!(raw.header("idempotent-replayed"), Some("true"));
    assert_eq!(app.calls(), 1, "the effect ran once");
}

/// `VmHWM` (peak resident set) of this process, in KiB.
fn vm_hwm_kib() -> u64 {
    proc_status_kib("VmHWM:")
}

fn proc_status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The soft limit on open files, from `/proc/self/limits`.
fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    limits
        .lines()
        .find(|l| l.starts_with("Max open files"))?
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_concurrent_one_mib_bodies_are_all_answered_with_bounded_memory() {
    const LIMIT: usize = 1024 * 1024;
    // Each request holds a client and a server socket.
    let concurrency = match open_files_limit() {
        Some(limit) if limit < 2_300 => ((limit as usize).saturating_sub(300) / 2).max(50),
        _ => 1000,
    };
    let app = App::start(
        IdempotencyLayer::new(MemoryStore::new())
            .namespace("hostile")
            .body_limit(LIMIT)
            // A key extractor that reads the body makes the layer buffer every body in full,
            // as payload fingerprinting does; fingerprinting itself is off only because
            // SHA-256 over 1 GiB takes half a minute in an unoptimised test build.
            .fingerprint(false)
            .key(from_body_fn(|parts, _body| {
                let key = parts.headers.get("idempotency-key")?;
                Some(key.to_str().ok()?.to_owned())
            })),
    )
    .await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    // One shared buffer: the client side costs nothing per request.
    let body = Bytes::from(vec![b'a'; LIMIT]);

    // Linux ≥ 4.0: writing 5 to clear_refs resets VmHWM to the current RSS.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let rss_before = proc_status_kib("VmRSS:");
    let hwm_before = vm_hwm_kib();
    let started = Instant::now();
    let requests = (0..concurrency).map(|i| {
        let client = client.clone();
        let body = body.clone();
        let url = app.url();
        tokio::spawn(async move {
            let request = Request::post(url)
                .header("idempotency-key", format!("bulk-{i}"))
                .header("x-hold-ms", "200")
                .body(Full::new(body))
                .unwrap();
            let response = client.request(request).await.expect("answered");
            let status = response.status();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (i, status, body)
        })
    });
    let results = futures_util::future::join_all(requests).await;
    let elapsed = started.elapsed();
    let hwm_after = vm_hwm_kib();

    for result in results {
        let (i, status, body) = result.expect("no task panicked");
        assert_eq!(status, StatusCode::OK, "request {i}");
        assert_eq!(body, format!("got {LIMIT} bytes"));
    }
    assert_eq!(app.calls(), concurrency);

    let peak_growth_mib = hwm_after.saturating_sub(hwm_before) as f64 / 1024.0;
    let bound_mib = (concurrency * LIMIT) as f64 / (1024.0 * 1024.0);
    println!(
        "{concurrency} concurrent 1 MiB bodies in {:.1} s: \
         RSS before {:.0} MiB, VmHWM before {:.0} MiB, after {:.0} MiB: peak growth {peak_growth_mib:.0} MiB \
         = {:.2} × (limit × concurrency = {bound_mib:.0} MiB)",
        elapsed.as_secs_f64(),
        rss_before as f64 / 1024.0,
        hwm_before as f64 / 1024.0,
        hwm_after as f64 / 1024.0,
        peak_growth_mib / bound_mib,
    );
    if hwm_after > 0 {
        // Buffering is bounded by the limit per request; allow 3× for hyper's read buffers,
        // the chunks being joined into one buffer, and allocator slack.
        assert!(
            peak_growth_mib < 3.0 * bound_mib,
            "peak memory grew {peak_growth_mib:.0} MiB for {concurrency} bodies of 1 MiB"
        );
    }
}

/// The demo's bounds on connections, over real sockets against the built demo.
#[cfg(all(feature = "metrics", feature = "verify", feature = "admin"))]
use crate::harness;

#[cfg(all(feature = "metrics", feature = "verify", feature = "admin"))]
mod demo_connections {
    use super::harness::{Http, start_demo, start_example_with_fd_limit};
    use super::*;

    /// Reads until the server closes `stream` (or `limit` passes): how long it took from
    /// `opened`, or `None` if it stayed open.
    async fn closed_after(
        mut stream: TcpStream,
        opened: Instant,
        limit: Duration,
    ) -> Option<Duration> {
        let mut buf = [0u8; 1024];
        let deadline = opened + limit;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            match tokio::time::timeout(left, stream.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return Some(opened.elapsed()),
                Ok(Ok(_)) => continue,
                Err(_) => return None,
            }
        }
    }

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    /// An empty SETTINGS frame.
    const SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];

    /// Whatever a connection sent short of a request head (nothing, `P`, `PR`, part of the
    /// HTTP/2 preface, the preface and SETTINGS, a partial HTTP/1 head), it is closed at
    /// `HEADER_TIMEOUT_MS` from its opening, not before.
    #[tokio::test]
    async fn connections_without_a_request_head_are_closed_at_the_header_timeout() {
        let demo = start_demo(&[("HEADER_TIMEOUT_MS", "500")]);
        let addr = demo.base.trim_start_matches("http://").to_owned();
        let preface_settings = [PREFACE, SETTINGS].concat();
        let sends: Vec<(&str, Vec<u8>)> = vec![
            ("nothing", vec![]),
            ("P", b"P".to_vec()),
            ("PR", b"PR".to_vec()),
            ("partial preface", PREFACE[..10].to_vec()),
            ("preface + SETTINGS", preface_settings),
            (
                "partial h1 head",
                b"POST /webhooks/kalipto HTTP/1.1\r\nho".to_vec(),
            ),
        ];
        let mut waits = Vec::new();
        for (name, bytes) in sends {
            let opened = Instant::now();
            let mut stream = TcpStream::connect(&addr).await.unwrap();
            stream.write_all(&bytes).await.unwrap();
            waits.push(async move {
                (
                    name,
                    closed_after(stream, opened, Duration::from_secs(5)).await,
                )
            });
        }
        for (name, closed) in futures_util::future::join_all(waits).await {
            let closed = closed.unwrap_or_else(|| panic!("{name}: still open after 5 s"));
            assert!(
                closed >= Duration::from_millis(450),
                "{name}: closed early, {closed:?}"
            );
        }
    }

    /// On a kept-alive HTTP/1 connection, the next head is due within `HEADER_TIMEOUT_MS` of
    /// the previous request's end: one dripped a byte every 100 ms (about 5 s for the head) is
    /// closed at the header timeout, not at the idle one, and not before.
    #[tokio::test]
    async fn a_later_http1_head_dripped_is_closed_at_the_header_timeout() {
        let demo = start_demo(&[("HEADER_TIMEOUT_MS", "500"), ("IDLE_TIMEOUT_MS", "20000")]);
        let addr = demo.base.trim_start_matches("http://").to_owned();
        let mut stream = TcpStream::connect(&addr).await.unwrap();
        let request = |id: &str| {
            format!(
                "POST /webhooks/kalipto HTTP/1.1\r\nhost: x\r\nx-kalipto-delivery-id: {id}\r\n\
                 content-type: application/json\r\ncontent-length: 2\r\n\r\n{{}}"
            )
        };
        stream
            .write_all(request("pd_keepalive").as_bytes())
            .await
            .unwrap();
        let mut reply = Vec::new();
        let mut buf = [0u8; 1024];
        while !String::from_utf8_lossy(&reply).contains("{\"ok\":true}") {
            let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
                .await
                .expect("no answer to the first request")
                .unwrap();
            assert!(read > 0, "closed after the first request");
            reply.extend_from_slice(&buf[..read]);
        }
        assert!(String::from_utf8_lossy(&reply).starts_with("HTTP/1.1 200"));
        let answered = Instant::now();
        let (mut read_half, mut write_half) = stream.into_split();
        let drip = tokio::spawn(async move {
            for byte in request("pd_dripped").into_bytes() {
                if write_half.write_all(&[byte]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let closed = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match read_half.read(&mut buf).await {
                    Ok(0) | Err(_) => return answered.elapsed(),
                    Ok(_) => continue,
                }
            }
        })
        .await
        .expect("a dripped later head was kept past 5 s");
        drip.abort();
        assert!(
            closed >= Duration::from_millis(400),
            "closed early: {closed:?}"
        );
        assert!(closed < Duration::from_secs(3), "closed late: {closed:?}");
    }

    /// An HTTP/2 connection is served past the header timeout once a request came, and is
    /// closed after `IDLE_TIMEOUT_MS` without one (the client answers pings: only the idle
    /// deadline closes it).
    #[tokio::test]
    async fn an_idle_http2_connection_is_closed_after_the_idle_time() {
        let demo = start_demo(&[("HEADER_TIMEOUT_MS", "500"), ("IDLE_TIMEOUT_MS", "1500")]);
        let addr = demo.base.trim_start_matches("http://").to_owned();
        let stream = TcpStream::connect(&addr).await.unwrap();
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        let conn = tokio::spawn(conn);
        let get = || {
            Request::get(format!("http://{addr}/effects"))
                .body(Full::new(Bytes::new()))
                .unwrap()
        };
        assert_eq!(
            sender.send_request(get()).await.unwrap().status(),
            StatusCode::OK
        );
        // Past the header timeout: still served.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert_eq!(
            sender.send_request(get()).await.unwrap().status(),
            StatusCode::OK
        );
        let idle = Instant::now();
        tokio::time::timeout(Duration::from_secs(6), conn)
            .await
            .expect("an idle HTTP/2 connection was kept open")
            .unwrap()
            .ok();
        assert!(
            idle.elapsed() >= Duration::from_millis(1300),
            "closed early: {:?}",
            idle.elapsed()
        );
    }

    /// File-descriptor exhaustion, scaled down: the demo may open 150 files, serves at most 50
    /// connections; 200 one-byte connections are opened, and a genuine delivery still gets 200
    /// within a few seconds (the excess shed on accept, the rest closed at the header timeout).
    #[tokio::test]
    async fn one_byte_flood_past_max_connections_does_not_starve_a_delivery() {
        let demo = start_example_with_fd_limit(
            "webhook_receiver",
            150,
            &[("HEADER_TIMEOUT_MS", "500"), ("MAX_CONNECTIONS", "50")],
        );
        let addr = demo.base.trim_start_matches("http://").to_owned();
        let mut flood = Vec::new();
        for _ in 0..200 {
            let mut stream = TcpStream::connect(&addr).await.unwrap();
            let _ = stream.write_all(b"P").await;
            flood.push(stream);
        }
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let started = Instant::now();
        let status = loop {
            let request = Request::post(format!("{}/webhooks/kalipto", demo.base))
                .header("content-type", "application/json")
                .header("X-Kalipto-Delivery-Id", "pd_flood")
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap();
            match tokio::time::timeout(Duration::from_secs(2), client.request(request)).await {
                Ok(Ok(response)) => break response.status(),
                _ if started.elapsed() < Duration::from_secs(8) => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                other => panic!("no answer to a genuine delivery: {other:?}"),
            }
        };
        assert_eq!(status, StatusCode::OK);
        assert!(started.elapsed() < Duration::from_secs(8));
        let metrics = Http::new(&demo).metrics().await;
        assert!(
            metrics.contains("demo_connections_shed_total"),
            "nothing was shed"
        );
        drop(flood);
    }
}
