//! The one place that decides whether an attempt succeeded, modelled on tower-http's
//! `classify`: a response classifier that may decide from the head, and an end-of-stream
//! classifier for what only the end tells (gRPC's `grpc-status` in the trailers).

use std::fmt;
use std::sync::Arc;

use http::{HeaderMap, StatusCode};

/// Whether an attempt succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Success,
    Failure,
}

type SuccessFn = Arc<dyn Fn(StatusCode, &HeaderMap) -> bool + Send + Sync>;

/// Decides success: for HTTP, a status classifier (default 2xx, see
/// [`success_when`](crate::IdempotencyLayer::success_when)) and a complete body; for gRPC,
/// HTTP 200 and a final `grpc-status: 0`, in the headers of a trailers-only response or in the
/// trailers.
#[derive(Clone)]
pub(crate) struct Classifier {
    success: SuccessFn,
}

impl Default for Classifier {
    fn default() -> Self {
        Classifier {
            success: Arc::new(|status, _| status.is_success()),
        }
    }
}

impl fmt::Debug for Classifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Classifier")
    }
}

/// What the head of a response says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Head {
    /// Decided: no need to read the body for the verdict.
    Final(Verdict),
    /// Success so far; the end of the stream decides (`grpc` responses read their trailers).
    Pending { grpc: bool },
}

impl Classifier {
    pub(crate) fn new(
        success: impl Fn(StatusCode, &HeaderMap) -> bool + Send + Sync + 'static,
    ) -> Self {
        Classifier {
            success: Arc::new(success),
        }
    }

    /// Classifies a response head. `grpc_request`: the request was a gRPC call.
    pub(crate) fn head(&self, grpc_request: bool, status: StatusCode, headers: &HeaderMap) -> Head {
        if grpc_request || is_grpc(headers) {
            if status != StatusCode::OK {
                return Head::Final(Verdict::Failure);
            }
            // A trailers-only response carries its final status in the headers.
            return match grpc_status(headers) {
                Some(Verdict::Failure) => Head::Final(Verdict::Failure),
                _ => Head::Pending { grpc: true },
            };
        }
        if (self.success)(status, headers) {
            Head::Pending { grpc: false }
        } else {
            Head::Final(Verdict::Failure)
        }
    }

    /// Classifies the end of a stream whose head was [`Head::Pending`]: `trailers` are the
    /// stream's trailers, if any; `head` the response headers (for a trailers-only gRPC reply).
    pub(crate) fn end(
        &self,
        pending_grpc: bool,
        head: Option<&HeaderMap>,
        trailers: Option<&HeaderMap>,
    ) -> Verdict {
        if !pending_grpc {
            return Verdict::Success;
        }
        grpc_status(trailers.unwrap_or(&HeaderMap::new()))
            .or_else(|| head.and_then(grpc_status))
            .unwrap_or(Verdict::Failure)
    }
}

/// Whether `headers` (of a request or a response) say gRPC: their first `content-type`, as
/// `HeaderMap::get` finds it. A response's few headers are scanned rather than looked up (a
/// look-up hashes the name); many are looked up.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    const SCANNED: usize = 8;
    let content_type = if headers.keys_len() <= SCANNED {
        headers
            .iter()
            .find_map(|(name, value)| (name == http::header::CONTENT_TYPE).then_some(value))
    } else {
        headers.get(http::header::CONTENT_TYPE)
    };
    content_type.is_some_and(says_grpc)
}

/// Whether a `content-type` value says gRPC.
pub(crate) fn says_grpc(content_type: &http::HeaderValue) -> bool {
    content_type.as_bytes().starts_with(b"application/grpc")
}

/// The verdict of a `grpc-status` header, if present: success only for `0`.
fn grpc_status(headers: &HeaderMap) -> Option<Verdict> {
    let status = headers.get("grpc-status")?;
    Some(if status == "0" {
        Verdict::Success
    } else {
        Verdict::Failure
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(*k, v.parse().unwrap());
        }
        map
    }

    #[test]
    fn http_is_decided_by_status_then_a_complete_body() {
        let c = Classifier::default();
        let h = HeaderMap::new();
        assert_eq!(
            c.head(false, StatusCode::CREATED, &h),
            Head::Pending { grpc: false }
        );
        assert_eq!(
            c.head(false, StatusCode::INTERNAL_SERVER_ERROR, &h),
            Head::Final(Verdict::Failure)
        );
        assert_eq!(c.end(false, Some(&h), None), Verdict::Success);
        let custom = Classifier::new(|s, _| s == StatusCode::ACCEPTED);
        assert_eq!(
            custom.head(false, StatusCode::OK, &h),
            Head::Final(Verdict::Failure)
        );
    }

    /// The scan of a few headers finds what the look-up finds: the first `content-type`.
    #[test]
    fn grpc_is_read_from_the_first_content_type() {
        let mut few = headers(&[("x-other", "1")]);
        few.append("content-type", "application/grpc".parse().unwrap());
        few.append("content-type", "text/plain".parse().unwrap());
        assert!(is_grpc(&few));
        let mut many = headers(&[("content-type", "text/plain")]);
        many.append("content-type", "application/grpc".parse().unwrap());
        assert!(!is_grpc(&many));
        for i in 0..10 {
            let name = http::HeaderName::try_from(format!("x-{i}")).unwrap();
            many.insert(name, "1".parse().unwrap());
        }
        assert!(!is_grpc(&many));
        many.insert("content-type", "application/grpc+proto".parse().unwrap());
        assert!(is_grpc(&many));
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn grpc_is_decided_by_the_final_status() {
        let c = Classifier::default();
        let grpc = headers(&[("content-type", "application/grpc")]);
        assert_eq!(
            c.head(false, StatusCode::OK, &grpc),
            Head::Pending { grpc: true }
        );
        let ok = headers(&[("grpc-status", "0")]);
        let failed = headers(&[("grpc-status", "13")]);
        assert_eq!(c.end(true, Some(&grpc), Some(&ok)), Verdict::Success);
        assert_eq!(c.end(true, Some(&grpc), Some(&failed)), Verdict::Failure);
        // No status at all is a failure (the stream was cut).
        assert_eq!(c.end(true, Some(&grpc), None), Verdict::Failure);
        // Trailers-only: the status is in the head.
        let only = headers(&[("content-type", "application/grpc"), ("grpc-status", "5")]);
        assert_eq!(
            c.head(true, StatusCode::OK, &only),
            Head::Final(Verdict::Failure)
        );
        let only_ok = headers(&[("content-type", "application/grpc"), ("grpc-status", "0")]);
        assert_eq!(
            c.head(true, StatusCode::OK, &only_ok),
            Head::Pending { grpc: true }
        );
        assert_eq!(c.end(true, Some(&only_ok), None), Verdict::Success);
        assert_eq!(
            c.head(true, StatusCode::BAD_GATEWAY, &grpc),
            Head::Final(Verdict::Failure)
        );
    }
}
