//! Hostile clients at `POST /mcp`, against the api binary run as a process (so its
//! memory and threads are measured alone) with a real Redis. After each, a real
//! rmcp client is served at once. No worker runs: `run_script` only queues.
//!
//! By subject: the JSON-RPC and header errors (`malformed`), request sizes
//! (`sizes`), huge headers and slow clients (`slow`), the caps on all clients
//! together (`caps`), each client's share of them (`shares`), clients told apart
//! behind a proxy (`proxies`), and a flood of unauthenticated requests (`flood`).
//! `wire` holds the raw HTTP the tests speak.

// Test code: a failed expectation is a panic (the workspace lints deny these in product code).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod caps;
mod flood;
mod malformed;
mod proxies;
mod shares;
mod sizes;
mod slow;
mod wire;
