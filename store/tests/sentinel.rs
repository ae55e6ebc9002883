//! Redis Sentinel, for real: a primary, its replica and three `redis-sentinel`s.
//! A pool built on `REDIS_SENTINELS` finds the primary through them, follows a
//! failover, and never has a write acknowledged by the demoted primary (which
//! still says `master` and takes writes for a moment after the sentinels named
//! its replica; those writes would be lost when it resyncs).

// Test code: a failed expectation is a panic (the workspace lints deny these in product code).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::Redis;
use common::sentinel::{MASTER, Sentinels};
use redis::AsyncCommands;
use script_runner_store::redis_error;
use script_runner_store::redis_pool::{self, RedisTarget};
use shared::envvar::{RedisSettings, Sentinels as SentinelSettings};

async fn target(sentinels: &Sentinels) -> RedisTarget {
    let settings = RedisSettings {
        // Its host is never used with sentinels: nothing listens on port 1.
        url: "redis://127.0.0.1:1".into(),
        client_cert: None,
        sentinels: Some(SentinelSettings {
            addrs: sentinels
                .ports
                .iter()
                .map(|p| format!("redis://127.0.0.1:{p}"))
                .collect(),
            master: MASTER.into(),
        }),
        replica_ack: None,
    };
    redis_pool::target(&settings).await.expect("target")
}

/// `SENTINEL FAILOVER` to the node on port `to`, then waits until `redis`
/// (a pool's target) follows it.
async fn fail_over(sentinels: &Sentinels, redis: &RedisTarget, to: u16) {
    sentinels.failover_to(to).await;
    testkit::wait_until(
        "the target to name the new primary",
        Duration::from_secs(10),
        || async { (redis.primary().map(|p| p.port) == Some(to)).then_some(()) },
    )
    .await;
}

async fn node_port(conn: &mut redis_pool::Connection) -> u16 {
    let port: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("port")
        .query_async(conn)
        .await
        .expect("CONFIG GET port");
    port[1].parse().expect("a port")
}

#[tokio::test]
async fn the_pool_finds_the_primary_and_follows_a_failover() {
    let primary = Redis::start().await;
    let replica = Redis::start_replica_of(&primary).await;
    let sentinels = Sentinels::start(&primary).await;
    let redis = target(&sentinels).await;
    let pool = redis_pool::build(&redis, 4, Duration::from_secs(3)).expect("pool");
    let mut conn = pool
        .get()
        .await
        .expect("a connection through the sentinels");
    assert_eq!(node_port(&mut conn).await, primary.port);
    let () = conn
        .set("before", "1")
        .await
        .expect("a write to the primary");
    drop(conn);

    fail_over(&sentinels, &redis, replica.port).await;
    // The pooled connection to the old primary is not handed out again: the
    // next one is to the new primary, which has what was written before.
    let mut conn = pool.get().await.expect("a connection after the failover");
    assert_eq!(node_port(&mut conn).await, replica.port);
    let before: Option<String> = conn.get("before").await.expect("read");
    assert_eq!(before.as_deref(), Some("1"));
    let () = conn
        .set("after", "2")
        .await
        .expect("a write to the new primary");
}

#[tokio::test]
async fn a_write_to_a_demoted_primary_is_never_acknowledged() {
    let primary = Redis::start().await;
    let replica = Redis::start_replica_of(&primary).await;
    let sentinels = Sentinels::start(&primary).await;
    let redis = target(&sentinels).await;
    // Trusted for an hour: no check on checkout could save it; only the target's
    // knowledge of the primary does.
    let pool = redis_pool::build_lean(&redis, 1, Duration::from_secs(3), Duration::from_secs(3600))
        .expect("pool");
    let mut held = pool.get().await.expect("a connection to the primary");
    assert_eq!(node_port(&mut held).await, primary.port);

    fail_over(&sentinels, &redis, replica.port).await;
    // The old primary may well still take writes now (the sentinels demote it
    // a moment later). A write on the connection made to it must not be sent.
    let stale: redis::RedisResult<()> = held.set("lost", "x").await;
    assert!(
        stale.is_err(),
        "a write on a connection to the demoted primary was acknowledged"
    );
    drop(held);
    let mut old = primary.conn().await;
    let on_old: Option<String> = old.get("lost").await.expect("read the old primary");
    assert_eq!(on_old, None, "the write reached the demoted primary");

    // And the pool goes on, to the new primary.
    let mut conn = pool.get().await.expect("a connection after the failover");
    let () = conn
        .set("kept", "y")
        .await
        .expect("a write to the new primary");
    let mut new = replica.conn().await;
    let kept: Option<String> = new.get("kept").await.expect("read the new primary");
    assert_eq!(kept.as_deref(), Some("y"));
}

#[tokio::test]
async fn a_connection_to_a_node_that_is_now_a_replica_is_dropped() {
    // The sentinels demote the old primary a moment after a failover; a
    // connection made to it then (before the target heard of the switch) gets
    // READONLY, and must not be reused.
    let primary = Redis::start().await;
    let replica = Redis::start_replica_of(&primary).await;
    let target = RedisTarget::url(&replica.url()).expect("url");
    let pool = redis_pool::build_lean(
        &target,
        1,
        Duration::from_secs(3),
        Duration::from_secs(3600),
    )
    .expect("pool");
    let mut conn = pool.get().await.expect("a connection");
    let first = client_id(&mut conn).await;
    let refused: redis::RedisResult<()> = conn.set("k", "v").await;
    assert!(
        refused.as_ref().is_err_and(redis_error::is_not_primary),
        "{refused:?}"
    );
    drop(conn);
    // Promote the replica: a new connection works; the refused one was not kept.
    let mut direct = replica.conn().await;
    let _: String = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut direct)
        .await
        .expect("REPLICAOF NO ONE");
    let mut conn = pool.get().await.expect("a new connection");
    assert_ne!(
        client_id(&mut conn).await,
        first,
        "the connection refused with READONLY was handed out again"
    );
    let () = conn
        .set("k", "v")
        .await
        .expect("a write after the promotion");
}

async fn client_id(conn: &mut redis_pool::Connection) -> i64 {
    redis::cmd("CLIENT")
        .arg("ID")
        .query_async(conn)
        .await
        .expect("CLIENT ID")
}
