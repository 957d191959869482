//! In-process statistics of each namespace, for the inbox's admin page (feature `admin`):
//! per minute over the last [`MINUTES`], what the routes received and how they answered, and
//! how long their handlers and the inbox workers took.
//!
//! The request path pays a clock read and a few relaxed atomic increments: a layer (through
//! its `Observer`) and a worker resolve their namespace's [`RouteStats`] once, when they are
//! built, and never look it up again. A minute's slot is recycled by the first sample of a
//! new minute; a sample racing that recycling may be lost, which a page of approximate
//! figures can afford (Prometheus keeps the exact counters).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::claim::outcome::Outcome;

/// How many minutes the statistics cover, the current one included.
pub(crate) const MINUTES: usize = 15;

/// The latency buckets: bucket `i >= 1` holds `[2^k, 1.5 * 2^k)` or `[1.5 * 2^k, 2^(k+1))`
/// microseconds (`k = (i - 1) / 2`), bucket 0 less than a microsecond; the last one holds
/// everything from about 100 s on.
const BUCKETS: usize = 56;

/// The reasons a rejected request is counted under: the rejections the layer answers with a
/// problem document (an unverified signature whatever the scheme's reason), `other` for any
/// other.
pub(crate) const REASONS: [&str; 9] = [
    "unverified",
    "missing_key",
    "malformed_key",
    "malformed_order",
    "payload_too_large",
    "body_timeout",
    "body_unreadable",
    "mismatch",
    "other",
];

/// A count kept per minute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Count {
    /// Every covered request.
    Received,
    /// First deliveries (claimed and handled, or released).
    First,
    /// Duplicates answered from the record.
    Duplicate,
    /// Events older than their object's last one, at the door or in the worker.
    Stale,
    /// Deliveries enqueued in an inbox.
    Queued,
}

const COUNTS: usize = 5;

/// A latency kept per minute.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Latency {
    /// The inner service (the handler) on the request path.
    Handler,
    /// An inbox worker's attempt.
    Worker,
}

/// One minute's samples.
struct Slot {
    /// The minute (since the epoch) plus one; 0 for a slot never used.
    stamp: AtomicU64,
    counts: [AtomicU64; COUNTS],
    rejected: [AtomicU64; REASONS.len()],
    latency: [[AtomicU32; BUCKETS]; 2],
}

impl Slot {
    fn new() -> Self {
        Slot {
            stamp: AtomicU64::new(0),
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            rejected: std::array::from_fn(|_| AtomicU64::new(0)),
            latency: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU32::new(0))),
        }
    }

    fn clear(&self) {
        let counters = self.counts.iter().chain(&self.rejected);
        counters.for_each(|counter| counter.store(0, Relaxed));
        let buckets = self.latency.iter().flatten();
        buckets.for_each(|bucket| bucket.store(0, Relaxed));
    }
}

/// The statistics of one namespace in this process.
pub(crate) struct RouteStats {
    namespace: Box<str>,
    /// Whether anything was ever counted: the page lists only the namespaces in use.
    used: AtomicBool,
    slots: [Slot; MINUTES],
}

impl std::fmt::Debug for RouteStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteStats")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// Every namespace's statistics: touched when a layer or a worker is built and when the page
/// is rendered, never per request.
static REGISTRY: Mutex<Vec<Arc<RouteStats>>> = Mutex::new(Vec::new());

/// The statistics of `namespace` (made on first use).
pub(crate) fn route(namespace: &str) -> Arc<RouteStats> {
    let mut registry = REGISTRY.lock().unwrap_or_else(|poison| poison.into_inner());
    if let Some(stats) = registry.iter().find(|s| &*s.namespace == namespace) {
        return stats.clone();
    }
    let stats = Arc::new(RouteStats::new(namespace));
    registry.push(stats.clone());
    stats
}

/// The statistics of every namespace that counted something, by name.
pub(crate) fn routes() -> Vec<Arc<RouteStats>> {
    let registry = REGISTRY.lock().unwrap_or_else(|poison| poison.into_inner());
    let mut used: Vec<_> = (registry.iter())
        .filter(|stats| stats.used.load(Relaxed))
        .cloned()
        .collect();
    used.sort_by(|a, b| a.namespace.cmp(&b.namespace));
    used
}

/// The current minute since the epoch.
pub(crate) fn now_minute() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    since.unwrap_or_default().as_secs() / 60
}

impl RouteStats {
    fn new(namespace: &str) -> Self {
        RouteStats {
            namespace: namespace.into(),
            used: AtomicBool::new(false),
            slots: std::array::from_fn(|_| Slot::new()),
        }
    }

    pub(crate) fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The slot of `minute`, recycled if it held an older one; `None` for a minute older than
    /// the slot's (a sample that waited past the window).
    fn slot(&self, minute: u64) -> Option<&Slot> {
        if !self.used.load(Relaxed) {
            self.used.store(true, Relaxed);
        }
        let slot = &self.slots[(minute % MINUTES as u64) as usize];
        let stamp = minute + 1;
        let seen = slot.stamp.load(Relaxed);
        if seen == stamp {
            return Some(slot);
        }
        let before = slot.stamp.fetch_max(stamp, Relaxed);
        match before.cmp(&stamp) {
            std::cmp::Ordering::Less => {
                slot.clear();
                Some(slot)
            }
            std::cmp::Ordering::Equal => Some(slot),
            std::cmp::Ordering::Greater => None,
        }
    }

    /// Counts one covered request's outcome now.
    pub(crate) fn outcome(&self, outcome: Outcome) {
        self.outcome_at(now_minute(), outcome);
    }

    pub(crate) fn outcome_at(&self, minute: u64, outcome: Outcome) {
        let count = match outcome {
            Outcome::PassThrough => return,
            Outcome::First | Outcome::Released => Some(Count::First),
            Outcome::Replayed | Outcome::MismatchAcked => Some(Count::Duplicate),
            Outcome::Stale => Some(Count::Stale),
            Outcome::Queued => Some(Count::Queued),
            _ => None,
        };
        let reason = match outcome {
            Outcome::Unverified(_) => Some(0),
            Outcome::Mismatch => Some(REASONS.len() - 2),
            Outcome::Rejected(code) => Some(
                (REASONS.iter().position(|reason| *reason == code)).unwrap_or(REASONS.len() - 1),
            ),
            _ => None,
        };
        let Some(slot) = self.slot(minute) else {
            return;
        };
        slot.counts[Count::Received as usize].fetch_add(1, Relaxed);
        if let Some(count) = count {
            slot.counts[count as usize].fetch_add(1, Relaxed);
        }
        if let Some(reason) = reason {
            slot.rejected[reason].fetch_add(1, Relaxed);
        }
    }

    /// Counts one event of `count` now (the worker's stale settlements).
    pub(crate) fn count(&self, count: Count) {
        if let Some(slot) = self.slot(now_minute()) {
            slot.counts[count as usize].fetch_add(1, Relaxed);
        }
    }

    /// Records one `latency` sample now.
    pub(crate) fn latency(&self, latency: Latency, elapsed: Duration) {
        self.latency_at(now_minute(), latency, elapsed);
    }

    pub(crate) fn latency_at(&self, minute: u64, latency: Latency, elapsed: Duration) {
        if let Some(slot) = self.slot(minute) {
            slot.latency[latency as usize][bucket(elapsed)].fetch_add(1, Relaxed);
        }
    }

    /// What the last [`MINUTES`] up to `now` (a minute since the epoch) hold, oldest first.
    pub(crate) fn window(&self, now: u64) -> Window {
        let minutes = std::array::from_fn(|i| {
            let minute = (now + 1 + i as u64).checked_sub(MINUTES as u64);
            let slot = &self.slots[(minute.unwrap_or(0) % MINUTES as u64) as usize];
            let current = minute.is_some_and(|m| slot.stamp.load(Relaxed) == m + 1);
            if !current {
                return MinuteStats::default();
            }
            let load = |counter: &AtomicU64| counter.load(Relaxed);
            let hist =
                |l: usize| Histogram(std::array::from_fn(|b| slot.latency[l][b].load(Relaxed)));
            MinuteStats {
                counts: std::array::from_fn(|c| load(&slot.counts[c])),
                rejected: std::array::from_fn(|r| load(&slot.rejected[r])),
                latency: [hist(0), hist(1)],
            }
        });
        Window { minutes }
    }
}

/// The bucket of `elapsed`.
fn bucket(elapsed: Duration) -> usize {
    let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
    if micros == 0 {
        return 0;
    }
    let log = 63 - micros.leading_zeros() as usize;
    let half = if log == 0 {
        0
    } else {
        (micros >> (log - 1)) & 1
    };
    (1 + 2 * log + half as usize).min(BUCKETS - 1)
}

/// The upper end of bucket `index`.
fn upper(index: usize) -> Duration {
    if index == 0 {
        return Duration::from_micros(1);
    }
    let (log, half) = ((index - 1) / 2, (index - 1) % 2);
    let micros = match log {
        0 => 2,
        _ => (1u64 << log) + (half as u64 + 1) * (1u64 << (log - 1)),
    };
    Duration::from_micros(micros)
}

/// A latency histogram.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Histogram([u32; BUCKETS]);

impl Default for Histogram {
    fn default() -> Self {
        Histogram([0; BUCKETS])
    }
}

impl Histogram {
    /// How many samples it holds.
    pub(crate) fn samples(&self) -> u64 {
        self.0.iter().map(|&n| u64::from(n)).sum()
    }

    /// The `q` quantile (0 to 1), as the upper end of its bucket (at most half again as long as
    /// the samples in it); `None` without samples.
    pub(crate) fn quantile(&self, q: f64) -> Option<Duration> {
        let samples = self.samples();
        let rank = ((q * samples as f64).ceil() as u64).clamp(1, samples.max(1));
        let mut seen = 0;
        for (index, &n) in self.0.iter().enumerate() {
            seen += u64::from(n);
            if samples > 0 && seen >= rank {
                return Some(upper(index));
            }
        }
        None
    }

    fn add(&mut self, other: &Histogram) {
        for (mine, theirs) in self.0.iter_mut().zip(&other.0) {
            *mine = mine.saturating_add(*theirs);
        }
    }
}

/// One minute's figures.
#[derive(Clone, Debug, Default)]
pub(crate) struct MinuteStats {
    counts: [u64; COUNTS],
    pub(crate) rejected: [u64; REASONS.len()],
    latency: [Histogram; 2],
}

impl MinuteStats {
    pub(crate) fn count(&self, count: Count) -> u64 {
        self.counts[count as usize]
    }

    /// Every rejection, whatever its reason.
    pub(crate) fn rejected(&self) -> u64 {
        self.rejected.iter().sum()
    }

    pub(crate) fn latency(&self, latency: Latency) -> &Histogram {
        &self.latency[latency as usize]
    }
}

/// The last [`MINUTES`] of one namespace, oldest first.
#[derive(Clone, Debug)]
pub(crate) struct Window {
    pub(crate) minutes: [MinuteStats; MINUTES],
}

impl Window {
    /// The sums over the window.
    pub(crate) fn total(&self) -> MinuteStats {
        let mut total = MinuteStats::default();
        for minute in &self.minutes {
            for (sum, n) in total.counts.iter_mut().zip(minute.counts) {
                *sum += n;
            }
            for (sum, n) in total.rejected.iter_mut().zip(minute.rejected) {
                *sum += n;
            }
            for (sum, hist) in total.latency.iter_mut().zip(&minute.latency) {
                sum.add(hist);
            }
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_half_powers_of_two_of_microseconds() {
        let micros = Duration::from_micros;
        assert_eq!(bucket(Duration::from_nanos(999)), 0);
        assert_eq!(bucket(micros(1)), 1);
        assert_eq!(bucket(micros(2)), 3);
        assert_eq!(bucket(micros(3)), 4);
        assert_eq!(bucket(micros(4)), 5);
        assert_eq!(bucket(micros(5)), 5);
        assert_eq!(bucket(micros(6)), 6);
        assert_eq!(bucket(micros(7)), 6);
        assert_eq!(bucket(micros(8)), 7);
        assert_eq!(bucket(Duration::from_secs(3600)), BUCKETS - 1);
        // Every duration is below its bucket's upper end and at or above the one before.
        for us in [1, 2, 3, 5, 7, 100, 1_000, 1_499, 1_500, 65_535, 1_000_000] {
            let index = bucket(micros(us));
            assert!(micros(us) < upper(index), "{us}");
            assert!(micros(us) >= upper(index - 1), "{us}");
        }
    }

    #[test]
    fn quantiles_are_read_from_the_buckets() {
        let stats = RouteStats::new("q");
        assert_eq!(
            stats
                .window(10)
                .total()
                .latency(Latency::Handler)
                .quantile(0.5),
            None
        );
        // 90 samples at 1 ms, 10 at 100 ms.
        for i in 0..100 {
            let elapsed = Duration::from_millis(if i < 90 { 1 } else { 100 });
            stats.latency_at(10, Latency::Handler, elapsed);
        }
        stats.latency_at(10, Latency::Worker, Duration::from_millis(3));
        let total = stats.window(10).total();
        let handler = total.latency(Latency::Handler);
        assert_eq!(handler.samples(), 100);
        // 1 ms = 1000 µs lies in [768, 1024) µs; 100 ms in [98 304, 131 072) µs.
        assert_eq!(handler.quantile(0.5), Some(Duration::from_micros(1024)));
        assert_eq!(handler.quantile(0.9), Some(Duration::from_micros(1024)));
        assert_eq!(handler.quantile(0.95), Some(Duration::from_micros(131_072)));
        let worker = total.latency(Latency::Worker);
        assert_eq!(worker.quantile(0.95), Some(Duration::from_micros(3072)));
    }

    #[test]
    fn minutes_roll_over_a_ring_of_fifteen() {
        let stats = RouteStats::new("ring");
        stats.outcome_at(100, Outcome::First);
        stats.outcome_at(100, Outcome::Replayed);
        stats.outcome_at(101, Outcome::Queued);
        stats.outcome_at(101, Outcome::Rejected("missing_key"));
        stats.outcome_at(101, Outcome::Unverified("expired"));
        stats.outcome_at(101, Outcome::Rejected("something_new"));
        stats.outcome_at(101, Outcome::PassThrough);
        let window = stats.window(101);
        let (before, now) = (&window.minutes[MINUTES - 2], &window.minutes[MINUTES - 1]);
        assert_eq!(before.count(Count::Received), 2);
        assert_eq!(before.count(Count::First), 1);
        assert_eq!(before.count(Count::Duplicate), 1);
        assert_eq!(now.count(Count::Received), 4);
        assert_eq!(now.count(Count::Queued), 1);
        assert_eq!(now.rejected(), 3);
        assert_eq!(now.rejected[0], 1); // unverified
        assert_eq!(now.rejected[1], 1); // missing_key
        assert_eq!(now.rejected[REASONS.len() - 1], 1); // other
        assert_eq!(window.total().count(Count::Received), 6);
        // Fifteen minutes on, minute 100 has left the window; its slot is reused for 115.
        assert_eq!(stats.window(115).total().count(Count::Received), 4);
        stats.outcome_at(115, Outcome::Stale);
        let window = stats.window(115);
        assert_eq!(window.minutes[MINUTES - 1].count(Count::Stale), 1);
        assert_eq!(window.minutes[MINUTES - 1].count(Count::Received), 1);
        // A late sample of minute 100 does not land in minute 115's slot.
        stats.outcome_at(100, Outcome::First);
        assert_eq!(stats.window(115).total().count(Count::First), 0);
        // Long after, nothing is left.
        assert_eq!(stats.window(1_000).total().count(Count::Received), 0);
    }

    #[test]
    fn the_registry_hands_out_one_handle_per_namespace_and_lists_those_used() {
        let a = route("stats-test-a");
        assert!(Arc::ptr_eq(&a, &route("stats-test-a")));
        assert!(!routes().iter().any(|s| s.namespace() == "stats-test-a"));
        a.outcome(Outcome::First);
        assert!(routes().iter().any(|s| s.namespace() == "stats-test-a"));
    }
}
