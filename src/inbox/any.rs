//! [`AnyInbox`]: the inbox on whichever backend an [`AnyStore`] was connected to.

use std::time::Duration;

use super::admin::DeadLetter;
use super::admin::{EntryInfo, Filter, InboxAdmin, Page, Requeued};
use super::entry::{InboxEntry, Lease};
use super::memory::MemoryInbox;
use super::store::{Enqueued, Failure, InboxCounts, InboxStore};
use super::wake::Wakeups;
use crate::store::{AnyStore, StoreError, StoreKey, Token};

crate::util::run_time_backends!(
    /// An inbox chosen at run time, as [`AnyStore`] is a store chosen at run time: a
    /// [`MemoryInbox`], a `RedisInbox`, a `PostgresInbox` or a `SqliteInbox` behind one type,
    /// so that a service configured by a URL names one inbox type whatever the backend.
    ///
    /// [`AnyInbox::on`] builds it on a store's own connections (the Redis client, the SQL
    /// pool): the records and the entries live in one place, and an exclusively locked SQLite
    /// file works with both.
    ///
    /// ```
    /// use tower_idempotency::inbox::{AnyInbox, InboxStore};
    /// use tower_idempotency::store::connect;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let store = connect("memory:").await.unwrap();
    /// let inbox = AnyInbox::on(&store, "email").await.unwrap();
    /// assert_eq!(inbox.backend(), "memory");
    /// assert_eq!(inbox.counts().await.unwrap().pending, 0);
    /// # });
    /// ```
    ///
    /// Match it to reach the backend's own inbox: a `PostgresInbox` or `SqliteInbox` for
    /// [`complete_in_tx`](super::SqlInbox::complete_in_tx) in a handler's transaction.
    AnyInbox {
        memory: MemoryInbox,
        redis: crate::redis::inbox::RedisInbox,
        postgres: crate::sql::inbox::PostgresInbox,
        sqlite: crate::sql::inbox::SqliteInbox,
    }
);

impl AnyInbox {
    /// The inbox on `store`'s backend and connections: a `RedisInbox` named `name` on its
    /// client, [durable](super::RedisInbox::durable) when the store's completion is; a `PostgresInbox` or `SqliteInbox` on its pool, in the table `name` (created
    /// by [`migrate`](super::SqlInbox::migrate) here); a [`MemoryInbox`] of the default
    /// capacity for a memory store. An error when the table cannot be created, or `name` is
    /// not a valid table name on SQL.
    #[cfg_attr(
        not(any(feature = "redis", feature = "sqlite", feature = "postgres")),
        allow(unused_variables)
    )]
    pub async fn on(store: &AnyStore, name: &str) -> Result<Self, StoreError> {
        #[cfg(feature = "redis")]
        if let AnyStore::Redis(redis) = store {
            let mut inbox = crate::redis::inbox::RedisInbox::new(redis.client().clone(), name);
            // The store's durable completion covers the inbox's writes as well.
            if let Some((replicas, timeout)) = redis.durability() {
                inbox = inbox.durable(replicas, timeout);
            }
            return Ok(inbox.into());
        }
        #[cfg(feature = "postgres")]
        if let AnyStore::Postgres(postgres) = store {
            let inbox =
                crate::sql::inbox::PostgresInbox::migrated_on(postgres.pool(), name).await?;
            return Ok(inbox.into());
        }
        #[cfg(feature = "sqlite")]
        if let AnyStore::Sqlite(sqlite) = store {
            let inbox = crate::sql::inbox::SqliteInbox::migrated_on(sqlite.pool(), name).await?;
            return Ok(inbox.into());
        }
        Ok(MemoryInbox::default().into())
    }

    /// The backend's name: `memory`, `redis`, `postgres` or `sqlite`.
    pub fn backend(&self) -> &'static str {
        self.name()
    }
}

/// Forwards a call to the backend's inbox.
macro_rules! dispatch {
    ($self:expr, $inbox:ident => $call:expr) => {
        match $self {
            AnyInbox::Memory($inbox) => $call,
            #[cfg(feature = "redis")]
            AnyInbox::Redis($inbox) => $call,
            #[cfg(feature = "postgres")]
            AnyInbox::Postgres($inbox) => $call,
            #[cfg(feature = "sqlite")]
            AnyInbox::Sqlite($inbox) => $call,
        }
    };
}

/// Every call goes to the backend's inbox.
impl InboxStore for AnyInbox {
    async fn enqueue(&self, entry: InboxEntry) -> Result<Enqueued, StoreError> {
        dispatch!(self, inbox => inbox.enqueue(entry).await)
    }

    async fn take(&self, max: usize, lease: Duration) -> Result<Vec<Lease>, StoreError> {
        dispatch!(self, inbox => inbox.take(max, lease).await)
    }

    async fn renew(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        dispatch!(self, inbox => inbox.renew(key, token, lease).await)
    }

    async fn complete(
        &self,
        leases: &[(StoreKey, Token)],
        retention: Duration,
    ) -> Result<Vec<bool>, StoreError> {
        dispatch!(self, inbox => inbox.complete(leases, retention).await)
    }

    async fn fail(
        &self,
        key: &StoreKey,
        token: &Token,
        failure: Failure,
    ) -> Result<bool, StoreError> {
        dispatch!(self, inbox => inbox.fail(key, token, failure).await)
    }

    async fn counts(&self) -> Result<InboxCounts, StoreError> {
        dispatch!(self, inbox => inbox.counts().await)
    }

    fn wakeups(&self) -> Wakeups {
        dispatch!(self, inbox => inbox.wakeups())
    }
}

/// Every call goes to the backend's inbox.
impl InboxAdmin for AnyInbox {
    async fn find(&self, key: &StoreKey) -> Result<Option<EntryInfo>, StoreError> {
        dispatch!(self, inbox => inbox.find(key).await)
    }

    async fn list(
        &self,
        filter: &Filter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        dispatch!(self, inbox => inbox.list(filter, cursor, limit).await)
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        dispatch!(self, inbox => inbox.dead_letters(limit).await)
    }

    async fn requeue(&self, key: &StoreKey) -> Result<bool, StoreError> {
        dispatch!(self, inbox => inbox.requeue(key).await)
    }

    async fn requeue_matching(
        &self,
        filter: &Filter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Requeued, StoreError> {
        dispatch!(self, inbox => inbox.requeue_matching(filter, cursor, limit).await)
    }

    async fn discard(&self, key: &StoreKey, retention: Duration) -> Result<bool, StoreError> {
        dispatch!(self, inbox => inbox.discard(key, retention).await)
    }

    async fn pause(&self) -> Result<(), StoreError> {
        dispatch!(self, inbox => inbox.pause().await)
    }

    async fn resume(&self) -> Result<(), StoreError> {
        dispatch!(self, inbox => inbox.resume().await)
    }

    async fn is_paused(&self) -> Result<bool, StoreError> {
        dispatch!(self, inbox => inbox.is_paused().await)
    }
}
