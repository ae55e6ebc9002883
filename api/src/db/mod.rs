//! The api's view of Redis, by job: `submit` (run_script), `read` (a task's
//! status and files), `wait` (a task's next event), `list` (list_tasks),
//! `kill` (kill_task), `workspaces` (the workspace tools) and `snapshot`
//! (/metrics); here the handle, its errors, the API key lookup and the health
//! check. Task records are read through the store's task repository
//! (`store::tasks`), workspaces through its workspace repository
//! (`store::workspaces`); every write is a Lua script (`shared/src/lua/`).

use std::time::Duration;

use deadpool_redis::redis;
use shared::Keys;
use shared::apikey::ApiKeyRecord;
use shared::envvar::ReplicaAck;
use shared::record::RecordError;
use store::redis_pool::{LeanPool, RedisTarget, ReplicationError};
use store::scripts::InvokeError;
use store::tasks::{TaskReadError, Tasks};
use store::workspaces::Workspaces;

mod kill;
mod list;
mod read;
mod snapshot;
mod submit;
mod wait;
mod workspaces;

pub use list::{ListCursor, ListedTask};
pub use read::{STATUS_FIELDS, StatusRead, TaskFiles};
pub use snapshot::{METRICS_OWNERS, Snapshot};
pub use store::workspaces::PageCursor as WorkspaceCursor;
pub use wait::{WAIT_CONNECTIONS, Woke};

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
    /// A stored workspace or version record does not read as its type.
    #[error("workspace {id}: {source}")]
    Workspace {
        id: shared::workspace::WorkspaceId,
        #[source]
        source: shared::workspace::BadStored,
    },
    /// A script replied with something this version does not know.
    #[error("the {script} script replied {reply}, which this version does not know")]
    Reply { script: &'static str, reply: String },
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

impl From<InvokeError> for StoreError {
    fn from(e: InvokeError) -> StoreError {
        match e {
            InvokeError::Redis(e) => StoreError::Redis(e),
            InvokeError::Reply { script, reply } => StoreError::Reply { script, reply },
        }
    }
}

impl From<TaskReadError> for StoreError {
    fn from(e: TaskReadError) -> StoreError {
        match e {
            TaskReadError::Redis(e) => StoreError::Redis(e),
            TaskReadError::Record { task_id, source } => StoreError::Record { task_id, source },
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
    tasks: Tasks,
    workspaces: Workspaces,
    replica_ack: Option<ReplicaAck>,
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
            wait::WAIT_CHECKOUT,
            store::redis_pool::TRUSTED_FOR,
        )?;
        Ok(Store {
            pool,
            waits,
            tasks: Tasks::new(keys.clone()),
            workspaces: Workspaces::new(keys.clone()),
            keys,
            replica_ack,
        })
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.pool.get().await?;
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        Ok(())
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
}
