//! What the layer costs in process, side by side with the bare service, on the memory store.
//!
//! ```text
//! cargo bench --all-features --bench layer
//! cargo bench --all-features --bench layer -- first/        # one group
//! ```
//!
//! Every request goes through `tower::ServiceExt::oneshot` on a current-thread Tokio runtime,
//! and its response body is read to the end. The inner service reads the request body and
//! answers `200 {"ok":true}`; the bare service is that same function without the layer.
//!
//! - `first/*`: first deliveries (a new key on every iteration): buffer, fingerprint, key,
//!   reserve, inner call, record;
//! - `duplicate/*`: the same delivery again and again: buffer, fingerprint, key, reserve → ack;
//! - `in_flight/*`: a delivery whose key is held by an attempt still in flight: → 409;
//! - `record/*`: the byte encoding that the Redis and SQL stores write and read;
//! - `verify/*` (feature `verify`): first deliveries of a Standard Webhooks request (key
//!   `webhook-id`, read as the route reads it: `svix-id`, else `webhook-id`; a constant body of
//!   1 KiB or 64 KiB), `standard_webhooks` verifying its signature against `unverified` not. Both sign every request (HMAC-SHA256 over
//!   `id.timestamp.body`, as the sender does) while making it, so their difference is what
//!   verification adds.
//!
//! `layer_any` is the layer on the memory store behind [`AnyStore`] (what `store::connect`
//! returns, and what the demo runs on): a store type whose calls are as large as its largest
//! backend's would show there, not on the plain memory store.
//!
//! Keys come from the `Idempotency-Key` header (`header`) or from every message id of a
//! WhatsApp-shaped batch (`json_path`, `$.entry[*].changes[*].value.messages[*].id`), on
//! payloads of 1 KiB and 64 KiB. `header_nofp` is the header key with the payload fingerprint
//! turned off (the body is then streamed to the inner service, not buffered).
//!
//! Each iteration asserts the status it expects, so a bench can never silently measure a 503.
//!
//! No metrics recorder is installed, so with the `metrics` feature every sample goes to the
//! no-op recorder. `LAYER_RECORDER=prometheus` installs the Prometheus recorder the way the
//! demo does (bucketed histograms, upkeep every 5 s) to measure what the metrics cost:
//!
//! ```text
//! LAYER_RECORDER=prometheus cargo bench --all-features --bench layer -- first/layer/header
//! ```
//!
//! Profile mode, without criterion, for allocation counts, `perf` or `valgrind`:
//!
//! ```text
//! cargo bench --all-features --bench layer --no-run     # prints the binary's path
//! LAYER_PROFILE=20000 target/release/deps/layer-<hash>  # heap allocations per request
//! LAYER_PROFILE=4000 LAYER_FILTER=first/layer/header/1KiB \
//!     valgrind --tool=callgrind target/release/deps/layer-<hash>
//! ```
//!
//! On a noisy host, `scripts/icount SCENARIO..` counts instructions per request with callgrind
//! in this profile mode (set-up subtracted): a figure that does not move between runs.
//!
//! Results and how to read them: `benches/results/RESULTS.md`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::convert::Infallible;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::IdempotencyStore;
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::key::{ExtractKey, HeaderKey, JsonPathKey};
use tower_idempotency::store::record::Record;
use tower_idempotency::store::{AnyStore, StoreKey, Target};
use tower_idempotency::test_util::values;
use tower_idempotency::{IdempotencyLayer, MemoryStore};

/// The JSONPath of every WhatsApp message id of a batch.
const WHATSAPP_IDS: &str = "$.entry[*].changes[*].value.messages[*].id";
/// The route every request goes to (the layer's default scope is the path).
const PATH: &str = "/webhooks/whatsapp";
const NAMESPACE: &str = "bench";
/// The placeholder, in the payload template, for the 16 hex digits that make ids unique.
const MARK: &[u8; 16] = b"@@@@@@@@@@@@@@@@";

type Svc = BoxCloneService<Request<Full<Bytes>>, Response<Bytes>, Infallible>;

/// The inner service: reads the body, answers `200 {"ok":true}`.
async fn handler<B>(request: Request<B>) -> Result<Response<Full<Bytes>>, Infallible>
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let body = request.into_body().collect().await.expect("request body");
    black_box(body.to_bytes());
    Ok(Response::new(Full::new(Bytes::from_static(
        br#"{"ok":true}"#,
    ))))
}

/// Reads a response in full, so that streamed bodies and recording are paid for too.
async fn read<B>(response: Response<B>) -> Response<Bytes>
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("response body").to_bytes();
    Response::from_parts(parts, body)
}

fn bare() -> Svc {
    BoxCloneService::new(
        tower::service_fn(handler::<Full<Bytes>>).and_then(|r| async move { Ok(read(r).await) }),
    )
}

/// The layer with its defaults (10 s lease, renewed; 72 h retention, ack mode), on `store`.
fn layered<K: ExtractKey + Clone>(store: impl IdempotencyStore, key: K, fingerprint: bool) -> Svc {
    let layer = IdempotencyLayer::new(store)
        .namespace(NAMESPACE)
        .key(key)
        .fingerprint(fingerprint);
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(handler::<tower_idempotency::RequestBody<Full<Bytes>>>);
    BoxCloneService::new(svc.and_then(|r| async move { Ok(read(r).await) }))
}

/// A memory store below its bounds however long a bench runs (criterion adds a few million
/// keys): first deliveries are measured without evictions. (With the default bounds, 1 M keys
/// and 256 MiB, about 2 M ack records, a long run would measure a full store evicting a record
/// per new key: that is `scripts/scale`'s subject.)
fn store() -> MemoryStore {
    MemoryStore::new()
        .with_max_entries(50_000_000)
        .with_max_bytes(usize::MAX)
}

/// The service of the scenario variant `name` (`bare/..`, `layer/..`, `layer_any/..`; a fresh
/// store behind each layer) and how its requests carry the key.
fn service(name: &str) -> (KeyKind, Svc) {
    let header = HeaderKey::idempotency_key;
    let json = || JsonPathKey::new(WHATSAPP_IDS).unwrap();
    match name {
        "bare/header" => (KeyKind::Header, bare()),
        "layer/header" => (KeyKind::Header, layered(store(), header(), true)),
        // The memory store behind `AnyStore`, as `store::connect` gives it (the demo's).
        "layer_any/header" => (
            KeyKind::Header,
            layered(AnyStore::from(store()), header(), true),
        ),
        "layer/header_nofp" => (KeyKind::Header, layered(store(), header(), false)),
        "bare/json_path" => (KeyKind::JsonPath, bare()),
        "layer/json_path" => (KeyKind::JsonPath, layered(store(), json(), true)),
        _ => unreachable!("no scenario variant {name}"),
    }
}

/// A WhatsApp Cloud API batch of `messages` text messages, padded to about `size` bytes. Every
/// message id holds [`MARK`], to be replaced by a counter.
fn whatsapp_template(size: usize, messages: usize) -> Vec<u8> {
    let overhead = 520 + messages * 190;
    let text_len = size.saturating_sub(overhead) / messages;
    let text: String = "Hola, ¿tienen stock del modelo 42? "
        .chars()
        .cycle()
        .take(text_len)
        .collect();
    let mark = std::str::from_utf8(MARK).unwrap();
    let msgs: Vec<String> = (0..messages)
        .map(|i| {
            format!(
                r#"{{"from":"5491155550000","id":"wamid.HBgNNTQ5MTE1NTU1MDAwMBUCABIY{mark}{i:04}","timestamp":"1732950001","type":"text","text":{{"body":"{text}"}}}}"#
            )
        })
        .collect();
    format!(
        r#"{{"object":"whatsapp_business_account","entry":[{{"id":"102290129340398","changes":[{{"field":"messages","value":{{"messaging_product":"whatsapp","metadata":{{"display_phone_number":"15550783881","phone_number_id":"106540352242922"}},"contacts":[{{"profile":{{"name":"Lucía"}},"wa_id":"5491155550000"}}],"messages":[{}]}}}}]}}]}}"#,
        msgs.join(",")
    )
    .into_bytes()
}

/// A payload template and where its [`MARK`]s are.
struct Payload {
    label: &'static str,
    template: Vec<u8>,
    marks: Vec<usize>,
}

impl Payload {
    fn new(label: &'static str, size: usize, messages: usize) -> Self {
        let template = whatsapp_template(size, messages);
        let marks = template
            .windows(MARK.len())
            .enumerate()
            .filter(|(_, w)| *w == MARK)
            .map(|(i, _)| i)
            .collect();
        Payload {
            label,
            template,
            marks,
        }
    }

    /// The payload with every message id made unique by `n`.
    fn with_ids(&self, n: u64) -> Bytes {
        let mut body = self.template.clone();
        let digits = format!("{n:016x}");
        for &at in &self.marks {
            body[at..at + MARK.len()].copy_from_slice(digits.as_bytes());
        }
        Bytes::from(body)
    }
}

fn payloads() -> [Payload; 2] {
    let small = Payload::new("1KiB", 1024, 2);
    let large = Payload::new("64KiB", 64 * 1024, 64);
    for p in [&small, &large] {
        serde_json::from_slice::<serde_json::Value>(&p.with_ids(1)).expect("valid JSON payload");
    }
    [small, large]
}

fn request(body: Bytes, key: Option<&str>) -> Request<Full<Bytes>> {
    let mut builder = Request::post(PATH)
        .header("content-type", "application/json")
        .header("content-length", body.len())
        .header("x-hub-signature-256", "sha256=9a2b0c0e5f1c0e9a2b0c0e5f1c0e");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", as_parsed(key));
    }
    builder.body(Full::new(body)).expect("request")
}

/// A header value as hyper makes one: a slice of the connection's read buffer, which a clone
/// shares (a reference count) rather than copies.
fn as_parsed(text: &str) -> HeaderValue {
    let mut buffer = BytesMut::from(text);
    HeaderValue::from_maybe_shared(buffer.split().freeze()).expect("a valid header value")
}

/// How the key is carried: a header (constant body) or the message ids (unique body).
#[derive(Clone, Copy)]
enum KeyKind {
    Header,
    JsonPath,
}

/// The request number `n`: unique by its header key or by its message ids.
fn nth_request(kind: KeyKind, payload: &Payload, constant: &Bytes, n: u64) -> Request<Full<Bytes>> {
    match kind {
        KeyKind::Header => request(constant.clone(), Some(&format!("pd_{n:016x}"))),
        KeyKind::JsonPath => request(payload.with_ids(n), None),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

async fn call(svc: &Svc, request: Request<Full<Bytes>>) -> Response<Bytes> {
    svc.clone().oneshot(request).await.expect("infallible")
}

/// One bench: a service, the requests it gets, and the answer each must get.
struct Scenario {
    /// `group/variant/payload`, as criterion names it.
    group: &'static str,
    variant: &'static str,
    payload: &'static str,
    bytes: u64,
    svc: Svc,
    /// The request of iteration `n`.
    make: Box<dyn Fn(u64) -> Request<Full<Bytes>>>,
    status: StatusCode,
    replayed: bool,
}

impl Scenario {
    fn name(&self) -> String {
        format!("{}/{}/{}", self.group, self.variant, self.payload)
    }

    async fn run(&self, n: u64) -> Response<Bytes> {
        let response = call(&self.svc, (self.make)(n)).await;
        assert_eq!(
            response.status(),
            self.status,
            "{}: {:?}",
            self.name(),
            response.body()
        );
        assert_eq!(
            response.headers().contains_key("idempotent-replayed"),
            self.replayed,
            "{}",
            self.name()
        );
        response
    }
}

/// Every scenario, in bench order. Duplicate and in-flight scenarios are primed on `rt`.
fn scenarios(rt: &tokio::runtime::Runtime) -> Vec<Scenario> {
    let mut out = Vec::new();
    for payload in payloads() {
        let payload = std::rc::Rc::new(payload);
        let label = payload.label;
        let bytes = payload.template.len() as u64;
        let constant = payload.with_ids(0);
        let header = || HeaderKey::idempotency_key();
        let json = || JsonPathKey::new(WHATSAPP_IDS).unwrap();

        // First deliveries: a new key on every iteration.
        let first = [
            "bare/header",
            "layer/header",
            "layer_any/header",
            "layer/header_nofp",
            "bare/json_path",
            "layer/json_path",
        ];
        for variant in first {
            let (kind, svc) = service(variant);
            let (payload, constant) = (payload.clone(), constant.clone());
            out.push(Scenario {
                group: "first",
                variant,
                payload: label,
                bytes,
                svc,
                make: Box::new(move |n| nth_request(kind, &payload, &constant, n + 1)),
                status: StatusCode::OK,
                replayed: false,
            });
        }

        // Duplicates of a completed key: the acknowledgement, the inner service not called.
        for variant in ["layer/header", "layer_any/header", "layer/json_path"] {
            let (kind, svc) = service(variant);
            let (payload, constant) = (payload.clone(), constant.clone());
            let make = move |_| nth_request(kind, &payload, &constant, 0);
            let primed = rt.block_on(call(&svc, make(0)));
            assert_eq!(primed.status(), StatusCode::OK);
            out.push(Scenario {
                group: "duplicate",
                variant,
                payload: label,
                bytes,
                svc,
                make: Box::new(make),
                status: StatusCode::OK,
                replayed: true,
            });
        }

        // Duplicates of a key whose first attempt is still in flight: 409.
        for (variant, kind) in [
            ("layer/header", KeyKind::Header),
            ("layer/json_path", KeyKind::JsonPath),
        ] {
            let store = store();
            let (svc, key) = match kind {
                KeyKind::Header => (
                    layered(store.clone(), header(), true),
                    format!("pd_{:016x}", 0),
                ),
                KeyKind::JsonPath => {
                    let mut ids: Vec<String> = (0..payload.marks.len())
                        .map(|i| format!("wamid.HBgNNTQ5MTE1NTU1MDAwMBUCABIY{:016x}{i:04}", 0))
                        .collect();
                    ids.sort_unstable();
                    (layered(store.clone(), json(), true), ids.join("\n"))
                }
            };
            // The first attempt: a claim with an hour-long lease that is never settled.
            let claim = values::claim(Fingerprint::of_bytes(&constant));
            let store_key = StoreKey::new(NAMESPACE, Some(PATH), &key);
            rt.block_on(store.reserve(
                &[Target::key(store_key)],
                &claim,
                Duration::from_secs(3600),
            ))
            .expect("reserve");
            let (payload, constant) = (payload.clone(), constant.clone());
            out.push(Scenario {
                group: "in_flight",
                variant,
                payload: label,
                bytes,
                svc,
                make: Box::new(move |_| nth_request(kind, &payload, &constant, 0)),
                status: StatusCode::CONFLICT,
                replayed: false,
            });
        }
    }
    let order = |g: &str| {
        ["first", "duplicate", "in_flight"]
            .iter()
            .position(|x| *x == g)
    };
    out.sort_by_key(|s| order(s.group));
    out
}

/// First deliveries, duplicates and in-flight duplicates, bare service vs layer.
fn layer(c: &mut Criterion) {
    let rt = runtime();
    let scenarios = scenarios(&rt);
    for group_name in ["first", "duplicate", "in_flight"] {
        let mut group = c.benchmark_group(group_name);
        for scenario in scenarios.iter().filter(|s| s.group == group_name) {
            group.throughput(Throughput::Bytes(scenario.bytes));
            let counter = AtomicU64::new(0);
            group.bench_function(BenchmarkId::new(scenario.variant, scenario.payload), |b| {
                b.to_async(&rt)
                    .iter(|| scenario.run(counter.fetch_add(1, Ordering::Relaxed)))
            });
        }
        group.finish();
    }
}

/// The record encoding of the shared stores: ack (9 bytes) and replay of 1 KiB and 64 KiB.
fn record(c: &mut Criterion) {
    let mut group = c.benchmark_group("record");
    let fingerprint = Fingerprint::of_bytes(b"payload");
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.insert(
        "location",
        HeaderValue::from_static("/api/orders/ord_000042"),
    );
    let records = [
        ("ack", values::record_ack(fingerprint)),
        (
            "replay_1KiB",
            values::record_replay(
                fingerprint,
                StatusCode::CREATED,
                headers.clone(),
                Bytes::from(vec![b'x'; 1024]),
                None,
            ),
        ),
        (
            "replay_64KiB",
            values::record_replay(
                fingerprint,
                StatusCode::CREATED,
                headers,
                Bytes::from(vec![b'x'; 64 * 1024]),
                None,
            ),
        ),
    ];
    for (name, record) in &records {
        let encoded = record.encode();
        group.throughput(Throughput::Bytes(encoded.len() as u64));
        group.bench_function(BenchmarkId::new("encode", name), |b| {
            b.iter(|| black_box(record).encode())
        });
        group.bench_function(BenchmarkId::new("decode", name), |b| {
            b.iter(|| Record::decode(black_box(&encoded)).expect("decodes"))
        });
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(700))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args()
}

/// The Standard Webhooks specification's test secret.
#[cfg(feature = "verify")]
const STANDARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// Request `n` of a Standard Webhooks sender: id `msg_<n>`, now, signed over `body`.
#[cfg(feature = "verify")]
fn signed_request(body: &Bytes, n: u64) -> Request<Full<Bytes>> {
    use base64::Engine as _;
    use hmac::{Hmac, Mac};
    let engine = base64::engine::general_purpose::STANDARD;
    let key = engine
        .decode(STANDARD_SECRET.trim_start_matches("whsec_"))
        .expect("base64 secret");
    let id = format!("msg_{n:016x}");
    let timestamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
        .to_string();
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&key).expect("any key length");
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    let signature = format!("v1,{}", engine.encode(mac.finalize().into_bytes()));
    Request::post(PATH)
        .header("content-type", "application/json")
        .header("content-length", body.len())
        .header("webhook-id", as_parsed(&id))
        .header("webhook-timestamp", as_parsed(&timestamp))
        .header("webhook-signature", as_parsed(&signature))
        .body(Full::new(body.clone()))
        .expect("request")
}

/// First deliveries of signed requests, verified and not (see the module docs).
#[cfg(feature = "verify")]
fn verify(c: &mut Criterion) {
    use tower_idempotency::key::Fallback;
    use tower_idempotency::verify::StandardWebhooks;
    let rt = runtime();
    let wrap = |layer: IdempotencyLayer<MemoryStore, Fallback<HeaderKey, HeaderKey>>| {
        let svc = ServiceBuilder::new()
            .layer(layer.namespace(NAMESPACE))
            .service_fn(handler::<tower_idempotency::RequestBody<Full<Bytes>>>);
        BoxCloneService::new(svc.and_then(|r| async move { Ok(read(r).await) }))
    };
    let mut group = c.benchmark_group("verify");
    for payload in payloads() {
        let body = payload.with_ids(0);
        group.throughput(Throughput::Bytes(body.len() as u64));
        // The verified route's key (svix-id, else webhook-id), without the verification.
        let key = |name| HeaderKey::from_name(http::HeaderName::from_static(name));
        let unverified: Svc =
            wrap(IdempotencyLayer::webhook(store()).key(key("svix-id").or(key("webhook-id"))));
        let scheme = StandardWebhooks::new([STANDARD_SECRET]).expect("a valid secret");
        let verified: Svc = wrap(IdempotencyLayer::standard_webhooks(store(), scheme));
        for (variant, svc) in [("unverified", unverified), ("standard_webhooks", verified)] {
            let counter = AtomicU64::new(0);
            group.bench_function(BenchmarkId::new(variant, payload.label), |b| {
                b.to_async(&rt).iter(|| async {
                    let n = counter.fetch_add(1, Ordering::Relaxed);
                    let response = call(&svc, signed_request(&body, n)).await;
                    assert_eq!(response.status(), StatusCode::OK, "{variant}");
                    response
                })
            });
        }
    }
    group.finish();
}

#[cfg(not(feature = "verify"))]
fn verify(_: &mut Criterion) {}

criterion_group! {
    name = benches;
    config = config();
    targets = layer, record, verify
}

/// Counts heap allocations while [`COUNTING`] is on (profile mode only).
struct CountingAlloc;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static ALLOC_BYTES: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            ALLOC_BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        }
        // SAFETY: forwarded as is to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            ALLOC_BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        }
        // SAFETY: forwarded as is to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Profile mode, for `valgrind --tool=callgrind` or `perf`: `LAYER_PROFILE=N` runs every
/// scenario whose name contains `LAYER_FILTER` (default: all) N times, without criterion, and
/// prints the heap allocations per request.
fn profile(n: u64) {
    let filter = std::env::var("LAYER_FILTER").unwrap_or_default();
    let rt = runtime();
    println!("| scenario | allocations / request | allocated bytes / request |");
    println!("|---|---:|---:|");
    for scenario in scenarios(&rt) {
        if !scenario.name().contains(&filter) {
            continue;
        }
        // Warm up (first-touch growth of the store, lazy statics), then count.
        rt.block_on(async {
            for i in 0..n.min(1000) {
                black_box(scenario.run(u64::MAX / 2 + i).await);
            }
        });
        ALLOCS.store(0, Ordering::Relaxed);
        ALLOC_BYTES.store(0, Ordering::Relaxed);
        COUNTING.store(true, Ordering::Relaxed);
        rt.block_on(async {
            for i in 0..n {
                black_box(scenario.run(i).await);
            }
        });
        COUNTING.store(false, Ordering::Relaxed);
        println!(
            "| {} | {:.1} | {:.0} |",
            scenario.name(),
            ALLOCS.load(Ordering::Relaxed) as f64 / n as f64,
            ALLOC_BYTES.load(Ordering::Relaxed) as f64 / n as f64
        );
    }
}

/// `LAYER_RECORDER=prometheus`: the demo's recorder, drained every 5 s as the demo does.
fn install_recorder() {
    if std::env::var("LAYER_RECORDER").as_deref() != Ok("prometheus") {
        return;
    }
    if !cfg!(feature = "metrics") {
        eprintln!("LAYER_RECORDER=prometheus: the `metrics` feature is off, nothing will record");
    }
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets(&[
            0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
            2.5, 5.0, 10.0,
        ])
        .expect("valid buckets")
        .install_recorder()
        .expect("no other recorder installed");
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_secs(5));
            handle.run_upkeep();
        }
    });
}

fn main() {
    install_recorder();
    if let Some(n) = std::env::var("LAYER_PROFILE")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        profile(n);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
