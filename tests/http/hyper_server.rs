//! The plain hyper server of `examples/hyper_server.rs` (the layer around a `service_fn`,
//! served by hyper-util's `auto::Builder`), driven by a real hyper client over loopback, in
//! HTTP/1.1 and in HTTP/2 (h2c with prior knowledge).
//!
//! The tests include the example's source (`#[path]`), so the service they exercise is the
//! example's own; one test also runs the built example binary.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tokio::net::TcpListener;
use tower_idempotency::MemoryStore;

use crate::harness;

#[allow(dead_code)]
#[path = "../../examples/hyper_server.rs"]
mod example;

use example::Ledger;

const VERSIONS: [Version; 2] = [Version::HTTP_11, Version::HTTP_2];

struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
    version: Version,
}

/// What came back: the head, and the body or the error that cut it short.
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Result<Bytes, hyper::Error>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(self.body.as_ref().expect("a complete body")).unwrap()
    }

    fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }
}

impl Http {
    fn new(base: String, version: Version) -> Self {
        let client = Client::builder(TokioExecutor::new())
            .http2_only(version == Version::HTTP_2)
            .build_http();
        Http {
            client,
            base,
            version,
        }
    }

    async fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
        self.try_send(method, path, headers, body).await.unwrap()
    }

    /// Sends a request; `Err` when the exchange failed before the response head arrived.
    async fn try_send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<Reply, hyper_util::client::legacy::Error> {
        let mut builder = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("content-type", "application/json");
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let request = builder
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        let response = tokio::time::timeout(Duration::from_secs(10), self.client.request(request))
            .await
            .expect("no answer within 10 s")?;
        assert_eq!(response.version(), self.version);
        let (parts, body) = response.into_parts();
        let body = tokio::time::timeout(Duration::from_secs(10), body.collect())
            .await
            .expect("body not finished within 10 s")
            .map(|collected| collected.to_bytes());
        Ok(Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// Charges, retrying while the key is still in flight (409), for up to 2 s.
    async fn charge_once_released(&self, key: &str) -> Reply {
        for _ in 0..40 {
            let reply = self.charge(key, &[]).await;
            if reply.status != StatusCode::CONFLICT {
                return reply;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{key} still in flight after 2 s");
    }

    async fn charge(&self, key: &str, hooks: &[(&str, &str)]) -> Reply {
        let mut headers = vec![("idempotency-key", key)];
        headers.extend_from_slice(hooks);
        self.send("POST", "/charges", &headers, r#"{"amount":1999}"#)
            .await
    }
}

/// Serves the example's service on `127.0.0.1:0`.
async fn start(version: Version) -> (Http, Ledger) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let ledger = Ledger::default();
    tokio::spawn(example::serve(
        listener,
        ledger.clone(),
        example::idempotency(MemoryStore::new()),
    ));
    (Http::new(base, version), ledger)
}

#[tokio::test]
async fn first_is_processed_and_duplicates_are_acked() {
    for version in VERSIONS {
        let (http, ledger) = start(version).await;

        let first = http.charge("ord_1001", &[]).await;
        assert_eq!(first.status, StatusCode::CREATED, "{version:?}");
        assert!(!first.replayed());
        assert_eq!(first.json()["charge_id"], "ch_000001");

        for _ in 0..2 {
            let again = http.charge("ord_1001", &[]).await;
            assert_eq!(again.status, StatusCode::OK, "{version:?}");
            assert!(again.replayed(), "{version:?}");
            assert_eq!(
                again.json(),
                serde_json::json!({"ok": true, "duplicate": true})
            );
        }
        assert_eq!((ledger.calls(), ledger.charges()), (1, 1), "{version:?}");

        // Reads pass through; a request without a key is refused with problem+json.
        let effects = http.send("GET", "/effects", &[], "").await;
        assert_eq!(effects.json()["charges"], 1);
        let missing = http.send("POST", "/charges", &[], "{}").await;
        assert_eq!(missing.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            missing.headers["content-type"], "application/problem+json",
            "{version:?}"
        );
        assert_eq!(missing.json()["code"], "missing_key");
        assert_eq!(ledger.calls(), 1);
    }
}

#[tokio::test]
async fn server_error_is_not_recorded_and_the_retry_is_processed() {
    for version in VERSIONS {
        let (http, ledger) = start(version).await;

        let failed = http.charge("ord_2001", &[("x-demo-fail", "true")]).await;
        assert_eq!(
            failed.status,
            StatusCode::INTERNAL_SERVER_ERROR,
            "{version:?}"
        );
        assert!(!failed.replayed());
        assert_eq!((ledger.calls(), ledger.charges()), (1, 0));

        let retry = http.charge("ord_2001", &[]).await;
        assert_eq!(retry.status, StatusCode::CREATED, "{version:?}");
        assert!(!retry.replayed());
        assert_eq!((ledger.calls(), ledger.charges()), (2, 1));

        let duplicate = http.charge("ord_2001", &[]).await;
        assert!(duplicate.replayed(), "{version:?}");
        assert_eq!(ledger.calls(), 2);
    }
}

#[tokio::test]
async fn body_failing_mid_stream_is_not_recorded_and_the_retry_is_processed() {
    for version in VERSIONS {
        let (http, ledger) = start(version).await;

        // A small body is held by the layer until it ends: its failure reaches the client
        // before the head is flushed (hyper aborts the exchange), or in the body.
        let small = [("idempotency-key", "ord_3001"), ("x-demo-break-body", "13")];
        match http.try_send("POST", "/charges", &small, "{}").await {
            Ok(reply) => assert!(reply.body.is_err(), "{version:?}: {:?}", reply.body),
            Err(err) => assert!(!err.is_connect(), "{version:?}: {err:?}"),
        }
        assert_eq!(ledger.calls(), 1);
        let retry = http.charge("ord_3001", &[]).await;
        assert_eq!(retry.status, StatusCode::CREATED, "{version:?}");
        assert!(!retry.replayed());
        assert_eq!((ledger.calls(), ledger.charges()), (2, 1));
        let duplicate = http.charge("ord_3001", &[]).await;
        assert!(duplicate.replayed(), "{version:?}");
        assert_eq!(ledger.calls(), 2);

        // A body past the response buffer limit streams: the client gets the head and the
        // first bytes, then the failure.
        let large = [
            ("idempotency-key", "ord_3002"),
            ("x-demo-break-body", "100000"),
        ];
        let broken = http
            .try_send("POST", "/charges", &large, "{}")
            .await
            .unwrap();
        assert_eq!(broken.status, StatusCode::OK, "{version:?}");
        assert!(broken.body.is_err(), "{version:?}: {:?}", broken.body);
        assert_eq!(ledger.calls(), 3);
        // Here the claim is released in the background as the body fails: a retry right away
        // may still find it in flight (409, never a 2xx).
        let retry = http.charge_once_released("ord_3002").await;
        assert_eq!(retry.status, StatusCode::CREATED, "{version:?}");
        assert!(!retry.replayed());
        assert_eq!((ledger.calls(), ledger.charges()), (4, 2));
    }
}

#[tokio::test]
async fn concurrent_duplicates_run_once_and_the_others_get_409() {
    for version in VERSIONS {
        let (http, ledger) = start(version).await;
        let http = std::sync::Arc::new(http);

        // Four at once, racing for the claim; the winner's handler holds it for 2 s, by which
        // time the other three (sent together with it) have long reached the layer.
        let calls = (0..4).map(|_| {
            let http = http.clone();
            tokio::spawn(async move {
                http.charge("ord_4001", &[("x-demo-delay-ms", "2000")])
                    .await
            })
        });
        let replies: Vec<Reply> = futures_util::future::join_all(calls)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let mut statuses: Vec<u16> = replies.iter().map(|r| r.status.as_u16()).collect();
        statuses.sort_unstable();
        assert_eq!(statuses, [201, 409, 409, 409], "{version:?}");
        for conflict in replies.iter().filter(|r| r.status == StatusCode::CONFLICT) {
            assert_eq!(conflict.headers["retry-after"], "1");
            assert_eq!(conflict.json()["code"], "in_flight");
        }
        assert_eq!((ledger.calls(), ledger.charges()), (1, 1), "{version:?}");
    }
}

/// The built example binary (`cargo test` builds examples), in both HTTP versions.
#[tokio::test]
async fn example_binary_serves_both_versions() {
    let example = harness::start_example("hyper_server", &[]);
    let base = example.base.clone();

    let h1 = Http::new(base.clone(), Version::HTTP_11);
    let h2 = Http::new(base, Version::HTTP_2);
    assert_eq!(h1.charge("ord_9001", &[]).await.status, StatusCode::CREATED);
    // The same key over the other protocol is the same key.
    let again = h2.charge("ord_9001", &[]).await;
    assert!(again.replayed());
    let effects = h1.send("GET", "/effects", &[], "").await.json();
    assert_eq!(effects, serde_json::json!({"calls": 1, "charges": 1}));
}
