//! [`ResponseFuture`]: the response future of [`Idempotency`](crate::Idempotency), a state
//! machine over a private state enum: prelude (read, key, claim) → calling the inner service →
//! finishing (decide success, record or release) → done. While the inner service runs (and
//! while its response is being read), the claim's renewal starts once a third of the lease has
//! passed.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use http::{HeaderMap, Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_service::Service;

use crate::body::{Collected, RequestBody, ResponseBody};
use crate::classify::{Head, Verdict};
use crate::config::{Mode, Settings};
use crate::guard::{ClaimGuard, Renewal, Settlement};
use crate::observe::Stopwatch;
use crate::outcome::Outcome;
use crate::store::BoxError;
use crate::store::record::{Record, StoredResponse};

/// What the prelude decided: answer now, or call the inner service.
pub(crate) enum Prelude<B, ResBody> {
    Respond(Response<ResponseBody<ResBody>>),
    Call {
        request: Request<RequestBody<B>>,
        guard: Option<ClaimGuard>,
        outcome: Outcome,
    },
}

type Finish<ResBody, E> = BoxFuture<'static, Result<Response<ResponseBody<ResBody>>, E>>;

pin_project! {
    /// The response future of [`Idempotency`](crate::Idempotency).
    pub struct ResponseFuture<S, ReqBody, ResBody>
    where
        S: Service<Request<RequestBody<ReqBody>>>,
    {
        #[pin]
        state: State<S, ReqBody, ResBody>,
        // When the claim's renewal starts, if the request is still in the inner service or
        // being finished by then.
        #[pin]
        renew_at: Option<Sleep>,
        renewal: Option<Renewal>,
        // `None` on the uncovered fast path: nothing to observe.
        settings: Option<Arc<Settings>>,
        span: tracing::Span,
        timer: Stopwatch,
        // The outcome to report if the inner service returns `Err`.
        outcome_on_err: Outcome,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody, ResBody>
    where
        S: Service<Request<RequestBody<ReqBody>>>,
    {
        Prelude {
            fut: BoxFuture<'static, Prelude<ReqBody, ResBody>>,
            inner: Option<S>,
        },
        Calling {
            #[pin]
            fut: S::Future,
            guard: Option<ClaimGuard>,
            outcome: Outcome,
            timer: Stopwatch,
        },
        Finishing {
            fut: Finish<ResBody, S::Error>,
        },
        Ready {
            response: Option<Response<ResponseBody<ResBody>>>,
        },
    }
}

impl<S, ReqBody, ResBody> ResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<RequestBody<ReqBody>>>,
{
    pub(crate) fn new(
        prelude: BoxFuture<'static, Prelude<ReqBody, ResBody>>,
        inner: S,
        settings: Arc<Settings>,
        span: tracing::Span,
        timer: Stopwatch,
    ) -> Self {
        ResponseFuture {
            state: State::Prelude {
                fut: prelude,
                inner: Some(inner),
            },
            renew_at: None,
            renewal: None,
            settings: Some(settings),
            span,
            timer,
            outcome_on_err: Outcome::Released,
        }
    }

    pub(crate) fn pass_through(fut: S::Future) -> Self {
        ResponseFuture {
            state: State::Calling {
                fut,
                guard: None,
                outcome: Outcome::PassThrough,
                timer: Stopwatch::OFF,
            },
            renew_at: None,
            renewal: None,
            settings: None,
            span: tracing::Span::none(),
            timer: Stopwatch::OFF,
            outcome_on_err: Outcome::PassThrough,
        }
    }

    pub(crate) fn ready(
        response: Response<ResponseBody<ResBody>>,
        settings: Arc<Settings>,
        span: tracing::Span,
        timer: Stopwatch,
    ) -> Self {
        ResponseFuture {
            state: State::Ready {
                response: Some(response),
            },
            renew_at: None,
            renewal: None,
            settings: Some(settings),
            span,
            timer,
            outcome_on_err: Outcome::PassThrough,
        }
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>,
    S::Error: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let _entered = this.span.enter();
        let output = poll_state(
            this.state.as_mut(),
            this.settings,
            this.outcome_on_err,
            this.renewal,
            cx,
        );
        let output = match output {
            Poll::Ready(output) => output,
            Poll::Pending => {
                // Still busy: start renewing the claim once a third of the lease has passed.
                // The timer is armed only now, so a handler that answers at once never pays
                // for one.
                if let Some(renewal) = this.renewal.as_ref() {
                    if this.renew_at.is_none() {
                        this.renew_at
                            .set(Some(tokio::time::sleep(renewal.interval())));
                    }
                }
                if let Some(sleep) = this.renew_at.as_mut().as_pin_mut() {
                    if sleep.poll(cx).is_ready() {
                        if let Some(renewal) = this.renewal.take() {
                            renewal.start();
                        }
                        this.renew_at.set(None);
                    }
                }
                return Poll::Pending;
            }
        };
        this.renew_at.set(None);
        if let Some(settings) = this.settings {
            let (outcome, status) = match &output {
                Ok(response) => (
                    response
                        .extensions()
                        .get::<Outcome>()
                        .copied()
                        .unwrap_or(Outcome::PassThrough),
                    Some(response.status()),
                ),
                Err(_) => (*this.outcome_on_err, None),
            };
            settings.observer.outcome(outcome, status, *this.timer);
        }
        Poll::Ready(output)
    }
}

fn poll_state<S, ReqBody, ResBody>(
    mut state: Pin<&mut State<S, ReqBody, ResBody>>,
    settings: &Option<Arc<Settings>>,
    outcome_on_err: &mut Outcome,
    renewal: &mut Option<Renewal>,
    cx: &mut Context<'_>,
) -> Poll<Result<Response<ResponseBody<ResBody>>, S::Error>>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>,
    S::Error: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    loop {
        match state.as_mut().project() {
            StateProj::Prelude { fut, inner } => match ready!(fut.as_mut().poll(cx)) {
                Prelude::Respond(response) => {
                    state.set(State::Ready { response: None });
                    return Poll::Ready(Ok(response));
                }
                Prelude::Call {
                    request,
                    guard,
                    outcome,
                } => {
                    match &guard {
                        None => *outcome_on_err = outcome,
                        Some(guard) => *renewal = Some(guard.renewal()),
                    }
                    let mut inner = inner.take().expect("polled after the inner call");
                    let fut = inner.call(request);
                    let timer = match (&guard, settings) {
                        (Some(guard), _) => guard.inner_stopwatch(),
                        (None, Some(s)) => s.observer.stopwatch(),
                        (None, None) => Stopwatch::OFF,
                    };
                    state.set(State::Calling {
                        fut,
                        guard,
                        outcome,
                        timer,
                    });
                }
            },
            StateProj::Calling {
                fut,
                guard,
                outcome,
                timer,
            } => {
                let result = ready!(fut.poll(cx));
                if let Some(settings) = settings {
                    settings.observer.inner_duration(*timer);
                }
                let outcome = *outcome;
                let fut: Finish<ResBody, S::Error> = match (result, guard.take()) {
                    (Ok(response), None) => {
                        let mut response = response.map(ResponseBody::inner);
                        response.extensions_mut().insert(outcome);
                        return Poll::Ready(Ok(response));
                    }
                    (Err(err), None) => return Poll::Ready(Err(err)),
                    (Ok(response), Some(guard)) => {
                        let settings = settings.clone().unwrap_or_default();
                        Box::pin(finish(guard, settings, response).map(Ok))
                    }
                    (Err(err), Some(guard)) => {
                        Box::pin(guard.settle(Settlement::Failure).map(|()| Err(err)))
                    }
                };
                state.set(State::Finishing { fut });
            }
            StateProj::Finishing { fut } => {
                let output = ready!(fut.as_mut().poll(cx));
                state.set(State::Ready { response: None });
                return Poll::Ready(output);
            }
            StateProj::Ready { response } => {
                let response = response.take().expect("polled after completion");
                return Poll::Ready(Ok(response));
            }
        }
    }
}

/// Decides whether the attempt succeeded, then records or releases the claim, then hands the
/// response on. Responses up to the buffer limit are read in full first, so that the client
/// never receives the end of a response that was not recorded.
fn finish<B>(
    guard: ClaimGuard,
    settings: Arc<Settings>,
    response: Response<B>,
) -> impl Future<Output = Response<ResponseBody<B>>> + Send + use<B>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    // An async block rather than an async fn: the block holds the parts it was handed once,
    // where an async fn would keep its arguments and their moved copies side by side.
    let (mut parts, body) = response.into_parts();
    async move {
        let grpc = match settings
            .classifier
            .head(guard.is_grpc(), parts.status, &parts.headers)
        {
            Head::Final(_) => {
                guard.settle(Settlement::Failure).await;
                parts.extensions.insert(Outcome::Released);
                return Response::from_parts(parts, ResponseBody::inner(body));
            }
            Head::Pending { grpc } => grpc,
        };

        let limit = settings.response_buffer_limit;
        let mut collected = Collected::default();
        // A body known to fit the buffer is read where it is; one that may not is boxed, so
        // that it can be handed on as a stream.
        let fits = body
            .size_hint()
            .upper()
            .is_some_and(|upper| upper <= limit as u64);
        let read = if fits {
            let body = std::pin::pin!(body);
            match read_within(body, limit, &mut collected).await {
                Read::TooLarge => Read::Failed("response body larger than its size hint".into()),
                read => read,
            }
        } else {
            let mut body = Box::pin(body);
            match read_within(body.as_mut(), limit, &mut collected).await {
                Read::TooLarge => {
                    // Too large to hold: stream it, and settle the claim at its end.
                    parts.extensions.insert(Outcome::First);
                    guard.renewal().start();
                    let (chunks, _) = collected.into_chunks();
                    let head = grpc.then(|| parts.headers.clone());
                    return Response::from_parts(
                        parts,
                        ResponseBody::guarded(
                            chunks,
                            body,
                            guard,
                            settings.classifier.clone(),
                            grpc,
                            head,
                        ),
                    );
                }
                read => read,
            }
        };
        if let Read::Failed(err) = read {
            guard.settle(Settlement::Failure).await;
            parts.extensions.insert(Outcome::Released);
            let (data, _) = collected.into_parts();
            return Response::from_parts(parts, ResponseBody::failed(data, err));
        }

        let verdict = settings
            .classifier
            .end(grpc, Some(&parts.headers), collected.trailers());
        let (data, trailers) = collected.into_parts();
        match verdict {
            Verdict::Success => {
                let fingerprint = guard.claim().fingerprint();
                let record = if (settings.mode == Mode::Replay || grpc) && !guard.is_batch() {
                    let headers = replay_headers(&parts.headers, &settings.replay_headers, grpc);
                    Record::replay(
                        fingerprint,
                        StoredResponse::new(parts.status, headers, data.clone(), trailers.clone()),
                    )
                } else {
                    Record::ack(fingerprint)
                };
                guard.settle(Settlement::Success(record)).await;
                parts.extensions.insert(Outcome::First);
            }
            Verdict::Failure => {
                guard.settle(Settlement::Failure).await;
                parts.extensions.insert(Outcome::Released);
            }
        }
        Response::from_parts(parts, ResponseBody::buffered(data, trailers))
    }
}

/// How reading a response body into the buffer ended.
enum Read {
    /// At its end, within the limit.
    Done,
    /// Past the limit: what was read is in the buffer, the rest is still in the body.
    TooLarge,
    /// The body failed.
    Failed(BoxError),
}

/// Reads `body` into `collected` until its end, an error, or more than `limit` bytes.
async fn read_within<B>(mut body: Pin<&mut B>, limit: usize, collected: &mut Collected) -> Read
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
