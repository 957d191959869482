//! The layer in front of real services, in process: a `tower::Service` (clone-and-swap, bodies,
//! trailers), hostile input on raw TCP, the hyper and gRPC examples' services over loopback (a
//! few tests start the built examples too), property tests, and the signature fixtures of real
//! senders.
//!
//! One test binary: each file is a module, the shared harness is declared once here.

#[path = "../support/harness.rs"]
mod harness;
#[path = "../support/hooks.rs"]
mod hooks;

mod fixtures;
mod grpc;
mod hostile;
mod hyper_server;
mod properties;
mod service;
