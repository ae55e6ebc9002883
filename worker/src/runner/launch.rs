//! Starting a task (a new container, or a warm one's waiting prelude handed
//! the task) and removing what it used after it.

use std::time::Instant;

use shared::task::Outcome;

use shared::egress::AllowList;

use crate::cache::Lease;
use crate::ctx::Ctx;
use crate::egress::EgressLease;
use crate::pool::Warm;
use crate::sandbox::{ContainerSpec, SandboxError, TaskOutput};

/// A task, handed to its container (its own, or a warm one).
pub(super) struct Launched {
    pub(super) container: String,
    pub(super) output: TaskOutput,
    /// An allow-list task's standing with the egress proxy.
    pub(super) egress: Option<EgressLease>,
    /// Just before the handoff was written: nothing of the task ran earlier
    /// (what its CPU is bounded from when its end cannot be read).
    pub(super) handed_at: Instant,
}

/// A cold start: creates and starts the task's own container, then hands its
/// prelude the task, as a warm one's. On failure, the outcome and the
/// container to remove.
///
/// An allow-list task's container is known to the egress proxy by its address
/// before its prelude is handed the task, so its first connection is already
/// its own list's.
pub(super) async fn launch_cold(
    ctx: &Ctx,
    spec: &ContainerSpec<'_>,
    stdin: Option<Vec<u8>>,
    allow: Option<&AllowList>,
) -> Result<Launched, (Outcome, Option<String>)> {
    let sandbox = &ctx.sandbox;
    let (container, attached) = sandbox
        .create(spec)
        .await
        .map_err(|e| (Outcome::start_failed(e), None))?;
    let egress = match allow {
        None => None,
        Some(list) => match sandbox.egress_address(&container).await {
            Ok(ip) => Some(ctx.egress.lease(ip, spec.task_id, list.clone())),
            Err(e) => return Err((Outcome::start_failed(e), Some(container))),
        },
    };
    let handed_at = Instant::now();
    match sandbox
        .hand_off(&container, attached, spec, stdin, false)
        .await
    {
        Ok(output) => Ok(Launched {
            container,
            output,
            egress,
            handed_at,
        }),
        Err(e) => Err((Outcome::start_failed(e), Some(container))),
    }
}

/// A warm start: the pool container's prelude, waiting since the container
/// started, is handed the task. An allow-list task's lease is taken first, by
/// the address its egress pool container was given (as a cold one's is).
pub(super) async fn launch_warm(
    ctx: &Ctx,
    warm: &mut Warm,
    spec: &ContainerSpec<'_>,
    stdin: Option<Vec<u8>>,
    allow: Option<&AllowList>,
) -> Result<Launched, SandboxError> {
    let egress = match (allow, warm.egress) {
        (None, _) => None,
        // Another task holds the address: this container died idle and the
        // engine gave its address away. Nothing ran: a cold start instead.
        (Some(list), Some(ip)) => Some(
            ctx.egress
                .try_lease(ip, spec.task_id, list.clone())
                .ok_or(SandboxError::HandoffNotTaken)?,
        ),
        // Taken from the task bridge's pool: never run there.
        (Some(_), None) => return Err(SandboxError::HandoffNotTaken),
    };
    let attached = warm.attached.take().ok_or(SandboxError::HandoffNotTaken)?;
    let handed_at = Instant::now();
    let output = ctx
        .sandbox
        .hand_off(&warm.id, attached, spec, stdin, true)
        .await?;
    Ok(Launched {
        container: warm.id.clone(),
        output,
        egress,
        handed_at,
    })
}

/// A lent cache comes back only from a container known to be gone: the
/// worker walks it as root, and a task still running could change the tree
/// under the walk. Otherwise it is dropped unread.
pub(super) async fn return_cache(ctx: &Ctx, lease: Lease, container_gone: bool) {
    if container_gone {
        ctx.caches.give_back(lease).await;
    } else {
        ctx.caches.forfeit(lease).await;
    }
}

/// Removes an ended task's container and host files (its extracted zip, or the
/// warm container's directory). Runs in the background: the task's record does
/// not wait for it.
pub(super) async fn clean_up(
    ctx: Ctx,
    container: Option<String>,
    source: Option<std::path::PathBuf>,
    restored: Option<std::path::PathBuf>,
    warm: Option<Warm>,
    cache: Option<Lease>,
) {
    match (warm, container, cache) {
        (Some(warm), _, None) => ctx.pool.discard(warm).await,
        // The cache comes back once nothing of the task can run any more, and
        // before the directory it was lent into goes.
        (Some(warm), _, Some(lease)) => {
            let gone = ctx.sandbox.remove(&warm.id).await;
            return_cache(&ctx, lease, gone).await;
            crate::pool::remove_dir(warm.dir().to_path_buf()).await;
        }
        (None, Some(c), lease) => {
            let gone = ctx.sandbox.remove(&c).await;
            if let Some(lease) = lease {
                return_cache(&ctx, lease, gone).await;
            }
        }
        (None, None, lease) => {
            if let Some(lease) = lease {
                ctx.caches.give_back(lease).await;
            }
        }
    }
    // A warm container's source and restore directories went with its
    // directory.
    for dir in [source, restored].into_iter().flatten() {
        crate::pool::remove_dir(dir).await;
    }
}
