//! The end-to-end harness: the real worker and api started in-process on port 0
//! against a `redis-server` of their own, the real Docker engine, and the rmcp
//! client over Streamable HTTP. Nothing is mocked. What is not about the two
//! services together (Redis per test, the MCP client, the binaries as processes)
//! comes from `script-runner-testkit`, re-exported here. The suites that use it
//! are modules of one test binary, `tests/main.rs`.
//!
//! Waiting is always on a condition with a deadline, never a bare sleep.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use redis::AsyncCommands;
use tokio_util::sync::CancellationToken;

pub use testkit::*;

#[derive(Clone)]
pub struct Options {
    pub concurrency: usize,
    pub max_timeout_seconds: u64,
    pub extra_env: Vec<(&'static str, String)>,
    /// Listen on every interface (Redis and api), as a careless deployment would.
    pub bind_all: bool,
    /// Start a worker in-process with the stack.
    pub start_worker: bool,
    /// Give the Redis a replica and three sentinels, and point the api and the
    /// workers at the sentinels (`REDIS_SENTINELS`) with a `REDIS_URL` whose
    /// host is never reached (port 1), so they can only find Redis through them.
    pub sentinels: bool,
    /// Where the workers' egress proxies resolve names (DNS unless a test
    /// stands a local server in for public hosts).
    pub egress_resolver: script_runner_worker::egress::Resolver,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            concurrency: 2,
            max_timeout_seconds: 120,
            extra_env: Vec::new(),
            egress_resolver: Default::default(),
            bind_all: false,
            start_worker: true,
            sentinels: false,
        }
    }
}

/// A replica of the stack's Redis and the sentinels watching both
/// (`Options::sentinels`).
pub struct Ha {
    pub replica: Redis,
    pub sentinels: sentinel::Sentinels,
}

/// Redis + worker(s) + api, all real.
pub struct Stack {
    pub redis: Redis,
    /// With `Options::sentinels`: the replica and the sentinels.
    pub ha: Option<Ha>,
    pub url: String,
    pub prefix: String,
    /// The name of the worker started with the stack.
    pub worker_name: String,
    env: HashMap<String, String>,
    egress_resolver: script_runner_worker::egress::Resolver,
    tasks_dir: std::path::PathBuf,
    stop: CancellationToken,
    workers: Vec<tokio::task::JoinHandle<()>>,
    /// Every worker name used, so their containers can be removed at the end.
    worker_names: Vec<String>,
    /// The worker processes started (`spawn_worker_process`), killed at the end.
    processes: Vec<SharedChild>,
}

impl Stack {
    pub async fn start(opts: Options) -> Stack {
        let bind = if opts.bind_all {
            "0.0.0.0"
        } else {
            "127.0.0.1"
        };
        let redis = Redis::start_on(bind).await;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let prefix = format!("t{}", &id[..8]);
        // The in-process worker's name, as `Stack::worker("main")` spells it.
        let worker_name = format!("main-{prefix}");
        let tasks_dir = std::env::temp_dir().join(format!("sr-tasks-{id}"));
        let mut env = service_env(&redis, &prefix, opts.max_timeout_seconds);
        env.extend(
            [
                ("WORKER_CONCURRENCY", opts.concurrency.to_string()),
                ("TASKS_DIR", tasks_dir.display().to_string()),
                // Named for the api too (its default is the worker's default
                // TASKS_DIR's), and shared by every worker of the stack.
                (
                    "WORKSPACE_STORE",
                    tasks_dir.join("workspace-store").display().to_string(),
                ),
                ("SHUTDOWN_GRACE_SECONDS", "0".to_owned()),
            ]
            .map(|(k, v)| (k.to_owned(), v)),
        );
        let ha = if opts.sentinels {
            let replica = Redis::start_replica_of(&redis).await;
            let sentinels = sentinel::Sentinels::start(&redis).await;
            env.insert("REDIS_SENTINELS".into(), sentinels.env());
            env.insert("REDIS_URL".into(), "redis://127.0.0.1:1".into());
            Some(Ha { replica, sentinels })
        } else {
            None
        };
        env.extend(
            opts.extra_env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone())),
        );

        let stop = CancellationToken::new();
        let api_cfg =
            script_runner_api::Config::from_lookup(|k| env.get(k).cloned()).expect("api config");
        let listener = tokio::net::TcpListener::bind((bind, 0))
            .await
            .expect("bind");
        let url = format!(
            "http://127.0.0.1:{}",
            listener.local_addr().expect("addr").port()
        );
        tokio::spawn({
            let stop = stop.clone();
            async move {
                let _ = script_runner_api::run(
                    listener,
                    api_cfg,
                    async move { stop.cancelled().await },
                )
                .await;
            }
        });
        let mut stack = Stack {
            redis,
            ha,
            url,
            prefix,
            worker_name: worker_name.clone(),
            env,
            egress_resolver: opts.egress_resolver.clone(),
            tasks_dir,
            stop,
            workers: Vec::new(),
            worker_names: Vec::new(),
            processes: Vec::new(),
        };
        if opts.start_worker {
            stack.start_worker("main", &[]).await;
        }
        stack
    }

    /// The workers' TASKS_DIR.
    pub fn tasks_dir(&self) -> &std::path::Path {
        &self.tasks_dir
    }

    /// The real worker name for `name` in this stack: names are labels on the one
    /// Docker engine, so they must not meet another test's (or run's) workers.
    pub fn worker(&self, name: &str) -> String {
        format!("{name}-{}", self.prefix)
    }

    /// The stack's environment with `extra` on top.
    pub fn env_with(&self, name: &str, extra: &[(&str, &str)]) -> HashMap<String, String> {
        let mut env = self.env.clone();
        env.insert("WORKER_NAME".into(), name.to_owned());
        env.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        env
    }

    /// Starts a worker in this process and waits until it heartbeats.
    pub async fn start_worker(&mut self, name: &str, extra: &[(&str, &str)]) {
        let name = &self.worker(name);
        let env = self.env_with(name, extra);
        let mut cfg = script_runner_worker::Config::from_lookup(|k| env.get(k).cloned())
            .expect("worker config");
        cfg.egress.resolver = self.egress_resolver.clone();
        let stop = self.stop.clone();
        self.workers.push(tokio::spawn(async move {
            if let Err(e) =
                script_runner_worker::run(cfg, async move { stop.cancelled().await }).await
            {
                panic!("worker failed: {e}");
            }
        }));
        self.worker_names.push(name.to_owned());
        self.wait_for_heartbeat(name).await;
    }

    /// Starts the worker binary as a child process (so a test can SIGKILL it) and
    /// waits until it heartbeats. The binary comes from `cargo build --bins`.
    pub async fn spawn_worker_process(
        &mut self,
        name: &str,
        extra: &[(&str, &str)],
    ) -> WorkerProcess {
        // A process reads its settings from variables only: a test resolver
        // cannot reach it, so such a stack's process workers would use DNS.
        assert!(
            matches!(
                self.egress_resolver,
                script_runner_worker::egress::Resolver::Dns
            ),
            "a worker process cannot take the stack's egress resolver"
        );
        let name = &self.worker(name);
        let bin = binary("script-runner-worker", "SCRIPT_RUNNER_WORKER_BIN");
        let child = Command::new(&bin)
            .env_clear()
            .envs(self.env_with(name, extra))
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("worker binary starts");
        if !self.worker_names.iter().any(|n| n == name) {
            self.worker_names.push(name.to_owned());
        }
        self.wait_for_heartbeat(name).await;
        let child = SharedChild::new(std::sync::Mutex::new(Some(child)));
        self.processes.push(child.clone());
        WorkerProcess(child)
    }

    /// Deletes a worker's heartbeat, as its expiry would after a crash, so that a
    /// restart's `wait_for_heartbeat` waits for the new process.
    pub async fn drop_heartbeat(&self, name: &str) {
        let mut r = self.redis_conn().await;
        let _: () = r
            .del(self.keys().worker(&self.worker(name)))
            .await
            .expect("del");
    }

    /// This stack's key schema (its own prefix).
    pub fn keys(&self) -> shared::Keys {
        shared::Keys::new(self.prefix.clone())
    }

    pub async fn wait_for_heartbeat(&self, name: &str) {
        let key = self.keys().worker(name);
        let client = self.redis.client();
        wait_until(
            &format!("worker {name} to heartbeat"),
            Duration::from_secs(30),
            || {
                let (client, key) = (client.clone(), key.clone());
                async move {
                    let mut c = client.get_multiplexed_async_connection().await.ok()?;
                    let alive: bool = c.exists(&key).await.ok()?;
                    alive.then_some(())
                }
            },
        )
        .await;
    }

    /// Waits until worker `name` (`Stack::worker` spells it) has no heartbeat
    /// key, then until a reaper has looked at it and seen that: a reaper's
    /// `EXISTS` on a heartbeat key is the only `EXISTS` anyone sends. From then
    /// on the reaper suspects the worker.
    pub async fn wait_reaper_suspects(&self, name: &str) {
        let redis = self.redis.client();
        let key = self.keys().worker(name);
        wait_until(
            &format!("worker {name}'s heartbeat to expire"),
            Duration::from_secs(10),
            || {
                let (redis, key) = (redis.clone(), key.clone());
                async move {
                    let mut c = redis.get_multiplexed_async_connection().await.ok()?;
                    let ttl: i64 = c.pttl(&key).await.ok()?;
                    (ttl == -2).then_some(())
                }
            },
        )
        .await;
        let seen = calls_of(self, "exists").await.expect("commandstats");
        wait_until(
            &format!("a reaper to see worker {name}'s heartbeat missing"),
            Duration::from_secs(10),
            || async { (calls_of(self, "exists").await? > seen).then_some(()) },
        )
        .await;
    }

    /// Waits until worker `name` (`Stack::worker` spells it) is gone from the
    /// worker registry: a reaper settled it and forgot it.
    pub async fn wait_forgotten(&self, name: &str) {
        let redis = self.redis.client();
        let key = self.keys().workers();
        wait_until(
            &format!("worker {name} to be forgotten"),
            Duration::from_secs(30),
            || {
                let (redis, key) = (redis.clone(), key.clone());
                async move {
                    let mut c = redis.get_multiplexed_async_connection().await.ok()?;
                    let members: Vec<String> = c.smembers(&key).await.ok()?;
                    (!members.iter().any(|m| m == name)).then_some(())
                }
            },
        )
        .await;
    }

    pub async fn client(&self) -> Client {
        mcp_client(&self.url, TOKEN)
            .await
            .expect("MCP client connects")
    }

    /// An MCP client with a new API key named `owner` (every scope, no
    /// limits): another owner than `client`'s admin token.
    pub async fn client_of(&self, owner: &str) -> Client {
        let mut conn = self.redis_conn().await;
        let record = shared::apikey::ApiKeyRecord {
            name: owner.into(),
            scopes: shared::apikey::Scopes::ALL,
            limits: shared::apikey::Limits::default(),
            allow_hosts: None,
            created_at: None,
            last_used_at: None,
        };
        let key = store::apikeys::create(&mut conn, &self.keys(), &record)
            .await
            .expect("create key");
        mcp_client(&self.url, key.expose())
            .await
            .expect("MCP client connects")
    }

    pub async fn redis_conn(&self) -> redis::aio::MultiplexedConnection {
        self.redis
            .client()
            .get_multiplexed_async_connection()
            .await
            .expect("redis")
    }

    /// Tells the api and the workers to stop, as SIGTERM does, and returns at
    /// once; Redis stays up until the stack is dropped.
    pub fn begin_shutdown(&self) {
        self.stop.cancel();
    }

    /// Stops the workers (killing their containers) and the api.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        for w in self.workers.drain(..) {
            match tokio::time::timeout(Duration::from_secs(30), w).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Ok(Err(e)) => panic!("worker task failed: {e}"),
                Err(_) => panic!("a worker did not stop within 30 s of shutdown"),
            }
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.stop.cancel();
        for child in &self.processes {
            kill_child(child);
        }
        // A failed test may drop the stack with containers still running; remove
        // them by their workers' label so they do not outlive the test.
        for name in &self.worker_names {
            let ids = Command::new("docker")
                .args([
                    "ps",
                    "-aq",
                    "--filter",
                    &format!("label=script-runner.worker={name}"),
                ])
                .output()
                .map(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .split_whitespace()
                        .map(str::to_owned)
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            if !ids.is_empty() {
                let _ = Command::new("docker")
                    .args(["rm", "-f"])
                    .args(&ids)
                    .stdout(Stdio::null())
                    .status();
            }
        }
        let _ = std::fs::remove_dir_all(&self.tasks_dir);
    }
}

/// Nothing of a task exists in Redis: no job ever stayed in the stream and no
/// task record or zip was written (a job would be gone once run, a record not).
pub async fn assert_no_task_created(stack: &Stack) {
    assert_no_task_in(&stack.redis, &stack.keys()).await;
}

/// Ids of the task's containers (any state), found by name: a warm pool
/// container is renamed `sr-<task_id>` when the task claims it (its labels were
/// set before the task existed).
pub fn containers_of_task(task_id: &str) -> String {
    let out = Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("name=^/sr-{task_id}$")])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Names of the task containers (not idle warm pool ones) worker `worker` has
/// on this engine, in any state.
pub fn task_containers_of_worker(worker: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "ps",
            "-a",
            "--filter",
            &format!("label=script-runner.worker={worker}"),
            "--format",
            "{{.Names}}",
        ])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|n| !n.starts_with("sr-pool-"))
        .map(str::to_owned)
        .collect()
}

/// Full ids of the containers `docker ps` lists with these arguments.
pub fn docker_ids(args: &[&str]) -> Vec<String> {
    let out = Command::new("docker")
        .arg("ps")
        .args(["-q", "--no-trunc"])
        .args(args)
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Ids of worker `worker`'s idle (running) warm pool containers of `runtime` on the
/// task bridge (the `internet` pool).
pub fn pool_containers(worker: &str, runtime: &str) -> Vec<String> {
    pool_containers_on(worker, runtime, "internet")
}

/// The idle pool containers of `runtime` on `network` (`internet`, `allow`).
pub fn pool_containers_on(worker: &str, runtime: &str, network: &str) -> Vec<String> {
    docker_ids(&[
        "--filter",
        &format!("label=script-runner.worker={worker}"),
        "--filter",
        &format!("label=script-runner.pool={runtime}"),
        "--filter",
        &format!("label=script-runner.pool-network={network}"),
        "--filter",
        "name=sr-pool-",
    ])
}

pub async fn wait_container_gone(task_id: &str) {
    wait_until(
        "the task's container to be removed",
        Duration::from_secs(30),
        || async { containers_of_task(task_id).is_empty().then_some(()) },
    )
    .await;
}

/// A worker process, shared between the test that started it and its stack.
type SharedChild = std::sync::Arc<std::sync::Mutex<Option<Child>>>;

fn take_child(child: &SharedChild) -> Option<Child> {
    child
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
}

/// SIGKILLs a worker process and reaps it, if it still runs.
fn kill_child(child: &SharedChild) {
    if let Some(mut child) = take_child(child) {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A worker process that is killed when dropped, so a failing test leaves none
/// behind. Its stack kills it too, before it removes the workers' containers:
/// a worker still alive then would go on making pool containers.
pub struct WorkerProcess(SharedChild);

impl WorkerProcess {
    pub fn pid(&self) -> u32 {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map(Child::id)
            .unwrap_or(0)
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        kill_child(&self.0);
    }

    pub fn terminate(&self) {
        // Never `kill -TERM 0`: that would signal this whole test's process group.
        assert!(
            self.pid() != 0,
            "terminate() after kill(): the process is gone"
        );
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        assert!(status.is_ok_and(|s| s.success()), "SIGTERM failed");
    }

    /// SIGSTOP: the process is frozen (no heartbeat, no reaper pass) but alive,
    /// as a worker stalled by its host would be.
    pub fn pause(&self) {
        self.send("-STOP");
    }

    /// SIGCONT after `pause`.
    pub fn resume(&self) {
        self.send("-CONT");
    }

    fn send(&self, signal: &str) {
        assert!(self.pid() != 0, "the process is gone");
        let status = Command::new("kill")
            .args([signal, &self.pid().to_string()])
            .status();
        assert!(status.is_ok_and(|s| s.success()), "kill {signal} failed");
    }

    /// Waits for it to exit (after `terminate`); whether it exited cleanly.
    pub async fn exited_cleanly(self) -> bool {
        let Some(mut child) = take_child(&self.0) else {
            return false;
        };
        tokio::task::spawn_blocking(move || child.wait().is_ok_and(|s| s.success()))
            .await
            .unwrap_or(false)
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What a task may and may not do, printed line by line: capabilities, limits,
/// user, and attempts to escalate. The hostile suite checks each line; the pool
/// suite checks a warm container prints exactly what a cold one does.
pub const PRIVILEGES: &str = r#"
grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status
echo "nofile=$(ulimit -n)"
echo "core=$(ulimit -c) hard=$(ulimit -H -c)"
echo "cpu=$(cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo "$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) $(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)")"
if [ -f /sys/fs/cgroup/memory.max ]; then
  echo "memory=$(cat /sys/fs/cgroup/memory.max) swap=$(cat /sys/fs/cgroup/memory.swap.max)"
else
  m=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes)
  s=$(cat /sys/fs/cgroup/memory/memory.memsw.limit_in_bytes 2>/dev/null) && s=$((s - m)) || s=unaccounted
  echo "memory=$m swap=$s"
fi
echo "uid=$(id -u)"
mount -t tmpfs none /mnt 2>/dev/null && echo "mount: ALLOWED" || echo "mount: denied"
unshare -r true 2>/dev/null && echo "unshare: ALLOWED" || echo "unshare: denied"
touch /pwned 2>/dev/null && echo "write-root: ALLOWED" || echo "write-root: denied"
chmod u+s /bin/sh 2>/dev/null && echo "chmod-suid: ALLOWED" || echo "chmod-suid: denied"
ls /var/run/docker.sock 2>/dev/null && echo "docker-socket: PRESENT" || echo "docker-socket: absent"
mkdir -p "$HOME/.local/lib" && touch /workspace/w /tmp/t && echo "home, workspace, tmp: writable"
"#;

/// Calls of `command` Redis has served since it started (`INFO commandstats`).
pub async fn calls_of(stack: &Stack, command: &str) -> Option<u64> {
    let mut c = stack
        .redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .ok()?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await
        .ok()?;
    let prefix = format!("cmdstat_{command}:calls=");
    Some(
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0),
    )
}

/// Seconds since the epoch, as `docker events --since/--until` take them.
/// The text of a worker's `/metrics` (`WORKER_METRICS_ADDR` 127.0.0.1:`port`).
pub async fn worker_metrics(port: u16) -> String {
    reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .expect("worker metrics")
        .text()
        .await
        .expect("metrics text")
}

pub fn docker_now() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is past 1970");
    format!("{}.{:09}", t.as_secs(), t.subsec_nanos())
}

/// `name image` of every container the engine created for `worker` since `since`.
pub fn containers_created(worker: &str, since: &str) -> Vec<String> {
    let out = std::process::Command::new("docker")
        .args(["events", "--since", since, "--until", &docker_now()])
        .args(["--filter", "type=container", "--filter", "event=create"])
        .args(["--filter", &format!("label=script-runner.worker={worker}")])
        .args([
            "--format",
            "{{.Actor.Attributes.name}} {{.Actor.Attributes.image}}",
        ])
        .output()
        .expect("docker events");
    assert!(out.status.success(), "docker events: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}
