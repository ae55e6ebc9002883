//! What the api and the worker agree on: task states and reasons, the Redis key
//! schema and hash fields, the Lua scripts that move a task between states, the
//! runtime catalogue, output tails and the zip safety rules.
//!
//! Invariant: this crate does no I/O. It holds types, names and pure functions, so
//! both binaries (and ops reading Redis by hand) see one definition of each.

pub mod apikey;
pub mod cache;
pub mod edit;
pub mod egress;
pub mod envvar;
pub mod functions;
pub mod keys;
mod names;
pub mod options;
pub mod owner;
pub mod record;
pub mod runtimes;
pub mod scripts;
pub mod spec;
pub mod tail;
pub mod task;
pub mod time;
pub mod usage;
pub mod view;
pub mod worker_name;
pub mod workspace;
pub mod zipcheck;

pub use keys::{Field, Keys};
pub use names::UnknownName;
pub use owner::Owner;
pub use record::{RecordError, TaskRecord};
pub use runtimes::{RuntimeCatalog, RuntimeError, RuntimeName};
pub use task::{ReasonKind, TaskState};
pub use worker_name::WorkerName;
