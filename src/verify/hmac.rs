//! HMAC-SHA256 under several keys, the decoding of a candidate signature, and its comparison in
//! constant time: the one place where a signature is checked, for every built-in scheme.

use std::fmt;
use std::sync::Arc;

use ::hmac::digest::CtOutput;
use ::hmac::{Hmac, Mac};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The length of an HMAC-SHA256 tag, in bytes: every candidate must decode to exactly this.
pub(crate) const SIGNATURE_LEN: usize = 32;

/// A candidate signature, decoded, of the right length.
pub(crate) type Candidate = [u8; SIGNATURE_LEN];

/// The keys a scheme accepts (several during a rotation), each already keyed: the inner and
/// outer pads are hashed once at start-up rather than once per request.
#[derive(Clone)]
pub(crate) struct Keys(Arc<[HmacSha256]>);

impl Keys {
    /// Keys from secret bytes; `Err(i)` when HMAC refuses the `i`-th (from 0). It takes keys of
    /// any length, so this does not happen, but it is an error to report rather than a panic.
    pub(crate) fn new<'a>(secrets: impl IntoIterator<Item = &'a [u8]>) -> Result<Self, usize> {
        let keys = secrets
            .into_iter()
            .enumerate()
            .map(|(i, secret)| HmacSha256::new_from_slice(secret).map_err(|_| i))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Keys(keys.into()))
    }

    /// How many keys there are (what `Debug` shows instead of the keys).
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether one of `candidates` is the HMAC of the concatenation of `message` under one of
    /// the keys. `message` is given in pieces (`id`, `.`, `timestamp`, `.`, `body`) so the
    /// body is never copied to build the signed string.
    ///
    /// The tag is computed once per key, then compared with each candidate in constant time.
    /// Stopping at the first match leaks only that a signature was valid, which its sender
    /// knows.
    pub(crate) fn verify<I>(&self, message: &[&[u8]], candidates: I) -> bool
    where
        I: Iterator<Item = Candidate> + Clone,
    {
        self.0.iter().any(|key| {
            let mut mac = key.clone();
            for piece in message {
                mac.update(piece);
            }
            let tag = mac.finalize();
            candidates
                .clone()
                .any(|candidate| tag_matches(&tag, &candidate))
        })
    }
}

impl fmt::Debug for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The count only: a keyed HMAC state is as secret as the key.
        write!(f, "{} secret(s)", self.len())
    }
}

/// Constant-time comparison of a computed tag with a candidate, after checking its length
/// (a short candidate compared as a prefix would accept an empty or truncated signature: the
/// Standard Webhooks libraries' bug until 2024).
fn tag_matches(tag: &CtOutput<HmacSha256>, candidate: &[u8]) -> bool {
    if candidate.len() != SIGNATURE_LEN {
        return false;
    }
    let mut bytes = ::hmac::digest::Output::<HmacSha256>::default();
    bytes.copy_from_slice(candidate);
    // `CtOutput`'s equality is `subtle::ConstantTimeEq`, the comparison `Mac::verify_slice`
    // uses; computing the tag once lets it be compared with several candidates.
    *tag == CtOutput::new(bytes)
}

/// Exactly 64 hexadecimal digits (either case) as 32 bytes; `None` for any other input.
pub(crate) fn decode_hex(text: &[u8]) -> Option<Candidate> {
    if text.len() != 2 * SIGNATURE_LEN {
        return None;
    }
    let mut out = [0u8; SIGNATURE_LEN];
    for (byte, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
        *byte = (hex_digit(pair[0])? << 4) | hex_digit(pair[1])?;
    }
    Some(out)
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Standard base64 (with its padding) of exactly 32 bytes; `None` for any other input.
pub(crate) fn decode_base64(text: &[u8]) -> Option<Candidate> {
    // 32 bytes are 44 characters; anything much longer is not worth decoding. The buffer holds
    // what 64 characters can decode to, so an over-long signature is an error, never a panic.
    if text.len() > 64 {
        return None;
    }
    let mut buf = [0u8; 48];
    let len = STANDARD.decode_slice(text, &mut buf).ok()?;
    buf.get(..len)?.try_into().ok()
}

/// HMAC-SHA256 of `message` under `secret`, for tests that sign requests.
#[cfg(test)]
pub(crate) fn sign(secret: &[u8], message: &[&[u8]]) -> Candidate {
    let mut mac = HmacSha256::new_from_slice(secret).unwrap();
    for piece in message {
        mac.update(piece);
    }
    let mut out = [0u8; SIGNATURE_LEN];
    out.copy_from_slice(&mac.finalize().into_bytes());
    out
}

/// Lowercase hex of a signature, for tests.
#[cfg(test)]
pub(crate) fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Standard base64 of a signature, for tests.
#[cfg(test)]
pub(crate) fn to_base64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(secrets: &[&[u8]]) -> Keys {
        Keys::new(secrets.iter().copied()).unwrap()
    }

    #[test]
    fn hex_needs_exactly_64_digits() {
        let tag = sign(b"k", &[b"m"]);
        let hex = to_hex(&tag);
        assert_eq!(decode_hex(hex.as_bytes()), Some(tag));
        assert_eq!(decode_hex(hex.to_uppercase().as_bytes()), Some(tag));
        assert_eq!(decode_hex(&hex.as_bytes()[..62]), None, "truncated");
        assert_eq!(decode_hex(&hex.as_bytes()[..63]), None, "odd length");
        assert_eq!(decode_hex(format!("{hex}00").as_bytes()), None, "too long");
        assert_eq!(decode_hex(b""), None);
        assert_eq!(decode_hex(&[b'g'; 64]), None, "not hex");
        // A multi-byte character where a digit should be: rejected, not sliced through.
        let mut bytes = hex.into_bytes();
        bytes.truncate(62);
        bytes.extend_from_slice("é".as_bytes());
        assert_eq!(decode_hex(&bytes), None);
    }

    #[test]
    fn base64_needs_exactly_32_bytes() {
        let tag = sign(b"k", &[b"m"]);
        let b64 = to_base64(&tag);
        assert_eq!(decode_base64(b64.as_bytes()), Some(tag));
        assert_eq!(decode_base64(b""), None, "empty");
        assert_eq!(decode_base64(&b64.as_bytes()[..40]), None, "truncated");
        assert_eq!(
            decode_base64(to_base64(&tag[..31]).as_bytes()),
            None,
            "31 bytes"
        );
        let long = [tag.as_slice(), &[0]].concat();
        assert_eq!(decode_base64(to_base64(&long).as_bytes()), None, "33 bytes");
        assert_eq!(decode_base64(&[b'A'; 1000]), None, "far too long");
        assert_eq!(decode_base64(b"!!!!"), None, "not base64");
    }

    #[test]
    fn any_key_and_any_candidate_may_match() {
        let keys = keys(&[b"old", b"new"]);
        let message: &[&[u8]] = &[b"id", b".", b"body"];
        let old = sign(b"old", message);
        let new = sign(b"new", message);
        let other = sign(b"other", message);
        assert!(keys.verify(message, [old].into_iter()));
        assert!(keys.verify(message, [other, new].into_iter()));
        assert!(!keys.verify(message, [other].into_iter()));
        assert!(!keys.verify(message, std::iter::empty()));
        // The pieces are concatenated: how the message is split does not matter.
        assert!(keys.verify(&[b"id.body"], [old].into_iter()));
        assert!(!keys.verify(&[b"id.bodz"], [old].into_iter()));
    }

    #[test]
    fn a_short_candidate_never_matches() {
        let tag = sign(b"k", &[b"m"]);
        let computed = {
            let mut mac = HmacSha256::new_from_slice(b"k").unwrap();
            mac.update(b"m");
            mac.finalize()
        };
        assert!(tag_matches(&computed, &tag));
        assert!(!tag_matches(&computed, &[]));
        assert!(!tag_matches(&computed, &tag[..16]));
        assert!(!tag_matches(&computed, &[tag.as_slice(), &[0]].concat()));
    }

    #[test]
    fn debug_shows_the_count_only() {
        let keys = keys(&[b"It's a Secret to Everybody"]);
        let debug = format!("{keys:?}");
        assert_eq!(debug, "1 secret(s)");
    }
}
