//! The HTTP layer in front of the MCP service, which is where a hostile or broken
//! client meets the api.
//!
//! - `serve`: HTTP/1.1 only, at most `MAX_CONNECTIONS` connections (more are
//!   answered 503 and closed) and `MAX_CONNECTIONS_PER_CLIENT` from one address
//!   (429), headers within `REQUEST_HEADER_TIMEOUT_SECONDS` (which also closes a
//!   kept-alive connection idle that long) and at most `MAX_HEADER_BYTES` of them
//!   (431 beyond).
//! - `client_limits`: names each request's client (`crate::clients`) and holds
//!   one of its `MAX_REQUESTS_PER_CLIENT` while the request is served (429 past
//!   them).
//! - `mcp_body`: the body of `POST /mcp`, read here before rmcp sees it: at most
//!   `MAX_REQUEST_BYTES` (413, refused from `Content-Length` before a byte is
//!   kept, or as soon as a chunked body passes it; the rest is drained, not
//!   kept, so the sender can read the answer), within
//!   `REQUEST_BODY_TIMEOUT_SECONDS` (408), within `MAX_BODY_BYTES_PER_CLIENT`
//!   for its client (429) and `MAX_BODY_BYTES_IN_FLIGHT` for all clients
//!   together (503). A body rmcp cannot parse gets 400 with a
//!   JSON-RPC error (-32700 when it is not JSON, -32600 when it is JSON but not
//!   one JSON-RPC message), as the Streamable HTTP transport asks, instead of
//!   rmcp's plain-text 415. It runs after the token check, so the body of an
//!   unauthenticated request is never read.
//!
//! Every wait is a timer on a task, never a thread: a slow client costs a
//! connection slot and its buffers, nothing more.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt as _;

use crate::clients::{ClientKey, Limit, RefusalLog, Share, Tally, TrustedProxies};
use crate::config::HttpLimits;

/// The largest request head (request line and headers). A bearer token and the
/// usual headers take well under 2 KiB; proxies add a few hundred bytes.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// At most this many headers in one request.
const MAX_HEADERS: usize = 64;
/// Connections beyond `MAX_CONNECTIONS` being answered 503 at once; past this
/// many they are closed without an answer. One costs a task, a descriptor and a
/// few hundred bytes, for a round trip or at most `REFUSAL_TIME`.
pub const MAX_REFUSALS: usize = 16_384;
/// How long a refused connection gets to read its 503.
const REFUSAL_TIME: Duration = Duration::from_secs(2);
/// What is read (and dropped) of a refused body at most, so its sender gets the
/// answer (see `linger`).
const LINGER_BYTES: usize = 64 << 20;
const LINGER_TIME: Duration = Duration::from_secs(5);

/// Connections the kernel may hold for us before `accept` (Linux caps it at
/// `net.core.somaxconn`, 4096 by default). tokio's default is 1024: a burst of
/// thousands of connects then overflows the queue, clients' packets are dropped
/// and, with SYN cookies, some connections are reset.
const LISTEN_BACKLOG: u32 = 4096;

/// A listener on `addr` with a deep accept queue (`LISTEN_BACKLOG`).
pub fn bind(addr: std::net::SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As std and tokio do: a restarted api can bind while old connections of the
    // previous one linger in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets in-flight
/// requests finish (bounded by the header and body timeouts for slow clients).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_header_size(MAX_HEADER_BYTES)
        .max_headers(MAX_HEADERS);
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let per_client = Tally::new(limits.max_connections_per_client);
    let refusal_log = RefusalLog::new(Limit::Connections);
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS));
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // A trusted proxy carries many clients' connections: only the global cap
        // applies to it, and its clients are told apart per request.
        let share = if limits.trusted_proxies.trusts(peer.ip()) {
            None
        } else {
            let client = ClientKey::of(peer.ip());
            match per_client.take(client, 1) {
                Some(share) => Some(share),
                None => {
                    refusal_log.refused(client, per_client.max());
                    refuse(
                        stream,
                        &refusals,
                        client_connections_response(per_client.max()),
                    );
                    continue;
                }
            }
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            refuse(stream, &refusals, busy_response());
            continue;
        };
        // Each request carries its peer's address, for `client_limits`.
        let service = TowerToHyperService::new(app.clone().map_request(
            move |mut req: Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(ConnectInfo(peer));
                req
            },
        ));
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            // Errors here are the client's (reset, timeout, bad request line):
            // hyper has answered what could be answered.
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop((permit, share));
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// An accept error: a connection that died before it was accepted is nothing;
/// running out of file descriptors or memory is, and retrying at once would spin.
async fn accept_failed(e: io::Error) {
    use io::ErrorKind::*;
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionReset | ConnectionRefused | Interrupted
    ) {
        return;
    }
    tracing::warn!(error = %e, "cannot accept connections; pausing 100 ms");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Answers a connection over a cap with `answer` (a whole HTTP response) and
/// closes it. The request is read (and dropped) after the answer, so closing
/// does not reset the connection before the client has read it.
fn refuse(mut stream: TcpStream, refusals: &Arc<Semaphore>, answer: Vec<u8>) {
    let Ok(permit) = refusals.clone().try_acquire_owned() else {
        return; // dropped: the client sees a closed connection
    };
    tokio::spawn(async move {
        let _permit = permit;
        let answer = async {
            stream.write_all(&answer).await?;
            stream.shutdown().await?;
            let mut sink = [0u8; 512];
            while stream.read(&mut sink).await? > 0 {}
            Ok::<_, io::Error>(())
        };
        let _ = tokio::time::timeout(REFUSAL_TIME, answer).await;
    });
}

fn busy_response() -> Vec<u8> {
    raw_response(
        "503 Service Unavailable",
        "the server is at its connection limit (MAX_CONNECTIONS); retry shortly",
    )
}

fn client_connections_response(max: usize) -> Vec<u8> {
    raw_response(
        "429 Too Many Requests",
        &format!(
            "this address already has {max} connections open (MAX_CONNECTIONS_PER_CLIENT); \
             reuse them, or retry when one closes"
        ),
    )
}

/// A whole HTTP/1.1 answer that closes the connection, with a JSON-RPC error
/// and `Retry-After: 1`, for a connection refused before hyper serves it.
fn raw_response(status: &str, message: &str) -> Vec<u8> {
    let body = rpc_error(None, -32000, message).to_string();
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Raises this process's open-file limit to its hard limit, as each connection
/// takes a descriptor, and warns when even that is below what `max_connections`
/// needs (plus some for Redis and the rest).
pub fn raise_fd_limit(max_connections: usize) {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    // `None` is unlimited; only a finite soft limit below a finite hard one is raised.
    if let (Some(soft), Some(hard)) = (limit.current, limit.maximum)
        && soft < hard
    {
        limit.current = Some(hard);
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            tracing::warn!(error = %e, "cannot raise the open-file limit");
        }
    }
    let now = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    let needed = max_connections as u64 + 256;
    if now < needed {
        tracing::warn!(
            open_files = now,
            max_connections,
            "the open-file limit is below MAX_CONNECTIONS + 256: connections past it fail \
             to be accepted; raise it (ulimit -n, LimitNOFILE, docker --ulimit) or lower \
             MAX_CONNECTIONS"
        );
    }
}

/// What `client_limits` needs: whom to believe about a client's address, and
/// each client's requests in flight.
#[derive(Clone)]
pub struct ClientGate {
    trusted: Arc<TrustedProxies>,
    requests: Arc<Tally<ClientKey>>,
    refusals: Arc<RefusalLog>,
}

impl ClientGate {
    pub fn new(limits: &HttpLimits) -> ClientGate {
        ClientGate {
            trusted: Arc::new(limits.trusted_proxies.clone()),
            requests: Tally::new(limits.max_requests_per_client),
            refusals: Arc::new(RefusalLog::new(Limit::Requests)),
        }
    }
}

/// Names the request's client (see `crate::clients`) for the layers after it,
/// and holds one of that client's `MAX_REQUESTS_PER_CLIENT` until the answer is
/// ready; past them, 429. Requests `serve` did not accept (no peer address, as
/// in tests that drive the router directly) pass uncounted.
pub async fn client_limits(
    State(gate): State<ClientGate>,
    mut req: Request,
    next: Next,
) -> Response {
    let Some(ConnectInfo(peer)) = req.extensions().get::<ConnectInfo<SocketAddr>>().copied() else {
        return next.run(req).await;
    };
    let client = gate.trusted.client_of(peer.ip(), req.headers());
    let Some(_share) = gate.requests.take(client, 1) else {
        gate.refusals.refused(client, gate.requests.max());
        linger(req.into_body());
        return too_many(format!(
            "this client already has {} requests in flight (MAX_REQUESTS_PER_CLIENT); \
             retry when one is answered",
            gate.requests.max()
        ));
    };
    req.extensions_mut().insert(client);
    next.run(req).await
}

/// What `mcp_body` needs: the limits, the in-flight budget shared by all
/// clients, and each client's share of it.
#[derive(Clone)]
pub struct BodyGate {
    max_bytes: usize,
    timeout: Duration,
    /// In KiB (a semaphore counts at most `u32` permits at a time).
    in_flight: Arc<Semaphore>,
    /// In bytes, per client (`MAX_BODY_BYTES_PER_CLIENT`).
    per_client: Arc<Tally<ClientKey>>,
    refusals: Arc<RefusalLog>,
}

impl BodyGate {
    pub fn new(limits: &HttpLimits) -> BodyGate {
        BodyGate {
            max_bytes: limits.max_request_bytes,
            timeout: limits.body_timeout,
            in_flight: Arc::new(Semaphore::new(
                limits.max_body_bytes_in_flight.div_ceil(1024),
            )),
            per_client: Tally::new(limits.max_body_bytes_per_client),
            refusals: Arc::new(RefusalLog::new(Limit::BodyBytes)),
        }
    }
}

enum BodyError {
    TooLarge,
    Busy,
    ClientBusy,
    Read(axum::Error),
}

/// What a body being read holds of the budgets, given back on drop.
type Held = (Option<OwnedSemaphorePermit>, Option<Share<ClientKey>>);

/// The `POST /mcp` body gate (see the module comment). Other methods, and bodies
/// not declared JSON, go to rmcp as they are: it answers them (405, 406, 415)
/// without reading a body.
pub async fn mcp_body(State(gate): State<BodyGate>, req: Request, next: Next) -> Response {
    if req.method() != Method::POST || !declared_json(req.headers()) {
        return next.run(req).await;
    }
    let (parts, mut body) = req.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > gate.max_bytes as u64) {
        linger(body);
        return too_large(gate.max_bytes);
    }
    let client = parts.extensions.get::<ClientKey>().copied();
    let read = read_body(&mut body, &gate, client, declared.unwrap_or(0) as usize);
    let (bytes, _held) = match tokio::time::timeout(gate.timeout, read).await {
        Err(_) => return body_timeout(gate.timeout),
        Ok(Err(BodyError::TooLarge)) => {
            linger(body);
            return too_large(gate.max_bytes);
        }
        Ok(Err(BodyError::Busy)) => {
            linger(body);
            return busy();
        }
        Ok(Err(BodyError::ClientBusy)) => {
            if let Some(client) = client {
                gate.refusals.refused(client, gate.per_client.max());
            }
            linger(body);
            return too_many(format!(
                "this client's request bodies in flight would pass {} bytes \
                 (MAX_BODY_BYTES_PER_CLIENT); retry when one is answered",
                gate.per_client.max()
            ));
        }
        Ok(Err(BodyError::Read(e))) => {
            return rpc_response(
                StatusCode::BAD_REQUEST,
                rpc_error(
                    None,
                    -32600,
                    &format!("Invalid Request: the body could not be read ({e})"),
                ),
            );
        }
        Ok(Ok(read)) => read,
    };
    // `_held` keeps this body's share of the budget until rmcp is done with it
    // (rmcp copies and parses it, so that is when the memory goes).
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes.clone())))
        .await;
    // The Content-Type was JSON, so a 415 from rmcp means it could not parse
    // the body as a JSON-RPC message.
    if response.status() == StatusCode::UNSUPPORTED_MEDIA_TYPE {
        return unparsable(&bytes);
    }
    response
}

/// Reads and drops what is left of a refused body, for at most `LINGER_BYTES`
/// and `LINGER_TIME`, while the answer goes out: most clients send their whole
/// body before they read, and one whose connection is closed mid-body sees a
/// broken pipe instead of the 413 that says why. Nothing is kept.
fn linger(mut body: Body) {
    tokio::spawn(async move {
        let drain = async {
            let mut seen = 0usize;
            while let Some(Ok(frame)) = body.frame().await {
                seen += frame.data_ref().map_or(0, |d| d.len());
                if seen > LINGER_BYTES {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(LINGER_TIME, drain).await;
    });
}

fn declared_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .eq_ignore_ascii_case("application/json")
        })
}

/// Reads the whole body, never holding more than `gate.max_bytes`, and takes its
/// size from the client's share and the in-flight budget as it arrives (never
/// waiting for either).
async fn read_body(
    body: &mut Body,
    gate: &BodyGate,
    client: Option<ClientKey>,
    declared: usize,
) -> Result<(Bytes, Held), BodyError> {
    let mut buf = bytes::BytesMut::with_capacity(declared.min(gate.max_bytes));
    let mut held: Option<OwnedSemaphorePermit> = None;
    let mut share = client.and_then(|c| gate.per_client.take(c, 0));
    let mut held_kib: usize = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(BodyError::Read)?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        if buf.len() + data.len() > gate.max_bytes {
            return Err(BodyError::TooLarge);
        }
        if share.as_mut().is_some_and(|s| !s.grow(data.len())) {
            return Err(BodyError::ClientBusy);
        }
        buf.extend_from_slice(&data);
        let more = buf.len().div_ceil(1024) - held_kib;
        if more > 0 {
            let permit = u32::try_from(more)
                .ok()
                .and_then(|n| gate.in_flight.clone().try_acquire_many_owned(n).ok())
                .ok_or(BodyError::Busy)?;
            match held.as_mut() {
                Some(h) => h.merge(permit),
                None => held = Some(permit),
            }
            held_kib += more;
        }
    }
    Ok((buf.freeze(), (held, share)))
}

/// A JSON-RPC error object; `id` is the request's when it could be read.
pub(crate) fn rpc_error(id: Option<Value>, code: i64, message: &str) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } })
}

pub(crate) fn rpc_response(status: StatusCode, body: Value) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.to_string(),
    )
        .into_response()
}

/// A refusal sent before the request's body was read (a wrong token, a
/// foreign origin): hyper closes such a connection after the answer, since the
/// body's rest is still on the way, so the answer must say so. Otherwise the
/// client keeps the connection for its next request (an OAuth client's retry
/// with its new token) and gets "server disconnected" instead of an answer.
pub(crate) fn refused_unread(request: &HeaderMap, response: Response) -> Response {
    let has_body = request.contains_key(header::TRANSFER_ENCODING)
        || request
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0");
    if has_body {
        closing(response)
    } else {
        response
    }
}

/// The client may still be sending: say so, and close the connection after the
/// answer rather than read the rest.
fn closing(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

fn too_large(max: usize) -> Response {
    closing(rpc_response(
        StatusCode::PAYLOAD_TOO_LARGE,
        rpc_error(
            None,
            -32600,
            &format!(
                "Invalid Request: the body is larger than {max} bytes (MAX_REQUEST_BYTES); \
                 a zip may be at most MAX_ZIP_BYTES decoded"
            ),
        ),
    ))
}

fn body_timeout(limit: Duration) -> Response {
    closing(rpc_response(
        StatusCode::REQUEST_TIMEOUT,
        rpc_error(
            None,
            -32600,
            &format!(
                "Invalid Request: the body did not arrive within {} s \
                 (REQUEST_BODY_TIMEOUT_SECONDS)",
                limit.as_secs()
            ),
        ),
    ))
}

/// 429 with `Retry-After`: this client is past its share; others are served.
fn too_many(message: String) -> Response {
    let mut response = closing(rpc_response(
        StatusCode::TOO_MANY_REQUESTS,
        rpc_error(None, -32000, &message),
    ));
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

fn busy() -> Response {
    let mut response = closing(rpc_response(
        StatusCode::SERVICE_UNAVAILABLE,
        rpc_error(
            None,
            -32000,
            "the server is holding as many request bodies as it may \
             (MAX_BODY_BYTES_IN_FLIGHT); retry shortly",
        ),
    ));
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// The 400 for a body rmcp could not parse, saying what is wrong with it.
fn unparsable(body: &[u8]) -> Response {
    let (id, code, message) = match serde_json::from_slice::<Value>(body) {
        Err(e) => (
            None,
            -32700,
            format!("Parse error: the body is not JSON ({e})"),
        ),
        Ok(value) => {
            let (id, problem) = invalid_request(&value);
            (id, -32600, format!("Invalid Request: {problem}"))
        }
    };
    rpc_response(StatusCode::BAD_REQUEST, rpc_error(id, code, &message))
}

/// Why a JSON value is not one MCP JSON-RPC message, and its id if it has a
/// usable one (to echo, as JSON-RPC asks when the id could be read).
pub fn invalid_request(value: &Value) -> (Option<Value>, String) {
    let Value::Object(m) = value else {
        let what = if value.is_array() {
            "a batch (JSON array) is not supported: send one JSON-RPC message per POST"
        } else {
            "the body must be a JSON-RPC 2.0 message (a JSON object)"
        };
        return (None, what.to_owned());
    };
    let id = m
        .get("id")
        .filter(|id| id.is_string() || id.as_i64().is_some() || id.as_u64().is_some());
    let problem = if m.get("jsonrpc") != Some(&json!("2.0")) {
        "\"jsonrpc\" must be \"2.0\"".to_owned()
    } else if m.contains_key("id") && id.is_none() {
        "\"id\" must be a string or an integer (MCP does not allow null)".to_owned()
    } else if !m.contains_key("method") && !m.contains_key("result") && !m.contains_key("error") {
        "a request needs \"method\" (a string)".to_owned()
    } else if m.get("method").is_some_and(|v| !v.is_string()) {
        "\"method\" must be a string".to_owned()
    } else if m.get("params").is_some_and(|p| !p.is_object()) {
        "\"params\" must be an object".to_owned()
    } else {
        "not a JSON-RPC request, notification or response this server understands".to_owned()
    };
    (id.cloned(), problem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_requests_say_what_is_wrong_and_keep_a_usable_id() {
        let check = |v: Value, id: Option<Value>, says: &str| {
            let (got_id, problem) = invalid_request(&v);
            assert_eq!(got_id, id, "{v}");
            assert!(problem.contains(says), "{v}: {problem}");
        };
        check(json!([{"jsonrpc": "2.0"}]), None, "batch");
        check(json!("x"), None, "JSON object");
        check(
            json!({"jsonrpc": "1.0", "id": 7, "method": "m"}),
            Some(json!(7)),
            "\"2.0\"",
        );
        check(
            json!({"jsonrpc": "2.0", "id": null, "method": "m"}),
            None,
            "null",
        );
        check(
            json!({"jsonrpc": "2.0", "id": 1.5, "method": "m"}),
            None,
            "integer",
        );
        check(
            json!({"jsonrpc": "2.0", "id": "a"}),
            Some(json!("a")),
            "needs \"method\"",
        );
        check(
            json!({"jsonrpc": "2.0", "id": 1, "method": 3}),
            Some(json!(1)),
            "a string",
        );
        check(
            json!({"jsonrpc": "2.0", "id": 1, "method": "m", "params": []}),
            Some(json!(1)),
            "object",
        );
    }

    #[test]
    fn the_busy_answer_is_a_complete_http_response() {
        let text = String::from_utf8(busy_response()).unwrap_or_default();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or_default();
        assert!(head.starts_with("HTTP/1.1 503 "));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let parsed: Value = serde_json::from_str(body).unwrap_or_default();
        assert_eq!(parsed["error"]["code"], -32000);
    }
}
