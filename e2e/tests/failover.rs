//! Redis failover (issue 22), for real: the stack's Redis with a replica and
//! three `redis-sentinel`s, the api and the worker pointed at the sentinels
//! only (their `REDIS_URL` host is never reached), a real task running across
//! `SENTINEL FAILOVER`, and `script-runner-ctl` following it; and replicated
//! acknowledgements (`REDIS_MIN_REPLICAS_ACK`) refusing what no replica has.

use std::process::Stdio;
use std::time::Duration;

use redis::AsyncCommands;
use script_runner_e2e::*;
use serde_json::{Value, json};

/// A task's status, or `None` while the api answers with an error (a read
/// during the failover is told to try again, which is what a client does).
async fn status_now(client: &Client, task_id: &str) -> Option<Value> {
    let r = call(client, "get_task_status", json!({ "task_id": task_id })).await;
    if r["isError"] == json!(true) {
        return None;
    }
    r.get("structuredContent").cloned()
}

async fn wait_for(
    client: &Client,
    task_id: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    wait_until(what, Duration::from_secs(90), || async {
        status_now(client, task_id).await.filter(|s| done(s))
    })
    .await
}

/// A field of a task's record read straight from one Redis node.
async fn record_field(
    node: &Redis,
    keys: &shared::Keys,
    task_id: &str,
    field: &str,
) -> Option<String> {
    let mut c = node.conn().await;
    c.hget(keys.task(task_id), field).await.expect("HGET")
}

#[tokio::test]
async fn api_worker_and_ctl_find_the_primary_through_sentinels_and_follow_a_failover() {
    let stack = Stack::start(Options {
        sentinels: true,
        ..Options::default()
    })
    .await;
    let ha = stack.ha.as_ref().expect("sentinels");
    let keys = stack.keys();
    let client = stack.client().await;

    // Found through the sentinels: nothing listens at REDIS_URL's host.
    let found = run_to_end(&client, "python3.13", "echo found", json!({})).await;
    assert_eq!(found["state"], "succeeded", "{found}");

    // A task that runs across the failover, and the ctl following it.
    let ticks = 30;
    let id = run(
        &client,
        "python3.13",
        &format!("for i in $(seq 1 {ticks}); do echo tick$i; sleep 0.5; done"),
        json!({}),
    )
    .await;
    let follower =
        tokio::process::Command::new(binary("script-runner-ctl", "SCRIPT_RUNNER_CTL_BIN"))
            .env_clear()
            .env("REDIS_URL", "redis://127.0.0.1:1")
            .env("REDIS_SENTINELS", ha.sentinels.env())
            .env("REDIS_KEY_PREFIX", &stack.prefix)
            .args(["task", &id, "--follow", "--interval", "0.2"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("script-runner-ctl starts");
    wait_for(&client, &id, "the task to print its second tick", |s| {
        s["stdout_tail"]
            .as_str()
            .is_some_and(|o| o.contains("tick2\n"))
    })
    .await;

    ha.sentinels.failover_to(ha.replica.port).await;
    // Mid-run: the task is still running once every sentinel names the replica.
    let during = wait_for(&client, &id, "a status read after the failover", |_| true).await;
    assert_eq!(
        during["state"], "running",
        "the task ended before the failover: {during}"
    );

    let end = wait_for(&client, &id, "the task to end", is_final).await;
    assert_eq!(end["state"], "succeeded", "{end}");
    assert_eq!(end["reason_kind"], "exited", "{end}");
    let out = end["stdout_tail"].as_str().unwrap_or_default();
    assert!(out.ends_with(&format!("tick{ticks}\n")), "{out}");
    // Its end is on the new primary (the old one is now its replica).
    assert_eq!(
        record_field(&ha.replica, &keys, &id, "state")
            .await
            .as_deref(),
        Some("succeeded")
    );

    // The ctl followed it to its end without a restart, every line once.
    let followed = tokio::time::timeout(Duration::from_secs(60), follower.wait_with_output())
        .await
        .expect("the ctl follower ends with the task")
        .expect("ctl output");
    let want: String = (1..=ticks).map(|i| format!("tick{i}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&followed.stdout), want);
    assert!(
        followed.status.success(),
        "{}",
        String::from_utf8_lossy(&followed.stderr)
    );

    // And new work goes to the new primary and runs.
    let after = wait_until(
        "a submit after the failover",
        Duration::from_secs(30),
        || async {
            let args = json!({ "runtime": "python3.13", "command_base64": b64("echo after") });
            let r = call(&client, "run_script", args).await;
            r["structuredContent"]["task_id"]
                .as_str()
                .map(str::to_owned)
        },
    )
    .await;
    let done = wait_for(
        &client,
        &after,
        "the task submitted after the failover to end",
        is_final,
    )
    .await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(
        record_field(&ha.replica, &keys, &after, "state")
            .await
            .as_deref(),
        Some("succeeded")
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn a_submit_no_replica_confirms_gets_try_again_and_runs_nothing() {
    let stack = Stack::start(Options {
        extra_env: vec![
            ("REDIS_MIN_REPLICAS_ACK", "1".into()),
            ("REDIS_REPLICA_ACK_TIMEOUT_MS", "300".into()),
        ],
        ..Options::default()
    })
    .await;
    let keys = stack.keys();
    let client = stack.client().await;
    let args = json!({ "runtime": "python3.13", "command_base64": b64("echo never") });

    // No replica: WAIT confirms nothing, and the client is told to try again.
    let err = call_err(&client, "run_script", args.clone()).await;
    assert!(err.contains("try again shortly"), "{err}");
    assert!(err.contains("replicas"), "{err}");

    // A kill of an unknown id has nothing to confirm: it is told so, not to try again.
    let unknown = call_err(
        &client,
        "kill_task",
        json!({ "task_id": "00000000-0000-4000-8000-000000000000" }),
    )
    .await;
    assert!(unknown.starts_with("no task with id"), "{unknown}");

    // What was written is withdrawn, and never runs.
    let mut r = stack.redis_conn().await;
    let pattern = format!("{}:task:*", stack.prefix);
    let task_keys: Vec<String> = r.keys(&pattern).await.expect("KEYS");
    let ids: Vec<String> = task_keys
        .iter()
        .filter_map(|k| k.rsplit(':').next())
        .filter(|id| uuid::Uuid::parse_str(id).is_ok())
        .map(str::to_owned)
        .collect();
    assert_eq!(ids.len(), 1, "{task_keys:?}");
    let id = &ids[0];
    let state = wait_until(
        "the withdrawn task to be settled",
        Duration::from_secs(30),
        || async {
            let mut r = stack.redis_conn().await;
            let (state, kind): (Option<String>, Option<String>) = redis::cmd("HMGET")
                .arg(keys.task(id))
                .arg("state")
                .arg("reason_kind")
                .query_async(&mut r)
                .await
                .ok()?;
            // A worker that read its job first may hold it a moment: settled is
            // killed, with the reason, and its job gone from the stream.
            let pending: i64 = r.xlen(keys.jobs()).await.ok()?;
            (pending == 0).then_some((state, kind))
        },
    )
    .await;
    assert_eq!(
        state,
        (Some("killed".into()), Some("not-replicated".into()))
    );
    assert_eq!(
        record_field(&stack.redis, &keys, id, "started_at").await,
        None,
        "a withdrawn task's container started"
    );

    // With a replica, the same submit is acknowledged, claimed, run and finished.
    // Retried as a client told "try again" does: a replica just attached on a
    // busy machine may take longer than the 300 ms to confirm the first one.
    let _replica = Redis::start_replica_of(&stack.redis).await;
    let confirmed = json!({ "runtime": "python3.13", "command_base64": b64("echo confirmed") });
    let id = wait_until(
        "a submit the replica confirms",
        Duration::from_secs(30),
        || async {
            let r = call(&client, "run_script", confirmed.clone()).await;
            r["structuredContent"]["task_id"]
                .as_str()
                .map(str::to_owned)
        },
    )
    .await;
    let done = wait_for(&client, &id, "the confirmed task to end", is_final).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["stdout_tail"], "confirmed\n");
    stack.shutdown().await;
}

/// A Redis node that joins after the worker started (here a replica the
/// sentinels learn of) is refused to tasks from the worker's next heartbeat
/// on, like the nodes it knew at start: a central Redis's new replica on
/// another host would otherwise be open to every task until a restart.
#[tokio::test]
async fn a_replica_added_later_is_put_in_the_task_firewall() {
    // A bridge of its own, with its chains emptied first: chains keep what
    // earlier workers on that bridge refused (an earlier run of this test).
    const NETWORK: &str = "script-runner-fwredis";
    const BRIDGE: &str = "sr-fwredis0";
    let chain = format!("SR-FWD-{BRIDGE}");
    let _ = std::process::Command::new("iptables")
        .args(["-w", "-F", &chain])
        .status();
    let stack = Stack::start(Options {
        sentinels: true,
        concurrency: 1,
        extra_env: vec![
            // A beat (and so a look at the sentinels) every second.
            ("WORKER_HEARTBEAT_SECONDS", "3".into()),
            ("TASK_NETWORK", NETWORK.into()),
            ("TASK_BRIDGE", BRIDGE.into()),
        ],
        ..Options::default()
    })
    .await;
    let rules = || {
        let out = std::process::Command::new("iptables")
            .args(["-w", "-S", &chain])
            .output()
            .expect("iptables");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let refuses = |listing: &str, ip: &str| {
        listing
            .lines()
            .any(|l| l.starts_with(&format!("-A {chain} -d {ip}/32 ")) && l.contains("REJECT"))
    };
    let at_start = rules();
    assert!(refuses(&at_start, "127.0.0.1"), "{at_start}");
    assert!(!refuses(&at_start, "127.0.0.2"), "{at_start}");

    // A replica of the primary: the sentinels list what the primary does.
    let late = Redis::start_replica_on(&stack.redis, "127.0.0.2").await;
    wait_until(
        "the worker to refuse the replica that joined",
        Duration::from_secs(60),
        || async { refuses(&rules(), "127.0.0.2").then_some(()) },
    )
    .await;
    // Still refusing what it did, and still running tasks.
    assert!(refuses(&rules(), "127.0.0.1"), "{}", rules());
    let client = stack.client().await;
    let done = run_to_end(&client, "python3.13", "echo after", json!({})).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    drop(late);
    stack.shutdown().await;
}
