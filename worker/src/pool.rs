//! The warm pool: per runtime, `POOL_SIZE` containers created and started ahead
//! of time with the exact hardening of a cold task's, their prelude waiting on
//! the attached stdin until a task claims one. A claimed container runs that
//! one task (handed to its prelude, as a cold container's is) and is removed
//! after it: never reused. The pool refills in the background.
//!
//! What a running container cannot get later, it gets at creation: its source
//! directory (`TASKS_DIR/pool-<worker>/<name>/src`, empty until a task with a
//! zip claims it and the worker extracts the zip there) and its collection pipe
//! are mounted ahead of time.
//!
//! There is a pool per runtime and network: `POOL_SIZE` on the task bridge for
//! `internet` tasks, `EGRESS_POOL_SIZE` on the egress network for allow-list
//! tasks (whose proxy lease is taken at the claim, by the container's address,
//! read when it was made: until then the proxy knows the address for no task
//! and refuses it everything). A `network: "none"` task must not run in a
//! container that was started with a network, so it always gets a cold one.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use shared::options::Network;
use shared::{RuntimeName, WorkerName};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::PoolConfig;
use crate::sandbox::{Attached, Sandbox, WarmSpec, pool_container_name};

/// The longest wait before trying again when a pool container could not be made.
const RETRY_MAX: Duration = Duration::from_secs(60);

/// How long to wait before trying again when a pool container could not be made
/// (a missing image, a busy engine): 2 s, doubled at each failure in a row, up
/// to `RETRY_MAX`.
fn retry_schedule() -> ExponentialBackoff {
    ExponentialBuilder::new()
        .with_min_delay(Duration::from_secs(2))
        .with_max_delay(RETRY_MAX)
        .without_max_times()
        .build()
}

/// A started, idle container, waiting for one task.
#[derive(Debug)]
pub struct Warm {
    /// The container's id.
    pub id: String,
    pub image: String,
    /// On the egress network: its address there, which the claiming task's
    /// proxy lease names. `None` on the task bridge.
    pub egress: Option<IpAddr>,
    /// Its streams, attached since before it started: the handoff goes to its
    /// prelude through them. Taken at the handoff.
    pub attached: Option<Attached>,
    /// Its host directory: `src/` (mounted at the source mount) and the pipe.
    dir: PathBuf,
    /// Whether it has a cache mount directory.
    cache: bool,
    born: Instant,
}

impl Warm {
    /// Where a claiming task's zip is extracted (the container sees it read-only).
    pub fn source(&self) -> PathBuf {
        self.dir.join("src")
    }

    /// Where a claiming workspace task's version is restored (read-only in
    /// the container too).
    pub fn restore(&self) -> PathBuf {
        self.dir.join("restore")
    }

    /// The collection pipe, mounted in the container.
    pub fn fifo(&self) -> PathBuf {
        self.dir.join("collect")
    }

    /// Mounted at the cache mount: a claiming task's dependency cache is lent
    /// into it (`cache.rs`). `None` when the worker keeps no caches.
    pub fn cache_mount(&self) -> Option<PathBuf> {
        self.cache.then(|| self.dir.join("cache"))
    }

    /// Its host directory, removed with the container.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// One pool: a runtime on a network (`Internet` or `Allow`).
type PoolKey = (RuntimeName, Network);

/// The warm pool of one worker. Clones share it.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    sandbox: Sandbox,
    config: PoolConfig,
    /// `TASKS_DIR/pool-<worker>`: every pool container's host directory.
    root: PathBuf,
    idle: Mutex<HashMap<PoolKey, VecDeque<Warm>>>,
    /// Woken when a container was taken.
    taken: Notify,
    /// Whether containers get a cache mount directory.
    caches: bool,
}

impl Pool {
    pub fn new(
        sandbox: Sandbox,
        config: PoolConfig,
        tasks_dir: &Path,
        worker: &WorkerName,
        caches: bool,
    ) -> Pool {
        Pool {
            inner: Arc::new(Inner {
                sandbox,
                config,
                root: pool_root(tasks_dir, worker),
                idle: Mutex::default(),
                taken: Notify::new(),
                caches,
            }),
        }
    }

    /// Whether any runtime has a pool.
    pub fn enabled(&self) -> bool {
        !self.inner.config.sizes.is_empty()
    }

    /// Takes an idle container of `runtime` on `network`, if there is one
    /// young enough; the refill starts at once. `None` means: start a cold one.
    /// Pool containers run this worker's catalogue image for their runtime
    /// (`PoolConfig::parse` takes it from the catalogue), the one a task of
    /// that runtime runs in.
    pub fn take(&self, runtime: &RuntimeName, network: Network) -> Option<Warm> {
        let inner = &self.inner;
        let key = (runtime.clone(), network);
        let warm = {
            let mut idle = inner.lock();
            let queue = idle.get_mut(&key)?;
            // Oldest first, so none ages out unused while younger ones serve;
            // one past its age is left for the refill loop to replace.
            let fresh = queue
                .iter()
                .position(|w| w.born.elapsed() < inner.config.max_age)?;
            let warm = queue.remove(fresh);
            inner.sandbox.metrics().set_pool_idle(&key, queue.len());
            warm
        };
        inner.taken.notify_one();
        warm
    }

    /// Keeps every runtime's pool full and young until `stop`, then removes the
    /// idle containers.
    pub async fn run(self, stop: CancellationToken) {
        if !self.enabled() {
            return;
        }
        let inner = &self.inner;
        // After failures in a row: the schedule, when the last one was, and how
        // long to wait after it.
        let mut failed: Option<(ExponentialBackoff, Instant, Duration)> = None;
        while !stop.is_cancelled() {
            self.replace_old().await;
            let backing_off = failed
                .as_ref()
                .is_some_and(|(_, at, wait)| at.elapsed() < *wait);
            if !backing_off && let Some((key, image)) = self.next_missing() {
                if self.add(&key, &image, &stop).await {
                    failed = None;
                } else {
                    let mut schedule = failed.take().map_or_else(retry_schedule, |(s, ..)| s);
                    let wait = schedule.next().unwrap_or(RETRY_MAX);
                    tracing::warn!(
                        runtime = %key.0,
                        network = %key.1,
                        image,
                        "pool container not made; next try in {wait:?}"
                    );
                    failed = Some((schedule, Instant::now(), wait));
                }
                continue;
            }
            // Full (or backing off): wait for a take, the next container to age
            // out, or the end of the back-off.
            let mut wait = self.next_expiry().unwrap_or(inner.config.max_age);
            if let Some((_, at, back_off)) = &failed {
                wait = wait.min(back_off.saturating_sub(at.elapsed()));
            }
            tokio::select! {
                _ = inner.taken.notified() => {}
                _ = tokio::time::sleep(wait) => {}
                _ = stop.cancelled() => {}
            }
        }
        self.clear().await;
    }

    /// The first pool short of its size, and its image.
    fn next_missing(&self) -> Option<(PoolKey, String)> {
        let idle = self.inner.lock();
        self.inner
            .config
            .sizes
            .iter()
            .map(|t| ((t.runtime.clone(), t.network), t))
            .find(|(key, t)| idle.get(key).map_or(0, VecDeque::len) < t.size)
            .map(|(key, t)| (key, t.image.clone()))
    }

    /// How long until the oldest idle container reaches its age.
    fn next_expiry(&self) -> Option<Duration> {
        let max_age = self.inner.config.max_age;
        self.inner
            .lock()
            .values()
            .flatten()
            .map(|w| max_age.saturating_sub(w.born.elapsed()))
            .min()
    }

    /// Creates and starts one container for the pool `key`. False if it could
    /// not be made (logged).
    async fn add(&self, key: &PoolKey, image: &str, stop: &CancellationToken) -> bool {
        let (runtime, network) = key;
        let inner = &self.inner;
        let name = pool_container_name();
        let dir = inner.root.join(&name);
        let made = {
            let dir = dir.clone();
            let owner = crate::source::parse_owner(&inner.sandbox.limits().user);
            let cache = inner.caches;
            tokio::task::spawn_blocking(move || make_dir(&dir, owner, cache)).await
        };
        if let Err(e) = made.map_err(std::io::Error::other).and_then(|r| r) {
            tracing::warn!(dir = %dir.display(), error = %e, "could not make a pool container's directory");
            return false;
        }
        let cache_dir = inner.caches.then(|| dir.join("cache"));
        let spec = WarmSpec {
            name: &name,
            runtime: runtime.as_str(),
            image,
            source: &dir.join("src"),
            restore: &dir.join("restore"),
            fifo: &dir.join("collect"),
            cache: cache_dir.as_deref(),
            network: *network,
        };
        let made = match inner.sandbox.create_warm(&spec).await {
            // Its address on the egress network, read once here rather than
            // at every claim (an inspect, a few ms on the task's path).
            Ok((id, attached)) if *network == Network::Allow => {
                match inner.sandbox.egress_address(&id).await {
                    Ok(ip) => Ok((id, attached, Some(ip))),
                    Err(e) => {
                        inner.sandbox.remove(&id).await;
                        Err(e)
                    }
                }
            }
            Ok((id, attached)) => Ok((id, attached, None)),
            Err(e) => Err(e),
        };
        match made {
            Ok((id, attached, egress)) => {
                let warm = Warm {
                    id,
                    image: image.to_owned(),
                    egress,
                    attached: Some(attached),
                    dir,
                    cache: inner.caches,
                    born: Instant::now(),
                };
                if stop.is_cancelled() {
                    // Shutting down meanwhile: it would never be used.
                    self.discard(warm).await;
                    return true;
                }
                let mut idle = inner.lock();
                let queue = idle.entry(key.clone()).or_default();
                queue.push_back(warm);
                inner.sandbox.metrics().set_pool_idle(key, queue.len());
                true
            }
            Err(e) => {
                tracing::warn!(%runtime, %network, image, error = %e, "could not start a pool container");
                remove_dir(dir).await;
                false
            }
        }
    }

    /// Removes idle containers that reached `POOL_MAX_AGE_SECONDS`.
    async fn replace_old(&self) {
        let max_age = self.inner.config.max_age;
        let old: Vec<Warm> = {
            let mut idle = self.inner.lock();
            let mut old = Vec::new();
            for (key, queue) in idle.iter_mut() {
                let (keep, expired): (VecDeque<Warm>, VecDeque<Warm>) =
                    queue.drain(..).partition(|w| w.born.elapsed() < max_age);
                *queue = keep;
                self.inner.sandbox.metrics().set_pool_idle(key, queue.len());
                old.extend(expired);
            }
            old
        };
        for warm in old {
            tracing::debug!(container = %warm.id, "replacing a pool container that waited too long");
            self.discard(warm).await;
        }
    }

    /// Removes every idle container (the worker is stopping).
    async fn clear(&self) {
        let all: Vec<Warm> = {
            let mut idle = self.inner.lock();
            for (key, queue) in idle.iter() {
                if !queue.is_empty() {
                    self.inner.sandbox.metrics().set_pool_idle(key, 0);
                }
            }
            idle.drain().flat_map(|(_, q)| q).collect()
        };
        let n = all.len();
        for warm in all {
            self.discard(warm).await;
        }
        if n > 0 {
            tracing::info!(removed = n, "warm pool emptied");
        }
    }

    /// Removes a container and its host directory.
    pub async fn discard(&self, warm: Warm) {
        self.inner.sandbox.remove(&warm.id).await;
        remove_dir(warm.dir).await;
    }
}

impl Inner {
    /// Only held for a lookup or a push, never across an await.
    fn lock(&self) -> MutexGuard<'_, HashMap<PoolKey, VecDeque<Warm>>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Where worker `worker`'s pool containers keep their host directories: a
/// `WorkerName`, so one directory of `tasks_dir`.
pub fn pool_root(tasks_dir: &Path, worker: &WorkerName) -> PathBuf {
    tasks_dir.join(format!("pool-{worker}"))
}

/// Removes a pool directory (after its container), never following a link.
pub async fn remove_dir(dir: PathBuf) {
    let _ = tokio::task::spawn_blocking(move || crate::source::remove(&dir)).await;
}

/// A pool container's host directory (the worker's alone, 0700): `src/` and
/// `restore/`, readable by the task's user (the container reaches it through its mount, not
/// through this directory), the collection pipe, the task user's (`owner`),
/// and with caches `cache/`, the worker's (so the task cannot replace the
/// cache lent into it).
fn make_dir(dir: &Path, owner: Option<(u32, u32)>, cache: bool) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let src = dir.join("src");
    std::fs::create_dir_all(&src)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o755))?;
    let restore = dir.join("restore");
    std::fs::create_dir(&restore)?;
    std::fs::set_permissions(&restore, std::fs::Permissions::from_mode(0o755))?;
    if cache {
        let cache = dir.join("cache");
        std::fs::create_dir(&cache)?;
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o755))?;
    }
    crate::collect::make_fifo(&dir.join("collect"), owner)
}
