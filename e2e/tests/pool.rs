//! The warm pool (`POOL_SIZE`), against the real engine: a task taken from the
//! pool runs in a container that was started before it existed, sees nothing
//! of any other task, is hardened exactly like a cold one, gets its zip, stdin,
//! environment and collected files, and the pool refills, empties on shutdown
//! and is cleaned up after a crash.
//!
//! Whether a task ran warm is never guessed: the pool's container ids are read
//! from the engine (label `script-runner.pool`) before the task is submitted,
//! and compared with the container its record names.

use std::process::Command;
use std::time::Duration;

use script_runner_e2e::*;
use serde_json::{Value, json};

/// Every container (any state, any name) carrying worker `worker`'s label.
fn all_containers(worker: &str) -> Vec<String> {
    docker_ids(&[
        "-a",
        "--filter",
        &format!("label=script-runner.worker={worker}"),
    ])
}

/// The count in the series `name` with exactly `labels` in `metrics`.
fn sample(metrics: &str, name: &str, labels: &[(&str, &str)]) -> u64 {
    exposition::read(metrics)
        .count(name, labels)
        .unwrap_or_else(|| panic!("no {name}{labels:?} in:\n{metrics}"))
}

/// Waits until worker `worker` keeps `n` idle containers of `runtime`; their ids.
async fn wait_pool(worker: &str, runtime: &str, n: usize) -> Vec<String> {
    wait_until(
        &format!("{n} idle {runtime} pool containers of {worker}"),
        Duration::from_secs(90),
        || async {
            let ids = pool_containers(worker, runtime);
            (ids.len() == n).then_some(ids)
        },
    )
    .await
}

/// The pool container that served `task_id`, read from the engine's events: a
/// warm container is renamed `sr-<task_id>` when the task claims it (a cold one
/// is created with that name, never renamed). Events since `since` (Unix time).
fn warm_container_of(worker: &str, task_id: &str, since: u64) -> Option<String> {
    let now = unix_now() + 1;
    let out = Command::new("docker")
        .args([
            "events",
            "--since",
            &since.to_string(),
            "--until",
            &now.to_string(),
            "--filter",
            "event=rename",
            "--filter",
            &format!("label=script-runner.worker={worker}"),
            "--format",
            "{{.Actor.ID}} {{.Actor.Attributes.name}}",
        ])
        .output()
        .expect("docker events");
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let (id, name) = l.split_once(' ')?;
        (name == format!("sr-{task_id}")).then(|| id.to_owned())
    })
}

/// The exec events (`exec_create`, `exec_start`) the engine reported for
/// container `id` since `since` (Unix time): a warm task is handed to the
/// container's waiting prelude, with no exec.
fn execs_in(id: &str, since: u64) -> Vec<String> {
    let now = unix_now() + 1;
    let out = Command::new("docker")
        .args([
            "events",
            "--since",
            &since.to_string(),
            "--until",
            &now.to_string(),
            "--filter",
            &format!("container={id}"),
            "--filter",
            "event=exec_create",
            "--filter",
            "event=exec_start",
            "--format",
            "{{.Action}}",
        ])
        .output()
        .expect("docker events");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// A stack whose worker keeps one idle python3.13 container (python3.8 maps to
/// the same image in tests and has no pool: the cold path, side by side), and
/// no egress pool (its container would count in the host directories below).
async fn pooled(extra: &[(&'static str, &str)]) -> Stack {
    let mut env = vec![
        ("POOL_SIZE", "python3.13=1".to_owned()),
        ("EGRESS_POOL_SIZE", "0".to_owned()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    Stack::start(Options {
        concurrency: 2,
        extra_env: env,
        ..Options::default()
    })
    .await
}

/// Runs `command` on the one idle python3.13 container and checks it did.
async fn run_warm(stack: &Stack, client: &Client, command: &str, extra: Value) -> Value {
    let warm = wait_pool(&stack.worker_name, "python3.13", 1).await;
    let since = unix_now();
    let id = run(client, "python3.13", command, extra).await;
    let end = wait_status(
        client,
        &id,
        "the warm task's end",
        Duration::from_secs(90),
        is_final,
    )
    .await;
    assert_eq!(
        warm_container_of(&stack.worker_name, &id, since).as_ref(),
        Some(&warm[0]),
        "the task did not run in the pool's container"
    );
    assert_eq!(
        execs_in(&warm[0], since),
        Vec::<String>::new(),
        "the warm task was run by an exec"
    );
    end
}

#[tokio::test]
async fn a_task_from_the_pool_sees_nothing_of_the_task_before_it() {
    let stack = pooled(&[]).await;
    let client = stack.client().await;
    let write = "echo secret > /workspace/left; echo secret > /tmp/left; \
                 mkdir -p $HOME/.cache && echo secret > $HOME/.cache/left; \
                 (sleep 600 &) ; hostname";
    let first = run_warm(&stack, &client, write, json!({})).await;
    assert_eq!(first["state"], "succeeded", "{first}");
    let look = "ls -A /workspace /tmp; ps -e -o comm= | sort | tr '\\n' ' '; echo; hostname";
    let second = run_warm(&stack, &client, look, json!({})).await;
    assert_eq!(second["state"], "succeeded", "{second}");
    let out = second["stdout_tail"].as_str().unwrap_or_default();
    assert!(!out.contains("left"), "a file of the task before: {out}");
    assert!(
        !out.contains("sleep"),
        "a process of the task before: {out}"
    );
    assert_ne!(
        first["stdout_tail"], second["stdout_tail"],
        "the same container (hostname) served both"
    );
    // Each container is used once and removed after its task.
    for t in [&first, &second] {
        wait_container_gone(t["task_id"].as_str().unwrap_or_default()).await;
    }
    stack.shutdown().await;
}

#[tokio::test]
async fn a_pool_container_is_hardened_exactly_like_a_cold_one() {
    let stack = pooled(&[]).await;
    let client = stack.client().await;
    // The same probe, plus the mounts a script can write to, on both paths.
    let probe = format!(
        "{PRIVILEGES}\ngrep -E ' /(workspace|tmp) ' /proc/mounts | sort\n\
         echo \"pids=$(cat /sys/fs/cgroup/pids.max /sys/fs/cgroup/pids/pids.max 2>/dev/null)\""
    );
    let warm = run_warm(&stack, &client, &probe, json!({})).await;
    let cold = run_to_end(&client, "python3.8", &probe, json!({})).await;
    assert_eq!(warm["state"], "succeeded", "{warm}");
    assert_eq!(cold["state"], "succeeded", "{cold}");
    assert_eq!(
        warm["stdout_tail"], cold["stdout_tail"],
        "a warm container differs from a cold one"
    );
    let out = warm["stdout_tail"].as_str().unwrap_or_default();
    for line in [
        "CapEff:\t0000000000000000",
        "NoNewPrivs:\t1",
        "core=0 hard=0",
        "uid=65534",
        "mount: denied",
        "write-root: denied",
        "chmod-suid: denied",
        "docker-socket: absent",
        "home, workspace, tmp: writable",
    ] {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }
    // What the engine was told: the same host config but for the mounts a warm
    // container gets ahead of time (its source directory and collection pipe).
    let idle = wait_pool(&stack.worker_name, "python3.13", 1).await;
    let sleeper = start_until_output(
        &client,
        "echo up; sleep 600",
        json!({"network": "none"}),
        "up\n",
    )
    .await;
    let host_config = |container: &str| {
        let out = Command::new("docker")
            .args(["inspect", "--format", "{{json .HostConfig}}", container])
            .output()
            .expect("docker inspect");
        let mut v: Value = serde_json::from_slice(&out.stdout).expect("host config JSON");
        for field in ["Binds", "NetworkMode"] {
            v[field] = Value::Null;
        }
        v
    };
    let cold_config = host_config(&format!("sr-{sleeper}"));
    assert_eq!(
        host_config(&idle[0]),
        cold_config,
        "the engine runs a warm container differently"
    );
    assert_eq!(cold_config["PidsLimit"], 256, "{cold_config}");
    call_ok(&client, "kill_task", json!({"task_id": sleeper})).await;
    // The host and its private networks are out of reach from a warm container
    // too: the host's Redis (bound to loopback and published nowhere) by the
    // gateway, and a cloud metadata address.
    let reach = "python3 -c \"import socket\nfor h in ('172.17.0.1', '169.254.169.254'):\n  \
                 try:\n    socket.create_connection((h, 22), timeout=3).close(); print(h, 'REACHED')\n  \
                 except OSError: print(h, 'blocked')\"";
    let net = run_warm(&stack, &client, reach, json!({})).await;
    assert_eq!(
        net["stdout_tail"], "172.17.0.1 blocked\n169.254.169.254 blocked\n",
        "{net}"
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn zip_stdin_env_and_collect_work_on_a_warm_container() {
    let stack = pooled(&[]).await;
    let client = stack.client().await;
    let zip = zip_of(&[
        (
            "run.sh",
            "#!/bin/sh\necho \"ran with $(cat data/input.txt)\"\n",
        ),
        ("data/input.txt", "the zip's data"),
    ]);
    let stdin: Vec<u8> = (0..=255u8).cycle().take(1 << 20).collect();
    let command = "sh ./run.sh; python3 -c \"import sys; d = sys.stdin.buffer.read(); \
                   print(len(d), sum(i * b for i, b in enumerate(d)) % 1000003)\"; \
                   echo \"$GREETING\"; mkdir -p out && echo made > out/result.txt";
    let end = run_warm(
        &stack,
        &client,
        command,
        json!({
            "zip_base64": b64(&zip),
            "stdin_base64": b64(&stdin),
            "env": {"GREETING": "hello from env"},
            "collect": ["out"],
        }),
    )
    .await;
    assert_eq!(end["state"], "succeeded", "{end}");
    // Length and a position-weighted sum: bytes lost, added or reordered show.
    let weighted = stdin
        .iter()
        .enumerate()
        .map(|(i, b)| i as u64 * u64::from(*b))
        .sum::<u64>()
        % 1_000_003;
    let digest = format!("{} {weighted}", stdin.len());
    assert_eq!(
        end["stdout_tail"],
        format!("ran with the zip's data\n{digest}\nhello from env\n")
    );
    let files = call_ok(
        &client,
        "get_task_files",
        json!({"task_id": end["task_id"]}),
    )
    .await;
    assert_eq!(files["files"][0]["name"], "out/result.txt", "{files}");
    // The pool container's host directory (with the zip's files) goes with it.
    let pool_dir = stack
        .tasks_dir()
        .join(format!("pool-{}", stack.worker_name));
    wait_until(
        "only the idle container's directory left",
        Duration::from_secs(30),
        || async {
            let left = std::fs::read_dir(&pool_dir).map(|d| d.count()).unwrap_or(0);
            (left <= 1).then_some(())
        },
    )
    .await;
    // TASKS_DIR and each pool container's directory are the worker's alone; the
    // task's user reaches its source directory and pipe through its mounts only,
    // and the pipe is the task user's, open to no one else.
    let idle = wait_pool(&stack.worker_name, "python3.13", 1).await;
    let stat = |p: &std::path::Path| {
        use std::os::unix::fs::MetadataExt;
        let m =
            std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("stat {}: {e}", p.display()));
        (m.uid(), m.gid(), m.mode() & 0o7777)
    };
    assert_eq!(idle.len(), 1);
    let dirs: Vec<_> = std::fs::read_dir(&pool_dir)
        .expect("pool directory")
        .filter_map(|e| Some(e.ok()?.path()))
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let idle_dir = &dirs[0];
    assert_eq!(stat(stack.tasks_dir()), (0, 0, 0o700), "TASKS_DIR");
    assert_eq!(
        stat(idle_dir),
        (0, 0, 0o700),
        "a pool container's directory"
    );
    assert_eq!(stat(&idle_dir.join("src")).2, 0o755, "its source directory");
    assert_eq!(
        stat(&idle_dir.join("collect")),
        (65534, 65534, 0o600),
        "its collection pipe"
    );
    // A cold task's pipe likewise (`network: "none"` never runs warm), and
    // collecting through it works.
    let cold = start_until_output(
        &client,
        "mkdir out && echo cold > out/r.txt && echo up && sleep 2",
        json!({"network": "none", "collect": ["out"]}),
        "up\n",
    )
    .await;
    let pipe = stack.tasks_dir().join(format!("{cold}.collect"));
    assert_eq!(stat(&pipe), (65534, 65534, 0o600), "a cold task's pipe");
    let end = wait_status(
        &client,
        &cold,
        "the cold task",
        Duration::from_secs(60),
        is_final,
    )
    .await;
    assert_eq!(end["state"], "succeeded", "{end}");
    let files = call_ok(&client, "get_task_files", json!({"task_id": cold})).await;
    assert_eq!(files["files"][0]["name"], "out/r.txt", "{files}");
    stack.shutdown().await;
}

#[tokio::test]
async fn exit_codes_timeouts_kills_and_oom_read_as_on_the_cold_path() {
    let stack = pooled(&[
        ("TASK_MEMORY_MB", "128"),
        ("TASK_DISK_MB", "32"),
        ("TASK_TMPFS_MB", "32"),
    ])
    .await;
    let client = stack.client().await;
    let failed = run_warm(&stack, &client, "echo oops >&2; exit 3", json!({})).await;
    assert_eq!(failed["state"], "failed");
    assert_eq!(failed["exit_code"], 3);
    assert_eq!(failed["stderr_tail"], "oops\n");
    // A background child that keeps the output open does not hold the task:
    // the task ends with its script, as a cold container's would.
    let child = run_warm(
        &stack,
        &client,
        "sleep 600 & echo parent done",
        json!({"timeout_seconds": 60}),
    )
    .await;
    assert_eq!(child["state"], "succeeded", "{child}");
    let timed = run_warm(
        &stack,
        &client,
        "echo start; sleep 600",
        json!({"timeout_seconds": 2}),
    )
    .await;
    assert_eq!(timed["state"], "timed-out", "{timed}");
    let oom = run_warm(
        &stack,
        &client,
        "python3 -c \"b = bytearray(512 * 1024 * 1024); print(len(b))\"",
        json!({}),
    )
    .await;
    assert_eq!(oom["state"], "failed", "{oom}");
    assert_eq!(oom["reason"], "out of memory (limit 128 MiB)", "{oom}");
    // kill_task on a warm task stops its container.
    let warm = wait_pool(&stack.worker_name, "python3.13", 1).await;
    let since = unix_now();
    let id = start_until_output(&client, "echo up; sleep 600", json!({}), "up\n").await;
    assert_eq!(
        warm_container_of(&stack.worker_name, &id, since),
        Some(warm[0].clone())
    );
    call_ok(&client, "kill_task", json!({"task_id": id})).await;
    let killed = wait_status(&client, &id, "killed", Duration::from_secs(30), is_final).await;
    assert_eq!(killed["state"], "killed", "{killed}");
    wait_container_gone(&id).await;
    stack.shutdown().await;
}

/// The prelude reports the script's end itself; one that is gone before it
/// could (the OOM killer may pick it, or anything that kills it) must still
/// give its task an end, from the engine.
#[tokio::test]
async fn a_task_whose_prelude_is_killed_before_it_reports_still_ends() {
    let stack = pooled(&[]).await;
    let client = stack.client().await;
    // The script's parent is `timeout`, whose parent is the prelude (the image
    // has no `ps`: /proc says).
    let command = "echo before; read -r _ _ _ pp _ < /proc/$PPID/stat; kill -9 $pp; sleep 600";
    let end = run_warm(&stack, &client, command, json!({"timeout_seconds": 120})).await;
    assert_eq!(end["state"], "failed", "{end}");
    assert_eq!(end["exit_code"], 137, "{end}");
    assert_eq!(end["stdout_tail"], "before\n", "{end}");
    wait_container_gone(end["task_id"].as_str().unwrap_or_default()).await;
    stack.shutdown().await;
}

#[tokio::test]
async fn a_task_without_network_never_runs_on_a_pool_container() {
    let stack = pooled(&[]).await;
    let client = stack.client().await;
    let warm = wait_pool(&stack.worker_name, "python3.13", 1).await;
    let since = unix_now();
    let end = run_to_end(
        &client,
        "python3.13",
        "ls /sys/class/net | tr '\\n' ' '",
        json!({"network": "none"}),
    )
    .await;
    assert_eq!(end["state"], "succeeded", "{end}");
    assert_eq!(end["stdout_tail"], "lo ");
    let id = end["task_id"].as_str().unwrap_or_default();
    assert_eq!(warm_container_of(&stack.worker_name, id, since), None);
    assert_eq!(
        pool_containers(&stack.worker_name, "python3.13"),
        warm,
        "the pool was used"
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn the_pool_refills_after_a_burst() {
    let metrics_port = free_port();
    let stack = Stack::start(Options {
        concurrency: 4,
        extra_env: vec![
            ("POOL_SIZE", "python3.13=2".to_owned()),
            // Only this pool's containers, so its counts are exact.
            ("EGRESS_POOL_SIZE", "0".to_owned()),
            ("WORKER_METRICS_ADDR", format!("127.0.0.1:{metrics_port}")),
        ],
        ..Options::default()
    })
    .await;
    let client = stack.client().await;
    let before = wait_pool(&stack.worker_name, "python3.13", 2).await;
    let since = unix_now();
    let mut ids = Vec::new();
    for i in 0..8 {
        ids.push(run(&client, "python3.13", &format!("echo {i}"), json!({})).await);
    }
    let mut containers = Vec::new();
    for id in &ids {
        let end = wait_status(
            &client,
            id,
            "the burst's end",
            Duration::from_secs(120),
            is_final,
        )
        .await;
        assert_eq!(end["state"], "succeeded", "{end}");
        containers.extend(warm_container_of(&stack.worker_name, id, since));
    }
    for c in &before {
        assert!(
            containers.contains(c),
            "pool container {c} served no task of the burst"
        );
    }
    let mut unique = containers.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        containers.len(),
        "a container served two tasks"
    );
    let after = wait_pool(&stack.worker_name, "python3.13", 2).await;
    // The worker's metrics tell the same story.
    let metrics = worker_metrics(metrics_port).await;
    let sample = |name: &str, labels: &[(&str, &str)]| sample(&metrics, name, labels);
    let warm = sample(
        "script_runner_worker_pool_claims_total",
        &[("path", "warm")],
    );
    let cold = sample(
        "script_runner_worker_pool_claims_total",
        &[("path", "cold")],
    );
    assert_eq!(
        (warm + cold, warm as usize),
        (8, containers.len()),
        "{metrics}"
    );
    // Every task is handed to a prelude: in a warm container or in its own.
    assert_eq!(
        sample("script_runner_worker_container_handoff_seconds_count", &[]),
        warm + cold
    );
    assert_eq!(
        sample(
            "script_runner_worker_pool_idle",
            &[("runtime", "python3.13"), ("network", "internet")]
        ),
        2
    );
    assert!(
        after.iter().all(|c| !before.contains(c)),
        "the pool was not refilled with new containers"
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn a_stopping_worker_removes_its_pool_and_a_restarted_one_removes_a_crashed_ones() {
    let mut stack = Stack::start(Options {
        start_worker: false,
        ..Options::default()
    })
    .await;
    let name = stack.worker("pooled");
    let env = [("POOL_SIZE", "python3.13=2,node24=1")];
    let mut crashed = stack.spawn_worker_process("pooled", &env).await;
    let old_python = wait_pool(&name, "python3.13", 2).await;
    let old_node = wait_pool(&name, "node24", 1).await;
    crashed.kill();
    // The crash left them running.
    assert_eq!(pool_containers(&name, "python3.13"), old_python);
    stack.drop_heartbeat("pooled").await;
    let restarted = stack.spawn_worker_process("pooled", &env).await;
    wait_until(
        "the crashed run's pool containers removed",
        Duration::from_secs(60),
        || async {
            let now = all_containers(&name);
            old_python
                .iter()
                .chain(&old_node)
                .all(|c| !now.contains(c))
                .then_some(())
        },
    )
    .await;
    wait_pool(&name, "python3.13", 2).await;
    wait_pool(&name, "node24", 1).await;
    restarted.terminate();
    assert!(
        restarted.exited_cleanly().await,
        "the worker did not stop cleanly"
    );
    assert_eq!(
        all_containers(&name),
        Vec::<String>::new(),
        "a stopped worker left containers"
    );
    let pool_dir = stack.tasks_dir().join(format!("pool-{name}"));
    let left = std::fs::read_dir(&pool_dir).map(|d| d.count()).unwrap_or(0);
    assert_eq!(left, 0, "pool directories left in {}", pool_dir.display());
    stack.shutdown().await;
}

#[tokio::test]
async fn a_pool_container_that_died_idle_costs_a_cold_start_not_the_task() {
    let metrics_port = free_port();
    let stack = pooled(&[("WORKER_METRICS_ADDR", &format!("127.0.0.1:{metrics_port}"))]).await;
    let client = stack.client().await;
    let idle = wait_pool(&stack.worker_name, "python3.13", 1).await;
    // As an engine restart or an operator's hand would: the worker still holds
    // it as idle.
    let killed = Command::new("docker")
        .args(["kill", &idle[0]])
        .output()
        .expect("docker kill");
    assert!(killed.status.success(), "{killed:?}");
    let end = run_to_end(&client, "python3.13", "echo still ran", json!({})).await;
    assert_eq!(end["state"], "succeeded", "{end}");
    assert_eq!(end["stdout_tail"], "still ran\n");
    let metrics = worker_metrics(metrics_port).await;
    assert_eq!(
        [
            sample(
                &metrics,
                "script_runner_worker_pool_claims_total",
                &[("path", "fallback")]
            ),
            sample(
                &metrics,
                "script_runner_worker_pool_claims_total",
                &[("path", "warm")]
            ),
        ],
        [1, 0],
        "{metrics}"
    );
    // The dead one is removed and replaced.
    wait_until(
        "the dead pool container removed",
        Duration::from_secs(30),
        || async { (!all_containers(&stack.worker_name).contains(&idle[0])).then_some(()) },
    )
    .await;
    let fresh = wait_pool(&stack.worker_name, "python3.13", 1).await;
    assert_ne!(fresh, idle);
    stack.shutdown().await;
}

#[tokio::test]
async fn an_idle_container_past_its_age_is_replaced() {
    let stack = pooled(&[("POOL_MAX_AGE_SECONDS", "10")]).await;
    let first = wait_pool(&stack.worker_name, "python3.13", 1).await;
    let replaced = wait_until(
        "the idle container replaced after 10 s",
        Duration::from_secs(60),
        || async {
            let now = pool_containers(&stack.worker_name, "python3.13");
            (now.len() == 1 && now != first).then_some(now)
        },
    )
    .await;
    assert!(
        !all_containers(&stack.worker_name).contains(&first[0]),
        "the old one was not removed"
    );
    // The fresh one serves the next task.
    let client = stack.client().await;
    let since = unix_now();
    let end = run_to_end(&client, "python3.13", "echo fresh", json!({})).await;
    let id = end["task_id"].as_str().unwrap_or_default();
    assert_eq!(
        warm_container_of(&stack.worker_name, id, since),
        Some(replaced[0].clone())
    );
    stack.shutdown().await;
}

/// Found by the fault run (tests/reliability/faults.py): a reaper settling a
/// dead worker removed the pool containers of that worker's next life, started
/// under the same name while the reaper was still at it. A reaper removes only
/// what a dead worker made before it fell silent.
#[tokio::test]
async fn a_reaper_removes_a_dead_worker_s_pool_but_not_what_its_next_life_made() {
    let mut stack = Stack::start(Options {
        start_worker: false,
        ..Options::default()
    })
    .await;
    let name = stack.worker("doomed");
    let mut doomed = stack
        .spawn_worker_process(
            "doomed",
            &[
                ("POOL_SIZE", "python3.13=1"),
                // Its one pool container, made before the second below.
                ("EGRESS_POOL_SIZE", "0"),
                ("WORKER_HEARTBEAT_SECONDS", "1"),
            ],
        )
        .await;
    let old = wait_pool(&name, "python3.13", 1).await;
    // The engine stamps a container's creation in whole seconds: let the worker
    // fall silent in a later second than its pool container was made.
    let made = unix_now();
    wait_until("the next second", Duration::from_secs(5), || async {
        (unix_now() > made).then_some(())
    })
    .await;
    doomed.kill();
    // The reaper passes every 2 s and settles a worker once it has seen its
    // heartbeat missing for 6 s.
    stack
        .start_worker(
            "reaper",
            &[
                ("WORKER_HEARTBEAT_SECONDS", "6"),
                ("POOL_SIZE", "0"),
                ("EGRESS_POOL_SIZE", "0"),
            ],
        )
        .await;
    stack.wait_reaper_suspects(&name).await;

    // Its next life makes a pool container while the reaper is still waiting to
    // settle the old one (the next life's heartbeat is what the reaper would
    // look at again; the race is between that look and the removal, so the
    // container stands for it here without a heartbeat).
    let next = Command::new("docker")
        .args([
            "run",
            "-d",
            "--name",
            &format!("sr-pool-{}", uuid::Uuid::new_v4().simple()),
            "--label",
            &format!("script-runner.worker={name}"),
            "--label",
            "script-runner.pool=python3.13",
            "--network",
            "none",
            &runtime_image(),
            "sleep",
            "300",
        ])
        .output()
        .expect("docker run");
    assert!(next.status.success(), "{next:?}");
    let next = String::from_utf8_lossy(&next.stdout).trim().to_owned();

    wait_until(
        "the dead worker's own pool container removed",
        Duration::from_secs(60),
        || async { (!all_containers(&name).contains(&old[0])).then_some(()) },
    )
    .await;
    stack.wait_forgotten(&name).await;
    assert_eq!(
        all_containers(&name),
        vec![next],
        "the reaper removed what the worker's next life made"
    );
    stack.shutdown().await;
}
