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
    }
}

/// Starts an exec of `cmd` in `container`, attached as the worker attaches a
/// task's; its id and everything it wrote.
async fn start_exec(docker: &Docker, container: &str, cmd: &[&str], dir: &str) -> (String, String) {
    let exec = docker
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
        .expect("create exec");
    let StartExecResults::Attached { mut output, .. } =
        docker.start_exec(&exec.id, None).await.expect("start exec")
    else {
        panic!("exec started detached");
    };
    let mut text = String::new();
    while let Some(Ok(frame)) = output.next().await {
        text.push_str(&String::from_utf8_lossy(&frame.into_bytes()));
    }
    (exec.id, text)
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

    // A process that ran and was gone at once (its exit code is 126 too, the
    // code the engine gives a failed start) is still one that started.
    let (ran, out) = start_exec(&docker, &id, &["sh", "-c", "echo ran; exit 126"], "/").await;
    assert_eq!(out, "ran\n");
    let started = sandbox.exec_started(&ran).await;
    assert!(started.is_ok(), "an exec that ran: {started:?}");
    assert_eq!(sandbox.exec_code(&ran).await.expect("exit code"), Some(126));

    // One the runtime could not start: the engine's complaint came through the
    // output, as a task's would.
    let (failed, out) = start_exec(&docker, &id, &["true"], "/nonexistent").await;
    assert!(
        out.contains("exec failed"),
        "the engine's complaint: {out:?}"
    );
    let started = sandbox.exec_started(&failed).await;
    assert!(
        matches!(started, Err(SandboxError::ExecNotStarted)),
        "an exec that never started: {started:?}"
    );
}
