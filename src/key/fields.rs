use serde_json::Value;
use sha2::{Digest, Sha256};

use super::query::ValuePath;
use super::{ExtractKey, IdempotencyKey, KeyError, KeyInput};
use crate::verify::VerifyRequest;

/// A key for senders without a stable id: a canonical hash of chosen trusted JSON fields.
///
/// The fields are selected by RFC 9535 JSONPaths (filters, descendants and slices with the
/// `jsonpath` feature). Their values are written canonically (object
/// members sorted by name, no insignificant whitespace) and hashed with SHA-256, so field order
/// and formatting of the body do not matter, and fields not listed (a `user_agent`, a delivery
/// timestamp) do not change the key. The key is `fields:` and 64 hex digits.
///
/// When none of the paths matches, the request has no key.
///
/// ```
/// use tower_idempotency::key::FieldsFingerprintKey;
///
/// let email_event = FieldsFingerprintKey::new(["$.message_id", "$.type", "$.occurred_at"]).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct FieldsFingerprintKey {
    paths: Vec<ValuePath>,
}

impl FieldsFingerprintKey {
    /// A fingerprint of the values at `paths`, in this order.
    pub fn new<I, S>(paths: I) -> Result<Self, crate::ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let paths = paths
            .into_iter()
            .map(|p| ValuePath::parse(p.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(FieldsFingerprintKey { paths })
    }
}

/// Writes `value` canonically: object members sorted by name, no whitespace.
pub(crate) fn write_canonical(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Object(map) => {
            let mut members: Vec<_> = map.iter().collect();
            members.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (name, value)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                // Serialising a string cannot fail.
                out.extend_from_slice(serde_json::to_string(name).unwrap_or_default().as_bytes());
                out.push(b':');
                write_canonical(out, value);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(out, item);
            }
            out.push(b']');
        }
        scalar => out.extend_from_slice(scalar.to_string().as_bytes()),
    }
}

impl ExtractKey for FieldsFingerprintKey {
    fn extract_key(&self, input: &KeyInput<'_>) -> Result<Option<IdempotencyKey>, KeyError> {
        let json = input.json()?;
        let mut canonical = Vec::with_capacity(256);
        let mut matched = false;
        canonical.push(b'[');
        for (i, path) in self.paths.iter().enumerate() {
            if i > 0 {
                canonical.push(b',');
            }
            let nodes = path.select(json);
            matched |= !nodes.is_empty();
            canonical.push(b'[');
            for (j, node) in nodes.into_iter().enumerate() {
                if j > 0 {
                    canonical.push(b',');
                }
                write_canonical(&mut canonical, node);
            }
            canonical.push(b']');
        }
        canonical.push(b']');
        if !matched {
            return Ok(None);
        }
        let mut key = String::with_capacity(7 + 64);
        key.push_str("fields:");
        crate::util::push_hex(&mut key, &Sha256::digest(&canonical));
        IdempotencyKey::new(key).map(Some)
    }

    fn needs_body(&self) -> bool {
        true
    }

    /// The body is signed by every built-in scheme.
    fn covered_by(&self, _verifier: &dyn VerifyRequest) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_ignores_member_order_and_whitespace() {
        let a: Value = serde_json::from_str(r#"{"b": 1, "a": {"y": [1, 2], "x": "s"}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"x":"s","y":[1,2]},"b":1}"#).unwrap();
        let (mut ca, mut cb) = (Vec::new(), Vec::new());
        write_canonical(&mut ca, &a);
        write_canonical(&mut cb, &b);
        assert_eq!(ca, cb);
        assert_eq!(ca, br#"{"a":{"x":"s","y":[1,2]},"b":1}"#);
    }
}
