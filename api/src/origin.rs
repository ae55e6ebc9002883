//! The `Origin` check the Streamable HTTP transport requires of a server (against
//! DNS rebinding and cross-site requests from web pages): a request to `/mcp` or
//! `/metrics` whose `Origin` header names an origin outside `ALLOWED_ORIGINS`
//! gets 403 with a JSON-RPC error. A request without `Origin` (every non-browser
//! client) is served as before. `ALLOWED_ORIGINS` is empty by default: no
//! browser origin is trusted.
//!
//! It runs before the token is checked and before any body is read: the origin
//! is a property of the request that no token can make right, so a foreign
//! origin is told so (not sent through a 401 and a token dance that ends in a
//! 403 anyway), and the refusal costs no key lookup in Redis.
//!
//! rmcp 3.11 has an `allowed_origins` setting of its own, but it runs inside the
//! MCP service (after the token check and after `http::mcp_body` has read the
//! body), covers `/mcp` only, answers in plain text and logs a warning per
//! refused request; so it is left off and this layer does the check.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::Response;

use crate::http::{rpc_error, rpc_response};
use crate::throttle::{self, Throttle};

/// The longest part of a refused `Origin` quoted back in the answer and the log.
const QUOTED_CHARS: usize = 200;

/// `ALLOWED_ORIGINS`, each as `canonical` writes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedOrigins(Vec<String>);

/// An `ALLOWED_ORIGINS` entry that is no origin.
#[derive(Debug, thiserror::Error)]
#[error(
    "{0:?} is not an origin: write each as a browser sends it, scheme://host or \
     scheme://host:port (e.g. https://claude.ai), with no path, user or wildcard"
)]
pub struct BadOrigin(pub String);

impl AllowedOrigins {
    /// Comma-separated origins; blank entries are skipped.
    pub fn parse(raw: &str) -> Result<AllowedOrigins, BadOrigin> {
        raw.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| canonical(s).ok_or_else(|| BadOrigin(s.to_owned())))
            .collect::<Result<Vec<_>, _>>()
            .map(AllowedOrigins)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether a request's `Origin` value names one of them. `null` (sandboxed
    /// frames, `file:` pages) and anything that is no origin never do.
    pub fn allows(&self, origin: &str) -> bool {
        canonical(origin).is_some_and(|o| self.0.contains(&o))
    }
}

/// An origin as RFC 6454 compares them: the scheme and host in lower case and
/// the port written out (80 for `http`, 443 for `https` when left out), so
/// `HTTPS://Claude.AI` and `https://claude.ai:443` are one origin. `None` for
/// what no browser sends as an origin: no scheme or host, a user, a query, a
/// path (a lone `/` is forgiven), `*`, `null`.
pub fn canonical(value: &str) -> Option<String> {
    let uri = Uri::try_from(value.trim()).ok()?;
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let authority = uri.authority()?;
    if authority.as_str().contains('@') || authority.host().is_empty() {
        return None;
    }
    if uri
        .path_and_query()
        .is_some_and(|p| p.as_str() != "/" && !p.as_str().is_empty())
    {
        return None;
    }
    let host = authority.host().to_ascii_lowercase();
    let port = authority.port_u16().or(match scheme.as_str() {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    });
    Some(match port {
        Some(port) => format!("{scheme}://{host}:{port}"),
        None => format!("{scheme}://{host}"),
    })
}

/// What `require_allowed_origin` needs: the list, and the refusals' log budget.
#[derive(Clone)]
pub struct OriginGate {
    allowed: Arc<AllowedOrigins>,
    log: Arc<Throttle>,
}

impl OriginGate {
    pub fn new(allowed: AllowedOrigins) -> OriginGate {
        OriginGate {
            allowed: Arc::new(allowed),
            log: Arc::new(Throttle::new()),
        }
    }
}

/// 403 with a JSON-RPC error when an `Origin` header names an origin outside
/// `ALLOWED_ORIGINS`; otherwise (no `Origin`, or an allowed one) the request
/// goes on. The body is never read.
pub async fn require_allowed_origin(
    State(gate): State<OriginGate>,
    req: Request,
    next: Next,
) -> Response {
    let refused = req
        .headers()
        .get_all(header::ORIGIN)
        .iter()
        .find(|v| !v.to_str().is_ok_and(|v| gate.allowed.allows(v)));
    let Some(origin) = refused.map(quoted) else {
        return next.run(req).await;
    };
    if let Some(refused) = gate.log.tick() {
        tracing::warn!(
            origin,
            refused,
            "a request from a browser origin outside ALLOWED_ORIGINS was answered 403 \
             (this is the first in {} s, `refused` counts it and those not logged since)",
            throttle::EVERY.as_secs()
        );
    }
    crate::http::refused_unread(req.headers(), forbidden(&origin, gate.allowed.is_empty()))
}

/// The header's text, cut to `QUOTED_CHARS` characters.
fn quoted(value: &HeaderValue) -> String {
    let text = String::from_utf8_lossy(value.as_bytes());
    match text.char_indices().nth(QUOTED_CHARS) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.into_owned(),
    }
}

fn forbidden(origin: &str, none_allowed: bool) -> Response {
    let why = if none_allowed {
        "this server trusts no browser origin (ALLOWED_ORIGINS is empty)"
    } else {
        "it is not in this server's ALLOWED_ORIGINS"
    };
    let message = format!(
        "Forbidden: the Origin {origin:?} is not allowed: {why}; clients that send no \
         Origin header are served"
    );
    rpc_response(StatusCode::FORBIDDEN, rpc_error(None, -32000, &message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_compare_by_scheme_host_and_port() {
        let allowed = AllowedOrigins::parse(" https://claude.ai , http://localhost:6274,")
            .expect("two origins");
        for yes in [
            "https://claude.ai",
            "HTTPS://Claude.AI",
            "https://claude.ai:443",
            "http://localhost:6274",
        ] {
            assert!(allowed.allows(yes), "{yes}");
        }
        for no in [
            "https://evil.example.com",
            "http://claude.ai",
            "https://claude.ai:8443",
            "https://claude.ai.evil.example",
            "https://evil@claude.ai",
            "https://claude.ai/path",
            "http://localhost",
            "null",
            "",
            "claude.ai",
        ] {
            assert!(!allowed.allows(no), "{no}");
        }
        assert!(!AllowedOrigins::default().allows("https://claude.ai"));
        let ipv6 = AllowedOrigins::parse("http://[::1]:3000").expect("an IPv6 origin");
        assert!(ipv6.allows("http://[::1]:3000") && !ipv6.allows("http://[::1]:3001"));
    }

    #[test]
    fn entries_that_are_no_origin_are_refused_by_name() {
        for bad in [
            "*",
            "null",
            "claude.ai",
            "https://claude.ai/mcp",
            "https://u@x.ai",
        ] {
            let e = AllowedOrigins::parse(&format!("https://ok.example,{bad}"))
                .err()
                .map(|e| e.to_string());
            assert!(
                e.as_deref()
                    .is_some_and(|m| m.starts_with(&format!("{bad:?} is not an origin"))),
                "{bad}: {e:?}"
            );
        }
        assert!(AllowedOrigins::parse(" , ").is_ok_and(|a| a.is_empty()));
    }

    #[test]
    fn a_long_origin_is_quoted_cut() {
        let long =
            HeaderValue::from_str(&format!("https://{}.example", "a".repeat(500))).expect("header");
        assert_eq!(quoted(&long).chars().count(), QUOTED_CHARS + 3);
    }
}
