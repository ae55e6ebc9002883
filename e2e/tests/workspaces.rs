//! Persistent workspaces, end to end: a task's /workspace becomes a version that
//! the next task starts from, through the real api, worker, Redis, Docker
//! engine and the blob store on the local file system.

use std::time::Duration;

use script_runner_e2e::*;
use serde_json::{Value, json};

/// Runs `command` on `workspace` (`"new"` or `{"id": ...}`) to its end, and
/// waits until its workspace outcome (a version, or a note) is recorded too.
async fn run_on(client: &Client, workspace: Value, command: &str) -> Value {
    let id = run(
        client,
        "python3.13",
        command,
        json!({ "workspace": workspace }),
    )
    .await;
    settled(client, &id).await
}

/// The task's status once it has ended and made its version (or said why not).
async fn settled(client: &Client, task_id: &str) -> Value {
    wait_status(
        client,
        task_id,
        "the task's end and its workspace version",
        Duration::from_secs(120),
        |s| is_final(s) && (s["workspace_version"].is_u64() || s["workspace_note"].is_string()),
    )
    .await
}

fn ws_id(status: &Value) -> String {
    status["workspace_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no workspace_id in {status}"))
        .to_owned()
}

#[tokio::test]
async fn files_links_and_modes_carry_over_from_one_task_to_the_next() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let first = run_on(
        &client,
        json!("new"),
        "mkdir -p src/deep && echo hello > src/deep/a.txt \
         && printf '#!/bin/sh\\necho ran-me\\n' > run.sh && chmod 755 run.sh \
         && echo secret > private && chmod 600 private \
         && ln -s /etc/hostname host-link && ln -s deep/a.txt src/rel-link \
         && echo made",
    )
    .await;
    assert_eq!(first["state"], "succeeded", "{first}");
    assert_eq!(first["workspace_version"], 1, "{first}");
    let ws = ws_id(&first);

    let second = run_on(
        &client,
        json!({ "id": ws }),
        "cat src/deep/a.txt && ./run.sh && cat private && readlink host-link \
         && cat src/rel-link && stat -c %a private run.sh",
    )
    .await;
    assert_eq!(second["state"], "succeeded", "{second}");
    assert_eq!(
        second["stdout_tail"], "hello\nran-me\nsecret\n/etc/hostname\nhello\n600\n755\n",
        "{second}"
    );
    assert_eq!(second["workspace_id"], ws.as_str());
    assert_eq!(second["workspace_version"], 2, "{second}");
    stack.shutdown().await;
}

/// `read_files`' answer (its structured content), failing the test on an error.
async fn read_files(client: &Client, args: Value) -> Value {
    let r = call(client, "read_files", args).await;
    assert_ne!(r["isError"], json!(true), "read_files failed: {r}");
    r["structuredContent"].clone()
}

/// The entry of `path` in a `read_files` answer.
fn entry<'a>(answer: &'a Value, path: &str) -> &'a Value {
    answer["files"]
        .as_array()
        .and_then(|f| f.iter().find(|e| e["path"] == path))
        .unwrap_or_else(|| panic!("no {path} in {answer}"))
}

#[tokio::test]
async fn read_files_shows_a_versions_files_by_path_and_pattern_to_their_owner_only() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let first = run_on(
        &client,
        json!("new"),
        "mkdir -p src/pkg && echo 'print(1)' > src/a.py && echo 'x = 2' > src/pkg/b.py \
         && printf 'caf\\303\\251\\n' > notes.txt && printf '\\000\\377\\001' > data.bin \
         && printf '#!/bin/sh\\n' > run.sh && chmod 755 run.sh && ln -s src/a.py main.py \
         && head -c 5000 /dev/zero | tr '\\0' 'y' > big.txt",
    )
    .await;
    assert_eq!(first["workspace_version"], 1, "{first}");
    let ws = ws_id(&first);
    let second = run_on(&client, json!({ "id": ws }), "echo 'print(3)' > src/a.py").await;
    assert_eq!(second["workspace_version"], 2, "{second}");

    // The head, by pattern: `*` stays in its segment, `**` crosses them.
    let head = read_files(
        &client,
        json!({ "workspace_id": ws, "paths": ["src/**/*.py", "*.txt", "data.bin", "run.sh",
            "main.py", "nothing/*"] }),
    )
    .await;
    assert_eq!(head["version"], 2, "{head}");
    assert_eq!(entry(&head, "src/a.py")["content"], "print(3)\n");
    assert_eq!(entry(&head, "src/pkg/b.py")["content"], "x = 2\n");
    assert_eq!(entry(&head, "notes.txt")["content"], "café\n");
    assert_eq!(entry(&head, "data.bin")["content_base64"], "AP8B");
    assert_eq!(entry(&head, "run.sh")["mode"], "0755");
    let link = entry(&head, "main.py");
    assert_eq!(
        (&link["kind"], &link["target"]),
        (&json!("symlink"), &json!("src/a.py"))
    );
    assert_eq!(entry(&head, "big.txt")["size"], 5000);
    assert_eq!(head["unmatched"], json!(["nothing/*"]), "{head}");
    let paths: Vec<&str> = head["files"]
        .as_array()
        .map(|f| f.iter().filter_map(|e| e["path"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        paths,
        [
            "big.txt",
            "data.bin",
            "main.py",
            "notes.txt",
            "run.sh",
            "src/a.py",
            "src/pkg/b.py"
        ]
    );

    // An older version, and a budget: the first file is cut, the rest empty.
    let old = read_files(
        &client,
        json!({ "workspace_id": ws, "version": 1, "paths": ["/workspace/src/a.py"] }),
    )
    .await;
    assert_eq!(entry(&old, "src/a.py")["content"], "print(1)\n", "{old}");
    let cut = read_files(
        &client,
        json!({ "workspace_id": ws, "paths": ["big.txt", "notes.txt"], "max_bytes": 100 }),
    )
    .await;
    let big = entry(&cut, "big.txt");
    assert_eq!(
        (&big["truncated"], big["content"].as_str().map(str::len)),
        (&json!(true), Some(100))
    );
    assert_eq!(entry(&cut, "notes.txt")["truncated"], true, "{cut}");

    // Bad input is refused naming it; another owner sees no such workspace.
    let bad = call(
        &client,
        "read_files",
        json!({ "workspace_id": ws, "paths": ["../etc/passwd"] }),
    )
    .await;
    assert_eq!(
        bad["structuredContent"]["code"], "invalid_argument",
        "{bad}"
    );
    let gone = call(
        &client,
        "read_files",
        json!({ "workspace_id": ws, "version": 9, "paths": ["*"] }),
    )
    .await;
    assert_eq!(
        gone["structuredContent"]["code"], "unknown_version",
        "{gone}"
    );
    let mallory = stack.client_of("mallory").await;
    let theirs = call(
        &mallory,
        "read_files",
        json!({ "workspace_id": ws, "paths": ["*"] }),
    )
    .await;
    assert_eq!(
        theirs["structuredContent"]["code"], "unknown_workspace",
        "{theirs}"
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn the_ctl_lists_shows_counts_and_deletes_every_owners_workspaces() {
    let stack = Stack::start(Options::default()).await;
    let alice = stack.client_of("alice").await;
    let made = run_on(&alice, json!("new"), "head -c 200000 /dev/urandom > data").await;
    assert_eq!(made["workspace_version"], 1, "{made}");
    let ws = ws_id(&made);

    let listed = crate::ops::ctl_json(
        &stack,
        &["--json", "workspaces", "list", "--owner", "alice"],
    )
    .await;
    let row = &listed[0];
    assert_eq!(
        (&row["workspace_id"], &row["owner"], &row["head"]),
        (&json!(ws), &json!("alice"), &json!(1)),
        "{listed}"
    );
    let bytes = row["bytes"].as_u64().unwrap_or_default();
    assert!(bytes >= 200_000, "{listed}");
    let shown = crate::ops::ctl_json(&stack, &["--json", "workspaces", "show", &ws]).await;
    assert_eq!(shown["versions"][0]["task_id"], made["task_id"], "{shown}");
    let usage = crate::ops::ctl_json(&stack, &["--json", "usage"]).await;
    let mine = usage["owners"]
        .as_array()
        .and_then(|o| o.iter().find(|u| u["owner"] == "alice"))
        .unwrap_or_else(|| panic!("no alice in {usage}"));
    assert_eq!(mine["workspace_kept_bytes"], bytes, "{usage}");

    let deleted =
        crate::ops::ctl_admin_json(&stack, &["--json", "workspaces", "delete", &ws]).await;
    assert_eq!(
        (&deleted["deleted"], &deleted["owner"]),
        (&json!(true), &json!("alice")),
        "{deleted}"
    );
    let gone = call(&alice, "get_workspace", json!({ "workspace_id": ws })).await;
    assert_eq!(
        gone["structuredContent"]["code"], "unknown_workspace",
        "{gone}"
    );
    let usage = crate::ops::ctl_json(&stack, &["--json", "usage"]).await;
    assert_eq!(usage["owners"][0]["workspace_kept_bytes"], 0, "{usage}");
    stack.shutdown().await;
}

#[tokio::test]
async fn a_version_past_its_owners_byte_cap_is_not_made_and_the_task_says_why() {
    let stack = Stack::start(Options {
        extra_env: vec![("WORKSPACE_OWNER_MAX_MB", "1".into())],
        ..Options::default()
    })
    .await;
    let alice = stack.client_of("alice").await;
    let small = run_on(&alice, json!("new"), "echo small > a").await;
    assert_eq!(small["workspace_version"], 1, "{small}");
    let ws = ws_id(&small);
    let big = run_on(
        &alice,
        json!({ "id": ws }),
        "head -c 2000000 /dev/urandom > big",
    )
    .await;
    assert_eq!(big["state"], "succeeded", "{big}");
    assert_eq!(big["workspace_version"], Value::Null, "{big}");
    let note = big["workspace_note"].as_str().unwrap_or_default();
    assert!(
        note.contains("over the cap of 1048576") && note.contains("WORKSPACE_OWNER_MAX_MB"),
        "{big}"
    );
    // The head stayed, with its files, and the workspace is free again.
    let next = run_on(&alice, json!({ "id": ws }), "cat a && ls").await;
    assert_eq!(
        (&next["stdout_tail"], &next["workspace_version"]),
        (&json!("small\na\n"), &json!(2)),
        "{next}"
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn failed_timed_out_and_killed_tasks_each_make_a_version() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let failed = run_on(&client, json!("new"), "echo 1 > failed.txt; exit 3").await;
    assert_eq!(failed["state"], "failed", "{failed}");
    assert_eq!(failed["workspace_version"], 1, "{failed}");
    let ws = ws_id(&failed);

    let id = run(
        &client,
        "python3.13",
        "echo 2 > timed-out.txt; sleep 300",
        json!({ "workspace": { "id": ws }, "timeout_seconds": 2 }),
    )
    .await;
    let timed_out = settled(&client, &id).await;
    assert_eq!(timed_out["state"], "timed-out", "{timed_out}");
    assert_eq!(timed_out["workspace_version"], 2, "{timed_out}");

    let id = start_until_output(
        &client,
        "echo 3 > killed.txt; echo ready; sleep 300",
        json!({ "workspace": { "id": ws } }),
        "ready\n",
    )
    .await;
    call_ok(&client, "kill_task", json!({ "task_id": id })).await;
    let killed = settled(&client, &id).await;
    assert_eq!(killed["state"], "killed", "{killed}");
    assert_eq!(killed["workspace_version"], 3, "{killed}");

    let all = run_on(
        &client,
        json!({ "id": ws }),
        "cat failed.txt timed-out.txt killed.txt",
    )
    .await;
    assert_eq!(all["stdout_tail"], "1\n2\n3\n", "{all}");
    stack.shutdown().await;
}

#[tokio::test]
async fn forks_diverge_and_an_old_version_can_be_started_from() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let base = run_on(&client, json!("new"), "echo base > f").await;
    let ws = ws_id(&base);
    let fork_a = call_ok(&client, "fork_workspace", json!({ "workspace_id": ws })).await;
    let fork_b = call_ok(
        &client,
        "fork_workspace",
        json!({ "workspace_id": ws, "version": 1 }),
    )
    .await;
    let (a, b) = (ws_id(&fork_a), ws_id(&fork_b));
    assert!(a != ws && b != ws && a != b, "{fork_a} {fork_b}");

    run_on(&client, json!({ "id": a }), "echo a >> f").await;
    run_on(&client, json!({ "id": b }), "echo b >> f").await;
    run_on(&client, json!({ "id": ws }), "echo original >> f").await;
    let read = |id: String| {
        let client = &client;
        async move { run_on(client, json!({ "id": id }), "cat f").await["stdout_tail"].clone() }
    };
    assert_eq!(read(a).await, "base\na\n");
    assert_eq!(read(b).await, "base\nb\n");
    assert_eq!(read(ws.clone()).await, "base\noriginal\n");

    // Version 1 is still there: starting from it rolls back.
    let back = run_on(&client, json!({ "id": ws, "version": 1 }), "cat f").await;
    assert_eq!(back["stdout_tail"], "base\n", "{back}");
    stack.shutdown().await;
}

/// `collect` and `workspace` together: the version is saved and the files are
/// collected. The save once came after the collector removed its directory,
/// which the engine mounts to read /workspace, and failed ("not a directory").
#[tokio::test]
async fn a_task_that_collects_files_still_makes_its_version() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let id = run(
        &client,
        "python3.13",
        "mkdir -p out && echo kept > out/r.txt && echo state > s.txt",
        json!({ "workspace": "new", "collect": ["out/*"] }),
    )
    .await;
    let done = settled(&client, &id).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["workspace_version"], 1, "{done}");
    let files = call_ok(&client, "get_task_files", json!({ "task_id": id })).await;
    assert_eq!(files["files"][0]["name"], "out/r.txt", "{files}");
    let next = run_on(
        &client,
        json!({ "id": ws_id(&done) }),
        "cat s.txt out/r.txt",
    )
    .await;
    assert_eq!(next["stdout_tail"], "state\nkept\n", "{next}");
    stack.shutdown().await;
}

#[tokio::test]
async fn the_zip_is_unpacked_over_the_restored_files() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let first = run_on(
        &client,
        json!("new"),
        "echo old > keep && echo old > replace",
    )
    .await;
    let ws = ws_id(&first);
    let zip = zip_of(&[("replace", "new\n"), ("added", "added\n")]);
    let id = run(
        &client,
        "python3.13",
        "cat keep replace added",
        json!({ "workspace": { "id": ws }, "zip_base64": zip }),
    )
    .await;
    let second = settled(&client, &id).await;
    assert_eq!(second["stdout_tail"], "old\nnew\nadded\n", "{second}");
    stack.shutdown().await;
}

#[tokio::test]
async fn a_task_that_kills_its_own_init_makes_no_version_and_says_why() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let first = run_on(&client, json!("new"), "echo kept > f").await;
    let ws = ws_id(&first);
    let gone = run_on(&client, json!({ "id": ws }), "echo lost > f; kill -9 -1").await;
    assert!(gone["workspace_version"].is_null(), "{gone}");
    assert!(
        gone["workspace_note"]
            .as_str()
            .is_some_and(|n| n.contains("before its /workspace could be saved")),
        "{gone}"
    );
    // The head stayed at version 1, and the workspace is free again.
    let next = run_on(&client, json!({ "id": ws }), "cat f").await;
    assert_eq!(next["stdout_tail"], "kept\n", "{next}");
    assert_eq!(next["workspace_version"], 2, "{next}");
    stack.shutdown().await;
}

/// A zip of `files` (name, text), base64.
fn zip_of(files: &[(&str, &str)]) -> String {
    use std::io::Write;
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, text) in files {
        w.start_file(*name, zip::write::SimpleFileOptions::default())
            .expect("zip entry");
        w.write_all(text.as_bytes()).expect("zip write");
    }
    b64(w.finish().expect("zip").into_inner())
}

/// A fresh directory for a worker's `TASKS_DIR`.
fn host_dir(name: &str) -> String {
    let dir =
        std::env::temp_dir().join(format!("sr-host-{name}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("tasks dir");
    dir.display().to_string()
}

#[tokio::test]
async fn a_version_saved_on_one_host_is_restored_on_another_through_s3() {
    let garage = testkit::garage::Garage::start().await;
    let mut stack = Stack::start(Options {
        start_worker: false,
        extra_env: garage.worker_env(),
        ..Options::default()
    })
    .await;
    let client = stack.client().await;
    let (dir_a, dir_b) = (host_dir("a"), host_dir("b"));
    let host_a = stack
        .spawn_worker_process("host-a", &[("TASKS_DIR", &dir_a)])
        .await;
    let first = run_on(
        &client,
        json!("new"),
        "head -c 3000000 /dev/urandom > blob && sha256sum blob > blob.sum \
         && mkdir -p .venv/bin && ln -s /usr/bin/python3 .venv/bin/python",
    )
    .await;
    assert_eq!(first["workspace_version"], 1, "{first}");
    let ws = ws_id(&first);
    host_a.terminate();
    assert!(host_a.exited_cleanly().await, "host a stops");

    // Kept: a dropped WorkerProcess is killed.
    let _host_b = stack
        .spawn_worker_process("host-b", &[("TASKS_DIR", &dir_b)])
        .await;
    let second = run_on(
        &client,
        json!({ "id": ws }),
        "sha256sum -c blob.sum && .venv/bin/python -c 'print(40 + 2)'",
    )
    .await;
    assert_eq!(second["state"], "succeeded", "{second}");
    assert_eq!(second["stdout_tail"], "blob: OK\n42\n", "{second}");
    assert_eq!(second["workspace_version"], 2, "{second}");
    // The api reads the same store.
    let sums = read_files(
        &client,
        json!({ "workspace_id": ws, "paths": ["blob.sum"] }),
    )
    .await;
    let sum = entry(&sums, "blob.sum")["content"]
        .as_str()
        .unwrap_or_default();
    assert!(sum.ends_with("  blob\n") && sum.len() == 64 + 7, "{sums}");
    // Neither host kept a store of its own: the versions are in S3.
    for dir in [&dir_a, &dir_b] {
        let local = std::path::Path::new(dir).join("workspace-store");
        assert!(!local.exists(), "{} exists", local.display());
    }
    stack.shutdown().await;
}

#[tokio::test]
async fn a_worker_killed_mid_save_leaves_the_head_where_it_was() {
    let mut stack = Stack::start(Options {
        start_worker: false,
        ..Options::default()
    })
    .await;
    let client = stack.client().await;
    let mut worker = stack.spawn_worker_process("saver", &[]).await;
    // Enough files that the save takes a while after the script's end.
    let id = run(
        &client,
        "python3.13",
        "for i in $(seq 1 300); do head -c 1000000 /dev/urandom > f$i; done; echo done; sleep 1",
        json!({ "workspace": "new", "timeout_seconds": 120 }),
    )
    .await;
    let running = wait_status(
        &client,
        &id,
        "the script's end",
        Duration::from_secs(120),
        |s| s["stdout_tail"] == "done\n" || is_final(s),
    )
    .await;
    let ws = ws_id(&running);
    // Its container is paused for the save: kill the worker now.
    let container = format!("sr-{id}");
    wait_until(
        "the container to be paused for its save",
        Duration::from_secs(30),
        || {
            let paused = docker_ids(&[
                "--filter",
                &format!("name={container}"),
                "--filter",
                "status=paused",
            ]);
            async move { (!paused.is_empty()).then_some(()) }
        },
    )
    .await;
    worker.kill();
    // Another worker settles it as lost; the workspace keeps no version.
    stack.start_worker("settler", &[]).await;
    let lost = wait_status(
        &client,
        &id,
        "the lost worker's task settled",
        Duration::from_secs(90),
        is_final,
    )
    .await;
    assert!(lost["workspace_version"].is_null(), "{lost}");
    // And says why, as every workspace task that makes no version does.
    let note = lost["workspace_note"].as_str().unwrap_or_default();
    assert!(
        note.starts_with("no version was made") && note.contains("worker lost"),
        "{lost}"
    );
    let info = call_ok(&client, "get_workspace", json!({ "workspace_id": ws })).await;
    assert_eq!(info["head"], 0, "{info}");
    assert_eq!(info["versions"], json!([]), "{info}");
    // Free again at once, and empty.
    let next = run_on(&client, json!({ "id": ws }), "ls | wc -l").await;
    assert_eq!(next["stdout_tail"], "0\n", "{next}");
    stack.shutdown().await;
}
