use std::fmt;

use http::HeaderName;
use http::request::Parts;

use super::hmac::{Keys, decode_hex};
use super::{VerifyError, VerifyRequest, header, secret};
use crate::ConfigError;

/// `X-Hub-Signature-256: sha256=<hex>`, HMAC-SHA256 of the raw body: GitHub webhooks, and Meta
/// (WhatsApp, Messenger, Instagram) with the app secret.
///
/// The secret is used as given. Nothing is timestamped: a replay is a duplicate, caught by the
/// idempotency key (`X-GitHub-Delivery`, or ids in the body).
///
/// A request is refused with:
/// - [`MissingHeader`](super::VerifyErrorKind::MissingHeader) without the header;
/// - [`MalformedHeader`](super::VerifyErrorKind::MalformedHeader) when it is repeated, not
///   visible ASCII, or does not start with `sha256=`;
/// - [`NoMatch`](super::VerifyErrorKind::NoMatch) when the rest is not 64 hex digits that match
///   a secret.
///
/// ```
/// use http::Request;
/// use tower_idempotency::verify::{HubSignature256, VerifyRequest};
///
/// // GitHub's documented example ("Validating webhook deliveries").
/// let github = HubSignature256::new(["It's a Secret to Everybody"])?;
/// let (parts, ()) = Request::post("/webhooks/github")
///     .header(
///         "X-Hub-Signature-256",
///         "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
///     )
///     .body(())?
///     .into_parts();
/// assert!(github.verify(&parts, b"Hello, World!").is_ok());
/// assert!(github.verify(&parts, b"Hello, World?").is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct HubSignature256 {
    keys: Keys,
}

const SIGNATURE: HeaderName = HeaderName::from_static(HubSignature256::HEADER);

impl HubSignature256 {
    /// The header that holds the signature.
    pub(crate) const HEADER: &'static str = "x-hub-signature-256";

    /// A verifier accepting any of `secrets`, each used as given. An error when there is none,
    /// or one is empty or padded with whitespace.
    pub fn new<I, S>(secrets: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(HubSignature256 {
            keys: secret::as_given(secrets)?,
        })
    }
}

impl VerifyRequest for HubSignature256 {
    fn verify(&self, parts: &Parts, body: &[u8]) -> Result<(), VerifyError> {
        let value = header::single(parts, &SIGNATURE)?;
        let hex = value.strip_prefix("sha256=").ok_or_else(|| {
            VerifyError::malformed_header(Self::HEADER, "it does not start with `sha256=`")
        })?;
        if self
            .keys
            .verify(&[body], decode_hex(hex.as_bytes()).into_iter())
        {
            Ok(())
        } else {
            Err(VerifyError::no_match())
        }
    }
}

impl fmt::Debug for HubSignature256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HubSignature256")
            .field("secrets", &self.keys.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::VerifyErrorKind;
    use crate::verify::hmac::{sign, to_hex};
    use crate::verify::testing::{kind, request};

    // GitHub's documented test values: docs.github.com, "Validating webhook deliveries",
    // section "Testing the webhook payload validation" (github/docs,
    // content/webhooks/using-webhooks/validating-webhook-deliveries.md). Checked independently
    // with Python's hmac module.
    const SECRET: &str = "It's a Secret to Everybody";
    const BODY: &[u8] = b"Hello, World!";
    const SIGNATURE: &str =
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

    fn check(value: &[u8], body: &[u8]) -> Result<(), VerifyError> {
        let verifier = HubSignature256::new([SECRET]).unwrap();
        verifier.verify(&request(&[("x-hub-signature-256", value)]), body)
    }

    #[test]
    fn githubs_documented_example() {
        assert_eq!(
            format!("sha256={}", to_hex(&sign(SECRET.as_bytes(), &[BODY]))),
            SIGNATURE
        );
        assert!(check(SIGNATURE.as_bytes(), BODY).is_ok());
    }

    #[test]
    fn secrets_rotate() {
        let verifier = HubSignature256::new(["app-secret-old", "app-secret-new"]).unwrap();
        for secret in ["app-secret-old", "app-secret-new"] {
            let value = format!("sha256={}", to_hex(&sign(secret.as_bytes(), &[BODY])));
            let parts = request(&[("x-hub-signature-256", value.as_bytes())]);
            assert!(verifier.verify(&parts, BODY).is_ok(), "{secret}");
        }
        assert_eq!(
            kind(verifier.verify(
                &request(&[("x-hub-signature-256", SIGNATURE.as_bytes())]),
                BODY
            )),
            VerifyErrorKind::NoMatch
        );
    }

    #[test]
    fn forgeries() {
        let hex = &SIGNATURE["sha256=".len()..];
        let wrong_secret = format!(
            "sha256={}",
            to_hex(&sign(b"It's a secret to everybody", &[BODY]))
        );
        for forged in [
            wrong_secret,
            "sha256=".to_owned(),
            format!("sha256={}", &hex[..62]),
            format!("sha256={}", &hex[..63]),
            format!("sha256={hex}00"),
            format!("sha256={}", &hex[..40]),
            format!("sha256= {hex}"),
            format!("sha256={}", "0".repeat(64)),
            format!("sha256={}x", &hex[..63]),
        ] {
            let err = check(forged.as_bytes(), BODY).unwrap_err();
            assert_eq!(err.kind(), VerifyErrorKind::NoMatch, "{forged}");
        }
        for tampered in [
            &b"Hello, World?"[..],
            b"Hello, World!\n",
            b"",
            b"hello, world!",
        ] {
            assert_eq!(
                kind(check(SIGNATURE.as_bytes(), tampered)),
                VerifyErrorKind::NoMatch
            );
        }
    }

    #[test]
    fn malformed_headers() {
        let hex = &SIGNATURE["sha256=".len()..];
        for garbage in [
            String::new(),
            hex.to_owned(),
            format!("sha1={hex}"),
            format!("SHA256={hex}"),
            "garbage".to_owned(),
        ] {
            let err = check(garbage.as_bytes(), BODY).unwrap_err();
            assert_eq!(err.kind(), VerifyErrorKind::MalformedHeader, "{garbage:?}");
            assert!(!err.to_string().contains(&hex[..16]), "{err}");
        }
        assert_eq!(
            kind(check(b"sha256=\xff\xfe", BODY)),
            VerifyErrorKind::MalformedHeader
        );
        let verifier = HubSignature256::new([SECRET]).unwrap();
        assert_eq!(
            kind(verifier.verify(&request(&[]), BODY)),
            VerifyErrorKind::MissingHeader
        );
        let twice = request(&[
            ("x-hub-signature-256", SIGNATURE.as_bytes()),
            ("x-hub-signature-256", SIGNATURE.as_bytes()),
        ]);
        let err = verifier.verify(&twice, BODY).unwrap_err();
        assert_eq!(err.kind(), VerifyErrorKind::MalformedHeader);
        assert!(err.to_string().contains("appears more than once"), "{err}");
    }

    #[test]
    fn configuration_and_debug() {
        assert!(HubSignature256::new(Vec::<String>::new()).is_err());
        assert!(HubSignature256::new([""]).is_err());
        let debug = format!("{:?}", HubSignature256::new([SECRET]).unwrap());
        assert_eq!(debug, "HubSignature256 { secrets: 1 }");
    }
}
