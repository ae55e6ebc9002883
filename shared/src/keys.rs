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
//! | `{p}:task:{id}:files` | string | the collected files (a zip), expiring with the record |
//! | `{p}:tasks` | sorted set | task ids by creation time (ms), for `list_tasks` |
//! | `{p}:worker:{name}` | string with TTL | a live worker's heartbeat |
//! | `{p}:workers` | set | workers that registered and have not been forgotten (a dead one is removed once it holds no job) |
//! | `{p}:stats` | hash | counters: `submitted`, `finished:<state>:<reason_kind>` |
//! | `{p}:stats:{minute}` | hash with TTL | tasks finished in that Unix minute: `<state>:<reason_kind>` |

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

    /// The prefix every key starts with (`REDIS_KEY_PREFIX`).
    pub fn prefix(&self) -> &str {
        &self.prefix
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

    /// The files a task collected (`collect`), as a zip.
    pub fn task_files(&self, task_id: &str) -> String {
        format!("{}:task:{task_id}:files", self.prefix)
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

    /// Tasks finished during Unix minute `minute` (seconds / 60, Redis's clock),
    /// fields `<state>:<reason_kind>`. Written by the FINISH and KILL scripts as
    /// `KEYS[3] .. ':' .. minute`, i.e. the stats key with the minute appended;
    /// they expire after `STATS_MINUTE_TTL_SECONDS`.
    pub fn stats_minute(&self, minute: u64) -> String {
        format!("{}:{minute}", self.stats())
    }
}

/// A worker's heartbeat value, as `key=value` words separated by spaces:
/// `running=<n> slots=<n> host=<h> version=<v> ttl=<s>` (readable in
/// `redis-cli`). Only `running=` is required, and it comes first: the first
/// heartbeats were `running=<n>` alone, and they still parse.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Heartbeat {
    /// Tasks the worker is running.
    pub running: u64,
    /// Its `WORKER_CONCURRENCY`.
    pub slots: Option<u64>,
    /// The host it runs on.
    pub host: Option<String>,
    /// The worker's version.
    pub version: Option<String>,
    /// The TTL the key was set with, in seconds: with the key's remaining TTL
    /// it tells how long ago the heartbeat was written, by Redis's clock.
    pub ttl_seconds: Option<u64>,
}

impl Heartbeat {
    /// The value stored in `Keys::worker`. Spaces and `=` in the host or
    /// version are replaced by `_`, so the value always parses back.
    pub fn to_value(&self) -> String {
        let clean = |s: &str| s.replace(|c: char| c.is_whitespace() || c == '=', "_");
        let mut v = format!("{HEARTBEAT_RUNNING}{}", self.running);
        if let Some(n) = self.slots {
            v.push_str(&format!(" slots={n}"));
        }
        if let Some(h) = &self.host {
            v.push_str(&format!(" host={}", clean(h)));
        }
        if let Some(ver) = &self.version {
            v.push_str(&format!(" version={}", clean(ver)));
        }
        if let Some(t) = self.ttl_seconds {
            v.push_str(&format!(" ttl={t}"));
        }
        v
    }

    /// Parses a value written by any version of the worker; `None` if it does
    /// not start with a well-formed `running=<n>`. Unknown words are skipped, so
    /// a newer worker may add some.
    pub fn parse(value: &str) -> Option<Heartbeat> {
        let mut words = value.split_whitespace();
        let running = words
            .next()?
            .strip_prefix(HEARTBEAT_RUNNING)?
            .parse()
            .ok()?;
        let mut hb = Heartbeat {
            running,
            ..Heartbeat::default()
        };
        for word in words {
            match word.split_once('=') {
                Some(("slots", n)) => hb.slots = n.parse().ok(),
                Some(("host", h)) => hb.host = Some(h.to_owned()),
                Some(("version", v)) => hb.version = Some(v.to_owned()),
                Some(("ttl", t)) => hb.ttl_seconds = t.parse().ok(),
                _ => {}
            }
        }
        Some(hb)
    }
}

/// A heartbeat value that says only how many tasks run (`running=<n>`).
pub fn heartbeat_value(running: usize) -> String {
    Heartbeat {
        running: running as u64,
        ..Heartbeat::default()
    }
    .to_value()
}

/// The tasks a heartbeat value says its worker runs; `None` if it is malformed.
pub fn parse_heartbeat(value: &str) -> Option<u64> {
    Heartbeat::parse(value).map(|h| h.running)
}

/// The first word of a heartbeat value.
pub const HEARTBEAT_RUNNING: &str = "running=";

/// How long a per-minute finished counter (`Keys::stats_minute`) lives, in
/// seconds: long enough for any "last hour" read.
pub const STATS_MINUTE_TTL_SECONDS: u64 = 7200;

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
    /// The `collect` patterns, a JSON array.
    Collect,
    /// What was collected: `CollectedFiles` as JSON (the zip is under `Keys::task_files`).
    Files,
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
            Field::Collect => "collect",
            Field::Files => "files",
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
        assert_eq!(parse_heartbeat("running=x slots=2"), None);
    }

    #[test]
    fn full_heartbeats_round_trip_and_old_ones_still_parse() {
        let hb = Heartbeat {
            running: 2,
            slots: Some(4),
            host: Some("web 1=a".into()),
            version: Some("0.1.0".into()),
            ttl_seconds: Some(15),
        };
        let v = hb.to_value();
        assert_eq!(v, "running=2 slots=4 host=web_1_a version=0.1.0 ttl=15");
        let back = Heartbeat::parse(&v).expect("parses");
        assert_eq!(back.host.as_deref(), Some("web_1_a"));
        assert_eq!(
            (back.running, back.slots, back.ttl_seconds),
            (2, Some(4), Some(15))
        );
        // What the api's metrics read, from the new format and the old.
        assert_eq!(parse_heartbeat(&v), Some(2));
        assert_eq!(
            Heartbeat::parse("running=3"),
            Some(Heartbeat {
                running: 3,
                ..Heartbeat::default()
            })
        );
        // Words a newer worker may add are skipped.
        assert_eq!(
            Heartbeat::parse("running=1 pool=3 slots=2").and_then(|h| h.slots),
            Some(2)
        );
    }

    #[test]
    fn minute_counters_hang_off_the_stats_key() {
        let k = Keys::new("t1");
        assert_eq!(k.stats_minute(29_000_000), "t1:stats:29000000");
    }
}
