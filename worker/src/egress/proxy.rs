//! The proxy's connections: who is asking (its source address), CONNECT
//! tunnels with the TLS server name checked, and plain HTTP requests.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONNECTION, HOST, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use shared::egress::{Verdict, fold_host};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::{EgressProxy, Entry};

type Body = BoxBody<Bytes, hyper::Error>;

/// How long the proxy tries to reach an allowed host.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a tunnel waits for the client's whole TLS ClientHello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// A ClientHello larger than this is refused (real ones are a few KiB).
const MAX_HELLO_BYTES: usize = 64 * 1024;
/// How long a client may take to send a request's headers (and a kept-alive
/// connection may sit idle).
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// A tunnel or forwarded connection through which nothing passed for this
/// long is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
const IDLE_CHECK: Duration = Duration::from_secs(15);
/// How long a host may take to answer a forwarded request's headers.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);
/// Headers that describe one hop, not the request (RFC 9110, 7.6.1): never
/// forwarded.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
];

pub(super) async fn serve(proxy: EgressProxy, listener: TcpListener, stop: CancellationToken) {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    tokio::spawn(connection(proxy.clone(), stream, peer));
                }
                Err(e) => {
                    // Out of descriptors, most likely: let some close.
                    tracing::warn!(error = %e, "egress proxy: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            () = stop.cancelled() => return,
        }
    }
}

/// The source address in its IPv4 form when it is one.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

async fn connection(proxy: EgressProxy, mut stream: TcpStream, peer: SocketAddr) {
    let Some(entry) = proxy.entry(canonical(peer.ip())) else {
        // No task holds this address (any more): nothing is served.
        let answer = raw_answer("403 Forbidden", "no task at this address");
        let _ = stream.write_all(answer.as_bytes()).await;
        return;
    };
    let Ok(_permit) = entry.slots.clone().try_acquire_owned() else {
        entry.record(&proxy.0.metrics, "-", 0, Verdict::TooManyConnections);
        let why = format!(
            "the task has {} connections open, the most it may",
            super::MAX_CONNECTIONS_PER_TASK
        );
        let _ = stream
            .write_all(raw_answer("429 Too Many Requests", &why).as_bytes())
            .await;
        return;
    };
    let ended = entry.ended.clone();
    let service = hyper::service::service_fn(move |req| {
        let (proxy, entry) = (proxy.clone(), entry.clone());
        async move { Ok::<_, Infallible>(handle(proxy, entry, req).await) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .preserve_header_case(true)
        .title_case_headers(true)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::select! {
        served = served => if let Err(e) = served {
            tracing::debug!(%peer, error = %e, "egress proxy connection ended");
        },
        () = ended.cancelled() => {}
    }
}

/// A whole HTTP/1.1 answer, for a connection the proxy serves nothing on.
fn raw_answer(status: &str, why: &str) -> String {
    let body = format!("script-runner egress proxy: {why}\n");
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\nconnection: close\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
}

async fn handle(proxy: EgressProxy, entry: Arc<Entry>, req: Request<Incoming>) -> Response<Body> {
    if req.method() == Method::CONNECT {
        connect(proxy, entry, req).await
    } else {
        forward(proxy, entry, req).await
    }
}

/// The host and port a request names, the port defaulting to `default`.
fn target(uri: &hyper::Uri, default: Option<u16>) -> Option<(String, u16)> {
    let a = uri.authority()?;
    let host = a.host().trim_start_matches('[').trim_end_matches(']');
    Some((fold_host(host), a.port_u16().or(default)?))
}

async fn connect(proxy: EgressProxy, entry: Arc<Entry>, req: Request<Incoming>) -> Response<Body> {
    let metrics = &proxy.0.metrics;
    let Some((host, port)) = target(req.uri(), None) else {
        entry.record(metrics, &req.uri().to_string(), 0, Verdict::BadRequest);
        return text(
            StatusCode::BAD_REQUEST,
            Verdict::BadRequest,
            "CONNECT needs host:port".to_owned(),
        );
    };
    let (permit, upstream) = match admit(&proxy, &entry, &host, port).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    // Logged as allowed once the tunnel's ClientHello passes (`tunnel`).
    let open = entry.opened();
    tokio::spawn(async move {
        let (_permit, _open) = (permit, open);
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => {
                tunnel(proxy, entry, TokioIo::new(upgraded), upstream, host, port).await
            }
            Err(e) => tracing::debug!(error = %e, "egress proxy: CONNECT not upgraded"),
        }
    });
    Response::new(empty())
}

/// Lets an attempt at `host:port` through, or says why not (recorded in the
/// task's log): the task's list and the policy, one of the task's connection
/// slots, and a connection to one of the addresses the policy checked.
async fn admit(
    proxy: &EgressProxy,
    entry: &Entry,
    host: &str,
    port: u16,
) -> Result<(OwnedSemaphorePermit, TcpStream), Response<Body>> {
    let refuse = |v: Verdict| {
        entry.record(&proxy.0.metrics, host, port, v);
        refusal(proxy, v, host, port)
    };
    let addrs = proxy
        .policy()
        .decide(&entry.allow, host, port)
        .await
        .map_err(refuse)?;
    let permit = entry
        .slots
        .clone()
        .try_acquire_owned()
        .map_err(|_| refuse(Verdict::TooManyConnections))?;
    let stream = reach(&addrs)
        .await
        .ok_or_else(|| refuse(Verdict::Unreachable))?;
    Ok((permit, stream))
}

/// Connects to the first of `addrs` that answers, within `CONNECT_TIMEOUT` in all.
async fn reach(addrs: &[SocketAddr]) -> Option<TcpStream> {
    let first = async {
        for a in addrs {
            if let Ok(s) = TcpStream::connect(a).await {
                return Some(s);
            }
        }
        None
    };
    tokio::time::timeout(CONNECT_TIMEOUT, first)
        .await
        .ok()
        .flatten()
}

/// Relays a CONNECT tunnel, which carries TLS only: nothing of the client's
/// goes to the host until its ClientHello has been read whole (within
/// `HELLO_TIMEOUT`, at most `MAX_HELLO_BYTES`) and names the CONNECT host or
/// another allowed one. A ClientHello naming another host (domain fronting
/// through an allowed address), naming none, or not coming at all, closes
/// the tunnel.
async fn tunnel<C: AsyncRead + AsyncWrite + Unpin>(
    proxy: EgressProxy,
    entry: Arc<Entry>,
    mut client: C,
    upstream: TcpStream,
    host: String,
    port: u16,
) {
    let metrics = &proxy.0.metrics;
    let (first, name) = match tokio::time::timeout(HELLO_TIMEOUT, client_hello(&mut client)).await {
        Ok(Some(hello)) => hello,
        _ => {
            entry.record(metrics, &host, port, Verdict::NotTls);
            return;
        }
    };
    if name != host && !entry.allow.allows(&name) {
        entry.record(metrics, &name, port, Verdict::ServerName);
        return;
    }
    entry.record(metrics, &host, port, Verdict::Allowed);
    let mut upstream = Counted::new(upstream);
    let (sent, received) = (upstream.sent.clone(), upstream.received.clone());
    let relay = async {
        upstream.write_all(&first).await?;
        tokio::io::copy_bidirectional(&mut client, &mut upstream).await
    };
    carry(&entry, &host, port, (&sent, &received), relay).await;
}

/// Runs `relay` (a tunnel, or a forwarded request's connection) until it
/// ends, the task ends, or nothing passed either way for `IDLE_TIMEOUT`; then
/// adds its bytes to the task's log. They were counted as they passed
/// (`Counted`), so a connection reset or cut keeps them.
async fn carry<F: std::future::Future>(
    entry: &Entry,
    host: &str,
    port: u16,
    (sent, received): (&AtomicU64, &AtomicU64),
    relay: F,
) {
    tokio::select! {
        _ = relay => {}
        () = entry.ended.cancelled() => {}
        () = idle(sent, received) => {}
    }
    entry.add_bytes(
        host,
        port,
        Verdict::Allowed,
        sent.load(Ordering::Relaxed),
        received.load(Ordering::Relaxed),
    );
}

/// Resolves once no byte has passed either way for `IDLE_TIMEOUT` (checked
/// every `IDLE_CHECK`): an idle connection holds one of its task's slots and
/// the worker's descriptors for nothing.
async fn idle(sent: &AtomicU64, received: &AtomicU64) {
    let total = || sent.load(Ordering::Relaxed) + received.load(Ordering::Relaxed);
    let (mut last, mut still) = (total(), Duration::ZERO);
    loop {
        tokio::time::sleep(IDLE_CHECK).await;
        let now = total();
        if now == last {
            still += IDLE_CHECK;
            if still >= IDLE_TIMEOUT {
                return;
            }
        } else {
            (last, still) = (now, Duration::ZERO);
        }
    }
}

/// Reads a TLS ClientHello whole: the bytes read, and the server name it
/// asks for. `None`: not TLS, malformed, too large, without a server name,
/// or the client closed first.
async fn client_hello<C: AsyncRead + Unpin>(client: &mut C) -> Option<(Vec<u8>, String)> {
    let mut first = Vec::new();
    let mut acceptor = rustls::server::Acceptor::default();
    let mut chunk = [0u8; 4096];
    loop {
        let n = client.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
        first.extend_from_slice(&chunk[..n]);
        // 0x16: a TLS handshake record.
        if first[0] != 0x16 || first.len() > MAX_HELLO_BYTES {
            return None;
        }
        let mut rest = &chunk[..n];
        while !rest.is_empty() {
            match acceptor.read_tls(&mut rest) {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
        match acceptor.accept() {
            Ok(Some(accepted)) => {
                let name = accepted.client_hello().server_name().map(fold_host)?;
                return Some((first, name));
            }
            Ok(None) => continue,
            Err(_) => return None,
        }
    }
}

/// A plain HTTP request in absolute form (`GET http://host/path`), sent on to
/// the host over a connection of its own.
async fn forward(proxy: EgressProxy, entry: Arc<Entry>, req: Request<Incoming>) -> Response<Body> {
    let metrics = &proxy.0.metrics;
    if req.uri().scheme_str() != Some("http") {
        entry.record(metrics, &req.uri().to_string(), 0, Verdict::BadRequest);
        return text(
            StatusCode::BAD_REQUEST,
            Verdict::BadRequest,
            "this is an HTTP proxy: send http:// requests in absolute form, and CONNECT for \
             https (tools do both when HTTP_PROXY and HTTPS_PROXY are set)"
                .to_owned(),
        );
    }
    let Some((host, port)) = target(req.uri(), Some(80)) else {
        entry.record(metrics, &req.uri().to_string(), 0, Verdict::BadRequest);
        return text(
            StatusCode::BAD_REQUEST,
            Verdict::BadRequest,
            "the request names no host".to_owned(),
        );
    };
    let (permit, stream) = match admit(&proxy, &entry, &host, port).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    let unreachable = || {
        entry.record(metrics, &host, port, Verdict::Unreachable);
        refusal(&proxy, Verdict::Unreachable, &host, port)
    };
    let counted = Counted::new(stream);
    let (sent, received) = (counted.sent.clone(), counted.received.clone());
    let (mut sender, conn) =
        match hyper::client::conn::http1::handshake(TokioIo::new(counted)).await {
            Ok(pair) => pair,
            Err(_) => return unreachable(),
        };
    {
        let (entry, host) = (entry.clone(), host.clone());
        let open = entry.opened();
        tokio::spawn(async move {
            let (_permit, _open) = (permit, open);
            carry(&entry, &host, port, (&sent, &received), conn).await;
        });
    }
    let (mut parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    parts.uri = match path.parse() {
        Ok(uri) => uri,
        Err(_) => return refusal(&proxy, Verdict::BadRequest, &host, port),
    };
    // What `Connection` names is hop-by-hop too.
    let named: Vec<String> = parts
        .headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|h| h.trim().to_ascii_lowercase())
        .collect();
    for h in HOP_BY_HOP
        .iter()
        .copied()
        .chain(named.iter().map(String::as_str))
    {
        parts.headers.remove(h);
    }
    // The host is the one checked, whatever `Host` the client sent: another
    // name there would reach another site behind the same address (RFC 9112,
    // 3.2.2: a proxy replaces it with the target's).
    let authority = if port == 80 {
        host.clone()
    } else {
        format!("{host}:{port}")
    };
    match HeaderValue::from_str(&authority) {
        Ok(v) => {
            parts.headers.insert(HOST, v);
        }
        Err(_) => return refusal(&proxy, Verdict::BadRequest, &host, port),
    }
    let sent = sender.send_request(Request::from_parts(parts, body));
    match tokio::time::timeout(RESPONSE_TIMEOUT, sent).await {
        Ok(Ok(resp)) => {
            entry.record(metrics, &host, port, Verdict::Allowed);
            resp.map(BodyExt::boxed)
        }
        _ => unreachable(),
    }
}

/// The proxy's answer to a refused attempt: what was refused and why, so
/// the task's log (and its author) can tell.
fn refusal(proxy: &EgressProxy, v: Verdict, host: &str, port: u16) -> Response<Body> {
    let why = match v {
        Verdict::NotAllowed => "the host is not on this task's allow-list".to_owned(),
        Verdict::Port => format!(
            "port {port} is not open through the proxy (open: {})",
            proxy
                .policy()
                .ports
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Verdict::PrivateAddress => {
            "the name resolves to a private, loopback or special address".to_owned()
        }
        Verdict::Unresolved => "the name does not resolve".to_owned(),
        Verdict::Unreachable => "the host did not answer".to_owned(),
        Verdict::ServerName => "the TLS server name is not allowed".to_owned(),
        Verdict::NotTls => "a tunnel carries TLS naming its host only".to_owned(),
        Verdict::TooManyConnections => format!(
            "the task has {} connections open, the most it may",
            super::MAX_CONNECTIONS_PER_TASK
        ),
        Verdict::BadRequest => "the request could not be forwarded".to_owned(),
        Verdict::Allowed => String::new(),
    };
    let status = match v {
        Verdict::Unreachable => StatusCode::BAD_GATEWAY,
        Verdict::BadRequest => StatusCode::BAD_REQUEST,
        Verdict::TooManyConnections => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::FORBIDDEN,
    };
    text(status, v, format!("refused {host}:{port}: {why}"))
}

fn text(status: StatusCode, v: Verdict, message: String) -> Response<Body> {
    let body = format!("script-runner egress proxy: {message}\n");
    let mut r = Response::new(Full::new(Bytes::from(body)).map_err(|n| match n {}).boxed());
    *r.status_mut() = status;
    let verdict = serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    if let Ok(h) = HeaderValue::from_str(&verdict) {
        r.headers_mut().insert("x-script-runner-egress", h);
    }
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("text/plain"));
    r
}

fn empty() -> Body {
    Full::new(Bytes::new()).map_err(|n| match n {}).boxed()
}

/// A stream that counts the bytes through it.
struct Counted {
    inner: TcpStream,
    sent: Arc<AtomicU64>,
    received: Arc<AtomicU64>,
}

impl Counted {
    fn new(inner: TcpStream) -> Counted {
        Counted {
            inner,
            sent: Arc::default(),
            received: Arc::default(),
        }
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = (buf.filled().len() - before) as u64;
        self.received.fetch_add(n, Ordering::Relaxed);
        r
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = r {
            self.sent.fetch_add(n as u64, Ordering::Relaxed);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
