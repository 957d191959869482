//! What the layer did with a request, as a typed response extension.
//!
//! Every response that passed through a covered route carries an [`Outcome`] in its
//! extensions, so an application can log or count it in its own middleware.
//!
//! ```
//! use tower_idempotency::Outcome;
//!
//! assert_eq!(Outcome::Replayed.as_str(), "replayed");
//! assert_eq!(Outcome::Rejected("missing_key").as_str(), "rejected");
//! ```

/// What the layer did with one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// First delivery: the inner service ran and succeeded; the key is recorded.
    First,
    /// The inner service ran and did not succeed (non-success status, error, failed body);
    /// the claim was released so that a retry is processed again.
    Released,
    /// A duplicate of a completed key, answered with the ack or the replay.
    Replayed,
    /// A duplicate while the original is still in flight (409).
    InFlight,
    /// The key was reused with a different payload (422).
    Mismatch,
    /// The key was reused with a different payload and acknowledged like a duplicate (the
    /// webhook profile, [`OnMismatch::Ack`](crate::OnMismatch::Ack)); logged at warn.
    MismatchAcked,
    /// Rejected before any claim, with the reason code (`missing_key`, `malformed_key`,
    /// `malformed_order`, `payload_too_large`, `body_timeout`, `body_unreadable`).
    Rejected(&'static str),
    /// The signature did not verify (401): no key was extracted, nothing was claimed. The
    /// reason is the [`VerifyErrorKind::code`](crate::verify::VerifyErrorKind::code)
    /// (`missing_signature`, `malformed_signature`, `signature_mismatch`,
    /// `timestamp_outside_tolerance`, `unverified`).
    Unverified(&'static str),
    /// An ordered event older than what was processed for its object: acknowledged without
    /// the inner service (or passed on to it, marked stale), its key recorded.
    Stale,
    /// An ordered event whose object has another event in flight (409).
    ObjectInFlight,
    /// The store failed and the layer failed closed (503).
    StoreError,
    /// The store failed and the layer failed open: processed without protection.
    FailOpen,
    /// Inbox mode: the delivery was stored for the workers and acknowledged (202).
    Queued,
    /// Not protected: an uncovered method, or a missing key with the pass-through policy.
    PassThrough,
}

impl Outcome {
    /// The reason behind a rejection (the rejection's code, or the verification failure's),
    /// `none` for other outcomes: the `reason` label of metrics.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Outcome::Rejected(reason) | Outcome::Unverified(reason) => reason,
            _ => "none",
        }
    }

    /// The outcome's name, as used in logs and metric labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::First => "first",
            Outcome::Released => "released",
            Outcome::Replayed => "replayed",
            Outcome::InFlight => "in_flight",
            Outcome::Mismatch => "mismatch",
            Outcome::MismatchAcked => "mismatch_acked",
            Outcome::Rejected(_) => "rejected",
            Outcome::Unverified(_) => "unverified",
            Outcome::Stale => "stale",
            Outcome::ObjectInFlight => "object_in_flight",
            Outcome::StoreError => "store_error",
            Outcome::FailOpen => "fail_open",
            Outcome::PassThrough => "pass_through",
            Outcome::Queued => "queued",
        }
    }
}
