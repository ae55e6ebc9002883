//! Clients told apart behind a proxy: by the hop a trusted proxy appended to
//! `X-Forwarded-For` (anyone else's is ignored), and through Caddy, the
//! deployment's proxy, each with its own share.

use std::net::SocketAddr;
use std::time::Duration;

use testkit::process::ApiProcess;
use testkit::*;

use crate::wire::*;

#[tokio::test]
async fn behind_a_trusted_proxy_clients_are_told_apart_by_the_hop_it_appended() {
    let redis = Redis::start().await;
    let proxy = loopback(8);
    let api = ApiProcess::start(
        &redis.url(),
        &[
            ("TRUSTED_PROXIES", "127.0.0.8/32, 10.0.0.0/8"),
            // One spare for a connection the api has not yet seen close.
            ("MAX_CONNECTIONS_PER_CLIENT", "3"),
            ("MAX_REQUESTS_PER_CLIENT", "1"),
        ],
    )
    .await;
    // The proxy appended 203.0.113.1; the client wrote the first entry itself.
    let same_client = tools_list("X-Forwarded-For: 203.0.113.1\r\n");
    let (held, refused) = hold_until_refused(
        proxy,
        api.addr,
        1,
        "X-Forwarded-For: 6.6.6.6, 203.0.113.1\r\n",
        &same_client,
    )
    .await;
    assert_client_refused(&refused, "MAX_REQUESTS_PER_CLIENT");
    // Other clients through the same proxy, on its fourth connection (more than
    // MAX_CONNECTIONS_PER_CLIENT: a trusted proxy's are not capped).
    let mut extra = Vec::new();
    for hop in ["203.0.113.8", "203.0.113.9"] {
        let line = format!("X-Forwarded-For: {hop}\r\n");
        extra.push(hold_request(proxy, api.addr, &line).await);
    }
    let answer = exchange_from(
        proxy,
        api.addr,
        &tools_list("X-Forwarded-For: 6.6.6.6, 203.0.113.2\r\n"),
    )
    .await;
    assert_served(&answer);
    // The client the proxy named with the first entry was never counted.
    let answer = exchange_from(proxy, api.addr, &tools_list("X-Forwarded-For: 6.6.6.6\r\n")).await;
    assert_served(&answer);
    // Anyone else's X-Forwarded-For is ignored: this peer is one client,
    // whatever it claims.
    let direct = loopback(9);
    let (spoofing, refused) = hold_until_refused(
        direct,
        api.addr,
        1,
        "X-Forwarded-For: 203.0.113.3\r\n",
        &tools_list("X-Forwarded-For: 203.0.113.4\r\n"),
    )
    .await;
    assert_client_refused(&refused, "MAX_REQUESTS_PER_CLIENT");
    for s in extra.into_iter().chain(held) {
        assert_eq!(status_of(&finish_held(s).await), Some(200));
    }
    // A client that goes away mid-request gives its place back.
    drop(spoofing);
    wait_until(
        "the place of a request whose client left to come back",
        Duration::from_secs(10),
        || async {
            let answer = exchange_from(direct, api.addr, &tools_list("")).await;
            (status_of(&answer) == Some(200)).then_some(())
        },
    )
    .await;
    let answer = exchange_from(proxy, api.addr, &same_client).await;
    assert_served(&answer);
}

/// Caddy (the deployment's proxy) in front of the api, as the deployment's
/// `Caddyfile` proxies it but over plain HTTP on a local port.
struct Caddy {
    child: std::process::Child,
    addr: SocketAddr,
    url: String,
    dir: std::path::PathBuf,
}

impl Caddy {
    async fn start(upstream: SocketAddr) -> Caddy {
        let dir = std::env::temp_dir().join(format!("sr-caddy-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("caddy dir");
        let port = free_port();
        let config = dir.join("Caddyfile");
        std::fs::write(
            &config,
            format!(
                "{{\n\tadmin off\n\tauto_https off\n}}\nhttp://127.0.0.1:{port} {{\n\t\
                 reverse_proxy {upstream} {{\n\t\tflush_interval -1\n\t\t\
                 transport http {{\n\t\t\tkeepalive 5s\n\t\t}}\n\t}}\n}}\n"
            ),
        )
        .expect("Caddyfile");
        let log = std::fs::File::create(dir.join("caddy.log")).expect("caddy log");
        let child = std::process::Command::new("caddy")
            .args(["run", "--adapter", "caddyfile", "--config"])
            .arg(&config)
            .env("XDG_DATA_HOME", dir.join("data"))
            .env("XDG_CONFIG_HOME", dir.join("config"))
            .stdout(log.try_clone().expect("caddy log"))
            .stderr(log)
            .spawn()
            .expect("caddy runs (scripts/test.sh installs it)");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let url = format!("http://{addr}");
        let caddy = Caddy {
            child,
            addr,
            url,
            dir,
        };
        let health = format!("{}/healthz", caddy.url);
        wait_until(
            "caddy to proxy /healthz",
            Duration::from_secs(30),
            || async {
                let r = reqwest::get(&health).await.ok()?;
                (r.status() == 200).then_some(())
            },
        )
        .await;
        caddy
    }
}

impl Drop for Caddy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn through_caddy_each_client_is_told_apart_and_has_its_own_share() {
    let redis = Redis::start().await;
    let api = ApiProcess::start(
        &redis.url(),
        &[
            ("TRUSTED_PROXIES", "127.0.0.1"),
            ("MAX_REQUESTS_PER_CLIENT", "1"),
        ],
    )
    .await;
    let caddy = Caddy::start(api.addr).await;
    let (greedy, other) = (loopback(10), loopback(11));
    let (held, refused) = hold_until_refused(greedy, caddy.addr, 1, "", &tools_list("")).await;
    assert_client_refused(&refused, "MAX_REQUESTS_PER_CLIENT");
    // Caddy's connections all come from 127.0.0.1, yet the other client has
    // its own share: the api counts the address Caddy names.
    a_real_client_is_served_from(&caddy.url, other).await;
    // Claiming to be the other client does not help: Caddy replaces the
    // header with the address it sees.
    let spoofed = tools_list(&format!("X-Forwarded-For: {other}\r\n"));
    let answer = exchange_from(greedy, caddy.addr, &spoofed).await;
    assert_client_refused(&answer, "MAX_REQUESTS_PER_CLIENT");
    for h in held {
        assert_eq!(status_of(&finish_held(h).await), Some(200));
    }
    a_real_client_is_served_from(&caddy.url, greedy).await;
}
