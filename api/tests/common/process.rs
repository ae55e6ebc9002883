//! The api binary as a real process (built by `cargo build --bins`), for tests
//! that measure it from outside (resident memory, threads) or watch it refuse to
//! start. `SCRIPT_RUNNER_API_BIN` picks another build, e.g. the release one.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use super::{TOKEN, wait_until};

pub struct ApiProcess {
    child: Option<Child>,
    /// Known once the api has logged the port it listens on (`wait_listening`).
    pub url: String,
    pub addr: std::net::SocketAddr,
    log: PathBuf,
}

impl ApiProcess {
    pub fn bin() -> String {
        std::env::var("SCRIPT_RUNNER_API_BIN").unwrap_or_else(|_| {
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../target/debug/script-runner-api"
            )
            .to_owned()
        })
    }

    /// Starts the api against `redis_url` with `extra` variables on top of the
    /// test defaults, without waiting for it. It listens on a port of the
    /// system's choosing (a port picked here and handed over could be taken by
    /// another test's process in between, and the test would talk to that one).
    pub fn spawn(redis_url: &str, extra: &[(&str, &str)]) -> ApiProcess {
        let bin = ApiProcess::bin();
        assert!(
            std::path::Path::new(&bin).exists(),
            "{bin} is missing: run `cargo build --bins` first"
        );
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], 0).into();
        let log =
            std::env::temp_dir().join(format!("sr-api-{}.log", uuid::Uuid::new_v4().simple()));
        let out = std::fs::File::create(&log).expect("api log file");
        let err = out.try_clone().expect("api log file");
        let prefix = format!("c{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let child = Command::new(&bin)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("SCRIPT_RUNNER_TOKEN", TOKEN)
            .env("REDIS_URL", redis_url)
            .env("REDIS_KEY_PREFIX", prefix)
            .env("LISTEN_ADDR", addr.to_string())
            .env("RUST_LOG", "info,rmcp=warn")
            .env("NO_COLOR", "1")
            .envs(extra.iter().copied())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("api binary starts");
        ApiProcess {
            child: Some(child),
            url: format!("http://{addr}"),
            addr,
            log,
        }
    }

    /// `spawn`, then waits until `/healthz` answers 200.
    pub async fn start(redis_url: &str, extra: &[(&str, &str)]) -> ApiProcess {
        let mut api = ApiProcess::spawn(redis_url, extra);
        api.wait_healthy().await;
        api
    }

    /// Waits for the api's "api listening" log line and takes its address.
    pub async fn wait_listening(&mut self) {
        let log = self.log.clone();
        let addr = wait_until("the api to listen", Duration::from_secs(30), || {
            let running = self.is_running();
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            async move {
                assert!(running, "the api exited:\n{text}");
                let line = text.lines().find(|l| l.contains("api listening"))?;
                line.split("addr=")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            }
        })
        .await;
        self.addr = addr;
        self.url = format!("http://{addr}");
    }

    pub async fn wait_healthy(&mut self) {
        self.wait_listening().await;
        let url = format!("{}/healthz", self.url);
        let http = reqwest::Client::new();
        wait_until(
            "the api to answer /healthz",
            Duration::from_secs(30),
            || {
                let running = self.is_running();
                let (http, url) = (http.clone(), url.clone());
                async move {
                    assert!(running, "the api exited");
                    let r = http.get(&url).send().await.ok()?;
                    (r.status() == 200).then_some(())
                }
            },
        )
        .await;
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// Waits up to `deadline` for the process to exit on its own.
    pub async fn exit_status(&mut self, deadline: Duration) -> ExitStatus {
        let child = self.child.as_mut().expect("the api was started");
        wait_until("the api to exit", deadline, || {
            let status = child.try_wait().ok().flatten();
            async move { status }
        })
        .await
    }

    /// A field of `/proc/<pid>/status`, in kB for the Vm* ones (`VmHWM` is the
    /// peak resident set, `VmRSS` the current one; `Threads` a count).
    pub fn proc_status(&self, field: &str) -> u64 {
        let text = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("/proc/<pid>/status");
        text.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {field} in /proc/<pid>/status"))
    }

    /// What the process printed so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ApiProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}
