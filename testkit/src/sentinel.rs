//! Three real `redis-sentinel`s (Debian's) watching a test primary with one
//! replica, as `REDIS_SENTINELS` points the binaries at them; and a failover on
//! demand.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{Redis, free_port, wait_until};

/// The name the sentinels watch the primary under (the binaries' default).
pub const MASTER: &str = "mymaster";

/// Three sentinels, quorum 2, each with a config file of its own (Sentinel
/// rewrites it).
pub struct Sentinels {
    children: Vec<Child>,
    pub ports: Vec<u16>,
    dir: std::path::PathBuf,
}

impl Sentinels {
    /// Watches `primary`, which must have `replica` attached. Returns once every
    /// sentinel knows the replica and the two other sentinels, so a failover
    /// can be asked for at once.
    pub async fn start(primary: &Redis) -> Sentinels {
        let dir =
            std::env::temp_dir().join(format!("sr-sentinel-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("sentinel dir");
        let mut s = Sentinels {
            children: Vec::new(),
            ports: Vec::new(),
            dir,
        };
        for i in 0..3 {
            let port = free_port();
            let conf = s.dir.join(format!("sentinel-{i}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                     sentinel monitor {MASTER} 127.0.0.1 {primary} 2\n\
                     sentinel down-after-milliseconds {MASTER} 1000\n\
                     sentinel failover-timeout {MASTER} 10000\n",
                    dir = s.dir.display(),
                    primary = primary.port,
                ),
            )
            .expect("sentinel config");
            let child = Command::new("redis-sentinel")
                .arg(&conf)
                .stdout(Stdio::null())
                .spawn()
                .expect("redis-sentinel must be installed (scripts/test.sh installs it)");
            s.children.push(child);
            s.ports.push(port);
        }
        for &port in &s.ports {
            wait_until(
                "a sentinel to know the replica and the other sentinels",
                Duration::from_secs(30),
                || async move {
                    let m: std::collections::HashMap<String, String> =
                        ask(port, &["MASTER", MASTER]).await.ok()?;
                    let n = |k: &str| m.get(k).and_then(|v| v.parse::<u32>().ok());
                    (n("num-slaves")? >= 1 && n("num-other-sentinels")? >= 2).then_some(())
                },
            )
            .await;
            // Demote an old primary and spread news in a second or two rather
            // than ten (`info-period` 10 s, `publish-period` 2 s by default).
            let _: redis::RedisResult<String> = ask(
                port,
                &["DEBUG", "info-period", "500", "publish-period", "250"],
            )
            .await;
        }
        s
    }

    /// `REDIS_SENTINELS` for them.
    pub fn env(&self) -> String {
        self.ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Asks for a failover (`SENTINEL FAILOVER`, retried while the sentinel has
    /// no replica it trusts yet) and waits until every sentinel names `to`.
    pub async fn failover_to(&self, to: u16) {
        let first = self.ports[0];
        wait_until(
            "SENTINEL FAILOVER to be accepted",
            Duration::from_secs(30),
            || async move { ask::<String>(first, &["FAILOVER", MASTER]).await.ok() },
        )
        .await;
        self.wait_named(to).await;
    }

    /// Waits until every sentinel names the node on port `to` primary.
    pub async fn wait_named(&self, to: u16) {
        for &port in &self.ports {
            wait_until(
                "every sentinel to name the new primary",
                Duration::from_secs(30),
                || async move {
                    let addr: Vec<String> =
                        ask(port, &["GET-MASTER-ADDR-BY-NAME", MASTER]).await.ok()?;
                    (addr.get(1)? == &to.to_string()).then_some(())
                },
            )
            .await;
        }
    }
}

/// `SENTINEL <args>` sent to the sentinel on `port`, over a connection of its own.
async fn ask<T: redis::FromRedisValue>(port: u16, args: &[&str]) -> redis::RedisResult<T> {
    let mut c = sentinel_client(port)
        .get_multiplexed_async_connection()
        .await?;
    redis::cmd("SENTINEL").arg(args).query_async(&mut c).await
}

fn sentinel_client(port: u16) -> redis::Client {
    redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("sentinel url")
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
