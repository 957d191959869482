//! The correct hand-written receiver, no idempotency crate: the least a careful team writes by
//! hand to apply each delivery once, on plain axum 0.8. It is the floor the crate's first
//! deliveries are measured against.
//!
//! - Without `REDIS_URL`: one `Mutex<HashMap>` critical section claims (absent → in flight; in
//!   flight → 409; done → ack), another one settles (done after success, removed after failure).
//! - With `REDIS_URL` (fred 10): `SET seen:<id> <token> NX PX 30000 GET` claims in one round
//!   trip (an old value `done` is a duplicate, any other one is in flight), then one token-checked
//!   `EVALSHA` marks it done for 7 days after success, or deletes it after a failure.
//!
//! No lease renewal, no stored response, no metrics, no tracing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use common::{App, RETENTION};
use fred::prelude::{
    Builder, Client, ClientLike, Config, Expiration, KeysInterface, LuaInterface, SetOptions,
};

/// How long an in-flight mark holds before a crashed receiver's delivery may be claimed again.
const IN_FLIGHT_MS: i64 = 30_000;
/// The value of a processed delivery's mark.
const DONE: &str = "done";
/// Marks the delivery done, only while the claim's token still holds it.
const COMPLETE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
    return redis.call('SET', KEYS[1], 'done', 'EX', ARGV[2]) end return false";
/// Deletes the claim, only while its token still holds it.
const RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
    return redis.call('DEL', KEYS[1]) end return 0";

/// What a claim found.
enum Claim {
    /// Ours, under this token.
    Taken(String),
    /// Processed before: acknowledge.
    Done,
    /// Another delivery of the id is being processed.
    InFlight,
}

/// Where deliveries are marked.
#[derive(Clone)]
enum Seen {
    /// `false`: in flight, `true`: done.
    Memory(Arc<Mutex<HashMap<String, bool>>>),
    Redis { redis: Client, complete: Arc<str>, release: Arc<str> },
}

/// A token unique to this process's claims.
fn token() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("{:x}.{:x}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

impl Seen {
    async fn claim(&self, id: &str) -> Result<Claim, fred::error::Error> {
        match self {
            Self::Memory(map) => {
                let mut map = map.lock().unwrap();
                Ok(match map.get(id) {
                    Some(true) => Claim::Done,
                    Some(false) => Claim::InFlight,
                    None => {
                        map.insert(id.to_owned(), false);
                        Claim::Taken(String::new())
                    }
                })
            }
            Self::Redis { redis, .. } => {
                let token = token();
                let ttl = Some(Expiration::PX(IN_FLIGHT_MS));
                let old: Option<String> =
                    redis.set(format!("seen:{id}"), token.as_str(), ttl, Some(SetOptions::NX), true).await?;
                Ok(match old.as_deref() {
                    None => Claim::Taken(token),
                    Some(DONE) => Claim::Done,
                    Some(_) => Claim::InFlight,
                })
            }
        }
    }

    async fn settle(&self, id: &str, token: String, success: bool) -> Result<(), fred::error::Error> {
        match self {
            Self::Memory(map) => {
                let mut map = map.lock().unwrap();
                if success {
                    map.insert(id.to_owned(), true);
                } else {
                    map.remove(id);
                }
                Ok(())
            }
            Self::Redis { redis, complete, release } => {
                let key = format!("seen:{id}");
                if success {
                    let args = vec![token, RETENTION.as_secs().to_string()];
                    redis.evalsha::<fred::types::Value, _, _, _>(&**complete, key, args).await?;
                } else {
                    redis.evalsha::<fred::types::Value, _, _, _>(&**release, key, token).await?;
                }
                Ok(())
            }
        }
    }
}

async fn kalipto(State(app): State<App<Seen>>, headers: HeaderMap, _body: Bytes) -> Response {
    let Some(id) = common::delivery_id(&headers) else {
        return common::missing_id();
    };
    let token = match app.seen.claim(id).await {
        Ok(Claim::Taken(token)) => token,
        Ok(Claim::Done) => return common::ok(),
        Ok(Claim::InFlight) => {
            return (StatusCode::CONFLICT, [("retry-after", "1")], "in flight").into_response();
        }
        Err(_) => return common::store_unavailable(),
    };
    let processed = common::process(&app.effects, &headers, id).await;
    match (app.seen.settle(id, token, processed.is_ok()).await, processed) {
        (Ok(()), Ok(())) => common::ok(),
        (Ok(()), Err(failed)) => failed,
        (Err(_), _) => common::store_unavailable(),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seen = match common::redis_url() {
        Some(url) => {
            let redis = Builder::from_config(Config::from_url(&url)?).build()?;
            redis.init().await?;
            let complete: String = redis.script_load(COMPLETE).await?;
            let release: String = redis.script_load(RELEASE).await?;
            Seen::Redis { redis, complete: complete.into(), release: release.into() }
        }
        None => Seen::Memory(Arc::default()),
    };
    common::serve_receiver(seen, kalipto).await?;
    Ok(())
}
