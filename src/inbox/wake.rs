//! Wake-ups: how an idle [`Worker`](super::Worker) learns, without polling the store, that an
//! entry arrived.
//!
//! An inbox **announces** what a worker may take: an enqueue, a retry or a re-queue, with the
//! time the entry is due, and, due now, an ordered entry that became a dead letter (its
//! object's next may go) and a resume; a worker **subscribes** before its first take and, when a take finds
//! nothing, waits for the next announcement instead of asking the store again and again.
//! Announcements cross processes where the store can carry them (Redis `PUBLISH` from the
//! enqueue script, PostgreSQL `NOTIFY` from the enqueue statement); in memory and on SQLite
//! they reach the workers of the process that enqueued. What a worker settles itself (a retry time, the next
//! entry of an object it completed) it tells its own loop. A slow fallback poll covers the
//! rest: a lease that ran out in a crashed process, an announcement lost while a connection was
//! down, an entry enqueued by another process on SQLite.
//!
//! A store of its own announces through an [`Announcer`] and hands out its subscriptions:
//!
//! ```
//! use std::time::SystemTime;
//! use tower_idempotency::inbox::{Announcer, Wakeups};
//!
//! let announcer = Announcer::new();
//! // What `InboxStore::wakeups` returns:
//! let wakeups: Wakeups = announcer.subscribe();
//! // What an enqueue does once its entry is stored:
//! announcer.announce(SystemTime::now());
//! # drop(wakeups);
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, Weak};
use std::time::SystemTime;

use tokio::sync::broadcast;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

/// How many announcements a subscription holds before the oldest are dropped (it then wakes
/// at once: a take finds whatever they announced).
const CAPACITY: usize = 256;

/// Where an inbox announces, in this process, that entries arrived: each announcement is the
/// time its entry is due. Cheap to clone (clones share the subscribers); announcing with no
/// subscriber costs a lock and nothing else.
///
/// The built-in inboxes hold one; a store of your own announces through one what a worker may
/// take (each enqueue and retry at its due time, each re-queue, and now an ordered entry that
/// became a dead letter and a resume) and returns [`subscribe`](Self::subscribe) from
/// [`InboxStore::wakeups`](super::InboxStore::wakeups).
#[derive(Clone)]
pub struct Announcer {
    sender: broadcast::Sender<SystemTime>,
    /// The task that relays another process's announcements (Redis, PostgreSQL), while a
    /// subscription holds it.
    // Used by the stores that relay other processes' announcements (Redis, PostgreSQL).
    #[cfg_attr(
        not(any(feature = "redis", feature = "postgres", feature = "sqlite")),
        allow(dead_code)
    )]
    relay: Arc<Mutex<Weak<Relay>>>,
}

impl fmt::Debug for Announcer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Announcer")
            .field("subscribers", &self.sender.receiver_count())
            .finish()
    }
}

impl Default for Announcer {
    fn default() -> Self {
        Announcer::new()
    }
}

impl Announcer {
    /// An announcer with no subscriber yet.
    pub fn new() -> Self {
        Announcer {
            sender: broadcast::channel(CAPACITY).0,
            relay: Arc::default(),
        }
    }

    /// The announcer of every inbox of this process on `place` (an SQLite database's table),
    /// so that two inboxes built apart on it (one for the route, one for the workers) hear
    /// each other. Announcers no inbox holds any more are forgotten.
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    pub(crate) fn shared(place: String) -> Announcer {
        static SHARED: Mutex<Option<HashMap<String, Announcer>>> = Mutex::new(None);
        let mut shared = SHARED
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let shared = shared.get_or_insert_with(HashMap::new);
        // Held by the map alone: no inbox on its place is left.
        shared.retain(|_, announcer| Arc::strong_count(&announcer.relay) > 1);
        shared.entry(place).or_default().clone()
    }

    /// Announces an entry due at `at` (now or earlier: at once) to every subscription.
    pub fn announce(&self, at: SystemTime) {
        // No subscriber is not an error: nobody waits.
        let _ = self.sender.send(at);
    }

    /// A subscription to what is announced from now on.
    pub fn subscribe(&self) -> Wakeups {
        Wakeups {
            receiver: Some(self.sender.subscribe()),
            _relay: None,
        }
    }

    /// A subscription that also keeps the relay of other processes' announcements running,
    /// started by `start` (a spawned task, or none) when no subscription holds one any more.
    /// Outside a Tokio runtime, where no task can be spawned, a plain subscription.
    #[cfg_attr(
        not(any(feature = "redis", feature = "postgres", feature = "sqlite")),
        allow(dead_code)
    )]
    pub(crate) fn subscribe_relayed(
        &self,
        start: impl FnOnce(Announcer) -> Option<tokio::task::JoinHandle<()>>,
    ) -> Wakeups {
        // Subscribed first: what the relay announces as it starts is heard.
        let receiver = self.sender.subscribe();
        if tokio::runtime::Handle::try_current().is_err() {
            return Wakeups {
                receiver: Some(receiver),
                _relay: None,
            };
        }
        let mut held = self
            .relay
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let relay = match held.upgrade() {
            Some(relay) => relay,
            None => {
                let relay = Arc::new(Relay(start(self.clone())));
                *held = Arc::downgrade(&relay);
                relay
            }
        };
        Wakeups {
            receiver: Some(receiver),
            _relay: Some(relay),
        }
    }
}

/// The relay task, aborted with its last subscription.
struct Relay(Option<tokio::task::JoinHandle<()>>);

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

/// A subscription to an inbox's announcements ([`Announcer::subscribe`]): what a
/// [`Worker`](super::Worker) waits on when it is idle. A store that announces nothing keeps
/// [`InboxStore::wakeups`](super::InboxStore::wakeups)' default, and the worker polls; a store
/// that wraps another returns the inner store's.
pub struct Wakeups {
    receiver: Option<broadcast::Receiver<SystemTime>>,
    _relay: Option<Arc<Relay>>,
}

impl fmt::Debug for Wakeups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wakeups")
            .field("announced", &self.is_announced())
            .finish()
    }
}

impl Wakeups {
    /// No announcements: a worker on such a store polls at its poll interval.
    pub(crate) fn none() -> Self {
        Wakeups {
            receiver: None,
            _relay: None,
        }
    }

    /// Whether the store announces (else the worker polls).
    pub(crate) fn is_announced(&self) -> bool {
        self.receiver.is_some()
    }

    /// The next announcement's due time. Announcements dropped because this subscription fell
    /// behind come back as one due at the epoch (take now). Never resolves without a store that
    /// announces, or once every announcer is gone.
    pub(crate) async fn next(&mut self) -> Option<SystemTime> {
        let Some(receiver) = &mut self.receiver else {
            return std::future::pending().await;
        };
        match receiver.recv().await {
            Ok(at) => Some(at),
            Err(RecvError::Lagged(_)) => Some(SystemTime::UNIX_EPOCH),
            Err(RecvError::Closed) => {
                self.receiver = None;
                std::future::pending().await
            }
        }
    }

    /// The announcement already there, if any (as [`next`](Self::next), without waiting).
    pub(crate) fn try_next(&mut self) -> Option<SystemTime> {
        match self.receiver.as_mut()?.try_recv() {
            Ok(at) => Some(at),
            Err(TryRecvError::Lagged(_)) => Some(SystemTime::UNIX_EPOCH),
            Err(TryRecvError::Empty | TryRecvError::Closed) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_subscription_hears_what_is_announced_after_it() {
        let announcer = Announcer::new();
        announcer.announce(SystemTime::UNIX_EPOCH + Duration::from_secs(1));
        let mut wakeups = announcer.subscribe();
        assert_eq!(wakeups.try_next(), None, "not what came before it");
        let at = SystemTime::now();
        announcer.clone().announce(at);
        assert_eq!(wakeups.next().await, Some(at));
    }

    #[tokio::test]
    async fn a_subscription_hears_an_announcement() {
        let announcer = Announcer::new();
        let mut wakeups = announcer.subscribe();
        let at = SystemTime::now();
        announcer.announce(at);
        assert_eq!(wakeups.next().await, Some(at));
    }

    #[tokio::test]
    async fn a_subscription_that_fell_behind_wakes_at_once() {
        let announcer = Announcer::new();
        let mut wakeups = announcer.subscribe();
        for _ in 0..CAPACITY + 1 {
            announcer.announce(SystemTime::now() + Duration::from_secs(60));
        }
        assert_eq!(wakeups.try_next(), Some(SystemTime::UNIX_EPOCH));
    }

    #[tokio::test]
    async fn the_relay_runs_while_a_subscription_holds_it() {
        let announcer = Announcer::new();
        let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let start = |announcer: Announcer| {
            started.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Some(tokio::spawn(async move {
                announcer.announce(SystemTime::UNIX_EPOCH);
                std::future::pending::<()>().await
            }))
        };
        let mut first = announcer.subscribe_relayed(start);
        let second = announcer.subscribe_relayed(start);
        assert_eq!(
            started.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "one relay"
        );
        assert_eq!(first.next().await, Some(SystemTime::UNIX_EPOCH));
        drop((first, second));
        let _third = announcer.subscribe_relayed(start);
        assert_eq!(
            started.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "started again"
        );
        assert!(!Wakeups::none().is_announced());
    }
}
