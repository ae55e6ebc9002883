//! The edge: bad input is refused with a clear message and creates nothing; the
//! bearer token guards /mcp; /healthz tells whether Redis is reachable; another
//! owner's task files are not even read.

// Test code: a failed expectation is a panic (the workspace lints deny these in product code).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod harness;

use harness::*;
use redis::AsyncCommands;
use rmcp::ServiceExt;
use rmcp::model::{CacheScope, CallToolRequestParams, MetaObject, ProtocolVersion};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use script_runner_api::tools::{SERVER_INFO_META_KEY, TOOL_LIST_TTL_MS};
use serde_json::{Value, json};
use testkit::process::ApiProcess;

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
    // By default no browser origin is trusted, however well-known.
    let resp = http
        .post(format!("{}/mcp", stack.url))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("origin", "https://claude.ai")
        .body(body)
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 403);
    let text = resp.text().await.unwrap_or_default();
    assert!(text.contains("ALLOWED_ORIGINS is empty"), "{text}");
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

/// `/healthz` is public: while Redis is down it says "unavailable" and nothing
/// of Redis's error; the reason is in the api's log, once however often it is
/// asked. `/metrics` (the admin's) still answers, so the scrape records it.
#[tokio::test]
async fn healthz_says_unavailable_without_redis_s_error_and_logs_the_reason_once() {
    let mut redis = Redis::start().await;
    let health_addr = format!("127.0.0.1:{}", testkit::free_port());
    let api = ApiProcess::start(&redis.url(), &[("HEALTH_ADDR", &health_addr)]).await;
    let url = format!("{}/healthz", api.url);
    let details = format!("http://{health_addr}/healthz");
    let resp = reqwest::get(&url).await.expect("healthz");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap_or_default(), "ok\n");
    let resp = reqwest::get(&details).await.expect("healthz details");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap_or_default(), "ok\n");
    redis.stop();
    for _ in 0..5 {
        let resp = reqwest::get(&url).await.expect("healthz");
        assert_eq!(resp.status(), 503);
        assert_eq!(resp.text().await.unwrap_or_default(), "unavailable\n");
    }
    // The loopback listener (HEALTH_ADDR) says why; it serves nothing else.
    let resp = reqwest::get(&details).await.expect("healthz details");
    assert_eq!(resp.status(), 503);
    let why = resp.text().await.unwrap_or_default();
    assert!(
        why.starts_with("unavailable: ") && why.contains("Redis"),
        "{why}"
    );
    let other = reqwest::get(format!("http://{health_addr}/metrics")).await;
    assert_eq!(other.map(|r| r.status().as_u16()).ok(), Some(404));
    let lines = |log: &str| {
        log.lines()
            .filter(|l| l.contains("/healthz answered 503"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let logged = wait_until(
        "the reason in the log",
        std::time::Duration::from_secs(10),
        || {
            let found = lines(&api.log());
            async move { (!found.is_empty()).then_some(found) }
        },
    )
    .await;
    assert_eq!(logged.len(), 1, "one line for five failures: {logged:?}");
    assert!(logged[0].contains("Redis"), "{logged:?}");
    let metrics = reqwest::Client::new()
        .get(format!("{}/metrics", api.url))
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
}

/// An rmcp client that sends `Origin: origin` with every request, as a browser
/// would.
async fn client_from_origin(
    url: &str,
    origin: &str,
) -> Result<Client, rmcp::service::ClientInitializeError> {
    let headers = [(
        reqwest::header::ORIGIN,
        reqwest::header::HeaderValue::from_str(origin).expect("an origin"),
    )];
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(format!("{url}/mcp"))
            .auth_header(TOKEN)
            .custom_headers(headers.into_iter().collect()),
    );
    ().serve(transport).await
}

/// The Streamable HTTP transport's Origin rule: a foreign `Origin` gets 403
/// with a JSON-RPC error naming it and `ALLOWED_ORIGINS`, on `/mcp` and
/// `/metrics`, with or without a token (the origin is checked first); an
/// allowed origin and no `Origin` at all are served.
#[tokio::test]
async fn a_foreign_origin_gets_403_and_an_allowed_one_or_none_is_served() {
    let stack = Stack::start(Options {
        extra_env: vec![("ALLOWED_ORIGINS", "https://claude.ai".into())],
        ..Options::default()
    })
    .await;
    let http = reqwest::Client::new();
    let post = |origin: Option<&'static str>, token: Option<&'static str>| {
        let mut req = http
            .post(format!("{}/mcp", stack.url))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#);
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        req.send()
    };
    let evil = "https://evil.example.com";
    for token in [Some(TOKEN), None] {
        let resp = post(Some(evil), token).await.expect("request");
        assert_eq!(resp.status(), 403, "token {token:?}");
        let body: Value = resp.json().await.expect("a JSON-RPC error");
        assert_eq!(
            (&body["jsonrpc"], &body["id"]),
            (&json!("2.0"), &Value::Null)
        );
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(evil) && message.contains("ALLOWED_ORIGINS"),
            "{message}"
        );
    }
    let metrics = http
        .get(format!("{}/metrics", stack.url))
        .header("origin", evil)
        .header("authorization", format!("Bearer {TOKEN}"))
        .send()
        .await
        .expect("metrics");
    assert_eq!(metrics.status(), 403);
    let resp = post(Some("https://claude.ai"), Some(TOKEN))
        .await
        .expect("request");
    assert_eq!(resp.status(), 200);
    let resp = post(Some("https://claude.ai"), None)
        .await
        .expect("request");
    assert_eq!(
        resp.status(),
        401,
        "an allowed origin still needs the token"
    );

    // The real client: refused from a foreign origin, served from the allowed
    // one and without any Origin.
    assert!(client_from_origin(&stack.url, evil).await.is_err());
    let allowed = client_from_origin(&stack.url, "https://claude.ai")
        .await
        .expect("served from an allowed origin");
    run(&allowed, "python3.13", "true", json!({})).await;
    let plain = stack.client().await;
    assert!(!plain.list_all_tools().await.expect("tools").is_empty());
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

/// `MAX_QUEUED_TASKS` is a cap, not a hint: the check and the submit are one
/// step in Redis, so clients submitting at once cannot pass it together, and a
/// refused submit stores nothing and says why.
#[tokio::test]
async fn max_queued_tasks_holds_under_concurrent_submits() {
    let stack = Stack::start(Options {
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

/// The server's name and version in a result's `_meta`, if there.
fn server_info(meta: Option<&MetaObject>) -> Option<(String, String)> {
    let info = meta?.get(SERVER_INFO_META_KEY)?;
    Some((
        info["name"].as_str()?.into(),
        info["version"].as_str()?.into(),
    ))
}

/// A client on protocol 2026-07-28 (`server/discover`, no `initialize`).
async fn modern_client(stack: &Stack) -> Client {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", stack.url))
            .auth_header(TOKEN),
    );
    let lifecycle = ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    ().serve_with_lifecycle(transport, lifecycle)
        .await
        .expect("a 2026-07-28 client connects")
}

#[tokio::test]
async fn the_tool_list_quotes_the_configured_limits_and_may_be_cached() {
    let stack = Stack::start(Options {
        extra_env: vec![("DEFAULT_TIMEOUT_SECONDS", "45".into())],
        ..Options::default()
    })
    .await;
    let us = Some((
        "script-runner".to_owned(),
        env!("CARGO_PKG_VERSION").to_owned(),
    ));
    let (legacy, modern) = (stack.client().await, modern_client(&stack).await);
    // Cache hints exist from 2026-07-28 on.
    let hints = Some((TOOL_LIST_TTL_MS, CacheScope::Public));
    for (client, hints) in [(&legacy, None), (&modern, hints)] {
        let listed = client.list_tools(None).await.expect("tools/list");
        assert_eq!(listed.ttl_ms.zip(listed.cache_scope), hints);
        let run = listed.tools.iter().find(|t| t.name == "run_script");
        let description = run
            .and_then(|t| t.description.as_deref())
            .unwrap_or_default();
        assert!(
            description.contains("default 45 s, at most 120 s"),
            "{description}"
        );
        let timeout = run
            .and_then(|t| t.input_schema.get("properties"))
            .and_then(|p| p["timeout_seconds"]["description"].as_str())
            .unwrap_or_default();
        assert!(
            timeout.contains("default 45") && timeout.contains("120"),
            "{timeout}"
        );

        // Every result names the server: initialize (or server/discover),
        // tools/list, tools/call (an answer and an error alike).
        let info = client.peer_info().expect("server info");
        assert_eq!(server_info(info.meta.as_ref()), us, "initialize");
        assert_eq!(server_info(listed.meta.as_ref()), us, "tools/list");
        for args in [json!({}), json!({ "limit": 0 })] {
            let r = call(client, "list_tasks", args).await;
            let meta: Option<MetaObject> = serde_json::from_value(r["_meta"].clone()).ok();
            assert_eq!(server_info(meta.as_ref()), us, "tools/call: {r}");
        }
    }
    stack.shutdown().await;
}

/// An API key is looked up in Redis on every request: while Redis is down the
/// key cannot be checked, which is 503 (try again), never the 401 of a revoked
/// key; a token that is no key is still 401 and the admin token still passes.
/// And `/metrics` is the admin's.
#[tokio::test]
async fn an_api_key_is_503_not_401_while_redis_is_down_and_metrics_are_the_admins() {
    let mut stack = Stack::start(Options::default()).await;
    let mut conn = stack
        .redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let record = shared::apikey::ApiKeyRecord {
        name: "ci".into(),
        scopes: shared::apikey::Scopes::ALL,
        limits: shared::apikey::Limits::default(),
        created_at: None,
        last_used_at: None,
    };
    let keys = shared::Keys::new(stack.prefix.clone());
    let key = store::apikeys::create(&mut conn, &keys, &record)
        .await
        .expect("create");
    let http = reqwest::Client::new();
    let post = |token: String| {
        http.post(format!("{}/mcp", stack.url))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("authorization", format!("Bearer {token}"))
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#)
            .send()
    };
    let with_key = post(key.expose().to_owned()).await.expect("request");
    assert_eq!(with_key.status(), 200);
    let metrics = |token: String| {
        http.get(format!("{}/metrics", stack.url))
            .header("authorization", format!("Bearer {token}"))
            .send()
    };
    let resp = metrics(key.expose().to_owned()).await.expect("metrics");
    assert_eq!(resp.status(), 403, "/metrics is not an API key's");

    stack.redis.stop();
    let resp = post(key.expose().to_owned()).await.expect("request");
    assert_eq!(resp.status(), 503);
    let text = resp.text().await.unwrap_or_default();
    assert!(
        text.contains("Redis") && text.contains("try again"),
        "{text}"
    );
    let resp = post("srk_not-a-key".into()).await.expect("request");
    assert_eq!(
        resp.status(),
        503,
        "any key-shaped token needs Redis to be told apart"
    );
    let resp = post("wrong-token-wrong-token-wrong-token-xx".into())
        .await
        .expect("request");
    assert_eq!(resp.status(), 401);
    let resp = post(TOKEN.into()).await.expect("request");
    assert_eq!(resp.status(), 200, "the admin token needs no Redis");
    stack.shutdown().await;
}

/// GET calls Redis has served so far (`INFO commandstats`).
async fn gets_served(c: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(c)
        .await
        .expect("info");
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_get:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a count"))
}

/// get_task_files on another owner's task never reads its zip (which may be
/// megabytes): the owner is read first, so a foreign id costs what an unknown
/// one does. The owner's own read gets the zip.
#[tokio::test]
async fn another_owners_files_are_never_read() {
    let redis = Redis::start().await;
    let keys = shared::Keys::new("sr");
    let target = store::redis_pool::RedisTarget::url(&redis.url()).expect("url");
    let store = script_runner_api::db::Store::new(&target, keys.clone(), None).expect("store");
    let mut c = redis.conn().await;
    let id = "6f1c2a52-8d0e-4c3b-9a51-0d6a2f7e9b10";
    let () = c
        .hset_multiple(
            keys.task(id),
            &[("state", "succeeded"), ("owner", "alice"), ("files", "{}")],
        )
        .await
        .expect("hset");
    let () = c
        .set(keys.task_files(id), b"PK zip".as_slice())
        .await
        .expect("set");
    let before = gets_served(&mut c).await;
    let foreign = store
        .files(id, |owner| owner == Some(&shared::Owner::Key("bob".into())))
        .await
        .expect("read");
    assert!(foreign.is_none());
    assert_eq!(
        gets_served(&mut c).await,
        before,
        "bob's read fetched alice's zip"
    );
    let own = store
        .files(id, |owner| {
            owner == Some(&shared::Owner::Key("alice".into()))
        })
        .await
        .expect("read")
        .expect("alice sees her task");
    assert_eq!(own.2.as_deref(), Some(b"PK zip".as_slice()));
    assert_eq!(gets_served(&mut c).await, before + 1);
}
