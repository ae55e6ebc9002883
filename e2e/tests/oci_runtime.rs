//! `TASK_OCI_RUNTIME`: task containers under another OCI runtime (gVisor's
//! `runsc`), and a worker that refuses to start when the engine lacks the one
//! it is told to use. Real worker, real Redis, real Docker engine.

use std::process::Command;
use std::time::Duration;

use script_runner_e2e::*;
use serde_json::json;

/// The runtime the gVisor test asks for: `TEST_OCI_RUNTIME`, else `runsc`
/// (scripts/test.sh registers it).
fn gvisor_runtime() -> String {
    std::env::var("TEST_OCI_RUNTIME")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| "runsc".into())
}

/// The runtimes the engine lists (`docker info`).
fn engine_runtimes() -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "info",
            "--format",
            "{{range $k, $v := .Runtimes}}{{$k}} {{end}}",
        ])
        .output()
        .expect("docker info");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

fn docker_out(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().expect("docker");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test]
async fn a_worker_refuses_to_start_under_a_runtime_the_engine_does_not_have() {
    let stack = Stack::start(Options {
        start_worker: false,
        ..Options::default()
    })
    .await;
    let name = stack.worker("nort");
    // Should the worker start after all, what it made goes with the test.
    let _cleanup = RemoveAll(format!("label=script-runner.worker={name}"));
    let env = stack.env_with(&name, &[("TASK_OCI_RUNTIME", "sr-no-such-runtime")]);
    let cfg =
        script_runner_worker::Config::from_lookup(|k| env.get(k).cloned()).expect("worker config");
    let ended = tokio::time::timeout(
        Duration::from_secs(60),
        script_runner_worker::run(cfg, std::future::pending()),
    )
    .await
    .expect("the worker stops at start, not later");
    let error = ended.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        error.contains("TASK_OCI_RUNTIME=sr-no-such-runtime")
            && error.contains("runc")
            && error.contains("daemon.json"),
        "the error names the runtime, what the engine has, and how to register one: {error:?}"
    );
    // It never joined: no heartbeat, no container (not even a pool one).
    let mut r = stack.redis_conn().await;
    let beat: Option<String> = redis::AsyncCommands::get(&mut r, stack.keys().worker(&name))
        .await
        .expect("redis");
    assert_eq!(beat, None);
    assert_eq!(
        docker_ids(&[
            "-a",
            "--filter",
            &format!("label=script-runner.worker={name}")
        ]),
        Vec::<String>::new()
    );
    stack.shutdown().await;
}

/// Removes every container that matches a `docker ps` filter when dropped.
struct RemoveAll(String);

impl Drop for RemoveAll {
    fn drop(&mut self) {
        for id in docker_ids(&["-a", "--filter", &self.0]) {
            let _ = Command::new("docker").args(["rm", "-f", &id]).output();
        }
    }
}

/// A cold `true` (network none: never a pool container), as its record
/// says: (created to started, created to finished) in ms. Started is when the
/// task's process started (claim, create, start, exec); finished adds the
/// script, its end and the record.
async fn cold_true_ms(client: &Client) -> (f64, f64) {
    let s = run_to_end(client, "python3.13", "true", json!({ "network": "none" })).await;
    assert_eq!(s["state"], "succeeded", "{s}");
    let at = |f: &str| {
        let t = s[f].as_str().unwrap_or_default();
        // 2026-12-01T19:19:55.167Z: hours to milliseconds are enough here.
        let hms: Vec<f64> = t
            .get(11..23)
            .unwrap_or_default()
            .split(':')
            .filter_map(|p| p.parse().ok())
            .collect();
        assert_eq!(hms.len(), 3, "{f}: {t}");
        (hms[0] * 3600.0 + hms[1] * 60.0 + hms[2]) * 1000.0
    };
    let created = at("created_at");
    (at("started_at") - created, at("finished_at") - created)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

const STARTS: usize = 9;

#[tokio::test]
async fn tasks_run_under_gvisor_with_timeout_kill_tails_and_the_firewall_intact() {
    let runtime = gvisor_runtime();
    let registered = engine_runtimes();
    if !registered.contains(&runtime) {
        eprintln!(
            "SKIPPED: the engine has no runtime {runtime:?} (it has {registered:?}); \
             scripts/test.sh registers runsc"
        );
        return;
    }
    let mut stack = Stack::start(Options {
        start_worker: false,
        ..Options::default()
    })
    .await;
    // No pool: a warm container always has the collection pipe mounted, and
    // Debian's runsc (2022) cannot mount a fifo (docs/sandbox.md), so every
    // task here is a cold start.
    stack
        .start_worker(
            "gvisor",
            &[
                ("TASK_OCI_RUNTIME", &runtime),
                ("POOL_SIZE", "0"),
                ("EGRESS_POOL_SIZE", "0"),
            ],
        )
        .await;
    let client = stack.client().await;

    // The task's container is created with the runtime.
    let id = start_sleeper(&client, "up").await;
    assert_eq!(
        docker_out(&[
            "inspect",
            "-f",
            "{{.HostConfig.Runtime}}",
            &format!("sr-{id}")
        ]),
        runtime
    );
    // kill_task still ends it.
    call_ok(&client, "kill_task", json!({ "task_id": id })).await;
    let killed = wait_status(&client, &id, "the kill", Duration::from_secs(30), is_final).await;
    assert_eq!(killed["state"], "killed", "{killed}");
    wait_container_gone(&id).await;

    // Tasks with and without a network run on gVisor's kernel, and keep
    // stdout, stderr and the exit code apart.
    let probe = "dmesg | grep -m1 -o gVisor; echo to-err >&2; exit 3";
    for (what, extra) in [
        ("internet", json!({})),
        ("none", json!({ "network": "none" })),
    ] {
        let s = run_to_end(&client, "python3.13", probe, extra).await;
        assert_eq!(
            (
                s["state"].as_str(),
                s["exit_code"].as_i64(),
                s["stdout_tail"].as_str(),
                s["stderr_tail"].as_str()
            ),
            (Some("failed"), Some(3), Some("gVisor\n"), Some("to-err\n")),
            "network {what}: {s}"
        );
        eprintln!("network {what} under {runtime}: usage {}", s["usage"]);
    }

    // What this runsc cannot do, and what it shows: a task with `collect` (its
    // pipe cannot be mounted), and how much of /workspace the worker sees used.
    let collect = run_to_end(
        &client,
        "python3.13",
        "echo hi > out",
        json!({ "collect": ["out"] }),
    )
    .await;
    // (Debian's 2022 build: failed, start-failed, the mount named. A newer
    // gVisor may mount it, so only the end is asserted.)
    assert!(is_final(&collect), "{collect}");
    eprintln!(
        "collect under {runtime}: {} / {} / {}",
        collect["state"], collect["reason_kind"], collect["reason"]
    );
    let written = run_to_end(
        &client,
        "python3.13",
        "head -c 5000000 /dev/zero > /workspace/five-mb",
        json!({}),
    )
    .await;
    assert_eq!(written["state"], "succeeded", "{written}");
    assert!(
        written["usage"]["workspace_bytes"]
            .as_u64()
            .is_some_and(|b| b >= 5_000_000),
        "{written}"
    );

    // The timeout still ends a task.
    let timed = run_to_end(
        &client,
        "python3.13",
        "sleep 60",
        json!({ "timeout_seconds": 2 }),
    )
    .await;
    assert_eq!(timed["state"], "timed-out", "{timed}");

    // Past the memory cap, the task ends (how, is documented: under gVisor the
    // cap holds the sandbox's own memory too).
    let oom = run_to_end(
        &client,
        "python3.13",
        "python3 -c 'b = bytearray(2 * 1024 ** 3); print(len(b))'",
        json!({ "timeout_seconds": 30 }),
    )
    .await;
    assert_ne!(oom["state"], "succeeded", "{oom}");
    eprintln!(
        "over the memory cap under {runtime}: {} / {} / {}",
        oom["state"], oom["reason_kind"], oom["reason"]
    );

    // The firewall still applies: the sandbox's traffic leaves through the task
    // bridge like runc's. The metadata address and a host service (on the
    // bridge's gateway) are refused.
    let gateway = docker_out(&[
        "network",
        "inspect",
        "script-runner-tasks",
        "-f",
        "{{(index .IPAM.Config 0).Gateway}}",
    ]);
    // A service on every host address, as a careless one would listen.
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0")
        .await
        .expect("bind");
    let host_port = listener.local_addr().expect("addr").port();
    let connect = format!(
        "import socket\n\
         for a in [('169.254.169.254', 80), ('{gateway}', {host_port})]:\n\
         \x20   try:\n\
         \x20       socket.create_connection(a, 3); print(a[0], 'reached')\n\
         \x20   except OSError as e:\n\
         \x20       print(a[0], 'refused')\n"
    );
    let net = run_to_end(
        &client,
        "python3.13",
        &format!("python3 - <<'EOF'\n{connect}EOF"),
        json!({}),
    )
    .await;
    assert_eq!(
        net["stdout_tail"].as_str(),
        Some(format!("169.254.169.254 refused\n{gateway} refused\n").as_str()),
        "{net}"
    );
    drop(listener);

    // The cost: cold starts on this worker and on a runc one beside it (a
    // stack of its own), interleaved so the machine's load falls on both alike.
    let runc_stack = Stack::start(Options::default()).await;
    let runc_client = runc_stack.client().await;
    let (mut gvisor, mut runc) = (Vec::new(), Vec::new());
    for _ in 0..STARTS {
        gvisor.push(cold_true_ms(&client).await);
        runc.push(cold_true_ms(&runc_client).await);
    }
    let medians = |v: &[(f64, f64)]| {
        (
            median(v.iter().map(|t| t.0).collect()),
            median(v.iter().map(|t| t.1).collect()),
        )
    };
    let ((rs, rf), (gs, gf)) = (medians(&runc), medians(&gvisor));
    eprintln!(
        "BENCH cold `true` (network none), medians of {STARTS} interleaved, created -> \
         started / -> finished: runc {rs:.0} / {rf:.0} ms, {runtime} {gs:.0} / {gf:.0} ms"
    );
    runc_stack.shutdown().await;
    stack.shutdown().await;
}
