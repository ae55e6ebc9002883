//! The reaper: settles the jobs of workers that died and never came back.
//!
//! Every worker runs one. A worker whose heartbeat key has been gone for a full
//! heartbeat period (seen continuously by this reaper, so a Redis outage that
//! expired every heartbeat at once does not condemn live workers) is dead: its
//! unacknowledged jobs are claimed here with `XCLAIM` (with a minimum idle time,
//! so two reapers never both take one) and settled like a restart would:
//! a task that was still queued goes back to the stream for any worker; one that
//! was running is recorded as killed, "worker lost", since its container went
//! with its worker. Containers the
//! dead worker left on this host's engine are removed; then it is forgotten.
//!
//! Deadlines need nothing more: a live worker enforces its own tasks' timeouts,
//! every container enforces its own shortly after (see `sandbox::prelude`),
//! and a dead worker's running tasks end here.
//!
//! It also settles this worker's own orphans: entries pending under its name that
//! no runner of it holds (a reply to `XREADGROUP` lost on the way, a record that
//! could not be read) would otherwise wait for its next restart.
//!
//! The registry (`Keys::workers`) is what any worker's Redis user wrote to it,
//! so a name is reaped only once it parses as a `WorkerName`: one that could be
//! no worker's (`../x`, `a/b`) is logged once and skipped, and never becomes a
//! path under `TASKS_DIR`.
//!
//! And it collects garbage in `TASKS_DIR`: the extracted zip of a task that is
//! no longer queued or running (left by a worker that died on this host and was
//! settled from elsewhere) is removed. Task records expire by themselves (TTL).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use shared::WorkerName;
use shared::task::Outcome;
use tokio_util::sync::CancellationToken;

use crate::ctx::Ctx;
use crate::queue::{QueueError, TaskStateReply};
use crate::recovery::{remove_leftovers_of, settle_or_log};
use crate::slots::Slots;

pub async fn run(ctx: Ctx, slots: Slots, stop: CancellationToken) {
    let ttl = ctx.config.heartbeat_ttl;
    let mut suspects: HashMap<String, Instant> = HashMap::new();
    let mut refused = Refused::default();
    let mut every = tokio::time::interval((ttl / 3).max(Duration::from_millis(500)));
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = stop.cancelled() => return,
        }
        if let Err(e) = reap(&ctx, &mut suspects, &mut refused, ttl).await {
            // A pass that could not look saw no heartbeat missing: suspicion must
            // be continuous. Kept through a Redis outage (which expires every
            // heartbeat), it would condemn a live worker on the first pass after.
            suspects.clear();
            tracing::warn!(error = %e, "reaper pass failed");
        }
        if let Err(e) = reclaim_orphans(&ctx, &slots, ttl).await {
            tracing::warn!(error = %e, "orphan pass failed");
        }
        if let Err(e) = collect_garbage(&ctx).await {
            tracing::warn!(error = %e, "TASKS_DIR clean-up failed");
        }
    }
}

/// The names in the registry that are no worker's, each logged once: a
/// planted name is skipped on every pass, and said once, not every pass.
#[derive(Default)]
struct Refused(HashSet<String>);

impl Refused {
    /// At most this many names are remembered; past them, a new bad name is
    /// still skipped, only no longer logged.
    const CAP: usize = 1000;

    /// `name` as a worker name, or `None` (logged the first time) if it is none.
    fn check(&mut self, name: String) -> Option<WorkerName> {
        match WorkerName::parse(&name) {
            Ok(name) => Some(name),
            Err(e) => {
                if self.0.len() < Self::CAP && self.0.insert(name) {
                    tracing::warn!(
                        error = %e,
                        "skipped a name in the worker registry that is no worker's: it is \
                         never reaped nor used as a path (written there by hand, or by a \
                         worker host's Redis user)"
                    );
                }
                None
            }
        }
    }
}

async fn reap(
    ctx: &Ctx,
    suspects: &mut HashMap<String, Instant>,
    refused: &mut Refused,
    ttl: Duration,
) -> Result<(), QueueError> {
    let me = ctx.queue.worker().to_owned();
    let mut seen_dead = Vec::new();
    for name in ctx.queue.workers().await? {
        let Some(worker) = refused.check(name) else {
            continue;
        };
        let name = worker.to_string();
        if name == me || ctx.queue.is_alive(&name).await? {
            continue;
        }
        let since = *suspects.entry(name.clone()).or_insert_with(Instant::now);
        seen_dead.push(name.clone());
        if since.elapsed() < ttl {
            continue;
        }
        let jobs = ctx.queue.claim_pending_of(&name, ttl, |_| false).await?;
        if !jobs.is_empty() {
            tracing::warn!(worker = %name, jobs = jobs.len(), "settling the jobs of a lost worker");
        }
        for job in jobs {
            settle_or_log(ctx, job, Outcome::worker_lost()).await;
        }
        // It may have come back while its jobs were settled: then its containers
        // are its own again.
        if ctx.queue.is_alive(&name).await? {
            continue;
        }
        // Only what it made before it fell silent: a new process under its name
        // (a restart racing this pass) makes containers after that.
        let silent_at = std::time::SystemTime::now()
            .checked_sub(since.elapsed())
            .unwrap_or(std::time::UNIX_EPOCH);
        let silent_since = silent_at
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        match remove_leftovers_of(ctx, &worker, Some(silent_since)).await {
            Ok(0) => {}
            Ok(n) => {
                tracing::warn!(worker = %name, containers = n, "removed a lost worker's containers")
            }
            Err(e) => {
                tracing::warn!(worker = %name, error = %e, "could not list a lost worker's containers")
            }
        }
        if ctx.queue.forget_worker(&name).await? {
            tracing::info!(worker = %name, "lost worker forgotten");
            // Its caches only save time, and a process back under its name
            // opens them anew; left, they would hold disk forever.
            crate::cache::Caches::remove_of(&ctx.config.tasks_dir, &worker, silent_at).await;
        }
    }
    // A worker that came back (or was forgotten) is no longer a suspect.
    suspects.retain(|name, _| seen_dead.contains(name));
    Ok(())
}

/// Settles entries pending under this worker that none of its runners holds and
/// that have been idle for two heartbeat periods (a job just read is not idle
/// yet, so the moment between the read and its runner starting is safe).
async fn reclaim_orphans(ctx: &Ctx, slots: &Slots, ttl: Duration) -> Result<(), QueueError> {
    let me = ctx.queue.worker().to_owned();
    let orphans = ctx
        .queue
        .claim_pending_of(&me, ttl * 2, |entry| slots.holds(entry))
        .await?;
    for job in orphans {
        if slots.runs_task(&job.task_id) {
            // A second entry for a task a runner here is running: drop the copy.
            tracing::warn!(task_id = %job.task_id, entry = %job.entry_id, "duplicate job dropped");
            ctx.queue.ack(&job.entry_id).await?;
            continue;
        }
        tracing::warn!(task_id = %job.task_id, entry = %job.entry_id, "settling a job no runner holds");
        settle_or_log(ctx, job, Outcome::orphaned()).await;
    }
    Ok(())
}

/// Removes extracted zips of tasks that have ended. A directory whose task has
/// no record under this deployment's prefix is removed only once it is older
/// than the retention period: it may belong to another deployment sharing
/// `TASKS_DIR`, or be a task record that simply expired.
async fn collect_garbage(ctx: &Ctx) -> Result<(), QueueError> {
    let dir = ctx.config.tasks_dir.clone();
    let retention = Duration::from_secs(ctx.config.retention_seconds);
    let entries = tokio::task::spawn_blocking(move || -> Vec<(String, bool)> {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        entries
            .filter_map(|e| {
                let e = e.ok()?;
                let old = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > retention);
                Some((e.file_name().into_string().ok()?, old))
            })
            .collect()
    })
    .await
    .unwrap_or_default();
    for (name, old) in entries {
        // Only task ids are ours to judge (a task's zip directory, or its
        // restored workspace, `<id>.restore`); anything else in TASKS_DIR is
        // left alone.
        let task_id = name.strip_suffix(".restore").unwrap_or(&name);
        if uuid::Uuid::parse_str(task_id).is_err() {
            continue;
        }
        let remove = match ctx.queue.state(task_id).await? {
            TaskStateReply::Missing => old,
            TaskStateReply::State(s) => s.is_terminal(),
            TaskStateReply::NotOwner => false,
        };
        if remove {
            let path = ctx.config.tasks_dir.join(&name);
            tracing::info!(task_id, "removing a finished task's leftover files");
            let _ = tokio::task::spawn_blocking(move || crate::source::remove(&path)).await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_worker_names_are_reaped_and_each_bad_one_is_remembered_once() {
        let mut refused = Refused::default();
        assert_eq!(
            refused.check("w-1".into()).map(|w| w.to_string()),
            Some("w-1".to_owned())
        );
        for bad in ["../x", "x/../../y", "..", ".", "", "../x"] {
            assert!(refused.check(bad.into()).is_none(), "{bad:?}");
        }
        assert_eq!(refused.0.len(), 5, "{:?}", refused.0);
        // Bounded: past the cap, bad names are still refused, no longer kept.
        for i in 0..2 * Refused::CAP {
            assert!(refused.check(format!("../{i}")).is_none());
        }
        assert_eq!(refused.0.len(), Refused::CAP);
    }
}
