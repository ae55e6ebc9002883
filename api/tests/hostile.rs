//! The hostile suite: scripts that try to break out, exhaust the host or reach
//! what they must not, each with the outcome it must have, run side by side with
//! an innocent task that must still succeed. Real Docker engine, real firewall.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

fn free_bytes(path: &str) -> u64 {
    let out = Command::new("df")
        .args(["-B1", "--output=avail", path])
        .output()
        .expect("df");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .expect("df output")
}

fn docker_out(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().expect("docker");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Peak resident memory of this process (worker and api run in it), in KiB.
/// A failed read fails the test: read as 0 it would pass any memory bound.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in /proc/self/status:\n{status}"))
}

const PROBE: &str = r#"
import socket, sys, time
for spec in sys.argv[1:]:
    name, host, port = spec.split(",")
    t = time.time()
    try:
        socket.create_connection((host, int(port)), timeout=4).close()
        print(name, "REACHED", flush=True)
    except OSError as e:
        print(name, "blocked", round(time.time() - t, 2), type(e).__name__, flush=True)
has_default = any(l.split()[1] == "00000000" for l in open("/proc/net/route").readlines()[1:])
print("default-route", "present" if has_default else "MISSING")
"#;

const SIBLING: &str = r#"python3 -c "
import http.server, socket, threading
server = http.server.HTTPServer(('0.0.0.0', 8000), http.server.SimpleHTTPRequestHandler)
threading.Thread(target=server.serve_forever, daemon=True).start()
ip = socket.gethostbyname(socket.gethostname())
socket.create_connection((ip, 8000), timeout=5).close()
print('listening', ip, flush=True)
threading.Event().wait()
""#;

#[tokio::test]
async fn hostile_scripts_are_contained_while_an_innocent_task_succeeds() {
    let disk_before = free_bytes("/var/lib/docker");
    let tmp_before = free_bytes(&std::env::temp_dir().display().to_string());
    let stack = Stack::start(Options {
        concurrency: 9,
        bind_all: true,
        extra_env: vec![
            ("TASK_MEMORY_MB", "256".into()),
            ("TASK_PIDS_LIMIT", "64".into()),
            ("TASK_DISK_MB", "64".into()),
            ("TASK_TMPFS_MB", "16".into()),
            ("TASK_CPUS", "0.5".into()),
        ],
        ..Options::default()
    })
    .await;
    let client = stack.client().await;

    // A host service listening on every interface: nothing from a task may reach it.
    let host_service = tokio::net::TcpListener::bind("0.0.0.0:0")
        .await
        .expect("listener");
    let service_port = host_service.local_addr().expect("addr").port();
    let reached = Arc::new(AtomicUsize::new(0));
    tokio::spawn({
        let reached = reached.clone();
        async move {
            while host_service.accept().await.is_ok() {
                reached.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    let gateway = docker_out(&[
        "network",
        "inspect",
        "script-runner-tasks",
        "-f",
        "{{(index .IPAM.Config 0).Gateway}}",
    ]);
    let host_ip = docker_out(&[
        "run",
        "--rm",
        "--network",
        "host",
        &runtime_image(),
        "hostname",
        "-I",
    ])
    .split_whitespace()
    .next()
    .unwrap_or_default()
    .to_owned();
    assert!(
        !gateway.is_empty() && !host_ip.is_empty(),
        "gateway {gateway:?}, host ip {host_ip:?}"
    );
    let api_port = stack.url.rsplit(':').next().unwrap_or("0").to_owned();

    // The innocent task goes first and must be untouched by what runs beside it.
    let innocent = run(
        &client,
        "python3.13",
        "for i in $(seq 1 20); do echo tick $i; sleep 0.5; done; echo done",
        json!({ "timeout_seconds": 120 }),
    )
    .await;
    // A sibling task serving on a port, for the prober to try. It prints its
    // address only once it has reached its own server, so the port is open.
    let sibling = run(
        &client,
        "python3.13",
        SIBLING,
        json!({ "timeout_seconds": 120 }),
    )
    .await;
    let sib = wait_status(
        &client,
        &sibling,
        "the sibling to serve",
        Duration::from_secs(60),
        |s| {
            s["stdout_tail"]
                .as_str()
                .is_some_and(|t| t.starts_with("listening "))
        },
    )
    .await;
    let sibling_ip = sib["stdout_tail"]
        .as_str()
        .and_then(|t| t.split_whitespace().nth(1))
        .unwrap_or_default()
        .to_owned();

    let targets = [
        format!("redis-via-gateway,{gateway},{}", stack.redis.port),
        format!("redis-via-host-ip,{host_ip},{}", stack.redis.port),
        format!("api-via-gateway,{gateway},{api_port}"),
        format!("host-service-via-gateway,{gateway},{service_port}"),
        format!("host-service-via-host-ip,{host_ip},{service_port}"),
        format!("host-ssh,{gateway},22"),
        format!("sibling-task,{sibling_ip},8000"),
        "metadata,169.254.169.254,80".to_owned(),
    ];
    let probe_cmd = format!(
        "cat > /tmp/probe.py <<'EOF'\n{PROBE}\nEOF\npython3 /tmp/probe.py {}",
        targets.join(" ")
    );

    let t = json!({ "timeout_seconds": 90 });
    let (fork_bomb, memory, disk, flood, pids, privileges, network) = tokio::join!(
        run_to_end(
            &client,
            "python3.13",
            // The bomb, then a busy loop of shell builtins (no fork), so the one
            // way this ends is the timeout, whatever the bomb left running.
            "f() { f | f & }; f; while :; do :; done",
            json!({ "timeout_seconds": 8 })
        ),
        run_to_end(
            &client,
            "python3.13",
            "python3 -c 'b = bytearray(2 * 1024 ** 3); print(len(b))'",
            t.clone()
        ),
        run_to_end(
            &client,
            "python3.13",
            "dd if=/dev/zero of=/workspace/fill bs=1M count=1024",
            t.clone()
        ),
        run_to_end_within(
            &client,
            "python3.13",
            "head -c 2147483648 /dev/zero",
            json!({ "timeout_seconds": 600 }),
            Duration::from_secs(600),
        ),
        run_to_end(
            &client,
            "python3.13",
            "python3 -c \"import subprocess; ps = [subprocess.Popen(['sleep', '60']) for _ in range(200)]\"",
            t.clone(),
        ),
        run_to_end(&client, "python3.13", PRIVILEGES, t.clone()),
        run_to_end(&client, "python3.13", &probe_cmd, t.clone()),
    );
    call_ok(&client, "kill_task", json!({ "task_id": sibling })).await;

    let innocent = wait_status(
        &client,
        &innocent,
        "the innocent task",
        Duration::from_secs(180),
        is_final,
    )
    .await;
    assert_eq!(innocent["state"], "succeeded", "{innocent}");
    let expected: String = (1..=20).map(|i| format!("tick {i}\n")).collect::<String>() + "done\n";
    assert_eq!(innocent["stdout_tail"], expected);

    // Fork bomb: stopped by the PID cap and the timeout, never by the host.
    assert_eq!(fork_bomb["state"], "timed-out", "fork bomb: {fork_bomb}");
    assert_eq!(fork_bomb["reason"], "timed out after 8 s", "{fork_bomb}");
    // ...and the PID cap is what held it: forks were refused inside.
    let fb_err = fork_bomb["stderr_tail"].as_str().unwrap_or_default();
    assert!(fb_err.contains("fork"), "no fork failure seen: {fork_bomb}");

    // Memory: 2 GiB asked under a 256 MiB cap.
    assert_eq!(memory["state"], "failed", "{memory}");
    assert_eq!(
        memory["reason"], "out of memory (limit 256 MiB)",
        "{memory}"
    );

    // Disk: the workspace is capped at 64 MiB.
    assert_eq!(disk["state"], "failed", "{disk}");
    assert_eq!(
        disk["reason"], "exited with code 1: disk full (workspace limit 64 MiB)",
        "{disk}"
    );

    // 2 GiB on stdout: counted in full, kept as a tail, memory bounded.
    assert_eq!(flood["state"], "succeeded", "{flood}");
    assert_eq!(flood["stdout_bytes"], 2_147_483_648u64);
    assert_eq!(flood["stdout_truncated"], true);
    assert_eq!(flood["stdout_tail"].as_str().map(str::len), Some(4096));
    let peak = peak_rss_kib();
    assert!(
        peak < 512 * 1024,
        "worker + api peaked at {peak} KiB while 2 GiB streamed through"
    );

    // PID cap: named in the reason.
    assert_eq!(pids["state"], "failed", "{pids}");
    assert_eq!(
        pids["reason"], "exited with code 1: process limit reached (64 processes)",
        "{pids}"
    );

    // Privileges.
    assert_eq!(
        privileges["stdout_tail"],
        "CapEff:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\nnofile=1024\ncpu=50000 100000\n\
         memory=268435456 swap=0\nuid=65534\nmount: denied\nunshare: denied\n\
         write-root: denied\nchmod-suid: denied\ndocker-socket: absent\n\
         home, workspace, tmp: writable\n",
        "{privileges}"
    );

    // Network: every probe refused; the route out is still there.
    let out = network["stdout_tail"].as_str().unwrap_or_default();
    assert_eq!(network["state"], "succeeded", "{network}");
    for target in &targets {
        let name = target.split(',').next().unwrap_or_default();
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_default();
        // Refused (reset, unreachable), not silently dropped: a drop would end in
        // the probe's own 4 s timeout.
        assert!(
            line.contains(" blocked ")
                && !line.contains("TimeoutError")
                && !line.contains("timeout"),
            "{name} was not refused: {line:?}\n{out}"
        );
    }
    assert!(out.contains("default-route present"), "{out}");
    assert_eq!(
        reached.load(Ordering::SeqCst),
        0,
        "a task reached the host service"
    );

    // After the suite: service healthy, nothing left behind, host disk untouched.
    let health = reqwest::get(format!("{}/healthz", stack.url))
        .await
        .expect("healthz");
    assert_eq!(health.status(), 200);
    let after = run_to_end(&client, "python3.13", "echo still-fine", json!({})).await;
    assert_eq!(after["stdout_tail"], "still-fine\n");
    // Containers are removed in the background once a task is recorded; idle
    // warm pool containers are not left behind, they wait for the next task.
    wait_until(
        "no task container left",
        Duration::from_secs(30),
        || async {
            task_containers_of_worker(&stack.worker_name)
                .is_empty()
                .then_some(())
        },
    )
    .await;
    let disk_after = free_bytes("/var/lib/docker");
    let tmp_after = free_bytes(&std::env::temp_dir().display().to_string());
    let mib = |a: u64, b: u64| (a as i64 - b as i64).abs() / (1 << 20);
    assert!(
        mib(disk_before, disk_after) < 8,
        "docker disk moved by {} MiB",
        mib(disk_before, disk_after)
    );
    assert!(
        mib(tmp_before, tmp_after) < 8,
        "tmp disk moved by {} MiB",
        mib(tmp_before, tmp_after)
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn unsafe_archives_are_refused_at_submit_and_write_nothing() {
    use std::io::Write;
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let args = |zip: Value| json!({ "runtime": "python3.13", "command_base64": b64("ls -R"), "zip_base64": zip });
    let canary = format!("sr-canary-{}", uuid::Uuid::new_v4().simple());
    let opts = zip::write::SimpleFileOptions::default();

    let slip = zip_of(&[
        ("ok.txt", "fine"),
        (&format!("../../../../tmp/{canary}"), "pwned"),
    ]);
    let absolute = zip_of(&[(&format!("/tmp/{canary}"), "pwned")]);
    let symlink = {
        let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        w.add_symlink("etc-passwd", "/etc/passwd", opts)
            .expect("symlink");
        w.finish().expect("zip").into_inner()
    };
    let many = {
        let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        for i in 0..100_000 {
            w.start_file(format!("f{i}"), opts).expect("entry");
        }
        w.finish().expect("zip").into_inner()
    };
    let bomb = {
        let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        w.start_file("zeros", opts.compression_level(Some(9)))
            .expect("entry");
        let chunk = vec![0u8; 1 << 20];
        for _ in 0..1024 {
            w.write_all(&chunk).expect("write");
        }
        w.finish().expect("zip").into_inner()
    };
    assert!(
        bomb.len() < 4 << 20,
        "the bomb should be small: {} bytes",
        bomb.len()
    );

    let cases: [(&str, &[u8], &str); 5] = [
        ("zip-slip", &slip, "unsafe path"),
        ("absolute path", &absolute, "unsafe path"),
        ("symlink", &symlink, "is a symbolic link"),
        (
            "100 000 entries",
            &many,
            "the zip has 100000 entries; at most 10000 are allowed",
        ),
        (
            "1 GiB expansion",
            &bomb,
            "at most 268435456 bytes are allowed",
        ),
    ];
    for (what, zip, expected) in cases {
        let msg = call_err(&client, "run_script", args(json!(b64(zip)))).await;
        assert!(
            msg.contains(expected),
            "{what}: {msg:?} does not contain {expected:?}"
        );
    }
    assert!(
        !std::path::Path::new(&format!("/tmp/{canary}")).exists(),
        "an archive wrote outside"
    );
    assert_no_task_created(&stack).await;
    stack.shutdown().await;
}
