//! The one lease keeper: renews a lease every third of it while its owner works, and says why
//! it stopped. The claim guard runs it in a task of its own for a slow request or job (the
//! owner cannot be interrupted: a lost claim is logged and counted); the inbox worker runs it
//! beside its handler, fenced by the lease's end by this host's clock, and cancels the handler
//! when it returns.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use crate::claim::guard::Renewal;

/// What one renewal found.
pub(crate) enum Renewed {
    /// The lease is still the owner's, and runs for another full lease from when it was sent.
    Held,
    /// The store refused it: the lease is somebody else's now, or gone.
    Gone,
    /// The owner settled meanwhile: nothing is left to renew.
    Stopped,
    /// The store did not answer (an error, or no answer in time): tried again a third of a
    /// lease later.
    Failed,
}

/// Why a keeper returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lost {
    /// A renewal was refused.
    TakenOver,
    /// The fenced lease was about to end with no renewal through.
    RanOut,
    /// The owner settled: the keeper's work is done.
    Stopped,
}

/// The end of a lease by this host's clock, with the margin its owner stops short of it: the
/// fence of an owner that must be gone before anybody else can take the lease over.
///
/// Kept as an offset from when the lease was asked for, in an atomic (for `Send`): the keeper
/// extends it on each renewal, the owner reads it before each step, both from one task, so
/// relaxed ordering suffices.
pub(crate) struct LeaseEnd {
    asked: Instant,
    ends: AtomicU64,
    /// A sixth of the lease: the owner stops this long before the end.
    margin: Duration,
}

impl LeaseEnd {
    /// A lease of `lease` asked for at `asked`.
    pub(crate) fn new(asked: Instant, lease: Duration) -> Self {
        let end = LeaseEnd {
            asked,
            ends: AtomicU64::new(0),
            margin: lease / 6,
        };
        // A lease within what an `Instant` (and a `u64` of nanoseconds) holds: the worker
        // bounds its lease so.
        end.set(asked + lease);
        end
    }

    fn get(&self) -> Instant {
        self.asked + Duration::from_nanos(self.ends.load(Ordering::Relaxed))
    }

    fn set(&self, ends: Instant) {
        let nanos = ends.saturating_duration_since(self.asked).as_nanos();
        self.ends
            .store(u64::try_from(nanos).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// When the owner must have stopped: the end less the margin.
    fn fence(&self) -> Instant {
        self.get() - self.margin
    }

    /// Whether the owner must stop: the end is within the margin, or past.
    pub(crate) fn near(&self) -> bool {
        Instant::now() >= self.fence()
    }
}

/// Renews a lease of `lease` with `renew` (given when each renewal was sent) until a renewal
/// is refused, the owner settled, or, when `fence` is given, the lease is about to end with no
/// renewal through. The first renewal is sent at `first`, each next one a third of a lease
/// after the last answer (or, fenced, by the fence if that comes first). A fenced renewal that
/// hangs is given up at the fence; a held one extends the fence to a lease from when it was
/// sent.
pub(crate) async fn keep<R, Fut>(
    lease: Duration,
    first: Instant,
    fence: Option<&LeaseEnd>,
    mut renew: R,
) -> Lost
where
    R: FnMut(Instant) -> Fut,
    Fut: Future<Output = Renewed>,
{
    let mut next = first;
    loop {
        let due = fence.map_or(next, |end| next.min(end.fence()));
        tokio::time::sleep_until(due).await;
        if fence.is_some_and(LeaseEnd::near) {
            return Lost::RanOut;
        }
        let sent = Instant::now();
        let answer = match fence {
            Some(end) => tokio::time::timeout_at(end.fence(), renew(sent))
                .await
                .unwrap_or(Renewed::Failed),
            None => renew(sent).await,
        };
        match answer {
            Renewed::Held => {
                if let Some(end) = fence {
                    end.set(sent + lease);
                }
            }
            Renewed::Gone => return Lost::TakenOver,
            Renewed::Stopped => return Lost::Stopped,
            Renewed::Failed => {}
        }
        next = Instant::now() + lease / 3;
    }
}

/// Arms the renewal timer of a claim whose owner is still busy (at the owner's first pending
/// poll, so an owner that answers at once never pays for a timer), and starts the guard's
/// renewal task when it fires. `true` once started: the caller drops its `renewal`.
///
/// The one way every door starts the keeper: the HTTP layer's future polls it between the
/// polls of the inner service and of the response body, `once` and `once_in_tx` through
/// [`renewed`].
pub(crate) fn poll_start(
    mut renew_at: Pin<&mut Option<Sleep>>,
    renewal: Option<&Renewal>,
    cx: &mut Context<'_>,
) -> bool {
    if let Some(renewal) = renewal {
        // Not armed for a quick settlement alone (the completion is bounded by the store
        // timeout, well within the lease): a first delivery that waits only on its record
        // costs no timer. One armed before (a slow handler or response body) runs on.
        if renew_at.is_none() && renewal.timed_by_request() {
            renew_at.set(Some(tokio::time::sleep(renewal.interval())));
        }
    }
    let Some(sleep) = renew_at.as_mut().as_pin_mut() else {
        return false;
    };
    if sleep.poll(cx).is_pending() {
        return false;
    }
    renew_at.set(None);
    if let Some(renewal) = renewal {
        renewal.start();
        return true;
    }
    false
}

/// Runs `work` with the claim's renewal started once a third of the lease has passed.
pub(crate) async fn renewed<Fut: Future>(renewal: &Renewal, work: Fut) -> Fut::Output {
    let mut work = pin!(work);
    let mut renew_at = pin!(None::<Sleep>);
    let mut pending = Some(renewal);
    poll_fn(|cx| {
        if let Poll::Ready(output) = work.as_mut().poll(cx) {
            return Poll::Ready(output);
        }
        if poll_start(renew_at.as_mut(), pending, cx) {
            pending = None;
        }
        Poll::Pending
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn renews_every_third_until_refused() {
        let lease = Duration::from_secs(3);
        let start = Instant::now();
        let calls = AtomicUsize::new(0);
        let lost = keep(lease, start + lease / 3, None, |sent| {
            let n = calls.fetch_add(1, Ordering::Relaxed);
            assert_eq!(sent - start, lease / 3 * (u32::try_from(n).unwrap() + 1));
            async move { if n < 2 { Renewed::Held } else { Renewed::Gone } }
        })
        .await;
        assert_eq!(lost, Lost::TakenOver);
        assert_eq!(calls.load(Ordering::Relaxed), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fenced_lease_with_no_renewal_through_runs_out_before_its_end() {
        let lease = Duration::from_secs(6);
        let start = Instant::now();
        let end = LeaseEnd::new(start, lease);
        let lost = keep(lease, start + lease / 3, Some(&end), |_| async {
            Renewed::Failed
        })
        .await;
        assert_eq!(lost, Lost::RanOut);
        // Stopped at the fence: a sixth of the lease before its end.
        assert_eq!(Instant::now() - start, lease - lease / 6);
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_renewal_moves_the_fence() {
        let lease = Duration::from_secs(6);
        let start = Instant::now();
        let end = LeaseEnd::new(start, lease);
        let calls = AtomicUsize::new(0);
        let lost = keep(lease, start + lease / 3, Some(&end), |_| {
            let n = calls.fetch_add(1, Ordering::Relaxed);
            async move {
                if n == 0 {
                    Renewed::Held
                } else {
                    Renewed::Stopped
                }
            }
        })
        .await;
        assert_eq!(lost, Lost::Stopped);
        assert_eq!(end.get() - start, lease / 3 + lease);
    }
}
