//! [`ResponseFuture`]: the response future of [`Idempotency`](crate::Idempotency), a state
//! machine over a private state enum that drives the [phases](crate::http::phase) of one request:
//! prelude (read, verify, key, claim) → calling the inner service → finishing (decide success,
//! record or release) → done. While the inner service runs (and while its response is being
//! read), the claim's renewal starts once a third of the lease has passed; the settlement that
//! follows is bounded by the store timeout and needs no timer of the request's when twice that
//! is shorter than the lease (its retries start the renewal themselves).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_service::Service;

use crate::claim::guard::{ClaimGuard, Ending, Renewal};
use crate::claim::lease;
use crate::claim::observe::Stopwatch;
use crate::claim::outcome::Outcome;
use crate::http::body::{RequestBody, ResponseBody};
use crate::http::config::Settings;
use crate::http::phase::Prelude;
use crate::http::phase::settle::finish;
use crate::store::BoxError;
use crate::util::in_box;

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
        let outer = Outer {
            settings: this.settings,
            outcome_on_err: this.outcome_on_err,
            renewal: this.renewal,
        };
        let Poll::Ready(output) = poll_state(this.state.as_mut(), outer, cx) else {
            // Still busy: start renewing the claim once a third of the lease has passed. The
            // timer is armed only now, so a handler that answers at once never pays for one.
            if lease::poll_start(this.renew_at.as_mut(), this.renewal.as_ref(), cx) {
                *this.renewal = None;
            }
            return Poll::Pending;
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
            settings
                .claim
                .policy
                .observer
                .outcome(outcome, status, *this.timer);
        }
        Poll::Ready(output)
    }
}

/// The fields of the future outside its state, which the states update.
struct Outer<'a> {
    settings: &'a Option<Arc<Settings>>,
    outcome_on_err: &'a mut Outcome,
    renewal: &'a mut Option<Renewal>,
}

/// Drives the state machine: prelude, inner call, finishing.
fn poll_state<S, ReqBody, ResBody>(
    mut state: Pin<&mut State<S, ReqBody, ResBody>>,
    mut outer: Outer<'_>,
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
                    let inner = inner.take().expect("polled after the inner call");
                    let calling = start_call(inner, request, guard, outcome, &mut outer);
                    state.set(calling);
                }
            },
            StateProj::Calling {
                fut,
                guard,
                outcome,
                timer,
            } => {
                let result = ready!(fut.poll(cx));
                if let Some(settings) = outer.settings {
                    settings.claim.policy.observer.inner_duration(*timer);
                }
                match after_call(result, guard.take(), *outcome, outer.settings) {
                    AfterCall::Done(output) => return Poll::Ready(output),
                    AfterCall::Settle(fut) => state.set(State::Finishing { fut }),
                }
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

/// Calls the inner service with a request the prelude let through: the state that awaits it.
/// An unprotected request's `Err` reports the prelude's outcome; a claimed one hands its
/// claim's renewal to the future (armed only if the handler is still busy when next polled),
/// and its handler's time is measured by the claim.
fn start_call<S, ReqBody, ResBody>(
    mut inner: S,
    request: Request<RequestBody<ReqBody>>,
    guard: Option<ClaimGuard>,
    outcome: Outcome,
    outer: &mut Outer<'_>,
) -> State<S, ReqBody, ResBody>
where
    S: Service<Request<RequestBody<ReqBody>>>,
{
    match &guard {
        None => *outer.outcome_on_err = outcome,
        Some(guard) => *outer.renewal = Some(guard.renewal()),
    }
    let fut = inner.call(request);
    let timer = match (&guard, outer.settings) {
        (Some(guard), _) => guard.inner_stopwatch(),
        (None, Some(settings)) => settings.claim.policy.observer.stopwatch(),
        (None, None) => Stopwatch::OFF,
    };
    State::Calling {
        fut,
        guard,
        outcome,
        timer,
    }
}

/// What follows the inner service's answer.
enum AfterCall<ResBody, E> {
    /// Nothing to settle: the answer as it is.
    Done(Result<Response<ResponseBody<ResBody>>, E>),
    /// The claim to settle first.
    Settle(Finish<ResBody, E>),
}

fn after_call<ResBody, E>(
    result: Result<Response<ResBody>, E>,
    guard: Option<ClaimGuard>,
    outcome: Outcome,
    settings: &Option<Arc<Settings>>,
) -> AfterCall<ResBody, E>
where
    E: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    match (result, guard) {
        (Ok(response), None) => {
            let mut response = response.map(ResponseBody::inner);
            response.extensions_mut().insert(outcome);
            AfterCall::Done(Ok(response))
        }
        (Err(err), None) => AfterCall::Done(Err(err)),
        (Ok(response), Some(guard)) => {
            let settings = settings.clone().unwrap_or_default();
            AfterCall::Settle(in_box(|| {
                finish(guard, settings, response, outcome).map(Ok)
            }))
        }
        (Err(err), Some(guard)) => {
            AfterCall::Settle(in_box(|| guard.settle(Ending::Failed).map(|()| Err(err))))
        }
    }
}
