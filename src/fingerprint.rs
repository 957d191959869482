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

use sha2::{Digest, Sha256};

/// A 64-bit hash of a request payload (the first 8 bytes of its SHA-256).
///
/// 64 bits are plenty to tell two payloads sent with one key apart (an accidental collision
/// has odds of 2⁻⁶⁴), and keep an ack-mode record at 9 bytes, so that a completed key costs
/// under 100 bytes of Redis memory.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; Fingerprint::LEN]);

impl Fingerprint {
    /// The fingerprint used when fingerprinting is off: matches every other `NONE`.
    pub const NONE: Fingerprint = Fingerprint([0; Fingerprint::LEN]);

    /// The length of a fingerprint in bytes.
    pub const LEN: usize = 8;

    /// The fingerprint of raw bytes (the default: the exact request body).
    pub fn of_bytes(bytes: &[u8]) -> Self {
        let digest = Sha256::digest(bytes);
        let mut out = [0u8; Fingerprint::LEN];
        out.copy_from_slice(&digest[..Fingerprint::LEN]);
        Fingerprint(out)
    }

    /// A fingerprint from its raw bytes (for store implementations decoding their encoding).
    pub fn from_bytes(bytes: [u8; Fingerprint::LEN]) -> Self {
        Fingerprint(bytes)
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; Fingerprint::LEN] {
        &self.0
    }

    /// Whether a request with fingerprint `other` may be treated as the same request.
    ///
    /// [`Fingerprint::NONE`] on either side matches anything: a layer with fingerprinting off
    /// never reports a mismatch.
    pub fn matches(&self, other: &Fingerprint) -> bool {
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
}
