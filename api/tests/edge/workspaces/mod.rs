//! Persistent workspaces at the api, with no worker: run_script's `workspace`
//! (a new one, one at a time, the head or a version), the workspace tools, and
//! who sees what. A version is committed here as a worker would: its task
//! claimed and WS_COMMIT run through the real scripts.

use super::*;
use shared::scripts::{Saved, ScriptCall, WsReply};
use shared::workspace::{BlobDigest, WorkspaceCaps, WorkspaceId};

mod arguments;
mod edits;
mod limits;

/// A fresh API key named `name` with `scopes`; its token.
async fn api_key(stack: &Stack, name: &str, scopes: shared::apikey::Scopes) -> String {
    let mut conn = stack.redis_conn().await;
    let record = shared::apikey::ApiKeyRecord {
        name: name.into(),
        scopes,
        limits: shared::apikey::Limits::default(),
        allow_hosts: None,
        created_at: None,
        last_used_at: None,
    };
    store::apikeys::create(&mut conn, &stack.keys(), &record)
        .await
        .expect("create key")
        .expose()
        .to_owned()
}

async fn client_as(stack: &Stack, token: &str) -> Client {
    mcp_client(&stack.url, token)
        .await
        .expect("MCP client connects")
}

/// run_script `true` with `workspace`: the raw result.
async fn run_on(client: &Client, workspace: Value) -> Value {
    let args =
        json!({ "runtime": "python3.13", "command_base64": b64("true"), "workspace": workspace });
    call(client, "run_script", args).await
}

/// A new workspace, and the task that made it (queued: no worker).
async fn new_workspace(client: &Client) -> (String, String) {
    let r = run_on(client, json!("new")).await;
    assert_ne!(r["isError"], json!(true), "{r}");
    let out = &r["structuredContent"];
    let ws = out["workspace_id"]
        .as_str()
        .expect("workspace_id")
        .to_owned();
    let task = out["task_id"].as_str().expect("task_id").to_owned();
    (ws, task)
}

/// A failed call's code and message (both in structuredContent, the message
/// also its text).
async fn refusal(client: &Client, tool: &'static str, args: Value) -> (String, String) {
    let r = call(client, tool, args.clone()).await;
    assert_eq!(r["isError"], json!(true), "{tool} {args} should fail: {r}");
    let text = r["content"][0]["text"].as_str().unwrap_or_default();
    assert_eq!(r["structuredContent"]["message"], text, "{r}");
    let code = r["structuredContent"]["code"].as_str().unwrap_or_default();
    (code.to_owned(), text.to_owned())
}

async fn task_records(stack: &Stack) -> usize {
    let mut r = stack.redis_conn().await;
    let keys: Vec<String> = r.keys(stack.keys().task("*")).await.expect("KEYS");
    // The task hashes only, not their :events streams.
    keys.iter().filter(|k| k.matches(':').count() == 2).count()
}

/// What a worker does when a task on workspace `ws` ends: claims it, then
/// commits its /workspace as the next version (through the real scripts).
async fn commit_version(stack: &Stack, task: &str, ws: &str, base: u64, bytes: u64) -> u64 {
    let caps = WorkspaceCaps {
        versions_kept: 10,
        owner_max_bytes: 0,
    };
    commit_capped(stack, task, ws, base, bytes, caps).await
}

/// `commit_version` under `caps` (0: the cap stopped it, or no version).
async fn commit_capped(
    stack: &Stack,
    task: &str,
    ws: &str,
    base: u64,
    bytes: u64,
    caps: WorkspaceCaps,
) -> u64 {
    let mut conn = stack.redis_conn().await;
    let keys = stack.keys();
    let claimed = store::scripts::invoke(&mut conn, &ScriptCall::claim(&keys, task, "w1", "0-1"))
        .await
        .expect("claim");
    assert_eq!(
        claimed,
        shared::scripts::TaskStateReply::State(shared::TaskState::Running)
    );
    let manifest = BlobDigest::of(task.as_bytes());
    let id = WorkspaceId::parse(ws).expect("a workspace id");
    let saved = Saved::Version {
        manifest: &manifest,
        bytes,
        files: 3,
        // No sweep has run: the epoch is still 0.
        epoch: 0,
    };
    let call = ScriptCall::ws_commit(&keys, task, "w1", &id, base, saved, caps);
    match store::scripts::invoke(&mut conn, &call)
        .await
        .expect("commit")
    {
        WsReply::Done(v) => v,
        other => panic!("commit refused: {other:?}"),
    }
}

#[tokio::test]
async fn a_new_workspace_is_busy_with_its_task_and_every_view_names_it() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let plain = run(&client, "python3.13", "true", json!({})).await;
    let (ws, first) = new_workspace(&client).await;
    assert!(WorkspaceId::parse(&ws).is_ok(), "{ws}");

    let s = status(&client, &first).await;
    assert_eq!(s["workspace_id"], ws, "{s}");
    assert_eq!(
        (&s["workspace_version"], &s["workspace_note"]),
        (&Value::Null, &Value::Null),
        "{s}"
    );
    let s = status(&client, &plain).await;
    for field in ["workspace_id", "workspace_version", "workspace_note"] {
        assert!(s.get(field).is_none(), "{field} on a task without one: {s}");
    }
    let listed = call_ok(&client, "list_tasks", json!({})).await;
    let entry = |id: &str| {
        listed["tasks"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["task_id"] == id).cloned())
            .unwrap_or_default()
    };
    assert_eq!(entry(&first)["workspace_id"], ws, "{listed}");
    assert!(entry(&plain).get("workspace_id").is_none(), "{listed}");

    // A second task on it while the first is queued: refused, naming it.
    for second in [json!({ "id": ws }), json!({ "id": ws, "version": 0 })] {
        let (code, message) = refusal(
            &client,
            "run_script",
            json!({ "runtime": "python3.13", "command_base64": b64("true"), "workspace": second }),
        )
        .await;
        assert_eq!(code, "workspace_busy", "{message}");
        assert!(
            message.contains(&format!("task {first} is using it"))
                && message.contains("fork_workspace"),
            "{message}"
        );
    }
    assert_eq!(
        task_records(&stack).await,
        2,
        "a refused run_script stores nothing"
    );

    let got = call_ok(&client, "get_workspace", json!({ "workspace_id": ws })).await;
    assert_eq!(
        (&got["busy_task"], &got["head"]),
        (&json!(first), &json!(0)),
        "{got}"
    );
    assert_eq!(got["versions"], json!([]));
    assert_eq!(got["forked_from"], Value::Null);
    let listed = call_ok(&client, "list_workspaces", json!({})).await;
    assert_eq!(listed["workspaces"][0]["workspace_id"], ws, "{listed}");
    assert_eq!(listed["next_cursor"], Value::Null);

    // Killed before any worker took it, the task holds the workspace no more.
    call_ok(&client, "kill_task", json!({ "task_id": first })).await;
    let got = call_ok(&client, "get_workspace", json!({ "workspace_id": ws })).await;
    assert_eq!(got["busy_task"], Value::Null, "{got}");
    let next = run_on(&client, json!({ "id": ws })).await;
    assert_eq!(next["structuredContent"]["workspace_id"], ws, "{next}");
    stack.shutdown().await;
}

/// One task at a time per workspace, decided in SUBMIT: of 8 submits at once
/// on a free workspace (on its head, or naming version 0), exactly one is
/// queued, and the others are told which task has it.
#[tokio::test]
async fn of_concurrent_submits_on_one_free_workspace_exactly_one_is_queued() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let (ws, first) = new_workspace(&client).await;
    call_ok(&client, "kill_task", json!({ "task_id": first })).await;
    let submits = (0..8).map(|i| {
        let (client, ws) = (&client, &ws);
        async move {
            let workspace = if i % 2 == 0 {
                json!({ "id": ws })
            } else {
                json!({ "id": ws, "version": 0 })
            };
            run_on(client, workspace).await
        }
    });
    let results = futures_util::future::join_all(submits).await;
    let (refused, queued): (Vec<_>, Vec<_>) =
        results.iter().partition(|r| r["isError"] == json!(true));
    assert_eq!(queued.len(), 1, "{results:?}");
    let winner = queued[0]["structuredContent"]["task_id"]
        .as_str()
        .expect("task_id");
    for r in &refused {
        assert_eq!(r["structuredContent"]["code"], "workspace_busy", "{r}");
        let message = r["content"][0]["text"].as_str().unwrap_or_default();
        assert!(message.contains(winner), "{message}");
    }
    assert_eq!(task_records(&stack).await, 2);
    stack.shutdown().await;
}

/// Another key's workspace is answered exactly like an id that never existed,
/// by every tool, and none of them touches it; list_workspaces lists the
/// caller's own. The admin key sees every workspace.
#[tokio::test]
async fn another_owners_workspace_is_answered_like_an_unknown_one() {
    let stack = Stack::start(Options::default()).await;
    let all = shared::apikey::Scopes::ALL;
    let alice = client_as(&stack, &api_key(&stack, "alice", all).await).await;
    let bob = client_as(&stack, &api_key(&stack, "bob", all).await).await;
    let (theirs, _) = new_workspace(&alice).await;
    let (mine, _) = new_workspace(&bob).await;
    let unknown = uuid::Uuid::new_v4().to_string();
    let calls = |id: &str| {
        [
            (
                "run_script",
                json!({ "runtime": "python3.13", "command_base64": b64("true"), "workspace": { "id": id } }),
            ),
            (
                "run_script",
                json!({ "runtime": "python3.13", "command_base64": b64("true"), "workspace": { "id": id, "version": 0 } }),
            ),
            ("get_workspace", json!({ "workspace_id": id })),
            ("fork_workspace", json!({ "workspace_id": id })),
            ("delete_workspace", json!({ "workspace_id": id })),
        ]
    };
    for ((tool, foreign), (_, never)) in calls(&theirs).into_iter().zip(calls(&unknown)) {
        let (code, message) = refusal(&bob, tool, foreign).await;
        let (unknown_code, unknown_message) = refusal(&bob, tool, never).await;
        assert_eq!(code, "unknown_workspace", "{tool}: {message}");
        assert_eq!(
            (code, message.replace(&theirs, "<id>")),
            (unknown_code, unknown_message.replace(&unknown, "<id>")),
            "{tool}"
        );
    }
    let ids = |listing: &Value| -> Vec<String> {
        listing["workspaces"]
            .as_array()
            .map(|w| {
                w.iter()
                    .filter_map(|w| w["workspace_id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let bobs = call_ok(&bob, "list_workspaces", json!({})).await;
    assert_eq!(ids(&bobs), std::slice::from_ref(&mine));
    let alices = call_ok(&alice, "list_workspaces", json!({})).await;
    assert_eq!(ids(&alices), std::slice::from_ref(&theirs));
    // Untouched: still alice's, still busy with her task, no fork of it made.
    let got = call_ok(&alice, "get_workspace", json!({ "workspace_id": theirs })).await;
    assert!(got["busy_task"].is_string(), "{got}");
    assert_eq!(
        task_records(&stack).await,
        2,
        "bob's refused runs stored nothing"
    );
    let admin = stack.client().await;
    let every = call_ok(&admin, "list_workspaces", json!({})).await;
    let mut seen = ids(&every);
    seen.sort();
    let mut want = vec![theirs.clone(), mine];
    want.sort();
    assert_eq!(seen, want);
    call_ok(&admin, "get_workspace", json!({ "workspace_id": theirs })).await;
    stack.shutdown().await;
}

/// Versions as a worker commits them, forks of them (O(1): a first version
/// naming the same manifest), a run on the head or on a version, an unknown
/// version, and delete.
#[tokio::test]
async fn versions_forks_and_delete() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let (ws, first) = new_workspace(&client).await;
    assert_eq!(commit_version(&stack, &first, &ws, 0, 12).await, 1);
    let s = status(&client, &first).await;
    assert_eq!(
        (&s["workspace_id"], &s["workspace_version"]),
        (&json!(ws), &json!(1)),
        "{s}"
    );
    let got = call_ok(&client, "get_workspace", json!({ "workspace_id": ws })).await;
    assert_eq!(
        (&got["head"], &got["busy_task"]),
        (&json!(1), &Value::Null),
        "{got}"
    );
    let v1 = &got["versions"][0];
    assert_eq!(
        (
            &v1["version"],
            &v1["task_id"],
            &v1["bytes"],
            &v1["files"],
            &v1["parent"]
        ),
        (&json!(1), &json!(first), &json!(12), &json!(3), &json!(0)),
        "{got}"
    );
    assert!(
        v1["created_at"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{v1}"
    );

    // Unknown versions, for fork_workspace and run_script alike.
    let (code, message) = refusal(
        &client,
        "fork_workspace",
        json!({ "workspace_id": ws, "version": 5 }),
    )
    .await;
    assert_eq!(code, "unknown_version", "{message}");
    assert!(
        message.contains(&format!("workspace {ws} has no version 5"))
            && message.contains("get_workspace"),
        "{message}"
    );
    let (code, message) = refusal(
        &client,
        "run_script",
        json!({ "runtime": "python3.13", "command_base64": b64("true"), "workspace": { "id": ws, "version": 7 } }),
    )
    .await;
    assert_eq!(code, "unknown_version", "{message}");

    // A fork of the head, and of version 0.
    let fork = call_ok(&client, "fork_workspace", json!({ "workspace_id": ws })).await;
    let forked = fork["workspace_id"]
        .as_str()
        .expect("workspace_id")
        .to_owned();
    assert_ne!(forked, ws);
    assert_eq!(
        fork["forked_from"],
        json!({ "workspace_id": ws, "version": 1 })
    );
    assert_eq!(fork["head"], 1);
    let got = call_ok(&client, "get_workspace", json!({ "workspace_id": forked })).await;
    assert_eq!(
        got["forked_from"],
        json!({ "workspace_id": ws, "version": 1 }),
        "{got}"
    );
    assert_eq!((&got["head"], &got["busy_task"]), (&json!(1), &Value::Null));
    let f1 = &got["versions"][0];
    assert_eq!(
        (&f1["version"], &f1["bytes"], &f1["parent"]),
        (&json!(1), &json!(12), &Value::Null),
        "{got}"
    );
    let empty = call_ok(
        &client,
        "fork_workspace",
        json!({ "workspace_id": ws, "version": "0" }),
    )
    .await;
    assert_eq!(
        (&empty["head"], &empty["forked_from"]["version"]),
        (&json!(0), &json!(0))
    );

    // A run on the fork's head starts from version 1; the original is free too.
    let on_fork = run_on(&client, json!({ "id": forked })).await;
    let task = on_fork["structuredContent"]["task_id"]
        .as_str()
        .expect("queued")
        .to_owned();
    let mut r = stack.redis_conn().await;
    let base: Option<String> = r
        .hget(stack.keys().task(&task), "workspace_base")
        .await
        .expect("HGET");
    assert_eq!(base.as_deref(), Some("1"));
    let on_version = run_on(&client, json!({ "id": ws, "version": 1 })).await;
    assert_ne!(on_version["isError"], json!(true), "{on_version}");

    // Delete: gone for every tool, and from the listing; the others stay.
    let deleted = call_ok(
        &client,
        "delete_workspace",
        json!({ "workspace_id": forked }),
    )
    .await;
    assert_eq!(deleted, json!({ "workspace_id": forked, "deleted": true }));
    for tool in ["get_workspace", "delete_workspace", "fork_workspace"] {
        let (code, message) = refusal(&client, tool, json!({ "workspace_id": forked })).await;
        assert_eq!(code, "unknown_workspace", "{tool}: {message}");
        assert!(
            message.contains(&format!("no workspace with id {forked}")),
            "{message}"
        );
    }
    let (code, _) = refusal(&client, "run_script", json!({ "runtime": "python3.13", "command_base64": b64("true"), "workspace": { "id": forked } })).await;
    assert_eq!(code, "unknown_workspace");
    let listed = call_ok(&client, "list_workspaces", json!({})).await;
    let listed = listed["workspaces"].as_array().cloned().unwrap_or_default();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed.iter().all(|w| w["workspace_id"] != forked.as_str()));
    let keys: Vec<String> = r
        .keys(format!("{}:ws:{forked}*", stack.prefix))
        .await
        .expect("KEYS");
    assert_eq!(keys, Vec::<String>::new(), "its records are gone");
    stack.shutdown().await;
}

/// Pages come newest first, each workspace once, and a cursor whose
/// workspace was deleted meanwhile still places the next page.
#[tokio::test]
async fn list_workspaces_pages_newest_first_past_a_deleted_cursor() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let (source, _) = new_workspace(&client).await;
    let mut made = vec![source.clone()];
    for _ in 0..4 {
        // Distinct created_at milliseconds, so "newest first" is one order.
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
        let f = call_ok(&client, "fork_workspace", json!({ "workspace_id": source })).await;
        made.push(f["workspace_id"].as_str().expect("id").to_owned());
    }
    made.reverse();
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut args = json!({ "limit": 2 });
        if let Some(c) = &cursor {
            args["cursor"] = json!(c);
        }
        let page = call_ok(&client, "list_workspaces", args).await;
        let ids: Vec<String> = page["workspaces"]
            .as_array()
            .expect("workspaces")
            .iter()
            .map(|w| w["workspace_id"].as_str().expect("id").to_owned())
            .collect();
        assert!(ids.len() <= 2, "{page}");
        // The page's last workspace deleted before the next page is asked for.
        if seen.is_empty()
            && let Some(last) = ids.last()
        {
            call_ok(&client, "delete_workspace", json!({ "workspace_id": last })).await;
        }
        seen.extend(ids);
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, made);
    stack.shutdown().await;
}

/// A client of the MCP tasks extension gets a task handle, not run_script's
/// result: a "new" caller learns its workspace from the handle's `_meta`, and
/// tasks/get carries it too.
#[tokio::test]
async fn the_tasks_extension_carries_the_workspace_id_in_meta() {
    let stack = Stack::start(Options::default()).await;
    let http = reqwest::Client::new();
    let post = |method: &'static str, name: String, params: Value| {
        let body = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
        http.post(format!("{}/mcp", stack.url))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", method)
            .header("mcp-name", name)
            .body(body.to_string())
            .send()
    };
    let meta = json!({
        "io.modelcontextprotocol/clientCapabilities":
            { "extensions": { "io.modelcontextprotocol/tasks": {} } },
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    });
    let params = json!({
        "name": "run_script",
        "arguments": { "runtime": "python3.13", "command_base64": b64("true"), "workspace": "new" },
        "_meta": meta,
    });
    let handle: Value = post("tools/call", "run_script".into(), params)
        .await
        .expect("tools/call")
        .json()
        .await
        .expect("JSON");
    let result = &handle["result"];
    assert_eq!(result["resultType"], "task", "{handle}");
    let ws = result["_meta"]["script-runner/workspace_id"]
        .as_str()
        .expect("the workspace in the handle's _meta")
        .to_owned();
    let task = result["taskId"].as_str().expect("taskId").to_owned();
    let params = json!({ "taskId": task, "_meta": meta });
    let got: Value = post("tasks/get", task.clone(), params)
        .await
        .expect("tasks/get")
        .json()
        .await
        .expect("JSON");
    assert_eq!(
        got["result"]["_meta"]["script-runner/workspace_id"], ws,
        "{got}"
    );
    let client = stack.client().await;
    assert_eq!(status(&client, &task).await["workspace_id"], ws);
    stack.shutdown().await;
}
