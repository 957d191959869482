//! What `Idempotent::once` costs, against calling the closure directly and, on Redis, against
//! the hand-written correct pattern (`SET key token NX PX .. GET`, then a token-checked
//! `EVALSHA` that marks it done).
//!
//! ```text
//! cargo bench --all-features --bench once                      # memory only
//! REDIS_URL=redis://127.0.0.1:6379 cargo bench --all-features --bench once
//! ```
//!
//! - `direct`: the closure called as is (an async block that returns its input);
//! - `first/memory`, `repeat/memory`: `once` on the memory store, a new key on every
//!   iteration, then the same key again and again (the recorded output decoded);
//! - with `REDIS_URL` (feature `redis`): `first/redis`, `repeat/redis` the same on a
//!   `RedisStore`, and `hand_first/redis`, `hand_repeat/redis` the hand-written pattern.
//!
//! Profile mode, without criterion: `ONCE_PROFILE=N` runs each scenario named in `ONCE_FILTER`
//! (names separated by commas; all when unset) N times, and for the Redis ones prints the
//! commands the server processed per call (`total_commands_processed`, which counts the calls a
//! script makes too: `SET NX` and then a script of two calls count 4). `ICOUNT_BENCH=once scripts/icount direct
//! first/memory` counts instructions per call with callgrind.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::Criterion;
use tower_idempotency::{Idempotent, MemoryStore, OnceError};

type Failure = OnceError<std::io::Error>;

/// Seven days, the retention of every scenario.
const RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// A key no earlier iteration (nor an earlier run against the same Redis) used.
fn fresh_key(n: u64) -> String {
    static RUN: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    let run = RUN.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos()
    });
    format!("job-{run:x}-{n}")
}

/// The work every scenario protects: nothing but its input back.
async fn work(n: u64) -> Result<u64, std::io::Error> {
    Ok(black_box(n))
}

/// One scenario: a name and what iteration `n` does.
struct Scenario {
    name: &'static str,
    run: Box<dyn Fn(u64) -> futures_util::future::LocalBoxFuture<'static, u64>>,
    /// Counts the commands a Redis server processed, when the scenario talks to one.
    #[cfg(feature = "redis")]
    commands: Option<redis::Counter>,
}

impl Scenario {
    fn new(
        name: &'static str,
        run: impl Fn(u64) -> futures_util::future::LocalBoxFuture<'static, u64> + 'static,
    ) -> Self {
        Scenario {
            name,
            run: Box::new(run),
            #[cfg(feature = "redis")]
            commands: None,
        }
    }
}

fn memory_scenarios() -> Vec<Scenario> {
    let first = Idempotent::new(MemoryStore::new())
        .namespace("bench")
        .retention(RETENTION);
    let repeat = first.clone();
    vec![
        Scenario::new("direct", |n| {
            Box::pin(async move { work(n).await.unwrap() })
        }),
        Scenario::new("first/memory", move |n| {
            let jobs = first.clone();
            Box::pin(async move {
                let out: Result<u64, Failure> = jobs.once(&fresh_key(n), || work(n)).await;
                out.expect("a first call runs")
            })
        }),
        Scenario::new("repeat/memory", move |_| {
            let jobs = repeat.clone();
            Box::pin(async move {
                let out: Result<u64, Failure> = jobs.once("repeated", || work(7)).await;
                assert_eq!(out.expect("a repeat replays"), 7);
                7
            })
        }),
    ]
}

#[cfg(feature = "redis")]
mod redis {
    //! The Redis scenarios: `once` on a `RedisStore`, and the hand-written correct pattern.

    use std::rc::Rc;

    use fred::prelude::*;
    use fred::types::InfoKind;
    use fred::types::scripts::Script;
    use tower_idempotency::{Idempotent, RedisStore};

    use super::{Failure, RETENTION, Scenario, fresh_key, work};

    /// Marks the key done for `ARGV[2]` seconds if it still holds our token (`ARGV[1]`).
    const COMPLETE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
        return redis.call('SET', KEYS[1], 'done', 'EX', ARGV[2]) end return false";

    /// Reads `total_commands_processed` from the server (the read itself is one command).
    #[derive(Clone)]
    pub struct Counter(Client);

    impl Counter {
        pub async fn read(&self) -> u64 {
            let info: String = self.0.info(Some(InfoKind::Stats)).await.expect("INFO");
            info.lines()
                .find_map(|l| l.strip_prefix("total_commands_processed:"))
                .and_then(|v| v.trim().parse().ok())
                .expect("total_commands_processed in INFO stats")
        }
    }

    async fn client(url: &str) -> Client {
        let client = Builder::from_config(Config::from_url(url).expect("REDIS_URL"))
            .build()
            .expect("client");
        client.init().await.expect("Redis reachable at REDIS_URL");
        client
    }

    /// The hand-written first delivery: claim with a token, run, mark done if still ours.
    async fn hand(client: &Client, script: &Script, key: String, n: u64) -> u64 {
        let token = format!("t{n}");
        let old: Option<String> = client
            .set(
                &key,
                token.as_str(),
                Some(Expiration::PX(30_000)),
                Some(SetOptions::NX),
                true,
            )
            .await
            .expect("SET NX");
        if old.is_some() {
            return n; // done (or in flight): not run
        }
        let out = work(n).await.expect("work");
        let secs = RETENTION.as_secs() as i64;
        let _: Option<String> = script
            .evalsha_with_reload(client, key, vec![Value::from(token), Value::from(secs)])
            .await
            .expect("EVALSHA");
        out
    }

    pub fn scenarios(rt: &tokio::runtime::Runtime, url: &str) -> Vec<Scenario> {
        let (store_client, hand_client, counter) = rt.block_on(async {
            (
                client(url).await,
                client(url).await,
                Counter(client(url).await),
            )
        });
        let store = RedisStore::new(store_client);
        rt.block_on(store.load_scripts()).expect("scripts load");
        let jobs = Idempotent::new(store)
            .namespace("bench")
            .retention(RETENTION);
        let script = Rc::new(Script::from_lua(COMPLETE));
        rt.block_on(script.load(&hand_client)).expect("SCRIPT LOAD");

        let (first, repeat) = (jobs.clone(), jobs);
        let (hand_first, hand_repeat) = (hand_client.clone(), hand_client);
        let (script_first, script_repeat) = (script.clone(), script);
        let mut out = vec![
            Scenario::new("first/redis", move |n| {
                let jobs = first.clone();
                Box::pin(async move {
                    let out: Result<u64, Failure> = jobs.once(&fresh_key(n), || work(n)).await;
                    out.expect("a first call runs")
                })
            }),
            Scenario::new("repeat/redis", move |_| {
                let jobs = repeat.clone();
                Box::pin(async move {
                    let key = fresh_key(u64::MAX);
                    let out: Result<u64, Failure> = jobs.once(&key, || work(7)).await;
                    out.expect("a repeat replays")
                })
            }),
            Scenario::new("hand_first/redis", move |n| {
                let (client, script) = (hand_first.clone(), script_first.clone());
                Box::pin(async move { hand(&client, &script, fresh_key(n), n).await })
            }),
            Scenario::new("hand_repeat/redis", move |_| {
                let (client, script) = (hand_repeat.clone(), script_repeat.clone());
                Box::pin(async move { hand(&client, &script, fresh_key(u64::MAX - 1), 7).await })
            }),
        ];
        for scenario in &mut out {
            scenario.commands = Some(counter.clone());
        }
        out
    }
}

fn scenarios(rt: &tokio::runtime::Runtime) -> Vec<Scenario> {
    let memory = memory_scenarios();
    let Ok(url) = std::env::var("REDIS_URL") else {
        return memory;
    };
    #[cfg(feature = "redis")]
    return memory
        .into_iter()
        .chain(redis::scenarios(rt, &url))
        .collect();
    #[cfg(not(feature = "redis"))]
    {
        let _ = (rt, url);
        eprintln!("REDIS_URL is set but the `redis` feature is off: memory only");
        memory
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Distinct iteration numbers across the warm-up and the measured calls of one process.
static ITERATION: AtomicU64 = AtomicU64::new(0);

fn profile(n: u64) {
    let filter = std::env::var("ONCE_FILTER").unwrap_or_default();
    let rt = runtime();
    for scenario in scenarios(&rt) {
        if !filter.is_empty() && !filter.split(',').any(|name| name == scenario.name) {
            continue;
        }
        rt.block_on(async {
            for _ in 0..n.min(200) {
                black_box((scenario.run)(ITERATION.fetch_add(1, Ordering::Relaxed)).await);
            }
            #[cfg(feature = "redis")]
            let before = match &scenario.commands {
                Some(counter) => Some(counter.read().await),
                None => None,
            };
            for _ in 0..n {
                black_box((scenario.run)(ITERATION.fetch_add(1, Ordering::Relaxed)).await);
            }
            #[cfg(feature = "redis")]
            if let (Some(counter), Some(before)) = (&scenario.commands, before) {
                // The second INFO is counted too: one command that is not the scenario's.
                let commands = counter.read().await - before - 1;
                println!(
                    "{}: {:.2} Redis commands per call (a script's own calls included)",
                    scenario.name,
                    commands as f64 / n as f64
                );
            }
        });
    }
}

fn benches(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("once");
    for scenario in scenarios(&rt) {
        group.bench_function(scenario.name, |b| {
            b.to_async(&rt)
                .iter(|| (scenario.run)(ITERATION.fetch_add(1, Ordering::Relaxed)))
        });
    }
    group.finish();
}

fn main() {
    if let Some(n) = std::env::var("ONCE_PROFILE")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        profile(n);
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c);
    c.final_summary();
}
