//! The Redis key schema, in one typed place: `Keys` builds every key name,
//! `Field` names the task hash's fields. What each key and field holds, who
//! writes it and how long it lives is documented once, in docs/redis-keys.md;
//! a test (`e2e/tests/config_docs.rs`) fails when that page and this module
//! disagree.
//!
//! Every key starts with a prefix (`REDIS_KEY_PREFIX`, default `sr`) so several
//! deployments, or several test runs, can share one Redis without meeting.

use crate::names::{UnknownName, stored_names};
use crate::workspace::WorkspaceId;

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

    /// A small stream (at most about `TASK_EVENTS_MAXLEN` entries) that the
    /// state scripts (CLAIM, STARTED, PROGRESS when the output grew, FINISH,
    /// KILL) append to, so a `wait_seconds` caller blocks on it (`XREAD BLOCK`)
    /// instead of polling the record. Expires `FINAL_EVENTS_TTL_SECONDS` after
    /// the task's end.
    pub fn task_events(&self, task_id: &str) -> String {
        format!("{}:task:{task_id}:events", self.prefix)
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

    /// An owner's tasks that may still be queued or running (sorted set: task
    /// id by created_at), for the per-key quotas. Written by SUBMIT; entries
    /// whose task has ended are dropped by the next SUBMIT that counts them.
    pub fn owner_active(&self, owner: &str) -> String {
        format!("{}:owner:{owner}:active", self.prefix)
    }

    /// An owner's CPU use over the last day (sorted set: `<task_id>:<cpu_ms>`
    /// by finished_at), for the CPU quota. Written by FINISH; entries older than
    /// a day are dropped by whoever reads it.
    pub fn owner_cpu(&self, owner: &str) -> String {
        format!("{}:owner:{owner}:cpu", self.prefix)
    }

    /// An owner's tasks by created_at (sorted set), for its `list_tasks`: the
    /// owner's share of `task_index`. Written by SUBMIT, trimmed like it.
    pub fn owner_tasks(&self, owner: &str) -> String {
        format!("{}:owner:{owner}:tasks", self.prefix)
    }

    /// An API key's record (hash, `ApiKeyField`s), under the SHA-256 (hex) of
    /// the key: the key itself is never stored.
    pub fn api_key(&self, sha256: &str) -> String {
        format!("{}:apikey:{sha256}", self.prefix)
    }

    /// Every API key's name and the SHA-256 of its key (hash: name -> hash),
    /// for `keys list`, `revoke` and `rotate`.
    pub fn api_key_names(&self) -> String {
        format!("{}:apikeys", self.prefix)
    }

    /// The names of revoked keys (set), kept forever: a revoked key's tasks
    /// keep its name as their owner, so `keys create` refuses the name (a new
    /// key under it would see and kill them, and inherit their quota counts).
    pub fn api_keys_revoked(&self) -> String {
        format!("{}:apikeys:revoked", self.prefix)
    }

    /// What an owner's tasks used in all (hash, fields in `shared::usage`:
    /// tasks, cpu_ms, peak_memory_bytes (the highest), workspace_bytes).
    /// Written by FINISH; kept forever.
    pub fn owner_usage(&self, owner: &str) -> String {
        format!("{}:owner:{owner}:usage", self.prefix)
    }

    /// Every owner with usage, scored by its total CPU ms (sorted set), so the
    /// heaviest can be listed without scanning: `/metrics` labels the top ones.
    /// Written by FINISH; kept forever.
    pub fn usage_owners(&self) -> String {
        format!("{}:usage:owners", self.prefix)
    }

    /// What every owned task used in all (hash, the fields of `owner_usage`):
    /// `/metrics` shows the owners past its top ones as `other`, this less
    /// theirs. Written by FINISH; kept forever.
    pub fn usage_totals(&self) -> String {
        format!("{}:usage:totals", self.prefix)
    }

    /// A workspace (hash, `workspace::WorkspaceField`s). Written by SUBMIT (a
    /// new one), WS_COMMIT (its head), WS_FORK and WS_DELETE.
    pub fn workspace(&self, id: &WorkspaceId) -> String {
        format!("{}:ws:{id}", self.prefix)
    }

    /// A workspace's versions (sorted set: version number by created_at).
    pub fn workspace_versions(&self, id: &WorkspaceId) -> String {
        format!("{}:ws:{id}:versions", self.prefix)
    }

    /// One version (hash, `workspace::VersionField`s): `workspace_versions`
    /// with `:<n>` appended, as the scripts build it.
    pub fn workspace_version(&self, id: &WorkspaceId, version: u64) -> String {
        format!("{}:ws:{id}:versions:{version}", self.prefix)
    }

    /// An owner's workspaces (sorted set: id by created_at), for
    /// `list_workspaces`.
    pub fn owner_workspaces(&self, owner: &str) -> String {
        format!("{}:owner:{owner}:workspaces", self.prefix)
    }

    /// What each owner's workspaces hold (hash: `Owner::as_stored()` to the
    /// sum of its workspaces' `bytes`), kept by WS_COMMIT, WS_FORK and
    /// WS_DELETE, which check it against the owner's cap.
    pub fn workspace_bytes(&self) -> String {
        format!("{}:ws:owner-bytes", self.prefix)
    }

    /// The blob store's sweep (hash, `WS_SWEEP`'s fields): which worker sweeps
    /// and until when, its phase, the `epoch` a save must still see when it
    /// commits (counted up as each delete phase starts), and the `forks` made.
    pub fn workspace_sweep(&self) -> String {
        format!("{}:ws:sweep", self.prefix)
    }

    /// Every workspace (sorted set: id by last use), for the reaper's idle
    /// expiry and its walk over what the blob store must keep.
    pub fn workspaces(&self) -> String {
        format!("{}:workspaces", self.prefix)
    }

    /// Requests to clear the workers' dependency caches (hash: a cache's
    /// `cache::owner_id`, or `cache::ALL_OWNERS`, to a generation counted up by
    /// each `script-runner-ctl cache clear`). A worker empties an owner's cache
    /// whose generations changed since it last looked. Kept forever (one field
    /// per owner ever cleared).
    pub fn cache_clears(&self) -> String {
        format!("{}:cache:clears", self.prefix)
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

/// How many entries a task's events stream keeps (`XADD MAXLEN ~`): a waiter
/// only needs to know that something was appended after the id it read.
pub const TASK_EVENTS_MAXLEN: u64 = 16;

/// How long a task's events stream outlives the task's end, in seconds (FINISH
/// and KILL expire it so; a shorter retention wins). Its waiters woke on the
/// final entry; one that read its mark just before the end still finds it in
/// this time, which is well above the longest `wait_seconds`. Kept as long as
/// the record, each ended task's stream (about 4.7 KiB for its few entries)
/// would be most of the task's memory in Redis.
pub const FINAL_EVENTS_TTL_SECONDS: u64 = 120;

/// The one field of a task events entry, and its values: what the scripts
/// append. Waiters read only that an entry came, not what it says.
pub const TASK_EVENT_FIELD: &str = "e";
pub const TASK_EVENTS: [&str; 5] = ["claimed", "started", "output", "finished", "killed"];

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
/// Stored under its `as_str()` name, the variant's in snake case.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantArray,
    strum::Display,
)]
#[strum(serialize_all = "snake_case", const_into_str)]
#[strum(parse_err_ty = UnknownName, parse_err_fn = Field::unknown)]
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
    /// `Network::as_str()`: `internet`, `none` or `allow` (then the list is
    /// `EgressAllow`).
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
    /// Who submitted it: the API key's name, `oauth:<subject>` for an OAuth
    /// token, or absent for the operator's admin key (`SCRIPT_RUNNER_TOKEN`).
    Owner,
    /// CPU time the task's container used, in milliseconds, as its cgroup
    /// reported at the end.
    UsageCpuMs,
    /// The container's peak memory use in bytes (cgroup), files in its tmpfs
    /// mounts included.
    UsagePeakMemoryBytes,
    /// Bytes in /workspace when the task ended.
    UsageWorkspaceBytes,
    /// `1` when the usage is the worker's estimate: the container was gone
    /// before its cgroup could be read at the end (absent: read).
    UsageEstimated,
    /// `CacheUse::as_str()`: `owner` or `none` (absent: `owner`).
    Cache,
    /// An `allow` task's hosts: `AllowList::to_stored()` (entries joined with ',').
    EgressAllow,
    /// What the egress proxy saw of an `allow` task: `EgressLog` as JSON.
    EgressLog,
    /// The api's signature of the task's spec (`shared::spec`):
    /// `<key id>:<base64 Ed25519 signature>`.
    SpecSignature,
    /// The workspace the task runs on (`WorkspaceId`); absent: none.
    WorkspaceId,
    /// The version it starts from (0: the empty one).
    WorkspaceBase,
    /// The version its `/workspace` became, once saved.
    WorkspaceVersion,
    /// Why its `/workspace` made no version (absent: it made one, or has not
    /// ended yet).
    WorkspaceNote,
    /// A `write_files` task's deletes, a JSON array of paths (its files are
    /// the task's zip). Present: the task is that edit of its workspace, run
    /// by a worker without a container; absent: a script.
    EditDeletes,
}

stored_names!(Field, parse "task record field");

impl Field {
    /// Whether the api signs the field (`shared::spec`): every field a worker
    /// acts on, and that nothing changes after submit. No wildcard: a new field
    /// is put on one side or the other before the code compiles.
    pub const fn is_signed(self) -> bool {
        match self {
            Field::Runtime
            | Field::Image
            | Field::Command
            | Field::TimeoutSeconds
            | Field::HasZip
            | Field::HasStdin
            | Field::Env
            | Field::Network
            | Field::Collect
            | Field::Owner
            | Field::Cache
            | Field::EgressAllow
            | Field::WorkspaceId
            | Field::WorkspaceBase
            | Field::EditDeletes => true,
            // Written after submit (by the worker, the reaper or a kill), or
            // the signature itself.
            Field::State
            | Field::Files
            | Field::CreatedAt
            | Field::ClaimedAt
            | Field::StartedAt
            | Field::FinishedAt
            | Field::LastOutputAt
            | Field::Worker
            | Field::Entry
            | Field::Container
            | Field::ExitCode
            | Field::Reason
            | Field::ReasonKind
            | Field::StdoutTail
            | Field::StderrTail
            | Field::StdoutBytes
            | Field::StderrBytes
            | Field::UsageCpuMs
            | Field::UsagePeakMemoryBytes
            | Field::UsageWorkspaceBytes
            | Field::UsageEstimated
            | Field::EgressLog
            | Field::SpecSignature
            | Field::WorkspaceVersion
            | Field::WorkspaceNote => false,
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

    /// The stored names are derived; these are what Redis holds today (and what
    /// ops and the Python harness read), so a renamed variant cannot slip by.
    #[test]
    fn fields_keep_their_stored_names() {
        let names: Vec<&str> = Field::ALL.iter().map(|f| f.as_str()).collect();
        assert_eq!(
            names,
            [
                "state",
                "runtime",
                "image",
                "command",
                "timeout_seconds",
                "has_zip",
                "has_stdin",
                "env",
                "network",
                "collect",
                "files",
                "created_at",
                "claimed_at",
                "started_at",
                "finished_at",
                "last_output_at",
                "worker",
                "entry",
                "container",
                "exit_code",
                "reason",
                "reason_kind",
                "stdout_tail",
                "stderr_tail",
                "stdout_bytes",
                "stderr_bytes",
                "owner",
                "usage_cpu_ms",
                "usage_peak_memory_bytes",
                "usage_workspace_bytes",
                "usage_estimated",
                "cache",
                "egress_allow",
                "egress_log",
                "spec_signature",
                "workspace_id",
                "workspace_base",
                "workspace_version",
                "workspace_note",
                "edit_deletes",
            ]
        );
        for &f in Field::ALL {
            assert_eq!(f.as_str().parse::<Field>(), Ok(f));
        }
    }

    #[test]
    fn minute_counters_hang_off_the_stats_key() {
        let k = Keys::new("t1");
        assert_eq!(k.stats_minute(29_000_000), "t1:stats:29000000");
    }
}
