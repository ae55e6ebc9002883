//! The worker's configuration, loaded from the environment. `.env.example` lists
//! every variable with its default; README.md explains each.

use std::path::PathBuf;

use shared::envvar::{Common, VarError, non_blank, parse_list, parse_or, parse_range};
use shared::zipcheck::ZipLimits;
use shared::{Keys, RuntimeCatalog, RuntimeError};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Var(#[from] VarError),
    #[error("RUNTIME_IMAGES: {0}")]
    Runtime(#[from] RuntimeError),
    #[error("WORKER_NAME {0:?} is not allowed: use letters, digits, '.', '-' and '_'")]
    BadWorkerName(String),
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
    /// `TASK_FIREWALL`: `iptables` (default) installs the host rules that keep
    /// tasks off the host and private networks; `off` skips them (development only).
    pub firewall: bool,
    /// `TASK_BLOCKED_CIDRS`: more IPv4 ranges tasks must not reach (comma-separated).
    pub blocked_cidrs: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Config {
    /// `REDIS_URL`.
    pub redis_url: String,
    /// `REDIS_KEY_PREFIX` (default `sr`).
    pub keys: Keys,
    /// `WORKER_NAME`: this worker's consumer name; keep it stable across restarts so
    /// a restarted worker finds and cleans up what it left (default: the hostname).
    pub worker_name: String,
    /// `WORKER_CONCURRENCY`: tasks run at once (default: number of CPUs).
    pub concurrency: usize,
    /// `TASKS_DIR`: where task workspaces live on this host (default `./tasks-data`).
    pub tasks_dir: PathBuf,
    /// `RUNTIME_IMAGES`, without the defaults: images this host uses instead of
    /// the one the api recorded for a task (e.g. a local mirror's tag). A runtime
    /// not listed here runs in the recorded image.
    pub runtime_overrides: RuntimeCatalog,
    pub limits: SandboxLimits,
    /// `ZIP_MAX_ENTRIES` / `ZIP_MAX_EXPANDED_BYTES`, enforced again at extraction.
    pub zip_limits: ZipLimits,
    /// `TASK_RETENTION_SECONDS`: how long a finished task's record is kept.
    pub retention_seconds: u64,
    /// `WORKER_HEARTBEAT_SECONDS`: how long a heartbeat lives (renewed three times
    /// as often). A worker silent this long is suspected dead, and after as long
    /// again other workers' reapers settle its tasks.
    pub heartbeat_ttl: std::time::Duration,
    /// `SHUTDOWN_GRACE_SECONDS`: on SIGTERM, how long running tasks may go on
    /// before they are killed (and recorded as such).
    pub shutdown_grace: std::time::Duration,
}

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
        let worker_name = var("WORKER_NAME")
            .filter(|n| !n.trim().is_empty())
            .unwrap_or_else(default_worker_name);
        if !worker_name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        {
            return Err(ConfigError::BadWorkerName(worker_name));
        }
        let cpus: f64 = parse_or(
            "TASK_CPUS",
            var("TASK_CPUS").as_deref(),
            1.0,
            "a number of cores such as 1 or 0.5",
        )?;
        if !(0.01..=256.0).contains(&cpus) {
            return Err(VarError::new(
                "TASK_CPUS",
                &cpus.to_string(),
                "a number of cores from 0.01 to 256",
            )
            .into());
        }
        Ok(Config {
            redis_url: common.redis_url,
            keys: common.keys,
            worker_name,
            concurrency: parse_range(
                "WORKER_CONCURRENCY",
                var("WORKER_CONCURRENCY").as_deref(),
                cpus_default as u64,
                1,
                1024,
            )? as usize,
            tasks_dir: PathBuf::from(var("TASKS_DIR").unwrap_or_else(|| "./tasks-data".into())),
            runtime_overrides: RuntimeCatalog::overrides(var("RUNTIME_IMAGES").as_deref())?,
            limits: SandboxLimits {
                memory_mib: parse_range(
                    "TASK_MEMORY_MB",
                    var("TASK_MEMORY_MB").as_deref(),
                    1024,
                    16,
                    1 << 20,
                )?,
                cpus,
                pids: parse_range(
                    "TASK_PIDS_LIMIT",
                    var("TASK_PIDS_LIMIT").as_deref(),
                    256,
                    8,
                    1 << 22,
                )? as i64,
                nofile: parse_range(
                    "TASK_NOFILE",
                    var("TASK_NOFILE").as_deref(),
                    1024,
                    64,
                    1 << 20,
                )? as i64,
                tmpfs_mib: parse_range(
                    "TASK_TMPFS_MB",
                    var("TASK_TMPFS_MB").as_deref(),
                    256,
                    1,
                    1 << 16,
                )?,
                user: var("TASK_USER")
                    .filter(|u| !u.is_empty())
                    .unwrap_or_else(|| "65534:65534".into()),
                disk_mib: parse_range(
                    "TASK_DISK_MB",
                    var("TASK_DISK_MB").as_deref(),
                    512,
                    1,
                    1 << 20,
                )?,
                network: var("TASK_NETWORK")
                    .filter(|n| !n.is_empty())
                    .unwrap_or_else(|| "script-runner-tasks".into()),
                bridge: var("TASK_BRIDGE")
                    .filter(|n| !n.is_empty())
                    .unwrap_or_else(|| "sr-tasks0".into()),
                firewall: match var("TASK_FIREWALL").as_deref().map(str::trim) {
                    None | Some("") | Some("iptables") => true,
                    Some("off") => false,
                    Some(other) => {
                        return Err(VarError::new("TASK_FIREWALL", other, "iptables or off").into());
                    }
                },
                blocked_cidrs: parse_list(var("TASK_BLOCKED_CIDRS").as_deref(), ""),
            },
            zip_limits: ZipLimits::from_env_values(
                var("ZIP_MAX_ENTRIES").as_deref(),
                var("ZIP_MAX_EXPANDED_BYTES").as_deref(),
            )?,
            retention_seconds: common.retention_seconds,
            heartbeat_ttl: std::time::Duration::from_secs(parse_range(
                "WORKER_HEARTBEAT_SECONDS",
                var("WORKER_HEARTBEAT_SECONDS").as_deref(),
                15,
                1,
                3600,
            )?),
            shutdown_grace: std::time::Duration::from_secs(parse_range(
                "SHUTDOWN_GRACE_SECONDS",
                var("SHUTDOWN_GRACE_SECONDS").as_deref(),
                30,
                0,
                86_400,
            )?),
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
