//! Every built-in signature scheme over arbitrary header values and bodies: `verify` never
//! panics, and every error has a kind with a label and a detail.
//!
//! The input is split at `\n` into the header values (Standard Webhooks id, timestamp and
//! signature; Stripe; X-Hub-Signature-256; Shopify; Slack signature and timestamp) and the body
//! (the rest). An empty field leaves its header out; the first byte's bits repeat headers. The
//! clocks are stopped at the Standard Webhooks test vector's timestamp, so that timestamps the
//! fuzzer finds there reach the HMAC comparison rather than stopping at the tolerance.
#![no_main]

use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderName, HeaderValue, Request};
use libfuzzer_sys::fuzz_target;
use tower_idempotency::verify::{
    HubSignature256, ShopifyHmac, SlackSignature, StandardWebhooks, StripeSignature, VerifyRequest,
};

const NOW: u64 = 1_614_265_330;

fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(NOW)
}

const HEADERS: [&str; 8] = [
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "stripe-signature",
    "x-hub-signature-256",
    "x-shopify-hmac-sha256",
    "x-slack-signature",
    "x-slack-request-timestamp",
];

static VERIFIERS: LazyLock<Vec<Box<dyn VerifyRequest>>> = LazyLock::new(|| {
    vec![
        Box::new(
            StandardWebhooks::new(["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_dGVzdA=="])
                .unwrap()
                .clock(now),
        ),
        Box::new(
            StripeSignature::stripe(["whsec_fuzz", "whsec_fuzz_next"])
                .unwrap()
                .clock(now),
        ),
        Box::new(HubSignature256::new(["It's a Secret to Everybody"]).unwrap()),
        Box::new(ShopifyHmac::new(["shpss_fuzz"]).unwrap()),
        Box::new(
            SlackSignature::new(["8f742231b10e8888abcd99yyyzzz85a5"])
                .unwrap()
                .clock(now),
        ),
    ]
});

fuzz_target!(|data: &[u8]| {
    let Some((&repeat, data)) = data.split_first() else {
        return;
    };
    let mut fields = data.splitn(HEADERS.len() + 1, |b| *b == b'\n');
    let mut request = Request::post("/hook").body(()).unwrap();
    for (i, name) in HEADERS.iter().enumerate() {
        let Some(field) = fields.next() else { break };
        // Bytes `http` refuses in a header value (CR, LF, NUL...) never reach a verifier.
        let Ok(value) = HeaderValue::from_bytes(field) else {
            continue;
        };
        if field.is_empty() {
            continue;
        }
        let name = HeaderName::from_static(name);
        if repeat & (1 << i) != 0 {
            request.headers_mut().append(name.clone(), value.clone());
        }
        request.headers_mut().append(name, value);
    }
    let body = fields.next().unwrap_or_default();
    let (parts, ()) = request.into_parts();
    for verifier in VERIFIERS.iter() {
        if let Err(err) = verifier.verify(&parts, body) {
            assert!(!err.kind().code().is_empty());
            assert!(!err.to_string().is_empty());
        }
    }
});
