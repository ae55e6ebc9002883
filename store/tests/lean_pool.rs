//! The api's Redis pool (`store::redis_pool::build_lean`) hands out a recently
//! used connection without a check round trip, so it must notice broken
//! connections itself. Against a real redis-server restarted under it.

// Test code: a failed expectation is a panic (the workspace lints deny these in product code).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::Redis;
use redis::RedisResult;
use script_runner_store::redis_pool::{LeanPool, RedisTarget, build_lean};

fn target(redis: &Redis) -> RedisTarget {
    RedisTarget::url(&redis.url()).expect("a Redis URL")
}

async fn ping(pool: &LeanPool) -> RedisResult<String> {
    let mut conn = pool.get().await.expect("a connection from the pool");
    redis::cmd("PING").query_async(&mut conn).await
}

#[tokio::test]
async fn a_connection_whose_command_failed_is_replaced_even_when_trusted() {
    let mut redis = Redis::start().await;
    // Trusted for an hour: only the failure can keep the dead connection out.
    let pool = build_lean(
        &target(&redis),
        1,
        Duration::from_secs(2),
        Duration::from_secs(3600),
    )
    .expect("pool");
    let mut conn = pool.get().await.expect("connection");
    let pong: String = redis::cmd("PING")
        .query_async(&mut conn)
        .await
        .expect("ping");
    assert_eq!(pong, "PONG");
    redis.restart().await;
    let failed: RedisResult<String> = redis::cmd("PING").query_async(&mut conn).await;
    assert!(
        failed.is_err(),
        "a PING on a connection to the old server should fail"
    );
    drop(conn);
    // The only slot held the dead connection: the next checkout must make a new one.
    assert_eq!(ping(&pool).await.expect("ping after the restart"), "PONG");
}

#[tokio::test]
async fn an_idle_connection_is_checked_before_it_is_handed_out() {
    let mut redis = Redis::start().await;
    // Never trusted: every checkout is checked (a PING).
    let pool =
        build_lean(&target(&redis), 1, Duration::from_secs(2), Duration::ZERO).expect("pool");
    assert_eq!(ping(&pool).await.expect("ping"), "PONG");
    redis.restart().await;
    // Nothing failed on it, but it idled: the check finds it dead and replaces it,
    // so the first command after the restart already succeeds.
    assert_eq!(ping(&pool).await.expect("ping after the restart"), "PONG");
}

#[tokio::test]
async fn a_trusted_connection_is_handed_out_without_a_check() {
    let redis = Redis::start().await;
    let pool = build_lean(
        &target(&redis),
        1,
        Duration::from_secs(2),
        Duration::from_secs(3600),
    )
    .expect("pool");
    let before = commands_processed(&redis).await;
    for _ in 0..10 {
        assert_eq!(ping(&pool).await.expect("ping"), "PONG");
    }
    // Ten PINGs and nothing else (deadpool-redis would add UNWATCH and PING per checkout).
    assert_eq!(commands_processed(&redis).await - before, 10 + 1);
}

/// `total_commands_processed` (the INFO call counts itself once it has run).
async fn commands_processed(redis: &Redis) -> u64 {
    let mut c = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("connection");
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut c)
        .await
        .expect("info");
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("total_commands_processed")
}
