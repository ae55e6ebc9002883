//! Allow-list egress (issue 20): a task run with `network: {"allow": [...]}`
//! reaches its hosts through the worker's egress proxy and nothing else. Real
//! proxy, real containers, real Redis and rmcp client. The "public" hosts are
//! a local server (tests/egress/server.py) that the worker treats as public
//! through the resolver this test gives it (`egress::Resolver::Fixed`), which
//! no variable can set.

use std::io::BufRead;
use std::process::{Child, Command, Stdio};

use script_runner_e2e::*;
use script_runner_worker::egress::{FixedHosts, Resolver};
use serde_json::{Value, json};

/// Where the stand-in internet listens.
const LOCAL: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// The stand-in internet: its ports and the CA its certificate is from.
struct Server {
    child: Child,
    http: u16,
    https: u16,
    ca: String,
}

impl Server {
    fn start() -> Server {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/egress/server.py");
        let mut child = Command::new("python3")
            .arg(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start tests/egress/server.py");
        let out = child.stdout.take().expect("stdout");
        let mut line = String::new();
        std::io::BufReader::new(out)
            .read_line(&mut line)
            .expect("server's first line");
        let v: Value = serde_json::from_str(&line).expect("server's JSON line");
        let port = |k: &str| v[k].as_u64().expect("port") as u16;
        Server {
            http: port("http"),
            https: port("https"),
            ca: v["ca"].as_str().expect("ca").to_owned(),
            child,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

/// A stack whose worker treats the local server as pkgs.test and other.test
/// (public) and rebind.test (at 127.0.0.2: private, as DNS rebinding would
/// make it), with the server's ports open through the proxy.
async fn stack(server: &Server) -> Stack {
    stack_with(server, Vec::new()).await
}

/// `stack`, with `extra` variables for the api and the workers.
async fn stack_with(server: &Server, extra: Vec<(&'static str, String)>) -> Stack {
    Stack::start(Options {
        concurrency: 3,
        egress_resolver: Resolver::Fixed(
            FixedHosts::default()
                .answer("pkgs.test", &[LOCAL])
                .answer("other.test", &[LOCAL])
                .answer("rebind.test", &["127.0.0.2".parse().expect("address")])
                .public(LOCAL.into()),
        ),
        extra_env: [(
            "EGRESS_PORTS",
            format!("80,443,{},{}", server.http, server.https),
        )]
        .into_iter()
        .chain(extra)
        .collect(),
        ..Options::default()
    })
    .await
}

/// A Python probe run as an allow-list task: `fetch(url)` prints
/// `OK <body>` or `ERR <what failed>`; the task's stdout is returned with
/// its final status.
async fn probe(client: &Client, server: &Server, allow: &[&str], body: &str) -> Value {
    let script = format!(
        r#"python3 - <<'PY'
import os, socket, ssl, sys, urllib.request
open('/tmp/ca.pem', 'w').write(os.environ['CA_PEM'])
CTX = ssl.create_default_context(cafile='/tmp/ca.pem')
HTTP, HTTPS = {http}, {https}
def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=10, context=CTX if url.startswith('https') else None) as r:
            print('OK', r.read().decode().strip())
    except Exception as e:
        print('ERR', type(e).__name__, str(e).replace(chr(10), ' ')[:300])
{body}
PY"#,
        http = server.http,
        https = server.https,
    );
    let env = json!({ "CA_PEM": server.ca });
    let s = run_to_end(
        client,
        "python3.13",
        &script,
        json!({ "network": { "allow": allow }, "env": env, "timeout_seconds": 60 }),
    )
    .await;
    assert_eq!(s["state"], "succeeded", "{s}");
    s
}

fn lines(s: &Value) -> Vec<String> {
    s["stdout_tail"]
        .as_str()
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn attempt<'a>(s: &'a Value, host: &str, verdict: &str) -> Option<&'a Value> {
    s["egress"]["attempts"]
        .as_array()?
        .iter()
        .find(|a| a["host"] == host && a["verdict"] == verdict)
}

/// The log's count and bytes in for `host` and `verdict`, over all ports.
fn totals(s: &Value, host: &str, verdict: &str) -> (u64, u64) {
    let lines = s["egress"]["attempts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    lines
        .iter()
        .filter(|a| a["host"] == host && a["verdict"] == verdict)
        .fold((0, 0), |(c, b), a| {
            (
                c + a["count"].as_u64().unwrap_or(0),
                b + a["bytes_in"].as_u64().unwrap_or(0),
            )
        })
}

#[tokio::test]
async fn an_allowed_host_is_reached_over_http_and_https_and_the_rest_is_refused() {
    let server = Server::start();
    let stack = stack(&server).await;
    let client = stack.client().await;
    let s = probe(
        &client,
        &server,
        &["pkgs.test"],
        r#"
fetch(f'http://pkgs.test:{HTTP}/hello')
fetch(f'https://pkgs.test:{HTTPS}/hello')
fetch(f'http://other.test:{HTTP}/hello')
fetch(f'https://other.test:{HTTPS}/hello')
fetch(f'https://pkgs.test:22/hello')
print('VARS', os.environ.get('HTTPS_PROXY', '-'), os.environ.get('no_proxy', '-'))
# Domain fronting: a tunnel to the allowed host, then TLS naming another
# (the server's certificate covers both, so only the proxy can refuse it).
ph, pp = os.environ['HTTPS_PROXY'].split('//')[1].split(':')
raw = socket.create_connection((ph, int(pp)), timeout=10)
raw.sendall(f'CONNECT pkgs.test:{HTTPS} HTTP/1.1\r\nHost: pkgs.test:{HTTPS}\r\n\r\n'.encode())
print('CONNECT', raw.recv(4096).split(b'\r\n')[0].decode())
try:
    t = CTX.wrap_socket(raw, server_hostname='other.test')
    t.sendall(b'GET /hello HTTP/1.0\r\nHost: other.test\r\n\r\n')
    print('FRONTED', t.recv(4096).decode().split('\r\n')[-1].strip())
except Exception as e:
    print('FRONTED ERR', type(e).__name__)
# Fronting over plain HTTP: the allowed host in the URL, another in Host.
req = urllib.request.Request(f'http://pkgs.test:{HTTP}/hello', headers={'Host': 'other.test'})
print('HOST', urllib.request.urlopen(req, timeout=10).read().decode().strip())
# A tunnel that does not carry TLS.
raw = socket.create_connection((ph, int(pp)), timeout=10)
raw.sendall(f'CONNECT pkgs.test:{HTTP} HTTP/1.1\r\nHost: pkgs.test:{HTTP}\r\n\r\n'.encode())
raw.recv(4096)
raw.sendall(b'GET /hello HTTP/1.0\r\nHost: pkgs.test\r\n\r\n')
print('PLAIN', raw.recv(4096).decode().split('\r\n')[-1].strip() or 'closed')
"#,
    )
    .await;
    let out = lines(&s);
    assert_eq!(out[0], "OK hello from pkgs.test", "{s}");
    assert_eq!(out[1], "OK hello from pkgs.test", "{s}");
    // Plain HTTP: the proxy's own 403, naming the host and why.
    assert!(
        out[2].starts_with("ERR HTTPError") && out[2].contains("403"),
        "{s}"
    );
    // HTTPS: the CONNECT is refused.
    assert!(out[3].starts_with("ERR") && out[3].contains("403"), "{s}");
    // A port the proxy does not open, on the allowed host.
    assert!(out[4].starts_with("ERR") && out[4].contains("403"), "{s}");
    assert!(
        out[5].starts_with("VARS http://") && out[5].ends_with("localhost,127.0.0.1,::1"),
        "{s}"
    );
    // Domain fronting over TLS: the tunnel opens (the host is allowed), but
    // the TLS server name is not, so nothing reaches the host.
    assert!(out[6].starts_with("CONNECT HTTP/1.1 200"), "{s}");
    assert!(out[7].starts_with("FRONTED ERR"), "{s}");
    assert!(attempt(&s, "other.test", "server_name").is_some(), "{s}");
    // Over plain HTTP: the host sent on is the one checked, whatever Host
    // the task wrote.
    assert_eq!(out[8], "HOST hello from pkgs.test", "{s}");
    // A tunnel carries TLS only.
    assert_eq!(out[9], "PLAIN closed", "{s}");
    assert!(attempt(&s, "pkgs.test", "not_tls").is_some(), "{s}");

    // The record: each host asked for, allowed or refused, with bytes.
    assert_eq!(s["egress"]["allow"], json!(["pkgs.test"]), "{s}");
    let (count, bytes_in) = totals(&s, "pkgs.test", "allowed");
    assert_eq!(count, 3, "{s}");
    assert!(bytes_in > 0, "{s}");
    assert_eq!(totals(&s, "other.test", "not_allowed").0, 2, "{s}");
    assert_eq!(s["egress"]["dropped_bytes_in"], 0, "{s}");
    let port = attempt(&s, "pkgs.test", "port").expect("port line");
    assert_eq!(port["port"], 22, "{s}");
    stack.shutdown().await;
}

#[tokio::test]
async fn direct_connections_dns_and_rebinding_are_refused() {
    let server = Server::start();
    let stack = stack(&server).await;
    let client = stack.client().await;
    let s = probe(
        &client,
        &server,
        &["pkgs.test", "rebind.test"],
        r#"
import subprocess, struct
proxy_host = os.environ['HTTP_PROXY'].split('//')[1].split(':')[0]
def connect(addr, port):
    s = socket.socket(); s.settimeout(5)
    try:
        s.connect((addr, port)); print('OPEN', addr, port)
    except Exception as e:
        print('CLOSED', addr, port, type(e).__name__)
# The local server's own ports on this host, bypassing the proxy, and a
# public address.
connect(proxy_host, HTTP)
connect(proxy_host, HTTPS)
connect('1.1.1.1', 443)
# DNS: every name fails, by the resolver and by hand over UDP and TCP.
for name in ['pkgs.test', 'pypi.org']:
    try:
        r = subprocess.run(['getent', 'hosts', name], capture_output=True, timeout=10)
        print('GETENT', name, r.returncode)
    except subprocess.TimeoutExpired:
        print('GETENT', name, 'timeout')
query = struct.pack('>HHHHHH', 0x1234, 0x0100, 1, 0, 0, 0) + b'\x07example\x03com\x00\x00\x01\x00\x01'
servers = [proxy_host, '127.0.0.11', '1.1.1.1', '8.8.8.8'] + [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')]
for ns in servers:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(2)
    try:
        u.sendto(query, (ns, 53)); data = u.recv(512)
        print('UDP53', ns, 'REPLY', struct.unpack('>H', data[6:8])[0])
    except Exception as e:
        print('UDP53', ns, 'FAILED')
    t = socket.socket(); t.settimeout(2)
    try:
        t.connect((ns, 53)); t.sendall(struct.pack('>H', len(query)) + query); data = t.recv(514)
        print('TCP53', ns, 'REPLY', struct.unpack('>H', data[8:10])[0] if len(data) >= 10 else 0)
    except Exception as e:
        print('TCP53', ns, 'FAILED')
# Rebinding: an allowed name that resolves to a private address.
fetch(f'http://rebind.test:{HTTP}/hello')
fetch(f'https://rebind.test:{HTTPS}/hello')
"#,
    )
    .await;
    let out = lines(&s);
    for l in &out {
        assert!(
            !l.starts_with("OPEN"),
            "a direct connection got through: {l}\n{s}"
        );
        // No DNS server outside the container is reached at all (a query
        // that arrives has already carried its data out, answered or not).
        // Docker's own, inside the container, may reply, but with nothing.
        if l.starts_with("UDP53") || l.starts_with("TCP53") {
            let inside = l.contains(" 127.0.0.11 ");
            assert!(
                l.ends_with("FAILED") || (inside && l.ends_with("REPLY 0")),
                "a DNS server was reached: {l}\n{s}"
            );
        }
        if l.starts_with("GETENT") {
            assert!(!l.ends_with(" 0"), "a name resolved: {l}\n{s}");
        }
    }
    assert_eq!(
        out.iter().filter(|l| l.starts_with("CLOSED")).count(),
        3,
        "{s}"
    );
    assert!(
        out.iter().filter(|l| l.starts_with("UDP53")).count() >= 4,
        "{s}"
    );
    let rebind: Vec<&String> = out.iter().filter(|l| l.starts_with("ERR")).collect();
    assert_eq!(rebind.len(), 2, "{s}");
    assert!(rebind.iter().all(|l| l.contains("403")), "{s}");
    assert_eq!(totals(&s, "rebind.test", "private_address").0, 2, "{s}");
    stack.shutdown().await;
}

#[tokio::test]
async fn two_concurrent_tasks_each_get_only_their_own_list() {
    let server = Server::start();
    let stack = stack(&server).await;
    let client = stack.client().await;
    // Each fetches both hosts for a few seconds, so the two run side by side.
    let body = r#"
import time
end = time.time() + 4
while time.time() < end:
    for h in ['pkgs.test', 'other.test']:
        fetch(f'https://{h}:{HTTPS}/hello')
    time.sleep(0.5)
"#;
    let (a, b) = tokio::join!(
        probe(&client, &server, &["pkgs.test"], body),
        probe(&client, &server, &["other.test"], body),
    );
    let (sa, fa) = (a["started_at"].as_str(), a["finished_at"].as_str());
    let (sb, fb) = (b["started_at"].as_str(), b["finished_at"].as_str());
    assert!(sa < fb && sb < fa, "the two did not overlap: {a}\n{b}");
    for (s, mine, theirs) in [
        (&a, "pkgs.test", "other.test"),
        (&b, "other.test", "pkgs.test"),
    ] {
        let out = lines(s);
        assert!(
            out.iter().any(|l| l == &format!("OK hello from {mine}")),
            "{s}"
        );
        assert!(
            !out.iter()
                .any(|l| l.contains(&format!("hello from {theirs}"))),
            "{s}"
        );
        assert!(attempt(s, theirs, "not_allowed").is_some(), "{s}");
        assert!(attempt(s, theirs, "allowed").is_none(), "{s}");
    }
    stack.shutdown().await;
}

#[tokio::test]
async fn pip_and_npm_install_through_the_allow_list() {
    let server = Server::start();
    let stack = stack(&server).await;
    let client = stack.client().await;
    let pip = format!(
        "printf '%s' \"$CA_PEM\" > /tmp/ca.pem && pip install --user --no-cache-dir --cert /tmp/ca.pem \
         --index-url https://pkgs.test:{}/simple/ srdemo && python3 -c 'import srdemo; print(\"value\", srdemo.VALUE)'",
        server.https
    );
    let s = run_to_end(
        &client,
        "python3.13",
        &pip,
        json!({ "network": { "allow": ["pkgs.test"] }, "env": { "CA_PEM": server.ca }, "timeout_seconds": 120 }),
    )
    .await;
    assert_eq!(s["state"], "succeeded", "{s}");
    assert!(
        s["stdout_tail"]
            .as_str()
            .unwrap_or_default()
            .contains("value 42"),
        "{s}"
    );
    assert!(attempt(&s, "pkgs.test", "allowed").is_some(), "{s}");

    // npm, then Node's own fetch over HTTPS (with the flag that makes it read
    // the proxy variables, as docs/egress.md says).
    let npm = format!(
        "npm install --no-audit --no-fund --registry http://pkgs.test:{}/ srdemo && node -e 'console.log(\"value\", require(\"srdemo\"))' \
         && printf '%s' \"$CA_PEM\" > /tmp/ca.pem && NODE_USE_ENV_PROXY=1 NODE_EXTRA_CA_CERTS=/tmp/ca.pem \
         node -e 'fetch(\"https://pkgs.test:{}/hello\").then(r => r.text()).then(t => console.log(\"fetch\", t.trim()))'",
        server.http, server.https
    );
    let s = run_to_end(
        &client,
        "node24",
        &npm,
        json!({ "network": { "allow": ["pkgs.test"] }, "env": { "CA_PEM": server.ca }, "timeout_seconds": 120 }),
    )
    .await;
    assert_eq!(s["state"], "succeeded", "{s}");
    let out = s["stdout_tail"].as_str().unwrap_or_default();
    assert!(out.contains("value 42"), "{s}");
    assert!(out.contains("fetch hello from pkgs.test"), "{s}");
    stack.shutdown().await;
}

#[tokio::test]
async fn a_bad_allow_list_is_refused_naming_the_entry() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    for (allow, named) in [
        (json!(["pypi.org", "10.0.0.1"]), "10.0.0.1"),
        (json!(["*"]), "\"*\""),
        (json!(["bad name.org"]), "bad name.org"),
    ] {
        let args = json!({
            "runtime": "python3.13",
            "command_base64": b64("true"),
            "network": { "allow": allow },
        });
        let e = call_err(&client, "run_script", args).await;
        assert!(e.contains(named), "{e}");
    }
    assert_no_task_created(&stack).await;
    stack.shutdown().await;
}

#[tokio::test]
async fn a_key_limited_to_some_policies_is_refused_the_others() {
    let stack = Stack::start(Options::default()).await;
    let mut conn = stack.redis_conn().await;
    let record = shared::apikey::ApiKeyRecord {
        name: "agent".into(),
        scopes: shared::apikey::Scopes::ALL,
        limits: shared::apikey::Limits {
            networks: shared::options::Networks::parse("none,allow").ok(),
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
    let args = |network: Value| json!({ "runtime": "python3.13", "command_base64": b64("true"), "network": network });
    // Asked for, or the operator's default (internet): refused, naming what is allowed.
    let e = call_err(&client, "run_script", args(json!("internet"))).await;
    assert!(
        e.contains("\"internet\"") && e.contains("none,allow"),
        "{e}"
    );
    let mut no_network = args(json!("none"));
    no_network.as_object_mut().map(|a| a.remove("network"));
    let e = call_err(&client, "run_script", no_network).await;
    assert!(e.contains("\"internet\""), "{e}");
    assert_no_task_created(&stack).await;
    // What it may use runs.
    let s = run_to_end(&client, "python3.13", "true", json!({ "network": "none" })).await;
    assert_eq!(s["state"], "succeeded", "{s}");
    stack.shutdown().await;
}

#[tokio::test]
async fn an_allow_list_outside_a_ceiling_is_refused_naming_the_entry_and_the_ceiling() {
    // The operator's ceiling for every task, and a key's own inside it.
    let server = Server::start();
    let stack = stack_with(
        &server,
        vec![(
            "EGRESS_ALLOW_HOSTS",
            "pkgs.test,other.test,*.pythonhosted.org".into(),
        )],
    )
    .await;
    let mut conn = stack.redis_conn().await;
    let record = shared::apikey::ApiKeyRecord {
        name: "confined".into(),
        scopes: shared::apikey::Scopes::ALL,
        limits: shared::apikey::Limits {
            networks: shared::options::Networks::parse("none,allow").ok(),
            ..shared::apikey::Limits::default()
        },
        allow_hosts: shared::egress::AllowList::parse(&["pkgs.test"]).ok(),
        created_at: None,
        last_used_at: None,
    };
    let key = store::apikeys::create(&mut conn, &stack.keys(), &record)
        .await
        .expect("create key");
    let confined = mcp_client(&stack.url, key.expose())
        .await
        .expect("MCP client connects");
    let admin = stack.client().await;
    let asking = |allow: Value| json!({ "runtime": "python3.13", "command_base64": b64("true"), "network": { "allow": allow } });
    // Outside the operator's ceiling, for the admin too.
    let e = call_err(
        &admin,
        "run_script",
        asking(json!(["pkgs.test", "attacker.example"])),
    )
    .await;
    assert!(
        e.contains("\"attacker.example\"")
            && e.contains("EGRESS_ALLOW_HOSTS")
            && e.contains("pkgs.test, other.test, *.pythonhosted.org"),
        "{e}"
    );
    // Inside the operator's, outside the key's: both named.
    for (allow, entry) in [
        (json!(["other.test"]), "\"other.test\""),
        (
            json!(["pkgs.test", "files.pythonhosted.org"]),
            "\"files.pythonhosted.org\"",
        ),
    ] {
        let e = call_err(&confined, "run_script", asking(allow)).await;
        assert!(
            e.contains(entry) && e.contains("--allow-hosts") && e.contains("pkgs.test"),
            "{e}"
        );
    }
    // Every name under a public suffix belongs to whoever registers one.
    let e = call_err(&admin, "run_script", asking(json!(["*.github.io"]))).await;
    assert!(
        e.contains("public suffix") && e.contains("*.github.io"),
        "{e}"
    );
    assert_no_task_created(&stack).await;

    // What both allow runs, and reaches its host.
    let s = probe(
        &confined,
        &server,
        &["pkgs.test"],
        "fetch(f'http://pkgs.test:{HTTP}/hello')",
    )
    .await;
    assert!(lines(&s).iter().any(|l| l.starts_with("OK")), "{s}");
    stack.shutdown().await;
}

/// Allow-list tasks start warm (`EGRESS_POOL_SIZE`): a container made ahead
/// of time on the egress network, whose proxy lease is taken at the claim by
/// the address it was given. Each reaches its own list's hosts and no other,
/// the pool refills with a new container, and a task never runs in the task
/// bridge's pool (which is off here, so every warm claim is the egress pool's).
#[tokio::test]
async fn allow_list_tasks_start_in_the_egress_pool_each_with_its_own_list() {
    let server = Server::start();
    let metrics_port = free_port();
    let stack = stack_with(
        &server,
        vec![
            ("POOL_SIZE", "0".into()),
            ("EGRESS_POOL_SIZE", "python3.13=1".into()),
            ("WORKER_METRICS_ADDR", format!("127.0.0.1:{metrics_port}")),
        ],
    )
    .await;
    let client = stack.client().await;
    let idle = || pool_containers_on(&stack.worker_name, "python3.13", "allow");
    let warm_claims = || async {
        let text = worker_metrics(metrics_port).await;
        let read = exposition::read(&text);
        let n = |path| {
            read.count("script_runner_worker_pool_claims_total", &[("path", path)])
                .unwrap_or(0)
        };
        (n("warm"), n("cold") + n("fallback"))
    };
    let body = r#"
fetch(f'https://pkgs.test:{HTTPS}/hello')
fetch(f'https://other.test:{HTTPS}/hello')
"#;
    let mut seen = Vec::new();
    for (round, (mine, theirs)) in [("pkgs.test", "other.test"), ("other.test", "pkgs.test")]
        .into_iter()
        .enumerate()
    {
        let waiting = wait_until(
            "an idle container in the egress pool",
            std::time::Duration::from_secs(90),
            || async {
                let ids = idle();
                (ids.len() == 1 && !seen.contains(&ids[0])).then(|| ids[0].clone())
            },
        )
        .await;
        let s = probe(&client, &server, &[mine], body).await;
        let out = lines(&s);
        let (ok, refused) = if mine == "pkgs.test" { (0, 1) } else { (1, 0) };
        assert_eq!(out[ok], format!("OK hello from {mine}"), "{s}");
        assert!(
            out[refused].starts_with("ERR") && out[refused].contains("403"),
            "{s}"
        );
        assert!(attempt(&s, theirs, "not_allowed").is_some(), "{s}");
        // It ran in the container that was waiting: claimed warm, and gone.
        assert_eq!(warm_claims().await, (round as u64 + 1, 0), "{s}");
        seen.push(waiting);
    }
    stack.shutdown().await;
}
