//! [`Completions`]: a worker's completions, sent to the store in batches.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::join_all;
use tokio::sync::{mpsc, oneshot};

use super::store::InboxStore;
use crate::store::{StoreError, StoreErrorKind, StoreKey, Token};

/// The most completions one batch carries: a Redis batch is one script, which holds the server
/// while it runs.
const MAX_BATCH: usize = 128;

type Request = (StoreKey, Token, oneshot::Sender<Result<bool, StoreError>>);

/// Hands a worker's completions to one task that sends them to the store with
/// [`complete`](InboxStore::complete): the first one alone, then those that gathered
/// while the previous batch was in flight. An idle worker's completion waits for nothing, a
/// busy one's for the batch in flight and its own, and a store that completes a batch in one
/// round trip (Redis) makes one for many entries.
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
    pub(super) async fn complete(&self, key: StoreKey, token: Token) -> Result<bool, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.queue.send((key, token, reply)).map_err(|_| ended())?;
        answer.await.unwrap_or_else(|_| Err(ended()))
    }
}

/// The task: one batch at a time, of everything that waits (up to [`MAX_BATCH`]).
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
        let answers = complete_batch(&*store, &leases, retention).await;
        for (reply, answer) in replies.into_iter().zip(answers) {
            let _ = reply.send(answer);
        }
    }
}

/// One answer per lease. A batch that fails as a whole (one lease's failure, one partition's,
/// a panic, a store that answers another number of flags) is completed again lease by lease,
/// so that one failure fails only its own lease (`complete` changes nothing for a lease it
/// already completed: one that the failed batch did complete answers `false` then, and is
/// logged as lost).
async fn complete_batch<St: InboxStore>(
    store: &St,
    leases: &[(StoreKey, Token)],
    retention: Duration,
) -> Vec<Result<bool, StoreError>> {
    let whole = guarded(store.complete(leases, retention)).await;
    match whole {
        Ok(flags) if flags.len() == leases.len() => return flags.into_iter().map(Ok).collect(),
        Ok(_) => tracing::warn!("inbox: complete answered another number of flags"),
        Err(error) if leases.len() == 1 => return vec![Err(error)],
        Err(error) => tracing::warn!(
            %error,
            leases = leases.len(),
            "inbox: a batch of completions failed; completing lease by lease (one the batch did \
             complete is then reported lost)"
        ),
    }
    let each = leases.iter().map(|lease| async move {
        let flags = guarded(store.complete(std::slice::from_ref(lease), retention)).await?;
        match flags[..] {
            [done] => Ok(done),
            _ => Err(StoreError::with_source(
                StoreErrorKind::Other,
                "the store answered another number of flags than one completion",
            )),
        }
    });
    join_all(each).await
}

/// A store call whose panic is an error (the task outlives a store that panics).
async fn guarded<T>(call: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
    AssertUnwindSafe(call)
        .catch_unwind()
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::with_source(
                StoreErrorKind::Other,
                "the store panicked while completing",
            ))
        })
}

/// The completing task is gone (the worker's run was dropped): nothing was completed.
fn ended() -> StoreError {
    StoreError::with_source(StoreErrorKind::Other, "the worker's completions ended")
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::inbox::{Enqueued, Failure, InboxCounts, InboxEntry, Lease, MemoryInbox};

    const RETENTION: Duration = Duration::from_secs(60);

    /// A memory inbox whose `complete` of more than one lease fails, or panics.
    struct Brittle {
        inner: MemoryInbox,
        panics: bool,
    }

    impl InboxStore for Brittle {
        async fn enqueue(&self, entry: InboxEntry) -> Result<Enqueued, StoreError> {
            self.inner.enqueue(entry).await
        }
        async fn take(&self, max: usize, lease: Duration) -> Result<Vec<Lease>, StoreError> {
            self.inner.take(max, lease).await
        }
        async fn renew(&self, k: &StoreKey, t: &Token, d: Duration) -> Result<bool, StoreError> {
            self.inner.renew(k, t, d).await
        }
        async fn complete(
            &self,
            leases: &[(StoreKey, Token)],
            retention: Duration,
        ) -> Result<Vec<bool>, StoreError> {
            match leases.len() {
                0 | 1 => self.inner.complete(leases, retention).await,
                _ if self.panics => panic!("a store's bug"),
                _ => Err(StoreError::new(StoreErrorKind::Unavailable)),
            }
        }
        async fn fail(&self, k: &StoreKey, t: &Token, f: Failure) -> Result<bool, StoreError> {
            self.inner.fail(k, t, f).await
        }
        async fn counts(&self) -> Result<InboxCounts, StoreError> {
            self.inner.counts().await
        }
    }

    /// Three leases taken, the second's token forged.
    async fn leases(store: &Brittle) -> Vec<(StoreKey, Token)> {
        for n in 0..3 {
            let key = StoreKey::new("completions", None, &format!("evt{n}"));
            let entry = InboxEntry::new(key, Bytes::from_static(b"{}"), "corr");
            store.enqueue(entry).await.unwrap();
        }
        let taken = store.take(3, RETENTION).await.unwrap();
        let mut leases: Vec<_> = taken
            .into_iter()
            .map(|lease| (lease.entry.key, lease.token))
            .collect();
        leases[1].1 = Token::random();
        leases
    }

    /// A batch that fails or panics as a whole is completed lease by lease: each gets its own
    /// answer, and the task lives on.
    #[tokio::test]
    async fn a_failed_batch_is_completed_lease_by_lease() {
        for panics in [false, true] {
            let store = Brittle {
                inner: MemoryInbox::new(100),
                panics,
            };
            let leases = leases(&store).await;
            let answers = complete_batch(&store, &leases, RETENTION).await;
            let flags: Vec<_> = answers.into_iter().map(Result::unwrap).collect();
            assert_eq!(flags, [true, false, true], "panics: {panics}");
            let counts = store.counts().await.unwrap();
            assert_eq!(counts.in_flight, 1, "the forged one's entry is still held");
        }
    }

    /// Through the task: completions sent at once are all answered, even from a batch that
    /// panicked, and the task ends once its handles are dropped.
    #[tokio::test]
    async fn the_task_answers_every_completion_and_ends() {
        let store = Arc::new(Brittle {
            inner: MemoryInbox::new(100),
            panics: true,
        });
        let leases = leases(&store).await;
        let (completions, task) = Completions::new(store.clone(), RETENTION);
        let task = tokio::spawn(task);
        let sent = leases
            .iter()
            .map(|(key, token)| completions.complete(key.clone(), *token));
        let flags: Vec<_> = join_all(sent)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(flags, [true, false, true]);
        drop(completions);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the task ends")
            .unwrap();
    }
}
