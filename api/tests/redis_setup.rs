//! The Redis set-up check at start (`REDIS_SETUP_CHECK`, support::redis_setup):
//! the api and the worker refuse a real redis-server that can evict keys or keeps
//! nothing on disk, start with a warning when told to, and start quietly on a
//! durable one (every other test's Redis, and the deployment's).

mod common;

use std::time::Duration;

use common::process::ApiProcess;
use common::*;
use redis::AsyncCommands;
use tokio_util::sync::CancellationToken;

/// Evicts under memory pressure and keeps nothing on disk.
const CARELESS: &[&str] = &[
    "--maxmemory-policy",
    "allkeys-lru",
    "--appendonly",
    "no",
    "--save",
    "",
];

/// A worker of its own against `redis`, in this process, with the firewall off
/// (it never gets as far as running a task here).
fn worker_config(redis: &Redis, name: &str, check: &str) -> script_runner_worker::Config {
    let tasks = std::env::temp_dir().join(format!("sr-setup-{}", uuid::Uuid::new_v4().simple()));
    let vars = [
        ("REDIS_URL", redis.url()),
        (
            "REDIS_KEY_PREFIX",
            format!("s{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
        ),
        ("WORKER_NAME", name.to_owned()),
        ("TASK_FIREWALL", "off".to_owned()),
        ("TASKS_DIR", tasks.display().to_string()),
        ("REDIS_SETUP_CHECK", check.to_owned()),
        ("SHUTDOWN_GRACE_SECONDS", "0".to_owned()),
    ];
    script_runner_worker::Config::from_lookup(|k| {
        vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
    })
    .expect("worker config")
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

    let config = worker_config(
        &redis,
        &format!("setup-{}", uuid::Uuid::new_v4().simple()),
        "refuse",
    );
    let run = script_runner_worker::run(config, std::future::pending());
    let result = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the worker decides within a minute");
    let message = result.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        message.contains("maxmemory-policy is allkeys-lru")
            && message.contains("persistence is off"),
        "the worker did not refuse: {message:?}"
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

    let name = format!("setup-{}", uuid::Uuid::new_v4().simple());
    let config = worker_config(&redis, &name, "warn");
    let keys = config.keys.clone();
    let stop = CancellationToken::new();
    let worker = tokio::spawn({
        let stop = stop.clone();
        async move { script_runner_worker::run(config, async move { stop.cancelled().await }).await }
    });
    let client = redis.client();
    wait_until("the worker to heartbeat", Duration::from_secs(60), || {
        let (client, key) = (client.clone(), keys.worker(&name));
        async move {
            let mut c = client.get_multiplexed_async_connection().await.ok()?;
            c.exists::<_, bool>(&key).await.ok()?.then_some(())
        }
    })
    .await;
    stop.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(30), worker)
        .await
        .expect("the worker stops");
    assert!(matches!(stopped, Ok(Ok(()))), "{stopped:?}");
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
