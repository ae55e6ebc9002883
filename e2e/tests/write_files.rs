//! `write_files` end to end: an edit made into a workspace's next version by a
//! real worker, without a container, read back with `read_files` and seen by
//! the next task; refused at once (no task, no version) when it cannot be
//! made, and by the worker, leaving the head as it was, when only a worker's
//! cap says so.

use std::time::Duration;

use script_runner_e2e::*;
use serde_json::{Value, json};

/// Runs `command` on `workspace` to its end and its version.
async fn run_on(client: &Client, workspace: Value, command: &str) -> Value {
    let id = run(
        client,
        "python3.13",
        command,
        json!({ "workspace": workspace }),
    )
    .await;
    wait_status(
        client,
        &id,
        "the task's end and its workspace version",
        Duration::from_secs(120),
        |s| is_final(s) && (s["workspace_version"].is_u64() || s["workspace_note"].is_string()),
    )
    .await
}

/// A failed call's code and message.
async fn refused(client: &Client, tool: &'static str, args: Value) -> (String, String) {
    let r = call(client, tool, args.clone()).await;
    assert_eq!(r["isError"], json!(true), "{tool} {args} should fail: {r}");
    let body = &r["structuredContent"];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    (text(&body["code"]), text(&body["message"]))
}

async fn head(client: &Client, ws: &str) -> Value {
    call_ok(client, "get_workspace", json!({ "workspace_id": ws })).await["head"].clone()
}

#[tokio::test]
async fn written_files_make_a_version_that_read_files_and_the_next_task_see() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let first = run_on(
        &client,
        json!("new"),
        "mkdir src gone && echo old > src/a.py && chmod 755 src/a.py && echo keep > keep.txt \
         && echo x > gone/f",
    )
    .await;
    assert_eq!(first["workspace_version"], 1, "{first}");
    let ws = first["workspace_id"]
        .as_str()
        .expect("workspace_id")
        .to_owned();

    let wrote = call_ok(
        &client,
        "write_files",
        json!({ "workspace_id": ws, "delete": ["gone"], "files": [
            { "path": "src/a.py", "content": "print('new')\n" },
            { "path": "deep/new/b.bin", "content_base64": "AP8B" },
            { "path": "/workspace/c.txt", "content": "c" },
        ] }),
    )
    .await;
    assert_eq!(
        (
            &wrote["state"],
            &wrote["version"],
            &wrote["written"],
            &wrote["deleted"]
        ),
        (&json!("succeeded"), &json!(2), &json!(3), &json!(1)),
        "{wrote}"
    );
    // The edit is a task like any: its status says what it made.
    let task = status(&client, wrote["task_id"].as_str().expect("task_id")).await;
    assert_eq!(
        (
            &task["reason_kind"],
            &task["workspace_version"],
            &task["workspace_id"]
        ),
        (&json!("files-written"), &json!(2), &json!(ws)),
        "{task}"
    );

    let read = call_ok(
        &client,
        "read_files",
        json!({ "workspace_id": ws, "paths": ["src/a.py", "deep/**", "c.txt", "gone/*", "keep.txt"] }),
    )
    .await;
    let files = read["files"].as_array().cloned().unwrap_or_default();
    let of = |p: &str| {
        files
            .iter()
            .find(|f| f["path"] == p)
            .cloned()
            .unwrap_or_else(|| panic!("no {p} in {read}"))
    };
    // Written over, a file keeps its mode; a new one is 0644.
    assert_eq!(
        (&of("src/a.py")["content"], &of("src/a.py")["mode"]),
        (&json!("print('new')\n"), &json!("0755"))
    );
    assert_eq!(of("deep/new/b.bin")["content_base64"], "AP8B");
    assert_eq!(of("c.txt")["mode"], "0644");
    assert_eq!(of("keep.txt")["content"], "keep\n");
    assert_eq!(read["unmatched"], json!(["gone/*"]), "{read}");

    let next = run_on(
        &client,
        json!({ "id": ws }),
        "python3 src/a.py && cat c.txt keep.txt && od -An -tx1 deep/new/b.bin \
         && test ! -e gone && stat -c %a src/a.py deep/new",
    )
    .await;
    assert_eq!(next["state"], "succeeded", "{next}");
    assert_eq!(
        next["stdout_tail"], "new\nckeep\n 00 ff 01\n755\n755\n",
        "{next}"
    );
    assert_eq!(next["workspace_version"], 3, "{next}");
    stack.shutdown().await;
}

#[tokio::test]
async fn an_edit_that_cannot_be_made_is_refused_and_the_workspace_is_left_as_it_was() {
    // A version holds at most 4 entries here: only a worker knows that cap.
    let stack = Stack::start(Options {
        extra_env: vec![("WORKSPACE_MAX_FILES", "4".into())],
        ..Options::default()
    })
    .await;
    let client = stack.client().await;
    let first = run_on(
        &client,
        json!("new"),
        "mkdir d && echo a > d/a && echo f > file",
    )
    .await;
    assert_eq!(first["workspace_version"], 1, "{first}");
    let ws = first["workspace_id"]
        .as_str()
        .expect("workspace_id")
        .to_owned();
    let tasks_before = call_ok(&client, "list_tasks", json!({})).await["tasks"]
        .as_array()
        .expect("list_tasks' tasks")
        .len();

    // Checked against the version at the api: no task is made.
    let write = |files: Value| json!({ "workspace_id": ws, "files": files });
    let cases = [
        (
            write(json!([{ "path": "file/x", "content": "" }])),
            "\"file\" is a file or a link",
        ),
        (
            write(json!([{ "path": "d", "content": "" }])),
            "\"d\" is a directory",
        ),
        (
            write(json!([{ "path": "../x", "content": "" }])),
            "a path relative to /workspace",
        ),
        (
            write(json!([{ "path": "a", "content": "", "content_base64": "" }])),
            "exactly one of content",
        ),
        (
            write(json!([{ "path": "a", "content": "1" }, { "path": "./a", "content": "2" }])),
            "relative to /workspace",
        ),
        (
            write(json!([{ "path": "a", "content": "1" }, { "path": "a", "content": "2" }])),
            "given twice",
        ),
        (
            write(json!([{ "path": "a", "content_base64": "%%" }])),
            "not valid base64",
        ),
        (
            json!({ "workspace_id": ws }),
            "needs files to write or paths to delete",
        ),
    ];
    for (args, says) in cases {
        let (code, message) = refused(&client, "write_files", args.clone()).await;
        assert_eq!(code, "invalid_argument", "{args}: {message}");
        assert!(message.contains(says), "{args}: {message:?} lacks {says:?}");
    }
    let tasks_after = call_ok(&client, "list_tasks", json!({})).await["tasks"]
        .as_array()
        .expect("list_tasks' tasks")
        .len();
    assert_eq!(tasks_before, tasks_after, "a refused edit made a task");

    // Past the worker's cap: its task fails, no version is made, and the
    // workspace is free for the next edit.
    let files: Vec<Value> = (0..3)
        .map(|i| json!({ "path": format!("new/{i}"), "content": "n" }))
        .collect();
    let (code, message) = refused(&client, "write_files", write(json!(files))).await;
    assert_eq!(code, "files_not_written", "{message}");
    assert!(
        message.contains("made no version") && message.contains("more than 4 files"),
        "{message}"
    );
    assert_eq!(head(&client, &ws).await, 1);
    let ok = call_ok(
        &client,
        "write_files",
        json!({ "workspace_id": ws, "delete": ["file"], "files": [{ "path": "d/b", "content": "b" }] }),
    )
    .await;
    assert_eq!(ok["version"], 2, "{ok}");

    // One task at a time: a workspace a task is using is refused as busy.
    let busy = start_until_output(
        &client,
        "echo ready; sleep 300",
        json!({ "workspace": { "id": ws } }),
        "ready\n",
    )
    .await;
    let (code, message) = refused(
        &client,
        "write_files",
        write(json!([{ "path": "z", "content": "" }])),
    )
    .await;
    assert_eq!(code, "workspace_busy", "{message}");
    assert!(message.contains(&busy), "{message}");
    call_ok(&client, "kill_task", json!({ "task_id": busy })).await;

    // Another owner's workspace is unknown to them.
    let mallory = stack.client_of("mallory").await;
    let (code, _) = refused(
        &mallory,
        "write_files",
        write(json!([{ "path": "z", "content": "" }])),
    )
    .await;
    assert_eq!(code, "unknown_workspace");
    stack.shutdown().await;
}
