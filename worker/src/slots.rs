//! The worker's capacity: `WORKER_CONCURRENCY` slots, the runners holding them,
//! and the stream entries those runners hold (any other entry pending under this
//! worker's name is an orphan, see the reaper).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::task::TaskTracker;

use crate::ctx::Ctx;
use crate::queue::Job;
use crate::runner;

/// The slots and their runners. Clones share them.
#[derive(Clone)]
pub struct Slots {
    free: Arc<Semaphore>,
    runners: TaskTracker,
    /// Stream entries a runner of this worker is working on right now, with their
    /// task ids.
    held: Arc<Mutex<HashMap<String, String>>>,
}

impl Slots {
    pub fn new(concurrency: usize) -> Slots {
        Slots {
            free: Arc::new(Semaphore::new(concurrency)),
            runners: TaskTracker::new(),
            held: Arc::default(),
        }
    }

    /// Waits for a free slot.
    pub async fn acquire(&self) -> Option<OwnedSemaphorePermit> {
        self.free.clone().acquire_owned().await.ok()
    }

    /// Runs `job` in the background, holding `permit` until it is done.
    pub fn spawn(&self, ctx: &Ctx, job: Job, permit: OwnedSemaphorePermit) {
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

    /// How many runners are running. Not the used slots: the job reader holds a
    /// slot during every blocking read, so an idle worker would count one.
    pub fn running(&self) -> usize {
        self.runners.len()
    }

    /// Takes no new runner; then `wait` resolves once the last one is done.
    pub fn close(&self) {
        self.runners.close();
    }

    /// Waits until every runner is done (after `close`).
    pub async fn wait(&self) {
        self.runners.wait().await;
    }

    /// Whether a runner of this worker holds stream entry `entry_id`.
    pub fn holds(&self, entry_id: &str) -> bool {
        lock(&self.held).contains_key(entry_id)
    }

    /// Whether a runner of this worker is running task `task_id` (from any entry).
    pub fn runs_task(&self, task_id: &str) -> bool {
        lock(&self.held).values().any(|t| t == task_id)
    }
}

/// The set is only touched for an insert, a remove or a lookup, never across an
/// await, so a poisoned lock can only mean a panic in one of those: keep going.
fn lock(held: &Mutex<HashMap<String, String>>) -> MutexGuard<'_, HashMap<String, String>> {
    held.lock().unwrap_or_else(PoisonError::into_inner)
}
