//! A task's inputs made ready for its container: its zip extracted (into a new
//! directory, or the warm container's), its stdin, its collection pipe,
//! and its owner's dependency cache lent.

use std::path::PathBuf;

use shared::options::CacheUse;

use crate::cache::Lease;
use crate::collect::Collector;
use crate::ctx::Ctx;
use crate::queue::TaskSpec;
use crate::retry;
use crate::source;
use crate::workspaces::WorkspaceError;
use shared::workspace::{Manifest, WorkspaceId};

/// What a task brings besides its command, ready for its container.
pub(super) struct Inputs {
    /// The extracted zip on the host: a new directory, or the warm container's.
    pub(super) source: Option<std::path::PathBuf>,
    /// The workspace version the task starts from, restored on the host (a
    /// new directory, or the warm container's), and its manifest; `None` for
    /// no workspace, or its empty version 0.
    pub(super) restored: Option<(PathBuf, Manifest)>,
    /// Whether `restored` is a directory of its own (a cold task's), removed
    /// with the task.
    pub(super) own_restore: bool,
    pub(super) stdin: Option<Vec<u8>>,
    pub(super) collector: Option<Collector>,
    /// The owner's dependency cache, lent to this task.
    pub(super) cache: Option<Lease>,
}

/// Why a task's inputs could not be made ready: the task fails with it, as
/// `Outcome::workspace_failed`.
#[derive(Debug, thiserror::Error)]
pub(super) enum InputError {
    #[error(transparent)]
    Extract(#[from] source::SourceError),
    #[error("extracting the task's zip stopped: {0}")]
    Extractor(#[from] tokio::task::JoinError),
    #[error("could not set up collect: {0}")]
    Collect(#[source] std::io::Error),
    #[error("could not restore the workspace: {0}")]
    Restore(#[from] WorkspaceError),
    #[error("the workspace could not be restored within {0:?}")]
    RestoreTimedOut(std::time::Duration),
    #[error("version {version} of workspace {id} is no longer kept")]
    VersionGone { id: WorkspaceId, version: u64 },
    #[error("could not read the workspace's version: {0}")]
    VersionRead(#[from] crate::queue::QueueError),
}

/// A warm container's host directories (not the container: its attached
/// streams are not `Sync`): its source directory, its collection pipe, and
/// its cache mount directory if it has one.
pub(super) struct WarmDirs {
    pub(super) source: PathBuf,
    pub(super) restore: PathBuf,
    pub(super) fifo: PathBuf,
    pub(super) cache: Option<PathBuf>,
}

impl Inputs {
    pub(super) async fn gather(
        ctx: &Ctx,
        task_id: &str,
        spec: &TaskSpec,
        warm: Option<WarmDirs>,
    ) -> Result<Inputs, InputError> {
        let (warm_source, warm_restore, warm_fifo, warm_cache) = match warm {
            Some(w) => (Some(w.source), Some(w.restore), Some(w.fifo), Some(w.cache)),
            None => (None, None, None, None),
        };
        let own_restore = warm_restore.is_none();
        let restored = restore(ctx, task_id, spec, warm_restore).await?;
        let source = if let Some(zip) = &spec.zip {
            let zip = zip.0.clone();
            let limits = ctx.config.zip_limits;
            let prepared = match warm_source {
                Some(dir) => {
                    tokio::task::spawn_blocking(move || {
                        source::fill(&dir, &zip, &limits).map(|()| dir)
                    })
                    .await
                }
                None => {
                    let (dir, id) = (ctx.config.tasks_dir.clone(), task_id.to_owned());
                    tokio::task::spawn_blocking(move || source::prepare(&dir, &id, &zip, &limits))
                        .await
                }
            };
            Some(prepared??)
        } else {
            None
        };
        let stdin = spec.stdin.as_ref().map(|s| s.0.to_vec());
        let collector = match (spec.collect.is_empty(), warm_fifo) {
            (true, _) => None,
            (false, Some(fifo)) => Some(Collector::open(fifo)),
            (false, None) => Some(
                Collector::start(&ctx.config.tasks_dir, task_id, &ctx.config.limits.user)
                    .await
                    .map_err(InputError::Collect)?,
            ),
        };
        // Last: nothing after it can fail, so a lent cache always reaches the
        // clean-up that gives it back.
        let cache = lend_cache(ctx, task_id, spec, warm_cache).await;
        Ok(Inputs {
            source,
            restored,
            own_restore,
            stdin,
            collector,
            cache,
        })
    }

    /// The task's environment: the variables pointing pip and npm at a lent
    /// cache (unless the task set them itself), then the task's own.
    pub(super) fn env(&self, spec: &TaskSpec) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = self
            .cache
            .as_ref()
            .map(Lease::env)
            .unwrap_or_default()
            .into_iter()
            .filter(|(name, _)| !spec.env.iter().any(|(n, _)| n == name))
            .collect();
        env.extend(spec.env.iter().cloned());
        env
    }
}

/// Restores the version a workspace task starts from (none for version 0)
/// into `warm` (the pool container's directory) or a new directory.
async fn restore(
    ctx: &Ctx,
    task_id: &str,
    spec: &TaskSpec,
    warm: Option<PathBuf>,
) -> Result<Option<(PathBuf, Manifest)>, InputError> {
    let Some((id, version)) = spec.workspace else {
        return Ok(None);
    };
    if version == 0 {
        return Ok(None);
    }
    let record = retry::redis("read the workspace version", &ctx.abort, || {
        ctx.queue.workspace_version(&id, version)
    })
    .await?
    .ok_or(InputError::VersionGone { id, version })?;
    let manifest = ctx.workspaces.manifest(&record.manifest).await?;
    let dir = match warm {
        Some(dir) => dir,
        None => {
            let dir = ctx.config.tasks_dir.join(format!("{task_id}.restore"));
            let made = dir.clone();
            tokio::task::spawn_blocking(move || {
                if made.symlink_metadata().is_ok() {
                    crate::source::remove(&made);
                }
                std::fs::create_dir(&made)?;
                std::fs::set_permissions(&made, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            })
            .await
            .map_err(|e| InputError::Restore(e.into()))?
            .map_err(|e| InputError::Restore(WorkspaceError::Restore(e)))?;
            dir
        }
    };
    let started = std::time::Instant::now();
    let deadline = std::time::Duration::from_millis(shared::workspace::SAVE_GRACE_MS / 2);
    tokio::time::timeout(deadline, ctx.workspaces.restore(&manifest, &dir))
        .await
        .map_err(|_| InputError::RestoreTimedOut(deadline))??;
    tracing::info!(
        task_id,
        workspace = %id,
        version,
        files = manifest.count(),
        bytes = manifest.bytes(),
        ms = started.elapsed().as_millis() as u64,
        "workspace restored"
    );
    Ok(Some((dir, manifest)))
}

/// Lends the task its owner's dependency cache, unless it opted out, the
/// worker keeps none, or another task of the owner holds it. A clear asked for
/// since the cache was made (`script-runner-ctl cache clear`) is applied first;
/// if Redis cannot say, the task runs without a cache rather than with one
/// that should have been cleared.
async fn lend_cache(
    ctx: &Ctx,
    task_id: &str,
    spec: &TaskSpec,
    warm_cache: Option<Option<PathBuf>>,
) -> Option<Lease> {
    if spec.cache == CacheUse::None || !ctx.caches.enabled() {
        return None;
    }
    let (mount, own_mount) = match warm_cache {
        Some(mount) => (mount?, false),
        None => (ctx.caches.cold_mount(task_id)?, true),
    };
    let owner_id = shared::cache::owner_id(&spec.owner);
    let current = match ctx.queue.cache_generations(&owner_id).await {
        Ok(g) => g,
        Err(e) => {
            tracing::warn!(task_id, error = %e, "could not read cache clears; no cache for this task");
            return None;
        }
    };
    ctx.caches.lend(&owner_id, current, mount, own_mount).await
}
