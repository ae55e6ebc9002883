//! `run_script`'s write: the task record, its zip and its job, in one script.

use deadpool_redis::redis;
use shared::ReasonKind;
use shared::TaskRecord;
use shared::scripts::{ScriptCall, Submit, SubmitReply};
use shared::task::NOT_REPLICATED_REASON;
use store::redis_pool::{LeanConnection, ReplicationError};
use store::scripts::{self, InvokeError};

use super::{Store, StoreError};

impl Store {
    /// Stores `record` (and the task's zip and stdin) and queues its job, all or
    /// nothing, unless the service's backlog cap or the owner's quota refuses it
    /// (one script: the checks and the submit are one step).
    pub async fn submit(
        &self,
        submit: &Submit<'_>,
        record: &TaskRecord,
    ) -> Result<SubmitReply, StoreError> {
        let call = ScriptCall::submit(&self.keys, submit, record);
        let mut conn = self.pool.get().await?;
        let submitted = scripts::invoke(&mut conn, &call).await?;
        if submitted == SubmitReply::Queued {
            self.confirm_submit(&mut conn, submit.task_id).await?;
        }
        Ok(submitted)
    }

    /// A submit is acknowledged (its id handed out) only once the replicas
    /// `REDIS_MIN_REPLICAS_ACK` asks for have it: a failover could otherwise
    /// lose a task its client was told exists. One that could not be confirmed
    /// is withdrawn (killed, so no worker runs it if it survives) and the client
    /// is told to try again.
    async fn confirm_submit(
        &self,
        conn: &mut LeanConnection,
        task_id: &str,
    ) -> Result<(), StoreError> {
        let Err(e) = store::redis_pool::replicated(conn, self.replica_ack).await else {
            return Ok(());
        };
        // A short count leaves the connection usable; a Redis error may not.
        let same_connection = matches!(e, ReplicationError::Short(_));
        let error = StoreError::from(e);
        let withdraw = ScriptCall::kill(
            &self.keys,
            task_id,
            NOT_REPLICATED_REASON,
            ReasonKind::NotReplicated,
            // Nobody was given its id: kept only long enough for an operator to see it.
            shared::envvar::MIN_RETENTION_SECONDS,
            &shared::owner::ADMIN,
        );
        // On the submit's connection while it works (so to the same node, after
        // it), waiting for the replicas as long as the submit did: a replica
        // that got the submit then likely gets the withdrawal too. Best effort:
        // the client is told to try again whatever happens here.
        let withdrawn = if same_connection {
            match scripts::invoke(conn, &withdraw).await {
                Ok(_) => {
                    let _ = store::redis_pool::replicated(conn, self.replica_ack).await;
                    Ok(())
                }
                Err(e) => Err(e),
            }
        } else {
            match self.pool.get().await {
                Ok(mut c) => scripts::invoke(&mut c, &withdraw).await.map(|_| ()),
                Err(e) => Err(InvokeError::Redis(redis::RedisError::from(
                    std::io::Error::other(e.to_string()),
                ))),
            }
        };
        match withdrawn {
            Ok(()) => {
                tracing::warn!(task_id = %task_id, error = %error, "submit withdrawn: not replicated")
            }
            Err(e) => tracing::warn!(
                task_id = %task_id, error = %error, withdraw_error = %e,
                "submit not replicated, and could not be withdrawn (if it survives, it runs)"
            ),
        }
        Err(error)
    }
}
