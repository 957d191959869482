//! A Redis Streams consumer group that gets every message at least once and applies each
//! business id exactly once, with [`Idempotent::once`] on a [`RedisStore`].
//!
//! - The producer `XADD`s the orders, some of them twice (a producer retry: two stream
//!   entries, one business id).
//! - Consumer `a` reads a batch and "crashes": it drops the first half without doing anything
//!   and applies the rest but never `XACK`s them.
//! - Consumer `b` reads the rest, then claims what `a` left pending (`XAUTOCLAIM` with a min
//!   idle time) and processes it again. `once` skips what is already applied.
//!
//! The effect (a counter per business id) must read 1 for every id: the summary says so, and
//! the process exits with status 1 if any id was applied twice or not at all.
//! `IDEMPOTENCY=off` applies without `once`, to show the duplicates it prevents.
//!
//! `REDIS_URL=redis://127.0.0.1:6379 cargo run --features redis --example stream_consumer`

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tower_idempotency::fred::prelude::{ClientLike, Config, Value};
use tower_idempotency::fred::types::{ClusterHash, CustomCommand};
use tower_idempotency::{Idempotent, RedisStore};

type Client = tower_idempotency::fred::clients::Client;
type Fallible<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Distinct business ids produced; every third one is sent twice.
const ORDERS: usize = 9;
/// How long a pending message stays with its consumer before another may claim it.
const MIN_IDLE: Duration = Duration::from_millis(200);
const GROUP: &str = "billing";

/// One stream entry: its stream id and the business id it carries.
struct Message {
    entry: String,
    order: String,
}

/// The consumer side: the stream, the once-runner and the effect it protects.
struct Consumers {
    redis: Client,
    stream: String,
    /// `None` with `IDEMPOTENCY=off`: apply every delivery.
    once: Option<Idempotent>,
    /// The effect: how many times each business id was applied.
    applied: Mutex<BTreeMap<String, u32>>,
}

/// Sends `args` as the Redis command `name` (fred's stream commands need its `i-streams`
/// feature; the crate builds fred without it).
async fn command(redis: &Client, name: &'static str, args: Vec<Value>) -> Fallible<Value> {
    let cmd = CustomCommand::new_static(name, ClusterHash::FirstKey, false);
    Ok(redis.custom(cmd, args).await?)
}

fn args(parts: &[&str]) -> Vec<Value> {
    parts.iter().map(|part| Value::from(*part)).collect()
}

/// The producer: every order once, and every third one again (a retry after a lost reply).
async fn produce(redis: &Client, stream: &str) -> Fallible<usize> {
    let mut sent = 0;
    for n in 0..ORDERS {
        let order = format!("order-{n}");
        let copies = if n % 3 == 0 { 2 } else { 1 };
        for _ in 0..copies {
            command(redis, "XADD", args(&[stream, "*", "order", &order])).await?;
            sent += 1;
        }
    }
    Ok(sent)
}

/// The entries of an `XREADGROUP` or `XAUTOCLAIM` entry list: `[[id, [field, value, ...]], ...]`
/// (an entry deleted meanwhile comes back without fields and is skipped).
fn messages(list: Value) -> Vec<Message> {
    let mut out = Vec::new();
    for entry in list.into_array() {
        let mut parts = entry.into_array().into_iter();
        let (Some(id), Some(fields)) = (parts.next(), parts.next()) else {
            continue;
        };
        let fields: Vec<String> = fields
            .into_array()
            .into_iter()
            .filter_map(|v| v.into_string())
            .collect();
        let order = fields
            .chunks(2)
            .find(|kv| kv.len() == 2 && kv[0] == "order");
        if let (Some(entry), Some(order)) = (id.into_string(), order) {
            out.push(Message {
                entry,
                order: order[1].clone(),
            });
        }
    }
    out
}

impl Consumers {
    /// Up to `count` new messages for `consumer` (`XREADGROUP ... >`).
    async fn read(&self, consumer: &str, count: usize) -> Fallible<Vec<Message>> {
        let reply = command(
            &self.redis,
            "XREADGROUP",
            args(&["GROUP", GROUP, consumer, "COUNT", &count.to_string()])
                .into_iter()
                .chain(args(&["STREAMS", &self.stream, ">"]))
                .collect(),
        )
        .await?;
        // RESP2: [[stream, entries]]; nil when nothing is new.
        let entries = reply.into_array().into_iter().next().map(|stream| {
            let mut parts = stream.into_array();
            if parts.len() == 2 {
                parts.remove(1)
            } else {
                Value::Null
            }
        });
        Ok(entries.map(messages).unwrap_or_default())
    }

    /// Claims for `consumer` the messages pending longer than [`MIN_IDLE`] (`XAUTOCLAIM`).
    async fn claim(&self, consumer: &str) -> Fallible<Vec<Message>> {
        let idle = MIN_IDLE.as_millis().to_string();
        let stream = self.stream.as_str();
        let reply = command(
            &self.redis,
            "XAUTOCLAIM",
            args(&[stream, GROUP, consumer, &idle, "0-0", "COUNT", "100"]),
        )
        .await?;
        // [next cursor, entries, deleted ids]
        Ok(reply
            .into_array()
            .into_iter()
            .nth(1)
            .map(messages)
            .unwrap_or_default())
    }

    /// How many messages the group holds delivered but not acknowledged (`XPENDING`).
    async fn pending(&self) -> Fallible<i64> {
        let reply = command(&self.redis, "XPENDING", args(&[&self.stream, GROUP])).await?;
        Ok(reply
            .into_array()
            .first()
            .and_then(Value::as_i64)
            .unwrap_or(0))
    }

    async fn ack(&self, message: &Message) -> Fallible<()> {
        command(
            &self.redis,
            "XACK",
            args(&[&self.stream, GROUP, &message.entry]),
        )
        .await?;
        Ok(())
    }

    /// The effect: count one application of `order`.
    fn apply(&self, order: &str) {
        *self
            .applied
            .lock()
            .unwrap()
            .entry(order.to_owned())
            .or_default() += 1;
    }

    /// Applies `message` at most once per business id. A replay is success too: the message
    /// is done and may be acknowledged.
    async fn process(&self, message: &Message) -> Fallible<()> {
        let Some(once) = &self.once else {
            self.apply(&message.order);
            return Ok(());
        };
        once.once(&message.order, || async {
            self.apply(&message.order);
            Ok::<_, Infallible>(())
        })
        .await?;
        Ok(())
    }

    /// Processes and acknowledges `batch`; a message whose processing failed (another
    /// consumer holds its key, a store error) stays pending and is claimed again later.
    async fn handle(&self, consumer: &str, batch: &[Message]) -> Fallible<()> {
        for message in batch {
            match self.process(message).await {
                Ok(()) => self.ack(message).await?,
                Err(err) => println!("{consumer}: {} left pending: {err}", message.entry),
            }
        }
        Ok(())
    }
}

/// Consumer `a`: one batch, then a "crash": the first half dropped before doing anything, the
/// rest applied but never acknowledged.
async fn crashing_consumer(c: &Consumers) -> Fallible<usize> {
    let batch = c.read("a", 6).await?;
    for message in &batch[batch.len() / 2..] {
        c.process(message).await?;
    }
    println!(
        "a: read {}, applied {}, acked 0, crashed",
        batch.len(),
        batch.len() - batch.len() / 2
    );
    Ok(batch.len())
}

/// Consumer `b`: everything new, then whatever stays pending, claimed once idle long enough,
/// until nothing is pending (bounded).
async fn surviving_consumer(c: &Consumers) -> Fallible<usize> {
    loop {
        let batch = c.read("b", 4).await?;
        if batch.is_empty() {
            break;
        }
        c.handle("b", &batch).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut claimed = 0;
    while c.pending().await? > 0 {
        if Instant::now() > deadline {
            return Err("messages still pending after 10 s".into());
        }
        let batch = c.claim("b").await?;
        claimed += batch.len();
        c.handle("b", &batch).await?;
        // The claim waits for MIN_IDLE; poll again shortly rather than guessing when.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("b: claimed {claimed} from a");
    Ok(claimed)
}

/// The effect's verdict: `(ids applied exactly once, ids applied twice or more, ids missing)`.
fn verdict(applied: &BTreeMap<String, u32>) -> (usize, Vec<String>, Vec<String>) {
    let ids = (0..ORDERS).map(|n| format!("order-{n}"));
    let (mut once, mut twice, mut missing) = (0, Vec::new(), Vec::new());
    for id in ids {
        match applied.get(&id).copied().unwrap_or(0) {
            0 => missing.push(id),
            1 => once += 1,
            n => twice.push(format!("{id}×{n}")),
        }
    }
    (once, twice, missing)
}

async fn connect() -> Fallible<Client> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let redis = Client::new(Config::from_url(&url)?, None, None, None);
    redis.init().await?;
    Ok(redis)
}

#[tokio::main]
async fn main() -> Fallible<()> {
    let redis = connect().await?;
    // A fresh stream and namespace per run: a rerun on the same Redis starts clean.
    let run = format!("{}-{}", std::process::id(), run_suffix());
    let stream = format!("orders:{run}");
    command(
        &redis,
        "XGROUP",
        args(&["CREATE", &stream, GROUP, "0", "MKSTREAM"]),
    )
    .await?;
    let protected = std::env::var("IDEMPOTENCY").as_deref() != Ok("off");
    let once = protected.then(|| {
        Idempotent::new(RedisStore::new(redis.clone())).namespace(&format!("billing-{run}"))
    });
    let consumers = Consumers {
        redis: redis.clone(),
        stream: stream.clone(),
        once,
        applied: Mutex::default(),
    };

    let sent = produce(&redis, &stream).await?;
    crashing_consumer(&consumers).await?;
    let claimed = surviving_consumer(&consumers).await?;
    command(&redis, "DEL", args(&[&stream])).await?;

    let applied = consumers.applied.into_inner().unwrap();
    let (once, twice, missing) = verdict(&applied);
    println!(
        "summary: {ORDERS} ids, {sent} messages, {claimed} claimed; applied once: {once}, \
         twice or more: {}, never: {}",
        twice.len(),
        missing.len()
    );
    if !twice.is_empty() || !missing.is_empty() || claimed == 0 {
        println!("FAILED: twice {twice:?}, never {missing:?}, claimed {claimed}");
        std::process::exit(1);
    }
    Ok(())
}

/// The clock's nanoseconds, so that two runs with the same process id never share a stream.
fn run_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{nanos:08x}")
}
