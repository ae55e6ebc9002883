//! `Sandbox::exec_started` against the real engine.
//!
//! A warm task is an exec in a pool container. The engine answers the exec's
//! start as soon as it has taken the connection over, before the runtime has
//! started the process; when that start fails (the container's init died a
//! moment before, and the engine had not noticed), the engine writes its
//! complaint into the output stream and gives the exec exit code 126 without a
//! process. Taken at face value that is a task that ran and failed; the worker
//! must see that nothing ran, so the task gets a cold container instead. And it
//! must never take an exec that did run (however briefly) for one that did not:
//! the task would run twice.
//!
//! The container's init cannot be made to die at the exact moment an exec starts,
//! so the failed start is produced another way the engine reports identically
//! (an exec whose working directory does not exist).

use std::collections::HashMap;
use std::process::Command;

use bollard::Docker;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::CreateContainerOptionsBuilder;
use futures_util::StreamExt;
use script_runner_worker::config::SandboxLimits;
use script_runner_worker::sandbox::{Sandbox, SandboxError};

fn runtime_image() -> String {
    std::env::var("TEST_RUNTIME_IMAGE")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| "script-runner-test/python:3.13-trixie".into())
}

/// Removes the test's container however the test ends.
struct Removed(String);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.0]).output();
    }
}

fn limits() -> SandboxLimits {
    SandboxLimits {
        memory_mib: 256,
        cpus: 1.0,
        pids: 64,
        nofile: 1024,
        tmpfs_mib: 16,
        user: "65534:65534".into(),
        disk_mib: 16,
        network: "none".into(),
        bridge: "none".into(),
        firewall: false,
        blocked_cidrs: Vec::new(),
        oci_runtime: None,
    }
}

type Output = std::pin::Pin<
    Box<
        dyn futures_util::Stream<
                Item = Result<bollard::container::LogOutput, bollard::errors::Error>,
            > + Send,
    >,
>;

/// Creates an exec of `cmd` in `container`, attached as the worker attaches a
/// task's; its id.
async fn create_exec(docker: &Docker, container: &str, cmd: &[&str], dir: &str) -> String {
    docker
        .create_exec(
            container,
            CreateExecOptions {
                cmd: Some(cmd.iter().map(|s| (*s).to_owned()).collect()),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                working_dir: Some(dir.to_owned()),
                user: Some("65534:65534".into()),
                ..Default::default()
            },
        )
        .await
        .expect("create exec")
        .id
}

/// Starts exec `id`; its output, unread.
async fn start(docker: &Docker, id: &str) -> Output {
    let StartExecResults::Attached { output, .. } =
        docker.start_exec(id, None).await.expect("start exec")
    else {
        panic!("exec started detached");
    };
    output
}

/// Creates and starts an exec; its id and its output, unread.
async fn start_exec(docker: &Docker, container: &str, cmd: &[&str], dir: &str) -> (String, Output) {
    let id = create_exec(docker, container, cmd, dir).await;
    let output = start(docker, &id).await;
    (id, output)
}

/// Everything an exec wrote, once it is done.
async fn read_all(mut output: Output) -> String {
    let mut text = String::new();
    while let Some(Ok(frame)) = output.next().await {
        text.push_str(&String::from_utf8_lossy(&frame.into_bytes()));
    }
    text
}

#[tokio::test]
async fn an_exec_the_engine_could_not_start_is_told_apart_from_one_that_ran() {
    let docker = Docker::connect_with_local_defaults()
        .expect("docker")
        .negotiate_version()
        .await
        .expect("docker version");
    let name = format!("sr-test-exec-start-{}", uuid::Uuid::new_v4().simple());
    let body = ContainerCreateBody {
        image: Some(runtime_image()),
        cmd: Some(vec!["sleep".into(), "300".into()]),
        user: Some("65534:65534".into()),
        host_config: Some(HostConfig {
            init: Some(true),
            network_mode: Some("none".into()),
            ..Default::default()
        }),
        labels: Some(HashMap::from([("script-runner.test".into(), name.clone())])),
        ..Default::default()
    };
    let opts = CreateContainerOptionsBuilder::default().name(&name).build();
    let id = docker
        .create_container(Some(opts), body)
        .await
        .expect("create container")
        .id;
    let _removed = Removed(id.clone());
    docker
        .start_container(&id, None)
        .await
        .expect("start container");
    let sandbox = Sandbox::connect(limits(), "exec-start-test".into())
        .await
        .expect("sandbox");

    // The engine answers an exec's start before it even marks the exec running
    // (it takes the connection over first), so the worker can ask while the
    // exec still looks as it did before the start: no process, no exit code.
    // That is a process about to start, not one that never will (the task
    // would run twice); here that moment is held for a while.
    let pending = create_exec(&docker, &id, &["sh", "-c", "echo ran"], "/").await;
    let (started, output) = tokio::join!(sandbox.exec_started(&pending), async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        start(&docker, &pending).await
    });
    assert!(
        started.is_ok(),
        "an exec asked about before it started: {started:?}"
    );
    assert_eq!(read_all(output).await, "ran\n");

    // And at once after the start, as the worker asks.
    let (ran, output) = start_exec(&docker, &id, &["sh", "-c", "echo ran"], "/").await;
    let started = sandbox.exec_started(&ran).await;
    assert!(started.is_ok(), "an exec asked about at once: {started:?}");
    assert_eq!(read_all(output).await, "ran\n");

    // A process that ran and was gone before the question (its exit code is 126
    // too, the code the engine gives a failed start) is still one that started.
    let (ran, output) = start_exec(&docker, &id, &["sh", "-c", "echo ran; exit 126"], "/").await;
    assert_eq!(read_all(output).await, "ran\n");
    let started = sandbox.exec_started(&ran).await;
    assert!(started.is_ok(), "an exec that ran: {started:?}");
    assert_eq!(sandbox.exec_code(&ran).await.expect("exit code"), Some(126));

    // One the runtime could not start, asked at once and after the engine's
    // complaint came through the output (as a task's output would).
    let (failed, output) = start_exec(&docker, &id, &["true"], "/nonexistent").await;
    let started = sandbox.exec_started(&failed).await;
    assert!(
        matches!(started, Err(SandboxError::ExecNotStarted)),
        "an exec that never started: {started:?}"
    );
    let out = read_all(output).await;
    assert!(
        out.contains("exec failed"),
        "the engine's complaint: {out:?}"
    );
    let started = sandbox.exec_started(&failed).await;
    assert!(
        matches!(started, Err(SandboxError::ExecNotStarted)),
        "an exec that never started, asked again: {started:?}"
    );
}
