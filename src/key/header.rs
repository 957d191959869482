use http::HeaderName;

use crate::verify::VerifyRequest;

use super::{ExtractKey, IdempotencyKey, InvalidHeaderName, KeyError, KeyErrorKind, KeyInput};

/// Takes the key from one request header (or gRPC metadata entry).
///
/// The header must appear at most once and be visible ASCII; its value is validated like every
/// key (1 to 255 bytes, no control characters).
///
/// ```
/// use tower_idempotency::key::HeaderKey;
///
/// let stripe_style = HeaderKey::idempotency_key();
/// let kalipto = HeaderKey::new("X-Kalipto-Delivery-Id")?;
/// let standard_webhooks = HeaderKey::from_name(http::HeaderName::from_static("webhook-id"));
/// assert!(HeaderKey::new("bad header").is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// The key from header `name` (case-insensitive); an error when `name` is not a valid
    /// header name.
    pub fn new(name: &str) -> Result<Self, crate::ConfigError> {
        let name = HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
            .map_err(|_| InvalidHeaderName::new(name))?;
        Ok(HeaderKey { name })
    }

    /// The header this extractor reads.
    #[cfg(test)]
    pub(crate) fn name(&self) -> &HeaderName {
        &self.name
    }

    /// The key from an already parsed header name.
    pub fn from_name(name: HeaderName) -> Self {
        HeaderKey { name }
    }

    /// The key from `Idempotency-Key` (IETF draft-ietf-httpapi-idempotency-key-header, Stripe).
    pub fn idempotency_key() -> Self {
        HeaderKey {
            name: HeaderName::from_static("idempotency-key"),
        }
    }
}

impl ExtractKey for HeaderKey {
    fn extract_key(&self, input: &KeyInput<'_>) -> Result<Option<IdempotencyKey>, KeyError> {
        let mut values = input.parts().headers.get_all(&self.name).iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(KeyError::new(
                KeyErrorKind::InvalidHeader,
                format!("the {} header appears more than once", self.name),
            ));
        }
        let key = IdempotencyKey::from_header(value).ok_or_else(|| {
            KeyError::new(
                KeyErrorKind::InvalidHeader,
                format!(
                    "the {} header is not visible ASCII (control characters or non-ASCII bytes)",
                    self.name
                ),
            )
        })?;
        key.map(Some)
    }

    fn expected(&self) -> Option<String> {
        Some(format!("in the {} header", self.name))
    }

    fn covered_by(&self, verifier: &dyn VerifyRequest) -> bool {
        verifier.covers_header(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Was a check of the type's doctest while `name` was public.
    #[test]
    fn names_are_lowercased() {
        let kalipto = HeaderKey::new("X-Kalipto-Delivery-Id").unwrap();
        assert_eq!(kalipto.name().as_str(), "x-kalipto-delivery-id");
    }
}
