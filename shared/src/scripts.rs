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
//! Each script has one typed call beside its source: a `ScriptCall` builder
//! that takes what the script needs and lays out its KEYS and ARGV as the
//! script's header says, so no call site assembles them by hand (a test holds
//! every builder to its header's counts). [`Script::ALL`] is the one list of
//! scripts.
//!
//! This crate does no I/O: [`crate::functions`] makes one Redis Functions
//! library of these sources, and `store::scripts` loads it and runs a
//! `ScriptCall` with `store::scripts::invoke` (an `FCALL`).

use crate::apikey::{ApiKeyField, Limits};
use crate::keys::{Field, Keys, WORKER_GROUP};
use crate::names::{UnknownName, stored_names};
use crate::owner::Owner;
use crate::record::TaskRecord;
use crate::spec::{self, SpecSigner};
use crate::task::{Outcome, ReasonKind, TaskState};
use crate::usage::{CPU_LEDGER_WINDOW_MS, Usage};
use crate::workspace::WorkspaceId;

mod workspaces;
pub use workspaces::*;

/// Every Lua script, each named as its file `lua/<name>.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case", const_into_str)]
pub enum Script {
    Submit,
    Claim,
    Started,
    Progress,
    Finish,
    Kill,
    ForgetWorker,
    Requeue,
    KeyCreate,
    KeyRotate,
    KeyRevoke,
    KeyTouch,
    WsCommit,
    WsFork,
    WsDelete,
    WsSweep,
}

// `Script::ALL` is the one list of scripts (for the functions library, and for the tests).
stored_names!(Script);

impl Script {
    /// The file stem, `lua/<name>.lua`.
    pub const fn name(self) -> &'static str {
        self.as_str()
    }

    pub const fn source(self) -> &'static str {
        match self {
            Script::Submit => SUBMIT,
            Script::Claim => CLAIM,
            Script::Started => STARTED,
            Script::Progress => PROGRESS,
            Script::Finish => FINISH,
            Script::Kill => KILL,
            Script::ForgetWorker => FORGET_WORKER,
            Script::Requeue => REQUEUE,
            Script::KeyCreate => KEY_CREATE,
            Script::KeyRotate => KEY_ROTATE,
            Script::KeyRevoke => KEY_REVOKE,
            Script::KeyTouch => KEY_TOUCH,
            Script::WsCommit => WS_COMMIT,
            Script::WsFork => WS_FORK,
            Script::WsDelete => WS_DELETE,
            Script::WsSweep => WS_SWEEP,
        }
    }
}

/// One call of a script: which, its KEYS and its ARGV, in the header's order,
/// and `R`, the type its reply reads as (`store::scripts::invoke` returns an
/// `R`), so no call site picks a reply type of its own. Only the builders
/// below make one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptCall<R> {
    script: Script,
    keys: Vec<String>,
    args: Vec<Vec<u8>>,
    reply: std::marker::PhantomData<fn() -> R>,
}

impl<R> ScriptCall<R> {
    fn new<const K: usize, const A: usize>(
        script: Script,
        keys: [String; K],
        args: [&[u8]; A],
    ) -> ScriptCall<R> {
        ScriptCall {
            script,
            keys: keys.into(),
            args: args.iter().map(|a| a.to_vec()).collect(),
            reply: std::marker::PhantomData,
        }
    }

    pub fn script(&self) -> Script {
        self.script
    }

    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    pub fn args(&self) -> &[Vec<u8>] {
        &self.args
    }

    /// The same call with its reply type forgotten: for tests that look at
    /// every script's layout at once.
    #[cfg(test)]
    fn untyped(self) -> ScriptCall<()> {
        ScriptCall {
            script: self.script,
            keys: self.keys,
            args: self.args,
            reply: std::marker::PhantomData,
        }
    }
}

/// `run_script`: the new record, its zip and its job, all or nothing.
pub const SUBMIT: &str = include_str!("lua/submit.lua");

/// What SUBMIT stores besides the record's fields.
#[derive(Debug, Clone, Copy)]
pub struct Submit<'a> {
    pub task_id: &'a str,
    /// The zip and stdin, hashed (what the spec signs of them).
    pub inputs: &'a spec::Inputs,
    /// Index entries older than this many milliseconds are dropped.
    pub index_horizon_ms: u64,
    /// `MAX_QUEUED_TASKS`: with this many jobs in the stream, nothing is stored.
    pub max_queued: u64,
    /// Who submits it, with its quotas (none for the admin).
    pub owner: &'a Owner,
    pub limits: Limits,
    /// The api's key: the record is stored with its spec signed
    /// (`spec_signature`), so workers run it.
    pub signer: &'a SpecSigner,
    /// The task's workspace, if it runs on one: the id and the version it
    /// starts from are the record's (`workspace_id`, `workspace_base`), signed
    /// with the rest.
    pub workspace: Option<SubmitWorkspace>,
}

/// How SUBMIT takes the record's workspace.
#[derive(Debug, Clone, Copy)]
pub struct SubmitWorkspace {
    /// Make it (it must not exist), else take an existing one.
    pub new: bool,
    /// The record's base version must still be the head (the client named none).
    pub must_be_head: bool,
    /// `WORKSPACE_SAVE_GRACE_SECONDS` in ms: a task that ended this recently,
    /// on a worker not lost, may still be saving, so the workspace stays busy.
    pub save_grace_ms: u64,
}

/// An owner's quota that refused a submit. Named in SUBMIT's reply as `as_str`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    strum::IntoStaticStr,
    strum::VariantArray,
    strum::EnumString,
)]
#[strum(serialize_all = "snake_case", const_into_str)]
pub enum Quota {
    MaxQueued,
    MaxRunning,
    CpuSecondsPerDay,
}

stored_names!(Quota);

/// What SUBMIT did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitReply {
    Queued,
    /// `MAX_QUEUED_TASKS` refused it: this many jobs were in the stream.
    Full(u64),
    /// The owner's task-count quota refused it: `count` of its tasks are
    /// queued (`MaxQueued`) or active (`MaxRunning`), the limit is `limit`.
    Tasks {
        quota: Quota,
        limit: u64,
        count: u64,
    },
    /// The CPU quota refused it: `used_ms` of `limit_ms` in the last 24 h;
    /// back under the limit at `frees_at_ms` (Redis's clock).
    Cpu {
        limit_ms: u64,
        used_ms: u64,
        frees_at_ms: i64,
    },
    /// Its workspace refused it (`detail` as `WsRefusal` says).
    Workspace {
        why: WsRefusal,
        detail: String,
    },
}

impl SubmitReply {
    /// From SUBMIT's reply: an entry id (text), an integer, or
    /// `{quota, limit, count, frees_at}`.
    pub fn parse(reply: SubmitRaw) -> Result<SubmitReply, UnknownName> {
        match reply {
            SubmitRaw::Entry => Ok(SubmitReply::Queued),
            SubmitRaw::Backlog(n) => Ok(SubmitReply::Full(n.max(0) as u64)),
            SubmitRaw::Workspace(why, detail) => Ok(SubmitReply::Workspace {
                why: why.parse()?,
                detail,
            }),
            SubmitRaw::Quota(name, limit, count, frees_at) => {
                let quota: Quota = name.parse().map_err(|_| UnknownName {
                    what: "quota",
                    name: name.clone(),
                })?;
                let (limit, count) = (limit.max(0) as u64, count.max(0) as u64);
                Ok(match quota {
                    Quota::CpuSecondsPerDay => SubmitReply::Cpu {
                        limit_ms: limit,
                        used_ms: count,
                        frees_at_ms: frees_at,
                    },
                    quota => SubmitReply::Tasks {
                        quota,
                        limit,
                        count,
                    },
                })
            }
        }
    }
}

/// SUBMIT's reply before it is read as a [`SubmitReply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitRaw {
    Entry,
    Backlog(i64),
    Quota(String, i64, i64, i64),
    /// `{'workspace', why, detail}`.
    Workspace(String, String),
}

impl ScriptCall<SubmitReply> {
    /// Replies with the jobs stream entry id, or (refused) the backlog as an
    /// integer, or the quota that refused it: read as a [`SubmitReply`].
    pub fn submit(keys: &Keys, s: &Submit<'_>, record: &TaskRecord) -> Self {
        let id = s.task_id;
        let (horizon, max) = (s.index_horizon_ms.to_string(), s.max_queued.to_string());
        // The admin key has no owner: the owner keys are named (for the
        // header's count) but never touched.
        let (owner, limits) = (s.owner.as_stored(), s.limits);
        let opt = |n: Option<u64>| n.map(|n| n.to_string()).unwrap_or_default();
        let cpu_ms = opt(limits.cpu_seconds_per_day.map(|s| s.saturating_mul(1000)));
        let (max_q, max_r) = (opt(limits.max_queued), opt(limits.max_running));
        // Without a workspace the key is named (for the header's count) and
        // never touched.
        let ws = s.workspace.zip(record.workspace_id);
        let ws_key = match &ws {
            Some((_, id)) => keys.workspace(id),
            None => keys.workspace(&WorkspaceId::from_bytes([0; 16])),
        };
        let (ws_use, ws_id, ws_base, must_be_head, grace) = match &ws {
            Some((w, id)) => (
                if w.new { "new" } else { "existing" },
                id.to_string(),
                record.workspace_base.unwrap_or(0).to_string(),
                if w.must_be_head { "1" } else { "" },
                w.save_grace_ms.to_string(),
            ),
            None => ("", String::new(), String::new(), "", String::new()),
        };
        let mut call = ScriptCall::new(
            Script::Submit,
            [
                keys.task(id),
                keys.task_zip(id),
                keys.task_stdin(id),
                keys.stats(),
                keys.jobs(),
                keys.task_index(),
                keys.owner_active(&owner),
                keys.owner_cpu(&owner),
                keys.owner_tasks(&owner),
                ws_key,
                keys.owner_workspaces(&owner),
                keys.workspaces(),
            ],
            [
                id.as_bytes(),
                s.inputs.zip().unwrap_or_default(),
                s.inputs.stdin().unwrap_or_default(),
                horizon.as_bytes(),
                max.as_bytes(),
                owner.as_bytes(),
                max_q.as_bytes(),
                max_r.as_bytes(),
                cpu_ms.as_bytes(),
                ws_use.as_bytes(),
                ws_id.as_bytes(),
                ws_base.as_bytes(),
                must_be_head.as_bytes(),
                grace.as_bytes(),
            ],
        );
        // Signed here, from the very pairs the script stores, so no submit
        // is unsigned and none signs other bytes than it writes.
        let fields: Vec<_> = record
            .to_fields()
            .into_iter()
            .filter(|(f, _)| *f != Field::SpecSignature)
            .collect();
        let signature = s.signer.sign(&spec::message(
            id,
            fields.iter().map(|(f, v)| (*f, v)),
            s.inputs,
        ));
        let signed = (Field::SpecSignature, signature.into_bytes());
        for (field, value) in fields.into_iter().chain([signed]) {
            call.args.push(field.as_str().as_bytes().to_vec());
            call.args.push(value);
        }
        call
    }
}

/// A worker takes a task it read from the stream: queued -> running.
pub const CLAIM: &str = include_str!("lua/claim.lua");

impl ScriptCall<TaskStateReply> {
    /// Replies with a [`TaskStateReply`].
    pub fn claim(keys: &Keys, task_id: &str, worker: &str, entry_id: &str) -> Self {
        ScriptCall::new(
            Script::Claim,
            [keys.task(task_id), keys.task_events(task_id)],
            [worker.as_bytes(), entry_id.as_bytes()],
        )
    }
}

/// The task's container has started.
pub const STARTED: &str = include_str!("lua/started.lua");

impl ScriptCall<TaskStateReply> {
    /// Replies with a [`TaskStateReply`]: `running` if the task is still `worker`'s.
    pub fn started(keys: &Keys, task_id: &str, worker: &str, container: &str) -> Self {
        ScriptCall::new(
            Script::Started,
            [keys.task(task_id), keys.task_events(task_id)],
            [worker.as_bytes(), container.as_bytes()],
        )
    }
}

/// Publishes a running task's output tails; replies with its state.
pub const PROGRESS: &str = include_str!("lua/progress.lua");

/// Output tails as published while a task runs.
#[derive(Debug, Clone, Copy)]
pub struct Progress<'a> {
    pub stdout_tail: &'a [u8],
    pub stderr_tail: &'a [u8],
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// Milliseconds since the last output byte; `None` if there was none yet.
    pub output_age_ms: Option<u64>,
    /// An allow-list task's egress log (`EgressLog` as JSON); `None` leaves
    /// the field as it is.
    pub egress_log: Option<&'a [u8]>,
}

impl ScriptCall<TaskStateReply> {
    /// Replies with a [`TaskStateReply`] (a kill shows here).
    pub fn progress(keys: &Keys, task_id: &str, worker: &str, p: &Progress<'_>) -> Self {
        let (out, err) = (p.stdout_bytes.to_string(), p.stderr_bytes.to_string());
        let age = p.output_age_ms.map(|a| a.to_string()).unwrap_or_default();
        ScriptCall::new(
            Script::Progress,
            [keys.task(task_id), keys.task_events(task_id)],
            [
                worker.as_bytes(),
                p.stdout_tail,
                p.stderr_tail,
                out.as_bytes(),
                err.as_bytes(),
                age.as_bytes(),
                p.egress_log.unwrap_or_default(),
            ],
        )
    }
}

/// Records how a task ended.
pub const FINISH: &str = include_str!("lua/finish.lua");

impl ScriptCall<TaskStateReply> {
    /// As `worker` (the one recorded as holding the task). `collected`: the
    /// zip of the collected files and its listing (JSON), kept as long as the
    /// record. Replies with a [`TaskStateReply`]: the state the task ends in.
    pub fn finish(
        keys: &Keys,
        task_id: &str,
        worker: &str,
        outcome: &Outcome,
        retention_seconds: u64,
        ended: &Ended<'_>,
    ) -> Self {
        let code = outcome.exit_code.map(|c| c.to_string()).unwrap_or_default();
        let retention = retention_seconds.to_string();
        let (zip, listing) = ended.collected.unwrap_or_default();
        let figure = |v: Option<u64>| v.map(|n| n.to_string()).unwrap_or_default();
        let u = &ended.usage;
        let (cpu, peak, ws) = (
            figure(u.cpu_ms),
            figure(u.peak_memory_bytes),
            figure(u.workspace_bytes),
        );
        let owner = ended.owner.as_stored();
        let window = CPU_LEDGER_WINDOW_MS.to_string();
        let note = no_version_note(&outcome.reason);
        ScriptCall::new(
            Script::Finish,
            [
                keys.task(task_id),
                keys.task_zip(task_id),
                keys.stats(),
                keys.task_stdin(task_id),
                keys.task_files(task_id),
                keys.owner_cpu(&owner),
                keys.owner_usage(&owner),
                keys.usage_owners(),
                keys.usage_totals(),
                keys.task_events(task_id),
            ],
            [
                worker.as_bytes(),
                outcome.state.as_str().as_bytes(),
                outcome.kind.as_str().as_bytes(),
                outcome.reason.as_bytes(),
                code.as_bytes(),
                retention.as_bytes(),
                zip,
                listing.as_bytes(),
                task_id.as_bytes(),
                owner.as_bytes(),
                cpu.as_bytes(),
                peak.as_bytes(),
                ws.as_bytes(),
                window.as_bytes(),
                if u.estimated { b"1" } else { b"" },
                note.as_bytes(),
            ],
        )
    }
}

/// What a workspace task that ended without its /workspace being saved (its
/// worker lost, or it never ran) is told, when nothing said why already.
fn no_version_note(reason: &str) -> String {
    format!(
        "no version was made: the task ended before its /workspace was saved ({reason}); the head stays where it was"
    )
}

/// What FINISH records besides the outcome. `Default`: nothing (a reaper
/// settling a lost worker's task).
#[derive(Debug, Clone, Copy)]
pub struct Ended<'a> {
    /// The files `collect` gathered: their zip and its listing (JSON).
    pub collected: Option<(&'a [u8], &'a str)>,
    /// What the container used (nothing unknown is written).
    pub usage: Usage,
    /// The task's owner as the worker read it at claim: its CPU ledger and
    /// totals are counted (none for the admin's).
    pub owner: &'a Owner,
}

impl Default for Ended<'_> {
    fn default() -> Self {
        Ended {
            collected: None,
            usage: Usage::default(),
            owner: &crate::owner::ADMIN,
        }
    }
}

/// `kill_task`.
pub const KILL: &str = include_str!("lua/kill.lua");

impl ScriptCall<KillReply> {
    /// Replies with `{state, killed}`: read as a [`KillReply`].
    /// `owner`: the caller (the admin sees every task, passed as `""`);
    /// another owner's task is answered as missing.
    pub fn kill(
        keys: &Keys,
        task_id: &str,
        reason: &str,
        kind: ReasonKind,
        retention_seconds: u64,
        owner: &Owner,
    ) -> Self {
        let retention = retention_seconds.to_string();
        ScriptCall::new(
            Script::Kill,
            [
                keys.task(task_id),
                keys.task_zip(task_id),
                keys.stats(),
                keys.task_stdin(task_id),
                keys.task_events(task_id),
            ],
            [
                reason.as_bytes(),
                kind.as_str().as_bytes(),
                retention.as_bytes(),
                owner.as_stored().as_bytes(),
            ],
        )
    }
}

/// What KILL did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReply {
    /// No such task.
    Missing,
    /// The task's state after the call, and whether this call killed it.
    State(TaskState, bool),
}

impl KillReply {
    pub fn parse((state, killed): (String, i64)) -> Result<KillReply, UnknownName> {
        if state == MISSING {
            return Ok(KillReply::Missing);
        }
        Ok(KillReply::State(state.parse()?, killed == 1))
    }
}

/// Forgets a dead worker that holds no job.
pub const FORGET_WORKER: &str = include_str!("lua/forget_worker.lua");

impl ScriptCall<bool> {
    /// Replies 1 (true) if `worker` was forgotten, 0 if it is alive or holds jobs.
    pub fn forget_worker(keys: &Keys, worker: &str) -> Self {
        ScriptCall::new(
            Script::ForgetWorker,
            [keys.jobs(), keys.worker(worker), keys.workers()],
            [WORKER_GROUP.as_bytes(), worker.as_bytes()],
        )
    }
}

/// Puts a job back in the stream for any worker.
pub const REQUEUE: &str = include_str!("lua/requeue.lua");

impl ScriptCall<bool> {
    /// Replies 1 (true) if requeued, 0 if the entry was no longer pending.
    pub fn requeue(keys: &Keys, entry_id: &str, task_id: &str) -> Self {
        ScriptCall::new(
            Script::Requeue,
            [keys.jobs()],
            [
                WORKER_GROUP.as_bytes(),
                entry_id.as_bytes(),
                task_id.as_bytes(),
            ],
        )
    }
}

/// `keys create`: a new key's record and name, unless the name is taken.
pub const KEY_CREATE: &str = include_str!("lua/key_create.lua");
/// `keys rotate`: the record moves to the new key's hash.
pub const KEY_ROTATE: &str = include_str!("lua/key_rotate.lua");
/// `keys revoke`: the record and the name go.
pub const KEY_REVOKE: &str = include_str!("lua/key_revoke.lua");
/// The api's `last_used_at`, at most once per interval.
pub const KEY_TOUCH: &str = include_str!("lua/key_touch.lua");

/// What KEY_CREATE did (it replies 1, 0 or 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyCreated {
    Created,
    NameTaken,
    /// A key of that name was revoked: its name is not reused.
    NameRevoked,
}

impl KeyCreated {
    pub fn parse(reply: i64) -> Result<KeyCreated, UnknownName> {
        match reply {
            1 => Ok(KeyCreated::Created),
            0 => Ok(KeyCreated::NameTaken),
            2 => Ok(KeyCreated::NameRevoked),
            n => Err(UnknownName {
                what: "key_create reply",
                name: n.to_string(),
            }),
        }
    }
}

impl ScriptCall<KeyCreated> {
    /// Replies 1; 0 when the name is taken; 2 when a key of that name was
    /// revoked: read as a [`KeyCreated`]. `fields`: the record's pairs
    /// (`ApiKeyRecord::to_fields`).
    pub fn key_create(
        keys: &Keys,
        name: &str,
        sha256: &str,
        fields: &[(ApiKeyField, String)],
    ) -> Self {
        let mut call = ScriptCall::new(
            Script::KeyCreate,
            [
                keys.api_key_names(),
                keys.api_key(sha256),
                keys.api_keys_revoked(),
            ],
            [name.as_bytes(), sha256.as_bytes()],
        );
        for (f, v) in fields {
            call.args.push(f.as_str().as_bytes().to_vec());
            call.args.push(v.as_bytes().to_vec());
        }
        call
    }
}

impl ScriptCall<bool> {
    /// Replies 1 (true), or 0 when no key has that name.
    pub fn key_rotate(keys: &Keys, name: &str, new_sha256: &str) -> Self {
        ScriptCall::new(
            Script::KeyRotate,
            [
                keys.api_key_names(),
                keys.api_key(new_sha256),
                keys.api_key(""),
            ],
            [name.as_bytes(), new_sha256.as_bytes()],
        )
    }

    /// Replies 1 (true), or 0 when no key has that name.
    pub fn key_revoke(keys: &Keys, name: &str) -> Self {
        ScriptCall::new(
            Script::KeyRevoke,
            [
                keys.api_key_names(),
                keys.api_key(""),
                keys.api_keys_revoked(),
            ],
            [name.as_bytes()],
        )
    }

    /// Replies 1 (true) if `last_used_at` was written.
    pub fn key_touch(keys: &Keys, sha256: &str, interval_ms: u64) -> Self {
        let interval = interval_ms.to_string();
        ScriptCall::new(
            Script::KeyTouch,
            [keys.api_key(sha256)],
            [interval.as_bytes()],
        )
    }
}

/// Replied when the task hash does not exist (never made, or expired).
pub const MISSING: &str = "missing";
/// Replied when the task belongs to another worker: the caller must not run (or
/// must stop) it.
pub const NOT_OWNER: &str = "not-owner";

/// What a state script answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskStateReply {
    /// No such task.
    Missing,
    /// The task is held by another worker.
    NotOwner,
    State(TaskState),
}

impl TaskStateReply {
    pub fn parse(s: &str) -> Result<TaskStateReply, UnknownName> {
        match s {
            MISSING => Ok(TaskStateReply::Missing),
            NOT_OWNER => Ok(TaskStateReply::NotOwner),
            _ => s.parse().map(TaskStateReply::State),
        }
    }

    pub fn is_running(self) -> bool {
        self == TaskStateReply::State(TaskState::Running)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Field;
    use crate::options::Network;
    use crate::workspace::{BlobDigest, WorkspaceCaps};

    /// Every single-quoted word in a script's code must be a known field, state,
    /// reply, stats or stream name, or a Redis command, so a typo cannot silently
    /// write a stray field.
    #[test]
    fn scripts_only_name_known_fields() {
        let known: Vec<&str> = Field::ALL
            .iter()
            .map(|f| f.as_str())
            .chain(crate::TaskState::ALL.iter().map(|s| s.as_str()))
            .chain([
                MISSING, NOT_OWNER, "", "%d", ":", "-", "+", "*", "-inf", "(",
            ])
            .chain([crate::keys::JOB_TASK_ID, crate::keys::STAT_SUBMITTED])
            .chain(["finished:", "finished:killed:", "killed:"])
            .chain(["~", crate::keys::TASK_EVENT_FIELD])
            .chain(crate::keys::TASK_EVENTS)
            .chain(Quota::ALL.iter().map(|q| q.as_str()))
            .chain(WsRefusal::ALL.iter().map(|q| q.as_str()))
            .chain(
                crate::workspace::WorkspaceField::ALL
                    .iter()
                    .map(|f| f.as_str()),
            )
            .chain(
                crate::workspace::VersionField::ALL
                    .iter()
                    .map(|f| f.as_str()),
            )
            .chain(crate::workspace::SweepField::ALL.iter().map(|f| f.as_str()))
            .chain(crate::workspace::SWEEP_PHASES)
            .chain(
                <SweepOp as strum::VariantArray>::VARIANTS
                    .iter()
                    .map(|&op| <&str>::from(op)),
            )
            .chain([
                "workspace",
                "refused",
                "new",
                "existing",
                "@",
                ":versions",
                ":versions:",
            ])
            .chain(["1", "0", "worker-lost", "spec-rejected"])
            .chain(ApiKeyField::ALL.iter().map(|f| f.as_str()))
            .chain([":(%d+)$"])
            .chain([
                crate::usage::TOTAL_TASKS,
                crate::usage::TOTAL_CPU_MS,
                crate::usage::TOTAL_PEAK_MEMORY_BYTES,
                crate::usage::TOTAL_WORKSPACE_BYTES,
            ])
            .collect();
        let is_command = |w: &str| !w.is_empty() && w.chars().all(|c| c.is_ascii_uppercase());
        for script in Script::ALL.iter().map(|s| s.source()) {
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

    fn header(script: Script) -> String {
        script
            .source()
            .lines()
            .take_while(|l| l.starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The highest `NAME[n]` the header documents, and whether it is open-ended
    /// (`NAME[n..]`: that many or more).
    fn documented(header: &str, name: &str) -> (usize, bool) {
        let mut max = (0, false);
        for part in header.split(&format!("{name}[")).skip(1) {
            let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
            let n: usize = digits.parse().unwrap_or(0);
            let open = part[digits.len()..].starts_with("..]");
            if n > max.0 || (n == max.0 && open) {
                max = (n, open);
            }
        }
        max
    }

    #[test]
    fn every_script_documents_its_keys_argv_and_reply() {
        for &script in Script::ALL {
            let header = header(script);
            assert!(header.contains("KEYS[1]"), "no KEYS in\n{header}");
            assert!(header.contains("ARGV[1]"), "no ARGV in\n{header}");
            assert!(header.contains("Returns"), "no reply in\n{header}");
        }
    }

    /// A typical call of each script's builder (a match, so a new script must
    /// add one here).
    fn sample_call(script: Script, keys: &Keys) -> ScriptCall<()> {
        let outcome = Outcome::worker_lost();
        match script {
            Script::Submit => {
                let mut record = TaskRecord::new(TaskState::Queued);
                record.runtime = Some(crate::RuntimeName::from_stored("python3.13"));
                record.network = Some(Network::None);
                let s = Submit {
                    task_id: "t",
                    inputs: &crate::spec::Inputs::hash(None, Some(b"in".to_vec())),
                    index_horizon_ms: 1,
                    max_queued: 2,
                    owner: &Owner::Key("alice".into()),
                    limits: Limits::default(),
                    signer: &crate::spec::SpecSigner::from_seed(&[1; 32]),
                    workspace: None,
                };
                ScriptCall::submit(keys, &s, &record).untyped()
            }
            Script::Claim => ScriptCall::claim(keys, "t", "w", "1-0").untyped(),
            Script::Started => ScriptCall::started(keys, "t", "w", "c").untyped(),
            Script::Progress => {
                let p = Progress {
                    stdout_tail: b"o",
                    stderr_tail: b"",
                    stdout_bytes: 1,
                    stderr_bytes: 0,
                    output_age_ms: None,
                    egress_log: None,
                };
                ScriptCall::progress(keys, "t", "w", &p).untyped()
            }
            Script::Finish => {
                let alice = Owner::Key("alice".into());
                let ended = Ended {
                    usage: Usage {
                        cpu_ms: Some(5),
                        ..Usage::default()
                    },
                    owner: &alice,
                    ..Ended::default()
                };
                ScriptCall::finish(keys, "t", "w", &outcome, 60, &ended).untyped()
            }
            Script::Kill => ScriptCall::kill(
                keys,
                "t",
                "why",
                ReasonKind::KilledByUser,
                60,
                &Owner::Admin,
            )
            .untyped(),
            Script::ForgetWorker => ScriptCall::forget_worker(keys, "w").untyped(),
            Script::Requeue => ScriptCall::requeue(keys, "1-0", "t").untyped(),
            Script::KeyCreate => ScriptCall::key_create(
                keys,
                "ci",
                "ab",
                &[
                    (ApiKeyField::Name, "ci".into()),
                    (ApiKeyField::Scopes, "run".into()),
                ],
            )
            .untyped(),
            Script::KeyRotate => ScriptCall::key_rotate(keys, "ci", "cd").untyped(),
            Script::KeyRevoke => ScriptCall::key_revoke(keys, "ci").untyped(),
            Script::KeyTouch => ScriptCall::key_touch(keys, "ab", 60_000).untyped(),
            Script::WsCommit => {
                let ws = WorkspaceId::from_bytes([1; 16]);
                let saved = Saved::Version {
                    manifest: &BlobDigest::of(b"m"),
                    bytes: 3,
                    files: 1,
                    epoch: 0,
                };
                let caps = WorkspaceCaps {
                    versions_kept: 20,
                    owner_max_bytes: 1 << 30,
                };
                ScriptCall::ws_commit(keys, "t", "w", &ws, 0, saved, caps).untyped()
            }
            Script::WsFork => {
                let (a, b) = (
                    WorkspaceId::from_bytes([1; 16]),
                    WorkspaceId::from_bytes([2; 16]),
                );
                ScriptCall::ws_fork(keys, &Owner::Admin, &a, Some(1), &b, 0).untyped()
            }
            Script::WsDelete => {
                let (ws, alice) = (WorkspaceId::from_bytes([1; 16]), Owner::Key("alice".into()));
                ScriptCall::ws_delete(keys, &alice, &ws, &alice).untyped()
            }
            Script::WsSweep => {
                ScriptCall::ws_sweep(keys, SweepOp::Begin, "w", 60_000, 3_600_000).untyped()
            }
        }
    }

    /// Each typed call passes exactly the KEYS and ARGV its header documents
    /// (an open-ended `ARGV[n..]` takes field/value pairs from `n` on).
    #[test]
    fn every_typed_call_matches_its_header() {
        let keys = Keys::new("p");
        for &script in Script::ALL {
            let (header, call) = (header(script), sample_call(script, &keys));
            assert_eq!(call.script, script);
            let (n_keys, _) = documented(&header, "KEYS");
            assert_eq!(call.keys.len(), n_keys, "{} KEYS", script.name());
            let (n_args, open) = documented(&header, "ARGV");
            if open {
                let fixed = n_args - 1;
                assert!(
                    call.args.len() > fixed && (call.args.len() - fixed) % 2 == 0,
                    "{} ARGV: {} for {fixed} and pairs",
                    script.name(),
                    call.args.len()
                );
            } else {
                assert_eq!(call.args.len(), n_args, "{} ARGV", script.name());
            }
            assert!(
                call.keys.iter().all(|k| k.starts_with("p:")),
                "{} names a key outside the prefix: {:?}",
                script.name(),
                call.keys
            );
        }
    }

    /// Every append to a task's events stream is trimmed to the documented
    /// length; the scripts that change a task's state or output all append.
    #[test]
    fn event_appends_are_trimmed_and_every_state_script_appends() {
        let xadd = format!(
            "'XADD', KEYS[{{}}], 'MAXLEN', '~', {}, '*', '{}', '",
            crate::keys::TASK_EVENTS_MAXLEN,
            crate::keys::TASK_EVENT_FIELD
        );
        for (script, key) in [
            (Script::Claim, 2),
            (Script::Started, 2),
            (Script::Progress, 2),
            (Script::Finish, 10),
            (Script::Kill, 5),
        ] {
            let want = xadd.replace("{}", &key.to_string());
            assert!(
                script.source().contains(&want),
                "{} does not append `{want}`",
                script.name()
            );
        }
        for &s in Script::ALL {
            assert_eq!(
                s.source().matches("'XADD'").count(),
                s.source().matches("'MAXLEN', '~', 16,").count()
                    + usize::from(matches!(s, Script::Submit | Script::Requeue)),
                "{}: an XADD without the events trim",
                s.name()
            );
        }
    }

    /// `Script::ALL` is every file in `lua/`, each under its own name.
    #[test]
    fn the_list_of_scripts_is_the_lua_directory() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/lua");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .expect("lua dir")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        files.sort();
        let mut named: Vec<String> = Script::ALL
            .iter()
            .map(|s| format!("{}.lua", s.name()))
            .collect();
        named.sort();
        assert_eq!(files, named);
        for &s in Script::ALL {
            let path = format!("{dir}/{}.lua", s.name());
            assert_eq!(
                std::fs::read_to_string(path).ok().as_deref(),
                Some(s.source())
            );
        }
    }

    #[test]
    fn submit_passes_the_records_fields_as_pairs() {
        let call = sample_call(Script::Submit, &Keys::new("p"));
        let pairs: Vec<(String, String)> = call.args[14..]
            .chunks(2)
            .map(|p| {
                (
                    String::from_utf8_lossy(&p[0]).into_owned(),
                    String::from_utf8_lossy(&p[1]).into_owned(),
                )
            })
            .collect();
        let expect = [
            ("state", "queued"),
            ("runtime", "python3.13"),
            ("network", "none"),
        ];
        let (signature, fields) = pairs.split_last().unwrap();
        assert_eq!(fields, expect.map(|(f, v)| (f.to_owned(), v.to_owned())));
        // Last, the signature of those very pairs, the id and the stdin.
        assert_eq!(signature.0, "spec_signature");
        let signer = crate::spec::SpecSigner::from_seed(&[1; 32]);
        let verifier = crate::spec::SpecVerifier::from_list(&signer.public_base64()).unwrap();
        let stored = fields.iter().map(|(f, v)| (f.parse::<Field>().unwrap(), v));
        let message = crate::spec::message(
            "t",
            stored,
            &crate::spec::Inputs::hash(None, Some(b"in".to_vec())),
        );
        assert_eq!(
            verifier.verify(&message, Some(&signature.1)),
            Ok(signer.key_id())
        );
    }

    #[test]
    fn kill_replies_read_as_their_kinds() {
        assert_eq!(
            KillReply::parse((MISSING.into(), 0)),
            Ok(KillReply::Missing)
        );
        assert_eq!(
            KillReply::parse(("killed".into(), 1)),
            Ok(KillReply::State(TaskState::Killed, true))
        );
        assert!(KillReply::parse(("gone".into(), 0)).is_err());
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

    /// An ended task's events stream lives `FINAL_EVENTS_TTL_SECONDS`, not as
    /// long as its record.
    #[test]
    fn an_ended_tasks_events_expire_soon_after_its_end() {
        let ttl = crate::keys::FINAL_EVENTS_TTL_SECONDS;
        assert!(FINISH.contains(&format!(
            "redis.call('EXPIRE', KEYS[10], math.min(tonumber(ARGV[6]), {ttl}))"
        )));
        assert!(KILL.contains(&format!(
            "redis.call('EXPIRE', KEYS[5], math.min(tonumber(ARGV[3]), {ttl}))"
        )));
        for script in [FINISH, KILL] {
            assert!(
                script.contains(&format!("expires {ttl} s later")),
                "{script}"
            );
        }
    }

    #[test]
    fn replies_parse_into_their_kinds() {
        assert_eq!(TaskStateReply::parse(MISSING), Ok(TaskStateReply::Missing));
        assert_eq!(
            TaskStateReply::parse(NOT_OWNER),
            Ok(TaskStateReply::NotOwner)
        );
        assert_eq!(
            TaskStateReply::parse("timed-out"),
            Ok(TaskStateReply::State(TaskState::TimedOut))
        );
        assert!(TaskStateReply::parse("done").is_err());
    }
}
