//! What a task's container is made of (the image, the prelude, caps, mounts,
//! network, user), and its creation, cold (`create`) or warm (`create_warm`):
//! both get the same hardening and the same prelude, attached before it starts.

use std::collections::HashMap;
use std::path::Path;

use bollard::errors::Error as DockerError;
use bollard::models::{
    ContainerCreateBody, HostConfig, HostConfigLogConfig, Mount, MountType, MountVolumeOptions,
    MountVolumeOptionsDriverConfig, ResourcesUlimits,
};
use bollard::query_parameters::{CreateContainerOptionsBuilder, CreateImageOptionsBuilder};
use futures_util::StreamExt;
use shared::options::Network;

use super::prelude::{COLLECT_MOUNT, RESTORE_MOUNT, SOURCE_MOUNT, container_command, task_env};
use super::{
    Attached, LABEL_POOL, LABEL_POOL_NETWORK, LABEL_TASK, LABEL_WORKER, Sandbox, SandboxError,
};
use crate::cache::CACHE_MOUNT;

/// Where an allow-list task's Docker DNS server forwards: nowhere that answers.
const NO_DNS_UPSTREAM: &str = "192.0.2.1";
use crate::metrics::Op;

/// Mount flags of /workspace and /tmp (`HOME`), before their size and mode.
const TMPFS_FLAGS: &str = "rw,exec,nosuid,nodev";

/// The program the kernel pipes crashes to, from `kernel.core_pattern`
/// (`|/usr/lib/systemd/systemd-coredump %P ...`); `None` for a file pattern.
/// The kernel starts such a helper, as root, for every crash whatever the
/// crashing process's core limit (it only passes the limit on), so the tasks'
/// core limit of 0 cannot stop it: the worker says so at start.
pub fn core_dump_helper(core_pattern: &str) -> Option<&str> {
    core_pattern
        .trim()
        .strip_prefix('|')?
        .split_whitespace()
        .next()
}

/// What a task's container is made of.
pub struct ContainerSpec<'a> {
    pub task_id: &'a str,
    pub image: &'a str,
    /// The user's shell one-liner.
    pub command: &'a str,
    /// The extracted zip on the host, if any.
    pub source: Option<&'a Path>,
    /// The workspace version it starts from, restored on the host, if any.
    pub restore: Option<&'a Path>,
    /// Whether it runs on a workspace (its files are copied in before it starts).
    pub workspace: bool,
    pub timeout_seconds: u64,
    /// Extra environment variables, as the api checked them.
    pub env: &'a [(String, String)],
    pub network: Network,
    /// `collect`: the collection pipe on the host and the patterns.
    pub collect: Option<(&'a Path, &'a [String])>,
    /// A cold task's cache mount directory on the host (its owner's cache lent
    /// into it), mounted at `CACHE_MOUNT`; a pool container has its own.
    pub cache: Option<&'a Path>,
}

impl ContainerSpec<'_> {
    /// The name of the task's container, cold or warm (a warm one is renamed):
    /// `sr-<task_id>`.
    pub(super) fn container_name(&self) -> String {
        format!("sr-{}", self.task_id)
    }
}

/// A warm pool container to be.
pub struct WarmSpec<'a> {
    /// The container's name (`pool_container_name`).
    pub name: &'a str,
    pub runtime: &'a str,
    pub image: &'a str,
    /// Mounted where a cold task's extracted zip is: filled at claim.
    pub source: &'a Path,
    /// Mounted where a cold task's restored workspace version is: filled at claim.
    pub restore: &'a Path,
    /// The collection pipe, mounted ahead of time.
    pub fifo: &'a Path,
    /// Mounted at `CACHE_MOUNT`: a claiming task's cache is lent into it.
    pub cache: Option<&'a Path>,
    /// The task bridge (`Internet`) or the egress network (`Allow`).
    pub network: Network,
}

/// Host paths mounted into a task container.
struct Mounts<'a> {
    source: Option<&'a Path>,
    restore: Option<&'a Path>,
    collect: Option<&'a Path>,
    cache: Option<&'a Path>,
}

impl Sandbox {
    /// Creates and starts a task's own container (a cold start); pulls the
    /// image once if it is missing. Returns the container id and its streams,
    /// attached before the start: its prelude waits on them for the task
    /// (`hand_off`).
    ///
    /// The extracted zip (`source`, on the host) is mounted read-only and copied
    /// into /workspace by the prelude before the command runs.
    pub async fn create(
        &self,
        spec: &ContainerSpec<'_>,
    ) -> Result<(String, Attached), SandboxError> {
        let mounts = Mounts {
            source: spec.source,
            restore: spec.restore,
            collect: spec.collect.map(|(fifo, _)| fifo),
            cache: spec.cache,
        };
        let body = ContainerCreateBody {
            image: Some(spec.image.to_owned()),
            labels: Some(HashMap::from([
                (LABEL_TASK.to_owned(), spec.task_id.to_owned()),
                (LABEL_WORKER.to_owned(), self.worker.clone()),
            ])),
            host_config: Some(self.host_config(&mounts, spec.network)),
            ..self.base_body()
        };
        let id = self
            .create_named(&spec.container_name(), spec.image, body)
            .await?;
        self.attach_and_start(id).await
    }

    /// Creates and starts a warm pool container: the very container a cold task
    /// of this image gets (caps, mounts, network, user, prelude), with its
    /// source directory and collection pipe mounted ahead of time (a running
    /// container cannot get a new mount), its prelude waiting for one task
    /// (`hand_off`). Returns the container id and its streams.
    ///
    /// Waiting on its stdin takes no CPU and no traffic. Should its worker die,
    /// the attach ends, the prelude reads the end of its input and exits, and
    /// the container with it.
    pub async fn create_warm(
        &self,
        warm: &WarmSpec<'_>,
    ) -> Result<(String, Attached), SandboxError> {
        let body = ContainerCreateBody {
            image: Some(warm.image.to_owned()),
            labels: Some(HashMap::from([
                (LABEL_WORKER.to_owned(), self.worker.clone()),
                (LABEL_POOL.to_owned(), warm.runtime.to_owned()),
                (
                    LABEL_POOL_NETWORK.to_owned(),
                    warm.network.as_str().to_owned(),
                ),
            ])),
            host_config: Some(self.host_config(
                &Mounts {
                    source: Some(warm.source),
                    restore: Some(warm.restore),
                    collect: Some(warm.fifo),
                    cache: warm.cache,
                },
                warm.network,
            )),
            ..self.base_body()
        };
        let id = self.create_named(warm.name, warm.image, body).await?;
        self.attach_and_start(id).await
    }

    /// Attaches to a created container's streams, stdin included, then starts
    /// it; removes it if either fails.
    async fn attach_and_start(&self, id: String) -> Result<(String, Attached), SandboxError> {
        let attached = match self.attach(&id).await {
            Ok(a) => a,
            Err(e) => {
                self.remove(&id).await;
                return Err(e);
            }
        };
        if let Err(e) = self.start(&id).await {
            self.remove(&id).await;
            return Err(e);
        }
        Ok((id, attached))
    }

    /// What every task container has, cold or warm: the prelude, waiting on
    /// a stdin that closes when the worker's attach does (`stdin_once`), so
    /// the script sees the end of its input.
    fn base_body(&self) -> ContainerCreateBody {
        ContainerCreateBody {
            cmd: Some(container_command()),
            env: Some(task_env(&[])),
            open_stdin: Some(true),
            stdin_once: Some(true),
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            working_dir: Some("/workspace".into()),
            user: Some(self.limits.user.clone()),
            tty: Some(false),
            ..Default::default()
        }
    }

    async fn create_named(
        &self,
        name: &str,
        image: &str,
        body: ContainerCreateBody,
    ) -> Result<String, SandboxError> {
        let opts = CreateContainerOptionsBuilder::default().name(name).build();
        let create = self
            .docker
            .create_container(Some(opts.clone()), body.clone());
        match self.metrics.docker(Op::Create, create).await {
            Ok(r) => Ok(r.id),
            Err(DockerError::DockerResponseServerError {
                status_code: 404, ..
            }) => {
                self.pull(image).await?;
                let create = self.docker.create_container(Some(opts), body);
                Ok(self.metrics.docker(Op::Create, create).await?.id)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The hardening and caps every task container gets.
    fn host_config(&self, mounts: &Mounts<'_>, network: Network) -> HostConfig {
        let l = &self.limits;
        let memory = (l.memory_mib * 1024 * 1024) as i64;
        let mut binds: Vec<String> = Vec::new();
        if let Some(src) = mounts.source {
            binds.push(format!("{}:{SOURCE_MOUNT}:ro", src.display()));
        }
        if let Some(restored) = mounts.restore {
            binds.push(format!("{}:{RESTORE_MOUNT}:ro", restored.display()));
        }
        // A pipe, not a file: what the prelude writes goes to the worker's
        // memory (bounded by what it reads), never to the host's disk.
        if let Some(fifo) = mounts.collect {
            binds.push(format!("{}:{COLLECT_MOUNT}", fifo.display()));
        }
        // Writable, and on the host's disk: the one host directory a task
        // writes to, its owner's dependency cache (see `cache.rs`).
        if let Some(cache) = mounts.cache {
            binds.push(format!("{}:{CACHE_MOUNT}:rw", cache.display()));
        }
        HostConfig {
            binds: (!binds.is_empty()).then_some(binds),
            memory: Some(memory),
            // Equal to memory: no swap on top of the cap.
            memory_swap: Some(memory),
            nano_cpus: Some((l.cpus * 1e9) as i64),
            pids_limit: Some(l.pids),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            readonly_rootfs: Some(true),
            tmpfs: Some(self.tmpfs_mounts()),
            mounts: Some(vec![self.workspace_mount()]),
            ulimits: Some(vec![
                ResourcesUlimits {
                    name: Some("nofile".into()),
                    soft: Some(l.nofile),
                    hard: Some(l.nofile),
                },
                // No core dumps: a crash writes no core file, and a host whose
                // core_pattern pipes to a helper (systemd-coredump) has it store
                // nothing (docs/security.md says what that does not stop).
                ResourcesUlimits {
                    name: Some("core".into()),
                    soft: Some(0),
                    hard: Some(0),
                },
            ]),
            // An allow-list task's Docker DNS server forwards to an address
            // that answers nothing (TEST-NET-1), not to the host's resolvers:
            // engines before 26.0 forwarded from internal networks when the
            // host's resolver was on loopback (CVE-2024-29018).
            dns: (network == Network::Allow).then(|| vec![NO_DNS_UPSTREAM.to_owned()]),
            network_mode: Some(match network {
                Network::Internet => l.network.clone(),
                // Docker's "none": a loopback interface and nothing else.
                Network::None => "none".to_owned(),
                Network::Allow => l.egress_network.clone(),
            }),
            // docker-init as PID 1, so neither `timeout` nor the script is: the
            // kernel ignores SIGKILL sent to PID 1 from inside its namespace (it
            // would defeat busybox's `timeout`, which execs the command in place),
            // and init reaps orphaned zombies whatever the script leaves behind.
            init: Some(true),
            // Output is streamed through attach; Docker keeps no log of its own,
            // so a flood cannot fill the host's disk.
            log_config: Some(HostConfigLogConfig {
                typ: Some("none".into()),
                config: None,
            }),
            // TASK_OCI_RUNTIME (e.g. runsc); none: the engine's default (runc).
            runtime: l.oci_runtime.clone(),
            ..Default::default()
        }
    }

    /// /workspace: a size-capped tmpfs owned by the task's user, as a volume of
    /// the engine's `local` driver (type tmpfs) rather than a `Tmpfs` entry. It
    /// is the same mount inside (flags and size below, nothing on the host's
    /// disk), but the engine can read a volume from the host side while the
    /// container exists, paused or not: that is how a workspace task's files
    /// are saved after its end, whatever the end (`Sandbox::workspace_archive`).
    /// Anonymous, so it goes with its container (`remove` passes `v`).
    fn workspace_mount(&self) -> Mount {
        let l = &self.limits;
        let owner = match crate::source::parse_owner(&l.user) {
            Some((uid, gid)) => format!("uid={uid},gid={gid},mode=0755"),
            None => "mode=1777".to_owned(),
        };
        Mount {
            target: Some("/workspace".into()),
            typ: Some(MountType::VOLUME),
            volume_options: Some(MountVolumeOptions {
                driver_config: Some(MountVolumeOptionsDriverConfig {
                    name: Some("local".into()),
                    options: Some(HashMap::from([
                        ("type".to_owned(), "tmpfs".to_owned()),
                        ("device".to_owned(), "tmpfs".to_owned()),
                        (
                            "o".to_owned(),
                            format!("{TMPFS_FLAGS},size={}m,{owner}", l.disk_mib),
                        ),
                    ])),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// /tmp is a size-capped tmpfs mount, so a task can never fill the host's
    /// disk (nor, with /workspace, its memory past the two caps).
    ///
    /// `exec` explicitly: Docker mounts a tmpfs noexec unless told otherwise, and
    /// a task must run what it brings or installs (`./run.sh`,
    /// `node_modules/.bin/*`, compiled Python packages). `nosuid` and `nodev` are
    /// what keep a task's files from raising privileges.
    fn tmpfs_mounts(&self) -> HashMap<String, String> {
        let l = &self.limits;
        HashMap::from([(
            "/tmp".to_owned(),
            format!("{TMPFS_FLAGS},size={}m,mode=1777", l.tmpfs_mib),
        )])
    }

    async fn pull(&self, image: &str) -> Result<(), SandboxError> {
        tracing::info!(image, "pulling missing runtime image");
        let opts = CreateImageOptionsBuilder::default()
            .from_image(image)
            .build();
        let mut progress = self.docker.create_image(Some(opts), None, None);
        while let Some(step) = progress.next().await {
            step.map_err(|source| SandboxError::ImageMissing {
                image: image.to_owned(),
                source,
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::core_dump_helper;

    #[test]
    fn a_piping_core_pattern_names_its_helper_and_a_file_pattern_none() {
        let systemd = "|/usr/lib/systemd/systemd-coredump %P %u %g %s %t %c %h\n";
        assert_eq!(
            core_dump_helper(systemd),
            Some("/usr/lib/systemd/systemd-coredump")
        );
        assert_eq!(core_dump_helper("core\n"), None);
        assert_eq!(core_dump_helper("/var/crash/core.%e.%p"), None);
    }
}
