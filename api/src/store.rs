//! The api's view of Redis: submit a task, read one, kill one, check reachability.
//! Key names and hash fields come from `shared`; multi-step changes are atomic
//! Lua scripts (`shared/src/lua/`).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use deadpool_redis::redis::{self, AsyncCommands};
use shared::keys::{STAT_FINISHED_PREFIX, STAT_SUBMITTED, WORKER_GROUP, parse_heartbeat};
use shared::options::Network;
use shared::scripts::MISSING;
use shared::task::KILLED_BY_USER_REASON;
use shared::{Field, Keys, ReasonKind, TaskState};
use support::redis_pool::LeanPool;
use support::scripts;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the task store (Redis) is unreachable: {0}")]
    Pool(#[from] deadpool_redis::PoolError),
    #[error("the task store (Redis) failed: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("the task store returned an unexpected value: {0}")]
    Corrupt(String),
    #[error(transparent)]
    BuildPool(#[from] support::redis_pool::PoolError),
}

/// `XPENDING key group`: count, first and last pending ids, and per consumer its
/// name and count.
type PendingSummary = (
    u64,
    Option<String>,
    Option<String>,
    Option<Vec<(String, String)>>,
);

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
}

/// A task as `run_script` hands it to the queue.
pub struct NewTask<'a> {
    pub id: &'a str,
    pub runtime: &'a str,
    pub image: &'a str,
    pub command: &'a str,
    pub timeout_seconds: u64,
    pub zip: Option<&'a [u8]>,
    pub stdin: Option<&'a [u8]>,
    /// Extra environment, as the JSON object stored in the record.
    pub env_json: Option<String>,
    pub network: Network,
    /// `collect` patterns, as the JSON array stored in the record.
    pub collect_json: Option<String>,
    /// How long the task index keeps an entry: the record's retention and then some.
    pub index_horizon_ms: u64,
    /// `MAX_QUEUED_TASKS`: with this many jobs in the stream, the task is refused.
    pub max_queued: u64,
}

/// What became of a `NewTask`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submitted {
    Queued,
    /// Refused, nothing stored: this many jobs were in the stream.
    Full(u64),
}

/// The fields of a task hash that `get` reads: what `get_task_status` shows.
/// Reading these rather than the whole hash leaves the command, image, env and
/// the worker's bookkeeping in Redis, and needs no map.
pub const STATUS_FIELDS: [Field; 13] = [
    Field::State,
    Field::Runtime,
    Field::TimeoutSeconds,
    Field::CreatedAt,
    Field::StartedAt,
    Field::FinishedAt,
    Field::LastOutputAt,
    Field::ExitCode,
    Field::Reason,
    Field::StdoutTail,
    Field::StderrTail,
    Field::StdoutBytes,
    Field::StderrBytes,
];

/// A task hash as read (the `STATUS_FIELDS`), with Redis's clock at the moment
/// of the read.
pub struct TaskRecord {
    values: Vec<Option<Vec<u8>>>,
    pub now_ms: i64,
}

impl TaskRecord {
    /// The field's value; `None` if the record has none, or if `f` is not one of
    /// the `STATUS_FIELDS` (a debug build panics then: add it there).
    pub fn bytes(&self, f: Field) -> Option<&[u8]> {
        let i = STATUS_FIELDS.iter().position(|s| *s == f);
        debug_assert!(i.is_some(), "Store::get does not read {f:?}");
        i.and_then(|i| self.values.get(i))
            .and_then(|v| v.as_deref())
    }

    pub fn text(&self, f: Field) -> Option<String> {
        self.bytes(f)
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }

    pub fn int(&self, f: Field) -> Option<i64> {
        self.bytes(f)
            .and_then(|b| std::str::from_utf8(b).ok())
            .and_then(|s| s.parse().ok())
    }
}

/// A task's state, its collected files' listing (JSON) and their zip.
pub type TaskFiles = (TaskState, Option<String>, Option<Vec<u8>>);
type FieldPair = (Option<String>, Option<String>);

/// Index entries read per round trip when listing.
const LIST_BATCH: usize = 100;

/// The fields `list` reads of each record, in `ListedTask::from_fields` order.
const LISTED_FIELDS: [&str; 6] = [
    Field::State.as_str(),
    Field::Runtime.as_str(),
    Field::Command.as_str(),
    Field::ExitCode.as_str(),
    Field::Reason.as_str(),
    Field::FinishedAt.as_str(),
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
    pub finished_ms: Option<i64>,
}

impl ListedTask {
    /// `None` when the record is gone (expired) or has no readable state.
    fn from_fields(task_id: String, created_ms: i64, f: Vec<Option<String>>) -> Option<ListedTask> {
        let mut f = f.into_iter();
        let mut next = || f.next().flatten();
        let state = next()?.parse().ok()?;
        Some(ListedTask {
            task_id,
            created_ms,
            state,
            runtime: next().unwrap_or_default(),
            command: next().unwrap_or_default(),
            exit_code: next().and_then(|c| c.parse().ok()),
            reason: next(),
            finished_ms: next().and_then(|c| c.parse().ok()),
        })
    }
}

#[derive(Clone)]
pub struct Store {
    pool: LeanPool,
    keys: Keys,
}

impl Store {
    pub fn new(redis_url: &str, keys: Keys) -> Result<Store, StoreError> {
        // Fail fast when Redis is down, so a tool call or /healthz answers in
        // bounded time instead of hanging on the pool. Lean: most requests send
        // one command, and a checked checkout would double their round trips.
        let pool = support::redis_pool::build_lean(
            redis_url,
            32,
            Duration::from_secs(2),
            support::redis_pool::TRUSTED_FOR,
        )?;
        Ok(Store { pool, keys })
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.pool.get().await?;
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        Ok(())
    }

    pub async fn snapshot(&self) -> Result<Snapshot, StoreError> {
        let mut conn = self.pool.get().await?;
        let (jobs_in_stream, stats, names): (u64, HashMap<String, u64>, Vec<String>) =
            redis::pipe()
                .xlen(self.keys.jobs())
                .hgetall(self.keys.stats())
                .smembers(self.keys.workers())
                .query_async(&mut conn)
                .await?;
        // XPENDING summary: [count, first id, last id, consumers]. Before any
        // worker made the group it does not exist: nothing is pending then.
        let pending: Result<PendingSummary, _> = redis::cmd("XPENDING")
            .arg(self.keys.jobs())
            .arg(WORKER_GROUP)
            .query_async(&mut conn)
            .await;
        let jobs_pending = match pending {
            Ok((n, ..)) => n,
            Err(e) if e.code() == Some("NOGROUP") => 0,
            Err(e) => return Err(e.into()),
        };
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
        })
    }

    /// Stores the task (and its zip) and appends its job, all or nothing.
    /// Stores the task and queues its job, unless `t.max_queued` jobs are in the
    /// stream already (one script: the check and the submit are one step).
    pub async fn submit(&self, t: &NewTask<'_>) -> Result<Submitted, StoreError> {
        let mut conn = self.pool.get().await?;
        let fields: Vec<(&str, String)> = vec![
            (Field::State.as_str(), TaskState::Queued.as_str().to_owned()),
            (Field::Runtime.as_str(), t.runtime.to_owned()),
            (Field::Image.as_str(), t.image.to_owned()),
            (Field::Command.as_str(), t.command.to_owned()),
            (
                Field::TimeoutSeconds.as_str(),
                t.timeout_seconds.to_string(),
            ),
            (
                Field::HasZip.as_str(),
                u8::from(t.zip.is_some()).to_string(),
            ),
            (
                Field::HasStdin.as_str(),
                u8::from(t.stdin.is_some()).to_string(),
            ),
            (Field::Network.as_str(), t.network.as_str().to_owned()),
            (Field::StdoutBytes.as_str(), "0".into()),
            (Field::StderrBytes.as_str(), "0".into()),
        ];
        let mut fields = fields;
        if let Some(env) = &t.env_json {
            fields.push((Field::Env.as_str(), env.clone()));
        }
        if let Some(collect) = &t.collect_json {
            fields.push((Field::Collect.as_str(), collect.clone()));
        }
        let mut call = scripts::SUBMIT.key(self.keys.task(t.id));
        call.key(self.keys.task_zip(t.id))
            .key(self.keys.task_stdin(t.id))
            .key(self.keys.stats())
            .key(self.keys.jobs())
            .key(self.keys.task_index())
            .arg(t.id)
            .arg(t.zip.unwrap_or_default())
            .arg(t.stdin.unwrap_or_default())
            .arg(t.index_horizon_ms)
            .arg(t.max_queued);
        for (field, value) in &fields {
            call.arg(*field).arg(value);
        }
        // The stream entry's id, or the backlog that refused the task.
        match call.invoke_async(&mut conn).await? {
            redis::Value::Int(backlog) => Ok(Submitted::Full(backlog.max(0) as u64)),
            _entry => Ok(Submitted::Queued),
        }
    }

    /// One page of tasks, newest first, after `cursor` (the last one a previous
    /// page ended on), keeping those `keep` accepts, at most `limit` of them.
    /// Examines at most `max_examined` index entries, so a rare filter costs a
    /// bounded amount per call: the page may then be short, with a cursor to go on.
    /// Index entries whose record expired are dropped on the way.
    pub async fn list(
        &self,
        cursor: Option<&ListCursor>,
        limit: usize,
        max_examined: usize,
        keep: impl Fn(&ListedTask) -> bool,
    ) -> Result<(Vec<ListedTask>, Option<ListCursor>), StoreError> {
        let mut conn = self.pool.get().await?;
        let index = self.keys.task_index();
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
            let mut pipe = redis::pipe();
            for (id, _) in &fresh {
                pipe.cmd("HMGET")
                    .arg(self.keys.task(id))
                    .arg(&LISTED_FIELDS);
            }
            let records: Vec<Vec<Option<String>>> = pipe.query_async(&mut conn).await?;
            for ((id, ms), fields) in fresh.into_iter().zip(records) {
                examined += 1;
                last = Some(ListCursor {
                    created_ms: ms,
                    task_id: id.clone(),
                });
                let Some(task) = ListedTask::from_fields(id.clone(), ms, fields) else {
                    // The record expired: its index entry goes too.
                    let _: i64 = conn.zrem(&index, &id).await?;
                    continue;
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

    /// A task's state, its collected files' listing (JSON) and zip; `None` if
    /// there is no such task.
    pub async fn files(&self, id: &str) -> Result<Option<TaskFiles>, StoreError> {
        let mut conn = self.pool.get().await?;
        let ((state, listing), zip): (FieldPair, Option<Vec<u8>>) = redis::pipe()
            .cmd("HMGET")
            .arg(self.keys.task(id))
            .arg(Field::State.as_str())
            .arg(Field::Files.as_str())
            .get(self.keys.task_files(id))
            .query_async(&mut conn)
            .await?;
        let Some(state) = state else {
            return Ok(None);
        };
        let state = state
            .parse()
            .map_err(|e: shared::task::UnknownState| StoreError::Corrupt(e.to_string()))?;
        Ok(Some((state, listing, zip)))
    }

    /// The task hash's `STATUS_FIELDS`, or `None` if there is no such task (or
    /// it expired).
    pub async fn get(&self, id: &str) -> Result<Option<TaskRecord>, StoreError> {
        let mut conn = self.pool.get().await?;
        let mut pipe = redis::pipe();
        pipe.cmd("HMGET").arg(self.keys.task(id));
        for f in STATUS_FIELDS {
            pipe.arg(f.as_str());
        }
        let (values, (secs, micros)): (Vec<Option<Vec<u8>>>, (i64, i64)) =
            pipe.cmd("TIME").query_async(&mut conn).await?;
        // Every record has a state from its first write on.
        if values.first().is_none_or(Option::is_none) {
            return Ok(None);
        }
        Ok(Some(TaskRecord {
            values,
            now_ms: secs * 1000 + micros / 1000,
        }))
    }

    /// Kills a queued or running task. `None` if there is no such task; otherwise
    /// its state after the call and whether this call killed it.
    pub async fn kill(
        &self,
        id: &str,
        retention_seconds: u64,
    ) -> Result<Option<(TaskState, bool)>, StoreError> {
        let mut conn = self.pool.get().await?;
        let (state, killed): (String, i64) = scripts::KILL
            .key(self.keys.task(id))
            .key(self.keys.task_zip(id))
            .key(self.keys.stats())
            .key(self.keys.task_stdin(id))
            .arg(KILLED_BY_USER_REASON)
            .arg(ReasonKind::KilledByUser.as_str())
            .arg(retention_seconds)
            .invoke_async(&mut conn)
            .await?;
        if state == MISSING {
            return Ok(None);
        }
        let state = state
            .parse()
            .map_err(|e: shared::task::UnknownState| StoreError::Corrupt(e.to_string()))?;
        Ok(Some((state, killed == 1)))
    }
}
