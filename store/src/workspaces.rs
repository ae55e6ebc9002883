//! The workspace repository: every read of a workspace's records (`Keys::workspace`,
//! its versions' hashes and the owners' indexes), for the api, the worker and
//! the ctl alike.
//!
//! Writes are Lua scripts (`shared::scripts`: SUBMIT makes a workspace busy or
//! new, WS_COMMIT adds a version, WS_FORK and WS_DELETE), run with
//! `scripts::invoke`, so each is atomic. The blobs themselves are not in Redis
//! (the worker's `workspaces` module keeps them).

use redis::aio::ConnectionLike;
use shared::workspace::{BadStored, VersionRecord, WorkspaceId, WorkspaceRecord};
use shared::{Keys, Owner};

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceReadError {
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
    #[error("workspace {id}: {source}")]
    Stored {
        id: WorkspaceId,
        #[source]
        source: BadStored,
    },
}

/// One page of an owner's workspaces, newest first.
#[derive(Debug, Clone)]
pub struct Page {
    pub workspaces: Vec<WorkspaceRecord>,
    /// Where the next page starts (`list`'s `after`), if there is one.
    pub next: Option<String>,
}

/// The workspace records under one key prefix.
#[derive(Debug, Clone)]
pub struct Workspaces {
    keys: Keys,
}

impl Workspaces {
    pub fn new(keys: Keys) -> Workspaces {
        Workspaces { keys }
    }

    /// A workspace, if it exists.
    pub async fn get(
        &self,
        conn: &mut impl ConnectionLike,
        id: &WorkspaceId,
    ) -> Result<Option<WorkspaceRecord>, WorkspaceReadError> {
        let pairs: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(self.keys.workspace(id))
            .query_async(conn)
            .await?;
        WorkspaceRecord::from_hash(*id, &pairs)
            .map_err(|source| WorkspaceReadError::Stored { id: *id, source })
    }

    /// A workspace `who` may see: its owner's, or any for the admin. Another
    /// owner's reads as none, exactly like an unknown id.
    pub async fn get_for(
        &self,
        conn: &mut impl ConnectionLike,
        id: &WorkspaceId,
        who: &Owner,
    ) -> Result<Option<WorkspaceRecord>, WorkspaceReadError> {
        let ws = self.get(conn, id).await?;
        Ok(ws.filter(|w| who.is_admin() || &w.owner == who))
    }

    /// One version, if it is kept.
    pub async fn version(
        &self,
        conn: &mut impl ConnectionLike,
        id: &WorkspaceId,
        version: u64,
    ) -> Result<Option<VersionRecord>, WorkspaceReadError> {
        let pairs: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(self.keys.workspace_version(id, version))
            .query_async(conn)
            .await?;
        VersionRecord::from_hash(version, &pairs)
            .map_err(|source| WorkspaceReadError::Stored { id: *id, source })
    }

    /// Every kept version, oldest first, in one round trip.
    pub async fn versions(
        &self,
        conn: &mut impl ConnectionLike,
        id: &WorkspaceId,
    ) -> Result<Vec<VersionRecord>, WorkspaceReadError> {
        let numbers: Vec<u64> = redis::cmd("ZRANGE")
            .arg(self.keys.workspace_versions(id))
            .arg(0)
            .arg(-1)
            .query_async(conn)
            .await?;
        if numbers.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for n in &numbers {
            pipe.cmd("HGETALL").arg(self.keys.workspace_version(id, *n));
        }
        let hashes: Vec<Vec<(String, String)>> = pipe.query_async(conn).await?;
        let mut out = Vec::with_capacity(numbers.len());
        for (n, pairs) in numbers.into_iter().zip(hashes) {
            // A version dropped between the two reads is skipped.
            if let Some(v) = VersionRecord::from_hash(n, &pairs)
                .map_err(|source| WorkspaceReadError::Stored { id: *id, source })?
            {
                out.push(v);
            }
        }
        Ok(out)
    }

    /// A page of `who`'s workspaces (every one for the admin), newest first:
    /// at most `limit`, starting after the id `after` names.
    pub async fn list(
        &self,
        conn: &mut impl ConnectionLike,
        who: &Owner,
        after: Option<&WorkspaceId>,
        limit: usize,
    ) -> Result<Page, WorkspaceReadError> {
        let index = if who.is_admin() {
            self.keys.workspaces()
        } else {
            self.keys.owner_workspaces(&who.as_stored())
        };
        // The page starts below the cursor's score (or at the top).
        let start: i64 = match after {
            Some(id) => {
                let rank: Option<i64> = redis::cmd("ZREVRANK")
                    .arg(&index)
                    .arg(id.to_string())
                    .query_async(conn)
                    .await?;
                rank.map(|r| r + 1).unwrap_or(0)
            }
            None => 0,
        };
        let ids: Vec<String> = redis::cmd("ZREVRANGE")
            .arg(&index)
            .arg(start)
            .arg(start + limit as i64)
            .query_async(conn)
            .await?;
        let more = ids.len() > limit;
        let mut workspaces = Vec::new();
        for text in ids.iter().take(limit) {
            let Ok(id) = WorkspaceId::parse(text) else {
                continue;
            };
            if let Some(ws) = self.get_for(conn, &id, who).await? {
                workspaces.push(ws);
            }
        }
        let next = more
            .then(|| ids.get(limit.saturating_sub(1)).cloned())
            .flatten();
        Ok(Page { workspaces, next })
    }
}
