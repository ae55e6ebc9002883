//! The MCP front end of script-runner: stateless Streamable HTTP at `POST /mcp`
//! and Prometheus `GET /metrics` behind a bearer token, and an open `GET /healthz`.
//!
//! `run(listener, config, shutdown)` is the whole server; the binary only loads
//! the config and binds. Tests start it on port 0.

pub mod clients;
pub mod config;
pub mod http;
pub mod mcp_tasks;
mod metrics;
pub mod store;
pub mod tools;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use support::redis_setup::{self, SetupError};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use config::Config;
use store::{Store, StoreError};
use tools::ScriptRunner;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the HTTP server failed: {0}")]
    Serve(#[from] std::io::Error),
    #[error(transparent)]
    RedisSetup(#[from] SetupError),
}

/// Serves until `shutdown` resolves, then finishes in-flight requests.
///
/// Redis's setup is checked first (`REDIS_SETUP_CHECK`); a Redis that does not
/// answer yet is checked in the background once it does, and with `refuse` a bad
/// setup found then stops the server with the reason.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ApiError> {
    let (url, mode) = (config.redis_url.clone(), config.redis_setup_check);
    let refused = CancellationToken::new();
    let late_check = match redis_setup::check(&url, mode).await {
        Err(e) if e.is_transient() => {
            tracing::warn!(error = %e, "serving; Redis's setup is checked once it answers");
            let refused = refused.clone();
            Some(tokio::spawn(async move {
                let result =
                    redis_setup::check_until_answered(&url, mode, Duration::from_secs(2)).await;
                if result.is_err() {
                    refused.cancel();
                }
                result
            }))
        }
        other => {
            other?;
            None
        }
    };
    let cancel = CancellationToken::new();
    let limits = config.http.clone();
    let app = router(config, cancel.clone())?;
    tracing::info!(addr = %listener.local_addr()?, "api listening");
    let stop = {
        let refused = refused.clone();
        async move {
            tokio::select! {
                () = shutdown => {}
                () = refused.cancelled() => {}
            }
            cancel.cancel();
        }
    };
    http::serve(listener, app, limits, stop).await?;
    if let Some(check) = late_check {
        if refused.is_cancelled() {
            if let Ok(Err(e)) = check.await {
                return Err(e.into());
            }
        } else {
            check.abort();
        }
    }
    Ok(())
}

/// The axum app: `/mcp` (authenticated) and `/healthz` (open).
pub fn router(config: Config, cancel: CancellationToken) -> Result<Router, StoreError> {
    let config = Arc::new(config);
    let store = Store::new(&config.redis_url, config.keys.clone())?;
    // `http::mcp_body` enforces the limit before rmcp reads anything; rmcp's own
    // is the same number, as a second fence.
    let mcp_config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_allowed_hosts(config.allowed_hosts.clone())
        .with_max_request_body_bytes(config.http.max_request_bytes)
        .with_cancellation_token(cancel);
    let factory = {
        let (store, config) = (store.clone(), config.clone());
        move || Ok(ScriptRunner::new(store.clone(), config.clone()))
    };
    let mcp = StreamableHttpService::new(
        factory,
        Arc::new(NeverSessionManager::default()),
        mcp_config,
    );
    let token = Arc::new(config.token.clone().into_bytes());
    // Layers run outside in: the client's share of requests in flight, then the
    // token, so no body of an unauthenticated request is ever read; then the
    // body gate.
    let mcp = Router::new()
        .route_service("/mcp", mcp)
        .layer(middleware::from_fn_with_state(
            http::BodyGate::new(&config.http),
            http::mcp_body,
        ));
    let authed = Router::new()
        .merge(mcp)
        .route("/metrics", get(metrics::handler))
        .with_state(store.clone())
        .layer(middleware::from_fn_with_state(token, require_bearer))
        // Outermost: a client past its share is refused before anything else.
        .layer(middleware::from_fn_with_state(
            http::ClientGate::new(&config.http),
            http::client_limits,
        ));
    Ok(Router::new()
        .route("/healthz", get(healthz))
        .with_state(store)
        .merge(authed))
}

/// 401 with `WWW-Authenticate: Bearer` unless the request carries the token.
/// Runs before any MCP processing.
async fn require_bearer(State(token): State<Arc<Vec<u8>>>, req: Request, next: Next) -> Response {
    // The scheme name is case-insensitive (RFC 7235).
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes())
        .filter(|v| v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer "))
        .map(|v| v[7..].trim_ascii());
    match presented {
        Some(p) if constant_time_eq(p, &token) => next.run(req).await,
        _ => {
            let mut resp = (
                StatusCode::UNAUTHORIZED,
                "missing or invalid bearer token\n",
            )
                .into_response();
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"script-runner\""),
            );
            resp
        }
    }
}

/// Compares without an early exit, so timing does not reveal how much of a guess
/// was right. (The length of the token is not a secret worth protecting.)
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// 200 when Redis answers a PING within a second, else 503 with the reason.
async fn healthz(State(store): State<Store>) -> Response {
    match tokio::time::timeout(Duration::from_secs(1), store.ping()).await {
        Ok(Ok(())) => (StatusCode::OK, "ok\n").into_response(),
        Ok(Err(e)) => {
            (StatusCode::SERVICE_UNAVAILABLE, format!("unhealthy: {e}\n")).into_response()
        }
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "unhealthy: Redis did not answer within 1 s\n",
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn token_comparison_needs_every_byte() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abd", b"abc"));
        assert!(!constant_time_eq(b"ab", b"abc"));
    }
}
