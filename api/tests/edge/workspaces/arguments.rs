//! Bad workspace arguments, each refused with a message that says what is
//! allowed, and the scopes a key needs for each workspace tool.

use super::*;

#[tokio::test]
async fn bad_workspace_arguments_get_clear_messages_and_scopes_hold() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let id = uuid::Uuid::new_v4().to_string();
    let run_with = |workspace: Value| json!({ "runtime": "python3.13", "command_base64": b64("true"), "workspace": workspace });
    let cases = [
        (
            "run_script",
            run_with(json!("old")),
            "workspace must be \"new\", or {\"id\": \"<workspace_id>\"}",
        ),
        (
            "run_script",
            run_with(json!(42)),
            "workspace must be \"new\"",
        ),
        (
            "run_script",
            run_with(json!({})),
            "workspace needs an \"id\"",
        ),
        (
            "run_script",
            run_with(json!({ "id": "../etc" })),
            "workspace id \"../etc\" is not a workspace id",
        ),
        (
            "run_script",
            run_with(json!({ "id": id, "version": -1 })),
            "workspace version must be 0 or more (got -1)",
        ),
        (
            "run_script",
            run_with(json!({ "id": id, "version": 1.5 })),
            "workspace version must be a whole number, got 1.5",
        ),
        (
            "run_script",
            run_with(json!({ "id": id, "branch": "main" })),
            "workspace has no field \"branch\"",
        ),
        (
            "get_workspace",
            json!({ "workspace_id": "nope" }),
            "workspace_id \"nope\" is not a workspace id",
        ),
        ("get_workspace", json!({}), "missing field `workspace_id`"),
        (
            "delete_workspace",
            json!({ "workspace_id": 7 }),
            "workspace_id",
        ),
        (
            "read_files",
            json!({ "workspace_id": id, "paths": [] }),
            "paths must hold 1 to 64 paths or patterns (got 0)",
        ),
        (
            "read_files",
            json!({ "workspace_id": id, "paths": ["a"], "max_bytes": 0 }),
            "max_bytes must be between 1 and 1048576 (got 0)",
        ),
        (
            "read_files",
            json!({ "workspace_id": id, "paths": ["/etc/passwd"] }),
            "path pattern \"/etc/passwd\" is not valid: an absolute path outside /workspace",
        ),
        (
            "fork_workspace",
            json!({ "workspace_id": id, "version": -3 }),
            "version must be a version number, 0 or more (got -3)",
        ),
        (
            "fork_workspace",
            json!({ "workspace_id": id, "version": "head" }),
            "version must be a whole number, got \"head\"",
        ),
        (
            "list_workspaces",
            json!({ "limit": 0 }),
            "limit must be between 1 and 100 (got 0)",
        ),
        (
            "write_files",
            json!({ "workspace_id": id }),
            "write_files needs files to write or paths to delete",
        ),
        (
            "write_files",
            json!({ "workspace_id": id, "files": [{ "path": "/etc/passwd", "content": "x" }] }),
            "files entry \"/etc/passwd\" is not valid: a path relative to /workspace",
        ),
        (
            "write_files",
            json!({ "workspace_id": id, "delete": ["a/../../b"] }),
            "delete entry \"a/../../b\" is not valid",
        ),
        (
            "write_files",
            json!({ "workspace_id": id, "files": [{ "path": "a" }] }),
            "give exactly one of content (text) and content_base64 (bytes)",
        ),
        (
            "write_files",
            json!({ "workspace_id": "nope", "files": [{ "path": "a", "content": "" }] }),
            "workspace_id \"nope\" is not a workspace id",
        ),
        (
            "list_workspaces",
            json!({ "cursor": "nope" }),
            "cursor \"nope\" is not one list_workspaces returned",
        ),
    ];
    for (tool, args, says) in cases {
        let (code, message) = refusal(&client, tool, args.clone()).await;
        assert_eq!(code, "invalid_argument", "{tool} {args}: {message}");
        assert!(
            message.contains(says),
            "{tool} {args}: {message:?} lacks {says:?}"
        );
    }
    // Too many, or too much: too_large, naming the cap.
    let many: Vec<Value> = (0..1001)
        .map(|i| json!({ "path": format!("f{i}"), "content": "" }))
        .collect();
    let big = "x".repeat(16 << 20);
    for (args, says) in [
        (
            json!({ "workspace_id": id, "files": many }),
            "at most 1000 files and 1000 deletes per call",
        ),
        (
            json!({ "workspace_id": id, "files": [{ "path": "a", "content": big }, { "path": "b", "content": "y" }] }),
            "more than 16777216 bytes together",
        ),
    ] {
        let (code, message) = refusal(&client, "write_files", args).await;
        assert_eq!(code, "too_large", "{message}");
        assert!(message.contains(says), "{message:?} lacks {says:?}");
    }
    // A workspace not there: refused before anything is queued.
    let (code, _) = refusal(
        &client,
        "write_files",
        json!({ "workspace_id": id, "files": [{ "path": "a", "content": "" }] }),
    )
    .await;
    assert_eq!(code, "unknown_workspace");
    assert_no_task_created(&stack).await;

    // A read-only key lists and reads workspaces, but may not run on, fork,
    // write to or delete one.
    let reader = client_as(
        &stack,
        &api_key(
            &stack,
            "reader",
            shared::apikey::Scopes::parse("read").expect("scopes"),
        )
        .await,
    )
    .await;
    call_ok(&reader, "list_workspaces", json!({})).await;
    let (code, _) = refusal(&reader, "get_workspace", json!({ "workspace_id": id })).await;
    assert_eq!(code, "unknown_workspace");
    for (tool, args) in [
        ("run_script", run_with(json!("new"))),
        ("fork_workspace", json!({ "workspace_id": id })),
        ("delete_workspace", json!({ "workspace_id": id })),
        (
            "write_files",
            json!({ "workspace_id": id, "delete": ["a"] }),
        ),
    ] {
        let (code, message) = refusal(&reader, tool, args).await;
        assert_eq!(code, "missing_scope", "{tool}: {message}");
        assert!(
            message.contains(&format!("which {tool} needs")),
            "{message}"
        );
    }
    stack.shutdown().await;
}
