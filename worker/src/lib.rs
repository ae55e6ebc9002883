//! The script-runner worker: a consumer in the jobs stream's consumer group that
//! runs each task in its own container on this host's Docker engine and publishes
//! state and output tails back to the task's Redis hash.
//!
//! `run(config, shutdown)` is the whole worker; the binary only loads the config.
//! This file is its start-up, its main loop (reading jobs into free slots) and
//! its shutdown; each part it starts lives in a module of its own.

pub mod cache;
pub mod collect;
pub mod config;
pub mod ctx;
pub mod egress;
pub mod firewall;
pub mod heartbeat;
pub mod metrics;
pub mod pool;
pub mod queue;
pub mod reaper;
pub mod recovery;
pub mod retry;
pub mod runner;
pub mod sandbox;
pub mod slots;
pub mod source;
pub mod workspaces;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use backon::RetryableWithContext;
use store::redis_pool::Pooled;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use config::Config;
use ctx::Ctx;
use queue::{Job, Queue, QueueError};
use sandbox::{Sandbox, SandboxError};
use slots::Slots;

/// How long one blocking read of the stream waits for a job.
const READ_BLOCK: Duration = Duration::from_secs(2);
/// How often a worker whose firewall is not in place tries to reinstall it.
const FIREWALL_RETRY: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error("cannot start the egress proxy on {0}: {1}")]
    EgressProxy(std::net::Ipv4Addr, std::io::Error),
    #[error("task firewall: {0}")]
    Firewall(#[from] firewall::FirewallError),
    #[error(transparent)]
    Metrics(#[from] metrics::ServeError),
    #[error("TASKS_DIR {path}: {error}")]
    TasksDir { path: String, error: std::io::Error },
    #[error(transparent)]
    RedisSetup(#[from] store::redis_setup::SetupError),
    #[error("restart recovery: {0}")]
    Recovery(#[from] recovery::RecoveryError),
    #[error("the workspace store: {0}")]
    Workspaces(#[from] blobs::BlobError),
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
    let slots = Slots::new(ctx.config.concurrency);
    // Heartbeat first, so no reaper takes this worker for dead while it recovers;
    // and last, so none does while its tasks use their shutdown grace period.
    let heartbeat_stop = CancellationToken::new();
    let heartbeat = tokio::spawn(heartbeat::run(
        ctx.clone(),
        slots.clone(),
        heartbeat_stop.clone(),
    ));
    recovery::recover(&ctx, &stop).await?;
    ctx.caches.drop_stale().await;
    let reaper = tokio::spawn(reaper::run(ctx.clone(), slots.clone(), stop.clone()));
    let every = ctx.workspaces.sweep_every();
    let sweeper = (!every.is_zero()).then(|| {
        // Blobs younger than the save grace may be a save's still: never swept.
        let min_age = Duration::from_millis(shared::workspace::SAVE_GRACE_MS);
        let sweeper = workspaces::sweep::Sweeper::new(
            ctx.queue.clone(),
            &ctx.workspaces,
            min_age,
            every,
            stop.clone(),
        );
        tokio::spawn(sweeper.run())
    });
    // Empties itself when `stop` fires; claimed containers are their runners'.
    let pool = tokio::spawn(ctx.pool.clone().run(stop.clone()));
    let spec_keys: Vec<String> = ctx
        .config
        .verifier
        .key_ids()
        .iter()
        .map(|k| k.to_string())
        .collect();
    tracing::info!(worker = %ctx.queue.worker(), concurrency = ctx.config.concurrency, pool = ?ctx.config.pool.sizes, ?spec_keys, "worker started");

    take_jobs(&ctx, &slots, &stop).await;

    reaper.abort();
    drain(&ctx, &slots).await;
    if let Some(mut sweeper) = sweeper {
        // Told by `stop`, a delete phase ends after its batch (saves on every
        // host wait for it); one stuck longer is left to its lease.
        if tokio::time::timeout(Duration::from_secs(30), &mut sweeper)
            .await
            .is_err()
        {
            sweeper.abort();
        }
    }
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
    let redis = store::redis_pool::target(&config.redis)
        .await
        .map_err(QueueError::from)?;
    let queue = Queue::new(
        &redis,
        config.keys.clone(),
        config.worker_name.to_string(),
        config.redis.replica_ack,
    )?;
    let sandbox = Sandbox::connect(config.limits.clone(), config.worker_name.to_string()).await?;
    sandbox.ensure_network().await?;
    let pattern = tokio::fs::read_to_string("/proc/sys/kernel/core_pattern").await;
    if let Some(helper) = pattern.as_deref().ok().and_then(sandbox::core_dump_helper) {
        tracing::warn!(
            helper,
            "kernel.core_pattern pipes crashes to a helper: the kernel starts it as root for \
             a crash inside a task too (tasks' core limit is 0, so systemd-coredump stores \
             nothing); set kernel.core_pattern to a file name to start no helper"
        );
    }
    // Allow-list tasks' only way out (see `egress`): it listens on the egress
    // bridge's gateway, and lives as long as tasks may run.
    let abort = CancellationToken::new();
    let gateway = sandbox.ensure_egress_network().await?;
    let refusals = firewall::Refusals::read(&config.limits.blocked_cidrs, &redis).await?;
    let policy = egress::Policy {
        ports: config.egress.ports.clone(),
        blocked: refusals.clone(),
        resolver: config.egress.resolver.clone(),
    };
    let egress = egress::EgressProxy::start(
        gateway.into(),
        config.egress.proxy_ports.clone(),
        policy,
        sandbox.metrics().clone(),
        abort.clone(),
    )
    .await
    .map_err(|e| WorkerError::EgressProxy(gateway, e))?;
    let firewall = if config.limits.firewall {
        let door = firewall::EgressDoor {
            bridge: &config.limits.egress_bridge,
            gateway,
            ports: config.egress.proxy_ports.clone(),
        };
        let firewall = firewall::install(
            &config.limits.bridge,
            &refusals,
            Some(door),
            sandbox.metrics().clone(),
        )
        .await?;
        sandbox.metrics().set_firewall(true);
        Some(firewall)
    } else {
        sandbox.metrics().set_firewall(false);
        tracing::warn!("TASK_FIREWALL=off: tasks can reach this host and its private networks");
        None
    };
    // A wrong password, a missing permission or an untrusted certificate does not
    // heal by waiting: stop with the reason instead of retrying forever.
    if let Err(e) = queue.ensure_group().await
        && let Some(why) = e.misconfiguration()
    {
        tracing::error!(error = %e, "{why}");
        return Err(e.into());
    }
    // Waits for Redis if it is not up yet (a SIGTERM meanwhile ends the wait).
    retry::redis("create consumer group", stop, || queue.ensure_group()).await?;
    // Before taking any job: a Redis that evicts keys or keeps nothing on disk
    // loses tasks (see store::redis_setup).
    tokio::select! {
        r = store::redis_setup::check_until_answered(
            &redis,
            config.redis_setup_check,
            Duration::from_secs(2),
        ) => r?,
        _ = stop.cancelled() => {}
    }
    let caches = {
        let (dir, worker, cfg, user) = (
            config.tasks_dir.clone(),
            config.worker_name.clone(),
            config.cache,
            config.limits.user.clone(),
        );
        let metrics = sandbox.metrics().clone();
        tokio::task::spawn_blocking(move || cache::Caches::open(&dir, &worker, cfg, &user, metrics))
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r)
            .unwrap_or_else(|e| {
                // A cache only saves time: without one, tasks still run.
                tracing::warn!(error = %e, "dependency caches unavailable; tasks run without");
                cache::Caches::off()
            })
    };
    // The store is opened, not reached: an S3 server that is down fails the
    // workspace tasks that need it, not the worker.
    let workspaces = {
        let (cfg, cache_dir, user) = (
            config.workspaces.clone(),
            config
                .tasks_dir
                .join(format!("blobs-{}", config.worker_name)),
            config.limits.user.clone(),
        );
        tokio::task::spawn_blocking(move || workspaces::Workspaces::open(&cfg, cache_dir, &user))
            .await
            .map_err(std::io::Error::other)
            .map_err(blobs::BlobError::Cache)??
    };
    let pool = pool::Pool::new(
        sandbox.clone(),
        config.pool.clone(),
        &config.tasks_dir,
        &config.worker_name,
        caches.enabled(),
    );
    Ok(Ctx {
        queue,
        sandbox,
        config: Arc::new(config),
        abort,
        pool,
        caches,
        firewall,
        refusals,
        egress,
        workspaces,
        cleanups: TaskTracker::new(),
    })
}

/// Reads jobs and hands each to a runner, until `stop`. A job is read only with a
/// free slot: jobs wait in the stream, where any other worker with room can take
/// them (backpressure). A failed read is tried again on `retry::read_schedule`.
async fn take_jobs(ctx: &Ctx, slots: &Slots, stop: &CancellationToken) {
    let mut conn = None;
    loop {
        let permit = tokio::select! {
            p = slots.acquire() => match p { Some(p) => p, None => return },
            _ = stop.cancelled() => return,
        };
        // A worker whose firewall could not be reinstalled takes no job: they
        // wait in the stream for another worker. It tries again every 2 s.
        if let Some(firewall) = &ctx.firewall
            && !firewall.intact()
            && firewall.ensure().await.is_err()
        {
            drop(permit);
            tokio::select! {
                _ = tokio::time::sleep(FIREWALL_RETRY) => continue,
                _ = stop.cancelled() => return,
            }
        }
        let read = (|conn| read_job(&ctx.queue, conn))
            .retry(retry::read_schedule())
            .context(conn.take())
            .notify(|e, _| tracing::warn!(error = %e, "reading the jobs stream failed; retrying"));
        let (reader, job) = tokio::select! {
            r = read => r,
            _ = stop.cancelled() => return,
        };
        conn = reader;
        if let Ok(Some(job)) = job {
            slots.spawn(ctx, job, permit);
        }
    }
}

/// Reads at most one job on `conn`, connecting first if there is none. A failed
/// read drops the connection (it may be half-open); a consumer group that Redis
/// lost (or someone deleted) is made again. Hands the connection back.
async fn read_job(
    queue: &Queue,
    conn: Option<Pooled>,
) -> (Option<Pooled>, Result<Option<Job>, QueueError>) {
    let mut conn = match conn {
        Some(c) => c,
        None => match queue.blocking_connection(READ_BLOCK).await {
            Ok(c) => c,
            Err(e) => return (None, Err(e)),
        },
    };
    match queue.read_jobs(&mut conn, 1, READ_BLOCK, false).await {
        Ok(jobs) => (Some(conn), Ok(jobs.into_iter().next())),
        Err(e) if e.is_no_group() => {
            tracing::warn!("the consumer group is gone; creating it again");
            (Some(conn), queue.ensure_group().await.map(|()| None))
        }
        Err(e) => (None, Err(e)),
    }
}

/// Gives running tasks the shutdown grace period, then kills (and records) the rest.
async fn drain(ctx: &Ctx, slots: &Slots) {
    let grace = ctx.config.shutdown_grace;
    tracing::info!(
        running = slots.running(),
        grace_seconds = grace.as_secs(),
        "worker stopping"
    );
    slots.close();
    if tokio::time::timeout(grace, slots.wait()).await.is_err() {
        ctx.abort.cancel();
        slots.wait().await;
    }
}

/// Makes `TASKS_DIR` if need be, the worker's alone (0700, see
/// `source::make_private`); its absolute path, because Docker bind mounts
/// need a host path.
async fn prepare_tasks_dir(dir: &Path) -> Result<PathBuf, WorkerError> {
    let d = dir.to_path_buf();
    let r = tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(&d)?;
        let d = std::fs::canonicalize(&d)?;
        if let source::Privacy::Tightened(mode) = source::make_private(&d)? {
            tracing::warn!(
                dir = %d.display(),
                was = format!("{mode:04o}"),
                "TASKS_DIR was open to other users: made it 0700"
            );
        }
        Ok(d)
    })
    .await
    .map_err(std::io::Error::other)
    .and_then(|r| r);
    r.map_err(|error| WorkerError::TasksDir {
        path: dir.display().to_string(),
        error,
    })
}
