//! A deadpool-redis pool whose every wait is bounded.

use std::time::Duration;

use deadpool_redis::redis::{self, AsyncConnectionConfig};
use deadpool_redis::{Pool, Runtime};

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("REDIS_URL is not a usable Redis address: {0}")]
    Url(#[from] redis::RedisError),
    #[error("could not create the Redis pool: {0}")]
    Build(String),
}

/// A pool of at most `max_size` connections that waits at most `wait` for a free
/// one, so a caller answers in bounded time when Redis is down.
///
/// redis-rs times a response out after 500 ms by default, which storing or
/// fetching a zip of a few MiB can exceed; and a timeout after Redis applied a
/// write would make a client retry a task that was in fact created. 10 s is ample
/// and still bounds a hung server.
pub fn build(redis_url: &str, max_size: usize, wait: Duration) -> Result<Pool, PoolError> {
    let conn_cfg = AsyncConnectionConfig::new()
        .set_response_timeout(Some(Duration::from_secs(10)))
        .set_connection_timeout(Some(Duration::from_secs(2)));
    let manager = deadpool_redis::Manager::new_with_config(redis_url, conn_cfg)?;
    Pool::builder(manager)
        .max_size(max_size)
        .wait_timeout(Some(wait))
        .create_timeout(Some(Duration::from_secs(2)))
        .recycle_timeout(Some(Duration::from_secs(2)))
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(|e| PoolError::Build(e.to_string()))
}
