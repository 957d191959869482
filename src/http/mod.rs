//! The HTTP door onto the claim core: [`IdempotencyLayer`](crate::IdempotencyLayer) and its
//! service, future and bodies, what it answers on its own, what counts as success, and a
//! request's life in phases (read, verify, key, claim, call, settle). Nothing outside this folder
//! but the inbox's door (which reuses the phases) speaks HTTP.

pub(crate) mod answer;
pub(crate) mod body;
pub(crate) mod classify;
pub(crate) mod config;
pub(crate) mod future;
pub(crate) mod layer;
pub(crate) mod phase;
pub mod rejection;
pub(crate) mod service;
