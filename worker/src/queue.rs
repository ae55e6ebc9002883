//! The worker's view of Redis: the jobs stream (consumer group), the task hash
//! transitions (Lua scripts from `shared`), zips and the heartbeat.

use std::sync::Arc;
use std::time::Duration;

use shared::envvar::ReplicaAck;
use store::redis_pool::{Pool, Pooled, RedisTarget, ReplicationError};

/// How many `WAIT`s a claim or finish sends on its connection before it gives
/// up and is retried whole (see `Queue::replicated_script`).
const REPLICA_WAITS: u32 = 30;
use redis::streams::{StreamReadOptions, StreamReadReply};
use redis::{AsyncCommands, AsyncConnectionConfig};
use shared::cache::Generations;
use shared::egress::Egress;
use shared::keys::{Heartbeat, JOB_TASK_ID, WORKER_GROUP};
use shared::options::{CacheUse, Network};
use shared::scripts::{Ended, Saved, ScriptCall, SweepOp, WsReply};
pub use shared::scripts::{Progress, TaskStateReply};
use shared::spec::{SpecRejection, SpecVerifier};
use shared::task::{Outcome, RecordedEnd};
use shared::workspace::{VersionRecord, WorkspaceCaps, WorkspaceId};
use shared::{Field, Keys, Owner, RecordError, RuntimeName};
use store::scripts;
use store::tasks::{SpecRead, TaskReadError, Tasks};

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("Redis is unreachable: {0}")]
    Pool(#[from] store::redis_pool::GetError),
    #[error("Redis failed: {0}")]
    Redis(#[from] redis::RedisError),
    #[error(transparent)]
    BuildPool(#[from] store::redis_pool::PoolError),
    /// `REDIS_MIN_REPLICAS_ACK` replicas did not confirm a transition.
    #[error("Redis did not replicate a transition in time: {0}")]
    NotReplicated(store::redis_pool::NotReplicated),
    /// The task's record does not read as its type (the error names the field).
    #[error("task {0} has a malformed record: {1}")]
    Corrupt(String, #[source] RecordError),
    /// A script replied with something this version does not know: another
    /// version's script, which retrying does not change.
    #[error("the {script} script replied {reply}, which this version does not know")]
    Reply { script: &'static str, reply: String },
    /// A workspace's stored records do not read.
    #[error(transparent)]
    Workspace(store::workspaces::WorkspaceReadError),
}

impl From<store::workspaces::WorkspaceReadError> for QueueError {
    fn from(e: store::workspaces::WorkspaceReadError) -> QueueError {
        match e {
            store::workspaces::WorkspaceReadError::Redis(e) => QueueError::Redis(e),
            other => QueueError::Workspace(other),
        }
    }
}

impl From<scripts::InvokeError> for QueueError {
    fn from(e: scripts::InvokeError) -> QueueError {
        match e {
            scripts::InvokeError::Redis(e) => QueueError::Redis(e),
            scripts::InvokeError::Reply { script, reply } => QueueError::Reply { script, reply },
        }
    }
}

impl From<TaskReadError> for QueueError {
    fn from(e: TaskReadError) -> QueueError {
        match e {
            TaskReadError::Redis(e) => QueueError::Redis(e),
            TaskReadError::Record { task_id, source } => QueueError::Corrupt(task_id, source),
        }
    }
}

impl QueueError {
    /// Whether retrying cannot help: a malformed record, or a reply this
    /// version cannot read, stays so however often it is read again.
    pub fn is_permanent(&self) -> bool {
        matches!(self, QueueError::Corrupt(..) | QueueError::Reply { .. })
    }

    /// What is wrong when waiting cannot help: a wrong Redis user or password, a
    /// missing ACL permission, a TLS certificate this worker does not trust. None for
    /// everything else (Redis down, a network blip), which is worth retrying.
    pub fn misconfiguration(&self) -> Option<&'static str> {
        type Dyn = dyn std::error::Error + 'static;
        /// The error `err` wraps. tokio-rustls hands a failed handshake on as an
        /// `io::Error` (InvalidData) around rustls's own error, redis keeps that
        /// in an `Arc` (ErrorKind::Io), and neither wrapper's `source()` yields
        /// what it wraps (io::Error's skips it): so each is opened here.
        fn wrapped(err: &Dyn) -> Option<&Dyn> {
            if let Some(io) = err.downcast_ref::<std::io::Error>() {
                return io.get_ref().map(|inner| inner as &Dyn);
            }
            if let Some(arc) =
                err.downcast_ref::<std::sync::Arc<dyn std::error::Error + Send + Sync>>()
            {
                return Some(&**arc);
            }
            err.source()
        }
        /// rustls refused the server's certificate (untrusted, or not naming the
        /// host): by its error type, not its message.
        fn certificate_refused(e: &redis::RedisError) -> bool {
            std::iter::successors(Some(e as &Dyn), |err| wrapped(*err)).any(|err| {
                matches!(
                    err.downcast_ref::<rustls::Error>(),
                    Some(rustls::Error::InvalidCertificate(_))
                )
            })
        }
        /// Redis (with REDIS_TLS_CLIENT_CERTS=on) refused this worker's client
        /// certificate, or wanted one: the alert it sent in the handshake.
        fn client_certificate_refused(e: &redis::RedisError) -> bool {
            use rustls::AlertDescription as A;
            std::iter::successors(Some(e as &Dyn), |err| wrapped(*err)).any(|err| {
                matches!(
                    err.downcast_ref::<rustls::Error>(),
                    Some(rustls::Error::AlertReceived(
                        A::CertificateRequired
                            | A::BadCertificate
                            | A::UnknownCA
                            | A::CertificateUnknown
                            | A::HandshakeFailure
                    ))
                )
            })
        }
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
            _ if certificate_refused(e) => Some(
                "Redis's TLS certificate is not trusted or does not name the host in REDIS_URL \
                 (a private CA goes in SSL_CERT_FILE)",
            ),
            _ if client_certificate_refused(e) => Some(
                "Redis refused this worker's TLS client certificate or wants one: set \
                 REDIS_CLIENT_CERT and REDIS_CLIENT_KEY to a certificate signed by the \
                 deployment's CA (deploy/add-worker.sh --issue)",
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

/// What a task asks a worker to do, every part of it signed by the api
/// (`Queue::task_spec` verifies before it makes one).
#[derive(Debug, Clone)]
pub enum Work {
    /// `run_script`: a command in a container.
    Script(TaskSpec),
    /// `write_files`: an edit of a workspace version, made without one.
    Edit(EditSpec),
}

/// A `write_files` task: files written over a version, and paths deleted.
#[derive(Debug, Clone)]
pub struct EditSpec {
    pub owner: Owner,
    /// The workspace, and the version the edit applies to.
    pub workspace: (WorkspaceId, u64),
    /// The files to write, as a zip the api made (none: only deletes).
    pub zip: Option<Payload>,
    /// Paths to delete, each with all under it, before the files are written.
    pub deletes: Vec<String>,
}

/// A script task: what a worker needs of it to run it.
#[derive(Debug, Clone)]
pub struct TaskSpec {
    pub runtime: RuntimeName,
    pub image: String,
    pub command: String,
    pub timeout_seconds: u64,
    /// The zip submitted with it, as read (and signed).
    pub zip: Option<Payload>,
    /// Its stdin, as read (and signed).
    pub stdin: Option<Payload>,
    /// Extra environment variables, as checked by the api.
    pub env: Vec<(String, String)>,
    /// What it may reach: the internet, nothing, or its allow-list.
    pub egress: Egress,
    /// `collect`: paths or globs under /workspace to keep after the run.
    pub collect: Vec<String>,
    /// Who submitted it: its usage is counted to them (none for the admin).
    pub owner: Owner,
    /// Whether it uses its owner's dependency caches.
    pub cache: CacheUse,
    /// The workspace it runs on, and the version it starts from (0: empty).
    pub workspace: Option<(WorkspaceId, u64)>,
}

/// Bytes a task was submitted with (its zip, its stdin), cheap to clone; its
/// `Debug` shows only the length.
#[derive(Clone)]
pub struct Payload(pub Arc<[u8]>);

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Payload({} bytes)", self.0.len())
    }
}

/// The fields `task_spec` reads: what a `TaskSpec` is made of, every signed
/// field among them (`tests::every_signed_field_is_read`), and the signature.
const SPEC_FIELDS: [Field; 17] = [
    Field::State,
    Field::Runtime,
    Field::Image,
    Field::Command,
    Field::TimeoutSeconds,
    Field::HasZip,
    Field::HasStdin,
    Field::Env,
    Field::Collect,
    Field::Network,
    Field::EgressAllow,
    Field::Owner,
    Field::Cache,
    Field::WorkspaceId,
    Field::WorkspaceBase,
    Field::EditDeletes,
    Field::SpecSignature,
];

/// The files a task's `collect` gathered: a zip, and its listing as JSON.
pub struct Collected {
    pub zip: Vec<u8>,
    pub listing: String,
}

#[derive(Clone)]
pub struct Queue {
    pool: Pool,
    target: RedisTarget,
    keys: Keys,
    tasks: Tasks,
    workspaces: store::workspaces::Workspaces,
    worker: String,
    replica_ack: Option<ReplicaAck>,
}

impl Queue {
    /// `redis`: `store::redis_pool::target`'s (`RedisTarget::url` in tests).
    /// `replica_ack`: claims and finishes wait for that many replicas.
    pub fn new(
        redis: &RedisTarget,
        keys: Keys,
        worker: String,
        replica_ack: Option<ReplicaAck>,
    ) -> Result<Queue, QueueError> {
        let pool = store::redis_pool::build(redis, 64, Duration::from_secs(5))?;
        Ok(Queue {
            pool,
            target: redis.clone(),
            tasks: Tasks::new(keys.clone()),
            workspaces: store::workspaces::Workspaces::new(keys.clone()),
            keys,
            worker,
            replica_ack,
        })
    }

    pub fn worker(&self) -> &str {
        &self.worker
    }

    /// A connection for blocking reads of up to `block`: the default response
    /// timeout (500 ms) would cut an `XREADGROUP ... BLOCK` short, and none at all
    /// would let a half-open connection stall the worker forever.
    pub async fn blocking_connection(&self, block: Duration) -> Result<Pooled, QueueError> {
        let cfg = AsyncConnectionConfig::new()
            .set_response_timeout(Some(block + Duration::from_secs(5)))
            .set_connection_timeout(Some(Duration::from_secs(2)));
        Ok(Pooled::connect(&self.target, &cfg).await?)
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
        conn: &mut Pooled,
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

    /// Runs a state script (STARTED, PROGRESS).
    async fn state_script(
        &self,
        call: &ScriptCall<TaskStateReply>,
    ) -> Result<TaskStateReply, QueueError> {
        let mut conn = self.pool.get().await?;
        Ok(scripts::invoke(&mut conn, call).await?)
    }

    /// Runs a transition whose loss in a failover would run a task twice (a
    /// claim: the job would be read again) or lose its end (a finish), and
    /// with `REDIS_MIN_REPLICAS_ACK` returns only once that many replicas have
    /// it. `WAIT` counts the writes of the connection it is sent on, so a short
    /// count is waited out on the same connection (a bounded number of times)
    /// rather than by running the script again elsewhere: a retry that finds
    /// the change made writes nothing, and its `WAIT` would prove nothing.
    ///
    /// `protect` says whether a reply is worth waiting for: a claim that found
    /// the task killed (or another's) changed nothing of ours.
    ///
    /// `calls` go in order on one connection; the last one's reply is returned.
    async fn replicated_script(
        &self,
        task_id: &str,
        calls: &[&ScriptCall<TaskStateReply>],
        protect: fn(&TaskStateReply) -> bool,
    ) -> Result<TaskStateReply, QueueError> {
        let mut conn = self.pool.get().await?;
        let replies = scripts::invoke_all(&mut conn, calls).await?;
        // `calls` is never empty; an empty one would read as a missing task.
        let reply = replies.last().copied().unwrap_or(TaskStateReply::Missing);
        let script = calls.last().map_or("?", |c| c.script().name());
        if !protect(&reply) {
            return Ok(reply);
        }
        let mut tries = 0;
        loop {
            match store::redis_pool::replicated(&mut conn, self.replica_ack).await {
                Ok(()) => break,
                Err(ReplicationError::Redis(e)) => return Err(e.into()),
                Err(ReplicationError::Short(short)) => {
                    tries += 1;
                    tracing::warn!(task_id, script, tries, error = %short, "waiting for replicas");
                    if tries >= REPLICA_WAITS {
                        return Err(QueueError::NotReplicated(short));
                    }
                }
            }
        }
        Ok(reply)
    }

    /// queued -> running, owned by this worker.
    pub async fn claim(&self, job: &Job) -> Result<TaskStateReply, QueueError> {
        let call = ScriptCall::claim(&self.keys, &job.task_id, &self.worker, &job.entry_id);
        self.replicated_script(&job.task_id, &[&call], |r| {
            *r == TaskStateReply::State(shared::TaskState::Running)
        })
        .await
    }

    /// Records the container start; the reply says whether the task is still ours.
    pub async fn started(
        &self,
        task_id: &str,
        container: &str,
    ) -> Result<TaskStateReply, QueueError> {
        let call = ScriptCall::started(&self.keys, task_id, &self.worker, container);
        self.state_script(&call).await
    }

    /// Publishes tails; the reply carries the current state (a kill shows here).
    pub async fn progress(
        &self,
        task_id: &str,
        p: &Progress<'_>,
    ) -> Result<TaskStateReply, QueueError> {
        let call = ScriptCall::progress(&self.keys, task_id, &self.worker, p);
        self.state_script(&call).await
    }

    /// Records how the task ended (unless it already ended: a kill is final).
    /// `collected`: the zip and listing of the files `collect` gathered, kept as
    /// long as the record.
    ///
    /// `last`: the task's final tails, written first on the same connection.
    /// So the finish, which waits for the replicas, carries them: a progress
    /// write lost with a demoted primary cannot leave an ended task without its
    /// last output.
    pub async fn finish(
        &self,
        task_id: &str,
        outcome: &Outcome,
        retention_seconds: u64,
        ended: &Ended<'_>,
        last: Option<&Progress<'_>>,
    ) -> Result<TaskStateReply, QueueError> {
        let progress = last.map(|p| ScriptCall::progress(&self.keys, task_id, &self.worker, p));
        self.finish_as(
            task_id,
            &self.worker,
            outcome,
            retention_seconds,
            ended,
            progress,
        )
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
        self.finish_as(
            task_id,
            worker,
            outcome,
            retention_seconds,
            &Ended::default(),
            None,
        )
        .await
    }

    async fn finish_as(
        &self,
        task_id: &str,
        worker: &str,
        outcome: &Outcome,
        retention_seconds: u64,
        ended: &Ended<'_>,
        progress: Option<ScriptCall<TaskStateReply>>,
    ) -> Result<TaskStateReply, QueueError> {
        let call = ScriptCall::finish(
            &self.keys,
            task_id,
            worker,
            outcome,
            retention_seconds,
            ended,
        );
        let calls: Vec<&ScriptCall<TaskStateReply>> = progress.iter().chain([&call]).collect();
        self.replicated_script(task_id, &calls, |_| true).await
    }

    /// The task's current state, read without changing anything.
    pub async fn state(&self, task_id: &str) -> Result<TaskStateReply, QueueError> {
        let mut conn = self.pool.get().await?;
        let state = self.tasks.state(&mut conn, task_id).await?;
        Ok(state.map_or(TaskStateReply::Missing, TaskStateReply::State))
    }

    /// A workspace's version record (its manifest's digest), if it is kept.
    pub async fn workspace_version(
        &self,
        id: &WorkspaceId,
        version: u64,
    ) -> Result<Option<VersionRecord>, QueueError> {
        let mut conn = self.pool.get().await?;
        Ok(self.workspaces.version(&mut conn, id, version).await?)
    }

    /// WS_COMMIT: the task's stored /workspace becomes its workspace's next
    /// version (or the task is recorded as making none), as this worker.
    pub async fn ws_commit(
        &self,
        task_id: &str,
        (id, base): (WorkspaceId, u64),
        saved: Saved<'_>,
        caps: WorkspaceCaps,
    ) -> Result<WsReply, QueueError> {
        let call = ScriptCall::ws_commit(&self.keys, task_id, &self.worker, &id, base, saved, caps);
        let mut conn = self.pool.get().await?;
        Ok(scripts::invoke(&mut conn, &call).await?)
    }

    /// WS_SWEEP's `op` as this worker, with a lease of `lease` (ignored by
    /// `Look` and `End`); `every`, for `Begin`, is how often the store is swept.
    pub async fn ws_sweep(
        &self,
        op: SweepOp,
        lease: Duration,
        every: Duration,
    ) -> Result<WsReply, QueueError> {
        let (lease, every) = (lease.as_millis() as u64, every.as_millis() as u64);
        let call = ScriptCall::ws_sweep(&self.keys, op, &self.worker, lease, every);
        let mut conn = self.pool.get().await?;
        Ok(scripts::invoke(&mut conn, &call).await?)
    }

    /// Every kept version of every workspace (for the blob sweep).
    pub async fn kept_versions(&self) -> Result<Vec<(WorkspaceId, VersionRecord)>, QueueError> {
        let mut conn = self.pool.get().await?;
        Ok(self.workspaces.kept_versions(&mut conn).await?)
    }

    /// The task's spec, once its signature holds under one of `verifier`'s keys
    /// (`Err` says why not: then nothing of the record may be acted on); `None`
    /// if there is no such task. The record's fields, zip and stdin are read in
    /// one round trip, and the signature checked over those very bytes.
    pub async fn task_spec(
        &self,
        task_id: &str,
        verifier: &SpecVerifier,
    ) -> Result<Option<Result<Work, SpecRejection>>, QueueError> {
        let mut conn = self.pool.get().await?;
        let read = self.tasks.read_spec(&mut conn, task_id, &SPEC_FIELDS).await;
        let Some(SpecRead {
            signature,
            message,
            record,
            zip,
            stdin,
        }) = read?
        else {
            return Ok(None);
        };
        // The signature first: nothing of a forged record, not even whether
        // its values parse, decides what happens to it.
        if let Err(rejection) = verifier.verify(&message, signature.as_deref()) {
            // Killed since the claim (its zip and stdin deleted with it): not
            // a forgery, and nothing left to run.
            if let Ok(r) = &record
                && r.state.is_terminal()
            {
                return Ok(None);
            }
            return Ok(Some(Err(rejection)));
        }
        let r = record?;
        if r.state.is_terminal() {
            return Ok(None);
        }
        let corrupt = |e| QueueError::Corrupt(task_id.to_owned(), e);
        let need = |v, f| RecordError::required(v, f).map_err(corrupt);
        // A zip or stdin whose flag is off is signed but not used.
        let zip = zip
            .filter(|_| r.has_zip == Some(true))
            .map(|z| Payload(z.into()));
        // The admin's tasks have no owner field.
        let owner = r.owner.unwrap_or(Owner::Admin);
        if let Some(deletes) = r.edit_deletes {
            let id = RecordError::required(r.workspace_id, Field::WorkspaceId).map_err(corrupt)?;
            return Ok(Some(Ok(Work::Edit(EditSpec {
                owner,
                workspace: (id, r.workspace_base.unwrap_or(0)),
                zip,
                deletes,
            }))));
        }
        Ok(Some(Ok(Work::Script(TaskSpec {
            runtime: RecordError::required(r.runtime, Field::Runtime).map_err(corrupt)?,
            image: need(r.image, Field::Image)?,
            command: need(r.command, Field::Command)?,
            timeout_seconds: RecordError::required(r.timeout_seconds, Field::TimeoutSeconds)
                .map_err(corrupt)?,
            zip,
            stdin: stdin
                .filter(|_| r.has_stdin == Some(true))
                .map(|s| Payload(s.into())),
            env: r.env.unwrap_or_default().into_iter().collect(),
            collect: r.collect.unwrap_or_default(),
            // Records written before the field existed ran with the internet;
            // an allow task whose list is gone may reach nothing.
            egress: Egress::from_record(
                r.network.unwrap_or(Network::Internet),
                r.egress_allow.as_ref(),
            ),
            owner,
            // Records written before the field existed: the default.
            cache: r.cache.unwrap_or_default(),
            workspace: r.workspace_id.map(|id| (id, r.workspace_base.unwrap_or(0))),
        }))))
    }

    /// The clear generations of an owner's dependency cache (`cache::owner_id`)
    /// as the ctl recorded them: one `HMGET`.
    pub async fn cache_generations(&self, owner_id: &str) -> Result<Generations, QueueError> {
        let mut conn = self.pool.get().await?;
        let (owner, all): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(self.keys.cache_clears())
            .arg(owner_id)
            .arg(shared::cache::ALL_OWNERS)
            .query_async(&mut conn)
            .await?;
        Ok(Generations::from_values(owner.as_deref(), all.as_deref()))
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
        let call = ScriptCall::forget_worker(&self.keys, name);
        Ok(scripts::invoke(&mut conn, &call).await?)
    }

    /// Puts a job back in the stream for any worker with a free slot, dropping
    /// its old entry (see `scripts::REQUEUE`).
    pub async fn requeue(&self, job: &Job) -> Result<(), QueueError> {
        let mut conn = self.pool.get().await?;
        let call = ScriptCall::requeue(&self.keys, &job.entry_id, &job.task_id);
        let _requeued = scripts::invoke(&mut conn, &call).await?;
        Ok(())
    }

    /// How the task's end was recorded, if it has ended: read when a task was
    /// ended by someone else (`kill_task`, a reaper) while this worker ran it.
    pub async fn recorded_end(&self, task_id: &str) -> Result<Option<RecordedEnd>, QueueError> {
        let mut conn = self.pool.get().await?;
        const FIELDS: [Field; 3] = [Field::State, Field::ReasonKind, Field::Reason];
        let record = self.tasks.read(&mut conn, task_id, &FIELDS).await?;
        Ok(record.and_then(|r| {
            Some(RecordedEnd {
                state: r.state,
                kind: r.reason_kind?,
                reason: r.reason?,
            })
        }))
    }

    /// The task's state and the worker recorded as holding it.
    pub async fn state_and_owner(
        &self,
        task_id: &str,
    ) -> Result<(TaskStateReply, Option<String>), QueueError> {
        let mut conn = self.pool.get().await?;
        const FIELDS: [Field; 2] = [Field::State, Field::Worker];
        Ok(match self.tasks.read(&mut conn, task_id, &FIELDS).await? {
            None => (TaskStateReply::Missing, None),
            Some(r) => (TaskStateReply::State(r.state), r.worker),
        })
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

    /// A signed field the worker did not read would be missing from the
    /// message it verifies, and every task would be refused.
    #[test]
    fn every_signed_field_is_read() {
        for f in Field::ALL.iter().filter(|f| f.is_signed()) {
            assert!(
                SPEC_FIELDS.contains(f),
                "{f} is signed but task_spec does not read it"
            );
        }
        assert!(SPEC_FIELDS.contains(&Field::SpecSignature));
    }

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

    /// A TLS failure wrapped as tokio-rustls and redis wrap it.
    fn tls_failure(error: rustls::Error) -> QueueError {
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, error);
        QueueError::Redis(redis::RedisError::from(io))
    }

    #[test]
    fn a_refused_certificate_stops_the_start_and_other_tls_failures_do_not() {
        for refused in [
            rustls::CertificateError::UnknownIssuer,
            rustls::CertificateError::NotValidForName,
            rustls::CertificateError::Expired,
        ] {
            let e = tls_failure(rustls::Error::InvalidCertificate(refused));
            assert!(
                e.misconfiguration()
                    .is_some_and(|why| why.contains("TLS certificate")),
                "{e}"
            );
        }
        // A plain-text Redis behind a rediss:// URL garbles the handshake: that
        // may be a port mix-up in progress, and is retried as before.
        let garbled = tls_failure(rustls::Error::InvalidMessage(
            rustls::InvalidMessage::InvalidContentType,
        ));
        assert!(garbled.misconfiguration().is_none(), "{garbled}");
    }
}
