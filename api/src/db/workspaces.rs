//! The workspace tools' reads and writes: a workspace as its caller may see it
//! (with whether it is busy now), its versions, a page of the caller's, and
//! fork and delete (one script each). Records through the store's workspace
//! repository (`store::workspaces`); a workspace of another owner reads as
//! none, exactly like an unknown one.

use deadpool_redis::redis;
use shared::Owner;
use shared::scripts::{ScriptCall, WsReply};
use shared::view::{HOLDER_FIELDS, holds_workspace};
use shared::workspace::{SAVE_GRACE_MS, VersionRecord, WorkspaceId, WorkspaceRecord};
use store::scripts;
use store::tasks::Tasks;
use store::workspaces::{PageCursor, WorkspaceReadError};

use super::{Store, StoreError};

/// How many index entries the idle expiry looks at, per workspace it may
/// delete in one pass.
const EXAMINED_PER_DELETE: usize = 10;

impl From<WorkspaceReadError> for StoreError {
    fn from(e: WorkspaceReadError) -> StoreError {
        match e {
            WorkspaceReadError::Redis(e) => StoreError::Redis(e),
            WorkspaceReadError::Stored { id, source } => StoreError::Workspace { id, source },
        }
    }
}

impl Store {
    /// Workspace `id` as stored, if `who` may see it (its owner, or the admin).
    /// `busy` is the field as stored: the task that last took it, which may
    /// have ended (SUBMIT decides).
    pub async fn workspace(
        &self,
        id: &WorkspaceId,
        who: &Owner,
    ) -> Result<Option<WorkspaceRecord>, StoreError> {
        let mut conn = self.pool.get().await?;
        Ok(self.workspaces.get_for(&mut conn, id, who).await?)
    }

    /// Workspace `id`, if `who` may see it, and its version `version` (the
    /// head when `None`): `None` for the version when it is not kept, and for
    /// version 0, the empty one, which has no record.
    pub async fn workspace_version(
        &self,
        id: &WorkspaceId,
        who: &Owner,
        version: Option<u64>,
    ) -> Result<Option<(WorkspaceRecord, u64, Option<VersionRecord>)>, StoreError> {
        let mut conn = self.pool.get().await?;
        let Some(ws) = self.workspaces.get_for(&mut conn, id, who).await? else {
            return Ok(None);
        };
        let n = version.unwrap_or(ws.head);
        let record = match n {
            0 => None,
            n => self.workspaces.version(&mut conn, id, n).await?,
        };
        Ok(Some((ws, n, record)))
    }

    /// Workspace `id` and its kept versions (oldest first), if `who` may see
    /// it, with `busy` only while its task still holds it.
    pub async fn workspace_with_versions(
        &self,
        id: &WorkspaceId,
        who: &Owner,
    ) -> Result<Option<(WorkspaceRecord, Vec<VersionRecord>)>, StoreError> {
        let mut conn = self.pool.get().await?;
        let Some(ws) = self.workspaces.get_for(&mut conn, id, who).await? else {
            return Ok(None);
        };
        let versions = self.workspaces.versions(&mut conn, id).await?;
        let mut one = [ws];
        self.settle_busy(&mut conn, &mut one).await?;
        let [ws] = one;
        Ok(Some((ws, versions)))
    }

    /// A page of `who`'s workspaces (everyone's for the admin), newest first,
    /// after `cursor`; each with `busy` only while its task still holds it.
    pub async fn list_workspaces(
        &self,
        who: &Owner,
        cursor: Option<&PageCursor>,
        limit: usize,
    ) -> Result<(Vec<WorkspaceRecord>, Option<PageCursor>), StoreError> {
        let mut conn = self.pool.get().await?;
        let mut page = self.workspaces.page(&mut conn, who, cursor, limit).await?;
        self.settle_busy(&mut conn, &mut page.workspaces).await?;
        Ok((page.workspaces, page.next))
    }

    /// A stored `busy` field outlives its task when no worker commits it (a
    /// task killed while queued): cleared here, in the view only, for each
    /// workspace whose task no longer holds it (SUBMIT's rule,
    /// `holds_workspace`). The tasks and Redis's clock in one round trip.
    async fn settle_busy(
        &self,
        conn: &mut store::redis_pool::LeanConnection,
        workspaces: &mut [WorkspaceRecord],
    ) -> Result<(), StoreError> {
        let held: Vec<(usize, String)> = workspaces
            .iter()
            .enumerate()
            .filter_map(|(i, w)| w.busy.clone().map(|t| (i, t)))
            .collect();
        if held.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for (_, task) in &held {
            self.tasks.add_read(&mut pipe, task, &HOLDER_FIELDS);
        }
        pipe.cmd("TIME");
        let mut replies: Vec<redis::Value> = pipe.query_async(conn).await?;
        let unreadable = |what: &str| StoreError::Reply {
            script: "settle_busy",
            reply: what.to_owned(),
        };
        let time: (i64, i64) = replies
            .pop()
            .map(redis::from_redis_value)
            .and_then(Result::ok)
            .ok_or_else(|| unreadable("no TIME"))?;
        let now_ms = shared::time::redis_time_ms(time);
        for ((i, task), reply) in held.into_iter().zip(replies) {
            let values: store::tasks::Values =
                redis::from_redis_value(reply).map_err(|e| unreadable(&e.to_string()))?;
            // A holder whose record does not read is shown as holding: SUBMIT
            // would judge it by its raw fields.
            let holds = match Tasks::record(&task, &HOLDER_FIELDS, values) {
                Ok(record) => holds_workspace(record.as_ref(), now_ms, SAVE_GRACE_MS),
                Err(e) => {
                    tracing::warn!(task_id = %task, error = %e, "a workspace's busy task does not read");
                    true
                }
            };
            if !holds && let Some(w) = workspaces.get_mut(i) {
                w.busy = None;
            }
        }
        Ok(())
    }

    /// fork_workspace: a new workspace `new`, owned by `who`, whose first
    /// version is `source`'s `version` (its head when `None`); one script,
    /// which checks the owner (another owner's reads as missing).
    pub async fn fork_workspace(
        &self,
        who: &Owner,
        source: &WorkspaceId,
        version: Option<u64>,
        new: &WorkspaceId,
        owner_max_bytes: u64,
    ) -> Result<WsReply, StoreError> {
        let mut conn = self.pool.get().await?;
        let call = ScriptCall::ws_fork(&self.keys, who, source, version, new, owner_max_bytes);
        let reply = scripts::invoke(&mut conn, &call).await?;
        // A fork acknowledged and then lost in a failover would hand out an
        // id that does not exist.
        if let WsReply::Done(_) = reply {
            store::redis_pool::replicated(&mut conn, self.replica_ack).await?;
        }
        Ok(reply)
    }

    /// The idle expiry: deletes up to `batch` workspaces that no task used
    /// for `idle` (every owner's: the index of all, by last use, oldest first),
    /// each by WS_DELETE as the admin, which checks again that it is idle and
    /// that no queued or running task holds it. Returns how many went.
    /// (At most `EXAMINED_PER_DELETE` entries are looked at per deletion a
    /// pass may make, so a pass stays bounded.)
    pub async fn expire_idle_workspaces(
        &self,
        idle: std::time::Duration,
        batch: usize,
    ) -> Result<usize, StoreError> {
        let mut conn = self.pool.get().await?;
        let time: (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await?;
        let horizon = shared::time::redis_time_ms(time) - idle.as_millis() as i64;
        // Entries that stay in the range (kept: busy, or saving; a record that
        // does not read) are stepped over, so however many there are, the
        // ones behind them are reached: `skipped` is where the next page
        // starts, since each one deleted leaves the range.
        let (mut expired, mut skipped, mut examined) = (0, 0, 0);
        while expired < batch && examined < batch * EXAMINED_PER_DELETE {
            let ids: Vec<String> = redis::cmd("ZRANGE")
                .arg(self.keys.workspaces())
                .arg("-inf")
                .arg(format!("({horizon}"))
                .arg("BYSCORE")
                .arg("LIMIT")
                .arg(skipped)
                .arg(batch)
                .query_async(&mut conn)
                .await?;
            if ids.is_empty() {
                break;
            }
            for raw in ids {
                examined += 1;
                let Ok(id) = WorkspaceId::parse(&raw) else {
                    tracing::warn!(member = raw, "the workspace index holds no workspace id");
                    skipped += 1;
                    continue;
                };
                let ws = match self.workspaces.get(&mut conn, &id).await {
                    Ok(Some(ws)) => ws,
                    Ok(None) => {
                        skipped += 1;
                        continue;
                    }
                    Err(store::workspaces::WorkspaceReadError::Redis(e)) => return Err(e.into()),
                    // One record that does not read stops none of the others.
                    Err(e) => {
                        tracing::warn!(workspace_id = %id, error = %e, "an idle workspace's record does not read: skipped");
                        skipped += 1;
                        continue;
                    }
                };
                let call =
                    ScriptCall::ws_expire(&self.keys, &id, &ws.owner, ws.busy.as_deref(), horizon);
                if scripts::invoke(&mut conn, &call).await? {
                    tracing::info!(workspace_id = %id, owner = %ws.owner, last_used_ms = ws.last_used_at, "idle workspace deleted");
                    expired += 1;
                } else {
                    skipped += 1;
                }
            }
        }
        Ok(expired)
    }

    /// delete_workspace: workspace `id` (read first for its owner, which the
    /// script checks again) and its versions' records. False if `who` has no
    /// such workspace.
    pub async fn delete_workspace(
        &self,
        who: &Owner,
        id: &WorkspaceId,
    ) -> Result<bool, StoreError> {
        let mut conn = self.pool.get().await?;
        let Some(ws) = self.workspaces.get_for(&mut conn, id, who).await? else {
            return Ok(false);
        };
        let call = ScriptCall::ws_delete(&self.keys, who, id, &ws.owner);
        let deleted = scripts::invoke(&mut conn, &call).await?;
        if deleted {
            store::redis_pool::replicated(&mut conn, self.replica_ack).await?;
        }
        Ok(deleted)
    }
}
