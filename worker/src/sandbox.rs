//! Task containers on this host's Docker engine: the network they join, the
//! container spec (caps, limits, mounts), start/attach/wait/kill/remove, and the
//! clean-up of containers a previous run of this worker left behind.

use std::collections::HashMap;
use std::path::Path;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::errors::Error as DockerError;
use bollard::exec::StartExecResults;
use bollard::models::{
    ContainerCreateBody, HostConfig, HostConfigLogConfig, NetworkCreateRequest, ResourcesUlimits,
};
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptionsBuilder, CreateImageOptionsBuilder,
    KillContainerOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
    RenameContainerOptionsBuilder,
};
use futures_util::{Stream, StreamExt};
use shared::options::Network;
use shared::task::self_deadline_seconds;
use std::time::Duration;

use crate::config::SandboxLimits;
use crate::metrics::{Metrics, Op};

/// The variables every task gets, after the task's own: the api refuses the
/// reserved names, and a later duplicate would win anyway.
fn task_env(extra: &[(String, String)]) -> Vec<String> {
    let mut env: Vec<String> = extra.iter().map(|(k, v)| format!("{k}={v}")).collect();
    env.extend([
        "HOME=/tmp".to_owned(),
        "LANG=C.UTF-8".to_owned(),
        "PYTHONUNBUFFERED=1".to_owned(),
    ]);
    env
}

/// An exec that is not running and has no exit code: it never started, or its
/// container stopped under it.
fn exec_without_code() -> SandboxError {
    SandboxError::Docker(DockerError::DockerStreamError {
        error: "the task's process ended without an exit code (its container stopped)".into(),
    })
}

/// How long `exec_started` waits for the engine to say whether a task's process
/// started in a warm container (it usually knows within a few milliseconds).
const EXEC_START_WAIT: Duration = Duration::from_secs(10);

/// The longest timeout the api accepts (`MAX_TIMEOUT_SECONDS` at most).
const MAX_TASK_SECONDS: u64 = 86_400;

/// The container's command: copy the zip's files in (if any), then run the user's
/// command under `timeout -s KILL <deadline>` where the image has `timeout`
/// (coreutils or busybox), else directly, with `$HOME/.local/bin` appended to
/// PATH. The user's command is passed as `$1`,
/// never spliced into the script, so no quoting of it is ever needed.
fn container_command(
    command: &str,
    has_source: bool,
    deadline_seconds: u64,
    collect: &[String],
) -> Vec<String> {
    let copy = if has_source {
        format!("cp -R {SOURCE_MOUNT}/. /workspace/ && ")
    } else {
        String::new()
    };
    // `pip install --user` puts console scripts (pytest, ...) in ~/.local/bin:
    // on PATH, after the image's own directories, they run by name.
    let setup = format!("{copy}cd /workspace && export PATH=\"$PATH:$HOME/.local/bin\" && ");
    // Without collect the script replaces the prelude (exec); with it, the
    // script runs as a child so the prelude goes on after it: the files matching
    // the patterns ($3...) are archived to the collection pipe, which the worker
    // reads. Only regular files reached without a link (find does not follow
    // links; realpath drops paths through a linked directory) and inside
    // /workspace are taken.
    let exec = if collect.is_empty() { "exec " } else { "" };
    let run = format!(
        "{setup}if command -v timeout >/dev/null 2>&1; \
         then {exec}timeout -s KILL \"$2\" sh -c \"$1\"; else {exec}sh -c \"$1\"; fi"
    );
    let script = if collect.is_empty() {
        run
    } else {
        format!(
            "{run}; rc=$?; \
             shift 2; for pat in \"$@\"; do for f in $pat; do find \"$f\" -type f -print 2>/dev/null; done; done \
             | while IFS= read -r f; do case \"$(realpath -- \"$f\" 2>/dev/null)\" in /workspace/*) printf '%s\\n' \"$f\";; esac; done \
             | tar -cf - -T - 2>/dev/null > {COLLECT_MOUNT}; exit $rc"
        )
    };
    let fixed = [
        "sh".to_owned(),
        "-c".to_owned(),
        script,
        "sh".to_owned(),
        command.to_owned(),
        deadline_seconds.to_string(),
    ];
    fixed.into_iter().chain(collect.iter().cloned()).collect()
}

/// Where the collection pipe (a FIFO the worker reads) is mounted.
const COLLECT_MOUNT: &str = "/.sr-collect";

/// Where the extracted zip is mounted (read-only) before it is copied to /workspace.
const SOURCE_MOUNT: &str = "/.sr-source";
/// Mount flags of /workspace and /tmp (`HOME`), before their size and mode.
const TMPFS_FLAGS: &str = "rw,exec,nosuid,nodev";
const OPT_BRIDGE_NAME: &str = "com.docker.network.bridge.name";
const OPT_ICC: &str = "com.docker.network.bridge.enable_icc";

/// Labels on every task container, so a worker can find its own after a crash.
pub const LABEL_TASK: &str = "script-runner.task";
pub const LABEL_WORKER: &str = "script-runner.worker";
/// On warm pool containers: the runtime whose pool holds it. A claimed one is
/// renamed `sr-<task_id>` (labels cannot change).
pub const LABEL_POOL: &str = "script-runner.pool";

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("cannot reach the Docker engine: {0}")]
    Connect(DockerError),
    #[error("runtime image {image} is not available on this worker host ({detail})")]
    ImageMissing { image: String, detail: String },
    #[error("task network: {0}")]
    Network(String),
    #[error("Docker refused the task container: {0}")]
    Docker(#[from] DockerError),
    #[error("the pool container stopped before the task's process could start in it")]
    ExecNotStarted,
}

pub type OutputStream =
    std::pin::Pin<Box<dyn Stream<Item = Result<LogOutput, DockerError>> + Send>>;
pub type StdinWriter = std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>;

/// What a task's container is made of.
pub struct ContainerSpec<'a> {
    pub task_id: &'a str,
    pub image: &'a str,
    /// The user's shell one-liner.
    pub command: &'a str,
    /// The extracted zip on the host, if any.
    pub source: Option<&'a Path>,
    pub timeout_seconds: u64,
    /// Extra environment variables, as the api checked them.
    pub env: &'a [(String, String)],
    pub network: Network,
    /// Whether the script gets a stdin (written through `attach`, then closed).
    pub stdin: bool,
    /// `collect`: the collection pipe on the host and the patterns.
    pub collect: Option<(&'a Path, &'a [String])>,
}

/// A warm pool container to be.
pub struct WarmSpec<'a> {
    /// The container's name, `sr-pool-...`.
    pub name: &'a str,
    pub runtime: &'a str,
    pub image: &'a str,
    /// Mounted where a cold task's extracted zip is: filled at claim.
    pub source: &'a Path,
    /// The collection pipe, mounted ahead of time.
    pub fifo: &'a Path,
    pub max_age: std::time::Duration,
}

/// Host paths mounted into a task container.
struct Mounts<'a> {
    source: Option<&'a Path>,
    collect: Option<&'a Path>,
}

/// A task's process in a warm container.
pub struct Exec {
    pub id: String,
    pub output: OutputStream,
    pub input: Option<StdinWriter>,
}

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

    /// Creates the tasks' bridge network if it does not exist, with a fixed bridge
    /// interface name (the firewall matches on it) and inter-container traffic
    /// off, so tasks cannot reach each other. A network of that name made
    /// otherwise (an older worker, by hand) is replaced when no task uses it.
    pub async fn ensure_network(&self) -> Result<(), SandboxError> {
        let (name, bridge) = (&self.limits.network, &self.limits.bridge);
        if let Ok(existing) = self.docker.inspect_network(name, None).await {
            let opts = existing.options.clone().unwrap_or_default();
            // IPv6 must be off: the firewall rules are IPv4 only.
            let ours = opts.get(OPT_BRIDGE_NAME) == Some(bridge)
                && opts.get(OPT_ICC).map(String::as_str) == Some("false")
                && existing.enable_ipv6 != Some(true);
            if ours {
                return Ok(());
            }
            if existing.containers.is_some_and(|c| !c.is_empty()) {
                return Err(SandboxError::Network(format!(
                    "network {name} exists without bridge name {bridge} and ICC off, and containers use it; \
                     remove it (docker network rm {name}) or set TASK_NETWORK"
                )));
            }
            tracing::warn!(network = %name, "replacing task network that lacks the isolation options");
            match self.docker.remove_network(name).await {
                // Another worker on this host removed it first.
                Ok(())
                | Err(DockerError::DockerResponseServerError {
                    status_code: 404, ..
                }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let options = HashMap::from([
            (OPT_BRIDGE_NAME.to_owned(), bridge.clone()),
            (OPT_ICC.to_owned(), "false".to_owned()),
            (
                "com.docker.network.bridge.enable_ip_masquerade".to_owned(),
                "true".to_owned(),
            ),
        ]);
        let req = NetworkCreateRequest {
            name: name.clone(),
            driver: Some("bridge".into()),
            options: Some(options),
            // Pinned off whatever the daemon's default: the firewall is IPv4 only.
            enable_ipv6: Some(false),
            labels: Some(HashMap::from([(
                "script-runner".to_owned(),
                "tasks".to_owned(),
            )])),
            ..Default::default()
        };
        match self.docker.create_network(req).await {
            Ok(_) => Ok(()),
            // Another worker on this host created it first.
            Err(e) if self.docker.inspect_network(name, None).await.is_ok() => {
                tracing::debug!(error = %e, "network appeared concurrently");
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Creates (but does not start) a task's container; pulls the image once if it
    /// is missing. Returns the container id.
    ///
    /// The extracted zip (`source`, on the host) is mounted read-only and copied
    /// into /workspace before the command runs. The script is killed from inside
    /// the container shortly after `timeout_seconds` even if this worker is gone
    /// by then.
    pub async fn create(&self, spec: &ContainerSpec<'_>) -> Result<String, SandboxError> {
        let cmd = container_command(
            spec.command,
            spec.source.is_some(),
            self_deadline_seconds(spec.timeout_seconds),
            spec.collect.map_or(&[][..], |(_, patterns)| patterns),
        );
        let mounts = Mounts {
            source: spec.source,
            collect: spec.collect.map(|(fifo, _)| fifo),
        };
        let body = ContainerCreateBody {
            image: Some(spec.image.to_owned()),
            cmd: Some(cmd),
            env: Some(task_env(spec.env)),
            labels: Some(HashMap::from([
                (LABEL_TASK.to_owned(), spec.task_id.to_owned()),
                (LABEL_WORKER.to_owned(), self.worker.clone()),
            ])),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            // With stdin, the container's stdin is closed when the worker closes
            // its side of the attach (stdin_once): the script then sees EOF.
            attach_stdin: Some(spec.stdin),
            open_stdin: Some(spec.stdin),
            stdin_once: Some(spec.stdin),
            host_config: Some(self.host_config(&mounts, spec.network)),
            ..self.base_body()
        };
        self.create_named(&format!("sr-{}", spec.task_id), spec.image, body)
            .await
    }

    /// Creates and starts a warm pool container: the very container a cold task
    /// of this image gets (caps, mounts, network, user), with its source
    /// directory and collection pipe mounted ahead of time (a running container
    /// cannot get a new mount), idle until `exec_task` hands it one task.
    ///
    /// Its only process sleeps: no CPU, no traffic. The sleep outlives any task
    /// (`max_age` idle, then at most the longest timeout), so a pool container
    /// whose worker died and never came back ends by itself.
    pub async fn create_warm(&self, warm: &WarmSpec<'_>) -> Result<String, SandboxError> {
        let idle_seconds = warm.max_age.as_secs() + MAX_TASK_SECONDS + 120;
        let body = ContainerCreateBody {
            image: Some(warm.image.to_owned()),
            cmd: Some(vec!["sleep".to_owned(), idle_seconds.to_string()]),
            env: Some(task_env(&[])),
            labels: Some(HashMap::from([
                (LABEL_WORKER.to_owned(), self.worker.clone()),
                (LABEL_POOL.to_owned(), warm.runtime.to_owned()),
            ])),
            host_config: Some(self.host_config(
                &Mounts {
                    source: Some(warm.source),
                    collect: Some(warm.fifo),
                },
                Network::Internet,
            )),
            ..self.base_body()
        };
        let id = self.create_named(warm.name, warm.image, body).await?;
        if let Err(e) = self.start(&id).await {
            self.remove(&id).await;
            return Err(e);
        }
        Ok(id)
    }

    /// What every task container has, cold or warm.
    fn base_body(&self) -> ContainerCreateBody {
        ContainerCreateBody {
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

    /// Hands a warm container its task: runs the same prelude a cold container
    /// runs as its command, as a process of its own in the running container,
    /// with the task's environment, attached to its output (and stdin, if it has
    /// one). Renames the container `sr-<task_id>` meanwhile, so it is found by
    /// name like a cold one.
    pub async fn exec_task(
        &self,
        container: &str,
        spec: &ContainerSpec<'_>,
    ) -> Result<Exec, SandboxError> {
        let cmd = container_command(
            spec.command,
            spec.source.is_some(),
            self_deadline_seconds(spec.timeout_seconds),
            spec.collect.map_or(&[][..], |(_, patterns)| patterns),
        );
        let config = bollard::exec::CreateExecOptions {
            attach_stdin: Some(spec.stdin),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(false),
            env: Some(task_env(spec.env)),
            cmd: Some(cmd),
            user: Some(self.limits.user.clone()),
            working_dir: Some("/workspace".to_owned()),
            ..Default::default()
        };
        let rename = self.docker.rename_container(
            container,
            RenameContainerOptionsBuilder::default()
                .name(&format!("sr-{}", spec.task_id))
                .build(),
        );
        let create = self.metrics.docker(Op::Exec, async {
            let exec = self.docker.create_exec(container, config).await?;
            let started = self.docker.start_exec(&exec.id, None).await?;
            Ok::<_, DockerError>((exec.id, started))
        });
        let (renamed, created) = tokio::join!(rename, create);
        if let Err(e) = renamed {
            tracing::debug!(container, error = %e, "could not rename the pool container");
        }
        match created? {
            (id, StartExecResults::Attached { output, input }) => Ok(Exec {
                id,
                output,
                input: spec.stdin.then_some(input),
            }),
            (_, StartExecResults::Detached) => {
                Err(SandboxError::Docker(DockerError::DockerStreamError {
                    error: "the task's process started detached".into(),
                }))
            }
        }
    }

    /// Waits until a task's process in a warm container has really started.
    /// `exec_task` returns once the engine took the connection over, before it
    /// even marks the exec running; if the runtime's start then fails (the container's init
    /// died a moment before, and the engine had not noticed yet), the engine
    /// writes its complaint ("cannot exec in a stopped container") into the
    /// output stream, where it would pass for the task's own output, and gives
    /// the exec an exit code without a process. That is an error here, so the
    /// task gets a cold container instead: nothing of it ran.
    ///
    /// An exec the engine reports neither way within `EXEC_START_WAIT` (or
    /// cannot report on at all) is taken as started: supervision finds out how it
    /// ends, and a task must never run twice.
    pub async fn exec_started(&self, exec: &str) -> Result<(), SandboxError> {
        let give_up = tokio::time::Instant::now() + EXEC_START_WAIT;
        let mut pause = Duration::from_millis(2);
        loop {
            match self.docker.inspect_exec(exec).await {
                Ok(state) if state.pid.is_some_and(|pid| pid > 0) => return Ok(()),
                // Not running and no exit code yet: the engine answered the start
                // before it began starting the process (it does, on purpose: the
                // connection is taken over first). Not running with an exit code
                // and no pid: the start failed.
                Ok(state) if state.running == Some(false) && state.exit_code.is_some() => {
                    return Err(SandboxError::ExecNotStarted);
                }
                Ok(_) => {}
                // Gone with its container, or a failed call: whether the process
                // started is unknown, and a task must never run twice, so the
                // supervision that follows finds out (a gone one is "container
                // lost").
                Err(DockerError::DockerResponseServerError {
                    status_code: 404, ..
                }) => return Ok(()),
                Err(e) => tracing::debug!(exec, error = %e, "could not ask about a task's process"),
            }
            if tokio::time::Instant::now() >= give_up {
                tracing::warn!(
                    exec,
                    "no word from the engine on a task's process; supervising it anyway"
                );
                return Ok(());
            }
            tokio::time::sleep(pause).await;
            // Fine-grained: the task's process runs meanwhile, and its result
            // waits for this.
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }

    /// Waits for a task's process in a warm container to exit, once its output
    /// has ended; returns its exit code. The output can end a moment before the
    /// engine records the exit, so this asks a few times; a process that closed
    /// its output early is waited for as long as it runs.
    pub async fn exec_exit(&self, exec: &str) -> Result<i64, SandboxError> {
        let mut pause = Duration::from_millis(2);
        loop {
            if let Some(code) = self.exec_code(exec).await? {
                return Ok(code);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// The exit code of a task's process in a warm container, if it has exited.
    /// One that ended without a code never ran, or its container was stopped
    /// under it: an error, never a made-up code.
    pub async fn exec_code(&self, exec: &str) -> Result<Option<i64>, SandboxError> {
        let state = self.docker.inspect_exec(exec).await?;
        match (state.running, state.exit_code) {
            (Some(false), Some(code)) => Ok(Some(code)),
            (Some(false), None) => Err(exec_without_code()),
            _ => Ok(None),
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
        // A pipe, not a file: what the prelude writes goes to the worker's
        // memory (bounded by what it reads), never to the host's disk.
        if let Some(fifo) = mounts.collect {
            binds.push(format!("{}:{COLLECT_MOUNT}", fifo.display()));
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
            ulimits: Some(vec![ResourcesUlimits {
                name: Some("nofile".into()),
                soft: Some(l.nofile),
                hard: Some(l.nofile),
            }]),
            network_mode: Some(match network {
                Network::Internet => l.network.clone(),
                // Docker's "none": a loopback interface and nothing else.
                Network::None => "none".to_owned(),
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
            ..Default::default()
        }
    }

    /// /workspace and /tmp are size-capped tmpfs mounts (/workspace owned by the
    /// task's user), so a task can never fill the host's disk.
    ///
    /// `exec` explicitly: Docker mounts a tmpfs noexec unless told otherwise, and
    /// a task must run what it brings or installs (`./run.sh`,
    /// `node_modules/.bin/*`, compiled Python packages). `nosuid` and `nodev` are
    /// what keep a task's files from raising privileges.
    fn tmpfs_mounts(&self) -> HashMap<String, String> {
        let l = &self.limits;
        let owner = match crate::workspace::parse_owner(&l.user) {
            Some((uid, gid)) => format!("uid={uid},gid={gid},mode=0755"),
            None => "mode=1777".to_owned(),
        };
        HashMap::from([
            (
                "/tmp".to_owned(),
                format!("{TMPFS_FLAGS},size={}m,mode=1777", l.tmpfs_mib),
            ),
            (
                "/workspace".to_owned(),
                format!("{TMPFS_FLAGS},size={}m,{owner}", l.disk_mib),
            ),
        ])
    }

    async fn pull(&self, image: &str) -> Result<(), SandboxError> {
        tracing::info!(image, "pulling missing runtime image");
        let opts = CreateImageOptionsBuilder::default()
            .from_image(image)
            .build();
        let mut progress = self.docker.create_image(Some(opts), None, None);
        while let Some(step) = progress.next().await {
            step.map_err(|e| SandboxError::ImageMissing {
                image: image.to_owned(),
                detail: e.to_string(),
            })?;
        }
        Ok(())
    }

    /// Attaches to stdout and stderr, and to stdin if `stdin` (the container must
    /// have been created with it). Call before `start` so no byte is missed.
    pub async fn attach(
        &self,
        id: &str,
        stdin: bool,
    ) -> Result<(OutputStream, Option<StdinWriter>), SandboxError> {
        let opts = AttachContainerOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .stdin(stdin)
            .stream(true)
            .logs(false)
            .build();
        let attach = self.docker.attach_container(id, Some(opts));
        let attached = self.metrics.docker(Op::Attach, attach).await?;
        Ok((attached.output, stdin.then_some(attached.input)))
    }

    pub async fn start(&self, id: &str) -> Result<(), SandboxError> {
        Ok(self
            .metrics
            .docker(Op::Start, self.docker.start_container(id, None))
            .await?)
    }

    /// Waits for the container to exit; returns its exit code.
    pub async fn wait(&self, id: &str) -> Result<i64, SandboxError> {
        let mut s = self.docker.wait_container(id, None);
        match s.next().await {
            Some(Ok(r)) => Ok(r.status_code),
            // bollard reports a non-zero exit as an error: it is a normal exit.
            Some(Err(DockerError::DockerContainerWaitError { code, .. })) => Ok(code),
            Some(Err(e)) => Err(e.into()),
            None => Err(SandboxError::Docker(DockerError::DockerStreamError {
                error: "wait stream ended".into(),
            })),
        }
    }

    /// Whether the kernel OOM-killed the container (unreliable on cgroup v2).
    pub async fn oom_killed(&self, id: &str) -> bool {
        self.docker
            .inspect_container(id, None)
            .await
            .ok()
            .and_then(|c| c.state)
            .and_then(|s| s.oom_killed)
            .unwrap_or(false)
    }

    pub async fn kill(&self, id: &str) {
        let opts = KillContainerOptionsBuilder::default()
            .signal("SIGKILL")
            .build();
        if let Err(e) = self.docker.kill_container(id, Some(opts)).await {
            tracing::debug!(container = id, error = %e, "kill (container may have exited already)");
        }
    }

    /// Removes a container whatever its state. Errors are logged, not returned:
    /// the orphan sweep at the next start catches what is left.
    pub async fn remove(&self, id: &str) {
        let opts = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        let remove = self.docker.remove_container(id, Some(opts));
        if let Err(e) = self.metrics.docker(Op::Remove, remove).await {
            tracing::warn!(container = id, error = %e, "could not remove task container");
        }
    }

    /// Removes every container on this host that worker `owner` made (task and
    /// warm pool containers alike): this worker's own at start-up (left by a
    /// previous run that died), or a dead worker's that shared this Docker engine.
    /// With `created_before` (Unix seconds), only containers created before then:
    /// a dead worker's, not those of a new process that took its name meanwhile.
    /// Returns the names of the containers removed.
    pub async fn remove_containers_of(
        &self,
        owner: &str,
        created_before: Option<i64>,
    ) -> Result<Vec<String>, SandboxError> {
        let filters =
            HashMap::from([("label".to_owned(), vec![format!("{LABEL_WORKER}={owner}")])]);
        let opts = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let containers = self.docker.list_containers(Some(opts)).await?;
        let mut removed = Vec::new();
        for c in containers {
            if created_before.is_some_and(|t| c.created.is_none_or(|made| made >= t)) {
                continue;
            }
            if let Some(id) = c.id {
                self.remove(&id).await;
                let name = c.names.and_then(|n| n.into_iter().next()).unwrap_or(id);
                removed.push(name.trim_start_matches('/').to_owned());
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_users_command_is_an_argument_never_part_of_the_script() {
        let evil = "echo \"$2\"; rm -rf / ; `id`";
        let cmd = container_command(evil, true, 65, &[]);
        assert_eq!(cmd.len(), 6);
        assert_eq!(&cmd[..2], ["sh", "-c"]);
        assert!(cmd[2].starts_with("cp -R /.sr-source/. /workspace/ && cd /workspace"));
        assert!(!cmd[2].contains("rm -rf"));
        assert_eq!((cmd[4].as_str(), cmd[5].as_str()), (evil, "65"));
        assert!(cmd[2].contains("timeout -s KILL \"$2\" sh -c \"$1\""));
        assert!(cmd[2].contains("export PATH=\"$PATH:$HOME/.local/bin\" && "));
        let no_zip = container_command("true", false, 10, &[]);
        assert!(no_zip[2].starts_with("cd /workspace && "));
    }
}
