//! `kill_task`: one script that checks the owner and ends the task.

use shared::scripts::{KillReply, ScriptCall};
use shared::task::KILLED_BY_USER_REASON;
use shared::{Owner, ReasonKind, TaskState};
use store::scripts;

use super::{Store, StoreError};

impl Store {
    /// Kills a queued or running task. `None` if there is no such task, or
    /// (`owner` not the admin) it is another owner's; otherwise its state after the
    /// call and whether this call killed it. The owner is checked in the same
    /// script, so another owner's task is never touched.
    pub async fn kill(
        &self,
        id: &str,
        retention_seconds: u64,
        owner: &Owner,
    ) -> Result<Option<(TaskState, bool)>, StoreError> {
        let mut conn = self.pool.get().await?;
        let call = ScriptCall::kill(
            &self.keys,
            id,
            KILLED_BY_USER_REASON,
            ReasonKind::KilledByUser,
            retention_seconds,
            owner,
        );
        let reply = scripts::invoke(&mut conn, &call).await?;
        // A kill acknowledged and then lost in a failover would let the task
        // run on. Only a killed task has anything to confirm (a retried kill
        // writes its state again, so this covers the first one too); an unknown
        // id gets its answer whatever the replicas do.
        if let KillReply::State(TaskState::Killed, _) = reply {
            store::redis_pool::replicated(&mut conn, self.replica_ack).await?;
        }
        Ok(match reply {
            KillReply::Missing => None,
            KillReply::State(state, killed) => Some((state, killed)),
        })
    }
}
