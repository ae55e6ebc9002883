//! Scripts run for real: Redis stream -> worker -> Docker container -> tails.

use std::time::Duration;

use rmcp::model::{
    ClientCapabilities, ClientConfig, GetTaskParams, Implementation, ProtocolVersion, TaskPayload,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use script_runner_api::tools::{REASON_KIND_META_KEY, STATE_META_KEY};
use script_runner_e2e::*;
use serde_json::{Value, json};

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
    assert_eq!(s["reason_kind"], "exited");
    assert_eq!(s["stdout_tail"], "to-out\n");
    assert_eq!(s["stderr_tail"], "to-err\n");
    assert_eq!(
        (s["stdout_bytes"].as_u64(), s["stderr_bytes"].as_u64()),
        (Some(7), Some(7))
    );
    // A crash (core dumps are off in tasks) still reads as its signal's code.
    let crash = run_to_end(&client, "python3.13", "sh -c 'kill -SEGV $$'", json!({})).await;
    assert_eq!(crash["state"], "failed", "{crash}");
    assert_eq!(crash["exit_code"], 139, "{crash}");
    assert_eq!(crash["reason_kind"], "exited", "{crash}");
    assert_eq!(crash["reason"], "exited with code 139", "{crash}");
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
    assert_eq!(s["reason_kind"], "timed-out");
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
    assert_eq!(s["reason_kind"], "killed-by-user");
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

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[tokio::test]
async fn a_record_naming_an_image_outside_the_workers_catalogue_is_refused_and_nothing_runs() {
    // The api records what its own RUNTIME_IMAGES says: here an api an attacker
    // configured (a compromised api writes records like any other), naming an
    // image that does not exist for python3.13 (a pull would be the only way to
    // get it) and a real local image, another runtime's, for python3.8 (which a
    // worker that ran the recorded image would run at once).
    let (img, node) = (runtime_image(), node_image());
    let evil = "attacker.invalid/evil:1";
    let mut stack = Stack::start(Options {
        start_worker: false,
        extra_env: vec![(
            "RUNTIME_IMAGES",
            format!("node24={node},python3.13={evil},python3.8={node}"),
        )],
        ..Options::default()
    })
    .await;
    // The worker's own catalogue, with a warm pool for both runtimes, so a
    // refusal must come before a warm container is taken as well as a cold one made.
    let catalogue = format!("node24={node},python3.13={img},python3.8={img}");
    stack
        .start_worker(
            "main",
            &[
                ("RUNTIME_IMAGES", &catalogue),
                ("POOL_SIZE", "python3.13=1,python3.8=1"),
                // No container made after the fill below but the tasks' own.
                ("EGRESS_POOL_SIZE", "0"),
            ],
        )
        .await;
    let worker = stack.worker("main");
    let warm = wait_until("the warm pool to fill", Duration::from_secs(60), || async {
        let (a, b) = (
            pool_containers(&worker, "python3.13"),
            pool_containers(&worker, "python3.8"),
        );
        (!a.is_empty() && !b.is_empty()).then(|| sorted([a, b].concat()))
    })
    .await;
    let since = docker_now();
    let client = stack.client().await;

    let refused = run_to_end(&client, "python3.13", "echo ran", json!({})).await;
    assert_eq!(
        (refused["state"].as_str(), refused["reason_kind"].as_str()),
        (Some("failed"), Some("image-refused")),
        "{refused}"
    );
    let reason = refused["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(evil) && reason.contains(&format!("{img:?}")),
        "the reason names the recorded image and what this worker accepts: {reason}"
    );
    assert_eq!(refused["stdout_tail"], "", "{refused}");
    assert!(refused["started_at"].is_null(), "{refused}");
    let other = run_to_end(&client, "python3.8", "echo ran", json!({})).await;
    assert_eq!(other["reason_kind"], "image-refused", "{other}");
    assert!(
        other["reason"]
            .as_str()
            .is_some_and(|r| r.contains(&node) && r.contains("python3.8")),
        "{other}"
    );

    // Nothing was created for either task, cold or warm: the warm containers
    // are the same ones, still idle; and the image was not pulled.
    assert_eq!(containers_created(&worker, &since), Vec::<String>::new());
    let idle = sorted(
        [
            pool_containers(&worker, "python3.13"),
            pool_containers(&worker, "python3.8"),
        ]
        .concat(),
    );
    assert_eq!(idle, warm);
    let inspect = std::process::Command::new("docker")
        .args(["image", "inspect", evil])
        .output()
        .expect("docker image inspect");
    assert!(!inspect.status.success(), "{evil} was pulled");

    // What the api and this worker agree on still runs (node24).
    let ok = run_to_end(
        &client,
        "node24",
        "node -e 'console.log(40 + 2)'",
        json!({}),
    )
    .await;
    assert_eq!(
        (ok["state"].as_str(), ok["stdout_tail"].as_str()),
        (Some("succeeded"), Some("42\n")),
        "{ok}"
    );
    stack.shutdown().await;
}

/// A client that declares the MCP tasks extension, so it may call `tasks/get`:
/// on protocol 2026-07-28, whose requests carry the client's capabilities (the
/// server keeps no session to remember them by).
async fn tasks_client(stack: &Stack) -> RunningService<RoleClient, ClientConfig> {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", stack.url))
            .auth_header(TOKEN),
    );
    let capabilities = ClientCapabilities::builder().enable_tasks().build();
    let lifecycle = ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    ClientConfig::new(capabilities, Implementation::new("tasks-test", "1"))
        .serve_with_lifecycle(transport, lifecycle)
        .await
        .expect("a tasks client connects")
}

/// The task's state and reason kind as `get_task_status`, `list_tasks` and
/// `tasks/get` (its `_meta`, and its result once completed) each say them.
async fn views_of(
    client: &Client,
    tasks: &RunningService<RoleClient, ClientConfig>,
    id: &str,
) -> [(String, Value); 4] {
    let status = status(client, id).await;
    let listed = call_ok(client, "list_tasks", json!({ "limit": 100 })).await;
    let entry = listed["tasks"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["task_id"] == id).cloned())
        .unwrap_or_default();
    let got = tasks
        .get_task(GetTaskParams::new(id))
        .await
        .expect("tasks/get");
    let meta = got.meta.clone().unwrap_or_default();
    let meta = |key: &str| meta.get(key).cloned().unwrap_or(Value::Null);
    let completed = match &got.task.payload {
        TaskPayload::Completed { result } => {
            result.get("structuredContent").cloned().unwrap_or_default()
        }
        _ => json!({ "state": meta(STATE_META_KEY), "reason_kind": meta(REASON_KIND_META_KEY) }),
    };
    let view = |v: &Value| {
        (
            v["state"].as_str().unwrap_or_default().to_owned(),
            v["reason_kind"].clone(),
        )
    };
    let meta_view = (
        meta(STATE_META_KEY).as_str().unwrap_or_default().to_owned(),
        meta(REASON_KIND_META_KEY),
    );
    [view(&status), view(&entry), meta_view, view(&completed)]
}

#[tokio::test]
async fn every_view_of_a_task_says_why_it_ended_by_kind() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let tasks = tasks_client(&stack).await;
    // tasks/get is not a tool call: its errors are JSON-RPC errors, the code in `data`.
    for (id, code) in [
        (uuid::Uuid::new_v4().to_string(), "unknown_task"),
        ("x".into(), "invalid_argument"),
    ] {
        let data = match tasks.get_task(GetTaskParams::new(id)).await {
            Err(rmcp::service::ServiceError::McpError(e)) => e.data,
            other => panic!("tasks/get of no task: {other:?}"),
        };
        assert_eq!(data, Some(json!({ "code": code })));
    }
    let failed = run_to_end(&client, "python3.13", "exit 3", json!({})).await;
    let failed = failed["task_id"].as_str().unwrap_or_default().to_owned();
    let sleeper = start_sleeper(&client, "up").await;
    let expect =
        |state: &str, kind: Value| std::array::from_fn(|_| (state.to_owned(), kind.clone()));
    assert_eq!(
        views_of(&client, &tasks, &failed).await,
        expect("failed", json!("exited"))
    );
    assert_eq!(
        views_of(&client, &tasks, &sleeper).await,
        expect("running", Value::Null),
        "no reason kind while running"
    );
    call_ok(&client, "kill_task", json!({ "task_id": sleeper })).await;
    assert_eq!(
        views_of(&client, &tasks, &sleeper).await,
        expect("killed", json!("killed-by-user"))
    );
    stack.shutdown().await;
}

/// The `usage` figures a task view (status, list entry) shows.
fn figures(v: &Value) -> (f64, u64, u64) {
    let u = &v["usage"];
    (
        u["cpu_seconds"].as_f64().unwrap_or(-1.0),
        u["peak_memory_bytes"].as_u64().unwrap_or(0),
        u["workspace_bytes"].as_u64().unwrap_or(0),
    )
}

/// What a task used, as its cgroup reported at the end, in every view: a task
/// that touches 200 MiB, writes 5 MiB to /workspace and burns 2 CPU seconds
/// shows them; one stopped by its timeout still shows what it used. With the
/// pool on (the default run) both run warm; TEST_POOL_SIZE=0 runs them cold.
#[tokio::test]
async fn usage_shows_cpu_peak_memory_and_workspace_bytes_even_when_timed_out() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let warm = std::env::var("TEST_POOL_SIZE").map_or(true, |s| s != "0");
    if warm {
        wait_until(
            "two idle python pool containers",
            Duration::from_secs(60),
            || async {
                (pool_containers(&stack.worker_name, "python3.13").len() >= 2).then_some(())
            },
        )
        .await;
    }
    let script = "import time\n\
                  b = bytearray(200 * 2**20)\n\
                  for i in range(0, len(b), 4096): b[i] = 1\n\
                  del b\n\
                  open('/workspace/out.bin', 'wb').write(b'x' * 5 * 2**20)\n\
                  while time.process_time() < 2: pass\n";
    let busy = "while True: pass\n";
    let (script, busy) = (
        format!("python3 -c \"{script}\""),
        format!("python3 -c \"{busy}\""),
    );
    let (used, stopped) = tokio::join!(
        run_to_end(&client, "python3.13", &script, json!({}),),
        run_to_end(
            &client,
            "python3.13",
            &busy,
            json!({ "timeout_seconds": 2 }),
        ),
    );
    assert_eq!(used["state"], "succeeded", "{used}");
    let (cpu, peak, workspace) = figures(&used);
    assert!((1.6..=3.0).contains(&cpu), "cpu_seconds {cpu}: {used}");
    assert!(peak >= 200 << 20, "peak_memory_bytes {peak}: {used}");
    // The file, and nothing else of note: the tmpfs counts whole pages.
    assert!(
        (5 << 20..(5 << 20) + (1 << 20)).contains(&workspace),
        "workspace_bytes {workspace}: {used}"
    );
    assert_eq!(stopped["state"], "timed-out", "{stopped}");
    let (cpu, peak, _) = figures(&stopped);
    // How much CPU two seconds of wall time buy depends on what else the
    // machine runs; that it was measured at all (the container was read before
    // it was stopped) is the point.
    assert!(
        cpu > 0.0,
        "a busy loop stopped at its timeout shows no CPU: {stopped}"
    );
    assert!(peak > 0, "{stopped}");
    // Both read from the kernel, not bounded by the worker.
    assert_eq!(used["usage"]["estimated"], false, "{used}");
    assert_eq!(stopped["usage"]["estimated"], false, "{stopped}");

    // list_tasks shows the same object.
    let listed = call_ok(&client, "list_tasks", json!({ "limit": 10 })).await;
    let entry = listed["tasks"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["task_id"] == used["task_id"]).cloned())
        .unwrap_or_default();
    assert_eq!(entry["usage"], used["usage"], "{listed}");
    stack.shutdown().await;
}

/// An empty stdin is stored as none, and signed as none: the task runs, reading
/// nothing (a signature over an empty stdin the worker never finds would refuse it).
#[tokio::test]
async fn an_empty_stdin_runs_and_reads_nothing() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let end = run_to_end(
        &client,
        "python3.13",
        "python3 -c 'import sys; print(len(sys.stdin.buffer.read()))'",
        json!({ "stdin_base64": "" }),
    )
    .await;
    assert_eq!(
        (end["state"].as_str(), end["stdout_tail"].as_str()),
        (Some("succeeded"), Some("0\n")),
        "{end}"
    );
    stack.shutdown().await;
}

/// A zip and a stdin large enough to be decoded, checked and hashed off the
/// api's async runtime, and hashed off the worker's (past
/// `spec::Inputs::HASH_INLINE_MAX`), arrive whole and the signed spec holds.
#[tokio::test]
async fn a_large_zip_and_stdin_are_signed_and_arrive_whole() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    // Pseudo-random hex, so deflate cannot shrink the zip below the line.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut text = |n: usize| -> String {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                char::from_digit((x % 16) as u32, 16).unwrap_or('0')
            })
            .collect()
    };
    let (file, stdin) = (text(1 << 20), text(300 << 10));
    let zip = zip_of(&[("big.txt", &file)]);
    assert!(zip.len() > 256 << 10, "the zip is only {} bytes", zip.len());
    let sum = |s: &str| s.bytes().map(u64::from).sum::<u64>();
    let end = run_to_end(
        &client,
        "python3.13",
        "python3 -c 'import sys; a=open(\"big.txt\",\"rb\").read(); b=sys.stdin.buffer.read(); \
         print(len(a), sum(a), len(b), sum(b))'",
        json!({ "zip_base64": b64(&zip), "stdin_base64": b64(stdin.as_bytes()) }),
    )
    .await;
    assert_eq!(end["state"], "succeeded", "{end}");
    assert_eq!(
        end["stdout_tail"],
        format!(
            "{} {} {} {}\n",
            file.len(),
            sum(&file),
            stdin.len(),
            sum(&stdin)
        ),
        "{end}"
    );
    stack.shutdown().await;
}
