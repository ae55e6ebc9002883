//! A task's status as `get_task_status` (and `tasks/get`) shows it, read from
//! its record.

use super::args::Seen;
use super::error::ToolError;
use super::output::TaskStatus;
use super::progress::Progress;
use super::runner::ScriptRunner;
use crate::auth::Principal;
use crate::db::{StatusRead, Woke};
use shared::view::StatusView;

/// A waiting call's wait: how long, for what, and what it tells on the way.
pub(super) struct Wait {
    /// At most this long (`wait_seconds`; zero: no wait).
    pub(super) wait: std::time::Duration,
    pub(super) until: Until,
    /// The caller's progress notifications, if it asked for them.
    pub(super) progress: Option<Progress>,
    /// What the caller saw last (`get_task_status`' `seen`).
    pub(super) seen: Option<Seen>,
}

/// What a waiting call (`wait_seconds`) waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Until {
    /// A final state (`run_script`).
    Final,
    /// Any change of state or new output after the call came (`get_task_status`).
    Change,
}

impl ScriptRunner {
    /// A task's status with the last `tail_bytes` of its output. Another
    /// owner's task is answered exactly like an unknown one.
    pub(super) async fn status(
        &self,
        who: &Principal,
        task_id: String,
        tail_bytes: usize,
    ) -> Result<TaskStatus, ToolError> {
        let record = self.status_read(who, &task_id).await?;
        status_from_record(task_id, &record, tail_bytes)
    }

    /// A task's record as `status` reads it, with Redis's clock at the read
    /// (`tasks/get` derives its poll interval from the two). Another owner's
    /// task is answered exactly like an unknown one.
    pub(super) async fn status_read(
        &self,
        who: &Principal,
        task_id: &str,
    ) -> Result<StatusRead, ToolError> {
        self.store
            .get(task_id)
            .await?
            .filter(|r| who.sees(r.record.owner.as_ref()))
            .ok_or_else(|| ToolError::UnknownTask(task_id.to_owned()))
    }

    /// `status`, once the task is final or (`Until::Change`) anything changed,
    /// waiting at most `wait`; at the deadline, or at once when the replica
    /// shuts down, the status as it is then.
    ///
    /// Backed by the task's events stream (`Keys::task_events`), not by
    /// reading the record again and again: the record and the stream's last id
    /// are read together, then the call blocks in Redis (`XREAD BLOCK`) for an
    /// entry after that id. The scripts that change the record append in the
    /// same step, so no change falls between the read and the block, and every
    /// waiter on the task wakes on the same append. (Pub/sub would lose a
    /// message published between the read and the subscribe, and keyspace
    /// notifications are off by default and server-wide.)
    ///
    /// `seen` (with `Until::Change`): what the caller saw last; a task that
    /// differs from it answers at once.
    ///
    /// With `progress` (the request carried a `progressToken`), the status at
    /// the start and each change the wait goes on past are told to the caller
    /// as they come. `until` is kept as asked: many clients (rmcp's, FastMCP
    /// and what is built on it) send a token with every call, so a token
    /// cannot mean "wait longer".
    pub(super) async fn status_waiting(
        &self,
        who: &Principal,
        task_id: String,
        tail_bytes: usize,
        wait: Wait,
    ) -> Result<TaskStatus, ToolError> {
        let Wait {
            wait,
            until,
            mut progress,
            seen,
        } = wait;
        if wait.is_zero() {
            return self.status(who, task_id, tail_bytes).await;
        }
        let deadline = tokio::time::Instant::now() + wait;
        let mut last_read = false;
        loop {
            let (record, mark) = self
                .store
                .get_marked(&task_id)
                .await?
                .filter(|(r, _)| who.sees(r.record.owner.as_ref()))
                .ok_or_else(|| ToolError::UnknownTask(task_id.clone()))?;
            if last_read || record.record.state.is_terminal() || self.shutdown.is_cancelled() {
                return status_from_record(task_id, &record, tail_bytes);
            }
            // Moved on since the caller's last look: that is the change.
            if let Some(seen) = seen.filter(|_| until == Until::Change) {
                let view = status_from_record(task_id.clone(), &record, tail_bytes)?;
                let now = Seen {
                    state: view.view.state,
                    stdout_bytes: view.view.stdout_bytes,
                    stderr_bytes: view.view.stderr_bytes,
                };
                if now != seen {
                    return Ok(view);
                }
            }
            if let Some(p) = progress.as_mut() {
                p.report(&status_from_record(task_id.clone(), &record, tail_bytes)?.view)
                    .await;
            }
            let woke = tokio::select! {
                woke = self.store.wait_for_event(&task_id, &mark, deadline) => woke?,
                () = self.shutdown.cancelled() => Woke::Deadline,
            };
            // One more read: the change itself, or the status at the end.
            last_read = !(woke == Woke::Event && until == Until::Final);
            if let (Some(p), Woke::Event) = (&progress, woke) {
                tokio::select! {
                    () = p.pace(deadline) => {}
                    () = self.shutdown.cancelled() => {}
                }
            }
        }
    }
}

pub(super) fn status_from_record(
    task_id: String,
    r: &StatusRead,
    tail_bytes: usize,
) -> Result<TaskStatus, ToolError> {
    // A record that reads at all has a known state (`TaskRecord::from_values`
    // refuses one without), so every view of it can be built.
    Ok(TaskStatus {
        task_id,
        view: StatusView::new(&r.record, r.now_ms, tail_bytes),
    })
}
