use std::fmt;

use http::HeaderName;
use http::request::Parts;

use super::freshness::Freshness;
use super::hmac::{Keys, decode_hex};
use super::{VerifyError, VerifyRequest, header, secret};
use crate::ConfigError;

/// Slack request signing: `X-Slack-Signature: v0=<hex>`, HMAC-SHA256 of
/// `v0:{X-Slack-Request-Timestamp}:{body}` with the app's signing secret, used as given.
///
/// The timestamp (unix seconds) must be within the [tolerance](Self::tolerance) of now.
///
/// A request is refused with:
/// - [`MissingHeader`](super::VerifyErrorKind::MissingHeader) without either header;
/// - [`MalformedHeader`](super::VerifyErrorKind::MalformedHeader) when one is repeated or not
///   visible ASCII, the signature does not start with `v0=`, or the timestamp is not a plain
///   decimal number;
/// - [`OutsideTolerance`](super::VerifyErrorKind::OutsideTolerance) for a timestamp too old or
///   too far ahead;
/// - [`NoMatch`](super::VerifyErrorKind::NoMatch) when the signature is not 64 hex digits that
///   match a secret.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use http::Request;
/// use tower_idempotency::verify::{SlackSignature, VerifyRequest};
///
/// // Slack's documented example ("Verifying requests from Slack"), at the time it was sent.
/// let slack = SlackSignature::new(["8f742231b10e8888abcd99yyyzzz85a5"])?
///     .tolerance(Duration::from_secs(60))
///     .clock(|| UNIX_EPOCH + Duration::from_secs(1531420618));
/// let body = concat!(
///     "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow",
///     "&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner",
///     "&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands",
///     "%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN",
///     "&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c",
/// );
/// let (parts, ()) = Request::post("/slack/commands")
///     .header("X-Slack-Request-Timestamp", "1531420618")
///     .header(
///         "X-Slack-Signature",
///         "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503",
///     )
///     .body(())?
///     .into_parts();
/// assert!(slack.verify(&parts, body.as_bytes()).is_ok());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct SlackSignature {
    keys: Keys,
    freshness: Freshness,
}

const SIGNATURE: HeaderName = HeaderName::from_static(SlackSignature::SIGNATURE_HEADER);
const TIMESTAMP: HeaderName = HeaderName::from_static(SlackSignature::TIMESTAMP_HEADER);

impl SlackSignature {
    /// The header that holds the signature.
    pub(crate) const SIGNATURE_HEADER: &'static str = "x-slack-signature";
    /// The header that holds the signed unix timestamp, in seconds.
    pub(crate) const TIMESTAMP_HEADER: &'static str = "x-slack-request-timestamp";

    /// A verifier accepting any of `secrets`, each used as given. An error when there is none,
    /// or one is empty or padded with whitespace.
    pub fn new<I, S>(secrets: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(SlackSignature {
            keys: secret::as_given(secrets)?,
            freshness: Freshness::default(),
        })
    }
}

timestamp_builders!(SlackSignature);

impl VerifyRequest for SlackSignature {
    fn verify(&self, parts: &Parts, body: &[u8]) -> Result<(), VerifyError> {
        let signature = header::single(parts, &SIGNATURE)?;
        let timestamp = header::single(parts, &TIMESTAMP)?;
        let hex = signature.strip_prefix("v0=").ok_or_else(|| {
            VerifyError::malformed_header(Self::SIGNATURE_HEADER, "it does not start with `v0=`")
        })?;
        let signed_at = header::unix_seconds(Self::TIMESTAMP_HEADER, timestamp)?;
        self.freshness.check(signed_at)?;
        let message = [b"v0:", timestamp.as_bytes(), b":", body];
        if self
            .keys
            .verify(&message, decode_hex(hex.as_bytes()).into_iter())
        {
            Ok(())
        } else {
            Err(VerifyError::no_match())
        }
    }

    /// `X-Slack-Request-Timestamp` is signed.
    fn covers_header(&self, name: &HeaderName) -> bool {
        name == TIMESTAMP
    }

    fn signed_context<'a>(&self, parts: &'a Parts) -> Vec<&'a [u8]> {
        header::signed_values(parts, &[&TIMESTAMP])
    }
}

impl fmt::Debug for SlackSignature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlackSignature")
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

    // Slack's documented example: api.slack.com, "Verifying requests from Slack", the
    // step-by-step walk-through. Checked independently with Python's hmac module.
    const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
    const TS: u64 = 1_531_420_618;
    const BODY: &[u8] = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    const SIGNATURE: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";

    fn verifier() -> SlackSignature {
        SlackSignature::new([SECRET]).unwrap().clock(at(TS))
    }

    fn parts(signature: &[u8], ts: &[u8]) -> Parts {
        request(&[
            ("x-slack-signature", signature),
            ("x-slack-request-timestamp", ts),
        ])
    }

    fn signed(secret: &str, ts: &str, body: &[u8]) -> String {
        let tag = sign(secret.as_bytes(), &[b"v0:", ts.as_bytes(), b":", body]);
        format!("v0={}", to_hex(&tag))
    }

    #[test]
    fn slacks_documented_example() {
        assert_eq!(signed(SECRET, "1531420618", BODY), SIGNATURE);
        assert!(
            verifier()
                .verify(&parts(SIGNATURE.as_bytes(), b"1531420618"), BODY)
                .is_ok()
        );
    }

    #[test]
    fn secrets_rotate() {
        let verifier = SlackSignature::new([SECRET, "another-signing-secret"])
            .unwrap()
            .clock(at(TS));
        for secret in [SECRET, "another-signing-secret"] {
            let signature = signed(secret, "1531420618", BODY);
            assert!(
                verifier
                    .verify(&parts(signature.as_bytes(), b"1531420618"), BODY)
                    .is_ok()
            );
        }
    }

    #[test]
    fn forgeries() {
        let hex = &SIGNATURE[3..];
        for forged in [
            signed("8f742231b10e8888abcd99yyyzzz85a6", "1531420618", BODY),
            "v0=".to_owned(),
            format!("v0={}", &hex[..60]),
            format!("v0={hex}ab"),
            format!("v0={}", "f".repeat(64)),
            // Signed for another timestamp.
            signed(SECRET, "1531420619", BODY),
        ] {
            let err = verifier()
                .verify(&parts(forged.as_bytes(), b"1531420618"), BODY)
                .unwrap_err();
            assert_eq!(err.kind(), VerifyErrorKind::NoMatch, "{forged}");
        }
        let parts = parts(SIGNATURE.as_bytes(), b"1531420618");
        let tampered = &BODY[..BODY.len() - 1];
        assert_eq!(
            kind(verifier().verify(&parts, tampered)),
            VerifyErrorKind::NoMatch
        );
    }

    #[test]
    fn malformed_and_missing_headers() {
        let hex = &SIGNATURE[3..];
        for garbage in [
            hex.to_owned(),
            format!("v1={hex}"),
            String::new(),
            "garbage".to_owned(),
        ] {
            let err = verifier()
                .verify(&parts(garbage.as_bytes(), b"1531420618"), BODY)
                .unwrap_err();
            assert_eq!(err.kind(), VerifyErrorKind::MalformedHeader, "{garbage:?}");
            assert!(!err.to_string().contains(&hex[..16]), "{err}");
        }
        for ts in [&b"+1531420618"[..], b"1531420618.0", b"", b"soon"] {
            let err = verifier()
                .verify(&parts(SIGNATURE.as_bytes(), ts), BODY)
                .unwrap_err();
            assert_eq!(err.kind(), VerifyErrorKind::MalformedHeader);
            assert!(
                err.to_string().contains("x-slack-request-timestamp"),
                "{err}"
            );
        }
        let only_signature = request(&[("x-slack-signature", SIGNATURE.as_bytes())]);
        let err = verifier().verify(&only_signature, BODY).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the x-slack-request-timestamp header is missing"
        );
        let only_timestamp = request(&[("x-slack-request-timestamp", b"1531420618")]);
        let err = verifier().verify(&only_timestamp, BODY).unwrap_err();
        assert_eq!(err.to_string(), "the x-slack-signature header is missing");
        let twice = request(&[
            ("x-slack-signature", SIGNATURE.as_bytes()),
            ("x-slack-request-timestamp", b"1531420618"),
            ("x-slack-request-timestamp", b"1531420618"),
        ]);
        let err = verifier().verify(&twice, BODY).unwrap_err();
        assert!(err.to_string().contains("appears more than once"), "{err}");
        let non_ascii = parts("v0=ä".as_bytes(), b"1531420618");
        assert_eq!(
            kind(verifier().verify(&non_ascii, BODY)),
            VerifyErrorKind::MalformedHeader
        );
    }

    #[test]
    fn the_timestamp_must_be_recent() {
        let parts = parts(SIGNATURE.as_bytes(), b"1531420618");
        let at_time = |now: u64| SlackSignature::new([SECRET]).unwrap().clock(at(now));
        assert_eq!(
            kind(at_time(TS + 600).verify(&parts, BODY)),
            VerifyErrorKind::OutsideTolerance
        );
        assert_eq!(
            kind(at_time(TS - 600).verify(&parts, BODY)),
            VerifyErrorKind::OutsideTolerance
        );
        assert!(at_time(TS + 120).verify(&parts, BODY).is_ok());
        assert!(at_time(TS - 120).verify(&parts, BODY).is_ok());
        let strict = at_time(TS + 120).tolerance(std::time::Duration::from_secs(60));
        assert_eq!(
            kind(strict.verify(&parts, BODY)),
            VerifyErrorKind::OutsideTolerance
        );
    }

    #[test]
    fn configuration_and_debug() {
        assert!(SlackSignature::new(Vec::<&str>::new()).is_err());
        assert!(SlackSignature::new([SECRET, ""]).is_err());
        let debug = format!("{:?}", verifier());
        assert!(debug.contains("secrets: 1"), "{debug}");
        assert!(debug.contains("custom"), "{debug}");
        assert!(!debug.contains(SECRET), "{debug}");
    }
}
