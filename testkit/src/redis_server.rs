//! A throwaway `redis-server` per test, on a free port.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{free_port, wait_until};

/// A `redis-server` of its own. It keeps an append-only file (fsync on every
/// write) in its own directory, so a test can kill it and start it again with its
/// data, as an outage would look.
pub struct Redis {
    child: Option<Child>,
    pub port: u16,
    bind: String,
    dir: std::path::PathBuf,
    /// The persistence and memory options, `DURABLE` unless a test asks otherwise.
    config: Vec<String>,
}

/// What every test Redis runs with unless it asks otherwise: an append-only file,
/// fsynced on every write, and nothing evicted (Redis's default policy). The api
/// and the worker refuse a Redis that can lose tasks (REDIS_SETUP_CHECK).
pub const DURABLE: &[&str] = &[
    "--save",
    "",
    "--appendonly",
    "yes",
    "--appendfsync",
    "always",
];

impl Redis {
    pub async fn start() -> Redis {
        Redis::start_on("127.0.0.1").await
    }

    /// On `bind` (e.g. "0.0.0.0", to check that tasks cannot reach it anyway).
    pub async fn start_on(bind: &str) -> Redis {
        Redis::start_with(bind, DURABLE).await
    }

    /// With `config` instead of `DURABLE` (e.g. `--maxmemory-policy allkeys-lru`).
    pub async fn start_with(bind: &str, config: &[&str]) -> Redis {
        let dir = std::env::temp_dir().join(format!("sr-redis-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("redis dir");
        let mut r = Redis {
            child: None,
            port: free_port(),
            bind: bind.to_owned(),
            dir,
            config: config.iter().map(|s| (*s).to_owned()).collect(),
        };
        r.spawn();
        r.wait_ready().await;
        r
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                &self.bind,
                "--protected-mode",
                "no",
            ])
            .args(&self.config)
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (scripts/test.sh installs it)");
        self.child = Some(child);
    }

    async fn wait_ready(&self) {
        let client = self.client();
        wait_until(
            "redis-server to answer PING",
            Duration::from_secs(10),
            || {
                let client = client.clone();
                async move {
                    let mut c = client.get_multiplexed_async_connection().await.ok()?;
                    redis::cmd("PING").query_async::<String>(&mut c).await.ok()
                }
            },
        )
        .await;
    }

    /// A replica of `primary` (same durability), as Sentinel needs to promote one.
    pub async fn start_replica_of(primary: &Redis) -> Redis {
        Redis::start_replica_on(primary, "127.0.0.1").await
    }

    /// A replica of `primary` listening on `bind` (another loopback address,
    /// say), which it announces: the primary and its sentinels list it there.
    pub async fn start_replica_on(primary: &Redis, bind: &str) -> Redis {
        let port = primary.port.to_string();
        let mut config = DURABLE.to_vec();
        config.extend(["--replicaof", "127.0.0.1", &port]);
        config.extend(["--replica-announce-ip", bind]);
        let replica = Redis::start_with(bind, &config).await;
        let client = replica.client();
        wait_until(
            "the replica to sync with its primary",
            Duration::from_secs(20),
            || {
                let client = client.clone();
                async move {
                    let mut c = client.get_multiplexed_async_connection().await.ok()?;
                    let info: String = redis::cmd("INFO")
                        .arg("replication")
                        .query_async(&mut c)
                        .await
                        .ok()?;
                    info.contains("master_link_status:up").then_some(())
                }
            },
        )
        .await;
        replica
    }

    /// Starts it again after `stop`, on the same port, with its data.
    pub async fn restart(&mut self) {
        self.stop();
        self.spawn();
        self.wait_ready().await;
    }

    /// Where it answers: its own address, or loopback when it listens on all.
    pub fn url(&self) -> String {
        let host = match self.bind.as_str() {
            "0.0.0.0" => "127.0.0.1",
            bind => bind,
        };
        format!("redis://{host}:{}", self.port)
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("redis url")
    }

    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .expect("redis")
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
