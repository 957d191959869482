//! The relay of a [`RedisInbox`](crate::inbox::RedisInbox)'s announcements: one subscriber connection
//! per process that hears every process's enqueues (`PUBLISH` from the enqueue script) and
//! announces them to this process's idle workers.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::broadcast::error::RecvError;

use fred::clients::SubscriberClient;
use fred::interfaces::{ClientLike, EventInterface, PubsubInterface};
use fred::types::Builder;
use futures_util::future::{Either, select};

use crate::claim::backoff::Backoff;
use crate::inbox::wake::Announcer;

/// How long the relay waits before it tries to connect or subscribe again the first time;
/// doubled at each failure in a row, up to [`MAX_RETRY`] (a user whose ACL denies `SUBSCRIBE`
/// is told so in the log a few times, not every second).
const RETRY: Duration = Duration::from_secs(1);

/// The longest wait between two tries.
const MAX_RETRY: Duration = Duration::from_secs(60);

/// Relays the messages of `channels` to `announcer`, on a subscriber connection made like
/// `client`'s (same servers, same reconnection policy), resubscribed after every reconnection.
/// Runs until aborted; the connection is closed then.
pub(super) async fn relay<C: ClientLike>(client: C, channels: Vec<String>, announcer: Announcer) {
    let mut builder = Builder::from_config(client.client_config());
    let connection = client.connection_config().clone();
    let performance = client.perf_config();
    builder
        .with_connection_config(|config| *config = connection)
        .with_performance_config(|config| *config = performance);
    if let Some(policy) = client.client_reconnect_policy() {
        builder.set_policy(policy);
    }
    // The client's own connections are left alone: a subscriber can send nothing else.
    drop(client);
    let subscriber = match builder.build_subscriber_client() {
        Ok(subscriber) => Subscriber(subscriber),
        Err(error) => {
            tracing::warn!(%error, "inbox: no subscriber for enqueues; polling");
            return;
        }
    };
    subscriber.listen(&channels, &announcer).await;
}

/// The subscriber, closed when the relay ends (aborted with the last subscription).
struct Subscriber(SubscriberClient);

impl Drop for Subscriber {
    fn drop(&mut self) {
        let client = self.0.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = client.quit().await;
            });
        }
    }
}

impl Subscriber {
    async fn listen(&self, channels: &[String], announcer: &Announcer) {
        let client = &self.0;
        let mut retry = Backoff::new(RETRY, MAX_RETRY);
        while let Err(error) = client.init().await {
            tracing::warn!(%error, "inbox: the subscriber for enqueues cannot connect; polling");
            retry.wait().await;
        }
        // Resubscribes after a reconnection (and ends with the client).
        let _resubscribing = client.manage_subscriptions();
        let (mut messages, mut reconnects) = (client.message_rx(), client.reconnect_rx());
        let mut retry = Backoff::new(RETRY, MAX_RETRY);
        while let Err(error) = client.subscribe(channels.to_vec()).await {
            tracing::warn!(%error, "inbox: subscribing to enqueues failed; polling");
            retry.wait().await;
        }
        // Listening now: what was enqueued before may have gone unheard.
        announcer.announce(UNIX_EPOCH);
        loop {
            let at = match pin_select(messages.recv(), reconnects.recv()).await {
                Either::Left(Ok(message)) => due_at(&message.value),
                Either::Left(Err(RecvError::Closed)) | Either::Right(Err(RecvError::Closed)) => {
                    return;
                }
                Either::Left(Err(RecvError::Lagged(_))) => UNIX_EPOCH,
                // Reconnected: messages may have been missed. Subscribed again first (fred's
                // resubscription runs on its own; a second SUBSCRIBE changes nothing), so that
                // the take this announcement starts is followed by heard enqueues: an enqueue
                // in between, its wake-up lost, would leave Redis's `idle` mark spent.
                Either::Right(Ok(_) | Err(RecvError::Lagged(_))) => {
                    if let Err(error) = client.subscribe(channels.to_vec()).await {
                        tracing::warn!(%error, "inbox: subscribing again to enqueues failed");
                    }
                    UNIX_EPOCH
                }
            };
            announcer.announce(at);
        }
    }
}

/// The due time a message's text gives, in microseconds since the epoch (the epoch, to take
/// at once, when it is not one).
fn due_at(value: &fred::types::Value) -> SystemTime {
    value
        .as_string()
        .and_then(|micros| micros.parse::<u64>().ok())
        .map_or(UNIX_EPOCH, |micros| {
            UNIX_EPOCH + Duration::from_micros(micros)
        })
}

async fn pin_select<A: std::future::Future, B: std::future::Future>(
    a: A,
    b: B,
) -> Either<A::Output, B::Output> {
    match select(std::pin::pin!(a), std::pin::pin!(b)).await {
        Either::Left((a, _)) => Either::Left(a),
        Either::Right((b, _)) => Either::Right(b),
    }
}
