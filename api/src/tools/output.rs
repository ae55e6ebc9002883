//! What the tools answer: each type's doc comments become the tool's output
//! schema (`{placeholders}` filled in by `describe`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use shared::time::rfc3339_ms;
use shared::usage::UsageView;
use shared::view::{StatusView, WorkspaceView};
use shared::workspace::{VersionRecord, WorkspaceId, WorkspaceRecord};
use shared::{ReasonKind, TaskState};

use crate::db::ListedTask;

/// `list_tasks` shows the command's first line up to this many characters.
pub const LIST_COMMAND_CHARS: usize = 200;

/// Output of `run_script`. With `wait_seconds`, a task that ended in time is
/// answered with get_task_status's fields instead (these three among them):
/// a final `state` tells that answer apart.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct RunScriptOutput {
    /// The id to pass to get_task_status and kill_task.
    pub task_id: String,
    /// "queued" (it waits for a free worker slot), or with wait_seconds the
    /// state when the wait ended: "running", or a final state with
    /// get_task_status's other fields beside it.
    pub state: TaskState,
    /// The effective timeout, after the server's cap.
    pub timeout_seconds: u64,
    /// Only with workspace: the workspace the task runs on (for "new", the id
    /// of the workspace just made: pass it as workspace {"id": ...} next time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_id: Option<WorkspaceId>,
}

/// Output of `get_task_status`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct TaskStatus {
    pub task_id: String,
    // Every other field, with its schema description, is the shared view's;
    // flattened after `task_id`, the JSON's order is docs/tools.md's.
    #[serde(flatten)]
    pub view: StatusView,
}

/// One task in `list_tasks`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct TaskSummary {
    pub task_id: String,
    pub state: TaskState,
    pub runtime: String,
    /// When run_script accepted it (RFC 3339, UTC).
    pub created_at: String,
    /// When it reached its final state; null until then.
    pub finished_at: Option<String>,
    /// The container's exit code once it exited, else null.
    pub exit_code: Option<i64>,
    /// The sentence for a final state; null while queued or running.
    pub reason: Option<String>,
    /// Why it ended (as in get_task_status); null while queued or running.
    pub reason_kind: Option<ReasonKind>,
    /// The first line of the command (at most {list_command_chars} characters).
    pub command: String,
    /// What it used (as in get_task_status); null until it ended.
    pub usage: Option<UsageView>,
    /// Only for a task run on a workspace: workspace_id, workspace_version and
    /// workspace_note, as in get_task_status.
    #[serde(flatten)]
    pub workspace: Option<WorkspaceView>,
}

/// Output of `list_tasks`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ListTasksOutput {
    /// Newest first.
    pub tasks: Vec<TaskSummary>,
    /// Pass as cursor for the next page; null when there are no more tasks. A
    /// page may hold fewer than limit tasks (even none) when a state filter
    /// skipped many: keep going while next_cursor is not null.
    pub next_cursor: Option<String>,
}

/// Output of `kill_task`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct KillOutput {
    pub task_id: String,
    /// The task's state after the call: "killed", or the final state it already had.
    pub state: TaskState,
    /// True if this call stopped it; false if it had already finished.
    pub killed: bool,
}

/// Output of `get_task_files`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct TaskFilesOutput {
    pub task_id: String,
    /// The task's state (final).
    pub state: TaskState,
    /// The files collected: path relative to /workspace, size in bytes, and
    /// the uri resources/read returns the file at.
    pub files: Vec<TaskFile>,
    /// True when more matched than the caps allow ({max_collect_files} files,
    /// {max_collect_size}): the listing and the zip hold what fitted.
    pub truncated: bool,
    /// The files as a zip archive, base64; null when nothing was collected.
    pub zip_base64: Option<String>,
}

/// One collected file in `get_task_files`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct TaskFile {
    /// Path relative to /workspace.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Where resources/read returns it: task://<task_id>/files/<path>.
    pub uri: String,
}

impl From<ListedTask> for TaskSummary {
    fn from(t: ListedTask) -> TaskSummary {
        let first_line = t.command.lines().next().unwrap_or_default();
        // As in get_task_status: only a final state shows a reason.
        let ended = t.state.is_terminal();
        TaskSummary {
            reason: t.reason.filter(|_| ended),
            reason_kind: t.reason_kind.filter(|_| ended),
            task_id: t.task_id,
            state: t.state,
            runtime: t.runtime,
            created_at: rfc3339_ms(t.created_ms),
            finished_at: t.finished_ms.map(rfc3339_ms),
            exit_code: t.exit_code,
            command: first_line.chars().take(LIST_COMMAND_CHARS).collect(),
            usage: t.usage.map(|u| u.view()),
            workspace: t.workspace,
        }
    }
}

/// The version a workspace was forked from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ForkedFrom {
    /// The workspace forked.
    pub workspace_id: WorkspaceId,
    /// Its version the fork started from (0: the empty one).
    pub version: u64,
}

impl ForkedFrom {
    /// The stored `<workspace id>@<version>`.
    pub fn parse(stored: &str) -> Option<ForkedFrom> {
        let (id, version) = stored.rsplit_once('@')?;
        Some(ForkedFrom {
            workspace_id: WorkspaceId::parse(id).ok()?,
            version: version.parse().ok()?,
        })
    }
}

/// A workspace, as list_workspaces and get_workspace show it.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct WorkspaceSummary {
    /// Pass it to run_script as workspace {"id": ...}, or to the other
    /// workspace tools.
    pub workspace_id: WorkspaceId,
    /// The version a task starts from when it names none: the newest (0: the
    /// empty one, before any task saved one).
    pub head: u64,
    /// The task using it now (queued, running, or ended with its /workspace
    /// still being saved); null when it is free. A run_script on a busy
    /// workspace is refused (workspace_busy).
    pub busy_task: Option<String>,
    /// When it was made (RFC 3339, UTC).
    pub created_at: String,
    /// When a task last took it, or a task's files were last saved into it
    /// (RFC 3339, UTC).
    pub last_used_at: String,
    /// For a fork: the workspace and version it was forked from; else null.
    pub forked_from: Option<ForkedFrom>,
    /// What its kept versions hold, each counted whole: what it counts
    /// against your cap on all your workspaces together.
    pub bytes: u64,
}

impl From<WorkspaceRecord> for WorkspaceSummary {
    fn from(w: WorkspaceRecord) -> WorkspaceSummary {
        let forked_from = w.forked_from.as_deref().and_then(|f| {
            let parsed = ForkedFrom::parse(f);
            if parsed.is_none() {
                tracing::warn!(workspace_id = %w.id, forked_from = f, "a workspace's forked_from does not read");
            }
            parsed
        });
        WorkspaceSummary {
            workspace_id: w.id,
            head: w.head,
            busy_task: w.busy,
            created_at: rfc3339_ms(w.created_at),
            last_used_at: rfc3339_ms(w.last_used_at),
            forked_from,
            bytes: w.bytes,
        }
    }
}

/// Output of `list_workspaces`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ListWorkspacesOutput {
    /// Newest first (for the admin key: every owner's, most recently used first).
    pub workspaces: Vec<WorkspaceSummary>,
    /// Pass as cursor for the next page; null when there are no more.
    pub next_cursor: Option<String>,
}

/// One kept version of a workspace.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct VersionSummary {
    /// Its number: pass it as workspace {"id": ..., "version": N} to start a
    /// task from it, or to fork_workspace.
    pub version: u64,
    /// The task whose /workspace it is; null for a fork's first version (it
    /// is the forked version's files).
    pub task_id: Option<String>,
    /// Bytes of its files.
    pub bytes: u64,
    /// Its entries: files, directories and links.
    pub files: u64,
    /// When it was saved (RFC 3339, UTC).
    pub created_at: String,
    /// The version its task started from; null for a fork's first version.
    pub parent: Option<u64>,
}

impl From<VersionRecord> for VersionSummary {
    fn from(v: VersionRecord) -> VersionSummary {
        VersionSummary {
            version: v.version,
            task_id: v.task_id,
            bytes: v.bytes,
            files: v.files,
            created_at: rfc3339_ms(v.created_at),
            parent: v.parent,
        }
    }
}

/// Output of `get_workspace`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct GetWorkspaceOutput {
    #[serde(flatten)]
    pub workspace: WorkspaceSummary,
    /// The kept versions, oldest first. Version 0, the empty one, is not
    /// listed: every workspace has it.
    pub versions: Vec<VersionSummary>,
}

/// Output of `fork_workspace`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ForkWorkspaceOutput {
    /// The new workspace: pass it to run_script as workspace {"id": ...}.
    pub workspace_id: WorkspaceId,
    /// The workspace and version it was forked from.
    pub forked_from: ForkedFrom,
    /// The new workspace's head: 1, a version with the forked version's files
    /// (0 when the empty version 0 was forked).
    pub head: u64,
}

/// Output of `delete_workspace`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct DeleteWorkspaceOutput {
    pub workspace_id: WorkspaceId,
    /// True: the workspace and its versions are gone.
    pub deleted: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::TaskRecord;
    use shared::egress::AllowList;
    use testkit::json::keys_in_order;

    #[test]
    fn get_task_status_keeps_its_fields_and_their_order() -> Result<(), Box<dyn std::error::Error>>
    {
        let record = TaskRecord {
            egress_allow: Some(AllowList::parse(&["pypi.org"])?),
            ..TaskRecord::new(TaskState::Succeeded)
        };
        let status = TaskStatus {
            task_id: "t".into(),
            view: StatusView::new(&record, 0, 100),
        };
        let json = serde_json::to_string(&status)?;
        // docs/tools.md's table, in its order; `egress` only for an allow-list task.
        let want = [
            "task_id",
            "state",
            "exit_code",
            "reason",
            "reason_kind",
            "runtime",
            "runtime_seconds",
            "seconds_since_last_output",
            "stdout_tail",
            "stderr_tail",
            "stdout_truncated",
            "stderr_truncated",
            "stdout_bytes",
            "stderr_bytes",
            "timeout_seconds",
            "created_at",
            "started_at",
            "finished_at",
            "usage",
            "egress",
        ];
        assert_eq!(keys_in_order(&json)?, want);
        let back: TaskStatus = serde_json::from_str(&json)?;
        assert_eq!((back.task_id.as_str(), &back.view), ("t", &status.view));
        // A workspace task's three fields come after usage.
        let on_workspace = TaskRecord {
            workspace_id: Some(WorkspaceId::from_bytes([5; 16])),
            ..record
        };
        let status = TaskStatus {
            task_id: "t".into(),
            view: StatusView::new(&on_workspace, 0, 100),
        };
        let json = serde_json::to_string(&status)?;
        let mut want = want.to_vec();
        want.splice(
            19..19,
            ["workspace_id", "workspace_version", "workspace_note"],
        );
        assert_eq!(keys_in_order(&json)?, want);
        let back: TaskStatus = serde_json::from_str(&json)?;
        assert_eq!(back.view, status.view);
        Ok(())
    }

    #[test]
    fn forked_from_reads_as_stored() {
        let id = WorkspaceId::from_bytes([9; 16]);
        assert_eq!(
            ForkedFrom::parse(&format!("{id}@3")),
            Some(ForkedFrom {
                workspace_id: id,
                version: 3
            })
        );
        for bad in ["", "x@1", &format!("{id}@"), &format!("{id}")] {
            assert_eq!(ForkedFrom::parse(bad), None, "{bad:?}");
        }
    }
}
