//! The inbox's metrics, per namespace, through the `metrics` facade (feature `metrics`; without
//! it every function here does nothing): `idempotency_inbox_attempts_total`,
//! `idempotency_inbox_retries_total`, `idempotency_inbox_dead_letters_total`,
//! `idempotency_inbox_stale_total`, and the gauges
//! `idempotency_inbox_pending`, `idempotency_inbox_in_flight`, `idempotency_inbox_dead` and
//! `idempotency_inbox_oldest_age_seconds`.

use super::store::InboxCounts;

/// The counters, at zero, when a worker starts: a rate or an `increase` over them has a series
/// from the start, before the first retry or dead letter.
pub(crate) fn register(namespace: &str) {
    for name in [
        "idempotency_inbox_attempts_total",
        "idempotency_inbox_retries_total",
        "idempotency_inbox_dead_letters_total",
        "idempotency_inbox_stale_total",
    ] {
        add(name, namespace, 0);
    }
}

/// One attempt started.
pub(crate) fn attempt(namespace: &str) {
    count("idempotency_inbox_attempts_total", namespace);
}

/// One failed attempt scheduled again.
pub(crate) fn retry(namespace: &str) {
    count("idempotency_inbox_retries_total", namespace);
}

/// One entry made a dead letter.
pub(crate) fn dead_letter(namespace: &str) {
    count("idempotency_inbox_dead_letters_total", namespace);
}

/// One entry settled as stale, without the handler: its object had moved past it.
pub(crate) fn stale(namespace: &str) {
    count("idempotency_inbox_stale_total", namespace);
}

fn count(name: &'static str, namespace: &str) {
    add(name, namespace, 1);
}

#[cfg(feature = "metrics")]
fn add(name: &'static str, namespace: &str, n: u64) {
    metrics::counter!(name, "namespace" => namespace.to_owned()).increment(n);
}

#[cfg(not(feature = "metrics"))]
fn add(_name: &'static str, _namespace: &str, _n: u64) {}

/// The inbox's depth, in flight, dead letters and oldest entry's age.
#[cfg(feature = "metrics")]
pub(crate) fn gauges(namespace: &str, counts: &InboxCounts) {
    let gauge = |name: &'static str, value: f64| {
        metrics::gauge!(name, "namespace" => namespace.to_owned()).set(value);
    };
    gauge("idempotency_inbox_pending", counts.pending as f64);
    gauge("idempotency_inbox_in_flight", counts.in_flight as f64);
    gauge("idempotency_inbox_dead", counts.dead as f64);
    let age = counts.oldest_age.unwrap_or_default().as_secs_f64();
    gauge("idempotency_inbox_oldest_age_seconds", age);
}

/// The inbox's depth, in flight, dead letters and oldest entry's age.
#[cfg(not(feature = "metrics"))]
pub(crate) fn gauges(_namespace: &str, _counts: &InboxCounts) {}
