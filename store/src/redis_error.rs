//! What a Redis error says about the connection it came on: broken (I/O,
//! timeout, protocol, or a node that is no longer the primary), or fine and
//! only one command refused.
//!
//! The pool (`redis_pool`, which drops broken connections) and the sentinel
//! follower (`redis_target`, which reconnects to a sentinel that did not
//! answer) both ask. The pool builds on the target, so this lives apart from
//! both: in the pool, the target would have to import it back.

use redis::Value;

/// Whether an error means the connection cannot be trusted any more (rather than
/// Redis answering a command with an error): a connection-level failure, or
/// the node no longer being the primary.
pub fn breaks_connection(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
        || is_not_primary(e)
}

/// Whether a reply is (or, for a transaction's, holds) an error saying the
/// node is not the primary (see `is_not_primary`).
pub(crate) fn says_not_primary(v: &Value) -> bool {
    match v {
        Value::ServerError(e) => NOT_PRIMARY.contains(&e.code()),
        Value::Array(items) => items
            .iter()
            .any(|i| matches!(i, Value::ServerError(e) if NOT_PRIMARY.contains(&e.code()))),
        _ => false,
    }
}

/// The error codes of a node that is not (or no longer) a writable primary.
const NOT_PRIMARY: [&str; 4] = ["READONLY", "UNBLOCKED", "MASTERDOWN", "NOREPLICAS"];

/// Whether Redis refused because the node is not (or no longer) a writable
/// primary: `READONLY` (a replica), `-UNBLOCKED` (a blocked read ended by a
/// demotion), `MASTERDOWN` (a replica cut off from its primary), `NOREPLICAS`
/// (a primary with fewer replicas than `min-replicas-to-write`).
pub fn is_not_primary(e: &redis::RedisError) -> bool {
    e.code().is_some_and(|c| NOT_PRIMARY.contains(&c))
}
