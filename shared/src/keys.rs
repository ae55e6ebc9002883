//! The Redis key schema, in one typed place. README.md documents it for ops.
//!
//! Every key starts with a prefix (`REDIS_KEY_PREFIX`, default `sr`) so several
//! deployments, or several test runs, can share one Redis without meeting.
//!
//! | key | type | what |
//! |---|---|---|
//! | `{p}:jobs` | stream | one entry per submitted task: `task_id` |
//! | `{p}:task:{id}` | hash | the task record (fields: [`Field`]) |
//! | `{p}:task:{id}:zip` | string | the submitted zip, until the task finishes or is killed |
//! | `{p}:task:{id}:stdin` | string | the submitted stdin, until the task finishes or is killed |
//! | `{p}:tasks` | sorted set | task ids by creation time (ms), for `list_tasks` |
//! | `{p}:worker:{name}` | string with TTL | a live worker's heartbeat |
//! | `{p}:workers` | set | workers that registered and have not been forgotten (a dead one is removed once it holds no job) |
//! | `{p}:stats` | hash | counters: `submitted`, `finished:<state>:<reason_kind>` |

/// The consumer group every worker joins on the jobs stream.
pub const WORKER_GROUP: &str = "workers";

/// Builds key names for one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub const DEFAULT_PREFIX: &'static str = "sr";

    pub fn new(prefix: impl Into<String>) -> Keys {
        Keys {
            prefix: prefix.into(),
        }
    }

    /// The stream the api appends jobs to and workers read from.
    pub fn jobs(&self) -> String {
        format!("{}:jobs", self.prefix)
    }

    pub fn task(&self, task_id: &str) -> String {
        format!("{}:task:{task_id}", self.prefix)
    }

    pub fn task_zip(&self, task_id: &str) -> String {
        format!("{}:task:{task_id}:zip", self.prefix)
    }

    pub fn task_stdin(&self, task_id: &str) -> String {
        format!("{}:task:{task_id}:stdin", self.prefix)
    }

    /// Task ids scored by creation time, newest last, for `list_tasks`.
    pub fn task_index(&self) -> String {
        format!("{}:tasks", self.prefix)
    }

    pub fn worker(&self, name: &str) -> String {
        format!("{}:worker:{name}", self.prefix)
    }

    pub fn workers(&self) -> String {
        format!("{}:workers", self.prefix)
    }

    /// Counters since the deployment began: `submitted`, and
    /// `finished:<state>:<reason_kind>` for every task that reached a final state.
    pub fn stats(&self) -> String {
        format!("{}:stats", self.prefix)
    }
}

/// A worker's heartbeat value: how many tasks it is running, as `running=<n>`
/// (readable in `redis-cli` and parsed by the api's metrics).
pub fn heartbeat_value(running: usize) -> String {
    format!("{HEARTBEAT_RUNNING}{running}")
}

/// The tasks a heartbeat value says its worker runs; `None` if it is malformed.
pub fn parse_heartbeat(value: &str) -> Option<u64> {
    value.strip_prefix(HEARTBEAT_RUNNING)?.parse().ok()
}

/// The prefix of a heartbeat value.
pub const HEARTBEAT_RUNNING: &str = "running=";

/// The `stats` hash field counting submitted tasks.
pub const STAT_SUBMITTED: &str = "submitted";
/// The prefix of the `stats` hash fields counting finished tasks.
pub const STAT_FINISHED_PREFIX: &str = "finished:";

impl Default for Keys {
    fn default() -> Self {
        Keys::new(Self::DEFAULT_PREFIX)
    }
}

/// The fields of a task hash. Timestamps are Unix milliseconds read from Redis's
/// own clock (`TIME`), so api and worker hosts never compare skewed clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// `TaskState::as_str()`.
    State,
    /// The runtime name the client asked for.
    Runtime,
    /// The image that runtime resolved to when the task was submitted.
    Image,
    /// The decoded shell one-liner.
    Command,
    /// The effective timeout in seconds.
    TimeoutSeconds,
    /// `1` when a zip was submitted (then stored under `Keys::task_zip`).
    HasZip,
    /// `1` when stdin was submitted (then stored under `Keys::task_stdin`).
    HasStdin,
    /// Extra environment variables, a JSON object of name to value.
    Env,
    /// `Network::as_str()`: `internet` or `none`.
    Network,
    CreatedAt,
    /// When a worker claimed it.
    ClaimedAt,
    /// When its container started; absent if it never did.
    StartedAt,
    FinishedAt,
    /// Time of the last byte on stdout or stderr.
    LastOutputAt,
    /// The worker (consumer name) holding it.
    Worker,
    /// The stream entry it was claimed from (so a retried claim is recognised).
    Entry,
    /// The Docker container id while it exists.
    Container,
    ExitCode,
    /// The sentence shown to clients.
    Reason,
    /// `ReasonKind::as_str()`.
    ReasonKind,
    /// The last bytes (at most the tail cap) of stdout / stderr, raw.
    StdoutTail,
    StderrTail,
    /// Total bytes the script wrote to stdout / stderr.
    StdoutBytes,
    StderrBytes,
}

impl Field {
    pub const fn as_str(self) -> &'static str {
        match self {
            Field::State => "state",
            Field::Runtime => "runtime",
            Field::Image => "image",
            Field::Command => "command",
            Field::TimeoutSeconds => "timeout_seconds",
            Field::HasZip => "has_zip",
            Field::HasStdin => "has_stdin",
            Field::Env => "env",
            Field::Network => "network",
            Field::CreatedAt => "created_at",
            Field::ClaimedAt => "claimed_at",
            Field::StartedAt => "started_at",
            Field::FinishedAt => "finished_at",
            Field::LastOutputAt => "last_output_at",
            Field::Worker => "worker",
            Field::Entry => "entry",
            Field::Container => "container",
            Field::ExitCode => "exit_code",
            Field::Reason => "reason",
            Field::ReasonKind => "reason_kind",
            Field::StdoutTail => "stdout_tail",
            Field::StderrTail => "stderr_tail",
            Field::StdoutBytes => "stdout_bytes",
            Field::StderrBytes => "stderr_bytes",
        }
    }
}

/// The field of a jobs-stream entry that names the task.
pub const JOB_TASK_ID: &str = "task_id";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_the_prefix() {
        let k = Keys::new("t1");
        assert_eq!(k.jobs(), "t1:jobs");
        assert_eq!(k.task("abc"), "t1:task:abc");
        assert_eq!(k.task_zip("abc"), "t1:task:abc:zip");
        assert_eq!(k.worker("w"), "t1:worker:w");
        assert_eq!(Keys::default().jobs(), "sr:jobs");
    }

    #[test]
    fn heartbeats_round_trip() {
        assert_eq!(heartbeat_value(3), "running=3");
        assert_eq!(parse_heartbeat(&heartbeat_value(7)), Some(7));
        assert_eq!(parse_heartbeat("busy"), None);
    }
}
