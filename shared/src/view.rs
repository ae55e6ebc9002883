//! A task's status as people and clients see it, built from its record once:
//! the api's `get_task_status` (and the views built on it) and the ctl's
//! `task` flatten it into their own output types, so the fields, the clock,
//! the timestamps and the tails are defined and computed one way.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::egress::EgressLog;
use crate::keys::Field;
use crate::record::TaskRecord;
use crate::tail::render_tail;
use crate::task::{ReasonKind, TaskState};
use crate::time::{rfc3339_ms, task_clock};
use crate::usage::{Usage, UsageView};
use crate::workspace::WorkspaceId;

/// The fields a [`StatusView`] is built from: what a reader asks Redis for
/// (`HMGET`) when it shows only the status. The command, image, env and the
/// worker's bookkeeping stay in Redis.
pub const STATUS_FIELDS: [Field; 24] = [
    Field::State,
    Field::Runtime,
    Field::TimeoutSeconds,
    Field::CreatedAt,
    Field::StartedAt,
    Field::FinishedAt,
    Field::LastOutputAt,
    Field::ExitCode,
    Field::Reason,
    Field::ReasonKind,
    Field::StdoutTail,
    Field::StderrTail,
    Field::StdoutBytes,
    Field::StderrBytes,
    Field::Owner,
    Field::UsageCpuMs,
    Field::UsagePeakMemoryBytes,
    Field::UsageWorkspaceBytes,
    Field::UsageEstimated,
    Field::EgressAllow,
    Field::EgressLog,
    Field::WorkspaceId,
    Field::WorkspaceVersion,
    Field::WorkspaceNote,
];

/// The fields a [`WorkspaceView`] is built from, for a reader that shows a
/// task's workspace without the rest of its status (`list_tasks`).
pub const WORKSPACE_FIELDS: [Field; 3] = [
    Field::WorkspaceId,
    Field::WorkspaceVersion,
    Field::WorkspaceNote,
];

/// A task's status at one moment, as clients see it: the fields of
/// `get_task_status` but its `task_id`. Its doc comments are the tool's
/// outputSchema descriptions (placeholders filled in by the api's
/// `describe`); the api's `TaskStatus` and the ctl's `TaskView` flatten it and
/// add their own fields, so the fields and their defaults exist once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StatusView {
    /// queued | running | succeeded | failed | killed | timed-out. The last four are final.
    pub state: TaskState,
    /// The container's exit code once it exited, else null.
    pub exit_code: Option<i64>,
    /// A short sentence for every final state (e.g. "exited with code 3",
    /// "timed out after 300 s"); null while queued or running.
    pub reason: Option<String>,
    // The api fills `{reason_kinds}` from `ReasonKind::ALL`, so the list
    // clients read cannot fall behind the enum.
    /// Why it ended, for a program to branch on: {reason_kinds}; null while queued or running.
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
    /// (bytes in /workspace at the end), and estimated (true when the container
    /// was gone before its end could be read: cpu_seconds is then the most it
    /// could have used, which its owner's CPU quota is charged). Null until it
    /// ended, or if it never ran; a figure the host could not report is null.
    pub usage: Option<UsageView>,
    /// Only for a task run on a workspace: its id, the version it made and why
    /// it made none.
    #[serde(flatten)]
    pub workspace: Option<WorkspaceView>,
    /// Only for a task run with network {"allow": [...]}: its allow-list
    /// (`allow`) and each host it asked the egress proxy for (`attempts`: host,
    /// port, verdict "allowed" or why it was refused, count, bytes_out,
    /// bytes_in; `dropped` counts attempts past the log's 64 lines). Filled in
    /// as the task runs and complete once it has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressView>,
}

/// An allow-list task's egress: its list and its log (empty until the
/// worker's proxy has seen an attempt).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EgressView {
    /// The hosts the task may reach, as given (`*.` for every name under a domain).
    pub allow: Vec<String>,
    /// Each host asked for through the proxy, allowed or refused, with bytes;
    /// at most 64 lines, the rest counted in `dropped`.
    #[serde(flatten)]
    pub log: EgressLog,
}

/// A task's workspace, in every view of the task (`get_task_status`,
/// `list_tasks`, `tasks/get`): absent, fields and all, for a task run without
/// one. Flattened into those views.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WorkspaceView {
    /// Only for a task run on a workspace: the workspace it runs on.
    pub workspace_id: WorkspaceId,
    /// Only for a task run on a workspace: the version its /workspace became
    /// when it ended (the workspace's head from then on); null until it is
    /// saved, and when it made none (workspace_note says why).
    pub workspace_version: Option<u64>,
    /// Only for a task run on a workspace: why it made no version (e.g. its
    /// worker was lost, or the workspace was deleted meanwhile); null
    /// otherwise.
    pub workspace_note: Option<String>,
}

impl WorkspaceView {
    /// The workspace part of `r`, if it runs on one.
    pub fn of(r: &TaskRecord) -> Option<WorkspaceView> {
        Some(WorkspaceView {
            workspace_id: r.workspace_id?,
            workspace_version: r.workspace_version,
            workspace_note: r.workspace_note.clone(),
        })
    }
}

/// The fields [`holds_workspace`] reads of the task a workspace's `busy`
/// field names.
pub const HOLDER_FIELDS: [Field; 4] = [
    Field::State,
    Field::FinishedAt,
    Field::Worker,
    Field::ReasonKind,
];

/// Whether the task a workspace's `busy` field names (`None`: its record is
/// gone) still holds the workspace at `now_ms`: while it is queued or running,
/// and for `grace_ms` after its end on a worker that claimed it and was not
/// lost (that worker may still be saving its /workspace). SUBMIT's rule
/// (`shared/src/lua/submit.lua`), for the views: a task killed before any
/// worker claimed it leaves `busy` set but holds nothing.
pub fn holds_workspace(task: Option<&TaskRecord>, now_ms: i64, grace_ms: u64) -> bool {
    let Some(t) = task else { return false };
    if !t.state.is_terminal() {
        return true;
    }
    let claimed = t.worker.as_deref().is_some_and(|w| !w.is_empty());
    // Lost, or refused unsigned: no worker is saving it.
    let lost = matches!(
        t.reason_kind,
        Some(ReasonKind::WorkerLost | ReasonKind::SpecRejected)
    );
    let grace = i64::try_from(grace_ms).unwrap_or(i64::MAX);
    claimed && !lost && t.finished_at.unwrap_or(0) > now_ms.saturating_sub(grace)
}

impl StatusView {
    /// The view of `r` at `now_ms` (Redis's clock, read with the record), with
    /// tails of at most `tail_bytes`. A field the record lacks reads as its
    /// type's empty value (a runtime of "", a timeout of 0), and the reason is
    /// shown only once the task has ended.
    pub fn new(r: &TaskRecord, now_ms: i64, tail_bytes: usize) -> StatusView {
        let (runtime_seconds, seconds_since_last_output) =
            task_clock(r.started_at, r.last_output_at, r.finished_at, now_ms);
        let stdout_bytes = r.stdout_bytes.unwrap_or(0);
        let stderr_bytes = r.stderr_bytes.unwrap_or(0);
        let tail = |t: &Option<Vec<u8>>, total| {
            render_tail(t.as_deref().unwrap_or_default(), tail_bytes, total)
        };
        let (stdout, stderr) = (
            tail(&r.stdout_tail, stdout_bytes),
            tail(&r.stderr_tail, stderr_bytes),
        );
        // Only the scripts that end a task write a reason; a reason beside an
        // open state would be a stale or hand-made one, not an answer.
        let ended = r.state.is_terminal();
        StatusView {
            state: r.state,
            exit_code: r.exit_code,
            reason: r.reason.clone().filter(|_| ended),
            reason_kind: r.reason_kind.filter(|_| ended),
            runtime: r
                .runtime
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            runtime_seconds,
            seconds_since_last_output,
            stdout_tail: stdout.text,
            stderr_tail: stderr.text,
            stdout_truncated: stdout.truncated,
            stderr_truncated: stderr.truncated,
            stdout_bytes,
            stderr_bytes,
            timeout_seconds: r.timeout_seconds.unwrap_or(0),
            created_at: r.created_at.map(rfc3339_ms),
            started_at: r.started_at.map(rfc3339_ms),
            finished_at: r.finished_at.map(rfc3339_ms),
            usage: Usage::of(r).map(|u| u.view()),
            workspace: WorkspaceView::of(r),
            egress: r.egress_allow.as_ref().map(|l| EgressView {
                allow: l.entries().iter().map(ToString::to_string).collect(),
                log: r.egress_log.clone().unwrap_or_default(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_task_reads_its_clock_times_and_tails_from_the_record() {
        let r = TaskRecord {
            runtime: Some(crate::RuntimeName::from_stored("python3.13")),
            created_at: Some(0),
            started_at: Some(1_000),
            last_output_at: Some(2_000),
            finished_at: Some(2_500),
            exit_code: Some(0),
            reason: Some("exited with code 0".into()),
            reason_kind: Some(ReasonKind::Exited),
            stdout_tail: Some(b"hello\n".to_vec()),
            stdout_bytes: Some(6),
            ..TaskRecord::new(TaskState::Succeeded)
        };
        let v = StatusView::new(&r, 9_000, 3);
        assert_eq!(
            (v.runtime_seconds, v.seconds_since_last_output),
            (Some(1.5), Some(0.5))
        );
        assert_eq!(v.started_at.as_deref(), Some("1970-01-01T00:00:01.000Z"));
        assert_eq!((v.stdout_tail.as_str(), v.stdout_truncated), ("lo\n", true));
        assert_eq!((v.stderr_tail.as_str(), v.stderr_bytes), ("", 0));
        assert_eq!(
            (v.reason.as_deref(), v.reason_kind),
            (Some("exited with code 0"), Some(ReasonKind::Exited))
        );
        assert_eq!((v.runtime.as_str(), v.timeout_seconds), ("python3.13", 0));
    }

    #[test]
    fn a_queued_task_has_no_clock_and_no_reason() {
        let v = StatusView::new(&TaskRecord::new(TaskState::Queued), 9_000, 100);
        assert_eq!(
            (v.runtime_seconds, v.seconds_since_last_output),
            (None, None)
        );
        assert_eq!((v.reason, v.reason_kind), (None, None));
        assert_eq!((v.stdout_tail.as_str(), v.stdout_truncated), ("", false));
    }

    #[test]
    fn an_open_task_shows_no_reason_even_if_one_is_recorded() {
        let r = TaskRecord {
            reason: Some("left over".into()),
            reason_kind: Some(ReasonKind::WorkerLost),
            ..TaskRecord::new(TaskState::Running)
        };
        let v = StatusView::new(&r, 9_000, 100);
        assert_eq!((v.reason, v.reason_kind), (None, None));
    }

    #[test]
    fn no_egress_field_for_a_task_without_an_allow_list() -> Result<(), serde_json::Error> {
        let v = StatusView::new(&TaskRecord::new(TaskState::Queued), 9_000, 100);
        let json = serde_json::to_value(&v)?;
        assert!(json.get("egress").is_none(), "{json}");
        assert_eq!(serde_json::from_value::<StatusView>(json)?, v);
        Ok(())
    }

    #[test]
    fn a_workspace_task_shows_its_workspace_and_others_show_none() -> Result<(), serde_json::Error>
    {
        let plain = serde_json::to_value(StatusView::new(
            &TaskRecord::new(TaskState::Queued),
            9_000,
            100,
        ))?;
        for field in ["workspace_id", "workspace_version", "workspace_note"] {
            assert!(plain.get(field).is_none(), "{field} in {plain}");
        }
        let id = WorkspaceId::from_bytes([3; 16]);
        let r = TaskRecord {
            workspace_id: Some(id),
            workspace_base: Some(2),
            ..TaskRecord::new(TaskState::Running)
        };
        let v = StatusView::new(&r, 9_000, 100);
        let json = serde_json::to_value(&v)?;
        assert_eq!(json["workspace_id"], serde_json::json!(id.to_string()));
        assert_eq!(json["workspace_version"], serde_json::Value::Null);
        assert_eq!(json["workspace_note"], serde_json::Value::Null);
        assert_eq!(serde_json::from_value::<StatusView>(json)?, v);
        let saved = TaskRecord {
            workspace_version: Some(3),
            ..r
        };
        let v = StatusView::new(&saved, 9_000, 100);
        assert_eq!(
            v.workspace.and_then(|w| w.workspace_version),
            Some(3),
            "the version it made"
        );
        Ok(())
    }

    #[test]
    fn a_workspace_is_held_while_its_task_runs_or_may_still_be_saving() {
        let grace = 1_000;
        let task = |state, worker: Option<&str>, finished, kind| TaskRecord {
            worker: worker.map(str::to_owned),
            finished_at: finished,
            reason_kind: kind,
            ..TaskRecord::new(state)
        };
        let holds = |t: &TaskRecord| holds_workspace(Some(t), 10_000, grace);
        assert!(holds(&task(TaskState::Queued, None, None, None)));
        assert!(holds(&task(TaskState::Running, Some("w"), None, None)));
        // Ended on a worker that may still be saving: held for the grace.
        let ended = task(TaskState::Succeeded, Some("w"), Some(9_500), None);
        assert!(holds(&ended));
        assert!(!holds_workspace(Some(&ended), 10_500, grace));
        // Killed before any worker claimed it, or its worker lost: free.
        assert!(!holds(&task(TaskState::Killed, None, Some(9_900), None)));
        let lost = task(
            TaskState::Failed,
            Some("w"),
            Some(9_900),
            Some(ReasonKind::WorkerLost),
        );
        assert!(!holds(&lost));
        assert!(!holds_workspace(None, 10_000, grace), "a record gone");
    }
}
