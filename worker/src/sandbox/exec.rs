//! A task in its container (cold or warm): the prelude run as an exec of its own
//! (`exec_task`), whether the engine really started it (`exec_started`), and its
//! exit code (`exec_exit`, `exec_code`).

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use bollard::errors::Error as DockerError;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::query_parameters::RenameContainerOptionsBuilder;

use super::prelude::task_env;
use super::{ContainerSpec, OutputStream, Sandbox, SandboxError, StdinWriter};
use crate::metrics::Op;

/// How long `exec_started` waits for the engine to say whether a task's process
/// started in a warm container (it usually knows within a few milliseconds).
const EXEC_START_WAIT: Duration = Duration::from_secs(10);

/// Pauses between two questions to the engine about an exec: 2 ms, doubling, at
/// most `max`, never running out. Fine-grained: the task's process
/// runs meanwhile, and its result waits for the answer.
fn polls(max: Duration) -> impl Iterator<Item = Duration> {
    ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(2))
        .with_max_delay(max)
        .without_max_times()
        .build()
}

/// A task's process in a warm container.
pub struct Exec {
    pub id: String,
    pub output: OutputStream,
    pub input: Option<StdinWriter>,
}

impl Sandbox {
    /// Hands a running container (a warm one, or the task's own) its task: runs
    /// the prelude as a process of its own in it, with the task's environment,
    /// attached to its output (and stdin, if it has one). With `rename` (a warm
    /// one), renames the container `sr-<task_id>` meanwhile, so it is found by
    /// name like a cold one.
    pub async fn exec_task(
        &self,
        container: &str,
        spec: &ContainerSpec<'_>,
        rename: bool,
    ) -> Result<Exec, SandboxError> {
        let config = CreateExecOptions {
            attach_stdin: Some(spec.stdin),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(false),
            env: Some(task_env(spec.env)),
            cmd: Some(spec.prelude()),
            user: Some(self.limits.user.clone()),
            working_dir: Some("/workspace".to_owned()),
            ..Default::default()
        };
        let rename = async {
            if !rename {
                return Ok(());
            }
            let opts = RenameContainerOptionsBuilder::default()
                .name(&spec.container_name())
                .build();
            self.docker.rename_container(container, opts).await
        };
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
            (_, StartExecResults::Detached) => Err(SandboxError::ExecDetached),
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
        let max = Duration::from_millis(10);
        let mut pauses = polls(max);
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
            tokio::time::sleep(pauses.next().unwrap_or(max)).await;
        }
    }

    /// Waits for a task's process in a warm container to exit, once its output
    /// has ended; returns its exit code. The output can end a moment before the
    /// engine records the exit, so this asks a few times; a process that closed
    /// its output early is waited for as long as it runs.
    pub async fn exec_exit(&self, exec: &str) -> Result<i64, SandboxError> {
        let max = Duration::from_millis(100);
        let mut pauses = polls(max);
        loop {
            if let Some(code) = self.exec_code(exec).await? {
                return Ok(code);
            }
            tokio::time::sleep(pauses.next().unwrap_or(max)).await;
        }
    }

    /// The exit code of a task's process in a warm container, if it has exited.
    /// One that ended without a code never ran, or its container was stopped
    /// under it: an error, never a made-up code.
    pub async fn exec_code(&self, exec: &str) -> Result<Option<i64>, SandboxError> {
        let state = self.docker.inspect_exec(exec).await?;
        match (state.running, state.exit_code) {
            (Some(false), Some(code)) => Ok(Some(code)),
            (Some(false), None) => Err(SandboxError::ExecEndedWithoutCode),
            _ => Ok(None),
        }
    }
}
