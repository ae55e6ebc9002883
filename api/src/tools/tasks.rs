//! The MCP tasks extension (`io.modelcontextprotocol/tasks`, SEP-2663), backed by
//! the task records in Redis rather than one process's memory, so any api
//! replica answers `tasks/get` and `tasks/cancel` for any task.
//!
//! An MCP task's id is our `task_id`. How our states map:
//!
//! | our state | MCP status | payload |
//! |---|---|---|
//! | queued, running | `working` | a status message |
//! | succeeded | `completed` | `get_task_status`'s result |
//! | failed, timed-out | `completed` | the same result, with `isError: true` (`failed` is for protocol errors) |
//! | killed | `cancelled` | the reason as status message |
//!
//! MCP's status says less than our state (`completed` is three of them), so
//! `tasks/get`'s `_meta` also carries ours and the reason kind, under
//! `script-runner/state` and `script-runner/reason_kind` (and a workspace
//! task's `script-runner/workspace_id`).

use rmcp::ErrorData as McpError;
use rmcp::model::{
    CallToolResult, CancelTaskParams, DetailedTask, GetTaskParams, GetTaskResult, MetaObject, Task,
    TaskPayload, TaskStatus as McpStatus,
};
use shared::TaskState;
use shared::tail::DEFAULT_TAIL_BYTES;

use super::args::parse_task_id;
use super::error::ToolError;
use super::output::TaskStatus;
use super::runner::{ScriptRunner, allowed};
use super::status::status_from_record;
use crate::auth::{Principal, Scope};
use rmcp::RoleServer;
use rmcp::service::RequestContext;

/// `tasks/get`'s `_meta` keys for our state and reason kind.
pub const STATE_META_KEY: &str = "script-runner/state";
pub const REASON_KIND_META_KEY: &str = "script-runner/reason_kind";
/// The `_meta` key of a workspace task's `workspace_id`, in `run_script`'s
/// task handle and in `tasks/get` (a working task has no result to carry it).
pub const WORKSPACE_META_KEY: &str = "script-runner/workspace_id";

impl ScriptRunner {
    /// `tasks/get`: the task's current state from its record, on any replica.
    pub(super) async fn get_mcp_task(
        &self,
        request: GetTaskParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let who = allowed(ctx, Scope::Read, "tasks/get").map_err(ToolError::into_protocol)?;
        let task_id = parse_task_id(&request.task_id).map_err(ToolError::into_protocol)?;
        let read = self
            .status_read(&who, &task_id)
            .await
            .map_err(ToolError::into_protocol)?;
        let poll = poll_interval_ms(&read.record, read.now_ms);
        let status = status_from_record(task_id, &read, DEFAULT_TAIL_BYTES)
            .map_err(ToolError::into_protocol)?;
        let mut meta = MetaObject::new();
        meta.insert(STATE_META_KEY.into(), serde_json::json!(status.view.state));
        meta.insert(
            REASON_KIND_META_KEY.into(),
            serde_json::json!(status.view.reason_kind),
        );
        if let Some(ws) = &status.view.workspace {
            meta.insert(
                WORKSPACE_META_KEY.into(),
                serde_json::json!(ws.workspace_id),
            );
        }
        let task = self
            .detailed_task(status, poll)
            .map_err(ToolError::into_protocol)?;
        let mut result = GetTaskResult::new(task);
        result.meta = Some(meta);
        Ok(result)
    }

    /// `tasks/cancel`: `kill_task`. A task already final is left as it is.
    pub(super) async fn cancel_mcp_task(
        &self,
        request: CancelTaskParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let who = allowed(ctx, Scope::Kill, "tasks/cancel").map_err(ToolError::into_protocol)?;
        let task_id = parse_task_id(&request.task_id).map_err(ToolError::into_protocol)?;
        let killed = self
            .store
            .kill(&task_id, self.config.retention_seconds, who.owner())
            .await
            .map_err(|e| ToolError::from(e).into_protocol())?;
        match killed {
            None => Err(ToolError::UnknownTask(task_id).into_protocol()),
            Some((_, true)) => {
                tracing::info!(%task_id, "task killed by tasks/cancel");
                Ok(())
            }
            Some(_) => Ok(()),
        }
    }

    /// The MCP task for a task just submitted (by `who`).
    pub(super) async fn new_mcp_task(
        &self,
        who: &Principal,
        task_id: &str,
    ) -> Result<Task, ToolError> {
        let read = self.status_read(who, task_id).await?;
        let poll = poll_interval_ms(&read.record, read.now_ms);
        let status = status_from_record(task_id.to_owned(), &read, 0)?;
        Ok(self.detailed_task(status, poll)?.task)
    }

    fn detailed_task(
        &self,
        status: TaskStatus,
        poll_ms: Option<u64>,
    ) -> Result<DetailedTask, ToolError> {
        let ttl_ms = self.config.retention_seconds * 1000;
        detailed_task(status, ttl_ms, poll_ms).map_err(ToolError::Encode)
    }
}

/// `pollIntervalMs` never suggests less than this: a pool hit of a trivial
/// script ends about 100 to 200 ms after its submit (BENCHMARKS.md), and one
/// `tasks/get` costs the api and Redis under a millisecond of CPU.
pub const MIN_POLL_INTERVAL_MS: u64 = 100;
/// Nor more than this, so a long task's end is seen within 10 s.
pub const MAX_POLL_INTERVAL_MS: u64 = 10_000;
/// The interval is a fifth of the task's age: a task is seen ended at most
/// about 20% of its life after its end, and a task of any length costs a
/// number of polls that grows with the logarithm of its length until the
/// cap (about 30 polls to reach it, at an age of 50 s), then one per cap.
const POLL_AGE_DIVISOR: i64 = 5;
/// A running task ends by its timeout at the latest: the worker kills it and
/// records `timed-out` shortly after (the kill, the engine's clean-up). The
/// interval is cut so that the poll after the deadline comes this long after it.
const POLL_AFTER_DEADLINE_MS: i64 = 500;

/// `pollIntervalMs` for a task read at `now_ms` (Redis's clock, as its
/// timestamps): short while it is young, since most tasks are short, growing
/// with its age, and never past its timeout's deadline by more than
/// `POLL_AFTER_DEADLINE_MS`. `None` once it is final: nothing is left to poll.
pub fn poll_interval_ms(record: &shared::TaskRecord, now_ms: i64) -> Option<u64> {
    if record.state.is_terminal() {
        return None;
    }
    let age = now_ms.saturating_sub(record.created_at.unwrap_or(now_ms));
    let mut interval = age / POLL_AGE_DIVISOR;
    if let (Some(started), Some(timeout)) = (record.started_at, record.timeout_seconds) {
        let deadline = started.saturating_add(
            i64::try_from(timeout)
                .unwrap_or(i64::MAX)
                .saturating_mul(1000),
        );
        interval = interval.min(
            deadline
                .saturating_sub(now_ms)
                .saturating_add(POLL_AFTER_DEADLINE_MS),
        );
    }
    let clamped = interval.clamp(MIN_POLL_INTERVAL_MS as i64, MAX_POLL_INTERVAL_MS as i64);
    Some(u64::try_from(clamped).unwrap_or(MIN_POLL_INTERVAL_MS))
}

/// The MCP task for one of our tasks, as `get_task_status` would describe it.
/// `ttl_ms` is how long its record is kept once it ends; `poll_ms` the
/// suggested poll interval (`poll_interval_ms`).
fn detailed_task(
    status: TaskStatus,
    ttl_ms: u64,
    poll_ms: Option<u64>,
) -> Result<DetailedTask, serde_json::Error> {
    let created = status.view.created_at.clone().unwrap_or_default();
    let updated = [&status.view.finished_at, &status.view.started_at]
        .into_iter()
        .flatten()
        .next()
        .cloned()
        .unwrap_or_else(|| created.clone());
    let mut task =
        Task::new(status.task_id.clone(), McpStatus::Working, created, updated).with_ttl_ms(ttl_ms);
    if let Some(ms) = poll_ms {
        task = task.with_poll_interval_ms(ms);
    }
    let (task, payload) = match status.view.state {
        TaskState::Queued => (
            task.with_status_message("queued: waiting for a free worker slot"),
            TaskPayload::Working,
        ),
        TaskState::Running => {
            let message = match (
                status.view.runtime_seconds,
                status.view.seconds_since_last_output,
            ) {
                (Some(ran), Some(quiet)) => {
                    format!("running for {ran:.0} s, last output {quiet:.0} s ago")
                }
                _ => "running: starting its container".to_owned(),
            };
            (task.with_status_message(message), TaskPayload::Working)
        }
        TaskState::Killed => {
            let reason = status
                .view
                .reason
                .clone()
                .unwrap_or_else(|| "killed".into());
            (task.with_status_message(reason), TaskPayload::Cancelled)
        }
        TaskState::Succeeded | TaskState::Failed | TaskState::TimedOut => {
            let failed = status.view.state != TaskState::Succeeded;
            let message = status.view.reason.clone().unwrap_or_default();
            let value = serde_json::to_value(&status)?;
            let result = if failed {
                CallToolResult::structured_error(value)
            } else {
                CallToolResult::structured(value)
            };
            let serde_json::Value::Object(result) = serde_json::to_value(result)? else {
                return Err(serde::de::Error::custom("a tool result is a JSON object"));
            };
            (
                task.with_status_message(message),
                TaskPayload::Completed { result },
            )
        }
    };
    Ok(DetailedTask::new(task, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(state: TaskState, reason: Option<&str>) -> TaskStatus {
        TaskStatus {
            task_id: "7d0b5c3e-2f7e-4c8e-9a51-0c5a3c9d8e11".into(),
            view: shared::view::StatusView {
                state,
                exit_code: (state == TaskState::Failed).then_some(3),
                reason: reason.map(str::to_owned),
                reason_kind: None,
                runtime: "python3.13".into(),
                runtime_seconds: Some(2.0),
                seconds_since_last_output: Some(1.0),
                stdout_tail: "out\n".into(),
                stderr_tail: String::new(),
                stdout_truncated: false,
                stderr_truncated: false,
                stdout_bytes: 4,
                stderr_bytes: 0,
                timeout_seconds: 300,
                created_at: Some("2026-11-30T00:00:00.000Z".into()),
                started_at: Some("2026-11-30T00:00:01.000Z".into()),
                finished_at: state
                    .is_terminal()
                    .then(|| "2026-11-30T00:00:03.000Z".into()),
                usage: state.is_terminal().then_some(shared::usage::UsageView {
                    cpu_seconds: Some(1.5),
                    peak_memory_bytes: Some(1 << 20),
                    workspace_bytes: Some(4096),
                    estimated: false,
                }),
                workspace: None,
                egress: None,
            },
        }
    }

    fn result_of(t: &DetailedTask) -> Option<&serde_json::Map<String, serde_json::Value>> {
        match &t.payload {
            TaskPayload::Completed { result } => Some(result),
            _ => None,
        }
    }

    #[test]
    fn open_states_are_working_with_a_message() -> Result<(), serde_json::Error> {
        let q = detailed_task(status(TaskState::Queued, None), 1000, Some(100))?;
        assert_eq!(q.status(), McpStatus::Working);
        assert!(
            q.task
                .status_message
                .is_some_and(|m| m.starts_with("queued"))
        );
        let r = detailed_task(status(TaskState::Running, None), 1000, Some(400))?;
        assert_eq!(
            r.task.status_message.as_deref(),
            Some("running for 2 s, last output 1 s ago")
        );
        assert_eq!(r.task.poll_interval_ms, Some(400));
        assert_eq!(r.task.ttl_ms, Some(1000));
        Ok(())
    }

    #[test]
    fn final_states_complete_with_the_status_result_and_errors_flagged()
    -> Result<(), serde_json::Error> {
        let ok = detailed_task(
            status(TaskState::Succeeded, Some("exited with code 0")),
            1,
            None,
        )?;
        assert_eq!(ok.task.poll_interval_ms, None, "a final task is not polled");
        assert_eq!(ok.status(), McpStatus::Completed);
        let result = result_of(&ok).cloned().unwrap_or_default();
        assert_eq!(result.get("isError"), Some(&serde_json::json!(false)));
        assert_eq!(
            result
                .get("structuredContent")
                .and_then(|s| s.get("stdout_tail")),
            Some(&serde_json::json!("out\n"))
        );
        // The tasks result carries the usage object as get_task_status does.
        assert_eq!(
            result.get("structuredContent").and_then(|s| s.get("usage")),
            Some(&serde_json::json!({
                "cpu_seconds": 1.5,
                "peak_memory_bytes": 1048576,
                "workspace_bytes": 4096,
                "estimated": false
            }))
        );
        for bad in [TaskState::Failed, TaskState::TimedOut] {
            let t = detailed_task(status(bad, Some("exited with code 3")), 1, None)?;
            assert_eq!(
                t.status(),
                McpStatus::Completed,
                "{bad}: failed is for protocol errors"
            );
            let result = result_of(&t).cloned().unwrap_or_default();
            assert_eq!(result.get("isError"), Some(&serde_json::json!(true)));
        }
        let killed = detailed_task(
            status(TaskState::Killed, Some("killed by kill_task")),
            1,
            None,
        )?;
        assert_eq!(killed.status(), McpStatus::Cancelled);
        assert_eq!(
            killed.task.status_message.as_deref(),
            Some("killed by kill_task")
        );
        Ok(())
    }

    /// A record created at 0, read at `now_ms`; started at `started` with
    /// `timeout` seconds when given.
    fn record(state: TaskState, started: Option<i64>, timeout: Option<u64>) -> shared::TaskRecord {
        let mut r = shared::TaskRecord::new(state);
        r.created_at = Some(0);
        r.started_at = started;
        r.timeout_seconds = timeout;
        r
    }

    #[test]
    fn the_poll_interval_starts_short_and_grows_with_the_tasks_age() {
        let at =
            |state, started, timeout, now| poll_interval_ms(&record(state, started, timeout), now);
        // New: the floor, so a short task is seen soon after it ends.
        assert_eq!(
            at(TaskState::Queued, None, Some(300), 0),
            Some(MIN_POLL_INTERVAL_MS)
        );
        assert_eq!(
            at(TaskState::Queued, None, Some(300), 300),
            Some(MIN_POLL_INTERVAL_MS)
        );
        // Then a fifth of its age, queued or running.
        assert_eq!(at(TaskState::Queued, None, Some(300), 2_000), Some(400));
        assert_eq!(
            at(TaskState::Running, Some(1_000), Some(300), 10_000),
            Some(2_000)
        );
        // Capped for long tasks.
        assert_eq!(
            at(TaskState::Running, Some(1_000), Some(3_600), 600_000),
            Some(MAX_POLL_INTERVAL_MS)
        );
        // Never far past the timeout's deadline (started 1 s + 60 s): at 55 s
        // the age says 11 s, the deadline 6 s + 0.5 s.
        assert_eq!(
            at(TaskState::Running, Some(1_000), Some(60), 55_000),
            Some(6_500)
        );
        // At or past the deadline (the kill on its way): the floor.
        assert_eq!(
            at(TaskState::Running, Some(1_000), Some(60), 61_000),
            Some(500)
        );
        assert_eq!(
            at(TaskState::Running, Some(1_000), Some(60), 70_000),
            Some(MIN_POLL_INTERVAL_MS)
        );
        // A read whose clock is behind the record's (another replica's view of
        // Redis cannot be, but a bad record can): the floor, not a panic.
        assert_eq!(
            at(TaskState::Queued, None, None, -5_000),
            Some(MIN_POLL_INTERVAL_MS)
        );
        // A timeout too large for milliseconds does not overflow.
        assert_eq!(
            at(TaskState::Running, Some(0), Some(u64::MAX), 600_000),
            Some(MAX_POLL_INTERVAL_MS)
        );
    }

    #[test]
    fn a_final_task_has_no_poll_interval() {
        for state in [
            TaskState::Succeeded,
            TaskState::Failed,
            TaskState::TimedOut,
            TaskState::Killed,
        ] {
            assert_eq!(
                poll_interval_ms(&record(state, Some(1), Some(60)), 5_000),
                None,
                "{state}"
            );
        }
    }

    #[test]
    fn polling_as_suggested_sees_a_short_task_soon_and_a_long_one_within_a_fifth() {
        // A client that obeys pollIntervalMs from the handle on: how late it
        // sees a task end, and how many tasks/get calls that takes.
        for (ends_at, most_late, most_polls) in [
            (150, 100, 2),
            (700, 175, 7),
            (60_000, 12_000, 35),
            (3_600_000, 10_000, 390),
        ] {
            let r = record(TaskState::Running, Some(0), Some(7_200));
            let (mut now, mut polls) = (0_i64, 0);
            while now < ends_at {
                now += i64::try_from(poll_interval_ms(&r, now).unwrap_or(0)).unwrap_or(0);
                polls += 1;
            }
            assert!(
                now - ends_at <= most_late,
                "a task of {ends_at} ms seen {} ms late",
                now - ends_at
            );
            assert!(
                polls <= most_polls,
                "a task of {ends_at} ms took {polls} polls"
            );
        }
    }
}
