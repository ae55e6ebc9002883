//! Waiting for a task's next event: `XREAD BLOCK` on its events stream, on
//! connections of their own.

use std::time::Duration;

use deadpool_redis::redis;
use store::tasks::EventMark;

use super::{Store, StoreError};

/// Blocking reads in flight at once per replica (`WAIT_CONNECTIONS`
/// connections, opened as needed). A waiter that finds none free within
/// `WAIT_CHECKOUT` answers with the status as it is, as at its deadline.
pub const WAIT_CONNECTIONS: usize = 128;
pub(super) const WAIT_CHECKOUT: Duration = Duration::from_millis(500);

/// One `XREAD BLOCK` lasts at most this long, under the connections' 10 s
/// response timeout; a longer wait blocks again.
const WAIT_SLICE: Duration = Duration::from_secs(5);

/// How a `wait_for_event` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woke {
    /// Something was appended after the mark.
    Event,
    /// The deadline passed first.
    Deadline,
    /// No wait connection was free: answer as at the deadline.
    Busy,
}

/// A wait connection in use: unless the read it carries completed, it is
/// closed, not returned, when dropped (the waiter was cancelled mid-read).
struct Blocking {
    conn: Option<store::redis_pool::LeanConnection>,
    clean: bool,
}

impl Drop for Blocking {
    fn drop(&mut self) {
        if !self.clean
            && let Some(conn) = self.conn.take()
        {
            conn.discard();
        }
    }
}

impl Store {
    /// Blocks until task `id`'s events stream has an entry after `mark`, or
    /// `until` passes. A blocking read on a connection of its own
    /// (`XREAD BLOCK`), so every waiter on a task wakes on the same append and
    /// nothing polls. Cancel it by dropping the future: its connection is then
    /// closed, not reused.
    pub async fn wait_for_event(
        &self,
        id: &str,
        mark: &EventMark,
        until: tokio::time::Instant,
    ) -> Result<Woke, StoreError> {
        let conn = match self.waits.get().await {
            Ok(conn) => conn,
            Err(deadpool_redis::PoolError::Timeout(_)) => return Ok(Woke::Busy),
            Err(e) => return Err(e.into()),
        };
        let mut held = Blocking {
            conn: Some(conn),
            clean: true,
        };
        let key = self.keys.task_events(id);
        loop {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Ok(Woke::Deadline);
            }
            // BLOCK 0 would mean for ever.
            let block_ms = left.min(WAIT_SLICE).as_millis().max(1) as u64;
            let Some(conn) = held.conn.as_mut() else {
                return Ok(Woke::Deadline);
            };
            held.clean = false;
            let reply: redis::Value = redis::cmd("XREAD")
                .arg("COUNT")
                .arg(1)
                .arg("BLOCK")
                .arg(block_ms)
                .arg("STREAMS")
                .arg(&key)
                .arg(mark.as_str())
                .query_async(conn)
                .await?;
            held.clean = true;
            if !matches!(reply, redis::Value::Nil) {
                return Ok(Woke::Event);
            }
        }
    }
}
