//! A `write_files` task: an edit of a workspace version, made by the worker
//! without a container. It takes the ordinary task path (SUBMIT made the
//! workspace busy with it, the claim, the signature, FINISH), so everything
//! that holds for a script's version holds for it: one writer per workspace,
//! the version stored whole before WS_COMMIT names it, and a worker lost
//! mid-edit leaves the head where it was.
//!
//! Why the worker and not the api: on one host the blob store is a directory
//! only the worker may write (the api's mount is read-only), and the sweep's
//! fence against deleting a save's blobs is the worker's (`sweep::epoch`).

use shared::task::Outcome;
use shared::workspace::{Manifest, SAVE_GRACE_MS, VersionLimits};

use super::keep;
use crate::ctx::Ctx;
use crate::queue::EditSpec;
use crate::retry;
use crate::workspaces::{StoredVersion, sweep};

/// Makes the edit and commits it; how the task ended.
pub(super) async fn run(ctx: &Ctx, task_id: &str, spec: &EditSpec) -> Outcome {
    let mut written = 0;
    let mut stored = store(ctx, spec)
        .await
        .map(|(stored, n)| {
            written = n;
            stored
        })
        .inspect_err(|why| tracing::info!(task_id, "files not written: {why}"));
    match keep::commit(ctx, task_id, spec.workspace, &mut stored).await {
        Ok(version) => Outcome::files_written(version, written, spec.deletes.len()),
        Err(why) => Outcome::files_not_written(why),
    }
}

/// The edited version, stored whole, and how many files it wrote; or why it
/// could not be made (a sentence for the client).
async fn store(ctx: &Ctx, spec: &EditSpec) -> Result<(StoredVersion, usize), String> {
    let (id, version) = spec.workspace;
    let base = match version {
        0 => Manifest::new(Vec::new(), ctx.workspaces.limits()).map_err(|e| e.to_string())?,
        _ => {
            let record = retry::redis("read the workspace version", &ctx.abort, || {
                ctx.queue.workspace_version(&id, version)
            })
            .await
            .map_err(|e| format!("could not read the version: {e}"))?
            .ok_or_else(|| format!("version {version} of workspace {id} is no longer kept"))?;
            // Uncapped: a version made under larger caps may still be edited
            // (a delete can bring it back under them); the edit's result is
            // held to today's caps.
            ctx.workspaces
                .store()
                .manifest(&record.manifest, VersionLimits::UNCAPPED)
                .await
                .map_err(|e| format!("could not read version {version}: {e}"))?
        }
    };
    // As a script's save: well within the save grace, after which the
    // workspace is another task's to take.
    let deadline = std::time::Duration::from_millis(SAVE_GRACE_MS / 2);
    let zip = spec.zip.as_ref().map(|z| z.0.clone());
    tokio::time::timeout(deadline, async {
        // Before any blob is checked: see `sweep`.
        let epoch = sweep::epoch(&ctx.queue, &ctx.abort).await?;
        ctx.workspaces
            .edit(&base, zip, &spec.deletes, epoch)
            .await
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|_| format!("the files could not be stored within {deadline:?}"))?
}
