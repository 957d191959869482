use std::fmt;

use http::HeaderName;
use http::request::Parts;

use super::freshness::Freshness;
use super::hmac::{Keys, decode_base64};
use super::{InvalidSecret, VerifyError, VerifyRequest, header, secret};

/// [Standard Webhooks](https://www.standardwebhooks.com) signatures (Svix and the senders that
/// follow the specification).
///
/// The sender signs `{webhook-id}.{webhook-timestamp}.{body}` with HMAC-SHA256 and sends
/// `webhook-signature: v1,<base64>`, possibly several space-separated entries (during a
/// rotation on its side); any `v1` entry that matches passes, entries of other versions are
/// skipped. Secrets are `whsec_<base64>` (or the bare base64): the decoded bytes are the key.
/// The timestamp (unix seconds) must be within the [tolerance](Self::tolerance) of now.
///
/// A request is refused with:
/// - [`MissingHeader`](super::VerifyErrorKind::MissingHeader) without `webhook-id`,
///   `webhook-timestamp` or `webhook-signature`;
/// - [`MalformedHeader`](super::VerifyErrorKind::MalformedHeader) when one of them is repeated
///   or not visible ASCII, the timestamp is not a plain decimal number, or the signature
///   header holds no entry or an entry without a version prefix;
/// - [`OutsideTolerance`](super::VerifyErrorKind::OutsideTolerance) for a timestamp too old or
///   too far ahead;
/// - [`NoMatch`](super::VerifyErrorKind::NoMatch) when no `v1` entry decodes to 32 bytes that
///   match a secret (an empty or truncated `v1,` never matches).
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use http::Request;
/// use tower_idempotency::verify::{StandardWebhooks, VerifyRequest};
///
/// // The specification's test vector (its reference libraries' tests).
/// let verifier = StandardWebhooks::new(["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"])?
///     .clock(|| UNIX_EPOCH + Duration::from_secs(1614265330));
/// let (parts, ()) = Request::post("/webhooks")
///     .header(StandardWebhooks::ID_HEADER, "msg_p5jXN8AQM9LWM0D4loKWxJek")
///     .header(StandardWebhooks::TIMESTAMP_HEADER, "1614265330")
///     .header(StandardWebhooks::SIGNATURE_HEADER, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
///     .body(())?
///     .into_parts();
/// assert!(verifier.verify(&parts, br#"{"test": 2432232314}"#).is_ok());
/// assert!(verifier.verify(&parts, br#"{"test": 2432232315}"#).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct StandardWebhooks {
    keys: Keys,
    freshness: Freshness,
}

const ID: HeaderName = HeaderName::from_static(StandardWebhooks::ID_HEADER);
const TIMESTAMP: HeaderName = HeaderName::from_static(StandardWebhooks::TIMESTAMP_HEADER);
const SIGNATURE: HeaderName = HeaderName::from_static(StandardWebhooks::SIGNATURE_HEADER);

impl StandardWebhooks {
    /// The header holding the message id, stable across retries: the idempotency key of a
    /// Standard Webhooks route.
    pub const ID_HEADER: &'static str = "webhook-id";
    /// The header holding the signed unix timestamp, in seconds.
    pub const TIMESTAMP_HEADER: &'static str = "webhook-timestamp";
    /// The header holding the signatures.
    pub const SIGNATURE_HEADER: &'static str = "webhook-signature";

    /// A verifier accepting any of `secrets` (`whsec_<base64>`, or the bare base64). An error
    /// when there is none, or one is empty, padded with whitespace or not base64.
    pub fn new<I, S>(secrets: I) -> Result<Self, InvalidSecret>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(StandardWebhooks {
            keys: secret::standard_webhooks(secrets)?,
            freshness: Freshness::default(),
        })
    }
}

timestamp_builders!(StandardWebhooks);

impl VerifyRequest for StandardWebhooks {
    fn verify(&self, parts: &Parts, body: &[u8]) -> Result<(), VerifyError> {
        let id = header::single(parts, &ID)?;
        let timestamp = header::single(parts, &TIMESTAMP)?;
        let signature = header::single(parts, &SIGNATURE)?;
        let signed_at = header::unix_seconds(Self::TIMESTAMP_HEADER, timestamp)?;
        let candidates = v1_signatures(signature)?;
        self.freshness.check(signed_at)?;
        // The timestamp as sent, not re-formatted: those are the bytes the sender signed.
        let message = [id.as_bytes(), b".", timestamp.as_bytes(), b".", body];
        if self.keys.verify(&message, candidates) {
            Ok(())
        } else {
            Err(VerifyError::no_match())
        }
    }

    /// `webhook-id` and `webhook-timestamp` are signed.
    fn covers_header(&self, name: &HeaderName) -> bool {
        name == ID || name == TIMESTAMP
    }

    fn signed_context<'a>(&self, parts: &'a Parts) -> Vec<&'a [u8]> {
        header::signed_values(parts, &[&ID, &TIMESTAMP])
    }
}

/// The decoded `v1` signatures of the header, after checking its syntax: space-separated
/// `<version>,<signature>` entries, at least one. Entries of other versions (`v1a`, `v2`) are
/// skipped; a `v1` entry that is not base64 of 32 bytes is dropped (it cannot match).
fn v1_signatures(
    value: &str,
) -> Result<impl Iterator<Item = super::hmac::Candidate> + Clone + '_, VerifyError> {
    let entries = value.split(' ').filter(|entry| !entry.is_empty());
    if entries.clone().next().is_none() {
        return Err(VerifyError::malformed_header(
            StandardWebhooks::SIGNATURE_HEADER,
            "it holds no signature",
        ));
    }
    if entries.clone().any(|entry| !entry.contains(',')) {
        return Err(VerifyError::malformed_header(
            StandardWebhooks::SIGNATURE_HEADER,
            "an entry has no version prefix such as `v1,`",
        ));
    }
    Ok(entries
        .filter_map(|entry| entry.split_once(','))
        .filter(|(version, _)| *version == "v1")
        .filter_map(|(_, signature)| decode_base64(signature.as_bytes())))
}

impl fmt::Debug for StandardWebhooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StandardWebhooks")
            .field("secrets", &self.keys.len())
            .field("freshness", &self.freshness)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;

    use super::*;
    use crate::verify::VerifyErrorKind;
    use crate::verify::hmac::{sign, to_base64};
    use crate::verify::testing::{at, request};

    // The Standard Webhooks test vector, from the specification's reference libraries
    // (standard-webhooks/standard-webhooks, libraries/python/tests/test_webhooks.py,
    // `test_sign_function`; the same in the other libraries' tests). Checked independently with
    // Python's hmac and base64 modules.
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const MSG_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TS: u64 = 1_614_265_330;
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    /// Another secret, to sign with in rotation tests (any base64).
    const NEXT_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

    fn verifier() -> StandardWebhooks {
        StandardWebhooks::new([SECRET]).unwrap().clock(at(TS))
    }

    fn parts(id: &str, ts: &str, signature: &str) -> Parts {
        request(&[
            ("webhook-id", id.as_bytes()),
            ("webhook-timestamp", ts.as_bytes()),
            ("webhook-signature", signature.as_bytes()),
        ])
    }

    fn check(signature: &str) -> Result<(), VerifyError> {
        verifier().verify(&parts(MSG_ID, &TS.to_string(), signature), BODY)
    }

    fn kind(result: Result<(), VerifyError>) -> VerifyErrorKind {
        result.unwrap_err().kind()
    }

    /// `v1,<base64>` of the message signed with `secret` at `ts`.
    fn signed(secret: &str, ts: u64, body: &[u8]) -> String {
        let key = STANDARD
            .decode(secret.strip_prefix("whsec_").unwrap_or(secret))
            .unwrap();
        let ts = ts.to_string();
        let tag = sign(&key, &[MSG_ID.as_bytes(), b".", ts.as_bytes(), b".", body]);
        format!("v1,{}", to_base64(&tag))
    }

    #[test]
    fn the_specification_test_vector() {
        assert_eq!(signed(SECRET, TS, BODY), SIGNATURE);
        assert!(check(SIGNATURE).is_ok());
        // The secret without its prefix is the same secret.
        let bare = StandardWebhooks::new(["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"])
            .unwrap()
            .clock(at(TS));
        assert!(
            bare.verify(&parts(MSG_ID, "1614265330", SIGNATURE), BODY)
                .is_ok()
        );
    }

    /// The second vector of the reference Rust library's tests
    /// (standard-webhooks/standard-webhooks, libraries/rust/src/lib.rs, `test_sign`), also
    /// checked with Python.
    #[test]
    fn the_reference_rust_library_vector() {
        let verifier = StandardWebhooks::new([NEXT_SECRET])
            .unwrap()
            .clock(at(1_649_367_553));
        let parts = request(&[
            ("webhook-id", b"msg_27UH4WbU6Z5A5EzD8u03UvzRbpk"),
            ("webhook-timestamp", b"1649367553"),
            (
                "webhook-signature",
                b"v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=",
            ),
        ]);
        let body = br#"{"email":"test@example.com","username":"test_user"}"#;
        assert!(verifier.verify(&parts, body).is_ok());
    }

    #[test]
    fn any_v1_entry_may_match_and_other_versions_are_skipped() {
        let other = signed(NEXT_SECRET, TS, BODY);
        assert!(check(&format!("{other} {SIGNATURE}")).is_ok());
        assert!(check(&format!("v1a,{} {SIGNATURE}", &SIGNATURE[3..])).is_ok());
        assert!(check(&format!("v2,abc  {SIGNATURE} ")).is_ok());
        // The right signature under an unknown version is not a v1 signature.
        assert_eq!(
            kind(check(&format!("v1a,{}", &SIGNATURE[3..]))),
            VerifyErrorKind::NoMatch
        );
        assert_eq!(kind(check(&other)), VerifyErrorKind::NoMatch);
    }

    #[test]
    fn secrets_rotate() {
        let verifier = StandardWebhooks::new([SECRET, NEXT_SECRET])
            .unwrap()
            .clock(at(TS));
        for secret in [SECRET, NEXT_SECRET] {
            let parts = parts(MSG_ID, &TS.to_string(), &signed(secret, TS, BODY));
            assert!(verifier.verify(&parts, BODY).is_ok(), "{secret}");
        }
        let parts = parts(MSG_ID, &TS.to_string(), &signed("dGhpcmQ=", TS, BODY));
        assert_eq!(
            kind(verifier.verify(&parts, BODY)),
            VerifyErrorKind::NoMatch
        );
    }

    #[test]
    fn forgeries() {
        let wrong_secret = signed(NEXT_SECRET, TS, BODY);
        let truncated = &SIGNATURE[..SIGNATURE.len() - 4];
        let mut tag = STANDARD.decode(&SIGNATURE[3..]).unwrap();
        tag.push(0);
        let too_long = format!("v1,{}", to_base64(&tag));
        let too_short = format!("v1,{}", to_base64(&tag[..31]));
        let prefix = format!("v1,{}", to_base64(&tag[..1]));
        for forged in [
            wrong_secret.as_str(),
            "v1,",
            "v1, v1,",
            truncated,
            &too_long,
            &too_short,
            &prefix,
            "v1,!!!!",
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA=",
        ] {
            let err = check(forged).unwrap_err();
            assert_eq!(err.kind(), VerifyErrorKind::NoMatch, "{forged:?}");
            assert_eq!(err.to_string(), "no signature matched");
        }
        for garbage in [
            "",
            "   ",
            "garbage",
            "v1 g0hM9SsE",
            "g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
        ] {
            let err = check(garbage).unwrap_err();
            assert_eq!(err.kind(), VerifyErrorKind::MalformedHeader, "{garbage:?}");
            assert!(!err.to_string().contains("g0hM"), "{err}");
        }
    }

    #[test]
    fn the_exact_body_bytes_are_signed() {
        let verifier = verifier();
        let parts = parts(MSG_ID, "1614265330", SIGNATURE);
        for tampered in [
            &br#"{"test": 2432232315}"#[..],
            br#"{"test":2432232314}"#,
            br#"{"test": 2432232314}
"#,
            b"",
        ] {
            assert_eq!(
                kind(verifier.verify(&parts, tampered)),
                VerifyErrorKind::NoMatch
            );
        }
        // Bytes that are not UTF-8 (or JSON) are signed and verified like any other.
        let body = b"\xff\xfe\x00binary";
        let parts = self::parts(MSG_ID, "1614265330", &signed(SECRET, TS, body));
        assert!(verifier.verify(&parts, body).is_ok());
        // The id and the timestamp are signed too.
        let parts = self::parts("msg_other", "1614265330", SIGNATURE);
        assert_eq!(
            kind(verifier.verify(&parts, BODY)),
            VerifyErrorKind::NoMatch
        );
        let parts = self::parts(MSG_ID, "01614265330", SIGNATURE);
        assert_eq!(
            kind(verifier.verify(&parts, BODY)),
            VerifyErrorKind::NoMatch
        );
    }

    #[test]
    fn every_header_is_needed() {
        let ts = TS.to_string();
        let all = [
            ("webhook-id", MSG_ID.as_bytes()),
            ("webhook-timestamp", ts.as_bytes()),
            ("webhook-signature", SIGNATURE.as_bytes()),
        ];
        for missing in 0..all.len() {
            let headers: Vec<_> = (0..all.len())
                .filter(|i| *i != missing)
                .map(|i| all[i])
                .collect();
            let err = verifier().verify(&request(&headers), BODY).unwrap_err();
            assert_eq!(err.kind(), VerifyErrorKind::MissingHeader);
            assert_eq!(
                err.to_string(),
                format!("the {} header is missing", all[missing].0)
            );
        }
    }

    #[test]
    fn a_repeated_or_non_ascii_header_is_malformed() {
        let ts = TS.to_string();
        let all = [
            ("webhook-id", MSG_ID.as_bytes()),
            ("webhook-timestamp", ts.as_bytes()),
            ("webhook-signature", SIGNATURE.as_bytes()),
        ];
        for i in 0..all.len() {
            let mut repeated = all.to_vec();
            repeated.push(all[i]);
            let err = verifier().verify(&request(&repeated), BODY).unwrap_err();
            assert_eq!(err.kind(), VerifyErrorKind::MalformedHeader);
            assert!(err.to_string().contains("appears more than once"), "{err}");
            assert!(err.to_string().contains(all[i].0), "{err}");

            let mut non_ascii = all.to_vec();
            non_ascii[i].1 = "v1,é".as_bytes();
            let err = verifier().verify(&request(&non_ascii), BODY).unwrap_err();
            assert_eq!(err.kind(), VerifyErrorKind::MalformedHeader);
            assert!(err.to_string().contains("not visible ASCII"), "{err}");
        }
    }

    #[test]
    fn the_timestamp_must_be_recent_and_decimal() {
        let check_at = |now: u64| {
            let verifier = StandardWebhooks::new([SECRET]).unwrap().clock(at(now));
            verifier.verify(&parts(MSG_ID, "1614265330", SIGNATURE), BODY)
        };
        // Ten minutes later, the delivery is old; ten minutes earlier, it is from the future.
        assert_eq!(kind(check_at(TS + 600)), VerifyErrorKind::OutsideTolerance);
        assert_eq!(kind(check_at(TS - 600)), VerifyErrorKind::OutsideTolerance);
        assert!(check_at(TS + 299).is_ok());
        assert!(check_at(TS - 299).is_ok());
        // A longer tolerance lets the old delivery in.
        let lenient = StandardWebhooks::new([SECRET])
            .unwrap()
            .clock(at(TS + 600))
            .tolerance(std::time::Duration::from_secs(900));
        assert!(
            lenient
                .verify(&parts(MSG_ID, "1614265330", SIGNATURE), BODY)
                .is_ok()
        );
        for bad in ["+1614265330", "1614265330.0", "-1614265330", "now", ""] {
            let err = verifier()
                .verify(&parts(MSG_ID, bad, SIGNATURE), BODY)
                .unwrap_err();
            assert_eq!(err.kind(), VerifyErrorKind::MalformedHeader, "{bad:?}");
        }
    }

    #[test]
    fn configuration_errors() {
        assert!(StandardWebhooks::new(Vec::<String>::new()).is_err());
        assert!(StandardWebhooks::new([""]).is_err());
        assert!(StandardWebhooks::new([SECRET, "whsec_%%%"]).is_err());
    }

    #[test]
    fn debug_hides_the_secrets() {
        let debug = format!(
            "{:?}",
            StandardWebhooks::new([SECRET, NEXT_SECRET]).unwrap()
        );
        assert!(debug.contains("secrets: 2"), "{debug}");
        assert!(!debug.contains("MfKQ"), "{debug}");
    }
}
