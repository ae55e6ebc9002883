//! Request sizes: the largest legal `run_script` fits the limit derived from the
//! other caps, one byte past the limit is 413, and a body that claims or streams
//! more is refused before it is read, the api's memory bounded.

use std::time::Duration;

use script_runner_api::config::needed_request_bytes;
use serde_json::{Value, json};
use testkit::process::ApiProcess;
use testkit::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::wire::*;

/// The default caps: a 16 MiB zip, 1 MiB of stdin, a 64 KiB command.
const ZIP_MAX: usize = 16 << 20;
const STDIN_MAX: usize = 1 << 20;
const COMMAND_MAX: usize = 64 << 10;

/// Incompressible bytes (xorshift), the same on every run.
fn noise(n: usize, mut x: u32) -> Vec<u8> {
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// A zip of exactly `size` bytes: one stored entry of incompressible bytes.
fn zip_of_size(size: usize) -> Vec<u8> {
    use std::io::Write;
    let build = |n: usize| {
        let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        w.start_file("data.bin", opts).expect("file");
        w.write_all(&noise(n, 7)).expect("write");
        w.finish().expect("zip").into_inner()
    };
    let overhead = build(0).len();
    let zip = build(size - overhead);
    assert_eq!(zip.len(), size, "a stored entry's zip grows byte for byte");
    zip
}

/// Base64 wrapped at 76 columns with CRLF, as some encoders write it (the api
/// ignores whitespace in base64); inside JSON each line break costs 4 bytes.
fn wrapped_b64(bytes: &[u8]) -> String {
    let flat = b64(bytes);
    flat.as_bytes()
        .chunks(76)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect::<Vec<_>>()
        .join("\r\n")
}
/// The largest run_script the other caps allow, written as expensively as a
/// client legally can: every env variable and collect pattern at its longest,
/// in characters JSON escapes to 6 bytes, base64 wrapped, and '/' escaped.
fn largest_legal_run_script() -> String {
    let env: serde_json::Map<String, Value> = (0..shared::options::MAX_ENV_VARS)
        .map(|i| {
            let name = format!("V{i:02}");
            let len = shared::options::MAX_ENV_BYTES / shared::options::MAX_ENV_VARS - name.len();
            (name, Value::String("\u{1}".repeat(len))) // 6 bytes each as JSON
        })
        .collect();
    let collect: Vec<String> = (0..shared::options::MAX_COLLECT_PATTERNS)
        .map(|_| "\u{1}".repeat(shared::options::MAX_COLLECT_PATTERN_LEN))
        .collect();
    let command = format!("true #{}", "x".repeat(COMMAND_MAX - 6));
    let args = json!({
        "runtime": "python3.13",
        "command_base64": wrapped_b64(command.as_bytes()),
        "zip_base64": wrapped_b64(&zip_of_size(ZIP_MAX)),
        "stdin_base64": wrapped_b64(&noise(STDIN_MAX, 3)),
        "env": env,
        "collect": collect,
        "network": "none",
        "timeout_seconds": 3600,
    });
    let request = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": { "name": "run_script", "arguments": args },
    });
    // And with '/' escaped, as some encoders do.
    request.to_string().replace('/', "\\/")
}

#[tokio::test]
async fn bodies_up_to_the_limit_pass_and_one_byte_more_is_refused() {
    let redis = Redis::start().await;
    let api = ApiProcess::start(&redis.url(), &[]).await;
    let limit = needed_request_bytes(ZIP_MAX, STDIN_MAX, COMMAND_MAX);

    // The largest legal run_script fits under the derived limit and is accepted.
    let largest = largest_legal_run_script();
    eprintln!(
        "largest legal run_script: {} bytes; limit {limit}",
        largest.len()
    );
    assert!(largest.len() <= limit, "{} > {limit}", largest.len());
    let (status, answer) = post(&api.url, largest).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["result"]["structuredContent"]["state"], "queued",
        "{answer}"
    );

    // Exactly the limit passes; one byte more is 413 with a JSON-RPC error.
    let (status, answer) = post(&api.url, padded_tools_list(limit)).await;
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = post(&api.url, padded_tools_list(limit + 1)).await;
    assert_eq!(status, 413, "{answer}");
    assert_eq!(answer["error"]["code"], -32600);
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(&format!("larger than {limit} bytes")))
    );
    a_real_client_is_served(&api.url).await;
}

#[tokio::test]
async fn a_declared_or_streamed_huge_body_is_refused_before_it_is_read() {
    let redis = Redis::start().await;
    let api = ApiProcess::start(&redis.url(), &[]).await;
    let limit = needed_request_bytes(ZIP_MAX, STDIN_MAX, COMMAND_MAX);

    // A declared 1 GiB is refused from its Content-Length: not one byte of the
    // body is sent, and the answer comes anyway; without the token it is 401.
    for (authed, want) in [(true, 413), (false, 401)] {
        let request = head(authed, "Content-Length: 1073741824\r\n");
        let answer = exchange(api.addr, request.as_bytes()).await;
        let text = String::from_utf8_lossy(&answer);
        assert_eq!(status_of(&answer), Some(want), "{text}");
        if authed {
            assert_eq!(header_of(&answer, "connection").as_deref(), Some("close"));
        }
    }

    // A chunked body (no length given) of up to 256 MiB: refused as soon as it
    // passes the limit, the connection closed, and the api's memory never holds
    // more than the limit.
    let peak_before = api.proc_status("VmHWM");
    let (answer, sent) = stream_chunked(&api, 256 << 20).await;
    assert_eq!(
        status_of(&answer),
        Some(413),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    let grew_kib = api.proc_status("VmHWM").saturating_sub(peak_before);
    eprintln!(
        "chunked: {} MiB sent before the api closed; its peak memory grew {grew_kib} KiB",
        sent >> 20
    );
    assert!(sent < 256 << 20, "the api read all 256 MiB");
    assert!(
        grew_kib < 64 * 1024,
        "the api's peak memory grew {grew_kib} KiB for a {limit}-byte limit"
    );
    a_real_client_is_served(&api.url).await;
}

/// Sends a chunked body of up to `max` bytes until the api answers and closes;
/// returns the answer and how many bytes were sent.
async fn stream_chunked(api: &ApiProcess, max: usize) -> (Vec<u8>, usize) {
    let stream = TcpStream::connect(api.addr).await.expect("connect");
    let (mut rd, mut wr) = stream.into_split();
    wr.write_all(head(true, "Transfer-Encoding: chunked\r\n").as_bytes())
        .await
        .expect("head");
    let writer = tokio::spawn(async move {
        let chunk = format!("10000\r\n{}\r\n", " ".repeat(0x10000));
        let mut sent = 0usize;
        while sent < max {
            if wr.write_all(chunk.as_bytes()).await.is_err() {
                break;
            }
            sent += 0x10000;
        }
        sent
    });
    let answer = read_until_closed(&mut rd, Duration::from_secs(60)).await;
    (answer, writer.await.expect("writer"))
}
