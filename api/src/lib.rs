//! The MCP front end of script-runner: stateless Streamable HTTP at `POST /mcp`
//! and Prometheus `GET /metrics` behind a bearer token, and an open `GET /healthz`.
//! With OAuth on (`crate::oauth`), the bearer may also be an access token of the
//! configured issuer, and the RFC 9728 metadata is served, open, under
//! `/.well-known/oauth-protected-resource`.
//!
//! `run(listener, config, shutdown)` is the whole server; the binary only loads
//! the config and binds. Tests start it on port 0.

pub mod auth;
pub mod clients;
pub mod config;
pub mod db;
pub mod http;
mod janitor;
mod metrics;
pub mod oauth;
pub mod origin;
mod throttle;
pub mod tools;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use store::redis_setup::{self, SetupError};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use config::Config;
use db::{Store, StoreError};
use oauth::OAuth;
use tools::ScriptRunner;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the HTTP server failed: {0}")]
    Serve(#[from] std::io::Error),
    #[error(transparent)]
    RedisSetup(#[from] SetupError),
    #[error(
        "OAuth is on but the system's root certificates could not be loaded (to reach \
         OAUTH_ISSUER over https; SSL_CERT_FILE names another file): {0}"
    )]
    OAuthRoots(std::io::Error),
    #[error("cannot listen on HEALTH_ADDR {addr}: {source}")]
    HealthListen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
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
    let redis = store::redis_pool::target(&config.redis)
        .await
        .map_err(StoreError::from)?;
    let (url, mode) = (redis.clone(), config.redis_setup_check);
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
    let health = match config.health_addr {
        Some(addr) => {
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|source| ApiError::HealthListen { addr, source })?;
            let store = Store::new(&redis, config.keys.clone(), config.redis.replica_ack)?;
            Some((listener, store))
        }
        None => None,
    };
    // rmcp answers the requests in flight with a 500 the moment its token is
    // cancelled; waiting calls (`wait_seconds`) wake on `cancel` and answer
    // with a status within milliseconds, so rmcp's token follows a moment later.
    let rmcp_cancel = CancellationToken::new();
    tokio::spawn({
        let (cancel, rmcp_cancel) = (cancel.clone(), rmcp_cancel.clone());
        async move {
            cancel.cancelled().await;
            tokio::time::sleep(WAITERS_ANSWER_GRACE).await;
            rmcp_cancel.cancel();
        }
    });
    if let Some(idle) = config.workspace_idle {
        let store = Store::new(&redis, config.keys.clone(), config.redis.replica_ack)?;
        tokio::spawn(janitor::run(store, idle, cancel.clone()));
    }
    let spec_key = config.signer.key_id();
    let app = router(config, &redis, cancel.clone(), rmcp_cancel)?;
    tracing::info!(addr = %listener.local_addr()?, %spec_key, "api listening");
    if let Some((listener, store)) = health {
        tracing::info!(addr = %listener.local_addr()?, "health details listening (loopback)");
        let app = Router::new()
            .route("/healthz", get(healthz_details))
            .with_state(store);
        let stop = cancel.clone();
        tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await;
            if let Err(e) = served {
                tracing::warn!(error = %e, "the health details listener stopped");
            }
        });
    }
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

/// How long after the shutdown signal rmcp's own token is cancelled, ending
/// whatever request is still in flight with a 500: waiting calls answer first.
const WAITERS_ANSWER_GRACE: Duration = Duration::from_secs(1);

/// The axum app: `/mcp` (authenticated), `/healthz` (open), and with OAuth on
/// the Protected Resource Metadata (open).
/// `redis` is where `config.redis` leads (`store::redis_pool::target`). `cancel`: the shutdown, which waiting calls
/// answer at once; `rmcp_cancel`: rmcp's token, which ends what is left.
pub fn router(
    config: Config,
    redis: &store::redis_pool::RedisTarget,
    cancel: CancellationToken,
    rmcp_cancel: CancellationToken,
) -> Result<Router, ApiError> {
    let config = Arc::new(config);
    let store = Store::new(redis, config.keys.clone(), config.redis.replica_ack)?;
    // `http::mcp_body` enforces the limit before rmcp reads anything; rmcp's own
    // is the same number, as a second fence.
    let mcp_config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_allowed_hosts(config.allowed_hosts.clone())
        .with_max_request_body_bytes(config.http.max_request_bytes)
        .with_cancellation_token(rmcp_cancel);
    // Built once (the tool definitions with them); cloned per request.
    let runner = ScriptRunner::new(store.clone(), config.clone(), cancel.clone());
    let factory = move || Ok(runner.clone());
    let mcp = StreamableHttpService::new(
        factory,
        Arc::new(NeverSessionManager::default()),
        mcp_config,
    );
    let oauth = match &config.oauth {
        Some(settings) => Some(OAuth::new(settings.clone()).map_err(ApiError::OAuthRoots)?),
        None => None,
    };
    let auth = auth::Authenticator::new(
        &config.token,
        config.metrics_token.as_deref(),
        store.clone(),
        oauth.clone(),
    );
    // Layers run outside in: the client's share of requests in flight, then the
    // Origin (no I/O; a foreign origin gets 403 whatever its token, see
    // `origin`), then the token, so no body of an unauthenticated request is
    // ever read; then the body gate.
    let mcp = Router::new()
        .route_service("/mcp", mcp)
        .layer(middleware::from_fn_with_state(
            http::BodyGate::new(&config.http),
            http::mcp_body,
        ));
    let authed = Router::new()
        .merge(mcp)
        .merge(
            Router::new()
                .route(auth::METRICS_PATH, get(metrics::handler))
                .layer(middleware::from_fn(auth::require_metrics_reader)),
        )
        .with_state(store.clone())
        .layer(middleware::from_fn_with_state(auth, auth::require_bearer))
        .layer(middleware::from_fn_with_state(
            origin::OriginGate::new(config.allowed_origins.clone()),
            origin::require_allowed_origin,
        ))
        // Outermost: a client past its share is refused before anything else.
        .layer(middleware::from_fn_with_state(
            http::ClientGate::new(&config.http),
            http::client_limits,
        ));
    let mut open = Router::new().route("/healthz", get(healthz));
    if let Some(settings) = oauth.as_ref().map(OAuth::settings) {
        open = open.merge(metadata_routes(settings));
    }
    Ok(open.with_state(store).merge(authed))
}

/// The Protected Resource Metadata at each of `OAuthSettings::metadata_paths`
/// (one route per path: axum refuses a path routed twice, at start).
fn metadata_routes<S: Clone + Send + Sync + 'static>(settings: &oauth::OAuthSettings) -> Router<S> {
    let metadata = Arc::new(settings.metadata());
    let mut routes = Router::new();
    for path in settings.metadata_paths() {
        let metadata = metadata.clone();
        routes = routes.route(
            &path,
            get(move || protected_resource_metadata(metadata.clone())),
        );
    }
    routes
}

/// RFC 9728 Protected Resource Metadata: public, so any origin may read it
/// (browser-based MCP clients fetch it too).
async fn protected_resource_metadata(metadata: Arc<serde_json::Value>) -> Response {
    let mut resp = axum::Json(metadata.as_ref().clone()).into_response();
    let headers = resp.headers_mut();
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=3600"),
    );
    resp
}

/// Failed health checks, for the log: `/healthz` is public and polled, so a
/// Redis outage must not become a line per request.
static HEALTH_FAILURES: throttle::Throttle = throttle::Throttle::new();

/// Whether Redis answers a PING within a second; why not, if it does not.
async fn redis_health(store: &Store) -> Result<(), String> {
    match tokio::time::timeout(Duration::from_secs(1), store.ping()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("Redis did not answer a PING within 1 s".to_owned()),
    }
}

/// `/healthz` on `HEALTH_ADDR` (loopback only): the public answer with its
/// reason, for an operator on the host (or Docker's health check, which runs
/// inside the container) who should not have to search the log.
async fn healthz_details(State(store): State<Store>) -> Response {
    match redis_health(&store).await {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("unavailable: {reason}\n"),
        )
            .into_response(),
    }
}

/// 200 "ok" when Redis answers a PING within a second, else 503 "unavailable".
/// The reason goes to the log only (and to `HEALTH_ADDR`): this answer is
/// public, and Redis's error text (addresses, ACL user names) is nobody's
/// business outside.
async fn healthz(State(store): State<Store>) -> Response {
    let Err(failure) = redis_health(&store).await else {
        return (StatusCode::OK, "ok\n").into_response();
    };
    if let Some(failed) = HEALTH_FAILURES.tick() {
        tracing::warn!(
            reason = %failure,
            failed,
            "/healthz answered 503 (this is the first failure in {} s, `failed` counts it \
             and those not logged since)",
            throttle::EVERY.as_secs()
        );
    }
    (StatusCode::SERVICE_UNAVAILABLE, "unavailable\n").into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A resource without a path puts both metadata URLs at the root: routed
    /// twice, axum would panic at start.
    #[test]
    fn a_resource_without_a_path_routes_its_metadata_once() {
        for resource in [
            "https://mcp.example.com",
            "https://mcp.example.com/",
            "https://mcp.example.com/mcp",
        ] {
            let vars = [
                ("OAUTH_ISSUER", "https://id.example.com"),
                ("OAUTH_RESOURCE", resource),
            ];
            let lookup = shared::envvar::non_blank(shared::envvar::lookup_of(&vars));
            let settings = oauth::OAuthSettings::from_lookup(&lookup)
                .ok()
                .flatten()
                .expect("OAuth on");
            let _: Router = metadata_routes(&settings);
        }
    }
}
