//! [`Completions`]: a worker's completions, sent to the store in batches.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::store::InboxStore;
use crate::store::{StoreError, StoreErrorKind, StoreKey, Token};

/// The most completions one batch carries: a Redis batch is one script, which holds the server
/// while it runs.
const MAX_BATCH: usize = 128;

/// What a completion became; one error is shared by every completion of its batch.
pub(super) type Completed = Result<bool, Arc<StoreError>>;

type Request = (StoreKey, Token, oneshot::Sender<Completed>);

/// Hands a worker's completions to one task that sends them to the store with
/// [`complete_many`](InboxStore::complete_many): the first one alone, then those that gathered
/// while the previous batch was in flight. An idle worker's completion waits for nothing, a
/// busy one's for one round trip at most, and a store that completes a batch in one round trip
/// (Redis) makes one for many entries.
#[derive(Clone)]
pub(super) struct Completions {
    queue: mpsc::UnboundedSender<Request>,
}

impl Completions {
    /// The handle, and the task that completes: it ends once every handle is dropped and every
    /// completion sent was answered.
    pub(super) fn new<St: InboxStore>(
        store: Arc<St>,
        retention: Duration,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let (queue, requests) = mpsc::unbounded_channel();
        (Completions { queue }, complete(store, retention, requests))
    }

    /// Completes `key`'s entry held by `token`, with the completions sent meanwhile.
    pub(super) async fn complete(&self, key: StoreKey, token: Token) -> Completed {
        let (reply, answer) = oneshot::channel();
        self.queue.send((key, token, reply)).map_err(|_| ended())?;
        answer.await.unwrap_or_else(|_| Err(ended()))
    }
}

/// The task: one `complete_many` at a time, of everything that waits (up to [`MAX_BATCH`]).
async fn complete<St: InboxStore>(
    store: Arc<St>,
    retention: Duration,
    mut requests: mpsc::UnboundedReceiver<Request>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while requests.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let (leases, replies): (Vec<_>, Vec<_>) = batch
            .drain(..)
            .map(|(key, token, reply)| ((key, token), reply))
            .unzip();
        match store.complete_many(&leases, retention).await {
            // A store that answers fewer flags leaves the rest unanswered: an error for them.
            Ok(flags) => {
                for (reply, flag) in replies.into_iter().zip(flags) {
                    let _ = reply.send(Ok(flag));
                }
            }
            Err(error) => {
                let error = Arc::new(error);
                for reply in replies {
                    let _ = reply.send(Err(error.clone()));
                }
            }
        }
    }
}

/// The completing task is gone (the worker's run was dropped): nothing was completed.
fn ended() -> Arc<StoreError> {
    Arc::new(StoreError::with_source(
        StoreErrorKind::Other,
        "the worker's completions ended",
    ))
}
