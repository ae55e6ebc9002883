//! The hostile suite: scripts that try to break out, exhaust the host or reach
//! what they must not, each with the outcome it must have, run side by side with
//! an innocent task that must still succeed. Real Docker engine, real firewall.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use script_runner_e2e::*;
use serde_json::{Value, json};

mod firewall;

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
from concurrent.futures import ThreadPoolExecutor
def probe(spec):
    name, host, port = spec.split(",")
    t = time.time()
    try:
        socket.create_connection((host, int(port)), timeout=4).close()
        return f"{name} REACHED"
    except OSError as e:
        return f"{name} blocked {round(time.time() - t, 2)} {type(e).__name__}"
# All at once: a probe that is dropped rather than refused costs its 4 s once.
with ThreadPoolExecutor(len(sys.argv) - 1) as pool:
    for line in pool.map(probe, sys.argv[1:]):
        print(line, flush=True)
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
    let disk_before = free_disks();
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
    let (service_port, reached) = host_service().await;
    let (gateway, host_ip) = gateway_and_host_ip("script-runner-tasks");

    // The innocent task goes first and must be untouched by what runs beside it.
    let innocent = run(
        &client,
        "python3.13",
        "for i in $(seq 1 20); do echo tick $i; sleep 0.5; done; echo done",
        json!({ "timeout_seconds": 120 }),
    )
    .await;
    let (sibling, sibling_ip) = start_sibling(&client).await;
    let targets = vec![
        format!("redis-via-gateway,{gateway},{}", stack.redis.port),
        format!("redis-via-host-ip,{host_ip},{}", stack.redis.port),
        format!(
            "api-via-gateway,{gateway},{}",
            stack.url.rsplit(':').next().unwrap_or("0")
        ),
        format!("host-service-via-gateway,{gateway},{service_port}"),
        format!("host-service-via-host-ip,{host_ip},{service_port}"),
        format!("host-ssh,{gateway},22"),
        format!("sibling-task,{sibling_ip},8000"),
        "metadata,169.254.169.254,80".to_owned(),
        // One address of each of IANA's special-purpose ranges beyond the private
        // ones above, and the metadata and host-agent addresses outside them.
        "azure-wireserver,168.63.129.16,80".to_owned(),
        "alibaba-metadata,100.100.100.200,80".to_owned(),
        "ietf-protocol-oci-metadata,192.0.0.192,80".to_owned(),
        "test-net-1,192.0.2.77,80".to_owned(),
        "6to4-relay,192.88.99.1,80".to_owned(),
        "benchmarking,198.18.0.1,80".to_owned(),
        "test-net-2,198.51.100.1,80".to_owned(),
        "test-net-3,203.0.113.1,80".to_owned(),
    ];
    let outcomes = run_hostile(&client, &targets).await;
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

    assert_contained(&outcomes);
    assert_unreachable(&outcomes.network, &targets);
    assert_eq!(
        reached.load(Ordering::SeqCst),
        0,
        "a task reached the host service"
    );
    assert_nothing_left(&stack, &client, disk_before).await;
    stack.shutdown().await;
}

/// A CPU burn of `seconds` of CPU time, then `kill -9 -1`: every process the
/// task's user may signal dies, its prelude among them, and with it the
/// container, before the worker can read what it used at the end.
fn burn_then_kill_init(seconds: u32) -> String {
    format!("python3 -c \"import time\nwhile time.process_time() < {seconds}: pass\"; kill -9 -1")
}

/// A task cannot shed its CPU from its owner's quota by killing its own init:
/// it is charged what it used (the last reading while it ran, plus at most
/// its CPU limit for the time since), marked estimated, and a loop of such
/// tasks is refused once the quota is used.
#[tokio::test]
async fn tasks_that_kill_their_own_init_are_charged_their_cpu_and_held_to_the_quota() {
    let stack = Stack::start(Options {
        // One CPU, so the bound adds little to what the task used.
        extra_env: vec![("TASK_CPUS", "1".into())],
        ..Options::default()
    })
    .await;
    let mut conn = stack.redis_conn().await;
    let record = shared::apikey::ApiKeyRecord {
        name: "burner".into(),
        scopes: shared::apikey::Scopes::ALL,
        limits: shared::apikey::Limits {
            cpu_seconds_per_day: Some(3),
            ..shared::apikey::Limits::default()
        },
        allow_hosts: None,
        created_at: None,
        last_used_at: None,
    };
    let key = store::apikeys::create(&mut conn, &stack.keys(), &record)
        .await
        .expect("create key");
    let client = mcp_client(&stack.url, key.expose())
        .await
        .expect("MCP client connects");
    let burn = 2;
    let mut charged = Vec::new();
    let refusal = loop {
        let args =
            json!({ "runtime": "python3.13", "command_base64": b64(burn_then_kill_init(burn)) });
        let r = call(&client, "run_script", args).await;
        if r["isError"] == json!(true) {
            break r["structuredContent"].clone();
        }
        let task = r["structuredContent"]["task_id"]
            .as_str()
            .expect("task id")
            .to_owned();
        let status = wait_status(
            &client,
            &task,
            "the burner",
            Duration::from_secs(120),
            is_final,
        )
        .await;
        // Its own init killed: the engine's word on the exit is all there is.
        assert_eq!(status["state"], "failed", "{status}");
        assert_eq!(status["exit_code"], 137, "{status}");
        let usage = &status["usage"];
        let cpu = usage["cpu_seconds"].as_f64().unwrap_or(-1.0);
        // At least what it burned; at most that plus one CPU for a tick
        // (250 ms), the CFS slack (200 ms) and the engine's report.
        assert!(
            (f64::from(burn)..f64::from(burn) + 1.0).contains(&cpu),
            "cpu_seconds {cpu}: {status}"
        );
        assert_eq!(usage["estimated"], true, "{status}");
        charged.push((task, cpu));
        assert!(charged.len() <= 3, "never refused: {charged:?}");
    };
    // 2 s and more each, against 3 s a day: the third submit is refused.
    assert_eq!(charged.len(), 2, "{charged:?} then {refusal}");
    assert_eq!(refusal["code"], "quota_exceeded", "{refusal}");
    let message = refusal["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("cpu_seconds_per_day") && message.contains("of 3 allowed"),
        "{message}"
    );
    // What the quota read: the owner's ledger, one entry per task as charged.
    let ledger: Vec<String> =
        redis::AsyncCommands::zrange(&mut conn, stack.keys().owner_cpu("burner"), 0, -1)
            .await
            .expect("zrange");
    let mut expected: Vec<String> = charged
        .iter()
        .map(|(task, cpu)| format!("{task}:{}", (cpu * 1000.0).round() as u64))
        .collect();
    let mut ledger_sorted = ledger.clone();
    ledger_sorted.sort();
    expected.sort();
    assert_eq!(ledger_sorted, expected);
    stack.shutdown().await;
}

/// The worker's metrics page.
async fn metrics_text(url: &str) -> String {
    let resp = reqwest::get(url).await.expect("scrape");
    resp.text().await.expect("metrics text")
}

/// One unlabelled count from a metrics page.
fn sample(text: &str, name: &str) -> Option<u64> {
    exposition::read(text).count(name, &[])
}

/// Free bytes of the file systems under Docker's data and the temporary directory.
fn free_disks() -> (u64, u64) {
    (
        free_bytes("/var/lib/docker"),
        free_bytes(&std::env::temp_dir().display().to_string()),
    )
}

/// A host service listening on every interface, which nothing from a task may
/// reach: its port and a count of the connections it accepted.
async fn host_service() -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0")
        .await
        .expect("listener");
    let port = listener.local_addr().expect("addr").port();
    let reached = Arc::new(AtomicUsize::new(0));
    tokio::spawn({
        let reached = reached.clone();
        async move {
            while listener.accept().await.is_ok() {
                reached.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    (port, reached)
}

/// A sibling task serving on a port, for the prober to try. It prints its
/// address only once it has reached its own server, so the port is open.
/// Returns its id and address.
async fn start_sibling(client: &Client) -> (String, String) {
    let sibling = run(
        client,
        "python3.13",
        SIBLING,
        json!({ "timeout_seconds": 120 }),
    )
    .await;
    let sib = wait_status(
        client,
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
    let ip = sib["stdout_tail"]
        .as_str()
        .and_then(|t| t.split_whitespace().nth(1))
        .unwrap_or_default()
        .to_owned();
    (sibling, ip)
}

/// The task network's gateway and the host's own address, as a task would
/// dial them (the probe tries Redis, the api and a host service through both).
fn gateway_and_host_ip(network: &str) -> (String, String) {
    let gateway = docker_out(&[
        "network",
        "inspect",
        network,
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
    (gateway, host_ip)
}

/// The final statuses of the hostile scripts, run all at once.
struct Outcomes {
    fork_bomb: Value,
    memory: Value,
    disk: Value,
    flood: Value,
    pids: Value,
    privileges: Value,
    network: Value,
}

async fn run_hostile(client: &Client, targets: &[String]) -> Outcomes {
    let probe_cmd = format!(
        "cat > /tmp/probe.py <<'EOF'\n{PROBE}\nEOF\npython3 /tmp/probe.py {}",
        targets.join(" ")
    );
    let t = json!({ "timeout_seconds": 90 });
    let (fork_bomb, memory, disk, flood, pids, privileges, network) = tokio::join!(
        run_to_end(
            client,
            "python3.13",
            // The bomb, then a busy loop of shell builtins (no fork), so the one
            // way this ends is the timeout, whatever the bomb left running.
            "f() { f | f & }; f; while :; do :; done",
            json!({ "timeout_seconds": 8 })
        ),
        run_to_end(
            client,
            "python3.13",
            "python3 -c 'b = bytearray(2 * 1024 ** 3); print(len(b))'",
            t.clone()
        ),
        run_to_end(
            client,
            "python3.13",
            "dd if=/dev/zero of=/workspace/fill bs=1M count=1024",
            t.clone()
        ),
        run_to_end_within(
            client,
            "python3.13",
            "head -c 2147483648 /dev/zero",
            json!({ "timeout_seconds": 600 }),
            Duration::from_secs(600),
        ),
        run_to_end(
            client,
            "python3.13",
            "python3 -c \"import subprocess; ps = [subprocess.Popen(['sleep', '60']) for _ in range(200)]\"",
            t.clone(),
        ),
        run_to_end(client, "python3.13", PRIVILEGES, t.clone()),
        run_to_end(client, "python3.13", &probe_cmd, t.clone()),
    );
    Outcomes {
        fork_bomb,
        memory,
        disk,
        flood,
        pids,
        privileges,
        network,
    }
}

/// Each hostile script ended as its cap says, never by the host.
fn assert_contained(o: &Outcomes) {
    // (what, status, state, reason): the caps named in the reason.
    let capped = [
        // Fork bomb: stopped by the PID cap and the timeout.
        (
            "fork bomb",
            &o.fork_bomb,
            "timed-out",
            "timed out after 8 s",
        ),
        // Memory: 2 GiB asked under a 256 MiB cap.
        (
            "memory",
            &o.memory,
            "failed",
            "out of memory (limit 256 MiB)",
        ),
        // Disk: the workspace is capped at 64 MiB.
        (
            "disk",
            &o.disk,
            "failed",
            "exited with code 1: disk full (workspace limit 64 MiB)",
        ),
        (
            "pids",
            &o.pids,
            "failed",
            "exited with code 1: process limit reached (64 processes)",
        ),
    ];
    for (what, status, state, reason) in capped {
        assert_eq!(status["state"], state, "{what}: {status}");
        assert_eq!(status["reason"], reason, "{what}: {status}");
    }
    // ...and the PID cap is what held the bomb: forks were refused inside.
    let fb_err = o.fork_bomb["stderr_tail"].as_str().unwrap_or_default();
    assert!(
        fb_err.contains("fork"),
        "no fork failure seen: {}",
        o.fork_bomb
    );

    // 2 GiB on stdout: counted in full, kept as a tail, memory bounded.
    let flood = &o.flood;
    assert_eq!(flood["state"], "succeeded", "{flood}");
    assert_eq!(flood["stdout_bytes"], 2_147_483_648u64);
    assert_eq!(flood["stdout_truncated"], true);
    assert_eq!(flood["stdout_tail"].as_str().map(str::len), Some(4096));
    let peak = peak_rss_kib();
    assert!(
        peak < 512 * 1024,
        "worker + api peaked at {peak} KiB while 2 GiB streamed through"
    );

    assert_eq!(
        o.privileges["stdout_tail"],
        "CapEff:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\nnofile=1024\ncore=0 hard=0\n\
         cpu=50000 100000\n\
         memory=268435456 swap=0\nuid=65534\nmount: denied\nunshare: denied\n\
         write-root: denied\nchmod-suid: denied\ndocker-socket: absent\n\
         home, workspace, tmp: writable\n",
        "{}",
        o.privileges
    );
}

/// Every probe was refused, and the route out is still there.
fn assert_unreachable(network: &Value, targets: &[String]) {
    let out = network["stdout_tail"].as_str().unwrap_or_default();
    assert_eq!(network["state"], "succeeded", "{network}");
    for target in targets {
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
}

/// After the suite: service healthy, nothing left behind, host disk untouched
/// (free space within 8 MiB of `before`; only meaningful on a quiet machine).
async fn assert_nothing_left(stack: &Stack, client: &Client, before: (u64, u64)) {
    let health = reqwest::get(format!("{}/healthz", stack.url))
        .await
        .expect("healthz");
    assert_eq!(health.status(), 200);
    let after = run_to_end(client, "python3.13", "echo still-fine", json!({})).await;
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
    let after = free_disks();
    let mib = |a: u64, b: u64| (a as i64 - b as i64).abs() / (1 << 20);
    assert!(
        mib(before.0, after.0) < 8,
        "docker disk moved by {} MiB",
        mib(before.0, after.0)
    );
    assert!(
        mib(before.1, after.1) < 8,
        "tmp disk moved by {} MiB",
        mib(before.1, after.1)
    );
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
