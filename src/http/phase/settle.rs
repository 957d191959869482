//! Phase 6: the inner service answered. Whether the attempt succeeded is decided by the one
//! [`Classifier`](crate::http::classify::Classifier); the claim is then recorded or released, and the
//! response handed on. Responses up to the buffer limit are read in full first, so that the
//! client never receives the end of a response that was not recorded; larger ones stream, and
//! their claim is settled at the end of the stream (the guarded [`ResponseBody`]).

use std::sync::Arc;

use bytes::Bytes;
use http::response::Parts;
use http::{HeaderMap, Response};
use http_body::Body;

use crate::claim::guard::{ClaimGuard, Ending};
use crate::claim::outcome::Outcome;
use crate::http::body::{Collected, Read, ResponseBody, read_within};
use crate::http::classify::{Head, Verdict};
use crate::http::config::{Mode, Replies, Settings};
use crate::store::BoxError;
use crate::store::record::StoredResponse;

/// Settles `guard` on `response`, then hands the response on, with `outcome` (`First`, or
/// `Stale` for a stale event passed on) when it succeeded and `Released` when it did not.
pub(crate) fn finish<B>(
    guard: ClaimGuard,
    settings: Arc<Settings>,
    response: Response<B>,
    outcome: Outcome,
) -> impl Future<Output = Response<ResponseBody<B>>> + Send + use<B>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    // An async block rather than an async fn: the block holds the parts it was handed once,
    // where an async fn would keep its arguments and their moved copies side by side.
    let (mut parts, body) = response.into_parts();
    async move {
        let classifier = &settings.reply.classifier;
        let grpc = match classifier.head(guard.is_grpc(), parts.status, &parts.headers) {
            Head::Final(_) => {
                guard.settle(Ending::Failed).await;
                parts.extensions.insert(Outcome::Released);
                return Response::from_parts(parts, ResponseBody::inner(body));
            }
            Head::Pending { grpc } => grpc,
        };
        let collected = match read_response(body, settings.reply.response_buffer_limit).await {
            Held::Whole(collected) => collected,
            Held::Streaming(prefix, body) => {
                // Too large to hold: streamed, and the claim settled at its end.
                parts.extensions.insert(outcome);
                guard.renewal().start();
                let (chunks, _) = prefix.into_chunks();
                let head = grpc.then(|| parts.headers.clone());
                let body =
                    ResponseBody::guarded(chunks, body, guard, classifier.clone(), grpc, head);
                return Response::from_parts(parts, body);
            }
            Held::Failed(prefix, err) => {
                guard.settle(Ending::Failed).await;
                parts.extensions.insert(Outcome::Released);
                let (data, _) = prefix.into_parts();
                return Response::from_parts(parts, ResponseBody::failed(data, err));
            }
        };
        let verdict = classifier.end(grpc, Some(&parts.headers), collected.trailers());
        let (data, trailers) = collected.into_boxed_parts();
        let ending = match verdict {
            Verdict::Success => Ending::Succeeded(kept(
                &settings.reply,
                &parts,
                grpc,
                &data,
                trailers.as_deref(),
            )),
            Verdict::Failure => Ending::Failed,
        };
        let succeeded = matches!(ending, Ending::Succeeded(_));
        guard.settle(ending).await;
        parts.extensions.insert(if succeeded {
            outcome
        } else {
            Outcome::Released
        });
        Response::from_parts(parts, ResponseBody::buffered_boxed(data, trailers))
    }
}

/// A response body, as far as it was read.
enum Held<B> {
    /// Read to its end, within the buffer limit.
    Whole(Collected),
    /// Larger than the limit: what was read, and the rest, to stream.
    Streaming(Collected, std::pin::Pin<Box<B>>),
    /// It failed, after what was read.
    Failed(Collected, BoxError),
}

/// Reads a response body within `limit` bytes. A body known to fit is read where it is; one
/// that may not is boxed, so that it can be handed on as a stream.
async fn read_response<B>(body: B, limit: usize) -> Held<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut collected = Collected::default();
    let fits = body
        .size_hint()
        .upper()
        .is_some_and(|upper| upper <= limit as u64);
    if fits {
        let body = std::pin::pin!(body);
        return match read_within(body, limit, &mut collected).await {
            Read::Done => Held::Whole(collected),
            Read::TooLarge => {
                Held::Failed(collected, "response body larger than its size hint".into())
            }
            Read::Failed(err) => Held::Failed(collected, err),
        };
    }
    let mut body = Box::pin(body);
    match read_within(body.as_mut(), limit, &mut collected).await {
        Read::Done => Held::Whole(collected),
        Read::TooLarge => Held::Streaming(collected, body),
        Read::Failed(err) => Held::Failed(collected, err),
    }
}

/// The response kept for replay: in replay mode, and always for gRPC (a gRPC client cannot
/// decode an acknowledgement); `None` otherwise (an acknowledgement will answer duplicates).
fn kept(
    reply: &Replies,
    parts: &Parts,
    grpc: bool,
    data: &Bytes,
    trailers: Option<&HeaderMap>,
) -> Option<Box<StoredResponse>> {
    if reply.mode != Mode::Replay && !grpc {
        return None;
    }
    let headers = replay_headers(&parts.headers, &reply.replay_headers, grpc);
    let response = StoredResponse::new(parts.status, headers, data.clone(), trailers.cloned());
    Some(Box::new(response))
}

/// The headers kept for replay: the allow-list, and for gRPC the `grpc-*` headers too.
fn replay_headers(headers: &HeaderMap, allow: &[http::HeaderName], grpc: bool) -> HeaderMap {
    let mut kept = HeaderMap::new();
    for (name, value) in headers {
        if allow.contains(name) || (grpc && name.as_str().starts_with("grpc-")) {
            kept.append(name.clone(), value.clone());
        }
    }
    kept
}
