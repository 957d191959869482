//! A backlog drain of the inbox on any backend, for `scripts/inbox_bench --sweep` (issue 55):
//! queues N entries with no worker running (not timed), then runs a [`Worker`] with a handler
//! that does nothing until nothing is pending or in flight, and prints how long that took and
//! the CPU this process spent on it.
//!
//! ```sh
//! cargo run --release --all-features --example inbox_drain -- redis://127.0.0.1:6379 50000
//! cargo run --release --all-features --example inbox_drain -- sqlite:///tmp/drain.db 10000 --ordered
//! ```
//!
//! Arguments: the store's URL (`memory:`, `redis://..`, `postgres://..`, `sqlite://FILE`, as
//! [`connect`] reads them) and the number of entries; then `--workers N` (entries at once, 32),
//! `--ordered` (each entry ordered among the events of one of 1 000 objects; unordered by
//! default), `--threads N` (Tokio worker threads, 1), `--wait` (after queueing, print `queued`
//! and wait for a line on stdin before draining, so that a caller can read the store's CPU
//! in between). Each entry carries a 1 KiB body. The last line of stdout is
//! `drained N in SECS s, cpu SECS s` (the CPU from `/proc/self/stat`, Linux only).

use std::io::BufRead;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tower_idempotency::inbox::{
    AnyInbox, EntryOrder, InboxRequest, InboxStore, MemoryInbox, Worker,
};
use tower_idempotency::order::{EqualPositions, Position};
use tower_idempotency::store::{ObjectKey, StoreKey, connect};
use tower_idempotency::test_util::values;

type Error = Box<dyn std::error::Error + Send + Sync>;

const NAMESPACE: &str = "inbox-drain";
const OBJECTS: usize = 1_000;
const ENQUEUERS: usize = 64;

struct Args {
    url: String,
    entries: usize,
    workers: usize,
    ordered: bool,
    threads: usize,
    wait: bool,
}

fn args() -> Result<Args, Error> {
    let usage = "usage: inbox_drain URL ENTRIES [--workers N] [--ordered] [--threads N] [--wait]";
    let mut it = std::env::args().skip(1);
    let url = it.next().ok_or(usage)?;
    let entries = it.next().ok_or(usage)?.parse()?;
    let mut args = Args {
        url,
        entries,
        workers: 32,
        ordered: false,
        threads: 1,
        wait: false,
    };
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--workers" => args.workers = it.next().ok_or(usage)?.parse()?,
            "--threads" => args.threads = it.next().ok_or(usage)?.parse()?,
            "--ordered" => args.ordered = true,
            "--wait" => args.wait = true,
            _ => return Err(usage.into()),
        }
    }
    Ok(args)
}

fn main() -> Result<(), Error> {
    let args = args()?;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()?
        .block_on(run(args))
}

/// utime + stime of this process, in seconds (`None` where `/proc` is not Linux's).
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // USER_HZ: 100 on every Linux architecture the crate builds for.
    Some(ticks as f64 / 100.0)
}

fn body(i: usize) -> bytes::Bytes {
    let mut body = format!(r#"{{"object":"whatsapp_business_account","id":"{i}","text":""#);
    body.push_str(&"x".repeat(1024 - 3 - body.len()));
    body.push_str(r#""}"#);
    body.push('\n');
    body.into()
}

async fn enqueue(inbox: &AnyInbox, entries: usize, ordered: bool) -> Result<(), Error> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..ENQUEUERS {
        let (inbox, next) = (inbox.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= entries {
                    return Ok::<(), Error>(());
                }
                let key = StoreKey::new(NAMESPACE, None, &format!("evt-{i}"));
                let mut entry = values::inbox_entry(key, body(i), format!("req-{i}"));
                if ordered {
                    let object = ObjectKey::new(NAMESPACE, None, &format!("obj-{}", i % OBJECTS));
                    let position = Position::from_integer_text(&(i / OBJECTS).to_string())
                        .ok_or("position")?;
                    let equal = EqualPositions::Process;
                    entry.order = Some(EntryOrder {
                        object,
                        position,
                        equal,
                    });
                }
                inbox.enqueue(entry).await?;
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

async fn run(args: Args) -> Result<(), Error> {
    let inbox = if args.url.starts_with("memory:") {
        // The default capacity (entries and done keys) is below the largest backlogs.
        AnyInbox::from(MemoryInbox::new(args.entries + 1))
    } else {
        AnyInbox::on(&connect(&args.url).await?, "inbox_drain").await?
    };
    enqueue(&inbox, args.entries, args.ordered).await?;
    let pending = inbox.counts().await?.pending;
    if args.wait {
        println!("queued {pending}");
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)?;
    }

    let handled = Arc::new(AtomicUsize::new(0));
    let counter = handled.clone();
    let handler = tower::service_fn(move |request: InboxRequest| {
        std::hint::black_box(request.body());
        counter.fetch_add(1, Ordering::Relaxed);
        async { Ok::<(), std::convert::Infallible>(()) }
    });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let cpu_start = cpu_seconds();
    let start = Instant::now();
    let worker = Worker::new(inbox.clone(), handler)
        .namespace(NAMESPACE)
        .workers(args.workers);
    let running = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));
    // Asks the store only at the tail: until every entry reached the handler, the counter
    // says enough (and a count of a large backlog is not free on SQL).
    while handled.load(Ordering::Relaxed) < pending as usize {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    loop {
        let counts = inbox.counts().await?;
        if counts.pending == 0 && counts.in_flight == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let seconds = start.elapsed().as_secs_f64();
    let cpu = match (cpu_start, cpu_seconds()) {
        (Some(a), Some(b)) => format!("{:.3}", b - a),
        _ => "n/a".to_owned(),
    };
    let _ = stop.send(());
    running.await?;
    println!("drained {pending} in {seconds:.3} s, cpu {cpu} s");
    Ok(())
}
