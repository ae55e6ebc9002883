//! Dependency caches (docs/sandbox.md, "Dependency caches"): pip's and npm's
//! caches kept per owner on the worker host, against the real engine, Redis,
//! API keys and the MCP client. pip proves the cache from its own words: a
//! package built from an sdist (by an in-tree build backend, so no network and
//! no setuptools) is "Using cached" in the owner's next task, and built again
//! anywhere else.

use std::path::{Path, PathBuf};
use std::time::Duration;

use script_runner_e2e::*;
use serde_json::{Value, json};

/// The in-tree PEP 517 backend of the `demo` sdist: writes a wheel with the
/// zip module. `requires = []`, so pip's isolated build needs nothing.
const BACKEND: &str = r#"import os, zipfile
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    fn = "demo-1.0-py3-none-any.whl"
    info = "demo-1.0.dist-info"
    with zipfile.ZipFile(os.path.join(wheel_directory, fn), "w") as z:
        z.writestr("demo.py", "def hello():\n    return 'hello from demo'\n")
        z.writestr(info + "/METADATA", "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
        z.writestr(info + "/WHEEL", "Wheel-Version: 1.0\nGenerator: backend\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(info + "/RECORD", "demo.py,,\n" + info + "/METADATA,,\n" + info + "/WHEEL,,\n" + info + "/RECORD,,\n")
    return fn
"#;

const PYPROJECT: &str = "[build-system]\nrequires = []\nbuild-backend = \"backend\"\n\
backend-path = [\".\"]\n[project]\nname = \"demo\"\nversion = \"1.0\"\n";

/// Packs the sdist in the task (the same path every time: pip's wheel cache is
/// keyed by the link) and installs it through --find-links, the way pip looks
/// in its wheel cache.
const PIP_INSTALL: &str = "mkdir -p sd && python -m tarfile -c sd/demo-1.0.tar.gz demo-1.0 && \
pip install --user --no-index --find-links ./sd demo 2>&1 && python -c 'import demo; print(demo.hello())'";

fn project_zip() -> Vec<u8> {
    zip_of(&[
        ("demo-1.0/pyproject.toml", PYPROJECT),
        ("demo-1.0/backend.py", BACKEND),
    ])
}

/// A stack whose worker keeps caches (`extra` on top), with the pool on
/// (one idle python3.13 container) or off.
async fn stack(pool: bool, extra: &[(&'static str, &str)]) -> Stack {
    let mut env = vec![
        (
            "POOL_SIZE",
            if pool { "python3.13=1" } else { "0" }.to_owned(),
        ),
        ("EGRESS_POOL_SIZE", "0".to_owned()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    Stack::start(Options {
        extra_env: env,
        ..Options::default()
    })
    .await
}

/// Where the worker keeps `owner`'s cache while no task holds it.
fn owner_dir(stack: &Stack, owner: Option<&str>) -> PathBuf {
    stack
        .tasks_dir()
        .join(format!("cache-{}", stack.worker_name))
        .join("owners")
        .join(shared::cache::owner_id(
            &owner.map_or(shared::Owner::Admin, shared::Owner::from_stored),
        ))
}

/// Waits until `owner`'s cache is back on the host (it comes back once its
/// task's container is removed, after the task's record is final).
async fn wait_back(stack: &Stack, owner: Option<&str>) -> PathBuf {
    let dir = owner_dir(stack, owner);
    wait_until(
        "the owner's cache to come back",
        Duration::from_secs(30),
        || async { dir.is_dir().then_some(()) },
    )
    .await;
    dir
}

/// Runs `command` as `client` to its end; with the pool on, first waits for
/// the idle container, so the task runs warm.
async fn run_python(stack: &Stack, client: &Client, command: &str, extra: Value) -> Value {
    if pool_on(stack) {
        wait_for_idle_container(stack).await;
    }
    let s = run_to_end_within(
        client,
        "python3.13",
        command,
        extra,
        Duration::from_secs(120),
    )
    .await;
    assert_eq!(s["state"], "succeeded", "{s}");
    s
}

/// Waits until the worker has an idle python3.13 pool container, so the next
/// task runs warm.
async fn wait_for_idle_container(stack: &Stack) {
    wait_until(
        "an idle python3.13 pool container",
        Duration::from_secs(90),
        || async { (!pool_containers(&stack.worker_name, "python3.13").is_empty()).then_some(()) },
    )
    .await;
}

fn pool_on(stack: &Stack) -> bool {
    stack
        .env_with("x", &[])
        .get("POOL_SIZE")
        .is_some_and(|s| s != "0")
}

fn stdout(s: &Value) -> &str {
    s["stdout_tail"].as_str().unwrap_or_default()
}

/// Every regular file under `dir` (no link followed).
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let m = e.path().symlink_metadata().expect("lstat");
            if m.is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out
}

async fn the_owners_next_task_uses_its_cache_and_no_one_elses(pool: bool) {
    let stack = stack(pool, &[]).await;
    let (alice, bob) = (stack.client_of("alice").await, stack.client_of("bob").await);
    let zip = json!({ "zip_base64": b64(project_zip()) });

    let first = run_python(&stack, &alice, PIP_INSTALL, zip.clone()).await;
    assert!(
        stdout(&first).contains("Building wheel for demo"),
        "{first}"
    );
    assert!(stdout(&first).contains("hello from demo"), "{first}");
    let dir = wait_back(&stack, Some("alice")).await;
    assert!(
        files_under(&dir)
            .iter()
            .any(|f| f.extension().is_some_and(|e| e == "whl")),
        "pip's built wheel is in alice's cache on the host: {:?}",
        files_under(&dir)
    );

    let second = run_python(&stack, &alice, PIP_INSTALL, zip.clone()).await;
    assert!(
        stdout(&second).contains("Using cached demo-1.0-py3-none-any.whl"),
        "alice's second task uses the wheel her first built: {second}"
    );
    assert!(!stdout(&second).contains("Building wheel"), "{second}");

    let other = run_python(&stack, &bob, PIP_INSTALL, zip.clone()).await;
    assert!(
        stdout(&other).contains("Building wheel for demo"),
        "bob sees nothing of alice's cache: {other}"
    );
    // The admin key is an owner of its own.
    let admin = stack.client().await;
    let theirs = run_python(&stack, &admin, PIP_INSTALL, zip.clone()).await;
    assert!(
        stdout(&theirs).contains("Building wheel for demo"),
        "{theirs}"
    );

    // Opted out: empty caches in /tmp, alice's neither seen nor touched.
    wait_back(&stack, Some("alice")).await;
    let before = files_under(&dir);
    let out = run_python(
        &stack,
        &alice,
        &format!(
            "{PIP_INSTALL} && echo \"cache=[${{PIP_CACHE_DIR:-}}]\" && ls -A /.sr-cache | wc -l"
        ),
        json!({ "zip_base64": b64(project_zip()), "cache": "none" }),
    )
    .await;
    assert!(stdout(&out).contains("Building wheel for demo"), "{out}");
    assert!(stdout(&out).contains("cache=[]\n0\n"), "{out}");
    assert_eq!(files_under(&dir), before, "alice's cache is untouched");
    stack.shutdown().await;
}

#[tokio::test]
async fn the_owners_next_task_uses_its_cache_and_no_one_elses_pool_off() {
    the_owners_next_task_uses_its_cache_and_no_one_elses(false).await;
}

#[tokio::test]
async fn the_owners_next_task_uses_its_cache_and_no_one_elses_pool_on() {
    the_owners_next_task_uses_its_cache_and_no_one_elses(true).await;
}

/// A kill and a timeout end a task's container by force, on the warm path and
/// the cold one alike; what the task wrote into its cache comes back all the
/// same, for the owner's next task.
async fn a_cache_comes_back_after_a_kill_and_a_timeout(pool: bool) {
    let stack = stack(pool, &[]).await;
    let alice = stack.client_of("alice").await;
    let warm = || async {
        if pool {
            wait_for_idle_container(&stack).await;
        }
    };

    warm().await;
    let id = start_until_output(
        &alice,
        "mkdir -p \"$PIP_CACHE_DIR\" && echo killed > \"$PIP_CACHE_DIR/k\" && echo ready && sleep 300",
        json!({}),
        "ready\n",
    )
    .await;
    call_ok(&alice, "kill_task", json!({ "task_id": id })).await;
    let killed = wait_status(&alice, &id, "the kill", Duration::from_secs(60), is_final).await;
    assert_eq!(killed["state"], "killed", "{killed}");
    wait_back(&stack, Some("alice")).await;

    warm().await;
    let timed_out = run_to_end_within(
        &alice,
        "python3.13",
        "cat \"$PIP_CACHE_DIR/k\" && echo timed-out > \"$PIP_CACHE_DIR/t\" && sleep 300",
        json!({ "timeout_seconds": 3 }),
        Duration::from_secs(90),
    )
    .await;
    assert_eq!(timed_out["state"], "timed-out", "{timed_out}");
    assert_eq!(
        stdout(&timed_out),
        "killed\n",
        "the killed task's cache came back"
    );
    wait_back(&stack, Some("alice")).await;

    let next = run_python(
        &stack,
        &alice,
        "cat \"$PIP_CACHE_DIR/k\" \"$PIP_CACHE_DIR/t\"",
        json!({}),
    )
    .await;
    assert_eq!(
        stdout(&next),
        "killed\ntimed-out\n",
        "the timed-out task's cache came back"
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn a_cache_comes_back_after_a_kill_and_a_timeout_pool_off() {
    a_cache_comes_back_after_a_kill_and_a_timeout(false).await;
}

#[tokio::test]
async fn a_cache_comes_back_after_a_kill_and_a_timeout_pool_on() {
    a_cache_comes_back_after_a_kill_and_a_timeout(true).await;
}

#[tokio::test]
async fn a_bad_cache_argument_is_refused_naming_the_choices() {
    let stack = stack(false, &[]).await;
    let client = stack.client().await;
    let e = call_err(
        &client,
        "run_script",
        json!({ "runtime": "python3.13", "command_base64": b64("true"), "cache": "shared" }),
    )
    .await;
    assert!(
        e.contains("cache") && e.contains("owner") && e.contains("none"),
        "{e}"
    );
    assert_no_task_created(&stack).await;
    stack.shutdown().await;
}

/// Writes `mib` MiB into the task's pip cache as `name`.
fn fill(name: &str, mib: u32) -> String {
    format!(
        "mkdir -p \"$PIP_CACHE_DIR\" && head -c {} /dev/urandom > \"$PIP_CACHE_DIR/{name}\"",
        mib << 20
    )
}

#[tokio::test]
async fn the_caps_evict_the_oldest_files_then_the_least_recently_used_owners() {
    let stack = stack(
        false,
        &[("CACHE_MB_PER_OWNER", "3"), ("CACHE_TOTAL_MB", "4")],
    )
    .await;
    let (alice, bob) = (stack.client_of("alice").await, stack.client_of("bob").await);
    // 3 MiB of files in one task, the oldest dated a day back: with their
    // directories (which count too), over alice's 3 MiB.
    let s = run_python(
        &stack,
        &alice,
        &format!(
            "{} && touch -d '1 day ago' \"$PIP_CACHE_DIR/old\" && {} && {}",
            fill("old", 1),
            fill("mid", 1),
            fill("new", 1)
        ),
        json!({}),
    )
    .await;
    let _ = s;
    let dir = wait_back(&stack, Some("alice")).await;
    let names = |dir: &Path| -> Vec<String> {
        let mut n: Vec<String> = files_under(dir)
            .iter()
            .filter_map(|f| f.file_name()?.to_str().map(str::to_owned))
            .collect();
        n.sort();
        n
    };
    wait_until(
        "alice's cache trimmed to 3 MiB",
        Duration::from_secs(30),
        || async { (names(&dir) == ["mid", "new"]).then_some(()) },
    )
    .await;
    // bob's 2 MiB on top of alice's 2 (and their directories): over the 4 MiB
    // in all, and alice's is the least recently used.
    run_python(&stack, &bob, &fill("b", 2), json!({})).await;
    let bobs = wait_back(&stack, Some("bob")).await;
    wait_until(
        "alice's cache evicted whole",
        Duration::from_secs(30),
        || async { (!dir.exists()).then_some(()) },
    )
    .await;
    assert_eq!(names(&bobs), ["b"]);
    stack.shutdown().await;
}

#[tokio::test]
async fn the_ctl_clears_an_owners_cache_before_its_next_task() {
    let stack = stack(false, &[]).await;
    let (alice, bob) = (stack.client_of("alice").await, stack.client_of("bob").await);
    let zip = json!({ "zip_base64": b64(project_zip()) });
    run_python(&stack, &alice, PIP_INSTALL, zip.clone()).await;
    run_python(&stack, &bob, PIP_INSTALL, zip.clone()).await;
    wait_back(&stack, Some("alice")).await;
    wait_back(&stack, Some("bob")).await;

    let clear = |owner: &'static str| {
        tokio::process::Command::new(binary("script-runner-ctl", "SCRIPT_RUNNER_CTL_BIN"))
            .env_clear()
            .env("REDIS_URL", stack.redis.url())
            .env("REDIS_KEY_PREFIX", &stack.prefix)
            .args(["cache", "clear", "--owner", owner])
            .output()
    };
    // A name that cannot own tasks is refused, and one that owns none yet is
    // cleared with a warning: both are likely typos, and neither clears alice's.
    let refused = clear("oauth:").await.expect("script-runner-ctl runs");
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && why.contains("\"oauth:\" is no owner"),
        "{why}"
    );
    let unknown = clear("alicee").await.expect("script-runner-ctl runs");
    let why = String::from_utf8_lossy(&unknown.stderr);
    assert!(
        unknown.status.success() && why.contains("warning: no task of this owner"),
        "{why}"
    );
    let out = clear("alice").await.expect("script-runner-ctl runs");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !said.contains("warning"), "{said}");

    let again = run_python(&stack, &alice, PIP_INSTALL, zip.clone()).await;
    assert!(
        stdout(&again).contains("Building wheel for demo"),
        "alice's cache was emptied: {again}"
    );
    let kept = run_python(&stack, &bob, PIP_INSTALL, zip.clone()).await;
    assert!(
        stdout(&kept).contains("Using cached demo-1.0-py3-none-any.whl"),
        "bob's cache is kept: {kept}"
    );
    stack.shutdown().await;
}

/// A scratch directory on the host that a task's links point at.
struct Outside(PathBuf);

impl Drop for Outside {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn links_in_a_cache_never_lead_the_worker_outside_it() {
    let stack = stack(false, &[("CACHE_MB_PER_OWNER", "2")]).await;
    let alice = stack.client_of("alice").await;
    let outside =
        Outside(std::env::temp_dir().join(format!("sr-outside-{}", uuid::Uuid::new_v4())));
    std::fs::create_dir_all(outside.0.join("dir")).expect("outside dir");
    let victim = outside.0.join("dir/victim");
    std::fs::write(&victim, vec![7u8; 512 * 1024]).expect("victim");
    // Old, so it would be the first file evicted, were the links followed.
    let past = std::time::SystemTime::now() - Duration::from_secs(86_400 * 30);
    std::fs::File::options()
        .write(true)
        .open(&victim)
        .and_then(|f| {
            f.set_times(
                std::fs::FileTimes::new()
                    .set_accessed(past)
                    .set_modified(past),
            )
        })
        .expect("age the victim");
    let o = outside.0.display().to_string();
    // Links to the host paths (a directory and a file), 2 MiB to go over the
    // cap, and an attempt to swap the lent directory itself for a link.
    let s = run_python(
        &stack,
        &alice,
        &format!(
            "mkdir -p \"$PIP_CACHE_DIR\" && ln -s {o}/dir \"$PIP_CACHE_DIR/dirlink\" && \
             ln -s {o}/dir/victim \"$PIP_CACHE_DIR/filelink\" && mkfifo \"$PIP_CACHE_DIR/pipe\" && \
             {} && touch -d '1 hour ago' \"$PIP_CACHE_DIR/a\" && {} && \
             (mv /.sr-cache/c /.sr-cache/gone 2>/dev/null && echo swapped || echo kept) && \
             (ln -s {o} /.sr-cache/c2 2>/dev/null && echo planted || echo refused)",
            fill("a", 1),
            fill("b", 1)
        ),
        json!({}),
    )
    .await;
    assert!(stdout(&s).contains("kept\nrefused"), "{s}");
    let dir = wait_back(&stack, Some("alice")).await;
    // The older of the two files goes over the cap: the trim has run.
    wait_until("alice's cache trimmed", Duration::from_secs(30), || async {
        (!dir.join("pip/a").exists()).then_some(())
    })
    .await;
    assert_eq!(
        std::fs::read(&victim)
            .expect("the file outside is still there")
            .len(),
        512 * 1024
    );
    assert!(outside.0.join("dir").is_dir());
    for link in ["dirlink", "filelink", "pipe"] {
        assert!(
            dir.join("pip").join(link).symlink_metadata().is_err(),
            "{link} was removed"
        );
    }
    assert_eq!(files_under(&dir), [dir.join("pip/b")]);
    stack.shutdown().await;
}

#[tokio::test]
async fn a_second_task_of_the_owner_running_meanwhile_gets_no_cache() {
    let stack = stack(false, &[]).await;
    let alice = stack.client_of("alice").await;
    let first = start_until_output(
        &alice,
        "echo \"cache=$PIP_CACHE_DIR\"; sleep 60",
        json!({}),
        "cache=/.sr-cache/c/pip\n",
    )
    .await;
    let second = run_python(
        &stack,
        &alice,
        "echo \"cache=[${PIP_CACHE_DIR:-}]\"; ls -A /.sr-cache 2>/dev/null | wc -l",
        json!({}),
    )
    .await;
    assert!(stdout(&second).contains("cache=[]\n0\n"), "{second}");
    call_ok(&alice, "kill_task", json!({ "task_id": first })).await;
    stack.shutdown().await;
}

#[tokio::test]
async fn a_lost_workers_caches_are_removed_by_the_worker_that_reaps_it() {
    let mut stack = Stack::start(Options {
        start_worker: false,
        extra_env: vec![
            ("POOL_SIZE", "0".to_owned()),
            ("EGRESS_POOL_SIZE", "0".to_owned()),
        ],
        ..Options::default()
    })
    .await;
    let alice = stack.client_of("alice").await;
    let fast_heartbeat = [("WORKER_HEARTBEAT_SECONDS", "1")];
    let mut doomed = stack.spawn_worker_process("doomed", &fast_heartbeat).await;
    let done = run_python(
        &stack,
        &alice,
        "mkdir -p \"$PIP_CACHE_DIR\" && echo kept > \"$PIP_CACHE_DIR/k\"",
        json!({}),
    )
    .await;
    assert_eq!(done["state"], "succeeded", "{done}");
    let doomed_caches = stack
        .tasks_dir()
        .join(format!("cache-{}", stack.worker("doomed")));
    let alices = doomed_caches
        .join("owners")
        .join(shared::cache::owner_id(&shared::Owner::Key("alice".into())));
    wait_until(
        "alice's cache back on the doomed worker's host",
        Duration::from_secs(30),
        || async { alices.join("pip/k").is_file().then_some(()) },
    )
    .await;

    doomed.kill();
    stack.start_worker("rescuer", &fast_heartbeat).await;
    stack.wait_forgotten(&stack.worker("doomed")).await;
    wait_until(
        "the lost worker's caches to be removed",
        Duration::from_secs(30),
        || async { (!doomed_caches.exists()).then_some(()) },
    )
    .await;
    assert!(
        stack
            .tasks_dir()
            .join(format!("cache-{}", stack.worker("rescuer")))
            .is_dir(),
        "the reaper's own caches are kept"
    );
    stack.shutdown().await;
}
