//! Task containers on this host's Docker engine. `Sandbox` is the worker's one
//! Docker handle; its methods are split by subject:
//!
//! - `prelude`: the shell prelude every task's container runs, and its environment;
//! - `spec`: the container spec (caps, limits, mounts) and creation, cold or warm;
//! - `network`: the tasks' bridge network;
//! - `container`: attach, start, wait, kill, remove, and the clean-up of the
//!   containers a worker left behind;
//! - `handoff`: a task handed to its container's waiting prelude (cold or warm),
//!   and its output with the prelude's markers (start, exit status) taken out;
//! - `usage`: what a container used (and whether it was OOM-killed), read from
//!   its cgroup when its task ends.
//!
//! It knows nothing about Redis.

mod container;
mod handoff;
mod network;
mod prelude;
mod spec;
mod usage;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::errors::Error as DockerError;
use futures_util::Stream;

pub use handoff::{Attached, Event, TaskOutput};
pub use prelude::Seen;
pub use spec::{ContainerSpec, WarmSpec, core_dump_helper};
pub use usage::Reading;

use crate::config::SandboxLimits;
use crate::metrics::Metrics;

/// Labels on every task container, so a worker can find its own after a crash.
pub const LABEL_TASK: &str = "script-runner.task";
pub const LABEL_WORKER: &str = "script-runner.worker";
/// On warm pool containers: the runtime whose pool holds it. A claimed one is
/// renamed `sr-<task_id>` (labels cannot change).
pub const LABEL_POOL: &str = "script-runner.pool";
/// On warm pool containers: the network of that pool (`internet`, `allow`).
pub const LABEL_POOL_NETWORK: &str = "script-runner.pool-network";

/// How every warm pool container's name begins (see `pool_container_name`).
pub const POOL_CONTAINER_PREFIX: &str = "sr-pool-";

/// A new warm pool container's name: `sr-pool-<random>`. Its host directory
/// bears the same name.
pub fn pool_container_name() -> String {
    format!("{POOL_CONTAINER_PREFIX}{}", uuid::Uuid::new_v4().simple())
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("cannot reach the Docker engine: {0}")]
    Connect(#[source] DockerError),
    #[error(
        "Docker Engine {0} is affected by CVE-2024-32473: it gives containers on an \
         IPv4-only network IPv6 addresses anyway, which the task firewall (IPv4) does not \
         cover; upgrade the engine to 26.0.2 or later"
    )]
    VulnerableEngine(String),
    #[error(
        "TASK_OCI_RUNTIME={name}: the Docker engine has no runtime of that name (it has: \
         {registered}); register it in /etc/docker/daemon.json (\"runtimes\") and reload \
         the engine (SIGHUP to dockerd), or unset TASK_OCI_RUNTIME"
    )]
    OciRuntimeMissing { name: String, registered: String },
    #[error("runtime image {image} is not available on this worker host ({source})")]
    ImageMissing { image: String, source: DockerError },
    #[error(
        "task network: network {name} exists without bridge name {bridge} and ICC off, and \
         containers use it; remove it (docker network rm {name}) or set TASK_NETWORK"
    )]
    NetworkInUse { name: String, bridge: String },
    #[error("the Docker network {0} has no IPv4 gateway for the egress proxy to listen on")]
    NoGateway(String),
    #[error("the task container has no address on the egress network {0}")]
    NoEgressAddress(String),
    #[error("Docker refused the task container: {0}")]
    Docker(#[from] DockerError),
    #[error("the engine ended the wait for the container without an exit code")]
    WaitEnded,
    #[error("the container stopped before its prelude took the task")]
    HandoffNotTaken,
    #[error(transparent)]
    Handoff(#[from] prelude::NulByte),
}

/// Whether an engine of this version (`docker version`'s server version, e.g.
/// `26.0.1` or `20.10.24+dfsg1`) has CVE-2024-32473: 26.0.0 and 26.0.1 enabled
/// IPv6 on networks created with IPv6 off, so tasks would get a route the
/// IPv4 firewall never sees.
fn leaks_ipv6(version: &str) -> bool {
    let core = version.split(['+', '-', '~']).next().unwrap_or_default();
    matches!(core, "26.0.0" | "26.0.1")
}

pub type OutputStream =
    std::pin::Pin<Box<dyn Stream<Item = Result<LogOutput, DockerError>> + Send>>;
pub type StdinWriter = std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>;

/// The worker's Docker handle, with the limits every task container gets and the
/// metrics every Docker call is recorded in. Clones share the connection.
#[derive(Clone)]
pub struct Sandbox {
    docker: Docker,
    limits: SandboxLimits,
    worker: String,
    metrics: Metrics,
}

impl Sandbox {
    /// Connects to the local engine and agrees on an API version with it (the
    /// engine may be older than the API bollard speaks by default).
    pub async fn connect(limits: SandboxLimits, worker: String) -> Result<Sandbox, SandboxError> {
        let docker = Docker::connect_with_local_defaults()
            .map_err(SandboxError::Connect)?
            .negotiate_version()
            .await
            .map_err(SandboxError::Connect)?;
        let version = docker
            .version()
            .await
            .map_err(SandboxError::Connect)?
            .version
            .unwrap_or_default();
        if leaks_ipv6(&version) {
            return Err(SandboxError::VulnerableEngine(version));
        }
        if let Some(name) = &limits.oci_runtime {
            let info = docker.info().await.map_err(SandboxError::Connect)?;
            let mut registered: Vec<String> =
                info.runtimes.unwrap_or_default().into_keys().collect();
            registered.sort();
            if !registered.contains(name) {
                return Err(SandboxError::OciRuntimeMissing {
                    name: name.clone(),
                    registered: registered.join(", "),
                });
            }
            tracing::info!(runtime = %name, "task containers run under TASK_OCI_RUNTIME");
        }
        if limits.disk_mib + limits.tmpfs_mib >= limits.memory_mib {
            tracing::warn!(
                memory_mib = limits.memory_mib,
                disk_mib = limits.disk_mib,
                tmpfs_mib = limits.tmpfs_mib,
                "TASK_DISK_MB + TASK_TMPFS_MB >= TASK_MEMORY_MB: files in /workspace and /tmp \
                 are charged to the memory cap, so a task that fills them is OOM-killed \
                 instead of seeing \"disk full\""
            );
        }
        Ok(Sandbox {
            docker,
            limits,
            worker,
            metrics: Metrics::default(),
        })
    }

    pub fn limits(&self) -> &SandboxLimits {
        &self.limits
    }

    /// This worker's metrics (Docker calls are recorded here).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }
}

#[cfg(test)]
mod tests {
    use super::leaks_ipv6;

    #[test]
    fn only_the_engines_with_cve_2024_32473_are_refused() {
        for bad in ["26.0.0", "26.0.1", "26.0.1+dfsg1", "26.0.0-rc1"] {
            assert!(leaks_ipv6(bad), "{bad}");
        }
        for fine in [
            "26.0.2",
            "20.10.24+dfsg1",
            "25.0.5",
            "27.3.1",
            "26.1.0",
            "",
            "26.0.10",
        ] {
            assert!(!leaks_ipv6(fine), "{fine}");
        }
    }
}
