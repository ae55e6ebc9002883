//! The api's configuration, loaded from the environment. `.env.example` lists every
//! variable with its default; docs/configuration.md explains each.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::Uri;

use crate::clients::{TrustedProxies, parse_proxy};
use shared::egress::{AllowList, Egress, EgressError};

use crate::oauth::{self, OAuthConfigError, OAuthSettings};
use shared::envvar::{Common, Var, VarError, non_blank, parse_list};
use shared::spec::{KeyError, SpecSigner};
use shared::zipcheck::ZipLimits;
use shared::{Keys, RuntimeCatalog, RuntimeError};

/// The longest `wait_seconds` a `run_script` or `get_task_status` call may ask
/// for (docs/tools.md). Bounds how long a request, and one of the store's wait
/// connections, is held; a client's waiting calls count against its
/// `MAX_REQUESTS_PER_CLIENT` like any request in flight.
pub const MAX_WAIT_SECONDS: i64 = 30;

// A waiter that read a task's events mark just before the task ended must
// still find the stream (with the final entry) for its whole wait: the stream
// lives min(retention, FINAL_EVENTS_TTL_SECONDS) after the end.
const _: () = {
    let ttl = shared::keys::FINAL_EVENTS_TTL_SECONDS;
    let shortest = if ttl < shared::envvar::MIN_RETENTION_SECONDS {
        ttl
    } else {
        shared::envvar::MIN_RETENTION_SECONDS
    };
    assert!(shortest as i64 >= 2 * MAX_WAIT_SECONDS);
};

/// Shortest bearer token the api accepts: anything shorter is guessable.
pub const MIN_TOKEN_LEN: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "SCRIPT_RUNNER_TOKEN is not set: every request to /mcp must carry it as a bearer token \
         (generate one with `openssl rand -hex 32`)"
    )]
    MissingToken,
    #[error("SCRIPT_RUNNER_TOKEN is {0} characters long; it must be at least {MIN_TOKEN_LEN}")]
    ShortToken(usize),
    #[error(
        "TASK_SIGNING_KEY is not set: the api signs every task's spec with it, and workers run \
         only what it signed (make a key pair with `script-runner-ctl signing-key generate`)"
    )]
    MissingSigningKey,
    #[error("TASK_SIGNING_KEY: {0}")]
    SigningKey(#[source] KeyError),
    #[error(
        "METRICS_TOKEN is {0} characters long; it must be at least {MIN_TOKEN_LEN} \
         (generate one with `openssl rand -hex 32`), or empty for none"
    )]
    ShortMetricsToken(usize),
    #[error(
        "METRICS_TOKEN is the same as SCRIPT_RUNNER_TOKEN: give Prometheus a token of its own \
         (`openssl rand -hex 32`), so that what it holds opens /metrics and nothing else"
    )]
    MetricsTokenIsAdminToken,
    #[error(transparent)]
    Var(#[from] VarError),
    #[error("RUNTIME_IMAGES: {0}")]
    Runtime(#[from] RuntimeError),
    #[error(
        "ALLOWED_HOSTS lists no host; give the names clients use, e.g. mcp.example.com,localhost"
    )]
    NoAllowedHosts,
    #[error("DEFAULT_TIMEOUT_SECONDS ({default}) must not exceed MAX_TIMEOUT_SECONDS ({max})")]
    DefaultAboveMax { default: u64, max: u64 },
    #[error(
        "MAX_REQUEST_BYTES ({given}) is below {needed}, the size of the largest run_script that \
         MAX_ZIP_BYTES, MAX_STDIN_BYTES and MAX_COMMAND_BYTES allow: raise it, or leave it empty \
         to derive it from them"
    )]
    RequestLimitTooSmall { given: usize, needed: usize },
    #[error(
        "MAX_BODY_BYTES_IN_FLIGHT ({budget}) is below MAX_REQUEST_BYTES ({request}): no request \
         of the largest allowed size could ever be read"
    )]
    BodyBudgetTooSmall { budget: usize, request: usize },
    #[error(
        "MAX_BODY_BYTES_PER_CLIENT ({share}) is below MAX_REQUEST_BYTES ({request}): no client \
         could send a request of the largest allowed size; raise it, or leave it empty to \
         derive it"
    )]
    ClientBodyShareTooSmall { share: usize, request: usize },
    #[error(transparent)]
    OAuth(#[from] OAuthConfigError),
}

/// Everything the api needs to run.
#[derive(Clone)]
pub struct Config {
    /// `SCRIPT_RUNNER_TOKEN`: the bearer token every `/mcp` request must carry.
    pub token: String,
    /// `TASK_SIGNING_KEY`: signs each task's spec at submit (`shared::spec`).
    pub signer: Arc<SpecSigner>,
    /// `METRICS_TOKEN`: a bearer token that opens `GET /metrics` and nothing
    /// else (for Prometheus); `None` when unset, and only the admin token reads
    /// the metrics.
    pub metrics_token: Option<String>,
    /// `REDIS_URL` or `REDIS_SENTINELS`, the client certificate, and
    /// `REDIS_MIN_REPLICAS_ACK`: where Redis is and what counts as acknowledged.
    pub redis: shared::envvar::RedisSettings,
    /// `REDIS_KEY_PREFIX`: prefix of every Redis key (default `sr`).
    pub keys: Keys,
    /// `LISTEN_ADDR`: the HTTP listen address.
    pub listen_addr: SocketAddr,
    /// `HEALTH_ADDR`: a second listener, on a loopback address only, whose
    /// `/healthz` also says why it is unavailable (the public one says only
    /// "unavailable"). Empty (the default): none.
    pub health_addr: Option<SocketAddr>,
    /// `ALLOWED_HOSTS`: Host header values accepted on `/mcp` (DNS-rebinding protection).
    pub allowed_hosts: Vec<String>,
    /// `ALLOWED_ORIGINS`: browser origins whose requests `/mcp` and `/metrics`
    /// serve; empty by default (see `crate::origin`).
    pub allowed_origins: AllowedOrigins,
    /// `RUNTIME_IMAGES`: runtime name to image.
    pub runtimes: RuntimeCatalog,
    /// `DEFAULT_TIMEOUT_SECONDS`: a task's timeout when the client gives none.
    pub default_timeout_seconds: u64,
    /// `MAX_TIMEOUT_SECONDS`: larger requested timeouts are lowered to this.
    pub max_timeout_seconds: u64,
    /// `MAX_COMMAND_BYTES`: the longest decoded one-liner.
    pub max_command_bytes: usize,
    /// `MAX_ZIP_BYTES`: the largest decoded zip.
    pub max_zip_bytes: usize,
    /// `MAX_STDIN_BYTES`: the largest decoded `stdin_base64`.
    pub max_stdin_bytes: usize,
    /// `ZIP_MAX_ENTRIES` / `ZIP_MAX_EXPANDED_BYTES`: caps on what a zip may hold.
    pub zip_limits: ZipLimits,
    /// `MAX_QUEUED_TASKS`: `run_script` refuses new work while this many jobs wait.
    pub max_queued_tasks: u64,
    /// `TASK_RETENTION_SECONDS`: how long a finished task's record is kept.
    pub retention_seconds: u64,
    /// The HTTP limits: body size, timeouts, connections (see `crate::http`).
    pub http: HttpLimits,
    /// `REDIS_SETUP_CHECK`: refuse to start, or only warn, when Redis can lose data.
    pub redis_setup_check: store::redis_setup::Mode,
    /// `OAUTH_*`: OAuth resource-server mode, `None` when off (see `crate::oauth`).
    pub oauth: Option<OAuthSettings>,
    /// `EGRESS_DEFAULT`: the egress policy of a task whose `run_script` names
    /// none: `internet`, `none`, or `allow:<host>,<host>,...`.
    pub egress_default: Egress,
    /// `EGRESS_ALLOW_HOSTS`: the most any task's allow-list may name (every
    /// entry one of these hosts or under one of these domains); `None`: any.
    pub egress_ceiling: Option<AllowList>,
    /// `WORKSPACE_STORE` and `WORKSPACE_S3_*`: the workers' blob store, which
    /// `read_files` reads (empty: `./tasks-data/workspace-store`, the worker's
    /// default beside it).
    pub workspace_store: blobs::StoreConfig,
    /// `WORKSPACE_OWNER_MAX_MB`, in bytes: the cap a fork is held to (0: none).
    pub workspace_owner_max_bytes: u64,
    /// `WORKSPACE_IDLE_SECONDS`: a workspace no task used for this long is
    /// deleted (`crate::janitor`); `None`: never.
    pub workspace_idle: Option<Duration>,
}

/// What the HTTP layer enforces in front of the MCP service: for all clients
/// together, and for each client (see `crate::clients`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpLimits {
    /// `MAX_REQUEST_BYTES`: the largest request body; larger ones get 413.
    pub max_request_bytes: usize,
    /// `MAX_BODY_BYTES_IN_FLIGHT`: request bodies held in memory at once, all
    /// clients together; a body that would pass it gets 503.
    pub max_body_bytes_in_flight: usize,
    /// `MAX_CONNECTIONS`: open connections at once; more are answered 503.
    pub max_connections: usize,
    /// `REQUEST_HEADER_TIMEOUT_SECONDS`: time to send a request's headers, and
    /// the longest a kept-alive connection may sit idle.
    pub header_timeout: Duration,
    /// `REQUEST_BODY_TIMEOUT_SECONDS`: time to send a whole request body.
    pub body_timeout: Duration,
    /// `MAX_CONNECTIONS_PER_CLIENT`: open connections from one address (a
    /// trusted proxy's are not counted); more are answered 429.
    pub max_connections_per_client: usize,
    /// `MAX_REQUESTS_PER_CLIENT`: requests in flight from one client; more are
    /// answered 429.
    pub max_requests_per_client: usize,
    /// `MAX_BODY_BYTES_PER_CLIENT`: request bodies held at once for one client;
    /// a body that would pass it gets 429.
    pub max_body_bytes_per_client: usize,
    /// `TRUSTED_PROXIES`: peers whose `X-Forwarded-For` names the client.
    pub trusted_proxies: TrustedProxies,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the token, nor the Redis password.
        f.debug_struct("Config")
            .field("signing_key", &self.signer.key_id())
            .field(
                "redis_url",
                &store::redis_pool::redacted_url(&self.redis.url),
            )
            .field("redis", &self.redis)
            .field("listen_addr", &self.listen_addr)
            .field("health_addr", &self.health_addr)
            .field("allowed_hosts", &self.allowed_hosts)
            .field("allowed_origins", &self.allowed_origins)
            .field("runtimes", &self.runtimes)
            .field("oauth", &self.oauth)
            .finish_non_exhaustive()
    }
}

/// Empty: none, and the api refuses to start (`ConfigError::MissingToken`).
const SCRIPT_RUNNER_TOKEN: Var = Var::new("SCRIPT_RUNNER_TOKEN", "");
/// Empty: none, and the api refuses to start (`ConfigError::MissingSigningKey`).
const TASK_SIGNING_KEY: Var = Var::new("TASK_SIGNING_KEY", "");
/// Empty: none; only the admin token reads `/metrics`.
const METRICS_TOKEN: Var = Var::new("METRICS_TOKEN", "");
const LISTEN_ADDR: Var = Var::new("LISTEN_ADDR", "0.0.0.0:8080");
/// Empty: no health details listener.
const HEALTH_ADDR: Var = Var::new("HEALTH_ADDR", "");
const ALLOWED_HOSTS: Var = Var::new("ALLOWED_HOSTS", "localhost,127.0.0.1,::1");
/// Empty: no browser origin is trusted (a request without `Origin` is served).
const ALLOWED_ORIGINS: Var = Var::new("ALLOWED_ORIGINS", "");
const DEFAULT_TIMEOUT_SECONDS: Var = Var::new("DEFAULT_TIMEOUT_SECONDS", "300");
const MAX_TIMEOUT_SECONDS: Var = Var::new("MAX_TIMEOUT_SECONDS", "3600");
const MAX_COMMAND_BYTES: Var = Var::new("MAX_COMMAND_BYTES", "65536");
const MAX_ZIP_BYTES: Var = Var::new("MAX_ZIP_BYTES", "16777216");
const MAX_QUEUED_TASKS: Var = Var::new("MAX_QUEUED_TASKS", "10000");
const MAX_STDIN_BYTES: Var = Var::new("MAX_STDIN_BYTES", "1048576");
/// Empty: derived from the zip, stdin and command caps (`needed_request_bytes`).
const MAX_REQUEST_BYTES: Var = Var::new("MAX_REQUEST_BYTES", "");
const MAX_BODY_BYTES_IN_FLIGHT: Var = Var::new("MAX_BODY_BYTES_IN_FLIGHT", "268435456");
const MAX_CONNECTIONS: Var = Var::new("MAX_CONNECTIONS", "1024");
const REQUEST_HEADER_TIMEOUT_SECONDS: Var = Var::new("REQUEST_HEADER_TIMEOUT_SECONDS", "10");
const REQUEST_BODY_TIMEOUT_SECONDS: Var = Var::new("REQUEST_BODY_TIMEOUT_SECONDS", "60");
const MAX_CONNECTIONS_PER_CLIENT: Var = Var::new("MAX_CONNECTIONS_PER_CLIENT", "256");
const MAX_REQUESTS_PER_CLIENT: Var = Var::new("MAX_REQUESTS_PER_CLIENT", "256");
/// Empty: a quarter of `MAX_BODY_BYTES_IN_FLIGHT`, and at least `MAX_REQUEST_BYTES`.
const MAX_BODY_BYTES_PER_CLIENT: Var = Var::new("MAX_BODY_BYTES_PER_CLIENT", "");
/// Empty: no proxy is trusted, every client is its peer address.
const TRUSTED_PROXIES: Var = Var::new("TRUSTED_PROXIES", "");
const EGRESS_DEFAULT: Var = Var::new("EGRESS_DEFAULT", "internet");
/// Empty: no ceiling on allow-lists.
const EGRESS_ALLOW_HOSTS: Var = Var::new("EGRESS_ALLOW_HOSTS", "");

/// 30 days; 0: never.
const WORKSPACE_IDLE_SECONDS: Var = Var::new("WORKSPACE_IDLE_SECONDS", "2592000");

/// Where the store is when `WORKSPACE_STORE` is empty: the worker's default
/// (`<TASKS_DIR>/workspace-store`, `TASKS_DIR` being `./tasks-data`).
const DEFAULT_WORKSPACE_STORE: &str = "./tasks-data/workspace-store";

/// The api's own variables with their defaults (besides `shared`'s common ones);
/// docs/configuration.md and `.env.example` are checked against them.
pub const VARS: [Var; 37] = [
    SCRIPT_RUNNER_TOKEN,
    EGRESS_ALLOW_HOSTS,
    TASK_SIGNING_KEY,
    METRICS_TOKEN,
    EGRESS_DEFAULT,
    HEALTH_ADDR,
    MAX_REQUEST_BYTES,
    MAX_CONNECTIONS_PER_CLIENT,
    MAX_REQUESTS_PER_CLIENT,
    MAX_BODY_BYTES_PER_CLIENT,
    TRUSTED_PROXIES,
    MAX_BODY_BYTES_IN_FLIGHT,
    MAX_CONNECTIONS,
    REQUEST_HEADER_TIMEOUT_SECONDS,
    REQUEST_BODY_TIMEOUT_SECONDS,
    store::redis_setup::REDIS_SETUP_CHECK,
    MAX_STDIN_BYTES,
    LISTEN_ADDR,
    ALLOWED_HOSTS,
    ALLOWED_ORIGINS,
    DEFAULT_TIMEOUT_SECONDS,
    MAX_TIMEOUT_SECONDS,
    MAX_COMMAND_BYTES,
    MAX_ZIP_BYTES,
    MAX_QUEUED_TASKS,
    oauth::OAUTH_ISSUER,
    oauth::OAUTH_RESOURCE,
    oauth::OAUTH_SCOPES,
    oauth::OAUTH_DEFAULT_SCOPES,
    oauth::OAUTH_REQUIRE_AT_JWT,
    oauth::OAUTH_MAX_QUEUED,
    oauth::OAUTH_MAX_RUNNING,
    oauth::OAUTH_CPU_SECONDS_PER_DAY,
    oauth::OAUTH_NETWORKS,
    oauth::OAUTH_JWKS_REFRESH_SECONDS,
    oauth::OAUTH_ALGORITHMS,
    WORKSPACE_IDLE_SECONDS,
];

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads variables through `get`, so tests can configure without touching the
    /// process environment.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let var = non_blank(get);
        let common = Common::from_lookup(&var)?;
        let token = SCRIPT_RUNNER_TOKEN.get(&var);
        if token.is_empty() {
            return Err(ConfigError::MissingToken);
        }
        if token.chars().count() < MIN_TOKEN_LEN {
            return Err(ConfigError::ShortToken(token.chars().count()));
        }
        let signing_key = TASK_SIGNING_KEY.get(&var);
        if signing_key.is_empty() {
            return Err(ConfigError::MissingSigningKey);
        }
        let signer = SpecSigner::from_base64(&signing_key).map_err(ConfigError::SigningKey)?;
        let metrics_token = metrics_token(&var, &token)?;
        let (default_timeout_seconds, max_timeout_seconds) = timeouts(&var)?;
        let allowed_hosts = parse_list(Some(&ALLOWED_HOSTS.get(&var)), "");
        // An empty list would make rmcp accept every Host: refuse it instead.
        if allowed_hosts.is_empty() {
            return Err(ConfigError::NoAllowedHosts);
        }
        let max_command_bytes = MAX_COMMAND_BYTES.range(&var, 1, 1 << 20)? as usize;
        let max_zip_bytes = MAX_ZIP_BYTES.range(&var, 1, 256 << 20)? as usize;
        let max_stdin_bytes = MAX_STDIN_BYTES.range(&var, 0, 64 << 20)? as usize;
        let needed = needed_request_bytes(max_zip_bytes, max_stdin_bytes, max_command_bytes);
        let http = http_limits(&var, needed)?;
        let egress_ceiling = egress_ceiling(&var)?;
        let workspace_store =
            blobs::StoreConfig::from_lookup(&var, std::path::Path::new(DEFAULT_WORKSPACE_STORE))?;
        let egress_default = egress_default(&var, egress_ceiling.as_ref())?;
        Ok(Config {
            token,
            signer: Arc::new(signer),
            metrics_token,
            redis: common.redis,
            keys: common.keys,
            listen_addr: LISTEN_ADDR.parse(&var, "an address and port such as 0.0.0.0:8080")?,
            health_addr: health_addr(&var)?,
            allowed_hosts,
            allowed_origins: allowed_origins(&var)?,
            runtimes: RuntimeCatalog::from_lookup(&var)?,
            default_timeout_seconds,
            max_timeout_seconds,
            max_command_bytes,
            max_zip_bytes,
            max_stdin_bytes,
            zip_limits: ZipLimits::from_lookup(&var)?,
            max_queued_tasks: MAX_QUEUED_TASKS.range(&var, 1, 10_000_000)?,
            retention_seconds: common.retention_seconds,
            http,
            redis_setup_check: store::redis_setup::Mode::from_lookup(&var)?,
            oauth: OAuthSettings::from_lookup(&var)?,
            egress_ceiling,
            workspace_store,
            workspace_owner_max_bytes: blobs::config::owner_max_bytes(&var)?,
            workspace_idle: match WORKSPACE_IDLE_SECONDS.range(&var, 0, 100 * 365 * 86_400)? {
                0 => None,
                s => Some(Duration::from_secs(s)),
            },
            egress_default,
        })
    }
}

/// `METRICS_TOKEN`: empty, or a token as long as the admin's and not the same.
fn metrics_token(
    var: &impl Fn(&str) -> Option<String>,
    admin: &str,
) -> Result<Option<String>, ConfigError> {
    let token = METRICS_TOKEN.get(var);
    if token.is_empty() {
        return Ok(None);
    }
    if token.chars().count() < MIN_TOKEN_LEN {
        return Err(ConfigError::ShortMetricsToken(token.chars().count()));
    }
    if token == admin {
        return Err(ConfigError::MetricsTokenIsAdminToken);
    }
    Ok(Some(token))
}

/// `EGRESS_DEFAULT`, checked as a client's `network` argument is.
/// `EGRESS_DEFAULT`, checked as a client's `network` argument is, and held to
/// `EGRESS_ALLOW_HOSTS` like one.
fn egress_default(
    var: &impl Fn(&str) -> Option<String>,
    ceiling: Option<&AllowList>,
) -> Result<Egress, ConfigError> {
    let raw = EGRESS_DEFAULT.get(var);
    let refused = |e: EgressError| {
        let expected = format!("internet, none, or allow:<host>,<host>,... ({e})");
        ConfigError::Var(VarError::new(EGRESS_DEFAULT.name, &raw, expected))
    };
    let egress = Egress::from_setting(&raw).map_err(refused)?;
    if let (Some(list), Some(ceiling)) = (egress.allow_list(), ceiling) {
        list.check_within(ceiling, OPERATOR_CEILING)
            .map_err(refused)?;
    }
    Ok(egress)
}

/// Who set `EGRESS_ALLOW_HOSTS`, as a refusal names it.
pub const OPERATOR_CEILING: &str = "the hosts this service allows (EGRESS_ALLOW_HOSTS)";

/// `EGRESS_ALLOW_HOSTS`: entries checked as an allow-list's are.
fn egress_ceiling(var: &impl Fn(&str) -> Option<String>) -> Result<Option<AllowList>, ConfigError> {
    let raw = EGRESS_ALLOW_HOSTS.get(var);
    if raw.trim().is_empty() {
        return Ok(None);
    }
    let entries: Vec<&str> = raw.split(',').collect();
    AllowList::parse(&entries).map(Some).map_err(|e| {
        let expected = format!("host names and *.domains, comma-separated ({e})");
        ConfigError::Var(VarError::new(EGRESS_ALLOW_HOSTS.name, &raw, expected))
    })
}

/// The body of the largest `run_script` the decoded-size caps allow, with room to
/// spare. Base64 is 4/3 of the bytes; wrapped at 76 columns with each line break
/// written `\r\n` inside the JSON string it is 1.41 times, and 3/2 also covers an
/// encoder that escapes '/' as `\/`. The command (at most 64 KiB by default) is
/// given twice its size, and 1 MiB covers `env` (32 KiB, up to 6 times that as JSON
/// escapes), `collect` and the JSON-RPC framing. api/tests/clients/sizes.rs sends the
/// largest such request and checks it fits.
pub fn needed_request_bytes(max_zip: usize, max_stdin: usize, max_command: usize) -> usize {
    (max_zip + max_stdin) / 2 * 3 + max_command * 2 + (1 << 20)
}

/// The HTTP limits; `needed` is `needed_request_bytes` for this configuration.
fn http_limits(
    var: &impl Fn(&str) -> Option<String>,
    needed: usize,
) -> Result<HttpLimits, ConfigError> {
    let max_request_bytes = match var(MAX_REQUEST_BYTES.name) {
        None => needed,
        Some(_) => {
            let given = MAX_REQUEST_BYTES.range(var, 1 << 16, 1 << 30)? as usize;
            if given < needed {
                return Err(ConfigError::RequestLimitTooSmall { given, needed });
            }
            given
        }
    };
    let budget = MAX_BODY_BYTES_IN_FLIGHT.range(var, 1 << 16, 1 << 40)? as usize;
    if budget < max_request_bytes {
        return Err(ConfigError::BodyBudgetTooSmall {
            budget,
            request: max_request_bytes,
        });
    }
    let body_share = match var(MAX_BODY_BYTES_PER_CLIENT.name) {
        None => (budget / 4).max(max_request_bytes),
        Some(_) => {
            let share = MAX_BODY_BYTES_PER_CLIENT.range(var, 1 << 16, 1 << 40)? as usize;
            if share < max_request_bytes {
                return Err(ConfigError::ClientBodyShareTooSmall {
                    share,
                    request: max_request_bytes,
                });
            }
            share
        }
    };
    Ok(HttpLimits {
        max_request_bytes,
        max_body_bytes_in_flight: budget,
        max_connections: MAX_CONNECTIONS.range(var, 1, 1_000_000)? as usize,
        header_timeout: Duration::from_secs(REQUEST_HEADER_TIMEOUT_SECONDS.range(var, 1, 3600)?),
        body_timeout: Duration::from_secs(REQUEST_BODY_TIMEOUT_SECONDS.range(var, 1, 3600)?),
        max_connections_per_client: MAX_CONNECTIONS_PER_CLIENT.range(var, 1, 1_000_000)? as usize,
        max_requests_per_client: MAX_REQUESTS_PER_CLIENT.range(var, 1, 1_000_000)? as usize,
        max_body_bytes_per_client: body_share,
        trusted_proxies: trusted_proxies(var)?,
    })
}

/// `TRUSTED_PROXIES`: addresses and networks, comma-separated.
fn trusted_proxies(var: &impl Fn(&str) -> Option<String>) -> Result<TrustedProxies, VarError> {
    let raw = TRUSTED_PROXIES.get(var);
    let nets = parse_list(Some(&raw), "")
        .iter()
        .map(|item| parse_proxy(item))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| VarError::new(TRUSTED_PROXIES.name, &raw, e))?;
    Ok(TrustedProxies::new(nets))
}

/// `HEALTH_ADDR`: empty, or a loopback address and port (its answers name
/// Redis's errors, which are not for the public).
fn health_addr(var: &impl Fn(&str) -> Option<String>) -> Result<Option<SocketAddr>, VarError> {
    let raw = HEALTH_ADDR.get(var);
    if raw.is_empty() {
        return Ok(None);
    }
    match raw.parse::<SocketAddr>() {
        Ok(addr) if addr.ip().is_loopback() => Ok(Some(addr)),
        _ => Err(VarError::new(
            HEALTH_ADDR.name,
            &raw,
            "must be empty or a loopback address and port, such as 127.0.0.1:8081",
        )),
    }
}

/// `ALLOWED_ORIGINS`: origins, comma-separated.
fn allowed_origins(var: &impl Fn(&str) -> Option<String>) -> Result<AllowedOrigins, VarError> {
    let raw = ALLOWED_ORIGINS.get(var);
    AllowedOrigins::parse(&raw).map_err(|e| VarError::new(ALLOWED_ORIGINS.name, &raw, e))
}

/// `ALLOWED_ORIGINS`, each as `canonical` writes it. A setting, so it lives
/// with the config: `origin` (the check) and `http` use the config, and the
/// config uses neither.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedOrigins(Vec<String>);

/// An `ALLOWED_ORIGINS` entry that is no origin.
#[derive(Debug, thiserror::Error)]
#[error(
    "{0:?} is not an origin: write each as a browser sends it, scheme://host or \
     scheme://host:port (e.g. https://claude.ai), with no path, user or wildcard"
)]
pub struct BadOrigin(pub String);

impl AllowedOrigins {
    /// Comma-separated origins; blank entries are skipped.
    pub fn parse(raw: &str) -> Result<AllowedOrigins, BadOrigin> {
        raw.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| canonical(s).ok_or_else(|| BadOrigin(s.to_owned())))
            .collect::<Result<Vec<_>, _>>()
            .map(AllowedOrigins)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether a request's `Origin` value names one of them. `null` (sandboxed
    /// frames, `file:` pages) and anything that is no origin never do.
    pub fn allows(&self, origin: &str) -> bool {
        canonical(origin).is_some_and(|o| self.0.contains(&o))
    }
}

/// An origin as RFC 6454 compares them: the scheme and host in lower case and
/// the port written out (80 for `http`, 443 for `https` when left out), so
/// `HTTPS://Claude.AI` and `https://claude.ai:443` are one origin. `None` for
/// what no browser sends as an origin: no scheme or host, a user, a query, a
/// path (a lone `/` is forgiven), `*`, `null`.
pub fn canonical(value: &str) -> Option<String> {
    let uri = Uri::try_from(value.trim()).ok()?;
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let authority = uri.authority()?;
    if authority.as_str().contains('@') || authority.host().is_empty() {
        return None;
    }
    if uri
        .path_and_query()
        .is_some_and(|p| p.as_str() != "/" && !p.as_str().is_empty())
    {
        return None;
    }
    let host = authority.host().to_ascii_lowercase();
    let port = authority.port_u16().or(match scheme.as_str() {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    });
    Some(match port {
        Some(port) => format!("{scheme}://{host}:{port}"),
        None => format!("{scheme}://{host}"),
    })
}

/// `DEFAULT_TIMEOUT_SECONDS` and `MAX_TIMEOUT_SECONDS`. An operator who lowers
/// only the cap below the default timeout gets the default lowered to the cap
/// (with a warning), not a refusal; setting both in conflict is refused.
fn timeouts(var: &impl Fn(&str) -> Option<String>) -> Result<(u64, u64), ConfigError> {
    let max = MAX_TIMEOUT_SECONDS.range(var, 1, 86_400)?;
    let default = DEFAULT_TIMEOUT_SECONDS.range(var, 1, 86_400)?;
    if default <= max {
        return Ok((default, max));
    }
    if var(DEFAULT_TIMEOUT_SECONDS.name).is_some() {
        return Err(ConfigError::DefaultAboveMax { default, max });
    }
    tracing::warn!(
        max_timeout_seconds = max,
        "MAX_TIMEOUT_SECONDS is below the default timeout ({default} s): \
         the default timeout is lowered to {max} s"
    );
    Ok((max, max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_health_details_listener_is_loopback_only() {
        let base = [
            (
                "SCRIPT_RUNNER_TOKEN",
                "a-token-that-is-long-enough-0123456789",
            ),
            SIGNING_KEY,
        ];
        let with = |v: &'static str| {
            let vars: Vec<(&str, &str)> =
                base.iter().copied().chain([("HEALTH_ADDR", v)]).collect();
            Config::from_lookup(shared::envvar::lookup_of(&vars))
        };
        assert_eq!(with("").map(|c| c.health_addr).ok(), Some(None));
        let on = with("127.0.0.1:8081").map(|c| c.health_addr).ok().flatten();
        assert_eq!(on.map(|a| a.port()), Some(8081));
        assert!(with("[::1]:8081").is_ok());
        for refused in ["0.0.0.0:8081", "192.0.2.1:8081", "localhost:8081", "8081"] {
            let err = with(refused)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                err.contains("HEALTH_ADDR") && err.contains("loopback"),
                "{refused}: {err}"
            );
        }
    }

    /// `vars`, with a signing key unless they give one.
    fn load(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let mut all = vars.to_vec();
        if !vars.iter().any(|(k, _)| *k == SIGNING_KEY.0) {
            all.push(SIGNING_KEY);
        }
        Config::from_lookup(shared::envvar::lookup_of(&all))
    }

    /// 32 bytes of 0x01, base64.
    const SIGNING_KEY: (&str, &str) = (
        "TASK_SIGNING_KEY",
        "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=",
    );

    #[test]
    fn refuses_to_start_without_a_signing_key_or_with_a_bad_one_naming_it() {
        let missing = load(&[TOKEN, ("TASK_SIGNING_KEY", " ")]).err();
        assert!(matches!(missing, Some(ConfigError::MissingSigningKey)));
        let text = missing.map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("signing-key generate"), "{text}");
        for (bad, says) in [("not base64!", "is not base64"), ("AAAA", "holds 3 bytes")] {
            let e = load(&[TOKEN, ("TASK_SIGNING_KEY", bad)]).err();
            let text = e.map(|e| e.to_string()).unwrap_or_default();
            assert!(
                text.starts_with("TASK_SIGNING_KEY: ") && text.contains(says),
                "{text}"
            );
        }
        let ok = load(&[TOKEN]).map(|c| c.signer.key_id().to_string());
        assert_eq!(ok.map(|id| id.len()).ok(), Some(16));
    }

    const TOKEN: (&str, &str) = ("SCRIPT_RUNNER_TOKEN", "0123456789abcdef0123456789abcdef");

    #[test]
    fn refuses_to_start_without_a_long_enough_token() {
        assert!(matches!(load(&[]), Err(ConfigError::MissingToken)));
        let short = load(&[("SCRIPT_RUNNER_TOKEN", "short")]);
        assert!(matches!(short, Err(ConfigError::ShortToken(5))));
        assert!(
            short
                .err()
                .map(|e| e.to_string())
                .is_some_and(|m| m.contains("at least 32"))
        );
    }

    #[test]
    fn a_metrics_token_must_be_long_and_not_the_admin_token() {
        assert_eq!(load(&[TOKEN]).ok().map(|c| c.metrics_token), Some(None));
        let own = "fedcba9876543210fedcba9876543210";
        let c = load(&[TOKEN, ("METRICS_TOKEN", own)]).expect("config");
        assert_eq!(c.metrics_token.as_deref(), Some(own));
        assert!(
            !format!("{c:?}").contains(own),
            "Debug shows the metrics token"
        );
        let short = load(&[TOKEN, ("METRICS_TOKEN", "short")]);
        assert!(matches!(short, Err(ConfigError::ShortMetricsToken(5))));
        assert!(matches!(
            load(&[TOKEN, ("METRICS_TOKEN", TOKEN.1)]),
            Err(ConfigError::MetricsTokenIsAdminToken)
        ));
    }

    #[test]
    fn defaults_match_the_spec() {
        let c = load(&[TOKEN]).expect("config");
        assert_eq!(c.redis.url, "redis://127.0.0.1:6379");
        assert_eq!(c.listen_addr.to_string(), "0.0.0.0:8080");
        assert_eq!(c.allowed_hosts, ["localhost", "127.0.0.1", "::1"]);
        assert_eq!(
            (c.default_timeout_seconds, c.max_timeout_seconds),
            (300, 3600)
        );
        assert_eq!(
            c.runtimes.lookup("python3.8").map(|(_, i)| i),
            Some("python:3.8-slim")
        );
    }

    #[test]
    fn blank_values_mean_the_default_and_an_empty_host_list_is_refused() {
        let c = load(&[TOKEN, ("REDIS_URL", ""), ("LISTEN_ADDR", " ")]).expect("config");
        assert_eq!(c.redis.url, "redis://127.0.0.1:6379");
        assert!(matches!(
            load(&[("SCRIPT_RUNNER_TOKEN", "")]),
            Err(ConfigError::MissingToken)
        ));
        assert!(matches!(
            load(&[TOKEN, ("ALLOWED_HOSTS", " , ")]),
            Err(ConfigError::NoAllowedHosts)
        ));
    }

    #[test]
    fn debug_output_shows_neither_token_nor_redis_password() {
        let c = load(&[
            TOKEN,
            ("REDIS_URL", "rediss://api:hunter2secret@redis.example:6380"),
        ])
        .expect("config");
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2secret") && !shown.contains(TOKEN.1));
        assert!(shown.contains("rediss://api:***@redis.example:6380"));
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = load(&[TOKEN, ("MAX_TIMEOUT_SECONDS", "soon")])
            .err()
            .map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.starts_with("MAX_TIMEOUT_SECONDS=\"soon\"")));
        let e = load(&[
            TOKEN,
            ("DEFAULT_TIMEOUT_SECONDS", "600"),
            ("MAX_TIMEOUT_SECONDS", "60"),
        ]);
        assert!(matches!(e, Err(ConfigError::DefaultAboveMax { .. })));
        let e = load(&[TOKEN, ("REDIS_KEY_PREFIX", "prod:eu")])
            .err()
            .map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.starts_with("REDIS_KEY_PREFIX=\"prod:eu\"")));
    }

    #[test]
    fn the_request_limit_is_derived_from_the_caps_and_never_below_them() {
        let c = load(&[TOKEN]).expect("config");
        // (16 MiB + 1 MiB) * 3/2 + 2 * 64 KiB + 1 MiB
        assert_eq!(c.http.max_request_bytes, 27_918_336);
        assert_eq!(c.http.max_connections, 1024);
        assert_eq!(c.redis_setup_check, store::redis_setup::Mode::Refuse);
        let c = load(&[TOKEN, ("MAX_ZIP_BYTES", "1048576")]).expect("config");
        assert_eq!(
            c.http.max_request_bytes,
            needed_request_bytes(1 << 20, 1 << 20, 1 << 16)
        );
        let low = load(&[TOKEN, ("MAX_REQUEST_BYTES", "20000000")]).err();
        assert!(matches!(
            low,
            Some(ConfigError::RequestLimitTooSmall {
                given: 20_000_000,
                needed: 27_918_336
            })
        ));
        let c = load(&[TOKEN, ("MAX_REQUEST_BYTES", "40000000")]).expect("config");
        assert_eq!(c.http.max_request_bytes, 40_000_000);
        let budget = load(&[TOKEN, ("MAX_BODY_BYTES_IN_FLIGHT", "1048576")]).err();
        assert!(matches!(
            budget,
            Some(ConfigError::BodyBudgetTooSmall { .. })
        ));
        let mode = load(&[TOKEN, ("REDIS_SETUP_CHECK", "never")])
            .err()
            .map(|e| e.to_string());
        assert!(mode.is_some_and(|m| m.starts_with("REDIS_SETUP_CHECK=\"never\"")));
    }

    #[test]
    fn per_client_shares_default_to_a_quarter_and_trusted_proxies_are_checked() {
        let c = load(&[TOKEN]).expect("config");
        assert_eq!(c.http.max_connections_per_client, 256);
        assert_eq!(c.http.max_requests_per_client, 256);
        assert_eq!(c.http.max_body_bytes_per_client, 64 << 20);
        assert!(
            !c.http
                .trusted_proxies
                .trusts("127.0.0.1".parse().expect("ip"))
        );
        // A quarter of a small budget would be below the largest request: not less.
        let c = load(&[TOKEN, ("MAX_BODY_BYTES_IN_FLIGHT", "40000000")]).expect("config");
        assert_eq!(c.http.max_body_bytes_per_client, 27_918_336);
        let small = load(&[TOKEN, ("MAX_BODY_BYTES_PER_CLIENT", "1048576")]).err();
        assert!(matches!(
            small,
            Some(ConfigError::ClientBodyShareTooSmall { .. })
        ));
        let c = load(&[TOKEN, ("TRUSTED_PROXIES", " 10.0.0.0/8 , 192.168.1.7 ")]).expect("config");
        assert!(
            c.http
                .trusted_proxies
                .trusts("10.9.8.7".parse().expect("ip"))
        );
        assert!(
            c.http
                .trusted_proxies
                .trusts("192.168.1.7".parse().expect("ip"))
        );
        assert!(
            !c.http
                .trusted_proxies
                .trusts("192.168.1.8".parse().expect("ip"))
        );
        let bad = load(&[TOKEN, ("TRUSTED_PROXIES", "10.0.0.0/8,caddy")])
            .err()
            .map(|e| e.to_string());
        assert!(
            bad.as_deref()
                .is_some_and(|m| m.starts_with("TRUSTED_PROXIES=\"10.0.0.0/8,caddy\"")
                    && m.contains("\"caddy\" is not an IP address")),
            "{bad:?}"
        );
    }

    #[test]
    fn no_origin_is_allowed_by_default_and_a_bad_one_is_named() {
        let c = load(&[TOKEN]).expect("config");
        assert!(c.allowed_origins.is_empty());
        let c = load(&[TOKEN, ("ALLOWED_ORIGINS", "https://claude.ai")]).expect("config");
        assert!(c.allowed_origins.allows("https://claude.ai"));
        let bad =
            load(&[TOKEN, ("ALLOWED_ORIGINS", "https://claude.ai/")]).map(|c| c.allowed_origins);
        assert!(bad.is_ok(), "a lone trailing slash is forgiven");
        let bad = load(&[TOKEN, ("ALLOWED_ORIGINS", "*")])
            .err()
            .map(|e| e.to_string());
        assert!(
            bad.as_deref().is_some_and(
                |m| m.starts_with("ALLOWED_ORIGINS=\"*\"") && m.contains("is not an origin")
            ),
            "{bad:?}"
        );
    }

    #[test]
    fn lowering_only_the_cap_lowers_the_default_timeout_to_it() {
        let c = load(&[TOKEN, ("MAX_TIMEOUT_SECONDS", "60")]).expect("config");
        assert_eq!((c.default_timeout_seconds, c.max_timeout_seconds), (60, 60));
    }

    #[test]
    fn origins_compare_by_scheme_host_and_port() {
        let allowed = AllowedOrigins::parse(" https://claude.ai , http://localhost:6274,")
            .expect("two origins");
        for yes in [
            "https://claude.ai",
            "HTTPS://Claude.AI",
            "https://claude.ai:443",
            "http://localhost:6274",
        ] {
            assert!(allowed.allows(yes), "{yes}");
        }
        for no in [
            "https://evil.example.com",
            "http://claude.ai",
            "https://claude.ai:8443",
            "https://claude.ai.evil.example",
            "https://evil@claude.ai",
            "https://claude.ai/path",
            "http://localhost",
            "null",
            "",
            "claude.ai",
        ] {
            assert!(!allowed.allows(no), "{no}");
        }
        assert!(!AllowedOrigins::default().allows("https://claude.ai"));
        let ipv6 = AllowedOrigins::parse("http://[::1]:3000").expect("an IPv6 origin");
        assert!(ipv6.allows("http://[::1]:3000") && !ipv6.allows("http://[::1]:3001"));
    }

    #[test]
    fn entries_that_are_no_origin_are_refused_by_name() {
        for bad in [
            "*",
            "null",
            "claude.ai",
            "https://claude.ai/mcp",
            "https://u@x.ai",
        ] {
            let e = AllowedOrigins::parse(&format!("https://ok.example,{bad}"))
                .err()
                .map(|e| e.to_string());
            assert!(
                e.as_deref()
                    .is_some_and(|m| m.starts_with(&format!("{bad:?} is not an origin"))),
                "{bad}: {e:?}"
            );
        }
        assert!(AllowedOrigins::parse(" , ").is_ok_and(|a| a.is_empty()));
    }
}
