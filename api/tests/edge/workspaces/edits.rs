//! `write_files` at the api, with the worker's part played by hand through the
//! real scripts: the call answers from the version, not from the task's state.

use std::time::Duration;

use super::*;

/// A workspace with no version and no task on it: its first task claimed, then
/// ended with nothing saved.
async fn free_workspace(stack: &Stack, client: &Client) -> String {
    let (ws, task) = new_workspace(client).await;
    let id = WorkspaceId::parse(&ws).expect("a workspace id");
    let mut conn = stack.redis_conn().await;
    let keys = stack.keys();
    store::scripts::invoke(&mut conn, &ScriptCall::claim(&keys, &task, "w1", "0-1"))
        .await
        .expect("claim");
    let caps = WorkspaceCaps {
        versions_kept: 10,
        owner_max_bytes: 0,
    };
    let nothing = ScriptCall::ws_commit(&keys, &task, "w1", &id, 0, Saved::Nothing("t"), caps);
    let reply = store::scripts::invoke(&mut conn, &nothing)
        .await
        .expect("commit");
    assert_eq!(reply, WsReply::Done(0));
    ws
}

/// `write_files` of one file on `ws`, called on a client of its own (it waits
/// for its edit), and the edit's task once the workspace names it.
async fn start_edit(
    stack: &Stack,
    client: &Client,
    ws: &str,
) -> (tokio::task::JoinHandle<Value>, String) {
    let caller = stack.client().await;
    let args = json!({ "workspace_id": ws, "files": [{ "path": "a.txt", "content": "a" }] });
    let answer = tokio::spawn(async move { call(&caller, "write_files", args).await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = call_ok(client, "get_workspace", json!({ "workspace_id": ws })).await;
        if let Some(task) = got["busy_task"].as_str() {
            return (answer, task.to_owned());
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no edit task: {got}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn an_edit_killed_after_its_worker_took_it_answers_with_the_version_it_made() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let ws = free_workspace(&stack, &client).await;
    let (answer, task) = start_edit(&stack, &client, &ws).await;
    let id = WorkspaceId::parse(&ws).expect("a workspace id");
    let mut conn = stack.redis_conn().await;
    let keys = stack.keys();
    store::scripts::invoke(&mut conn, &ScriptCall::claim(&keys, &task, "w1", "0-2"))
        .await
        .expect("claim");
    let killed = call_ok(&client, "kill_task", json!({ "task_id": task })).await;
    assert_eq!(killed["state"], "killed", "{killed}");
    // The worker goes on with its edit, which takes a while on a slow store:
    // longer than write_files once waited after the task's end (5 s).
    tokio::time::sleep(Duration::from_secs(6)).await;
    if answer.is_finished() {
        let early = answer.await.expect("write_files");
        panic!("write_files answered before the edit was made: {early}");
    }
    let manifest = BlobDigest::of(b"an edit");
    let saved = Saved::Version {
        manifest: &manifest,
        bytes: 1,
        files: 1,
        epoch: 0,
    };
    let caps = WorkspaceCaps {
        versions_kept: 10,
        owner_max_bytes: 0,
    };
    let commit = ScriptCall::ws_commit(&keys, &task, "w1", &id, 0, saved, caps);
    let reply = store::scripts::invoke(&mut conn, &commit)
        .await
        .expect("commit");
    assert_eq!(reply, WsReply::Done(1));
    let answer = answer.await.expect("write_files");
    assert_ne!(answer["isError"], json!(true), "{answer}");
    let out = &answer["structuredContent"];
    assert_eq!(out["version"], 1, "{answer}");
    assert_eq!(out["state"], "killed", "{answer}");
    stack.shutdown().await;
}

#[tokio::test]
async fn an_edit_killed_while_queued_is_not_written_and_leaves_the_workspace_free() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let ws = free_workspace(&stack, &client).await;
    let (answer, task) = start_edit(&stack, &client, &ws).await;
    call_ok(&client, "kill_task", json!({ "task_id": task })).await;
    let answer = answer.await.expect("write_files");
    assert_eq!(answer["isError"], json!(true), "{answer}");
    assert_eq!(
        answer["structuredContent"]["code"], "files_not_written",
        "{answer}"
    );
    let got = call_ok(&client, "get_workspace", json!({ "workspace_id": ws })).await;
    assert_eq!(got["busy_task"], Value::Null, "{got}");
    assert_eq!(got["head"], 0, "{got}");
    stack.shutdown().await;
}
