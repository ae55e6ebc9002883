//! `script-runner-ctl`: a live view of a script-runner deployment for operators,
//! read from Redis only (any user allowed the read commands below is enough).
//!
//! - `status`: workers, queue, running tasks, tasks finished in the last hour;
//! - `top`: the same, refreshing in the terminal, the stuck-looking tasks first;
//! - `task ID`: one task's record and output tails, `--follow` to watch them grow.
//!
//! Every read is bounded, so it is safe against a busy production Redis: no
//! `KEYS`; the worker registry is read with `SSCAN ... COUNT` up to a cap, the
//! running tasks come from the jobs stream's pending entries (`XPENDING` with a
//! count), and "the last hour" from sixty per-minute counter hashes that the
//! FINISH and KILL scripts keep (`Keys::stats_minute`). Commands used: `TIME`,
//! `SSCAN`, `MGET`, `PTTL`, `XLEN`, `XPENDING`, `XRANGE`, `HMGET`, `HGETALL`.

pub mod read;
pub mod render;
pub mod top;

use shared::Keys;
use shared::envvar::{Common, VarError, non_blank};

/// What the ctl needs: the same `REDIS_URL` and `REDIS_KEY_PREFIX` as the api and
/// the workers, read and checked the same way (`shared::envvar::Common`).
#[derive(Debug, Clone)]
pub struct Config {
    pub redis_url: String,
    pub keys: Keys,
}

impl Config {
    pub fn from_env() -> Result<Config, CtlError> {
        Config::from_lookup(|name| std::env::var(name).ok())
    }

    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, CtlError> {
        let common = Common::from_lookup(non_blank(get))?;
        Ok(Config {
            redis_url: common.redis_url,
            keys: common.keys,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error(transparent)]
    Config(#[from] VarError),
    #[error(transparent)]
    BuildPool(#[from] support::redis_pool::PoolError),
    #[error("Redis is unreachable: {0}")]
    Pool(#[from] deadpool_redis::PoolError),
    #[error("Redis failed: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("no task {0} (never submitted under this REDIS_KEY_PREFIX, or its record expired)")]
    NoSuchTask(String),
    #[error("terminal: {0}")]
    Terminal(#[from] std::io::Error),
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
}
