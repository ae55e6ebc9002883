//! Reads of the jobs stream that more than one binary makes.

use std::collections::HashMap;

use redis::RedisResult;
use redis::aio::ConnectionLike;
use shared::Keys;
use shared::keys::WORKER_GROUP;

/// The worker group's unacknowledged entries, from `XPENDING key group`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PendingSummary {
    /// Entries read by a worker and not yet acknowledged.
    pub count: u64,
    /// The same, per consumer (worker name).
    pub per_consumer: HashMap<String, u64>,
}

/// `XPENDING key group`: count, first and last ids, and (consumer, count) pairs.
type Reply = (
    u64,
    Option<String>,
    Option<String>,
    Option<Vec<(String, String)>>,
);

/// The summary of the jobs stream's pending entries. Before any worker made
/// the group it does not exist: nothing is pending then.
pub async fn pending_summary(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
) -> RedisResult<PendingSummary> {
    let reply: RedisResult<Reply> = redis::cmd("XPENDING")
        .arg(keys.jobs())
        .arg(WORKER_GROUP)
        .query_async(conn)
        .await;
    match reply {
        Ok((count, _, _, consumers)) => Ok(PendingSummary {
            count,
            per_consumer: consumers
                .unwrap_or_default()
                .into_iter()
                .map(|(c, n)| (c, n.parse().unwrap_or(0)))
                .collect(),
        }),
        Err(e) if e.code() == Some("NOGROUP") => Ok(PendingSummary::default()),
        Err(e) => Err(e),
    }
}
