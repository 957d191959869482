//! What the admin service's and the admin page's tests set up alike: the deliveries of one
//! route in a `MemoryInbox`, some of them made dead letters, and a request sent to the app.
#![cfg(feature = "admin")]

use std::time::Duration;

use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_idempotency::inbox::{Failure, InboxStore, MemoryInbox};
use tower_idempotency::store::StoreKey;
use tower_idempotency::test_util::values;

const LEASE: Duration = Duration::from_secs(30);

/// The deliveries of one route, enqueued as its door enqueues them.
pub struct Deliveries {
    /// The route (the door's namespace).
    pub route: &'static str,
    /// The path the door is mounted at.
    pub scope: &'static str,
    /// What each body holds after its `"event_id"` member (`,"name":value` pairs).
    pub more: &'static str,
    /// Why the dead letters failed.
    pub why: &'static str,
}

impl Deliveries {
    /// The store key of the delivery `id`.
    pub fn key(&self, id: &str) -> StoreKey {
        StoreKey::new(self.route, Some(self.scope), id)
    }

    /// Enqueues the delivery `id` with correlation id `corr-{id}`.
    pub async fn enqueue(&self, inbox: &MemoryInbox, id: &str) {
        let body = Bytes::from(format!("{{\"event_id\":\"{id}\"{}}}", self.more));
        let mut entry = values::inbox_entry(self.key(id), body, format!("corr-{id}"));
        (entry.route, entry.id) = (self.route.to_owned(), id.to_owned());
        inbox.enqueue(entry).await.unwrap();
    }

    /// A fresh inbox holding `dead` as dead letters (see [`Deliveries::kill`]), then `queued`.
    pub async fn inbox(&self, dead: &[&str], queued: &[&str]) -> MemoryInbox {
        let inbox = MemoryInbox::default();
        self.kill(&inbox, dead).await;
        for id in queued {
            self.enqueue(&inbox, id).await;
        }
        inbox
    }

    /// `ids` made dead letters, after one failed attempt each (every due entry is taken).
    pub async fn kill(&self, inbox: &MemoryInbox, ids: &[&str]) {
        for id in ids {
            self.enqueue(inbox, id).await;
        }
        for lease in inbox.take(ids.len(), LEASE).await.unwrap() {
            let why = Failure::Dead(self.why.to_owned());
            assert!(
                inbox
                    .fail(&lease.entry.key, &lease.token, why)
                    .await
                    .unwrap()
            );
        }
    }
}

/// Sends `method uri` with `headers` and `body` to `app`: the answer's status, headers and
/// body.
pub async fn send(
    app: &Router,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: impl Into<axum::body::Body>,
) -> (StatusCode, HeaderMap, Bytes) {
    let mut request = Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(body.into()).unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, bytes)
}
