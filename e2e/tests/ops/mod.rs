//! The operators' view: `script-runner-ctl` (the built binary, from
//! `cargo build --bins`) against a real stack running real tasks, `top` in a
//! real terminal (tmux), and the Grafana dashboard against the metrics a real
//! api and worker serve.

use std::process::{Command, Output};
use std::time::Duration;

use script_runner_e2e::*;
use serde_json::{Value, json};

mod metrics;

fn repo_path(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
}

fn ctl_bin() -> String {
    binary("script-runner-ctl", "SCRIPT_RUNNER_CTL_BIN")
        .display()
        .to_string()
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

/// A Redis URL for a user that may only read (`+@read +time`), as
/// docs/operations.md says is enough for the ctl; made on first use.
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
    ctl_as(stack, read_only_url(stack).await, args).await
}

/// Runs the ctl as Redis's admin (the test Redis's default user, who may
/// send anything, like the deployment's `admin`): for the commands that write.
async fn ctl_admin(stack: &Stack, args: &[&str]) -> Output {
    ctl_as(stack, stack.redis.url(), args).await
}

async fn ctl_as(stack: &Stack, redis_url: String, args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new(ctl_bin());
    cmd.env_clear()
        .env("REDIS_URL", redis_url)
        .env("REDIS_KEY_PREFIX", &stack.prefix)
        .args(args)
        .kill_on_drop(true);
    tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("script-runner-ctl {args:?} did not end within 60 s"))
        .expect("script-runner-ctl runs")
}

pub(crate) async fn ctl_json(stack: &Stack, args: &[&str]) -> Value {
    json_of(args, ctl(stack, args).await)
}

pub(crate) async fn ctl_admin_json(stack: &Stack, args: &[&str]) -> Value {
    json_of(args, ctl_admin(stack, args).await)
}

fn json_of(args: &[&str], out: Output) -> Value {
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
    let worker = stack.worker_name.clone();
    let tasks = start_tasks(&client).await;

    // Three ended; two running on the only worker (both its slots busy), the
    // silent one clearly silent longer than the chatty one.
    let status = wait_until(
        "ctl status to show the worker busy with both tasks, the sleeper silent, and three ended tasks",
        Duration::from_secs(30),
        || async {
            let s = ctl_json(&stack, &["status", "--json"]).await;
            let w = &s["workers"][0];
            let silent = silence(&s, &tasks.sleeper)? > silence(&s, &tasks.chatty)? + 1.0;
            let ready = w["name"] == worker.as_str()
                && w["slots_busy"] == 2
                && finished(&s).len() == 3
                && silent;
            ready.then_some(s)
        },
    )
    .await;
    assert_busy_status(&status, &worker, &tasks);
    // The text form says the same.
    let text = ctl(&stack, &["status"]).await;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&tasks.sleeper) && text.contains(&worker),
        "{text}"
    );
    assert!(text.contains("Finished in the last hour: 3"), "{text}");
    call_ok(&client, "kill_task", json!({ "task_id": tasks.chatty })).await;

    assert_task_shown(&stack, &tasks.succeeded, &worker).await;
    assert_task_followed(&stack, &client).await;

    // The sleeper killed: nothing runs, and the hour counts it.
    call_ok(&client, "kill_task", json!({ "task_id": tasks.sleeper })).await;
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

/// The tasks `status_and_task_report_what_the_tasks_did` reads back.
struct Tasks {
    /// Ended: printed "out" and "err", exited 0.
    succeeded: String,
    /// Running, printing every 0.2 s.
    chatty: String,
    /// Running, silent after its first line ("second").
    sleeper: String,
}

/// Three tasks that end (succeeded, failed, killed), then a chatty task (the
/// older stream entry) and a silent one, both left running.
async fn start_tasks(client: &Client) -> Tasks {
    let ok = run_to_end(client, "python3.13", "echo out; echo err >&2", json!({})).await;
    run_to_end(client, "python3.13", "exit 3", json!({})).await;
    let killed = start_sleeper(client, "first").await;
    call_ok(client, "kill_task", json!({ "task_id": killed })).await;
    let chatty = run(
        client,
        "python3.13",
        "while true; do echo .; sleep 0.2; done",
        json!({}),
    )
    .await;
    wait_status(
        client,
        &chatty,
        "the chatty task's output",
        Duration::from_secs(60),
        |s| s["stdout_bytes"].as_u64().is_some_and(|n| n > 0),
    )
    .await;
    Tasks {
        succeeded: ok["task_id"].as_str().expect("id").to_owned(),
        chatty,
        sleeper: start_sleeper(client, "second").await,
    }
}

/// Seconds since task `id` last printed, as `ctl status --json` shows it.
fn silence(status: &Value, id: &str) -> Option<f64> {
    status["running"]
        .as_array()?
        .iter()
        .find(|t| t["task_id"] == id)?["seconds_since_last_output"]
        .as_f64()
}

/// `ctl status --json` with the worker busy with `tasks`' two running ones.
fn assert_busy_status(status: &Value, worker: &str, tasks: &Tasks) {
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
    assert_eq!(running[0]["task_id"], tasks.sleeper.as_str(), "{status}");
    assert_eq!(running[1]["task_id"], tasks.chatty.as_str(), "{status}");
    assert_eq!(running[0]["state"], "running");
    assert_eq!(running[0]["worker"], worker);
    assert_eq!(running[0]["runtime"], "python3.13");
    assert_eq!(running[0]["stdout_bytes"], "second\n".len());
    assert!(
        running[0]["runtime_seconds"]
            .as_f64()
            .is_some_and(|s| s >= 0.0)
    );
    assert_eq!(
        finished(status),
        owned(&[
            ("failed/exited", 1),
            ("killed/killed-by-user", 1),
            ("succeeded/exited", 1)
        ])
    );
    assert_eq!(status["finished_last_hour_total"], 3);
}

/// `ctl task` shows one task's record and tails (as JSON and as text), and
/// says so when there is no such task.
async fn assert_task_shown(stack: &Stack, id: &str, worker: &str) {
    let t = ctl_json(stack, &["task", id, "--json"]).await;
    assert_eq!(t["state"], "succeeded");
    assert_eq!(t["exit_code"], 0);
    assert_eq!(t["reason"], "exited with code 0");
    assert_eq!(t["reason_kind"], "exited");
    assert_eq!(t["worker"], worker);
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
    let text = ctl(stack, &["task", id]).await;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("--- stdout (4 bytes) ---\nout\n"), "{text}");
    let missing = ctl(stack, &["task", "00000000-0000-4000-8000-000000000000"]).await;
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no task"));
}

/// `ctl task --follow` prints the output as it grows and ends with the task.
async fn assert_task_followed(stack: &Stack, client: &Client) {
    let ticking = run(
        client,
        "python3.13",
        "for i in 1 2 3 4 5; do echo tick$i; sleep 0.5; done; echo bye >&2",
        json!({}),
    )
    .await;
    let followed = ctl(stack, &["task", &ticking, "--follow", "--interval", "0.2"]).await;
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

/// A new API key made by the ctl (as admin), and an MCP client holding it.
async fn key_client(stack: &Stack, name: &str) -> (String, Client) {
    let made = ctl_admin_json(stack, &["--json", "keys", "create", "--name", name]).await;
    let key = made["key"].as_str().expect("the new key").to_owned();
    let client = mcp_client(&stack.url, &key)
        .await
        .expect("MCP client connects with the new key");
    (key, client)
}

/// One owner's running task and one queued behind it, and another owner's
/// running task: the worker's two slots are full, so the queued one waits.
struct OwnersTasks {
    running: String,
    queued: String,
    other_running: String,
}

async fn fill_slots(mine: &Client, other: &Client) -> OwnersTasks {
    let running = start_sleeper(mine, "mine").await;
    let other_running = start_sleeper(other, "other").await;
    let queued = run(mine, "python3.13", "echo never", json!({})).await;
    assert_eq!(status(mine, &queued).await["state"], "queued");
    for id in [&running, &other_running] {
        assert!(!containers_of_task(id).is_empty(), "{id} has its container");
    }
    OwnersTasks {
        running,
        queued,
        other_running,
    }
}

/// `ids` sorted, as the ctl's `task_ids` are.
fn sorted(ids: &[&String]) -> Value {
    let mut ids: Vec<&str> = ids.iter().map(|s| s.as_str()).collect();
    ids.sort();
    json!(ids)
}

/// Waits until the task has ended and checks it was the operator's kill.
async fn assert_killed_by_operator(client: &Client, id: &str, reason: &str) -> Value {
    let s = wait_status(
        client,
        id,
        "the task to end",
        Duration::from_secs(30),
        is_final,
    )
    .await;
    assert_eq!(
        (
            s["state"].as_str(),
            s["reason_kind"].as_str(),
            s["reason"].as_str()
        ),
        (Some("killed"), Some("killed-by-operator"), Some(reason)),
        "{s}"
    );
    s
}

/// `tasks kill --owner` ends that owner's running and queued tasks (recorded
/// `killed-by-operator`, the running one's container removed, the queued one
/// never started) and leaves another owner's running; `--admin` then ends the
/// admin key's task (found in the jobs stream: it has no owner's set) and
/// still leaves the other owner's. The read-only user may not kill.
#[tokio::test]
async fn tasks_kill_ends_one_owners_queued_and_running_tasks_and_no_one_elses() {
    let stack = Stack::start(Options::default()).await;
    let (_, alice) = key_client(&stack, "alice").await;
    let (_, bob) = key_client(&stack, "bob").await;
    let admin = stack.client().await;
    let t = fill_slots(&alice, &bob).await;
    let admins = run(&admin, "python3.13", "echo admin; sleep 300", json!({})).await;

    let refused = ctl(&stack, &["tasks", "kill", "--owner", "alice"]).await;
    assert!(
        !refused.status.success(),
        "a read-only user killed: {}",
        String::from_utf8_lossy(&refused.stdout)
    );
    assert_eq!(status(&alice, &t.running).await["state"], "running");

    let out = ctl_admin_json(&stack, &["--json", "tasks", "kill", "--owner", "alice"]).await;
    assert_eq!(
        out,
        json!({
            "owner": "alice", "admin": false, "killed": 2,
            "task_ids": sorted(&[&t.running, &t.queued]), "truncated": false
        })
    );
    let reason = "killed by an operator (script-runner-ctl tasks kill)";
    assert_killed_by_operator(&alice, &t.running, reason).await;
    wait_container_gone(&t.running).await;
    // The freed slot goes past the killed queued job to the admin's.
    wait_status(
        &admin,
        &admins,
        "the admin's task to start",
        Duration::from_secs(60),
        |s| s["stdout_tail"] == "admin\n",
    )
    .await;
    let q = assert_killed_by_operator(&alice, &t.queued, reason).await;
    assert!(q["started_at"].is_null(), "the queued task ran: {q}");
    assert!(containers_of_task(&t.queued).is_empty());
    assert_eq!(status(&bob, &t.other_running).await["state"], "running");

    let out = ctl_admin_json(&stack, &["--json", "tasks", "kill", "--admin"]).await;
    assert_eq!(
        out,
        json!({
            "owner": null, "admin": true, "killed": 1,
            "task_ids": [admins], "truncated": false
        })
    );
    assert_killed_by_operator(&admin, &admins, reason).await;
    wait_container_gone(&admins).await;
    assert_eq!(status(&bob, &t.other_running).await["state"], "running");
    assert!(!containers_of_task(&t.other_running).is_empty());

    // Nothing of alice's is left; as text.
    let again = ctl_admin(&stack, &["tasks", "kill", "--owner", "alice"]).await;
    assert_eq!(
        String::from_utf8_lossy(&again.stdout),
        "killed 0 tasks of \"alice\"\n"
    );
    stack.shutdown().await;
}

/// `keys revoke --kill-tasks` refuses the key from its next request and ends
/// its running and queued tasks, saying so; another key's task runs on.
#[tokio::test]
async fn keys_revoke_with_kill_tasks_refuses_the_key_and_ends_its_tasks() {
    let stack = Stack::start(Options::default()).await;
    let (key, alice) = key_client(&stack, "alice").await;
    let (_, bob) = key_client(&stack, "bob").await;
    let admin = stack.client().await;
    let t = fill_slots(&alice, &bob).await;

    let out = ctl_admin(&stack, &["keys", "revoke", "alice", "--kill-tasks"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "revoked key \"alice\" and killed 2 of its tasks\n"
    );
    assert!(
        mcp_client(&stack.url, &key).await.is_err(),
        "the revoked key still connects"
    );
    let reason = "killed by an operator: its API key was revoked (script-runner-ctl keys revoke --kill-tasks)";
    for id in [&t.running, &t.queued] {
        assert_killed_by_operator(&admin, id, reason).await;
    }
    wait_container_gone(&t.running).await;
    assert_eq!(status(&bob, &t.other_running).await["state"], "running");
    assert!(!containers_of_task(&t.other_running).is_empty());

    // With --json, and a key with nothing running: revoked, nothing killed.
    let (_, _carol) = key_client(&stack, "carol").await;
    let out = ctl_admin_json(
        &stack,
        &["--json", "keys", "revoke", "carol", "--kill-tasks"],
    )
    .await;
    assert_eq!(
        out,
        json!({"name": "carol", "revoked": true, "killed": 0, "task_ids": [], "truncated": false})
    );
    stack.shutdown().await;
}
