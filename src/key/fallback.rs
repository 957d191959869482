use crate::verify::VerifyRequest;

use super::{ExtractKey, IdempotencyKey, KeyError, KeyInput};

/// Tries `A`, then `B` when `A` finds no key; built by
/// [`ExtractKey::or`](super::ExtractKey::or).
///
/// The key is the value itself, whichever extractor found it: the same event id sent once in a
/// header and once only in the body is the same key.
#[derive(Clone, Debug)]
pub struct Fallback<A, B> {
    first: A,
    second: B,
}

impl<A, B> Fallback<A, B> {
    /// `first`, else `second`.
    pub(crate) fn new(first: A, second: B) -> Self {
        Fallback { first, second }
    }
}

impl<A: ExtractKey, B: ExtractKey> ExtractKey for Fallback<A, B> {
    fn extract_key(&self, input: &KeyInput<'_>) -> Result<Option<IdempotencyKey>, KeyError> {
        match self.first.extract_key(input)? {
            Some(key) => Ok(Some(key)),
            None => self.second.extract_key(input),
        }
    }

    fn needs_body(&self) -> bool {
        self.first.needs_body() || self.second.needs_body()
    }

    /// Only when both are: a header that takes precedence over a signed body value is a way
    /// to send a captured request again under a new key.
    fn covered_by(&self, verifier: &dyn VerifyRequest) -> bool {
        self.first.covered_by(verifier) && self.second.covered_by(verifier)
    }

    fn expected(&self) -> Option<String> {
        match (self.first.expected(), self.second.expected()) {
            (Some(a), Some(b)) => Some(format!("{a}, or {b}")),
            (a, b) => a.or(b),
        }
    }
}
