use std::fmt;
use std::sync::Arc;

use crate::{ConfigError, ConfigErrorKind};

/// Why a request's key is malformed. Answered 400 (problem+json, or `INVALID_ARGUMENT` for
/// gRPC) with [`Display`](fmt::Display) as the detail: it says exactly what is wrong, never
/// echoing the key or the body.
#[derive(Clone, Debug)]
pub struct KeyError {
    kind: KeyErrorKind,
    detail: Arc<str>,
}

/// The class of a [`KeyError`], for metrics and matching.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyErrorKind {
    /// The key is the empty string.
    Empty,
    /// The key is longer than allowed.
    TooLong,
    /// The key contains a control character.
    ControlCharacter,
    /// The key header is not visible ASCII / UTF-8, or appears more than once.
    InvalidHeader,
    /// The body is not JSON (or not UTF-8, or nested too deep), where a JSON key is needed.
    BodyNotJson,
    /// A JSON value selected as a key is not a string or a number.
    WrongType,
    /// A batch holds more values than one composite key may.
    TooManyParts,
    /// An extractor that needs the body got none (a configuration error).
    BodyNotBuffered,
    /// Anything else, reported by a user extractor.
    Other,
}

impl KeyError {
    /// An error of `kind` with a human-readable `detail` (for user extractors).
    pub fn new(kind: KeyErrorKind, detail: impl Into<String>) -> Self {
        KeyError {
            kind,
            detail: detail.into().into(),
        }
    }

    /// The class of the error.
    pub fn kind(&self) -> KeyErrorKind {
        self.kind
    }

    pub(crate) fn empty() -> Self {
        Self::new(KeyErrorKind::Empty, "the idempotency key is empty")
    }

    pub(crate) fn too_long(len: usize, max: usize) -> Self {
        Self::new(
            KeyErrorKind::TooLong,
            format!("the idempotency key is {len} bytes long; at most {max} bytes are allowed"),
        )
    }

    pub(crate) fn control_character() -> Self {
        Self::new(
            KeyErrorKind::ControlCharacter,
            "the idempotency key contains a control character",
        )
    }

    pub(crate) fn too_many_parts(max: usize) -> Self {
        Self::new(
            KeyErrorKind::TooManyParts,
            format!("the request holds more than {max} idempotency key values"),
        )
    }

    pub(crate) fn body_not_buffered() -> Self {
        Self::new(
            KeyErrorKind::BodyNotBuffered,
            "the key extractor needs the request body, but it was not buffered",
        )
    }

    pub(crate) fn not_json(err: serde_json::Error) -> Self {
        // serde_json's message names the position and the class of the error, never the input.
        Self::new(
            KeyErrorKind::BodyNotJson,
            format!("the request body is not valid JSON: {err}"),
        )
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for KeyError {}

/// Why a JSONPath was refused: it does not parse (RFC 9535 syntax), or needs the `jsonpath`
/// feature that is off (a [`ConfigError`] of kind [`JsonPath`](ConfigErrorKind::JsonPath)).
#[derive(Clone, Debug)]
pub(crate) struct PathError {
    path: String,
    message: String,
}

impl PathError {
    pub(crate) fn new(path: &str, err: impl fmt::Display) -> Self {
        PathError {
            path: path.to_owned(),
            message: err.to_string(),
        }
    }
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid JSONPath {:?}: {}", self.path, self.message)
    }
}

impl std::error::Error for PathError {}

impl From<PathError> for ConfigError {
    fn from(why: PathError) -> Self {
        ConfigError::new(ConfigErrorKind::JsonPath, why)
    }
}

/// Why a header name was refused (a [`ConfigError`] of kind
/// [`HeaderName`](ConfigErrorKind::HeaderName)).
#[derive(Clone, Debug)]
pub(crate) struct InvalidHeaderName {
    name: String,
}

impl InvalidHeaderName {
    pub(crate) fn new(name: &str) -> Self {
        InvalidHeaderName {
            name: name.to_owned(),
        }
    }
}

impl fmt::Display for InvalidHeaderName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid header name {:?}", self.name)
    }
}

impl std::error::Error for InvalidHeaderName {}

impl From<InvalidHeaderName> for ConfigError {
    fn from(why: InvalidHeaderName) -> Self {
        ConfigError::new(ConfigErrorKind::HeaderName, why)
    }
}
