//! Ed25519 under several public keys (Standard Webhooks `v1a`), and the decoding of a candidate
//! signature: the asymmetric counterpart of [`hmac`](super::hmac).

use std::fmt;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ed25519_dalek::{PUBLIC_KEY_LENGTH, SIGNATURE_LENGTH, Signature, VerifyingKey};

/// The public keys a scheme accepts (several during a rotation); possibly none, when every
/// configured secret is an HMAC secret.
#[derive(Clone, Default)]
pub(crate) struct PublicKeys(Arc<[VerifyingKey]>);

/// Why 32 bytes are not a usable public key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BadKey {
    /// Not the compressed form of a curve point.
    NotAPoint,
    /// A point of small order: any signature would be checked against a key nobody holds the
    /// private half of, and [`VerifyingKey::verify_strict`] refuses every one.
    Weak,
}

impl PublicKeys {
    /// Keys from their 32-byte encodings; `Err((i, why))` for the first one (from 0) that is
    /// not a usable Ed25519 public key.
    pub(crate) fn new<'a>(
        keys: impl IntoIterator<Item = &'a [u8; PUBLIC_KEY_LENGTH]>,
    ) -> Result<Self, (usize, BadKey)> {
        let keys = keys
            .into_iter()
            .enumerate()
            .map(|(i, bytes)| {
                let key = VerifyingKey::from_bytes(bytes).map_err(|_| (i, BadKey::NotAPoint))?;
                if key.is_weak() {
                    return Err((i, BadKey::Weak));
                }
                Ok(key)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PublicKeys(keys.into()))
    }

    /// How many keys there are.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether one of `candidates` is a signature of the concatenation of `message` under one
    /// of the keys. Ed25519 hashes the whole message after the signature's first half, so the
    /// pieces are joined once (only when there is a key and a candidate to check).
    ///
    /// `verify_strict`: a non-canonical signature or a small-order key is refused, so one
    /// signed message has one signature a receiver accepts.
    pub(crate) fn verify<I>(&self, message: &[&[u8]], candidates: I) -> bool
    where
        I: Iterator<Item = Signature> + Clone,
    {
        if self.0.is_empty() || candidates.clone().next().is_none() {
            return false;
        }
        let message = message.concat();
        self.0.iter().any(|key| {
            candidates
                .clone()
                .any(|signature| key.verify_strict(&message, &signature).is_ok())
        })
    }
}

impl fmt::Debug for PublicKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The count only, as for the secrets: which key a receiver trusts is its own business.
        write!(f, "{} public key(s)", self.len())
    }
}

/// Standard base64 (with its padding) of exactly 64 bytes as a signature; `None` for any
/// other input.
pub(crate) fn decode_signature(text: &[u8]) -> Option<Signature> {
    // 64 bytes are 88 characters; the buffer holds what 96 can decode to, so an over-long
    // signature is an error, never a panic.
    if text.len() > 96 {
        return None;
    }
    let mut buf = [0u8; 72];
    let len = STANDARD.decode_slice(text, &mut buf).ok()?;
    let bytes: &[u8; SIGNATURE_LENGTH] = buf.get(..len)?.try_into().ok()?;
    Some(Signature::from_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use ed25519_dalek::{Signer, SigningKey};

    use super::*;

    fn signing_key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    fn keys(seeds: &[u8]) -> PublicKeys {
        let public: Vec<_> = seeds
            .iter()
            .map(|seed| signing_key(*seed).verifying_key().to_bytes())
            .collect();
        PublicKeys::new(&public).unwrap()
    }

    #[test]
    fn any_key_and_any_candidate_may_match() {
        let keys = keys(&[1, 2]);
        let message: &[&[u8]] = &[b"id", b".", b"body"];
        let first = signing_key(1).sign(b"id.body");
        let second = signing_key(2).sign(b"id.body");
        let other = signing_key(3).sign(b"id.body");
        assert!(keys.verify(message, [first].into_iter()));
        assert!(keys.verify(message, [other, second].into_iter()));
        assert!(!keys.verify(message, [other].into_iter()));
        assert!(!keys.verify(message, std::iter::empty()));
        assert!(!keys.verify(&[b"id.bodz"], [first].into_iter()));
        assert!(!PublicKeys::default().verify(message, [first].into_iter()));
    }

    #[test]
    fn signatures_are_base64_of_64_bytes() {
        let signature = signing_key(1).sign(b"m");
        let b64 = STANDARD.encode(signature.to_bytes());
        assert_eq!(decode_signature(b64.as_bytes()), Some(signature));
        assert_eq!(decode_signature(b""), None);
        assert_eq!(decode_signature(&b64.as_bytes()[..84]), None, "truncated");
        let short = STANDARD.encode(&signature.to_bytes()[..63]);
        assert_eq!(decode_signature(short.as_bytes()), None, "63 bytes");
        let long = STANDARD.encode([&signature.to_bytes()[..], &[0]].concat());
        assert_eq!(decode_signature(long.as_bytes()), None, "65 bytes");
        assert_eq!(decode_signature(&[b'A'; 1000]), None, "far too long");
        assert_eq!(decode_signature(b"!!!!"), None, "not base64");
    }

    #[test]
    fn keys_must_be_points_of_large_order() {
        // The identity point (y = 1) is of small order; y = 2 is on no curve point.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        assert_eq!(PublicKeys::new([&identity]).unwrap_err(), (0, BadKey::Weak));
        let mut not_a_point = [0u8; 32];
        not_a_point[0] = 2;
        let good = signing_key(1).verifying_key().to_bytes();
        assert_eq!(
            PublicKeys::new([&good, &not_a_point]).unwrap_err(),
            (1, BadKey::NotAPoint)
        );
        assert_eq!(format!("{:?}", keys(&[1, 2])), "2 public key(s)");
    }
}
