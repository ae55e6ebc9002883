//! The blob store's sweep, and the fence that keeps it off a save's blobs.
//!
//! Blobs and manifests are content-addressed and shared between versions, so
//! nothing deletes them when a version goes (WS_COMMIT drops versions past the
//! kept count, WS_DELETE whole workspaces). The sweep deletes those no kept
//! version names, once they are older than a minimum age. Every worker tries
//! every `WORKSPACE_SWEEP_SECONDS`; WS_SWEEP lets one at a time, once per
//! interval:
//!
//! 1. `begin`: the sweep is this worker's, for a lease it renews as it goes.
//! 2. The store is listed; blobs and manifests older than the minimum age are
//!    the candidates.
//! 3. Every kept version is read (Redis), and its manifest (the store): what is
//!    named. A read that fails ends the sweep, deleting nothing.
//! 4. `delete`: the epoch counts up, and no save may begin (`look`) until the
//!    phase ends.
//! 5. Every kept version is read again, and any manifest not read yet; then
//!    `renew`, and if a fork ran since 4, the sweep ends, deleting nothing.
//! 6. The candidates still named by nothing are deleted, in batches, the lease
//!    renewed between them, for at most `DELETE_PHASE`; the rest wait for the
//!    next sweep, so saves never wait long.
//! 7. `end`.
//!
//! **The invariant: a blob a kept version names is never deleted.**
//! - A version committed before step 5 is read there.
//! - A save records the epoch before it checks a blob (`epoch`), and WS_COMMIT
//!   refuses it in another epoch: a save that began before step 4 is told
//!   `sweep_moved`, checks its blobs again, sending the ones gone, and commits
//!   in the new epoch (`commit`). A save that begins after step 4 began after
//!   the phase's deletes.
//! - A fork names an existing version's manifest from a new workspace, which
//!   step 5's read may have passed; each fork counts `forks` up (WS_FORK).
//! - The blobs a save did not send are its base version's, which stays kept
//!   until this very task's commit (one task at a time per workspace).
//!
//! Object stores have no fencing: a sweeper stalled past its lease (a paused
//! VM) could still delete after another phase began. The lease is long beside
//! a batch's time limit, and the minimum age (the save grace) protects a save's
//! fresh blobs besides.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use blobs::{BlobStore, Kind};
use futures_util::TryStreamExt;
use shared::scripts::{Saved, SweepOp, WsRefusal, WsReply};
use shared::workspace::{BlobDigest, VersionLimits, WorkspaceCaps, WorkspaceId};
use tokio_util::sync::CancellationToken;

use super::{StoredVersion, Workspaces};
use crate::queue::{Queue, QueueError};
use crate::retry;

/// How long a sweep holds WS_SWEEP without renewing: a worker that dies
/// sweeping keeps saves waiting (or other sweeps out) no longer than this.
const LEASE: Duration = Duration::from_secs(60);
/// Each delete request's time limit, well within the lease.
const BATCH_TIMEOUT: Duration = Duration::from_secs(20);
const BATCH: usize = 1000;
/// How long one delete phase deletes, while saves wait to begin.
const DELETE_PHASE: Duration = Duration::from_secs(20);
/// How often a save waiting out a delete phase looks again.
const LOOK_EVERY: Duration = Duration::from_millis(250);
/// How many times a save is sent again after a delete phase moved its epoch.
const COMMIT_TRIES: usize = 5;

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error(transparent)]
    Blob(#[from] blobs::BlobError),
    #[error(
        "workspace {workspace} version {version}: its manifest could not be read ({source}), so what it names is unknown and nothing was deleted; delete the workspace (`script-runner-ctl workspaces delete`) if the version is lost"
    )]
    Manifest {
        workspace: WorkspaceId,
        version: u64,
        #[source]
        source: blobs::BlobError,
    },
    #[error("deleting a batch took longer than {BATCH_TIMEOUT:?}")]
    Timeout,
    #[error("deleting a batch: {0}")]
    Deleting(#[source] blobs::BlobError),
    #[error("WS_SWEEP answered {0}")]
    Reply(String),
}

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Swept {
    /// Objects the store holds (blobs and manifests).
    pub listed: u64,
    /// Of them, those no kept version names, old enough to go.
    pub unnamed: u64,
    pub deleted: u64,
    /// Why it stopped short of deleting them all, if it did.
    pub stopped: Option<&'static str>,
}

/// What `Sweeper::sweep` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Swept(Swept),
    /// Another worker holds the sweep, or one ended within the interval.
    NotNow(WsRefusal),
}

/// The sweeper: the manifests it has read (immutable, being content-addressed),
/// kept between sweeps for those still named.
pub struct Sweeper {
    queue: Queue,
    store: BlobStore,
    /// Only objects written longer ago than this are deleted.
    min_age: Duration,
    every: Duration,
    manifests: HashMap<BlobDigest, Arc<[BlobDigest]>>,
    /// When the lease was last renewed.
    renewed: Instant,
    /// At shutdown: a delete phase ends after its batch, not mid-way.
    stop: CancellationToken,
}

impl Sweeper {
    /// `stop`: the worker's, which ends a delete phase after its batch.
    pub fn new(
        queue: Queue,
        workspaces: &Workspaces,
        min_age: Duration,
        every: Duration,
        stop: CancellationToken,
    ) -> Sweeper {
        Sweeper {
            queue,
            store: workspaces.store().clone(),
            min_age,
            every,
            manifests: HashMap::new(),
            renewed: Instant::now(),
            stop,
        }
    }

    /// Sweeps every `every` until the worker stops, logging each sweep.
    pub async fn run(mut self) {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.stop.cancelled() => return,
            }
            let started = Instant::now();
            match self.sweep().await {
                Ok(Outcome::Swept(s)) => tracing::info!(
                    listed = s.listed,
                    unnamed = s.unnamed,
                    deleted = s.deleted,
                    stopped = s.stopped,
                    ms = started.elapsed().as_millis() as u64,
                    "workspace store swept"
                ),
                Ok(Outcome::NotNow(why)) => {
                    tracing::debug!(why = why.as_str(), "workspace store sweep not needed now")
                }
                Err(e) => tracing::warn!(error = %e, "workspace store sweep failed"),
            }
        }
    }

    /// One sweep, as the module's header says.
    pub async fn sweep(&mut self) -> Result<Outcome, SweepError> {
        match self.op(SweepOp::Begin).await? {
            WsReply::Done(_) => {}
            WsReply::Refused { why, .. } => return Ok(Outcome::NotNow(why)),
        }
        self.renewed = Instant::now();
        let result = self.sweep_held().await;
        // A delete request that failed or timed out may still be carried out
        // by the store: the phase is left to its lease, so no save begins (and
        // finds a blob that is about to go) until the request is surely over.
        if let Err(SweepError::Timeout | SweepError::Deleting(_)) = &result {
            tokio::time::sleep(LEASE).await;
            return result.map(Outcome::Swept);
        }
        // Given up however else it went (a lost lease is given up already).
        if let Err(e) = self.op(SweepOp::End).await {
            tracing::warn!(error = %e, "could not end the workspace store sweep");
        }
        result.map(Outcome::Swept)
    }

    async fn sweep_held(&mut self) -> Result<Swept, SweepError> {
        let old_enough = SystemTime::now() - self.min_age;
        let mut candidates = Vec::new();
        let mut listed = 0;
        for kind in [Kind::Blob, Kind::Manifest] {
            let mut objects = self.store.list(kind);
            while let Some(o) = objects.try_next().await? {
                listed += 1;
                if o.written < old_enough {
                    candidates.push((o.kind, o.digest));
                }
                self.keep_due().await?;
            }
        }
        let mut swept = Swept {
            listed,
            ..Swept::default()
        };
        let named = self.named().await?;
        candidates.retain(|o| !named.contains(o));
        if candidates.is_empty() {
            return Ok(swept);
        }
        let forks = self.keep_op(SweepOp::Delete).await?;
        self.renewed = Instant::now();
        let phase = Instant::now();
        let named = self.named().await?;
        if self.keep_op(SweepOp::Renew).await? != forks {
            swept.stopped = Some("a workspace was forked while the sweep read what is named");
            return Ok(swept);
        }
        candidates.retain(|o| !named.contains(o));
        swept.unnamed = candidates.len() as u64;
        self.renewed = Instant::now();
        for batch in candidates.chunks(BATCH) {
            if phase.elapsed() > DELETE_PHASE {
                swept.stopped = Some("the delete phase's time ran out: the rest go next sweep");
                break;
            }
            if self.stop.is_cancelled() {
                swept.stopped = Some("the worker is stopping");
                break;
            }
            let deleted = tokio::time::timeout(BATCH_TIMEOUT, self.store.delete(batch.to_vec()))
                .await
                .map_err(|_| SweepError::Timeout)?
                .map_err(SweepError::Deleting)?;
            swept.deleted += deleted;
            self.keep_op(SweepOp::Renew).await?;
            self.renewed = Instant::now();
        }
        Ok(swept)
    }

    /// Every object a kept version names: its manifest, and the manifest's
    /// blobs. Manifests read before are not read again.
    async fn named(&mut self) -> Result<HashSet<(Kind, BlobDigest)>, SweepError> {
        let versions = self.queue.kept_versions().await?;
        let mut named = HashSet::new();
        let mut read = HashMap::new();
        for (workspace, v) in versions {
            self.keep_due().await?;
            let blobs = match self.manifests.get(&v.manifest) {
                Some(b) => b.clone(),
                None => {
                    let m = self
                        .store
                        .manifest(&v.manifest, VersionLimits::UNCAPPED)
                        .await
                        .map_err(|source| SweepError::Manifest {
                            workspace,
                            version: v.version,
                            source,
                        })?;
                    let blobs: Arc<[BlobDigest]> = m.blobs().into_iter().cloned().collect();
                    self.manifests.insert(v.manifest.clone(), blobs.clone());
                    blobs
                }
            };
            named.extend(blobs.iter().map(|b| (Kind::Blob, b.clone())));
            named.insert((Kind::Manifest, v.manifest.clone()));
            read.insert(v.manifest, blobs);
        }
        // Only the manifests still named are worth keeping in memory.
        self.manifests = read;
        Ok(named)
    }

    /// Renews the lease if a third of it has passed since it was; an error
    /// once it is lost.
    async fn keep_due(&mut self) -> Result<(), SweepError> {
        if self.renewed.elapsed() > LEASE / 3 {
            self.keep_op(SweepOp::Renew).await?;
            self.renewed = Instant::now();
        }
        Ok(())
    }

    /// `op` on a sweep this worker holds: the forks made so far.
    async fn keep_op(&self, op: SweepOp) -> Result<u64, SweepError> {
        match self.op(op).await? {
            WsReply::Done(forks) => Ok(forks),
            WsReply::Refused { why, detail } => {
                Err(SweepError::Reply(format!("{} {detail}", why.as_str())))
            }
        }
    }

    async fn op(&self, op: SweepOp) -> Result<WsReply, QueueError> {
        self.queue.ws_sweep(op, LEASE, self.every).await
    }
}

/// The sweep epoch a save begins in (WS_SWEEP `look`), waiting out a delete
/// phase: a blob the save finds in the store now might be gone by its commit.
/// Waits for Redis as long as `stop` has not fired.
pub async fn epoch(queue: &Queue, stop: &CancellationToken) -> Result<u64, String> {
    loop {
        let reply = retry::redis("look up the sweep epoch", stop, || {
            queue.ws_sweep(SweepOp::Look, Duration::ZERO, Duration::ZERO)
        })
        .await
        .map_err(|e| format!("the workspace store's sweep could not be read: {e}"))?;
        match reply {
            WsReply::Done(epoch) => return Ok(epoch),
            WsReply::Refused {
                why: WsRefusal::Sweeping,
                detail,
            } => {
                let left = detail.parse().map_or(LOOK_EVERY, Duration::from_millis);
                tokio::select! {
                    _ = tokio::time::sleep(left.min(LOOK_EVERY)) => {}
                    _ = stop.cancelled() => return Err("the worker stopped".to_owned()),
                }
            }
            WsReply::Refused { why, detail } => {
                return Err(format!("WS_SWEEP answered {} {detail}", why.as_str()));
            }
        }
    }
}

/// What a task is told when sweeps kept its version from being committed.
const SWEPT_AWAY: &str = "the workspace store was swept again and again while the version was stored, or its files could not be sent again: the workspace was left as it was";

/// What `commit` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Committed {
    /// WS_COMMIT's reply to the version.
    Reply(WsReply),
    /// Sweeps kept the version from being committed: the task was recorded
    /// as making none, for this reason.
    SweptAway(&'static str),
}

/// WS_COMMIT of `stored`, for task `task_id` on `workspace`. A commit refused
/// because a delete phase ran since the save began (`sweep_moved`) is sent
/// again in the new epoch, once the blobs it names are back in the store; if
/// that cannot be done, the task is recorded as making no version (so the
/// workspace is free at once, and the task says why).
pub async fn commit(
    queue: &Queue,
    workspaces: &Workspaces,
    stop: &CancellationToken,
    task_id: &str,
    workspace: (WorkspaceId, u64),
    stored: &mut StoredVersion,
    caps: WorkspaceCaps,
) -> Result<Committed, QueueError> {
    for resent in 0..=COMMIT_TRIES {
        let reply = retry::redis("commit the workspace version", stop, || {
            queue.ws_commit(task_id, workspace, stored.as_saved(), caps)
        })
        .await?;
        let WsReply::Refused {
            why: WsRefusal::SweepMoved,
            ..
        } = reply
        else {
            return Ok(Committed::Reply(reply));
        };
        if resent == COMMIT_TRIES {
            break;
        }
        let epoch = match epoch(queue, stop).await {
            Ok(epoch) => epoch,
            Err(e) => {
                tracing::warn!(task_id, error = %e, "could not look up the sweep epoch");
                break;
            }
        };
        tracing::info!(
            task_id,
            epoch,
            "a sweep ran during the save: its blobs are checked again"
        );
        if let Err(e) = workspaces.resend(stored, epoch).await {
            tracing::warn!(task_id, error = %e, "could not send the workspace version again");
            break;
        }
    }
    let reply = retry::redis("record the task as making no version", stop, || {
        queue.ws_commit(task_id, workspace, Saved::Nothing(SWEPT_AWAY), caps)
    })
    .await?;
    if reply != WsReply::Done(0) {
        tracing::warn!(
            task_id,
            ?reply,
            "recording the task as making no version was refused"
        );
    }
    Ok(Committed::SweptAway(SWEPT_AWAY))
}
