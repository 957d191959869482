//! How fred's errors map to [`StoreErrorKind`]s: what the layer answers when Redis is down.

use fred::error::{Error as FredError, ErrorKind as FredErrorKind};

use crate::store::{StoreError, StoreErrorKind};

/// Server errors that mean "not now": the server is loading, busy, read-only or without a
/// primary, or the cluster is reconfiguring.
const TRANSIENT_SERVER_ERRORS: [&str; 7] = [
    "LOADING",
    "BUSY",
    "MASTERDOWN",
    "READONLY",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "NOREPLICAS",
];

fn error_kind(error: &FredError) -> StoreErrorKind {
    let details = error.details();
    let prefix = details.split_whitespace().next().unwrap_or("");
    match error.kind() {
        FredErrorKind::IO
        | FredErrorKind::Canceled
        | FredErrorKind::Routing
        | FredErrorKind::Cluster
        | FredErrorKind::Sentinel
        | FredErrorKind::Backpressure => StoreErrorKind::Unavailable,
        FredErrorKind::Timeout => StoreErrorKind::Timeout,
        FredErrorKind::Parse => StoreErrorKind::Corrupt,
        _ if TRANSIENT_SERVER_ERRORS.contains(&prefix) => StoreErrorKind::Unavailable,
        _ if prefix == "OOM" => StoreErrorKind::Capacity,
        // The client was never initialized, has quit, or gave up reconnecting.
        FredErrorKind::Unknown
            if details.starts_with("Client is not initialized")
                || details.starts_with("Failed to send command to router") =>
        {
            StoreErrorKind::Unavailable
        }
        _ => StoreErrorKind::Other,
    }
}

pub(crate) fn store_error(error: FredError) -> StoreError {
    StoreError::with_source(error_kind(&error), error)
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn errors_map_to_store_error_kinds() {
        let cases = [
            (
                FredErrorKind::IO,
                "Connection reset",
                StoreErrorKind::Unavailable,
            ),
            (
                FredErrorKind::Canceled,
                "Connection closed",
                StoreErrorKind::Unavailable,
            ),
            (
                FredErrorKind::Timeout,
                "Request timed out.",
                StoreErrorKind::Timeout,
            ),
            (
                FredErrorKind::Parse,
                "Cannot parse",
                StoreErrorKind::Corrupt,
            ),
            (
                FredErrorKind::Unknown,
                "LOADING Redis is loading",
                StoreErrorKind::Unavailable,
            ),
            (
                FredErrorKind::Unknown,
                "READONLY You can't write",
                StoreErrorKind::Unavailable,
            ),
            (
                FredErrorKind::Unknown,
                "OOM command not allowed",
                StoreErrorKind::Capacity,
            ),
            (
                FredErrorKind::Unknown,
                "Client is not initialized.",
                StoreErrorKind::Unavailable,
            ),
            (
                FredErrorKind::Unknown,
                "ERR syntax error",
                StoreErrorKind::Other,
            ),
            (
                FredErrorKind::InvalidArgument,
                "WRONGTYPE Operation",
                StoreErrorKind::Other,
            ),
        ];
        for (kind, details, expected) in cases {
            let error = store_error(FredError::new(kind, details));
            assert_eq!(error.kind(), expected, "{details}");
            let source = error.source().expect("the fred error is the source");
            assert!(source.to_string().contains(details));
        }
    }
}
