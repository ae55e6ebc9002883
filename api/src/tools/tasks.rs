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
//! `script-runner/state` and `script-runner/reason_kind`.

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
use crate::auth::{Principal, Scope};
use rmcp::RoleServer;
use rmcp::service::RequestContext;

/// `tasks/get`'s `_meta` keys for our state and reason kind.
pub const STATE_META_KEY: &str = "script-runner/state";
pub const REASON_KIND_META_KEY: &str = "script-runner/reason_kind";

impl ScriptRunner {
    /// `tasks/get`: the task's current state from its record, on any replica.
    pub(super) async fn get_mcp_task(
        &self,
        request: GetTaskParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let who = allowed(ctx, Scope::Read, "tasks/get").map_err(ToolError::into_protocol)?;
        let task_id = parse_task_id(&request.task_id).map_err(ToolError::into_protocol)?;
        let status = self
            .status(&who, task_id, DEFAULT_TAIL_BYTES)
            .await
            .map_err(ToolError::into_protocol)?;
        let mut meta = MetaObject::new();
        meta.insert(STATE_META_KEY.into(), serde_json::json!(status.state));
        meta.insert(
            REASON_KIND_META_KEY.into(),
            serde_json::json!(status.reason_kind),
        );
        let task = self
            .detailed_task(status)
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
        let status = self.status(who, task_id.to_owned(), 0).await?;
        Ok(self.detailed_task(status)?.task)
    }

    fn detailed_task(&self, status: TaskStatus) -> Result<DetailedTask, ToolError> {
        let ttl_ms = self.config.retention_seconds * 1000;
        detailed_task(status, ttl_ms).map_err(ToolError::Encode)
    }
}

/// How often a client should poll a task that is still working.
pub const POLL_INTERVAL_MS: u64 = 1000;

/// The MCP task for one of our tasks, as `get_task_status` would describe it.
/// `ttl_ms` is how long its record is kept once it ends.
fn detailed_task(status: TaskStatus, ttl_ms: u64) -> Result<DetailedTask, serde_json::Error> {
    let created = status.created_at.clone().unwrap_or_default();
    let updated = [&status.finished_at, &status.started_at]
        .into_iter()
        .flatten()
        .next()
        .cloned()
        .unwrap_or_else(|| created.clone());
    let task = Task::new(status.task_id.clone(), McpStatus::Working, created, updated)
        .with_ttl_ms(ttl_ms)
        .with_poll_interval_ms(POLL_INTERVAL_MS);
    let (task, payload) = match status.state {
        TaskState::Queued => (
            task.with_status_message("queued: waiting for a free worker slot"),
            TaskPayload::Working,
        ),
        TaskState::Running => {
            let message = match (status.runtime_seconds, status.seconds_since_last_output) {
                (Some(ran), Some(quiet)) => {
                    format!("running for {ran:.0} s, last output {quiet:.0} s ago")
                }
                _ => "running: starting its container".to_owned(),
            };
            (task.with_status_message(message), TaskPayload::Working)
        }
        TaskState::Killed => {
            let reason = status.reason.clone().unwrap_or_else(|| "killed".into());
            (task.with_status_message(reason), TaskPayload::Cancelled)
        }
        TaskState::Succeeded | TaskState::Failed | TaskState::TimedOut => {
            let failed = status.state != TaskState::Succeeded;
            let message = status.reason.clone().unwrap_or_default();
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
            }),
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
        let q = detailed_task(status(TaskState::Queued, None), 1000)?;
        assert_eq!(q.status(), McpStatus::Working);
        assert!(
            q.task
                .status_message
                .is_some_and(|m| m.starts_with("queued"))
        );
        let r = detailed_task(status(TaskState::Running, None), 1000)?;
        assert_eq!(
            r.task.status_message.as_deref(),
            Some("running for 2 s, last output 1 s ago")
        );
        assert_eq!(r.task.poll_interval_ms, Some(POLL_INTERVAL_MS));
        assert_eq!(r.task.ttl_ms, Some(1000));
        Ok(())
    }

    #[test]
    fn final_states_complete_with_the_status_result_and_errors_flagged()
    -> Result<(), serde_json::Error> {
        let ok = detailed_task(status(TaskState::Succeeded, Some("exited with code 0")), 1)?;
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
                "workspace_bytes": 4096
            }))
        );
        for bad in [TaskState::Failed, TaskState::TimedOut] {
            let t = detailed_task(status(bad, Some("exited with code 3")), 1)?;
            assert_eq!(
                t.status(),
                McpStatus::Completed,
                "{bad}: failed is for protocol errors"
            );
            let result = result_of(&t).cloned().unwrap_or_default();
            assert_eq!(result.get("isError"), Some(&serde_json::json!(true)));
        }
        let killed = detailed_task(status(TaskState::Killed, Some("killed by kill_task")), 1)?;
        assert_eq!(killed.status(), McpStatus::Cancelled);
        assert_eq!(
            killed.task.status_message.as_deref(),
            Some("killed by kill_task")
        );
        Ok(())
    }
}
