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
//! - `REDIS_URL=redis://...`: the effect is an `HINCRBY` of the event id in
//!   `demo:effects:{inbox:inbox_email}` and an `HSET` of the message's status in
//!   `demo:status:{inbox:inbox_email}`, made by the script that marks the entry done
//!   (`RedisInbox::complete_with`, one token-checked step): **exactly once**, even for a worker
//!   paused past its lease or killed at any point. `REDIS_WAIT_REPLICAS=N` (and
//!   `REDIS_WAIT_TIMEOUT_MS`, default 50) makes each completion wait for N replicas, as the
//!   demo's enqueue does, so that a failover loses no completion.
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

use email_inbox::{BoxError, InboxSettings, durable_from_env, inbox_on, shared_effects};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // The store as the demo connects to it (REDIS_URL first).
    let url = std::env::var("REDIS_URL").or_else(|_| std::env::var("DATABASE_URL"));
    let url = url.map_err(|_| "set REDIS_URL or DATABASE_URL: a memory inbox is not shared")?;
    let store = durable_from_env(tower_idempotency::store::connect(&url).await?)?;
    let inbox = inbox_on(&store).await?;
    let Some(effects) = shared_effects(&inbox) else {
        return Err("set REDIS_URL or DATABASE_URL: a memory inbox is not shared".into());
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
