//! The demo's inbox workers without an HTTP server (issue #33): receivers and workers in
//! separate processes on one shared inbox.
//!
//! The demo (`webhook_receiver`) receives `POST /inbox/email` into the inbox on its store;
//! this binary runs the same workers on the same store, so either can be started, stopped or
//! killed apart from the other (the demo with `INBOX_WORKERS=0` only receives). The first line
//! of stdout is `worker ready`; it runs until Ctrl-C, then finishes what it runs.
//!
//! The store, one of which must be set (a memory inbox is not shared):
//!
//! - `DATABASE_URL=sqlite://FILE` or `postgres://...`: the effect (the event id counted, the
//!   message's status) is a row of the demo tables `demo_effects` and `demo_messages`, written
//!   in the transaction that marks the entry done (`complete_in_tx`): a worker killed at any
//!   point leaves both or neither, so every event is applied **exactly once**, and the demo's
//!   `GET /effects` and `GET /messages/{id}` show it.
//! - `REDIS_URL=redis://...`: the effect is an `INCR` of `demo:effect:<event_id>` (and a `SET`
//!   of `demo:status:<message_id>`), then the worker completes: **at least once**, as a worker
//!   killed between the two applies the event again after its lease. Exactly once on Redis
//!   needs an effect idempotent by the key (`SET NX` of the event id) or written with the
//!   record.
//!
//! `INBOX_WORKERS` (entries at once, 2), `INBOX_MAX_ATTEMPTS` (5), `INBOX_RETRY_BASE_MS` (200),
//! `INBOX_LEASE_MS` (10 000), as the demo's.
//!
//! ```sh
//! cargo build --all-features --example webhook_receiver --example inbox_worker
//! export DATABASE_URL=sqlite:///tmp/inbox.db
//! INBOX_WORKERS=0 target/debug/examples/webhook_receiver &
//! target/debug/examples/inbox_worker & target/debug/examples/inbox_worker &
//! curl -si localhost:3000/inbox/email -H 'X-Request-Id: req-1' \
//!   -d '{"event_id":"ev_1","message_id":"m_1","type":"email.delivered","occurred_at":"2026-12-03T10:00:00Z"}'
//! curl -s localhost:3000/effects; curl -s localhost:3000/messages/m_1
//! ```

#[path = "webhook_receiver/email_inbox.rs"]
mod email_inbox;

use email_inbox::{BoxError, Effects, InboxSettings, inbox_on, table_effects};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // The store as the demo connects to it (REDIS_URL first).
    let url = std::env::var("REDIS_URL").or_else(|_| std::env::var("DATABASE_URL"));
    let url = url.map_err(|_| "set REDIS_URL or DATABASE_URL: a memory inbox is not shared")?;
    let inbox = inbox_on(&tower_idempotency::store::connect(&url).await?).await?;
    let effects = match (table_effects(&inbox), inbox.as_redis()) {
        (Some(table), _) => table,
        (None, Some(redis)) => Effects::Redis(redis.client().clone()),
        (None, _) => {
            return Err("set REDIS_URL or DATABASE_URL: a memory inbox is not shared".into());
        }
    };
    let worker = InboxSettings::from_env()?.worker(inbox, effects);
    println!("worker ready");
    worker
        .run(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
    Ok(())
}
