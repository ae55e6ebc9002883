//! What the tests of every crate share, none of it tied to one binary: a real
//! `redis-server` per test on a free port, the built binaries run as processes,
//! the rmcp client over Streamable HTTP and its tool-call helpers, and a reader
//! of the Prometheus text `/metrics` serves (`exposition`). Nothing is mocked.
//! The api-and-worker stack lives in the e2e crate's harness (`e2e/src/lib.rs`),
//! which builds on this crate.
//!
//! Waiting is always on a condition with a deadline, never a bare sleep.

pub mod exposition;
pub mod garage;
pub mod json;
mod mcp;
pub mod process;
mod redis_server;
pub mod registry;
pub mod sentinel;

use std::collections::HashMap;
use std::future::Future;
use std::net::TcpListener as StdListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use redis::AsyncCommands;

pub use mcp::*;
pub use redis_server::{DURABLE, Redis};

/// The bearer token every test service is started with.
pub const TOKEN: &str = "test-token-0123456789abcdef0123456789abcdef";

/// The api's spec signing key in tests (`TASK_SIGNING_KEY`: 32 bytes of 0x01),
/// and its public key, which every test worker verifies with
/// (`TASK_VERIFY_KEYS`; `script-runner-ctl signing-key public` prints it).
pub const SIGNING_KEY: &str = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=";
pub const VERIFY_KEY: &str = "iojj3XQJ8ZX9UtstPLpdcspnCb8dlBIb83SIAbQPb1w=";

/// The image the Python runtimes (python3.13, python3.8) map to in tests: no
/// registry here, so it is built by scripts/build-test-image.sh (Debian trixie's
/// Python 3.13 with pip and venv, like `python:3.13-slim`).
pub fn runtime_image() -> String {
    std::env::var("TEST_RUNTIME_IMAGE")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| "script-runner-test/python:3.13-trixie".into())
}

/// The image `node24` maps to in tests (Node 24 and npm, like `node:24-slim`),
/// built by scripts/build-test-image.sh.
pub fn node_image() -> String {
    std::env::var("TEST_NODE_IMAGE")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| "script-runner-test/node:24-trixie".into())
}

pub fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Polls `check` until it returns `Some`, or panics after `deadline` with `what`.
pub async fn wait_until<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < end,
            "timed out after {deadline:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The built binary `name` (`script-runner-api`, `-worker`, `-ctl`), or the path
/// in `override_var` (e.g. a release build). By default the one beside this test
/// executable's directory (`<target>/debug/deps/..`), so a `CARGO_TARGET_DIR`
/// elsewhere is found too; `cargo build --bins` makes it.
pub fn binary(name: &str, override_var: &str) -> PathBuf {
    let bin = std::env::var_os(override_var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let exe = std::env::current_exe().expect("the test executable's path");
            // <target>/debug/deps/<test> -> <target>/debug/<name>
            let profile_dir = exe
                .parent()
                .and_then(|deps| deps.parent())
                .expect("the test executable sits in <target>/<profile>/deps");
            profile_dir.join(name)
        });
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --bins` first (or set {override_var})",
        bin.display()
    );
    bin
}

/// The environment both services read in tests, against `redis` under key
/// `prefix`: the token, the test runtime images, the timeout cap, and the warm
/// pool's size when TEST_POOL_SIZE says it (scripts/test.sh runs the task suites
/// with the pool on and off).
pub fn service_env(
    redis: &Redis,
    prefix: &str,
    max_timeout_seconds: u64,
) -> HashMap<String, String> {
    let (img, node) = (runtime_image(), node_image());
    let mut env: HashMap<String, String> = [
        ("SCRIPT_RUNNER_TOKEN", TOKEN.to_owned()),
        ("TASK_SIGNING_KEY", SIGNING_KEY.to_owned()),
        ("TASK_VERIFY_KEYS", VERIFY_KEY.to_owned()),
        ("REDIS_URL", redis.url()),
        ("REDIS_KEY_PREFIX", prefix.to_owned()),
        ("LISTEN_ADDR", "127.0.0.1:0".to_owned()),
        (
            "RUNTIME_IMAGES",
            format!("node24={node},python3.13={img},python3.8={img}"),
        ),
        ("MAX_TIMEOUT_SECONDS", max_timeout_seconds.to_string()),
        ("DEFAULT_TIMEOUT_SECONDS", "60".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    if let Ok(size) = std::env::var("TEST_POOL_SIZE") {
        // No pool at all: allow-list tasks' too.
        if size.trim() == "0" {
            env.insert("EGRESS_POOL_SIZE".to_owned(), "0".to_owned());
        }
        env.insert("POOL_SIZE".to_owned(), size);
    }
    env
}

/// A key prefix no other test (or run) uses: `<letter>` and 8 hex digits.
pub fn unique_prefix(letter: char) -> String {
    format!(
        "{letter}{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// Nothing of a task exists under `keys` in `redis`: no job ever stayed in the
/// stream and no task record or zip was written (a job would be gone once run,
/// a record not).
pub async fn assert_no_task_in(redis: &Redis, keys: &shared::Keys) {
    let mut r = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    // A Redis error must fail the check, never read as "nothing there".
    let jobs: u64 = r.xlen(keys.jobs()).await.expect("XLEN of the jobs stream");
    assert_eq!(jobs, 0, "a job was enqueued");
    let found: Vec<String> = r
        .keys(keys.task("*"))
        .await
        .expect("KEYS of the task records");
    assert!(found.is_empty(), "task keys were written: {found:?}");
}

/// A zip of `(path, contents)` pairs; paths ending in '/' are directories.
pub fn zip_of(entries: &[(&str, &str)]) -> Vec<u8> {
    use std::io::Write;
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default();
    for (name, data) in entries {
        if name.ends_with('/') {
            w.add_directory(*name, opts).expect("dir");
        } else {
            w.start_file(*name, opts).expect("file");
            w.write_all(data.as_bytes()).expect("write");
        }
    }
    w.finish().expect("zip").into_inner()
}
