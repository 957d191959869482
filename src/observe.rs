//! What operators see: one `tracing` span per covered request, outcome events at the right
//! levels, metrics through the `metrics` facade (feature `metrics`), and an optional hook.
//!
//! Nothing here ever logs a body, a raw key or an owner token: the key appears only as its
//! store key (`ti:<hash>`), a SHA-256 prefix that cannot be reversed.
//!
//! # Metrics (feature `metrics`)
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `idempotency_requests_total` | counter | `namespace`, `outcome`, `reason` | one per covered request, by [`Outcome`] (`reason` is the rejection code, or `none`) |
//! | `idempotency_store_duration_seconds` | histogram | `namespace`, `operation` | latency of `reserve`, `complete`, `release` |
//! | `idempotency_store_errors_total` | counter | `namespace`, `operation` | failed store calls (including timeouts) |
//! | `idempotency_inner_duration_seconds` | histogram | `namespace` | time the inner service took to answer |
//!
//! ```
//! use tower_idempotency::{IdempotencyLayer, MemoryStore, OutcomeEvent};
//!
//! let layer = IdempotencyLayer::new(MemoryStore::new())
//!     .namespace("kalipto")
//!     .on_outcome(|event: &OutcomeEvent<'_>| {
//!         if event.outcome.as_str() == "store_error" {
//!             eprintln!("{} store error after {:?}", event.namespace, event.elapsed);
//!         }
//!     });
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

use crate::outcome::Outcome;

/// What the outcome hook receives, once per covered request.
#[derive(Debug)]
#[non_exhaustive]
pub struct OutcomeEvent<'a> {
    /// The layer's namespace.
    pub namespace: &'a str,
    /// What the layer did.
    pub outcome: Outcome,
    /// The status sent (for gRPC, the HTTP status: see `grpc-status` in the response).
    pub status: Option<StatusCode>,
    /// Time from the call to the response head.
    pub elapsed: Duration,
}

type Hook = Arc<dyn Fn(&OutcomeEvent<'_>) + Send + Sync>;

/// The observability settings of one layer.
#[derive(Clone)]
pub(crate) struct Observer {
    namespace: Arc<str>,
    hook: Option<Hook>,
}

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observer")
            .field("namespace", &self.namespace)
            .field("hook", &self.hook.is_some())
            .finish()
    }
}

/// A store operation, as labelled in metrics.
#[derive(Clone, Copy, Debug)]
pub(crate) enum StoreOp {
    Reserve,
    Complete,
    Release,
}

impl StoreOp {
    fn as_str(self) -> &'static str {
        match self {
            StoreOp::Reserve => "reserve",
            StoreOp::Complete => "complete",
            StoreOp::Release => "release",
        }
    }
}

impl Observer {
    pub(crate) fn new(namespace: &str) -> Self {
        Observer {
            namespace: namespace.into(),
            hook: None,
        }
    }

    pub(crate) fn set_namespace(&mut self, namespace: &str) {
        self.namespace = namespace.into();
    }

    pub(crate) fn namespace(&self) -> &str {
        &self.namespace
    }

    pub(crate) fn set_hook(&mut self, hook: Hook) {
        self.hook = Some(hook);
    }

    /// The span of one covered request. Fields are filled in as the request progresses.
    pub(crate) fn span(&self, method: &http::Method) -> tracing::Span {
        tracing::info_span!(
            "idempotency",
            namespace = %self.namespace,
            method = %method,
            key = tracing::field::Empty,
            outcome = tracing::field::Empty,
            store_ms = tracing::field::Empty,
        )
    }

    /// Records the outcome of one covered request: span field, event, metric, hook.
    pub(crate) fn outcome(&self, outcome: Outcome, status: Option<StatusCode>, elapsed: Duration) {
        let span = tracing::Span::current();
        span.record("outcome", outcome.as_str());
        let reason = match outcome {
            Outcome::Rejected(reason) => reason,
            _ => "none",
        };
        let status_code = status.map(|s| s.as_u16());
        match outcome {
            Outcome::StoreError | Outcome::FailOpen => tracing::error!(
                outcome = outcome.as_str(),
                status = status_code,
                "idempotency store unavailable"
            ),
            Outcome::Mismatch => tracing::warn!(
                outcome = outcome.as_str(),
                status = status_code,
                "idempotency key reused with a different payload"
            ),
            Outcome::Replayed | Outcome::InFlight | Outcome::Released => tracing::info!(
                outcome = outcome.as_str(),
                status = status_code,
                "idempotency outcome"
            ),
            _ => tracing::debug!(
                outcome = outcome.as_str(),
                reason,
                status = status_code,
                "idempotency outcome"
            ),
        }
        #[cfg(feature = "metrics")]
        metrics::counter!(
            "idempotency_requests_total",
            "namespace" => self.namespace.clone(),
            "outcome" => outcome.as_str(),
            "reason" => reason,
        )
        .increment(1);
        if let Some(hook) = &self.hook {
            hook(&OutcomeEvent {
                namespace: &self.namespace,
                outcome,
                status,
                elapsed,
            });
        }
    }

    /// Records the latency (and failure) of one store call.
    pub(crate) fn store_call(&self, op: StoreOp, elapsed: Duration, ok: bool) {
        if matches!(op, StoreOp::Reserve) {
            tracing::Span::current().record("store_ms", elapsed.as_secs_f64() * 1e3);
        }
        tracing::trace!(
            operation = op.as_str(),
            ?elapsed,
            ok,
            "idempotency store call"
        );
        #[cfg(feature = "metrics")]
        {
            metrics::histogram!(
                "idempotency_store_duration_seconds",
                "namespace" => self.namespace.clone(),
                "operation" => op.as_str(),
            )
            .record(elapsed.as_secs_f64());
            if !ok {
                metrics::counter!(
                    "idempotency_store_errors_total",
                    "namespace" => self.namespace.clone(),
                    "operation" => op.as_str(),
                )
                .increment(1);
            }
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (op, elapsed, ok);
    }

    /// Records how long the inner service took to answer.
    pub(crate) fn inner_duration(&self, elapsed: Duration) {
        #[cfg(feature = "metrics")]
        metrics::histogram!(
            "idempotency_inner_duration_seconds",
            "namespace" => self.namespace.clone(),
        )
        .record(elapsed.as_secs_f64());
        #[cfg(not(feature = "metrics"))]
        let _ = elapsed;
    }
}
