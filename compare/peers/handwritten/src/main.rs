//! The pattern a webhook guide gives when it says "make your receiver idempotent", written by
//! hand with no idempotency crate, on plain axum 0.8: look the delivery id up, process, remember
//! the id once processing succeeded.
//!
//! - Without `REDIS_URL`: a `Mutex<HashSet<String>>` in the process.
//! - With `REDIS_URL`: fred 10, `EXISTS seen:<id>` before processing and
//!   `SET seen:<id> 1 EX 604800` after it succeeded.
//!
//! The check and the mark are separate steps, so two concurrent deliveries of one id are both
//! processed, and a crash between processing and the mark forgets the delivery. It is not a
//! correct receiver: it is the floor of what remembering delivery ids costs.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use common::{App, RETENTION};
use fred::prelude::{Builder, Client, ClientLike, Config, Expiration, KeysInterface};

/// Where the ids of processed deliveries are kept.
#[derive(Clone)]
enum Seen {
    Memory(Arc<Mutex<HashSet<String>>>),
    Redis(Client),
}

impl Seen {
    async fn was_processed(&self, id: &str) -> Result<bool, fred::error::Error> {
        match self {
            Self::Memory(set) => Ok(set.lock().unwrap().contains(id)),
            Self::Redis(redis) => Ok(redis.exists::<u32, _>(format!("seen:{id}")).await? > 0),
        }
    }

    async fn mark_processed(&self, id: &str) -> Result<(), fred::error::Error> {
        match self {
            Self::Memory(set) => {
                set.lock().unwrap().insert(id.to_owned());
                Ok(())
            }
            Self::Redis(redis) => {
                let ttl = Expiration::EX(RETENTION.as_secs() as i64);
                redis.set(format!("seen:{id}"), 1, Some(ttl), None, false).await
            }
        }
    }
}

async fn kalipto(State(app): State<App<Seen>>, headers: HeaderMap, _body: Bytes) -> Response {
    let Some(id) = common::delivery_id(&headers) else {
        return common::missing_id();
    };
    match app.seen.was_processed(id).await {
        Ok(true) => return common::ok(),
        Ok(false) => {}
        Err(_) => return common::store_unavailable(),
    }
    if let Err(failed) = common::process(&app.effects, &headers, id).await {
        return failed;
    }
    match app.seen.mark_processed(id).await {
        Ok(()) => common::ok(),
        Err(_) => common::store_unavailable(),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seen = match common::redis_url() {
        Some(url) => {
            let redis = Builder::from_config(Config::from_url(&url)?).build()?;
            redis.init().await?;
            Seen::Redis(redis)
        }
        None => Seen::Memory(Arc::default()),
    };
    common::serve_receiver(seen, kalipto).await?;
    Ok(())
}
