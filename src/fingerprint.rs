//! The payload fingerprint: a hash of the request body, stored with the claim and the record to
//! detect a key reused with a different payload (answered 422 by default).
//!
//! ```
//! use tower_idempotency::fingerprint::Fingerprint;
//!
//! let a = Fingerprint::of_bytes(br#"{"id":"evt_1"}"#);
//! assert_eq!(a, Fingerprint::of_bytes(br#"{"id":"evt_1"}"#));
//! assert_ne!(a, Fingerprint::of_bytes(br#"{"id":"evt_2"}"#));
//! ```

use std::fmt;

/// A 64-bit hash of a request payload: its XXH3-64 (seed 0), big-endian.
///
/// 64 bits are plenty to tell two payloads sent with one key apart (an accidental collision
/// has odds of 2⁻⁶⁴), and keep an ack-mode record at 9 bytes, so that a completed key costs
/// under 100 bytes of Redis memory.
///
/// XXH3 is a fast, specified and stable hash, not a cryptographic one: it reads a 1 KiB body
/// in about 50 ns where SHA-256 takes about 600 ns (it was the costliest step of a first
/// delivery), and that is all this check needs. The fingerprint guards against *accidents*
/// (a sender reusing a key for another payload); it is compared only with the fingerprint
/// stored under the same key, so a forged collision would only let its sender be acknowledged,
/// or be replayed a response, for a key it already knows the original payload of. The store
/// key, which does separate senders, is a BLAKE3 (a cryptographic hash).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; Fingerprint::LEN]);

impl Fingerprint {
    /// The fingerprint used when fingerprinting is off: matches every other `NONE`.
    pub const NONE: Fingerprint = Fingerprint([0; Fingerprint::LEN]);

    /// The length of a fingerprint in bytes.
    pub(crate) const LEN: usize = 8;

    /// The fingerprint of raw bytes (the default: the exact request body).
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Fingerprint(xxhash_rust::xxh3::xxh3_64(bytes).to_be_bytes())
    }

    /// A fingerprint from its raw bytes (for store implementations decoding their encoding).
    pub fn from_bytes(bytes: [u8; 8]) -> Self {
        Fingerprint(bytes)
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; 8] {
        &self.0
    }

    /// Whether a request with fingerprint `other` may be treated as the same request.
    ///
    /// [`Fingerprint::NONE`] on either side matches anything: a layer with fingerprinting off
    /// never reports a mismatch.
    pub(crate) fn matches(&self, other: &Fingerprint) -> bool {
        *self == Fingerprint::NONE || *other == Fingerprint::NONE || self == other
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", crate::util::hex(&self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_matches_everything() {
        let a = Fingerprint::of_bytes(b"a");
        assert!(Fingerprint::NONE.matches(&a));
        assert!(a.matches(&Fingerprint::NONE));
        assert!(!a.matches(&Fingerprint::of_bytes(b"b")));
    }

    #[test]
    fn is_the_specified_xxh3_64() {
        // Stored fingerprints must stay comparable across versions: pin the algorithm to the
        // reference values of XXH3-64 with seed 0.
        assert_eq!(
            Fingerprint::of_bytes(b"").as_bytes(),
            &0x2D06800538D394C2u64.to_be_bytes()
        );
        assert_eq!(
            Fingerprint::of_bytes(b"a").as_bytes(),
            &0xE6C632B61E964E1Fu64.to_be_bytes()
        );
    }
}
