//! `script-runner-ctl`: a live view of a script-runner deployment for operators,
//! read from Redis only (any user allowed the read commands below is enough),
//! the management of API keys (`keys`, which writes: `FCALL` too), and, for
//! Redis's admin user, loading this build's Lua functions (`redis`).
//!
//! - `status`: workers, queue, running tasks, tasks finished in the last hour;
//! - `top`: the same, refreshing in the terminal, the stuck-looking tasks first;
//! - `task ID`: one task's record and output tails, `--follow` to watch them grow;
//! - `keys create|list|revoke|rotate`: API keys (`keys`); `revoke
//!   --kill-tasks` also kills the key's active tasks.
//! - `tasks kill --owner NAME|--admin`: kills every active task of one owner
//!   (`tasks`: the KILL script, `FCALL`, so as `admin` like `keys`).
//! - `usage`: what each owner's tasks used in all, the heaviest first, and
//!   what its workspaces hold.
//! - `workspaces list|show|delete`: persistent workspaces, every owner's
//!   (`workspaces`; `delete` runs WS_DELETE, `FCALL`, so as `admin`).
//! - `cache clear`: asks the workers to empty dependency caches (`cache`:
//!   writes one counter, `HINCRBY`, so as `admin` like `keys`).
//! - `redis load-functions|functions|prune-functions`: the Lua functions
//!   library, one per build (`functions`).
//!
//! Every read is bounded, so it is safe against a busy production Redis: no
//! `KEYS`; the worker registry is read with `SSCAN ... COUNT` up to a cap, the
//! running tasks come from the jobs stream's pending entries (`XPENDING` with a
//! count), and "the last hour" from sixty per-minute counter hashes that the
//! FINISH and KILL scripts keep (`Keys::stats_minute`). Commands used: `TIME`,
//! `SSCAN`, `MGET`, `PTTL`, `XLEN`, `XPENDING`, `XRANGE`, `HMGET`, `HGETALL`, `ZREVRANGE`,
//! `ZCARD`.

pub mod cache;
pub mod functions;
pub mod keys;
pub mod read;
pub mod render;
pub mod signing;
pub mod tasks;
pub mod top;
pub mod usage;
pub mod workspaces;

use shared::Keys;
use shared::envvar::{Common, VarError, non_blank};

/// What the ctl needs: the same `REDIS_URL` and `REDIS_KEY_PREFIX` as the api and
/// the workers, read and checked the same way (`shared::envvar::Common`).
#[derive(Debug, Clone)]
pub struct Config {
    /// `REDIS_URL` (or `REDIS_SENTINELS`), with the client certificate for a
    /// Redis that requires mutual TLS.
    pub redis: shared::envvar::RedisSettings,
    pub keys: Keys,
    /// `TASK_RETENTION_SECONDS`, as the api's: how long a task the ctl kills
    /// keeps its record.
    pub retention_seconds: u64,
}

impl Config {
    pub fn from_env() -> Result<Config, CtlError> {
        Config::from_lookup(|name| std::env::var(name).ok())
    }

    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, CtlError> {
        let common = Common::from_lookup(non_blank(get))?;
        Ok(Config {
            redis: common.redis,
            keys: common.keys,
            retention_seconds: common.retention_seconds,
        })
    }

    /// A pool of at most `size` connections to this Redis, with the client
    /// certificate if one is set.
    pub async fn pool(&self, size: usize) -> Result<store::redis_pool::Pool, CtlError> {
        let redis = store::redis_pool::target(&self.redis).await?;
        Ok(store::redis_pool::build(
            &redis,
            size,
            std::time::Duration::from_secs(3),
        )?)
    }
}

impl CtlError {
    /// Redis not answering, or answering from a node that is no longer the
    /// primary (a failover under way): a later read may well succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            // A login refused (WRONGPASS, NOPERM) is no outage.
            CtlError::Pool(store::redis_pool::GetError::Backend(e)) => {
                store::redis_error::breaks_connection(e)
            }
            CtlError::Pool(_) => true,
            CtlError::Redis(e) => store::redis_error::breaks_connection(e),
            _ => false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error(transparent)]
    Config(#[from] VarError),
    #[error(transparent)]
    BuildPool(#[from] store::redis_pool::PoolError),
    #[error("Redis is unreachable: {0}")]
    Pool(#[from] store::redis_pool::GetError),
    #[error("Redis failed: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("no task {0} (never submitted under this REDIS_KEY_PREFIX, or its record expired)")]
    NoSuchTask(String),
    #[error("task {task_id}: {source}")]
    Record {
        task_id: String,
        #[source]
        source: shared::RecordError,
    },
    #[error(transparent)]
    ApiKey(#[from] store::apikeys::ApiKeyError),
    #[error("killing the tasks failed: {0}")]
    Kill(#[from] store::scripts::InvokeError),
    #[error(
        "the tasks were killed, but Redis could not confirm it on the replicas \
         REDIS_MIN_REPLICAS_ACK asks for ({0}): run the command again to be sure"
    )]
    KillNotReplicated(#[from] store::redis_pool::ReplicationError),
    #[error(transparent)]
    Functions(#[from] store::scripts::FunctionsError),
    #[error(transparent)]
    Key(#[from] shared::apikey::KeyError),
    #[error("no workspace {0} (never made under this REDIS_KEY_PREFIX, or deleted)")]
    NoSuchWorkspace(shared::workspace::WorkspaceId),
    #[error("workspace {id}: {what}")]
    Workspace {
        id: shared::workspace::WorkspaceId,
        what: String,
    },
    #[error("{0}")]
    BadWorkspaceId(#[from] shared::workspace::BadWorkspaceId),
    #[error("terminal: {0}")]
    Terminal(#[from] std::io::Error),
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
}

impl From<store::tasks::TaskReadError> for CtlError {
    fn from(e: store::tasks::TaskReadError) -> CtlError {
        use store::tasks::TaskReadError as E;
        match e {
            E::Redis(e) => CtlError::Redis(e),
            E::Record { task_id, source } => CtlError::Record { task_id, source },
        }
    }
}
