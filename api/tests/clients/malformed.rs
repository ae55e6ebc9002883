//! Malformed and wrongly shaped requests: each gets the HTTP status and the
//! JSON-RPC error the Streamable HTTP transport asks for, and a real client is
//! served right after.

use serde_json::Value;
use testkit::process::ApiProcess;
use testkit::*;

use crate::wire::*;

/// A body, the HTTP status it gets, the JSON-RPC error code (none: no body at
/// all), and words the error message must contain.
type Case = (&'static [u8], u16, Option<i64>, &'static str);

const MALFORMED: &[Case] = &[
    (b"not json", 400, Some(-32700), "not JSON"),
    (b"", 400, Some(-32700), "not JSON"),
    (
        br#"{"jsonrpc":"2.0","id":1,"#,
        400,
        Some(-32700),
        "not JSON",
    ),
    (&[0xff, 0xfe, b'{', b'}'], 400, Some(-32700), "not JSON"),
    (
        br#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]"#,
        400,
        Some(-32600),
        "batch",
    ),
    (b"[]", 400, Some(-32600), "batch"),
    (br#""tools/list""#, 400, Some(-32600), "JSON object"),
    (b"{}", 400, Some(-32600), "\"jsonrpc\""),
    (
        br#"{"jsonrpc":"1.0","id":7,"method":"tools/list"}"#,
        400,
        Some(-32600),
        "\"2.0\"",
    ),
    (
        br#"{"jsonrpc":"2.0","id":null,"method":"tools/list"}"#,
        400,
        Some(-32600),
        "\"id\"",
    ),
    (
        br#"{"jsonrpc":"2.0","id":1.5,"method":"tools/list"}"#,
        400,
        Some(-32600),
        "\"id\"",
    ),
    (
        br#"{"jsonrpc":"2.0","id":{"a":1},"method":"tools/list"}"#,
        400,
        Some(-32600),
        "\"id\"",
    ),
    (
        br#"{"jsonrpc":"2.0","id":1}"#,
        400,
        Some(-32600),
        "\"method\"",
    ),
    (
        br#"{"jsonrpc":"2.0","id":1,"method":42}"#,
        400,
        Some(-32600),
        "\"method\"",
    ),
    (
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"x"}"#,
        400,
        Some(-32600),
        "\"params\"",
    ),
    // A response from a client: rmcp's own 400 (a stateless server asked nothing).
    (
        br#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
        400,
        Some(-32600),
        "responses",
    ),
    // Well-formed, but not something this server does: JSON-RPC errors in a 200.
    (
        br#"{"jsonrpc":"2.0","id":2,"method":"no/such/method"}"#,
        200,
        Some(-32601),
        "no/such/method",
    ),
    (
        br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"no_such_tool"}}"#,
        200,
        Some(-32602),
        "tool not found",
    ),
    // A known method with params of the wrong shape.
    (
        br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{}}"#,
        200,
        Some(-32602),
        "missing field `name`",
    ),
    // A notification is accepted with 202 and no body, known or not.
    (
        br#"{"jsonrpc":"2.0","method":"notifications/whatever"}"#,
        202,
        None,
        "",
    ),
];

/// Posts `body` and checks the answer against the case.
async fn check(url: &str, body: Vec<u8>, want_status: u16, want_code: Option<i64>, words: &str) {
    let shown = String::from_utf8_lossy(&body)
        .chars()
        .take(60)
        .collect::<String>();
    let (status, answer) = post(url, body).await;
    assert_eq!(status, want_status, "{shown}: {answer}");
    let Some(code) = want_code else {
        assert_eq!(answer, Value::String(String::new()), "{shown}");
        return;
    };
    assert_eq!(answer["jsonrpc"], "2.0", "{shown}: {answer}");
    assert_eq!(answer["error"]["code"], code, "{shown}: {answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(words),
        "{shown}: {message:?} lacks {words:?}"
    );
}

#[tokio::test]
async fn malformed_bodies_get_the_status_and_json_rpc_error_the_transport_asks_for() {
    let redis = Redis::start().await;
    let api = ApiProcess::start(&redis.url(), &[]).await;
    for &(body, status, code, words) in MALFORMED {
        check(&api.url, body.to_vec(), status, code, words).await;
    }
    // Nested past serde_json's recursion limit.
    let nested = "[".repeat(100_000).into_bytes();
    check(&api.url, nested, 400, Some(-32700), "recursion limit").await;
    // The id is echoed when it could be read, as JSON-RPC asks.
    let (_, answer) = post(&api.url, r#"{"jsonrpc":"1.0","id":7,"method":"x"}"#).await;
    assert_eq!(answer["id"], 7);
    a_real_client_is_served(&api.url).await;
}

#[tokio::test]
async fn wrong_headers_and_methods_get_the_answers_the_transport_specifies() {
    let redis = Redis::start().await;
    let api = ApiProcess::start(&redis.url(), &[]).await;
    let http = reqwest::Client::new();
    let mcp = format!("{}/mcp", api.url);
    // (method, content-type, accept, status): rmcp's answers.
    let cases = [
        (reqwest::Method::POST, Some("text/plain"), Some(ACCEPT), 415),
        (reqwest::Method::POST, Some("application/json"), None, 406),
        (reqwest::Method::GET, None, Some("text/event-stream"), 405),
    ];
    for (method, content_type, accept, want) in cases {
        let mut request = http
            .request(method.clone(), &mcp)
            .header("authorization", format!("Bearer {TOKEN}"));
        if let Some(t) = content_type {
            request = request.header("content-type", t).body(TOOLS_LIST);
        }
        if let Some(a) = accept {
            request = request.header("accept", a);
        }
        let status = request.send().await.expect("request").status();
        assert_eq!(status, want, "{method} with {content_type:?}, {accept:?}");
    }
    a_real_client_is_served(&api.url).await;
}

/// A request refused before its body is read (no token) is answered with
/// `Connection: close` when its body comes after the head, as most clients
/// send it: the server closes that connection after the answer, and a client
/// that kept it for its next request (an OAuth client retrying with its new
/// token) would get no answer at all. A body-less refusal keeps the connection.
#[tokio::test]
async fn a_refusal_before_the_body_is_read_says_the_connection_closes() {
    use tokio::io::AsyncWriteExt;
    let redis = Redis::start().await;
    let api = ApiProcess::start(&redis.url(), &[]).await;
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;

    let mut stream = tokio::net::TcpStream::connect(api.addr)
        .await
        .expect("connect");
    let head = head(false, &format!("Content-Length: {}\r\n", body.len()));
    stream.write_all(head.as_bytes()).await.expect("head");
    let answer = read_response(&mut stream, std::time::Duration::from_secs(10)).await;
    assert_eq!(status_of(&answer), Some(401));
    assert_eq!(header_of(&answer, "connection").as_deref(), Some("close"));
    // The body arrives after the answer; the server closes all the same.
    let _ = stream.write_all(body.as_bytes()).await;
    let rest = read_until_closed(&mut stream, std::time::Duration::from_secs(10)).await;
    assert!(rest.is_empty(), "more came after the 401: {rest:?}");

    // Without a body, the refusal leaves the connection open for the next request.
    let mut stream = tokio::net::TcpStream::connect(api.addr)
        .await
        .expect("connect");
    let get = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    stream.write_all(get.as_bytes()).await.expect("request");
    let answer = read_response(&mut stream, std::time::Duration::from_secs(10)).await;
    assert_eq!(status_of(&answer), Some(401));
    assert_eq!(header_of(&answer, "connection"), None);
    stream
        .write_all(get.as_bytes())
        .await
        .expect("a second request");
    let again = read_response(&mut stream, std::time::Duration::from_secs(10)).await;
    assert_eq!(
        status_of(&again),
        Some(401),
        "the kept connection answered again"
    );
}
