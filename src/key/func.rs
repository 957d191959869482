use bytes::Bytes;
use http::request::Parts;

use super::{ExtractKey, IdempotencyKey, KeyError, KeyInput};

/// An extractor from a closure over the request head and the buffered body bytes; built by
/// [`from_body_fn`].
#[derive(Clone, Debug)]
pub struct BodyFn<F> {
    f: F,
}

/// Builds an extractor from a closure that reads the buffered body, for example the key field
/// of a protobuf message of a gRPC call (the bytes are the whole gRPC frame: a 5-byte prefix,
/// then the message).
///
/// ```
/// use tower_idempotency::key::{from_body_fn, ExtractKey, KeyInput};
///
/// // The first line of a text body is the key.
/// let first_line = from_body_fn(|_parts, body| {
///     let text = std::str::from_utf8(body).ok()?;
///     text.lines().next().map(str::to_owned)
/// });
/// assert!(first_line.needs_body());
/// ```
pub fn from_body_fn<F>(f: F) -> BodyFn<F>
where
    F: Fn(&Parts, &Bytes) -> Option<String> + Send + Sync + 'static,
{
    BodyFn { f }
}

impl<F> ExtractKey for BodyFn<F>
where
    F: Fn(&Parts, &Bytes) -> Option<String> + Send + Sync + 'static,
{
    fn extract_key(&self, input: &KeyInput<'_>) -> Result<Option<IdempotencyKey>, KeyError> {
        let body = input.body().ok_or_else(KeyError::body_not_buffered)?;
        (self.f)(input.parts(), body)
            .map(IdempotencyKey::new)
            .transpose()
    }

    fn needs_body(&self) -> bool {
        true
    }
}
