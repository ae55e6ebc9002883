//! `Ctx`: what the run loop, every task runner, the recovery and the reaper
//! share: the worker's Redis access, its Docker handle, its configuration and
//! warm pool, and the two things shutdown waits on.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cache::Caches;
use crate::config::Config;
use crate::egress::EgressProxy;
use crate::firewall::{Firewall, Refusals};
use crate::pool::Pool;
use crate::queue::Queue;
use crate::sandbox::Sandbox;
use crate::workspaces::Workspaces;

/// What every part of a running worker shares. Clones share it.
#[derive(Clone)]
pub struct Ctx {
    pub queue: Queue,
    pub sandbox: Sandbox,
    pub config: Arc<Config>,
    /// Cancelled when the worker's shutdown grace period is over.
    pub abort: CancellationToken,
    pub pool: Pool,
    /// The owners' dependency caches on this host.
    pub caches: Caches,
    /// The task firewall, checked before each task starts (None with
    /// `TASK_FIREWALL=off`).
    pub firewall: Option<Firewall>,
    /// What tasks may not reach: the firewall and the egress proxy follow
    /// it, and the heartbeat reads the Redis hosts into it again.
    pub refusals: Refusals,
    /// The egress proxy of allow-list tasks.
    pub egress: EgressProxy,
    /// Workspace versions: restored before a task, saved after it.
    pub workspaces: Workspaces,
    /// Removals of ended tasks' containers and files, waited for at shutdown.
    pub cleanups: TaskTracker,
}
