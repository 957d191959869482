//! The in-flight claim of one request, from the moment it is acquired until it is completed or
//! released, whatever happens in between (non-success, `Err`, panic, dropped future, a response
//! body that fails or is dropped).

use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use http::HeaderMap;

use crate::observe::{Observer, StoreOp};
use crate::record::Record;
use crate::store::{Claim, IdempotencyStore, StoreError, StoreErrorKind, StoreKey};

/// Runs `fut` under the store timeout.
///
/// A store that answers on the first poll (the memory store, always) never arms a timer: the
/// deadline is set only if the first poll is pending.
pub(crate) async fn timed<T>(
    timeout: Duration,
    fut: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let mut fut = std::pin::pin!(fut);
    if let Poll::Ready(result) = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await
    {
        return result;
    }
    match tokio::time::timeout(timeout, fut).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::new(StoreErrorKind::Timeout)),
    }
}

/// The store operations of one claim, with the store type erased so that futures and bodies do
/// not carry it.
trait LeaseOps: Send + Sync + 'static {
    // `Arc<Self>`: the future shares the lease's key and claim instead of cloning them.
    /// Writes the record; after a store error, keeps retrying in the background until
    /// `expires` (the claim is ours until then, so a late record is still the right record).
    fn complete(self: Arc<Self>, record: Record, expires: Instant) -> BoxFuture<'static, ()>;
    fn release(self: Arc<Self>) -> BoxFuture<'static, Result<bool, StoreError>>;
}

struct StoreLease<St> {
    observer: Observer,
    store: St,
    key: StoreKey,
    claim: Claim,
    retention: Duration,
    timeout: Duration,
}

impl<St: IdempotencyStore> StoreLease<St> {
    async fn write(&self, record: &Record) -> Result<bool, StoreError> {
        let timer = self.observer.stopwatch();
        let call = self
            .store
            .complete(&self.key, &self.claim, record, self.retention);
        let result = timed(self.timeout, call).await;
        self.observer
            .store_call(StoreOp::Complete, timer, result.is_ok());
        result
    }
}

impl<St: IdempotencyStore> LeaseOps for StoreLease<St> {
    fn complete(self: Arc<Self>, record: Record, expires: Instant) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            match self.write(&record).await {
                Ok(true) => return,
                Ok(false) => return warn_lease_lost(),
                Err(err) if written_but_not_replicated(&err) => {
                    // The record is on the primary: writing it again would only be refused.
                    return tracing::error!(error = %err, "idempotency record not replicated");
                }
                Err(err) => tracing::error!(
                    error = %err,
                    "could not record a completed idempotency key; retrying until the lease expires"
                ),
            }
            let Ok(handle) = tokio::runtime::Handle::try_current() else {
                return;
            };
            handle.spawn(async move {
                let mut pause = Duration::from_millis(100);
                while Instant::now() + pause < expires {
                    tokio::time::sleep(pause).await;
                    match self.write(&record).await {
                        Ok(true) => {
                            tracing::info!("idempotency key recorded on a retry");
                            return;
                        }
                        Ok(false) => return warn_lease_lost(),
                        Err(_) => pause = (pause * 2).min(Duration::from_secs(2)),
                    }
                }
                tracing::error!(
                    "gave up recording a completed idempotency key: its lease expired; a \
                     duplicate may run again"
                );
            });
        })
    }

    fn release(self: Arc<Self>) -> BoxFuture<'static, Result<bool, StoreError>> {
        Box::pin(async move {
            let timer = self.observer.stopwatch();
            let result = timed(self.timeout, self.store.release(&self.key, &self.claim)).await;
            self.observer
                .store_call(StoreOp::Release, timer, result.is_ok());
            result
        })
    }
}

/// Whether the attempt succeeded, decided once the response is complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Success,
    Failure,
}

impl Verdict {
    /// The verdict of a gRPC response from its final `grpc-status` (trailers, or the headers of
    /// a trailers-only response): success only for `0`.
    pub(crate) fn grpc(headers: Option<&HeaderMap>) -> Option<Verdict> {
        let status = headers?.get("grpc-status")?;
        Some(if status == "0" {
            Verdict::Success
        } else {
            Verdict::Failure
        })
    }
}

/// A store call that is finished on a spawned task if it is dropped before it finished.
struct FinishOnDrop<T: Send + 'static>(Option<BoxFuture<'static, T>>);

impl<T: Send + 'static> Future for FinishOnDrop<T> {
    type Output = T;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<T> {
        let fut = self
            .0
            .as_mut()
            .expect("FinishOnDrop polled after completion");
        let output = std::task::ready!(fut.as_mut().poll(cx));
        self.0 = None;
        std::task::Poll::Ready(output)
    }
}

impl<T: Send + 'static> Drop for FinishOnDrop<T> {
    fn drop(&mut self) {
        if let (Some(fut), Ok(handle)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            handle.spawn(fut);
        }
    }
}

/// Whether a completion failed only for want of replica acknowledgements (durable completion).
fn written_but_not_replicated(err: &StoreError) -> bool {
    #[cfg(feature = "redis")]
    {
        use std::error::Error as _;
        err.source()
            .is_some_and(|source| source.is::<crate::store::redis::NotReplicated>())
    }
    #[cfg(not(feature = "redis"))]
    {
        let _ = err;
        false
    }
}

fn warn_lease_lost() {
    tracing::warn!(
        "idempotency lease expired before completion; the key was not recorded \
         (raise the lease above the inner service's duration)"
    );
}

/// An acquired claim. Dropping it unsettled releases it in the background (you cannot `.await`
/// in `Drop`); the lease TTL is the backstop when even that fails.
pub(crate) struct Lease {
    ops: Arc<dyn LeaseOps>,
    claim_fingerprint: crate::fingerprint::Fingerprint,
    /// Success of a gRPC response is decided by `grpc-status` in the trailers.
    grpc: bool,
    armed: bool,
    /// When the lease runs out (about): a failed completion is retried until then.
    expires: Instant,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("grpc", &self.grpc)
            .field("armed", &self.armed)
            .finish_non_exhaustive()
    }
}

impl Lease {
    pub(crate) fn new<St: IdempotencyStore>(
        store: St,
        key: StoreKey,
        claim: Claim,
        expires: Instant,
        retention: Duration,
        timeout: Duration,
        observer: Observer,
    ) -> Self {
        let claim_fingerprint = claim.fingerprint();
        Lease {
            ops: Arc::new(StoreLease {
                observer,
                store,
                key,
                claim,
                retention,
                timeout,
            }),
            claim_fingerprint,
            grpc: false,
            armed: true,
            expires,
        }
    }

    pub(crate) fn set_grpc(&mut self, grpc: bool) {
        self.grpc = grpc;
    }

    pub(crate) fn is_grpc(&self) -> bool {
        self.grpc
    }

    pub(crate) fn fingerprint(&self) -> crate::fingerprint::Fingerprint {
        self.claim_fingerprint
    }

    /// Records the completed key. A store error or a lost lease is logged: the effect has
    /// happened, so the response still goes out. A store error is retried in the background
    /// until the lease runs out (the claim is still ours until then, so a late record is
    /// still the right record).
    pub(crate) async fn complete(mut self, record: Record) {
        self.armed = false;
        // The inner service has succeeded: the record must be written even if this future is
        // dropped from here on (the client disconnected). A store call cut off mid-way would
        // leave the claim to expire with its lease, and the retry would run the effect again.
        FinishOnDrop(Some(self.ops.clone().complete(record, self.expires))).await
    }

    /// Releases the claim so that a retry is processed again.
    pub(crate) async fn release(mut self) {
        self.armed = false;
        if let Err(err) = self.ops.clone().release().await {
            tracing::error!(error = %err, "could not release an idempotency claim; it expires with its lease");
        }
    }

    /// Releases the claim from a spawned task (for synchronous contexts).
    pub(crate) fn release_in_background(self) {
        drop(self);
    }

    /// Settles a streamed response at its end: completes (ack record) on success, releases
    /// otherwise. `trailers` are the response's trailers, if any.
    pub(crate) fn settle(self, trailers: Option<&HeaderMap>) -> BoxFuture<'static, ()> {
        let verdict = if self.grpc {
            Verdict::grpc(trailers).unwrap_or(Verdict::Failure)
        } else {
            Verdict::Success
        };
        Box::pin(async move {
            match verdict {
                Verdict::Success => {
                    let record = Record::ack(self.claim_fingerprint);
                    self.complete(record).await
                }
                Verdict::Failure => self.release().await,
            }
        })
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let release = self.ops.clone().release();
                handle.spawn(async move {
                    if let Err(err) = release.await {
                        tracing::error!(error = %err, "could not release a dropped idempotency claim; it expires with its lease");
                    }
                });
            }
            Err(_) => tracing::warn!(
                "idempotency claim dropped outside a Tokio runtime; it expires with its lease"
            ),
        }
    }
}
