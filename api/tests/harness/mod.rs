//! The api alone: started in this process on port 0 against a `redis-server` of
//! its own (script-runner-testkit, re-exported here), with no worker. What the
//! api does by itself (input validation, the token, health, the queue cap) is
//! tested against it; what it does with a worker is tested in e2e/. Nothing is
//! mocked.

#![allow(dead_code)] // each test binary uses a different part of the harness

use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use testkit::*;

#[derive(Clone)]
pub struct Options {
    pub max_timeout_seconds: u64,
    pub extra_env: Vec<(&'static str, String)>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_timeout_seconds: 120,
            extra_env: Vec::new(),
        }
    }
}

/// Redis + the api, both real; tasks are queued and never run.
pub struct Stack {
    pub redis: Redis,
    pub url: String,
    pub prefix: String,
    stop: CancellationToken,
    api: Option<tokio::task::JoinHandle<()>>,
}

impl Stack {
    pub async fn start(opts: Options) -> Stack {
        let redis = Redis::start().await;
        let prefix = unique_prefix('t');
        let mut env = service_env(&redis, &prefix, opts.max_timeout_seconds);
        env.extend(
            opts.extra_env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone())),
        );
        let config =
            script_runner_api::Config::from_lookup(|k| env.get(k).cloned()).expect("api config");
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("bind");
        let url = format!(
            "http://127.0.0.1:{}",
            listener.local_addr().expect("addr").port()
        );
        let stop = CancellationToken::new();
        let api = tokio::spawn({
            let stop = stop.clone();
            async move {
                let stopped = async move { stop.cancelled().await };
                let _ = script_runner_api::run(listener, config, stopped).await;
            }
        });
        Stack {
            redis,
            url,
            prefix,
            stop,
            api: Some(api),
        }
    }

    /// This stack's key schema (its own prefix).
    pub fn keys(&self) -> shared::Keys {
        shared::Keys::new(self.prefix.clone())
    }

    pub async fn client(&self) -> Client {
        mcp_client(&self.url, TOKEN)
            .await
            .expect("MCP client connects")
    }

    pub async fn redis_conn(&self) -> redis::aio::MultiplexedConnection {
        self.redis.conn().await
    }

    /// Stops the api; a panic in it fails the test here.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        let Some(api) = self.api.take() else { return };
        match tokio::time::timeout(Duration::from_secs(30), api).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Ok(Err(e)) => panic!("the api task failed: {e}"),
            Err(_) => panic!("the api did not stop within 30 s of shutdown"),
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Nothing of a task exists in the stack's Redis (see `assert_no_task_in`).
pub async fn assert_no_task_created(stack: &Stack) {
    assert_no_task_in(&stack.redis, &stack.keys()).await;
}
