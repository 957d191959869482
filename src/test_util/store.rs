//! The store contract every backend must honour, called on the store directly (no HTTP):
//! state transitions, token checks, takeover of expired claims, renewal, concurrent winners,
//! retry-safe completion and per-item (batch) claims.
//!
//! Each store's test file instantiates it with
//! [`store_contract!`](crate::store_contract)`(async { (store, guard) })`, where `guard` keeps
//! whatever the store needs (a server) alive for the test.

#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::fingerprint::Fingerprint;
use crate::order::{EqualPositions, Position};
use crate::store::record::Record;
use crate::store::{Claim, Completion, ObjectKey, Reservation, StoreError, StoreKey, Target};
use crate::{IdempotencyStore, OrderedStore};

const RETENTION: Duration = Duration::from_secs(3600);
const LONG: Duration = Duration::from_secs(60);
/// A retention or lease a case waits out; what it holds is checked at once.
const SHORT: Duration = Duration::from_secs(2);
/// How long past its end a case waits before it expects a retention or lease to be over.
const PAST: Duration = Duration::from_millis(1500);

/// A key no other test (nor an earlier run against the same server) uses.
pub fn fresh_key(test: &str) -> StoreKey {
    static N: AtomicU64 = AtomicU64::new(0);
    let unique = format!(
        "{test}-{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    StoreKey::new("contract", None, &unique)
}

fn claim() -> Claim {
    Claim::new(Fingerprint::of_bytes(b"payload"))
}

/// [`completes`] with the contract's retention.
async fn recorded<St: IdempotencyStore>(
    store: &St,
    key: &StoreKey,
    claim: &Claim,
    record: &Record,
    expected: Completion,
) {
    completes(store, key, claim, record, RETENTION, expected).await;
}

fn ack(claim: &Claim) -> Record {
    Record::ack(claim.fingerprint()).owned_by(claim.token())
}

/// The targets of `keys`, none of them ordered (what a batch claims).
pub fn keys_of(keys: &[StoreKey]) -> Vec<Target> {
    keys.iter().cloned().map(Target::key).collect()
}

/// `events` with `equal` as their rule for a position equal to the watermark.
pub fn with_equal(events: &[Target], equal: EqualPositions) -> Vec<Target> {
    events
        .iter()
        .map(|event| event.clone().equal_positions(equal))
        .collect()
}

/// The one-target forms of the contract, for tests: each calls the slice method with
/// `[Target::key(key.clone())]` and answers what it answers for that one target.
pub trait OneTarget: IdempotencyStore {
    /// [`reserve`](IdempotencyStore::reserve) of `key` alone: its one reservation.
    fn reserve_one(
        &self,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> impl Future<Output = Result<Reservation, StoreError>> + Send {
        let targets = [Target::key(key.clone())];
        async move { Ok(self.reserve(&targets, claim, lease).await?.remove(0)) }
    }

    /// [`complete`](IdempotencyStore::complete) of `key` alone: its one completion.
    fn complete_one(
        &self,
        key: &StoreKey,
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> impl Future<Output = Result<Completion, StoreError>> + Send {
        let targets = [Target::key(key.clone())];
        async move {
            Ok(self
                .complete(&targets, claim, record, retention)
                .await?
                .remove(0))
        }
    }

    /// [`release`](IdempotencyStore::release) of `key` alone: whether it was released.
    fn release_one(
        &self,
        key: &StoreKey,
        claim: &Claim,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let targets = [Target::key(key.clone())];
        async move { Ok(self.release(&targets, claim).await? == 1) }
    }

    /// [`renew`](IdempotencyStore::renew) of `key` alone: whether it was still ours.
    fn renew_one(
        &self,
        key: &StoreKey,
        claim: &Claim,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let targets = [Target::key(key.clone())];
        async move { self.renew(&targets, claim, lease).await }
    }
}

impl<St: IdempotencyStore> OneTarget for St {}

/// Asserts that `claim`'s reserve of `key` alone, for `lease`, answers `expected`.
pub async fn reserves<St: IdempotencyStore>(
    store: &St,
    key: &StoreKey,
    claim: &Claim,
    lease: Duration,
    expected: Reservation,
) {
    let answer = store.reserve_one(key, claim, lease).await.unwrap();
    assert_eq!(answer, expected, "the reserve of {key:?}");
}

/// Asserts that `claim`'s completion of `key` alone with `record`, kept for `retention`,
/// answers `expected`.
pub async fn completes<St: IdempotencyStore>(
    store: &St,
    key: &StoreKey,
    claim: &Claim,
    record: &Record,
    retention: Duration,
    expected: Completion,
) {
    let answer = store
        .complete_one(key, claim, record, retention)
        .await
        .unwrap();
    assert_eq!(answer, expected, "the completion of {key:?}");
}

/// The four calls of an [`IdempotencyStore`], as a [`Hook`] is told them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// [`reserve`](IdempotencyStore::reserve).
    Reserve,
    /// [`complete`](IdempotencyStore::complete).
    Complete,
    /// [`release`](IdempotencyStore::release).
    Release,
    /// [`renew`](IdempotencyStore::renew).
    Renew,
}

/// What a [`Hooked`] store does around each call it forwards; each method does nothing by
/// default, so a test writes only the one it changes.
pub trait Hook: Clone + Send + Sync + 'static {
    /// Runs before `call` of `targets` is forwarded: an error is the call's answer, and the
    /// call never reaches the store.
    fn before(
        &self,
        call: Call,
        targets: &[Target],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (call, targets);
        std::future::ready(Ok(()))
    }

    /// Runs once the store has answered `call`, before the answer is returned.
    fn after(&self, call: Call) -> impl Future<Output = ()> + Send {
        let _ = call;
        std::future::ready(())
    }

    /// What the store's answers to a reserve become.
    fn reserved(&self, answers: Vec<Reservation>) -> Result<Vec<Reservation>, StoreError> {
        Ok(answers)
    }

    /// The hooked store's [`command_timeout`](IdempotencyStore::command_timeout).
    fn command_timeout(&self) -> Option<Duration> {
        None
    }
}

/// No hook: the calls are forwarded as they are.
impl Hook for () {}

/// A store that forwards every call to `store` through `hook`: a working store with one
/// behaviour changed (slow, failing, counted, answering otherwise), for tests. It does not
/// answer in process, whatever `store` does, as a store behind a network.
#[derive(Clone, Debug, Default)]
pub struct Hooked<St, H = ()> {
    /// The store every call is forwarded to.
    pub store: St,
    /// What runs around each call.
    pub hook: H,
}

impl<St: IdempotencyStore, H: Hook> IdempotencyStore for Hooked<St, H> {
    async fn reserve(
        &self,
        targets: &[Target],
        claim: &Claim,
        lease: Duration,
    ) -> Result<Vec<Reservation>, StoreError> {
        self.hook.before(Call::Reserve, targets).await?;
        let answers = self.store.reserve(targets, claim, lease).await;
        self.hook.after(Call::Reserve).await;
        self.hook.reserved(answers?)
    }

    async fn complete(
        &self,
        targets: &[Target],
        claim: &Claim,
        record: &Record,
        retention: Duration,
    ) -> Result<Vec<Completion>, StoreError> {
        self.hook.before(Call::Complete, targets).await?;
        let answers = self.store.complete(targets, claim, record, retention).await;
        self.hook.after(Call::Complete).await;
        answers
    }

    async fn release(&self, targets: &[Target], claim: &Claim) -> Result<usize, StoreError> {
        self.hook.before(Call::Release, targets).await?;
        let released = self.store.release(targets, claim).await;
        self.hook.after(Call::Release).await;
        released
    }

    async fn renew(
        &self,
        targets: &[Target],
        claim: &Claim,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.hook.before(Call::Renew, targets).await?;
        let renewed = self.store.renew(targets, claim, lease).await;
        self.hook.after(Call::Renew).await;
        renewed
    }

    fn command_timeout(&self) -> Option<Duration> {
        self.hook.command_timeout()
    }
}

/// absent → in flight → completed; a second claim sees each state.
pub async fn reserve_complete_then_duplicate<St: IdempotencyStore>(store: St) {
    let key = fresh_key("transitions");
    let (first, second) = (claim(), claim());
    reserves(&store, &key, &first, LONG, Reservation::Acquired).await;
    // The same claim again (a retried reserve): still ours.
    reserves(&store, &key, &first, LONG, Reservation::Acquired).await;
    reserves(
        &store,
        &key,
        &second,
        LONG,
        Reservation::InFlight {
            fingerprint: first.fingerprint(),
        },
    )
    .await;
    let record = ack(&first);
    recorded(&store, &key, &first, &record, Completion::Written).await;
    match store.reserve_one(&key, &second, LONG).await.unwrap() {
        Reservation::Completed(held) => assert_eq!(held.fingerprint(), first.fingerprint()),
        other => panic!("expected a completed record, got {other:?}"),
    }
}

/// Completing again after a completion that landed says so; a stranger's completion is lost.
pub async fn complete_is_safe_to_retry<St: IdempotencyStore>(store: St) {
    let key = fresh_key("retry-complete");
    let owner = claim();
    store.reserve_one(&key, &owner, LONG).await.unwrap();
    let record = ack(&owner);
    recorded(&store, &key, &owner, &record, Completion::Written).await;
    recorded(&store, &key, &owner, &record, Completion::AlreadyWritten).await;
    let stranger = claim();
    recorded(&store, &key, &stranger, &ack(&stranger), Completion::Lost).await;
    // Completing a key nobody holds writes nothing.
    let absent = fresh_key("retry-complete-absent");
    recorded(&store, &absent, &owner, &record, Completion::Lost).await;
    reserves(&store, &absent, &stranger, LONG, Reservation::Acquired).await;
}

/// Release and renew compare the owner token.
pub async fn release_and_renew_check_the_token<St: IdempotencyStore>(store: St) {
    let key = fresh_key("tokens");
    let (owner, stranger) = (claim(), claim());
    store.reserve_one(&key, &owner, LONG).await.unwrap();
    assert!(!store.release_one(&key, &stranger).await.unwrap());
    assert!(!store.renew_one(&key, &stranger, LONG).await.unwrap());
    assert!(store.renew_one(&key, &owner, LONG).await.unwrap());
    assert!(store.release_one(&key, &owner).await.unwrap());
    assert!(!store.release_one(&key, &owner).await.unwrap());
    assert!(!store.renew_one(&key, &owner, LONG).await.unwrap());
    reserves(&store, &key, &stranger, LONG, Reservation::Acquired).await;
}

/// An expired claim (its owner died) is taken over; the old owner can no longer touch it.
pub async fn expired_claim_is_taken_over<St: IdempotencyStore>(store: St) {
    let key = fresh_key("takeover");
    let (dead, next) = (claim(), claim());
    store
        .reserve_one(&key, &dead, Duration::from_millis(200))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    reserves(&store, &key, &next, LONG, Reservation::Acquired).await;
    recorded(&store, &key, &dead, &ack(&dead), Completion::Lost).await;
    assert!(!store.release_one(&key, &dead).await.unwrap());
    assert!(!store.renew_one(&key, &dead, LONG).await.unwrap());
    recorded(&store, &key, &next, &ack(&next), Completion::Written).await;
}

/// Renewal keeps a claim alive past its first lease; without it the claim expires.
pub async fn renewal_keeps_the_claim<St: IdempotencyStore>(store: St) {
    let key = fresh_key("renewal");
    let owner = claim();
    let lease = Duration::from_millis(1500);
    store.reserve_one(&key, &owner, lease).await.unwrap();
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(store.renew_one(&key, &owner, lease).await.unwrap());
    }
    // Two seconds in, more than a lease after the claim: still held.
    assert!(matches!(
        store.reserve_one(&key, &claim(), lease).await.unwrap(),
        Reservation::InFlight { .. }
    ));
    tokio::time::sleep(Duration::from_millis(2600)).await;
    reserves(&store, &key, &claim(), lease, Reservation::Acquired).await;
}

/// Many concurrent claims of one key: exactly one wins.
pub async fn one_winner_among_concurrent_claims<St: IdempotencyStore>(store: St) {
    let key = fresh_key("race");
    let winners = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (store, key, winners) = (store.clone(), key.clone(), winners.clone());
        tasks.push(tokio::spawn(async move {
            if store.reserve_one(&key, &claim(), LONG).await.unwrap() == Reservation::Acquired {
                winners.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(winners.load(Ordering::SeqCst), 1);
}

/// The items of a batch: claimed, completed, released and renewed one by one, in order.
pub async fn batch_items_are_claimed_one_by_one<St: IdempotencyStore>(store: St) {
    let [a, b, c] = [
        fresh_key("item-a"),
        fresh_key("item-b"),
        fresh_key("item-c"),
    ];
    let first = claim();
    let batch = [a.clone(), b.clone()];
    assert_eq!(
        store.reserve(&keys_of(&batch), &first, LONG).await.unwrap(),
        [Reservation::Acquired, Reservation::Acquired]
    );
    assert!(store.renew(&keys_of(&batch), &first, LONG).await.unwrap());
    // An overlapping batch sees B in flight and C free.
    let second = claim();
    let overlap = [b.clone(), c.clone()];
    let answers = store
        .reserve(&keys_of(&overlap), &second, LONG)
        .await
        .unwrap();
    assert!(
        matches!(answers[0], Reservation::InFlight { .. }),
        "{answers:?}"
    );
    assert_eq!(answers[1], Reservation::Acquired);
    assert_eq!(
        store
            .release(&keys_of(std::slice::from_ref(&c)), &second)
            .await
            .unwrap(),
        1
    );
    // The first batch completes; its items are done, one by one.
    assert_eq!(
        store
            .complete(&keys_of(&batch), &first, &ack(&first), RETENTION)
            .await
            .unwrap(),
        [Completion::Written, Completion::Written]
    );
    assert!(!store.renew(&keys_of(&batch), &first, LONG).await.unwrap());
    let third = claim();
    let answers = store
        .reserve(&keys_of(&[a, b, c.clone()]), &third, LONG)
        .await
        .unwrap();
    assert!(
        matches!(answers[0], Reservation::Completed(_)),
        "{answers:?}"
    );
    assert!(
        matches!(answers[1], Reservation::Completed(_)),
        "{answers:?}"
    );
    assert_eq!(answers[2], Reservation::Acquired);
    assert_eq!(store.release(&keys_of(&[c]), &third).await.unwrap(), 1);
}

/// Two overlapping batches racing, each retried until it goes through: every item is claimed
/// and completed by exactly one of them.
pub async fn overlapping_batches_race_exactly_once<St: IdempotencyStore>(store: St) {
    let keys: Vec<StoreKey> = (0..6)
        .map(|i| fresh_key(&format!("race-item-{i}")))
        .collect();
    let completed_by = Arc::new(std::sync::Mutex::new(vec![0usize; keys.len()]));
    let batches: Vec<Vec<usize>> = vec![vec![0, 1, 2, 3], vec![2, 3, 4, 5], vec![1, 3, 5]];
    let mut tasks = Vec::new();
    for batch in batches {
        let (store, keys, completed_by) = (store.clone(), keys.clone(), completed_by.clone());
        tasks.push(tokio::spawn(async move {
            let mine: Vec<StoreKey> = batch.iter().map(|&i| keys[i].clone()).collect();
            loop {
                let claim = claim();
                let answers = store.reserve(&keys_of(&mine), &claim, LONG).await.unwrap();
                let acquired: Vec<usize> = answers
                    .iter()
                    .enumerate()
                    .filter(|(_, a)| **a == Reservation::Acquired)
                    .map(|(i, _)| i)
                    .collect();
                let held: Vec<StoreKey> = acquired.iter().map(|&i| mine[i].clone()).collect();
                if answers
                    .iter()
                    .any(|a| matches!(a, Reservation::InFlight { .. }))
                {
                    store.release(&keys_of(&held), &claim).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                let done = store
                    .complete(&keys_of(&held), &claim, &ack(&claim), RETENTION)
                    .await
                    .unwrap();
                assert!(done.iter().all(|d| *d == Completion::Written), "{done:?}");
                let mut counts = completed_by.lock().unwrap();
                for &i in &acquired {
                    counts[batch[i]] += 1;
                }
                return;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*completed_by.lock().unwrap(), vec![1; 6]);
}

/// A completed record read back by a reserve may say how long the store keeps it (what a
/// local cache bounds its entry by; the built-in stores that know tell it): when it does,
/// that is within the retention it was written with. (Redis does not say: its reserve is one
/// plain `SET`.)
pub async fn a_told_expiry_is_within_the_retention<St: IdempotencyStore>(store: St) {
    let key = fresh_key("told-expiry");
    let owner = claim();
    reserves(&store, &key, &owner, LONG, Reservation::Acquired).await;
    let record = ack(&owner);
    recorded(&store, &key, &owner, &record, Completion::Written).await;
    let Reservation::Completed(read) = store.reserve_one(&key, &claim(), LONG).await.unwrap()
    else {
        panic!("the record is held");
    };
    assert_eq!(read, record.owned_by(owner.token()));
    if let Some(left) = read.expires_in() {
        assert!(
            left <= RETENTION && left > RETENTION - Duration::from_secs(60),
            "{left:?}"
        );
    }
}

/// A completed record is kept for the retention it was written with, and no longer: a
/// delivery after the sender's retry window is processed as new, and the store does not grow
/// without bound.
pub async fn a_record_expires_with_its_retention<St: IdempotencyStore>(store: St) {
    let key = fresh_key("retention");
    let owner = claim();
    reserves(&store, &key, &owner, LONG, Reservation::Acquired).await;
    completes(
        &store,
        &key,
        &owner,
        &ack(&owner),
        SHORT,
        Completion::Written,
    )
    .await;
    let answer = store.reserve_one(&key, &claim(), LONG).await.unwrap();
    assert!(
        matches!(answer, Reservation::Completed(_)),
        "a record is held within its retention: {answer:?}"
    );
    tokio::time::sleep(SHORT + PAST).await;
    let answer = store.reserve_one(&key, &claim(), LONG).await.unwrap();
    assert_eq!(
        answer,
        Reservation::Acquired,
        "a record kept for {SHORT:?} is gone {:?} later",
        SHORT + PAST
    );
}

/// An event of `object` at `position`, with a key no other test uses.
fn ordered(test: &str, object: &ObjectKey, position: i128) -> Target {
    Target::ordered(fresh_key(test), object.clone(), Position::new(position))
}

/// An object no other test (nor an earlier run) uses.
fn fresh_object(test: &str) -> ObjectKey {
    ObjectKey::new("contract", None, fresh_key(test).as_str())
}

/// `claim`'s reserve of `event` alone, for `lease`: the answers.
async fn reserve_event<St: IdempotencyStore>(
    store: &St,
    event: &Target,
    claim: &Claim,
    lease: Duration,
) -> Vec<Reservation> {
    let events = std::slice::from_ref(event);
    store.reserve(events, claim, lease).await.unwrap()
}

/// `claim`'s completion of `event` alone with its ack record: the answers.
async fn complete_event<St: IdempotencyStore>(
    store: &St,
    event: &Target,
    claim: &Claim,
) -> Vec<Completion> {
    let events = std::slice::from_ref(event);
    store
        .complete(events, claim, &ack(claim), RETENTION)
        .await
        .unwrap()
}

/// `claim`'s release of `event` alone: how many were released.
async fn release_event<St: IdempotencyStore>(store: &St, event: &Target, claim: &Claim) -> usize {
    let events = std::slice::from_ref(event);
    store.release(events, claim).await.unwrap()
}

/// `claim`'s renewal of `event` alone, for `lease`: whether it was still held.
async fn renew_event<St: IdempotencyStore>(
    store: &St,
    event: &Target,
    claim: &Claim,
    lease: Duration,
) -> bool {
    let events = std::slice::from_ref(event);
    store.renew(events, claim, lease).await.unwrap()
}

/// The watermark follows the highest position completed, never a lower one; an event below it
/// is stale (claimed, so that its key can be recorded), one at it is stale only by option.
pub async fn ordered_events_keep_the_highest_position<St: OrderedStore>(store: St) {
    let object = fresh_object("watermark");
    let (high, low, equal) = (
        ordered("high", &object, 20),
        ordered("low", &object, 10),
        ordered("equal", &object, 20),
    );
    let owner = claim();
    let answers = reserve_event(&store, &high, &owner, LONG).await;
    assert_eq!(answers, [Reservation::Acquired]);
    let done = complete_event(&store, &high, &owner).await;
    assert_eq!(done, [Completion::Written]);
    // A retried completion: already written, the watermark unchanged.
    let done = complete_event(&store, &high, &owner).await;
    assert_eq!(done, [Completion::AlreadyWritten]);

    let late = claim();
    let answers = reserve_event(&store, &low, &late, LONG).await;
    let watermark = Position::new(20);
    assert_eq!(answers, [Reservation::Stale { watermark }]);
    // Recording the stale event's key leaves the watermark where it is, and frees the object.
    let done = complete_event(&store, &low, &late).await;
    assert_eq!(done, [Completion::Written]);
    let answers = reserve_event(&store, &low, &claim(), LONG).await;
    assert!(
        matches!(answers[0], Reservation::Completed(_)),
        "{answers:?}"
    );

    let strict = claim();
    let answers = store
        .reserve(
            &with_equal(std::slice::from_ref(&equal), EqualPositions::Stale),
            &strict,
            LONG,
        )
        .await
        .unwrap();
    assert_eq!(answers, [Reservation::Stale { watermark }]);
    assert_eq!(release_event(&store, &equal, &strict).await, 1);
    let answers = reserve_event(&store, &equal, &claim(), LONG).await;
    assert_eq!(
        answers,
        [Reservation::Acquired],
        "equal positions are processed by default"
    );
}

/// One event of an object at a time: another claim finds the object busy (and writes
/// nothing); releasing or failing lets the object go; the same claim may hold several events
/// of one object (a batch).
pub async fn an_object_is_held_by_one_claim_at_a_time<St: IdempotencyStore>(store: St) {
    let object = fresh_object("busy");
    let (first, second) = (ordered("first", &object, 1), ordered("second", &object, 2));
    let owner = claim();
    let answers = reserve_event(&store, &first, &owner, LONG).await;
    assert_eq!(answers, [Reservation::Acquired]);
    let other = claim();
    let answers = reserve_event(&store, &second, &other, LONG).await;
    assert_eq!(answers, [Reservation::ObjectBusy]);
    // Busy: nothing was claimed for the second event.
    assert_eq!(release_event(&store, &second, &other).await, 0);
    // The owner renews both its key and the object; a stranger renews nothing.
    assert!(renew_event(&store, &first, &owner, LONG).await);
    assert!(!renew_event(&store, &first, &other, LONG).await);
    // The owner may claim another event of the same object (a batch).
    let answers = reserve_event(&store, &second, &owner, LONG).await;
    assert_eq!(answers, [Reservation::Acquired]);
    // Releasing lets the object go.
    assert_eq!(
        store
            .release(&[first.clone(), second.clone()], &owner)
            .await
            .unwrap(),
        2
    );
    let answers = reserve_event(&store, &second, &other, LONG).await;
    assert_eq!(answers, [Reservation::Acquired], "the object was let go");
}

/// An object's lease expires with its claim: a crashed owner frees the object within a lease.
pub async fn an_objects_lease_expires_with_its_owner<St: IdempotencyStore>(store: St) {
    let object = fresh_object("expiry");
    let dead = claim();
    let short = Duration::from_millis(200);
    let first = ordered("dead", &object, 1);
    reserve_event(&store, &first, &dead, short).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let next = ordered("next", &object, 2);
    let answers = reserve_event(&store, &next, &claim(), LONG).await;
    assert_eq!(answers, [Reservation::Acquired]);
    // The dead owner's late completion is lost, and leaves the watermark alone.
    let done = complete_event(&store, &first, &dead).await;
    assert_eq!(done, [Completion::Lost]);
}

/// The watermark is kept for the retention of the completion that raised it, and no longer:
/// once it is gone, an event at a lower position is no longer stale.
pub async fn a_watermark_expires_with_its_retention<St: IdempotencyStore>(store: St) {
    let object = fresh_object("watermark-retention");
    let (high, low) = (ordered("high", &object, 20), ordered("low", &object, 10));
    let owner = claim();
    assert_eq!(
        reserve_event(&store, &high, &owner, LONG).await,
        [Reservation::Acquired]
    );
    let events = std::slice::from_ref(&high);
    let done = store
        .complete(events, &owner, &ack(&owner), SHORT)
        .await
        .unwrap();
    assert_eq!(done, [Completion::Written]);
    let probe = claim();
    let answers = reserve_event(&store, &low, &probe, LONG).await;
    let watermark = Position::new(20);
    assert_eq!(
        answers,
        [Reservation::Stale { watermark }],
        "a lower position is stale while the watermark is kept"
    );
    assert_eq!(release_event(&store, &low, &probe).await, 1);
    tokio::time::sleep(SHORT + PAST).await;
    let answers = reserve_event(&store, &low, &claim(), LONG).await;
    assert_eq!(
        answers,
        [Reservation::Acquired],
        "a watermark kept for {SHORT:?} is gone {:?} later",
        SHORT + PAST
    );
}

/// Renewing an ordered event's claim renews its object's lease too: another event of the
/// object is still busy after the first lease would have run out.
pub async fn renewal_keeps_the_object<St: IdempotencyStore>(store: St) {
    let object = fresh_object("renew-object");
    let owner = claim();
    let held = ordered("held", &object, 1);
    assert_eq!(
        reserve_event(&store, &held, &owner, SHORT).await,
        [Reservation::Acquired]
    );
    assert!(
        renew_event(&store, &held, &owner, LONG).await,
        "the owner renews its event"
    );
    tokio::time::sleep(SHORT + PAST).await;
    let answers = reserve_event(&store, &ordered("next", &object, 2), &claim(), LONG).await;
    assert_eq!(
        answers,
        [Reservation::ObjectBusy],
        "renewing an event for {LONG:?} renews its object's lease: it is held past the first \
         lease of {SHORT:?}"
    );
}

/// Concurrent claims of different events of one object: exactly one holds it.
pub async fn concurrent_events_of_one_object_have_one_holder<St: IdempotencyStore>(store: St) {
    let object = fresh_object("race");
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let (store, event) = (store.clone(), ordered("race", &object, i));
            tokio::spawn(async move { store.reserve(&[event], &claim(), LONG).await.unwrap() })
        })
        .collect();
    let mut holders = 0;
    for task in tasks {
        match task.await.unwrap().as_slice() {
            [Reservation::Acquired] => holders += 1,
            [Reservation::ObjectBusy] => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(holders, 1);
}

/// The record-store contract as `#[tokio::test]`s, one per case, in a module of the calling
/// file (feature `test-util`; see [`test_util`](crate::test_util)).
///
/// `$make` is an `async` expression whose output is `(store, guard)`: a fresh
/// [`IdempotencyStore`](crate::IdempotencyStore) and whatever must live as long as the test
/// (a server, a temporary directory, `()`). The ordered cases need an
/// [`OrderedStore`](crate::OrderedStore); a store that does not order events runs the others
/// with `store_contract!(unordered: $make)`. Every case runs on a multi-threaded runtime with
/// two workers.
#[macro_export]
macro_rules! store_contract {
    (unordered: $make:expr) => {
        $crate::store_contract!(@tests contract_tests $make;
            reserve_complete_then_duplicate,
            complete_is_safe_to_retry,
            release_and_renew_check_the_token,
            expired_claim_is_taken_over,
            renewal_keeps_the_claim,
            one_winner_among_concurrent_claims,
            batch_items_are_claimed_one_by_one,
            overlapping_batches_race_exactly_once,
            a_told_expiry_is_within_the_retention,
            a_record_expires_with_its_retention,
        );
    };
    ($make:expr) => {
        $crate::store_contract!(unordered: $make);
        $crate::store_contract!(@tests ordered_contract_tests $make;
            ordered_events_keep_the_highest_position,
            an_object_is_held_by_one_claim_at_a_time,
            an_objects_lease_expires_with_its_owner,
            concurrent_events_of_one_object_have_one_holder,
            a_watermark_expires_with_its_retention,
            renewal_keeps_the_object,
        );
    };
    (@tests $module:ident $make:expr; $($name:ident),* $(,)?) => {
        mod $module {
            use super::*;
            $crate::suite_cases!($crate::test_util::store; $make; $($name),*);
        }
    };
}

pub use crate::store_contract;
