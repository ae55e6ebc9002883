//! `script-runner-ctl tasks kill`: ends every active (queued or running) task
//! of one owner, as `kill_task` ends one: through the KILL script
//! (`ScriptCall::kill`, run by `store::scripts::invoke_all`), which checks the
//! state, and for an owner the record's owner, in the same step. A worker
//! running one sees the state on its next tick and stops the container; a
//! queued one is skipped when a worker reads it. Recorded as
//! `ReasonKind::KilledByOperator` (`Outcome::killed_by_operator`).
//!
//! Where the tasks are found, bounded like every read of the ctl:
//! - an API key's or OAuth subject's: the owner's active set
//!   (`Keys::owner_active`, `ZSCAN ... COUNT`), which SUBMIT fills for every
//!   owned task and which holds little more than its active ones;
//! - the admin key's (no owner, so in no such set): the jobs stream
//!   (`XRANGE ... COUNT`), where every task not yet finished has its entry.
//!
//! At most `MAX_TASKS` are looked at per call; past them the result says so,
//! and running it again kills the rest (the ones killed no longer count).

use redis::streams::StreamRangeReply;
use shared::keys::JOB_TASK_ID;
use shared::scripts::{KillReply, ScriptCall};
use shared::task::{OperatorKill, Outcome};
use shared::{Field, Keys, Owner, TaskState};
use store::redis_pool::{Connection, Pool};
use store::tasks::Tasks;

use crate::{Config, CtlError};

/// At most this many of an owner's tasks (entries of its active set, or jobs
/// in the stream for the admin) are looked at per call.
pub const MAX_TASKS: usize = 10_000;
/// Entries asked for per `ZSCAN` or `XRANGE`, and kills sent per pipeline.
const PAGE: usize = 500;

/// The fields read to pick the active tasks.
const PICK_FIELDS: [Field; 2] = [Field::State, Field::Owner];

/// What a kill of an owner's tasks did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Killed {
    /// The tasks this call killed (queued or running until then), by id.
    pub task_ids: Vec<String>,
    /// More than `MAX_TASKS` were there to look at: run it again for the rest.
    pub truncated: bool,
}

/// The ctl's handle on the task records, for kills.
pub struct TaskAdmin {
    pool: Pool,
    keys: Keys,
    tasks: Tasks,
    retention_seconds: u64,
    replica_ack: Option<shared::envvar::ReplicaAck>,
}

impl TaskAdmin {
    pub async fn new(config: &Config) -> Result<TaskAdmin, CtlError> {
        Ok(TaskAdmin {
            pool: config.pool(1).await?,
            keys: config.keys.clone(),
            tasks: Tasks::new(config.keys.clone()),
            retention_seconds: config.retention_seconds,
            replica_ack: config.redis.replica_ack,
        })
    }

    /// Kills every queued or running task of `owner` (`Owner::Admin`: the admin
    /// key's tasks, not everyone's); `why` is the reason recorded. With
    /// `REDIS_MIN_REPLICAS_ACK`, returns once the replicas have the kills.
    pub async fn kill_all_of(&self, owner: &Owner, why: OperatorKill) -> Result<Killed, CtlError> {
        let mut conn = self.pool.get().await?;
        let (candidates, truncated) = match owner {
            Owner::Admin => self.stream_tasks(&mut conn).await?,
            _ => self.active_set(&mut conn, owner).await?,
        };
        let outcome = Outcome::killed_by_operator(why);
        let mut task_ids = Vec::new();
        for page in candidates.chunks(PAGE) {
            let records = self.tasks.read_many(&mut conn, page, &PICK_FIELDS).await?;
            // Only the owner's own, and only what is still active: an ended
            // task's entry waits in the set for the next submit to drop it.
            let active: Vec<&String> = page
                .iter()
                .zip(records)
                .filter_map(|(id, record)| {
                    let r = record.ok()??;
                    let theirs = r.owner.as_ref().unwrap_or(&Owner::Admin) == owner;
                    (theirs && !r.state.is_terminal()).then_some(id)
                })
                .collect();
            if active.is_empty() {
                continue;
            }
            // The script checks the owner again (the admin's call checks none:
            // the owner was read above, and a task's owner never changes).
            let calls: Vec<ScriptCall<KillReply>> = active
                .iter()
                .map(|id| {
                    ScriptCall::kill(
                        &self.keys,
                        id,
                        &outcome.reason,
                        outcome.kind,
                        self.retention_seconds,
                        owner,
                    )
                })
                .collect();
            let refs: Vec<&ScriptCall<KillReply>> = calls.iter().collect();
            let replies = store::scripts::invoke_all(&mut conn, &refs).await?;
            for (id, reply) in active.into_iter().zip(replies) {
                if reply == KillReply::State(TaskState::Killed, true) {
                    task_ids.push(id.clone());
                }
            }
        }
        // As the api's kill: acknowledged, then lost in a failover, would let
        // the tasks run on. WAIT covers every write on this connection.
        if !task_ids.is_empty() {
            store::redis_pool::replicated(&mut conn, self.replica_ack).await?;
        }
        Ok(Killed {
            task_ids,
            truncated,
        })
    }

    /// The task ids in `owner`'s active set (`ZSCAN`), up to `MAX_TASKS`.
    async fn active_set(
        &self,
        conn: &mut Connection,
        owner: &Owner,
    ) -> Result<(Vec<String>, bool), CtlError> {
        let key = self.keys.owner_active(&owner.as_stored());
        let mut ids: Vec<String> = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            // Members and scores, alternating.
            let (next, batch): (u64, Vec<String>) = redis::cmd("ZSCAN")
                .arg(&key)
                .arg(cursor)
                .arg("COUNT")
                .arg(PAGE)
                .query_async(conn)
                .await?;
            ids.extend(batch.into_iter().step_by(2));
            cursor = next;
            if cursor == 0 || ids.len() > MAX_TASKS {
                break;
            }
        }
        // SCAN may return a member twice.
        ids.sort();
        ids.dedup();
        Ok(capped(ids, cursor != 0))
    }

    /// The task ids of the jobs stream's entries (`XRANGE`, oldest first), up
    /// to `MAX_TASKS`: every task not finished yet has one.
    async fn stream_tasks(&self, conn: &mut Connection) -> Result<(Vec<String>, bool), CtlError> {
        let jobs = self.keys.jobs();
        let mut ids: Vec<String> = Vec::new();
        let mut start = "-".to_owned();
        let more = loop {
            let page: StreamRangeReply = redis::cmd("XRANGE")
                .arg(&jobs)
                .arg(&start)
                .arg("+")
                .arg("COUNT")
                .arg(PAGE)
                .query_async(conn)
                .await?;
            let Some(last) = page.ids.last() else {
                break false;
            };
            start = format!("({}", last.id);
            let full = page.ids.len() == PAGE;
            ids.extend(page.ids.iter().filter_map(|e| e.get::<String>(JOB_TASK_ID)));
            if !full || ids.len() > MAX_TASKS {
                break full;
            }
        };
        // A task requeued has a second entry for a while.
        ids.sort();
        ids.dedup();
        Ok(capped(ids, more))
    }
}

/// `ids` cut to `MAX_TASKS`, and whether there were (or may be) more.
fn capped(mut ids: Vec<String>, more: bool) -> (Vec<String>, bool) {
    let over = ids.len() > MAX_TASKS;
    ids.truncate(MAX_TASKS);
    (ids, more || over)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_max_tasks_are_looked_at_and_the_cut_is_said() {
        let ids = |n: usize| (0..n).map(|i| i.to_string()).collect::<Vec<_>>();
        assert_eq!(capped(ids(3), false), (ids(3), false));
        assert_eq!(capped(ids(3), true), (ids(3), true));
        let (kept, more) = capped(ids(MAX_TASKS + 1), false);
        assert_eq!((kept.len(), more), (MAX_TASKS, true));
    }
}
