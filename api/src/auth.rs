//! Who a request comes from. `authenticate` reads the bearer token and answers
//! with a `Principal`: the operator's admin key (`SCRIPT_RUNNER_TOKEN`), or an
//! API key's `Grant` (its name as owner, its scopes and quotas), looked up in
//! Redis on every request so a revoked key is refused at once by every replica.
//! `require_bearer` puts the principal in the request's extensions, where the
//! tools find it (`tools::runner`). The metrics token (`METRICS_TOKEN`) is no
//! principal: on `METRICS_PATH` it lets the request through as a
//! `MetricsReader`, and anywhere else it is an unknown token.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use shared::apikey::KEY_PREFIX;
pub use shared::apikey::{Limits, Scope, Scopes};
use shared::egress::AllowList;
use subtle::ConstantTimeEq;

use crate::db::{Store, StoreError};
use crate::oauth::{OAuth, OAuthError, OAuthGrant, OAuthScope};
use crate::throttle::{self, Throttle};
use shared::Owner;

/// The one route `METRICS_TOKEN` opens.
pub const METRICS_PATH: &str = "/metrics";

/// What a 503 says when an API key could not be looked up. Fixed: the caller is
/// not authenticated yet, and the store's error (Redis's address, its ACL user,
/// `WRONGPASS`) is for the log only.
const KEY_UNCHECKED: &str =
    "the API key could not be checked just now (the key store did not answer); try again shortly";

/// In a request's extensions when it carried `METRICS_TOKEN` to `METRICS_PATH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsReader;

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// `SCRIPT_RUNNER_TOKEN`: every scope, every task, no quota, no owner.
    Admin,
    /// An API key or an OAuth access token: only its own tasks.
    Owner(Grant),
}

/// What a key may do, and as whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The key (by name) or OAuth subject: the tasks' owner.
    pub owner: Owner,
    pub scopes: Scopes,
    pub limits: Limits,
    /// The most its allow-lists may name (`keys create --allow-hosts`);
    /// `None`: any, within the operator's `EGRESS_ALLOW_HOSTS`.
    pub allow_hosts: Option<AllowList>,
}

impl Principal {
    /// The owner its tasks are recorded under and filtered by.
    pub fn owner(&self) -> &Owner {
        match self {
            Principal::Admin => &shared::owner::ADMIN,
            Principal::Owner(g) => &g.owner,
        }
    }

    /// The scopes it holds.
    pub fn scopes(&self) -> Scopes {
        match self {
            Principal::Admin => Scopes::ALL,
            Principal::Owner(g) => g.scopes,
        }
    }

    /// Whether a task recorded with `owner` (`None`: the admin's) is visible
    /// to it: the admin sees every task, a key only its own.
    pub fn sees(&self, owner: Option<&Owner>) -> bool {
        match self {
            Principal::Admin => true,
            Principal::Owner(g) => owner == Some(&g.owner),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// No bearer token, or one that is no key: 401, the same for every cause.
    #[error("missing or invalid bearer token")]
    Unauthorized,
    /// The key could not be looked up: 503 (the key may be fine). The message
    /// is `KEY_UNCHECKED`, whatever the cause; the cause is its source.
    #[error("{KEY_UNCHECKED}")]
    Unavailable(#[source] StoreError),
    /// An OAuth access token was refused (OAuth on): 401 with
    /// `error="invalid_token"` and the reason, never the token.
    #[error(transparent)]
    InvalidToken(OAuthError),
    /// The issuer's keys could not be fetched and none are cached: 503.
    #[error(transparent)]
    OAuthUnavailable(OAuthError),
}

/// Checks bearer tokens: the admin token (and the metrics token) in constant
/// time, API keys by their SHA-256 in Redis, and with OAuth on, JWT access
/// tokens of the issuer.
#[derive(Clone)]
pub struct Authenticator {
    admin_token: Arc<Vec<u8>>,
    /// `METRICS_TOKEN`, if set.
    metrics_token: Option<Arc<Vec<u8>>>,
    store: Store,
    /// The log budget of the 503s a key lookup's failure causes: a client can
    /// repeat them at will while Redis is down.
    unavailable_log: Arc<Throttle>,
    oauth: Option<OAuth>,
    /// The `WWW-Authenticate` challenge: `Bearer realm=...`, and with OAuth on
    /// `resource_metadata` and `scope` (RFC 9728 §5.1).
    challenge: Arc<str>,
}

impl Authenticator {
    pub fn new(
        admin_token: &str,
        metrics_token: Option<&str>,
        store: Store,
        oauth: Option<OAuth>,
    ) -> Authenticator {
        let challenge = match oauth.as_ref().map(OAuth::settings) {
            None => "Bearer realm=\"script-runner\"".to_owned(),
            Some(s) => format!(
                "Bearer realm=\"script-runner\", resource_metadata=\"{}\", scope=\"{}\"",
                s.metadata_url(),
                s.scopes
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        };
        Authenticator {
            admin_token: Arc::new(admin_token.as_bytes().to_vec()),
            metrics_token: metrics_token.map(|t| Arc::new(t.as_bytes().to_vec())),
            store,
            unavailable_log: Arc::new(Throttle::new()),
            oauth,
            challenge: challenge.into(),
        }
    }

    /// 401 with the challenge; with OAuth on and a token presented,
    /// `error="invalid_token"` and `why` (never the token) too.
    fn unauthorized(&self, presented: bool, why: Option<&str>) -> Response {
        let mut resp = (
            StatusCode::UNAUTHORIZED,
            "missing or invalid bearer token\n",
        )
            .into_response();
        let mut value = self.challenge.to_string();
        if self.oauth.is_some() && presented {
            value.push_str(", error=\"invalid_token\"");
            if let Some(why) = why {
                value.push_str(&format!(
                    ", error_description=\"{}\"",
                    quoted_string_safe(why)
                ));
            }
        }
        let value = HeaderValue::from_str(&value)
            .unwrap_or_else(|_| HeaderValue::from_static("Bearer realm=\"script-runner\""));
        resp.headers_mut().insert(header::WWW_AUTHENTICATE, value);
        resp
    }

    /// Whether the request's bearer token is `METRICS_TOKEN` (compared in
    /// constant time). Asked only on `METRICS_PATH`.
    fn is_metrics_token(&self, headers: &HeaderMap) -> bool {
        match (&self.metrics_token, bearer(headers)) {
            (Some(token), Some(presented)) => token_matches(presented, token),
            _ => false,
        }
    }

    /// The principal the request's `Authorization: Bearer` header names.
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, AuthError> {
        let presented = bearer(headers).ok_or(AuthError::Unauthorized)?;
        if token_matches(presented, &self.admin_token) {
            return Ok(Principal::Admin);
        }
        if !presented.starts_with(KEY_PREFIX.as_bytes()) {
            return match &self.oauth {
                Some(oauth) if looks_like_jwt(presented) => {
                    let token = String::from_utf8_lossy(presented);
                    match oauth.authenticate(&token).await {
                        Ok(grant) => Ok(Principal::Owner(grant_of(grant))),
                        Err(e) if e.is_unavailable() => Err(AuthError::OAuthUnavailable(e)),
                        Err(e) => Err(AuthError::InvalidToken(e)),
                    }
                }
                _ => Err(AuthError::Unauthorized),
            };
        }
        // No cache: a revoked or rotated key is refused from the next request
        // on, by every replica. The lookup is one HGETALL (docs/security.md).
        match self.store.api_key(presented).await {
            Ok(Some(record)) => Ok(Principal::Owner(Grant {
                owner: Owner::Key(record.name),
                scopes: record.scopes,
                limits: record.limits,
                allow_hosts: record.allow_hosts,
            })),
            Ok(None) => Err(AuthError::Unauthorized),
            Err(StoreError::ApiKey(e)) => {
                // A record this version cannot read: the key is unusable, and
                // saying so to the caller would tell it the key exists.
                tracing::error!(error = %e, "an API key record is malformed; refusing the key");
                Err(AuthError::Unauthorized)
            }
            Err(e) => Err(AuthError::Unavailable(e)),
        }
    }
}

/// An OAuth grant as the tools see every owner.
fn grant_of(g: OAuthGrant) -> Grant {
    let scopes = g.scopes.iter().fold(Scopes::NONE, |set, s| {
        set.with(match s {
            OAuthScope::Run => Scope::Run,
            OAuthScope::Read => Scope::Read,
            OAuthScope::Kill => Scope::Kill,
        })
    });
    Grant {
        owner: g.owner,
        scopes,
        limits: Limits {
            max_queued: g.limits.max_queued,
            max_running: g.limits.max_running,
            cpu_seconds_per_day: g.limits.cpu_seconds_per_day,
            networks: g.limits.networks,
        },
        allow_hosts: None,
    }
}

/// Three dot-separated base64url parts, as a JWS compact serialisation has;
/// neither the admin token nor an API key (`srk_...`) looks like this.
fn looks_like_jwt(token: &[u8]) -> bool {
    token.split(|&b| b == b'.').count() == 3
        && token
            .iter()
            .all(|&b| b == b'.' || b == b'-' || b == b'_' || b.is_ascii_alphanumeric())
}

/// `text` as RFC 6750 allows inside `error_description`: printable ASCII
/// without `"` and `\`.
fn quoted_string_safe(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '"' | '\\' => '\'',
            ' '..='~' => c,
            _ => '?',
        })
        .collect()
}

/// The bearer token of `Authorization`, trimmed; the scheme name is
/// case-insensitive (RFC 7235).
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    headers
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes())
        .filter(|v| v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer "))
        .map(|v| v[7..].trim_ascii())
}

/// 401 with `WWW-Authenticate: Bearer` unless the request carries a valid
/// token, 503 when the key store cannot say; otherwise the request goes on with
/// its `Principal` in its extensions. Runs before any MCP processing.
pub async fn require_bearer(
    State(auth): State<Authenticator>,
    mut req: Request,
    next: Next,
) -> Response {
    // METRICS_TOKEN opens the metrics and nothing else: on any other path it
    // goes through `authenticate` like every unknown token, and is refused as one.
    if req.uri().path() == METRICS_PATH && auth.is_metrics_token(req.headers()) {
        req.extensions_mut().insert(MetricsReader);
        return next.run(req).await;
    }
    let presented = bearer(req.headers()).is_some();
    let refused = match auth.authenticate(req.headers()).await {
        Ok(principal) => {
            req.extensions_mut().insert(principal);
            return next.run(req).await;
        }
        Err(AuthError::Unauthorized) => auth.unauthorized(presented, None),
        Err(AuthError::InvalidToken(e)) => {
            tracing::debug!(reason = %e, "refused an OAuth access token");
            auth.unauthorized(presented, Some(&e.to_string()))
        }
        Err(AuthError::Unavailable(cause)) => {
            if let Some(refused) = auth.unavailable_log.tick() {
                tracing::warn!(
                    error = %cause,
                    refused,
                    "a request was answered 503: its API key could not be looked up (this is \
                     the first in {} s, `refused` counts it and those not logged since)",
                    throttle::EVERY.as_secs()
                );
            }
            let mut resp = (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("{KEY_UNCHECKED}\n"),
            )
                .into_response();
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            resp
        }
        Err(e @ AuthError::OAuthUnavailable(_)) => {
            let mut resp = (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the token could not be checked: {e}\n"),
            )
                .into_response();
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            resp
        }
    };
    crate::http::refused_unread(req.headers(), refused)
}

/// `/metrics` is the operator's: it counts every owner's tasks. The metrics
/// token or the admin token reads it; an API key or an access token gets 403.
pub async fn require_metrics_reader(req: Request, next: Next) -> Response {
    let reader = req.extensions().get::<MetricsReader>().is_some()
        || req.extensions().get::<Principal>() == Some(&Principal::Admin);
    if reader {
        return next.run(req).await;
    }
    (
        StatusCode::FORBIDDEN,
        "/metrics needs METRICS_TOKEN or the admin token (SCRIPT_RUNNER_TOKEN), not an API key \
         or an access token\n",
    )
        .into_response()
}

/// Compares in constant time (`subtle`), so timing does not reveal how much of
/// a guess was right. (A length mismatch answers at once: the length of the
/// token is not a secret worth protecting.)
fn token_matches(presented: &[u8], token: &[u8]) -> bool {
    presented.ct_eq(token).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_jws_shaped_tokens_go_to_oauth() {
        assert!(looks_like_jwt(
            b"eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhIn0.c2ln-_"
        ));
        assert!(!looks_like_jwt(b"0123456789abcdef0123456789abcdef"));
        assert!(!looks_like_jwt(b"srk_abc"));
        assert!(!looks_like_jwt(b"a.b"));
        assert!(!looks_like_jwt(b"a.b.c.d.e"));
        assert!(!looks_like_jwt(b"a.b c.d"));
    }

    #[test]
    fn an_error_description_cannot_break_out_of_its_quotes() {
        assert_eq!(quoted_string_safe("a \"b\" \\ c\u{e9}\n"), "a 'b' ' c??");
    }

    #[test]
    fn token_comparison_needs_every_byte() {
        assert!(token_matches(b"abc", b"abc"));
        assert!(!token_matches(b"abd", b"abc"));
        assert!(!token_matches(b"ab", b"abc"));
        assert!(!token_matches(b"abcd", b"abc"));
        assert!(!token_matches(b"", b"abc"));
    }

    #[test]
    fn a_key_sees_only_its_own_tasks_and_the_admin_all() {
        let key = |n: &str| Owner::Key(n.to_owned());
        let alice = Principal::Owner(Grant {
            owner: key("alice"),
            scopes: Scopes::ALL,
            limits: Limits::default(),
            allow_hosts: None,
        });
        assert!(alice.sees(Some(&key("alice"))));
        assert!(!alice.sees(Some(&key("bob"))));
        assert!(!alice.sees(Some(&Owner::OAuth("alice".into()))));
        assert!(!alice.sees(None));
        assert!(Principal::Admin.sees(None) && Principal::Admin.sees(Some(&key("bob"))));
    }
}
