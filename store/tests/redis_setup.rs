//! The Redis set-up check at start (`REDIS_SETUP_CHECK`, store::redis_setup):
//! the api and the worker refuse a real redis-server that can evict keys or keeps
//! nothing on disk, start with a warning when told to, and start quietly on a
//! durable one (every other test's Redis, and the deployment's).

// Test code: a failed expectation is a panic (the workspace lints deny these in product code).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::process::{ApiProcess, Process};
use common::*;
use redis::AsyncCommands;

/// Evicts under memory pressure and keeps nothing on disk.
const CARELESS: &[&str] = &[
    "--maxmemory-policy",
    "allkeys-lru",
    "--appendonly",
    "no",
    "--save",
    "",
];

/// The worker binary against `redis`, with the firewall off and no warm pool (it
/// never gets as far as running a task here). Returns it and its heartbeat key.
fn spawn_worker(redis: &Redis, check: &str) -> (Process, String) {
    let tasks = std::env::temp_dir().join(format!("sr-setup-{}", uuid::Uuid::new_v4().simple()));
    let name = format!("setup-{}", uuid::Uuid::new_v4().simple());
    let prefix = unique_prefix('s');
    let heartbeat = shared::Keys::new(prefix.clone()).worker(&name);
    let (url, tasks) = (redis.url(), tasks.display().to_string());
    let vars = [
        ("REDIS_URL", url.as_str()),
        ("REDIS_KEY_PREFIX", &prefix),
        ("WORKER_NAME", &name),
        ("TASK_FIREWALL", "off"),
        ("POOL_SIZE", "0"),
        ("TASKS_DIR", &tasks),
        ("REDIS_SETUP_CHECK", check),
        ("SHUTDOWN_GRACE_SECONDS", "0"),
        ("TASK_VERIFY_KEYS", testkit::VERIFY_KEY),
    ];
    let bin = binary("script-runner-worker", "SCRIPT_RUNNER_WORKER_BIN");
    (Process::spawn(&bin, vars), heartbeat)
}

#[tokio::test]
async fn the_api_and_the_worker_refuse_a_redis_that_can_lose_tasks() {
    let redis = Redis::start_with("127.0.0.1", CARELESS).await;

    let mut api = ApiProcess::spawn(&redis.url(), &[]);
    let status = api.exit_status(Duration::from_secs(30)).await;
    assert!(!status.success(), "the api started on a careless Redis");
    let log = api.log();
    for words in [
        "maxmemory-policy is allkeys-lru",
        "persistence is off",
        "REDIS_SETUP_CHECK=warn",
    ] {
        assert!(log.contains(words), "the api's log lacks {words:?}:\n{log}");
    }

    let (mut worker, _) = spawn_worker(&redis, "refuse");
    let status = worker.exit_status(Duration::from_secs(60)).await;
    let log = worker.log();
    assert!(
        !status.success()
            && log.contains("maxmemory-policy is allkeys-lru")
            && log.contains("persistence is off"),
        "the worker did not refuse ({status}):\n{log}"
    );
}

#[tokio::test]
async fn told_to_warn_they_start_and_say_what_is_wrong() {
    let redis = Redis::start_with("127.0.0.1", CARELESS).await;
    let api = ApiProcess::start(&redis.url(), &[("REDIS_SETUP_CHECK", "warn")]).await;
    let log = api.log();
    assert!(
        log.contains("REDIS_SETUP_CHECK=warn, starting anyway") && log.contains("allkeys-lru"),
        "{log}"
    );
    a_real_client_is_served(&api.url).await;

    let (mut worker, heartbeat) = spawn_worker(&redis, "warn");
    let client = redis.client();
    wait_until("the worker to heartbeat", Duration::from_secs(60), || {
        let (client, key) = (client.clone(), heartbeat.clone());
        async move {
            let mut c = client.get_multiplexed_async_connection().await.ok()?;
            c.exists::<_, bool>(&key).await.ok()?.then_some(())
        }
    })
    .await;
    assert!(
        worker.log().contains("REDIS_SETUP_CHECK=warn"),
        "{}",
        worker.log()
    );
    worker.terminate();
    let stopped = worker.exit_status(Duration::from_secs(30)).await;
    assert!(stopped.success(), "{stopped}:\n{}", worker.log());
}

#[tokio::test]
async fn any_evicting_policy_is_refused_and_rdb_snapshots_count_as_persistence() {
    // volatile-* evicts keys that have a time to live: finished tasks' records.
    let volatile = Redis::start_with(
        "127.0.0.1",
        &["--maxmemory-policy", "volatile-lru", "--appendonly", "yes"],
    )
    .await;
    let mut api = ApiProcess::spawn(&volatile.url(), &[]);
    assert!(!api.exit_status(Duration::from_secs(30)).await.success());
    assert!(
        api.log().contains("maxmemory-policy is volatile-lru"),
        "{}",
        api.log()
    );
    assert!(!api.log().contains("persistence is off"), "{}", api.log());

    let snapshots = Redis::start_with("127.0.0.1", &["--appendonly", "no", "--save", "60 1"]).await;
    let api = ApiProcess::start(&snapshots.url(), &[]).await;
    assert!(api.log().contains("Redis setup checked"), "{}", api.log());
}

#[tokio::test]
async fn a_redis_user_that_may_not_run_info_gets_a_warning_not_a_refusal() {
    let redis = Redis::start().await;
    let mut admin = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let _: () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER",
                "noinfo",
                "on",
                ">secret-pass",
                "~*",
                "&*",
                "+@all",
                "-info",
                "-config",
            ][..],
        )
        .query_async(&mut admin)
        .await
        .expect("ACL SETUSER");
    let url = format!("redis://noinfo:secret-pass@127.0.0.1:{}", redis.port);
    let api = ApiProcess::start(&url, &[]).await;
    assert!(api.log().contains("INFO was refused"), "{}", api.log());
    a_real_client_is_served(&api.url).await;
}

#[tokio::test]
async fn a_redis_that_comes_up_late_is_checked_then_and_a_bad_one_stops_the_api() {
    let mut redis = Redis::start_with("127.0.0.1", CARELESS).await;
    redis.stop();
    let mut api = ApiProcess::spawn(&redis.url(), &[]);
    api.wait_listening().await;
    let health = reqwest::get(format!("{}/healthz", api.url))
        .await
        .expect("healthz");
    assert_eq!(health.status(), 503, "serving while Redis is down");
    assert!(
        api.log()
            .contains("Redis's setup is checked once it answers"),
        "{}",
        api.log()
    );
    redis.restart().await;
    let status = api.exit_status(Duration::from_secs(30)).await;
    assert!(!status.success());
    assert!(
        api.log().contains("maxmemory-policy is allkeys-lru"),
        "{}",
        api.log()
    );
}

/// A real MCP client is served: run_script queues a task.
async fn a_real_client_is_served(url: &str) {
    let client = mcp_client(url, TOKEN)
        .await
        .expect("the real client connects");
    let out = call_ok(
        &client,
        "run_script",
        serde_json::json!({ "runtime": "python3.13", "command_base64": b64("true") }),
    )
    .await;
    assert_eq!(out["state"], "queued");
    let _ = client.cancel().await;
}
