//! `script-runner-ctl workspaces list|show|delete`: persistent workspaces as an
//! operator sees them, every owner's, through the store's workspace repository
//! (`store::workspaces`); `delete` runs WS_DELETE as the admin key would
//! (`FCALL`, so as Redis's `admin` user, like `keys`). Reads are bounded:
//! `list` is one page of the index (`ZREVRANGEBYSCORE ... LIMIT`), `show` one
//! workspace and its kept versions.

use std::fmt::Write as _;

use serde::Serialize;
use shared::scripts::ScriptCall;
use shared::time::rfc3339_ms;
use shared::workspace::{VersionRecord, WorkspaceId, WorkspaceRecord};
use shared::{Keys, Owner};
use store::redis_pool::Pool;
use store::workspaces::{WorkspaceReadError, Workspaces};

use crate::{Config, CtlError};

/// The most workspaces `list` shows.
pub const MAX_LIST: usize = 1000;

/// One workspace as the ctl shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct WorkspaceRow {
    pub workspace_id: WorkspaceId,
    /// The API key's name, `oauth:<subject>`, or `(admin)`.
    pub owner: String,
    pub head: u64,
    /// Its kept versions' bytes, each counted whole (what the owner's cap counts).
    pub bytes: u64,
    /// The task using it, while one does (as stored: it may have ended).
    pub busy_task: Option<String>,
    pub created_at: String,
    pub last_used_at: String,
    pub forked_from: Option<String>,
}

impl From<&WorkspaceRecord> for WorkspaceRow {
    fn from(w: &WorkspaceRecord) -> WorkspaceRow {
        WorkspaceRow {
            workspace_id: w.id,
            owner: w.owner.to_string(),
            head: w.head,
            bytes: w.bytes,
            busy_task: w.busy.clone(),
            created_at: rfc3339_ms(w.created_at),
            last_used_at: rfc3339_ms(w.last_used_at),
            forked_from: w.forked_from.clone(),
        }
    }
}

/// `show`: a workspace and its kept versions, oldest first.
#[derive(Debug, Clone, Serialize)]
pub struct WorkspaceDetail {
    #[serde(flatten)]
    pub workspace: WorkspaceRow,
    pub versions: Vec<VersionRecord>,
}

/// The ctl's handle on the workspace records.
pub struct WorkspaceAdmin {
    pool: Pool,
    keys: Keys,
    workspaces: Workspaces,
}

impl From<WorkspaceReadError> for CtlError {
    fn from(e: WorkspaceReadError) -> CtlError {
        match e {
            WorkspaceReadError::Redis(e) => CtlError::Redis(e),
            WorkspaceReadError::Stored { id, source } => CtlError::Workspace {
                id,
                what: source.to_string(),
            },
        }
    }
}

impl WorkspaceAdmin {
    pub async fn new(config: &Config) -> Result<WorkspaceAdmin, CtlError> {
        Ok(WorkspaceAdmin {
            pool: config.pool(1).await?,
            keys: config.keys.clone(),
            workspaces: Workspaces::new(config.keys.clone()),
        })
    }

    /// The `limit` most recently used workspaces (at most `MAX_LIST`) of
    /// `owner`, or of every owner (`None`).
    pub async fn list(
        &self,
        owner: Option<&Owner>,
        limit: usize,
    ) -> Result<Vec<WorkspaceRow>, CtlError> {
        let mut conn = self.pool.get().await?;
        // The admin's view is every owner's; an owner's, its own index.
        let who = owner.unwrap_or(&Owner::Admin);
        let page = self
            .workspaces
            .page(&mut conn, who, None, limit.clamp(1, MAX_LIST))
            .await?;
        Ok(page.workspaces.iter().map(WorkspaceRow::from).collect())
    }

    /// Workspace `id` and its kept versions.
    pub async fn show(&self, id: &WorkspaceId) -> Result<WorkspaceDetail, CtlError> {
        let mut conn = self.pool.get().await?;
        let ws = self
            .workspaces
            .get(&mut conn, id)
            .await?
            .ok_or(CtlError::NoSuchWorkspace(*id))?;
        let versions = self.workspaces.versions(&mut conn, id).await?;
        Ok(WorkspaceDetail {
            workspace: WorkspaceRow::from(&ws),
            versions,
        })
    }

    /// Deletes workspace `id` and its versions' records, whoever owns it; its
    /// owner.
    pub async fn delete(&self, id: &WorkspaceId) -> Result<Owner, CtlError> {
        let mut conn = self.pool.get().await?;
        let ws = self
            .workspaces
            .get(&mut conn, id)
            .await?
            .ok_or(CtlError::NoSuchWorkspace(*id))?;
        let call = ScriptCall::ws_delete(&self.keys, &Owner::Admin, id, &ws.owner);
        if !store::scripts::invoke(&mut conn, &call).await? {
            return Err(CtlError::NoSuchWorkspace(*id));
        }
        Ok(ws.owner)
    }
}

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / 1_048_576.0)
}

/// `list` as a table.
pub fn render_list(rows: &[WorkspaceRow]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<36} {:<24} {:>5} {:>10} {:<24} BUSY",
        "WORKSPACE", "OWNER", "HEAD", "MIB", "LAST_USED"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<36} {:<24} {:>5} {:>10} {:<24} {}",
            r.workspace_id,
            r.owner,
            r.head,
            mib(r.bytes),
            r.last_used_at,
            r.busy_task.as_deref().unwrap_or("-")
        );
    }
    if rows.is_empty() {
        out.push_str("(no workspace)\n");
    }
    out
}

/// `show` as text: the workspace, then a table of its versions.
pub fn render_detail(d: &WorkspaceDetail) -> String {
    let w = &d.workspace;
    let mut out = String::new();
    let _ = writeln!(out, "workspace   {}", w.workspace_id);
    let _ = writeln!(out, "owner       {}", w.owner);
    let _ = writeln!(out, "head        {}", w.head);
    let _ = writeln!(out, "bytes       {} ({} MiB)", w.bytes, mib(w.bytes));
    let _ = writeln!(out, "busy task   {}", w.busy_task.as_deref().unwrap_or("-"));
    let _ = writeln!(out, "created     {}", w.created_at);
    let _ = writeln!(out, "last used   {}", w.last_used_at);
    if let Some(f) = &w.forked_from {
        let _ = writeln!(out, "forked from {f}");
    }
    let _ = writeln!(
        out,
        "\n{:>7} {:>7} {:>10} {:>8} {:<24} TASK",
        "VERSION", "PARENT", "BYTES", "FILES", "CREATED"
    );
    for v in &d.versions {
        let parent = v.parent.map_or_else(|| "-".to_owned(), |p| p.to_string());
        let _ = writeln!(
            out,
            "{:>7} {:>7} {:>10} {:>8} {:<24} {}",
            v.version,
            parent,
            v.bytes,
            v.files,
            rfc3339_ms(v.created_at),
            v.task_id.as_deref().unwrap_or("-")
        );
    }
    if d.versions.is_empty() {
        out.push_str("(no version kept: the head is the empty version 0)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workspace_and_its_versions_render_as_tables() {
        let id = WorkspaceId::from_bytes([7; 16]);
        let row = WorkspaceRow {
            workspace_id: id,
            owner: "alice".into(),
            head: 2,
            bytes: 3 << 20,
            busy_task: None,
            created_at: rfc3339_ms(0),
            last_used_at: rfc3339_ms(1000),
            forked_from: None,
        };
        let list = render_list(std::slice::from_ref(&row));
        assert!(
            list.contains(&id.to_string()) && list.contains("3.0"),
            "{list}"
        );
        let detail = WorkspaceDetail {
            workspace: row,
            versions: vec![VersionRecord {
                version: 2,
                manifest: shared::workspace::BlobDigest::of(b"m"),
                task_id: Some("t-2".into()),
                parent: Some(1),
                bytes: 3 << 20,
                files: 4,
                created_at: 1000,
            }],
        };
        let text = render_detail(&detail);
        assert!(
            text.contains("t-2") && text.contains("owner       alice"),
            "{text}"
        );
        assert!(render_list(&[]).ends_with("(no workspace)\n"));
    }
}
