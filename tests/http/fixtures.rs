//! Every realistic delivery of `tests/fixtures/webhooks.json` yields the expected key values,
//! both from the extractor directly and through the layer (the key in the request extensions);
//! and (feature `verify`) every Standard Webhooks request of
//! `tests/fixtures/standard_webhooks/cases.json`, signed by independent implementations,
//! verifies or fails as expected.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use serde_json::Value;
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::key::{ExtractKey, FieldsFingerprintKey, HeaderKey, JsonPathKey, KeyInput};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, MemoryStore, RequestBody};

fn cases() -> Vec<Value> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/webhooks.json"
    ))
    .unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    doc["cases"].as_array().unwrap().clone()
}

fn extractor(spec: &Value) -> Arc<dyn ExtractKey> {
    if let Some(fields) = spec["fingerprint_of"].as_array() {
        let paths: Vec<&str> = fields.iter().map(|f| f.as_str().unwrap()).collect();
        return Arc::new(FieldsFingerprintKey::new(paths).unwrap());
    }
    match (
        spec["header"].as_str(),
        spec["else_json_path"].as_str(),
        spec["json_path"].as_str(),
    ) {
        (Some(h), Some(p), _) => {
            Arc::new(HeaderKey::new(h).unwrap().or(JsonPathKey::new(p).unwrap()))
        }
        (Some(h), None, _) => Arc::new(HeaderKey::new(h).unwrap()),
        (None, _, Some(p)) => Arc::new(JsonPathKey::new(p).unwrap()),
        _ => panic!("unknown key spec {spec}"),
    }
}

fn body_of(case: &Value) -> Bytes {
    match case["body_raw"].as_str() {
        Some(raw) => Bytes::from(raw.to_owned()),
        None => Bytes::from(serde_json::to_vec(&case["body"]).unwrap()),
    }
}

fn request(case: &Value, body: Bytes) -> Request<Full<Bytes>> {
    let mut builder = Request::post("/webhook");
    for (name, value) in case["headers"].as_object().unwrap() {
        builder = builder.header(name.as_str(), value.as_str().unwrap());
    }
    builder.body(Full::new(body)).unwrap()
}

fn extract(case: &Value, body: &Bytes) -> IdempotencyKey {
    let (parts, _) = request(case, body.clone()).into_parts();
    extractor(&case["key"])
        .extract_key(&KeyInput::new(&parts, Some(body)))
        .unwrap_or_else(|e| panic!("{}: {e}", case["name"]))
        .unwrap_or_else(|| panic!("{}: no key", case["name"]))
}

#[test]
fn every_fixture_yields_its_expected_keys() {
    let cases = cases();
    assert!(cases.len() >= 9);
    for case in &cases {
        let key = extract(case, &body_of(case));
        if let Some(expected) = case["expected"].as_array() {
            let mut expected: Vec<&str> = expected.iter().map(|v| v.as_str().unwrap()).collect();
            expected.sort_unstable();
            assert_eq!(
                key.parts().collect::<Vec<_>>(),
                expected,
                "{}",
                case["name"]
            );
        }
        if case["expected_same_key_as_body"].is_object() {
            let other =
                Bytes::from(serde_json::to_vec(&case["expected_same_key_as_body"]).unwrap());
            assert_eq!(extract(case, &other), key, "{}", case["name"]);
            let mut changed = case["body"].clone();
            changed["message_id"] = "msg_other".into();
            let changed = Bytes::from(serde_json::to_vec(&changed).unwrap());
            assert_ne!(extract(case, &changed), key, "{}", case["name"]);
        }
    }
}

/// The same fixtures through the layer: the inner service finds the key in the extensions.
#[tokio::test]
async fn every_fixture_keys_the_layer() {
    for case in cases() {
        let seen: Arc<Mutex<Option<IdempotencyKey>>> = Arc::default();
        let seen2 = seen.clone();
        let service = ServiceBuilder::new()
            .layer(IdempotencyLayer::new(MemoryStore::new()).key(extractor(&case["key"])))
            .service_fn(move |req: Request<RequestBody<Full<Bytes>>>| {
                *seen2.lock().unwrap() = req.extensions().get::<IdempotencyKey>().cloned();
                async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))) }
            });
        let body = body_of(&case);
        let response = service
            .clone()
            .oneshot(request(&case, body.clone()))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{}", case["name"]);
        let key = seen.lock().unwrap().take().expect("key in extensions");
        assert_eq!(key, extract(&case, &body), "{}", case["name"]);
        // And a redelivery of the same bytes is a duplicate.
        let response = service.oneshot(request(&case, body)).await.unwrap();
        assert_eq!(
            response.headers()["idempotent-replayed"],
            "true",
            "{}",
            case["name"]
        );
    }
}

/// Sangho: the same event id in the header once and only in the body once is one key.
#[test]
fn fallback_key_is_the_id_whichever_source() {
    let cases = cases();
    let by_name = |name: &str| cases.iter().find(|c| c["name"] == name).unwrap().clone();
    let header = by_name("sangho-header");
    let body_only = by_name("sangho-body-only");
    assert_eq!(
        extract(&header, &body_of(&header)),
        extract(&body_only, &body_of(&body_only))
    );
}

/// Standard Webhooks requests signed by independent implementations
/// (`tests/fixtures/standard_webhooks/cases.json`, written by its `generate.py`): `v1` by Svix's
/// official library, `v1a` by Python's `cryptography`, under both header families, with
/// tampered requests that must fail. Each case is verified at the fixture's timestamp.
#[cfg(feature = "verify")]
mod standard_webhooks {
    use std::time::{Duration, UNIX_EPOCH};

    use http::Request;
    use serde_json::Value;
    use tower_idempotency::verify::{StandardWebhooks, VerifyRequest};

    const CASES: &str = include_str!("../fixtures/standard_webhooks/cases.json");

    #[test]
    fn every_case_verifies_as_its_signer_says() {
        let doc: Value = serde_json::from_str(CASES).unwrap();
        let timestamp = doc["timestamp"].as_u64().unwrap();
        let cases = doc["cases"].as_array().unwrap();
        assert!(cases.len() >= 20, "{} cases", cases.len());
        let (mut accepted, mut refused) = (0, 0);
        for case in cases {
            let name = case["name"].as_str().unwrap();
            let secrets: Vec<&str> = case["secrets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap())
                .collect();
            let verifier = StandardWebhooks::new(secrets)
                .unwrap()
                .clock(move || UNIX_EPOCH + Duration::from_secs(timestamp));
            let mut request = Request::post("/webhooks");
            for header in case["headers"].as_array().unwrap() {
                request = request.header(header[0].as_str().unwrap(), header[1].as_str().unwrap());
            }
            let (parts, ()) = request.body(()).unwrap().into_parts();
            let body = case["body"].as_str().unwrap().as_bytes();
            let outcome = match verifier.verify(&parts, body) {
                Ok(()) => "ok",
                Err(err) => err.kind().code(),
            };
            assert_eq!(outcome, case["expected"], "{name}");
            if outcome == "ok" {
                accepted += 1;
            } else {
                refused += 1;
            }
        }
        assert!(
            accepted >= 5 && refused >= 10,
            "{accepted} accepted, {refused} refused"
        );
    }
}
