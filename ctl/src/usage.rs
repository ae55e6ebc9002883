//! `usage`: what each owner's tasks used in all (the totals FINISH keeps per
//! API key or OAuth subject), the heaviest by CPU first, and what each one's
//! workspaces hold now. Reads `ZREVRANGE`, `ZCARD`, one `HGETALL` per owner
//! shown (at most `MAX_OWNERS`) and one `HMGET` of the workspace bytes.

use std::fmt::Write as _;

use serde::Serialize;
use shared::usage::OwnerTotals;
use store::usage::UsageTotals;

use crate::CtlError;
use crate::read::Reader;

/// The most owners `usage` shows.
pub const MAX_OWNERS: usize = 1000;

/// One owner's totals as `usage` shows them.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OwnerUsage {
    /// The API key's name, or `oauth:<subject>`.
    pub owner: String,
    /// Tasks that ended with a usage recorded.
    pub tasks: u64,
    pub cpu_seconds: f64,
    /// The highest peak memory of any one of its tasks.
    pub peak_memory_bytes: u64,
    /// Bytes in /workspace at the end, summed over its tasks.
    pub workspace_bytes: u64,
    /// What its workspaces' kept versions hold now, each counted whole (what
    /// `WORKSPACE_OWNER_MAX_MB` caps); null for the rows of several owners.
    pub workspace_kept_bytes: Option<u64>,
}

impl OwnerUsage {
    fn new(owner: &str, t: &OwnerTotals) -> OwnerUsage {
        OwnerUsage {
            owner: owner.to_owned(),
            tasks: t.tasks,
            cpu_seconds: t.cpu_ms as f64 / 1000.0,
            peak_memory_bytes: t.peak_memory_bytes,
            workspace_bytes: t.workspace_bytes,
            workspace_kept_bytes: None,
        }
    }
}

/// The report: the heaviest owners, the rest together, and everything.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct UsageReport {
    pub owners: Vec<OwnerUsage>,
    /// How many owners have usage (more than `owners` holds when limited).
    pub owner_count: u64,
    /// The owners not shown, together; null when all are shown.
    pub others: Option<OwnerUsage>,
    /// Every owned task (the admin key's tasks have no owner and are not counted).
    pub all: OwnerUsage,
}

impl UsageReport {
    pub fn new(t: &UsageTotals) -> UsageReport {
        let shown = t.owners.len() as u64;
        UsageReport {
            owners: t
                .owners
                .iter()
                .map(|(o, u)| OwnerUsage::new(o, u))
                .collect(),
            owner_count: t.owner_count,
            others: (t.owner_count > shown).then(|| OwnerUsage::new("(others)", &t.rest())),
            all: OwnerUsage::new("(all)", &t.all),
        }
    }
}

impl Reader {
    /// The `limit` heaviest owners' totals (at most `MAX_OWNERS`).
    pub async fn usage(&self, limit: usize) -> Result<UsageReport, CtlError> {
        let mut conn = self.pool.get().await?;
        let totals = store::usage::top_owners(&mut conn, &self.keys, limit.min(MAX_OWNERS)).await?;
        let mut report = UsageReport::new(&totals);
        if !report.owners.is_empty() {
            let owners: Vec<&str> = report.owners.iter().map(|u| u.owner.as_str()).collect();
            // Signed: a total that drifted below zero (a counter older than the
            // backfill in WS_COMMIT) reads as none, never as an error.
            let kept: Vec<Option<i64>> = redis::cmd("HMGET")
                .arg(self.keys.workspace_bytes())
                .arg(&owners)
                .query_async(&mut conn)
                .await?;
            for (u, k) in report.owners.iter_mut().zip(kept) {
                u.workspace_kept_bytes = Some(k.unwrap_or(0).max(0) as u64);
            }
        }
        Ok(report)
    }
}

/// The report as a table.
pub fn render(r: &UsageReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<32} {:>8} {:>12} {:>12} {:>14} {:>10}",
        "OWNER", "TASKS", "CPU_SECONDS", "PEAK_MIB", "WORKSPACE_MIB", "KEPT_MIB"
    );
    let mib = |b: u64| format!("{:.1}", b as f64 / 1_048_576.0);
    let others = r.others.iter();
    for u in r.owners.iter().chain(others).chain([&r.all]) {
        let _ = writeln!(
            out,
            "{:<32} {:>8} {:>12.1} {:>12} {:>14} {:>10}",
            u.owner,
            u.tasks,
            u.cpu_seconds,
            mib(u.peak_memory_bytes),
            mib(u.workspace_bytes),
            u.workspace_kept_bytes.map_or_else(|| "-".to_owned(), mib)
        );
    }
    if r.owner_count == 0 {
        out.push_str("(no task with an owner has ended yet)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_past_the_limit_are_shown_together() {
        let t = |tasks, cpu_ms| OwnerTotals {
            tasks,
            cpu_ms,
            peak_memory_bytes: 1 << 20,
            workspace_bytes: 0,
        };
        let totals = UsageTotals {
            owners: vec![("alice".into(), t(2, 3000))],
            owner_count: 3,
            all: t(5, 3500),
        };
        let r = UsageReport::new(&totals);
        assert_eq!(r.owners[0].cpu_seconds, 3.0);
        let others = r.others.clone().expect("others");
        assert_eq!((others.tasks, others.cpu_seconds), (3, 0.5));
        let text = render(&r);
        assert!(text.contains("alice"), "{text}");
        assert!(text.contains("(others)"), "{text}");
    }
}
