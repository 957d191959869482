use std::fmt;

use http::HeaderName;
use http::request::Parts;

use super::freshness::Freshness;
use super::hmac::{Candidate, Keys, decode_hex};
use super::secret::InvalidSecret;
use super::{VerifyError, VerifyRequest, header, secret};
use crate::ConfigError;

/// Stripe-style signatures: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>...]`, HMAC-SHA256
/// of `{t}.{body}`. Many senders copy the format under their own header name
/// ([`new`](Self::new)).
///
/// Any `v1` entry that matches passes (Stripe sends one per active secret while one is rolled);
/// entries of other schemes (`v0=`, a test-mode signature) are ignored. The secret is used as
/// given: the bytes of the whole `whsec_...` string are the key (unlike
/// [`StandardWebhooks`](super::StandardWebhooks), which decodes it). `t` must be within the
/// [tolerance](Self::tolerance) of now.
///
/// A request is refused with:
/// - [`MissingHeader`](super::VerifyErrorKind::MissingHeader) without the header;
/// - [`MalformedHeader`](super::VerifyErrorKind::MalformedHeader) when it is repeated or not
///   visible ASCII, an item is not `key=value`, `t` is missing, repeated or not a plain
///   decimal number;
/// - [`OutsideTolerance`](super::VerifyErrorKind::OutsideTolerance) for a `t` too old or too
///   far ahead;
/// - [`NoMatch`](super::VerifyErrorKind::NoMatch) when no `v1` entry is 64 hex digits that
///   match a secret.
///
/// ```
/// use http::Request;
/// use tower_idempotency::verify::{StripeSignature, VerifyErrorKind, VerifyRequest};
///
/// let stripe = StripeSignature::stripe(["whsec_current", "whsec_previous"])?;
/// let kalipto = StripeSignature::new("X-Kalipto-Signature", ["kalipto-signing-secret"])?;
///
/// let (parts, ()) = Request::post("/webhooks/stripe")
///     .header("stripe-signature", "t=1492774577,v1=not-a-signature")
///     .body(())?
///     .into_parts();
/// // Far outside the tolerance (and not signed with either secret anyway).
/// let err = stripe.verify(&parts, b"{}").unwrap_err();
/// assert_eq!(err.kind(), VerifyErrorKind::OutsideTolerance);
/// // The other verifier reads another header.
/// assert_eq!(kalipto.verify(&parts, b"{}").unwrap_err().kind(), VerifyErrorKind::MissingHeader);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct StripeSignature {
    header: HeaderName,
    keys: Keys,
    freshness: Freshness,
}

impl StripeSignature {
    /// The header Stripe sends.
    pub(crate) const STRIPE_HEADER: &'static str = "stripe-signature";

    /// A verifier of header `header` (case-insensitive) accepting any of `secrets`, each used
    /// as given. An error when `header` is not a valid header name, or there is no secret, or
    /// one is empty or padded with whitespace.
    pub fn new<I, S>(header: &str, secrets: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let header = HeaderName::from_bytes(header.to_ascii_lowercase().as_bytes())
            .map_err(|_| InvalidSecret::header_name(header))?;
        Ok(StripeSignature {
            header,
            keys: secret::as_given(secrets)?,
            freshness: Freshness::default(),
        })
    }

    /// A verifier of Stripe's own `Stripe-Signature` header.
    pub fn stripe<I, S>(secrets: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::new(Self::STRIPE_HEADER, secrets)
    }
}

timestamp_builders!(StripeSignature);

impl VerifyRequest for StripeSignature {
    fn verify(&self, parts: &Parts, body: &[u8]) -> Result<(), VerifyError> {
        let value = header::single(parts, &self.header)?;
        let signed = Signed::parse(self.header.as_str(), value)?;
        self.freshness.check(signed.at)?;
        let message = [signed.timestamp.as_bytes(), b".", body];
        if self.keys.verify(&message, signed.v1()) {
            Ok(())
        } else {
            Err(VerifyError::no_match())
        }
    }

    /// The `t=` timestamp (no header a key could come from is signed).
    fn signed_context<'a>(&self, parts: &'a Parts) -> Vec<&'a [u8]> {
        header::single(parts, &self.header)
            .and_then(|value| Signed::parse(self.header.as_str(), value))
            .map(|signed| vec![signed.timestamp.as_bytes()])
            .unwrap_or_default()
    }
}

/// The header's items: its timestamp, as sent and as a number, and the whole value to draw the
/// `v1` entries from.
struct Signed<'a> {
    timestamp: &'a str,
    at: u64,
    value: &'a str,
}

impl<'a> Signed<'a> {
    fn parse(name: &str, value: &'a str) -> Result<Self, VerifyError> {
        let mut timestamp = None;
        for item in items(value) {
            let (key, text) = item.split_once('=').ok_or_else(|| {
                VerifyError::malformed_header(name, "an item is not of the form `key=value`")
            })?;
            // `replace` only for `t` items: `&&` does not evaluate it otherwise.
            if key == "t" && timestamp.replace(text).is_some() {
                return Err(VerifyError::malformed_header(
                    name,
                    "it holds more than one `t=` timestamp",
                ));
            }
        }
        let timestamp = timestamp
            .ok_or_else(|| VerifyError::malformed_header(name, "it holds no `t=` timestamp"))?;
        Ok(Signed {
            timestamp,
            at: header::unix_seconds(name, timestamp)?,
            value,
        })
    }

    /// The `v1` signatures that decode to 32 bytes (others cannot match).
    fn v1(&self) -> impl Iterator<Item = Candidate> + Clone + 'a {
        items(self.value)
            .filter_map(|item| item.strip_prefix("v1="))
            .filter_map(|hex| decode_hex(hex.as_bytes()))
    }
}

/// The comma-separated items, spaces around them trimmed (Stripe sends none; some senders of
/// the same format do), empty items skipped.
fn items(value: &str) -> impl Iterator<Item = &str> + Clone {
    value
        .split(',')
        .map(|item| item.trim_matches(' '))
        .filter(|item| !item.is_empty())
}

impl fmt::Debug for StripeSignature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StripeSignature")
            .field("header", &self.header)
            .field("secrets", &self.keys.len())
            .field("freshness", &self.freshness)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::VerifyErrorKind;
    use crate::verify::hmac::{sign, to_hex};
    use crate::verify::testing::{at, kind, request};

    // Stripe publishes the format (its webhook documentation, "Verify signatures manually"),
    // not a vector with a secret. These signatures were computed independently with Python's hmac
    // module: hmac.new(SECRET, b"1686089970." + BODY, hashlib.sha256).hexdigest().
    const SECRET: &str = "whsec_tower_idempotency_stripe_test";
    const NEXT_SECRET: &str = "whsec_tower_idempotency_stripe_next";
    const TS: u64 = 1_686_089_970;
    const BODY: &[u8] = br#"{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event"}"#;
    const V1: &str = "8dc086e726e2012a2b5f84f9a8bb485544b73abe045beb1d754a4cdd31234062";
    const V1_NEXT: &str = "59ef582cafabe9d32607de2e3920f6bada24dc5b51c208bb11c429031416b0f6";

    fn verifier() -> StripeSignature {
        StripeSignature::stripe([SECRET]).unwrap().clock(at(TS))
    }

    fn check(value: &str) -> Result<(), VerifyError> {
        verifier().verify(&request(&[("stripe-signature", value.as_bytes())]), BODY)
    }

    #[test]
    fn the_secret_is_used_as_given() {
        let tag = sign(SECRET.as_bytes(), &[b"1686089970.", BODY]);
        assert_eq!(to_hex(&tag), V1);
        assert!(check(&format!("t={TS},v1={V1}")).is_ok());
        // Upper-case hex is the same signature.
        assert!(check(&format!("t={TS},v1={}", V1.to_uppercase())).is_ok());
    }

    #[test]
    fn several_v1_entries_and_other_schemes() {
        // Any 64 hex digits: a v0 entry is never checked.
        let v0 = "6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39";
        assert!(check(&format!("t={TS},v1={V1_NEXT},v1={V1}")).is_ok());
        assert!(check(&format!("t={TS},v1={V1},v0={v0}")).is_ok());
        assert!(
            check(&format!("v0={v0},v1={V1},t={TS}")).is_ok(),
            "any order"
        );
        assert!(check(&format!("t={TS}, v1={V1}")).is_ok(), "spaces");
        assert!(check(&format!("t={TS},scheme=future,v1={V1}")).is_ok());
        // The right signature under another scheme is not a v1 signature.
        assert_eq!(
            kind(check(&format!("t={TS},v0={V1}"))),
            VerifyErrorKind::NoMatch
        );
        assert_eq!(kind(check(&format!("t={TS}"))), VerifyErrorKind::NoMatch);
    }

    #[test]
    fn secrets_rotate() {
        let verifier = StripeSignature::stripe([SECRET, NEXT_SECRET])
            .unwrap()
            .clock(at(TS));
        for v1 in [V1, V1_NEXT] {
            let parts = request(&[("stripe-signature", format!("t={TS},v1={v1}").as_bytes())]);
            assert!(verifier.verify(&parts, BODY).is_ok(), "{v1}");
        }
        assert_eq!(
            kind(check(&format!("t={TS},v1={V1_NEXT}"))),
            VerifyErrorKind::NoMatch
        );
    }

    #[test]
    fn forgeries() {
        let other_body = to_hex(&sign(SECRET.as_bytes(), &[b"1686089970.", b"{}"]));
        let decoded_key = to_hex(&sign(
            b"tower_idempotency_stripe_test",
            &[b"1686089970.", BODY],
        ));
        for forged in [
            format!("t={TS},v1="),
            format!("t={TS},v1={}", &V1[..63]),
            format!("t={TS},v1={}", &V1[..32]),
            format!("t={TS},v1={V1}00"),
            format!("t={TS},v1=zz{}", &V1[2..]),
            format!("t={TS},v1={other_body}"),
            format!("t={TS},v1={decoded_key}"),
            // Signed for another timestamp: the timestamp is part of the message.
            format!("t={},v1={V1}", TS + 1),
        ] {
            let err = check(&forged).unwrap_err();
            assert_eq!(err.kind(), VerifyErrorKind::NoMatch, "{forged}");
            assert!(!err.to_string().contains(&V1[..16]));
        }
        let verifier = verifier();
        let parts = request(&[("stripe-signature", format!("t={TS},v1={V1}").as_bytes())]);
        assert_eq!(
            kind(verifier.verify(&parts, b"{}")),
            VerifyErrorKind::NoMatch
        );
        let mut tampered = BODY.to_vec();
        tampered[7] ^= 1;
        assert_eq!(
            kind(verifier.verify(&parts, &tampered)),
            VerifyErrorKind::NoMatch
        );
    }

    #[test]
    fn malformed_headers() {
        for garbage in [
            String::new(),
            "garbage".to_owned(),
            format!("v1={V1}"),
            format!("t={TS},t={TS},v1={V1}"),
            format!("t=+{TS},v1={V1}"),
            format!("t={TS}.5,v1={V1}"),
            format!("t=,v1={V1}"),
            format!("t={TS};v1={V1}"),
        ] {
            let err = check(&garbage).unwrap_err();
            assert_eq!(err.kind(), VerifyErrorKind::MalformedHeader, "{garbage:?}");
            assert!(
                err.to_string().starts_with("the stripe-signature header"),
                "{err}"
            );
            assert!(!err.to_string().contains(&V1[..16]), "{err}");
        }
        let err = verifier().verify(&request(&[]), BODY).unwrap_err();
        assert_eq!(err.kind(), VerifyErrorKind::MissingHeader);
        let value = format!("t={TS},v1={V1}");
        let twice = request(&[
            ("stripe-signature", value.as_bytes()),
            ("stripe-signature", value.as_bytes()),
        ]);
        let err = verifier().verify(&twice, BODY).unwrap_err();
        assert!(err.to_string().contains("appears more than once"), "{err}");
        let non_ascii = request(&[("stripe-signature", b"t=1686089970,v1=\xe9")]);
        assert_eq!(
            kind(verifier().verify(&non_ascii, BODY)),
            VerifyErrorKind::MalformedHeader
        );
    }

    #[test]
    fn the_timestamp_must_be_recent() {
        let value = format!("t={TS},v1={V1}");
        let parts = request(&[("stripe-signature", value.as_bytes())]);
        let at_time = |now: u64| StripeSignature::stripe([SECRET]).unwrap().clock(at(now));
        assert_eq!(
            kind(at_time(TS + 600).verify(&parts, BODY)),
            VerifyErrorKind::OutsideTolerance
        );
        assert_eq!(
            kind(at_time(TS - 600).verify(&parts, BODY)),
            VerifyErrorKind::OutsideTolerance
        );
        assert!(at_time(TS + 300).verify(&parts, BODY).is_ok());
        assert!(at_time(TS - 300).verify(&parts, BODY).is_ok());
        let lenient = at_time(TS + 600).tolerance(std::time::Duration::from_secs(601));
        assert!(lenient.verify(&parts, BODY).is_ok());
    }

    #[test]
    fn a_custom_header() {
        let verifier = StripeSignature::new("X-Kalipto-Signature", [SECRET])
            .unwrap()
            .clock(at(TS));
        let value = format!("t={TS},v1={V1}");
        let parts = request(&[("x-kalipto-signature", value.as_bytes())]);
        assert!(verifier.verify(&parts, BODY).is_ok());
        let err = verifier
            .verify(&request(&[("stripe-signature", value.as_bytes())]), BODY)
            .unwrap_err();
        assert_eq!(err.to_string(), "the x-kalipto-signature header is missing");
    }

    #[test]
    fn configuration_errors() {
        let err = StripeSignature::new("bad header", [SECRET]).unwrap_err();
        assert_eq!(err.to_string(), r#"invalid header name "bad header""#);
        assert!(StripeSignature::stripe(Vec::<&str>::new()).is_err());
        assert!(StripeSignature::stripe([SECRET, ""]).is_err());
    }

    #[test]
    fn debug_hides_the_secrets() {
        let debug = format!(
            "{:?}",
            StripeSignature::stripe([SECRET, NEXT_SECRET]).unwrap()
        );
        assert!(debug.contains("secrets: 2"), "{debug}");
        assert!(!debug.contains("whsec"), "{debug}");
    }
}
