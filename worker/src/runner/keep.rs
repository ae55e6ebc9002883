//! A workspace task's end: its /workspace, read from its paused container
//! before the container goes, stored as the next version (`save`), and that
//! version committed as the workspace's head, or the task recorded as making
//! none (`commit`).
//!
//! Every end the worker sees makes a version (exit, kill, timeout, shutdown):
//! the container is paused, not killed, so its files are still there. Only a
//! container that is gone by itself (the task killed its own init, or the
//! engine lost it) makes none, and the task says why (`workspace_note`).

use shared::scripts::{Saved, WsReply};
use shared::workspace::{Manifest, WorkspaceId};

use crate::ctx::Ctx;
use crate::retry;
use crate::workspaces::StoredVersion;
use crate::workspaces::sweep::{self, Committed};

/// Why a workspace task made no version, as its record says.
pub(super) const NOT_RUN: &str = "the task did not run, so its workspace was left as it was";
const GONE: &str = "the task's container ended before its /workspace could be saved (its own init was killed, its files could not be copied into /workspace, or the engine lost it): the workspace was left as it was";

/// Saves `container`'s /workspace (paused by `supervise`). `base`: the
/// version it started from, whose blobs the store holds.
pub(super) async fn save(
    ctx: &Ctx,
    task_id: &str,
    container: &str,
    base: Option<&Manifest>,
) -> Result<StoredVersion, String> {
    let sandbox = &ctx.sandbox;
    if !sandbox.is_paused(container).await {
        return Err(GONE.to_owned());
    }
    // Well within the save grace, after which the workspace is another
    // task's to take (and this commit would be refused).
    let deadline = std::time::Duration::from_millis(shared::workspace::SAVE_GRACE_MS / 2);
    let stored = tokio::time::timeout(deadline, async {
        // Before any blob is checked: see `sweep`.
        let epoch = sweep::epoch(&ctx.queue, &ctx.abort).await?;
        ctx.workspaces
            .save(sandbox, container, base, epoch)
            .await
            .map_err(|e| format!("the task's /workspace could not be saved: {e}"))
    })
    .await
    .map_err(|_| format!("the task's /workspace could not be saved within {deadline:?}"))??;
    // Paused all along, so the volume was mounted during the whole read: an
    // exited container's /workspace reads as empty, which must never become
    // a version.
    if !sandbox.is_paused(container).await {
        return Err(GONE.to_owned());
    }
    tracing::info!(
        task_id,
        files = stored.entries,
        bytes = stored.bytes,
        uploaded = stored.uploaded,
        ms = stored.took.as_millis() as u64,
        "workspace saved"
    );
    Ok(stored)
}

/// WS_COMMIT: the stored version becomes the head, or the task is recorded as
/// making none (`saved` says why); the workspace is no longer busy either way.
/// Waits for Redis as long as the worker runs. The version made, or why none
/// was.
pub(super) async fn commit(
    ctx: &Ctx,
    task_id: &str,
    workspace: (WorkspaceId, u64),
    saved: &mut Result<StoredVersion, String>,
) -> Result<u64, String> {
    let caps = ctx.workspaces.caps();
    let reply = match saved {
        Ok(stored) => {
            let committed = sweep::commit(
                &ctx.queue,
                &ctx.workspaces,
                &ctx.abort,
                task_id,
                workspace,
                stored,
                caps,
            )
            .await;
            match committed {
                Ok(Committed::Reply(reply)) => Ok(reply),
                Ok(Committed::SweptAway(why)) => {
                    tracing::info!(task_id, workspace = %workspace.0, "no workspace version: {why}");
                    return Err(why.to_owned());
                }
                Err(e) => Err(e),
            }
        }
        Err(why) => {
            let why: &str = why;
            retry::redis("commit the workspace version", &ctx.abort, || {
                ctx.queue
                    .ws_commit(task_id, workspace, Saved::Nothing(why), caps)
            })
            .await
        }
    };
    let (id, base) = workspace;
    let none = match reply {
        Ok(WsReply::Done(n)) if n > 0 => {
            tracing::info!(task_id, workspace = %id, base, version = n, "workspace version committed");
            return Ok(n);
        }
        Ok(WsReply::Done(_)) => match saved {
            Err(why) => why.clone(),
            Ok(_) => format!(
                "its owner's workspaces would hold more than their cap of {} bytes \
                 (WORKSPACE_OWNER_MAX_MB); delete_workspace ones no longer needed",
                caps.owner_max_bytes
            ),
        },
        Ok(WsReply::Refused { why, .. }) => {
            tracing::warn!(task_id, workspace = %id, refused = why.as_str(), "workspace version not committed");
            shared::scripts::WORKSPACE_TAKEN.to_owned()
        }
        Err(e) => {
            tracing::error!(task_id, workspace = %id, error = %e, "could not commit the workspace version");
            format!("the version could not be committed: {e}")
        }
    };
    tracing::info!(task_id, workspace = %id, base, "no workspace version: {none}");
    Err(none)
}
