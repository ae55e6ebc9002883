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
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

use crate::config::AllowedOrigins;
use crate::http::{rpc_error, rpc_response};
use crate::throttle::{self, Throttle};

/// The longest part of a refused `Origin` quoted back in the answer and the log.
const QUOTED_CHARS: usize = 200;

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
    fn a_long_origin_is_quoted_cut() {
        let long =
            HeaderValue::from_str(&format!("https://{}.example", "a".repeat(500))).expect("header");
        assert_eq!(quoted(&long).chars().count(), QUOTED_CHARS + 3);
    }
}
