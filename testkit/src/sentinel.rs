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
            let client = sentinel_client(port);
            wait_until(
                "a sentinel to know the replica and the other sentinels",
                Duration::from_secs(30),
                || {
                    let client = client.clone();
                    async move {
                        let mut c = client.get_multiplexed_async_connection().await.ok()?;
                        let m: std::collections::HashMap<String, String> = redis::cmd("SENTINEL")
                            .arg("MASTER")
                            .arg(MASTER)
                            .query_async(&mut c)
                            .await
                            .ok()?;
                        let n = |k: &str| m.get(k).and_then(|v| v.parse::<u32>().ok());
                        (n("num-slaves")? >= 1 && n("num-other-sentinels")? >= 2).then_some(())
                    }
                },
            )
            .await;
            // Demote an old primary and spread news in a second or two rather
            // than ten (`info-period` 10 s, `publish-period` 2 s by default).
            let mut c = client
                .get_multiplexed_async_connection()
                .await
                .expect("sentinel");
            let _: redis::RedisResult<String> = redis::cmd("SENTINEL")
                .arg("DEBUG")
                .arg("info-period")
                .arg(500)
                .arg("publish-period")
                .arg(250)
                .query_async(&mut c)
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

    /// The primary's port as the first sentinel names it.
    pub async fn primary_port(&self) -> Option<u16> {
        let mut c = sentinel_client(self.ports[0])
            .get_multiplexed_async_connection()
            .await
            .ok()?;
        let addr: Vec<String> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(MASTER)
            .query_async(&mut c)
            .await
            .ok()?;
        addr.get(1)?.parse().ok()
    }

    /// Asks for a failover (`SENTINEL FAILOVER`, retried while the sentinel has
    /// no replica it trusts yet) and waits until every sentinel names `to`.
    pub async fn failover_to(&self, to: u16) {
        let client = sentinel_client(self.ports[0]);
        wait_until(
            "SENTINEL FAILOVER to be accepted",
            Duration::from_secs(30),
            || {
                let client = client.clone();
                async move {
                    let mut c = client.get_multiplexed_async_connection().await.ok()?;
                    let r: redis::RedisResult<String> = redis::cmd("SENTINEL")
                        .arg("FAILOVER")
                        .arg(MASTER)
                        .query_async(&mut c)
                        .await;
                    r.ok()
                }
            },
        )
        .await;
        self.wait_named(to).await;
    }

    /// Waits until every sentinel names the node on port `to` primary.
    pub async fn wait_named(&self, to: u16) {
        for &port in &self.ports {
            let client = sentinel_client(port);
            wait_until(
                "every sentinel to name the new primary",
                Duration::from_secs(30),
                || {
                    let client = client.clone();
                    async move {
                        let mut c = client.get_multiplexed_async_connection().await.ok()?;
                        let addr: Vec<String> = redis::cmd("SENTINEL")
                            .arg("GET-MASTER-ADDR-BY-NAME")
                            .arg(MASTER)
                            .query_async(&mut c)
                            .await
                            .ok()?;
                        (addr.get(1)? == &to.to_string()).then_some(())
                    }
                },
            )
            .await;
        }
    }
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
