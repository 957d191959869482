//! The core every door uses (the HTTP layer, the inbox's door, `once`): the claim guard that
//! owns one claim from its reserve to its settlement, and the observer that counts and logs
//! each outcome.

pub(crate) mod backoff;
pub(crate) mod guard;
pub(crate) mod items;
pub(crate) mod lease;
pub(crate) mod observe;
pub(crate) mod outcome;
pub(crate) mod policy;
pub(crate) mod throttle;
