//! Verification before the claim, through a real axum router, on every store: a forged request
//! gets 401 and leaves no trace a genuine delivery could collide with.

use std::time::Duration;

use axum::body::Body;
use http::{Request, StatusCode};
use tower_idempotency::key::HeaderKey;
use tower_idempotency::verify::{HubSignature256, StandardWebhooks};
use tower_idempotency::{IdempotencyLayer, IdempotencyStore, Outcome};

use super::app::{Effects, router};
use super::{assert_problem, ns, send};

#[path = "../support/signing.rs"]
mod signing;

use signing::{STANDARD_SECRET as SECRET, now};

fn standard_signature(secret: &str, id: &str, timestamp: u64, body: &str) -> String {
    signing::standard(secret, id, timestamp, body)
}

fn hub_signature(secret: &str, body: &str) -> String {
    signing::hub(secret, body)
}

/// A Standard Webhooks delivery of `id` at `timestamp`, signed with `signature`.
fn delivery(id: &str, timestamp: u64, signature: &str, body: &'static str) -> Request<Body> {
    Request::post("/effect")
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(Body::from(body))
        .unwrap()
}

fn standard_layer<St: IdempotencyStore>(store: St, test: &str) -> IdempotencyLayer {
    let scheme = StandardWebhooks::new([SECRET]).unwrap();
    IdempotencyLayer::standard_webhooks(store, scheme).namespace(ns(test))
}

/// A signed delivery is processed once; its redelivery with a fresh timestamp and signature is
/// acknowledged; every kind of forgery is 401 with its reason, has no effect, and claims
/// nothing, so the genuine delivery sent after it is processed.
pub async fn forged_requests_are_401_and_claim_nothing<St: IdempotencyStore>(store: St) {
    let effects = Effects::default();
    let app = router(standard_layer(store, "verify"), &effects);
    let body = r#"{"type":"payment.succeeded"}"#;
    let t = now();
    let good = standard_signature(SECRET, "msg_1", t, body);
    let other_secret = "whsec_QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=";
    let forged = [
        (
            standard_signature(other_secret, "msg_1", t, body),
            t,
            "signature_mismatch",
        ),
        (
            standard_signature(SECRET, "msg_1", t, r#"{"type":"x"}"#),
            t,
            "signature_mismatch",
        ),
        ("v1,".to_owned(), t, "signature_mismatch"),
        (good[..good.len() - 8].to_owned(), t, "signature_mismatch"),
        ("v1,AAAA".to_owned(), t, "signature_mismatch"),
        ("garbage".to_owned(), t, "malformed_signature"),
        (
            standard_signature(SECRET, "msg_1", t - 600, body),
            t - 600,
            "timestamp_outside_tolerance",
        ),
        (
            standard_signature(SECRET, "msg_1", t + 600, body),
            t + 600,
            "timestamp_outside_tolerance",
        ),
    ];
    for (signature, timestamp, reason) in &forged {
        let response = send_full(&app, delivery("msg_1", *timestamp, signature, body)).await;
        assert_eq!(response.0, StatusCode::UNAUTHORIZED, "{reason}");
        assert_problem(&response.1, &response.2, 401, "unverified");
        assert_eq!(response.3, Some(Outcome::Unverified(reason)), "{reason}");
    }
    // Missing headers, and a signature header repeated.
    let mut missing = delivery("msg_1", t, &good, body);
    missing.headers_mut().remove("webhook-signature");
    assert_eq!(send(&app, missing).await.0, StatusCode::UNAUTHORIZED);
    let mut repeated = delivery("msg_1", t, &good, body);
    repeated
        .headers_mut()
        .append("webhook-signature", good.parse().unwrap());
    assert_eq!(send(&app, repeated).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(effects.total(), 0, "no forgery reached the handler");
    // Nothing was claimed: the genuine delivery is processed.
    let (status, _, _) = send(&app, delivery("msg_1", t, &good, body)).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(effects.total(), 1);
    // A redelivery (fresh timestamp, fresh signature) is a duplicate.
    let later = t + 30;
    let again = standard_signature(SECRET, "msg_1", later, body);
    let (status, headers, _) = send(&app, delivery("msg_1", later, &again, body)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-replayed"], "true");
    // A forgery under the id already completed is 401, not an acknowledgement.
    let (status, headers, _) = send(&app, delivery("msg_1", t, "v1,", body)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(headers.get("idempotent-replayed").is_none());
    assert_eq!(effects.total(), 1);
}

/// Each of two secrets verifies (rotation with overlap).
pub async fn either_of_two_secrets_verifies<St: IdempotencyStore>(store: St) {
    let effects = Effects::default();
    let (old, new) = ("It's a Secret to Everybody", "the new secret");
    let layer = IdempotencyLayer::webhook(store)
        .namespace(ns("rotation"))
        .key(HeaderKey::new("X-GitHub-Delivery").unwrap())
        .verify(HubSignature256::new([old, new]).unwrap());
    let app = router(layer, &effects);
    for (i, secret) in [old, new].into_iter().enumerate() {
        let body = r#"{"zen":"Design for failure."}"#;
        let request = Request::post("/effect")
            .header("x-github-delivery", format!("delivery-{i}"))
            .header("x-hub-signature-256", hub_signature(secret, body))
            .body(Body::from(body))
            .unwrap();
        assert_eq!(send(&app, request).await.0, StatusCode::CREATED, "{secret}");
    }
    assert_eq!(effects.total(), 2);
}

/// A flood of forged requests under a genuine delivery's id, concurrent with it, never makes
/// the genuine delivery a 409 nor an acknowledgement: zero of the rounds are affected.
pub async fn a_forged_flood_never_blocks_the_genuine_delivery<St: IdempotencyStore>(store: St) {
    const ROUNDS: usize = 20;
    let effects = Effects::default();
    let app = router(standard_layer(store, "flood"), &effects);
    let body = r#"{"type":"payment.succeeded"}"#;
    let mut affected = 0;
    for round in 0..ROUNDS {
        let id = format!("msg_flood_{round}");
        let t = now();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let forgers: Vec<_> = (0..4)
            .map(|_| {
                let (app, id, stop) = (app.clone(), id.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut answers = Vec::new();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let forged = delivery(&id, t, "v1,bm90IGEgc2lnbmF0dXJl", body);
                        answers.push(send(&app, forged).await.0);
                        // An in-process answer never waits: let the genuine delivery run.
                        tokio::task::yield_now().await;
                    }
                    answers
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(2)).await;
        let mut genuine = delivery(&id, t, &standard_signature(SECRET, &id, t, body), body);
        genuine
            .headers_mut()
            .insert("x-demo-delay-ms", "20".parse().unwrap());
        let (status, headers, _) = send(&app, genuine).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for forger in forgers {
            let answers = forger.await.unwrap();
            assert!(
                answers.iter().all(|s| *s == StatusCode::UNAUTHORIZED),
                "{answers:?}"
            );
        }
        if status != StatusCode::CREATED || headers.contains_key("idempotent-replayed") {
            affected += 1;
        }
    }
    assert_eq!(
        affected, 0,
        "rounds where the genuine delivery was not processed"
    );
    assert_eq!(effects.total(), ROUNDS);
}

/// `send`, with the response's outcome.
async fn send_full(
    app: &axum::Router,
    request: Request<Body>,
) -> (StatusCode, http::HeaderMap, bytes::Bytes, Option<Outcome>) {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let response = app.clone().oneshot(request).await.unwrap();
    let outcome = response.extensions().get::<Outcome>().copied();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, body, outcome)
}
