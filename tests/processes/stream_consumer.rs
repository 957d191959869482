//! The Redis Streams consumer example (examples/stream_consumer.rs) against a real
//! `redis-server`: every business id applied exactly once through a crash and a claim, and,
//! without `once`, the duplicates its check catches.
#![cfg(feature = "redis")]

use crate::harness;
use crate::redis_server;

use std::process::{Command, Output};

use redis_server::RedisServer;

/// Runs the built example against `server` with `envs`; its output.
fn run_example(server: &RedisServer, envs: &[(&str, &str)]) -> Output {
    Command::new(harness::example_path("stream_consumer"))
        .env("REDIS_URL", server.url())
        .env_remove("IDEMPOTENCY")
        .envs(envs.iter().copied())
        .output()
        .expect("run the stream_consumer example")
}

fn summary(output: &Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .find(|line| line.starts_with("summary: "))
        .unwrap_or_else(|| panic!("no summary line in {stdout:?}"))
        .to_owned()
}

/// Consumer `a` crashes with half its batch applied and nothing acknowledged, `b` claims it
/// all: every id once, twice on the same Redis (each run has its own stream and namespace).
#[test]
fn every_id_is_applied_exactly_once() {
    let server = RedisServer::start();
    for _ in 0..2 {
        let output = run_example(&server, &[]);
        assert!(output.status.success(), "{output:?}");
        assert_eq!(
            summary(&output),
            "summary: 9 ids, 12 messages, 6 claimed; applied once: 9, twice or more: 0, never: 0"
        );
    }
}

/// Without `once` the same deliveries apply ids twice, and the example says so and fails: its
/// check is what the test above relies on.
#[test]
fn without_once_the_duplicates_fail_the_run() {
    let server = RedisServer::start();
    let output = run_example(&server, &[("IDEMPOTENCY", "off")]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let line = summary(&output);
    assert!(!line.contains("twice or more: 0,"), "{line}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("FAILED: twice"));
}
