//! [`Idle`]: what a worker whose last take found nothing waits for before it takes again.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::pin::pin;
use std::time::{Duration, SystemTime};

use futures_util::future::{Either, select};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::wake::Wakeups;

/// How long an idle worker on a store that announces waits at most before it takes again: for
/// what nobody announces (a lease that ran out in a crashed process, an announcement lost while
/// a connection was down, an enqueue by another process on SQLite).
pub(super) const ANNOUNCED_POLL: Duration = Duration::from_secs(5);

/// How often an idle worker on a store that announces nothing takes again.
pub(super) const UNANNOUNCED_POLL: Duration = Duration::from_millis(50);

/// The most future due times an idle worker keeps in mind; past it the poll covers the rest.
const HEARD: usize = 1024;

/// How long a worker waits after a take failed (the store unreachable), doubled at each
/// failure in a row, up to the poll interval.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);

/// The due times an idle worker heard of: the store's announcements of what arrived, and what
/// the worker's own settlements told it (a retry's time; now, after an ordered entry settled,
/// since its object's next entry may be free to go).
pub(super) struct Idle {
    wakeups: Wakeups,
    own: mpsc::UnboundedReceiver<SystemTime>,
    /// Heard and not due yet, the earliest first.
    due: BinaryHeap<Reverse<SystemTime>>,
    poll: Duration,
    /// Takes failed in a row: the next wait is a backoff, not a wait for announcements.
    failures: u32,
}

/// Where a worker's settlements tell its loop when an entry is due.
pub(super) type Tell = mpsc::UnboundedSender<SystemTime>;

impl Idle {
    /// Waits on `wakeups` and on what is told through the returned sender, at most `poll` (by
    /// default [`ANNOUNCED_POLL`] or [`UNANNOUNCED_POLL`], as the store announces or not).
    pub(super) fn new(wakeups: Wakeups, poll: Option<Duration>) -> (Self, Tell) {
        let default = match wakeups.is_announced() {
            true => ANNOUNCED_POLL,
            false => UNANNOUNCED_POLL,
        };
        let (tell, own) = mpsc::unbounded_channel();
        let idle = Idle {
            wakeups,
            own,
            due: BinaryHeap::new(),
            poll: poll.unwrap_or(default),
            failures: 0,
        };
        (idle, tell)
    }

    /// Before a take: what was heard since the last one and is due by now, the take will find;
    /// what is due later is kept for [`wait`](Self::wait).
    pub(super) fn before_take(&mut self) {
        while let Some(at) = self.wakeups.try_next() {
            self.keep(at);
        }
        while let Ok(at) = self.own.try_recv() {
            self.keep(at);
        }
        let now = SystemTime::now();
        while self.due.peek().is_some_and(|Reverse(at)| *at <= now) {
            self.due.pop();
        }
    }

    /// What the take after [`before_take`](Self::before_take) came to: after a failure the
    /// worker backs off (50 ms, doubled at each failure in a row, up to the poll), since what
    /// was announced meanwhile is still there to take.
    pub(super) fn took(&mut self, ok: bool) {
        self.failures = if ok {
            0
        } else {
            self.failures.saturating_add(1)
        };
    }

    /// Until something may be due: an announcement of an entry due now, a time heard of
    /// reached, or the poll interval passed; after a failed take, its backoff.
    pub(super) async fn wait(&mut self) {
        if self.failures > 0 {
            let doubled = FIRST_BACKOFF.saturating_mul(1 << (self.failures - 1).min(16));
            tokio::time::sleep(doubled.min(self.poll)).await;
            return;
        }
        loop {
            let deadline = self.deadline();
            let heard = {
                let announced = pin!(self.wakeups.next());
                let told = pin!(self.own.recv());
                let either = select(announced, told);
                match select(either, pin!(tokio::time::sleep_until(deadline))).await {
                    Either::Left((Either::Left((at, _)), _)) => at,
                    // The sender lives as long as the worker's loop.
                    Either::Left((Either::Right((at, _)), _)) => at,
                    Either::Right(_) => return,
                }
            };
            match heard {
                Some(at) if at <= SystemTime::now() => return,
                Some(at) => self.keep(at),
                None => {}
            }
        }
    }

    /// The earliest of the poll and the first time heard of.
    fn deadline(&self) -> Instant {
        let now = Instant::now();
        let poll = now + self.poll;
        match self.due.peek() {
            Some(Reverse(at)) => {
                let until = at.duration_since(SystemTime::now()).unwrap_or_default();
                // A time past what an `Instant` holds is later than the poll.
                now.checked_add(until).map_or(poll, |at| poll.min(at))
            }
            None => poll,
        }
    }

    fn keep(&mut self, at: SystemTime) {
        self.due.push(Reverse(at));
        if self.due.len() > HEARD {
            // Full: the latest times go (the poll covers them), never an earlier one.
            // Sorted by `Reverse`: the latest times first.
            let mut kept = std::mem::take(&mut self.due).into_sorted_vec();
            kept.drain(..kept.len() - HEARD / 2);
            self.due = kept.into();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inbox::Announcer;

    #[tokio::test(start_paused = true)]
    async fn an_idle_worker_waits_for_what_it_hears() {
        let announcer = Announcer::new();
        let (mut idle, tell) = Idle::new(announcer.subscribe(), None);
        assert_eq!(idle.poll, ANNOUNCED_POLL);
        let start = Instant::now();
        announcer.announce(SystemTime::now());
        idle.wait().await;
        assert_eq!(start.elapsed(), Duration::ZERO, "an entry due now: at once");
        // A retry in 2 s that its own settlement told it of: then, not at the poll.
        tell.send(SystemTime::now() + Duration::from_secs(2))
            .unwrap();
        idle.before_take();
        idle.wait().await;
        let waited = start.elapsed();
        assert!(waited < ANNOUNCED_POLL, "{waited:?}");
        // Nothing heard (a new worker: the paused clock does not move `SystemTime`): the poll.
        let (mut idle, _tell) = Idle::new(announcer.subscribe(), None);
        let start = Instant::now();
        idle.before_take();
        idle.wait().await;
        assert_eq!(start.elapsed(), ANNOUNCED_POLL);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_take_backs_off_then_waits_again() {
        let announcer = Announcer::new();
        let (mut idle, _tell) = Idle::new(announcer.subscribe(), None);
        for expected in [50, 100, 200] {
            idle.took(false);
            let start = Instant::now();
            idle.wait().await;
            assert_eq!(start.elapsed(), Duration::from_millis(expected));
        }
        for _ in 0..40 {
            idle.took(false);
        }
        let start = Instant::now();
        idle.wait().await;
        assert_eq!(start.elapsed(), ANNOUNCED_POLL, "at most the poll");
        idle.took(true);
        let start = Instant::now();
        idle.wait().await;
        assert_eq!(
            start.elapsed(),
            ANNOUNCED_POLL,
            "nothing heard: the poll again"
        );
    }

    #[test]
    fn a_full_memory_of_due_times_keeps_the_earliest() {
        let (mut idle, _tell) = Idle::new(Wakeups::none(), None);
        let base = SystemTime::now() + Duration::from_secs(3600);
        for i in (0..=HEARD as u64).rev() {
            idle.keep(base + Duration::from_secs(i));
        }
        assert!(idle.due.len() <= HEARD);
        assert_eq!(idle.due.peek(), Some(&Reverse(base)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_that_announces_nothing_is_polled() {
        let (mut idle, _tell) = Idle::new(Wakeups::none(), None);
        let start = Instant::now();
        idle.wait().await;
        assert_eq!(start.elapsed(), UNANNOUNCED_POLL);
    }
}
