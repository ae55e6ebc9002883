//! The workspace scripts' calls and replies: WS_COMMIT (a saved version
//! becomes the head), WS_FORK, WS_DELETE (and the idle expiry's delete) and
//! WS_SWEEP (the blob store's sweep), and the refusals they and SUBMIT share
//! (`WsRefusal`). Re-exported from `scripts`, so callers name them there.

use super::{Script, ScriptCall};
use crate::keys::Keys;
use crate::names::{UnknownName, stored_names};
use crate::owner::Owner;
use crate::workspace::{BlobDigest, WorkspaceCaps, WorkspaceId};

/// Why a workspace script (or SUBMIT, for a task's workspace) did nothing. Named
/// in the replies as `as_str`.
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
#[strum(parse_err_ty = UnknownName, parse_err_fn = WsRefusal::unknown)]
pub enum WsRefusal {
    /// No such workspace, or another owner's (answered alike).
    Missing,
    /// A task runs on it (detail: its id).
    Busy,
    /// The version asked for is not kept (detail: the version).
    NoVersion,
    /// Its head moved between the api's read and the submit (detail: the head).
    Moved,
    /// The task is not the caller's (another worker holds it).
    NotYours,
    /// The workspace is no longer busy with the task (deleted, or taken after
    /// the save grace).
    NotBusy,
    /// It would take its owner past the byte cap (detail: the bytes its
    /// owner's versions would hold).
    OverCap,
    /// A sweep's delete phase ran since the save began (detail: the epoch now).
    SweepMoved,
    /// A sweep's delete phase runs (detail: its ms left).
    Sweeping,
    /// Another worker sweeps (detail: its name).
    SweepHeld,
    /// A sweep began within the interval (detail: how many ms ago).
    Swept,
    /// The sweep's lease ran out, or another worker took it.
    SweepLost,
}

stored_names!(WsRefusal, parse "workspace refusal");

/// A workspace script's reply: a number (a version), or why it did nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WsReply {
    Done(u64),
    Refused { why: WsRefusal, detail: String },
}

impl WsReply {
    /// From the raw reply: a number, or `{'refused', why, detail?}`.
    pub fn parse(raw: Result<i64, (String, String)>) -> Result<WsReply, UnknownName> {
        match raw {
            Ok(n) => Ok(WsReply::Done(n.max(0) as u64)),
            Err((why, detail)) => Ok(WsReply::Refused {
                why: why.parse()?,
                detail,
            }),
        }
    }
}

/// A task's /workspace becomes a version (or is recorded as making none).
pub const WS_COMMIT: &str = include_str!("../lua/ws_commit.lua");
/// fork_workspace.
pub const WS_FORK: &str = include_str!("../lua/ws_fork.lua");
/// delete_workspace.
pub const WS_DELETE: &str = include_str!("../lua/ws_delete.lua");
/// The blob store's sweep, and the epoch a save begins in.
pub const WS_SWEEP: &str = include_str!("../lua/ws_sweep.lua");

/// What WS_SWEEP is asked to do (its ARGV[1]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum SweepOp {
    /// A save begins: the epoch, unless a delete phase runs.
    Look,
    /// A sweep starts listing.
    Begin,
    /// Its delete phase starts: the epoch counted up.
    Delete,
    /// Its lease extended.
    Renew,
    /// It is over.
    End,
}

/// What a task whose version WS_COMMIT refused is told.
pub const WORKSPACE_TAKEN: &str =
    "the workspace was deleted, or taken by another task, before this task's files were saved";

/// What a task whose version its owner's byte cap stopped is told; `%d` is
/// where WS_COMMIT puts the bytes the owner's versions would have held.
pub(super) fn over_cap_note(cap: u64) -> String {
    format!(
        "not saved: this owner's workspaces would hold %d bytes, over the cap of {cap} \
         (WORKSPACE_OWNER_MAX_MB); delete_workspace ones no longer needed, and run again"
    )
}

/// What a worker saved of a task's /workspace.
#[derive(Debug, Clone, Copy)]
pub enum Saved<'a> {
    /// Stored whole: its manifest's digest, bytes and entries, and the sweep
    /// epoch its save began in (WS_SWEEP `Look`).
    Version {
        manifest: &'a BlobDigest,
        bytes: u64,
        files: u64,
        epoch: u64,
    },
    /// Nothing, for this reason (shown to the client).
    Nothing(&'a str),
}

impl ScriptCall<WsReply> {
    /// Replies with the new version (0: none made) or why nothing was written.
    pub fn ws_commit(
        keys: &Keys,
        task_id: &str,
        worker: &str,
        workspace: &WorkspaceId,
        base: u64,
        saved: Saved<'_>,
        caps: WorkspaceCaps,
    ) -> Self {
        let (manifest, bytes, files, note, epoch) = match saved {
            Saved::Version {
                manifest,
                bytes,
                files,
                epoch,
            } => (
                manifest.as_str(),
                bytes.to_string(),
                files.to_string(),
                WORKSPACE_TAKEN,
                epoch.to_string(),
            ),
            Saved::Nothing(why) => ("", String::new(), String::new(), why, String::new()),
        };
        let (base, kept) = (base.to_string(), caps.versions_kept.max(1).to_string());
        let cap = caps.owner_max_bytes.to_string();
        let over = over_cap_note(caps.owner_max_bytes);
        ScriptCall::new(
            Script::WsCommit,
            [
                keys.task(task_id),
                keys.workspace(workspace),
                keys.workspace_versions(workspace),
                keys.workspace_bytes(),
                keys.workspace_sweep(),
            ],
            [
                worker.as_bytes(),
                task_id.as_bytes(),
                manifest.as_bytes(),
                bytes.as_bytes(),
                files.as_bytes(),
                base.as_bytes(),
                kept.as_bytes(),
                note.as_bytes(),
                cap.as_bytes(),
                over.as_bytes(),
                epoch.as_bytes(),
            ],
        )
    }

    /// Replies with the version forked (0: the empty one), or why not.
    pub fn ws_fork(
        keys: &Keys,
        caller: &Owner,
        source: &WorkspaceId,
        version: Option<u64>,
        new: &WorkspaceId,
        owner_max_bytes: u64,
    ) -> Self {
        let owner = caller.as_stored();
        let version = version.map(|v| v.to_string()).unwrap_or_default();
        let (new_id, source_id) = (new.to_string(), source.to_string());
        let cap = owner_max_bytes.to_string();
        ScriptCall::new(
            Script::WsFork,
            [
                keys.workspace(source),
                keys.workspace(new),
                keys.owner_workspaces(&owner),
                keys.workspaces(),
                keys.workspace_bytes(),
                keys.workspace_sweep(),
            ],
            [
                owner.as_bytes(),
                version.as_bytes(),
                new_id.as_bytes(),
                source_id.as_bytes(),
                cap.as_bytes(),
            ],
        )
    }

    /// WS_SWEEP's `op`, as worker `worker` with a lease of `lease_ms` (both
    /// ignored by `Look`); `every_ms`, for `Begin`, is how often the store is
    /// swept. Replies as its header says.
    pub fn ws_sweep(keys: &Keys, op: SweepOp, worker: &str, lease_ms: u64, every_ms: u64) -> Self {
        let (op, lease, every) = (<&str>::from(op), lease_ms.to_string(), every_ms.to_string());
        ScriptCall::new(
            Script::WsSweep,
            [keys.workspace_sweep()],
            [
                op.as_bytes(),
                worker.as_bytes(),
                lease.as_bytes(),
                every.as_bytes(),
            ],
        )
    }
}

impl ScriptCall<bool> {
    /// Replies 1 (true) if deleted, 0 if there was no such workspace of the
    /// caller's. `owner` is the workspace's owner as the caller read it.
    pub fn ws_delete(keys: &Keys, caller: &Owner, id: &WorkspaceId, owner: &Owner) -> Self {
        ScriptCall::ws_delete_if(keys, caller, id, owner, None)
    }

    /// The idle expiry's delete: workspace `id`, as the admin, only if it was
    /// last used before `idle_before` (Unix ms) and is still as the caller
    /// read it: owned by `owner`, busy with `busy` (a task no longer queued or
    /// running) or with none. Replies 1 (true) if it went.
    pub fn ws_expire(
        keys: &Keys,
        id: &WorkspaceId,
        owner: &Owner,
        busy: Option<&str>,
        idle_before: i64,
    ) -> Self {
        ScriptCall::ws_delete_if(keys, &Owner::Admin, id, owner, Some((busy, idle_before)))
    }

    fn ws_delete_if(
        keys: &Keys,
        caller: &Owner,
        id: &WorkspaceId,
        owner: &Owner,
        idle: Option<(Option<&str>, i64)>,
    ) -> Self {
        let (caller, owner, ws) = (caller.as_stored(), owner.as_stored(), id.to_string());
        let busy = idle.and_then(|(b, _)| b).unwrap_or_default();
        let horizon = idle.map(|(_, h)| h.to_string()).unwrap_or_default();
        let grace = crate::workspace::SAVE_GRACE_MS.to_string();
        ScriptCall::new(
            Script::WsDelete,
            [
                keys.workspace(id),
                keys.workspace_versions(id),
                keys.owner_workspaces(&owner),
                keys.workspaces(),
                keys.workspace_bytes(),
                // Named for the header's count when there is no busy task.
                keys.task(if busy.is_empty() { "-" } else { busy }),
            ],
            [
                caller.as_bytes(),
                ws.as_bytes(),
                owner.as_bytes(),
                horizon.as_bytes(),
                busy.as_bytes(),
                grace.as_bytes(),
            ],
        )
    }
}
