//! A task's inputs made ready for its container: its zip extracted (into a new
//! directory, or the warm container's), its stdin, its collection pipe,
//! and its owner's dependency cache lent.

use std::path::PathBuf;

use shared::options::CacheUse;

use crate::cache::Lease;
use crate::collect::Collector;
use crate::ctx::Ctx;
use crate::queue::TaskSpec;
use crate::source;

/// What a task brings besides its command, ready for its container.
pub(super) struct Inputs {
    /// The extracted zip on the host: a new directory, or the warm container's.
    pub(super) source: Option<std::path::PathBuf>,
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
}

/// A warm container's host directories (not the container: its attached
/// streams are not `Sync`): its source directory, its collection pipe, and
/// its cache mount directory if it has one.
pub(super) struct WarmDirs {
    pub(super) source: PathBuf,
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
        let (warm_source, warm_fifo, warm_cache) = match warm {
            Some(w) => (Some(w.source), Some(w.fifo), Some(w.cache)),
            None => (None, None, None),
        };
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
                    tokio::task::spawn_blocking(move || {
                        source::prepare(&dir, &id, &zip, &limits)
                    })
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
