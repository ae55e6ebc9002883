//! What a task's container used, read from the kernel at the end, once the
//! task's script has exited and before the container is stopped (every task's
//! prelude outlives its script, idle, so its cgroup is still there):
//!
//! - from the container's cgroup, read on the host (`CGROUP_ROOT`, which the
//!   worker's container mounts read-only from the host): OOM kills, peak memory
//!   and CPU time, cgroup v1 or v2, whichever the host has. Read from outside
//!   because a container whose memory is full (files in its tmpfs mounts count,
//!   and cannot be reclaimed) cannot start even a tiny process to read it: the
//!   kernel OOM-kills it;
//! - /workspace's size: a tmpfs in the container's own mount namespace, which
//!   the host reaches through the container's first process,
//!   `/proc/<pid>/root/workspace` (`statvfs`, microseconds), when the worker
//!   shares the host's PID namespace and may look into another user's process
//!   (`pid: host` and `SYS_PTRACE` in docker-compose.yml; a worker run on the
//!   host as root can). Otherwise a short exec in the container, `stat -f
//!   /workspace` (coreutils or busybox; about 50 ms), which fails when the
//!   container's memory is full: the figure is unknown then.
//!
//! What cannot be read is `None`: a figure is never made up here. (When the
//! end cannot be read at all, the runner's meter, `runner/meter.rs`, bounds
//! the task's CPU from its cgroup figures sampled while it ran.)

use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::exec::{CreateExecOptions, StartExecResults};
use futures_util::StreamExt;

use super::Sandbox;
use crate::metrics::Op;

/// Where the host's cgroup file system is mounted (in the worker's container,
/// a read-only bind mount of the host's own).
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// How long the /workspace exec may take: it delays the record (and, for a
/// kill or a timeout, the kill), so a wedged container costs the figure, not
/// the task.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// The most output the exec is read for (it prints one short line).
const PROBE_MAX_OUTPUT: usize = 1024;

/// The /workspace exec: blocks in all, blocks free, block size.
const WORKSPACE_PROBE: &str = "stat -f -c '%b %f %S' /workspace";

/// What the kernel says a container used, as far as it could be read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reading {
    /// How many processes the OOM killer killed in the container.
    pub oom_kills: Option<u64>,
    /// CPU time of every process the container ran, in nanoseconds.
    pub cpu_ns: Option<u64>,
    /// The container's peak memory (tmpfs files and page cache included).
    pub peak_memory_bytes: Option<u64>,
    /// Bytes in use in /workspace's tmpfs.
    pub workspace_bytes: Option<u64>,
}

impl Reading {
    /// Whether the kernel's OOM killer killed anything in the container.
    pub fn oom_killed(&self) -> bool {
        self.oom_kills.is_some_and(|n| n > 0)
    }
}

/// Container `id`'s cgroup figures under `root`: v2 if `root` is a cgroup2
/// mount (it has `cgroup.controllers`), else v1. The container's directory is
/// where Docker puts it with either cgroup driver (`docker/<id>` with
/// cgroupfs, `system.slice/docker-<id>.scope` with systemd).
///
/// v1: `memory.oom_control` `oom_kill` (kernel 4.13+), `memory.max_usage_in_bytes`,
/// `cpuacct.usage` (ns). v2: `memory.events` `oom_kill`, `memory.peak` (kernel
/// 5.19+), `cpu.stat` `usage_usec`.
///
/// `None` when the container has no CPU cgroup directory here: not made yet,
/// not where the worker looks, or removed, which the kernel allows only once
/// the cgroup holds no process.
pub fn read_cgroup(root: &Path, id: &str) -> Option<Reading> {
    let dirs = |under: &Path| -> Option<PathBuf> {
        [
            under.join("docker").join(id),
            under
                .join("system.slice")
                .join(format!("docker-{id}.scope")),
        ]
        .into_iter()
        .find(|d| d.is_dir())
    };
    let mut r = Reading::default();
    if root.join("cgroup.controllers").exists() {
        let d = dirs(root)?;
        r.oom_kills = keyed(&d.join("memory.events"), "oom_kill");
        r.peak_memory_bytes = number(&d.join("memory.peak"));
        r.cpu_ns = keyed(&d.join("cpu.stat"), "usage_usec").and_then(|us| us.checked_mul(1000));
    } else {
        let cpu = dirs(&root.join("cpuacct"))?;
        r.cpu_ns = number(&cpu.join("cpuacct.usage"));
        if let Some(d) = dirs(&root.join("memory")) {
            r.oom_kills = keyed(&d.join("memory.oom_control"), "oom_kill");
            r.peak_memory_bytes = number(&d.join("memory.max_usage_in_bytes"));
        }
    }
    Some(r)
}

/// A file holding one number.
fn number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The number after `key` in a file of `key value` lines.
fn keyed(path: &Path, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    parse_keyed(&text, key)
}

fn parse_keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Bytes in use from `stat -f -c '%b %f %S'`.
fn parse_statfs(out: &str) -> Option<u64> {
    let n: Vec<u64> = out
        .split_ascii_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    match n.as_slice() {
        [blocks, free, size] => blocks.checked_sub(*free)?.checked_mul(*size),
        _ => None,
    }
}

impl Sandbox {
    /// Container `id`'s cgroup figures only (a few small files; no Docker
    /// call, no process in the container): what the runner samples while a
    /// task runs, and at its end. `None` once it is gone (see `read_cgroup`);
    /// a read that failed here is a cgroup with nothing known.
    pub async fn cgroup(&self, id: &str) -> Option<Reading> {
        let read = {
            let id = id.to_owned();
            tokio::task::spawn_blocking(move || read_cgroup(Path::new(CGROUP_ROOT), &id))
        };
        match read.await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(container = id, error = %e, "could not read the container's cgroup");
                Some(Reading::default())
            }
        }
    }

    /// Bytes in /workspace: through the container's first process if this
    /// worker can reach it, else from a short exec in the container.
    pub async fn workspace_bytes(&self, id: &str) -> Option<u64> {
        if let Some(bytes) = self.workspace_bytes_on_host(id).await {
            return Some(bytes);
        }
        self.workspace_bytes_by_exec(id).await
    }

    /// `statvfs` of `/proc/<pid>/root/workspace`, `pid` the container's first
    /// process (alive: it sleeps until the worker stops the container).
    async fn workspace_bytes_on_host(&self, id: &str) -> Option<u64> {
        let pid = self
            .docker
            .inspect_container(id, None)
            .await
            .ok()?
            .state?
            .pid
            .filter(|&p| p > 0)?;
        let path = PathBuf::from(format!("/proc/{pid}/root/workspace"));
        let stat = tokio::task::spawn_blocking(move || rustix::fs::statvfs(&path))
            .await
            .ok()?;
        match stat {
            Ok(s) => s.f_blocks.checked_sub(s.f_bfree)?.checked_mul(s.f_frsize),
            Err(e) => {
                tracing::debug!(container = id, error = %e, "/workspace not reachable from the host; asking the container");
                None
            }
        }
    }

    /// Bytes in /workspace, from a short exec in the container.
    async fn workspace_bytes_by_exec(&self, id: &str) -> Option<u64> {
        let read = async {
            let config = CreateExecOptions {
                attach_stdout: Some(true),
                attach_stderr: Some(false),
                tty: Some(false),
                cmd: Some(vec![
                    "sh".to_owned(),
                    "-c".to_owned(),
                    WORKSPACE_PROBE.to_owned(),
                ]),
                user: Some(self.limits.user.clone()),
                ..Default::default()
            };
            let exec = self.docker.create_exec(id, config).await?;
            let started = self.docker.start_exec(&exec.id, None).await?;
            let mut out = Vec::new();
            if let StartExecResults::Attached { mut output, .. } = started {
                while let Some(frame) = output.next().await {
                    out.extend_from_slice(&frame?.into_bytes());
                    if out.len() > PROBE_MAX_OUTPUT {
                        break;
                    }
                }
            }
            Ok::<_, bollard::errors::Error>(out)
        };
        let timed = tokio::time::timeout(PROBE_TIMEOUT, self.metrics.docker(Op::Probe, read));
        match timed.await {
            Ok(Ok(out)) => parse_statfs(&String::from_utf8_lossy(&out)),
            Ok(Err(e)) => {
                tracing::debug!(container = id, error = %e, "could not read /workspace's size");
                None
            }
            Err(_) => {
                tracing::debug!(container = id, "reading /workspace's size took too long");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory standing for a cgroup root; removed at the end.
    struct Root(PathBuf);

    impl Root {
        fn new() -> Root {
            let d = std::env::temp_dir().join(format!("sr-cg-test-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(&d).expect("mkdir");
            Root(d)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Root {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn cgroup_files_and_statfs_output_are_parsed() {
        let oom = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(parse_keyed(oom, "oom_kill"), Some(2));
        let events = "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(parse_keyed(events, "oom_kill"), Some(1));
        assert_eq!(
            parse_keyed("usage_usec 1500\nuser_usec 1000\n", "usage_usec"),
            Some(1500)
        );
        assert_eq!(parse_keyed("nothing here\n", "oom_kill"), None);
        assert_eq!(parse_statfs("2560 1280 4096\n"), Some(1280 * 4096));
        assert_eq!(parse_statfs("stat: not found"), None);
    }

    #[test]
    fn a_v1_cgroup_is_read_where_docker_puts_it_and_a_missing_one_reads_as_nothing() {
        let root = Root::new();
        let mem = root.path().join("memory/docker/abc");
        let cpu = root.path().join("cpuacct/system.slice/docker-abc.scope");
        std::fs::create_dir_all(&mem).expect("mkdir");
        std::fs::create_dir_all(&cpu).expect("mkdir");
        std::fs::write(
            mem.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
        )
        .expect("write");
        std::fs::write(mem.join("memory.max_usage_in_bytes"), "201326592\n").expect("write");
        std::fs::write(cpu.join("cpuacct.usage"), "2000000000\n").expect("write");
        let r = read_cgroup(root.path(), "abc").expect("present");
        assert_eq!(
            r,
            Reading {
                oom_kills: Some(1),
                cpu_ns: Some(2_000_000_000),
                peak_memory_bytes: Some(201_326_592),
                workspace_bytes: None,
            }
        );
        assert!(r.oom_killed());
        assert_eq!(read_cgroup(root.path(), "other"), None);
        // Memory's cgroup alone is no CPU figure: the CPU's is what is gone.
        std::fs::remove_dir_all(&cpu).expect("rmdir");
        assert_eq!(read_cgroup(root.path(), "abc"), None);
    }

    #[test]
    fn a_v2_cgroup_is_read() {
        let root = Root::new();
        std::fs::write(root.path().join("cgroup.controllers"), "cpu memory\n").expect("write");
        let d = root.path().join("docker/abc");
        std::fs::create_dir_all(&d).expect("mkdir");
        std::fs::write(
            d.join("memory.events"),
            "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
        )
        .expect("write");
        std::fs::write(d.join("cpu.stat"), "usage_usec 1500\n").expect("write");
        let r = read_cgroup(root.path(), "abc").expect("present");
        assert_eq!(
            r,
            Reading {
                oom_kills: Some(0),
                cpu_ns: Some(1_500_000),
                // No memory.peak before kernel 5.19: unknown, not zero.
                peak_memory_bytes: None,
                workspace_bytes: None,
            }
        );
        assert!(!r.oom_killed());
    }
}
