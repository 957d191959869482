//! Signature verification, before any key is claimed: the [`VerifyRequest`] trait, its error,
//! and (feature `verify`) the built-in schemes.
//!
//! The layer calls a verifier on the request head and the exact body bytes it buffered, before
//! it extracts or claims an idempotency key, and answers 401 when verification fails. Until a
//! request is verified, its delivery id was chosen by whoever sent it: claiming it would let a
//! forger hold a genuine delivery's key, or learn which ids exist.
//!
//! Built in, behind the `verify` feature:
//!
//! | scheme | headers | signed bytes | secret |
//! |---|---|---|---|
//! | `StandardWebhooks` | `webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64> v1a,<base64> ...`, or the same as `svix-*` (Svix, Clerk, Resend) | `{id}.{timestamp}.{body}` | `whsec_<base64>` (HMAC, `v1`) and `whpk_<base64>` Ed25519 public keys (`v1a`) |
//! | `StripeSignature` | `Stripe-Signature: t=<unix>,v1=<hex>,...` (name configurable) | `{t}.{body}` | as given |
//! | `HubSignature256` | `X-Hub-Signature-256: sha256=<hex>` (GitHub, Meta) | the body | as given |
//! | `ShopifyHmac` | `X-Shopify-Hmac-Sha256: <base64>` | the body | as given |
//! | `SlackSignature` | `X-Slack-Signature: v0=<hex>`, `X-Slack-Request-Timestamp` | `v0:{timestamp}:{body}` | as given |
//!
//! Every scheme takes several secrets (any one verifies, for rotation), decodes each candidate
//! signature and checks its length (32 bytes for HMAC-SHA256, compared in constant time; 64 for
//! Ed25519), and refuses a signature header that appears twice or is not visible ASCII. A timestamp must be a plain
//! decimal number of seconds within the tolerance (5 minutes unless configured, past and future).
//! Errors never quote a signature, a secret or the body.
//!
//! Any other scheme is a closure or a type implementing [`VerifyRequest`]:
//!
//! ```
//! use http::Request;
//! use tower_idempotency::verify::{VerifyError, VerifyErrorKind, VerifyRequest};
//!
//! // A sender that authenticates with a shared token (no signature over the body).
//! let token = |parts: &http::request::Parts, _body: &[u8]| match parts.headers.get("x-token") {
//!     Some(value) if value == "s3cr3t" => Ok(()),
//!     Some(_) => Err(VerifyError::new(VerifyErrorKind::NoMatch, "the token does not match")),
//!     None => Err(VerifyError::new(VerifyErrorKind::MissingHeader, "the x-token header is missing")),
//! };
//!
//! let (parts, ()) = Request::post("/hook").header("x-token", "s3cr3t").body(()).unwrap().into_parts();
//! assert!(token.verify(&parts, b"{}").is_ok());
//!
//! let (parts, ()) = Request::post("/hook").body(()).unwrap().into_parts();
//! let err = token.verify(&parts, b"{}").unwrap_err();
//! assert_eq!(err.kind(), VerifyErrorKind::MissingHeader);
//! assert_eq!(err.kind().code(), "missing_signature");
//! ```

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use http::request::Parts;

/// The `tolerance` and `clock` builder methods of the schemes that sign a timestamp, written
/// once. Defined before the modules, which invoke it (the fields are theirs).
#[cfg(feature = "verify")]
macro_rules! timestamp_builders {
    ($($ty:ident),+ $(,)?) => {$(
        impl $ty {
            /// How far the signed timestamp may be from now, in the past or the future
            /// (default 5 minutes, what Standard Webhooks, Stripe and Slack use).
            /// Further is [`OutsideTolerance`](crate::verify::VerifyErrorKind::OutsideTolerance).
            pub fn tolerance(mut self, tolerance: std::time::Duration) -> Self {
                self.freshness = self.freshness.with_tolerance(tolerance);
                self
            }

            /// The clock that says what now is (default [`SystemTime::now`](std::time::SystemTime::now));
            /// for tests.
            pub fn clock(
                mut self,
                clock: impl Fn() -> std::time::SystemTime + Send + Sync + 'static,
            ) -> Self {
                self.freshness = self.freshness.with_clock(clock);
                self
            }
        }
    )+};
}

#[cfg(feature = "verify")]
mod ed25519;
#[cfg(feature = "verify")]
mod freshness;
#[cfg(feature = "verify")]
mod header;
#[cfg(feature = "verify")]
mod hmac;
#[cfg(feature = "verify")]
mod hub;
#[cfg(feature = "verify")]
mod secret;
#[cfg(feature = "verify")]
mod shopify;
#[cfg(feature = "verify")]
mod slack;
#[cfg(feature = "verify")]
mod standard;
#[cfg(feature = "verify")]
mod stripe;

#[cfg(feature = "verify")]
#[cfg_attr(docsrs, doc(cfg(feature = "verify")))]
pub use self::{
    hub::HubSignature256, shopify::ShopifyHmac, slack::SlackSignature, standard::StandardWebhooks,
    stripe::StripeSignature,
};

/// How far a signed timestamp may be from the current time, in the past or in the future, by
/// default: 5 minutes, what Standard Webhooks, Stripe and Slack use.
#[cfg_attr(not(feature = "verify"), allow(dead_code))]
pub(crate) const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// Checks that a request is authentic, from its head and its exact body bytes.
///
/// Called before the idempotency key is extracted or claimed; an `Err` is answered 401 with
/// the error's [`Display`](fmt::Display) as the detail and [`VerifyErrorKind::code`] as the
/// metric label.
///
/// Any `Fn(&http::request::Parts, &[u8]) -> Result<(), VerifyError>` closure implements this
/// trait, and so does `Arc<V>` (`Arc<dyn VerifyRequest>` for verifiers chosen at run time).
///
/// # What the signature covers
///
/// A signature covers the body and, depending on the scheme, some headers (an id, a
/// timestamp). A key taken from anything else, such as a delivery-id header the sender does
/// not sign, can be changed by whoever captured one signed request: the same body and
/// signature, sent again under a new id, verify. So when a verified route's key extractor
/// cannot prove that every key it yields is covered
/// ([`ExtractKey::covered_by`](crate::key::ExtractKey::covered_by)), the layer also claims the
/// **signed content** of each request (a SHA-256 of the body and
/// [`signed_context`](Self::signed_context)) beside its key, in the same reserve: a replay
/// under a new id finds it completed and is a duplicate, and a redelivery under the same id
/// stays one. Two methods say what a scheme covers; their defaults say "the body only", which
/// is right for a scheme that signs the body alone and conservative for any other.
///
/// The cost: under a scheme that signs the body only (`X-Hub-Signature-256`, Shopify), two
/// events with byte-identical bodies under different ids are one event. Where a timestamp or
/// an id is signed, it is part of the signed content, and only a replay of the same signed
/// values is merged.
pub trait VerifyRequest: Send + Sync + 'static {
    /// `Ok(())` when the request is authentic.
    fn verify(&self, parts: &Parts, body: &[u8]) -> Result<(), VerifyError>;

    /// Whether the signature covers the value of header `name`, so that a key taken from it
    /// cannot be changed without breaking the signature. Default: no header (the body only).
    ///
    /// Standard Webhooks covers `webhook-id` and `webhook-timestamp` (and their `svix-*`
    /// names), Slack its
    /// `X-Slack-Request-Timestamp`; Stripe-style, `X-Hub-Signature-256` and Shopify no header
    /// a key could come from.
    fn covers_header(&self, name: &HeaderName) -> bool {
        let _ = name;
        false
    }

    /// What the signature covers besides the body in this verified request, as sent (the
    /// signed id, the signed timestamp), in a fixed order. The layer hashes it with the body
    /// into the signed content it claims when the key is not covered: so two genuine events
    /// with the same body but signed at different times are not merged, while a captured
    /// request replayed as is (it must keep its signed values to verify) is. Default: nothing.
    ///
    /// Standard Webhooks: the id and the timestamp of the family verified (`svix-*` or
    /// `webhook-*`); Stripe-style: the `t=` value;
    /// Slack: `X-Slack-Request-Timestamp`; `X-Hub-Signature-256` and Shopify: nothing.
    fn signed_context<'a>(&self, parts: &'a Parts) -> Vec<&'a [u8]> {
        let _ = parts;
        Vec::new()
    }
}

impl<F> VerifyRequest for F
where
    F: Fn(&Parts, &[u8]) -> Result<(), VerifyError> + Send + Sync + 'static,
{
    fn verify(&self, parts: &Parts, body: &[u8]) -> Result<(), VerifyError> {
        self(parts, body)
    }
}

/// A shared verifier, for verifiers chosen at run time (`Arc<dyn VerifyRequest>`).
impl<V: VerifyRequest + ?Sized> VerifyRequest for Arc<V> {
    fn verify(&self, parts: &Parts, body: &[u8]) -> Result<(), VerifyError> {
        (**self).verify(parts, body)
    }

    fn covers_header(&self, name: &HeaderName) -> bool {
        (**self).covers_header(name)
    }

    fn signed_context<'a>(&self, parts: &'a Parts) -> Vec<&'a [u8]> {
        (**self).signed_context(parts)
    }
}

/// Why a request is not authentic. Answered 401 with [`Display`](fmt::Display) as the detail:
/// it says what is wrong and names the header, never quoting a header value, a signature, a
/// secret or the body.
#[derive(Clone, Debug)]
pub struct VerifyError {
    kind: VerifyErrorKind,
    detail: Cow<'static, str>,
}

/// The class of a [`VerifyError`], for metrics and matching.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum VerifyErrorKind {
    /// A header the scheme needs (signature, timestamp, id) is not there.
    MissingHeader,
    /// A header is there but unusable: repeated, not visible ASCII, not in the scheme's syntax,
    /// or a timestamp that is not a plain decimal number.
    MalformedHeader,
    /// The header is well formed but no signature in it matches any secret or key (this
    /// includes a signature that does not decode to the length of its kind: it cannot match).
    NoMatch,
    /// The signed timestamp is further from now than the tolerance.
    OutsideTolerance,
    /// Anything else, reported by a user verifier.
    Other,
}

impl VerifyErrorKind {
    /// A stable label for metrics and logs: `missing_signature`, `malformed_signature`,
    /// `signature_mismatch`, `timestamp_outside_tolerance`, `unverified`.
    pub fn code(self) -> &'static str {
        match self {
            VerifyErrorKind::MissingHeader => "missing_signature",
            VerifyErrorKind::MalformedHeader => "malformed_signature",
            VerifyErrorKind::NoMatch => "signature_mismatch",
            VerifyErrorKind::OutsideTolerance => "timestamp_outside_tolerance",
            VerifyErrorKind::Other => "unverified",
        }
    }
}

impl VerifyError {
    /// An error of `kind` with a human-readable `detail` (for user verifiers). Keep secrets,
    /// signatures and the body out of it: it is sent to the client.
    pub fn new(kind: VerifyErrorKind, detail: impl Into<Cow<'static, str>>) -> Self {
        VerifyError {
            kind,
            detail: detail.into(),
        }
    }

    /// The class of the error.
    pub fn kind(&self) -> VerifyErrorKind {
        self.kind
    }

    /// Header `name` is missing: "the `name` header is missing".
    #[cfg_attr(not(feature = "verify"), allow(dead_code))]
    pub(crate) fn missing_header(name: &str) -> Self {
        Self::new(
            VerifyErrorKind::MissingHeader,
            format!("the {name} header is missing"),
        )
    }

    /// Header `name` is unusable, for reason `why` ("it appears more than once"). The header's
    /// value is not quoted: it may be a signature.
    #[cfg_attr(not(feature = "verify"), allow(dead_code))]
    pub(crate) fn malformed_header(name: &str, why: &str) -> Self {
        Self::new(
            VerifyErrorKind::MalformedHeader,
            format!("the {name} header is malformed: {why}"),
        )
    }

    /// No signature matched any secret.
    #[cfg_attr(not(feature = "verify"), allow(dead_code))]
    pub(crate) fn no_match() -> Self {
        Self::new(VerifyErrorKind::NoMatch, "no signature matched")
    }

    /// The signed timestamp is further from now than `tolerance`.
    #[cfg(test)]
    pub(crate) fn outside_tolerance(tolerance: Duration) -> Self {
        Self::new(
            VerifyErrorKind::OutsideTolerance,
            format!(
                "the signed timestamp is more than {} s away from the current time",
                tolerance.as_secs()
            ),
        )
    }

    /// An [`OutsideTolerance`](VerifyErrorKind::OutsideTolerance) error, saying by how much: `skew` is now minus
    /// the signed time, in seconds (positive: signed in the past). The timestamp is the
    /// request's own and not secret; the skew tells a clock problem from a replay.
    #[cfg_attr(not(feature = "verify"), allow(dead_code))]
    pub(crate) fn timestamp_skew(tolerance: Duration, skew: i128) -> Self {
        let direction = if skew >= 0 { "past" } else { "future" };
        Self::new(
            VerifyErrorKind::OutsideTolerance,
            format!(
                "the signed timestamp is {} s in the {direction}; at most {} s either way is tolerated",
                skew.unsigned_abs(),
                tolerance.as_secs()
            ),
        )
    }
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for VerifyError {}

/// Helpers for the schemes' tests.
#[cfg(all(test, feature = "verify"))]
pub(crate) mod testing {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use http::request::Parts;
    use http::{HeaderValue, Request};

    use super::{VerifyError, VerifyErrorKind};

    /// A POST's head with `headers`, in order (a name given twice appears twice).
    pub(crate) fn request(headers: &[(&str, &[u8])]) -> Parts {
        let mut request = Request::post("/hook").body(()).unwrap();
        for (name, value) in headers {
            let name = http::HeaderName::from_bytes(name.as_bytes()).unwrap();
            let value = HeaderValue::from_bytes(value).unwrap();
            request.headers_mut().append(name, value);
        }
        request.into_parts().0
    }

    /// A clock stopped at `secs` after the epoch.
    pub(crate) fn at(secs: u64) -> impl Fn() -> SystemTime + Send + Sync + 'static {
        move || UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// The kind of the error `result` must be.
    pub(crate) fn kind<T: std::fmt::Debug>(result: Result<T, VerifyError>) -> VerifyErrorKind {
        result.unwrap_err().kind()
    }
}

/// What each built-in scheme says it covers.
#[cfg(all(test, feature = "verify"))]
mod coverage {
    use super::testing::request;
    use super::*;

    #[test]
    fn each_scheme_names_what_it_signs() {
        let secret = ["It's a Secret to Everybody"];
        let parts = request(&[
            ("webhook-id", b"msg_1"),
            ("webhook-timestamp", b"1614265330"),
            ("stripe-signature", b"t=1492774577,v1=00,v1=11"),
            ("x-slack-request-timestamp", b"1531420618"),
        ]);
        let name = HeaderName::from_static;
        let standard = StandardWebhooks::new(["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]).unwrap();
        assert!(standard.covers_header(&name("webhook-id")));
        assert!(standard.covers_header(&name("webhook-timestamp")));
        assert!(standard.covers_header(&name("svix-id")));
        assert!(standard.covers_header(&name("svix-timestamp")));
        assert!(!standard.covers_header(&name("x-delivery")));
        let signed: [&[u8]; 2] = [b"msg_1", b"1614265330"];
        assert_eq!(standard.signed_context(&parts), signed);
        // Stripe-style: the `t=` value only, not the (paddable) signature entries.
        let stripe = StripeSignature::stripe(secret).unwrap();
        assert!(!stripe.covers_header(&name("stripe-signature")));
        assert_eq!(stripe.signed_context(&parts), [b"1492774577"]);
        let slack = SlackSignature::new(secret).unwrap();
        assert!(slack.covers_header(&name("x-slack-request-timestamp")));
        assert_eq!(slack.signed_context(&parts), [b"1531420618"]);
        let body_only: [Arc<dyn VerifyRequest>; 2] = [
            Arc::new(HubSignature256::new(secret).unwrap()),
            Arc::new(ShopifyHmac::new(secret).unwrap()),
        ];
        for scheme in body_only {
            assert!(!scheme.covers_header(&name("webhook-id")));
            assert!(scheme.signed_context(&parts).is_empty());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn parts(token: Option<&str>) -> Parts {
        let mut request = Request::post("/hook");
        if let Some(token) = token {
            request = request.header("x-token", token);
        }
        request.body(()).unwrap().into_parts().0
    }

    fn token(parts: &Parts, body: &[u8]) -> Result<(), VerifyError> {
        match parts.headers.get("x-token") {
            None => Err(VerifyError::missing_header("x-token")),
            Some(value) if value == "t0ken" && !body.is_empty() => Ok(()),
            Some(_) => Err(VerifyError::no_match()),
        }
    }

    #[test]
    fn a_closure_is_a_verifier() {
        let verifier = |parts: &Parts, body: &[u8]| token(parts, body);
        assert!(verifier.verify(&parts(Some("t0ken")), b"{}").is_ok());
        assert_eq!(
            verifier
                .verify(&parts(Some("guess")), b"{}")
                .unwrap_err()
                .kind(),
            VerifyErrorKind::NoMatch
        );
        // A function item too.
        assert_eq!(
            token.verify(&parts(None), b"{}").unwrap_err().kind(),
            VerifyErrorKind::MissingHeader
        );
    }

    #[test]
    fn a_shared_verifier_chosen_at_run_time() {
        fn check(verifier: &impl VerifyRequest) -> Result<(), VerifyError> {
            verifier.verify(&parts(Some("t0ken")), b"{}")
        }
        let allow: Arc<dyn VerifyRequest> = Arc::new(|_: &Parts, _: &[u8]| Ok(()));
        let deny: Arc<dyn VerifyRequest> = Arc::new(|_: &Parts, _: &[u8]| {
            Err(VerifyError::new(
                VerifyErrorKind::Other,
                "the sender is unknown",
            ))
        });
        assert!(check(&allow).is_ok());
        let err = check(&deny).unwrap_err();
        assert_eq!(err.kind().code(), "unverified");
        assert_eq!(err.to_string(), "the sender is unknown");
        assert!(check(&Arc::new(token)).is_ok());
    }

    #[test]
    fn codes_are_stable() {
        let codes = [
            (VerifyErrorKind::MissingHeader, "missing_signature"),
            (VerifyErrorKind::MalformedHeader, "malformed_signature"),
            (VerifyErrorKind::NoMatch, "signature_mismatch"),
            (
                VerifyErrorKind::OutsideTolerance,
                "timestamp_outside_tolerance",
            ),
            (VerifyErrorKind::Other, "unverified"),
        ];
        for (kind, code) in codes {
            assert_eq!(kind.code(), code);
        }
    }

    #[test]
    fn details() {
        let err = VerifyError::missing_header("webhook-signature");
        assert_eq!(err.kind(), VerifyErrorKind::MissingHeader);
        assert_eq!(err.to_string(), "the webhook-signature header is missing");

        let err = VerifyError::malformed_header("stripe-signature", "it appears more than once");
        assert_eq!(err.kind(), VerifyErrorKind::MalformedHeader);
        assert_eq!(
            err.to_string(),
            "the stripe-signature header is malformed: it appears more than once"
        );

        let err = VerifyError::no_match();
        assert_eq!(err.kind(), VerifyErrorKind::NoMatch);
        assert_eq!(err.to_string(), "no signature matched");

        let err = VerifyError::outside_tolerance(DEFAULT_TOLERANCE);
        assert_eq!(err.kind(), VerifyErrorKind::OutsideTolerance);
        assert!(err.to_string().contains("300 s"), "{err}");

        let err = VerifyError::timestamp_skew(DEFAULT_TOLERANCE, -601);
        assert_eq!(err.kind(), VerifyErrorKind::OutsideTolerance);
        assert!(err.to_string().contains("601 s in the future"), "{err}");

        // A source-less error, usable behind `Box<dyn Error>`.
        let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(VerifyError::no_match());
        assert!(boxed.source().is_none());
    }
}
