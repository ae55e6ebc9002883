//! Lua scripts for every multi-step change of a task, so each one is atomic
//! inside Redis. The scripts live in `lua/*.lua`, each with a header saying its
//! KEYS, ARGV and reply; this module names them and the replies they share.
//!
//! They read the clock with `TIME` (Redis 7 replicates script effects, so this is
//! allowed) so that all timestamps come from one clock. Field names in them must
//! be `Field::as_str()` values; `tests::scripts_only_name_known_fields` keeps them
//! honest.
//!
//! Rules every state script follows: a terminal state is never overwritten, and a
//! worker only writes to a task whose `worker` field is its own name.
//!
//! This crate does no I/O: the binaries wrap these sources in `redis::Script`
//! once per process (`support::scripts`), so each is sent by `EVALSHA`.

use crate::task::{TaskState, UnknownState};

/// `run_script`: the new record, its zip and its job, all or nothing.
pub const SUBMIT: &str = include_str!("lua/submit.lua");
/// A worker takes a task it read from the stream: queued -> running.
pub const CLAIM: &str = include_str!("lua/claim.lua");
/// The task's container has started.
pub const STARTED: &str = include_str!("lua/started.lua");
/// Publishes a running task's output tails; replies with its state.
pub const PROGRESS: &str = include_str!("lua/progress.lua");
/// Records how a task ended.
pub const FINISH: &str = include_str!("lua/finish.lua");
/// `kill_task`.
pub const KILL: &str = include_str!("lua/kill.lua");
/// Forgets a dead worker that holds no job.
pub const FORGET_WORKER: &str = include_str!("lua/forget_worker.lua");
/// Puts a job back in the stream for any worker.
pub const REQUEUE: &str = include_str!("lua/requeue.lua");

/// Every script, for tests and for loading them all at once.
pub const ALL: [&str; 8] = [
    SUBMIT,
    CLAIM,
    STARTED,
    PROGRESS,
    FINISH,
    KILL,
    FORGET_WORKER,
    REQUEUE,
];

/// Replied when the task hash does not exist (never made, or expired).
pub const MISSING: &str = "missing";
/// Replied when the task belongs to another worker: the caller must not run (or
/// must stop) it.
pub const NOT_OWNER: &str = "not-owner";

/// What a state script (or a plain read of the `state` field) answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskStateReply {
    /// No such task.
    Missing,
    /// The task is held by another worker.
    NotOwner,
    State(TaskState),
}

impl TaskStateReply {
    pub fn parse(s: &str) -> Result<TaskStateReply, UnknownState> {
        match s {
            MISSING => Ok(TaskStateReply::Missing),
            NOT_OWNER => Ok(TaskStateReply::NotOwner),
            _ => s.parse().map(TaskStateReply::State),
        }
    }

    /// A plain `HGET state` read: `None` is a missing task.
    pub fn from_field(state: Option<&str>) -> Result<TaskStateReply, UnknownState> {
        TaskStateReply::parse(state.unwrap_or(MISSING))
    }

    pub fn is_running(self) -> bool {
        self == TaskStateReply::State(TaskState::Running)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Field;

    const ALL_FIELDS: [Field; 26] = [
        Field::Collect,
        Field::Files,
        Field::HasStdin,
        Field::Env,
        Field::Network,
        Field::State,
        Field::Runtime,
        Field::Image,
        Field::Command,
        Field::TimeoutSeconds,
        Field::HasZip,
        Field::CreatedAt,
        Field::ClaimedAt,
        Field::Entry,
        Field::StartedAt,
        Field::FinishedAt,
        Field::LastOutputAt,
        Field::Worker,
        Field::Container,
        Field::ExitCode,
        Field::Reason,
        Field::ReasonKind,
        Field::StdoutTail,
        Field::StderrTail,
        Field::StdoutBytes,
        Field::StderrBytes,
    ];

    /// Every single-quoted word in a script's code must be a known field, state,
    /// reply, stats or stream name, or a Redis command, so a typo cannot silently
    /// write a stray field.
    #[test]
    fn scripts_only_name_known_fields() {
        let known: Vec<&str> = ALL_FIELDS
            .iter()
            .map(|f| f.as_str())
            .chain(crate::TaskState::ALL.iter().map(|s| s.as_str()))
            .chain([
                MISSING, NOT_OWNER, "", "%d", ":", "-", "+", "*", "-inf", "(",
            ])
            .chain([crate::keys::JOB_TASK_ID, crate::keys::STAT_SUBMITTED])
            .chain(["finished:", "finished:killed:", "killed:"])
            .collect();
        let is_command = |w: &str| !w.is_empty() && w.chars().all(|c| c.is_ascii_uppercase());
        for script in ALL {
            // Header comments may quote freely; only the code is checked.
            let code: String = script
                .lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n");
            for (i, part) in code.split('\'').enumerate() {
                if i % 2 == 1 {
                    assert!(
                        known.contains(&part) || is_command(part),
                        "unknown quoted name {part:?} in a script"
                    );
                }
            }
        }
    }

    #[test]
    fn every_script_documents_its_keys_argv_and_reply() {
        for script in ALL {
            let header: String = script
                .lines()
                .take_while(|l| l.starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n");
            assert!(header.contains("KEYS[1]"), "no KEYS in\n{header}");
            assert!(header.contains("ARGV[1]"), "no ARGV in\n{header}");
            assert!(header.contains("Returns"), "no reply in\n{header}");
        }
    }

    #[test]
    fn the_finished_counter_prefix_is_the_one_metrics_read() {
        assert!(FINISH.contains(&format!("'{}'", crate::keys::STAT_FINISHED_PREFIX)));
        assert!(KILL.contains(&format!("'{}killed:'", crate::keys::STAT_FINISHED_PREFIX)));
    }

    /// The per-minute counters ops read (`Keys::stats_minute`) are the stats key
    /// with the minute appended, kept as long as `STATS_MINUTE_TTL_SECONDS`.
    #[test]
    fn the_minute_counters_are_where_ops_read_them() {
        let ttl = format!(
            "'EXPIRE', minute, {}",
            crate::keys::STATS_MINUTE_TTL_SECONDS
        );
        for script in [FINISH, KILL] {
            assert!(script.contains("local minute = KEYS[3] .. ':' .. string.format('%d', math.floor(tonumber(t[1]) / 60))"));
            assert!(script.contains(&ttl), "{script}");
        }
        assert_eq!(crate::Keys::new("p").stats_minute(7), "p:stats:7");
    }

    #[test]
    fn replies_parse_into_their_kinds() {
        assert_eq!(TaskStateReply::parse(MISSING), Ok(TaskStateReply::Missing));
        assert_eq!(
            TaskStateReply::parse(NOT_OWNER),
            Ok(TaskStateReply::NotOwner)
        );
        assert_eq!(
            TaskStateReply::from_field(Some("timed-out")),
            Ok(TaskStateReply::State(TaskState::TimedOut))
        );
        assert_eq!(
            TaskStateReply::from_field(None),
            Ok(TaskStateReply::Missing)
        );
        assert!(TaskStateReply::parse("done").is_err());
    }
}
