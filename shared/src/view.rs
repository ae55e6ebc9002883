//! A task's status as people and clients see it, built from its record once:
//! the api's `get_task_status` (and the views built on it) and the ctl's
//! `task` map this onto their own output types, so the clock, the timestamps
//! and the tails are computed one way.

use crate::egress::EgressLog;
use crate::keys::Field;
use crate::record::TaskRecord;
use crate::tail::{RenderedTail, render_tail};
use crate::task::{ReasonKind, TaskState};
use crate::time::{rfc3339_ms, task_clock};
use crate::usage::Usage;

/// The fields a [`StatusView`] is built from: what a reader asks Redis for
/// (`HMGET`) when it shows only the status. The command, image, env and the
/// worker's bookkeeping stay in Redis.
pub const STATUS_FIELDS: [Field; 20] = [
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
    Field::EgressAllow,
    Field::EgressLog,
];

/// A task's status at one moment. Unset record fields stay `None` here; each
/// output decides its own defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusView {
    pub state: TaskState,
    /// The sentence, as recorded (only an ended task has one).
    pub reason: Option<String>,
    pub reason_kind: Option<ReasonKind>,
    pub exit_code: Option<i64>,
    pub runtime: Option<String>,
    pub timeout_seconds: Option<u64>,
    /// RFC 3339 UTC.
    pub created_at: Option<String>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    /// Seconds since its container started (until it finished); `None` before.
    pub runtime_seconds: Option<f64>,
    /// Seconds since its last output byte (since the start if none).
    pub seconds_since_last_output: Option<f64>,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// The last `tail_bytes` of each stream, cut on a UTF-8 boundary.
    pub stdout: RenderedTail,
    pub stderr: RenderedTail,
    /// What its container used, once it ended (if it could be read).
    pub usage: Option<Usage>,
    /// An allow-list task's hosts and what the egress proxy saw of it.
    pub egress: Option<EgressView>,
}

/// An allow-list task's egress: its list and its log (empty until the
/// worker's proxy has seen an attempt).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct EgressView {
    /// The hosts the task may reach, as given (`*.` for every name under a domain).
    pub allow: Vec<String>,
    /// Each host asked for through the proxy, allowed or refused, with bytes;
    /// at most 64 lines, the rest counted in `dropped`.
    #[serde(flatten)]
    pub log: EgressLog,
}

impl StatusView {
    /// The view of `r` at `now_ms` (Redis's clock, read with the record), with
    /// tails of at most `tail_bytes`.
    pub fn new(r: &TaskRecord, now_ms: i64, tail_bytes: usize) -> StatusView {
        let (runtime_seconds, seconds_since_last_output) =
            task_clock(r.started_at, r.last_output_at, r.finished_at, now_ms);
        let stdout_bytes = r.stdout_bytes.unwrap_or(0);
        let stderr_bytes = r.stderr_bytes.unwrap_or(0);
        let tail = |t: &Option<Vec<u8>>, total| {
            render_tail(t.as_deref().unwrap_or_default(), tail_bytes, total)
        };
        StatusView {
            state: r.state,
            reason: r.reason.clone(),
            reason_kind: r.reason_kind,
            exit_code: r.exit_code,
            runtime: r.runtime.clone(),
            timeout_seconds: r.timeout_seconds,
            created_at: r.created_at.map(rfc3339_ms),
            started_at: r.started_at.map(rfc3339_ms),
            finished_at: r.finished_at.map(rfc3339_ms),
            runtime_seconds,
            seconds_since_last_output,
            stdout_bytes,
            stderr_bytes,
            stdout: tail(&r.stdout_tail, stdout_bytes),
            stderr: tail(&r.stderr_tail, stderr_bytes),
            usage: Usage::of(r),
            egress: r.egress_allow.as_ref().map(|l| EgressView {
                allow: l.entries().iter().map(ToString::to_string).collect(),
                log: r.egress_log.clone().unwrap_or_default(),
            }),
        }
    }

    /// The reason and its kind once the task has ended; `None` before (what
    /// clients are shown).
    pub fn end_reason(&self) -> Option<(&str, Option<ReasonKind>)> {
        if self.state.is_terminal() {
            self.reason.as_deref().map(|r| (r, self.reason_kind))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_task_reads_its_clock_times_and_tails_from_the_record() {
        let r = TaskRecord {
            runtime: Some("python3.13".into()),
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
        assert_eq!((v.stdout.text.as_str(), v.stdout.truncated), ("lo\n", true));
        assert_eq!((v.stderr.text.as_str(), v.stderr_bytes), ("", 0));
        assert_eq!(
            v.end_reason(),
            Some(("exited with code 0", Some(ReasonKind::Exited)))
        );
    }

    #[test]
    fn a_queued_task_has_no_clock_and_no_reason() {
        let v = StatusView::new(&TaskRecord::new(TaskState::Queued), 9_000, 100);
        assert_eq!(
            (v.runtime_seconds, v.seconds_since_last_output),
            (None, None)
        );
        assert_eq!(v.end_reason(), None);
        assert_eq!((v.stdout.text.as_str(), v.stdout.truncated), ("", false));
    }
}
