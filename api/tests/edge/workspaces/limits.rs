//! What an owner's workspaces are held to: the byte cap as versions come and
//! go, and the idle expiry, which keeps a workspace a queued task holds.

use super::*;

/// The bytes `owner`'s workspaces hold, as the scripts counted them.
async fn owner_bytes(stack: &Stack, owner: &str) -> u64 {
    let mut r = stack.redis_conn().await;
    let held: Option<u64> = r
        .hget(stack.keys().workspace_bytes(), owner)
        .await
        .expect("HGET");
    held.unwrap_or(0)
}

#[tokio::test]
async fn an_owners_workspaces_are_held_to_its_byte_cap_as_versions_come_and_go() {
    // 1 MiB per owner: the api holds forks to it, and the commits below the
    // same cap, as a worker with WORKSPACE_OWNER_MAX_MB=1 would.
    let stack = Stack::start(Options {
        extra_env: vec![("WORKSPACE_OWNER_MAX_MB", "1".into())],
        ..Options::default()
    })
    .await;
    let alice = client_as(
        &stack,
        &api_key(&stack, "alice", shared::apikey::Scopes::ALL).await,
    )
    .await;
    let caps = |kept| WorkspaceCaps {
        versions_kept: kept,
        owner_max_bytes: 1 << 20,
    };
    let (ws, first) = new_workspace(&alice).await;
    assert_eq!(
        commit_capped(&stack, &first, &ws, 0, 600_000, caps(10)).await,
        1
    );
    assert_eq!(owner_bytes(&stack, "alice").await, 600_000);
    let listed = call_ok(&alice, "list_workspaces", json!({})).await;
    assert_eq!(listed["workspaces"][0]["bytes"], 600_000, "{listed}");

    // A fork would double it: refused, naming the cap, and nothing is made.
    let (code, message) = refusal(&alice, "fork_workspace", json!({ "workspace_id": ws })).await;
    assert_eq!(code, "quota_exceeded", "{message}");
    assert!(
        message.contains("would hold 1200000 bytes")
            && message.contains("cap of 1048576 bytes (WORKSPACE_OWNER_MAX_MB)"),
        "{message}"
    );
    let listed = call_ok(&alice, "list_workspaces", json!({})).await;
    assert_eq!(
        listed["workspaces"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );

    // A second version of 500 kB: with ten kept, 1.1 MB, over the cap, so the
    // task says why and the head stays; with one kept, version 1's bytes go
    // and it fits.
    let second = run_on(&alice, json!({ "id": ws })).await;
    let second = second["structuredContent"]["task_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(
        commit_capped(&stack, &second, &ws, 1, 500_000, caps(10)).await,
        0
    );
    let s = status(&alice, &second).await;
    let note = s["workspace_note"].as_str().unwrap_or_default();
    assert!(
        note.contains("1100000 bytes, over the cap of 1048576"),
        "{s}"
    );
    let got = call_ok(&alice, "get_workspace", json!({ "workspace_id": ws })).await;
    assert_eq!(
        (&got["head"], &got["busy_task"]),
        (&json!(1), &Value::Null),
        "{got}"
    );
    let third = run_on(&alice, json!({ "id": ws })).await;
    let third = third["structuredContent"]["task_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(
        commit_capped(&stack, &third, &ws, 1, 500_000, caps(1)).await,
        2
    );
    assert_eq!(owner_bytes(&stack, "alice").await, 500_000);

    // Over the cap already (as after an operator lowered it): a version that
    // leaves alice holding less is still made.
    let mut r = stack.redis_conn().await;
    let bytes_key = stack.keys().workspace_bytes();
    let _: () = r.hset(&bytes_key, "alice", 2_000_000).await.expect("HSET");
    let fourth = task_of(&run_on(&alice, json!({ "id": ws })).await);
    assert_eq!(
        commit_capped(&stack, &fourth, &ws, 2, 100_000, caps(1)).await,
        3
    );
    assert_eq!(owner_bytes(&stack, "alice").await, 1_600_000);

    // A workspace made before bytes were counted (no `bytes`, nothing in
    // alice's total): its kept versions are counted at its next commit, so
    // the version it drops takes off nothing that was never added.
    let id = WorkspaceId::parse(&ws).expect("a workspace id");
    let _: () = r
        .hdel(stack.keys().workspace(&id), "bytes")
        .await
        .expect("HDEL");
    let _: () = r.hset(&bytes_key, "alice", 0).await.expect("HSET");
    let fifth = task_of(&run_on(&alice, json!({ "id": ws })).await);
    assert_eq!(
        commit_capped(&stack, &fifth, &ws, 3, 200_000, caps(1)).await,
        4
    );
    assert_eq!(owner_bytes(&stack, "alice").await, 200_000);

    // Deleting gives its bytes back.
    call_ok(&alice, "delete_workspace", json!({ "workspace_id": ws })).await;
    assert_eq!(owner_bytes(&stack, "alice").await, 0);
    stack.shutdown().await;
}

/// The task id of a `run_script` answer.
fn task_of(answer: &Value) -> String {
    answer["structuredContent"]["task_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Whether workspace `ws` is still there (its hash in Redis).
async fn exists(stack: &Stack, ws: &str) -> bool {
    let id = WorkspaceId::parse(ws).expect("a workspace id");
    let mut r = stack.redis_conn().await;
    r.exists(stack.keys().workspace(&id)).await.expect("EXISTS")
}

#[tokio::test]
async fn idle_workspaces_are_deleted_and_one_a_queued_task_holds_is_kept() {
    let stack = Stack::start(Options {
        extra_env: vec![("WORKSPACE_IDLE_SECONDS", "1".into())],
        ..Options::default()
    })
    .await;
    let client = stack.client().await;
    // Both made now, each by a task (queued: no worker here); one task is
    // killed at once, so nothing holds its workspace.
    let (held, _holder) = new_workspace(&client).await;
    let (idle, task) = new_workspace(&client).await;
    call_ok(&client, "kill_task", json!({ "task_id": task })).await;
    wait_until(
        "the idle workspace to be deleted",
        std::time::Duration::from_secs(30),
        || async { (!exists(&stack, &idle).await).then_some(()) },
    )
    .await;
    let (code, _) = refusal(&client, "get_workspace", json!({ "workspace_id": idle })).await;
    assert_eq!(code, "unknown_workspace");
    // As old, but its task is still queued: kept.
    assert!(
        exists(&stack, &held).await,
        "a workspace a queued task holds was deleted"
    );
    // One whose task ended just now on a worker, which may still be saving
    // into it (within the save grace): kept as well.
    let (saving, ended) = new_workspace(&client).await;
    let mut r = stack.redis_conn().await;
    let now: (u64, u64) = redis::cmd("TIME").query_async(&mut r).await.expect("TIME");
    let fields = [
        ("state", "succeeded".to_owned()),
        ("worker", "w1".to_owned()),
        ("finished_at", (now.0 * 1000).to_string()),
    ];
    let _: () = r
        .hset_multiple(stack.keys().task(&ended), &fields)
        .await
        .expect("HSET");
    // A record that does not read (garbled by hand) stops no pass: the idle
    // one behind it in the index still goes.
    let (broken, task) = new_workspace(&client).await;
    call_ok(&client, "kill_task", json!({ "task_id": task })).await;
    let broken_id = WorkspaceId::parse(&broken).expect("a workspace id");
    let _: () = r
        .hset(stack.keys().workspace(&broken_id), "head", "garbled")
        .await
        .expect("HSET");
    // The janitor has had its chance once another idle one is gone.
    let (later, task) = new_workspace(&client).await;
    call_ok(&client, "kill_task", json!({ "task_id": task })).await;
    wait_until(
        "a later idle workspace to be deleted",
        std::time::Duration::from_secs(30),
        || async { (!exists(&stack, &later).await).then_some(()) },
    )
    .await;
    assert!(
        exists(&stack, &saving).await,
        "a workspace whose task may still be saving was deleted"
    );
    let got = call_ok(&client, "get_workspace", json!({ "workspace_id": held })).await;
    assert_ne!(got["busy_task"], Value::Null, "{got}");
    stack.shutdown().await;
}
