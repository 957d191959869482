//! The in-flight claim of one request, from the moment it is acquired until it is completed or
//! released, whatever happens in between (non-success, `Err`, panic, dropped future, a response
//! body that fails or is dropped).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use http::HeaderMap;

use crate::observe::{Observer, StoreOp};
use crate::record::Record;
use crate::store::{Claim, IdempotencyStore, StoreError, StoreErrorKind, StoreKey};

/// Runs `fut` under the store timeout.
pub(crate) async fn timed<T>(
    timeout: Duration,
    fut: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::new(StoreErrorKind::Timeout)),
    }
}

/// The store operations of one claim, with the store type erased so that futures and bodies do
/// not carry it.
trait LeaseOps: Send + Sync + 'static {
    fn complete(&self, record: Record) -> BoxFuture<'static, Result<bool, StoreError>>;
    fn release(&self) -> BoxFuture<'static, Result<bool, StoreError>>;
}

struct StoreLease<St> {
    observer: Observer,
    store: St,
    key: StoreKey,
    claim: Claim,
    retention: Duration,
    timeout: Duration,
}

impl<St: IdempotencyStore> LeaseOps for StoreLease<St> {
    fn complete(&self, record: Record) -> BoxFuture<'static, Result<bool, StoreError>> {
        let (store, key, claim) = (self.store.clone(), self.key.clone(), self.claim.clone());
        let (retention, timeout) = (self.retention, self.timeout);
        let observer = self.observer.clone();
        Box::pin(async move {
            let started = Instant::now();
            let result = timed(timeout, store.complete(&key, &claim, &record, retention)).await;
            observer.store_call(StoreOp::Complete, started.elapsed(), result.is_ok());
            result
        })
    }

    fn release(&self) -> BoxFuture<'static, Result<bool, StoreError>> {
        let (store, key, claim) = (self.store.clone(), self.key.clone(), self.claim.clone());
        let timeout = self.timeout;
        let observer = self.observer.clone();
        Box::pin(async move {
            let started = Instant::now();
            let result = timed(timeout, store.release(&key, &claim)).await;
            observer.store_call(StoreOp::Release, started.elapsed(), result.is_ok());
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

/// An acquired claim. Dropping it unsettled releases it in the background (you cannot `.await`
/// in `Drop`); the lease TTL is the backstop when even that fails.
pub(crate) struct Lease {
    ops: Arc<dyn LeaseOps>,
    claim_fingerprint: crate::fingerprint::Fingerprint,
    /// Success of a gRPC response is decided by `grpc-status` in the trailers.
    grpc: bool,
    armed: bool,
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
    /// happened, so the response still goes out.
    pub(crate) async fn complete(mut self, record: Record) {
        self.armed = false;
        match self.ops.complete(record).await {
            Ok(true) => {}
            Ok(false) => tracing::warn!(
                "idempotency lease expired before completion; the key was not recorded \
                 (raise the lease above the inner service's duration)"
            ),
            Err(err) => {
                tracing::error!(error = %err, "could not record a completed idempotency key")
            }
        }
    }

    /// Releases the claim so that a retry is processed again.
    pub(crate) async fn release(mut self) {
        self.armed = false;
        if let Err(err) = self.ops.release().await {
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
                let release = self.ops.release();
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
