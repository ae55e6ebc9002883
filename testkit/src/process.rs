//! The built binaries as real processes (from `cargo build --bins`), for tests
//! that measure one from outside (resident memory, threads), watch it refuse to
//! start, or kill it. `SCRIPT_RUNNER_API_BIN` and `SCRIPT_RUNNER_WORKER_BIN` pick
//! other builds, e.g. the release ones.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use crate::{TOKEN, binary, unique_prefix, wait_until};

/// A binary run with exactly the environment given (and `PATH`), its stdout and
/// stderr in a log file of its own. Killed when dropped.
pub struct Process {
    child: Option<Child>,
    log: PathBuf,
}

impl Process {
    pub fn spawn<'a>(bin: &Path, env: impl IntoIterator<Item = (&'a str, &'a str)>) -> Process {
        let log =
            std::env::temp_dir().join(format!("sr-proc-{}.log", uuid::Uuid::new_v4().simple()));
        let out = std::fs::File::create(&log).expect("process log file");
        let err = out.try_clone().expect("process log file");
        let child = Command::new(bin)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("NO_COLOR", "1")
            .envs(env)
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("{} starts: {e}", bin.display()));
        Process {
            child: Some(child),
            log,
        }
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
        let child = self.child.as_mut().expect("the process was started");
        wait_until("the process to exit", deadline, || {
            let status = child.try_wait().ok().flatten();
            async move { status }
        })
        .await
    }

    /// SIGTERM, as a stop would send.
    pub fn terminate(&self) {
        // Never `kill -TERM 0`: that would signal this whole test's process group.
        assert!(self.pid() != 0, "the process is gone");
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        assert!(status.is_ok_and(|s| s.success()), "SIGTERM failed");
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

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The api binary as a process against a Redis, with the test token.
pub struct ApiProcess {
    process: Process,
    /// Known once the api has logged the port it listens on (`wait_listening`).
    pub url: String,
    pub addr: std::net::SocketAddr,
}

impl ApiProcess {
    pub fn bin() -> PathBuf {
        binary("script-runner-api", "SCRIPT_RUNNER_API_BIN")
    }

    /// Starts the api against `redis_url` with `extra` variables on top of the
    /// test defaults, without waiting for it. It listens on a port of the
    /// system's choosing (a port picked here and handed over could be taken by
    /// another test's process in between, and the test would talk to that one).
    pub fn spawn(redis_url: &str, extra: &[(&str, &str)]) -> ApiProcess {
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], 0).into();
        let prefix = unique_prefix('c');
        let listen = addr.to_string();
        let defaults = [
            ("SCRIPT_RUNNER_TOKEN", TOKEN),
            ("TASK_SIGNING_KEY", crate::SIGNING_KEY),
            ("REDIS_URL", redis_url),
            ("REDIS_KEY_PREFIX", &prefix),
            ("LISTEN_ADDR", &listen),
            ("RUST_LOG", "info,rmcp=warn"),
        ];
        ApiProcess {
            process: Process::spawn(
                &ApiProcess::bin(),
                defaults.into_iter().chain(extra.iter().copied()),
            ),
            url: format!("http://{addr}"),
            addr,
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
        let addr = wait_until("the api to listen", Duration::from_secs(30), || {
            let running = self.process.is_running();
            let text = self.process.log();
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
                let running = self.process.is_running();
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
        self.process.pid()
    }

    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// Waits up to `deadline` for the process to exit on its own.
    pub async fn exit_status(&mut self, deadline: Duration) -> ExitStatus {
        self.process.exit_status(deadline).await
    }

    /// A field of `/proc/<pid>/status` (see `Process::proc_status`).
    pub fn proc_status(&self, field: &str) -> u64 {
        self.process.proc_status(field)
    }

    /// What the process printed so far.
    pub fn log(&self) -> String {
        self.process.log()
    }
}
