//! The admin side of the inbox contract ([`InboxAdmin`]) every queue backend must honour: find
//! an entry in each state with its attempts, dead letters and their re-queue, list with filters
//! and a cursor, re-queue all matching in bounded calls, discard, pause and resume.
//!
//! Each store's test file instantiates it with `inbox_admin_contract!(async { (store, guard) })`
//! beside `inbox_contract!`. Every listing filters on names no other test uses, so that a
//! shared server's other entries never change what a case sees.

#![allow(dead_code)]

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime};

use crate::inbox::admin::{KEPT_ERROR_BYTES, worker_id};
use crate::inbox::{
    AttemptOutcome, Backoff, Enqueued, EntryInfo, Failure, Filter, InboxAdmin, InboxEntry,
    InboxRequest, KeyState, Worker,
};
use crate::order::Position;
use crate::store::{ObjectKey, StoreKey};
use bytes::Bytes;

// The names, bounds and retention of the queue contract (`inbox_contract`, beside this
// module in every file that runs both).
use super::inbox::{
    DEADLINE, LONG, RETENTION, SHORT_RETENTION, completes, entry, fresh, idle_worker,
    kept_for_its_retention, stop_worker, take_one, whole_ms,
};

/// `name`'s entry, enqueued, taken and failed as dead with `error`: a dead letter.
async fn dead_letter<St: InboxAdmin>(store: &St, name: &str, error: &str) -> InboxEntry {
    let entry = entry(name);
    store.enqueue(entry.clone()).await.unwrap();
    let lease = take_one(store, "the entry is due").await;
    let failure = Failure::Dead(error.to_owned());
    assert!(
        store.fail(&entry.key, &lease.token, failure).await.unwrap(),
        "the lease's holder settles it as dead"
    );
    entry
}

/// An entry of `route` whose delivery id is `id`, keyed as a route keys it.
fn delivery(route: &str, id: &str) -> InboxEntry {
    let key = StoreKey::new(route, Some("/admin-contract"), id);
    InboxEntry::new(key, Bytes::from_static(b"{\"event\":1}"), fresh("corr"))
        .with_delivery(route, id)
}

async fn find<St: InboxAdmin>(store: &St, key: &StoreKey) -> EntryInfo {
    store
        .find(key)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("find: expected the inbox to know {key}, got None"))
}

/// Every entry matching `filter`, read page by page (`limit` each), once each, checking that no
/// page holds more than asked and that each entry listed matches. An entry listed again is
/// counted once: a listing that is a scan (Redis) may repeat one while the server resizes its
/// table, as `InboxAdmin::list` allows.
async fn list_all<St: InboxAdmin>(store: &St, filter: &Filter, limit: usize) -> Vec<EntryInfo> {
    let mut all = Vec::new();
    let mut seen = HashSet::new();
    let mut cursor: Option<String> = None;
    let start = Instant::now();
    loop {
        let page = store.list(filter, cursor.as_deref(), limit).await.unwrap();
        assert!(
            page.entries.len() <= limit,
            "{} > {limit}",
            page.entries.len()
        );
        for info in page.entries {
            assert!(filter.matches(&info), "does not match: {info:?}");
            if seen.insert(info.entry.key.clone()) {
                all.push(info);
            }
        }
        match page.next {
            Some(next) => cursor = Some(next),
            None => return all,
        }
        assert!(start.elapsed() < DEADLINE * 3, "the listing never ends");
    }
}

/// Takes until the entry of `key` is handed out (others of the route are failed again at
/// once... none are due in these cases), failing after the deadline.
async fn take_key<St: InboxAdmin>(store: &St, key: &StoreKey) -> crate::inbox::Lease {
    let start = Instant::now();
    loop {
        let taken = store.take(10, LONG).await.unwrap();
        let mut found = None;
        for lease in taken {
            if lease.entry.key == *key {
                found = Some(lease);
            } else {
                // Another case's entry on a shared server: give it back, due now.
                let back = Failure::RetryAt(SystemTime::now(), "not this case's".to_owned());
                store
                    .fail(&lease.entry.key, &lease.token, back)
                    .await
                    .unwrap();
            }
        }
        if let Some(lease) = found {
            return lease;
        }
        assert!(start.elapsed() < DEADLINE, "not taken: {key}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An entry found in each state it goes through, with its delivery id, route, correlation id
/// and every attempt: who ran it, how it ended, with the error.
pub async fn find_tells_each_state_and_its_attempts<St: InboxAdmin>(store: St) {
    let route = fresh("find");
    let first = delivery(&route, "evt_1");
    let key = first.key.clone();
    assert!(
        store.find(&key).await.unwrap().is_none(),
        "an unknown key is not found"
    );
    assert_eq!(
        store.enqueue(first.clone()).await.unwrap(),
        Enqueued::Queued,
        "a new key is queued"
    );

    let queued = find(&store, &key).await;
    assert_eq!(queued.state, KeyState::Queued, "found queued once enqueued");
    assert_eq!(
        (queued.entry.id.as_str(), queued.entry.route.as_str()),
        ("evt_1", route.as_str())
    );
    assert_eq!(
        queued.entry.correlation_id, first.correlation_id,
        "a queued entry keeps its correlation id"
    );
    assert_eq!(
        queued.entry.body, first.body,
        "find reads a queued entry's body"
    );
    assert!(
        queued.history.is_empty() && queued.last_error.is_none(),
        "a queued entry never taken has no attempts and no error"
    );

    let lease = take_key(&store, &key).await;
    assert_eq!(lease.entry.id, "evt_1", "a worker gets the delivery id");
    assert_eq!(lease.entry.route, route, "a worker gets the route");
    let running = find(&store, &key).await;
    assert_eq!(running.state, KeyState::Running, "found running once taken");
    assert_eq!(running.history.len(), 1, "one attempt once taken");
    assert_eq!(
        running.history[0].outcome,
        AttemptOutcome::Running,
        "the attempt taken runs"
    );
    assert_eq!(
        running.history[0].worker,
        worker_id(),
        "the attempt names this process (host/pid)"
    );
    assert_eq!(
        running.history[0].number, 1,
        "the first attempt is number 1"
    );
    assert!(
        running.until.unwrap() > SystemTime::now(),
        "a running entry's until is its lease end, ahead"
    );

    let retry = Failure::RetryAt(SystemTime::now(), "gateway timeout".to_owned());
    assert!(
        store.fail(&key, &lease.token, retry).await.unwrap(),
        "the lease's holder schedules a retry"
    );
    let retrying = find(&store, &key).await;
    assert_eq!(
        retrying.state,
        KeyState::Queued,
        "found queued again after a retry is scheduled"
    );
    assert_eq!(
        retrying.last_error.as_deref(),
        Some("gateway timeout"),
        "the failed attempt's error is the last error"
    );
    assert_eq!(
        retrying.history[0].outcome,
        AttemptOutcome::Failed("gateway timeout".to_owned())
    );
    assert!(
        retrying.history[0].duration.is_some(),
        "a failed attempt has a duration"
    );

    let lease = take_key(&store, &key).await;
    let long = format!("poisoned\t{}", "x".repeat(2_000));
    assert!(
        store
            .fail(&key, &lease.token, Failure::Dead(long))
            .await
            .unwrap(),
        "the lease's holder settles it as dead"
    );
    let dead = find(&store, &key).await;
    assert_eq!(
        dead.state,
        KeyState::Dead,
        "found dead after a dead failure"
    );
    assert!(
        dead.last_error.as_deref().unwrap().starts_with("poisoned"),
        "{:?}",
        dead.last_error
    );
    assert_eq!(dead.history.len(), 2, "two attempts: one retried, one dead");
    let AttemptOutcome::Failed(kept) = &dead.history[1].outcome else {
        panic!("the second attempt failed: {:?}", dead.history);
    };
    assert!(
        kept.len() <= KEPT_ERROR_BYTES,
        "an attempt's error is cut: {} bytes",
        kept.len()
    );

    assert!(
        store.requeue(&key).await.unwrap(),
        "a dead letter is re-queued"
    );
    let lease = take_key(&store, &key).await;
    completes(&store, &key, lease.token, RETENTION).await;
    let done = find(&store, &key).await;
    assert_eq!(done.state, KeyState::Done, "found done once completed");
    assert_eq!(done.entry.id, "evt_1", "a done entry keeps its delivery id");
    assert_eq!(
        done.entry.correlation_id, first.correlation_id,
        "a done entry keeps its correlation id"
    );
    assert_eq!(done.history.len(), 3, "{:?}", done.history);
    assert_eq!(
        done.history[2].outcome,
        AttemptOutcome::Succeeded,
        "the completed attempt succeeded"
    );
    assert!(
        done.until.unwrap() > SystemTime::now() + RETENTION / 2,
        "a done entry's until is the end of its retention"
    );
}

/// A listing pages through every matching entry exactly once, whatever the page size, and
/// each filter keeps what it names.
pub async fn list_pages_through_every_match<St: InboxAdmin>(store: St) {
    let route = fresh("list");
    let object = ObjectKey::new(&route, None, "order-1");
    let mut entries = Vec::new();
    for n in 0..23 {
        let mut entry = delivery(&route, &format!("evt_{n:02}"));
        if n < 3 {
            let position = Position::from_integer_text(&n.to_string()).unwrap();
            entry = entry.ordered(object.clone(), position);
        }
        store.enqueue(entry.clone()).await.unwrap();
        entries.push(entry);
    }
    let other = delivery(&fresh("other-route"), "evt_00");
    store.enqueue(other.clone()).await.unwrap();

    let by_route = Filter {
        route: Some(route.clone()),
        ..Filter::default()
    };
    for limit in [1, 5, 23, 100] {
        let listed = list_all(&store, &by_route, limit).await;
        assert_eq!(listed.len(), 23, "page size {limit}");
    }
    let prefixed = list_all(
        &store,
        &Filter {
            id_prefix: Some("evt_1".into()),
            ..by_route.clone()
        },
        4,
    )
    .await;
    let mut ids: Vec<_> = prefixed.iter().map(|info| info.entry.id.clone()).collect();
    ids.sort();
    let expected: Vec<_> = (10..20).map(|n| format!("evt_{n}")).collect();
    assert_eq!(ids, expected, "the ids with the prefix evt_1, each once");

    let correlated = Filter {
        correlation_id: Some(entries[7].correlation_id.clone()),
        ..Filter::default()
    };
    let found = list_all(&store, &correlated, 10).await;
    assert_eq!(found.len(), 1, "one entry of that correlation id");
    assert_eq!(
        found[0].entry.key, entries[7].key,
        "the entry of that correlation id"
    );

    let of_object = Filter {
        object: Some(object.clone()),
        ..Filter::default()
    };
    let of_object = list_all(&store, &of_object, 2).await;
    assert_eq!(of_object.len(), 3, "the three entries of the object");

    // Two fail for good with different errors; only the one named is found by its error.
    for (n, error) in [(20, "card declined"), (21, "timeout talking to smtp")] {
        let lease = take_key(&store, &entries[n].key).await;
        let failure = Failure::Dead(error.to_owned());
        assert!(
            store
                .fail(&entries[n].key, &lease.token, failure)
                .await
                .unwrap(),
            "the lease's holder settles it as dead"
        );
    }
    let declined = Filter {
        error_contains: Some("declined".into()),
        ..by_route.clone()
    };
    let found = list_all(&store, &declined, 10).await;
    assert_eq!(found.len(), 1, "one dead letter whose error says declined");
    assert_eq!(
        found[0].entry.id, "evt_20",
        "the dead letter whose error says declined"
    );
    let dead = list_all(
        &store,
        &Filter {
            state: Some(KeyState::Dead),
            ..by_route.clone()
        },
        10,
    )
    .await;
    assert_eq!(dead.len(), 2, "two dead letters of the route");
    let queued = list_all(
        &store,
        &Filter {
            state: Some(KeyState::Queued),
            ..by_route.clone()
        },
        10,
    )
    .await;
    assert_eq!(queued.len(), 21, "the 21 entries not dead are queued");
}

/// A listing reads the entries' bodies and kept headers only when its filter asks
/// (`with_bodies`); `find` always reads them. Which entries match does not change.
pub async fn a_listing_reads_bodies_only_when_asked<St: InboxAdmin>(store: St) {
    let route = fresh("bodies");
    let mut entry = delivery(&route, "evt_body");
    entry
        .headers
        .insert("x-event-type", "email.bounced".parse().unwrap());
    store.enqueue(entry.clone()).await.unwrap();
    let by_route = Filter {
        route: Some(route.clone()),
        ..Filter::default()
    };
    let bare = list_all(&store, &by_route, 10).await;
    assert_eq!(bare.len(), 1, "one entry of the route listed");
    assert_eq!(
        bare[0].entry.key, entry.key,
        "the entry of the route listed"
    );
    assert!(bare[0].entry.body.is_empty(), "{:?}", bare[0].entry.body);
    assert!(
        bare[0].entry.headers.is_empty(),
        "a listing without with_bodies reads no headers"
    );
    let with_bodies = Filter {
        with_bodies: true,
        ..by_route
    };
    let full = list_all(&store, &with_bodies, 10).await;
    assert_eq!(full.len(), 1, "one entry of the route listed with bodies");
    assert_eq!(
        full[0].entry.body, entry.body,
        "a listing with_bodies reads the body"
    );
    assert_eq!(
        full[0].entry.headers, entry.headers,
        "a listing with_bodies reads the kept headers"
    );
    let found = find(&store, &entry.key).await;
    assert_eq!(
        (found.entry.body, found.entry.headers),
        (entry.body, entry.headers),
        "find reads the body and kept headers"
    );
}

/// Every dead letter matching a filter is re-queued, in calls that each re-queue at most their
/// limit and go on from their cursor; the others stay dead.
pub async fn requeue_matching_redrives_in_bounded_calls<St: InboxAdmin>(store: St) {
    let route = fresh("bulk");
    let mut poisoned = Vec::new();
    for n in 0..30 {
        let entry = delivery(&route, &format!("evt_{n}"));
        store.enqueue(entry.clone()).await.unwrap();
        let lease = take_key(&store, &entry.key).await;
        let error = if n < 26 {
            "downstream 503"
        } else {
            "invalid payload"
        };
        let failure = Failure::Dead(error.to_owned());
        assert!(
            store.fail(&entry.key, &lease.token, failure).await.unwrap(),
            "the lease's holder settles it as dead"
        );
        poisoned.push((entry.key, n < 26));
    }
    let filter = Filter {
        route: Some(route.clone()),
        error_contains: Some("503".into()),
        ..Filter::default()
    };
    let mut total = 0;
    let mut cursor: Option<String> = None;
    let mut calls = 0;
    loop {
        let done = store
            .requeue_matching(&filter, cursor.as_deref(), 8)
            .await
            .unwrap();
        assert!(
            done.requeued <= 8,
            "one call re-queues at most its limit: {done:?}"
        );
        total += done.requeued;
        calls += 1;
        assert!(calls < 200, "the re-queue never ends");
        match done.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(
        total, 26,
        "every dead letter with 503 in its error is re-queued, once"
    );
    for (key, matched) in &poisoned {
        let state = find(&store, key).await.state;
        let expected = if *matched {
            KeyState::Queued
        } else {
            KeyState::Dead
        };
        assert_eq!(
            state, expected,
            "the matching dead letters queued, the others still dead"
        );
    }
    // Nothing left to re-queue: a second pass finds no dead letter matching.
    let again = store.requeue_matching(&filter, None, 100).await.unwrap();
    assert_eq!(
        again.requeued, 0,
        "a second pass finds nothing left to re-queue"
    );
}

/// A discarded dead letter is gone without running; its key stays known, so the sender's
/// next retry is a duplicate. Only a dead letter is discarded.
pub async fn discard_drops_a_dead_letter_and_keeps_its_key<St: InboxAdmin>(store: St) {
    let route = fresh("discard");
    let entry = delivery(&route, "evt_poison");
    store.enqueue(entry.clone()).await.unwrap();
    assert!(
        !store.discard(&entry.key, RETENTION).await.unwrap(),
        "a queued entry is not discarded"
    );
    let lease = take_key(&store, &entry.key).await;
    let failure = Failure::Dead("poison".to_owned());
    assert!(
        store.fail(&entry.key, &lease.token, failure).await.unwrap(),
        "the lease's holder settles it as dead"
    );
    assert!(
        store.discard(&entry.key, RETENTION).await.unwrap(),
        "a dead letter is discarded"
    );
    assert!(
        !store.discard(&entry.key, RETENTION).await.unwrap(),
        "a discarded key is no longer dead: a second discard is refused"
    );
    assert_eq!(
        find(&store, &entry.key).await.state,
        KeyState::Done,
        "a discarded dead letter is found done"
    );
    assert_eq!(
        store.enqueue(entry.clone()).await.unwrap(),
        Enqueued::Duplicate(KeyState::Done),
        "a discarded key is a duplicate, answered done"
    );
    let dead = Filter {
        route: Some(route.clone()),
        state: Some(KeyState::Dead),
        ..Filter::default()
    };
    assert!(
        list_all(&store, &dead, 10).await.is_empty(),
        "a discarded dead letter is no longer listed as dead"
    );
}

/// Paused, no take hands out anything (through every handle of the inbox) and a worker starts
/// nothing; resumed, an idle worker starts the waiting entry within a second.
pub async fn pause_stops_every_take_and_resume_wakes<St: InboxAdmin + Clone>(store: St) {
    let route = fresh("pause");
    assert!(!store.is_paused().await.unwrap(), "not paused");
    store.pause().await.unwrap();
    assert!(store.is_paused().await.unwrap(), "paused once paused");
    let entry = delivery(&route, "evt_wait");
    store.enqueue(entry.clone()).await.unwrap();
    assert!(store.take(10, LONG).await.unwrap().is_empty(), "paused");

    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let handler = tower::service_fn(move |_request: InboxRequest| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Infallible>(()) }
    });
    let worker = Worker::new(store.clone(), handler).poll_interval(Duration::from_secs(60));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(worker.run(async {
        stopped.await.ok();
    }));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "a paused inbox runs nothing"
    );
    assert_eq!(
        find(&store, &entry.key).await.state,
        KeyState::Queued,
        "paused: the entry still waits"
    );

    let resumed = Instant::now();
    store.resume().await.unwrap();
    assert!(!store.is_paused().await.unwrap(), "not paused");
    while find(&store, &entry.key).await.state != KeyState::Done {
        assert!(
            resumed.elapsed() < Duration::from_secs(1),
            "not done within a second of the resume"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.send(()).unwrap();
    tokio::time::timeout(DEADLINE, run).await.unwrap().unwrap();
}

/// A worker's attempts are kept: an entry that failed twice then succeeded is found by its
/// correlation id, done, with two failed attempts (their errors) and one success.
pub async fn a_worker_records_every_attempt<St: InboxAdmin + Clone>(store: St) {
    let route = fresh("attempts");
    let entry = delivery(&route, "evt_flaky");
    store.enqueue(entry.clone()).await.unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let handler = tower::service_fn(move |_request: InboxRequest| {
        let call = counted.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            if call <= 2 {
                return Err(format!("smtp said 451 (call {call})"));
            }
            Ok(())
        }
    });
    let backoff = Backoff::new(Duration::from_millis(20))
        .max_delay(Duration::from_millis(40))
        .max_attempts(5);
    let worker = Worker::new(store.clone(), handler).retry(backoff);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(worker.run(async {
        stopped.await.ok();
    }));
    let by_correlation = Filter {
        correlation_id: Some(entry.correlation_id.clone()),
        ..Filter::default()
    };
    let start = Instant::now();
    let found = loop {
        let found = list_all(&store, &by_correlation, 50).await;
        if found
            .first()
            .is_some_and(|info| info.state == KeyState::Done)
        {
            break found;
        }
        assert!(start.elapsed() < DEADLINE, "not done: {found:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    stop.send(()).unwrap();
    tokio::time::timeout(DEADLINE, run).await.unwrap().unwrap();
    assert_eq!(found.len(), 1, "the one entry done, listed once");
    let outcomes: Vec<_> = found[0].history.iter().map(|a| a.outcome.clone()).collect();
    assert_eq!(
        outcomes,
        [
            AttemptOutcome::Failed("smtp said 451 (call 1)".to_owned()),
            AttemptOutcome::Failed("smtp said 451 (call 2)".to_owned()),
            AttemptOutcome::Succeeded,
        ],
        "the outcome of each attempt: two failures with their errors, then a success"
    );
    let numbers: Vec<_> = found[0].history.iter().map(|a| a.number).collect();
    assert_eq!(numbers, [1, 2, 3], "the attempts numbered 1, 2, 3");
    assert!(
        found[0].history.iter().all(|a| a.duration.is_some()),
        "every ended attempt has a duration"
    );
}

/// After the last attempt the entry is a dead letter with its last error; re-queued, it runs
/// again from its first attempt.
pub async fn dead_letters_and_requeue<St: InboxAdmin>(store: St) {
    let first = dead_letter(&store, "dead", "gateway said no").await;
    assert!(
        store.take(10, LONG).await.unwrap().is_empty(),
        "a dead letter is not taken"
    );
    assert_eq!(
        store.enqueue(first.clone()).await.unwrap(),
        Enqueued::Duplicate(KeyState::Dead),
        "a later delivery of a dead letter's key is a duplicate, answered dead"
    );
    let dead = store.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1, "one dead letter");
    assert_eq!(
        (dead[0].entry.key.clone(), dead[0].last_error.as_str()),
        (first.key.clone(), "gateway said no")
    );
    assert_eq!(
        store.counts().await.unwrap().dead,
        1,
        "the dead letter is counted as dead"
    );
    assert!(
        store.requeue(&first.key).await.unwrap(),
        "a dead letter is re-queued"
    );
    assert!(
        !store.requeue(&first.key).await.unwrap(),
        "only a dead letter is re-queued"
    );
    let again = take_one(&store, "due again").await;
    assert_eq!(
        again.entry.attempts, 1,
        "a re-queued dead letter counts its attempts from 1 again"
    );
    completes(&store, &first.key, again.token, RETENTION).await;
    assert!(
        store.dead_letters(10).await.unwrap().is_empty(),
        "a re-queued and completed entry is no dead letter"
    );
}

/// An operator's re-queue is announced as an enqueue is: a worker idle meanwhile (its fallback
/// poll a minute) starts the re-queued dead letter within a second or two.
pub async fn a_requeue_wakes_an_idle_worker<St: InboxAdmin + Clone>(store: St) {
    let first = dead_letter(&store, "requeue-wakes", "gateway said no").await;
    // Idle: the only entry is a dead letter.
    let (gated, stop, run) = idle_worker(store.clone()).await;
    assert_eq!(
        gated.calls.load(Ordering::SeqCst),
        0,
        "a dead letter does not run"
    );
    let requeued = Instant::now();
    assert!(
        store.requeue(&first.key).await.unwrap(),
        "a dead letter is re-queued"
    );
    gated.started().await;
    let woken = requeued.elapsed();
    assert!(
        woken < Duration::from_secs(2),
        "the idle worker started the re-queued entry {woken:?} after the re-queue (expected \
         within 2 s: a re-queue is announced)"
    );
    stop_worker(stop, run).await;
}

/// A done entry keeps what an operator finds of it, not its body or headers: `find` shows
/// them empty.
pub async fn a_done_entry_keeps_no_body_or_headers<St: InboxAdmin>(store: St) {
    let mut first = delivery(&fresh("done-body"), "evt_done");
    first
        .headers
        .insert("x-event-type", "email.bounced".parse().unwrap());
    store.enqueue(first.clone()).await.unwrap();
    let lease = take_key(&store, &first.key).await;
    completes(&store, &first.key, lease.token, RETENTION).await;
    let done = find(&store, &first.key).await;
    assert_eq!(done.state, KeyState::Done, "found done");
    assert_eq!(
        done.entry.correlation_id, first.correlation_id,
        "a done entry keeps its correlation id"
    );
    assert!(
        done.entry.body.is_empty(),
        "a done entry keeps no body: {:?}",
        done.entry.body
    );
    assert!(
        done.entry.headers.is_empty(),
        "a done entry keeps no headers: {:?}",
        done.entry.headers
    );
}

/// `dead_letters` come oldest first, by the time their entry was enqueued, whatever the order
/// they died in; a limit keeps the oldest.
pub async fn dead_letters_come_oldest_first<St: InboxAdmin>(store: St) {
    let now = SystemTime::now();
    let mut errors = Vec::new();
    for (n, age) in [(0, 30), (1, 60), (2, 10)] {
        let mut letter = entry("dead-order");
        letter.enqueued_at = whole_ms(now - Duration::from_secs(age));
        store.enqueue(letter.clone()).await.unwrap();
        let lease = take_key(&store, &letter.key).await;
        let error = format!("enqueued {age} s ago (died {n})");
        let failure = Failure::Dead(error.clone());
        assert!(
            store
                .fail(&letter.key, &lease.token, failure)
                .await
                .unwrap(),
            "the lease's holder settles it as dead"
        );
        errors.push(error);
    }
    let listed = |dead: Vec<crate::inbox::DeadLetter>| -> Vec<String> {
        dead.into_iter().map(|letter| letter.last_error).collect()
    };
    assert_eq!(
        listed(store.dead_letters(10).await.unwrap()),
        [errors[1].clone(), errors[0].clone(), errors[2].clone()],
        "dead letters oldest enqueued first"
    );
    assert_eq!(
        listed(store.dead_letters(2).await.unwrap()),
        [errors[1].clone(), errors[0].clone()],
        "a limit of two keeps the two oldest"
    );
}

/// A discarded dead letter's key is kept as done for the retention `discard` was given, and no
/// longer: a delivery of it right away and a second in is a duplicate, one after it is queued.
pub async fn a_discarded_key_is_kept_for_its_retention_only<St: InboxAdmin>(store: St) {
    let first = dead_letter(&store, "discarded-expires", "poison").await;
    let asked = Instant::now();
    assert!(
        store.discard(&first.key, SHORT_RETENTION).await.unwrap(),
        "a dead letter is discarded"
    );
    kept_for_its_retention(&store, &first, asked, Instant::now(), "discarded").await;
}

/// An attempt whose lease ran out unsettled, and which another take took over, is marked
/// `LeaseLost` in the entry's history; the attempt taking over runs.
pub async fn a_taken_over_attempt_is_marked_lease_lost<St: InboxAdmin>(store: St) {
    let first = entry("lease-lost");
    store.enqueue(first.clone()).await.unwrap();
    let short = Duration::from_millis(300);
    let lost = store.take(10, short).await.unwrap();
    assert_eq!(lost.len(), 1, "the entry is taken under a short lease");
    let again = take_key(&store, &first.key).await;
    assert_eq!(
        again.entry.attempts, 2,
        "taken over after the lease ran out"
    );
    let found = find(&store, &first.key).await;
    let attempts: Vec<_> = found
        .history
        .iter()
        .map(|attempt| (attempt.number, attempt.outcome.clone()))
        .collect();
    assert_eq!(
        attempts,
        [(1, AttemptOutcome::LeaseLost), (2, AttemptOutcome::Running)],
        "(number, outcome) of each attempt: the one taken over is marked lease lost"
    );
    completes(&store, &first.key, again.token, RETENTION).await;
}

/// `counts().oldest_age` is the age of the oldest entry that is not dead: a dead letter
/// enqueued a minute ago does not count, a live entry of that age does.
pub async fn oldest_age_counts_live_entries_only<St: InboxAdmin>(store: St) {
    let mut old = entry("oldest-dead");
    old.enqueued_at = whole_ms(SystemTime::now() - Duration::from_secs(60));
    store.enqueue(old.clone()).await.unwrap();
    let age = store.counts().await.unwrap().oldest_age;
    assert!(
        age.is_some_and(|age| age >= Duration::from_secs(60)),
        "the oldest age of one live entry enqueued 60 s ago: {age:?}"
    );
    let lease = take_one(&store, "the entry is due").await;
    let failure = Failure::Dead("poison".to_owned());
    assert!(
        store.fail(&old.key, &lease.token, failure).await.unwrap(),
        "the lease's holder settles it as dead"
    );
    let age = store.counts().await.unwrap().oldest_age;
    assert_eq!(age, None, "only a dead letter: no oldest age");
    store.enqueue(entry("oldest-live")).await.unwrap();
    let age = store.counts().await.unwrap().oldest_age;
    assert!(
        age.is_some_and(|age| age < Duration::from_secs(30)),
        "the oldest age is the new entry's, not the dead letter's 60 s: {age:?}"
    );
}

/// The inbox admin contract as `#[tokio::test]`s, one per case, in a module of the calling
/// file (feature `test-util`; see [`test_util`](crate::test_util)).
///
/// `$make` is as for [`inbox_contract!`](crate::inbox_contract): `(inbox, guard)`, where the
/// inbox implements [`InboxAdmin`](crate::inbox::InboxAdmin).
#[macro_export]
macro_rules! inbox_admin_contract {
    ($make:expr) => {
        $crate::inbox_admin_contract!(@tests $make;
            find_tells_each_state_and_its_attempts,
            dead_letters_and_requeue,
            list_pages_through_every_match,
            a_listing_reads_bodies_only_when_asked,
            requeue_matching_redrives_in_bounded_calls,
            discard_drops_a_dead_letter_and_keeps_its_key,
            pause_stops_every_take_and_resume_wakes,
            a_worker_records_every_attempt,
            a_requeue_wakes_an_idle_worker,
            a_done_entry_keeps_no_body_or_headers,
            dead_letters_come_oldest_first,
            a_discarded_key_is_kept_for_its_retention_only,
            a_taken_over_attempt_is_marked_lease_lost,
            oldest_age_counts_live_entries_only,
        );
    };
    (@tests $make:expr; $($name:ident),* $(,)?) => {
        mod inbox_admin_contract_tests {
            use super::*;
            $crate::suite_cases!($crate::test_util::inbox_admin; $make; $($name),*);
        }
    };
}

pub use crate::inbox_admin_contract;
