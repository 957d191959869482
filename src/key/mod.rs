//! Where the idempotency key comes from: the [`ExtractKey`] trait and its implementations.
//!
//! - [`HeaderKey`]: a request header (`Idempotency-Key`, `X-Kalipto-Delivery-Id`, `webhook-id`,
//!   gRPC metadata such as `idempotency-key`). Header-only extractors never make the layer parse
//!   the body.
//! - [`JsonPathKey`]: one or many values in the JSON body, selected by an RFC 9535 JSONPath.
//! - [`FieldsFingerprintKey`]: a canonical hash of chosen trusted JSON fields, for senders
//!   without a stable id.
//! - [`Fallback`] (via [`ExtractKey::or`]): try extractors in order.
//! - closures: any `Fn(&http::request::Parts) -> Option<String>` is an extractor; [`from_body_fn`]
//!   wraps a closure that reads the buffered body bytes.
//!
//! JSONPaths (of keys, fields, batch items and positions) made of members, indexes and
//! wildcards need no feature; the other RFC 9535 forms (filters, descendants, slices) need the
//! crate feature `jsonpath`, and without it are refused when the extractor is built.
//!
//! ```
//! use http::Request;
//! use tower_idempotency::key::{ExtractKey, HeaderKey, JsonPathKey, KeyInput};
//!
//! let sangho = HeaderKey::new("Sangho-Event-ID")?.or(JsonPathKey::new("$.id")?);
//!
//! let (parts, ()) = Request::post("/").body(()).unwrap().into_parts();
//! let body = bytes::Bytes::from_static(br#"{"id":"evt_1"}"#);
//! let key = sangho.extract_key(&KeyInput::new(&parts, Some(&body))).unwrap().unwrap();
//! assert_eq!(key.as_str(), "evt_1");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
mod fallback;
mod fields;
mod func;
mod header;
mod json;
pub(crate) mod query;
mod scan;
pub(crate) mod value;

use std::sync::OnceLock;

use bytes::Bytes;
use http::request::Parts;

use crate::verify::VerifyRequest;

pub(crate) use self::error::{InvalidHeaderName, PathError};
pub use self::error::{KeyError, KeyErrorKind};
pub use self::fallback::Fallback;
pub use self::fields::FieldsFingerprintKey;
pub use self::func::{BodyFn, from_body_fn};
pub use self::header::HeaderKey;
pub use self::json::JsonPathKey;
pub use self::value::IdempotencyKey;

/// The longest accepted key part, in bytes (Stripe's limit).
pub(crate) const MAX_KEY_LEN: usize = 255;

/// The most values one composite or per-item key may hold (a batch with more ids is rejected
/// with 400).
pub(crate) const MAX_KEY_PARTS: usize = 1000;

/// The separator between the parts of a composite key. A control character, so it can never
/// occur inside a valid part.
const PART_SEPARATOR: char = '\n';

/// What an extractor sees: the request head and, when some extractor needs it, the buffered
/// body, with its JSON parsed at most once and only on demand.
pub struct KeyInput<'a> {
    parts: &'a Parts,
    body: Option<&'a Bytes>,
    json: OnceLock<Result<serde_json::Value, KeyError>>,
}

impl<'a> KeyInput<'a> {
    /// The input of one request. `body` is `None` when no extractor asked for the body.
    pub fn new(parts: &'a Parts, body: Option<&'a Bytes>) -> Self {
        KeyInput {
            parts,
            body,
            json: OnceLock::new(),
        }
    }

    /// The request head: method, URI, version, headers, extensions.
    pub fn parts(&self) -> &'a Parts {
        self.parts
    }

    /// The buffered request body, if it was buffered.
    pub fn body(&self) -> Option<&'a Bytes> {
        self.body
    }

    /// The body parsed as JSON (parsed once, on first use).
    ///
    /// A body that is not JSON is [`KeyError`] `body is not valid JSON`. Nesting is limited by
    /// `serde_json`'s recursion limit (128), so hostile deeply nested bodies are rejected, never
    /// a stack overflow.
    pub fn json(&self) -> Result<&serde_json::Value, KeyError> {
        self.json
            .get_or_init(|| {
                let body = self.body.ok_or_else(KeyError::body_not_buffered)?;
                serde_json::from_slice(body).map_err(KeyError::not_json)
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}

/// Derives the idempotency key of a request.
///
/// Return `Ok(None)` when the request carries no key (the layer then applies its missing-key
/// policy), `Err` when it carries a malformed one (answered 400 with the error's message).
///
/// Any `Fn(&http::request::Parts) -> Option<String>` closure implements this trait.
pub trait ExtractKey: Send + Sync + 'static {
    /// Extracts the key of one request.
    fn extract_key(&self, input: &KeyInput<'_>) -> Result<Option<IdempotencyKey>, KeyError>;

    /// Whether this extractor reads the body. When no extractor does (and payload
    /// fingerprinting is off) the layer streams the body to the inner service without
    /// buffering it.
    fn needs_body(&self) -> bool {
        false
    }

    /// Where the key is expected (`"in the X-GitHub-Delivery header"`), named in the 400
    /// answer to a request without one. `None`: the answer says only that the key is missing.
    fn expected(&self) -> Option<String> {
        None
    }

    /// Whether every key this extractor can yield is covered by `verifier`'s signature (see
    /// [what a signature covers](crate::verify::VerifyRequest#what-the-signature-covers)), so
    /// that a captured request cannot be sent again under another key. When not, a verified
    /// route also claims each request's signed content (one more key in the same reserve).
    ///
    /// Default: `false` (not proven), which is what closures and
    /// [`from_body_fn`] get: a route keyed by them claims the signed content. A key from a
    /// JSON body ([`JsonPathKey`], [`FieldsFingerprintKey`]) is covered, a [`HeaderKey`] when
    /// the scheme [covers its header](crate::verify::VerifyRequest::covers_header) (Standard
    /// Webhooks' `webhook-id`), a [`Fallback`] when both of its extractors are.
    fn covered_by(&self, verifier: &dyn VerifyRequest) -> bool {
        let _ = verifier;
        false
    }

    /// Tries `self`, and `other` when `self` finds no key. An error from `self` (a malformed
    /// key) is returned as is: a malformed header is not silently replaced by a body value.
    ///
    /// ```
    /// use tower_idempotency::key::{ExtractKey, HeaderKey, JsonPathKey};
    ///
    /// let sangho = HeaderKey::new("Sangho-Event-ID")?.or(JsonPathKey::new("$.id")?);
    /// assert!(sangho.needs_body());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn or<O: ExtractKey>(self, other: O) -> Fallback<Self, O>
    where
        Self: Sized,
    {
        Fallback::new(self, other)
    }
}

impl<F> ExtractKey for F
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    fn extract_key(&self, input: &KeyInput<'_>) -> Result<Option<IdempotencyKey>, KeyError> {
        self(input.parts()).map(IdempotencyKey::new).transpose()
    }
}

/// A shared extractor, for extractors chosen at run time (`Arc<dyn ExtractKey>`).
impl<K: ExtractKey + ?Sized> ExtractKey for std::sync::Arc<K> {
    fn extract_key(&self, input: &KeyInput<'_>) -> Result<Option<IdempotencyKey>, KeyError> {
        (**self).extract_key(input)
    }

    fn needs_body(&self) -> bool {
        (**self).needs_body()
    }

    fn expected(&self) -> Option<String> {
        (**self).expected()
    }

    fn covered_by(&self, verifier: &dyn VerifyRequest) -> bool {
        (**self).covered_by(verifier)
    }
}
