//! A handed-off task until its end: its output into the tails, published
//! every tick; kill, timeout and shutdown; and how it ended, from the
//! prelude's report or the engine's.

use std::time::{Duration, Instant};

use bollard::container::LogOutput;
use shared::TaskState;
use shared::tail::{TAIL_CAP, TailBuffer};
use shared::task::{Caps, ContainerExit, Outcome};
use shared::usage::Usage;

use super::TICK;
use super::launch::Launched;
use crate::ctx::Ctx;
use crate::egress::EgressLease;
use crate::queue::{Progress, Queue, QueueError, TaskSpec, TaskStateReply};
use crate::retry;
use crate::sandbox::{Event, Reading, Sandbox, SandboxError, Seen, TaskOutput};

/// Both streams' tails and when the last byte arrived.
pub(super) struct Tails {
    stdout: TailBuffer,
    stderr: TailBuffer,
    last_output: Option<Instant>,
    dirty: bool,
    /// An allow-list task's egress log, published with the tails.
    egress: Option<EgressLease>,
}

impl Tails {
    fn new(egress: Option<EgressLease>) -> Tails {
        Tails {
            stdout: TailBuffer::new(TAIL_CAP),
            stderr: TailBuffer::new(TAIL_CAP),
            last_output: None,
            dirty: false,
            egress,
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
        let egress_changed = self.egress.as_ref().is_some_and(EgressLease::changed);
        if !self.dirty && !egress_changed {
            return queue.state(task_id).await;
        }
        let reply = self.send(queue, task_id).await?;
        self.dirty = false;
        Ok(reply)
    }

    /// Once the task has ended, before its container is removed: waits (a
    /// second at most) for its last connections through the egress proxy to
    /// close by themselves, then ends its standing there (closing what is
    /// left), so the engine's next owner of its address gets nothing of it.
    pub(super) async fn end_egress(&self) {
        if let Some(lease) = &self.egress {
            lease.settled(Duration::from_secs(1)).await;
            lease.revoke();
        }
    }

    /// Publishes the tails as they are; the reply carries the task's state.
    pub(super) async fn send(
        &self,
        queue: &Queue,
        task_id: &str,
    ) -> Result<TaskStateReply, QueueError> {
        let snap = self.snapshot();
        queue.progress(task_id, &snap.progress()).await
    }

    /// The tails as they are now, owned (a `Progress` borrows them).
    pub(super) fn snapshot(&self) -> Snapshot {
        Snapshot {
            out: self.stdout.to_vec(),
            err: self.stderr.to_vec(),
            out_bytes: self.stdout.total(),
            err_bytes: self.stderr.total(),
            age_ms: self.last_output.map(|t| t.elapsed().as_millis() as u64),
            egress_log: self.egress.as_ref().map(EgressLease::log_json),
        }
    }
}

/// The tails at one moment (`Tails::snapshot`).
pub(super) struct Snapshot {
    out: Vec<u8>,
    err: Vec<u8>,
    out_bytes: u64,
    err_bytes: u64,
    age_ms: Option<u64>,
    egress_log: Option<Vec<u8>>,
}

impl Snapshot {
    pub(super) fn progress(&self) -> Progress<'_> {
        Progress {
            stdout_tail: &self.out,
            stderr_tail: &self.err,
            stdout_bytes: self.out_bytes,
            stderr_bytes: self.err_bytes,
            output_age_ms: self.age_ms,
            egress_log: self.egress_log.as_deref(),
        }
    }
}

/// Runs a handed-off task to its end: streams output into the tails, publishes
/// them every tick, and stops the container on kill, timeout or worker shutdown.
/// How the task ended is decided by `Outcome`'s rules, from what was seen here.
pub(super) async fn supervise(
    ctx: &Ctx,
    task_id: &str,
    spec: &TaskSpec,
    launched: Launched,
) -> ((Outcome, Option<Tails>), Option<Reading>) {
    let sandbox = &ctx.sandbox;
    let Launched {
        container,
        output: stream,
        egress,
    } = launched;
    // The container's own clock (its deadline) starts about now.
    let started = Instant::now();
    let mut output = Output { stream, open: true };
    let mut tails = Tails::new(egress);
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
    sandbox
        .metrics()
        .task_ran(spec.runtime.as_str(), started.elapsed());
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
pub(super) fn usage_of(r: &Reading) -> Usage {
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
