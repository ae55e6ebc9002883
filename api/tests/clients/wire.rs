//! Raw HTTP/1.1 at the api, as a hostile client speaks it: requests written by
//! hand on sockets bound to chosen loopback addresses, answers read and taken
//! apart, and the checks every test makes of a refusal.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use script_runner_api::config::needed_request_bytes;
use serde_json::{Value, json};
use testkit::process::ApiProcess;
use testkit::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const ACCEPT: &str = "application/json, text/event-stream";
pub const TOOLS_LIST: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;

/// A real MCP client is served: run_script queues a task, get_task_status finds it.
pub async fn a_real_client_is_served(url: &str) {
    a_real_client_is_served_from(url, LOCALHOST).await;
}

pub const LOCALHOST: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// 127.0.0.`n`: on Linux the whole of 127/8 is the loopback interface, so each
/// such address is another client as the api sees it.
pub fn loopback(n: u8) -> IpAddr {
    IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, n))
}

/// `a_real_client_is_served`, the client's connections made from `local`.
pub async fn a_real_client_is_served_from(url: &str, local: IpAddr) {
    let client = mcp_client_from(url, TOKEN, local)
        .await
        .expect("the real client connects");
    let out = call_ok(
        &client,
        "run_script",
        json!({ "runtime": "python3.13", "command_base64": b64("true") }),
    )
    .await;
    assert_eq!(out["state"], "queued");
    let id = out["task_id"].as_str().expect("task_id");
    assert_eq!(status(&client, id).await["state"], "queued");
    let _ = client.cancel().await;
}

/// POSTs `body` to /mcp with the token and the headers the transport asks for.
pub async fn post(url: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{url}/mcp"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .header("accept", ACCEPT)
        .body(body)
        .send()
        .await
        .expect("request");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// The head of a `POST /mcp` with the token (or not) and `extra` header lines.
pub fn head(authed: bool, extra: &str) -> String {
    let auth = if authed {
        format!("Authorization: Bearer {TOKEN}\r\n")
    } else {
        String::new()
    };
    format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\n\
         Accept: {ACCEPT}\r\n{extra}\r\n"
    )
}

/// Reads what the server sends until it closes the connection, for at most
/// `deadline`. Panics on a timeout: the server must answer and close.
pub async fn read_until_closed(
    stream: &mut (impl AsyncReadExt + Unpin),
    deadline: Duration,
) -> Vec<u8> {
    let mut buf = Vec::new();
    let read = tokio::time::timeout(deadline, async {
        let mut chunk = [0u8; 8192];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "the server neither answered nor closed within {deadline:?}"
    );
    buf
}

/// Reads one HTTP answer: until its head and `Content-Length` bytes of body
/// are in, or the server closes. Panics past `deadline`.
pub async fn read_response(
    stream: &mut (impl AsyncReadExt + Unpin),
    deadline: Duration,
) -> Vec<u8> {
    let mut buf = Vec::new();
    let complete = |buf: &[u8]| {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            return false;
        };
        let length = header_of(buf, "content-length").and_then(|v| v.parse::<usize>().ok());
        length.is_some_and(|n| buf.len() >= end + 4 + n)
    };
    let read = tokio::time::timeout(deadline, async {
        let mut chunk = [0u8; 8192];
        while !complete(&buf) {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no answer within {deadline:?}");
    buf
}

/// Sends `request` on a fresh connection and returns the raw answer.
pub async fn exchange(addr: SocketAddr, request: &[u8]) -> Vec<u8> {
    exchange_from(LOCALHOST, addr, request).await
}

/// `exchange` from the local address `local`.
pub async fn exchange_from(local: IpAddr, addr: SocketAddr, request: &[u8]) -> Vec<u8> {
    let mut s = connect_from(local, addr).await.expect("connect");
    s.write_all(request).await.expect("write");
    read_response(&mut s, Duration::from_secs(30)).await
}

/// A connection to `addr` made from the local address `local`.
pub async fn connect_from(local: IpAddr, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(local, 0))?;
    socket.connect(addr).await
}

pub fn status_of(answer: &[u8]) -> Option<u16> {
    let line = answer.split(|b| *b == b'\n').next()?;
    std::str::from_utf8(line)
        .ok()?
        .split(' ')
        .nth(1)?
        .parse()
        .ok()
}

pub fn header_of(answer: &[u8], name: &str) -> Option<String> {
    let text = String::from_utf8_lossy(answer);
    let (head, _) = text.split_once("\r\n\r\n")?;
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
    })
}

pub fn json_body_of(answer: &[u8]) -> Value {
    let text = String::from_utf8_lossy(answer);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    serde_json::from_str(body).unwrap_or(Value::Null)
}

/// Asserts a 429 that says which per-client limit was reached and when to retry.
pub fn assert_client_refused(answer: &[u8], limit: &str) {
    assert_refused(answer, 429, limit);
}

/// Asserts a refusal with `status`, `Retry-After: 1` and a JSON-RPC error that
/// names the `limit` reached.
pub fn assert_refused(answer: &[u8], status: u16, limit: &str) {
    let text = String::from_utf8_lossy(answer);
    assert_eq!(status_of(answer), Some(status), "{text}");
    assert_eq!(
        header_of(answer, "retry-after").as_deref(),
        Some("1"),
        "{text}"
    );
    let body = json_body_of(answer);
    assert_eq!(body["error"]["code"], -32000, "{text}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(limit)),
        "{text}"
    );
}

/// Waits for the api's warning that `client` was refused past `limit`.
pub async fn wait_logged(api: &ApiProcess, limit: &str, client: IpAddr) {
    wait_until(
        "the api to log the refusal",
        Duration::from_secs(10),
        || async {
            api.log()
                .lines()
                .any(|l| {
                    l.contains("WARN")
                        && l.contains("past its share")
                        && l.contains(limit)
                        && l.contains(&format!("client={client}"))
                })
                .then_some(())
        },
    )
    .await;
}

/// Asserts a 200, showing the whole answer otherwise.
pub fn assert_served(answer: &[u8]) {
    assert_eq!(
        status_of(answer),
        Some(200),
        "{}",
        String::from_utf8_lossy(answer)
    );
}

/// A `tools/list` padded with spaces (which JSON ignores) to `size` bytes.
pub fn padded_tools_list(size: usize) -> String {
    format!("{TOOLS_LIST}{}", " ".repeat(size - TOOLS_LIST.len()))
}

/// An api whose largest request is small enough (`limit` bytes, returned) for
/// a test to fill the body budget `budget_var`, which is set to exactly that.
pub async fn api_with_body_budget(redis: &Redis, budget_var: &str) -> (ApiProcess, usize) {
    let (zip_max, stdin_max, command_max) = (256 * 1024, 0, 1024);
    let limit = needed_request_bytes(zip_max, stdin_max, command_max);
    let api = ApiProcess::start(
        &redis.url(),
        &[
            ("MAX_ZIP_BYTES", &zip_max.to_string()),
            ("MAX_STDIN_BYTES", &stdin_max.to_string()),
            ("MAX_COMMAND_BYTES", &command_max.to_string()),
            (budget_var, &limit.to_string()),
        ],
    )
    .await;
    (api, limit)
}

/// Sends, from `locals[0]` and `locals[1]`, all but the last byte of two
/// bodies (`limit` × 2/3 and × 1/2) that each fit a budget of `limit` but not
/// together. Whichever the api reads past the budget second is refused at
/// once: returns that answer, and the other connection, still waiting for its
/// last byte (`finish_body`).
pub async fn two_bodies_one_refused(
    addr: SocketAddr,
    limit: usize,
    locals: [IpAddr; 2],
) -> (Vec<u8>, TcpStream) {
    let mut sends = Vec::new();
    for (size, local) in [limit * 2 / 3, limit / 2].into_iter().zip(locals) {
        let mut s = connect_from(local, addr).await.expect("connect");
        let length = format!("Content-Length: {size}\r\n");
        s.write_all(head(true, &length).as_bytes())
            .await
            .expect("head");
        s.write_all(&padded_tools_list(size).as_bytes()[..size - 1])
            .await
            .expect("body");
        sends.push(s);
    }
    let [mut first, mut second]: [TcpStream; 2] = sends.try_into().expect("two");
    let deadline = Duration::from_secs(30);
    tokio::select! {
        a = read_response(&mut first, deadline) => (a, second),
        b = read_response(&mut second, deadline) => (b, first),
    }
}

/// Sends the byte `two_bodies_one_refused` held back, and asserts the body is
/// then served.
pub async fn finish_body(mut served: TcpStream) {
    served.write_all(b" ").await.expect("last byte");
    assert_served(&read_response(&mut served, Duration::from_secs(30)).await);
}

/// A `tools/list` with the token and `extra` header lines.
pub fn tools_list(extra: &str) -> Vec<u8> {
    let length = format!("Content-Length: {}\r\n{extra}", TOOLS_LIST.len());
    format!("{}{TOOLS_LIST}", head(true, &length)).into_bytes()
}

/// Starts a `tools/list` from `local` and sends all of it but the last byte, so
/// the request stays in flight at the api until `finish_held` sends that byte.
/// The body is padded to 64 KiB with spaces: a proxy passes a body on through a
/// buffer (Caddy's is 4 KiB) and would otherwise hold back the whole request.
pub async fn hold_request(local: IpAddr, addr: SocketAddr, extra: &str) -> TcpStream {
    let body = padded_tools_list(TOOLS_LIST.len() + 64 * 1024);
    let length = format!("Content-Length: {}\r\n{extra}", body.len());
    let request = format!("{}{body}", head(true, &length));
    let mut s = connect_from(local, addr).await.expect("connect");
    s.write_all(&request.as_bytes()[..request.len() - 1])
        .await
        .expect("write");
    s
}

pub async fn finish_held(mut s: TcpStream) -> Vec<u8> {
    s.write_all(b" ").await.expect("last byte");
    read_response(&mut s, Duration::from_secs(30)).await
}

/// `n` open connections to `addr`, each proven to hold one of the api's
/// connection slots: each has been served a `GET /healthz` and stays open
/// (keep-alive). Connecting alone proves nothing: a connection the api has not
/// yet seen close (`ApiProcess::start`'s own health check, dropped an instant
/// ago) may still hold a slot, so one of ours is refused and, when that one
/// frees, a slot is open past the cap. Then all are closed and it starts over.
pub async fn hold_served_connections(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut held = Vec::new();
        let mut all_served = true;
        for _ in 0..n {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                .await
                .expect("write");
            let answer = read_response(&mut s, Duration::from_secs(30)).await;
            all_served &= status_of(&answer) == Some(200);
            held.push(s);
        }
        if all_served {
            return held;
        }
        drop(held);
        assert!(
            Instant::now() < deadline,
            "{n} connections to {addr} were never all served at once"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Holds `holds` requests from `local` in flight (`hold_request`, with the
/// header lines `extra`), then sends `request` from `local`, until that is
/// refused with 429 while the held ones stay in flight. Returns the held
/// requests and the refusal.
///
/// The first tries may not settle it: a small request can overtake a held one
/// (through a proxy, which forwards the 64 KiB body slower, it often does), and
/// is served while the held one is the one refused. Then the held requests are
/// finished and it starts over.
pub async fn hold_until_refused(
    local: IpAddr,
    addr: SocketAddr,
    holds: usize,
    extra: &str,
    request: &[u8],
) -> (Vec<TcpStream>, Vec<u8>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut held = Vec::new();
        for _ in 0..holds {
            held.push(hold_request(local, addr, extra).await);
        }
        let answer = exchange_from(local, addr, request).await;
        if status_of(&answer) != Some(200) {
            return (held, answer);
        }
        for h in held {
            finish_held(h).await;
        }
        assert!(
            Instant::now() < deadline,
            "the api never refused {local} with {holds} requests held in flight"
        );
    }
}
