//! The task state machine.
//!
//! ```text
//! queued ──claim──▶ running ──finish──▶ succeeded | failed | timed-out | killed
//!    └──────────────kill_task──────────────────────────────────────────▶ killed
//! ```
//! Terminal states are final: every Lua script in [`crate::scripts`] that writes a
//! state first checks that the current one is not terminal, inside Redis, atomically.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Where a task is in its life. Stored in the task hash as its `as_str()` form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum TaskState {
    /// Accepted and waiting in the stream for a worker with a free slot.
    Queued,
    /// Claimed by a worker: its workspace and container are being prepared or run.
    Running,
    /// The script exited with code 0.
    Succeeded,
    /// The script exited non-zero, ran out of memory, or could not be started.
    Failed,
    /// Stopped by `kill_task`, or lost with its worker.
    Killed,
    /// Still running when its wall-clock timeout expired.
    TimedOut,
}

impl TaskState {
    pub const ALL: [TaskState; 6] = [
        TaskState::Queued,
        TaskState::Running,
        TaskState::Succeeded,
        TaskState::Failed,
        TaskState::Killed,
        TaskState::TimedOut,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Queued => "queued",
            TaskState::Running => "running",
            TaskState::Succeeded => "succeeded",
            TaskState::Failed => "failed",
            TaskState::Killed => "killed",
            TaskState::TimedOut => "timed-out",
        }
    }

    pub fn is_terminal(self) -> bool {
        !matches!(self, TaskState::Queued | TaskState::Running)
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown task state {0:?}")]
pub struct UnknownState(pub String);

impl FromStr for TaskState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TaskState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_owned()))
    }
}

/// Why a task reached its terminal state. Stored as `reason_kind` next to the
/// human sentence in `reason`, so ops and code can branch on it without parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReasonKind {
    /// The container exited by itself, with the recorded exit code.
    Exited,
    /// The wall-clock timeout expired.
    TimedOut,
    /// `kill_task` was called.
    KilledByUser,
    /// The container hit its memory cap.
    OutOfMemory,
    /// The container could not be created or started (e.g. the image is missing).
    StartFailed,
    /// The workspace could not be prepared (e.g. the zip could not be extracted).
    WorkspaceFailed,
    /// The worker that held the task stopped heartbeating.
    WorkerLost,
    /// The worker that held the task restarted while it was running.
    WorkerRestarted,
    /// The worker shut down (after its grace period) while the task was running.
    WorkerShutdown,
    /// The script failed after filling its workspace (or /tmp).
    DiskFull,
    /// The script failed after reaching the process limit.
    ProcessLimit,
}

impl ReasonKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ReasonKind::Exited => "exited",
            ReasonKind::TimedOut => "timed-out",
            ReasonKind::KilledByUser => "killed-by-user",
            ReasonKind::OutOfMemory => "out-of-memory",
            ReasonKind::StartFailed => "start-failed",
            ReasonKind::WorkspaceFailed => "workspace-failed",
            ReasonKind::WorkerLost => "worker-lost",
            ReasonKind::WorkerRestarted => "worker-restarted",
            ReasonKind::WorkerShutdown => "worker-shutdown",
            ReasonKind::DiskFull => "disk-full",
            ReasonKind::ProcessLimit => "process-limit",
        }
    }
}

/// The sentence shown to clients for a kill requested through `kill_task`.
pub const KILLED_BY_USER_REASON: &str = "killed by kill_task";

/// A terminal outcome as the worker decides it: state, reason and exit code together,
/// so they cannot disagree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub state: TaskState,
    pub kind: ReasonKind,
    pub reason: String,
    pub exit_code: Option<i64>,
}

/// The caps a task ran under, named in reasons so a client knows which one it hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    pub memory_mib: u64,
    pub pids: i64,
    /// Size of /workspace (a tmpfs).
    pub disk_mib: u64,
    /// Size of /tmp, which is also `HOME` (a tmpfs).
    pub tmpfs_mib: u64,
}

impl Caps {
    /// Files in /workspace and /tmp live in memory and are charged to the memory
    /// cap: when the two together may fill it, a script that writes files can be
    /// OOM-killed before either reports "disk full", and its reason says so.
    pub fn files_can_fill_memory(&self) -> bool {
        self.disk_mib + self.tmpfs_mib >= self.memory_mib
    }

    fn out_of_memory_reason(&self) -> String {
        if self.files_can_fill_memory() {
            format!(
                "out of memory (limit {} MiB, shared with the files in /workspace and /tmp)",
                self.memory_mib
            )
        } else {
            format!("out of memory (limit {} MiB)", self.memory_mib)
        }
    }

    /// Which tmpfs filled up, from the lines of stderr that report it: a path
    /// under /tmp (`HOME`) names /tmp, one under /workspace names /workspace;
    /// both or neither (a relative path, a message without one) names the two.
    fn disk_full_reason(&self, exit_code: i64, stderr: &str) -> String {
        let lines = stderr
            .lines()
            .filter(|l| DISK_SIGNS.iter().any(|s| l.contains(s)));
        let (mut tmp, mut workspace) = (false, false);
        for line in lines {
            tmp |= line.contains("/tmp");
            workspace |= line.contains("/workspace");
        }
        let limit = match (workspace, tmp) {
            (true, false) => format!("workspace limit {} MiB", self.disk_mib),
            (false, true) => format!("/tmp and HOME limit {} MiB", self.tmpfs_mib),
            _ => format!(
                "workspace limit {} MiB, /tmp and HOME limit {} MiB",
                self.disk_mib, self.tmpfs_mib
            ),
        };
        format!("exited with code {exit_code}: disk full ({limit})")
    }
}

/// What a runtime prints when an allocation fails before the kernel's OOM killer
/// steps in (Python, Node).
const OOM_SIGNS: [&str; 3] = [
    "MemoryError",
    "JavaScript heap out of memory",
    "std::bad_alloc",
];
/// What `fork`/`clone` failing with EAGAIN at the PID limit looks like.
const PID_SIGNS: [&str; 4] = [
    "Resource temporarily unavailable",
    "can't fork",
    "Cannot fork",
    "fork: retry",
];
const DISK_SIGNS: [&str; 2] = ["No space left on device", "ENOSPC"];

impl Outcome {
    /// The container exited by itself. `oom_killed` comes from Docker's inspect;
    /// `stderr_tail` is searched for the marks a cap leaves when the script dies of
    /// it, so the reason can name the cap (a guess, said as such only by the kind:
    /// the exit code is always kept).
    pub fn exited(exit_code: i64, oom_killed: bool, stderr_tail: &[u8], caps: Caps) -> Outcome {
        let stderr = String::from_utf8_lossy(stderr_tail);
        let has = |signs: &[&str]| exit_code != 0 && signs.iter().any(|s| stderr.contains(s));
        if oom_killed || has(&OOM_SIGNS) {
            return Outcome {
                state: TaskState::Failed,
                kind: ReasonKind::OutOfMemory,
                reason: caps.out_of_memory_reason(),
                exit_code: Some(exit_code),
            };
        }
        let (state, kind, reason) = if exit_code == 0 {
            (
                TaskState::Succeeded,
                ReasonKind::Exited,
                "exited with code 0".to_owned(),
            )
        } else if has(&DISK_SIGNS) {
            (
                TaskState::Failed,
                ReasonKind::DiskFull,
                caps.disk_full_reason(exit_code, &stderr),
            )
        } else if has(&PID_SIGNS) {
            (
                TaskState::Failed,
                ReasonKind::ProcessLimit,
                format!(
                    "exited with code {exit_code}: process limit reached ({} processes)",
                    caps.pids
                ),
            )
        } else {
            (
                TaskState::Failed,
                ReasonKind::Exited,
                format!("exited with code {exit_code}"),
            )
        };
        Outcome {
            state,
            kind,
            reason,
            exit_code: Some(exit_code),
        }
    }

    pub fn timed_out(timeout_seconds: u64) -> Outcome {
        Outcome {
            state: TaskState::TimedOut,
            kind: ReasonKind::TimedOut,
            reason: format!("timed out after {timeout_seconds} s"),
            exit_code: None,
        }
    }

    pub fn failed(kind: ReasonKind, reason: impl Into<String>) -> Outcome {
        Outcome {
            state: TaskState::Failed,
            kind,
            reason: reason.into(),
            exit_code: None,
        }
    }

    pub fn killed(kind: ReasonKind, reason: impl Into<String>) -> Outcome {
        Outcome {
            state: TaskState::Killed,
            kind,
            reason: reason.into(),
            exit_code: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_through_their_stored_form() {
        for st in TaskState::ALL {
            assert_eq!(st.as_str().parse::<TaskState>(), Ok(st));
            // The serde form is what clients see; it must equal the stored form.
            assert_eq!(
                serde_json::to_value(st).ok(),
                Some(serde_json::json!(st.as_str()))
            );
        }
        assert!("done".parse::<TaskState>().is_err());
    }

    #[test]
    fn only_queued_and_running_are_not_terminal() {
        let open: Vec<_> = TaskState::ALL
            .into_iter()
            .filter(|s| !s.is_terminal())
            .collect();
        assert_eq!(open, vec![TaskState::Queued, TaskState::Running]);
    }

    const CAPS: Caps = Caps {
        memory_mib: 256,
        pids: 64,
        disk_mib: 100,
        tmpfs_mib: 50,
    };

    #[test]
    fn exit_outcomes_carry_code_and_sentence() {
        let ok = Outcome::exited(0, false, b"", CAPS);
        assert_eq!((ok.state, ok.exit_code), (TaskState::Succeeded, Some(0)));
        let bad = Outcome::exited(3, false, b"boom", CAPS);
        assert_eq!(
            (bad.state, bad.kind),
            (TaskState::Failed, ReasonKind::Exited)
        );
        assert_eq!(bad.reason, "exited with code 3");
        assert_eq!(Outcome::timed_out(300).reason, "timed out after 300 s");
    }

    #[test]
    fn reasons_name_the_cap_that_was_hit() {
        let oom = Outcome::exited(137, true, b"", CAPS);
        assert_eq!(
            (oom.kind, oom.reason.as_str()),
            (ReasonKind::OutOfMemory, "out of memory (limit 256 MiB)")
        );
        let py_oom = Outcome::exited(1, false, b"Traceback...\nMemoryError\n", CAPS);
        assert_eq!(py_oom.kind, ReasonKind::OutOfMemory);
        let disk = Outcome::exited(
            1,
            false,
            b"dd: error writing '/workspace/x': No space left on device\n",
            CAPS,
        );
        assert_eq!(
            disk.reason,
            "exited with code 1: disk full (workspace limit 100 MiB)"
        );
        let tmp = Outcome::exited(
            1,
            false,
            b"ERROR: [Errno 28] No space left on device: '/tmp/.local/lib/python3.13'\n",
            CAPS,
        );
        assert_eq!(
            (tmp.kind, tmp.reason.as_str()),
            (
                ReasonKind::DiskFull,
                "exited with code 1: disk full (/tmp and HOME limit 50 MiB)"
            )
        );
        let unknown = Outcome::exited(228, false, b"npm error code ENOSPC\n", CAPS);
        assert_eq!(
            unknown.reason,
            "exited with code 228: disk full (workspace limit 100 MiB, /tmp and HOME limit 50 MiB)"
        );
        let pids = Outcome::exited(
            1,
            false,
            b"BlockingIOError: [Errno 11] Resource temporarily unavailable",
            CAPS,
        );
        assert_eq!(
            pids.reason,
            "exited with code 1: process limit reached (64 processes)"
        );
        // When the two tmpfs mounts together can fill the memory cap, files may be
        // what exhausted it, and the reason says so.
        let roomy_disks = Caps {
            disk_mib: 220,
            ..CAPS
        };
        assert_eq!(
            Outcome::exited(137, true, b"", roomy_disks).reason,
            "out of memory (limit 256 MiB, shared with the files in /workspace and /tmp)"
        );
        // A script that succeeded after a failure it handled is still a success.
        assert_eq!(
            Outcome::exited(0, false, b"MemoryError", CAPS).state,
            TaskState::Succeeded
        );
    }
}
