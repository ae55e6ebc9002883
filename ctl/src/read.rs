//! Everything the ctl reads from Redis, as plain data (serialisable for `--json`).

use std::collections::{BTreeMap, HashMap};

use redis::AsyncCommands;
use redis::streams::StreamRangeReply;
use serde::Serialize;
use shared::keys::{Heartbeat, JOB_TASK_ID, WORKER_GROUP};
use shared::time::{redis_time_ms, rfc3339_ms, task_clock};
use shared::view::StatusView;
use shared::{Field, Keys, ReasonKind, TaskRecord, TaskState};
use store::redis_pool::Pool;
use store::tasks::{Tasks, Values};

use crate::{Config, CtlError};

/// At most this many registered workers are read.
pub const MAX_WORKERS: usize = 1000;
/// At most this many running tasks (pending stream entries) are read.
pub const MAX_RUNNING: usize = 1000;
/// "The last hour": the current minute and the 59 before it.
pub const HOUR_MINUTES: u64 = 60;

/// The whole deployment at one moment.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// Redis's clock when this was read (RFC 3339).
    pub at: String,
    pub workers: Vec<WorkerView>,
    pub queue: QueueView,
    /// Running tasks, the longest silent first (the stuck-looking ones).
    pub running: Vec<RunningTask>,
    /// True when there were more than `MAX_RUNNING` to read.
    pub running_truncated: bool,
    /// Tasks that ended in the last hour (60 whole minutes by Redis's clock),
    /// by state and reason kind.
    pub finished_last_hour: Vec<FinishedCount>,
    pub finished_last_hour_total: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WorkerView {
    pub name: String,
    /// Its heartbeat key exists.
    pub alive: bool,
    pub host: Option<String>,
    /// Tasks it runs (from its heartbeat).
    pub slots_busy: Option<u64>,
    /// Its `WORKER_CONCURRENCY` (from its heartbeat; absent from old workers).
    pub slots_total: Option<u64>,
    /// Seconds since its last heartbeat (from the key's TTL, Redis's clock).
    pub last_heartbeat_seconds_ago: Option<f64>,
    pub version: Option<String>,
    /// Jobs pending under its name in the stream.
    pub jobs_held: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct QueueView {
    /// Jobs waiting for a worker with a free slot.
    pub waiting: u64,
    /// Jobs a worker has read and not finished.
    pub held: u64,
    /// Entries in the stream (waiting + held).
    pub in_stream: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunningTask {
    pub task_id: String,
    /// `running`, or `queued` for a job a worker has just read and not yet claimed.
    pub state: TaskState,
    pub worker: Option<String>,
    pub runtime: Option<String>,
    /// Seconds since its container started; null before that.
    pub runtime_seconds: Option<f64>,
    /// Seconds since its last output byte (since the start if none); null before the start.
    pub seconds_since_last_output: Option<f64>,
    pub timeout_seconds: Option<u64>,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FinishedCount {
    pub state: TaskState,
    pub reason_kind: ReasonKind,
    pub count: u64,
}

/// One task's record, as `task ID` shows it: its status as `get_task_status`
/// shows it, then what only an operator sees.
#[derive(Debug, Clone, Serialize)]
pub struct TaskView {
    pub task_id: String,
    // Flattened, so `--json` has the api's field names, order and defaults;
    // the operator's fields come after it.
    #[serde(flatten)]
    pub status: StatusView,
    pub image: Option<String>,
    pub command: Option<String>,
    pub worker: Option<String>,
    pub claimed_at: Option<String>,
    /// Seconds until the record expires; null while it has no TTL (queued, running).
    pub expires_in_seconds: Option<i64>,
    /// The raw stored tails, for `--follow` (not in the JSON).
    #[serde(skip)]
    pub raw_stdout: Vec<u8>,
    #[serde(skip)]
    pub raw_stderr: Vec<u8>,
}

impl TaskView {
    pub fn is_terminal(&self) -> bool {
        self.status.state.is_terminal()
    }
}

/// Fields read for each running task, in this order.
const RUNNING_FIELDS: [Field; 8] = [
    Field::State,
    Field::Worker,
    Field::Runtime,
    Field::StartedAt,
    Field::LastOutputAt,
    Field::TimeoutSeconds,
    Field::StdoutBytes,
    Field::StderrBytes,
];

#[derive(Clone)]
pub struct Reader {
    pub(crate) pool: Pool,
    pub(crate) keys: Keys,
    /// The task records, read through the store's one repository.
    tasks: Tasks,
}

impl Reader {
    pub async fn new(config: &Config) -> Result<Reader, CtlError> {
        Ok(Reader {
            pool: config.pool(2).await?,
            keys: config.keys.clone(),
            tasks: Tasks::new(config.keys.clone()),
        })
    }

    async fn now_ms(conn: &mut store::redis_pool::Connection) -> Result<i64, CtlError> {
        let time: (i64, i64) = redis::cmd("TIME").query_async(conn).await?;
        Ok(redis_time_ms(time))
    }

    pub async fn status(&self) -> Result<Status, CtlError> {
        let mut conn = self.pool.get().await?;
        let now_ms = Reader::now_ms(&mut conn).await?;
        let in_stream: u64 = conn.xlen(self.keys.jobs()).await?;
        let pending = store::jobs::pending_summary(&mut conn, &self.keys).await?;
        let (held, per_worker) = (pending.count, pending.per_consumer);
        let workers = self.workers(&mut conn, &per_worker).await?;
        let (running, running_truncated) = if held > 0 {
            self.running(&mut conn, now_ms).await?
        } else {
            (Vec::new(), false)
        };
        let finished = self.finished_last_hour(&mut conn, now_ms).await?;
        let total = finished.iter().map(|f| f.count).sum();
        Ok(Status {
            at: rfc3339_ms(now_ms),
            workers,
            queue: QueueView {
                waiting: in_stream.saturating_sub(held),
                held,
                in_stream,
            },
            running,
            running_truncated,
            finished_last_hour: finished,
            finished_last_hour_total: total,
        })
    }

    /// Registered workers (`SSCAN`, bounded) and their heartbeats.
    async fn workers(
        &self,
        conn: &mut store::redis_pool::Connection,
        held: &HashMap<String, u64>,
    ) -> Result<Vec<WorkerView>, CtlError> {
        let mut names: Vec<String> = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SSCAN")
                .arg(self.keys.workers())
                .arg(cursor)
                .arg("COUNT")
                .arg(100)
                .query_async(conn)
                .await?;
            names.extend(batch);
            cursor = next;
            if cursor == 0 || names.len() >= MAX_WORKERS {
                break;
            }
        }
        names.sort();
        names.dedup();
        names.truncate(MAX_WORKERS);
        // A worker holding jobs but missing from the registry is still shown.
        for name in held.keys() {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<String> = names.iter().map(|n| self.keys.worker(n)).collect();
        let beats: Vec<Option<String>> = redis::cmd("MGET").arg(&keys).query_async(conn).await?;
        let mut pipe = redis::pipe();
        for k in &keys {
            pipe.pttl(k);
        }
        let ttls: Vec<i64> = pipe.query_async(conn).await?;
        Ok(names
            .into_iter()
            .zip(beats)
            .zip(ttls)
            .map(|((name, beat), pttl)| {
                worker_view(
                    name.clone(),
                    beat.as_deref(),
                    pttl,
                    held.get(&name).copied().unwrap_or(0),
                )
            })
            .collect())
    }

    /// The tasks behind the stream's pending entries, read in three pipelined
    /// round trips; the longest silent first.
    async fn running(
        &self,
        conn: &mut store::redis_pool::Connection,
        now_ms: i64,
    ) -> Result<(Vec<RunningTask>, bool), CtlError> {
        let jobs = self.keys.jobs();
        let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
            .arg(&jobs)
            .arg(WORKER_GROUP)
            .arg("-")
            .arg("+")
            .arg(MAX_RUNNING + 1)
            .query_async(conn)
            .await?;
        let truncated = pending.len() > MAX_RUNNING;
        let pending = &pending[..pending.len().min(MAX_RUNNING)];
        if pending.is_empty() {
            return Ok((Vec::new(), false));
        }
        let mut pipe = redis::pipe();
        for (id, ..) in pending {
            pipe.cmd("XRANGE").arg(&jobs).arg(id).arg(id);
        }
        let entries: Vec<StreamRangeReply> = pipe.query_async(conn).await?;
        let mut ids: Vec<(String, String)> = Vec::new();
        for ((_, consumer, ..), entry) in pending.iter().zip(entries) {
            if let Some(task_id) = entry.ids.first().and_then(|e| e.get::<String>(JOB_TASK_ID)) {
                ids.push((task_id, consumer.clone()));
            }
        }
        // Jobs acknowledged (and deleted) since XPENDING listed them leave
        // nothing to read.
        let task_ids: Vec<&str> = ids.iter().map(|(id, _)| id.as_str()).collect();
        let records = self
            .tasks
            .read_many(conn, &task_ids, &RUNNING_FIELDS)
            .await?;
        let mut running: Vec<RunningTask> = ids
            .into_iter()
            .zip(records)
            .filter_map(|((task_id, consumer), record)| {
                // Gone, or not readable: nothing to show in a live view.
                let r = record.ok()??;
                running_task(task_id, consumer, &r, now_ms)
            })
            .collect();
        sort_stuck_first(&mut running);
        Ok((running, truncated))
    }

    async fn finished_last_hour(
        &self,
        conn: &mut store::redis_pool::Connection,
        now_ms: i64,
    ) -> Result<Vec<FinishedCount>, CtlError> {
        let minute = (now_ms.max(0) as u64) / 60_000;
        let mut pipe = redis::pipe();
        for m in minute.saturating_sub(HOUR_MINUTES - 1)..=minute {
            pipe.hgetall(self.keys.stats_minute(m));
        }
        let hashes: Vec<HashMap<String, u64>> = pipe.query_async(conn).await?;
        Ok(sum_minutes(&hashes))
    }

    /// One task's record with Redis's clock; `NoSuchTask` if there is none.
    pub async fn task(&self, task_id: &str, tail_bytes: usize) -> Result<TaskView, CtlError> {
        let mut conn = self.pool.get().await?;
        // The record, the clock and its time to live, all in one round trip.
        let mut pipe = redis::pipe();
        self.tasks.add_read(&mut pipe, task_id, Field::ALL);
        pipe.cmd("TIME");
        // Its time to live: -2 when there is no such task, -1 while it runs
        // and has none yet. Key metadata, not a field: the ctl's alone.
        pipe.ttl(self.keys.task(task_id));
        let (values, time, ttl): (Values, (i64, i64), i64) = pipe.query_async(&mut conn).await?;
        let record = Tasks::record(task_id, Field::ALL, values)?
            .ok_or_else(|| CtlError::NoSuchTask(task_id.to_owned()))?;
        Ok(task_view(
            task_id,
            &record,
            redis_time_ms(time),
            ttl,
            tail_bytes,
        ))
    }
}

/// A worker as its heartbeat (`beat`, if alive) and the key's remaining TTL show it.
pub fn worker_view(name: String, beat: Option<&str>, pttl_ms: i64, jobs_held: u64) -> WorkerView {
    let hb = beat.and_then(Heartbeat::parse);
    let ago = hb.as_ref().and_then(|h| {
        let ttl = h.ttl_seconds? as i64 * 1000;
        (pttl_ms >= 0).then(|| ((ttl - pttl_ms).max(0) as f64) / 1000.0)
    });
    WorkerView {
        name,
        alive: beat.is_some(),
        host: hb.as_ref().and_then(|h| h.host.clone()),
        slots_busy: hb.as_ref().map(|h| h.running),
        slots_total: hb.as_ref().and_then(|h| h.slots),
        last_heartbeat_seconds_ago: ago,
        version: hb.as_ref().and_then(|h| h.version.clone()),
        jobs_held,
    }
}

/// A running task from its `RUNNING_FIELDS`; `None` if it has already ended
/// (its job not yet acknowledged).
fn running_task(
    task_id: String,
    consumer: String,
    r: &TaskRecord,
    now_ms: i64,
) -> Option<RunningTask> {
    if r.state.is_terminal() {
        return None;
    }
    let (runtime_seconds, seconds_since_last_output) =
        task_clock(r.started_at, r.last_output_at, None, now_ms);
    Some(RunningTask {
        task_id,
        state: r.state,
        worker: r.worker.clone().or(Some(consumer)),
        runtime: r.runtime.as_ref().map(ToString::to_string),
        runtime_seconds,
        seconds_since_last_output,
        timeout_seconds: r.timeout_seconds,
        stdout_bytes: r.stdout_bytes.unwrap_or(0),
        stderr_bytes: r.stderr_bytes.unwrap_or(0),
    })
}

/// The longest silent first; tasks not started yet last; ties by id.
pub fn sort_stuck_first(tasks: &mut [RunningTask]) {
    tasks.sort_by(|a, b| {
        let silent = |t: &RunningTask| t.seconds_since_last_output.unwrap_or(-1.0);
        silent(b)
            .total_cmp(&silent(a))
            .then_with(|| a.task_id.cmp(&b.task_id))
    });
}

/// Per-minute counter hashes (fields `<state>:<reason_kind>`) summed, in the
/// order of their names. Fields that do not name a known state and kind are
/// skipped.
pub fn sum_minutes(hashes: &[HashMap<String, u64>]) -> Vec<FinishedCount> {
    let mut sums: BTreeMap<(&str, &str), (TaskState, ReasonKind, u64)> = BTreeMap::new();
    for h in hashes {
        for (field, n) in h {
            let Some((state, kind)) = field.split_once(':') else {
                continue;
            };
            let (Ok(state), Ok(kind)) = (state.parse::<TaskState>(), kind.parse::<ReasonKind>())
            else {
                continue;
            };
            sums.entry((state.as_str(), kind.as_str()))
                .or_insert((state, kind, 0))
                .2 += n;
        }
    }
    sums.into_values()
        .map(|(state, reason_kind, count)| FinishedCount {
            state,
            reason_kind,
            count,
        })
        .collect()
}

/// A task record as `task` shows it; the status part as `get_task_status`
/// builds it (`StatusView`).
pub fn task_view(
    task_id: &str,
    r: &TaskRecord,
    now_ms: i64,
    ttl: i64,
    tail_bytes: usize,
) -> TaskView {
    TaskView {
        task_id: task_id.to_owned(),
        status: StatusView::new(r, now_ms, tail_bytes),
        image: r.image.clone(),
        command: r.command.clone(),
        worker: r.worker.clone(),
        claimed_at: r.claimed_at.map(rfc3339_ms),
        expires_in_seconds: (ttl >= 0).then_some(ttl),
        raw_stdout: r.stdout_tail.clone().unwrap_or_default(),
        raw_stderr: r.stderr_tail.clone().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use testkit::json::keys_in_order;

    #[test]
    fn task_json_is_the_api_status_then_the_operators_fields() -> Result<(), serde_json::Error> {
        let r = TaskRecord {
            runtime: Some(shared::RuntimeName::from_stored("python3.13")),
            worker: Some("w1".into()),
            claimed_at: Some(500),
            ..TaskRecord::new(TaskState::Running)
        };
        let t = task_view("t", &r, 9_000, -1, 100);
        let json = serde_json::to_string(&t)?;
        // `--json`'s order: get_task_status's fields (the shared view's, which
        // the api's test pins against docs/tools.md), then the record's.
        let view = serde_json::to_string(&StatusView::new(&r, 9_000, 100))?;
        let mut want = vec!["task_id".to_owned()];
        want.extend(keys_in_order(&view)?);
        want.extend(
            [
                "image",
                "command",
                "worker",
                "claimed_at",
                "expires_in_seconds",
            ]
            .map(str::to_owned),
        );
        assert!(want.contains(&"stdout_tail".to_owned()), "{want:?}");
        assert_eq!(keys_in_order(&json)?, want);
        assert_eq!(
            (
                t.worker.as_deref(),
                t.claimed_at.as_deref(),
                t.expires_in_seconds
            ),
            (Some("w1"), Some("1970-01-01T00:00:00.500Z"), None)
        );
        Ok(())
    }

    fn task(id: &str, silent: Option<f64>) -> RunningTask {
        RunningTask {
            task_id: id.into(),
            state: TaskState::Running,
            worker: None,
            runtime: None,
            runtime_seconds: silent,
            seconds_since_last_output: silent,
            timeout_seconds: None,
            stdout_bytes: 0,
            stderr_bytes: 0,
        }
    }

    #[test]
    fn the_longest_silent_come_first_and_unstarted_last() {
        let mut t = vec![task("a", Some(1.0)), task("b", None), task("c", Some(90.0))];
        sort_stuck_first(&mut t);
        let order: Vec<&str> = t.iter().map(|t| t.task_id.as_str()).collect();
        assert_eq!(order, ["c", "a", "b"]);
    }

    #[test]
    fn minutes_are_summed_by_state_and_kind() {
        let m1 = HashMap::from([
            ("succeeded:exited".to_owned(), 2),
            ("killed:killed-by-user".to_owned(), 1),
            ("timed-out:timed-out".to_owned(), 1),
        ]);
        let m2 = HashMap::from([
            ("succeeded:exited".to_owned(), 3),
            ("junk".to_owned(), 9),
            ("done:exited".to_owned(), 9),
        ]);
        let sums = sum_minutes(&[m1, m2]);
        // In the order of the names (as the JSON always was), not of the enums.
        assert_eq!(
            sums,
            vec![
                FinishedCount {
                    state: TaskState::Killed,
                    reason_kind: ReasonKind::KilledByUser,
                    count: 1
                },
                FinishedCount {
                    state: TaskState::Succeeded,
                    reason_kind: ReasonKind::Exited,
                    count: 5
                },
                FinishedCount {
                    state: TaskState::TimedOut,
                    reason_kind: ReasonKind::TimedOut,
                    count: 1
                },
            ]
        );
    }

    #[test]
    fn heartbeat_age_comes_from_the_keys_ttl() {
        let w = worker_view(
            "w".into(),
            Some("running=1 slots=4 host=h version=1 ttl=15"),
            12_000,
            1,
        );
        assert_eq!(w.last_heartbeat_seconds_ago, Some(3.0));
        assert_eq!((w.slots_busy, w.slots_total), (Some(1), Some(4)));
        // An old worker's heartbeat: busy slots only, no age.
        let old = worker_view("o".into(), Some("running=2"), 9_000, 0);
        assert_eq!(
            (
                old.slots_busy,
                old.slots_total,
                old.last_heartbeat_seconds_ago
            ),
            (Some(2), None, None)
        );
        let dead = worker_view("d".into(), None, -2, 0);
        assert!(!dead.alive);
    }

    #[test]
    fn a_running_task_reads_its_silence_from_last_output() {
        let values = [
            Some("running"),
            Some("w1"),
            Some("python3.13"),
            Some("1000"),
            Some("4000"),
            Some("60"),
            Some("12"),
            None,
        ];
        let r = TaskRecord::from_values(&RUNNING_FIELDS, values)
            .ok()
            .flatten()
            .expect("a record");
        let t = running_task("t".into(), "w1".into(), &r, 11_000).expect("running");
        assert_eq!(
            (t.runtime_seconds, t.seconds_since_last_output),
            (Some(10.0), Some(7.0))
        );
        assert_eq!((t.stdout_bytes, t.stderr_bytes), (12, 0));
        let ended = TaskRecord {
            state: TaskState::Succeeded,
            ..r
        };
        assert!(running_task("t".into(), "w1".into(), &ended, 11_000).is_none());
    }
}
