//! The defaults of [`IdempotencyLayer`](crate::IdempotencyLayer), each changed by the builder
//! method of the same name.

use std::time::Duration;

/// The default body limit: 1 MiB, ample for webhooks.
pub const BODY_LIMIT: usize = 1024 * 1024;
/// The default lease: how long a claim stays "in flight" if its holder dies without
/// finishing. 10 s: the claim of a live holder is renewed every third of the lease however long
/// the handler runs, so the lease only bounds crash recovery (a crashed worker's key is free
/// again within 10 s, before most providers' first retry) while tolerating a store that
/// misses one renewal (3.3 s) without losing the claim.
pub const LEASE: Duration = Duration::from_secs(10);
/// The default retention of completed keys: 72 hours, a common provider retry window.
pub const RETENTION: Duration = Duration::from_secs(72 * 3600);
/// The default timeout of each store call.
pub const STORE_TIMEOUT: Duration = Duration::from_secs(2);
/// The default limit of a response kept in memory (and so replayable): 64 KiB.
pub const RESPONSE_BUFFER_LIMIT: usize = 64 * 1024;
/// The default interval of throttled log lines: at most one line per outcome and reason every
/// 10 s for what an outsider can cause at will (see
/// [`log_interval`](crate::IdempotencyLayer::log_interval)).
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);
