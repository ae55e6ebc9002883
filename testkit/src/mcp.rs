//! The rmcp client over Streamable HTTP, and the tool calls tests make with it.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

use crate::wait_until;

pub type Client = RunningService<rmcp::RoleClient, ()>;

pub async fn mcp_client(
    url: &str,
    token: &str,
) -> Result<Client, rmcp::service::ClientInitializeError> {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(format!("{url}/mcp")).auth_header(token),
    );
    ().serve(transport).await
}

/// `mcp_client`, its connections made from `local` (an address on the loopback
/// interface such as 127.0.0.2), so that one test can play several clients.
pub async fn mcp_client_from(
    url: &str,
    token: &str,
    local: std::net::IpAddr,
) -> Result<Client, rmcp::service::ClientInitializeError> {
    let http = reqwest::Client::builder()
        .local_address(local)
        .build()
        .expect("an HTTP client");
    let transport = StreamableHttpClientTransport::with_client(
        http,
        StreamableHttpClientTransportConfig::with_uri(format!("{url}/mcp")).auth_header(token),
    );
    ().serve(transport).await
}

/// A tool call's result as JSON: `structuredContent`, `isError`, `content`.
pub async fn call(client: &Client, tool: &'static str, args: Value) -> Value {
    let Value::Object(args) = args else {
        panic!("tool arguments must be an object")
    };
    let result = client
        .call_tool(CallToolRequestParams::new(tool).with_arguments(args))
        .await
        .unwrap_or_else(|e| panic!("{tool} failed at the protocol level: {e}"));
    serde_json::to_value(result).expect("result serializes")
}

/// The structured result of a successful call (panics on `isError`).
pub async fn call_ok(client: &Client, tool: &'static str, args: Value) -> Value {
    let r = call(client, tool, args).await;
    assert_ne!(r["isError"], json!(true), "{tool} returned an error: {r}");
    r["structuredContent"].clone()
}

/// The message of a call that must fail with `isError: true`.
pub async fn call_err(client: &Client, tool: &'static str, args: Value) -> String {
    let r = call(client, tool, args).await;
    assert_eq!(r["isError"], json!(true), "{tool} should have failed: {r}");
    r["content"][0]["text"]
        .as_str()
        .expect("error text")
        .to_owned()
}

pub fn b64(s: impl AsRef<[u8]>) -> String {
    STANDARD.encode(s)
}

/// Starts a script and returns its task id.
pub async fn run(client: &Client, runtime: &str, command: &str, extra: Value) -> String {
    let mut args = json!({ "runtime": runtime, "command_base64": b64(command) });
    if let (Value::Object(a), Value::Object(e)) = (&mut args, extra) {
        a.extend(e);
    }
    let out = call_ok(client, "run_script", args).await;
    assert_eq!(out["state"], "queued");
    out["task_id"].as_str().expect("task_id").to_owned()
}

pub async fn status(client: &Client, task_id: &str) -> Value {
    call_ok(client, "get_task_status", json!({ "task_id": task_id })).await
}

/// Polls until the task's status satisfies `done`.
pub async fn wait_status(
    client: &Client,
    task_id: &str,
    what: &str,
    deadline: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    wait_until(what, deadline, || async {
        let s = status(client, task_id).await;
        done(&s).then_some(s)
    })
    .await
}

pub fn is_final(s: &Value) -> bool {
    matches!(
        s["state"].as_str(),
        Some("succeeded" | "failed" | "killed" | "timed-out")
    )
}

/// Runs a script to its final state and returns that status.
pub async fn run_to_end(client: &Client, runtime: &str, command: &str, extra: Value) -> Value {
    run_to_end_within(client, runtime, command, extra, Duration::from_secs(120)).await
}

/// `run_to_end` for a task that may legitimately take longer than two minutes.
pub async fn run_to_end_within(
    client: &Client,
    runtime: &str,
    command: &str,
    extra: Value,
    deadline: Duration,
) -> Value {
    let id = run(client, runtime, command, extra).await;
    wait_status(client, &id, "the task to finish", deadline, is_final).await
}

/// Starts `echo <marker>; sleep 300` and waits until it is running and has
/// printed the marker.
pub async fn start_sleeper(client: &Client, marker: &str) -> String {
    start_until_output(
        client,
        &format!("echo {marker}; sleep 300"),
        json!({}),
        &format!("{marker}\n"),
    )
    .await
}

/// Starts `command` and waits until its stdout is exactly `first_output`, so the
/// test knows the container is up and the script well under way.
pub async fn start_until_output(
    client: &Client,
    command: &str,
    extra: Value,
    first_output: &str,
) -> String {
    let id = run(client, "python3.13", command, extra).await;
    wait_status(
        client,
        &id,
        "the task's first output",
        Duration::from_secs(60),
        |s| s["stdout_tail"] == first_output,
    )
    .await;
    id
}
