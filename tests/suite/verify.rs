//! Verification before the claim, through a real axum router, on every store: a forged request
//! gets 401 and leaves no trace a genuine delivery could collide with.

use std::time::Duration;

use axum::body::Body;
use http::{Request, StatusCode};
use tower_idempotency::key::{ExtractKey, Fallback, HeaderKey, JsonPathKey};
use tower_idempotency::verify::{
    HubSignature256, ShopifyHmac, SlackSignature, StandardWebhooks, StripeSignature, VerifyRequest,
};
use tower_idempotency::{IdempotencyLayer, IdempotencyStore, Outcome};

use super::app::{Effects, router};
use super::{assert_problem, ns, send, served};

#[path = "../support/signing.rs"]
mod signing;

use signing::{STANDARD_SECRET as SECRET, now};

fn standard_signature(secret: &str, id: &str, timestamp: u64, body: &str) -> String {
    signing::standard(secret, id, timestamp, body)
}

fn hub_signature(secret: &str, body: &str) -> String {
    signing::hub(secret, body)
}

/// A Standard Webhooks delivery of `id` at `timestamp`, signed with `signature`, under the
/// header names of `family` (`webhook-id`, ...; Svix's `svix-id`, ...).
fn delivery_of(
    family: &str,
    id: &str,
    timestamp: u64,
    signature: &str,
    body: &'static str,
) -> Request<Body> {
    Request::post("/effect")
        .header("content-type", "application/json")
        .header(format!("{family}-id"), id)
        .header(format!("{family}-timestamp"), timestamp.to_string())
        .header(format!("{family}-signature"), signature)
        .body(Body::from(body))
        .unwrap()
}

/// A Standard Webhooks delivery of `id` at `timestamp`, signed with `signature`.
fn delivery(id: &str, timestamp: u64, signature: &str, body: &'static str) -> Request<Body> {
    delivery_of("webhook", id, timestamp, signature, body)
}

fn standard_layer<St: IdempotencyStore>(
    store: St,
    test: &str,
) -> IdempotencyLayer<St, Fallback<HeaderKey, HeaderKey>> {
    let scheme = StandardWebhooks::new([SECRET]).unwrap();
    IdempotencyLayer::standard_webhooks(store, scheme).namespace(ns(test))
}

/// A signed delivery is processed once; its redelivery with a fresh timestamp and signature is
/// acknowledged; every kind of forgery is 401 with its reason, has no effect, and claims
/// nothing, so the genuine delivery sent after it is processed.
pub async fn forged_requests_are_401_and_claim_nothing<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(standard_layer(store, "verify"));
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

/// A Standard Webhooks delivery under Svix's header names (`svix-id`, `svix-timestamp`,
/// `svix-signature`), as Svix, Clerk and Resend send it.
fn svix_delivery(id: &str, timestamp: u64, signature: &str, body: &'static str) -> Request<Body> {
    delivery_of("svix", id, timestamp, signature, body)
}

/// A Standard Webhooks route takes Svix's header names: the delivery is processed once, keyed
/// by its signed `svix-id` (a redelivery, under either family, is a duplicate); a forgery is
/// 401, and so is a signed request sent again with a `webhook-id` it did not sign.
pub async fn svix_headers_are_verified_and_keyed_by_svix_id<St: IdempotencyStore>(store: St) {
    let (effects, app) = served(standard_layer(store, "svix"));
    let body = r#"{"type":"user.created"}"#;
    let t = now();
    let good = standard_signature(SECRET, "msg_svix", t, body);
    let response = send_full(&app, svix_delivery("msg_svix", t, "v1,AAAA", body)).await;
    assert_eq!(response.3, Some(Outcome::Unverified("signature_mismatch")));
    let (status, _, _) = send(&app, svix_delivery("msg_svix", t, &good, body)).await;
    assert_eq!(status, StatusCode::CREATED);
    let later = t + 30;
    let again = standard_signature(SECRET, "msg_svix", later, body);
    let (status, headers, _) = send(&app, svix_delivery("msg_svix", later, &again, body)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-replayed"], "true");
    // The same id under the other family is the same key.
    let (status, headers, _) = send(&app, delivery("msg_svix", later, &again, body)).await;
    assert_eq!(
        (status, &headers["idempotent-replayed"]),
        (StatusCode::OK, &"true".parse().unwrap())
    );
    // The captured request with an unsigned webhook-id beside its signed svix-id.
    let mut rekeyed = svix_delivery("msg_svix", t, &good, body);
    rekeyed
        .headers_mut()
        .insert("webhook-id", "msg_new".parse().unwrap());
    let response = send_full(&app, rekeyed).await;
    assert_eq!(response.0, StatusCode::UNAUTHORIZED);
    assert_eq!(response.3, Some(Outcome::Unverified("malformed_signature")));
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
        // Two events (two bodies: the same body under another id would be a replay).
        let body = format!(r#"{{"zen":"Design for failure.","hook_id":{i}}}"#);
        let request = Request::post("/effect")
            .header("x-github-delivery", format!("delivery-{i}"))
            .header("x-hub-signature-256", hub_signature(secret, &body))
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
    let (effects, app) = served(standard_layer(store, "flood"));
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

/// The signed headers of one delivery: webhook id (signed by Standard Webhooks only), time
/// and body.
type Sign = fn(&str, u64, &str) -> Vec<(&'static str, String)>;

/// Every built-in scheme, with how its sender signs, and whether it signs a timestamp.
fn schemes() -> Vec<(&'static str, Box<dyn VerifyRequest>, Sign, bool)> {
    const SECRET_AS_GIVEN: &str = "It's a Secret to Everybody";
    vec![
        (
            "standard",
            Box::new(StandardWebhooks::new([SECRET]).unwrap()),
            |id, t, body| {
                vec![
                    ("webhook-id", id.to_owned()),
                    ("webhook-timestamp", t.to_string()),
                    ("webhook-signature", standard_signature(SECRET, id, t, body)),
                ]
            },
            true,
        ),
        (
            "stripe",
            Box::new(StripeSignature::stripe([SECRET_AS_GIVEN]).unwrap()),
            |_, t, body| {
                vec![(
                    "stripe-signature",
                    signing::stripe(SECRET_AS_GIVEN, t, body),
                )]
            },
            true,
        ),
        (
            "hub",
            Box::new(HubSignature256::new([SECRET_AS_GIVEN]).unwrap()),
            |_, _, body| vec![("x-hub-signature-256", hub_signature(SECRET_AS_GIVEN, body))],
            false,
        ),
        (
            "shopify",
            Box::new(ShopifyHmac::new([SECRET_AS_GIVEN]).unwrap()),
            |_, _, body| {
                let signature = signing::shopify(SECRET_AS_GIVEN, body);
                vec![("x-shopify-hmac-sha256", signature)]
            },
            false,
        ),
        (
            "slack",
            Box::new(SlackSignature::new([SECRET_AS_GIVEN]).unwrap()),
            |_, t, body| {
                vec![
                    ("x-slack-request-timestamp", t.to_string()),
                    (
                        "x-slack-signature",
                        signing::slack(SECRET_AS_GIVEN, t, body),
                    ),
                ]
            },
            true,
        ),
    ]
}

/// A delivery keyed by the unsigned `x-delivery` header, with `signed` headers.
fn keyed_delivery(delivery: &str, signed: &[(&'static str, String)], body: &str) -> Request<Body> {
    let mut request = Request::post("/effect").header("x-delivery", delivery);
    for (name, value) in signed {
        request = request.header(*name, value);
    }
    request.body(Body::from(body.to_owned())).unwrap()
}

/// For every built-in scheme, on a route keyed by a header the signature does not cover: a
/// captured signed request replayed under new delivery ids is a duplicate (one effect); the
/// provider's redelivery (same id, same body, signed again later) is one too; other genuine
/// events (another body, or where a timestamp is signed the same body signed at another
/// time) run. Before the signed content was claimed, every replay ran again.
pub async fn a_replay_under_a_new_delivery_id_is_a_duplicate<St: IdempotencyStore>(store: St) {
    for (name, scheme, sign, timestamped) in schemes() {
        let effects = Effects::default();
        let layer = IdempotencyLayer::webhook(store.clone())
            .namespace(ns(&format!("replay-{name}")))
            .key(HeaderKey::new("x-delivery").unwrap())
            .verify(std::sync::Arc::<dyn VerifyRequest>::from(scheme));
        let app = router(layer, &effects);
        let (body, t) = (r#"{"type":"payment.succeeded","amount":100}"#, now());
        let captured = sign("msg_1", t, body);
        let (status, _, _) = send(&app, keyed_delivery("d-1", &captured, body)).await;
        assert_eq!(status, StatusCode::CREATED, "{name}");
        for replay in ["d-2", "d-3", "d-4"] {
            let (status, headers, _) = send(&app, keyed_delivery(replay, &captured, body)).await;
            assert_eq!(status, StatusCode::OK, "{name}: a replay under {replay}");
            assert_eq!(headers["idempotent-replayed"], "true", "{name}");
        }
        assert_eq!(
            effects.total(),
            1,
            "{name}: replays under new ids ran again"
        );
        let redelivery = sign("msg_1", t + 30, body);
        let (status, headers, _) = send(&app, keyed_delivery("d-1", &redelivery, body)).await;
        assert_eq!(status, StatusCode::OK, "{name}: the redelivery");
        assert_eq!(headers["idempotent-replayed"], "true", "{name}");
        assert_eq!(effects.total(), 1, "{name}");
        let other = r#"{"type":"payment.succeeded","amount":200}"#;
        let fresh = sign("msg_2", t, other);
        let (status, _, _) = send(&app, keyed_delivery("d-5", &fresh, other)).await;
        assert_eq!(status, StatusCode::CREATED, "{name}: another body");
        if timestamped {
            let later = sign("msg_3", t + 60, body);
            let (status, _, _) = send(&app, keyed_delivery("d-6", &later, body)).await;
            assert_eq!(
                status,
                StatusCode::CREATED,
                "{name}: the same body signed later"
            );
        }
        assert_eq!(effects.total(), 2 + usize::from(timestamped), "{name}");
    }
}

/// A route keyed by an unsigned header, else by the signed body's `$.id` (Sangho's): a
/// request captured without the header and sent again with one under new ids is a duplicate
/// too (the signed content is claimed whichever extractor found the key), and a provider
/// redelivery without the header stays one.
pub async fn a_header_fallback_cannot_rekey_a_signed_body<St: IdempotencyStore>(store: St) {
    const SANGHO: &str = "whsec_sangho";
    let effects = Effects::default();
    let key = HeaderKey::new("x-delivery")
        .unwrap()
        .or(JsonPathKey::new("$.id").unwrap());
    let layer = IdempotencyLayer::webhook(store)
        .namespace(ns("replay-fallback"))
        .key(key)
        .verify(StripeSignature::new("sangho-signature", [SANGHO]).unwrap());
    let app = router(layer, &effects);
    let (body, t) = (r#"{"id":"evt_1","type":"charge.succeeded"}"#, now());
    let signed = [("sangho-signature", signing::stripe(SANGHO, t, body))];
    let unkeyed = |signed: &[(&'static str, String)], body: &str| {
        let mut request = keyed_delivery("-", signed, body);
        request.headers_mut().remove("x-delivery");
        request
    };
    assert_eq!(
        send(&app, unkeyed(&signed, body)).await.0,
        StatusCode::CREATED
    );
    for replay in ["d-2", "d-3"] {
        let (status, headers, _) = send(&app, keyed_delivery(replay, &signed, body)).await;
        assert_eq!(status, StatusCode::OK, "a replay under {replay}");
        assert_eq!(headers["idempotent-replayed"], "true");
    }
    let later = [("sangho-signature", signing::stripe(SANGHO, t + 30, body))];
    let (status, headers, _) = send(&app, unkeyed(&later, body)).await;
    assert_eq!(
        (status, &headers["idempotent-replayed"]),
        (StatusCode::OK, &"true".parse().unwrap())
    );
    let other = r#"{"id":"evt_2","type":"charge.succeeded"}"#;
    let fresh = [("sangho-signature", signing::stripe(SANGHO, t, other))];
    assert_eq!(
        send(&app, unkeyed(&fresh, other)).await.0,
        StatusCode::CREATED
    );
    assert_eq!(effects.total(), 2);
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
