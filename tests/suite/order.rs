//! Events of one object in order, through a real axum router, on every store: an older
//! transition never overtakes a newer one, across two layer instances sharing the store.

use std::collections::HashMap;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use http::{Request, StatusCode};
use tower_idempotency::key::JsonPathKey;
use tower_idempotency::order::{EventOrder, PositionAt, StaleEvents};
use tower_idempotency::{IdempotencyLayer, OrderedStore};

use super::app::{Effects, router};
use super::{assert_problem, send, served};

/// An ordered route: keyed by `$.event_id`, ordered by `$.object` and `$.seq`.
fn ordered_layer<St: OrderedStore>(
    store: St,
    namespace: &str,
) -> IdempotencyLayer<St, JsonPathKey> {
    let order = EventOrder::new(
        JsonPathKey::new("$.object").unwrap(),
        PositionAt::sequence("$.seq").unwrap(),
    );
    IdempotencyLayer::webhook(store)
        .namespace(namespace)
        .lease(Duration::from_secs(5))
        .key(JsonPathKey::new("$.event_id").unwrap())
        .order(order)
}

fn event(id: &str, object: &str, seq: i64) -> String {
    format!(r#"{{"event_id":"{id}","object":"{object}","seq":{seq}}}"#)
}

fn deliver(body: String, headers: &[(&str, &str)]) -> Request<Body> {
    let mut builder = Request::post("/ordered").header("content-type", "application/json");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Body::from(body)).unwrap()
}

/// `delivered`@2 then `processed`@1: the second is 200 stale, with no effect; then `failed`@3
/// is processed; redeliveries of any of them are duplicates (the stale one's key was
/// recorded). A missing position is 400.
pub async fn a_stale_event_is_acknowledged_without_the_handler<St: OrderedStore>(store: St) {
    let (effects, app) = served(ordered_layer(store, &super::ns("stale")));
    let (status, _, _) = send(&app, deliver(event("e2", "m1", 2), &[])).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, headers, body) = send(&app, deliver(event("e1", "m1", 1), &[])).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-stale"], "true");
    assert!(headers.get("idempotent-replayed").is_none());
    assert_eq!(body, r#"{"ok":true,"stale":true}"#);
    assert_eq!(effects.ordered().state["m1"], 2);
    let (status, _, _) = send(&app, deliver(event("e3", "m1", 3), &[])).await;
    assert_eq!(status, StatusCode::CREATED);
    for id in ["e1", "e2", "e3"] {
        let seq = id[1..].parse().unwrap();
        let (status, headers, _) = send(&app, deliver(event(id, "m1", seq), &[])).await;
        assert_eq!(status, StatusCode::OK, "{id}");
        assert_eq!(headers["idempotent-replayed"], "true", "{id}");
    }
    let ordered = effects.ordered();
    assert_eq!(ordered.state["m1"], 3);
    assert_eq!(
        ordered.effects.get("e1"),
        None,
        "the stale event had no effect"
    );
    assert_eq!((ordered.effects["e2"], ordered.effects["e3"]), (1, 1));
    let (status, headers, body) = send(
        &app,
        deliver(r#"{"event_id":"e9","object":"m1"}"#.into(), &[]),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_problem(&headers, &body, 400, "malformed_order");
}

/// While an event of an object is in flight, another event of the object is 409; once the
/// first completes, the retry is processed or stale as its position says. A failed event lets
/// its object go: the next one is processed.
pub async fn one_event_of_an_object_at_a_time<St: OrderedStore>(store: St) {
    let (effects, app) = served(ordered_layer(store, &super::ns("busy")));
    let slow = {
        let app = app.clone();
        tokio::spawn(async move {
            send(&app, deliver(event("e5", "m1", 5), &[("x-demo-hold", "1")])).await
        })
    };
    effects.wait_started(1).await;
    let (status, headers, body) = send(&app, deliver(event("e4", "m1", 4), &[])).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(headers.contains_key("retry-after"));
    assert_problem(&headers, &body, 409, "object_in_flight");
    // Another object is not held up.
    let (status, _, _) = send(&app, deliver(event("x1", "m2", 1), &[])).await;
    assert_eq!(status, StatusCode::CREATED);
    effects.open_gate();
    assert_eq!(slow.await.unwrap().0, StatusCode::CREATED);
    // The retry of e4 now finds it stale; e6 is processed.
    let (status, headers, _) = send(&app, deliver(event("e4", "m1", 4), &[])).await;
    assert_eq!(
        (status, headers["idempotent-stale"].to_str().unwrap()),
        (StatusCode::OK, "true")
    );
    let (status, _, _) = send(&app, deliver(event("e7", "m1", 7), &[("x-demo-fail", "1")])).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let (status, _, _) = send(&app, deliver(event("e6", "m1", 6), &[])).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "the failed e7 let its object go, its position unrecorded"
    );
    assert_eq!(effects.ordered().state["m1"], 6);
}

/// With `StaleEvents::PassOn`, a stale event reaches the handler marked stale, and its
/// effect (a log of the invalid transition) leaves the object's state alone.
pub async fn a_stale_event_passed_on_is_marked<St: OrderedStore>(store: St) {
    let effects = Effects::default();
    let order = EventOrder::new(
        JsonPathKey::new("$.object").unwrap(),
        PositionAt::sequence("$.seq").unwrap(),
    )
    .stale_events(StaleEvents::PassOn);
    let layer = IdempotencyLayer::webhook(store)
        .namespace(super::ns("pass-on"))
        .key(JsonPathKey::new("$.event_id").unwrap())
        .order(order);
    let app = router(layer, &effects);
    assert_eq!(
        send(&app, deliver(event("e2", "m1", 2), &[])).await.0,
        StatusCode::CREATED
    );
    let (status, headers, _) = send(&app, deliver(event("e1", "m1", 1), &[])).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(headers.get("idempotent-stale").is_none());
    let ordered = effects.ordered();
    assert_eq!(
        ordered.state["m1"], 2,
        "the stale event did not move the state back"
    );
    assert_eq!(
        ordered.log.last().unwrap(),
        &("e1".to_owned(), "m1".to_owned(), 1, true)
    );
    // Its key was recorded: a redelivery is a duplicate.
    let (status, headers, _) = send(&app, deliver(event("e1", "m1", 1), &[])).await;
    assert_eq!(
        (status, headers["idempotent-replayed"].to_str().unwrap()),
        (StatusCode::OK, "true")
    );
}

/// A small deterministic generator (xorshift), so that a failing schedule can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Random interleavings of 24 events over 4 objects, each delivered twice and each delivery
/// retried until acknowledged (at-least-once: some first attempts fail, 409s are retried), from
/// 4 concurrent senders, across two layer instances sharing one store: every event has at most
/// one effect; every object ends in the state of its highest-position event; and an event
/// answered stale had, when answered, a higher one of its object already applied (none
/// arriving at or above the watermark was lost).
pub async fn random_interleavings_keep_each_object_in_order<St: OrderedStore>(store: St) {
    for seed in [0x9E37_79B9_7F4A_7C15_u64, 42, 7777, 123_456_789] {
        let namespace = super::ns("order-props");
        let effects = Effects::default();
        let apps = [
            router(ordered_layer(store.clone(), &namespace), &effects),
            router(ordered_layer(store.clone(), &namespace), &effects),
        ];
        let mut rng = Rng(seed);
        // Distinct positions per object, in a random order of arrival.
        let mut events: Vec<(String, String, i64)> = (0..24)
            .map(|i| {
                (
                    format!("ev{i}"),
                    format!("obj{}", i % 4),
                    (i / 4) as i64 * 10 + (i % 4) as i64,
                )
            })
            .collect();
        for i in (1..events.len()).rev() {
            events.swap(i, rng.below(i + 1));
        }
        // Each event twice (a sender's redelivery), some first attempts failing.
        let mut deliveries = Vec::new();
        for event in &events {
            deliveries.push((event.clone(), rng.below(3) == 0));
            deliveries.push((event.clone(), false));
        }
        let queue = std::sync::Arc::new(std::sync::Mutex::new(deliveries));
        let stale_answers = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let senders: Vec<_> = (0..4)
            .map(|sender| {
                let (queue, apps, effects) = (queue.clone(), apps.clone(), effects.clone());
                let stale_answers = stale_answers.clone();
                let mut rng = Rng(seed ^ ((sender + 1) * 0xA5A5));
                tokio::spawn(async move {
                    deliver_until_acked(&queue, &apps, &effects, &stale_answers, &mut rng).await
                })
            })
            .collect();
        for sender in senders {
            sender.await.unwrap();
        }
        check_order(&events, &effects, &stale_answers.lock().unwrap(), seed);
    }
}

type Queue = std::sync::Mutex<Vec<((String, String, i64), bool)>>;

/// One sender: takes events off the queue and delivers each until it is acknowledged, putting
/// back (with a short pause) the ones answered 409 or 500.
async fn deliver_until_acked(
    queue: &Queue,
    apps: &[Router; 2],
    effects: &Effects,
    stale_answers: &std::sync::Mutex<Vec<(String, Vec<String>)>>,
    rng: &mut Rng,
) {
    let mut attempts = 0;
    loop {
        let Some(((id, object, seq), fail)) = ({
            let mut queue = queue.lock().unwrap();
            let len = queue.len();
            (len > 0).then(|| queue.swap_remove(rng.below(len)))
        }) else {
            return;
        };
        attempts += 1;
        assert!(attempts < 2_000, "deliveries never settled");
        let headers: &[(&str, &str)] = if fail { &[("x-demo-fail", "1")] } else { &[] };
        let app = &apps[rng.below(2)];
        let (status, response_headers, _) =
            send(app, deliver(event(&id, &object, seq), headers)).await;
        match status {
            StatusCode::OK if response_headers.contains_key("idempotent-stale") => {
                // Which events of the object had been applied when the stale answer came.
                let applied = effects
                    .ordered()
                    .log
                    .iter()
                    .filter(|(_, o, s, _)| *o == object && *s > seq)
                    .map(|(e, ..)| e.clone())
                    .collect();
                stale_answers.lock().unwrap().push((id, applied));
            }
            StatusCode::OK | StatusCode::CREATED => {}
            StatusCode::CONFLICT | StatusCode::INTERNAL_SERVER_ERROR => {
                // Redelivered later; a sender's second attempt succeeds.
                queue.lock().unwrap().push(((id, object, seq), false));
                tokio::time::sleep(Duration::from_millis(1 + rng.below(5) as u64)).await;
            }
            other => panic!("unexpected {other} for {id}"),
        }
    }
}

fn check_order(
    events: &[(String, String, i64)],
    effects: &Effects,
    stale_answers: &[(String, Vec<String>)],
    seed: u64,
) {
    let ordered = effects.ordered();
    let mut highest: HashMap<&str, i64> = HashMap::new();
    for (_, object, seq) in events {
        let top = highest.entry(object).or_insert(*seq);
        *top = (*top).max(*seq);
    }
    for (object, top) in &highest {
        assert_eq!(
            ordered.state[*object], *top,
            "seed {seed}: {object} ended out of order"
        );
    }
    for (id, count) in &ordered.effects {
        assert_eq!(*count, 1, "seed {seed}: {id} applied {count} times");
    }
    let stale: HashMap<&str, &Vec<String>> = stale_answers
        .iter()
        .map(|(id, a)| (id.as_str(), a))
        .collect();
    for (id, ..) in events {
        match (ordered.effects.contains_key(id), stale.get(id.as_str())) {
            (true, _) => {}
            (false, Some(applied)) => assert!(
                !applied.is_empty(),
                "seed {seed}: {id} was answered stale with nothing newer applied"
            ),
            (false, None) => panic!("seed {seed}: {id} was neither applied nor stale: lost"),
        }
    }
}
