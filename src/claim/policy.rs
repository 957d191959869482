//! What a claim needs to know of the door that opened it: how long its lease runs, how long its
//! record is kept, how long a store call may take, how long a repeat waits for an attempt in
//! flight, and who observes it. The HTTP layer's settings hold one; `once` holds one alone.

use std::time::Duration;

use crate::claim::observe::Observer;
use crate::defaults;

/// The policy of the claims one door opens.
#[derive(Clone)]
pub(crate) struct Policy {
    /// Counts, logs and times the door's outcomes and store calls.
    pub(crate) observer: Observer,
    /// How long a claim holds its keys without a renewal.
    pub(crate) lease: Duration,
    /// How long a completed record is kept.
    pub(crate) retention: Duration,
    /// How long one store call may take before it counts as failed.
    pub(crate) store_timeout: Duration,
    /// How long a repeat waits for the attempt in flight before it is answered as busy.
    pub(crate) wait_in_flight: Option<Duration>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            observer: Observer::new("default"),
            lease: defaults::LEASE,
            retention: defaults::RETENTION,
            store_timeout: defaults::STORE_TIMEOUT,
            wait_in_flight: None,
        }
    }
}
