//! One task from claim to acknowledgement:
//! claim -> source files -> container (a warm one from the pool, else a new
//! one), its waiting prelude handed the task -> supervise (tails, kill,
//! timeout; the exit status from the prelude) ->
//! probe its cgroup -> record output and outcome -> ack. The container and source files
//! are removed in the background as soon as the process has ended: off the
//! critical path, and without waiting for Redis.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bollard::container::LogOutput;
use shared::TaskState;
use shared::options::{CacheUse, Network};
use shared::scripts::Ended;
use shared::tail::{TAIL_CAP, TailBuffer};
use shared::task::{Caps, ContainerExit, Outcome};
use shared::usage::Usage;

use crate::cache::Lease;
use crate::collect::Collector;
use crate::ctx::Ctx;
use crate::metrics::Claim;
use crate::pool::Warm;
use crate::queue::{Collected, Job, Progress, Queue, QueueError, TaskSpec, TaskStateReply};
use crate::retry;
use crate::sandbox::{ContainerSpec, Event, Reading, Sandbox, SandboxError, Seen, TaskOutput};
use crate::workspace;

/// How often a running task's tails are published and its state re-read (which
/// is how a `kill_task` reaches the worker holding it).
pub const TICK: Duration = Duration::from_millis(250);

/// Runs a job to its end and acknowledges it. Never panics, never returns an error:
/// failures are recorded on the task or logged.
pub async fn run_job(ctx: Ctx, job: Job) {
    let task_id = job.task_id.clone();
    match run_task(&ctx, &job).await {
        Ok(Some(state)) => tracing::info!(%task_id, %state, "task finished"),
        Ok(None) => {}
        Err(e) => {
            // The entry stays pending: the reaper's orphan pass (or this worker's
            // next start) settles it.
            tracing::error!(%task_id, error = %e, "task could not be recorded; left pending");
            return;
        }
    }
    if let Err(e) = retry::redis("ack", &ctx.abort, || ctx.queue.ack(&job.entry_id)).await {
        tracing::error!(%task_id, error = %e, "could not acknowledge job");
    }
}

async fn run_task(ctx: &Ctx, job: &Job) -> Result<Option<TaskState>, QueueError> {
    let task_id = job.task_id.as_str();
    match retry::redis("claim", &ctx.abort, || ctx.queue.claim(job)).await? {
        TaskStateReply::State(TaskState::Running) => {}
        other => {
            tracing::info!(task_id, ?other, "job skipped: task is not queued");
            return Ok(None);
        }
    }
    let Some(spec) = retry::redis("read task", &ctx.abort, || ctx.queue.task_spec(task_id)).await?
    else {
        return Ok(None);
    };
    tracing::info!(task_id, runtime = %spec.runtime, "task claimed");
    let mut collected = None;
    let mut usage = Usage::default();
    let (outcome, tails) = execute(ctx, task_id, &spec, &mut collected, &mut usage).await;
    // The container is gone by now: only the record is left to write, and it is
    // worth waiting for Redis as long as this worker lives.
    if let Some(tails) = &tails {
        retry::redis("publish output", &ctx.abort, || {
            tails.send(&ctx.queue, task_id)
        })
        .await?;
    }
    let retention = ctx.config.retention_seconds;
    let ended = Ended {
        collected: collected.as_ref().map(|c| (&c.zip[..], c.listing.as_str())),
        usage,
        owner: spec.owner.as_deref(),
    };
    let reply = retry::redis("finish", &ctx.abort, || {
        ctx.queue.finish(task_id, &outcome, retention, &ended)
    })
    .await?;
    Ok(match reply {
        TaskStateReply::State(s) => Some(s),
        TaskStateReply::Missing | TaskStateReply::NotOwner => None,
    })
}

/// Prepares, runs and cleans up; returns how the task ended and, if it ran, its
/// output (and puts in `collected` the files `collect` gathered, and in `usage`
/// what its container used). Docker resources are released whether or not
/// Redis answers.
async fn execute(
    ctx: &Ctx,
    task_id: &str,
    spec: &TaskSpec,
    collected: &mut Option<Collected>,
    usage: &mut Usage,
) -> (Outcome, Option<Tails>) {
    // The image is this worker's for the runtime, never the record's: a
    // record naming another one (written by anything but an api that agrees
    // with this worker) is refused before anything is pulled, extracted or run.
    let image = match ctx.config.catalog.resolve(&spec.runtime, &spec.image) {
        Ok(image) => image,
        Err(refusal) => {
            tracing::warn!(
                task_id,
                runtime = %spec.runtime,
                recorded_image = %spec.image,
                "task refused: {refusal}"
            );
            return (Outcome::image_refused(refusal), None);
        }
    };
    // A task without a network must not run where a network was set up.
    let mut warm = match spec.network {
        Network::Internet => ctx.pool.take(&spec.runtime),
        Network::None => None,
    };
    let mut claim = if warm.is_some() {
        Claim::Warm
    } else {
        Claim::Cold
    };
    let (launched, inputs) = loop {
        let dirs = warm.as_ref().map(|w| WarmDirs {
            source: w.source(),
            fifo: w.fifo(),
            cache: w.cache_mount(),
        });
        let inputs = match Inputs::gather(ctx, task_id, spec, dirs).await {
            Ok(inputs) => inputs,
            Err(e) => {
                if let Some(warm) = warm {
                    ctx.pool.discard(warm).await;
                }
                return (Outcome::workspace_failed(e), None);
            }
        };
        let env = inputs.env(spec);
        let container_spec = ContainerSpec {
            task_id,
            image,
            command: &spec.command,
            source: inputs.source.as_deref(),
            timeout_seconds: spec.timeout_seconds,
            env: &env,
            network: spec.network,
            collect: inputs
                .collector
                .as_ref()
                .map(|c| (c.fifo(), &spec.collect[..])),
            cache: inputs.cache.as_ref().and_then(Lease::cold_mount),
        };
        // Checked (and repaired) right before the task's process starts, so a
        // rule removed since the last check never meets a running task.
        if let Some(firewall) = &ctx.firewall
            && let Err(e) = firewall.ensure().await
        {
            let failed = Outcome::start_failed(format!("the task firewall: {e}"));
            break (Err((failed, None)), inputs);
        }
        let stdin = inputs.stdin.clone();
        match &mut warm {
            Some(w) => match launch_warm(ctx, w, &container_spec, stdin).await {
                Ok(launched) => break (Ok(launched), inputs),
                Err(e) => {
                    // Nothing of the task ran: a pool container that died while
                    // idle (an engine restart, a hand), or just before its
                    // process could start, costs a cold start, not the task.
                    tracing::warn!(task_id, error = %e, "pool container unusable; starting a new one");
                    claim = Claim::Fallback;
                    if let Some(c) = inputs.collector {
                        c.finish().await;
                    }
                    // Removed before the cold one is made (it may already bear
                    // the task's container name), and before the cache is
                    // looked at: the engine may have started the process after
                    // all. Then the cache goes back, to be lent again to the
                    // cold one, or is dropped if the container is not gone.
                    if let Some(w) = warm.take() {
                        let gone = ctx.sandbox.remove(&w.id).await;
                        if let Some(lease) = inputs.cache {
                            return_cache(ctx, lease, gone).await;
                        }
                        crate::pool::remove_dir(w.dir().to_path_buf()).await;
                    }
                }
            },
            None => break (launch_cold(ctx, &container_spec, stdin).await, inputs),
        }
    };
    if ctx.pool.enabled() {
        ctx.sandbox.metrics().pool_claim(claim);
    }
    match launched {
        Ok(launched) => {
            let container = launched.container.clone();
            let (ended, reading) = supervise(ctx, task_id, spec, launched).await;
            if let Some(lease) = &inputs.cache {
                ctx.caches.returning(lease);
            }
            if let Some(r) = reading {
                *usage = usage_of(&r);
            }
            if let Some(c) = inputs.collector {
                *collected = c.finish().await;
            }
            ctx.cleanups.spawn(clean_up(
                ctx.clone(),
                Some(container),
                inputs.source,
                warm,
                inputs.cache,
            ));
            ended
        }
        Err((outcome, container)) => {
            if let Some(c) = inputs.collector {
                c.finish().await;
            }
            ctx.cleanups.spawn(clean_up(
                ctx.clone(),
                container,
                inputs.source,
                warm,
                inputs.cache,
            ));
            (outcome, None)
        }
    }
}

/// What a task brings besides its command, ready for its container.
struct Inputs {
    /// The extracted zip on the host: a new directory, or the warm container's.
    source: Option<std::path::PathBuf>,
    stdin: Option<Vec<u8>>,
    collector: Option<Collector>,
    /// The owner's dependency cache, lent to this task.
    cache: Option<Lease>,
}

/// Why a task's inputs could not be made ready: the task fails with it, as
/// `Outcome::workspace_failed`.
#[derive(Debug, thiserror::Error)]
enum InputError {
    #[error("could not read the task's zip: {0}")]
    ReadZip(#[source] QueueError),
    #[error("the task's zip is no longer in the store")]
    ZipGone,
    #[error(transparent)]
    Extract(#[from] workspace::WorkspaceError),
    #[error("extracting the task's zip stopped: {0}")]
    Extractor(#[from] tokio::task::JoinError),
    #[error("could not read the task's stdin: {0}")]
    ReadStdin(#[source] QueueError),
    #[error("could not set up collect: {0}")]
    Collect(#[source] std::io::Error),
}

/// A warm container's host directories (not the container: its attached
/// streams are not `Sync`): its source directory, its collection pipe, and
/// its cache mount directory if it has one.
struct WarmDirs {
    source: PathBuf,
    fifo: PathBuf,
    cache: Option<PathBuf>,
}

impl Inputs {
    async fn gather(
        ctx: &Ctx,
        task_id: &str,
        spec: &TaskSpec,
        warm: Option<WarmDirs>,
    ) -> Result<Inputs, InputError> {
        let (warm_source, warm_fifo, warm_cache) = match warm {
            Some(w) => (Some(w.source), Some(w.fifo), Some(w.cache)),
            None => (None, None, None),
        };
        let source = if spec.has_zip {
            let zip = retry::redis("read zip", &ctx.abort, || ctx.queue.zip(task_id))
                .await
                .map_err(InputError::ReadZip)?
                .ok_or(InputError::ZipGone)?;
            let limits = ctx.config.zip_limits;
            let prepared = match warm_source {
                Some(dir) => {
                    tokio::task::spawn_blocking(move || {
                        workspace::fill(&dir, &zip, &limits).map(|()| dir)
                    })
                    .await
                }
                None => {
                    let (dir, id) = (ctx.config.tasks_dir.clone(), task_id.to_owned());
                    tokio::task::spawn_blocking(move || {
                        workspace::prepare(&dir, &id, &zip, &limits)
                    })
                    .await
                }
            };
            Some(prepared??)
        } else {
            None
        };
        let stdin = if spec.has_stdin {
            let stdin = retry::redis("read stdin", &ctx.abort, || ctx.queue.stdin(task_id))
                .await
                .map_err(InputError::ReadStdin)?;
            // Gone only if the task ended meanwhile: then it will not run anyway.
            Some(stdin.unwrap_or_default())
        } else {
            None
        };
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
    fn env(&self, spec: &TaskSpec) -> Vec<(String, String)> {
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
    let owner_id = shared::cache::owner_id(spec.owner.as_deref());
    let current = match ctx.queue.cache_generations(&owner_id).await {
        Ok(g) => g,
        Err(e) => {
            tracing::warn!(task_id, error = %e, "could not read cache clears; no cache for this task");
            return None;
        }
    };
    ctx.caches.lend(&owner_id, current, mount, own_mount).await
}

/// A task, handed to its container (its own, or a warm one).
struct Launched {
    container: String,
    output: TaskOutput,
}

/// A cold start: creates and starts the task's own container, then hands its
/// prelude the task, as a warm one's. On failure, the outcome and the
/// container to remove.
async fn launch_cold(
    ctx: &Ctx,
    spec: &ContainerSpec<'_>,
    stdin: Option<Vec<u8>>,
) -> Result<Launched, (Outcome, Option<String>)> {
    let sandbox = &ctx.sandbox;
    let (container, attached) = sandbox
        .create(spec)
        .await
        .map_err(|e| (Outcome::start_failed(e), None))?;
    match sandbox
        .hand_off(&container, attached, spec, stdin, false)
        .await
    {
        Ok(output) => Ok(Launched { container, output }),
        Err(e) => Err((Outcome::start_failed(e), Some(container))),
    }
}

/// A warm start: the pool container's prelude, waiting since the container
/// started, is handed the task.
async fn launch_warm(
    ctx: &Ctx,
    warm: &mut Warm,
    spec: &ContainerSpec<'_>,
    stdin: Option<Vec<u8>>,
) -> Result<Launched, SandboxError> {
    let attached = warm.attached.take().ok_or(SandboxError::HandoffNotTaken)?;
    let output = ctx
        .sandbox
        .hand_off(&warm.id, attached, spec, stdin, true)
        .await?;
    Ok(Launched {
        container: warm.id.clone(),
        output,
    })
}

/// A lent cache comes back only from a container known to be gone: the
/// worker walks it as root, and a task still running could change the tree
/// under the walk. Otherwise it is dropped unread.
async fn return_cache(ctx: &Ctx, lease: Lease, container_gone: bool) {
    if container_gone {
        ctx.caches.give_back(lease).await;
    } else {
        ctx.caches.forfeit(lease).await;
    }
}

/// Removes an ended task's container and host files (its extracted zip, or the
/// warm container's directory). Runs in the background: the task's record does
/// not wait for it.
async fn clean_up(
    ctx: Ctx,
    container: Option<String>,
    source: Option<std::path::PathBuf>,
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
    if let Some(src) = source {
        // A warm container's source directory went with its directory.
        crate::pool::remove_dir(src).await;
    }
}

/// Both streams' tails and when the last byte arrived.
struct Tails {
    stdout: TailBuffer,
    stderr: TailBuffer,
    last_output: Option<Instant>,
    dirty: bool,
}

impl Tails {
    fn new() -> Tails {
        Tails {
            stdout: TailBuffer::new(TAIL_CAP),
            stderr: TailBuffer::new(TAIL_CAP),
            last_output: None,
            dirty: false,
        }
    }

    fn push(&mut self, frame: LogOutput) {
        let (buf, bytes) = match frame {
            LogOutput::StdOut { message } | LogOutput::Console { message } => {
                (&mut self.stdout, message)
            }
            LogOutput::StdErr { message } => (&mut self.stderr, message),
            LogOutput::StdIn { .. } => return,
        };
        if !bytes.is_empty() {
            buf.push(&bytes);
            self.last_output = Some(Instant::now());
            self.dirty = true;
        }
    }

    /// Publishes if anything changed, else only reads the state.
    async fn tick(&mut self, queue: &Queue, task_id: &str) -> Result<TaskStateReply, QueueError> {
        if !self.dirty {
            return queue.state(task_id).await;
        }
        let reply = self.send(queue, task_id).await?;
        self.dirty = false;
        Ok(reply)
    }

    /// Publishes the tails as they are; the reply carries the task's state.
    async fn send(&self, queue: &Queue, task_id: &str) -> Result<TaskStateReply, QueueError> {
        let (out, err) = (self.stdout.to_vec(), self.stderr.to_vec());
        queue
            .progress(
                task_id,
                &Progress {
                    stdout_tail: &out,
                    stderr_tail: &err,
                    stdout_bytes: self.stdout.total(),
                    stderr_bytes: self.stderr.total(),
                    output_age_ms: self.last_output.map(|t| t.elapsed().as_millis() as u64),
                },
            )
            .await
    }
}

/// Runs a handed-off task to its end: streams output into the tails, publishes
/// them every tick, and stops the container on kill, timeout or worker shutdown.
/// How the task ended is decided by `Outcome`'s rules, from what was seen here.
async fn supervise(
    ctx: &Ctx,
    task_id: &str,
    spec: &TaskSpec,
    launched: Launched,
) -> ((Outcome, Option<Tails>), Option<Reading>) {
    let sandbox = &ctx.sandbox;
    let Launched {
        container,
        output: stream,
    } = launched;
    // The container's own clock (its deadline) starts about now.
    let started = Instant::now();
    let mut output = Output { stream, open: true };
    let mut tails = Tails::new();
    let (end, reading) = match record_start(ctx, task_id, &container).await {
        Some(end) => (end, None),
        None => {
            watch(
                ctx,
                task_id,
                spec,
                &container,
                &mut output,
                &mut tails,
                started,
            )
            .await
        }
    };
    // Stopped by the worker (or by someone else): the last output comes until
    // the stream ends. After an exit the prelude's markers said all of the
    // script's output is in; the container goes in the background.
    if !matches!(end, End::Exited(_)) {
        if output.open {
            sandbox.kill(&container).await;
        }
        output.drain(&mut tails).await;
    }
    sandbox.metrics().task_ran(&spec.runtime, started.elapsed());
    let outcome = match end {
        End::Exited(exit) => {
            let l = sandbox.limits();
            let caps = Caps {
                memory_mib: l.memory_mib,
                pids: l.pids,
                disk_mib: l.disk_mib,
                tmpfs_mib: l.tmpfs_mib,
            };
            Outcome::container_exited(exit, spec.timeout_seconds, &tails.stderr.to_vec(), caps)
        }
        End::Decided(outcome) => outcome,
        End::Superseded => {
            let recorded = retry::redis("read how the task ended", &ctx.abort, || {
                ctx.queue.recorded_end(task_id)
            })
            .await;
            Outcome::superseded(recorded.ok().flatten())
        }
    };
    ((outcome, Some(tails)), reading)
}

/// The figures a task's record keeps from a reading of its container.
fn usage_of(r: &Reading) -> Usage {
    Usage {
        cpu_ms: r.cpu_ns.map(|ns| ns / 1_000_000),
        peak_memory_bytes: r.peak_memory_bytes,
        workspace_bytes: r.workspace_bytes,
    }
}

/// How long the engine may take to report a container's end when its prelude
/// died before it could report the script's.
const ENGINE_EXIT_WAIT: Duration = Duration::from_secs(30);

/// Whether the kernel OOM-killed the task, for a script that exited with 137
/// (SIGKILL): from the container's cgroup, which counts the OOM killer's kills
/// (`reading`, read while the container still runs), or else from Docker's
/// `OOMKilled` flag. The flag alone is not enough: the engine sets it from
/// containerd's OOM event, asynchronously, and under load it can come after
/// the exit was seen; and it is only set when the container stops, so the
/// container is stopped first.
async fn oom_killed(sandbox: &Sandbox, container: &str, reading: Option<&Reading>) -> bool {
    if reading.is_some_and(Reading::oom_killed) {
        return true;
    }
    sandbox.kill(container).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), sandbox.wait(container)).await;
    sandbox.oom_killed(container).await
}

/// The script exited with `code` (its prelude said so, or the engine did):
/// its container's usage, read before anything stops it, and whether it was
/// OOM-killed.
async fn exited(
    sandbox: &Sandbox,
    container: &str,
    code: i64,
    started: Instant,
) -> (End, Option<Reading>) {
    let ran = started.elapsed();
    let reading = sandbox.probe(container).await;
    // 137 is SIGKILL; at the memory cap it is the OOM killer.
    let oom_killed = code == 137 && oom_killed(sandbox, container, reading.as_ref()).await;
    (
        End::Exited(ContainerExit {
            code,
            oom_killed,
            ran,
        }),
        reading,
    )
}

/// Records the container's start. One attempt, not a retry: the container runs
/// now and must be supervised (timeout, output) even if Redis is down; only
/// `started_at` is lost then. Returns how it ended if the task is no longer this
/// worker's to run (the container is stopped then).
async fn record_start(ctx: &Ctx, task_id: &str, container: &str) -> Option<End> {
    match ctx.queue.started(task_id, container).await {
        Ok(r) if r.is_running() => None,
        Ok(_) => {
            // Killed or taken over while we were preparing.
            ctx.sandbox.kill(container).await;
            Some(End::Superseded)
        }
        Err(e) => {
            tracing::warn!(task_id, error = %e, "could not record the start; supervising anyway");
            None
        }
    }
}

/// The supervision loop: until the prelude reports the script's exit, or the
/// worker stops the container (kill, timeout, shutdown).
async fn watch(
    ctx: &Ctx,
    task_id: &str,
    spec: &TaskSpec,
    container: &str,
    output: &mut Output,
    tails: &mut Tails,
    started: Instant,
) -> (End, Option<Reading>) {
    let sandbox = &ctx.sandbox;
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let deadline = tokio::time::sleep(Duration::from_secs(spec.timeout_seconds));
    tokio::pin!(deadline);
    // The script's exit status (stdout's end marker), and whether stderr's end
    // marker came: the end is the later of the two, when both streams are
    // complete.
    let mut code: Option<i64> = None;
    let mut stderr_done = false;
    loop {
        tokio::select! {
            event = output.stream.next(), if output.open => match event {
                Some(Ok(Event::Frame(frame))) => tails.push(frame),
                Some(Ok(Event::Marker(Seen::Exited(c)))) => code = Some(c),
                Some(Ok(Event::Marker(Seen::StderrEnd))) => stderr_done = true,
                Some(Ok(Event::Marker(Seen::Started))) => {}
                Some(Err(e)) => tracing::warn!(task_id, error = %e, "output stream failed"),
                None => {
                    output.open = false;
                    if let Some(code) = code {
                        return exited(sandbox, container, code, started).await;
                    }
                    // The prelude is gone without a word: OOM-killed itself,
                    // or its container stopped under it. The engine's answer
                    // is all there is.
                    let waited = tokio::time::timeout(ENGINE_EXIT_WAIT, sandbox.wait(container)).await;
                    return match waited {
                        Ok(Ok(code)) => exited(sandbox, container, code, started).await,
                        Ok(Err(e)) => (End::Decided(Outcome::container_lost(e)), None),
                        Err(_) => (
                            End::Decided(Outcome::container_lost(SandboxError::WaitEnded)),
                            None,
                        ),
                    };
                }
            },
            _ = ticker.tick() => match tails.tick(&ctx.queue, task_id).await {
                Ok(TaskStateReply::State(TaskState::Running)) => {}
                // Killed by kill_task, or settled by a reaper: stop it (what
                // it used so far is read first: the kill ends its cgroup).
                Ok(_) => {
                    let reading = sandbox.probe(container).await;
                    sandbox.kill(container).await;
                    return (End::Superseded, reading);
                }
                // Redis is down: keep running the task; publish when it is back.
                Err(e) => tracing::warn!(task_id, error = %e, "could not publish progress"),
            },
            _ = &mut deadline => {
                let reading = sandbox.probe(container).await;
                sandbox.kill(container).await;
                return (End::Decided(Outcome::timed_out(spec.timeout_seconds)), reading);
            }
            _ = ctx.abort.cancelled() => {
                let reading = sandbox.probe(container).await;
                sandbox.kill(container).await;
                return (End::Decided(Outcome::worker_shutdown()), reading);
            }
        }
        if let (Some(c), true) = (code, stderr_done) {
            // All of the script's output is in; what its leftover processes
            // wrote meanwhile is kept too, without waiting for more.
            for event in output.stream.ready() {
                if let Event::Frame(frame) = event {
                    tails.push(frame);
                }
            }
            return exited(sandbox, container, c, started).await;
        }
    }
}

/// A container's output stream, and whether it is still open.
struct Output {
    stream: TaskOutput,
    open: bool,
}

impl Output {
    /// The container has exited or been killed: what is left in the stream is
    /// the last output. Drains it, but does not wait forever on a wedged engine.
    async fn drain(&mut self, tails: &mut Tails) {
        if !self.open {
            return;
        }
        let drain = async {
            while let Some(Ok(event)) = self.stream.next().await {
                if let Event::Frame(frame) = event {
                    tails.push(frame);
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), drain).await;
    }
}

/// How the supervision loop ended.
enum End {
    /// The script exited by itself (its prelude said so, or the engine): the
    /// outcome is decided from its output after the last of it has arrived.
    Exited(ContainerExit),
    /// The worker stopped it (timeout, shutdown) or lost it.
    Decided(Outcome),
    /// Someone else ended the task (kill_task, a reaper) or took it over; the
    /// container was stopped, and the outcome is what they recorded.
    Superseded,
}
