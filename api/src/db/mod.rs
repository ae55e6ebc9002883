//! The api's view of Redis: submit a task, read one, kill one, check reachability.
//! Key names and hash fields come from `shared`; multi-step changes are atomic
//! Lua scripts (`shared/src/lua/`).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use deadpool_redis::redis::{self, AsyncCommands};
use shared::apikey::{ApiKeyRecord, Limits};
use shared::egress::Egress;
use shared::envvar::ReplicaAck;
use shared::keys::{STAT_FINISHED_PREFIX, STAT_SUBMITTED, parse_heartbeat};
use shared::options::CacheUse;
use shared::record::RecordError;
use shared::scripts::{KillReply, ScriptCall, Submit, SubmitReply};
use shared::task::KILLED_BY_USER_REASON;
use shared::task::NOT_REPLICATED_REASON;
use shared::time::redis_time_ms;
use shared::view::StatusView;
use shared::{Field, Keys, ReasonKind, TaskState};
use store::redis_pool::{LeanConnection, LeanPool, RedisTarget, ReplicationError};
use store::scripts;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the task store (Redis) is unreachable: {0}")]
    Pool(#[from] store::redis_pool::GetError),
    #[error("the task store (Redis) failed: {0}")]
    Redis(#[from] redis::RedisError),
    /// A stored task record does not read as its type (the error names the field).
    #[error("task {task_id}: {source}")]
    Record {
        task_id: String,
        #[source]
        source: RecordError,
    },
    /// A script replied with something this version does not know.
    #[error("the {script} script replied {reply:?}, which this version does not know")]
    Reply { script: &'static str, reply: String },
    /// A value could not be written or read as JSON.
    #[error("a value could not be encoded as JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    BuildPool(#[from] store::redis_pool::PoolError),
    /// `REDIS_MIN_REPLICAS_ACK` replicas did not confirm a write in time.
    #[error("the task store (Redis) is failing over or its replicas lag: {0}")]
    NotReplicated(#[from] store::redis_pool::NotReplicated),
    /// An API key record that does not read as one.
    #[error("{0}")]
    ApiKey(#[from] shared::apikey::KeyError),
}

impl From<ReplicationError> for StoreError {
    fn from(e: ReplicationError) -> StoreError {
        match e {
            ReplicationError::Short(short) => StoreError::NotReplicated(short),
            ReplicationError::Redis(e) => StoreError::Redis(e),
        }
    }
}

impl StoreError {
    fn record(task_id: &str) -> impl FnOnce(RecordError) -> StoreError {
        let task_id = task_id.to_owned();
        move |source| StoreError::Record { task_id, source }
    }
}

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
    /// Its egress policy (the record's `network` and `egress_allow`).
    pub egress: &'a Egress,
    /// Whether the task uses its owner's dependency caches.
    pub cache: CacheUse,
    /// `collect` patterns, as the JSON array stored in the record.
    pub collect_json: Option<String>,
    /// How long the task index keeps an entry: the record's retention and then some.
    pub index_horizon_ms: u64,
    /// `MAX_QUEUED_TASKS`: with this many jobs in the stream, the task is refused.
    pub max_queued: u64,
    /// The key submitting it and its quotas (`None`: the admin key).
    pub owner: Option<(&'a str, Limits)>,
}

/// What became of a `NewTask`: queued, or refused (nothing stored) by the
/// service's cap or the owner's quota.
pub type Submitted = SubmitReply;

/// The fields of a task hash that `get` reads: what `get_task_status` shows.
pub use shared::view::STATUS_FIELDS;

/// A task record as `get` read it (its `STATUS_FIELDS`), with Redis's clock at
/// the moment of the read.
#[derive(Debug, Clone)]
pub struct StatusRead {
    pub record: shared::TaskRecord,
    pub now_ms: i64,
}

impl StatusRead {
    /// The status at the moment of the read, tails of at most `tail_bytes`.
    pub fn view(&self, tail_bytes: usize) -> StatusView {
        StatusView::new(&self.record, self.now_ms, tail_bytes)
    }
}

/// A task's state, its collected files' listing (JSON) and their zip (read
/// only once the task has ended).
pub type TaskFiles = (TaskState, Option<String>, Option<Vec<u8>>);

/// Index entries read per round trip when listing.
const LIST_BATCH: usize = 100;

/// The fields `list` reads of each record.
const LISTED_FIELDS: [Field; 10] = [
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
}

impl ListedTask {
    fn new(task_id: String, created_ms: i64, r: shared::TaskRecord) -> ListedTask {
        let usage = shared::usage::Usage::of(&r);
        ListedTask {
            task_id,
            created_ms,
            state: r.state,
            runtime: r.runtime.unwrap_or_default(),
            command: r.command.unwrap_or_default(),
            exit_code: r.exit_code,
            reason: r.reason,
            reason_kind: r.reason_kind,
            finished_ms: r.finished_at,
            usage,
        }
    }
}

#[derive(Clone)]
pub struct Store {
    pool: LeanPool,
    /// Connections for `wait_for_event` only: an `XREAD BLOCK` holds its
    /// connection (a multiplexed one too: Redis answers nothing else on it
    /// until the read returns), so waiters never take `pool`'s.
    waits: LeanPool,
    keys: Keys,
    replica_ack: Option<ReplicaAck>,
}

/// Blocking reads in flight at once per replica (`WAIT_CONNECTIONS`
/// connections, opened as needed). A waiter that finds none free within
/// `WAIT_CHECKOUT` answers with the status as it is, as at its deadline.
pub const WAIT_CONNECTIONS: usize = 128;
const WAIT_CHECKOUT: Duration = Duration::from_millis(500);

/// One `XREAD BLOCK` lasts at most this long, under the connections' 10 s
/// response timeout; a longer wait blocks again.
const WAIT_SLICE: Duration = Duration::from_secs(5);

/// The last entry of a task's events stream when its record was read (`0-0`
/// before the first): a waiter blocks for entries after it, so nothing
/// appended between the read and the block is missed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventMark(String);

/// `XREVRANGE <events> + - COUNT 1`: the last entry, if any (its fields unread).
type LastEvent = Vec<(String, redis::Value)>;

/// How a `wait_for_event` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woke {
    /// Something was appended after the mark.
    Event,
    /// The deadline passed first.
    Deadline,
    /// No wait connection was free: answer as at the deadline.
    Busy,
}

/// A wait connection in use: unless the read it carries completed, it is
/// closed, not returned, when dropped (the waiter was cancelled mid-read).
struct Blocking {
    conn: Option<store::redis_pool::LeanConnection>,
    clean: bool,
}

impl Drop for Blocking {
    fn drop(&mut self) {
        if !self.clean
            && let Some(conn) = self.conn.take()
        {
            conn.discard();
        }
    }
}

impl Store {
    /// `replica_ack`: submits and kills are answered only once that many
    /// replicas have them (`REDIS_MIN_REPLICAS_ACK`).
    pub fn new(
        redis: &RedisTarget,
        keys: Keys,
        replica_ack: Option<ReplicaAck>,
    ) -> Result<Store, StoreError> {
        // Fail fast when Redis is down, so a tool call or /healthz answers in
        // bounded time instead of hanging on the pool. Lean: most requests send
        // one command, and a checked checkout would double their round trips.
        let pool = store::redis_pool::build_lean(
            redis,
            32,
            Duration::from_secs(2),
            store::redis_pool::TRUSTED_FOR,
        )?;
        let waits = store::redis_pool::build_lean(
            redis,
            WAIT_CONNECTIONS,
            WAIT_CHECKOUT,
            store::redis_pool::TRUSTED_FOR,
        )?;
        Ok(Store {
            pool,
            waits,
            keys,
            replica_ack,
        })
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

    /// Stores the task (and its zip) and appends its job, all or nothing.
    /// Stores the task and queues its job, unless `t.max_queued` jobs are in the
    /// stream already (one script: the check and the submit are one step).
    pub async fn submit(&self, t: &NewTask<'_>) -> Result<Submitted, StoreError> {
        // The api hands env and collect over as the JSON it checked; the record
        // holds them typed.
        let env = t
            .env_json
            .as_deref()
            .map(serde_json::from_str)
            .transpose()?;
        let collect = t
            .collect_json
            .as_deref()
            .map(serde_json::from_str)
            .transpose()?;
        let record = shared::TaskRecord {
            runtime: Some(t.runtime.to_owned()),
            image: Some(t.image.to_owned()),
            command: Some(t.command.to_owned()),
            timeout_seconds: Some(t.timeout_seconds),
            has_zip: Some(t.zip.is_some()),
            has_stdin: Some(t.stdin.is_some()),
            env,
            network: Some(t.egress.network()),
            egress_allow: t.egress.allow_list().cloned(),
            cache: Some(t.cache),
            collect,
            stdout_bytes: Some(0),
            stderr_bytes: Some(0),
            owner: t.owner.map(|(o, _)| o.to_owned()),
            ..shared::TaskRecord::new(TaskState::Queued)
        };
        let submit = Submit {
            task_id: t.id,
            zip: t.zip,
            stdin: t.stdin,
            index_horizon_ms: t.index_horizon_ms,
            max_queued: t.max_queued,
            owner: t.owner,
        };
        let call = ScriptCall::submit(&self.keys, &submit, &record);
        let mut conn = self.pool.get().await?;
        // The stream entry's id, the backlog that refused the task, or the
        // owner's quota that did.
        let reply: redis::Value = scripts::invoke(&mut conn, &call).await?;
        let submitted = scripts::read_submit(reply).map_err(|reply| StoreError::Reply {
            script: call.script.name(),
            reply,
        })?;
        if submitted == SubmitReply::Queued {
            self.confirm_submit(&mut conn, t).await?;
        }
        Ok(submitted)
    }

    /// A submit is acknowledged (its id handed out) only once the replicas
    /// `REDIS_MIN_REPLICAS_ACK` asks for have it: a failover could otherwise
    /// lose a task its client was told exists. One that could not be confirmed
    /// is withdrawn (killed, so no worker runs it if it survives) and the client
    /// is told to try again.
    async fn confirm_submit(
        &self,
        conn: &mut LeanConnection,
        t: &NewTask<'_>,
    ) -> Result<(), StoreError> {
        let Err(e) = store::redis_pool::replicated(conn, self.replica_ack).await else {
            return Ok(());
        };
        // A short count leaves the connection usable; a Redis error may not.
        let same_connection = matches!(e, ReplicationError::Short(_));
        let error = StoreError::from(e);
        let withdraw = ScriptCall::kill(
            &self.keys,
            t.id,
            NOT_REPLICATED_REASON,
            ReasonKind::NotReplicated,
            // Nobody was given its id: kept only long enough for an operator to see it.
            shared::envvar::MIN_RETENTION_SECONDS,
            None,
        );
        // On the submit's connection while it works (so to the same node, after
        // it), waiting for the replicas as long as the submit did: a replica
        // that got the submit then likely gets the withdrawal too. Best effort:
        // the client is told to try again whatever happens here.
        let withdrawn = if same_connection {
            match scripts::invoke::<(String, i64)>(conn, &withdraw).await {
                Ok(_) => {
                    let _ = store::redis_pool::replicated(conn, self.replica_ack).await;
                    Ok(())
                }
                Err(e) => Err(e),
            }
        } else {
            match self.pool.get().await {
                Ok(mut c) => scripts::invoke::<(String, i64)>(&mut c, &withdraw)
                    .await
                    .map(|_| ()),
                Err(e) => Err(redis::RedisError::from(std::io::Error::other(
                    e.to_string(),
                ))),
            }
        };
        match withdrawn {
            Ok(()) => {
                tracing::warn!(task_id = %t.id, error = %error, "submit withdrawn: not replicated")
            }
            Err(e) => tracing::warn!(
                task_id = %t.id, error = %error, withdraw_error = %e,
                "submit not replicated, and could not be withdrawn (if it survives, it runs)"
            ),
        }
        Err(error)
    }

    /// The record of the API key presented (hashed before it reaches Redis),
    /// `None` if there is no such key; touches its `last_used_at` at most once
    /// a minute.
    pub async fn api_key(&self, presented: &[u8]) -> Result<Option<ApiKeyRecord>, StoreError> {
        use store::apikeys::ApiKeyError as E;
        let mut conn = self.pool.get().await?;
        match store::apikeys::lookup(&mut conn, &self.keys, presented).await {
            Ok(r) => Ok(r),
            Err(E::Redis(e)) => Err(StoreError::Redis(e)),
            Err(E::Key(e)) => Err(StoreError::ApiKey(e)),
            Err(e) => Err(StoreError::Reply {
                script: "key lookup",
                reply: e.to_string(),
            }),
        }
    }

    /// One page of tasks, newest first, after `cursor` (the last one a previous
    /// page ended on), keeping those `keep` accepts, at most `limit` of them.
    /// Examines at most `max_examined` index entries, so a rare filter costs a
    /// bounded amount per call: the page may then be short, with a cursor to go on.
    /// Index entries whose record expired are dropped on the way.
    /// `owner`: only that owner's tasks (its own index); `None`: everyone's.
    pub async fn list(
        &self,
        owner: Option<&str>,
        cursor: Option<&ListCursor>,
        limit: usize,
        max_examined: usize,
        keep: impl Fn(&ListedTask) -> bool,
    ) -> Result<(Vec<ListedTask>, Option<ListCursor>), StoreError> {
        let mut conn = self.pool.get().await?;
        let index = match owner {
            Some(o) => self.keys.owner_tasks(o),
            None => self.keys.task_index(),
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
            let mut pipe = redis::pipe();
            for (id, _) in &fresh {
                pipe.cmd("HMGET").arg(self.keys.task(id));
                for f in LISTED_FIELDS {
                    pipe.arg(f.as_str());
                }
            }
            let records: Vec<Vec<Option<Vec<u8>>>> = pipe.query_async(&mut conn).await?;
            for ((id, ms), fields) in fresh.into_iter().zip(records) {
                examined += 1;
                last = Some(ListCursor {
                    created_ms: ms,
                    task_id: id.clone(),
                });
                let task = match shared::TaskRecord::from_values(&LISTED_FIELDS, fields) {
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

    /// A task's state, its collected files' listing (JSON) and, once it has
    /// ended, their zip; `None` if there is no such task or `sees` refuses its
    /// owner. The owner is read first and the zip only for a caller who sees
    /// the task, so another owner's task costs what an unknown id does.
    pub async fn files(
        &self,
        id: &str,
        sees: impl FnOnce(Option<&str>) -> bool,
    ) -> Result<Option<TaskFiles>, StoreError> {
        let mut conn = self.pool.get().await?;
        const FIELDS: [Field; 3] = [Field::State, Field::Files, Field::Owner];
        let values: Vec<Option<Vec<u8>>> = redis::cmd("HMGET")
            .arg(self.keys.task(id))
            .arg(&FIELDS.map(Field::as_str))
            .query_async(&mut conn)
            .await?;
        let record =
            shared::TaskRecord::from_values(&FIELDS, values).map_err(StoreError::record(id))?;
        let Some(r) = record.filter(|r| sees(r.owner.as_deref())) else {
            return Ok(None);
        };
        let zip = if r.state.is_terminal() {
            conn.get(self.keys.task_files(id)).await?
        } else {
            None
        };
        Ok(Some((r.state, r.files, zip)))
    }

    /// The task hash's `STATUS_FIELDS`, or `None` if there is no such task (or
    /// it expired).
    pub async fn get(&self, id: &str) -> Result<Option<StatusRead>, StoreError> {
        let mut conn = self.pool.get().await?;
        let mut pipe = redis::pipe();
        self.read_status(&mut pipe, id);
        let (values, time) = pipe.query_async(&mut conn).await?;
        status_read(id, values, time)
    }

    /// `get`, and the mark to wait from (`wait_for_event`): the events
    /// stream's last id is read first, in the same round trip, so an event
    /// after it is always one the record read does not show yet.
    pub async fn get_marked(
        &self,
        id: &str,
    ) -> Result<Option<(StatusRead, EventMark)>, StoreError> {
        let mut conn = self.pool.get().await?;
        let mut pipe = redis::pipe();
        pipe.cmd("XREVRANGE")
            .arg(self.keys.task_events(id))
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1);
        self.read_status(&mut pipe, id);
        let (last, values, time): (LastEvent, _, _) = pipe.query_async(&mut conn).await?;
        let mark = EventMark(
            last.into_iter()
                .next()
                .map_or_else(|| "0-0".to_owned(), |(id, _)| id),
        );
        Ok(status_read(id, values, time)?.map(|read| (read, mark)))
    }

    /// Appends what `get` reads to `pipe`: the record's `STATUS_FIELDS`, then
    /// Redis's clock (`status_read` takes the two replies).
    fn read_status(&self, pipe: &mut redis::Pipeline, id: &str) {
        pipe.cmd("HMGET")
            .arg(self.keys.task(id))
            .arg(&STATUS_FIELDS.map(Field::as_str))
            .cmd("TIME");
    }

    /// Blocks until task `id`'s events stream has an entry after `mark`, or
    /// `until` passes. A blocking read on a connection of its own
    /// (`XREAD BLOCK`), so every waiter on a task wakes on the same append and
    /// nothing polls. Cancel it by dropping the future: its connection is then
    /// closed, not reused.
    pub async fn wait_for_event(
        &self,
        id: &str,
        mark: &EventMark,
        until: tokio::time::Instant,
    ) -> Result<Woke, StoreError> {
        let conn = match self.waits.get().await {
            Ok(conn) => conn,
            Err(deadpool_redis::PoolError::Timeout(_)) => return Ok(Woke::Busy),
            Err(e) => return Err(e.into()),
        };
        let mut held = Blocking {
            conn: Some(conn),
            clean: true,
        };
        let key = self.keys.task_events(id);
        loop {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Ok(Woke::Deadline);
            }
            // BLOCK 0 would mean for ever.
            let block_ms = left.min(WAIT_SLICE).as_millis().max(1) as u64;
            let Some(conn) = held.conn.as_mut() else {
                return Ok(Woke::Deadline);
            };
            held.clean = false;
            let reply: redis::Value = redis::cmd("XREAD")
                .arg("COUNT")
                .arg(1)
                .arg("BLOCK")
                .arg(block_ms)
                .arg("STREAMS")
                .arg(&key)
                .arg(&mark.0)
                .query_async(conn)
                .await?;
            held.clean = true;
            if !matches!(reply, redis::Value::Nil) {
                return Ok(Woke::Event);
            }
        }
    }

    /// Kills a queued or running task. `None` if there is no such task, or
    /// (`owner` given) it is another owner's; otherwise its state after the
    /// call and whether this call killed it. The owner is checked in the same
    /// script, so another owner's task is never touched.
    pub async fn kill(
        &self,
        id: &str,
        retention_seconds: u64,
        owner: Option<&str>,
    ) -> Result<Option<(TaskState, bool)>, StoreError> {
        let mut conn = self.pool.get().await?;
        let call = ScriptCall::kill(
            &self.keys,
            id,
            KILLED_BY_USER_REASON,
            ReasonKind::KilledByUser,
            retention_seconds,
            owner,
        );
        let reply: (String, i64) = scripts::invoke(&mut conn, &call).await?;
        // A kill acknowledged and then lost in a failover would let the task
        // run on. Only a killed task has anything to confirm (a retried kill
        // writes its state again, so this covers the first one too); an unknown
        // id gets its answer whatever the replicas do.
        if reply.0 == TaskState::Killed.as_str() {
            store::redis_pool::replicated(&mut conn, self.replica_ack).await?;
        }
        match KillReply::parse(reply) {
            Ok(KillReply::Missing) => Ok(None),
            Ok(KillReply::State(state, killed)) => Ok(Some((state, killed))),
            Err(e) => Err(StoreError::Reply {
                script: call.script.name(),
                reply: e.name,
            }),
        }
    }
}

/// The replies of `Store::read_status` as a task's status, `None` when there
/// is no such task.
fn status_read(
    id: &str,
    values: Vec<Option<Vec<u8>>>,
    time: (i64, i64),
) -> Result<Option<StatusRead>, StoreError> {
    let record =
        shared::TaskRecord::from_values(&STATUS_FIELDS, values).map_err(StoreError::record(id))?;
    Ok(record.map(|record| StatusRead {
        record,
        now_ms: redis_time_ms(time),
    }))
}
