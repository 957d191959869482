//! `MapStore`: a record store written outside the crate, on its public API only: a
//! `HashMap` behind a mutex. It keeps the state machine of the `store` module's docs (absent,
//! in flight, completed), claims each key in one critical section and checks the claim's token
//! before it touches a key. It does not order events (no `OrderedStore`), so a route on it
//! cannot call `.order(..)`.
//!
//! The crate's tests run the record-store contract on it (`tests/stores/custom.rs`):
//! `tower_idempotency::store_contract!(unordered: async { (MapStore::default(), ()) });`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tower_idempotency::IdempotencyStore;
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::store::record::Record;
use tower_idempotency::store::{
    Claim, Completion, Reservation, StoreError, StoreErrorKind, StoreKey, Target, Token,
};

/// What one key holds, until `expires`.
enum State {
    /// A claim whose owner has not finished.
    InFlight {
        token: Token,
        fingerprint: Fingerprint,
    },
    /// A completed record, as [`Record::encode`] wrote it (what a store that keeps bytes
    /// keeps: a database column, a Redis value).
    Completed(Vec<u8>),
}

/// A record store in one process: a map from each key to its state and its expiry.
#[derive(Clone, Default)]
pub struct MapStore {
    keys: Arc<Mutex<HashMap<StoreKey, (State, Instant)>>>,
}

impl MapStore {
    /// Runs `f` on the map with every expired key removed first: an expired claim or record
    /// is as absent as one never written.
    fn with_live<T>(
        &self,
        f: impl FnOnce(&mut HashMap<StoreKey, (State, Instant)>, Instant) -> T,
    ) -> T {
        let mut keys = self
            .keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        keys.retain(|_, (_, expires)| *expires > now);
        f(&mut keys, now)
    }
}

/// Whether `state` is the in-flight claim of `token`.
fn held_by(state: &State, token: &Token) -> bool {
    matches!(state, State::InFlight { token: held, .. } if held == token)
}

impl IdempotencyStore for MapStore {
    async fn reserve(
        &self,
        targets: &[Target],
        claim: &Claim,
        lease: Duration,
    ) -> Result<Vec<Reservation>, StoreError> {
        if targets.iter().any(|target| target.order.is_some()) {
            // Only an `OrderedStore` is handed ordered targets; say so if one comes anyway.
            return Err(StoreError::new(StoreErrorKind::Other));
        }
        self.with_live(|keys, now| {
            targets
                .iter()
                .map(|target| match keys.get(&target.key) {
                    // A retried reserve of our own claim: still ours.
                    Some((state, _)) if held_by(state, claim.token()) => Ok(Reservation::Acquired),
                    Some((State::InFlight { fingerprint, .. }, _)) => Ok(Reservation::InFlight {
                        fingerprint: *fingerprint,
                    }),
                    // Saying how long the record is kept lets a local cache keep it no longer.
                    Some((State::Completed(bytes), expires)) => Ok(Reservation::Completed(
                        Record::decode(bytes)?.expiring_in(*expires - now),
                    )),
                    None => {
                        let state = State::InFlight {
                            token: *claim.token(),
                            fingerprint: claim.fingerprint(),
                        };
                        keys.insert(target.key.clone(), (state, now + lease));
                        Ok(Reservation::Acquired)
                    }
                })
                .collect()
        })
    }

    async fn complete(
        &self,
        targets: &[Target],
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> Result<Vec<Completion>, StoreError> {
        self.with_live(|keys, now| {
            targets
                .iter()
                .map(|target| match keys.get_mut(&target.key) {
                    Some(slot) if held_by(&slot.0, claim.token()) => {
                        *slot = (State::Completed(record.encode().to_vec()), now + retention);
                        Ok(Completion::Written)
                    }
                    // A completion retried after one that landed: the record says whose it is.
                    Some((State::Completed(bytes), _))
                        if Record::decode(bytes)?.is_owned_by(claim.token()) =>
                    {
                        Ok(Completion::AlreadyWritten)
                    }
                    // Released, expired, or another attempt's: write nothing.
                    _ => Ok(Completion::Lost),
                })
                .collect()
        })
    }

    async fn release(&self, targets: &[Target], claim: &Claim) -> Result<usize, StoreError> {
        self.with_live(|keys, _| {
            let mut released = 0;
            for target in targets {
                if keys
                    .get(&target.key)
                    .is_some_and(|(state, _)| held_by(state, claim.token()))
                {
                    keys.remove(&target.key);
                    released += 1;
                }
            }
            Ok(released)
        })
    }

    async fn renew(
        &self,
        targets: &[Target],
        claim: &Claim,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.with_live(|keys, now| {
            let mut all = true;
            for target in targets {
                match keys.get_mut(&target.key) {
                    Some((state, expires)) if held_by(state, claim.token()) => {
                        *expires = now + lease
                    }
                    _ => all = false,
                }
            }
            Ok(all)
        })
    }

    /// No I/O: the layer need not time these calls.
    fn in_process(&self) -> bool {
        true
    }
}
