//! The operators' view: `script-runner-ctl` (the built binary, from
//! `cargo build --bins`) against a real stack running real tasks, `top` in a
//! real terminal (tmux), and the Grafana dashboard against the metrics a real
//! api and worker serve.

mod common;

use std::collections::BTreeSet;
use std::process::{Command, Output};
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

fn repo_path(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
}

fn ctl_bin() -> String {
    let bin = std::env::var("SCRIPT_RUNNER_CTL_BIN").unwrap_or_else(|_| {
        repo_path("target/debug/script-runner-ctl")
            .display()
            .to_string()
    });
    assert!(
        std::path::Path::new(&bin).exists(),
        "{bin} is missing: run `cargo build --bins` first"
    );
    bin
}

/// Options for a stack whose worker heartbeats every second and serves its
/// metrics on `metrics_port`.
fn ops_options(metrics_port: u16) -> Options {
    Options {
        extra_env: vec![
            ("WORKER_HEARTBEAT_SECONDS", "3".to_owned()),
            ("WORKER_METRICS_ADDR", format!("127.0.0.1:{metrics_port}")),
        ],
        ..Options::default()
    }
}

/// A Redis URL for a user that may only read (`+@read +time`), as the README
/// says is enough for the ctl; made on first use.
async fn read_only_url(stack: &Stack) -> String {
    let mut r = stack.redis_conn().await;
    let () = redis::cmd("ACL")
        .arg(&["SETUSER", "ops", "on", ">ops-pass", "~*", "resetchannels"])
        .arg(&["-@all", "+@read", "+time"])
        .query_async(&mut r)
        .await
        .expect("ACL SETUSER");
    format!("redis://ops:ops-pass@127.0.0.1:{}", stack.redis.port)
}

/// Runs the ctl with this stack's Redis (as a read-only user) and prefix, and
/// nothing else.
async fn ctl(stack: &Stack, args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new(ctl_bin());
    cmd.env_clear()
        .env("REDIS_URL", read_only_url(stack).await)
        .env("REDIS_KEY_PREFIX", &stack.prefix)
        .args(args)
        .kill_on_drop(true);
    tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("script-runner-ctl {args:?} did not end within 60 s"))
        .expect("script-runner-ctl runs")
}

async fn ctl_json(stack: &Stack, args: &[&str]) -> Value {
    let out = ctl(stack, args).await;
    assert!(
        out.status.success(),
        "ctl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "ctl {args:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// `finished_last_hour` as `state/reason_kind -> count`.
fn finished(status: &Value) -> Vec<(String, u64)> {
    status["finished_last_hour"]
        .as_array()
        .expect("finished_last_hour")
        .iter()
        .map(|f| {
            (
                format!(
                    "{}/{}",
                    f["state"].as_str().unwrap_or_default(),
                    f["reason_kind"].as_str().unwrap_or_default()
                ),
                f["count"].as_u64().unwrap_or_default(),
            )
        })
        .collect()
}

fn owned(pairs: &[(&str, u64)]) -> Vec<(String, u64)> {
    pairs.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect()
}

#[tokio::test]
async fn status_and_task_report_what_the_tasks_did() {
    let stack = Stack::start(ops_options(free_port())).await;
    let client = stack.client().await;
    let ok = run_to_end(&client, "python3.13", "echo out; echo err >&2", json!({})).await;
    let ok_id = ok["task_id"].as_str().expect("id").to_owned();
    run_to_end(&client, "python3.13", "exit 3", json!({})).await;
    let killed = start_sleeper(&client, "first").await;
    call_ok(&client, "kill_task", json!({ "task_id": killed })).await;
    // A chatty task first (the older stream entry), then a silent one.
    let chatty = run(
        &client,
        "python3.13",
        "while true; do echo .; sleep 0.2; done",
        json!({}),
    )
    .await;
    wait_status(
        &client,
        &chatty,
        "the chatty task's output",
        Duration::from_secs(60),
        |s| s["stdout_bytes"].as_u64().is_some_and(|n| n > 0),
    )
    .await;
    let sleeper = start_sleeper(&client, "second").await;

    // Three ended; two running on the only worker (both its slots busy), the
    // silent one clearly silent longer than the chatty one.
    let worker = stack.worker_name.clone();
    let silence = |s: &Value, id: &str| -> Option<f64> {
        s["running"]
            .as_array()?
            .iter()
            .find(|t| t["task_id"] == id)?["seconds_since_last_output"]
            .as_f64()
    };
    let status = wait_until(
        "ctl status to show the worker busy with both tasks, the sleeper silent, and three ended tasks",
        Duration::from_secs(30),
        || async {
            let s = ctl_json(&stack, &["status", "--json"]).await;
            let w = &s["workers"][0];
            let silent = silence(&s, &sleeper)? > silence(&s, &chatty)? + 1.0;
            let ready = w["name"] == worker.as_str()
                && w["slots_busy"] == 2
                && finished(&s).len() == 3
                && silent;
            ready.then_some(s)
        },
    )
    .await;
    let w = &status["workers"][0];
    assert_eq!(
        status["workers"].as_array().map(Vec::len),
        Some(1),
        "{status}"
    );
    assert_eq!(w["alive"], true);
    assert_eq!(w["slots_total"], 2);
    assert_eq!(w["jobs_held"], 2);
    assert_eq!(w["version"], env!("CARGO_PKG_VERSION"));
    assert!(w["host"].as_str().is_some_and(|h| !h.is_empty()), "{w}");
    let ago = w["last_heartbeat_seconds_ago"]
        .as_f64()
        .expect("heartbeat age");
    assert!((0.0..=3.0).contains(&ago), "{w}");
    assert_eq!(
        status["queue"],
        json!({ "waiting": 0, "held": 2, "in_stream": 2 })
    );
    let running = status["running"].as_array().expect("running");
    assert_eq!(running.len(), 2, "{status}");
    // The stuck-looking one first, though its job is the newer one.
    assert_eq!(running[0]["task_id"], sleeper.as_str(), "{status}");
    assert_eq!(running[1]["task_id"], chatty.as_str(), "{status}");
    assert_eq!(running[0]["state"], "running");
    assert_eq!(running[0]["worker"], worker.as_str());
    assert_eq!(running[0]["runtime"], "python3.13");
    assert_eq!(running[0]["stdout_bytes"], "second\n".len());
    assert!(
        running[0]["runtime_seconds"]
            .as_f64()
            .is_some_and(|s| s >= 0.0)
    );
    assert_eq!(
        finished(&status),
        owned(&[
            ("failed/exited", 1),
            ("killed/killed-by-user", 1),
            ("succeeded/exited", 1)
        ])
    );
    assert_eq!(status["finished_last_hour_total"], 3);

    // The text form says the same.
    let text = ctl(&stack, &["status"]).await;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains(&sleeper) && text.contains(&worker), "{text}");
    assert!(text.contains("Finished in the last hour: 3"), "{text}");
    call_ok(&client, "kill_task", json!({ "task_id": chatty })).await;

    // One task's record and tails.
    let t = ctl_json(&stack, &["task", &ok_id, "--json"]).await;
    assert_eq!(t["state"], "succeeded");
    assert_eq!(t["exit_code"], 0);
    assert_eq!(t["reason"], "exited with code 0");
    assert_eq!(t["reason_kind"], "exited");
    assert_eq!(t["worker"], worker.as_str());
    assert_eq!(t["command"], "echo out; echo err >&2");
    assert_eq!(
        (t["stdout_tail"].clone(), t["stderr_tail"].clone()),
        (json!("out\n"), json!("err\n"))
    );
    assert_eq!(
        (t["stdout_bytes"].clone(), t["stderr_bytes"].clone()),
        (json!(4), json!(4))
    );
    assert!(
        t["expires_in_seconds"].as_i64().is_some_and(|s| s > 0),
        "{t}"
    );
    let text = ctl(&stack, &["task", &ok_id]).await;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("--- stdout (4 bytes) ---\nout\n"), "{text}");
    let missing = ctl(&stack, &["task", "00000000-0000-4000-8000-000000000000"]).await;
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no task"));

    // --follow prints the output as it grows and ends with the task.
    let ticking = run(
        &client,
        "python3.13",
        "for i in 1 2 3 4 5; do echo tick$i; sleep 0.5; done; echo bye >&2",
        json!({}),
    )
    .await;
    let followed = ctl(&stack, &["task", &ticking, "--follow", "--interval", "0.2"]).await;
    assert!(followed.status.success());
    assert_eq!(
        String::from_utf8_lossy(&followed.stdout),
        "tick1\ntick2\ntick3\ntick4\ntick5\n"
    );
    let err = String::from_utf8_lossy(&followed.stderr);
    assert!(
        err.contains("bye\n") && err.contains("succeeded (exited with code 0)"),
        "{err}"
    );

    // The sleeper killed: nothing runs, and the hour counts it.
    call_ok(&client, "kill_task", json!({ "task_id": sleeper })).await;
    let status = wait_until(
        "ctl status to show the kills and nothing running",
        Duration::from_secs(30),
        || async {
            let s = ctl_json(&stack, &["status", "--json"]).await;
            (s["running"].as_array().is_some_and(Vec::is_empty)
                && s["queue"]["held"] == 0
                && s["finished_last_hour_total"] == 6)
                .then_some(s)
        },
    )
    .await;
    assert_eq!(
        finished(&status),
        owned(&[
            ("failed/exited", 1),
            ("killed/killed-by-user", 3),
            ("succeeded/exited", 2)
        ])
    );
    stack.shutdown().await;
}

/// A tmux server of its own (`-L`), killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .expect("tmux must be installed (scripts/test.sh installs it)")
    }

    fn pane(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }

    fn alive(&self) -> bool {
        self.run(&["has-session", "-t", "top"]).status.success()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

#[tokio::test]
async fn top_shows_a_worker_and_a_running_task_in_a_real_terminal() {
    let stack = Stack::start(ops_options(free_port())).await;
    let client = stack.client().await;
    let sleeper = start_sleeper(&client, "watched").await;
    let tmux = Tmux {
        socket: format!("sr-ops-{}", stack.prefix),
    };
    let started = tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "200",
        "-y",
        "50",
        "-e",
        &format!("REDIS_URL={}", read_only_url(&stack).await),
        "-e",
        &format!("REDIS_KEY_PREFIX={}", stack.prefix),
        &format!("{} top --interval 0.5", ctl_bin()),
    ]);
    assert!(
        started.status.success(),
        "tmux: {}",
        String::from_utf8_lossy(&started.stderr)
    );
    let worker = stack.worker_name.clone();
    wait_until(
        "top to show the worker, busy, and the running task",
        Duration::from_secs(30),
        || async {
            let pane = tmux.pane();
            let ok = pane.contains(&worker)
                && pane.contains("1/2")
                && pane.contains(&sleeper)
                && pane.contains("python3.13")
                && pane.contains("Running tasks (1)");
            ok.then_some(())
        },
    )
    .await;
    // It refreshes: the kill shows without touching it.
    call_ok(&client, "kill_task", json!({ "task_id": sleeper })).await;
    wait_until(
        "top to show the task gone and the kill counted",
        Duration::from_secs(30),
        || async {
            let pane = tmux.pane();
            let ok = !pane.contains(&sleeper)
                && pane.contains("Running tasks (0)")
                && pane.contains("killed-by-user");
            ok.then_some(())
        },
    )
    .await;
    // q quits (and the session with it).
    assert!(tmux.run(&["send-keys", "-t", "top", "q"]).status.success());
    wait_until("top to quit on q", Duration::from_secs(10), || async {
        (!tmux.alive()).then_some(())
    })
    .await;
    stack.shutdown().await;
}

/// Every metric name a PromQL expression names (`script_runner_...`).
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("script_runner_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// The sample names in a Prometheus text exposition.
fn sample_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn the_dashboard_queries_only_metrics_a_real_api_and_worker_serve() {
    let metrics_port = free_port();
    let mut options = ops_options(metrics_port);
    // Cold starts only, so each count below is exactly the two tasks' (the pool's
    // own metrics are checked in api/tests/pool.rs).
    options.extra_env.push(("POOL_SIZE", "0".to_owned()));
    let stack = Stack::start(options).await;
    let client = stack.client().await;
    run_to_end(&client, "python3.13", "echo hi", json!({})).await;
    run_to_end(&client, "python3.13", "exit 1", json!({})).await;

    let http = reqwest::Client::new();
    let api = wait_until(
        "the api's metrics to show a finished task",
        Duration::from_secs(30),
        || async {
            let r = http
                .get(format!("{}/metrics", stack.url))
                .header("authorization", format!("Bearer {TOKEN}"))
                .send()
                .await
                .ok()?;
            let text = r.text().await.ok()?;
            text.contains("script_runner_tasks_finished_total{")
                .then_some(text)
        },
    )
    .await;
    // Containers are removed after their task is recorded: wait for both.
    let worker = wait_until(
        "the worker's metrics to show both removals",
        Duration::from_secs(30),
        || async {
            let r = http
                .get(format!("http://127.0.0.1:{metrics_port}/metrics"))
                .send()
                .await
                .ok()?;
            assert_eq!(r.status(), 200);
            let text = r.text().await.ok()?;
            text.contains("script_runner_worker_container_remove_seconds_count 2\n")
                .then_some(text)
        },
    )
    .await;
    // What the worker saw of its own work.
    for want in [
        "script_runner_worker_task_run_seconds_count{runtime=\"python3.13\"}",
        "script_runner_worker_container_create_seconds_count",
        "script_runner_worker_container_start_seconds_count",
        "script_runner_worker_container_remove_seconds_count",
        "script_runner_worker_docker_errors_total{op=\"create\"}",
        "script_runner_worker_slots 2\n",
        &format!(
            "script_runner_worker_info{{worker=\"{}\"",
            stack.worker_name
        ),
    ] {
        assert!(
            worker.contains(want),
            "{want:?} not in the worker's metrics:\n{worker}"
        );
    }
    // The stack's workers install the firewall (the default).
    assert!(
        worker.contains("script_runner_worker_firewall_enabled 1\n"),
        "{worker}"
    );
    let count = |name: &str| -> u64 {
        worker
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    // Each worker reports its own work: exactly the two tasks run here.
    for name in [
        "script_runner_worker_task_run_seconds_count{runtime=\"python3.13\"} ",
        "script_runner_worker_container_create_seconds_count ",
        "script_runner_worker_container_start_seconds_count ",
        "script_runner_worker_container_remove_seconds_count ",
    ] {
        assert_eq!(count(name), 2, "{name}in:\n{worker}");
    }

    let served: BTreeSet<String> = sample_names(&api)
        .into_iter()
        .chain(sample_names(&worker))
        .collect();
    let raw = std::fs::read_to_string(repo_path("deploy/grafana/dashboards/script-runner.json"))
        .expect("dashboard file");
    let dash: Value = serde_json::from_str(&raw).expect("the dashboard is valid JSON");
    assert_eq!(dash["uid"], "script-runner");
    let datasources = std::fs::read_to_string(repo_path(
        "deploy/grafana/provisioning/datasources/prometheus.yml",
    ))
    .expect("datasource provisioning");
    let panels = dash["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    let mut queried = BTreeSet::new();
    for p in panels {
        let title = p["title"].as_str().expect("every panel has a title");
        assert!(
            ids.insert(p["id"].as_u64().expect("panel id")),
            "duplicate id at {title}"
        );
        for k in ["x", "y", "w", "h"] {
            assert!(p["gridPos"][k].is_u64(), "{title}: gridPos.{k}");
        }
        if p["type"] == "row" {
            continue;
        }
        let uid = p["datasource"]["uid"].as_str().expect("datasource uid");
        assert!(
            datasources.contains(&format!("uid: {uid}")),
            "{title}: datasource {uid} is not provisioned"
        );
        let targets = p["targets"].as_array().filter(|t| !t.is_empty());
        for t in targets.unwrap_or_else(|| panic!("{title} has no query")) {
            let expr = t["expr"].as_str().expect("expr");
            let names = metric_names(expr);
            assert!(
                !names.is_empty(),
                "{title}: {expr} queries no script-runner metric"
            );
            for name in names {
                assert!(
                    served.contains(&name),
                    "{title}: {name} is served by neither the api nor the worker"
                );
                queried.insert(name);
            }
        }
    }
    // The list: queue depth, running, throughput by state, latencies, workers alive.
    for must in [
        "script_runner_jobs_queued",
        "script_runner_jobs_running",
        "script_runner_tasks_finished_total",
        "script_runner_workers_alive",
        "script_runner_worker_container_start_seconds_bucket",
        "script_runner_worker_task_run_seconds_bucket",
    ] {
        assert!(queried.contains(must), "the dashboard does not show {must}");
    }
    stack.shutdown().await;
}
