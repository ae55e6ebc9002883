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
use super::meter::Meter;
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
/// How the task ended is decided by `Outcome`'s rules, from what was seen here;
/// what it is charged, by the `Meter`'s.
pub(super) async fn supervise(
    ctx: &Ctx,
    task_id: &str,
    spec: &TaskSpec,
    launched: Launched,
) -> ((Outcome, Option<Tails>), Usage) {
    let sandbox = &ctx.sandbox;
    let Launched {
        container,
        output: stream,
        egress,
        handed_at,
    } = launched;
    // The container's own clock (its deadline) starts about now.
    let started = Instant::now();
    let mut meter = Meter::new(sandbox.limits().cpus, handed_at);
    let mut output = Output { stream, open: true };
    let mut tails = Tails::new(egress);
    let end = match record_start(
        ctx,
        task_id,
        &container,
        &mut meter,
        spec.workspace.is_some(),
    )
    .await
    {
        Some(end) => end,
        None => {
            meter.sample(sandbox, &container).await;
            let mut run = Run {
                ctx,
                task_id,
                spec,
                container: &container,
                meter: &mut meter,
                started,
            };
            run.watch(&mut output, &mut tails).await
        }
    };
    // Stopped by the worker (or by someone else): the last output comes until
    // the stream ends. After an exit the prelude's markers said all of the
    // script's output is in; the container goes in the background.
    if spec.workspace.is_some() {
        // Paused, not killed: its /workspace is saved next (`keep::save`), and
        // a paused container writes nothing more, so what is ready is all.
        sandbox.pause(&container).await;
        for event in output.stream.ready() {
            if let Event::Frame(frame) = event {
                tails.push(frame);
            }
        }
    } else if !matches!(end, End::Exited(_)) {
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
    ((outcome, Some(tails)), meter.usage())
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

/// Records the container's start. One attempt, not a retry: the container runs
/// now and must be supervised (timeout, output) even if Redis is down; only
/// `started_at` is lost then. Returns how it ended if the task is no longer this
/// worker's to run (the container is stopped then, what it used read first).
async fn record_start(
    ctx: &Ctx,
    task_id: &str,
    container: &str,
    meter: &mut Meter,
    keep: bool,
) -> Option<End> {
    match ctx.queue.started(task_id, container).await {
        Ok(r) if r.is_running() => None,
        Ok(_) => {
            // Killed or taken over while we were preparing.
            meter.read_end(&ctx.sandbox, container).await;
            if keep {
                ctx.sandbox.pause(container).await;
            } else {
                ctx.sandbox.kill(container).await;
            }
            Some(End::Superseded)
        }
        Err(e) => {
            tracing::warn!(task_id, error = %e, "could not record the start; supervising anyway");
            None
        }
    }
}

/// One running task, as the supervision loop sees it.
struct Run<'a> {
    ctx: &'a Ctx,
    task_id: &'a str,
    spec: &'a TaskSpec,
    container: &'a str,
    meter: &'a mut Meter,
    /// When supervision began (the exit's run time counts from here).
    started: Instant,
}

impl Run<'_> {
    /// The supervision loop: until the prelude reports the script's exit, or
    /// the worker stops the container (kill, timeout, shutdown). What the
    /// container used is read (`Meter::read_end`) before anything stops it,
    /// and sampled on every tick until then.
    async fn watch(&mut self, output: &mut Output, tails: &mut Tails) -> End {
        let (ctx, task_id, container) = (self.ctx, self.task_id, self.container);
        let sandbox = &ctx.sandbox;
        let mut ticker = tokio::time::interval(TICK);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let timeout_seconds = self.spec.timeout_seconds;
        let deadline = tokio::time::sleep(Duration::from_secs(timeout_seconds));
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
                            return self.exited(code).await;
                        }
                        // The prelude is gone without a word: OOM-killed itself,
                        // killed by the task (`kill -9 -1`), or its container
                        // stopped under it. The engine's answer is all there is
                        // (and the meter's bound, which ends when a read finds the
                        // cgroup gone: read now, not after Docker has answered).
                        self.meter.sample(sandbox, container).await;
                        let waited = tokio::time::timeout(ENGINE_EXIT_WAIT, sandbox.wait(container)).await;
                        return match waited {
                            Ok(Ok(code)) => self.exited(code).await,
                            Ok(Err(e)) => End::Decided(Outcome::container_lost(e)),
                            Err(_) => End::Decided(Outcome::container_lost(SandboxError::WaitEnded)),
                        };
                    }
                },
                _ = ticker.tick() => {
                    self.meter.sample(sandbox, container).await;
                    match tails.tick(&ctx.queue, task_id).await {
                        Ok(TaskStateReply::State(TaskState::Running)) => {}
                        // Killed by kill_task, or settled by a reaper: stop it (what
                        // it used so far is read first: the kill ends its cgroup).
                        Ok(_) => {
                            self.meter.read_end(sandbox, container).await;
                            self.stop().await;
                            return End::Superseded;
                        }
                        // Redis is down: keep running the task; publish when it is back.
                        Err(e) => tracing::warn!(task_id, error = %e, "could not publish progress"),
                    }
                },
                _ = &mut deadline => {
                    self.meter.read_end(sandbox, container).await;
                    self.stop().await;
                    return End::Decided(Outcome::timed_out(timeout_seconds));
                }
                _ = ctx.abort.cancelled() => {
                    self.meter.read_end(sandbox, container).await;
                    self.stop().await;
                    return End::Decided(Outcome::worker_shutdown());
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
                return self.exited(c).await;
            }
        }
    }

    /// Stops the task's processes: a kill, or for a workspace task a pause,
    /// which stops them as surely and keeps its /workspace to be saved.
    async fn stop(&self) {
        if self.spec.workspace.is_some() {
            self.ctx.sandbox.pause(self.container).await;
        } else {
            self.ctx.sandbox.kill(self.container).await;
        }
    }

    /// The script exited with `code` (its prelude said so, or the engine did):
    /// its container's usage, read before anything stops it, and whether it was
    /// OOM-killed.
    async fn exited(&mut self, code: i64) -> End {
        let ran = self.started.elapsed();
        let sandbox = &self.ctx.sandbox;
        let reading = self.meter.read_end(sandbox, self.container).await;
        // 137 is SIGKILL; at the memory cap it is the OOM killer. A workspace
        // task's container must stay for its save: only the cgroup's word.
        let oom_killed = code == 137
            && if self.spec.workspace.is_some() {
                reading.as_ref().is_some_and(Reading::oom_killed)
            } else {
                oom_killed(sandbox, self.container, reading.as_ref()).await
            };
        End::Exited(ContainerExit {
            code,
            oom_killed,
            ran,
        })
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
