//! What `/metrics` reports, read from Redis at scrape time.

use std::collections::{BTreeMap, HashMap};

use deadpool_redis::redis::{self, AsyncCommands};
use shared::keys::{STAT_FINISHED_PREFIX, STAT_SUBMITTED, parse_heartbeat};

use super::{Store, StoreError};

/// What `/metrics` reports, read from Redis in one go.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Entries in the jobs stream: queued plus being run.
    pub jobs_in_stream: u64,
    /// Entries read by a worker and not yet acknowledged.
    pub jobs_pending: u64,
    /// Live workers and the tasks each is running (from its heartbeat).
    pub workers: BTreeMap<String, u64>,
    pub submitted: u64,
    /// (state, reason kind) -> tasks.
    pub finished: BTreeMap<(String, String), u64>,
    /// The heaviest owners' usage totals (`METRICS_OWNERS` of them) and the
    /// totals over every owner.
    pub usage: store::usage::UsageTotals,
}

/// How many owners `/metrics` labels by name, the heaviest by CPU; the rest are
/// one series, `owner="(other)"`. Bounds the label's cardinality however many
/// API keys or OAuth subjects there are.
pub const METRICS_OWNERS: usize = 100;

impl Store {
    pub async fn snapshot(&self) -> Result<Snapshot, StoreError> {
        let mut conn = self.pool.get().await?;
        let (jobs_in_stream, stats, names): (u64, HashMap<String, u64>, Vec<String>) =
            redis::pipe()
                .xlen(self.keys.jobs())
                .hgetall(self.keys.stats())
                .smembers(self.keys.workers())
                .query_async(&mut conn)
                .await?;
        let jobs_pending = store::jobs::pending_summary(&mut conn, &self.keys)
            .await?
            .count;
        let usage = store::usage::top_owners(&mut conn, &self.keys, METRICS_OWNERS).await?;
        let mut workers = BTreeMap::new();
        if !names.is_empty() {
            let beats: Vec<Option<String>> = conn
                .mget(
                    names
                        .iter()
                        .map(|n| self.keys.worker(n))
                        .collect::<Vec<_>>(),
                )
                .await?;
            for (name, beat) in names.into_iter().zip(beats) {
                if let Some(beat) = beat {
                    workers.insert(name, parse_heartbeat(&beat).unwrap_or(0));
                }
            }
        }
        let mut finished = BTreeMap::new();
        for (field, n) in &stats {
            if let Some((state, kind)) = field
                .strip_prefix(STAT_FINISHED_PREFIX)
                .and_then(|r| r.split_once(':'))
            {
                finished.insert((state.to_owned(), kind.to_owned()), *n);
            }
        }
        Ok(Snapshot {
            jobs_in_stream,
            jobs_pending,
            workers,
            submitted: stats.get(STAT_SUBMITTED).copied().unwrap_or(0),
            finished,
            usage,
        })
    }
}
