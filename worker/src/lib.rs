//! The script-runner worker: a consumer in the jobs stream's consumer group that
//! runs each task in its own container on this host's Docker engine and publishes
//! state and output tails back to the task's Redis hash.
//!
//! `run(config, shutdown)` is the whole worker; the binary only loads the config.

pub mod collect;
pub mod config;
pub mod firewall;
pub mod metrics;
pub mod pool;
pub mod queue;
pub mod reaper;
pub mod runner;
pub mod sandbox;
pub mod workspace;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use shared::TaskState;
use shared::task::{Outcome, Settlement};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use config::Config;
use queue::{Job, Queue, QueueError, TaskStateReply};
use runner::{Ctx, retry};
use sandbox::{Sandbox, SandboxError};

/// How long one blocking read of the stream waits for a job.
const READ_BLOCK: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error("task firewall: {0}")]
    Firewall(#[from] firewall::FirewallError),
    #[error(transparent)]
    Metrics(#[from] metrics::ServeError),
    #[error("TASKS_DIR {path}: {error}")]
    TasksDir { path: String, error: std::io::Error },
    #[error(transparent)]
    RedisSetup(#[from] support::redis_setup::SetupError),
}

/// The worker's capacity: `WORKER_CONCURRENCY` slots, and the runners holding them.
#[derive(Clone)]
pub struct Slots {
    free: Arc<Semaphore>,
    runners: TaskTracker,
    /// Stream entries a runner of this worker is working on right now, with their
    /// task ids; any other entry pending under this worker's name has been
    /// orphaned (see the reaper).
    held: Arc<std::sync::Mutex<HashMap<String, String>>>,
}

impl Slots {
    /// Waits for a free slot.
    async fn acquire(&self) -> Option<OwnedSemaphorePermit> {
        self.free.clone().acquire_owned().await.ok()
    }

    /// Runs `job` in the background, holding `permit` until it is done.
    fn spawn(&self, ctx: &Ctx, job: Job, permit: OwnedSemaphorePermit) {
        let ctx = ctx.clone();
        let held = self.held.clone();
        let entry = job.entry_id.clone();
        lock(&held).insert(entry.clone(), job.task_id.clone());
        self.runners.spawn(async move {
            runner::run_job(ctx, job).await;
            lock(&held).remove(&entry);
            drop(permit);
        });
    }

    /// Whether a runner of this worker holds stream entry `entry_id`.
    pub(crate) fn holds(&self, entry_id: &str) -> bool {
        lock(&self.held).contains_key(entry_id)
    }

    /// Whether a runner of this worker is running task `task_id` (from any entry).
    pub(crate) fn runs_task(&self, task_id: &str) -> bool {
        lock(&self.held).values().any(|t| t == task_id)
    }
}

/// The set is only touched for an insert, a remove or a lookup, never across an
/// await, so a poisoned lock can only mean a panic in one of those: keep going.
fn lock(
    held: &std::sync::Mutex<HashMap<String, String>>,
) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
    held.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs until `shutdown` resolves. Then it takes no new job, gives running tasks
/// `config.shutdown_grace` to finish, and kills (and records) the rest.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), WorkerError> {
    let stop = CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            shutdown.await;
            stop.cancel();
        }
    });
    let ctx = prepare(config, &stop).await?;
    let metrics_server = match ctx.config.metrics_addr {
        Some(addr) => Some(metrics::serve(addr, ctx.sandbox.metrics().clone()).await?),
        None => None,
    };
    let slots = Slots {
        free: Arc::new(Semaphore::new(ctx.config.concurrency)),
        runners: TaskTracker::new(),
        held: Arc::default(),
    };
    // Heartbeat first, so no reaper takes this worker for dead while it recovers;
    // and last, so none does while its tasks use their shutdown grace period.
    let heartbeat_stop = CancellationToken::new();
    let heartbeat = tokio::spawn(heartbeat(
        ctx.clone(),
        slots.clone(),
        heartbeat_stop.clone(),
    ));
    recover(&ctx, &stop).await?;
    let reaper = tokio::spawn(reaper::run(ctx.clone(), slots.clone(), stop.clone()));
    // Empties itself when `stop` fires; claimed containers are their runners'.
    let pool = tokio::spawn(ctx.pool.clone().run(stop.clone()));
    tracing::info!(worker = %ctx.queue.worker(), concurrency = ctx.config.concurrency, pool = ?ctx.config.pool.sizes, "worker started");

    take_jobs(&ctx, &slots, &stop).await;

    reaper.abort();
    drain(&ctx, &slots).await;
    let _ = pool.await;
    ctx.cleanups.close();
    ctx.cleanups.wait().await;
    heartbeat_stop.cancel();
    let _ = heartbeat.await;
    if let Some(server) = metrics_server {
        server.abort();
    }
    Ok(())
}

/// Everything a worker needs before it takes a job: its task files directory,
/// Redis, the Docker engine, the task network and firewall, the consumer group.
async fn prepare(mut config: Config, stop: &CancellationToken) -> Result<Ctx, WorkerError> {
    config.tasks_dir = prepare_tasks_dir(&config.tasks_dir).await?;
    let queue = Queue::new(
        &config.redis_url,
        config.keys.clone(),
        config.worker_name.clone(),
    )?;
    let sandbox = Sandbox::connect(config.limits.clone(), config.worker_name.clone()).await?;
    sandbox.ensure_network().await?;
    if config.limits.firewall {
        firewall::install(
            &config.limits.bridge,
            &config.limits.blocked_cidrs,
            &config.redis_url,
        )
        .await?;
        sandbox.metrics().set_firewall(true);
    } else {
        sandbox.metrics().set_firewall(false);
        tracing::warn!("TASK_FIREWALL=off: tasks can reach this host and its private networks");
    }
    // A wrong password, a missing permission or an untrusted certificate does not
    // heal by waiting: stop with the reason instead of retrying forever.
    if let Err(e) = queue.ensure_group().await
        && let Some(why) = e.misconfiguration()
    {
        tracing::error!(error = %e, "{why}");
        return Err(e.into());
    }
    // Waits for Redis if it is not up yet (a SIGTERM meanwhile ends the wait).
    retry("create consumer group", stop, || queue.ensure_group()).await?;
    // Before taking any job: a Redis that evicts keys or keeps nothing on disk
    // loses tasks (see support::redis_setup).
    tokio::select! {
        r = support::redis_setup::check_until_answered(
            &config.redis_url,
            config.redis_setup_check,
            Duration::from_secs(2),
        ) => r?,
        _ = stop.cancelled() => {}
    }
    let pool = pool::Pool::new(
        sandbox.clone(),
        config.pool.clone(),
        &config.tasks_dir,
        &config.worker_name,
    );
    Ok(Ctx {
        queue,
        sandbox,
        config: Arc::new(config),
        abort: CancellationToken::new(),
        pool,
        cleanups: TaskTracker::new(),
    })
}

/// Reads jobs and hands each to a runner, until `stop`. A job is read only with a
/// free slot: jobs wait in the stream, where any other worker with room can take
/// them (backpressure).
async fn take_jobs(ctx: &Ctx, slots: &Slots, stop: &CancellationToken) {
    let queue = &ctx.queue;
    let mut conn = None;
    while !stop.is_cancelled() {
        let permit = tokio::select! {
            p = slots.acquire() => match p { Some(p) => p, None => break },
            _ = stop.cancelled() => break,
        };
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match queue.blocking_connection(READ_BLOCK).await {
                Ok(c) => conn.insert(c),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot connect to Redis; retrying");
                    pause(stop).await;
                    continue;
                }
            },
        };
        let jobs = tokio::select! {
            r = queue.read_jobs(c, 1, READ_BLOCK, false) => r,
            _ = stop.cancelled() => break,
        };
        match jobs {
            Ok(jobs) => {
                if let Some(job) = jobs.into_iter().next() {
                    slots.spawn(ctx, job, permit);
                }
            }
            Err(e) if e.is_no_group() => {
                // Redis lost its data (or the group was deleted): make it again.
                tracing::warn!("the consumer group is gone; creating it again");
                if let Err(e) = queue.ensure_group().await {
                    tracing::warn!(error = %e, "could not create the consumer group");
                    pause(stop).await;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the jobs stream failed; reconnecting");
                conn = None;
                pause(stop).await;
            }
        }
    }
}

/// Gives running tasks the shutdown grace period, then kills (and records) the rest.
async fn drain(ctx: &Ctx, slots: &Slots) {
    let grace = ctx.config.shutdown_grace;
    tracing::info!(
        running = slots.runners.len(),
        grace_seconds = grace.as_secs(),
        "worker stopping"
    );
    slots.runners.close();
    if tokio::time::timeout(grace, slots.runners.wait())
        .await
        .is_err()
    {
        ctx.abort.cancel();
        slots.runners.wait().await;
    }
}

async fn pause(stop: &CancellationToken) {
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        _ = stop.cancelled() => {}
    }
}

/// After a crash or restart: remove this worker's leftover containers, and settle
/// the jobs it had read but not acknowledged. A job that cannot be settled now
/// stays pending under this worker, and the reaper's orphan pass takes it later.
async fn recover(ctx: &Ctx, stop: &CancellationToken) -> Result<(), WorkerError> {
    let me = ctx.queue.worker().to_owned();
    let orphans = remove_leftovers_of(ctx, &me, None).await?;
    if orphans > 0 {
        tracing::warn!(
            orphans,
            "removed task and pool containers left by a previous run"
        );
    }
    let pending = retry("read this worker's pending jobs", stop, || async {
        let mut conn = ctx.queue.blocking_connection(READ_BLOCK).await?;
        ctx.queue
            .read_jobs(&mut conn, 10_000, READ_BLOCK, true)
            .await
    })
    .await?;
    for job in pending {
        settle_or_log(ctx, job, Outcome::worker_restarted()).await;
    }
    Ok(())
}

/// Removes every container worker `owner` left on this host (task and warm pool
/// containers alike: all carry its label) and the pool directories of those;
/// how many containers there were. `created_before`: see
/// `Sandbox::remove_containers_of` (`None` at this worker's own start, when its
/// whole pool directory is stale).
pub(crate) async fn remove_leftovers_of(
    ctx: &Ctx,
    owner: &str,
    created_before: Option<i64>,
) -> Result<usize, SandboxError> {
    let removed = ctx
        .sandbox
        .remove_containers_of(owner, created_before)
        .await?;
    let root = pool::pool_root(&ctx.config.tasks_dir, owner);
    match created_before {
        None => pool::remove_dir(root).await,
        // A new process of that name may keep its own pool there by now.
        Some(_) => {
            for name in removed.iter().filter(|n| n.starts_with("sr-pool-")) {
                pool::remove_dir(root.join(name)).await;
            }
        }
    }
    Ok(removed.len())
}

/// `settle`, logging a failure instead of returning it, so one bad job does not
/// hold up the others (it stays pending, and is tried again later).
pub(crate) async fn settle_or_log(ctx: &Ctx, job: Job, lost: Outcome) {
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
        let _ = tokio::task::spawn_blocking(move || workspace::remove(&src)).await;
        ctx.queue.ack(&job.entry_id).await?;
    }
    Ok(())
}

async fn heartbeat(ctx: Ctx, slots: Slots, stop: CancellationToken) {
    let ttl = ctx.config.heartbeat_ttl;
    let host = host_name();
    let version = env!("CARGO_PKG_VERSION");
    let metrics = ctx.sandbox.metrics();
    metrics.set_identity(ctx.queue.worker(), &host, version, ctx.config.concurrency);
    let mut every = tokio::time::interval(ttl / 3);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = stop.cancelled() => return,
        }
        // The runners, not the used slots: the job reader holds a slot during
        // every blocking read, so an idle worker would count one.
        let beat = shared::keys::Heartbeat {
            running: slots.runners.len() as u64,
            slots: Some(ctx.config.concurrency as u64),
            host: Some(host.clone()),
            version: Some(version.to_owned()),
            ttl_seconds: Some(ttl.as_secs()),
        };
        if let Err(e) = ctx.queue.heartbeat(ttl, &beat).await {
            tracing::warn!(error = %e, "heartbeat failed");
        }
    }
}

/// This host's name, for ops (the heartbeat, the metrics).
fn host_name() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

async fn prepare_tasks_dir(dir: &std::path::Path) -> Result<std::path::PathBuf, WorkerError> {
    let d = dir.to_path_buf();
    let r = tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(&d)?;
        // Absolute, because Docker bind mounts need a host path.
        std::fs::canonicalize(&d)
    })
    .await
    .map_err(std::io::Error::other)
    .and_then(|r| r);
    r.map_err(|error| WorkerError::TasksDir {
        path: dir.display().to_string(),
        error,
    })
}
