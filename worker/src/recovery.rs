//! Settling jobs that were read but never finished: this worker's own after a
//! restart (`recover`, at start), and a dead worker's or an orphaned entry's (the
//! reaper, through `settle_or_log`). How each ends is `Settlement::decide`'s
//! rule; this module gathers what it needs and carries it out.

use std::time::Duration;

use shared::task::{Outcome, Settlement};
use shared::{TaskState, WorkerName};
use tokio_util::sync::CancellationToken;

use crate::ctx::Ctx;
use crate::pool;
use crate::queue::{Job, QueueError, TaskStateReply};
use crate::retry;
use crate::sandbox::{POOL_CONTAINER_PREFIX, SandboxError};
use crate::source;

/// The reply timeout of the read of this worker's pending entries, less 5 s
/// (see `Queue::blocking_connection`; that read does not block).
const PENDING_READ: Duration = Duration::from_secs(2);

/// After a crash or restart: remove this worker's leftover containers, and settle
/// the jobs it had read but not acknowledged. A job that cannot be settled now
/// stays pending under this worker, and the reaper's orphan pass takes it later.
/// Waits for Redis until `stop`.
pub async fn recover(ctx: &Ctx, stop: &CancellationToken) -> Result<(), RecoveryError> {
    let orphans = remove_leftovers_of(ctx, &ctx.config.worker_name, None).await?;
    if orphans > 0 {
        tracing::warn!(
            orphans,
            "removed task and pool containers left by a previous run"
        );
    }
    let pending = retry::redis("read this worker's pending jobs", stop, || async {
        let mut conn = ctx.queue.blocking_connection(PENDING_READ).await?;
        ctx.queue
            .read_jobs(&mut conn, 10_000, PENDING_READ, true)
            .await
    })
    .await?;
    for job in pending {
        settle_or_log(ctx, job, Outcome::worker_restarted()).await;
    }
    Ok(())
}

/// Why `recover` could not finish.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    #[error("could not remove the containers of a previous run: {0}")]
    Sandbox(#[from] SandboxError),
    #[error("could not read this worker's pending jobs: {0}")]
    Queue(#[from] QueueError),
}

/// Removes every container worker `owner` left on this host (task and warm pool
/// containers alike: all carry its label) and the pool directories of those;
/// how many containers there were. `created_before`: see
/// `Sandbox::remove_containers_of` (`None` at this worker's own start, when its
/// whole pool directory is stale).
pub async fn remove_leftovers_of(
    ctx: &Ctx,
    owner: &WorkerName,
    created_before: Option<i64>,
) -> Result<usize, SandboxError> {
    let removed = ctx
        .sandbox
        .remove_containers_of(owner.as_str(), created_before)
        .await?;
    let root = pool::pool_root(&ctx.config.tasks_dir, owner);
    match created_before {
        None => pool::remove_dir(root).await,
        // A new process of that name may keep its own pool there by now.
        Some(_) => {
            for name in removed
                .iter()
                .filter(|n| n.starts_with(POOL_CONTAINER_PREFIX))
            {
                pool::remove_dir(root.join(name)).await;
            }
        }
    }
    Ok(removed.len())
}

/// `settle`, logging a failure instead of returning it, so one bad job does not
/// hold up the others (it stays pending, and is tried again later).
pub async fn settle_or_log(ctx: &Ctx, job: Job, lost: Outcome) {
    let (task_id, entry) = (job.task_id.clone(), job.entry_id.clone());
    if let Err(e) = settle(ctx, job, lost).await {
        tracing::warn!(%task_id, %entry, error = %e, "could not settle a job; it stays pending");
    }
}

/// Settles a job that was read but never finished (by this worker before a
/// restart, or by a dead one), as `Settlement::decide` rules: a queued task goes
/// back to the stream, a running one whose holder is gone ends with `lost`
/// (written as the worker recorded as holding it), an ended one is only
/// acknowledged.
///
/// The entry is acknowledged only once the task is final or requeued, so a
/// failure here leaves it pending for the next try.
async fn settle(ctx: &Ctx, job: Job, lost: Outcome) -> Result<(), QueueError> {
    let (state, owner) = match ctx.queue.state_and_owner(&job.task_id).await {
        Ok(found) => found,
        // A record nothing can make sense of: drop the job, or it would come
        // back on every pass.
        Err(e @ QueueError::Corrupt(..)) => {
            tracing::error!(task_id = %job.task_id, error = %e, "job dropped: its task record is malformed");
            return ctx.queue.ack(&job.entry_id).await;
        }
        Err(e) => return Err(e),
    };
    let state = match state {
        TaskStateReply::State(s) => Some(s),
        TaskStateReply::Missing | TaskStateReply::NotOwner => None,
    };
    let owner = owner.as_deref();
    let alive_elsewhere = match owner {
        Some(o) if state == Some(TaskState::Running) && o != ctx.queue.worker() => {
            ctx.queue.is_alive(o).await?
        }
        _ => false,
    };
    let ended = match Settlement::decide(state, owner, alive_elsewhere, lost) {
        Settlement::Requeue => {
            ctx.queue.requeue(&job).await?;
            return Ok(());
        }
        Settlement::LeaveToOwner => {
            tracing::info!(task_id = %job.task_id, ?owner, "task is held by a live worker; left to it");
            return Ok(());
        }
        Settlement::Finish { owner, outcome } => {
            let reply = ctx
                .queue
                .finish_for(&job.task_id, &owner, &outcome, ctx.config.retention_seconds)
                .await?;
            tracing::warn!(task_id = %job.task_id, ?reply, reason = %outcome.reason, "in-flight task settled");
            matches!(reply, TaskStateReply::State(s) if s.is_terminal())
        }
        Settlement::Ack => true,
    };
    if ended {
        // Whatever was extracted for this task is stale.
        let src = ctx.config.tasks_dir.join(&job.task_id);
        let _ = tokio::task::spawn_blocking(move || source::remove(&src)).await;
        ctx.queue.ack(&job.entry_id).await?;
    }
    Ok(())
}
