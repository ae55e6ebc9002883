//! A task handed to its container's waiting prelude, against the real engine:
//! the prelude takes the task from its stdin, runs it with the task's stdin,
//! variables and deadline, and reports the script's exit status itself, in
//! markers the worker takes out of the output; and a container whose prelude
//! is gone before the handoff is told apart from one that took the task (the
//! warm path's fallback to a cold start rests on it: a task must never run
//! twice, nor be lost).

// Test code: a failed expectation is a panic (the workspace lints deny these in product code).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

use script_runner_worker::config::SandboxLimits;
use script_runner_worker::sandbox::{
    ContainerSpec, Event, Sandbox, SandboxError, Seen, TaskOutput,
};
use shared::options::Network;

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
        egress_network: "none".into(),
        egress_bridge: "none".into(),
        firewall: false,
        blocked_cidrs: Vec::new(),
        oci_runtime: None,
    }
}

/// What a handed-off task wrote and the markers seen, in order, until its
/// end markers (or the end of the stream).
async fn read_to_end(output: &mut TaskOutput) -> (String, String, Vec<Seen>) {
    let (mut out, mut err, mut seen) = (Vec::new(), Vec::new(), Vec::new());
    let read = async {
        while let Some(Ok(event)) = output.next().await {
            match event {
                Event::Frame(f @ bollard::container::LogOutput::StdErr { .. }) => {
                    err.extend_from_slice(&f.into_bytes())
                }
                Event::Frame(f) => out.extend_from_slice(&f.into_bytes()),
                Event::Marker(m) => {
                    seen.push(m);
                    if seen.iter().any(|s| matches!(s, Seen::Exited(_)))
                        && seen.contains(&Seen::StderrEnd)
                    {
                        break;
                    }
                }
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), read)
        .await
        .expect("the task ended within a minute");
    (
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
        seen,
    )
}

fn spec<'a>(
    task_id: &'a str,
    image: &'a str,
    command: &'a str,
    env: &'a [(String, String)],
) -> ContainerSpec<'a> {
    ContainerSpec {
        task_id,
        image,
        command,
        source: None,
        restore: None,
        workspace: false,
        timeout_seconds: 30,
        env,
        network: Network::None,
        collect: None,
        cache: None,
    }
}

#[tokio::test]
async fn the_prelude_runs_the_handed_task_and_reports_its_exit_status_itself() {
    let sandbox = Sandbox::connect(limits(), "handoff-test".into())
        .await
        .expect("sandbox");
    let image = runtime_image();
    let task_id = format!("handoff-{}", uuid::Uuid::new_v4().simple());
    let env = vec![("GREETING".to_owned(), "it's\nhere".to_owned())];
    let command = "cat; printf '%s' \"$GREETING\"; echo oops >&2; exit 3";
    let spec = spec(&task_id, &image, command, &env);
    let (container, attached) = sandbox.create(&spec).await.expect("container");
    let _removed = Removed(container.clone());
    let mut output = sandbox
        .hand_off(
            &container,
            attached,
            &spec,
            Some(b"from stdin\n".to_vec()),
            false,
        )
        .await
        .expect("the prelude took the task");
    let (out, err, seen) = read_to_end(&mut output).await;
    assert_eq!(out, "from stdin\nit's\nhere");
    assert_eq!(err, "oops\n");
    // The two streams are relayed apart: their end markers come in either order.
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(
        seen.contains(&Seen::Exited(3)) && seen.contains(&Seen::StderrEnd),
        "{seen:?}"
    );
    // The prelude stays, idle, so the container (and its cgroup) is still there
    // to be read after the script's end.
    let state = Command::new("docker")
        .args(["inspect", "-f", "{{.State.Running}}", &container])
        .output()
        .expect("docker inspect");
    assert_eq!(String::from_utf8_lossy(&state.stdout).trim(), "true");
}

#[tokio::test]
async fn a_container_whose_prelude_is_gone_never_takes_the_task() {
    let sandbox = Sandbox::connect(limits(), "handoff-test".into())
        .await
        .expect("sandbox");
    let image = runtime_image();
    let task_id = format!("handoff-{}", uuid::Uuid::new_v4().simple());
    let spec = spec(&task_id, &image, "echo ran", &[]);
    let (container, attached) = sandbox.create(&spec).await.expect("container");
    let _removed = Removed(container.clone());
    // Died idle (an engine restart, a hand): stopped before its task came.
    let killed = Command::new("docker")
        .args(["kill", &container])
        .output()
        .expect("docker kill");
    assert!(killed.status.success(), "{killed:?}");
    let _ = sandbox.wait(&container).await;
    let handed = sandbox
        .hand_off(&container, attached, &spec, None, false)
        .await;
    assert!(
        matches!(handed, Err(SandboxError::HandoffNotTaken)),
        "{:?}",
        handed.err()
    );
}
