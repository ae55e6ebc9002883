//! The end-to-end suites: the api and the worker together, with a real Redis,
//! the real Docker engine and the real MCP client. One test binary, a module per
//! suite; the harness they share is this crate's library (`src/lib.rs`).
//!
//! Run one suite with a filter on its module: `cargo nextest run -p
//! script-runner-e2e -E 'test(/^running::/)'`.

mod caches;
mod code_map;
mod config_docs;
mod egress;
mod failover;
mod forged;
mod hostile;
mod oci_runtime;
mod ops;
mod pinned;
mod pool;
mod projects;
mod recovery;
mod redis_acl;
mod running;
mod waiting;
mod workspaces;
mod write_files;
