//! The edge: bad input is refused with a clear message and creates nothing; the
//! bearer token guards /mcp; /healthz tells whether Redis is reachable.

mod common;

use std::time::Duration;

use common::*;
use redis::AsyncCommands;
use serde_json::json;

#[tokio::test]
async fn bad_input_is_an_error_result_that_says_what_to_fix_and_creates_no_task() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let ok_cmd = b64("echo hi");

    let cases = [
        (
            json!({ "runtime": "python3.13", "command_base64": "not base64!!" }),
            "command_base64 is not valid base64",
        ),
        (
            json!({ "runtime": "cobol85", "command_base64": ok_cmd }),
            "unknown runtime \"cobol85\": use one of node24, python3.13, python3.8",
        ),
        (
            json!({ "runtime": "python3.13", "command_base64": ok_cmd, "zip_base64": b64("this is not a zip") }),
            "zip_base64 is not a readable zip archive",
        ),
        (
            json!({ "runtime": "python3.13", "command_base64": ok_cmd, "zip_base64": "%%%" }),
            "zip_base64 is not valid base64",
        ),
        (
            json!({ "runtime": "python3.13", "command_base64": ok_cmd, "timeout_seconds": 0 }),
            "timeout_seconds must be at least 1 (got 0)",
        ),
        (
            json!({ "runtime": "python3.13", "command_base64": ok_cmd, "timeout_seconds": -5 }),
            "at least 1",
        ),
        (
            json!({ "runtime": "python3.13", "command_base64": b64("   ") }),
            "empty command",
        ),
        (
            json!({ "runtime": "python3.13", "command_base64": ok_cmd, "zip_base64": b64(zip_of(&[("../escape.txt", "x")])) }),
            "unsafe path",
        ),
    ];
    for (args, expected) in cases {
        let msg = call_err(&client, "run_script", args.clone()).await;
        assert!(
            msg.contains(expected),
            "for {args}: {msg:?} does not contain {expected:?}"
        );
    }
    assert_no_task_created(&stack).await;

    let unknown = uuid::Uuid::new_v4().to_string();
    for tool in ["get_task_status", "kill_task"] {
        let msg = call_err(&client, tool, json!({ "task_id": unknown })).await;
        assert!(
            msg.contains(&format!("no task with id {unknown}")),
            "{tool}: {msg}"
        );
        let msg = call_err(&client, tool, json!({ "task_id": "../../etc" })).await;
        assert!(msg.contains("is not a task id"), "{tool}: {msg}");
    }
    let id = run(&client, "python3.13", "true", json!({})).await;
    let msg = call_err(
        &client,
        "get_task_status",
        json!({ "task_id": id, "tail_bytes": -1 }),
    )
    .await;
    assert!(
        msg.contains("tail_bytes must be between 0 and 65536"),
        "{msg}"
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn tools_are_listed_with_input_and_output_schemas() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let tools = client.list_all_tools().await.expect("list tools");
    let mut names: Vec<_> = tools.iter().map(|t| t.name.to_string()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "get_task_files",
            "get_task_status",
            "kill_task",
            "list_tasks",
            "run_script"
        ]
    );
    for t in &tools {
        assert!(
            t.description.as_ref().is_some_and(|d| d.len() > 80),
            "{} needs a real description",
            t.name
        );
        assert!(t.output_schema.is_some(), "{} has no outputSchema", t.name);
    }
    let run = tools
        .iter()
        .find(|t| t.name == "run_script")
        .expect("run_script");
    let required = run
        .input_schema
        .get("required")
        .cloned()
        .unwrap_or_default();
    assert_eq!(required, json!(["runtime", "command_base64"]));
    let info = client.peer_info().expect("server info");
    assert_eq!(
        info.server_info.as_ref().map(|s| s.name.as_str()),
        Some("script-runner")
    );
    assert!(
        info.instructions
            .as_deref()
            .is_some_and(|i| i.contains("python3.13"))
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn mcp_requires_the_bearer_token_and_healthz_does_not() {
    let stack = Stack::start(Options::default()).await;
    let http = reqwest::Client::new();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;
    let post = |auth: Option<&'static str>| {
        let mut req = http
            .post(format!("{}/mcp", stack.url))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        req.send()
    };
    for auth in [
        None,
        Some("Bearer wrong-token-wrong-token-wrong-token-xx"),
        Some("Basic dXNlcjpwYXNz"),
        Some("Bearer "),
    ] {
        let resp = post(auth).await.expect("request");
        assert_eq!(resp.status(), 401, "auth {auth:?}");
        let challenge = resp
            .headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        assert!(
            challenge.starts_with("Bearer"),
            "auth {auth:?}: {challenge:?}"
        );
    }
    // The scheme is case-insensitive (RFC 7235): a lowercase "bearer" with the
    // right token gets through.
    let lower = http
        .post(format!("{}/mcp", stack.url))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("bearer {TOKEN}"))
        .body(body)
        .send()
        .await
        .expect("request");
    assert_eq!(lower.status(), 200);
    // The real client with a wrong token cannot even initialize.
    assert!(
        mcp_client(&stack.url, "wrong-token-wrong-token-wrong-token-xx")
            .await
            .is_err()
    );

    let health = http
        .get(format!("{}/healthz", stack.url))
        .send()
        .await
        .expect("healthz");
    assert_eq!(health.status(), 200);
    stack.shutdown().await;
}

#[tokio::test]
async fn the_host_header_is_checked_on_mcp() {
    let stack = Stack::start(Options::default()).await;
    let resp = reqwest::Client::new()
        .post(format!("{}/mcp", stack.url))
        .header("host", "evil.example")
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#)
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 403);
    stack.shutdown().await;
}

#[tokio::test]
async fn healthz_is_503_with_a_reason_while_redis_is_down() {
    let mut stack = Stack::start(Options::default()).await;
    let url = format!("{}/healthz", stack.url);
    stack.redis.stop();
    let resp = reqwest::get(&url).await.expect("healthz");
    assert_eq!(resp.status(), 503);
    let text = resp.text().await.unwrap_or_default();
    assert!(text.contains("Redis"), "{text}");
    // Metrics still answer, so the scrape records that Redis is down.
    let metrics = reqwest::Client::new()
        .get(format!("{}/metrics", stack.url))
        .header("authorization", format!("Bearer {TOKEN}"))
        .send()
        .await
        .expect("metrics");
    assert_eq!(metrics.status(), 200);
    assert!(
        metrics
            .text()
            .await
            .unwrap_or_default()
            .contains("script_runner_redis_up 0\n")
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn a_zip_over_the_compressed_size_cap_is_refused_with_both_sizes() {
    let stack = Stack::start(Options {
        extra_env: vec![("MAX_ZIP_BYTES", "1000".into())],
        ..Options::default()
    })
    .await;
    let client = stack.client().await;
    // Incompressible text (xorshift), so the zip stays larger than the cap.
    let mut x: u32 = 2_463_534_242;
    let noise: String = (0..4000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect();
    let zip = zip_of(&[("big.txt", &noise)]);
    let args =
        json!({ "runtime": "python3.13", "command_base64": b64("true"), "zip_base64": b64(&zip) });
    let msg = call_err(&client, "run_script", args).await;
    assert_eq!(
        msg,
        format!("the zip is {} bytes; at most 1000 are allowed", zip.len())
    );
    assert_no_task_created(&stack).await;
    stack.shutdown().await;
}

#[tokio::test]
async fn numbers_as_strings_are_accepted_and_wrong_arguments_are_named() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let cmd = b64("true");
    let ok = call_ok(
        &client,
        "run_script",
        json!({ "runtime": "python3.13", "command_base64": cmd, "timeout_seconds": "5" }),
    )
    .await;
    assert_eq!(ok["timeout_seconds"], 5);
    let ok = call_ok(
        &client,
        "run_script",
        json!({ "runtime": "python3.13", "command_base64": cmd, "timeout_seconds": 7.0 }),
    )
    .await;
    assert_eq!(ok["timeout_seconds"], 7);

    let msg = call_err(
        &client,
        "run_script",
        json!({ "runtime": "python3.13", "command_base64": cmd, "timeout_seconds": "soon" }),
    )
    .await;
    assert!(
        msg.contains("timeout_seconds must be a whole number, got \"soon\""),
        "{msg}"
    );
    let msg = call_err(
        &client,
        "run_script",
        json!({ "runtime": "python3.13", "command_base64": cmd, "timeout_seconds": 1.5 }),
    )
    .await;
    assert!(
        msg.contains("timeout_seconds must be a whole number, got 1.5"),
        "{msg}"
    );
    let msg = call_err(
        &client,
        "run_script",
        json!({ "runtime": "python3.13", "command_base64": cmd, "language": "python" }),
    )
    .await;
    assert!(
        msg.contains("unknown field `language`") && msg.contains("timeout_seconds"),
        "{msg}"
    );
    let id = ok["task_id"].as_str().unwrap_or_default();
    let msg = call_err(
        &client,
        "get_task_status",
        json!({ "task_id": id, "tail_bytes": [1] }),
    )
    .await;
    assert!(msg.contains("tail_bytes must be a whole number"), "{msg}");

    // Too large for an integer: lowered to the cap like any other large value.
    for huge in [json!(1e20), json!("99999999999999999999")] {
        let capped = call_ok(
            &client,
            "run_script",
            json!({ "runtime": "python3.13", "command_base64": cmd, "timeout_seconds": huge }),
        )
        .await;
        assert_eq!(capped["timeout_seconds"], 120);
    }
    // The schema still tells the model these are integers.
    let tools = client.list_all_tools().await.expect("tools");
    let run = tools
        .iter()
        .find(|t| t.name == "run_script")
        .expect("run_script");
    let ty = run
        .input_schema
        .get("properties")
        .and_then(|p| p.get("timeout_seconds"))
        .and_then(|t| t.get("type"))
        .cloned();
    assert_eq!(
        ty,
        Some(json!(["integer", "null"])),
        "{:?}",
        run.input_schema
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn metrics_report_the_queue_the_workers_and_every_outcome_behind_the_token() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    run_to_end(&client, "python3.13", "true", json!({})).await;
    run_to_end(&client, "python3.13", "exit 3", json!({})).await;
    let sleeper = start_sleeper(&client, "up").await;
    call_ok(&client, "kill_task", json!({ "task_id": sleeper })).await;

    let url = format!("{}/metrics", stack.url);
    let anonymous = reqwest::get(&url).await.expect("metrics");
    assert_eq!(anonymous.status(), 401);
    let http = reqwest::Client::new();
    // The idle count must come from a heartbeat written after the work ended,
    // not one left from before it started: drop the current one and wait for
    // the next (the worker is absent from the metrics until it comes).
    wait_until(
        "the kill to be recorded",
        Duration::from_secs(30),
        || async {
            let s = call_ok(&client, "get_task_status", json!({ "task_id": sleeper })).await;
            (s["state"] == "killed").then_some(())
        },
    )
    .await;
    stack.drop_heartbeat("main").await;
    let text = wait_until("the metrics to show every outcome and an idle worker", Duration::from_secs(30), || async {
        let resp = http.get(&url).header("authorization", format!("Bearer {TOKEN}")).send().await.ok()?;
        let text = resp.text().await.ok()?;
        (text.contains("script_runner_tasks_finished_total{state=\"killed\",reason_kind=\"killed-by-user\"} 1\n")
            && text.contains(&format!("script_runner_worker_tasks_running{{worker=\"{}\"}} 0\n", stack.worker_name)))
        .then_some(text)
    })
    .await;
    for line in [
        "script_runner_redis_up 1\n",
        "script_runner_tasks_submitted_total 3\n",
        "script_runner_tasks_finished_total{state=\"succeeded\",reason_kind=\"exited\"} 1\n",
        "script_runner_tasks_finished_total{state=\"failed\",reason_kind=\"exited\"} 1\n",
        "script_runner_workers_alive 1\n",
        "script_runner_jobs_queued 0\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
    stack.shutdown().await;
}

/// `MAX_QUEUED_TASKS` is a cap, not a hint: the check and the submit are one
/// step in Redis, so clients submitting at once cannot pass it together, and a
/// refused submit stores nothing and says why.
#[tokio::test]
async fn max_queued_tasks_holds_under_concurrent_submits() {
    let stack = Stack::start(Options {
        start_worker: false,
        extra_env: vec![("MAX_QUEUED_TASKS", "5".to_owned())],
        ..Options::default()
    })
    .await;
    let client = stack.client().await;
    let submits = (0..24).map(|i| {
        let client = &client;
        async move {
            let args =
                json!({ "runtime": "python3.13", "command_base64": b64(format!("echo {i}")) });
            call(client, "run_script", args).await
        }
    });
    let results = futures_util::future::join_all(submits).await;
    let (refused, queued): (Vec<_>, Vec<_>) =
        results.iter().partition(|r| r["isError"] == json!(true));
    assert_eq!(queued.len(), 5, "tasks queued with MAX_QUEUED_TASKS=5");
    for r in &refused {
        assert_eq!(
            r["content"][0]["text"],
            "the service is at capacity (5 tasks queued or running); wait for some to finish and try again"
        );
    }
    let mut r = stack.redis_conn().await;
    let jobs: u64 = r.xlen(stack.keys().jobs()).await.expect("XLEN");
    let records: Vec<String> = r.keys(stack.keys().task("*")).await.expect("KEYS");
    assert_eq!((jobs, records.len()), (5, 5), "{records:?}");
    stack.shutdown().await;
}
