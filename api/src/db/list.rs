//! `list_tasks`: pages of the creation-time index, newest first, bounded per call.

use deadpool_redis::redis::{self, AsyncCommands};
use shared::{Field, Owner, ReasonKind, TaskState};

use super::{Store, StoreError};

/// Index entries read per round trip when listing.
const LIST_BATCH: usize = 100;

/// The fields `list` reads of each record.
const LISTED_FIELDS: [Field; 14] = [
    Field::State,
    Field::Runtime,
    Field::Command,
    Field::ExitCode,
    Field::Reason,
    Field::ReasonKind,
    Field::FinishedAt,
    Field::UsageCpuMs,
    Field::UsagePeakMemoryBytes,
    Field::UsageWorkspaceBytes,
    Field::UsageEstimated,
    // shared::view::WORKSPACE_FIELDS (the test below holds them to it)
    Field::WorkspaceId,
    Field::WorkspaceVersion,
    Field::WorkspaceNote,
];

/// Where a page of `list` ended: the last task examined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListCursor {
    pub created_ms: i64,
    pub task_id: String,
}

impl ListCursor {
    /// Whether the entry (`ms`, `id`) comes after this cursor, newest first.
    fn is_before(&self, ms: i64, id: &str) -> bool {
        ms < self.created_ms || (ms == self.created_ms && id < self.task_id.as_str())
    }
}

/// A task as `list_tasks` shows it.
#[derive(Debug, Clone)]
pub struct ListedTask {
    pub task_id: String,
    pub created_ms: i64,
    pub state: TaskState,
    pub runtime: String,
    pub command: String,
    pub exit_code: Option<i64>,
    pub reason: Option<String>,
    pub reason_kind: Option<ReasonKind>,
    pub finished_ms: Option<i64>,
    pub usage: Option<shared::usage::Usage>,
    pub workspace: Option<shared::view::WorkspaceView>,
}

impl ListedTask {
    fn new(task_id: String, created_ms: i64, r: shared::TaskRecord) -> ListedTask {
        let usage = shared::usage::Usage::of(&r);
        let workspace = shared::view::WorkspaceView::of(&r);
        ListedTask {
            task_id,
            created_ms,
            state: r.state,
            runtime: r.runtime.map(|n| n.to_string()).unwrap_or_default(),
            command: r.command.unwrap_or_default(),
            exit_code: r.exit_code,
            reason: r.reason,
            reason_kind: r.reason_kind,
            finished_ms: r.finished_at,
            usage,
            workspace,
        }
    }
}

impl Store {
    /// One page of tasks, newest first, after `cursor` (the last one a previous
    /// page ended on), keeping those `keep` accepts, at most `limit` of them.
    /// Examines at most `max_examined` index entries, so a rare filter costs a
    /// bounded amount per call: the page may then be short, with a cursor to go on.
    /// Index entries whose record expired are dropped on the way.
    /// `owner`: only that owner's tasks (its own index); the admin: everyone's.
    pub async fn list(
        &self,
        owner: &Owner,
        cursor: Option<&ListCursor>,
        limit: usize,
        max_examined: usize,
        keep: impl Fn(&ListedTask) -> bool,
    ) -> Result<(Vec<ListedTask>, Option<ListCursor>), StoreError> {
        let mut conn = self.pool.get().await?;
        let index = match owner {
            Owner::Admin => self.keys.task_index(),
            o => self.keys.owner_tasks(&o.as_stored()),
        };
        let mut page = Vec::new();
        let mut last = cursor.cloned();
        let mut examined = 0;
        while examined < max_examined {
            let max = last
                .as_ref()
                .map_or("+inf".to_owned(), |c| c.created_ms.to_string());
            let batch: Vec<(String, i64)> = redis::cmd("ZREVRANGEBYSCORE")
                .arg(&index)
                .arg(&max)
                .arg("-inf")
                .arg("WITHSCORES")
                .arg("LIMIT")
                .arg(0)
                .arg(LIST_BATCH)
                .query_async(&mut conn)
                .await?;
            // Equal scores come in reverse member order: skip up to the cursor.
            let fresh: Vec<(String, i64)> = batch
                .into_iter()
                .filter(|(id, ms)| last.as_ref().is_none_or(|c| c.is_before(*ms, id)))
                .collect();
            if fresh.is_empty() {
                return Ok((page, None));
            }
            let ids: Vec<&str> = fresh.iter().map(|(id, _)| id.as_str()).collect();
            let records = self
                .tasks
                .read_many(&mut conn, &ids, &LISTED_FIELDS)
                .await?;
            for ((id, ms), record) in fresh.into_iter().zip(records) {
                examined += 1;
                last = Some(ListCursor {
                    created_ms: ms,
                    task_id: id.clone(),
                });
                let task = match record {
                    Ok(Some(r)) => ListedTask::new(id.clone(), ms, r),
                    Ok(None) => {
                        // The record expired: its index entry goes too.
                        let _: i64 = conn.zrem(&index, &id).await?;
                        continue;
                    }
                    // One bad record must not hide every page after it.
                    Err(e) => {
                        tracing::warn!(task_id = %id, error = %e, "list_tasks skipped a malformed record");
                        continue;
                    }
                };
                if keep(&task) {
                    page.push(task);
                    if page.len() == limit {
                        return Ok((page, last));
                    }
                }
                if examined == max_examined {
                    break;
                }
            }
        }
        Ok((page, last))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listed_task_reads_what_its_workspace_view_needs() {
        for f in shared::view::WORKSPACE_FIELDS {
            assert!(LISTED_FIELDS.contains(&f), "{f}");
        }
    }
}
