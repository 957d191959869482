//! The one backoff of the crate: a pause that starts at `first` and doubles after every failure
//! in a row, up to `max`. The guard retries store calls with it, the Redis relay its
//! subscriber, and the inbox's retry policy takes its ceiling from the same doubling.

use std::time::Duration;

/// Doubling pauses between `first` and `max`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    /// Pauses of `first`, then twice as long each time, never longer than `max`.
    pub(crate) const fn new(first: Duration, max: Duration) -> Self {
        Backoff { next: first, max }
    }

    /// The pause before the next try; the one after it doubles.
    pub(crate) fn pause(&mut self) -> Duration {
        let pause = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        pause
    }

    /// Sleeps for [`pause`](Self::pause).
    #[cfg(feature = "redis")]
    pub(crate) async fn wait(&mut self) {
        tokio::time::sleep(self.pause()).await;
    }
}

/// The pause after `failures` failures in a row (the first failure waits `first`), without
/// stepping through the ones before it: what a policy that only knows the count needs.
pub(crate) fn nth(first: Duration, max: Duration, failures: u32) -> Duration {
    let doubling = 2u32.saturating_pow(failures.saturating_sub(1).min(31));
    first.saturating_mul(doubling).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_the_bound_and_agree_with_nth() {
        let (first, max) = (Duration::from_millis(100), Duration::from_secs(2));
        let mut backoff = Backoff::new(first, max);
        let pauses: Vec<_> = (0..7).map(|_| backoff.pause().as_millis()).collect();
        assert_eq!(pauses, [100, 200, 400, 800, 1600, 2000, 2000]);
        let counted: Vec<_> = (1..=7).map(|n| nth(first, max, n).as_millis()).collect();
        assert_eq!(counted, pauses);
        assert_eq!(nth(first, max, 0), first);
        assert_eq!(
            nth(first, Duration::MAX, u32::MAX),
            first.saturating_mul(1 << 31)
        );
    }
}
