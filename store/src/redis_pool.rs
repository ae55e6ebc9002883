//! Redis connection pools whose every wait is bounded: `build` (deadpool-redis as
//! is) and `build_lean` (no check round trip on a busy connection).

use std::time::Duration;

use deadpool::managed::{self, Metrics, RecycleError, RecycleResult};
use deadpool_redis::Runtime;
use deadpool_redis::redis::aio::{ConnectionLike, MultiplexedConnection};
use deadpool_redis::redis::{
    self, AsyncConnectionConfig, ClientTlsConfig, Cmd, ConnectionInfo, IntoConnectionInfo,
    Pipeline, RedisFuture, TlsCertificates, Value,
};
use shared::envvar::{
    ClientCertFiles, REDIS_CLIENT_CERT, REDIS_CLIENT_KEY, RedisSettings, ReplicaAck,
};

use crate::redis_error::{breaks_connection, says_not_primary};
use crate::redis_target::Node;
pub use crate::redis_target::RedisTarget;

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("REDIS_URL is not a usable Redis address: {0}")]
    Url(#[from] redis::RedisError),
    #[error("REDIS_SENTINELS holds an address that is not usable: {0}")]
    Sentinels(redis::RedisError),
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

/// Where a binary's Redis is (`RedisSettings`): `REDIS_URL`, or the primary
/// the sentinels of `REDIS_SENTINELS` name (reached with `REDIS_URL`'s
/// credentials, TLS and database); and with `REDIS_CLIENT_CERT` and
/// `REDIS_CLIENT_KEY` the client certificate a mutual-TLS Redis requires, read
/// once here (the server's certificate is still checked against the system
/// roots or `SSL_CERT_FILE`). Every pool and client of a binary connects
/// through it. With sentinels, needs a Tokio runtime (it starts following them).
pub async fn target(redis: &RedisSettings) -> Result<RedisTarget, PoolError> {
    let node = node_info(&redis.url, redis.client_cert.as_ref()).await?;
    Ok(match &redis.sentinels {
        None => RedisTarget::direct(node),
        Some(sentinels) => RedisTarget::sentinel(node, sentinels).map_err(PoolError::Sentinels)?,
    })
}

/// `REDIS_URL` as connection info, with the client certificate if one is set.
async fn node_info(
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
pub fn connection_config() -> AsyncConnectionConfig {
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
/// costs a round trip (a `PING`); see `build_lean`.
pub fn build(target: &RedisTarget, max_size: usize, wait: Duration) -> Result<Pool, PoolError> {
    build_lean(target, max_size, wait, Duration::ZERO)
}

/// How long after its last checkout a connection is handed out again unchecked
/// (`build_lean`): long enough to cover a busy server's reuse, short enough that
/// a connection idle across a Redis restart is checked first.
pub const TRUSTED_FOR: Duration = Duration::from_secs(1);

/// A pool like `build`'s, without a round trip per checkout.
///
/// A connection that is checked on checkout costs a round trip: for a request
/// that sends one command (a status read), that doubles the round trips, and
/// Redis's and the caller's work. Here a connection handed out within the last
/// `trusted_for` is handed out again as is; one idle for longer is checked with
/// a `PING`, so one that died while idle (across a Redis restart) is replaced
/// before use. A connection on which a command failed for a connection-level
/// reason (I/O, timeout, protocol), or because its node is no longer the
/// primary (`READONLY`, `-UNBLOCKED`, `MASTERDOWN`), is never handed out again;
/// with sentinels, neither is one whose node the sentinels stopped naming, and
/// no command is sent on it once they have. So a Redis restart fails the
/// commands in flight, and at most one more command on each connection used
/// within `trusted_for` before it. `WATCH` must not be used on these
/// connections (nothing `UNWATCH`es them); `MULTI`/`EXEC` sent as one pipeline
/// is fine.
pub fn build_lean(
    target: &RedisTarget,
    max_size: usize,
    wait: Duration,
    trusted_for: Duration,
) -> Result<LeanPool, PoolError> {
    let manager = LeanManager {
        target: target.clone(),
        config: connection_config(),
        trusted_for,
    };
    bounded(managed::Pool::builder(manager), max_size, wait)
}

/// Every binary's pool (see `build_lean`).
pub type Pool = LeanPool;
/// What `Pool::get` hands out.
pub type Connection = LeanConnection;
/// Why `Pool::get` handed nothing out.
pub type GetError = managed::PoolError<redis::RedisError>;

/// See `build_lean`.
pub type LeanPool = managed::Pool<LeanManager, LeanConnection>;

/// Makes connections to the target's primary, checking one only after it idled.
pub struct LeanManager {
    target: RedisTarget,
    config: AsyncConnectionConfig,
    trusted_for: Duration,
}

/// A pooled connection, the node it was made to, and whether a command on it
/// failed at the connection level.
pub struct Pooled {
    conn: MultiplexedConnection,
    target: RedisTarget,
    node: Node,
    broken: bool,
}

impl managed::Manager for LeanManager {
    type Type = Pooled;
    type Error = redis::RedisError;

    async fn create(&self) -> Result<Pooled, redis::RedisError> {
        Pooled::connect(&self.target, &self.config).await
    }

    async fn recycle(
        &self,
        pooled: &mut Pooled,
        metrics: &Metrics,
    ) -> RecycleResult<redis::RedisError> {
        if pooled.is_broken() {
            return Err(RecycleError::message(
                "a command failed on this connection, or its node is no longer the primary",
            ));
        }
        if metrics.last_used() < self.trusted_for {
            return Ok(());
        }
        let pong: String = redis::cmd("PING").query_async(&mut pooled.conn).await?;
        if pong != "PONG" {
            return Err(RecycleError::message("PING was not answered PONG"));
        }
        Ok(())
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
}

impl Pooled {
    /// A connection of its own (no pool) to `target`'s primary, with the same
    /// guards as a pooled one: nothing is sent once the sentinels name another
    /// primary, and a failed one stays failed. For blocking reads, whose reply
    /// timeout `config` sets.
    pub async fn connect(
        target: &RedisTarget,
        config: &AsyncConnectionConfig,
    ) -> redis::RedisResult<Pooled> {
        let (conn, node) = target.connect(config).await?;
        Ok(Pooled {
            conn,
            target: target.clone(),
            node,
            broken: false,
        })
    }

    /// Whether a command on it failed at the connection level, or its node is
    /// no longer the primary: it must not be used again.
    pub fn is_broken(&self) -> bool {
        self.broken || !self.target.is_current(&self.node)
    }

    /// Marks the connection broken after a connection-level failure, or a
    /// reply saying its node is not the primary. redis-rs hands Redis's error
    /// replies back as values (`Value::ServerError`), made errors only when
    /// the caller reads them, so those are looked at here (in a pipeline's
    /// replies and a transaction's too).
    fn note(&mut self, result: &redis::RedisResult<Value>) {
        self.broken |= match result {
            Err(e) => breaks_connection(e),
            Ok(v) => says_not_primary(v),
        };
    }

    fn note_all(&mut self, result: &redis::RedisResult<Vec<Value>>) {
        self.broken |= match result {
            Err(e) => breaks_connection(e),
            Ok(values) => values.iter().any(says_not_primary),
        };
    }

    /// Refuses to send anything on a connection to a node the sentinels no
    /// longer name: a write there would be lost when it resyncs as a replica.
    fn check_current(&mut self) -> redis::RedisResult<()> {
        if self.is_broken() {
            self.broken = true;
            return Err(moved());
        }
        Ok(())
    }
}

fn moved() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "the sentinels name another Redis primary now; not sent to the old one",
    ))
}

impl ConnectionLike for Pooled {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            self.check_current()?;
            let result = self.conn.req_packed_command(cmd).await;
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
            self.check_current()?;
            let result = self.conn.req_packed_commands(pipeline, offset, count).await;
            self.note_all(&result);
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

impl ConnectionLike for LeanConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.0.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.0.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }
}

/// `WAIT` found fewer replicas holding this connection's writes than asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "Redis confirmed the write on {acked} of the {wanted} replicas REDIS_MIN_REPLICAS_ACK asks for \
     within {timeout_ms} ms"
)]
pub struct NotReplicated {
    pub acked: u32,
    pub wanted: u32,
    pub timeout_ms: u64,
}

/// Why a write could not be confirmed as replicated.
#[derive(Debug, thiserror::Error)]
pub enum ReplicationError {
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
    #[error(transparent)]
    Short(#[from] NotReplicated),
}

/// Waits until `ack.replicas` replicas hold every write sent on `conn` so far
/// (Redis `WAIT`, which counts this connection's writes only: call it on the
/// connection that wrote). `None`: nothing to wait for.
pub async fn replicated(
    conn: &mut impl ConnectionLike,
    ack: Option<ReplicaAck>,
) -> Result<(), ReplicationError> {
    let Some(ack) = ack else {
        return Ok(());
    };
    let timeout_ms = ack.timeout.as_millis() as u64;
    let acked: u32 = redis::cmd("WAIT")
        .arg(ack.replicas)
        .arg(timeout_ms)
        .query_async(conn)
        .await?;
    if acked >= ack.replicas {
        Ok(())
    } else {
        Err(NotReplicated {
            acked,
            wanted: ack.replicas,
            timeout_ms,
        }
        .into())
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
