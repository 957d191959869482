use std::fmt;

use http::HeaderName;
use http::request::Parts;

use super::hmac::{Keys, decode_base64};
use super::{VerifyError, VerifyRequest, header, secret};
use crate::ConfigError;

/// Shopify webhooks: `X-Shopify-Hmac-Sha256: <base64>`, HMAC-SHA256 of the raw body with the
/// app's client secret (or the webhook signing secret shown in the admin), used as given.
///
/// Nothing is timestamped: a replay is a duplicate, caught by the idempotency key
/// (`X-Shopify-Webhook-Id`).
///
/// A request is refused with:
/// - [`MissingHeader`](super::VerifyErrorKind::MissingHeader) without the header;
/// - [`MalformedHeader`](super::VerifyErrorKind::MalformedHeader) when it is repeated or not
///   visible ASCII;
/// - [`NoMatch`](super::VerifyErrorKind::NoMatch) when it is not base64 of 32 bytes that match
///   a secret.
///
/// ```
/// use http::Request;
/// use tower_idempotency::verify::{ShopifyHmac, VerifyErrorKind, VerifyRequest};
///
/// let shopify = ShopifyHmac::new(["shpss_current", "shpss_previous"])?;
/// let (parts, ()) = Request::post("/webhooks/shopify")
///     .header("X-Shopify-Hmac-Sha256", "bm90IGEgc2lnbmF0dXJl")
///     .body(())?
///     .into_parts();
/// let err = shopify.verify(&parts, br#"{"id":1}"#).unwrap_err();
/// assert_eq!(err.kind(), VerifyErrorKind::NoMatch);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct ShopifyHmac {
    keys: Keys,
}

const SIGNATURE: HeaderName = HeaderName::from_static(ShopifyHmac::HEADER);

impl ShopifyHmac {
    /// The header that holds the signature.
    pub(crate) const HEADER: &'static str = "x-shopify-hmac-sha256";

    /// A verifier accepting any of `secrets`, each used as given. An error when there is none,
    /// or one is empty or padded with whitespace.
    pub fn new<I, S>(secrets: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(ShopifyHmac {
            keys: secret::as_given(secrets)?,
        })
    }
}

impl VerifyRequest for ShopifyHmac {
    fn verify(&self, parts: &Parts, body: &[u8]) -> Result<(), VerifyError> {
        let value = header::single(parts, &SIGNATURE)?;
        if self
            .keys
            .verify(&[body], decode_base64(value.as_bytes()).into_iter())
        {
            Ok(())
        } else {
            Err(VerifyError::no_match())
        }
    }
}

impl fmt::Debug for ShopifyHmac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShopifyHmac")
            .field("secrets", &self.keys.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::VerifyErrorKind;
    use crate::verify::hmac::{sign, to_base64};
    use crate::verify::testing::{kind, request};

    // Shopify documents the scheme, not a vector. This signature was computed independently
    // with Python: base64.b64encode(hmac.new(SECRET, BODY, hashlib.sha256).digest()).
    const SECRET: &str = "shpss_tower_idempotency_test";
    const BODY: &[u8] = br#"{"id":820982911946154508,"email":"jon@example.com"}"#;
    const SIGNATURE: &str = "ejuRmqWAgTafXzlFUNlP8RnIiNnx+LO2WupTLI9Mp8Q=";

    fn check(value: &[u8], body: &[u8]) -> Result<(), VerifyError> {
        let verifier = ShopifyHmac::new([SECRET]).unwrap();
        verifier.verify(&request(&[("x-shopify-hmac-sha256", value)]), body)
    }

    #[test]
    fn a_signature_computed_elsewhere() {
        assert_eq!(to_base64(&sign(SECRET.as_bytes(), &[BODY])), SIGNATURE);
        assert!(check(SIGNATURE.as_bytes(), BODY).is_ok());
    }

    #[test]
    fn secrets_rotate() {
        let verifier = ShopifyHmac::new(["shpss_old", "shpss_new"]).unwrap();
        for secret in ["shpss_old", "shpss_new"] {
            let value = to_base64(&sign(secret.as_bytes(), &[BODY]));
            let parts = request(&[("x-shopify-hmac-sha256", value.as_bytes())]);
            assert!(verifier.verify(&parts, BODY).is_ok(), "{secret}");
        }
    }

    #[test]
    fn forgeries() {
        let tag = sign(SECRET.as_bytes(), &[BODY]);
        let long = [tag.as_slice(), &[0]].concat();
        for forged in [
            to_base64(&sign(b"shpss_other", &[BODY])),
            String::new(),
            SIGNATURE[..40].to_owned(),
            SIGNATURE.trim_end_matches('=').to_owned(),
            to_base64(&tag[..31]),
            to_base64(&long),
            to_base64(&tag[..1]),
            "garbage".to_owned(),
            format!("sha256={SIGNATURE}"),
            "=".repeat(44),
        ] {
            let err = check(forged.as_bytes(), BODY).unwrap_err();
            assert_eq!(err.kind(), VerifyErrorKind::NoMatch, "{forged:?}");
            assert_eq!(err.to_string(), "no signature matched");
        }
        let mut tampered = BODY.to_vec();
        tampered.push(b' ');
        assert_eq!(
            kind(check(SIGNATURE.as_bytes(), &tampered)),
            VerifyErrorKind::NoMatch
        );
    }

    #[test]
    fn malformed_headers() {
        let verifier = ShopifyHmac::new([SECRET]).unwrap();
        assert_eq!(
            kind(verifier.verify(&request(&[]), BODY)),
            VerifyErrorKind::MissingHeader
        );
        let twice = request(&[
            ("x-shopify-hmac-sha256", SIGNATURE.as_bytes()),
            ("x-shopify-hmac-sha256", SIGNATURE.as_bytes()),
        ]);
        let err = verifier.verify(&twice, BODY).unwrap_err();
        assert!(err.to_string().contains("appears more than once"), "{err}");
        assert!(!err.to_string().contains(SIGNATURE), "{err}");
        assert_eq!(
            kind(check(b"ejuR\x80", BODY)),
            VerifyErrorKind::MalformedHeader
        );
    }

    #[test]
    fn configuration_and_debug() {
        assert!(ShopifyHmac::new(Vec::<&str>::new()).is_err());
        assert!(ShopifyHmac::new([" shpss"]).is_err());
        let debug = format!("{:?}", ShopifyHmac::new([SECRET, "b"]).unwrap());
        assert_eq!(debug, "ShopifyHmac { secrets: 2 }");
    }
}
