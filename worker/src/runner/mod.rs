//! One task from claim to acknowledgement:
//! claim -> source files -> container (a warm one from the pool, else a new
//! one), its waiting prelude handed the task -> supervise (tails, kill,
//! timeout; the exit status from the prelude) ->
//! its usage (the cgroup read at the end, or bounded from what was sampled
//! while it ran) -> record output and outcome -> ack. The container and source files
//! are removed in the background as soon as the process has ended: off the
//! critical path, and without waiting for Redis.
//!
//! The steps live beside this flow: `inputs` (the zip, stdin, collect and the
//! dependency cache, made ready for the container), `launch` (a cold or warm
//! start, and the clean-up after it), `supervise` (tails, kill, timeout and
//! how the task ended) and `meter` (what the task is charged).

mod edit;
mod inputs;
mod keep;
mod launch;
mod meter;
mod supervise;

use std::time::Duration;

use shared::TaskState;
use shared::options::Network;
use shared::scripts::{Ended, Progress};
use shared::spec::SpecRejection;
use shared::task::Outcome;
use shared::usage::Usage;

use crate::cache::Lease;
use crate::ctx::Ctx;
use crate::metrics::Claim;
use crate::queue::{Collected, Job, QueueError, TaskSpec, TaskStateReply, Work};
use crate::retry;
use crate::sandbox::ContainerSpec;

use inputs::{Inputs, WarmDirs};
use launch::{clean_up, launch_cold, launch_warm, return_cache};
use supervise::{Tails, supervise};

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
    let verifier = &ctx.config.verifier;
    let read = retry::redis("read task", &ctx.abort, || {
        ctx.queue.task_spec(task_id, verifier)
    })
    .await?;
    let mut spec = match read {
        None => return Ok(None),
        Some(Ok(Work::Script(spec))) => spec,
        Some(Ok(Work::Edit(edit))) => {
            tracing::info!(task_id, workspace = %edit.workspace.0, "edit claimed");
            let outcome = edit::run(ctx, task_id, &edit).await;
            let ended = Ended {
                owner: &edit.owner,
                ..Ended::default()
            };
            return record_end(ctx, task_id, &outcome, &ended, None).await;
        }
        Some(Err(rejection)) => return reject(ctx, task_id, &rejection).await,
    };
    let cap = ctx.config.max_timeout_seconds;
    if spec.timeout_seconds > cap {
        tracing::warn!(
            task_id,
            asked = spec.timeout_seconds,
            cap,
            "timeout lowered to this worker's MAX_TIMEOUT_SECONDS"
        );
        spec.timeout_seconds = cap;
    }
    tracing::info!(task_id, runtime = %spec.runtime, "task claimed");
    let mut collected = None;
    let mut usage = Usage::default();
    let mut saved = None;
    let (outcome, tails) =
        execute(ctx, task_id, &spec, &mut collected, &mut usage, &mut saved).await;
    // Before FINISH: a task that shows as ended has its version, if it made one.
    if let Some(workspace) = spec.workspace {
        let mut saved = saved.unwrap_or_else(|| Err(keep::NOT_RUN.to_owned()));
        // Made or not, the record says so (`workspace_version` or `_note`).
        let _made = keep::commit(ctx, task_id, workspace, &mut saved).await;
    }
    // The container is gone by now: only the record is left to write, and it is
    // worth waiting for Redis as long as this worker lives. The final tails go
    // with the finish, on its connection (see `Queue::finish`).
    let snapshot = tails.as_ref().map(Tails::snapshot);
    let last = snapshot.as_ref().map(|s| s.progress());
    let ended = Ended {
        collected: collected.as_ref().map(|c| (&c.zip[..], c.listing.as_str())),
        usage,
        owner: &spec.owner,
    };
    record_end(ctx, task_id, &outcome, &ended, last.as_ref()).await
}

/// Writes how the task ended (FINISH), waiting for Redis as long as this
/// worker lives; the state recorded, or `None` if the task is gone or no
/// longer this worker's.
async fn record_end(
    ctx: &Ctx,
    task_id: &str,
    outcome: &Outcome,
    ended: &Ended<'_>,
    last: Option<&Progress<'_>>,
) -> Result<Option<TaskState>, QueueError> {
    let retention = ctx.config.retention_seconds;
    let reply = retry::redis("finish", &ctx.abort, || {
        ctx.queue.finish(task_id, outcome, retention, ended, last)
    })
    .await?;
    Ok(match reply {
        TaskStateReply::State(s) => Some(s),
        TaskStateReply::Missing | TaskStateReply::NotOwner => None,
    })
}

/// Ends a task whose spec does not verify, having run nothing of it. Nothing
/// is counted to the owner its record names: that name is not to be trusted.
async fn reject(
    ctx: &Ctx,
    task_id: &str,
    rejection: &SpecRejection,
) -> Result<Option<TaskState>, QueueError> {
    tracing::warn!(task_id, "task refused, nothing run: {rejection}");
    ctx.sandbox.metrics().spec_rejected();
    let outcome = Outcome::spec_rejected(rejection);
    record_end(ctx, task_id, &outcome, &Ended::default(), None).await
}

/// A cold task's restored workspace directory, removed with the task (a warm
/// one's goes with the pool container's directory).
fn own_restore(inputs: &Inputs) -> Option<std::path::PathBuf> {
    let (dir, _) = inputs.restored.as_ref().filter(|_| inputs.own_restore)?;
    Some(dir.clone())
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
    saved: &mut Option<Result<crate::workspaces::StoredVersion, String>>,
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
    // A task without a network must not run where a network was set up; an
    // allow-list task takes one of the egress network's pool.
    let mut warm = match spec.egress.network() {
        network @ (Network::Internet | Network::Allow) => ctx.pool.take(&spec.runtime, network),
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
            restore: w.restore(),
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
        let mut env = inputs.env(spec);
        // The proxy's variables win over the task's own: they are its only way out.
        if spec.egress.allow_list().is_some() {
            let ours = ctx.egress.env();
            env.retain(|(k, _)| !ours.iter().any(|(o, _)| o == k));
            env.extend(ours);
        }
        let container_spec = ContainerSpec {
            task_id,
            image,
            command: &spec.command,
            source: inputs.source.as_deref(),
            restore: inputs.restored.as_ref().map(|(dir, _)| dir.as_path()),
            workspace: spec.workspace.is_some(),
            timeout_seconds: spec.timeout_seconds,
            env: &env,
            network: spec.egress.network(),
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
            Some(w) => {
                match launch_warm(ctx, w, &container_spec, stdin, spec.egress.allow_list()).await {
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
                }
            }
            None => {
                let launched =
                    launch_cold(ctx, &container_spec, stdin, spec.egress.allow_list()).await;
                break (launched, inputs);
            }
        }
    };
    if ctx.pool.enabled() {
        ctx.sandbox.metrics().pool_claim(claim);
    }
    match launched {
        Ok(launched) => {
            let container = launched.container.clone();
            let (ended, used) = supervise(ctx, task_id, spec, launched).await;
            if let (_, Some(tails)) = &ended {
                tails.end_egress().await;
            }
            if let Some(lease) = &inputs.cache {
                ctx.caches.returning(lease);
            }
            *usage = used;
            let restored = own_restore(&inputs);
            // Its container is paused, not gone: its files are read now.
            // Before the collector finishes: that removes the collect
            // directory, and the engine mounts every one of the container's
            // mounts to read its /workspace, so a save after it failed with
            // "not a directory" (found by the console's browser test).
            if spec.workspace.is_some() {
                let base = inputs.restored.as_ref().map(|(_, m)| m);
                *saved = Some(keep::save(ctx, task_id, &container, base).await);
            }
            if let Some(c) = inputs.collector {
                *collected = c.finish().await;
            }
            ctx.cleanups.spawn(clean_up(
                ctx.clone(),
                Some(container),
                inputs.source,
                restored,
                warm,
                inputs.cache,
            ));
            ended
        }
        Err((outcome, container)) => {
            let restored = own_restore(&inputs);
            if let Some(c) = inputs.collector {
                c.finish().await;
            }
            ctx.cleanups.spawn(clean_up(
                ctx.clone(),
                container,
                inputs.source,
                restored,
                warm,
                inputs.cache,
            ));
            (outcome, None)
        }
    }
}
