//! One task from claim to acknowledgement:
//! claim -> source files -> container (attach, start) -> supervise (tails, kill,
//! timeout) -> remove container and source files -> record output and outcome
//! -> ack. Docker resources are released before anything that needs Redis.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::container::LogOutput;
use futures_util::StreamExt;
use shared::tail::{TAIL_CAP, TailBuffer};
use shared::task::{Caps, KILLED_BY_USER_REASON, Outcome};
use shared::{ReasonKind, TaskState};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::queue::{Job, Progress, Queue, QueueError, TaskSpec, TaskStateReply};
use crate::sandbox::{OutputStream, Sandbox};
use crate::workspace;

/// How often a running task's tails are published and its state re-read (which
/// is how a `kill_task` reaches the worker holding it).
pub const TICK: Duration = Duration::from_millis(250);

/// What every task runner shares.
#[derive(Clone)]
pub struct Ctx {
    pub queue: Queue,
    pub sandbox: Sandbox,
    pub config: Arc<Config>,
    /// Cancelled when the worker's shutdown grace period is over.
    pub abort: CancellationToken,
}

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
    if let Err(e) = retry("ack", &ctx.abort, || ctx.queue.ack(&job.entry_id)).await {
        tracing::error!(%task_id, error = %e, "could not acknowledge job");
    }
}

async fn run_task(ctx: &Ctx, job: &Job) -> Result<Option<TaskState>, QueueError> {
    let task_id = job.task_id.as_str();
    match retry("claim", &ctx.abort, || ctx.queue.claim(job)).await? {
        TaskStateReply::State(TaskState::Running) => {}
        other => {
            tracing::info!(task_id, ?other, "job skipped: task is not queued");
            return Ok(None);
        }
    }
    let Some(spec) = retry("read task", &ctx.abort, || ctx.queue.task_spec(task_id)).await? else {
        return Ok(None);
    };
    tracing::info!(task_id, runtime = %spec.runtime, "task claimed");
    let (outcome, tails) = execute(ctx, task_id, &spec).await;
    // The container is gone by now: only the record is left to write, and it is
    // worth waiting for Redis as long as this worker lives.
    if let Some(tails) = &tails {
        retry("publish output", &ctx.abort, || {
            tails.send(&ctx.queue, task_id)
        })
        .await?;
    }
    let retention = ctx.config.retention_seconds;
    let reply = retry("finish", &ctx.abort, || {
        ctx.queue.finish(task_id, &outcome, retention)
    })
    .await?;
    Ok(match reply {
        TaskStateReply::State(s) => Some(s),
        TaskStateReply::Missing | TaskStateReply::NotOwner => None,
    })
}

/// Prepares, runs and cleans up; returns how the task ended and, if it ran, its
/// output. Docker resources are released here whether or not Redis answers.
async fn execute(ctx: &Ctx, task_id: &str, spec: &TaskSpec) -> (Outcome, Option<Tails>) {
    let workspace_failed = |e: String| {
        let reason = format!("could not prepare /workspace: {e}");
        (Outcome::failed(ReasonKind::WorkspaceFailed, reason), None)
    };
    let source = if spec.has_zip {
        let zip = match retry("read zip", &ctx.abort, || ctx.queue.zip(task_id)).await {
            Ok(Some(zip)) => zip,
            Ok(None) => return workspace_failed("the task's zip is no longer in the store".into()),
            Err(e) => return workspace_failed(e.to_string()),
        };
        let (dir, id, limits) = (
            ctx.config.tasks_dir.clone(),
            task_id.to_owned(),
            ctx.config.zip_limits,
        );
        let prepared =
            tokio::task::spawn_blocking(move || workspace::prepare(&dir, &id, &zip, &limits)).await;
        match prepared
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
        {
            Ok(src) => Some(src),
            Err(e) => return workspace_failed(e),
        }
    } else {
        None
    };
    // The api recorded the image at submit; a host may override it (a mirror).
    let image = ctx
        .config
        .runtime_overrides
        .image(&spec.runtime)
        .unwrap_or(&spec.image);
    let ended = match ctx
        .sandbox
        .create(
            task_id,
            image,
            &spec.command,
            source.as_deref(),
            spec.timeout_seconds,
        )
        .await
    {
        Ok(container) => {
            let ended = supervise(ctx, task_id, spec, &container).await;
            ctx.sandbox.remove(&container).await;
            ended
        }
        Err(e) => {
            let reason = format!("could not start the container: {e}");
            (Outcome::failed(ReasonKind::StartFailed, reason), None)
        }
    };
    if let Some(src) = source {
        let _ = tokio::task::spawn_blocking(move || workspace::remove(&src)).await;
    }
    ended
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

/// Runs a created container to its end: streams output into the tails, publishes
/// them every tick, and stops the container on kill, timeout or worker shutdown.
async fn supervise(
    ctx: &Ctx,
    task_id: &str,
    spec: &TaskSpec,
    container: &str,
) -> (Outcome, Option<Tails>) {
    let sandbox = &ctx.sandbox;
    let start_failed = |e: crate::sandbox::SandboxError| {
        let reason = format!("could not start the container: {e}");
        (Outcome::failed(ReasonKind::StartFailed, reason), None)
    };
    let mut output: OutputStream = match sandbox.attach(container).await {
        Ok(o) => o,
        Err(e) => return start_failed(e),
    };
    if let Err(e) = sandbox.start(container).await {
        return start_failed(e);
    }
    // The container's own clock (its deadline) starts about now.
    let started = Instant::now();
    // One attempt, not a retry: the container runs now and must be supervised
    // (timeout, output) even if Redis is down; only started_at is lost then.
    match ctx.queue.started(task_id, container).await {
        Ok(r) if r.is_running() => {}
        Ok(_) => {
            // Killed while we were preparing: the state is already final.
            sandbox.kill(container).await;
            return (
                Outcome::killed(ReasonKind::KilledByUser, KILLED_BY_USER_REASON),
                None,
            );
        }
        Err(e) => {
            tracing::warn!(task_id, error = %e, "could not record the start; supervising anyway")
        }
    }
    let mut tails = Tails::new();
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let deadline = tokio::time::sleep(Duration::from_secs(spec.timeout_seconds));
    tokio::pin!(deadline);
    let wait = sandbox.wait(container);
    tokio::pin!(wait);
    let mut output_open = true;

    let end = loop {
        tokio::select! {
            exit = &mut wait => {
                break match exit {
                    Ok(code) => {
                        let ran = started.elapsed();
                        // 137 is SIGKILL; at the memory cap it is the OOM killer.
                        let oom = code == 137 && sandbox.oom_killed(container).await;
                        End::Exited { code, oom, ran }
                    }
                    Err(e) => End::Decided(Outcome::failed(
                        ReasonKind::StartFailed,
                        format!("lost track of the container: {e}"),
                    )),
                };
            }
            frame = output.next(), if output_open => match frame {
                Some(Ok(frame)) => tails.push(frame),
                Some(Err(e)) => {
                    tracing::warn!(task_id, error = %e, "output stream failed");
                    output_open = false;
                }
                None => output_open = false,
            },
            _ = ticker.tick() => match tails.tick(&ctx.queue, task_id).await {
                Ok(TaskStateReply::State(TaskState::Running)) => {}
                Ok(_) => {
                    sandbox.kill(container).await;
                    break End::Decided(Outcome::killed(ReasonKind::KilledByUser, KILLED_BY_USER_REASON));
                }
                // Redis is down: keep running the task; publish when it is back.
                Err(e) => tracing::warn!(task_id, error = %e, "could not publish progress"),
            },
            _ = &mut deadline => {
                sandbox.kill(container).await;
                break End::Decided(Outcome::timed_out(spec.timeout_seconds));
            }
            _ = ctx.abort.cancelled() => {
                sandbox.kill(container).await;
                break End::Decided(Outcome::killed(ReasonKind::WorkerShutdown, "worker shut down before the task finished"));
            }
        }
    };
    // The container has exited or been killed: what is left in the stream is the
    // last output. Drain it, but do not wait forever on a wedged engine.
    if output_open {
        let drain = async {
            while let Some(Ok(frame)) = output.next().await {
                tails.push(frame);
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), drain).await;
    }
    let self_deadline =
        Duration::from_secs(spec.timeout_seconds + crate::sandbox::SELF_DEADLINE_GRACE_SECONDS);
    let outcome = match end {
        // Killed by the container's own deadline (the worker's timer was late):
        // `timeout -s KILL` exits 137 (124 is its usual "timed out" status).
        End::Exited {
            code: 124 | 137,
            oom: false,
            ran,
        } if ran + Duration::from_secs(1) >= self_deadline => {
            Outcome::timed_out(spec.timeout_seconds)
        }
        End::Exited { code, oom, .. } => {
            let l = sandbox.limits();
            let caps = Caps {
                memory_mib: l.memory_mib,
                pids: l.pids,
                disk_mib: l.disk_mib,
                tmpfs_mib: l.tmpfs_mib,
            };
            Outcome::exited(code, oom, &tails.stderr.to_vec(), caps)
        }
        End::Decided(outcome) => outcome,
    };
    (outcome, Some(tails))
}

/// How the supervision loop ended.
enum End {
    /// The container exited by itself (with its exit code, Docker's OOM flag and
    /// how long it ran): the reason is read from its output after the last of it
    /// has arrived.
    Exited { code: i64, oom: bool, ran: Duration },
    /// The worker stopped it (kill, timeout, shutdown) or lost it.
    Decided(Outcome),
}

/// Retries a Redis operation until it succeeds, backing off up to 5 s, for as
/// long as the worker runs: an outage delays a task's record but never loses
/// it. Gives up (with the last error) only when `abort` fires at shutdown; the
/// job then stays pending and is settled at the next start.
pub async fn retry<T, F, Fut>(
    what: &str,
    abort: &CancellationToken,
    mut op: F,
) -> Result<T, QueueError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, QueueError>>,
{
    let mut delay = Duration::from_millis(100);
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e @ QueueError::Corrupt(..)) => return Err(e),
            Err(e) if abort.is_cancelled() => return Err(e),
            Err(e) => {
                tracing::warn!(what, error = %e, "Redis operation failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = abort.cancelled() => {}
                }
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
}
