//! The task state machine.
//!
//! ```text
//! queued ──claim──▶ running ──finish──▶ succeeded | failed | timed-out | killed
//!    └──────────────kill_task──────────────────────────────────────────▶ killed
//! ```
//! Terminal states are final: every Lua script in [`crate::scripts`] that writes a
//! state first checks that the current one is not terminal, inside Redis, atomically.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::names::{UnknownName, stored_names};

/// Where a task is in its life. Stored in the task hash as its `as_str()` form,
/// which is also its serde form (what clients see).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantArray,
    strum::Display,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case", const_into_str)]
#[strum(parse_err_ty = UnknownName, parse_err_fn = TaskState::unknown)]
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

stored_names!(TaskState, parse "task state");

impl TaskState {
    pub fn is_terminal(self) -> bool {
        !matches!(self, TaskState::Queued | TaskState::Running)
    }
}

/// Why a task reached its terminal state. Stored as `reason_kind` next to the
/// human sentence in `reason`, so ops and code can branch on it without parsing.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantArray,
    strum::Display,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case", const_into_str)]
#[strum(parse_err_ty = UnknownName, parse_err_fn = ReasonKind::unknown)]
pub enum ReasonKind {
    /// The container exited by itself, with the recorded exit code.
    Exited,
    /// The wall-clock timeout expired.
    TimedOut,
    /// `kill_task` was called.
    KilledByUser,
    /// An operator killed it with `script-runner-ctl` (`tasks kill`, or
    /// `keys revoke --kill-tasks`): every active task of its owner.
    KilledByOperator,
    /// The container hit its memory cap.
    OutOfMemory,
    /// The container could not be created or started (e.g. the image is missing).
    StartFailed,
    /// The container started, then the worker lost track of it (the engine
    /// stopped answering about it, or it was removed from outside).
    ContainerLost,
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
    /// The worker refused the task's record: its runtime or image is not in the
    /// worker's catalogue (nothing was pulled or run).
    ImageRefused,
    /// The worker refused the task's spec: its signature does not hold (a
    /// record written or changed in Redis by anything but the api), so nothing
    /// was pulled or run.
    SpecRejected,
    /// The api withdrew the submit: Redis could not confirm it on
    /// `REDIS_MIN_REPLICAS_ACK` replicas in time, and the client was told to try
    /// again instead of being given the task's id.
    NotReplicated,
    /// A `write_files` call's edit was stored as the workspace's next version
    /// (no container ran).
    FilesWritten,
    /// A `write_files` call's edit could not be made (a path under a file, a
    /// version cap, the store): the workspace was left as it was.
    FilesNotWritten,
}

stored_names!(ReasonKind, parse "reason kind");

/// The reason recorded on a submit the api withdrew (`ReasonKind::NotReplicated`).
pub const NOT_REPLICATED_REASON: &str = "withdrawn before it was acknowledged: Redis could not confirm the submit on enough \
     replicas (REDIS_MIN_REPLICAS_ACK); the client was told to try again";

/// The sentence shown to clients for a kill requested through `kill_task`.
pub const KILLED_BY_USER_REASON: &str = "killed by kill_task";

/// Why an operator killed a task (`Outcome::killed_by_operator`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperatorKill {
    /// `script-runner-ctl tasks kill`: every active task of its owner.
    Owner,
    /// `script-runner-ctl keys revoke --kill-tasks`: its owner's key was revoked.
    KeyRevoked,
}

/// The sentence recorded for `OperatorKill::Owner`.
pub const KILLED_BY_OPERATOR_REASON: &str = "killed by an operator (script-runner-ctl tasks kill)";

/// The sentence recorded for `OperatorKill::KeyRevoked`.
pub const KEY_REVOKED_REASON: &str =
    "killed by an operator: its API key was revoked (script-runner-ctl keys revoke --kill-tasks)";

/// A container kills its own script this long after the task's timeout, so a
/// task outlives neither its deadline nor a worker that died (whose timer died
/// with it). Normally the worker's own timer, at the timeout itself, acts first.
pub const SELF_DEADLINE_GRACE_SECONDS: u64 = 5;

/// The container's own deadline for a task with `timeout_seconds`.
pub fn self_deadline_seconds(timeout_seconds: u64) -> u64 {
    timeout_seconds + SELF_DEADLINE_GRACE_SECONDS
}

/// How a container that exited by itself ended, as the worker saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerExit {
    pub code: i64,
    /// Whether the kernel OOM-killed it (its cgroup's `oom_kill` count, or
    /// Docker's OOM-killed flag).
    pub oom_killed: bool,
    /// How long it ran, from its start to its exit.
    pub ran: Duration,
}

/// How a task that ended without its worker's say was recorded (by `kill_task`
/// or by a reaper), read back from its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedEnd {
    pub state: TaskState,
    pub kind: ReasonKind,
    pub reason: String,
}

/// What to do with a job that was read but never finished (after a restart, of
/// a dead worker, or orphaned), given its task's state. See [`Settlement::decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    /// Still queued: back in the stream for any worker.
    Requeue,
    /// Running under a live worker that is not the settler: its to finish.
    LeaveToOwner,
    /// Running, its holder gone: end it with this outcome, written as `owner`
    /// (the worker recorded as holding it, which the scripts require).
    Finish { owner: String, outcome: Outcome },
    /// Already ended (or gone): only acknowledge the job.
    Ack,
}

impl Settlement {
    /// The one rule for settling a job. `state` is the task's current state
    /// (`None` if it has no record), `owner` the worker recorded as holding it,
    /// `owner_alive_elsewhere` whether that owner is a live worker other than the
    /// settler, and `lost` the outcome a running task gets when its holder is gone.
    pub fn decide(
        state: Option<TaskState>,
        owner: Option<&str>,
        owner_alive_elsewhere: bool,
        lost: Outcome,
    ) -> Settlement {
        match state {
            Some(TaskState::Queued) => Settlement::Requeue,
            Some(TaskState::Running) if owner_alive_elsewhere => Settlement::LeaveToOwner,
            Some(TaskState::Running) => Settlement::Finish {
                owner: owner.unwrap_or_default().to_owned(),
                outcome: lost,
            },
            _ => Settlement::Ack,
        }
    }
}

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

    /// A container that exited by itself. The container's own deadline rule
    /// comes first: `timeout -s KILL` inside it ends the script with 137 (124 is
    /// its usual status) at the self deadline, when the worker's timer was late
    /// (or its worker was gone); that is a timeout, not an exit.
    pub fn container_exited(
        exit: ContainerExit,
        timeout_seconds: u64,
        stderr_tail: &[u8],
        caps: Caps,
    ) -> Outcome {
        let self_deadline = Duration::from_secs(self_deadline_seconds(timeout_seconds));
        let by_own_deadline = matches!(exit.code, 124 | 137)
            && !exit.oom_killed
            && exit.ran + Duration::from_secs(1) >= self_deadline;
        if by_own_deadline {
            return Outcome::timed_out(timeout_seconds);
        }
        Outcome::exited(exit.code, exit.oom_killed, stderr_tail, caps)
    }

    /// The worker found, at a tick or when recording the start, that the task is
    /// no longer its running task, and stopped the container. The outcome is the
    /// one recorded by whoever ended it (`kill_task`, a reaper); without a
    /// record to read, the task was taken from this worker.
    pub fn superseded(recorded: Option<RecordedEnd>) -> Outcome {
        match recorded {
            Some(r) if r.state.is_terminal() => Outcome {
                state: r.state,
                kind: r.kind,
                reason: r.reason,
                exit_code: None,
            },
            _ => Outcome::killed(
                ReasonKind::WorkerLost,
                "the task was taken over while its worker ran it",
            ),
        }
    }

    pub fn killed_by_user() -> Outcome {
        Outcome::killed(ReasonKind::KilledByUser, KILLED_BY_USER_REASON)
    }

    /// An operator ended it with `script-runner-ctl`; `why` says which command.
    pub fn killed_by_operator(why: OperatorKill) -> Outcome {
        let reason = match why {
            OperatorKill::Owner => KILLED_BY_OPERATOR_REASON,
            OperatorKill::KeyRevoked => KEY_REVOKED_REASON,
        };
        Outcome::killed(ReasonKind::KilledByOperator, reason)
    }

    /// The worker's shutdown grace period ran out.
    pub fn worker_shutdown() -> Outcome {
        Outcome::killed(
            ReasonKind::WorkerShutdown,
            "worker shut down before the task finished",
        )
    }

    /// Its worker restarted: the container went with the old process.
    pub fn worker_restarted() -> Outcome {
        Outcome::killed(ReasonKind::WorkerRestarted, "worker restarted")
    }

    /// Its worker stopped heartbeating and a reaper settled it.
    pub fn worker_lost() -> Outcome {
        Outcome::killed(ReasonKind::WorkerLost, "worker lost")
    }

    /// A live worker's job that none of its runners held (a lost stream reply).
    pub fn orphaned() -> Outcome {
        Outcome::killed(ReasonKind::WorkerLost, "worker lost track of the task")
    }

    pub fn start_failed(error: impl fmt::Display) -> Outcome {
        Outcome::failed(
            ReasonKind::StartFailed,
            format!("could not start the container: {error}"),
        )
    }

    /// The worker refused what the task's record names (see
    /// `runtimes::ImageRefusal`); nothing was pulled or run.
    pub fn image_refused(refusal: impl fmt::Display) -> Outcome {
        Outcome::failed(ReasonKind::ImageRefused, refusal.to_string())
    }

    /// The worker refused the task's spec (see `spec::SpecRejection`).
    pub fn spec_rejected(rejection: &crate::spec::SpecRejection) -> Outcome {
        Outcome::failed(
            ReasonKind::SpecRejected,
            format!("not run: {rejection}; only specs the api signed run"),
        )
    }

    /// The container had started when the worker lost track of it.
    pub fn container_lost(error: impl fmt::Display) -> Outcome {
        Outcome::failed(
            ReasonKind::ContainerLost,
            format!("lost track of the container: {error}"),
        )
    }

    pub fn workspace_failed(error: impl fmt::Display) -> Outcome {
        Outcome::failed(
            ReasonKind::WorkspaceFailed,
            format!("could not prepare /workspace: {error}"),
        )
    }

    /// A `write_files` edit made version `version`: `written` files written,
    /// `deleted` paths deleted.
    pub fn files_written(version: u64, written: usize, deleted: usize) -> Outcome {
        let files =
            |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        Outcome {
            state: TaskState::Succeeded,
            kind: ReasonKind::FilesWritten,
            reason: format!(
                "{} written and {} deleted: version {version}",
                files(written, "file", "files"),
                files(deleted, "path", "paths")
            ),
            exit_code: None,
        }
    }

    /// A `write_files` edit that made no version, and why.
    pub fn files_not_written(why: impl fmt::Display) -> Outcome {
        Outcome::failed(
            ReasonKind::FilesNotWritten,
            format!("no files were written, the workspace is as it was: {why}"),
        )
    }

    pub fn timed_out(timeout_seconds: u64) -> Outcome {
        Outcome {
            state: TaskState::TimedOut,
            kind: ReasonKind::TimedOut,
            reason: format!("timed out after {timeout_seconds} s"),
            exit_code: None,
        }
    }

    fn failed(kind: ReasonKind, reason: impl Into<String>) -> Outcome {
        Outcome {
            state: TaskState::Failed,
            kind,
            reason: reason.into(),
            exit_code: None,
        }
    }

    fn killed(kind: ReasonKind, reason: impl Into<String>) -> Outcome {
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
        for &st in TaskState::ALL {
            assert_eq!(st.as_str().parse::<TaskState>(), Ok(st));
            // The serde form is what clients see; it must equal the stored form.
            assert_eq!(
                serde_json::to_value(st).ok(),
                Some(serde_json::json!(st.as_str()))
            );
        }
        assert!("done".parse::<TaskState>().is_err());
    }

    /// The names are derived from the variants; these are the ones stored in
    /// Redis and shown to clients, so a renamed variant cannot slip by.
    #[test]
    fn states_and_reason_kinds_keep_their_stored_names() {
        let states: Vec<&str> = TaskState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            states,
            [
                "queued",
                "running",
                "succeeded",
                "failed",
                "killed",
                "timed-out"
            ]
        );
        let kinds: Vec<&str> = ReasonKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "exited",
                "timed-out",
                "killed-by-user",
                "killed-by-operator",
                "out-of-memory",
                "start-failed",
                "container-lost",
                "workspace-failed",
                "worker-lost",
                "worker-restarted",
                "worker-shutdown",
                "disk-full",
                "process-limit",
                "image-refused",
                "spec-rejected",
                "not-replicated",
                "files-written",
                "files-not-written",
            ]
        );
    }

    #[test]
    fn only_queued_and_running_are_not_terminal() {
        let open: Vec<_> = TaskState::ALL
            .iter()
            .copied()
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

    #[test]
    fn reason_kinds_round_trip() {
        for &k in ReasonKind::ALL {
            assert_eq!(k.as_str().parse::<ReasonKind>(), Ok(k));
            // The serde form is what clients see; it must equal the stored form.
            assert_eq!(
                serde_json::to_value(k).ok(),
                Some(serde_json::json!(k.as_str()))
            );
        }
        assert!("bored".parse::<ReasonKind>().is_err());
    }

    fn exit(code: i64, oom_killed: bool, ran_s: u64) -> ContainerExit {
        ContainerExit {
            code,
            oom_killed,
            ran: Duration::from_secs(ran_s),
        }
    }

    #[test]
    fn the_containers_own_deadline_is_a_timeout_not_an_exit() {
        // Timeout 10 s: the container's own deadline is at 15 s.
        let own = Outcome::container_exited(exit(137, false, 15), 10, b"", CAPS);
        assert_eq!(own, Outcome::timed_out(10));
        let own_124 = Outcome::container_exited(exit(124, false, 14), 10, b"", CAPS);
        assert_eq!(own_124.state, TaskState::TimedOut);
        // Killed (137) well before it: the script's own SIGKILL, an exit.
        let early = Outcome::container_exited(exit(137, false, 3), 10, b"", CAPS);
        assert_eq!(
            (early.state, early.kind),
            (TaskState::Failed, ReasonKind::Exited)
        );
        assert_eq!(early.exit_code, Some(137));
        // At the memory cap, 137 is the OOM killer even late.
        let oom = Outcome::container_exited(exit(137, true, 20), 10, b"", CAPS);
        assert_eq!(oom.kind, ReasonKind::OutOfMemory);
        // Any other code near the deadline is the script's own exit.
        let late = Outcome::container_exited(exit(3, false, 15), 10, b"", CAPS);
        assert_eq!(late.reason, "exited with code 3");
    }

    #[test]
    fn an_operator_kill_is_told_apart_from_a_client_kill_and_says_which_command() {
        for why in [OperatorKill::Owner, OperatorKill::KeyRevoked] {
            let o = Outcome::killed_by_operator(why);
            assert_eq!(
                (o.state, o.kind, o.exit_code),
                (TaskState::Killed, ReasonKind::KilledByOperator, None)
            );
            assert_ne!(o.reason, KILLED_BY_USER_REASON);
        }
        assert!(
            Outcome::killed_by_operator(OperatorKill::KeyRevoked)
                .reason
                .contains("revoked")
        );
        // A worker that finds it killed on its tick reports what was recorded.
        let recorded = RecordedEnd {
            state: TaskState::Killed,
            kind: ReasonKind::KilledByOperator,
            reason: KILLED_BY_OPERATOR_REASON.into(),
        };
        assert_eq!(
            Outcome::superseded(Some(recorded)),
            Outcome::killed_by_operator(OperatorKill::Owner)
        );
    }

    #[test]
    fn a_superseded_task_reports_what_was_recorded_not_a_kill_by_the_user() {
        let reaped = RecordedEnd {
            state: TaskState::Killed,
            kind: ReasonKind::WorkerLost,
            reason: "worker lost".into(),
        };
        assert_eq!(Outcome::superseded(Some(reaped)), Outcome::worker_lost());
        let by_user = RecordedEnd {
            state: TaskState::Killed,
            kind: ReasonKind::KilledByUser,
            reason: KILLED_BY_USER_REASON.into(),
        };
        assert_eq!(
            Outcome::superseded(Some(by_user)),
            Outcome::killed_by_user()
        );
        // Another worker holds it (no end recorded): taken over, never "kill_task".
        let taken = Outcome::superseded(None);
        assert_eq!(taken.kind, ReasonKind::WorkerLost);
        assert_ne!(taken.reason, KILLED_BY_USER_REASON);
    }

    #[test]
    fn lost_containers_and_failed_starts_are_told_apart() {
        assert_eq!(
            Outcome::container_lost("gone").kind,
            ReasonKind::ContainerLost
        );
        assert_eq!(
            Outcome::start_failed("no image").kind,
            ReasonKind::StartFailed
        );
        assert_eq!(
            Outcome::start_failed("no image").reason,
            "could not start the container: no image"
        );
    }

    #[test]
    fn settling_requeues_queued_ends_orphaned_running_and_acks_the_rest() {
        let lost = Outcome::worker_lost;
        assert_eq!(
            Settlement::decide(Some(TaskState::Queued), None, false, lost()),
            Settlement::Requeue
        );
        assert_eq!(
            Settlement::decide(Some(TaskState::Running), Some("w2"), true, lost()),
            Settlement::LeaveToOwner
        );
        assert_eq!(
            Settlement::decide(Some(TaskState::Running), Some("w2"), false, lost()),
            Settlement::Finish {
                owner: "w2".into(),
                outcome: lost()
            }
        );
        for done in [TaskState::Succeeded, TaskState::Killed, TaskState::TimedOut] {
            assert_eq!(
                Settlement::decide(Some(done), Some("w2"), false, lost()),
                Settlement::Ack
            );
        }
        assert_eq!(
            Settlement::decide(None, None, false, lost()),
            Settlement::Ack
        );
    }
}
