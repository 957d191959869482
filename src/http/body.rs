//! The bodies the layer hands on: [`RequestBody`] to the inner service, [`ResponseBody`] to the
//! client.
//!
//! The inner service sees the exact bytes that arrived: a buffered body is replayed as the
//! single chunk that arrived (no copy) or the concatenation of the chunks, followed by the
//! original trailers. A body that did not need buffering is streamed through, still bounded by
//! the layer's body limit.
//!
//! ```
//! use std::convert::Infallible;
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_idempotency::{IdempotencyLayer, MemoryStore, RequestBody};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let svc = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::new(MemoryStore::new()))
//!     .service_fn(|req: Request<RequestBody<Full<Bytes>>>| async move {
//!         // The inner service reads the bytes that arrived, though the layer read them first.
//!         let body = req.into_body().collect().await.unwrap().to_bytes();
//!         assert_eq!(body, Bytes::from_static(b"{\"id\":1}"));
//!         Ok::<_, Infallible>(Response::new(Full::new(body)))
//!     });
//! let request = Request::post("/orders")
//!     .header("idempotency-key", "k1")
//!     .body(Full::new(Bytes::from_static(b"{\"id\":1}")))
//!     .unwrap();
//! let response = svc.oneshot(request).await.unwrap();
//! let echoed = response.into_body().collect().await.unwrap().to_bytes();
//! assert_eq!(echoed, Bytes::from_static(b"{\"id\":1}"));
//! # }
//! ```

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::future::BoxFuture;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Limited};
use pin_project_lite::pin_project;

use crate::claim::guard::{ClaimGuard, Ending};
use crate::http::classify::{Classifier, Verdict};
use crate::http::rejection::Rejection;
use crate::store::BoxError;

pin_project! {
    /// The request body the inner service receives.
    #[derive(Debug)]
    pub struct RequestBody<B> {
        #[pin]
        kind: RequestKind<B>,
    }
}

pin_project! {
    #[project = RequestKindProj]
    #[derive(Debug)]
    enum RequestKind<B> {
        Streaming {
            #[pin]
            body: B,
        },
        Limited {
            #[pin]
            body: Limited<B>,
        },
        Buffered {
            body: InMemory,
        },
    }
}

impl<B> RequestBody<B> {
    /// The original body, streamed through untouched.
    pub(crate) fn streaming(body: B) -> Self {
        RequestBody {
            kind: RequestKind::Streaming { body },
        }
    }

    /// The original body streamed through, failing with
    /// [`LengthLimitError`](http_body_util::LengthLimitError) past `limit` bytes.
    pub(crate) fn limited(body: B, limit: usize) -> Self {
        RequestBody {
            kind: RequestKind::Limited {
                body: Limited::new(body, limit),
            },
        }
    }

    /// A body that was read in full: its bytes, then its trailers (boxed, as [`Collected`]
    /// keeps them).
    pub(crate) fn buffered_boxed(data: Bytes, trailers: Option<Box<HeaderMap>>) -> Self {
        RequestBody {
            kind: RequestKind::Buffered {
                body: InMemory::new(data, trailers),
            },
        }
    }
}

impl<B> Body for RequestBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            RequestKindProj::Streaming { body } => body.poll_frame(cx).map_err(Into::into),
            RequestKindProj::Limited { body } => body.poll_frame(cx),
            RequestKindProj::Buffered { body } => Poll::Ready(body.next_frame()),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            RequestKind::Streaming { body } => body.is_end_stream(),
            RequestKind::Limited { body } => body.is_end_stream(),
            RequestKind::Buffered { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            RequestKind::Streaming { body } => body.size_hint(),
            RequestKind::Limited { body } => body.size_hint(),
            RequestKind::Buffered { body } => body.size_hint(),
        }
    }
}

/// A body already in memory, the buffered state of both [`RequestBody`] and [`ResponseBody`]:
/// its data as one frame (none when empty), then its trailers.
#[derive(Debug)]
struct InMemory {
    data: Option<Bytes>,
    // Boxed (rare, and a `HeaderMap` is 96 bytes): bodies are moved with every request, and
    // responses several times on their way out.
    trailers: Option<Box<HeaderMap>>,
}

// `#[inline]`: called from the generic `Body` impls, which are compiled in the user's crate.
impl InMemory {
    #[inline]
    fn new(data: Bytes, trailers: Option<Box<HeaderMap>>) -> Self {
        InMemory {
            data: (!data.is_empty()).then_some(data),
            trailers,
        }
    }

    /// The data, then the trailers, then the end (`None`).
    #[inline]
    fn next_frame(&mut self) -> Option<Result<Frame<Bytes>, BoxError>> {
        self.data
            .take()
            .map(Frame::data)
            .or_else(|| self.trailers.take().map(|t| Frame::trailers(*t)))
            .map(Ok)
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

/// How reading a body into a [`Collected`] ended.
pub(crate) enum Read {
    /// At its end, within the limit.
    Done,
    /// Past the limit: what was read is in the buffer, the rest is still in the body.
    TooLarge,
    /// The body failed.
    Failed(BoxError),
}

/// Reads `body` into `collected` until its end, an error, or more than `limit` bytes: the one
/// reading loop, for requests and responses.
pub(crate) async fn read_within<B>(
    mut body: Pin<&mut B>,
    limit: usize,
    collected: &mut Collected,
) -> Read
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    loop {
        match body.frame().await {
            None => return Read::Done,
            Some(Ok(frame)) => {
                if collected.push(frame) > limit {
                    return Read::TooLarge;
                }
            }
            Some(Err(err)) => return Read::Failed(err.into()),
        }
    }
}

/// Reads a request body in full, within `limit` bytes and, when set, `timeout`: the read
/// phase of a request. A body over the limit is 413, one that fails is 400, one slower than
/// the timeout is 408.
pub(crate) async fn read_request<B>(
    body: B,
    limit: usize,
    timeout: Option<Duration>,
) -> Result<Collected, Rejection>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let read = async {
        let body = std::pin::pin!(body);
        let mut collected = Collected::default();
        match read_within(body, limit, &mut collected).await {
            Read::Done => Ok(collected),
            Read::TooLarge => Err(Rejection::PayloadTooLarge { limit }),
            Read::Failed(err) => {
                tracing::debug!(error = %err, "request body could not be read");
                Err(Rejection::BodyUnreadable)
            }
        }
    };
    let mut read = std::pin::pin!(read);
    let Some(limit) = timeout else {
        return read.await;
    };
    // The timer is armed only when the body is not all there at the first look: a body that
    // arrived with its head (most webhooks) costs no timer.
    if let Some(result) = crate::util::ready_now(read.as_mut()).await {
        return result;
    }
    // Boxed: a timer is large, and the request's future stays small (below the allocator's
    // per-thread cache size).
    match Box::pin(tokio::time::timeout(limit, read)).await {
        Ok(result) => result,
        Err(_) => Err(Rejection::BodyTimeout),
    }
}

/// A request or response body read in full: its data (without copying a single chunk) and its
/// trailers.
#[derive(Debug, Default)]
pub(crate) struct Collected {
    /// The first data chunk. Most bodies arrive as one chunk: kept here, it costs no
    /// allocation (`rest` allocates on its first push only).
    first: Option<Bytes>,
    rest: VecDeque<Bytes>,
    len: usize,
    /// Boxed (rare, and a `HeaderMap` is large): a `Collected`, and the trailers taken from
    /// it, sit in the futures of the read and of the settlement, boxed on every request.
    trailers: Option<Box<HeaderMap>>,
}

impl Collected {
    /// Adds one frame; returns the new data length.
    pub(crate) fn push(&mut self, frame: Frame<Bytes>) -> usize {
        match frame.into_data() {
            Ok(data) => {
                self.len += data.len();
                if !data.is_empty() {
                    match self.first {
                        None => self.first = Some(data),
                        Some(_) => self.rest.push_back(data),
                    }
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    match &mut self.trailers {
                        Some(existing) => existing.extend(trailers),
                        None => self.trailers = Some(Box::new(trailers)),
                    }
                }
            }
        }
        self.len
    }

    pub(crate) fn trailers(&self) -> Option<&HeaderMap> {
        self.trailers.as_deref()
    }

    /// The data chunks as they arrived, and the trailers.
    pub(crate) fn into_chunks(self) -> (VecDeque<Bytes>, Option<HeaderMap>) {
        let mut chunks = self.rest;
        if let Some(first) = self.first {
            chunks.push_front(first);
        }
        (chunks, self.trailers.map(|trailers| *trailers))
    }

    /// The data as one `Bytes`: the single chunk itself when there is one.
    pub(crate) fn into_parts(self) -> (Bytes, Option<HeaderMap>) {
        let (data, trailers) = self.into_boxed_parts();
        (data, trailers.map(|trailers| *trailers))
    }

    /// As [`into_parts`](Self::into_parts), the trailers left in their box.
    pub(crate) fn into_boxed_parts(self) -> (Bytes, Option<Box<HeaderMap>>) {
        let data = match self.first {
            None => Bytes::new(),
            Some(first) if self.rest.is_empty() => first,
            Some(first) => {
                let mut out = BytesMut::with_capacity(self.len);
                out.extend_from_slice(&first);
                for chunk in &self.rest {
                    out.extend_from_slice(chunk);
                }
                out.freeze()
            }
        };
        (data, self.trailers)
    }
}

pin_project! {
    /// The response body the client receives: the inner service's body (untouched, or guarded
    /// until the claim is settled), a buffered copy of it, a replayed response or a rejection.
    pub struct ResponseBody<B> {
        #[pin]
        kind: ResponseKind<B>,
    }
}

pin_project! {
    #[project = ResponseKindProj]
    enum ResponseKind<B> {
        Inner {
            #[pin]
            body: B,
        },
        Buffered {
            body: InMemory,
        },
        Failed {
            data: Option<Bytes>,
            error: Option<BoxError>,
        },
        Guarded {
            // Boxed for the same reason: this state is large and rare.
            guarded: Box<Guarded<B>>,
        },
    }
}

/// A response too large to buffer, streamed until the claim is settled.
struct Guarded<B> {
    body: Pin<Box<B>>,
    prefix: VecDeque<Bytes>,
    guard: Option<ClaimGuard>,
    classifier: Classifier,
    grpc: bool,
    /// The response headers of a gRPC reply (a trailers-only reply has its status there).
    head: Option<HeaderMap>,
    settling: Option<BoxFuture<'static, ()>>,
    held_trailers: Option<HeaderMap>,
    done: bool,
}

impl<B> Guarded<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    /// The next frame: the prefix read while deciding to stream, then the body's frames; at
    /// the end of the stream the claim is settled before the end (or the trailers) goes out,
    /// so that the client never sees the end of a response that was not recorded.
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if let Some(settling) = &mut self.settling {
                ready!(settling.as_mut().poll(cx));
                self.settling = None;
                self.done = true;
            }
            if self.done {
                return Poll::Ready(self.held_trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            if let Some(data) = self.prefix.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            match ready!(self.body.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) if frame.is_data() => return Poll::Ready(Some(Ok(frame))),
                // Trailers end the stream: held until the claim is settled.
                Some(Ok(frame)) => self.settle(frame.into_trailers().ok()),
                Some(Err(err)) => {
                    // Dropping the guard unsettled releases the claim in the background.
                    drop(self.guard.take());
                    return Poll::Ready(Some(Err(err.into())));
                }
                None => self.settle(None),
            }
        }
    }

    /// Starts settling the claim at the end of the stream (ended by `trailers`, or by none).
    fn settle(&mut self, trailers: Option<HeaderMap>) {
        match self.guard.take() {
            Some(guard) => {
                // Too large to have been kept: a success is recorded as an ack.
                let head = self.head.as_ref();
                let ending = match self.classifier.end(self.grpc, head, trailers.as_ref()) {
                    Verdict::Success => Ending::Succeeded(None),
                    Verdict::Failure => Ending::Failed,
                };
                self.settling = Some(Box::pin(guard.settle(ending)));
            }
            None => self.done = true,
        }
        self.held_trailers = trailers;
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            ResponseKind::Inner { .. } => "Inner",
            ResponseKind::Buffered { .. } => "Buffered",
            ResponseKind::Failed { .. } => "Failed",
            ResponseKind::Guarded { .. } => "Guarded",
        };
        f.debug_struct("ResponseBody").field("kind", &kind).finish()
    }
}

impl<B> ResponseBody<B> {
    /// The inner service's body, untouched.
    pub(crate) fn inner(body: B) -> Self {
        ResponseBody {
            kind: ResponseKind::Inner { body },
        }
    }

    /// A body that is already in memory: a buffered response, a replay or a rejection.
    pub(crate) fn buffered(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self::buffered_boxed(data, trailers.map(Box::new))
    }

    /// As [`buffered`](Self::buffered), with trailers already boxed (as [`Collected`] keeps
    /// them).
    pub(crate) fn buffered_boxed(data: Bytes, trailers: Option<Box<HeaderMap>>) -> Self {
        ResponseBody {
            kind: ResponseKind::Buffered {
                body: InMemory::new(data, trailers),
            },
        }
    }

    /// A body that failed while it was being buffered: the data read so far, then the error.
    pub(crate) fn failed(data: Bytes, error: BoxError) -> Self {
        ResponseBody {
            kind: ResponseKind::Failed {
                data: (!data.is_empty()).then_some(data),
                error: Some(error),
            },
        }
    }

    /// A body too large to buffer: `prefix` (already read), then the rest of `body`; the claim
    /// is settled when the stream ends (completed on success, released on error or drop).
    pub(crate) fn guarded(
        prefix: VecDeque<Bytes>,
        body: Pin<Box<B>>,
        guard: ClaimGuard,
        classifier: Classifier,
        grpc: bool,
        head: Option<HeaderMap>,
    ) -> Self {
        ResponseBody {
            kind: ResponseKind::Guarded {
                guarded: Box::new(Guarded {
                    body,
                    prefix,
                    guard: Some(guard),
                    classifier,
                    grpc,
                    head,
                    settling: None,
                    held_trailers: None,
                    done: false,
                }),
            },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            ResponseKindProj::Inner { body } => body.poll_frame(cx).map_err(Into::into),
            ResponseKindProj::Buffered { body } => Poll::Ready(body.next_frame()),
            ResponseKindProj::Failed { data, error } => Poll::Ready(match data.take() {
                Some(data) => Some(Ok(Frame::data(data))),
                None => error.take().map(Err),
            }),
            ResponseKindProj::Guarded { guarded } => guarded.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            ResponseKind::Inner { body } => body.is_end_stream(),
            ResponseKind::Buffered { body } => body.is_end_stream(),
            ResponseKind::Failed { data, error } => data.is_none() && error.is_none(),
            // Never report the end early: the stream must be polled to its end for the claim
            // to be settled.
            ResponseKind::Guarded { guarded } => guarded.done && guarded.held_trailers.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            ResponseKind::Inner { body } => body.size_hint(),
            ResponseKind::Buffered { body } => body.size_hint(),
            ResponseKind::Failed { data, .. } => {
                let mut hint = SizeHint::new();
                hint.set_lower(data.as_ref().map_or(0, |d| d.len() as u64));
                hint
            }
            // An exact hint would let HTTP/1 servers stop polling after the last byte, before
            // the claim is settled; announce a lower bound only.
            ResponseKind::Guarded { guarded } => {
                let mut hint = SizeHint::new();
                let prefix = guarded.prefix.iter().map(|b| b.len() as u64).sum::<u64>();
                hint.set_lower(prefix + guarded.body.size_hint().lower());
                hint
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::{Arc, Mutex};

    use http::{Request, Response};
    use http_body_util::{BodyExt, Full, StreamBody};
    use tower::{ServiceBuilder, ServiceExt};

    use super::*;
    use crate::{IdempotencyLayer, MemoryStore};

    /// Was the module's doctest while `RequestBody::buffered` was public.
    #[tokio::test]
    async fn a_buffered_body_yields_its_bytes() {
        let body: RequestBody<http_body_util::Empty<Bytes>> =
            RequestBody::buffered_boxed(Bytes::from_static(b"{\"id\":1}"), None);
        let collected = body.collect().await.unwrap();
        assert_eq!(collected.to_bytes(), Bytes::from_static(b"{\"id\":1}"));
    }

    #[test]
    fn a_single_chunk_is_kept_without_copying() {
        let data = Bytes::from(vec![7u8; 4096]);
        let mut collected = Collected::default();
        assert_eq!(collected.push(Frame::data(data.clone())), 4096);
        let (out, trailers) = collected.into_parts();
        assert_eq!(out.as_ptr(), data.as_ptr(), "the chunk was copied");
        assert_eq!(out.len(), data.len());
        assert!(trailers.is_none());
    }

    #[test]
    fn several_chunks_are_joined_in_order_with_their_trailers() {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-checksum", http::HeaderValue::from_static("abc"));
        let mut collected = Collected::default();
        for chunk in [&b"ab"[..], b"", b"cd", b"e"] {
            collected.push(Frame::data(Bytes::copy_from_slice(chunk)));
        }
        let (chunks, _) = collected.into_chunks();
        assert_eq!(chunks, [&b"ab"[..], b"cd", b"e"]);

        let mut collected = Collected::default();
        for chunk in [&b"ab"[..], b"cd", b"e"] {
            collected.push(Frame::data(Bytes::copy_from_slice(chunk)));
        }
        collected.push(Frame::trailers(trailers.clone()));
        assert_eq!(collected.trailers(), Some(&trailers));
        let (data, kept) = collected.into_parts();
        assert_eq!(data, &b"abcde"[..]);
        assert_eq!(kept, Some(trailers));
    }

    /// Through the layer (payload fingerprint on, so the body is buffered): the inner service
    /// gets the very bytes that arrived in one chunk, not a copy.
    #[tokio::test]
    async fn the_inner_service_gets_a_single_chunk_body_uncopied() {
        let data = Bytes::from(vec![b'x'; 64 * 1024]);
        let seen: Arc<Mutex<Vec<(usize, usize)>>> = Arc::default();
        let seen2 = seen.clone();
        let service = ServiceBuilder::new()
            .layer(IdempotencyLayer::new(MemoryStore::new()))
            .service_fn(move |request: Request<RequestBody<Full<Bytes>>>| {
                let seen = seen2.clone();
                async move {
                    let mut body = request.into_body();
                    while let Some(frame) = body.frame().await {
                        if let Ok(chunk) = frame.unwrap().into_data() {
                            seen.lock()
                                .unwrap()
                                .push((chunk.as_ptr() as usize, chunk.len()));
                        }
                    }
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
                }
            });
        let request = Request::post("/x")
            .header("idempotency-key", "k")
            .body(Full::new(data.clone()))
            .unwrap();
        let response = service.oneshot(request).await.unwrap();
        assert_eq!(response.status(), http::StatusCode::OK);
        assert_eq!(
            *seen.lock().unwrap(),
            [(data.as_ptr() as usize, data.len())]
        );
    }

    /// A body that arrives in several chunks reaches the inner service whole, in order.
    #[tokio::test]
    async fn a_chunked_body_is_handed_on_whole() {
        let chunks = [&b"{\"id\":"[..], b"\"evt_1\"", b"}"];
        let stream = futures_util::stream::iter(
            chunks.map(|c| Ok::<_, Infallible>(Frame::data(Bytes::from_static(c)))),
        );
        let service = ServiceBuilder::new()
            .layer(IdempotencyLayer::new(MemoryStore::new()))
            .service_fn(|request: Request<RequestBody<StreamBody<_>>>| async move {
                let body = request.into_body().collect().await.unwrap().to_bytes();
                Ok::<_, Infallible>(Response::new(Full::new(body)))
            });
        let request = Request::post("/x")
            .header("idempotency-key", "k")
            .body(StreamBody::new(stream))
            .unwrap();
        let response = service.oneshot(request).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, &b"{\"id\":\"evt_1\"}"[..]);
    }
}
