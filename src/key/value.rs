//! [`IdempotencyKey`]: a validated key, as the layer hands it to the inner service.

use std::fmt;

use http::HeaderValue;

use super::{KeyError, MAX_KEY_LEN, MAX_KEY_PARTS, PART_SEPARATOR};

/// A validated idempotency key: one value, the sorted, de-duplicated values of a batch taken as
/// one key, or the **items** of a batch, each its own key (see [`IdempotencyKey::items`]).
///
/// The layer puts it into the request extensions, so the inner service can read it. Behind
/// [`MissingKey::PassThrough`](crate::MissingKey::PassThrough) a request may have no key: read
/// it with `Option<Extension<IdempotencyKey>>` in axum.
///
/// [`Display`](fmt::Display) writes the key itself ([`as_str`](Self::as_str)); [`Debug`]
/// only its length, so that keys stay out of logs by accident.
pub struct IdempotencyKey {
    value: KeyText,
    items: bool,
}

/// Where a key's text lives.
enum KeyText {
    Owned(String),
    /// The value of the header it came from, shared with the request rather than copied (a
    /// header value parsed by hyper is a slice of the connection's read buffer). Only the key
    /// the layer extracts and moves into the request's extensions is kept this way: a clone
    /// owns its text, so a key a handler keeps does not keep that buffer alive. Visible ASCII,
    /// checked when the key was made.
    Header(HeaderValue),
}

impl KeyText {
    fn as_str(&self) -> &str {
        match self {
            KeyText::Owned(text) => text,
            // Checked when the key was made, so `to_str` (a scan of at most `MAX_KEY_LEN`
            // bytes: no unchecked conversion in this crate) cannot fail here.
            KeyText::Header(value) => value.to_str().unwrap_or_default(),
        }
    }
}

impl Clone for IdempotencyKey {
    /// A clone owns its text (see `KeyText::Header`).
    fn clone(&self) -> Self {
        IdempotencyKey {
            value: KeyText::Owned(self.as_str().to_owned()),
            items: self.items,
        }
    }
}

impl PartialEq for IdempotencyKey {
    fn eq(&self, other: &Self) -> bool {
        self.items == other.items && self.as_str() == other.as_str()
    }
}

impl Eq for IdempotencyKey {}

impl std::hash::Hash for IdempotencyKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
        self.items.hash(state);
    }
}

impl IdempotencyKey {
    /// Validates one key value: 1 to 255 bytes (Stripe's limit), no control characters.
    pub fn new(value: impl Into<String>) -> Result<Self, KeyError> {
        let value = value.into();
        validate_part(&value)?;
        Ok(IdempotencyKey {
            value: KeyText::Owned(value),
            items: false,
        })
    }

    /// A key of one header value, shared with the request rather than copied. `None` when the
    /// value is not visible ASCII.
    pub(crate) fn from_header(value: &HeaderValue) -> Option<Result<Self, KeyError>> {
        let text = value.to_str().ok()?;
        Some(validate_part(text).map(|()| IdempotencyKey {
            value: KeyText::Header(value.clone()),
            items: false,
        }))
    }

    /// A per-item key: every value is the key of one item of the batch (a WhatsApp message id,
    /// an Instagram mid), claimed, recorded and released on its own. De-duplicated, each value
    /// validated, at most 1000 (a batch with more ids is rejected with 400). An empty iterator
    /// yields `Ok(None)` (no key).
    pub fn items<I, S>(values: I) -> Result<Option<Self>, KeyError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::items_of(values.into_iter().map(Into::<String>::into))
    }

    /// [`items`](Self::items) from values that need not be owned.
    pub(crate) fn items_of<I, S>(values: I) -> Result<Option<Self>, KeyError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(Self::composite_of(values)?.map(|mut key| {
            key.items = true;
            key
        }))
    }

    /// Whether each value is its own key ([`IdempotencyKey::items`]).
    pub(crate) fn is_items(&self) -> bool {
        self.items
    }

    /// A composite key from many values: order-independent and de-duplicated, each value
    /// validated. An empty iterator yields `Ok(None)` (no key).
    pub fn composite<I, S>(values: I) -> Result<Option<Self>, KeyError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::composite_of(values.into_iter().map(Into::<String>::into))
    }

    /// [`composite`](Self::composite) from values that need not be owned (ids borrowed from
    /// the request body): only the joined key is allocated.
    pub(crate) fn composite_of<I, S>(values: I) -> Result<Option<Self>, KeyError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut values = values.into_iter();
        // One value (most keys): no list to sort.
        let first = match values.next() {
            None => return Ok(None),
            Some(first) => first,
        };
        let Some(second) = values.next() else {
            validate_part(first.as_ref())?;
            return Ok(Some(IdempotencyKey {
                value: KeyText::Owned(first.as_ref().to_owned()),
                items: false,
            }));
        };
        let mut parts: Vec<S> = Vec::new();
        for value in [first, second].into_iter().chain(values) {
            validate_part(value.as_ref())?;
            parts.push(value);
            if parts.len() > MAX_KEY_PARTS {
                return Err(KeyError::too_many_parts(MAX_KEY_PARTS));
            }
        }
        if parts.is_empty() {
            return Ok(None);
        }
        parts.sort_unstable_by(|a, b| a.as_ref().cmp(b.as_ref()));
        parts.dedup_by(|a, b| a.as_ref() == b.as_ref());
        let mut joined = String::with_capacity(parts.iter().map(|p| p.as_ref().len() + 1).sum());
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                joined.push(PART_SEPARATOR);
            }
            joined.push_str(part.as_ref());
        }
        Ok(Some(IdempotencyKey {
            value: KeyText::Owned(joined),
            items: false,
        }))
    }

    /// The key (values of a composite or per-item key are separated by `'\n'`).
    pub fn as_str(&self) -> &str {
        self.value.as_str()
    }

    /// The values of the key: one, or each value of a composite or per-item key, sorted.
    pub fn parts(&self) -> impl Iterator<Item = &str> {
        self.as_str().split(PART_SEPARATOR)
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keys may be sensitive (some senders use signed tokens as delivery ids): keep them out
        // of logs by default.
        write!(f, "IdempotencyKey(<{} bytes>)", self.as_str().len())
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

pub(crate) fn validate_part(value: &str) -> Result<(), KeyError> {
    if value.is_empty() {
        return Err(KeyError::empty());
    }
    if value.len() > MAX_KEY_LEN {
        return Err(KeyError::too_long(value.len(), MAX_KEY_LEN));
    }
    // Control characters are C0 (below 0x20), DEL and C1 (U+0080..U+009F, 0xC2 0x80..0x9F in
    // UTF-8): ASCII values are checked byte by byte, others char by char.
    let bytes = value.as_bytes();
    let control = if value.is_ascii() {
        bytes.iter().any(|&b| b < 0x20 || b == 0x7F)
    } else {
        value.chars().any(char::is_control)
    };
    if control {
        return Err(KeyError::control_character());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        assert!(IdempotencyKey::new("pd_01JD8Q4M7T0XK3").is_ok());
        assert!(IdempotencyKey::new("a".repeat(255)).is_ok());
        let err = IdempotencyKey::new("a".repeat(256)).unwrap_err();
        assert!(err.to_string().contains("256 bytes"), "{err}");
        assert!(
            IdempotencyKey::new("a\u{7}b")
                .unwrap_err()
                .to_string()
                .contains("control")
        );
        assert!(IdempotencyKey::new("").is_err());
    }

    /// A key shared with its header value is the same key as one copied from the same text:
    /// equal, hashed alike, validated alike.
    #[test]
    fn a_header_key_is_the_key_of_its_text() {
        use std::hash::BuildHasher;
        let state = std::hash::RandomState::new();
        let hash_with = |key: &IdempotencyKey| state.hash_one(key);
        let value = HeaderValue::from_static("pd_01JD8Q4M7T0XK3");
        let shared = IdempotencyKey::from_header(&value).unwrap().unwrap();
        let owned = IdempotencyKey::new("pd_01JD8Q4M7T0XK3").unwrap();
        assert_eq!(shared, owned);
        assert_eq!(hash_with(&shared), hash_with(&owned));
        assert_eq!(shared.as_str(), "pd_01JD8Q4M7T0XK3");
        assert_eq!(shared.to_string(), owned.to_string());
        assert_eq!(format!("{shared:?}"), format!("{owned:?}"));
        // A clone owns its text: a key kept by a handler does not keep the request's buffer.
        let kept = shared.clone();
        assert!(matches!(shared.value, KeyText::Header(_)));
        assert!(matches!(kept.value, KeyText::Owned(_)));
        assert_eq!(kept, shared);
        // Tabs pass `HeaderValue::to_str` but are control characters; non-ASCII is refused.
        let tab = HeaderValue::from_static("a\tb");
        assert!(IdempotencyKey::from_header(&tab).unwrap().is_err());
        let long = HeaderValue::from_str(&"a".repeat(256)).unwrap();
        assert!(IdempotencyKey::from_header(&long).unwrap().is_err());
        let utf8 = HeaderValue::from_bytes("café".as_bytes()).unwrap();
        assert!(IdempotencyKey::from_header(&utf8).is_none());
        // Not equal to a per-item key of the same text.
        let items = IdempotencyKey::items(["pd_01JD8Q4M7T0XK3"])
            .unwrap()
            .unwrap();
        assert_ne!(shared, items);
    }

    #[test]
    fn composite_is_order_independent_and_deduplicated() {
        let a = IdempotencyKey::composite(["b", "a", "b"]).unwrap().unwrap();
        let b = IdempotencyKey::composite(["a", "b"]).unwrap().unwrap();
        assert_eq!(a, b);
        assert_eq!(a.parts().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(
            IdempotencyKey::composite(Vec::<String>::new()).unwrap(),
            None
        );
    }

    #[test]
    fn debug_does_not_leak_the_key() {
        let key = IdempotencyKey::new("secret-token").unwrap();
        assert!(!format!("{key:?}").contains("secret"));
    }
}
