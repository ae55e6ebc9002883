//! Real projects, as an AI client sends them: a zip of sources plus a command such
//! as `npm install && npm test` or `pip install ... && python -m unittest`. Real
//! Docker, real Redis, through the MCP tools, in the local images that stand in for
//! `node:24-slim` and `python:3.13-slim` (scripts/build-test-image.sh).
//!
//! Tasks cannot reach a package registry here, so dependencies travel in the zip:
//! an `npm pack` tarball, wheels and a shared object built by this test (with the
//! host's npm, the zip crate and gcc). Nothing binary is committed. The stacks run
//! with the worker's default limits, so these tests also show that the defaults
//! hold a small install.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use script_runner_e2e::*;
use serde_json::{Value, json};

/// A scratch directory on the host, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let dir = std::env::temp_dir().join(format!("sr-fixture-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }

    /// Writes `contents` at `rel` (parents created) with Unix mode `mode`.
    fn write(&self, rel: &str, contents: impl AsRef<[u8]>, mode: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = self.0.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::write(&path, contents).expect("write fixture");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs a host tool for a fixture; panics with its output if it fails.
fn host(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A zip of `(path, contents, unix mode)`.
fn zip_with_modes(entries: &[(String, Vec<u8>, u32)]) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, data, mode) in entries {
        let opts = zip::write::SimpleFileOptions::default().unix_permissions(*mode);
        w.start_file(name.as_str(), opts).expect("zip entry");
        w.write_all(data).expect("zip write");
    }
    w.finish().expect("zip").into_inner()
}

/// Every file under `root`, with its mode, as zip entries (paths relative to root).
fn files_under(root: &Path) -> Vec<(String, Vec<u8>, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir") {
            let path = entry.expect("dir entry").path();
            let meta = std::fs::metadata(&path).expect("metadata");
            if meta.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path
                .strip_prefix(root)
                .expect("under root")
                .display()
                .to_string();
            let data = std::fs::read(&path).expect("read fixture");
            out.push((rel, data, meta.permissions().mode() & 0o7777));
        }
    }
    out
}

/// A wheel (a zip with a `.dist-info`), as `pip wheel` would make it; the RECORD
/// lists the files without hashes, which pip accepts.
fn wheel(
    name: &str,
    tag: &str,
    files: &[(&str, Vec<u8>)],
    entry_points: Option<&str>,
) -> (String, Vec<u8>) {
    let info = format!("{name}-1.0.dist-info");
    let purelib = tag.ends_with("-any");
    let mut entries: Vec<(String, Vec<u8>, u32)> = files
        .iter()
        .map(|(p, d)| ((*p).to_owned(), d.clone(), 0o644))
        .collect();
    entries.push((
        format!("{info}/METADATA"),
        format!("Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n").into_bytes(),
        0o644,
    ));
    entries.push((
        format!("{info}/WHEEL"),
        format!(
            "Wheel-Version: 1.0\nGenerator: script-runner-tests\nRoot-Is-Purelib: {purelib}\nTag: {tag}\n"
        )
        .into_bytes(),
        0o644,
    ));
    if let Some(ep) = entry_points {
        entries.push((
            format!("{info}/entry_points.txt"),
            ep.as_bytes().to_vec(),
            0o644,
        ));
    }
    let mut record: String = entries.iter().map(|(p, _, _)| format!("{p},,\n")).collect();
    record.push_str(&format!("{info}/RECORD,,\n"));
    entries.push((format!("{info}/RECORD"), record.into_bytes(), 0o644));
    (format!("{name}-1.0-{tag}.whl"), zip_with_modes(&entries))
}

/// Peak memory of the task's cgroup (files in its tmpfs mounts included), v1 or v2.
const PRINT_PEAK_MEMORY: &str = "echo \"peak-memory-bytes $(cat /sys/fs/cgroup/memory.peak \
     2>/dev/null || cat /sys/fs/cgroup/memory/memory.max_usage_in_bytes)\"";

fn report_peak(what: &str, status: &Value, elapsed: Duration) {
    let peak = status["stdout_tail"]
        .as_str()
        .and_then(|t| t.lines().find_map(|l| l.strip_prefix("peak-memory-bytes ")))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|b| format!("{} MiB", b >> 20))
        .unwrap_or_else(|| "unknown".into());
    eprintln!(
        "{what}: {elapsed:.1?} from submit to end, task runtime {} s, peak memory {peak}",
        status["runtime_seconds"]
    );
}

/// A Node project whose `test` script runs a tool from `node_modules/.bin`, with
/// its one dependency as an `npm pack` tarball in `deps/`.
fn node_project() -> Vec<u8> {
    let dep = Scratch::new();
    dep.write(
        "package.json",
        r#"{"name":"shout-cli","version":"1.0.0","main":"index.js","bin":{"shout":"bin/shout.js"}}"#,
        0o644,
    );
    dep.write(
        "index.js",
        "module.exports = (s) => s.toUpperCase() + '!';\n",
        0o644,
    );
    dep.write(
        "bin/shout.js",
        "#!/usr/bin/env node\nconsole.log(require('../index.js')(process.argv.slice(2).join(' ')));\n",
        0o755,
    );
    let project = Scratch::new();
    project.write(
        "package.json",
        r#"{"name":"real-project","version":"1.0.0","private":true,
            "scripts":{"test":"shout tests pass && node test.js"},
            "dependencies":{"shout-cli":"file:deps/shout-cli-1.0.0.tgz"}}"#,
        0o644,
    );
    project.write(
        "test.js",
        "const assert = require('assert');\n\
         assert.strictEqual(require('shout-cli')('hi'), 'HI!');\n\
         console.log('test.js ok');\n",
        0o644,
    );
    std::fs::create_dir_all(project.0.join("deps")).expect("deps dir");
    host(
        Command::new("npm")
            .arg("pack")
            .arg("--silent")
            .arg("--pack-destination")
            .arg(project.0.join("deps"))
            .current_dir(&dep.0)
            .env("npm_config_cache", dep.0.join(".npm-cache")),
    );
    zip_with_modes(&files_under(&project.0))
}

#[tokio::test]
async fn a_node_project_installs_its_dependencies_and_runs_its_tests() {
    let zip = tokio::task::spawn_blocking(node_project)
        .await
        .expect("fixture");
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    // npm install, then npm test (whose script runs node_modules/.bin/shout),
    // then npm ci from the lockfile install just wrote, and npx; npm's cache
    // is the owner's dependency cache, writable.
    let command = format!(
        "npm install && npm test && npm ci && npx shout via npx && \
         test -d \"$(npm config get cache)/_cacache\" && npm config get cache && \
         echo cache-writable && {PRINT_PEAK_MEMORY}"
    );
    let started = Instant::now();
    let s = run_to_end_within(
        &client,
        "node24",
        &command,
        json!({ "zip_base64": b64(&zip), "timeout_seconds": 600 }),
        Duration::from_secs(600),
    )
    .await;
    report_peak("npm install && npm test && npm ci", &s, started.elapsed());
    assert_eq!(s["state"], "succeeded", "{s}");
    let out = s["stdout_tail"].as_str().unwrap_or_default();
    for expected in [
        "TESTS PASS!",
        "test.js ok",
        "VIA NPX!",
        "/.sr-cache/c/npm\n",
        "cache-writable",
    ] {
        assert!(out.contains(expected), "{expected:?} missing from {out}");
    }
    stack.shutdown().await;
}

const FASTADD_C: &str = "int fastadd(int a, int b) { return a + b; }\n";

const FASTADD_INIT: &str = "\
import ctypes, os
LIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'libfastadd.so')
_lib = ctypes.CDLL(LIB)
def add(a, b):
    return _lib.fastadd(a, b)
";

const GREET: &str = "\
def hello(name):
    return 'hello ' + name
def main():
    print(hello('from the console script'))
";

const PROJECT_TESTS: &str = "\
import ctypes, os, sys, unittest
import fastadd, greet

class ProjectTest(unittest.TestCase):
    def test_pure_python_wheel(self):
        self.assertEqual(greet.hello('tests'), 'hello tests')

    def test_wheel_carrying_a_shared_object(self):
        self.assertEqual(fastadd.add(2, 3), 5)
        # Installed where the command asked: the user site under $HOME, or the venv.
        where = sys.prefix if sys.prefix != sys.base_prefix else os.path.expanduser('~')
        self.assertTrue(fastadd.LIB.startswith(where + '/'), fastadd.LIB)

    def test_shared_object_from_the_workspace(self):
        lib = ctypes.CDLL(os.path.abspath('native/libfastadd.so'))
        self.assertEqual(lib.fastadd(40, 2), 42)

if __name__ == '__main__':
    unittest.main()
";

/// A Python project: a pure-Python wheel with a console script, a wheel carrying
/// a shared object it loads with ctypes, the same shared object loose in the
/// project, and unittest tests that use all three.
fn python_project() -> Vec<u8> {
    let build = Scratch::new();
    let src = build.write("fastadd.c", FASTADD_C, 0o644);
    let so = build.0.join("libfastadd.so");
    host(
        Command::new("gcc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&so)
            .arg(&src),
    );
    let so_bytes = std::fs::read(&so).expect("libfastadd.so");
    let (greet_name, greet_whl) = wheel(
        "greet",
        "py3-none-any",
        &[("greet.py", GREET.as_bytes().to_vec())],
        Some("[console_scripts]\ngreet = greet:main\n"),
    );
    let (fastadd_name, fastadd_whl) = wheel(
        "fastadd",
        "py3-none-linux_x86_64",
        &[
            ("fastadd/__init__.py", FASTADD_INIT.as_bytes().to_vec()),
            ("fastadd/libfastadd.so", so_bytes.clone()),
        ],
        None,
    );
    zip_with_modes(&[
        (format!("wheels/{greet_name}"), greet_whl, 0o644),
        (format!("wheels/{fastadd_name}"), fastadd_whl, 0o644),
        ("native/libfastadd.so".into(), so_bytes, 0o755),
        (
            "test_project.py".into(),
            PROJECT_TESTS.as_bytes().to_vec(),
            0o644,
        ),
    ])
}

fn assert_unittest_passed(s: &Value, tests: usize) {
    assert_eq!(s["state"], "succeeded", "{s}");
    let err = s["stderr_tail"].as_str().unwrap_or_default();
    assert!(
        err.contains(&format!("Ran {tests} tests")) && err.contains("\nOK"),
        "{err}"
    );
    let out = s["stdout_tail"].as_str().unwrap_or_default();
    assert!(out.contains("hello from the console script"), "{out}");
}

#[tokio::test]
async fn a_python_project_installs_wheels_with_pip_user_and_loads_compiled_code() {
    let zip = tokio::task::spawn_blocking(python_project)
        .await
        .expect("fixture");
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    // `greet` is a console script in ~/.local/bin, run by name; pip's cache is
    // the owner's dependency cache.
    let command = format!(
        "pip install --user ./wheels/*.whl && python -m unittest -v && greet && \
         pip cache dir && {PRINT_PEAK_MEMORY}"
    );
    let started = Instant::now();
    let s = run_to_end_within(
        &client,
        "python3.13",
        &command,
        json!({ "zip_base64": b64(&zip), "timeout_seconds": 600 }),
        Duration::from_secs(600),
    )
    .await;
    report_peak(
        "pip install --user && python -m unittest",
        &s,
        started.elapsed(),
    );
    assert_unittest_passed(&s, 3);
    let out = s["stdout_tail"].as_str().unwrap_or_default();
    assert!(out.lines().any(|l| l == "/.sr-cache/c/pip"), "{out}");
    stack.shutdown().await;
}

#[tokio::test]
async fn a_venv_created_in_the_workspace_works() {
    let zip = tokio::task::spawn_blocking(python_project)
        .await
        .expect("fixture");
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let command = "python -m venv .venv && .venv/bin/pip install ./wheels/*.whl && \
                   .venv/bin/python -m unittest -v && .venv/bin/greet && \
                   . .venv/bin/activate && python -c 'import fastadd; print(fastadd.LIB)'";
    let s = run_to_end_within(
        &client,
        "python3.13",
        command,
        json!({ "zip_base64": b64(&zip), "timeout_seconds": 600 }),
        Duration::from_secs(600),
    )
    .await;
    assert_unittest_passed(&s, 3);
    let out = s["stdout_tail"].as_str().unwrap_or_default();
    assert!(out.contains("/workspace/.venv/lib/"), "{out}");
    stack.shutdown().await;
}

const RUN_SH: &str = "#!/bin/sh\necho \"run.sh ran as $(id -u) in $(pwd)\"\n";

#[tokio::test]
async fn executables_from_the_zip_run_and_setuid_bits_are_not_applied() {
    let zip = zip_with_modes(&[
        ("run.sh".into(), RUN_SH.as_bytes().to_vec(), 0o755),
        (
            "tools/suid.sh".into(),
            b"#!/bin/sh\necho suid.sh ran as $(id -u)\n".to_vec(),
            0o4755,
        ),
        (
            "tools/sgid-sticky.sh".into(),
            b"#!/bin/sh\necho sgid\n".to_vec(),
            0o3755,
        ),
        ("data.txt".into(), b"just data\n".to_vec(), 0o644),
    ]);
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    // Run from the zip, from $HOME (/tmp) and from /tmp, then show modes, owners
    // and the mount flags the task got.
    let command = "./run.sh && ./tools/suid.sh && cp run.sh \"$HOME/home.sh\" && \"$HOME/home.sh\" && \
                   stat -c '%a %u %n' run.sh tools/suid.sh tools/sgid-sticky.sh data.txt && \
                   awk '$5 == \"/workspace\" || $5 == \"/tmp\" { print \"mount\", $5, $6 }' /proc/self/mountinfo";
    let s = run_to_end(
        &client,
        "python3.13",
        command,
        json!({ "zip_base64": b64(&zip) }),
    )
    .await;
    assert_eq!(s["state"], "succeeded", "{s}");
    let out = s["stdout_tail"].as_str().unwrap_or_default();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[..7],
        [
            "run.sh ran as 65534 in /workspace",
            "suid.sh ran as 65534",
            "run.sh ran as 65534 in /workspace",
            "755 65534 run.sh",
            "755 65534 tools/suid.sh",
            "755 65534 tools/sgid-sticky.sh",
            "644 65534 data.txt",
        ],
        "{out}"
    );
    let mounts: Vec<&str> = lines
        .iter()
        .filter(|l| l.starts_with("mount "))
        .copied()
        .collect();
    assert_eq!(mounts.len(), 2, "{out}");
    for m in mounts {
        let flags: Vec<&str> = m
            .rsplit(' ')
            .next()
            .unwrap_or_default()
            .split(',')
            .collect();
        assert!(
            flags.contains(&"nosuid") && flags.contains(&"nodev") && !flags.contains(&"noexec"),
            "{m}"
        );
    }
    stack.shutdown().await;
}

#[tokio::test]
async fn a_full_home_and_files_that_fill_memory_get_different_reasons() {
    // /workspace (256 MiB) is larger than the memory cap (192 MiB): files written
    // there can exhaust memory before the tmpfs is full.
    let stack = Stack::start(Options {
        extra_env: vec![
            ("TASK_MEMORY_MB", "192".into()),
            ("TASK_DISK_MB", "256".into()),
            ("TASK_TMPFS_MB", "32".into()),
        ],
        ..Options::default()
    })
    .await;
    let client = stack.client().await;
    let (home, memory) = tokio::join!(
        run_to_end(
            &client,
            "python3.13",
            "dd if=/dev/zero of=\"$HOME/fill\" bs=1M count=64",
            json!({}),
        ),
        run_to_end(
            &client,
            "python3.13",
            "dd if=/dev/zero of=/workspace/fill bs=1M count=250",
            json!({}),
        ),
    );
    assert_eq!(
        (home["state"].as_str(), home["reason"].as_str()),
        (
            Some("failed"),
            Some("exited with code 1: disk full (/tmp and HOME limit 32 MiB)")
        ),
        "{home}"
    );
    assert_eq!(
        (memory["state"].as_str(), memory["reason"].as_str()),
        (
            Some("failed"),
            Some("out of memory (limit 192 MiB, shared with the files in /workspace and /tmp)")
        ),
        "{memory}"
    );
    stack.shutdown().await;
}
