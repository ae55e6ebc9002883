//! Scripts run for real: Redis stream -> worker -> Docker container -> tails.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

#[tokio::test]
async fn python_and_node_one_liners_succeed_with_their_output() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;

    let py = run_to_end(
        &client,
        "python3.13",
        "python3 -c 'print(6 * 7)'",
        json!({}),
    )
    .await;
    assert_eq!(py["state"], "succeeded", "{py}");
    assert_eq!(py["exit_code"], 0);
    assert_eq!(py["stdout_tail"], "42\n");
    assert_eq!(py["reason"], "exited with code 0");
    assert_eq!(py["runtime"], "python3.13");
    assert!(py["runtime_seconds"].as_f64().is_some_and(|s| s >= 0.0));
    assert!(
        py["started_at"].is_string()
            && py["finished_at"].is_string()
            && py["created_at"].is_string()
    );

    let node = run_to_end(
        &client,
        "node24",
        "node -e 'console.log([1,2,3].map(x => x * 2).join(\",\"))'",
        json!({}),
    )
    .await;
    assert_eq!(node["state"], "succeeded", "{node}");
    assert_eq!(node["stdout_tail"], "2,4,6\n");
    stack.shutdown().await;
}

#[tokio::test]
async fn a_non_zero_exit_fails_with_its_code_and_stderr_kept_apart() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let s = run_to_end(
        &client,
        "python3.8",
        "echo to-out; echo to-err >&2; exit 3",
        json!({}),
    )
    .await;
    assert_eq!(s["state"], "failed", "{s}");
    assert_eq!(s["exit_code"], 3);
    assert_eq!(s["reason"], "exited with code 3");
    assert_eq!(s["stdout_tail"], "to-out\n");
    assert_eq!(s["stderr_tail"], "to-err\n");
    assert_eq!(
        (s["stdout_bytes"].as_u64(), s["stderr_bytes"].as_u64()),
        (Some(7), Some(7))
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn zip_files_are_in_the_workspace_with_nested_folders() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let zip = zip_of(&[
        ("main.py", "from lib.util import greet\nprint(greet())\n"),
        ("lib/", ""),
        ("lib/__init__.py", ""),
        (
            "lib/util.py",
            "def greet():\n    return open('data/deep/er/msg.txt').read().strip()\n",
        ),
        ("data/deep/er/msg.txt", "hello from a nested file\n"),
    ]);
    let s = run_to_end(
        &client,
        "python3.13",
        "pwd && python3 main.py && ls data/deep/er",
        json!({ "zip_base64": b64(&zip) }),
    )
    .await;
    assert_eq!(s["state"], "succeeded", "{s}");
    assert_eq!(
        s["stdout_tail"],
        "/workspace\nhello from a nested file\nmsg.txt\n"
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn a_sleeping_task_is_running_and_its_clocks_grow() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let id = run(&client, "python3.13", "echo started; sleep 30", json!({})).await;
    let first = wait_status(
        &client,
        &id,
        "the first output",
        Duration::from_secs(60),
        |s| s["state"] == "running" && s["stdout_tail"] == "started\n",
    )
    .await;
    assert!(
        first["reason"].is_null() && first["exit_code"].is_null() && first["finished_at"].is_null()
    );
    let (rt0, quiet0) = (
        first["runtime_seconds"].as_f64().unwrap_or(-1.0),
        first["seconds_since_last_output"].as_f64().unwrap_or(-1.0),
    );
    assert!(rt0 >= 0.0 && quiet0 >= 0.0, "{first}");
    let later = wait_status(
        &client,
        &id,
        "the clocks to advance by a second",
        Duration::from_secs(20),
        |s| {
            s["runtime_seconds"]
                .as_f64()
                .is_some_and(|r| r >= rt0 + 1.0)
        },
    )
    .await;
    assert_eq!(later["state"], "running");
    assert!(
        later["seconds_since_last_output"]
            .as_f64()
            .is_some_and(|q| q >= quiet0 + 1.0),
        "{later}"
    );
    let killed = call_ok(&client, "kill_task", json!({ "task_id": id })).await;
    assert_eq!(
        killed,
        json!({ "task_id": id, "state": "killed", "killed": true })
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn a_task_past_its_timeout_ends_timed_out_and_large_timeouts_are_capped() {
    let stack = Stack::start(Options {
        max_timeout_seconds: 90,
        ..Options::default()
    })
    .await;
    let client = stack.client().await;

    let capped = call_ok(
        &client,
        "run_script",
        json!({ "runtime": "python3.13", "command_base64": b64("true"), "timeout_seconds": 100_000 }),
    )
    .await;
    assert_eq!(capped["timeout_seconds"], 90);
    let capped_status = status(&client, capped["task_id"].as_str().unwrap_or_default()).await;
    assert_eq!(capped_status["timeout_seconds"], 90);

    let s = run_to_end(
        &client,
        "python3.13",
        "echo before; sleep 60; echo after",
        json!({ "timeout_seconds": 2 }),
    )
    .await;
    assert_eq!(s["state"], "timed-out", "{s}");
    assert_eq!(s["reason"], "timed out after 2 s");
    assert_eq!(s["stdout_tail"], "before\n");
    assert!(
        s["runtime_seconds"]
            .as_f64()
            .is_some_and(|r| (2.0..30.0).contains(&r)),
        "{s}"
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn kill_task_stops_a_running_task() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let id = start_sleeper(&client, "up").await;

    let k = call_ok(&client, "kill_task", json!({ "task_id": id })).await;
    assert_eq!(
        (k["state"].as_str(), k["killed"].as_bool()),
        (Some("killed"), Some(true))
    );
    let s = status(&client, &id).await;
    assert_eq!(s["state"], "killed");
    assert_eq!(s["reason"], "killed by kill_task");
    // The container really goes away, not just the record.
    wait_container_gone(&id).await;
    // Killing again is not an error, and changes nothing.
    let again = call_ok(&client, "kill_task", json!({ "task_id": id })).await;
    assert_eq!(
        (again["state"].as_str(), again["killed"].as_bool()),
        (Some("killed"), Some(false))
    );
    // Nor is killing a task that finished: it keeps its final state.
    let done = run_to_end(&client, "python3.13", "true", json!({})).await;
    let late = call_ok(&client, "kill_task", json!({ "task_id": done["task_id"] })).await;
    assert_eq!(
        (late["state"].as_str(), late["killed"].as_bool()),
        (Some("succeeded"), Some(false))
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn kill_task_on_a_queued_task_means_it_never_starts() {
    // One slot: the second task waits in the stream behind the first.
    let stack = Stack::start(Options {
        concurrency: 1,
        ..Options::default()
    })
    .await;
    let client = stack.client().await;
    let blocker = start_sleeper(&client, "busy").await;
    let queued = run(&client, "python3.13", "echo should-never-run", json!({})).await;
    assert_eq!(status(&client, &queued).await["state"], "queued");

    let k = call_ok(&client, "kill_task", json!({ "task_id": queued })).await;
    assert_eq!(
        (k["state"].as_str(), k["killed"].as_bool()),
        (Some("killed"), Some(true))
    );
    // Free the slot, then run one more task: the stream is read in order, so once
    // it has finished the killed task's job has been read and skipped.
    call_ok(&client, "kill_task", json!({ "task_id": blocker })).await;
    let after = run_to_end(&client, "python3.13", "echo next", json!({})).await;
    assert_eq!(after["state"], "succeeded", "{after}");

    let s = status(&client, &queued).await;
    assert_eq!(s["state"], "killed");
    assert!(
        s["started_at"].is_null() && s["runtime_seconds"].is_null(),
        "it started: {s}"
    );
    assert_eq!(s["stdout_bytes"], 0);
    // Its job left the stream (the last task's is acknowledged just after its
    // final state is written, so wait for it).
    let redis = stack.redis.client();
    let jobs = stack.keys().jobs();
    wait_until("the stream to empty", Duration::from_secs(30), || {
        let (redis, jobs) = (redis.clone(), jobs.clone());
        async move {
            let mut c = redis.get_multiplexed_async_connection().await.ok()?;
            let len: u64 = redis::AsyncCommands::xlen(&mut c, &jobs).await.ok()?;
            (len == 0).then_some(())
        }
    })
    .await;
    stack.shutdown().await;
}

#[tokio::test]
async fn a_megabyte_of_output_keeps_only_a_tail_cut_on_character_boundaries() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    // 524 288 two-byte characters: 1 MiB, then a marker.
    let s = run_to_end(
        &client,
        "python3.13",
        "python3 -c \"import sys; sys.stdout.write('é' * 524288); sys.stdout.write('END')\"",
        json!({}),
    )
    .await;
    assert_eq!(s["state"], "succeeded", "{}", s["stderr_tail"]);
    assert_eq!(s["stdout_bytes"], 1_048_576 + 3);
    assert_eq!(s["stdout_truncated"], true);
    // Default tail: 4096 bytes = "END" + 4093 bytes of 'é': the odd byte is dropped.
    let tail = s["stdout_tail"].as_str().unwrap_or_default();
    assert_eq!(tail, format!("{}END", "é".repeat(2046)));

    // An explicit odd tail size never splits a character either.
    let id = s["task_id"].as_str().unwrap_or_default();
    let t = call_ok(
        &client,
        "get_task_status",
        json!({ "task_id": id, "tail_bytes": 1001 }),
    )
    .await;
    assert_eq!(t["stdout_tail"], format!("{}END", "é".repeat(499)));
    // Asking for more than the cap gets the cap (64 KiB).
    let big = call_ok(
        &client,
        "get_task_status",
        json!({ "task_id": id, "tail_bytes": 10_000_000 }),
    )
    .await;
    assert_eq!(big["stdout_tail"].as_str().map(str::len), Some(65_535));
    assert_eq!(big["stdout_truncated"], true);
    stack.shutdown().await;
}

#[tokio::test]
async fn a_worker_without_its_own_runtime_map_runs_the_image_the_api_recorded() {
    let mut stack = Stack::start(Options {
        start_worker: false,
        ..Options::default()
    })
    .await;
    // No RUNTIME_IMAGES on this worker: it must not fall back to the public
    // default (node:24-slim, which cannot be pulled here) but use what the api
    // resolved at submit.
    stack.start_worker("plain", &[("RUNTIME_IMAGES", "")]).await;
    let client = stack.client().await;
    let s = run_to_end(
        &client,
        "node24",
        "node -e 'console.log(40 + 2)'",
        json!({}),
    )
    .await;
    assert_eq!(
        (s["state"].as_str(), s["stdout_tail"].as_str()),
        (Some("succeeded"), Some("42\n")),
        "{s}"
    );
    stack.shutdown().await;
}
