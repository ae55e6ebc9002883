//! The worker's configuration, loaded from the environment. `.env.example` lists
//! every variable with its default; docs/configuration.md explains each.

use crate::workspaces::WorkspaceConfig;
use shared::workspace::VersionLimits;
use std::path::PathBuf;
use std::time::Duration;

use shared::envvar::{Common, Var, VarError, non_blank, parse_list, parse_range};
use shared::options::Network;
use shared::spec::SpecVerifier;
use shared::zipcheck::ZipLimits;
use shared::{Keys, RuntimeCatalog, RuntimeError, RuntimeName, WorkerName};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Var(#[from] VarError),
    #[error("RUNTIME_IMAGES: {0}")]
    Runtime(#[from] RuntimeError),
    #[error("WORKER_NAME: {0}")]
    BadWorkerName(#[from] shared::worker_name::BadWorkerName),
    #[error(
        "TASK_VERIFY_KEYS is not set: a worker runs only task specs the api signed, and this \
         names the api's public key (`script-runner-ctl signing-key generate` makes a pair)"
    )]
    MissingVerifyKeys,
    #[error("TASK_VERIFY_KEYS: {0}")]
    VerifyKeys(#[source] shared::spec::KeyError),
    #[error("{var}={value:?}: {why}")]
    PoolSize {
        var: &'static str,
        value: String,
        why: PoolSizeError,
    },
}

/// What is wrong with one entry of `POOL_SIZE` or `EGRESS_POOL_SIZE`.
#[derive(Debug, thiserror::Error)]
pub enum PoolSizeError {
    #[error("entry {0:?} is not runtime=count (e.g. python3.13=2,node24=1; 0 turns the pool off)")]
    NotAPair(String),
    #[error("unknown runtime {runtime:?}; this worker's runtimes are {known}")]
    UnknownRuntime { runtime: String, known: String },
    #[error("count {count:?} for {runtime} is not a whole number from 0 to {MAX_POOL_PER_RUNTIME}")]
    BadCount { runtime: String, count: String },
    #[error("runtime {0} is listed twice")]
    Twice(String),
}

/// Caps applied to every task container.
#[derive(Debug, Clone)]
pub struct SandboxLimits {
    /// `TASK_MEMORY_MB`: memory cap (swap is capped to the same, so no swap).
    pub memory_mib: u64,
    /// `TASK_CPUS`: CPU quota in cores (fractions allowed).
    pub cpus: f64,
    /// `TASK_PIDS_LIMIT`: processes and threads at most.
    pub pids: i64,
    /// `TASK_NOFILE`: open files at most.
    pub nofile: i64,
    /// `TASK_TMPFS_MB`: size of the writable /tmp (HOME) tmpfs.
    pub tmpfs_mib: u64,
    /// `TASK_USER`: the uid:gid a script runs as.
    pub user: String,
    /// `TASK_DISK_MB`: size of /workspace, a tmpfs: what a task can write there
    /// (it also counts against the memory cap). The host's disk is never written.
    pub disk_mib: u64,
    /// `TASK_NETWORK`: the Docker network tasks are attached to.
    pub network: String,
    /// `TASK_BRIDGE`: the Linux bridge interface of that network, which the host
    /// firewall rules match on.
    pub bridge: String,
    /// `TASK_EGRESS_NETWORK`: the internal Docker network allow-list tasks are
    /// attached to (no route out; the egress proxy is its only door).
    pub egress_network: String,
    /// `TASK_EGRESS_BRIDGE`: that network's Linux bridge interface.
    pub egress_bridge: String,
    /// `TASK_FIREWALL`: `iptables` (default) installs the host rules that keep
    /// tasks off the host and private networks; `off` skips them (development only).
    pub firewall: bool,
    /// `TASK_BLOCKED_CIDRS`: more IPv4 ranges tasks must not reach (comma-separated).
    pub blocked_cidrs: Vec<String>,
    /// `TASK_OCI_RUNTIME`: the Docker runtime every task container (warm and cold)
    /// is created with, e.g. `runsc` (gVisor); `None` (the default, empty) is the
    /// engine's default (runc). The worker refuses to start when the engine does
    /// not list it.
    pub oci_runtime: Option<String>,
}

#[derive(Clone)]
pub struct Config {
    /// `REDIS_URL` or `REDIS_SENTINELS`, the client certificate, and
    /// `REDIS_MIN_REPLICAS_ACK`: where Redis is and what counts as acknowledged.
    pub redis: shared::envvar::RedisSettings,
    /// `REDIS_KEY_PREFIX` (default `sr`).
    pub keys: Keys,
    /// `WORKER_NAME`: this worker's consumer name; keep it stable across restarts so
    /// a restarted worker finds and cleans up what it left (default: the hostname).
    pub worker_name: WorkerName,
    /// `WORKER_CONCURRENCY`: tasks run at once (default: number of CPUs).
    pub concurrency: usize,
    /// `TASKS_DIR`: where task workspaces live on this host (default `./tasks-data`).
    pub tasks_dir: PathBuf,
    /// This worker's catalogue: the default runtimes with `RUNTIME_IMAGES` over
    /// them (e.g. a local mirror's tag). A task always runs in this catalogue's
    /// image for its runtime, never in one its record names; a record naming an
    /// image that is neither the runtime's default nor this worker's is refused
    /// (`RuntimeCatalog::resolve`).
    pub catalog: RuntimeCatalog,
    pub limits: SandboxLimits,
    /// `ZIP_MAX_ENTRIES` / `ZIP_MAX_EXPANDED_BYTES`, enforced again at extraction.
    pub zip_limits: ZipLimits,
    /// `TASK_RETENTION_SECONDS`: how long a finished task's record is kept.
    pub retention_seconds: u64,
    /// `WORKER_HEARTBEAT_SECONDS`: how long a heartbeat lives (renewed three times
    /// as often). A worker silent this long is suspected dead, and after as long
    /// again other workers' reapers settle its tasks.
    pub heartbeat_ttl: Duration,
    /// `SHUTDOWN_GRACE_SECONDS`: on SIGTERM, how long running tasks may go on
    /// before they are killed (and recorded as such).
    pub shutdown_grace: Duration,
    /// `WORKER_METRICS_ADDR`: where to serve the worker's Prometheus metrics
    /// (`GET /metrics`); `None` (the default, empty) serves none.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// `POOL_SIZE` and `POOL_MAX_AGE_SECONDS`: the warm pool.
    pub pool: PoolConfig,
    /// `REDIS_SETUP_CHECK`: refuse to start, or only warn, when Redis can lose data.
    pub redis_setup_check: store::redis_setup::Mode,
    /// `CACHE_MB_PER_OWNER` and `CACHE_TOTAL_MB`: the dependency caches.
    pub cache: CacheConfig,
    /// `EGRESS_*`: the egress proxy of allow-list tasks.
    pub egress: EgressConfig,
    /// `TASK_VERIFY_KEYS`: the api's public keys (one, or two while rotating);
    /// a task runs only if its spec is signed by one of them.
    pub verifier: SpecVerifier,
    /// `MAX_TIMEOUT_SECONDS`: this worker's own cap on a task's timeout,
    /// whatever its record says.
    pub max_timeout_seconds: u64,
    /// `WORKSPACE_*`: where workspace versions are stored, and their caps.
    pub workspaces: WorkspaceConfig,
}

/// The egress proxy (`crate::egress`).
#[derive(Debug, Clone)]
pub struct EgressConfig {
    /// `EGRESS_PROXY_PORTS`: the ports the egress proxies of this host may
    /// listen on (on the egress bridge's gateway); each worker takes the first
    /// free one, and the firewall opens the range only.
    pub proxy_ports: std::ops::RangeInclusive<u16>,
    /// `EGRESS_PORTS`: the only ports a task may ask the proxy for.
    pub ports: Vec<u16>,
    /// Where the proxy resolves names: DNS. No variable changes it; tests set
    /// it in Rust (`egress::Resolver`).
    pub resolver: crate::egress::Resolver,
}

/// The owners' dependency caches (pip's, npm's) kept on this host between
/// their tasks (see `cache.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// `CACHE_MB_PER_OWNER`: what one owner's cache may hold once returned
    /// (oldest files go first); 0 keeps no caches.
    pub per_owner_bytes: u64,
    /// `CACHE_TOTAL_MB`: what all owners' caches may hold together on this
    /// host (least recently used owners go first).
    pub total_bytes: u64,
}

impl CacheConfig {
    /// Whether tasks get their owner's caches at all.
    pub fn enabled(&self) -> bool {
        self.per_owner_bytes > 0
    }
}

/// The warm pool: containers created and started ahead of time, idle until a
/// task claims one (see `pool.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// `POOL_SIZE` (on the task bridge, for `internet` tasks) then
    /// `EGRESS_POOL_SIZE` (on the egress network, for allow-list tasks): idle
    /// containers kept per runtime and network, with the image each runs
    /// (this worker's catalogue: its `RUNTIME_IMAGES` over the defaults).
    /// Empty: no pool.
    pub sizes: Vec<PoolTarget>,
    /// `POOL_MAX_AGE_SECONDS`: an idle container older than this is replaced,
    /// so the next task gets a fresh start.
    pub max_age: Duration,
}

/// One runtime's share of the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolTarget {
    pub runtime: RuntimeName,
    /// `Internet` or `Allow`: a `none` task never runs where a network was.
    pub network: Network,
    pub image: String,
    pub size: usize,
}

/// Idle containers per runtime at most: each holds a little memory on the host.
const MAX_POOL_PER_RUNTIME: usize = 64;

impl PoolConfig {
    /// `POOL_SIZE` and `EGRESS_POOL_SIZE`, each `runtime=n,runtime=n`, or `0`
    /// (or empty) for none. Every runtime named must be in `catalog`.
    fn parse(
        internet: &str,
        allow: &str,
        catalog: &RuntimeCatalog,
        max_age: Duration,
    ) -> Result<Self, ConfigError> {
        let mut sizes = PoolConfig::targets(POOL_SIZE.name, internet, Network::Internet, catalog)?;
        sizes.extend(PoolConfig::targets(
            EGRESS_POOL_SIZE.name,
            allow,
            Network::Allow,
            catalog,
        )?);
        Ok(PoolConfig { sizes, max_age })
    }

    /// One variable's targets, each on `network`.
    fn targets(
        var: &'static str,
        value: &str,
        network: Network,
        catalog: &RuntimeCatalog,
    ) -> Result<Vec<PoolTarget>, ConfigError> {
        let bad = |why: PoolSizeError| ConfigError::PoolSize {
            var,
            value: value.to_owned(),
            why,
        };
        let mut sizes: Vec<PoolTarget> = Vec::new();
        let value_t = value.trim();
        if !(value_t.is_empty() || value_t == "0") {
            for entry in value_t.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                let Some((runtime, n)) = entry.split_once('=').map(|(r, n)| (r.trim(), n.trim()))
                else {
                    return Err(bad(PoolSizeError::NotAPair(entry.to_owned())));
                };
                let Some((name, image)) = catalog.lookup(runtime) else {
                    return Err(bad(PoolSizeError::UnknownRuntime {
                        runtime: runtime.to_owned(),
                        known: catalog.names_list(),
                    }));
                };
                let size = n
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n <= MAX_POOL_PER_RUNTIME)
                    .ok_or_else(|| {
                        bad(PoolSizeError::BadCount {
                            runtime: runtime.to_owned(),
                            count: n.to_owned(),
                        })
                    })?;
                if sizes.iter().any(|t| t.runtime.as_str() == runtime) {
                    return Err(bad(PoolSizeError::Twice(runtime.to_owned())));
                }
                if size > 0 {
                    sizes.push(PoolTarget {
                        runtime: name.clone(),
                        network,
                        image: image.to_owned(),
                        size,
                    });
                }
            }
        }
        Ok(sizes)
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the Redis password.
        f.debug_struct("Config")
            .field(
                "redis_url",
                &store::redis_pool::redacted_url(&self.redis.url),
            )
            .field("redis", &self.redis)
            .field("worker_name", &self.worker_name)
            .field("concurrency", &self.concurrency)
            .field("tasks_dir", &self.tasks_dir)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// Empty: the contents of `/etc/hostname` (`default_worker_name`).
const WORKER_NAME: Var = Var::new("WORKER_NAME", "");
/// Empty: the number of CPUs.
const WORKER_CONCURRENCY: Var = Var::new("WORKER_CONCURRENCY", "");
const TASKS_DIR: Var = Var::new("TASKS_DIR", "./tasks-data");
const TASK_MEMORY_MB: Var = Var::new("TASK_MEMORY_MB", "1024");
const TASK_CPUS: Var = Var::new("TASK_CPUS", "1");
const TASK_PIDS_LIMIT: Var = Var::new("TASK_PIDS_LIMIT", "256");
const TASK_NOFILE: Var = Var::new("TASK_NOFILE", "1024");
const TASK_TMPFS_MB: Var = Var::new("TASK_TMPFS_MB", "256");
const TASK_USER: Var = Var::new("TASK_USER", "65534:65534");
const TASK_DISK_MB: Var = Var::new("TASK_DISK_MB", "512");
const TASK_NETWORK: Var = Var::new("TASK_NETWORK", "script-runner-tasks");
const TASK_BRIDGE: Var = Var::new("TASK_BRIDGE", "sr-tasks0");
const TASK_FIREWALL: Var = Var::new("TASK_FIREWALL", "iptables");
const TASK_EGRESS_NETWORK: Var = Var::new("TASK_EGRESS_NETWORK", "script-runner-egress");
const TASK_EGRESS_BRIDGE: Var = Var::new("TASK_EGRESS_BRIDGE", "sr-egress0");
/// One port per worker on the host: tasks learn theirs from their proxy
/// variables, and the firewall opens the range.
const EGRESS_PROXY_PORTS: Var = Var::new("EGRESS_PROXY_PORTS", "3128-3191");
const EGRESS_PORTS: Var = Var::new("EGRESS_PORTS", "80,443");
const TASK_BLOCKED_CIDRS: Var = Var::new("TASK_BLOCKED_CIDRS", "");
const TASK_OCI_RUNTIME: Var = Var::new("TASK_OCI_RUNTIME", "");
const WORKER_HEARTBEAT_SECONDS: Var = Var::new("WORKER_HEARTBEAT_SECONDS", "15");
const SHUTDOWN_GRACE_SECONDS: Var = Var::new("SHUTDOWN_GRACE_SECONDS", "30");
const WORKER_METRICS_ADDR: Var = Var::new("WORKER_METRICS_ADDR", "");
const POOL_SIZE: Var = Var::new("POOL_SIZE", "python3.13=2,node24=1");
/// Allow-list tasks' own pool, on the egress network.
const EGRESS_POOL_SIZE: Var = Var::new("EGRESS_POOL_SIZE", "python3.13=1");
const POOL_MAX_AGE_SECONDS: Var = Var::new("POOL_MAX_AGE_SECONDS", "600");
const CACHE_MB_PER_OWNER: Var = Var::new("CACHE_MB_PER_OWNER", "1024");
const CACHE_TOTAL_MB: Var = Var::new("CACHE_TOTAL_MB", "10240");
/// Empty: none, and the worker refuses to start (`ConfigError::MissingVerifyKeys`).
const TASK_VERIFY_KEYS: Var = Var::new("TASK_VERIFY_KEYS", "");
/// The api's variable of the same name and default: its cap on what a client
/// may ask, here the worker's cap on what a record may say.
const MAX_TIMEOUT_SECONDS: Var = Var::new("MAX_TIMEOUT_SECONDS", "3600");
// Persistent workspaces (docs/workspaces.md); the store's own variables are the
// `blobs` crate's (empty store here: `<TASKS_DIR>/workspace-store`).
const WORKSPACE_CACHE_MB: Var = Var::new("WORKSPACE_CACHE_MB", "2048");
const WORKSPACE_MAX_MB: Var = Var::new("WORKSPACE_MAX_MB", "1024");
const WORKSPACE_MAX_FILES: Var = Var::new("WORKSPACE_MAX_FILES", "100000");
const WORKSPACE_VERSIONS_KEPT: Var = Var::new("WORKSPACE_VERSIONS_KEPT", "20");
const WORKSPACE_SWEEP_SECONDS: Var = Var::new("WORKSPACE_SWEEP_SECONDS", "3600");

/// The worker's own variables with their defaults (besides `shared`'s common
/// ones); docs/configuration.md and `.env.example` are checked against them.
pub const VARS: [Var; 35] = [
    WORKER_NAME,
    TASK_VERIFY_KEYS,
    MAX_TIMEOUT_SECONDS,
    WORKER_CONCURRENCY,
    TASK_EGRESS_NETWORK,
    TASK_EGRESS_BRIDGE,
    EGRESS_PROXY_PORTS,
    EGRESS_PORTS,
    store::redis_setup::REDIS_SETUP_CHECK,
    TASKS_DIR,
    TASK_MEMORY_MB,
    TASK_CPUS,
    TASK_PIDS_LIMIT,
    TASK_NOFILE,
    TASK_TMPFS_MB,
    TASK_USER,
    TASK_DISK_MB,
    TASK_NETWORK,
    TASK_BRIDGE,
    TASK_FIREWALL,
    TASK_BLOCKED_CIDRS,
    TASK_OCI_RUNTIME,
    WORKER_HEARTBEAT_SECONDS,
    SHUTDOWN_GRACE_SECONDS,
    WORKER_METRICS_ADDR,
    POOL_SIZE,
    EGRESS_POOL_SIZE,
    POOL_MAX_AGE_SECONDS,
    CACHE_MB_PER_OWNER,
    CACHE_TOTAL_MB,
    WORKSPACE_CACHE_MB,
    WORKSPACE_MAX_MB,
    WORKSPACE_MAX_FILES,
    WORKSPACE_VERSIONS_KEPT,
    WORKSPACE_SWEEP_SECONDS,
];

/// Linux interface names are at most 15 bytes (IFNAMSIZ less the NUL).
const MAX_BRIDGE_LEN: usize = 15;

impl Config {
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_lookup(|name| std::env::var(name).ok())
    }

    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let var = non_blank(get);
        let common = Common::from_lookup(&var)?;
        let cpus_default = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let worker_name = match WORKER_NAME.get(&var) {
            name if name.is_empty() => default_worker_name(),
            name => name,
        };
        let worker_name = WorkerName::parse(&worker_name)?;
        let catalog = RuntimeCatalog::from_lookup(&var)?;
        let pool_size = POOL_SIZE.get(&var);
        // A worker that turned its pool off (runsc's hosts must) keeps the
        // egress one off too unless it names one.
        let egress_pool_size = match var(EGRESS_POOL_SIZE.name) {
            Some(v) => v,
            None if pool_size.trim() == "0" => "0".to_owned(),
            None => EGRESS_POOL_SIZE.default.to_owned(),
        };
        let pool = PoolConfig::parse(
            &pool_size,
            &egress_pool_size,
            &catalog,
            Duration::from_secs(POOL_MAX_AGE_SECONDS.range(&var, 10, 86_400)?),
        )?;
        let per_owner_mib = CACHE_MB_PER_OWNER.range(&var, 0, 1 << 24)?;
        let total_mib = CACHE_TOTAL_MB.range(&var, 0, 1 << 30)?;
        if total_mib < per_owner_mib {
            let e = VarError::new(
                CACHE_TOTAL_MB.name,
                &total_mib.to_string(),
                format!("at least CACHE_MB_PER_OWNER ({per_owner_mib})"),
            );
            return Err(e.into());
        }
        let egress = EgressConfig::from_lookup(&var)?;
        let verify_keys = TASK_VERIFY_KEYS.get(&var);
        if verify_keys.trim().is_empty() {
            return Err(ConfigError::MissingVerifyKeys);
        }
        let verifier = SpecVerifier::from_list(&verify_keys).map_err(ConfigError::VerifyKeys)?;
        let tasks_dir = PathBuf::from(TASKS_DIR.get(&var));
        let workspaces = workspace_config(&var, &tasks_dir)?;
        Ok(Config {
            workspaces,
            verifier,
            max_timeout_seconds: MAX_TIMEOUT_SECONDS.range(&var, 1, 86_400)?,
            pool,
            egress,
            cache: CacheConfig {
                per_owner_bytes: per_owner_mib << 20,
                total_bytes: total_mib << 20,
            },
            redis: common.redis,
            keys: common.keys,
            worker_name,
            // The default is computed (the CPUs), not the Var's text, so
            // `parse_range` rather than `Var::range`.
            concurrency: parse_range(
                WORKER_CONCURRENCY.name,
                Some(&WORKER_CONCURRENCY.get(&var)),
                cpus_default as u64,
                1,
                1024,
            )? as usize,
            tasks_dir,
            catalog,
            limits: SandboxLimits::from_lookup(&var)?,
            zip_limits: ZipLimits::from_lookup(&var)?,
            retention_seconds: common.retention_seconds,
            heartbeat_ttl: Duration::from_secs(WORKER_HEARTBEAT_SECONDS.range(&var, 1, 3600)?),
            shutdown_grace: Duration::from_secs(SHUTDOWN_GRACE_SECONDS.range(&var, 0, 86_400)?),
            redis_setup_check: store::redis_setup::Mode::from_lookup(&var)?,
            metrics_addr: match WORKER_METRICS_ADDR.get(&var).trim() {
                "" => None,
                _ => Some(WORKER_METRICS_ADDR.parse(
                    &var,
                    "a listen address such as 0.0.0.0:9464 (or empty: no metrics)",
                )?),
            },
        })
    }
}

/// `WORKSPACE_*`, checked: a store that parses, S3 credentials given together,
/// caps in range.
fn workspace_config(
    var: &impl Fn(&str) -> Option<String>,
    tasks_dir: &std::path::Path,
) -> Result<WorkspaceConfig, ConfigError> {
    let store = blobs::StoreConfig::from_lookup(var, &tasks_dir.join("workspace-store"))?;
    Ok(WorkspaceConfig {
        store,
        cache_bytes: WORKSPACE_CACHE_MB.range(var, 0, 1 << 30)? << 20,
        limits: VersionLimits {
            max_bytes: WORKSPACE_MAX_MB.range(var, 1, 1 << 20)? << 20,
            max_files: WORKSPACE_MAX_FILES.range(var, 1, 10_000_000)?,
        },
        versions_kept: WORKSPACE_VERSIONS_KEPT.range(var, 1, 10_000)?,
        owner_max_bytes: blobs::config::owner_max_bytes(var)?,
        sweep_every: sweep_every(var)?,
    })
}

/// `WORKSPACE_SWEEP_SECONDS`: 0 (never), or at least a minute, since each
/// sweep's delete phase holds every host's saves for a moment.
fn sweep_every(var: &impl Fn(&str) -> Option<String>) -> Result<Duration, ConfigError> {
    let secs = WORKSPACE_SWEEP_SECONDS.range(var, 0, 7 * 86_400)?;
    if (1..60).contains(&secs) {
        let e = VarError::new(
            WORKSPACE_SWEEP_SECONDS.name,
            &secs.to_string(),
            "0 (never), or from 60 to 604800 seconds",
        );
        return Err(e.into());
    }
    Ok(Duration::from_secs(secs))
}

impl SandboxLimits {
    fn from_lookup(var: &impl Fn(&str) -> Option<String>) -> Result<SandboxLimits, ConfigError> {
        let cpus: f64 = TASK_CPUS.parse(var, "a number of cores such as 1 or 0.5")?;
        if !(0.01..=256.0).contains(&cpus) {
            let e = VarError::new(
                TASK_CPUS.name,
                &cpus.to_string(),
                "a number of cores from 0.01 to 256",
            );
            return Err(e.into());
        }
        let user = TASK_USER.get(var);
        if crate::source::parse_owner(&user).is_none_or(|(uid, _)| uid == 0) {
            let e = VarError::new(
                TASK_USER.name,
                &user,
                "a numeric uid:gid other than root (0), e.g. 65534:65534",
            );
            return Err(e.into());
        }
        let network = TASK_NETWORK.name_value(var, 64)?;
        // Docker's own networks: "host" and "none" would undo the isolation, and
        // "bridge" lets containers talk to each other.
        if matches!(network.as_str(), "host" | "none" | "bridge" | "default") {
            let e = VarError::new(
                TASK_NETWORK.name,
                &network,
                "a network of its own (not host, none, bridge or default)",
            );
            return Err(e.into());
        }
        if TASK_EGRESS_NETWORK.get(var) == network
            || TASK_EGRESS_BRIDGE.get(var) == TASK_BRIDGE.get(var)
        {
            let e = VarError::new(
                TASK_EGRESS_NETWORK.name,
                &TASK_EGRESS_NETWORK.get(var),
                "a network and bridge other than TASK_NETWORK's and TASK_BRIDGE's",
            );
            return Err(e.into());
        }
        let firewall = match TASK_FIREWALL.get(var).trim() {
            "iptables" => true,
            "off" => false,
            other => return Err(VarError::new(TASK_FIREWALL.name, other, "iptables or off").into()),
        };
        Ok(SandboxLimits {
            memory_mib: TASK_MEMORY_MB.range(var, 16, 1 << 20)?,
            cpus,
            pids: TASK_PIDS_LIMIT.range(var, 8, 1 << 22)? as i64,
            nofile: TASK_NOFILE.range(var, 64, 1 << 20)? as i64,
            tmpfs_mib: TASK_TMPFS_MB.range(var, 1, 1 << 16)?,
            user,
            disk_mib: TASK_DISK_MB.range(var, 1, 1 << 20)?,
            network,
            bridge: TASK_BRIDGE.name_value(var, MAX_BRIDGE_LEN)?,
            egress_network: TASK_EGRESS_NETWORK.name_value(var, 64)?,
            egress_bridge: TASK_EGRESS_BRIDGE.name_value(var, MAX_BRIDGE_LEN)?,
            firewall,
            blocked_cidrs: parse_list(Some(&TASK_BLOCKED_CIDRS.get(var)), ""),
            // Docker's runtime names are free-form, but they reach the engine's
            // API and the log: the same alphabet as the network's.
            oci_runtime: match TASK_OCI_RUNTIME.get(var).trim() {
                "" => None,
                _ => Some(TASK_OCI_RUNTIME.name_value(var, 64)?),
            },
        })
    }
}

/// `EGRESS_PROXY_PORTS`: `low-high`, or one port.
fn proxy_ports(
    var: &impl Fn(&str) -> Option<String>,
) -> Result<std::ops::RangeInclusive<u16>, ConfigError> {
    let raw = EGRESS_PROXY_PORTS.get(var);
    let (lo, hi) = raw.split_once('-').unwrap_or((&raw, &raw));
    match (lo.trim().parse::<u16>(), hi.trim().parse::<u16>()) {
        (Ok(lo), Ok(hi)) if lo > 0 && lo <= hi => Ok(lo..=hi),
        _ => Err(VarError::new(
            EGRESS_PROXY_PORTS.name,
            &raw,
            "a port range low-high (e.g. 3128-3191) or one port",
        )
        .into()),
    }
}

impl EgressConfig {
    fn from_lookup(var: &impl Fn(&str) -> Option<String>) -> Result<EgressConfig, ConfigError> {
        let raw_ports = EGRESS_PORTS.get(var);
        let ports: Option<Vec<u16>> = raw_ports
            .split(',')
            .map(|p| p.trim().parse::<u16>().ok().filter(|p| *p > 0))
            .collect();
        let ports = ports
            .filter(|p| !p.is_empty())
            .ok_or_else(|| VarError::new(EGRESS_PORTS.name, &raw_ports, "ports, e.g. 80,443"))?;
        Ok(EgressConfig {
            proxy_ports: proxy_ports(var)?,
            ports,
            resolver: crate::egress::Resolver::Dns,
        })
    }
}

/// The hostname, which is stable across restarts of a worker on one host.
fn default_worker_name() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "worker".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `vars`, with a verify key unless they give one.
    fn load(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let key = public_key(1);
        let mut all = vars.to_vec();
        if !vars.iter().any(|(k, _)| *k == "TASK_VERIFY_KEYS") {
            all.push(("TASK_VERIFY_KEYS", &key));
        }
        Config::from_lookup(shared::envvar::lookup_of(&all))
    }

    fn public_key(seed: u8) -> String {
        shared::spec::SpecSigner::from_seed(&[seed; 32]).public_base64()
    }

    #[test]
    fn worker_names_that_are_no_single_path_component_are_refused() {
        for bad in ["..", ".", "../x", "a/b", "w 1"] {
            let text = refused(&[("WORKER_NAME", bad)]);
            assert!(
                text.starts_with("WORKER_NAME: worker name ") && text.contains("is not allowed"),
                "{text}"
            );
        }
        let ok = load(&[("WORKER_NAME", "w-1.example_a")]).map(|c| c.worker_name.to_string());
        assert_eq!(ok.ok().as_deref(), Some("w-1.example_a"));
    }

    #[test]
    fn refuses_to_start_without_verify_keys_or_with_bad_ones_naming_them() {
        assert!(matches!(
            load(&[("TASK_VERIFY_KEYS", " ")]),
            Err(ConfigError::MissingVerifyKeys)
        ));
        let (a, b, c) = (public_key(1), public_key(2), public_key(3));
        let three = format!("{a},{b},{c}");
        for (bad, says) in [
            ("AAAA", "holds 3 bytes"),
            ("%%%", "is not base64"),
            (three.as_str(), "3 keys are listed"),
        ] {
            let text = refused(&[("TASK_VERIFY_KEYS", bad)]);
            assert!(
                text.starts_with("TASK_VERIFY_KEYS: ") && text.contains(says),
                "{text}"
            );
        }
        let two = format!("{a}, {b}");
        let c = load(&[("TASK_VERIFY_KEYS", &two)]).expect("two keys");
        assert_eq!(c.verifier.key_ids().len(), 2);
    }

    fn refused(vars: &[(&str, &str)]) -> String {
        match load(vars) {
            Ok(_) => panic!("{vars:?} was accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn the_sweep_runs_hourly_by_default_never_at_zero_and_never_more_than_once_a_minute() {
        let every =
            |v: &str| load(&[("WORKSPACE_SWEEP_SECONDS", v)]).map(|c| c.workspaces.sweep_every);
        assert_eq!(
            load(&[]).expect("defaults").workspaces.sweep_every,
            Duration::from_secs(3600)
        );
        assert_eq!(every("0").ok(), Some(Duration::ZERO));
        assert_eq!(every("60").ok(), Some(Duration::from_secs(60)));
        let text = refused(&[("WORKSPACE_SWEEP_SECONDS", "5")]);
        assert!(
            text.starts_with("WORKSPACE_SWEEP_SECONDS=\"5\"")
                && text.contains("0 (never), or from 60"),
            "{text}"
        );
    }

    #[test]
    fn the_declared_defaults_load() {
        let c = load(&[]).expect("defaults");
        assert_eq!(c.limits.bridge, "sr-tasks0");
        assert_eq!(c.limits.user, "65534:65534");
        assert!(c.limits.firewall);
        assert_eq!(c.metrics_addr, None);
        let sizes: Vec<_> = c
            .pool
            .sizes
            .iter()
            .map(|t| (t.runtime.as_str(), t.network, t.size))
            .collect();
        assert_eq!(
            sizes,
            [
                ("python3.13", Network::Internet, 2),
                ("node24", Network::Internet, 1),
                ("python3.13", Network::Allow, 1)
            ]
        );
        assert_eq!(c.pool.sizes[0].image, "python:3.13-slim");
    }

    #[test]
    fn caches_are_sized_in_mib_and_zero_turns_them_off() {
        let c = load(&[]).expect("defaults");
        assert_eq!(c.cache.per_owner_bytes, 1024 << 20);
        assert_eq!(c.cache.total_bytes, 10240 << 20);
        assert!(c.cache.enabled());
        assert!(
            !load(&[("CACHE_MB_PER_OWNER", "0")])
                .expect("off")
                .cache
                .enabled()
        );
        let small = refused(&[("CACHE_MB_PER_OWNER", "100"), ("CACHE_TOTAL_MB", "50")]);
        assert!(
            small.contains("CACHE_TOTAL_MB") && small.contains("at least CACHE_MB_PER_OWNER (100)"),
            "{small}"
        );
    }

    #[test]
    fn the_pool_is_per_runtime_and_zero_turns_it_off() {
        let c = load(&[
            ("POOL_SIZE", "node24=3, python3.8=0"),
            ("EGRESS_POOL_SIZE", "node24=1"),
            ("RUNTIME_IMAGES", "node24=mirror/node"),
        ])
        .expect("valid");
        let target = |network, size| PoolTarget {
            runtime: RuntimeName::from_stored("node24"),
            network,
            image: "mirror/node".into(),
            size,
        };
        assert_eq!(
            c.pool.sizes,
            [target(Network::Internet, 3), target(Network::Allow, 1)]
        );
        assert!(
            load(&[("POOL_SIZE", "0"), ("EGRESS_POOL_SIZE", "0")])
                .expect("off")
                .pool
                .sizes
                .is_empty()
        );
        // By default, allow-list tasks have one Python container waiting.
        let default = load(&[]).expect("defaults").pool.sizes;
        assert!(
            default
                .iter()
                .any(|t| t.network == Network::Allow && t.runtime.as_str() == "python3.13"),
            "{default:?}"
        );
        // POOL_SIZE=0 alone turns both off; EGRESS_POOL_SIZE named keeps its own.
        assert!(
            load(&[("POOL_SIZE", "0")])
                .expect("off")
                .pool
                .sizes
                .is_empty()
        );
        let only_egress = load(&[("POOL_SIZE", "0"), ("EGRESS_POOL_SIZE", "node24=1")])
            .expect("egress only")
            .pool
            .sizes;
        assert_eq!(only_egress.len(), 1, "{only_egress:?}");
        let egress = refused(&[("EGRESS_POOL_SIZE", "ruby3=1")]);
        assert!(egress.starts_with("EGRESS_POOL_SIZE="), "{egress}");
        let unknown = refused(&[("POOL_SIZE", "ruby3=1")]);
        assert!(unknown.contains("unknown runtime \"ruby3\""), "{unknown}");
        assert!(
            unknown.contains("node24, python3.13, python3.8"),
            "{unknown}"
        );
        assert!(refused(&[("POOL_SIZE", "node24")]).contains("runtime=count"));
        assert!(refused(&[("POOL_SIZE", "node24=lots")]).contains("from 0 to 64"));
        assert!(refused(&[("POOL_SIZE", "node24=1,node24=2")]).contains("twice"));
        assert!(refused(&[("POOL_MAX_AGE_SECONDS", "1")]).starts_with("POOL_MAX_AGE_SECONDS="));
    }

    #[test]
    fn the_metrics_address_is_an_address() {
        let c = load(&[("WORKER_METRICS_ADDR", "127.0.0.1:9464")]).expect("valid");
        assert_eq!(c.metrics_addr, Some(([127, 0, 0, 1], 9464).into()));
        assert!(refused(&[("WORKER_METRICS_ADDR", ":9464")]).starts_with("WORKER_METRICS_ADDR="));
    }

    #[test]
    fn names_that_reach_docker_linux_or_redis_are_checked() {
        let long = refused(&[("TASK_BRIDGE", "sr-tasks-bridge0")]);
        assert!(
            long.starts_with("TASK_BRIDGE=\"sr-tasks-bridge0\""),
            "{long}"
        );
        assert!(long.contains("1 to 15 characters"));
        assert!(refused(&[("TASK_BRIDGE", "sr tasks")]).starts_with("TASK_BRIDGE="));
        assert!(refused(&[("TASK_NETWORK", "host")]).contains("not host"));
        assert!(refused(&[("TASK_NETWORK", "a/b")]).starts_with("TASK_NETWORK="));
        assert!(refused(&[("TASK_USER", "0:0")]).contains("other than root"));
        assert!(refused(&[("TASK_USER", "nobody")]).starts_with("TASK_USER="));
        assert!(refused(&[("REDIS_KEY_PREFIX", "a b")]).starts_with("REDIS_KEY_PREFIX="));
        assert!(refused(&[("TASK_FIREWALL", "nft")]).contains("iptables or off"));
        assert!(refused(&[("TASK_OCI_RUNTIME", "run sc")]).starts_with("TASK_OCI_RUNTIME="));
    }

    #[test]
    fn the_oci_runtime_is_the_engine_s_default_unless_named() {
        let runtime = |vars: &[(&str, &str)]| load(vars).ok().and_then(|c| c.limits.oci_runtime);
        assert_eq!(runtime(&[]), None);
        assert_eq!(runtime(&[("TASK_OCI_RUNTIME", " ")]), None);
        assert_eq!(
            runtime(&[("TASK_OCI_RUNTIME", "runsc")]),
            Some("runsc".to_owned())
        );
    }
}
