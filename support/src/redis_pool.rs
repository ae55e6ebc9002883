//! Redis connection pools whose every wait is bounded: `build` (deadpool-redis as
//! is) and `build_lean` (no check round trip on a busy connection).

use std::time::Duration;

use deadpool::managed::{self, Metrics, RecycleError, RecycleResult};
use deadpool_redis::redis::aio::{ConnectionLike, MultiplexedConnection};
use deadpool_redis::redis::{
    self, AsyncConnectionConfig, ClientTlsConfig, Cmd, ConnectionInfo, IntoConnectionInfo,
    Pipeline, RedisFuture, TlsCertificates, Value,
};
use deadpool_redis::{Pool, Runtime};
use shared::envvar::{ClientCertFiles, REDIS_CLIENT_CERT, REDIS_CLIENT_KEY};

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("REDIS_URL is not a usable Redis address: {0}")]
    Url(#[from] redis::RedisError),
    #[error("could not create the Redis pool: {0}")]
    Build(#[from] managed::BuildError),
    #[error("cannot read {var} ({path}): {source}")]
    ClientCertFile {
        var: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error(
        "REDIS_CLIENT_CERT ({cert}) and REDIS_CLIENT_KEY ({key}) are not a PEM certificate \
         and private key: {source}"
    )]
    ClientCert {
        cert: String,
        key: String,
        source: redis::RedisError,
    },
}

/// Where a binary's Redis is: `REDIS_URL`, and with `REDIS_CLIENT_CERT` and
/// `REDIS_CLIENT_KEY` the client certificate a mutual-TLS Redis requires, read
/// once here (the server's certificate is still checked against the system roots
/// or `SSL_CERT_FILE`). Every pool and client of a binary connects through it.
pub async fn target(
    redis_url: &str,
    client_cert: Option<&ClientCertFiles>,
) -> Result<ConnectionInfo, PoolError> {
    let Some(files) = client_cert else {
        return Ok(redis_url.into_connection_info()?);
    };
    let read = |var: &'static str, path: String| async move {
        tokio::fs::read(&path)
            .await
            .map_err(|source| PoolError::ClientCertFile { var, path, source })
    };
    let tls = ClientTlsConfig {
        client_cert: read(REDIS_CLIENT_CERT.name, files.cert.clone()).await?,
        client_key: read(REDIS_CLIENT_KEY.name, files.key.clone()).await?,
    };
    let certificates = TlsCertificates {
        client_tls: Some(tls),
        root_cert: None,
    };
    let client = redis::Client::build_with_tls(redis_url, certificates).map_err(|source| {
        PoolError::ClientCert {
            cert: files.cert.clone(),
            key: files.key.clone(),
            source,
        }
    })?;
    Ok(client.get_connection_info().clone())
}

/// redis-rs times a response out after 500 ms by default, which storing or
/// fetching a zip of a few MiB can exceed; and a timeout after Redis applied a
/// write would make a client retry a task that was in fact created. 10 s is ample
/// and still bounds a hung server.
fn connection_config() -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_response_timeout(Some(Duration::from_secs(10)))
        .set_connection_timeout(Some(Duration::from_secs(2)))
}

fn bounded<M: managed::Manager, W: From<managed::Object<M>>>(
    builder: managed::PoolBuilder<M, W>,
    max_size: usize,
    wait: Duration,
) -> Result<managed::Pool<M, W>, PoolError> {
    builder
        .max_size(max_size)
        .wait_timeout(Some(wait))
        .create_timeout(Some(Duration::from_secs(2)))
        .recycle_timeout(Some(Duration::from_secs(2)))
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(PoolError::Build)
}

/// A pool of at most `max_size` connections that waits at most `wait` for a free
/// one, so a caller answers in bounded time when Redis is down. Every checkout
/// costs a round trip (deadpool-redis's `UNWATCH` + `PING`); see `build_lean`.
pub fn build(
    redis: impl IntoConnectionInfo,
    max_size: usize,
    wait: Duration,
) -> Result<Pool, PoolError> {
    let manager = deadpool_redis::Manager::new_with_config(redis, connection_config())?;
    bounded(Pool::builder(manager), max_size, wait)
}

/// How long after its last checkout a connection is handed out again unchecked
/// (`build_lean`): long enough to cover a busy server's reuse, short enough that
/// a connection idle across a Redis restart is checked first.
pub const TRUSTED_FOR: Duration = Duration::from_secs(1);

/// A pool like `build`'s, without a round trip per checkout.
///
/// deadpool-redis checks every connection it hands out with `UNWATCH` + `PING`:
/// for a request that sends one command (a status read), that doubles the round
/// trips, and Redis's and the caller's work. Here a connection handed out within
/// the last `trusted_for` is handed out again as is; one idle for longer is
/// checked as before, so one that died while idle (across a Redis restart) is
/// replaced before use. A connection on which a command failed for a
/// connection-level reason (I/O, timeout, protocol) is never handed out again.
/// So a Redis restart fails the commands in flight, and at most one more command
/// on each connection used within `trusted_for` before it. `WATCH` must not be
/// used on these connections (nothing `UNWATCH`es them); `MULTI`/`EXEC` sent as
/// one pipeline is fine.
pub fn build_lean(
    redis: impl IntoConnectionInfo,
    max_size: usize,
    wait: Duration,
    trusted_for: Duration,
) -> Result<LeanPool, PoolError> {
    let manager = LeanManager {
        inner: deadpool_redis::Manager::new_with_config(redis, connection_config())?,
        trusted_for,
    };
    bounded(managed::Pool::builder(manager), max_size, wait)
}

/// See `build_lean`.
pub type LeanPool = managed::Pool<LeanManager, LeanConnection>;

/// deadpool-redis's manager, checking a connection only after it idled.
pub struct LeanManager {
    inner: deadpool_redis::Manager,
    trusted_for: Duration,
}

/// A pooled connection, and whether a command on it failed at the connection level.
pub struct Pooled {
    conn: MultiplexedConnection,
    broken: bool,
}

impl managed::Manager for LeanManager {
    type Type = Pooled;
    type Error = redis::RedisError;

    async fn create(&self) -> Result<Pooled, redis::RedisError> {
        Ok(Pooled {
            conn: managed::Manager::create(&self.inner).await?,
            broken: false,
        })
    }

    async fn recycle(
        &self,
        pooled: &mut Pooled,
        metrics: &Metrics,
    ) -> RecycleResult<redis::RedisError> {
        if pooled.broken {
            return Err(RecycleError::message("a command failed on this connection"));
        }
        if metrics.last_used() < self.trusted_for {
            return Ok(());
        }
        managed::Manager::recycle(&self.inner, &mut pooled.conn, metrics).await
    }
}

/// What `LeanPool::get` hands out: use it like a `MultiplexedConnection`.
pub struct LeanConnection(managed::Object<LeanManager>);

impl From<managed::Object<LeanManager>> for LeanConnection {
    fn from(o: managed::Object<LeanManager>) -> Self {
        LeanConnection(o)
    }
}

impl LeanConnection {
    /// Closes the connection instead of returning it to the pool: for one a
    /// caller stopped waiting on mid-command (a blocking read whose reply is
    /// still to come would hold up the next user's commands).
    pub fn discard(self) {
        drop(managed::Object::take(self.0));
    }

    fn note<T>(&mut self, result: &redis::RedisResult<T>) {
        if let Err(e) = result
            && breaks_connection(e)
        {
            self.0.broken = true;
        }
    }
}

/// Whether an error means the connection cannot be trusted any more (rather than
/// Redis answering a command with an error).
fn breaks_connection(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_unrecoverable_error()
}

impl ConnectionLike for LeanConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let result = self.0.conn.req_packed_command(cmd).await;
            self.note(&result);
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let result = self
                .0
                .conn
                .req_packed_commands(pipeline, offset, count)
                .await;
            self.note(&result);
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.0.conn.get_db()
    }
}

/// `url` with its password, if any, replaced by `***`: fit for logs and `Debug`.
pub fn redacted_url(url: &str) -> String {
    match redis::parse_redis_url(url) {
        Some(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        None => "<not a Redis URL>".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redis_password_is_never_shown() {
        let shown = redacted_url("rediss://worker:hunter2secret@redis.example:6380");
        assert_eq!(shown, "rediss://worker:***@redis.example:6380");
        assert_eq!(
            redacted_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
        assert_eq!(redacted_url("not a url"), "<not a Redis URL>");
    }
}
