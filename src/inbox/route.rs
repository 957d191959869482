//! `InboxRoute`: what a layer in inbox mode needs (the inbox, the correlation header, the
//! kept headers, the first delivery's answer), with the inbox's type erased.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use http::{HeaderName, HeaderValue, StatusCode};

use super::entry::InboxEntry;
use super::store::{Enqueued, InboxStore};
use crate::http::config::AckResponse;
use crate::store::StoreError;

/// `Idempotency-Correlation-Id`: the header of an inbox route's acknowledgement that relates
/// the delivery to the worker's run (and to its logs).
pub const IDEMPOTENCY_CORRELATION_ID: HeaderName =
    HeaderName::from_static("idempotency-correlation-id");

type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The one store call of an inbox route, erased (boxed once per request).
trait Enqueue: Send + Sync + 'static {
    fn enqueue(&self, entry: InboxEntry) -> Boxed<'_, Result<Enqueued, StoreError>>;
}

impl<St: InboxStore> Enqueue for St {
    fn enqueue(&self, entry: InboxEntry) -> Boxed<'_, Result<Enqueued, StoreError>> {
        Box::pin(InboxStore::enqueue(self, entry))
    }
}

/// The inbox mode of a route ([`InboxLayer`](super::InboxLayer)): the inbox, the correlation
/// header, the kept headers and the first delivery's answer.
#[derive(Clone)]
pub(crate) struct InboxRoute {
    store: Arc<dyn Enqueue>,
    pub(crate) correlation_header: HeaderName,
    pub(crate) keep_headers: Vec<HeaderName>,
    pub(crate) accepted: AckResponse,
}

impl InboxRoute {
    /// Inbox mode on `inbox`: correlation id from `X-Request-Id` (else generated), no headers
    /// kept, first deliveries answered `202 {"ok":true,"queued":true}`.
    pub(crate) fn new(inbox: impl InboxStore) -> Self {
        InboxRoute {
            store: Arc::new(inbox),
            correlation_header: HeaderName::from_static("x-request-id"),
            keep_headers: Vec::new(),
            accepted: AckResponse::new(
                StatusCode::ACCEPTED,
                HeaderValue::from_static("application/json"),
                &br#"{"ok":true,"queued":true}"#[..],
            ),
        }
    }

    pub(crate) fn enqueue(&self, entry: InboxEntry) -> Boxed<'_, Result<Enqueued, StoreError>> {
        self.store.enqueue(entry)
    }
}

impl fmt::Debug for InboxRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InboxRoute")
            .field("correlation_header", &self.correlation_header)
            .field("keep_headers", &self.keep_headers)
            .finish_non_exhaustive()
    }
}
