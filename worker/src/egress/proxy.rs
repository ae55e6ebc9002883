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
use hyper::header::{HOST, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use shared::egress::{Verdict, fold_host};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::{EgressProxy, Entry};

type Body = BoxBody<Bytes, hyper::Error>;

/// How long the proxy tries to reach an allowed host.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a tunnel waits for the client's first bytes (a TLS ClientHello).
const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(10);
/// A ClientHello larger than this is not read for its server name.
const MAX_HELLO_BYTES: usize = 16 * 1024;

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
        let body = "script-runner egress proxy: no task at this address\n";
        let head = format!(
            "HTTP/1.1 403 Forbidden\r\ncontent-type: text/plain\r\nconnection: close\r\n\
             content-length: {}\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(head.as_bytes()).await;
        return;
    };
    let service = hyper::service::service_fn(move |req| {
        let (proxy, entry) = (proxy.clone(), entry.clone());
        async move { Ok::<_, Infallible>(handle(proxy, entry, req).await) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .preserve_header_case(true)
        .title_case_headers(true)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades()
        .await;
    if let Err(e) = served {
        tracing::debug!(%peer, error = %e, "egress proxy connection ended");
    }
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
    let addrs = match proxy.policy().decide(&entry.allow, &host, port).await {
        Ok(addrs) => addrs,
        Err(v) => {
            entry.record(metrics, &host, port, v);
            return refusal(&proxy, v, &host, port);
        }
    };
    let upstream = match reach(&addrs).await {
        Some(s) => s,
        None => {
            entry.record(metrics, &host, port, Verdict::Unreachable);
            return refusal(&proxy, Verdict::Unreachable, &host, port);
        }
    };
    entry.record(metrics, &host, port, Verdict::Allowed);
    tokio::spawn(async move {
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => {
                tunnel(proxy, entry, TokioIo::new(upgraded), upstream, host, port).await
            }
            Err(e) => tracing::debug!(error = %e, "egress proxy: CONNECT not upgraded"),
        }
    });
    Response::new(empty())
}

/// Connects to the first of `addrs` that answers.
async fn reach(addrs: &[SocketAddr]) -> Option<TcpStream> {
    for a in addrs {
        if let Ok(Ok(s)) = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(a)).await {
            return Some(s);
        }
    }
    None
}

/// Relays a CONNECT tunnel. If the client opens with a TLS ClientHello, its
/// server name must be the CONNECT host or another allowed one: a name
/// fronted by an allowed address (domain fronting) is refused.
async fn tunnel<C: AsyncRead + AsyncWrite + Unpin>(
    proxy: EgressProxy,
    entry: Arc<Entry>,
    mut client: C,
    mut upstream: TcpStream,
    host: String,
    port: u16,
) {
    let mut first = Vec::new();
    let mut acceptor = rustls::server::Acceptor::default();
    let mut chunk = [0u8; 4096];
    let server_name = loop {
        let n = match tokio::time::timeout(FIRST_BYTES_TIMEOUT, client.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(n)) => n,
            // A protocol whose server speaks first: nothing to read a name from.
            Err(_) => break None,
        };
        first.extend_from_slice(&chunk[..n]);
        // 0x16: a TLS handshake record.
        if first[0] != 0x16 || first.len() > MAX_HELLO_BYTES {
            break None;
        }
        if acceptor.read_tls(&mut &chunk[..n]).is_err() {
            break None;
        }
        match acceptor.accept() {
            Ok(Some(accepted)) => break accepted.client_hello().server_name().map(fold_host),
            Ok(None) => continue,
            Err(_) => break None,
        }
    };
    if let Some(name) = &server_name
        && *name != host
        && !entry.allow.allows(name)
    {
        entry.record(&proxy.0.metrics, name, port, Verdict::ServerName);
        return;
    }
    if upstream.write_all(&first).await.is_err() {
        return;
    }
    let (out, inb) = tokio::io::copy_bidirectional(&mut client, &mut upstream)
        .await
        .unwrap_or((0, 0));
    entry.add_bytes(&host, port, Verdict::Allowed, out + first.len() as u64, inb);
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
    let addrs = match proxy.policy().decide(&entry.allow, &host, port).await {
        Ok(addrs) => addrs,
        Err(v) => {
            entry.record(metrics, &host, port, v);
            return refusal(&proxy, v, &host, port);
        }
    };
    let Some(stream) = reach(&addrs).await else {
        entry.record(metrics, &host, port, Verdict::Unreachable);
        return refusal(&proxy, Verdict::Unreachable, &host, port);
    };
    entry.record(metrics, &host, port, Verdict::Allowed);
    let counted = Counted::new(stream);
    let (sent, received) = (counted.sent.clone(), counted.received.clone());
    let (mut sender, conn) =
        match hyper::client::conn::http1::handshake(TokioIo::new(counted)).await {
            Ok(pair) => pair,
            Err(_) => return refusal(&proxy, Verdict::Unreachable, &host, port),
        };
    {
        let (entry, host) = (entry.clone(), host.clone());
        tokio::spawn(async move {
            let _ = conn.await;
            entry.add_bytes(
                &host,
                port,
                Verdict::Allowed,
                sent.load(Ordering::Relaxed),
                received.load(Ordering::Relaxed),
            );
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
    parts.headers.remove("proxy-authorization");
    parts.headers.remove("proxy-connection");
    if !parts.headers.contains_key(HOST)
        && let Ok(v) = HeaderValue::from_str(&host)
    {
        parts.headers.insert(HOST, v);
    }
    match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(resp) => resp.map(BodyExt::boxed),
        Err(_) => refusal(&proxy, Verdict::Unreachable, &host, port),
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
        Verdict::BadRequest => "the request could not be forwarded".to_owned(),
        Verdict::Allowed => String::new(),
    };
    let status = match v {
        Verdict::Unreachable => StatusCode::BAD_GATEWAY,
        Verdict::BadRequest => StatusCode::BAD_REQUEST,
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
