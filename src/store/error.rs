use std::error::Error;
use std::fmt;

/// A boxed error, as carried by [`StoreError::source`]: the same type as `tower::BoxError` and
/// `axum::BoxError`.
pub(crate) type BoxError = Box<dyn Error + Send + Sync + 'static>;

/// Why a store call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store could not be reached (connection refused, reset, not yet connected).
    Unavailable,
    /// The store did not answer within the configured store timeout.
    Timeout,
    /// The store answered with data this crate cannot decode.
    Corrupt,
    /// The store is full (the memory store's bound was reached).
    Capacity,
    /// A write landed on the primary but fewer replicas than required acknowledged it in time
    /// (the Redis store's durable completion): writing it again would change nothing.
    NotReplicated,
    /// Any other failure reported by the backend.
    Other,
}

impl fmt::Display for StoreErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StoreErrorKind::Unavailable => "store unavailable",
            StoreErrorKind::Timeout => "store timed out",
            StoreErrorKind::Corrupt => "store returned undecodable data",
            StoreErrorKind::Capacity => "store is full",
            StoreErrorKind::NotReplicated => "written but not acknowledged by enough replicas",
            StoreErrorKind::Other => "store error",
        })
    }
}

/// A failed store call. The layer answers it with 503 (fail closed) or passes the request
/// through (fail open), as configured.
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    source: Option<BoxError>,
}

impl StoreError {
    /// An error of `kind` without an underlying cause.
    pub fn new(kind: StoreErrorKind) -> Self {
        StoreError { kind, source: None }
    }

    /// An error of `kind` caused by `source`.
    pub fn with_source(kind: StoreErrorKind, source: impl Into<BoxError>) -> Self {
        StoreError {
            kind,
            source: Some(source.into()),
        }
    }

    /// What went wrong.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Some(source) => write!(f, "{}: {}", self.kind, source),
            None => fmt::Display::fmt(&self.kind, f),
        }
    }
}

impl Error for StoreError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}
