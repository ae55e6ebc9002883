//! What a task used, as its container's cgroup reported at the end, or as
//! the worker bounds it when the end could not be read (`Usage`, on the task
//! record), and what an owner's tasks used in all (`OwnerTotals`, the hash
//! `Keys::owner_usage`). Both written by the worker's FINISH script.

use std::collections::HashMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::record::TaskRecord;

/// How long an owner's CPU ledger (`Keys::owner_cpu`) keeps an entry: the
/// CPU quota's rolling day.
pub const CPU_LEDGER_WINDOW_MS: u64 = 86_400_000;

/// The fields of an owner's totals hash (`Keys::owner_usage`) and of the
/// totals over every owner (`Keys::usage_totals`), as FINISH writes them.
pub const TOTAL_TASKS: &str = "tasks";
pub const TOTAL_CPU_MS: &str = "cpu_ms";
pub const TOTAL_PEAK_MEMORY_BYTES: &str = "peak_memory_bytes";
pub const TOTAL_WORKSPACE_BYTES: &str = "workspace_bytes";

/// A task's resource use. Each figure is `None` when it could not be read
/// (the task never ran, the host's kernel does not report it). When the
/// container was gone before its end could be read, the figures are the
/// worker's estimate, and say so (`estimated`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU time of every process in the container, in milliseconds.
    pub cpu_ms: Option<u64>,
    /// The container's peak memory, files in its tmpfs mounts included.
    pub peak_memory_bytes: Option<u64>,
    /// Bytes in /workspace when the task ended.
    pub workspace_bytes: Option<u64>,
    /// The container was gone before its cgroup could be read at the end (the
    /// task killed its own init, or the container vanished): `cpu_ms` is then
    /// the most it could have used (the last reading while it ran, plus its
    /// CPU limit for the time since), so a task cannot shed its CPU from its
    /// owner's quota by ending that way; `peak_memory_bytes` is the last
    /// reading's (the peak was at least that), `workspace_bytes` unknown.
    pub estimated: bool,
}

impl Usage {
    /// The usage recorded on `r`; `None` if it has none.
    pub fn of(r: &TaskRecord) -> Option<Usage> {
        let u = Usage {
            cpu_ms: r.usage_cpu_ms,
            peak_memory_bytes: r.usage_peak_memory_bytes,
            workspace_bytes: r.usage_workspace_bytes,
            estimated: r.usage_estimated.unwrap_or(false),
        };
        (!u.is_empty()).then_some(u)
    }

    /// No figure at all (whether or not it is marked estimated).
    pub fn is_empty(&self) -> bool {
        self.cpu_ms.is_none() && self.peak_memory_bytes.is_none() && self.workspace_bytes.is_none()
    }

    /// How clients see it.
    pub fn view(&self) -> UsageView {
        UsageView {
            cpu_seconds: self.cpu_ms.map(|ms| ms as f64 / 1000.0),
            peak_memory_bytes: self.peak_memory_bytes,
            workspace_bytes: self.workspace_bytes,
            estimated: self.estimated,
        }
    }
}

/// A finished task's resource use, as its container's cgroup reported it at
/// the end; a figure the host could not report is null.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UsageView {
    /// CPU time of every process the task ran, in seconds.
    pub cpu_seconds: Option<f64>,
    /// Peak memory in bytes (files written to /workspace and /tmp count: they live in memory).
    pub peak_memory_bytes: Option<u64>,
    /// Bytes in /workspace when the task ended (the zip's files included).
    pub workspace_bytes: Option<u64>,
    /// True when the container was gone before its end could be read (the
    /// task killed its own init, or its container was lost): cpu_seconds is
    /// then the most the task could have used (its last reading while it ran
    /// plus its CPU limit for the time since), and that is what its owner's
    /// CPU quota is charged; peak_memory_bytes is the last reading's, and
    /// workspace_bytes null.
    #[serde(default)]
    pub estimated: bool,
}

/// What one owner's tasks (or every owned task) used in all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OwnerTotals {
    /// Tasks that ended with a usage recorded.
    pub tasks: u64,
    pub cpu_ms: u64,
    /// The highest peak memory of any one task.
    pub peak_memory_bytes: u64,
    /// Bytes in /workspace at the end, summed over the tasks.
    pub workspace_bytes: u64,
}

impl OwnerTotals {
    /// From the hash's fields (`HGETALL`); a field missing or unreadable is 0.
    pub fn from_hash(h: &HashMap<String, String>) -> OwnerTotals {
        let n = |f: &str| h.get(f).and_then(|v| v.parse().ok()).unwrap_or(0);
        OwnerTotals {
            tasks: n(TOTAL_TASKS),
            cpu_ms: n(TOTAL_CPU_MS),
            peak_memory_bytes: n(TOTAL_PEAK_MEMORY_BYTES),
            workspace_bytes: n(TOTAL_WORKSPACE_BYTES),
        }
    }

    /// These totals less `part`'s (for "every other owner"); the peak, a
    /// maximum, cannot be subtracted and is kept.
    pub fn less(&self, part: &OwnerTotals) -> OwnerTotals {
        OwnerTotals {
            tasks: self.tasks.saturating_sub(part.tasks),
            cpu_ms: self.cpu_ms.saturating_sub(part.cpu_ms),
            peak_memory_bytes: self.peak_memory_bytes,
            workspace_bytes: self.workspace_bytes.saturating_sub(part.workspace_bytes),
        }
    }

    /// These totals plus `other`'s.
    pub fn plus(&self, other: &OwnerTotals) -> OwnerTotals {
        OwnerTotals {
            tasks: self.tasks + other.tasks,
            cpu_ms: self.cpu_ms + other.cpu_ms,
            peak_memory_bytes: self.peak_memory_bytes.max(other.peak_memory_bytes),
            workspace_bytes: self.workspace_bytes + other.workspace_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TaskState;

    #[test]
    fn a_record_without_usage_has_none_and_one_with_shows_cpu_in_seconds() {
        assert_eq!(Usage::of(&TaskRecord::new(TaskState::Failed)), None);
        let r = TaskRecord {
            usage_cpu_ms: Some(2_150),
            usage_workspace_bytes: Some(4096),
            ..TaskRecord::new(TaskState::Succeeded)
        };
        let v = Usage::of(&r).expect("usage").view();
        assert_eq!(
            v,
            UsageView {
                cpu_seconds: Some(2.15),
                peak_memory_bytes: None,
                workspace_bytes: Some(4096),
                estimated: false,
            }
        );
        let r = TaskRecord {
            usage_cpu_ms: Some(8_400),
            usage_estimated: Some(true),
            ..TaskRecord::new(TaskState::Failed)
        };
        let u = Usage::of(&r).expect("usage");
        assert!(u.estimated && u.view().estimated, "{u:?}");
    }

    #[test]
    fn totals_read_from_a_hash_and_other_is_the_rest() {
        let h: HashMap<String, String> = [("tasks", "3"), ("cpu_ms", "900"), ("junk", "x")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let t = OwnerTotals::from_hash(&h);
        assert_eq!((t.tasks, t.cpu_ms, t.peak_memory_bytes), (3, 900, 0));
        let all = OwnerTotals {
            tasks: 10,
            cpu_ms: 1000,
            peak_memory_bytes: 7,
            workspace_bytes: 5,
        };
        let rest = all.less(&t);
        assert_eq!(
            (rest.tasks, rest.cpu_ms, rest.peak_memory_bytes),
            (7, 100, 7)
        );
        assert_eq!(t.plus(&rest).tasks, 10);
    }
}
