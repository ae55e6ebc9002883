//! The worker's view of Redis: the jobs stream (consumer group), the task hash
//! transitions (Lua scripts from `shared`), zips and the heartbeat.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use deadpool_redis::Pool;
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamReadOptions, StreamReadReply};
use redis::{AsyncCommands, AsyncConnectionConfig, Script};
use shared::keys::{Heartbeat, JOB_TASK_ID, WORKER_GROUP};
use shared::options::Network;
pub use shared::scripts::TaskStateReply;
use shared::task::{Outcome, RecordedEnd};
use shared::{Field, Keys};
use support::scripts;

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("Redis is unreachable: {0}")]
    Pool(#[from] deadpool_redis::PoolError),
    #[error("Redis failed: {0}")]
    Redis(#[from] redis::RedisError),
    #[error(transparent)]
    BuildPool(#[from] support::redis_pool::PoolError),
    #[error("task {0} has a malformed record: {1}")]
    Corrupt(String, String),
}

impl QueueError {
    /// What is wrong when waiting cannot help: a wrong Redis user or password, a
    /// missing ACL permission, a TLS certificate this worker does not trust. None for
    /// everything else (Redis down, a network blip), which is worth retrying.
    pub fn misconfiguration(&self) -> Option<&'static str> {
        let e = match self {
            QueueError::Redis(e) => e,
            QueueError::Pool(deadpool_redis::PoolError::Backend(e)) => e,
            _ => return None,
        };
        match e.kind() {
            redis::ErrorKind::AuthenticationFailed => {
                Some("Redis refused the user or password in REDIS_URL")
            }
            redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) => Some(
                "the Redis user in REDIS_URL lacks a permission the worker needs (see ACL LOG)",
            ),
            _ if e.to_string().contains("invalid peer certificate") => Some(
                "Redis's TLS certificate is not trusted or does not name the host in REDIS_URL \
                 (a private CA goes in SSL_CERT_FILE)",
            ),
            _ => None,
        }
    }
}

/// One entry read from the jobs stream.
#[derive(Debug, Clone)]
pub struct Job {
    pub entry_id: String,
    pub task_id: String,
}

/// What a worker needs of a task to run it.
#[derive(Debug, Clone)]
pub struct TaskSpec {
    pub runtime: String,
    pub image: String,
    pub command: String,
    pub timeout_seconds: u64,
    pub has_zip: bool,
    pub has_stdin: bool,
    /// Extra environment variables, as checked by the api.
    pub env: Vec<(String, String)>,
    pub network: Network,
    /// `collect`: paths or globs under /workspace to keep after the run.
    pub collect: Vec<String>,
}

/// The files a task's `collect` gathered: a zip, and its listing as JSON.
pub struct Collected {
    pub zip: Vec<u8>,
    pub listing: String,
}

/// Output tails as published while a task runs.
pub struct Progress<'a> {
    pub stdout_tail: &'a [u8],
    pub stderr_tail: &'a [u8],
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// Milliseconds since the last output byte; `None` if there was none yet.
    pub output_age_ms: Option<u64>,
}

#[derive(Clone)]
pub struct Queue {
    pool: Pool,
    client: redis::Client,
    keys: Keys,
    worker: String,
}

impl Queue {
    pub fn new(redis_url: &str, keys: Keys, worker: String) -> Result<Queue, QueueError> {
        let pool = support::redis_pool::build(redis_url, 64, Duration::from_secs(5))?;
        Ok(Queue {
            pool,
            client: redis::Client::open(redis_url)?,
            keys,
            worker,
        })
    }

    pub fn worker(&self) -> &str {
        &self.worker
    }

    /// A connection for blocking reads of up to `block`: the default response
    /// timeout (500 ms) would cut an `XREADGROUP ... BLOCK` short, and none at all
    /// would let a half-open connection stall the worker forever.
    pub async fn blocking_connection(
        &self,
        block: Duration,
    ) -> Result<MultiplexedConnection, QueueError> {
        let cfg = AsyncConnectionConfig::new()
            .set_response_timeout(Some(block + Duration::from_secs(5)))
            .set_connection_timeout(Some(Duration::from_secs(2)));
        Ok(self
            .client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await?)
    }

    /// Creates the consumer group (and stream) if missing. It starts at id 0 so
    /// jobs submitted before any worker existed are still run.
    pub async fn ensure_group(&self) -> Result<(), QueueError> {
        let mut conn = self.pool.get().await?;
        let created: Result<(), redis::RedisError> = conn
            .xgroup_create_mkstream(self.keys.jobs(), WORKER_GROUP, "0")
            .await;
        match created {
            Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
            other => Ok(other?),
        }
    }

    /// Reads up to `count` jobs. `pending = true` re-reads this consumer's own
    /// unacknowledged entries (what it held when it last stopped); otherwise new
    /// ones, blocking up to `block`.
    pub async fn read_jobs(
        &self,
        conn: &mut MultiplexedConnection,
        count: usize,
        block: Duration,
        pending: bool,
    ) -> Result<Vec<Job>, QueueError> {
        let mut opts = StreamReadOptions::default()
            .group(WORKER_GROUP, &self.worker)
            .count(count);
        if !pending {
            opts = opts.block(block.as_millis() as usize);
        }
        let id = if pending { "0" } else { ">" };
        let reply: Option<StreamReadReply> = conn
            .xread_options(&[self.keys.jobs()], &[id], &opts)
            .await?;
        let mut jobs = Vec::new();
        for key in reply.map(|r| r.keys).unwrap_or_default() {
            for entry in key.ids {
                match job_from(entry.id.clone(), entry.get(JOB_TASK_ID)) {
                    Some(job) => jobs.push(job),
                    // An entry that names no task, or not by a task id, can never
                    // be run (and must not become a host path): drop it.
                    None => {
                        tracing::warn!(entry = %entry.id, "jobs entry without a valid task_id dropped");
                        self.ack(&entry.id).await?;
                    }
                }
            }
        }
        Ok(jobs)
    }

    /// Acknowledges and deletes a stream entry: the task hash is the record, the
    /// stream only carries work, so it does not grow without bound.
    pub async fn ack(&self, entry_id: &str) -> Result<(), QueueError> {
        let mut conn = self.pool.get().await?;
        let jobs = self.keys.jobs();
        let () = redis::pipe()
            .atomic()
            .xack(&jobs, WORKER_GROUP, &[entry_id])
            .ignore()
            .xdel(&jobs, &[entry_id])
            .ignore()
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    /// Runs a state script for `task_id` as worker `worker` (ARGV[1]).
    async fn state_script(
        &self,
        script: &Script,
        task_id: &str,
        worker: &str,
        args: &[&[u8]],
    ) -> Result<TaskStateReply, QueueError> {
        let mut conn = self.pool.get().await?;
        let mut inv = script.key(self.keys.task(task_id));
        inv.key(self.keys.task_zip(task_id))
            .key(self.keys.stats())
            .key(self.keys.task_stdin(task_id))
            .key(self.keys.task_files(task_id));
        inv.arg(worker);
        for a in args {
            inv.arg(*a);
        }
        let s: String = inv.invoke_async(&mut conn).await?;
        parse_reply(task_id, Some(&s))
    }

    /// queued -> running, owned by this worker.
    pub async fn claim(&self, job: &Job) -> Result<TaskStateReply, QueueError> {
        let entry = job.entry_id.as_bytes();
        self.state_script(&scripts::CLAIM, &job.task_id, &self.worker, &[entry])
            .await
    }

    /// Records the container start; the reply says whether the task is still ours.
    pub async fn started(
        &self,
        task_id: &str,
        container: &str,
    ) -> Result<TaskStateReply, QueueError> {
        self.state_script(
            &scripts::STARTED,
            task_id,
            &self.worker,
            &[container.as_bytes()],
        )
        .await
    }

    /// Publishes tails; the reply carries the current state (a kill shows here).
    pub async fn progress(
        &self,
        task_id: &str,
        p: &Progress<'_>,
    ) -> Result<TaskStateReply, QueueError> {
        let (out_b, err_b) = (p.stdout_bytes.to_string(), p.stderr_bytes.to_string());
        let age = p.output_age_ms.map(|a| a.to_string()).unwrap_or_default();
        self.state_script(
            &scripts::PROGRESS,
            task_id,
            &self.worker,
            &[
                p.stdout_tail,
                p.stderr_tail,
                out_b.as_bytes(),
                err_b.as_bytes(),
                age.as_bytes(),
            ],
        )
        .await
    }

    /// Records how the task ended (unless it already ended: a kill is final).
    /// `collected`: the zip and listing of the files `collect` gathered, kept as
    /// long as the record.
    pub async fn finish(
        &self,
        task_id: &str,
        outcome: &Outcome,
        retention_seconds: u64,
        collected: Option<&Collected>,
    ) -> Result<TaskStateReply, QueueError> {
        self.finish_as(task_id, &self.worker, outcome, retention_seconds, collected)
            .await
    }

    /// Records the end of a task held by `worker`, which may be another (dead)
    /// worker: the reaper settles a lost worker's tasks this way.
    pub async fn finish_for(
        &self,
        task_id: &str,
        worker: &str,
        outcome: &Outcome,
        retention_seconds: u64,
    ) -> Result<TaskStateReply, QueueError> {
        self.finish_as(task_id, worker, outcome, retention_seconds, None)
            .await
    }

    async fn finish_as(
        &self,
        task_id: &str,
        worker: &str,
        outcome: &Outcome,
        retention_seconds: u64,
        collected: Option<&Collected>,
    ) -> Result<TaskStateReply, QueueError> {
        let code = outcome.exit_code.map(|c| c.to_string()).unwrap_or_default();
        let retention = retention_seconds.to_string();
        let (zip, listing) = collected.map_or((&[][..], ""), |c| (&c.zip[..], c.listing.as_str()));
        self.state_script(
            &scripts::FINISH,
            task_id,
            worker,
            &[
                outcome.state.as_str().as_bytes(),
                outcome.kind.as_str().as_bytes(),
                outcome.reason.as_bytes(),
                code.as_bytes(),
                retention.as_bytes(),
                zip,
                listing.as_bytes(),
            ],
        )
        .await
    }

    /// The task's current state, read without changing anything.
    pub async fn state(&self, task_id: &str) -> Result<TaskStateReply, QueueError> {
        let mut conn = self.pool.get().await?;
        let s: Option<String> = conn
            .hget(self.keys.task(task_id), Field::State.as_str())
            .await?;
        parse_reply(task_id, s.as_deref())
    }

    pub async fn task_spec(&self, task_id: &str) -> Result<Option<TaskSpec>, QueueError> {
        let mut conn = self.pool.get().await?;
        let f: HashMap<String, String> = conn.hgetall(self.keys.task(task_id)).await?;
        if f.is_empty() {
            return Ok(None);
        }
        let get = |field: Field| {
            f.get(field.as_str()).cloned().ok_or_else(|| {
                QueueError::Corrupt(task_id.to_owned(), format!("no {}", field.as_str()))
            })
        };
        Ok(Some(TaskSpec {
            runtime: get(Field::Runtime)?,
            image: get(Field::Image)?,
            command: get(Field::Command)?,
            timeout_seconds: get(Field::TimeoutSeconds)?.parse().map_err(|_| {
                QueueError::Corrupt(task_id.to_owned(), "bad timeout_seconds".into())
            })?,
            has_zip: f.get(Field::HasZip.as_str()).is_some_and(|v| v == "1"),
            has_stdin: f.get(Field::HasStdin.as_str()).is_some_and(|v| v == "1"),
            env: match f.get(Field::Env.as_str()) {
                None => Vec::new(),
                Some(json) => serde_json::from_str::<BTreeMap<String, String>>(json)
                    .map_err(|e| QueueError::Corrupt(task_id.to_owned(), format!("bad env: {e}")))?
                    .into_iter()
                    .collect(),
            },
            collect: match f.get(Field::Collect.as_str()) {
                None => Vec::new(),
                Some(json) => serde_json::from_str(json).map_err(|e| {
                    QueueError::Corrupt(task_id.to_owned(), format!("bad collect: {e}"))
                })?,
            },
            // Records written before the field existed ran with the internet.
            network: match f.get(Field::Network.as_str()) {
                None => Network::Internet,
                Some(n) => n
                    .parse()
                    .map_err(|e: String| QueueError::Corrupt(task_id.to_owned(), e))?,
            },
        }))
    }

    pub async fn zip(&self, task_id: &str) -> Result<Option<Vec<u8>>, QueueError> {
        let mut conn = self.pool.get().await?;
        Ok(conn.get(self.keys.task_zip(task_id)).await?)
    }

    /// The task's stdin; `None` once the task ended (or if it sent none).
    pub async fn stdin(&self, task_id: &str) -> Result<Option<Vec<u8>>, QueueError> {
        let mut conn = self.pool.get().await?;
        Ok(conn.get(self.keys.task_stdin(task_id)).await?)
    }

    /// Every worker that registered and has not been forgotten.
    pub async fn workers(&self) -> Result<Vec<String>, QueueError> {
        let mut conn = self.pool.get().await?;
        Ok(conn.smembers(self.keys.workers()).await?)
    }

    /// Whether `name`'s heartbeat is alive.
    pub async fn is_alive(&self, name: &str) -> Result<bool, QueueError> {
        let mut conn = self.pool.get().await?;
        Ok(conn.exists(self.keys.worker(name)).await?)
    }

    /// Moves up to 100 of `owner`'s unacknowledged jobs that have been idle at
    /// least `min_idle` to this worker (so two reapers never both take one), except
    /// those `keep` says to leave. `owner` may be this worker itself: then the
    /// claim only resets the entries' idle time.
    pub async fn claim_pending_of(
        &self,
        owner: &str,
        min_idle: Duration,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Vec<Job>, QueueError> {
        let mut conn = self.pool.get().await?;
        let jobs = self.keys.jobs();
        let min_idle_ms = min_idle.as_millis() as u64;
        // XPENDING key group IDLE ms - + count consumer (Redis 6.2+): id, consumer,
        // idle ms, deliveries for each entry.
        let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
            .arg(&jobs)
            .arg(WORKER_GROUP)
            .arg("IDLE")
            .arg(min_idle_ms)
            .arg("-")
            .arg("+")
            .arg(100)
            .arg(owner)
            .query_async(&mut conn)
            .await?;
        let ids: Vec<String> = pending
            .into_iter()
            .map(|p| p.0)
            .filter(|id| !keep(id))
            .collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let claimed: redis::streams::StreamClaimReply = conn
            .xclaim(&jobs, WORKER_GROUP, &self.worker, min_idle_ms, &ids)
            .await?;
        let mut jobs = Vec::new();
        for e in claimed.ids {
            match job_from(e.id.clone(), e.get(JOB_TASK_ID)) {
                Some(job) => jobs.push(job),
                None => self.ack(&e.id).await?,
            }
        }
        Ok(jobs)
    }

    /// Removes a dead worker that holds no job any more from the group and the
    /// registry, atomically (see `scripts::FORGET_WORKER`). Returns false (and
    /// keeps it) while it is alive again or still has pending jobs.
    pub async fn forget_worker(&self, name: &str) -> Result<bool, QueueError> {
        let mut conn = self.pool.get().await?;
        let forgotten: i64 = scripts::FORGET_WORKER
            .key(self.keys.jobs())
            .key(self.keys.worker(name))
            .key(self.keys.workers())
            .arg(WORKER_GROUP)
            .arg(name)
            .invoke_async(&mut conn)
            .await?;
        Ok(forgotten == 1)
    }

    /// Puts a job back in the stream for any worker with a free slot, dropping
    /// its old entry (see `scripts::REQUEUE`).
    pub async fn requeue(&self, job: &Job) -> Result<(), QueueError> {
        let mut conn = self.pool.get().await?;
        let _requeued: i64 = scripts::REQUEUE
            .key(self.keys.jobs())
            .arg(WORKER_GROUP)
            .arg(&job.entry_id)
            .arg(&job.task_id)
            .invoke_async(&mut conn)
            .await?;
        Ok(())
    }

    /// How the task's end was recorded, if it has ended: read when a task was
    /// ended by someone else (`kill_task`, a reaper) while this worker ran it.
    pub async fn recorded_end(&self, task_id: &str) -> Result<Option<RecordedEnd>, QueueError> {
        let mut conn = self.pool.get().await?;
        let (state, kind, reason): (Option<String>, Option<String>, Option<String>) =
            redis::cmd("HMGET")
                .arg(self.keys.task(task_id))
                .arg(Field::State.as_str())
                .arg(Field::ReasonKind.as_str())
                .arg(Field::Reason.as_str())
                .query_async(&mut conn)
                .await?;
        let corrupt =
            |e: shared::task::UnknownState| QueueError::Corrupt(task_id.to_owned(), e.to_string());
        let (Some(state), Some(kind), Some(reason)) = (state, kind, reason) else {
            return Ok(None);
        };
        Ok(Some(RecordedEnd {
            state: state.parse().map_err(corrupt)?,
            kind: kind.parse().map_err(corrupt)?,
            reason,
        }))
    }

    /// The task's state and the worker recorded as holding it.
    pub async fn state_and_owner(
        &self,
        task_id: &str,
    ) -> Result<(TaskStateReply, Option<String>), QueueError> {
        let mut conn = self.pool.get().await?;
        let (state, owner): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(self.keys.task(task_id))
            .arg(Field::State.as_str())
            .arg(Field::Worker.as_str())
            .query_async(&mut conn)
            .await?;
        Ok((parse_reply(task_id, state.as_deref())?, owner))
    }

    /// Says this worker is alive, for ops and the reaper.
    pub async fn heartbeat(&self, ttl: Duration, beat: &Heartbeat) -> Result<(), QueueError> {
        let mut conn = self.pool.get().await?;
        let () = redis::pipe()
            .set_ex(
                self.keys.worker(&self.worker),
                beat.to_value(),
                ttl.as_secs(),
            )
            .ignore()
            .sadd(self.keys.workers(), &self.worker)
            .ignore()
            .query_async(&mut conn)
            .await?;
        Ok(())
    }
}

/// A script's reply or a read `state` field (`None`: no such task), as a
/// [`TaskStateReply`]; anything else means the record is malformed.
fn parse_reply(task_id: &str, s: Option<&str>) -> Result<TaskStateReply, QueueError> {
    TaskStateReply::from_field(s)
        .map_err(|e| QueueError::Corrupt(task_id.to_owned(), e.to_string()))
}

/// A job from a stream entry, if it names a task by a well-formed task id.
fn job_from(entry_id: String, task_id: Option<String>) -> Option<Job> {
    let task_id = uuid::Uuid::parse_str(&task_id?).ok()?.to_string();
    Some(Job { entry_id, task_id })
}

impl QueueError {
    /// The consumer group is gone (Redis lost its data): it must be created again.
    pub fn is_no_group(&self) -> bool {
        matches!(self, QueueError::Redis(e) if e.code() == Some("NOGROUP"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_password_stops_the_start_and_an_outage_does_not() {
        let auth = QueueError::Redis(redis::RedisError::from((
            redis::ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        )));
        assert!(auth.misconfiguration().is_some());
        let down = QueueError::Redis(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        )));
        assert!(down.misconfiguration().is_none());
    }
}
