//! Huge headers are refused, and clients that are silent or slow are cut off
//! by the timeouts, without holding a thread each.

use std::sync::Arc;
use std::time::Duration;

use testkit::process::ApiProcess;
use testkit::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::wire::*;

/// The api with short header and body timeouts.
async fn impatient_api(redis: &Redis) -> ApiProcess {
    ApiProcess::start(
        &redis.url(),
        &[
            ("REQUEST_HEADER_TIMEOUT_SECONDS", "2"),
            ("REQUEST_BODY_TIMEOUT_SECONDS", "3"),
        ],
    )
    .await
}

#[tokio::test]
async fn headers_past_16_kib_or_64_lines_are_refused_with_431() {
    let redis = Redis::start().await;
    let api = impatient_api(&redis).await;
    let big = format!("X-Big: {}\r\nContent-Length: 2\r\n", "a".repeat(20 * 1024));
    let many: String = (0..100).map(|i| format!("X-H{i}: v\r\n")).collect();
    for (what, extra) in [("a 20 KiB header", big), ("100 headers", many)] {
        let answer = exchange(api.addr, format!("{}{{}}", head(true, &extra)).as_bytes()).await;
        assert_eq!(status_of(&answer), Some(431), "{what}");
    }
    a_real_client_is_served(&api.url).await;
}

#[tokio::test]
async fn silent_or_dribbling_header_senders_are_cut_off_by_the_header_timeout() {
    let redis = Redis::start().await;
    let api = impatient_api(&redis).await;
    let mut silent = TcpStream::connect(api.addr).await.expect("connect");
    let dribbler = tokio::spawn(dribble_headers(api.addr));
    let _ = read_until_closed(&mut silent, Duration::from_secs(20)).await;
    assert!(
        dribbler.await.expect("dribbler"),
        "a header dribbler was never cut off"
    );
    a_real_client_is_served(&api.url).await;
}

/// Sends a request head one header line every 300 ms; whether the api closed
/// the connection before 100 lines.
async fn dribble_headers(addr: std::net::SocketAddr) -> bool {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .expect("write");
    let mut buf = [0u8; 1024];
    for i in 0..100 {
        tokio::select! {
            r = s.read(&mut buf) => if matches!(r, Ok(0) | Err(_)) { return true },
            () = tokio::time::sleep(Duration::from_millis(300)) => {}
        }
        if s.write_all(format!("X-Slow-{i}: 1\r\n").as_bytes())
            .await
            .is_err()
        {
            return true;
        }
    }
    false
}

/// 64 clients dribbling bodies, one byte every 250 ms: a real client is served
/// meanwhile (so no thread is held by them: the api has two worker threads),
/// and each dribbler gets 408 and a closed connection.
#[tokio::test]
async fn slow_bodies_get_408_without_a_thread_each_and_others_are_served_meanwhile() {
    let redis = Redis::start().await;
    let api = impatient_api(&redis).await;
    let threads_before = api.proc_status("Threads");
    let ready = Arc::new(tokio::sync::Barrier::new(65));
    let slow: Vec<_> = (0..64)
        .map(|_| tokio::spawn(dribble_body(api.addr, ready.clone())))
        .collect();
    ready.wait().await;
    a_real_client_is_served(&api.url).await;
    let threads_during = api.proc_status("Threads");
    for s in slow {
        let answer = s.await.expect("dribbler");
        assert_eq!(
            status_of(&answer),
            Some(408),
            "{}",
            String::from_utf8_lossy(&answer)
        );
        assert_eq!(json_body_of(&answer)["error"]["code"], -32600);
    }
    eprintln!("api threads: {threads_before} before, {threads_during} with 64 slow clients");
    assert!(
        threads_during < threads_before + 8,
        "threads grew from {threads_before} to {threads_during} with 64 slow clients"
    );
    a_real_client_is_served(&api.url).await;
}

/// Sends a head and the first byte of a 1000-byte body, waits at `ready`, then
/// one byte every 250 ms until the api closes; returns its answer.
async fn dribble_body(addr: std::net::SocketAddr, ready: Arc<tokio::sync::Barrier>) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(head(true, "Content-Length: 1000\r\n").as_bytes())
        .await
        .expect("head");
    s.write_all(b"{").await.expect("first byte");
    ready.wait().await;
    let (mut rd, mut wr) = s.into_split();
    let drip = tokio::spawn(async move {
        while wr.write_all(b" ").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    let answer = read_until_closed(&mut rd, Duration::from_secs(30)).await;
    drip.abort();
    answer
}
