//! [`Idempotent::once_in_tx`]: `once` whose record joins the closure's SQL transaction
//! (features `postgres`, `sqlite`), so that the effect and the record commit together.
//!
//! The claim is taken as for [`once`](Idempotent::once) (the one claim guard: atomic reserve,
//! lease renewed while the closure runs). Then a transaction is begun on the store's pool and
//! handed to the closure; on `Ok` the token-checked completion runs in it (the same statement
//! as the store's own [`complete`](crate::IdempotencyStore::complete), through
//! `SqlStore::complete_in_tx`, as the inbox's
//! [`SqlInbox::complete_in_tx`](crate::inbox::SqlInbox::complete_in_tx)), and the transaction
//! commits. Whatever else happens (an `Err`, a panic, a dropped future, a lost claim) rolls it
//! back, and the claim is released: there is no moment where the effect is committed and the
//! record is not.

use futures_util::future::BoxFuture;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::Transaction;

use super::{Idempotent, OnceError, encode, fingerprint_json};
use crate::claim::guard::ClaimGuard;
use crate::claim::lease::renewed;
use crate::fingerprint::Fingerprint;
use crate::sql::{Dialect, SqlStore};
use crate::store::record::Record;
use crate::store::{Completion, StoreKey};

impl Idempotent {
    /// [`once`](Self::once), with the closure's effect and the record in one SQL transaction:
    /// `f` gets a transaction begun on `store`'s pool, the completion of the key is written in
    /// it after `f` returns `Ok`, and it commits; on `Err` (or a panic, or a dropped future) it
    /// rolls back and the key is free again. `store` is the store this `Idempotent` was built
    /// on (a clone of it); another one never completes the claim, and every call then ends in
    /// [`OnceError::Lost`] with nothing committed.
    ///
    /// `f` has the shape of sqlx's `Connection::transaction`:
    /// `|tx| Box::pin(async move { .. })`. It must not commit or roll back `tx` itself.
    ///
    /// - A repeat after the commit replays the recorded output without running `f`; a repeat
    ///   while `f` runs is [`OnceError::InFlight`] (or waits, with
    ///   [`wait_in_flight`](Self::wait_in_flight)).
    /// - The claim's renewal runs on another connection of the pool while `f` holds one: give
    ///   the pool at least two. On SQLite, a transaction that writes holds the database's write
    ///   lock until it commits, so other writers (a concurrent claim of another key, a
    ///   renewal) wait for it up to the busy timeout: keep such transactions short.
    /// - The transaction has the pool's default isolation. Under PostgreSQL's `REPEATABLE
    ///   READ` or `SERIALIZABLE`, a closure that outlives a third of the lease (so a renewal
    ///   updated the claim's row after the transaction's snapshot) can fail at the completion
    ///   with a serialization error ([`OnceError::Store`]): nothing is committed, and the next
    ///   call runs again. `READ COMMITTED`, the default, has no such failure.
    /// - The [store timeout](Self::store_timeout) bounds the claim's calls (reserve, renew,
    ///   release), not the transaction's statements: those run under the pool's own
    ///   timeouts, and a commit cut off by a timeout would leave its outcome unknown.
    /// - [`OnceError::Lost`]: the claim ran out before its record (nothing committed).
    ///   [`OnceError::Store`] from the commit itself leaves it unknown whether the commit
    ///   landed: the next call replays the output if it did, and runs `f` again if it did not.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_idempotency::{Idempotent, SqliteStore};
    ///
    /// # let dir = std::env::temp_dir().join(format!("once-in-tx-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir)?;
    /// # let path = dir.join("refunds.db");
    /// let store = SqliteStore::open(&path).await?;
    /// sqlx::query("CREATE TABLE IF NOT EXISTS refunds (id TEXT PRIMARY KEY, cents INTEGER)")
    ///     .execute(store.pool())
    ///     .await?;
    /// let refunds = Idempotent::new(store.clone()).namespace("refunds");
    /// for _ in 0..2 {
    ///     // The refund row and the record of "refund-42" commit together, or neither does.
    ///     let cents: i64 = refunds
    ///         .once_in_tx("refund-42", &store, |tx| {
    ///             Box::pin(async move {
    ///                 sqlx::query("INSERT INTO refunds (id, cents) VALUES ($1, $2)")
    ///                     .bind("refund-42")
    ///                     .bind(4200_i64)
    ///                     .execute(&mut **tx)
    ///                     .await?;
    ///                 Ok::<_, sqlx::Error>(4200)
    ///             })
    ///         })
    ///         .await?;
    ///     assert_eq!(cents, 4200);
    /// }
    /// // The second call replayed the output: one row.
    /// let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM refunds")
    ///     .fetch_one(store.pool())
    ///     .await?;
    /// assert_eq!(rows, 1);
    /// # drop(store);
    /// # let _ = std::fs::remove_dir_all(&dir);
    /// # Ok(())
    /// # }
    /// # #[cfg(not(feature = "sqlite"))]
    /// # fn main() {}
    /// ```
    // Not an `AsyncFnOnce(&mut Transaction<'static, DB>)`: rustc (1.95) cannot prove the
    // future of such a closure `Send` for every lifetime of the borrow, so `tokio::spawn` of a
    // call would not compile ("implementation of `AsyncFnOnce` is not general enough").
    pub async fn once_in_tx<DB, T, E, F>(
        &self,
        key: &str,
        store: &SqlStore<DB>,
        f: F,
    ) -> Result<T, OnceError<E>>
    where
        DB: Dialect,
        T: Serialize + DeserializeOwned,
        F: for<'t> FnOnce(&'t mut Transaction<'static, DB>) -> BoxFuture<'t, Result<T, E>>,
    {
        self.in_tx(key, Fingerprint::NONE, store, f).await
    }

    /// [`once_in_tx`](Self::once_in_tx), with `payload` fingerprinted as
    /// [`once_with`](Self::once_with) does: a key already used with another payload gets
    /// [`OnceError::Mismatch`], and `f` does not run.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_idempotency::{Idempotent, OnceError, SqliteStore};
    ///
    /// # let dir = std::env::temp_dir().join(format!("once-in-tx-with-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir)?;
    /// let store = SqliteStore::open(dir.join("refunds.db")).await?;
    /// let refunds = Idempotent::new(store.clone()).namespace("refunds");
    /// let mut answers = Vec::new();
    /// for cents in [500_i64, 900] {
    ///     let answer = refunds
    ///         .once_in_tx_with("refund-7", &cents, &store, move |_tx| {
    ///             Box::pin(async move { Ok::<_, sqlx::Error>(cents) })
    ///         })
    ///         .await;
    ///     answers.push(answer);
    /// }
    /// assert_eq!(answers[0].as_ref().unwrap(), &500);
    /// // The key reused with another amount:
    /// assert!(matches!(answers[1], Err(OnceError::Mismatch)));
    /// # drop(store);
    /// # let _ = std::fs::remove_dir_all(&dir);
    /// # Ok(())
    /// # }
    /// # #[cfg(not(feature = "sqlite"))]
    /// # fn main() {}
    /// ```
    pub async fn once_in_tx_with<DB, P, T, E, F>(
        &self,
        key: &str,
        payload: &P,
        store: &SqlStore<DB>,
        f: F,
    ) -> Result<T, OnceError<E>>
    where
        DB: Dialect,
        P: Serialize + ?Sized,
        T: Serialize + DeserializeOwned,
        F: for<'t> FnOnce(&'t mut Transaction<'static, DB>) -> BoxFuture<'t, Result<T, E>>,
    {
        let fingerprint = fingerprint_json(payload).map_err(OnceError::Encode)?;
        self.in_tx(key, fingerprint, store, f).await
    }

    /// Both doors: `once`'s one claim path, with the transaction's as the claimed path.
    async fn in_tx<DB, T, E, F>(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        store: &SqlStore<DB>,
        f: F,
    ) -> Result<T, OnceError<E>>
    where
        DB: Dialect,
        T: Serialize + DeserializeOwned,
        F: for<'t> FnOnce(&'t mut Transaction<'static, DB>) -> BoxFuture<'t, Result<T, E>>,
    {
        let store_key = self.store_key(key);
        let joined = InTx {
            store,
            key: store_key.clone(),
            retention: self.policy.retention,
        };
        let claimed = |guard| joined.run(guard, f);
        self.run(store_key, fingerprint, claimed).await
    }
}

/// What a claimed `once_in_tx` needs besides its guard: where and how long to record.
struct InTx<'a, DB: Dialect> {
    store: &'a SqlStore<DB>,
    key: StoreKey,
    retention: std::time::Duration,
}

impl<DB: Dialect> InTx<'_, DB> {
    /// Runs `f` in a new transaction under the claim `guard` holds, records the output in it
    /// and commits; releases the claim on every other ending.
    async fn run<T, E, F>(self, guard: ClaimGuard, f: F) -> Result<T, OnceError<E>>
    where
        T: Serialize,
        F: for<'t> FnOnce(&'t mut Transaction<'static, DB>) -> BoxFuture<'t, Result<T, E>>,
    {
        let mut tx = match self.store.begin().await {
            Ok(tx) => tx,
            Err(err) => return fail(guard, OnceError::Store(err)).await,
        };
        let renewal = guard.renewal();
        // A panic in `f` drops `tx` (sqlx rolls it back) and the guard (released in the
        // background).
        let value = match renewed(&renewal, f(&mut tx)).await {
            Ok(value) => value,
            Err(err) => return abort(guard, tx, OnceError::Failed(err)).await,
        };
        let record = match encode(&value) {
            Ok(stored) => {
                Record::replay(guard.claim().fingerprint(), stored).owned_by(guard.claim().token())
            }
            Err(err) => return abort(guard, tx, OnceError::Encode(err)).await,
        };
        // From the completion on, the row is locked by `tx` (PostgreSQL) or the database by
        // its write lock (SQLite): no other claim can take the key before `tx` ends, so the
        // renewal stops here, and does not meet the completed row and call the claim lost.
        renewal.stop();
        let store = self.store;
        let completed = store
            .complete_in_tx(&mut tx, &self.key, guard.claim(), &record, self.retention)
            .await;
        match completed {
            Ok(Completion::Written | Completion::AlreadyWritten) => {}
            Ok(Completion::Lost) => return abort(guard, tx, OnceError::Lost).await,
            Err(err) => return abort(guard, tx, OnceError::Store(err)).await,
        }
        if let Err(err) = store.commit(tx).await {
            // Whether it landed is unknown. The release is token-checked: a committed record
            // (no token any more) is left as it is.
            return fail(guard, OnceError::Store(err)).await;
        }
        guard.settled_outside();
        Ok(value)
    }
}

/// Rolls `tx` back (first: on SQLite it holds the write lock the release needs), then
/// [`fail`]s.
async fn abort<DB: Dialect, T, E>(
    guard: ClaimGuard,
    tx: Transaction<'static, DB>,
    err: OnceError<E>,
) -> Result<T, OnceError<E>> {
    if let Err(error) = tx.rollback().await {
        // The connection is closed with it, which rolls back as well.
        tracing::debug!(%error, "rollback of a once_in_tx transaction failed");
    }
    fail(guard, err).await
}

/// Releases the claim, and returns `err`.
async fn fail<T, E>(guard: ClaimGuard, err: OnceError<E>) -> Result<T, OnceError<E>> {
    guard.release().await;
    Err(err)
}
