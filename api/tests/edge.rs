//! The edge: bad input is refused with a clear message and creates nothing; the
//! bearer token guards /mcp; /healthz tells whether Redis is reachable; another
//! owner's task files are not even read; workspaces are taken one task at a
//! time and seen by their owner only.

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

#[path = "edge/access.rs"]
mod access;
#[path = "edge/input.rs"]
mod input;
#[path = "edge/workspaces/mod.rs"]
mod workspaces;

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
            "delete_workspace",
            "fork_workspace",
            "get_task_files",
            "get_task_status",
            "get_workspace",
            "kill_task",
            "list_tasks",
            "list_workspaces",
            "read_files",
            "run_script",
            "write_files"
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
    // The runtime is given under one of two names, so neither is required
    // (see `runtime_name`), and no tool may say "one of" at the top level.
    assert_eq!(required, json!(["command_base64"]));
    let props = run
        .input_schema
        .get("properties")
        .cloned()
        .unwrap_or_default();
    assert!(props.get("runtime").is_some() && props.get("runtime_name").is_some());
    for t in &tools {
        for word in ["anyOf", "oneOf", "allOf"] {
            assert!(
                t.input_schema.get(word).is_none(),
                "{}'s input schema has a top-level {word}, which the Anthropic API refuses",
                t.name
            );
        }
    }
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
