//! Signatures as the senders compute them, for the tests of verified routes.

#![allow(dead_code)]

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use hmac::{Hmac, Mac};

/// The Standard Webhooks test secret (of the specification's own test vector), the demo's
/// default.
pub const STANDARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// GitHub's documented test secret, the demo's default.
pub const GITHUB_SECRET: &str = "It's a Secret to Everybody";

fn mac(key: &[u8], message: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `webhook-signature` of `id`, `timestamp` and `body` under `secret` (`whsec_` base64).
pub fn standard(secret: &str, id: &str, timestamp: u64, body: &str) -> String {
    let engine = base64::engine::general_purpose::STANDARD;
    let key = engine.decode(secret.trim_start_matches("whsec_")).unwrap();
    let signed = mac(&key, format!("{id}.{timestamp}.{body}").as_bytes());
    format!("v1,{}", engine.encode(signed))
}

/// `sha256=<hex>` of `body` under `secret`, as GitHub and Meta send it.
pub fn hub(secret: &str, body: &str) -> String {
    format!("sha256={}", hex(&mac(secret.as_bytes(), body.as_bytes())))
}

/// `t=<timestamp>,v1=<hex>` of `timestamp.body` under `secret` (as given), Stripe's scheme.
pub fn stripe(secret: &str, timestamp: u64, body: &str) -> String {
    let signed = mac(secret.as_bytes(), format!("{timestamp}.{body}").as_bytes());
    format!("t={timestamp},v1={}", hex(&signed))
}

/// Now, in Unix seconds.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The `X-Shopify-Hmac-Sha256` of `body` under `secret`: base64 of its HMAC-SHA256.
pub fn shopify(secret: &str, body: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(mac(secret.as_bytes(), body.as_bytes()))
}

/// The `X-Slack-Signature` of `v0:{timestamp}:{body}` under `secret`, as Slack sends it.
pub fn slack(secret: &str, timestamp: u64, body: &str) -> String {
    let signed = mac(
        secret.as_bytes(),
        format!("v0:{timestamp}:{body}").as_bytes(),
    );
    format!("v0={}", hex(&signed))
}
