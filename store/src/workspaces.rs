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

/// Where a page of [`Workspaces::page`] ended: the last workspace examined,
/// with its score in the index (created_at for an owner's, last use for the
/// admin's). Unlike a rank, it still places the next page when that workspace
/// has been deleted since.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageCursor {
    pub score: i64,
    pub id: WorkspaceId,
}

impl PageCursor {
    /// Whether the index entry (`score`, `member`) comes after this cursor,
    /// highest score first (equal scores come in reverse member order).
    fn is_before(&self, score: i64, member: &str) -> bool {
        score < self.score || (score == self.score && member < self.id.to_string().as_str())
    }
}

/// One page of [`Workspaces::page`].
#[derive(Debug, Clone)]
pub struct ScoredPage {
    pub workspaces: Vec<WorkspaceRecord>,
    /// Where the next page starts, if there is one.
    pub next: Option<PageCursor>,
}

/// Index entries [`Workspaces::page`] reads per round trip beyond the page
/// itself, and the round trips it makes at most: entries at the cursor's very
/// score are skipped, so a page costs a bounded number of reads however many
/// share it.
const PAGE_SLACK: usize = 16;
const PAGE_ROUNDS: usize = 8;

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

    /// Every kept version of every workspace, as the blob sweep reads them: the
    /// index of all workspaces (ZSCAN, so one there for the whole scan is
    /// seen), then each one's versions. Not one snapshot: the sweep reads it
    /// again once saves are fenced (WS_SWEEP). A record that does not read is
    /// an error, never skipped, since what is left out here is deleted; an
    /// index entry that is no workspace id names no record and is passed over.
    pub async fn kept_versions(
        &self,
        conn: &mut impl ConnectionLike,
    ) -> Result<Vec<(WorkspaceId, VersionRecord)>, WorkspaceReadError> {
        let mut ids = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("ZSCAN")
                .arg(self.keys.workspaces())
                .arg(cursor)
                .arg("COUNT")
                .arg(500)
                .query_async(conn)
                .await?;
            // ZSCAN replies member, score, member, score, ...
            ids.extend(
                batch
                    .iter()
                    .step_by(2)
                    .filter_map(|m| WorkspaceId::parse(m).ok()),
            );
            if next == 0 {
                break;
            }
            cursor = next;
        }
        ids.sort_unstable();
        ids.dedup();
        let mut out = Vec::new();
        for id in ids {
            for v in self.versions(conn, &id).await? {
                out.push((id, v));
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

    /// A page of `who`'s workspaces (every one for the admin, by last use),
    /// newest first: at most `limit`, after `after`. The index is read by
    /// score, so a cursor whose workspace was deleted since still places the
    /// page; the records come in one round trip. A workspace deleted between
    /// the two reads, or whose record does not read (logged), is left out.
    pub async fn page(
        &self,
        conn: &mut impl ConnectionLike,
        who: &Owner,
        after: Option<&PageCursor>,
        limit: usize,
    ) -> Result<ScoredPage, WorkspaceReadError> {
        let index = if who.is_admin() {
            self.keys.workspaces()
        } else {
            self.keys.owner_workspaces(&who.as_stored())
        };
        let max = after.map_or_else(|| "+inf".to_owned(), |c| c.score.to_string());
        let batch = limit + 1 + PAGE_SLACK;
        let mut picked: Vec<(WorkspaceId, i64)> = Vec::new();
        let mut offset = 0;
        for _ in 0..PAGE_ROUNDS {
            let entries: Vec<(String, i64)> = redis::cmd("ZREVRANGEBYSCORE")
                .arg(&index)
                .arg(&max)
                .arg("-inf")
                .arg("WITHSCORES")
                .arg("LIMIT")
                .arg(offset)
                .arg(batch)
                .query_async(conn)
                .await?;
            let read = entries.len();
            for (member, score) in entries {
                if after.is_some_and(|c| !c.is_before(score, &member)) {
                    continue;
                }
                // Only ids this service made are in the index; anything else is skipped.
                if let Ok(id) = WorkspaceId::parse(&member) {
                    picked.push((id, score));
                }
            }
            if picked.len() > limit || read < batch {
                break;
            }
            offset += read;
        }
        let more = picked.len() > limit;
        picked.truncate(limit);
        if picked.is_empty() {
            return Ok(ScoredPage {
                workspaces: Vec::new(),
                next: None,
            });
        }
        let mut pipe = redis::pipe();
        for (id, _) in &picked {
            pipe.cmd("HGETALL").arg(self.keys.workspace(id));
        }
        let hashes: Vec<Vec<(String, String)>> = pipe.query_async(conn).await?;
        let mut workspaces = Vec::with_capacity(picked.len());
        for ((id, _), pairs) in picked.iter().zip(hashes) {
            match WorkspaceRecord::from_hash(*id, &pairs) {
                Ok(Some(ws)) if who.is_admin() || &ws.owner == who => workspaces.push(ws),
                Ok(_) => {}
                // One bad record must not hide every page after it.
                Err(e) => {
                    tracing::warn!(workspace_id = %id, error = %e, "a workspace record does not read; left out of the listing");
                }
            }
        }
        let next = more
            .then(|| picked.last().map(|&(id, score)| PageCursor { score, id }))
            .flatten();
        Ok(ScoredPage { workspaces, next })
    }
}
