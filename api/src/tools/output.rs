//! What the tools answer: each type's doc comments become the tool's output
//! schema (`{placeholders}` filled in by `describe`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use shared::options::CollectedFile;
use shared::time::rfc3339_ms;
use shared::usage::UsageView;
use shared::view::EgressView;
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
}

/// Output of `get_task_status`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct TaskStatus {
    pub task_id: String,
    /// queued | running | succeeded | failed | killed | timed-out. The last four are final.
    pub state: TaskState,
    /// The container's exit code once it exited, else null.
    pub exit_code: Option<i64>,
    /// A short sentence for every final state (e.g. "exited with code 3",
    /// "timed out after 300 s"); null while queued or running.
    pub reason: Option<String>,
    /// Why it ended, for a program to branch on: exited, timed-out,
    /// killed-by-user, out-of-memory, start-failed, container-lost,
    /// workspace-failed, worker-lost, worker-restarted, worker-shutdown,
    /// disk-full, process-limit, image-refused or not-replicated; null while queued or running.
    pub reason_kind: Option<ReasonKind>,
    /// The runtime the task runs in.
    pub runtime: String,
    /// Wall time since the container started (so far, while running); null if it never started.
    pub runtime_seconds: Option<f64>,
    /// Seconds since the last byte on stdout or stderr (since start if none yet),
    /// up to the end for a finished task; null if it never started. Growing while
    /// running means the script may be stuck.
    pub seconds_since_last_output: Option<f64>,
    /// The last tail_bytes bytes of stdout, cut on a character boundary.
    pub stdout_tail: String,
    /// The last tail_bytes bytes of stderr, cut on a character boundary.
    pub stderr_tail: String,
    /// True when stdout holds more than stdout_tail shows.
    pub stdout_truncated: bool,
    /// True when stderr holds more than stderr_tail shows.
    pub stderr_truncated: bool,
    /// Total bytes the script wrote to stdout.
    pub stdout_bytes: u64,
    /// Total bytes the script wrote to stderr.
    pub stderr_bytes: u64,
    /// The effective timeout.
    pub timeout_seconds: u64,
    /// When run_script accepted it (RFC 3339, UTC).
    pub created_at: Option<String>,
    /// When its container started; null if it has not.
    pub started_at: Option<String>,
    /// When it reached its final state; null until then.
    pub finished_at: Option<String>,
    /// What it used, as its container's cgroup reported at the end: cpu_seconds,
    /// peak_memory_bytes (files in /workspace and /tmp count), workspace_bytes
    /// (bytes in /workspace at the end). Null until it ended, or if it never
    /// ran; a figure the host could not report is null.
    pub usage: Option<UsageView>,
    /// Only for a task run with network {"allow": [...]}: its allow-list
    /// (`allow`) and each host it asked the egress proxy for (`attempts`: host,
    /// port, verdict "allowed" or why it was refused, count, bytes_out,
    /// bytes_in; `dropped` counts attempts past the log's 64 lines). Filled in
    /// as the task runs and complete once it has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressView>,
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
    /// The files collected: path relative to /workspace and size in bytes.
    pub files: Vec<CollectedFile>,
    /// True when more matched than the caps allow ({max_collect_files} files,
    /// {max_collect_size}): the listing and the zip hold what fitted.
    pub truncated: bool,
    /// The files as a zip archive, base64; null when nothing was collected.
    pub zip_base64: Option<String>,
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
        }
    }
}
