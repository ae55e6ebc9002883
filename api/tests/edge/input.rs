//! Bad input at the tools: each error a result that says what to fix, with a
//! stable code, and no task created.

use super::*;

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
            json!({ "runtime_name": "cobol85", "command_base64": ok_cmd }),
            "unknown runtime \"cobol85\"",
        ),
        (
            json!({ "command_base64": ok_cmd }),
            "runtime is missing: give runtime (or runtime_name",
        ),
        (
            json!({ "runtime": "python3.13", "runtime_name": "node24", "command_base64": ok_cmd }),
            "runtime \"python3.13\" and runtime_name \"node24\" name different runtimes",
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

    // runtime_name is the same argument (for LangChain's adapters, which keep
    // `runtime` for themselves), alone or beside an equal runtime.
    for args in [
        json!({ "runtime_name": "node24", "command_base64": ok_cmd }),
        json!({ "runtime": "node24", "runtime_name": "node24", "command_base64": ok_cmd }),
    ] {
        let made = call_ok(&client, "run_script", args.clone()).await;
        let id = made["task_id"].as_str().expect("a task id").to_owned();
        let listed = call_ok(&client, "list_tasks", json!({})).await;
        let task = listed["tasks"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["task_id"] == id.as_str()))
            .cloned()
            .unwrap_or_default();
        assert_eq!(task["runtime"], "node24", "{args}: {listed}");
    }
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

/// A tool error's code and message: both in `structuredContent`, the message
/// also the text a model reads.
async fn call_err_code(client: &Client, tool: &'static str, args: Value) -> (String, String) {
    let r = call(client, tool, args.clone()).await;
    assert_eq!(
        r["isError"],
        json!(true),
        "{tool} {args} should have failed: {r}"
    );
    let text = r["content"][0]["text"].as_str().unwrap_or_default();
    assert_eq!(r["structuredContent"]["message"], text, "{r}");
    let code = r["structuredContent"]["code"].as_str().unwrap_or_default();
    (code.to_owned(), text.to_owned())
}

#[tokio::test]
async fn every_tool_error_carries_a_stable_code() {
    // No worker, so a task stays queued, and one queued task fills the queue.
    let mut stack = Stack::start(Options {
        extra_env: vec![("MAX_QUEUED_TASKS", "1".into())],
        ..Options::default()
    })
    .await;
    let client = stack.client().await;
    let ok = b64("true");
    let queued = run(&client, "python3.13", "true", json!({})).await;
    let unknown = uuid::Uuid::new_v4().to_string();
    let run_with = |extra: Value| {
        let mut args = json!({ "runtime": "python3.13", "command_base64": ok });
        if let (Value::Object(a), Value::Object(e)) = (&mut args, extra) {
            a.extend(e);
        }
        args
    };
    let cases = [
        (
            "run_script",
            run_with(json!({ "command_base64": "%%%" })),
            "invalid_argument",
        ),
        (
            "run_script",
            run_with(json!({ "runtime": "cobol85" })),
            "unknown_runtime",
        ),
        (
            "run_script",
            run_with(json!({ "language": "py" })),
            "invalid_argument",
        ),
        (
            "run_script",
            run_with(json!({ "timeout_seconds": "soon" })),
            "invalid_argument",
        ),
        (
            "run_script",
            run_with(json!({ "env": { "PATH": "/x" } })),
            "invalid_argument",
        ),
        (
            "run_script",
            run_with(json!({ "command_base64": b64("x".repeat(70_000)) })),
            "too_large",
        ),
        ("run_script", run_with(json!({})), "queue_full"),
        (
            "get_task_status",
            json!({ "task_id": unknown }),
            "unknown_task",
        ),
        (
            "kill_task",
            json!({ "task_id": "../../etc" }),
            "invalid_argument",
        ),
        (
            "get_task_files",
            json!({ "task_id": queued }),
            "not_finished",
        ),
        ("list_tasks", json!({ "limit": 0 }), "invalid_argument"),
        (
            "list_tasks",
            json!({ "cursor": "nope" }),
            "invalid_argument",
        ),
    ];
    for (tool, args, expected) in cases {
        let (code, message) = call_err_code(&client, tool, args.clone()).await;
        assert_eq!(code, expected, "{tool} {args}: {message}");
    }
    // A tool that does not exist is a protocol error, its code in `error.data`.
    let err = client
        .call_tool(CallToolRequestParams::new("no_such_tool"))
        .await
        .expect_err("an unknown tool is refused");
    let data = match err {
        rmcp::service::ServiceError::McpError(e) => e.data,
        other => panic!("not a JSON-RPC error: {other}"),
    };
    assert_eq!(data, Some(json!({ "code": "unknown_tool" })));
    // Redis gone: the store failing is `unavailable`, worth another try.
    stack.redis.stop();
    let (code, message) =
        call_err_code(&client, "get_task_status", json!({ "task_id": unknown })).await;
    assert_eq!(code, "unavailable", "{message}");
    assert!(message.contains("try again"), "{message}");
    stack.shutdown().await;
}
