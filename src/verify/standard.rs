use std::fmt;

use http::HeaderName;
use http::request::Parts;

use ed25519_dalek::Signature;

use super::ed25519::{PublicKeys, decode_signature};
use super::freshness::Freshness;
use super::hmac::{Candidate, Keys, decode_base64};
use super::{VerifyError, VerifyRequest, header, secret};
use crate::ConfigError;

/// [Standard Webhooks](https://www.standardwebhooks.com) signatures (Svix, the services built
/// on it, and the senders that follow the specification).
///
/// # Headers: two families
/// The same three headers come under two names:
/// - `svix-id`, `svix-timestamp`, `svix-signature`: what Svix sends by default, and so the
///   services built on it, such as Clerk and Resend;
/// - `webhook-id`, `webhook-timestamp`, `webhook-signature`: what the specification names,
///   sent by senders implementing it directly and by Svix in its white-label setting.
///
/// A request is verified by one family: `svix-*` as soon as one of its three headers is there
/// (Svix's own libraries try it first), else `webhook-*`; errors name the header of that
/// family. A `webhook-id` or `webhook-timestamp` sent beside a verified `svix-*` family must
/// hold the same value as its `svix-*` counterpart, so an id read from either name is the
/// signed one. The key of [`IdempotencyLayer::standard_webhooks`] is the id of the family used.
///
/// # Signatures: `v1` and `v1a`
/// The sender signs `{id}.{timestamp}.{body}` and sends space-separated `<version>,<base64>`
/// entries (several during a rotation on its side); any entry that matches passes, entries of
/// other versions are skipped:
/// - `v1,<base64 of 32 bytes>`: HMAC-SHA256, checked against every `whsec_<base64>` secret
///   (or the bare base64: the decoded bytes are the key);
/// - `v1a,<base64 of 64 bytes>`: Ed25519, what an endpoint with an asymmetric key is sent,
///   checked against every `whpk_<base64>` public key (32 bytes). Strict verification: a
///   non-canonical signature is refused.
///
/// One verifier may hold secrets and public keys together (a rotation from one to the other).
/// A `whsk_` private key is refused at construction: it is the sender's signing key, and a
/// receiver needs the `whpk_` public key. The timestamp (unix seconds) must be within the
/// [tolerance](Self::tolerance) of now. `Debug` shows how many secrets and keys there are,
/// never the keys.
///
/// A request is refused with:
/// - [`MissingHeader`](super::VerifyErrorKind::MissingHeader) without the id, the timestamp or
///   the signature header of its family;
/// - [`MalformedHeader`](super::VerifyErrorKind::MalformedHeader) when one of them is repeated
///   or not visible ASCII, the timestamp is not a plain decimal number, the signature header
///   holds no entry or an entry without a version prefix, or a `webhook-id` or
///   `webhook-timestamp` differs from the signed `svix-*` value;
/// - [`OutsideTolerance`](super::VerifyErrorKind::OutsideTolerance) for a timestamp too old or
///   too far ahead;
/// - [`NoMatch`](super::VerifyErrorKind::NoMatch) when no `v1` entry decodes to 32 bytes that
///   match a secret and no `v1a` entry decodes to 64 bytes that verify under a public key (an
///   empty or truncated entry never matches; nor does a `v1a` entry without a public key
///   configured, or a `v1` entry without a secret).
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
///     .header("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
///     .header("webhook-timestamp", "1614265330")
///     .header("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
///     .body(())?
///     .into_parts();
/// assert!(verifier.verify(&parts, br#"{"test": 2432232314}"#).is_ok());
/// assert!(verifier.verify(&parts, br#"{"test": 2432232315}"#).is_err());
///
/// // The same delivery as Svix sends it by default.
/// let (parts, ()) = Request::post("/webhooks")
///     .header("svix-id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
///     .header("svix-timestamp", "1614265330")
///     .header("svix-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
///     .body(())?
///     .into_parts();
/// assert!(verifier.verify(&parts, br#"{"test": 2432232314}"#).is_ok());
///
/// // A secret and an Ed25519 public key, during a rotation; never the private key.
/// let rotating = StandardWebhooks::new([
///     "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
///     "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=",
/// ])?;
/// assert!(StandardWebhooks::new(["whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A="]).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// [`IdempotencyLayer::standard_webhooks`]: crate::IdempotencyLayer::standard_webhooks
#[derive(Clone)]
pub struct StandardWebhooks {
    keys: Keys,
    public_keys: PublicKeys,
    freshness: Freshness,
}

/// The three headers of one family: `svix-*` or `webhook-*`.
struct Family {
    id: HeaderName,
    timestamp: HeaderName,
    signature: HeaderName,
}

static SVIX: Family = Family {
    id: HeaderName::from_static(StandardWebhooks::SVIX_ID_HEADER),
    timestamp: HeaderName::from_static(StandardWebhooks::SVIX_TIMESTAMP_HEADER),
    signature: HeaderName::from_static(StandardWebhooks::SVIX_SIGNATURE_HEADER),
};

static WEBHOOK: Family = Family {
    id: HeaderName::from_static(StandardWebhooks::ID_HEADER),
    timestamp: HeaderName::from_static(StandardWebhooks::TIMESTAMP_HEADER),
    signature: HeaderName::from_static(StandardWebhooks::SIGNATURE_HEADER),
};

impl Family {
    /// The family a request is verified by: `svix-*` as soon as one of its headers is there
    /// (what Svix's own libraries try first), else `webhook-*`. One family per request, so a
    /// missing header is named in the family the sender used.
    fn of(parts: &Parts) -> &'static Family {
        let headers = &parts.headers;
        if [&SVIX.id, &SVIX.timestamp, &SVIX.signature]
            .into_iter()
            .any(|name| headers.contains_key(name))
        {
            &SVIX
        } else {
            &WEBHOOK
        }
    }
}

impl StandardWebhooks {
    /// The header holding the message id, stable across retries: the idempotency key of a
    /// Standard Webhooks route (or `svix-id` when the sender
    /// uses that family).
    pub(crate) const ID_HEADER: &'static str = "webhook-id";
    /// The header holding the signed unix timestamp, in seconds.
    pub(crate) const TIMESTAMP_HEADER: &'static str = "webhook-timestamp";
    /// The header holding the signatures.
    pub(crate) const SIGNATURE_HEADER: &'static str = "webhook-signature";
    /// `webhook-id` as Svix sends it by default.
    pub(crate) const SVIX_ID_HEADER: &'static str = "svix-id";
    /// `webhook-timestamp` as Svix sends it by default.
    pub(crate) const SVIX_TIMESTAMP_HEADER: &'static str = "svix-timestamp";
    /// `webhook-signature` as Svix sends it by default.
    pub(crate) const SVIX_SIGNATURE_HEADER: &'static str = "svix-signature";

    /// A verifier accepting any of `secrets`, in any mix: HMAC secrets (`whsec_<base64>`, or
    /// the bare base64) for `v1` signatures and Ed25519 public keys (`whpk_<base64>`) for
    /// `v1a` signatures. An error when there is none, or one is empty, padded with whitespace
    /// or not base64, a `whpk_` key is not a 32-byte Ed25519 public key, or one is a `whsk_`
    /// private key (a receiver needs the public key).
    pub fn new<I, S>(secrets: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let (keys, public_keys) = secret::standard_webhooks(secrets)?;
        Ok(StandardWebhooks {
            keys,
            public_keys,
            freshness: Freshness::default(),
        })
    }
}

timestamp_builders!(StandardWebhooks);

impl VerifyRequest for StandardWebhooks {
    fn verify(&self, parts: &Parts, body: &[u8]) -> Result<(), VerifyError> {
        let family = Family::of(parts);
        let id = header::single(parts, &family.id)?;
        let timestamp = header::single(parts, &family.timestamp)?;
        let signature = header::single(parts, &family.signature)?;
        if family.id == SVIX.id {
            same_as_signed(parts, &WEBHOOK.id, id, &SVIX.id)?;
            same_as_signed(parts, &WEBHOOK.timestamp, timestamp, &SVIX.timestamp)?;
        }
        let signed_at = header::unix_seconds(family.timestamp.as_str(), timestamp)?;
        let entries = Entries::parse(family.signature.as_str(), signature)?;
        self.freshness.check(signed_at)?;
        // The timestamp as sent, not re-formatted: those are the bytes the sender signed.
        let message = [id.as_bytes(), b".", timestamp.as_bytes(), b".", body];
        if self.keys.verify(&message, entries.v1())
            || self.public_keys.verify(&message, entries.v1a())
        {
            Ok(())
        } else {
            Err(VerifyError::no_match())
        }
    }

    /// The id and the timestamp of either family (`svix-id`, `svix-timestamp`, `webhook-id`,
    /// `webhook-timestamp`): the request is verified by one family, and a header of the other
    /// one is refused unless it holds the same value (so a key read from either is signed).
    fn covers_header(&self, name: &HeaderName) -> bool {
        [&SVIX.id, &SVIX.timestamp, &WEBHOOK.id, &WEBHOOK.timestamp].contains(&name)
    }

    /// The id and the timestamp of the family the request was verified by.
    fn signed_context<'a>(&self, parts: &'a Parts) -> Vec<&'a [u8]> {
        let family = Family::of(parts);
        header::signed_values(parts, &[&family.id, &family.timestamp])
    }
}

/// When a request verified by its `svix-*` headers also carries `webhook-*` ones, each of
/// those must hold the signed value: a key extractor may read either name
/// ([`covers_header`](VerifyRequest::covers_header) says both are signed), and an unsigned
/// `webhook-id` beside a signed `svix-id` would let a captured request be sent again under a
/// new key.
fn same_as_signed(
    parts: &Parts,
    other: &HeaderName,
    signed: &str,
    signed_name: &HeaderName,
) -> Result<(), VerifyError> {
    if !parts.headers.contains_key(other) {
        return Ok(());
    }
    if header::single(parts, other)? == signed {
        Ok(())
    } else {
        Err(VerifyError::malformed_header(
            other.as_str(),
            &format!("it differs from the signed {signed_name} header"),
        ))
    }
}

/// The entries of a signature header, after checking its syntax: space-separated
/// `<version>,<signature>` entries, at least one. `v1` entries are HMAC-SHA256 tags, `v1a`
/// entries Ed25519 signatures; entries of other versions (`v2`) are skipped, and an entry that
/// does not decode to the length of its version is dropped (it cannot match).
#[derive(Clone, Copy)]
struct Entries<'a>(&'a str);

impl<'a> Entries<'a> {
    fn parse(name: &str, value: &'a str) -> Result<Self, VerifyError> {
        let entries = Entries(value);
        if entries.all().next().is_none() {
            return Err(VerifyError::malformed_header(name, "it holds no signature"));
        }
        if entries.all().any(|entry| !entry.contains(',')) {
            return Err(VerifyError::malformed_header(
                name,
                "an entry has no version prefix such as `v1,`",
            ));
        }
        Ok(entries)
    }

    fn all(self) -> impl Iterator<Item = &'a str> + Clone {
        self.0.split(' ').filter(|entry| !entry.is_empty())
    }

    /// The signatures of `version`, still encoded.
    fn of(self, version: &'static str) -> impl Iterator<Item = &'a [u8]> + Clone {
        self.all()
            .filter_map(|entry| entry.split_once(','))
            .filter(move |(v, _)| *v == version)
            .map(|(_, signature)| signature.as_bytes())
    }

    fn v1(self) -> impl Iterator<Item = Candidate> + Clone + 'a {
        self.of("v1").filter_map(decode_base64)
    }

    fn v1a(self) -> impl Iterator<Item = Signature> + Clone + 'a {
        self.of("v1a").filter_map(decode_signature)
    }
}

impl fmt::Debug for StandardWebhooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StandardWebhooks")
            .field("secrets", &self.keys.len())
            .field("public_keys", &self.public_keys.len())
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
    use crate::verify::testing::{at, kind, request};

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
            StandardWebhooks::new([SECRET, NEXT_SECRET, &public_key(1)]).unwrap()
        );
        assert!(debug.contains("secrets: 2"), "{debug}");
        assert!(debug.contains("public_keys: 1"), "{debug}");
        assert!(!debug.contains("MfKQ"), "{debug}");
        assert!(!debug.contains(&public_key(1)[5..15]), "{debug}");
    }

    /// The three headers of the `svix-*` family.
    fn svix_parts(id: &str, ts: &str, signature: &str) -> Parts {
        request(&[
            ("svix-id", id.as_bytes()),
            ("svix-timestamp", ts.as_bytes()),
            ("svix-signature", signature.as_bytes()),
        ])
    }

    #[test]
    fn svix_headers_are_the_same_scheme() {
        let verifier = verifier();
        let ts = TS.to_string();
        assert!(
            verifier
                .verify(&svix_parts(MSG_ID, &ts, SIGNATURE), BODY)
                .is_ok()
        );
        let tampered = &br#"{"test": 2432232315}"#[..];
        let err = verifier
            .verify(&svix_parts(MSG_ID, &ts, SIGNATURE), tampered)
            .unwrap_err();
        assert_eq!(err.kind(), VerifyErrorKind::NoMatch);
        let err = verifier
            .verify(&svix_parts("msg_other", &ts, SIGNATURE), BODY)
            .unwrap_err();
        assert_eq!(err.kind(), VerifyErrorKind::NoMatch);
        // The same checks as for `webhook-*`, named after the header in use.
        let err = verifier
            .verify(&svix_parts(MSG_ID, "+1614265330", SIGNATURE), BODY)
            .unwrap_err();
        assert!(
            err.to_string().starts_with("the svix-timestamp header"),
            "{err}"
        );
        let err = verifier
            .verify(&svix_parts(MSG_ID, &ts, "garbage"), BODY)
            .unwrap_err();
        assert!(
            err.to_string().starts_with("the svix-signature header"),
            "{err}"
        );
        let err = verifier
            .verify(
                &svix_parts(MSG_ID, &(TS + 600).to_string(), SIGNATURE),
                BODY,
            )
            .unwrap_err();
        assert_eq!(err.kind(), VerifyErrorKind::OutsideTolerance);
    }

    #[test]
    fn one_svix_header_chooses_the_svix_family() {
        let ts = TS.to_string();
        let webhook = [
            ("webhook-id", MSG_ID.as_bytes()),
            ("webhook-timestamp", ts.as_bytes()),
            ("webhook-signature", SIGNATURE.as_bytes()),
        ];
        let svix = [
            ("svix-id", MSG_ID.as_bytes()),
            ("svix-timestamp", ts.as_bytes()),
            ("svix-signature", SIGNATURE.as_bytes()),
        ];
        // Any one svix header beside a complete webhook family: the other two are missing.
        for present in 0..svix.len() {
            let mut headers = webhook.to_vec();
            headers.push(svix[present]);
            let err = verifier().verify(&request(&headers), BODY).unwrap_err();
            assert_eq!(err.kind(), VerifyErrorKind::MissingHeader);
            // The first one missing, in the order id, timestamp, signature.
            let expected = svix
                .iter()
                .map(|(name, _)| *name)
                .find(|name| *name != svix[present].0)
                .unwrap();
            assert_eq!(err.to_string(), format!("the {expected} header is missing"));
        }
        // A repeated svix header is malformed, as a webhook one is.
        let mut repeated = svix.to_vec();
        repeated.push(svix[0]);
        let err = verifier().verify(&request(&repeated), BODY).unwrap_err();
        assert!(
            err.to_string().contains("svix-id header is malformed"),
            "{err}"
        );
    }

    #[test]
    fn both_families_must_agree() {
        let ts = TS.to_string();
        let both = |webhook_id: &str, webhook_ts: &str| {
            request(&[
                ("svix-id", MSG_ID.as_bytes()),
                ("svix-timestamp", ts.as_bytes()),
                ("svix-signature", SIGNATURE.as_bytes()),
                ("webhook-id", webhook_id.as_bytes()),
                ("webhook-timestamp", webhook_ts.as_bytes()),
                ("webhook-signature", b"v1,whatever"),
            ])
        };
        // The same values in both: verified by svix-*, and either id is the signed one.
        assert!(verifier().verify(&both(MSG_ID, &ts), BODY).is_ok());
        // An unsigned webhook-id beside a signed svix-id could be a key nobody signed.
        let err = verifier().verify(&both("msg_new", &ts), BODY).unwrap_err();
        assert_eq!(err.kind(), VerifyErrorKind::MalformedHeader);
        assert_eq!(
            err.to_string(),
            "the webhook-id header is malformed: it differs from the signed svix-id header"
        );
        let err = verifier()
            .verify(&both(MSG_ID, "1614265331"), BODY)
            .unwrap_err();
        assert!(
            err.to_string().contains("webhook-timestamp header"),
            "{err}"
        );
    }

    #[test]
    fn the_signed_context_is_the_family_in_use() {
        let verifier = verifier();
        for name in [
            "svix-id",
            "svix-timestamp",
            "webhook-id",
            "webhook-timestamp",
        ] {
            assert!(
                verifier.covers_header(&HeaderName::from_static(name)),
                "{name}"
            );
        }
        for name in ["svix-signature", "webhook-signature", "x-delivery"] {
            assert!(
                !verifier.covers_header(&HeaderName::from_static(name)),
                "{name}"
            );
        }
        let svix = svix_parts("msg_svix", "1614265330", SIGNATURE);
        let signed: [&[u8]; 2] = [b"msg_svix", b"1614265330"];
        assert_eq!(verifier.signed_context(&svix), signed);
        let webhook = parts("msg_webhook", "1614265331", SIGNATURE);
        let signed: [&[u8]; 2] = [b"msg_webhook", b"1614265331"];
        assert_eq!(verifier.signed_context(&webhook), signed);
    }

    fn signing_key(seed: u8) -> ed25519_dalek::SigningKey {
        ed25519_dalek::SigningKey::from_bytes(&[seed; 32])
    }

    /// The `whpk_` public key of the key made of `seed`.
    fn public_key(seed: u8) -> String {
        format!(
            "whpk_{}",
            STANDARD.encode(signing_key(seed).verifying_key().to_bytes())
        )
    }

    /// `v1a,<base64>` of the test message, signed with the key made of `seed`.
    fn signed_v1a(seed: u8, id: &str, body: &[u8]) -> String {
        use ed25519_dalek::Signer;
        let message = [id.as_bytes(), b".", TS.to_string().as_bytes(), b".", body].concat();
        let signature = signing_key(seed).sign(&message);
        format!("v1a,{}", STANDARD.encode(signature.to_bytes()))
    }

    #[test]
    fn v1a_signatures_verify_with_public_keys() {
        let verifier = StandardWebhooks::new([public_key(1)])
            .unwrap()
            .clock(at(TS));
        let check = |signature: &str, body: &[u8]| {
            verifier.verify(&parts(MSG_ID, &TS.to_string(), signature), body)
        };
        let good = signed_v1a(1, MSG_ID, BODY);
        assert!(check(&good, BODY).is_ok());
        assert!(check(&format!("v1,{} {good}", &SIGNATURE[3..]), BODY).is_ok());
        // Svix's header names, the same signature.
        assert!(
            verifier
                .verify(&svix_parts(MSG_ID, &TS.to_string(), &good), BODY)
                .is_ok()
        );
        let mut bytes = STANDARD.decode(&good[4..]).unwrap();
        let too_short = format!("v1a,{}", STANDARD.encode(&bytes[..63]));
        bytes.push(0);
        let too_long = format!("v1a,{}", STANDARD.encode(&bytes));
        for forged in [
            signed_v1a(1, MSG_ID, b"{}"),
            signed_v1a(1, "msg_other", BODY),
            signed_v1a(2, MSG_ID, BODY),
            too_short,
            too_long,
            "v1a,".to_owned(),
            "v1a,!!!!".to_owned(),
            // An HMAC secret's tag is no use without that secret.
            SIGNATURE.to_owned(),
            // The right Ed25519 signature under another version is not a `v1a` one.
            format!("v1,{}", &good[4..]),
            format!("v2,{}", &good[4..]),
        ] {
            let err = check(&forged, BODY).unwrap_err();
            assert_eq!(err.kind(), VerifyErrorKind::NoMatch, "{forged}");
        }
        assert_eq!(kind(check(&good, b"{}")), VerifyErrorKind::NoMatch);
    }

    #[test]
    fn v1a_needs_a_public_key() {
        // Only HMAC secrets: a `v1a` entry cannot match.
        assert_eq!(
            kind(check(&signed_v1a(1, MSG_ID, BODY))),
            VerifyErrorKind::NoMatch
        );
    }

    #[test]
    fn secrets_and_public_keys_rotate_together() {
        let verifier = StandardWebhooks::new([public_key(1), SECRET.to_owned(), public_key(2)])
            .unwrap()
            .clock(at(TS));
        let ts = TS.to_string();
        for signature in [
            signed_v1a(1, MSG_ID, BODY),
            signed_v1a(2, MSG_ID, BODY),
            SIGNATURE.to_owned(),
            format!("{} {}", signed_v1a(3, MSG_ID, BODY), SIGNATURE),
        ] {
            let parts = parts(MSG_ID, &ts, &signature);
            assert!(verifier.verify(&parts, BODY).is_ok(), "{signature}");
        }
        let parts = parts(MSG_ID, &ts, &signed_v1a(3, MSG_ID, BODY));
        assert_eq!(
            kind(verifier.verify(&parts, BODY)),
            VerifyErrorKind::NoMatch
        );
    }

    #[test]
    fn public_key_configuration_errors() {
        assert!(StandardWebhooks::new(["whpk_dGVzdA=="]).is_err());
        assert!(StandardWebhooks::new([SECRET, "whpk_%%%"]).is_err());
        let err = StandardWebhooks::new(["whsk_dGVzdA=="]).unwrap_err();
        assert!(err.to_string().contains("`whpk_` public key"), "{err}");
    }
}
