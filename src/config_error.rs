//! [`ConfigError`]: the one error of a setting refused where it is given (a leaf: it imports
//! nothing of the crate; each module that checks a setting converts its own reason into it).

use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// A setting the crate refuses where it is given, before anything is served: a header name,
/// a JSON path, a secret (or another setting of a signature scheme), an SQL table name. A
/// configuration error: return it from start-up.
///
/// [`Display`](fmt::Display) names the setting and says what is wrong with it, never a secret
/// (a secret is named by its position, from 1). It is the whole reason: there is no
/// [`source`](Error::source) behind it.
///
/// ```
/// use tower_idempotency::ConfigErrorKind;
/// use tower_idempotency::key::{HeaderKey, JsonPathKey};
///
/// let err = HeaderKey::new("X Delivery").unwrap_err();
/// assert_eq!(err.kind(), ConfigErrorKind::HeaderName);
/// assert_eq!(err.to_string(), "invalid header name \"X Delivery\"");
/// assert_eq!(JsonPathKey::new("$.id[").unwrap_err().kind(), ConfigErrorKind::JsonPath);
/// ```
#[derive(Clone, Debug)]
pub struct ConfigError {
    kind: ConfigErrorKind,
    why: Arc<dyn Error + Send + Sync + 'static>,
}

/// Which setting a [`ConfigError`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigErrorKind {
    /// A header name that is not one (a key's or a scope's header, a signature scheme's).
    HeaderName,
    /// A JSONPath that does not parse (RFC 9535), or that needs the `jsonpath` feature that is
    /// off: a key's, a position's or an order's.
    JsonPath,
    /// A signature scheme's secret that cannot be used (none, empty, with whitespace around
    /// it, not base64, a private key where a public one is needed, ...).
    Secret,
    /// An SQL table name that is not an identifier (`with_table`).
    Table,
}

impl ConfigError {
    /// The error of `kind`, saying `why` (whose [`Display`](fmt::Display) is this error's).
    pub(crate) fn new(kind: ConfigErrorKind, why: impl Error + Send + Sync + 'static) -> Self {
        ConfigError {
            kind,
            why: Arc::new(why),
        }
    }

    /// Which setting was refused.
    pub fn kind(&self) -> ConfigErrorKind {
        self.kind
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.why, f)
    }
}

impl Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refused_setting_says_which_it_is() {
        let header = crate::key::HeaderKey::new("X Delivery").unwrap_err();
        assert_eq!(header.kind(), ConfigErrorKind::HeaderName);
        let scope = crate::Scope::header("a:b").unwrap_err();
        assert_eq!(scope.kind(), ConfigErrorKind::HeaderName);
        let path = crate::order::PositionAt::sequence("$.seq[").unwrap_err();
        assert_eq!(path.kind(), ConfigErrorKind::JsonPath);
        assert!(path.to_string().contains("$.seq["), "{path}");
        #[cfg(feature = "verify")]
        {
            use crate::verify::{StandardWebhooks, StripeSignature};
            let secret = StandardWebhooks::new(["whsk_AAAA"]).unwrap_err();
            assert_eq!(secret.kind(), ConfigErrorKind::Secret);
            assert!(!secret.to_string().contains("AAAA"), "{secret}");
            let named = StripeSignature::new("Stripe Signature", ["whsec_x"]).unwrap_err();
            assert_eq!(named.kind(), ConfigErrorKind::HeaderName);
        }
        #[cfg(any(feature = "postgres", feature = "sqlite"))]
        {
            let table = ConfigError::from(crate::sql::validate_table("1keys", false).unwrap_err());
            assert_eq!(table.kind(), ConfigErrorKind::Table);
        }
    }
}
