//! The firewall tamper tests: an operator's reload, a flushed chain, a removed
//! jump or an ACCEPT put first in FORWARD, each repaired by the worker before its
//! next task. Each runs with a bridge of its own, alone (scripts/test.sh).

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use script_runner_e2e::*;
use serde_json::json;

use super::{PROBE, assert_unreachable, gateway_and_host_ip, host_service, metrics_text, sample};
/// Runs `iptables -w args` on the host, as an operator (or a firewall reload) would.
fn iptables(args: &[&str]) {
    let out = Command::new("iptables")
        .arg("-w")
        .args(args)
        .output()
        .expect("iptables");
    assert!(
        out.status.success(),
        "iptables {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What the worker logs at warning level and above, in this test process.
#[derive(Clone, Default)]
struct Log(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    fn text(&self) -> String {
        let bytes = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// The tamper test's task network and bridge: the same on every run, so none
/// is left behind per run.
const NETWORK: &str = "script-runner-fwtest";
const BRIDGE: &str = "sr-fwtest0";

/// Tampers with this worker's own chains (its bridge's, which no other worker
/// on the host touches) while it runs.
#[tokio::test]
async fn a_flushed_firewall_or_a_removed_jump_is_reinstalled_before_the_next_task() {
    let log = Log::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .init();
    let metrics_port = free_port();
    let stack = Stack::start(Options {
        concurrency: 1,
        bind_all: true,
        extra_env: vec![
            ("WORKER_METRICS_ADDR", format!("127.0.0.1:{metrics_port}")),
            // Beats (and so checks) 2 s apart, for the last case below.
            ("WORKER_HEARTBEAT_SECONDS", "6".into()),
            // A bridge of its own, so the chains flushed below are this
            // worker's alone (workers on one bridge share its chains).
            ("TASK_NETWORK", NETWORK.into()),
            ("TASK_BRIDGE", BRIDGE.into()),
        ],
        ..Options::default()
    })
    .await;
    let client = stack.client().await;
    let (service_port, reached) = host_service().await;
    let (gateway, host_ip) = gateway_and_host_ip(NETWORK);
    let targets = vec![
        format!("redis-via-gateway,{gateway},{}", stack.redis.port),
        format!("redis-via-host-ip,{host_ip},{}", stack.redis.port),
        format!(
            "api-via-gateway,{gateway},{}",
            stack.url.rsplit(':').next().unwrap_or("0")
        ),
        format!("host-service-via-host-ip,{host_ip},{service_port}"),
        "metadata,169.254.169.254,80".to_owned(),
    ];
    let probe = format!(
        "cat > /tmp/probe.py <<'EOF'\n{PROBE}\nEOF\npython3 /tmp/probe.py {}",
        targets.join(" ")
    );
    let metrics = format!("http://127.0.0.1:{metrics_port}/metrics");
    // A heartbeat's check may land between two tampering commands (two
    // repairs): each tamper must add a repair, not an exact count.
    let scrape = || async {
        let text = metrics_text(&metrics).await;
        assert_eq!(
            sample(&text, "script_runner_worker_firewall_intact"),
            Some(1),
            "{text}"
        );
        sample(&text, "script_runner_worker_firewall_repairs_total")
            .unwrap_or_else(|| panic!("no repairs counter in {text}"))
    };
    let before = scrape().await;

    // A firewall reload that empties both chains.
    let (chain_in, chain_fwd) = (format!("SR-IN-{BRIDGE}"), format!("SR-FWD-{BRIDGE}"));
    iptables(&["-F", &chain_in]);
    iptables(&["-F", &chain_fwd]);
    let status = run_to_end(
        &client,
        "python3.13",
        &probe,
        json!({ "timeout_seconds": 60 }),
    )
    .await;
    assert_unreachable(&status, &targets);
    let after_flush = scrape().await;
    assert!(
        after_flush > before,
        "no repair counted: {before} then {after_flush}"
    );
    let warned = log.text();
    assert!(
        warned.contains("task firewall was missing or altered; reinstalled it")
            && warned.contains(&format!("missing from {chain_in}"))
            && warned.contains(&format!("final RETURN of {chain_fwd} is missing")),
        "{warned}"
    );

    // One that drops the jumps into them instead.
    iptables(&["-D", "INPUT", "-i", BRIDGE, "-j", &chain_in]);
    iptables(&["-D", "DOCKER-USER", "-i", BRIDGE, "-j", &chain_fwd]);
    let status = run_to_end(
        &client,
        "python3.13",
        &probe,
        json!({ "timeout_seconds": 60 }),
    )
    .await;
    assert_unreachable(&status, &targets);
    let after_jumps = scrape().await;
    assert!(
        after_jumps > after_flush,
        "no repair counted: {after_flush} then {after_jumps}"
    );
    let warned = log.text();
    assert!(
        warned.contains(&format!(
            "jump \"-A INPUT -i {BRIDGE} -j {chain_in}\" missing"
        )) && warned.contains(&format!(
            "jump \"-A DOCKER-USER -i {BRIDGE} -j {chain_fwd}\" missing"
        )),
        "{warned}"
    );

    // With no task to start, the next heartbeat puts it back.
    iptables(&["-D", "DOCKER-USER", "-i", BRIDGE, "-j", &chain_fwd]);
    let jump_back = || async {
        tokio::process::Command::new("iptables")
            .args(["-w", "-C", "DOCKER-USER", "-i", BRIDGE, "-j", &chain_fwd])
            .output()
            .await
            .is_ok_and(|o| o.status.success())
    };
    wait_until(
        "a heartbeat to reinstall the jump",
        Duration::from_secs(10),
        || async { (jump_back().await && scrape().await > after_jumps).then_some(()) },
    )
    .await;

    // An IPv6 address on the bridge (a task network with IPv6 on, or a hand):
    // the rules are IPv4 only, so no task starts until it is gone.
    let v6 = V6Address::add("fd00:5352::1/64");
    let status = run_to_end(&client, "python3.13", "echo ran", json!({})).await;
    let intact_while = sample(
        &metrics_text(&metrics).await,
        "script_runner_worker_firewall_intact",
    );
    drop(v6);
    assert_eq!(status["state"], "failed", "{status}");
    let reason = status["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("the task firewall")
            && reason.contains(&format!("bridge {BRIDGE} has IPv6 address fd00:5352::1/64")),
        "{status}"
    );
    assert!(
        !status["stdout_tail"]
            .as_str()
            .unwrap_or_default()
            .contains("ran")
    );
    assert_eq!(intact_while, Some(0), "the firewall counted as intact");
    // Gone again: tasks run, and a task itself has no IPv6 address at all
    // (Docker turns IPv6 off in containers on a network without it).
    let count = "echo v6=$(cat /proc/net/if_inet6 2>/dev/null | wc -l)";
    let status = run_to_end(&client, "python3.13", count, json!({})).await;
    assert_eq!(status["state"], "succeeded", "{status}");
    assert_eq!(status["stdout_tail"], "v6=0\n", "{status}");

    assert_eq!(
        reached.load(Ordering::SeqCst),
        0,
        "a task reached the host service"
    );
    stack.shutdown().await;
}

/// A global IPv6 address on the tamper test's bridge, removed when dropped (a
/// failed assertion must not leave it, or the next run's worker would refuse
/// to start).
struct V6Address(&'static str);

impl V6Address {
    fn add(address: &'static str) -> V6Address {
        let out = Command::new("ip")
            .args(["-6", "addr", "add", address, "dev", BRIDGE])
            .output()
            .expect("ip");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        V6Address(address)
    }
}

impl Drop for V6Address {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["-6", "addr", "del", self.0, "dev", BRIDGE])
            .output();
    }
}

/// The FORWARD tamper test's task network and bridge, its own for the same
/// reason as the test above (and so the two can run side by side).
const FWD_NETWORK: &str = "script-runner-fwdtest";
const FWD_BRIDGE: &str = "sr-fwdtest0";

/// Rules put into `FORWARD` ahead of the worker's, as a hand or Tailscale
/// (`ts-forward`) would: an ACCEPT for the task bridge on top of `FORWARD`,
/// before Docker's jump into `DOCKER-USER`, and a chain that accepts, jumped to
/// on top. Each must be found and put behind the task rules, by the heartbeat's
/// check and by the one before a task; and a `FORWARD` policy of ACCEPT stops
/// the tasks until it is DROP again.
#[tokio::test]
async fn an_accept_put_first_in_forward_is_put_behind_the_task_rules() {
    let log = Log::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .init();
    let metrics_port = free_port();
    let stack = Stack::start(Options {
        concurrency: 1,
        extra_env: vec![
            ("WORKER_METRICS_ADDR", format!("127.0.0.1:{metrics_port}")),
            // Beats (and so checks) 2 s apart.
            ("WORKER_HEARTBEAT_SECONDS", "6".into()),
            ("TASK_NETWORK", FWD_NETWORK.into()),
            ("TASK_BRIDGE", FWD_BRIDGE.into()),
        ],
        ..Options::default()
    })
    .await;
    let client = stack.client().await;
    // Forwarded, not the host's: this machine's network answers TCP on any
    // address, so a task past the rules reaches them.
    let targets = vec![
        "metadata,169.254.169.254,80".to_owned(),
        "private,10.1.2.3,80".to_owned(),
    ];
    let probe = format!(
        "cat > /tmp/probe.py <<'EOF'\n{PROBE}\nEOF\npython3 /tmp/probe.py {}",
        targets.join(" ")
    );
    let metrics = format!("http://127.0.0.1:{metrics_port}/metrics");
    let scrape = || async {
        let text = metrics_text(&metrics).await;
        (
            sample(&text, "script_runner_worker_firewall_intact"),
            sample(&text, "script_runner_worker_firewall_repairs_total")
                .unwrap_or_else(|| panic!("no repairs counter in {text}")),
        )
    };
    let (intact, before) = scrape().await;
    assert_eq!(intact, Some(1));
    let chain_fwd = format!("SR-FWD-{FWD_BRIDGE}");
    let ours = format!("-A FORWARD -i {FWD_BRIDGE} -j {chain_fwd}");

    // An ACCEPT on top of FORWARD, with no task to start: the heartbeat puts
    // the worker's jump back in front of it.
    let accept = Undo::insert(&["-I", "FORWARD", "1", "-i", FWD_BRIDGE, "-j", "ACCEPT"]);
    let accept_rule = format!("-A FORWARD -i {FWD_BRIDGE} -j ACCEPT");
    let repaired = wait_until(
        "a heartbeat to put the jump back in front of the ACCEPT",
        Duration::from_secs(10),
        || async {
            let after = scrape().await.1;
            (comes_before("FORWARD", &ours, &accept_rule) && after > before).then_some(after)
        },
    )
    .await;
    let warned = log.text();
    assert!(
        warned.contains("task firewall was missing or altered; reinstalled it")
            && warned.contains(&format!("{accept_rule:?} comes before jump {ours:?}")),
        "{warned}"
    );
    let status = run_to_end(
        &client,
        "python3.13",
        &probe,
        json!({ "timeout_seconds": 60 }),
    )
    .await;
    assert_unreachable(&status, &targets);
    drop(accept);

    // A chain of another tool's that accepts, jumped to on top of FORWARD right
    // before a task: the check before the task finds it.
    let chain = "SR-TEST-ts-forward";
    let _chain = Undo::chain(chain);
    let jump = Undo::insert(&["-I", "FORWARD", "1", "-i", FWD_BRIDGE, "-j", chain]);
    let status = run_to_end(
        &client,
        "python3.13",
        &probe,
        json!({ "timeout_seconds": 60 }),
    )
    .await;
    assert_unreachable(&status, &targets);
    assert!(comes_before(
        "FORWARD",
        &ours,
        &format!("-A FORWARD -i {FWD_BRIDGE} -j {chain}")
    ));
    assert!(scrape().await.1 > repaired, "no repair counted");
    drop(jump);

    // FORWARD's policy is the host's: the worker does not change it, and takes
    // no task while it is ACCEPT (the heartbeat finds it).
    let policy = Undo::policy_accept();
    wait_until(
        "a heartbeat to find the policy and stop taking tasks",
        Duration::from_secs(10),
        || async { (scrape().await.0 == Some(0)).then_some(()) },
    )
    .await;
    let refused = "task firewall is not in place; no task starts until it is";
    let warned = log.text();
    assert!(
        warned.contains(refused)
            && warned.contains("the FORWARD chain's policy is ACCEPT, not DROP"),
        "{warned}"
    );
    assert_eq!(forward_policy(), "ACCEPT", "the worker changed the policy");
    // Its clock in ms: the container's is the host's.
    let task = run(&client, "python3.13", "date +%s%3N", json!({})).await;
    let restored_ms = {
        drop(policy);
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis()
    };
    let status = wait_status(
        &client,
        &task,
        "the task, once the policy is DROP again",
        Duration::from_secs(60),
        is_final,
    )
    .await;
    assert_eq!(status["state"], "succeeded", "{status}");
    let ran_ms: u128 = status["stdout_tail"]
        .as_str()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no time in {status}"));
    assert!(
        ran_ms >= restored_ms,
        "the task ran {} ms before the policy was DROP again",
        restored_ms - ran_ms
    );
    assert_eq!(scrape().await.0, Some(1));
    stack.shutdown().await;
}

/// `FORWARD`'s policy on the host.
fn forward_policy() -> String {
    let out = Command::new("iptables")
        .args(["-w", "-S", "FORWARD"])
        .output()
        .expect("iptables");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("-P FORWARD "))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// Whether `first` is in `chain` and ahead of `then` (or `then` is gone).
fn comes_before(chain: &str, first: &str, then: &str) -> bool {
    let out = Command::new("iptables")
        .args(["-w", "-S", chain])
        .output()
        .expect("iptables");
    let rules: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_owned())
        .collect();
    let at = |r: &str| rules.iter().position(|l| l == r);
    match (at(first), at(then)) {
        (Some(a), Some(b)) => a < b,
        (Some(_), None) => true,
        _ => false,
    }
}

/// A change to the host's rules, undone when dropped (a failed assertion must
/// not leave an ACCEPT behind).
struct Undo(Vec<Vec<String>>);

impl Undo {
    /// `iptables -I <chain> 1 <rule>`; deleted again.
    fn insert(args: &[&str]) -> Undo {
        iptables(args);
        let mut delete: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        delete[0] = "-D".into();
        delete.remove(2);
        Undo(vec![delete])
    }

    /// A chain that accepts everything; flushed and removed again.
    fn chain(name: &str) -> Undo {
        let _ = Command::new("iptables").args(["-w", "-N", name]).output();
        iptables(&["-F", name]);
        iptables(&["-A", name, "-j", "ACCEPT"]);
        Undo(vec![
            vec!["-F".into(), name.into()],
            vec!["-X".into(), name.into()],
        ])
    }

    /// FORWARD's policy ACCEPT; DROP again (the worker refuses to start under
    /// any other, so it was DROP before).
    fn policy_accept() -> Undo {
        iptables(&["-P", "FORWARD", "ACCEPT"]);
        Undo(vec![vec!["-P".into(), "FORWARD".into(), "DROP".into()]])
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        for args in &self.0 {
            let _ = Command::new("iptables").arg("-w").args(args).output();
        }
    }
}
