//! Test harness: a real Redis (a `redis-server` per test on a free port), the real
//! worker and api started in-process on port 0, the real Docker engine, and the
//! rmcp client over Streamable HTTP. Nothing is mocked.
//!
//! Waiting is always on a condition with a deadline, never a bare sleep.

#![allow(dead_code)] // each test binary uses a different part of the harness

pub mod process;

use std::collections::HashMap;
use std::future::Future;
use std::net::TcpListener as StdListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use redis::AsyncCommands;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub type Client = RunningService<rmcp::RoleClient, ()>;

pub const TOKEN: &str = "test-token-0123456789abcdef0123456789abcdef";

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

/// A throwaway `redis-server` on a free port. It keeps an append-only file
/// (fsync on every write) in its own directory, so a test can kill it and start
/// it again with its data, as an outage would look.
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

    /// Starts it again after `stop`, on the same port, with its data.
    pub async fn restart(&mut self) {
        self.stop();
        self.spawn();
        self.wait_ready().await;
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("redis url")
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

#[derive(Clone)]
pub struct Options {
    pub concurrency: usize,
    pub max_timeout_seconds: u64,
    pub extra_env: Vec<(&'static str, String)>,
    /// Listen on every interface (Redis and api), as a careless deployment would.
    pub bind_all: bool,
    /// Start a worker in-process with the stack.
    pub start_worker: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            concurrency: 2,
            max_timeout_seconds: 120,
            extra_env: Vec::new(),
            bind_all: false,
            start_worker: true,
        }
    }
}

/// Redis + worker(s) + api, all real.
pub struct Stack {
    pub redis: Redis,
    pub url: String,
    pub prefix: String,
    /// The name of the worker started with the stack.
    pub worker_name: String,
    env: HashMap<String, String>,
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
        let (img, node) = (runtime_image(), node_image());
        let mut env: HashMap<String, String> = [
            ("SCRIPT_RUNNER_TOKEN", TOKEN.to_owned()),
            ("REDIS_URL", redis.url()),
            ("REDIS_KEY_PREFIX", prefix.clone()),
            ("LISTEN_ADDR", "127.0.0.1:0".to_owned()),
            (
                "RUNTIME_IMAGES",
                format!("node24={node},python3.13={img},python3.8={img}"),
            ),
            ("MAX_TIMEOUT_SECONDS", opts.max_timeout_seconds.to_string()),
            ("DEFAULT_TIMEOUT_SECONDS", "60".to_owned()),
            ("WORKER_CONCURRENCY", opts.concurrency.to_string()),
            ("TASKS_DIR", tasks_dir.display().to_string()),
            ("SHUTDOWN_GRACE_SECONDS", "0".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        // The warm pool: the worker's default unless TEST_POOL_SIZE says otherwise
        // (scripts/test.sh runs the suites with it on and off).
        if let Ok(size) = std::env::var("TEST_POOL_SIZE") {
            env.insert("POOL_SIZE".to_owned(), size);
        }
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
            url,
            prefix,
            worker_name: worker_name.clone(),
            env,
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
    fn env_with(&self, name: &str, extra: &[(&str, &str)]) -> HashMap<String, String> {
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
        let cfg = script_runner_worker::Config::from_lookup(|k| env.get(k).cloned())
            .expect("worker config");
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
        let name = &self.worker(name);
        let bin = std::env::var("SCRIPT_RUNNER_WORKER_BIN").unwrap_or_else(|_| {
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../target/debug/script-runner-worker"
            )
            .to_owned()
        });
        assert!(
            std::path::Path::new(&bin).exists(),
            "{bin} is missing: run `cargo build --bins` first"
        );
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

    pub async fn redis_conn(&self) -> redis::aio::MultiplexedConnection {
        self.redis
            .client()
            .get_multiplexed_async_connection()
            .await
            .expect("redis")
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

pub async fn mcp_client(
    url: &str,
    token: &str,
) -> Result<Client, rmcp::service::ClientInitializeError> {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(format!("{url}/mcp")).auth_header(token),
    );
    ().serve(transport).await
}

/// `mcp_client`, its connections made from `local` (an address on the loopback
/// interface such as 127.0.0.2), so that one test can play several clients.
pub async fn mcp_client_from(
    url: &str,
    token: &str,
    local: std::net::IpAddr,
) -> Result<Client, rmcp::service::ClientInitializeError> {
    let http = reqwest::Client::builder()
        .local_address(local)
        .build()
        .expect("an HTTP client");
    let transport = StreamableHttpClientTransport::with_client(
        http,
        StreamableHttpClientTransportConfig::with_uri(format!("{url}/mcp")).auth_header(token),
    );
    ().serve(transport).await
}

/// A tool call's result as JSON: `structuredContent`, `isError`, `content`.
pub async fn call(client: &Client, tool: &'static str, args: Value) -> Value {
    let Value::Object(args) = args else {
        panic!("tool arguments must be an object")
    };
    let result = client
        .call_tool(CallToolRequestParams::new(tool).with_arguments(args))
        .await
        .unwrap_or_else(|e| panic!("{tool} failed at the protocol level: {e}"));
    serde_json::to_value(result).expect("result serializes")
}

/// The structured result of a successful call (panics on `isError`).
pub async fn call_ok(client: &Client, tool: &'static str, args: Value) -> Value {
    let r = call(client, tool, args).await;
    assert_ne!(r["isError"], json!(true), "{tool} returned an error: {r}");
    r["structuredContent"].clone()
}

/// The message of a call that must fail with `isError: true`.
pub async fn call_err(client: &Client, tool: &'static str, args: Value) -> String {
    let r = call(client, tool, args).await;
    assert_eq!(r["isError"], json!(true), "{tool} should have failed: {r}");
    r["content"][0]["text"]
        .as_str()
        .expect("error text")
        .to_owned()
}

pub fn b64(s: impl AsRef<[u8]>) -> String {
    STANDARD.encode(s)
}

/// Starts a script and returns its task id.
pub async fn run(client: &Client, runtime: &str, command: &str, extra: Value) -> String {
    let mut args = json!({ "runtime": runtime, "command_base64": b64(command) });
    if let (Value::Object(a), Value::Object(e)) = (&mut args, extra) {
        a.extend(e);
    }
    let out = call_ok(client, "run_script", args).await;
    assert_eq!(out["state"], "queued");
    out["task_id"].as_str().expect("task_id").to_owned()
}

pub async fn status(client: &Client, task_id: &str) -> Value {
    call_ok(client, "get_task_status", json!({ "task_id": task_id })).await
}

/// Polls until the task's status satisfies `done`.
pub async fn wait_status(
    client: &Client,
    task_id: &str,
    what: &str,
    deadline: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    wait_until(what, deadline, || async {
        let s = status(client, task_id).await;
        done(&s).then_some(s)
    })
    .await
}

pub fn is_final(s: &Value) -> bool {
    matches!(
        s["state"].as_str(),
        Some("succeeded" | "failed" | "killed" | "timed-out")
    )
}

/// Runs a script to its final state and returns that status.
pub async fn run_to_end(client: &Client, runtime: &str, command: &str, extra: Value) -> Value {
    run_to_end_within(client, runtime, command, extra, Duration::from_secs(120)).await
}

/// `run_to_end` for a task that may legitimately take longer than two minutes.
pub async fn run_to_end_within(
    client: &Client,
    runtime: &str,
    command: &str,
    extra: Value,
    deadline: Duration,
) -> Value {
    let id = run(client, runtime, command, extra).await;
    wait_status(client, &id, "the task to finish", deadline, is_final).await
}

/// Nothing of a task exists in Redis: no job ever stayed in the stream and no
/// task record or zip was written (a job would be gone once run, a record not).
pub async fn assert_no_task_created(stack: &Stack) {
    let mut r = stack.redis_conn().await;
    // A Redis error must fail the check, never read as "nothing there".
    let jobs: u64 = r
        .xlen(stack.keys().jobs())
        .await
        .expect("XLEN of the jobs stream");
    assert_eq!(jobs, 0, "a job was enqueued");
    let keys: Vec<String> = r
        .keys(stack.keys().task("*"))
        .await
        .expect("KEYS of the task records");
    assert!(keys.is_empty(), "task keys were written: {keys:?}");
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

/// Starts `echo <marker>; sleep 300` and waits until it is running and has
/// printed the marker.
pub async fn start_sleeper(client: &Client, marker: &str) -> String {
    start_until_output(
        client,
        &format!("echo {marker}; sleep 300"),
        json!({}),
        &format!("{marker}\n"),
    )
    .await
}

/// Starts `command` and waits until its stdout is exactly `first_output`, so the
/// test knows the container is up and the script well under way.
pub async fn start_until_output(
    client: &Client,
    command: &str,
    extra: Value,
    first_output: &str,
) -> String {
    let id = run(client, "python3.13", command, extra).await;
    wait_status(
        client,
        &id,
        "the task's first output",
        Duration::from_secs(60),
        |s| s["stdout_tail"] == first_output,
    )
    .await;
    id
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
