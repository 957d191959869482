//! Phase 4: the claim. The reserve (waiting, when asked, for an attempt in flight), then what
//! its answers mean: call the inner service, or answer now.

use http::Request;
use http::request::Parts;

use super::Prelude;
use super::key::Derived;
use crate::claim::guard::{ClaimGuard, ClaimStore, Ending};
use crate::claim::items::BatchItems;
use crate::claim::outcome::Outcome;
use crate::fingerprint::Fingerprint;
use crate::http::answer::{duplicate, stale};
use crate::http::body::RequestBody;
use crate::http::config::{ClaimRules, FailureMode, OnMismatch, Settings};
use crate::http::rejection::Rejection;
use crate::order::{Position, StaleEvent, StaleEvents};
use crate::store::{Claim, Reservation, StoreError, StoreErrorKind};

/// A request on its way through the claim: what the inner service will get (its head and
/// body) and what it is claimed as. Boxed once and handed down by pointer: moved by value, it
/// took a slot of its own in each async step that held it, and the prelude future that every
/// request allocates grew past the allocator's per-thread cache.
pub(crate) struct Claiming<B> {
    pub(crate) parts: Parts,
    pub(crate) body: RequestBody<B>,
    pub(crate) derived: Derived,
}

/// Claims what the request's `derived` names, then calls the inner service or answers.
pub(crate) async fn claim<B, ResBody>(
    claims: &ClaimStore,
    settings: &Settings,
    request: Box<Claiming<B>>,
    grpc: bool,
) -> Prelude<B, ResBody> {
    // Until the reserve's answer is in, the claim may land without us knowing: if this future
    // is dropped (the client went away) or the reserve fails, the guard undoes it.
    let fingerprint = request.derived.fingerprint;
    let claim = Claim::new(fingerprint);
    let mut guard = claims.open(
        request.derived.targets.clone(),
        claim,
        &settings.claim.policy,
    );
    guard.set_grpc(grpc);
    match guard
        .reserve_waiting(settings.claim.policy.wait_in_flight, &fingerprint)
        .await
    {
        Ok(answers) => decide(guard, answers, settings, request, grpc).await,
        Err(err) => {
            let one_key = request.derived.items.is_none() && !request.derived.signed;
            if err.kind() == StoreErrorKind::Capacity && one_key {
                // Refused before anything was written.
                guard.forget();
            } else {
                // A reserve that timed out or lost its connection may still be applied later
                // (a client that queues and retries commands across a reconnect): dropping the
                // guard undoes it, token-checked, so it cannot block the sender's retries until
                // the lease expires.
                drop(guard);
            }
            store_failure(err, settings, *request, grpc)
        }
    }
}

/// What holds a request back: another attempt with one of its keys, or another event of one
/// of its objects.
enum Busy {
    Key(Fingerprint),
    Object,
}

fn busy(answers: &[Reservation]) -> Option<Busy> {
    answers.iter().find_map(|a| match a {
        Reservation::InFlight { fingerprint } => Some(Busy::Key(*fingerprint)),
        Reservation::ObjectBusy => Some(Busy::Object),
        _ => None,
    })
}

/// The answer to a request whose key (or object) another request holds: 422 when the held
/// key's payload differs and mismatches are rejected, else 409.
fn busy_rejection(busy: Busy, fingerprint: &Fingerprint, rules: &ClaimRules) -> Rejection {
    let retry_after = rules.in_flight_retry_after;
    match busy {
        Busy::Key(held)
            if !held.matches(fingerprint) && rules.on_mismatch == OnMismatch::Reject =>
        {
            Rejection::Mismatch
        }
        Busy::Key(_) => Rejection::InFlight { retry_after },
        Busy::Object => Rejection::ObjectInFlight { retry_after },
    }
}

/// What the reserve's answers mean.
async fn decide<B, ResBody>(
    mut guard: ClaimGuard,
    answers: Vec<Reservation>,
    settings: &Settings,
    mut request: Box<Claiming<B>>,
    grpc: bool,
) -> Prelude<B, ResBody> {
    let fingerprint = request.derived.fingerprint;
    if let Some(busy) = busy(&answers) {
        // Let go of what this request claimed, so the other holder's items are not blocked.
        guard.keep(&answers);
        // The rare paths' store calls are boxed: awaited inline, their futures would make the
        // prelude's (boxed on every request) several times larger.
        Box::pin(guard.release()).await;
        return Prelude::reject(
            settings,
            busy_rejection(busy, &fingerprint, &settings.claim),
            grpc,
        );
    }
    guard.keep(&answers);
    if !answers.iter().any(Reservation::is_ours) {
        drop(guard);
        // Every key (every item) was completed earlier: a duplicate.
        return completed(answers, settings, &fingerprint, grpc);
    }
    if request.derived.signed
        && answers
            .iter()
            .any(|answer| matches!(answer, Reservation::Completed(_)))
    {
        // The key is new but the signed content was done before (a captured request replayed
        // under another id), or the key was done before and the signed content is new (a
        // redelivery signed again at another time): a duplicate either way. What this request
        // claimed is let go.
        Box::pin(guard.release()).await;
        return completed(answers, settings, &fingerprint, grpc);
    }
    // A plain function decides, and the one await stays here: an async helper would add a
    // future of its own to the prelude's.
    match admit(&mut guard, &answers, settings, &mut request) {
        Admit::Call(outcome) => request.into_call(Some(guard), outcome),
        Admit::Stale((position, watermark)) => {
            // Acknowledged, and recorded, without the handler.
            Box::pin(guard.settle(Ending::Succeeded(None))).await;
            Prelude::Respond(stale(settings, grpc, position, watermark))
        }
    }
}

/// What a request that holds its claim does next.
enum Admit {
    /// Call the inner service; the outcome when it succeeds.
    Call(Outcome),
    /// Answer that the event is stale, at this position and watermark, without the handler.
    Stale((Position, Position)),
}

/// Whether a request holding its claim reaches the inner service: a batch does unless every
/// new item is stale (the handler learns which items it holds), a single stale event only on
/// routes that pass stale events on (marked with a [`StaleEvent`]).
fn admit<B>(
    guard: &mut ClaimGuard,
    answers: &[Reservation],
    settings: &Settings,
    request: &mut Claiming<B>,
) -> Admit {
    let pass_on = settings.order.as_deref().map(|o| o.stale()) == Some(StaleEvents::PassOn);
    let stale_at = first_stale(answers, &request.derived);
    match request.derived.items.take() {
        Some(ids) => {
            let batch = batch_items(ids, answers, pass_on);
            if batch.nothing_new() {
                // Every new item is stale: answered without the handler, the items recorded
                // when the claim settles.
                guard.set_items(batch);
                return Admit::Stale(stale_at.unwrap_or_default());
            }
            request.parts.extensions.insert(batch.clone());
            guard.set_items(batch);
            Admit::Call(Outcome::First)
        }
        None => match stale_at {
            Some(at) if !pass_on => Admit::Stale(at),
            Some((position, watermark)) => {
                request.parts.extensions.insert(StaleEvent {
                    position,
                    watermark,
                });
                Admit::Call(Outcome::Stale)
            }
            None => Admit::Call(Outcome::First),
        },
    }
}

impl<B> Claiming<B> {
    /// Hands the request to the inner service with its key, under `guard` (`None`: it runs
    /// unprotected), for `outcome` when the inner service succeeds.
    fn into_call<ResBody>(
        self,
        guard: Option<ClaimGuard>,
        outcome: Outcome,
    ) -> Prelude<B, ResBody> {
        // The key goes to the inner service only: a duplicate or a rejection never reads it.
        let Claiming {
            mut parts,
            body,
            derived,
        } = self;
        parts.extensions.insert(derived.key);
        Prelude::Call {
            request: Request::from_parts(parts, body),
            guard,
            outcome,
        }
    }
}

/// The answer to a request done before: every key was completed earlier, or (a request whose
/// key the signature does not cover) its key or its signed content was. The first completed
/// answer's record is the one answered: the key's, when it was completed.
fn completed<B, ResBody>(
    answers: Vec<Reservation>,
    settings: &Settings,
    fingerprint: &Fingerprint,
    grpc: bool,
) -> Prelude<B, ResBody> {
    let Some(record) = answers.into_iter().find_map(|answer| match answer {
        Reservation::Completed(record) => Some(record),
        _ => None,
    }) else {
        unreachable!("a request done before has a completed answer");
    };
    let mut outcome = Outcome::Replayed;
    if !record.fingerprint().matches(fingerprint) {
        if settings.claim.on_mismatch == OnMismatch::Reject {
            return Prelude::reject(settings, Rejection::Mismatch, grpc);
        }
        outcome = Outcome::MismatchAcked;
    }
    Prelude::Respond(duplicate(record, settings, grpc, outcome))
}

/// The position and watermark of the first stale event among the answers.
fn first_stale(answers: &[Reservation], derived: &Derived) -> Option<(Position, Position)> {
    answers
        .iter()
        .zip(&derived.positions)
        .find_map(|(answer, position)| match answer {
            Reservation::Stale { watermark } => Some((*position, *watermark)),
            _ => None,
        })
}

/// What the handler learns of a batch: its items held (new or stale) and done before.
fn batch_items(ids: Vec<String>, answers: &[Reservation], pass_on: bool) -> BatchItems {
    let (mut held, mut before) = (Vec::new(), Vec::new());
    for (id, answer) in ids.into_iter().zip(answers) {
        match answer {
            Reservation::Acquired => held.push((id, false)),
            Reservation::Stale { .. } => held.push((id, true)),
            _ => before.push(id),
        }
    }
    BatchItems::new(held, before, pass_on)
}

/// The answer when the store failed: 503 (fail closed), or the inner service unprotected (fail
/// open). The error is logged at debug; the outcome's line, at error, is throttled (a full
/// store refuses every request an outsider sends).
fn store_failure<B, ResBody>(
    err: StoreError,
    settings: &Settings,
    request: Claiming<B>,
    grpc: bool,
) -> Prelude<B, ResBody> {
    match settings.claim.failure_mode {
        FailureMode::Closed => {
            tracing::debug!(error = %err, "idempotency store error; failing closed");
            let retry_after = settings.claim.store_retry_after;
            Prelude::reject(settings, Rejection::StoreUnavailable { retry_after }, grpc)
        }
        FailureMode::Open => {
            tracing::debug!(error = %err, "idempotency store error; failing open");
            request.into_call(None, Outcome::FailOpen)
        }
    }
}
