//! The service contract: readiness, and the request the inner service sees.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::hooks::Unreleased;
use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::store::{StoreError, StoreErrorKind, Target};
use tower_idempotency::test_util::store::{Call, Hook, Hooked};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, MemoryStore, RequestBody};
use tower_test::mock;

type Req = Request<RequestBody<Full<Bytes>>>;

/// The instance that `poll_ready` made ready is the one called: `tower_test`'s mock panics
/// when an unready clone is called.
#[tokio::test]
async fn the_ready_instance_is_the_one_called() {
    let (mut service, mut handle) = mock::spawn_layer::<Req, Response<Full<Bytes>>, _>(
        IdempotencyLayer::new(MemoryStore::new()).fingerprint(false),
    );
    handle.allow(1);
    assert!(service.poll_ready().is_ready());
    let request = Request::post("/x")
        .header("idempotency-key", "k")
        .body(Full::new(Bytes::from_static(b"hello")))
        .unwrap();
    let response = service.call(request);
    let responder = tokio::spawn(async move {
        let (request, send) = handle.next_request().await.unwrap();
        assert_eq!(request.uri(), "/x");
        send.send_response(Response::new(Full::new(Bytes::from_static(b"ok"))));
    });
    let response = response.await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    responder.await.unwrap();
}

/// A service whose readiness is observed: not ready until the mock allows it.
#[tokio::test]
async fn poll_ready_is_delegated() {
    let (mut service, mut handle) = mock::spawn_layer::<Req, Response<Full<Bytes>>, _>(
        IdempotencyLayer::new(MemoryStore::new()),
    );
    handle.allow(0);
    assert!(service.poll_ready().is_pending());
    handle.allow(1);
    assert!(service.poll_ready().is_ready());
}

#[derive(Clone, Debug, PartialEq)]
struct Marker(&'static str);

/// The inner service sees the exact bytes, method, URI, version, headers, extensions and
/// trailers, plus the derived key in the extensions.
#[tokio::test]
async fn inner_sees_the_exact_request() {
    type Seen = (http::request::Parts, Bytes, Option<HeaderMap>);
    let seen: Arc<Mutex<Option<Seen>>> = Arc::default();
    let seen2 = seen.clone();
    let service = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(MemoryStore::new()))
        .service_fn(move |req: Request<RequestBody<_>>| {
            let seen = seen2.clone();
            async move {
                let (parts, body) = req.into_parts();
                let collected = body.collect().await.unwrap();
                let trailers = collected.trailers().cloned();
                *seen.lock().unwrap() = Some((parts, collected.to_bytes(), trailers));
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
            }
        });

    let raw: &[&[u8]] = &[b"{\"a\":", b" 1,\r\n \"b\": \"\xc3\xa9\"", b"}\x00\xff"];
    let mut trailers = HeaderMap::new();
    trailers.insert("x-signature", "sig".parse().unwrap());
    let mut frames: Vec<Result<Frame<Bytes>, Infallible>> = raw
        .iter()
        .map(|c| Ok(Frame::data(Bytes::from_static(c))))
        .collect();
    frames.push(Ok(Frame::trailers(trailers.clone())));
    let mut request = Request::put("/path?q=1")
        .version(http::Version::HTTP_2)
        .header("idempotency-key", "evt_1")
        .header("x-kalipto-signature", "sha256=abc")
        .body(StreamBody::new(futures_util::stream::iter(frames)))
        .unwrap();
    request.extensions_mut().insert(Marker("kept"));

    let response = service.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let (parts, body, seen_trailers) = seen.lock().unwrap().take().unwrap();
    assert_eq!(body, raw.concat(), "byte-identical body");
    assert_eq!(seen_trailers, Some(trailers));
    assert_eq!(parts.method, http::Method::PUT);
    assert_eq!(parts.uri, "/path?q=1");
    assert_eq!(parts.version, http::Version::HTTP_2);
    assert_eq!(parts.headers["x-kalipto-signature"], "sha256=abc");
    assert_eq!(parts.extensions.get::<Marker>(), Some(&Marker("kept")));
    assert_eq!(
        parts.extensions.get::<IdempotencyKey>().map(|k| k.as_str()),
        Some("evt_1")
    );
}

/// The service a layer wraps is reachable: borrowed, changed in place, and given back.
#[test]
fn the_inner_service_is_borrowed_changed_and_given_back() {
    use tower::Layer;
    let mut service = IdempotencyLayer::new(MemoryStore::new()).layer(Marker("inner"));
    assert_eq!(service.get_ref(), &Marker("inner"));
    *service.get_mut() = Marker("changed");
    assert_eq!(service.into_inner(), Marker("changed"));
}

/// gRPC requests get gRPC statuses, not HTTP problem documents.
#[tokio::test]
async fn grpc_requests_get_grpc_statuses() {
    let service = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(MemoryStore::new()).body_limit(4))
        .service_fn(|_req: Request<RequestBody<Full<Bytes>>>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        });
    let request = |key: Option<&str>, body: &'static [u8]| {
        let mut b = Request::post("/pkg.Svc/Method").header("content-type", "application/grpc");
        if let Some(key) = key {
            b = b.header("idempotency-key", key);
        }
        b.body(Full::new(Bytes::from_static(body))).unwrap()
    };
    let response = service.clone().oneshot(request(None, b"")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["grpc-status"], "3");
    assert!(
        response.headers()["grpc-message"]
            .to_str()
            .unwrap()
            .contains("no idempotency key")
    );
    let response = service
        .clone()
        .oneshot(request(Some("k"), b"too large"))
        .await
        .unwrap();
    assert_eq!(response.headers()["grpc-status"], "8");
}

/// What makes a store answer slowly or fail on purpose, around a real `MemoryStore` (see
/// [`flaky`]): claims and completions land at once, their answers come late (a slow network on
/// the way back), and the first completions fail (a store that went away for a moment).
#[derive(Clone, Default)]
struct Flaky {
    reserve_delay: Duration,
    complete_delay: Duration,
    /// How long a completion takes before it reaches the store (a slow network on the way
    /// there: the claim's lease runs meanwhile).
    complete_sent_after: Duration,
    failing_completes: Arc<AtomicUsize>,
    /// Completions attempted.
    completes: Arc<AtomicUsize>,
}

impl Hook for Flaky {
    async fn before(&self, call: Call, _: &[Target]) -> Result<(), StoreError> {
        if call == Call::Complete {
            self.completes.fetch_add(1, Ordering::SeqCst);
            let failing = self.failing_completes.load(Ordering::SeqCst);
            if failing > 0 {
                self.failing_completes.store(failing - 1, Ordering::SeqCst);
                return Err(StoreError::new(StoreErrorKind::Unavailable));
            }
            tokio::time::sleep(self.complete_sent_after).await;
        }
        Ok(())
    }

    async fn after(&self, call: Call) {
        match call {
            Call::Reserve => tokio::time::sleep(self.reserve_delay).await,
            Call::Complete => tokio::time::sleep(self.complete_delay).await,
            Call::Release | Call::Renew => {}
        }
    }
}

/// A fresh memory store behind `hook`.
fn flaky(hook: Flaky) -> Hooked<MemoryStore, Flaky> {
    Hooked {
        store: MemoryStore::new(),
        hook,
    }
}

/// What the layer answers over a `Full` body.
type Replied = Response<tower_idempotency::ResponseBody<Full<Bytes>>>;

/// `layer` over a handler that counts its runs in `runs` and answers 200 `done`.
fn counted<St: 'static>(
    layer: IdempotencyLayer<St>,
    runs: Arc<AtomicUsize>,
) -> impl tower::Service<Request<Full<Bytes>>, Response = Replied, Error = Infallible, Future: Send>
+ Clone
+ Send
+ 'static {
    ServiceBuilder::new()
        .layer(layer)
        .service_fn(move |_req: Request<RequestBody<Full<Bytes>>>| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done")))) }
        })
}

/// While `first` is still settling, a duplicate is 409 (the claim was kept); then `first`
/// answers 200, the duplicate after it is acknowledged, and the handler ran once.
async fn kept_until_recorded<S>(
    service: S,
    first: tokio::task::JoinHandle<Result<Replied, Infallible>>,
    runs: &AtomicUsize,
) where
    S: tower::Service<Request<Full<Bytes>>, Response = Replied, Error = Infallible> + Clone,
{
    let duplicate = service.clone().oneshot(keyed()).await.unwrap();
    assert_eq!(
        duplicate.status(),
        StatusCode::CONFLICT,
        "the claim was kept"
    );
    let response = first.await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let duplicate = service.oneshot(keyed()).await.unwrap();
    assert_eq!(duplicate.status(), StatusCode::OK);
    assert_eq!(duplicate.headers()["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

fn keyed() -> Request<Full<Bytes>> {
    Request::post("/x")
        .header("idempotency-key", "k")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap()
}

/// The client goes away while the reserve is in flight: the claim that landed anyway is
/// released at once, so the retry is processed without waiting for the lease (10 s).
#[tokio::test]
async fn a_request_dropped_during_its_reserve_leaves_no_claim() {
    let store = flaky(Flaky {
        reserve_delay: Duration::from_millis(300),
        ..Flaky::default()
    });
    let runs = Arc::new(AtomicUsize::new(0));
    let service = counted(IdempotencyLayer::new(store.clone()), runs.clone());
    let dropped = tokio::spawn(service.clone().oneshot(keyed()));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(store.store.len(), 1, "the claim landed");
    dropped.abort();
    let _ = dropped.await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(store.store.len(), 0, "the claim was released");
    let response = service.oneshot(keyed()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().get("idempotent-replayed").is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A completion that fails is retried in the background: the response still went out, and the
/// duplicate that follows is acknowledged instead of running again.
#[tokio::test]
async fn a_failed_completion_is_retried_until_recorded() {
    let store = flaky(Flaky {
        failing_completes: Arc::new(AtomicUsize::new(2)),
        ..Flaky::default()
    });
    let runs = Arc::new(AtomicUsize::new(0));
    let service = counted(IdempotencyLayer::new(store.clone()), runs.clone());
    let response = service.clone().oneshot(keyed()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "the effect happened");
    // Retries at 100 ms, then 200 ms later.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        let response = service.clone().oneshot(keyed()).await.unwrap();
        if response.headers().get("idempotent-replayed").is_some() {
            break;
        }
        assert_eq!(
            response.status(),
            StatusCode::CONFLICT,
            "still in flight, never run again"
        );
        assert!(tokio::time::Instant::now() < deadline, "never recorded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(store.hook.failing_completes.load(Ordering::SeqCst), 0);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A completion that takes two leases to reach the store (within the store timeout): the claim
/// is renewed meanwhile, so a duplicate is 409 and never run, and the record is written (the
/// duplicate after it is acknowledged), not lost with an expired lease.
#[tokio::test]
async fn a_settlement_longer_than_the_lease_keeps_its_claim() {
    let lease = Duration::from_millis(600);
    let store = flaky(Flaky {
        complete_sent_after: 2 * lease,
        ..Flaky::default()
    });
    let runs = Arc::new(AtomicUsize::new(0));
    let service = counted(
        IdempotencyLayer::new(store.clone()).lease(lease),
        runs.clone(),
    );
    let first = tokio::spawn(service.clone().oneshot(keyed()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while store.hook.completes.load(Ordering::SeqCst) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never settled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Past the first lease, while the completion is still on its way.
    tokio::time::sleep(lease + lease / 3).await;
    kept_until_recorded(service, first, &runs).await;
}

/// A quick settlement (twice the store timeout is shorter than the lease) runs without a
/// renewal timer of the request's; when its completion fails and is retried past the lease, the
/// retries keep the claim themselves: the duplicate sent after the first lease is 409 and never
/// run, and the record lands on a later try.
#[tokio::test]
async fn completion_retries_past_the_lease_keep_their_claim() {
    let lease = Duration::from_millis(600);
    let store = flaky(Flaky {
        // Tries at 0, 100, 300 and 700 ms (a 100 ms pause, doubling): the last one past the
        // lease the reserve took.
        failing_completes: Arc::new(AtomicUsize::new(3)),
        ..Flaky::default()
    });
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(store.clone())
        .lease(lease)
        .store_timeout(Duration::from_millis(100));
    let service = counted(layer, runs.clone());
    let started = tokio::time::Instant::now();
    let first = tokio::spawn(service.clone().oneshot(keyed()));
    tokio::time::sleep_until(started + lease + Duration::from_millis(50)).await;
    assert!(
        store.hook.failing_completes.load(Ordering::SeqCst) == 0 && !first.is_finished(),
        "still retrying its completion past the lease"
    );
    kept_until_recorded(service, first, &runs).await;
}

/// A store slower to answer a claim than the store timeout: 503, the handler never run; the
/// same store within the (default, 2 s) timeout is waited for.
#[tokio::test(start_paused = true)]
async fn a_claim_slower_than_the_store_timeout_is_503() {
    let slow = Flaky {
        reserve_delay: Duration::from_secs(1),
        ..Flaky::default()
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let layer =
        IdempotencyLayer::new(flaky(slow.clone())).store_timeout(Duration::from_millis(100));
    let response = counted(layer, runs.clone()).oneshot(keyed()).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let layer = IdempotencyLayer::new(flaky(slow));
    let response = counted(layer, runs.clone()).oneshot(keyed()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A holder gone without releasing its claim blocks its key for the lease, and no longer: a
/// duplicate is 409 at first, processed once the lease has run out.
#[tokio::test]
async fn a_claim_left_behind_blocks_its_key_for_the_lease() {
    let lease = Duration::from_millis(1000);
    let store = Hooked {
        store: MemoryStore::new(),
        hook: Unreleased,
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let seen = runs.clone();
    let service = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store).lease(lease))
        .service_fn(move |_req: Request<RequestBody<Full<Bytes>>>| {
            let first = seen.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                if first {
                    std::future::pending::<()>().await;
                }
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
            }
        });
    let holder = tokio::spawn(service.clone().oneshot(keyed()));
    while runs.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    holder.abort();
    let _ = holder.await;
    let duplicate = service.clone().oneshot(keyed()).await.unwrap();
    assert_eq!(
        duplicate.status(),
        StatusCode::CONFLICT,
        "the claim was left"
    );
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    let retry = service.oneshot(keyed()).await.unwrap();
    assert_eq!(retry.status(), StatusCode::OK);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// The layer's own answers go through the configured renderer, and carry the `Rejection` in
/// their extensions.
#[tokio::test]
async fn rejections_are_rendered_by_the_configured_renderer() {
    use tower_idempotency::rejection::Rejection;
    let layer = IdempotencyLayer::new(MemoryStore::new()).render_rejection(
        |rejection: &Rejection, _grpc: bool| {
            let mut response = Response::new(Bytes::from(format!("custom {}", rejection.code())));
            *response.status_mut() = rejection.status();
            response
        },
    );
    let service = ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_req: Req| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
        });
    let request = Request::post("/x")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(matches!(
        response.extensions().get::<Rejection>(),
        Some(Rejection::MissingKey { expected: Some(expected) }) if expected.contains("idempotency-key")
    ));
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "custom missing_key");
}

/// A response body that yields more than its size hint promised.
struct Lying {
    chunks: Vec<Bytes>,
}

impl http_body::Body for Lying {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let next = (!self.chunks.is_empty()).then(|| self.chunks.remove(0));
        std::task::Poll::Ready(next.map(|chunk| Ok(Frame::data(chunk))))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(2)
    }
}

/// A body said to fit the response buffer is read in place; one that turns out larger than it
/// said is a failed response, and the claim is released: the retry runs again.
#[tokio::test]
async fn a_response_larger_than_its_size_hint_is_not_recorded() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let service = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(MemoryStore::new()).response_buffer_limit(8))
        .service_fn(move |_req: Request<RequestBody<Full<Bytes>>>| {
            counted.fetch_add(1, Ordering::SeqCst);
            async {
                Ok::<_, Infallible>(Response::new(Lying {
                    chunks: vec![Bytes::from_static(b"0123456789"); 2],
                }))
            }
        });
    let response = service.clone().oneshot(keyed()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        response.into_body().collect().await.is_err(),
        "the client sees the failure"
    );
    let retry = service.oneshot(keyed()).await.unwrap();
    assert!(retry.headers().get("idempotent-replayed").is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 2, "the retry ran again");
}

/// The request goes away after its record landed but before the store said so: the settlement
/// runs again from the start in the background, finds its own record (`AlreadyWritten`), and
/// counts no lost lease; the duplicate is acknowledged.
#[cfg(feature = "metrics")]
#[tokio::test(flavor = "current_thread")]
async fn a_settlement_cut_off_after_its_write_is_finished_without_a_lost_lease() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let _metrics = metrics::set_default_local_recorder(&recorder);
    let store = flaky(Flaky {
        complete_delay: Duration::from_millis(300),
        ..Flaky::default()
    });
    let runs = Arc::new(AtomicUsize::new(0));
    let service = counted(IdempotencyLayer::new(store.clone()), runs.clone());
    let cut = tokio::spawn(service.clone().oneshot(keyed()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    cut.abort();
    assert!(
        cut.await.unwrap_err().is_cancelled(),
        "cut off while completing"
    );
    // The settlement's second run answers after another 300 ms.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let repeat = service.oneshot(keyed()).await.unwrap();
    assert_eq!(repeat.headers()["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        store.hook.completes.load(Ordering::SeqCst),
        2,
        "the settlement ran again"
    );
    let lost: u64 = recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == "idempotency_lease_lost_total")
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum();
    assert_eq!(lost, 0, "a repeated completion is not a lost lease");
}

/// What a store written outside the crate sees in `complete`: only the public API. It keeps the
/// encoded record and records whether it would tell a retried completion of this claim.
#[derive(Clone, Default)]
struct Outside {
    inner: MemoryStore,
    owned: Arc<Mutex<Vec<bool>>>,
}

impl tower_idempotency::IdempotencyStore for Outside {
    async fn reserve(
        &self,
        targets: &[Target],
        claim: &tower_idempotency::store::Claim,
        lease: Duration,
    ) -> Result<Vec<tower_idempotency::store::Reservation>, StoreError> {
        self.inner.reserve(targets, claim, lease).await
    }

    async fn complete(
        &self,
        targets: &[Target],
        claim: &tower_idempotency::store::Claim,
        record: &tower_idempotency::store::record::Record,
        retention: Duration,
    ) -> Result<Vec<tower_idempotency::store::Completion>, StoreError> {
        let kept = tower_idempotency::store::record::Record::decode(&record.encode()).unwrap();
        self.owned
            .lock()
            .unwrap()
            .push(kept.is_owned_by(claim.token()));
        self.inner.complete(targets, claim, record, retention).await
    }

    async fn release(
        &self,
        targets: &[Target],
        claim: &tower_idempotency::store::Claim,
    ) -> Result<usize, StoreError> {
        self.inner.release(targets, claim).await
    }

    async fn renew(
        &self,
        targets: &[Target],
        claim: &tower_idempotency::store::Claim,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.inner.renew(targets, claim, lease).await
    }
}

/// The layer hands `complete` a record owned by its claim, in ack and in replay mode: a store
/// that keeps `record.encode()` as it is tells a retried completion by `is_owned_by`.
#[tokio::test]
async fn complete_gets_a_record_owned_by_its_claim() {
    let owned = Arc::new(Mutex::new(Vec::new()));
    let store = || Outside {
        inner: MemoryStore::new(),
        owned: owned.clone(),
    };
    for layer in [
        IdempotencyLayer::webhook(store()),
        IdempotencyLayer::api(store()),
    ] {
        let service = ServiceBuilder::new()
            .layer(layer)
            .service_fn(|_: Req| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{\"id\":1}"))))
            });
        let response = service.oneshot(keyed()).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    assert_eq!(*owned.lock().unwrap(), [true, true]);
}
