//! OAuth 2.1 resource-server mode (optional, off by default): the api accepts
//! access tokens an authorization server issued for it, beside its own keys.
//!
//! - `settings`: `OAuthSettings`, `OAUTH_*` read and checked at start, and the
//!   RFC 9728 Protected Resource Metadata the api publishes.
//! - `keys`: the cached signing keys and which of a JWK set's keys are usable.
//! - here, `OAuth`: the validator. `authenticate(token)` checks a JWT access token
//!   against the issuer's published keys (JWKS, found through its RFC 8414 or
//!   OpenID metadata): signature with an allowed algorithm, `iss` equal to the
//!   issuer, `aud` containing this server's resource (RFC 8707), `exp` and `nbf`,
//!   and (`OAUTH_REQUIRE_AT_JWT`, on by default) the header's `typ` saying it is
//!   an access token (RFC 9068), not an ID token of the same issuer.
//!   Keys are cached; a token naming an unknown key id makes it fetch them
//!   again (at most once per `REFETCH_GAP`), so a rotation at the issuer is
//!   picked up without a restart, and they are refetched anyway once older
//!   than `OAUTH_JWKS_REFRESH_SECONDS`. A token whose key is cached never waits
//!   on the issuer: stale keys are refreshed in the background and used
//!   meanwhile; only a token whose key is not cached waits for a fetch, at most
//!   `UNKNOWN_KEY_WAIT`. One fetch runs at a time.
//!
//! A token is never logged, and no error here carries it.

mod keys;
mod settings;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use tokio::sync::{Mutex, RwLock};
use url::Url;

use keys::{CachedKey, FetchState, KeyCache, usable_key};
use settings::is_loopback;
pub use settings::{
    METADATA_ROOT, OAUTH_ALGORITHMS, OAUTH_CPU_SECONDS_PER_DAY, OAUTH_DEFAULT_SCOPES, OAUTH_ISSUER,
    OAUTH_JWKS_REFRESH_SECONDS, OAUTH_MAX_QUEUED, OAUTH_MAX_RUNNING, OAUTH_NETWORKS,
    OAUTH_REQUIRE_AT_JWT, OAUTH_RESOURCE, OAUTH_SCOPES, OAuthConfigError, OAuthGrant, OAuthLimits,
    OAuthScope, OAuthSettings,
};

/// A token naming a key id the cache lacks makes the api fetch the keys again,
/// at most once per this gap, so a stream of made-up key ids cannot turn the
/// api into a load on the issuer.
pub const REFETCH_GAP: Duration = Duration::from_secs(5);

/// The longest a request whose key id the cache lacks waits for the keys to be
/// fetched; past it, it is answered 503 (try again), and the fetch goes on.
const UNKNOWN_KEY_WAIT: Duration = Duration::from_secs(10);

/// Clock skew allowed on `exp` and `nbf`.
const LEEWAY_SECONDS: u64 = 30;
/// The longest the issuer may take to answer one metadata or JWKS request.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest metadata document or key set read.
const MAX_DOCUMENT_BYTES: usize = 1 << 20;
/// The longest `sub` taken as an owner name.
const MAX_SUBJECT_CHARS: usize = 256;

/// Why a token was refused. The messages say what was wrong, never the token.
#[derive(Debug, thiserror::Error)]
pub enum OAuthError {
    #[error("the token is not a well-formed JWT ({0})")]
    Malformed(jsonwebtoken::errors::Error),
    #[error("the token is signed with {0:?}, which OAUTH_ALGORITHMS does not allow")]
    Algorithm(Algorithm),
    /// `typ` absent or other than `at+jwt`; the value, cut, if there was one.
    #[error(
        "the token is not a JWT access token: its header's typ is {}, not at+jwt (RFC 9068; \
         an ID token is not accepted)",
        .0.as_deref().map_or("absent".to_owned(), |t| format!("{t:?}"))
    )]
    NotAnAccessToken(Option<String>),
    #[error("the issuer publishes no key for this token (key id {0:?})")]
    UnknownKey(Option<String>),
    #[error("the token was refused: {0}")]
    Invalid(jsonwebtoken::errors::Error),
    #[error("the token's subject (sub) is empty, too long or has control characters")]
    Subject,
    #[error("the authorization server's keys could not be fetched: {0}")]
    Unavailable(String),
}

impl OAuthError {
    /// True when the token could not be checked at all (the issuer is
    /// unreachable and no key is cached): a 503, not a 401.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, OAuthError::Unavailable(_))
    }
}

/// The claims read beyond those `jsonwebtoken` checks (`iss`, `aud`, `exp`, `nbf`).
#[derive(Deserialize)]
struct Claims {
    sub: String,
    /// RFC 9068 / RFC 8693: space-separated; some issuers send an array (`scp`).
    #[serde(default)]
    scope: Option<ScopeClaim>,
    #[serde(default)]
    scp: Option<ScopeClaim>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ScopeClaim {
    Text(String),
    List(Vec<String>),
}

impl ScopeClaim {
    fn names(&self) -> Vec<&str> {
        match self {
            ScopeClaim::Text(s) => s.split_ascii_whitespace().collect(),
            ScopeClaim::List(l) => l.iter().map(String::as_str).collect(),
        }
    }
}

/// What a token may do: the scopes its claim names that `OAUTH_SCOPES` (the
/// operator's ceiling) allows; without a claim, `OAUTH_DEFAULT_SCOPES` (none
/// unless the operator names some), within the ceiling too.
fn granted_scopes(
    claim: Option<&ScopeClaim>,
    ceiling: &BTreeSet<OAuthScope>,
    default: &BTreeSet<OAuthScope>,
) -> BTreeSet<OAuthScope> {
    match claim {
        Some(claim) => claim
            .names()
            .into_iter()
            .filter_map(OAuthScope::parse)
            .filter(|s| ceiling.contains(s))
            .collect(),
        None => default.intersection(ceiling).copied().collect(),
    }
}

/// The longest `typ` quoted back in a refusal.
const MAX_QUOTED_TYP: usize = 40;

/// Whether a JOSE header's `typ` names a JWT access token: `at+jwt`, or the
/// full media type `application/at+jwt` (RFC 9068 §2.1), in any case (media
/// types compare case-insensitively, RFC 7515 §4.1.9).
fn is_access_token_type(typ: Option<&str>) -> bool {
    typ.is_some_and(|t| {
        let t = t.trim();
        let t = match t.get(..12) {
            Some(prefix) if prefix.eq_ignore_ascii_case("application/") => &t[12..],
            _ => t,
        };
        t.eq_ignore_ascii_case("at+jwt")
    })
}

type HttpClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// The validator; cheap to clone (one cache per api process).
#[derive(Clone)]
pub struct OAuth {
    inner: Arc<Inner>,
}

struct Inner {
    settings: OAuthSettings,
    http: HttpClient,
    keys: RwLock<KeyCache>,
    /// Held for the whole of a fetch (network I/O): only ever `try_lock`ed, or
    /// awaited within `unknown_key_wait` by a request whose key is not cached.
    fetch: Arc<Mutex<FetchState>>,
    unknown_key_wait: Duration,
}

impl OAuth {
    /// Builds the validator; nothing is fetched until the first token.
    pub fn new(settings: OAuthSettings) -> Result<OAuth, std::io::Error> {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(Duration::from_secs(5)));
        http.enforce_http(false);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(Arc::new(rustls::crypto::ring::default_provider()))?
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new()).build(https);
        Ok(OAuth {
            inner: Arc::new(Inner {
                settings,
                http: client,
                keys: RwLock::new(KeyCache::default()),
                fetch: Arc::new(Mutex::new(FetchState::default())),
                unknown_key_wait: UNKNOWN_KEY_WAIT,
            }),
        })
    }

    pub fn settings(&self) -> &OAuthSettings {
        &self.inner.settings
    }

    /// Checks `token` and says whose it is.
    pub async fn authenticate(&self, token: &str) -> Result<OAuthGrant, OAuthError> {
        let settings = &self.inner.settings;
        let header = jsonwebtoken::decode_header(token).map_err(OAuthError::Malformed)?;
        if !settings.algorithms.contains(&header.alg) {
            return Err(OAuthError::Algorithm(header.alg));
        }
        // Before any key is fetched: an ID token (typ JWT, or none) signed by
        // the same keys would otherwise pass every check below.
        if settings.require_at_jwt && !is_access_token_type(header.typ.as_deref()) {
            let typ = header.typ.map(|t| t.chars().take(MAX_QUOTED_TYP).collect());
            return Err(OAuthError::NotAnAccessToken(typ));
        }
        let key = self.key_for(header.kid.as_deref(), header.alg).await?;
        let mut validation = Validation::new(header.alg);
        validation.algorithms = vec![header.alg];
        validation.set_issuer(&[&settings.issuer]);
        validation.set_audience(&[&settings.resource]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.validate_nbf = true;
        validation.leeway = LEEWAY_SECONDS;
        let claims = jsonwebtoken::decode::<Claims>(token, &key, &validation)
            .map_err(OAuthError::Invalid)?
            .claims;
        let sub = claims.sub;
        if sub.is_empty()
            || sub.chars().count() > MAX_SUBJECT_CHARS
            || sub.chars().any(char::is_control)
        {
            return Err(OAuthError::Subject);
        }
        let scopes = granted_scopes(
            claims.scope.as_ref().or(claims.scp.as_ref()),
            &settings.scopes,
            &settings.default_scopes,
        );
        Ok(OAuthGrant {
            owner: shared::Owner::OAuth(sub.to_owned()),
            scopes,
            limits: settings.limits,
        })
    }

    /// The key that may verify a token with this key id and algorithm. A cached
    /// one is used at once, even when stale (a refresh is then started in the
    /// background): no request with a known key waits on the issuer. A key id
    /// the cache lacks waits for a fetch (one at a time, at most once per
    /// `REFETCH_GAP`), at most `unknown_key_wait`.
    async fn key_for(&self, kid: Option<&str>, alg: Algorithm) -> Result<DecodingKey, OAuthError> {
        {
            let cache = self.inner.keys.read().await;
            if let Some(key) = cache.find(kid, alg) {
                if !cache.is_fresh(self.inner.settings.jwks_refresh) {
                    self.refresh_in_background();
                }
                return Ok(key);
            }
        }
        let waited = tokio::time::timeout(self.inner.unknown_key_wait, async {
            match self.inner.fetch.clone().try_lock_owned() {
                // No fetch running: start one, unless one was made just now,
                // and wait for it. It runs in its own task, so a request that
                // gives up waiting does not cut it short.
                Ok(mut state) => {
                    if state.start_attempt() {
                        let this = self.clone();
                        let fetch =
                            tokio::spawn(async move { this.fetch_into_cache(&mut state).await });
                        let _ = fetch.await;
                    }
                }
                // One is running: wait for it to end.
                Err(_) => drop(self.inner.fetch.lock().await),
            }
        })
        .await;
        let cache = self.inner.keys.read().await;
        if let Some(key) = cache.find(kid, alg) {
            return Ok(key);
        }
        match (waited, &cache.last_error, cache.fetched_at) {
            (Err(_), _, _) => Err(OAuthError::Unavailable(format!(
                "the issuer's keys are still being fetched after {:?}",
                self.inner.unknown_key_wait
            ))),
            (Ok(()), Some(e), None) => Err(OAuthError::Unavailable(e.clone())),
            _ => Err(OAuthError::UnknownKey(kid.map(str::to_owned))),
        }
    }

    /// Starts fetching the keys in a task of its own, unless a fetch is running
    /// or one was made within `REFETCH_GAP`. Never waits.
    fn refresh_in_background(&self) {
        let Ok(mut state) = self.inner.fetch.clone().try_lock_owned() else {
            return;
        };
        if !state.start_attempt() {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move { this.fetch_into_cache(&mut state).await });
    }

    /// Fetches the key set and puts it in the cache; on failure keeps the keys
    /// there (a stale key set beats none while the issuer is unreachable) and
    /// records why.
    async fn fetch_into_cache(&self, state: &mut FetchState) {
        match self.fetch_keys(state).await {
            Ok(keys) => {
                tracing::info!(keys = keys.len(), "fetched the OAuth issuer's keys");
                *self.inner.keys.write().await = KeyCache {
                    keys,
                    fetched_at: Some(Instant::now()),
                    last_error: None,
                };
            }
            Err(e) => {
                // Discover the JWKS URL again next time, in case it moved.
                tracing::warn!(error = %e, "could not fetch the OAuth issuer's keys");
                state.jwks_uri = None;
                self.inner.keys.write().await.last_error = Some(e);
            }
        }
    }

    /// The issuer's signing keys: the JWKS at the `jwks_uri` its metadata names.
    async fn fetch_keys(&self, state: &mut FetchState) -> Result<Vec<CachedKey>, String> {
        let jwks_uri = match &state.jwks_uri {
            Some(u) => u.clone(),
            None => {
                let u = self.discover_jwks_uri().await?;
                state.jwks_uri = Some(u.clone());
                u
            }
        };
        #[derive(Deserialize)]
        struct KeySet {
            keys: Vec<serde_json::Value>,
        }
        let set: KeySet = serde_json::from_slice(&self.get(&jwks_uri).await?)
            .map_err(|e| format!("{jwks_uri} is not a JWK set: {e}"))?;
        // Keys this api cannot use (encryption keys, symmetric keys, unknown
        // types) are skipped rather than failing the whole set.
        let keys: Vec<CachedKey> = set
            .keys
            .into_iter()
            .filter_map(|v| serde_json::from_value::<Jwk>(v).ok())
            .filter_map(|jwk| usable_key(&jwk))
            .collect();
        if keys.is_empty() {
            return Err(format!("{jwks_uri} holds no usable signing key"));
        }
        Ok(keys)
    }

    /// RFC 8414 metadata (`/.well-known/oauth-authorization-server`, inserted
    /// before the issuer's path), else OpenID Connect discovery (appended to
    /// it); the first whose `issuer` is ours names the `jwks_uri`.
    async fn discover_jwks_uri(&self) -> Result<Url, String> {
        let issuer = &self.inner.settings.issuer_url;
        let path = issuer.path().trim_end_matches('/');
        let origin = issuer.origin().ascii_serialization();
        let candidates = [
            format!("{origin}/.well-known/oauth-authorization-server{path}"),
            format!("{origin}{path}/.well-known/openid-configuration"),
        ];
        #[derive(Deserialize)]
        struct Metadata {
            issuer: String,
            jwks_uri: Option<String>,
        }
        let mut failures = Vec::new();
        for candidate in candidates {
            let Ok(url) = Url::parse(&candidate) else {
                continue;
            };
            let meta = match self.get(&url).await {
                Ok(body) => serde_json::from_slice::<Metadata>(&body)
                    .map_err(|e| format!("{url} is not authorization server metadata: {e}")),
                Err(e) => Err(e),
            };
            let meta = match meta {
                Ok(m) => m,
                Err(e) => {
                    failures.push(e);
                    continue;
                }
            };
            if meta.issuer != self.inner.settings.issuer {
                return Err(format!(
                    "{url} names the issuer {:?}, not OAUTH_ISSUER {:?}: set OAUTH_ISSUER \
                     exactly as the authorization server spells it",
                    meta.issuer, self.inner.settings.issuer
                ));
            }
            let jwks = meta
                .jwks_uri
                .ok_or_else(|| format!("{url} names no jwks_uri"))?;
            let jwks = Url::parse(&jwks).map_err(|e| format!("jwks_uri {jwks:?}: {e}"))?;
            if jwks.scheme() != "https" && !(jwks.scheme() == "http" && is_loopback(&jwks)) {
                return Err(format!("jwks_uri {jwks} is not https"));
            }
            return Ok(jwks);
        }
        Err(failures.join("; "))
    }

    /// GET `url`, its body if it answers 200 within `FETCH_TIMEOUT` and
    /// `MAX_DOCUMENT_BYTES`.
    async fn get(&self, url: &Url) -> Result<Bytes, String> {
        let uri: hyper::Uri = url.as_str().parse().map_err(|e| format!("{url}: {e}"))?;
        let req = hyper::Request::get(uri)
            .header(header::ACCEPT, "application/json")
            .header(header::USER_AGENT, "script-runner-api")
            .body(Empty::new())
            .map_err(|e| format!("{url}: {e}"))?;
        let fetch = async {
            let resp = self
                .inner
                .http
                .request(req)
                .await
                .map_err(|e| format!("{url}: {e}"))?;
            if resp.status() != hyper::StatusCode::OK {
                return Err(format!("{url} answered {}", resp.status()));
            }
            Limited::new(resp.into_body(), MAX_DOCUMENT_BYTES)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .map_err(|e| format!("{url}: {e}"))
        };
        tokio::time::timeout(FETCH_TIMEOUT, fetch)
            .await
            .map_err(|_| format!("{url} did not answer within {FETCH_TIMEOUT:?}"))?
    }
}

#[cfg(test)]
mod tests {
    use super::keys::tests::rsa_jwk;
    use super::settings::tests::{ISSUER, RESOURCE, load};
    use super::*;

    /// An issuer that accepts connections and never answers: every fetch
    /// hangs until `FETCH_TIMEOUT`. The validator holds one stale key, "a".
    async fn stuck_issuer_and_a_stale_key(wait: Duration) -> (OAuth, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        let issuer = format!("http://127.0.0.1:{port}/oauth");
        let settings = load(&[("OAUTH_ISSUER", &issuer), RESOURCE])
            .ok()
            .flatten()
            .expect("on");
        let mut oauth = OAuth::new(settings).expect("validator");
        Arc::get_mut(&mut oauth.inner)
            .expect("not shared yet")
            .unknown_key_wait = wait;
        // No fetch time: as stale as it gets (an `Instant` in the past may not
        // exist on a machine up for less than OAUTH_JWKS_REFRESH_SECONDS).
        *oauth.inner.keys.write().await = KeyCache {
            keys: vec![usable_key(&rsa_jwk(serde_json::json!({"kid": "a"}))).expect("usable")],
            fetched_at: None,
            last_error: None,
        };
        (oauth, silent)
    }

    #[tokio::test]
    async fn a_cached_key_never_waits_on_the_issuer() {
        let (oauth, silent) = stuck_issuer_and_a_stale_key(Duration::from_millis(300)).await;
        // A made-up key id starts a fetch (which hangs) and waits for it, bounded.
        let junk = {
            let oauth = oauth.clone();
            tokio::spawn(async move { oauth.key_for(Some("junk"), Algorithm::RS256).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Meanwhile a token of the cached (stale) key is verified at once, again
        // and again, though the fetch holds the lock for seconds.
        for _ in 0..3 {
            let known = tokio::time::timeout(
                Duration::from_millis(200),
                oauth.key_for(Some("a"), Algorithm::RS256),
            )
            .await;
            assert!(
                matches!(known, Ok(Ok(_))),
                "a cached key waited on the issuer"
            );
        }
        let junk = tokio::time::timeout(Duration::from_secs(2), junk)
            .await
            .expect("the unknown key id waited past its bound")
            .expect("joined");
        assert!(
            matches!(&junk, Err(e) if e.is_unavailable()),
            "{:?}",
            junk.err()
        );
        silent.abort();
    }

    #[test]
    fn scope_claims_of_either_shape_are_read() {
        let text: ScopeClaim = serde_json::from_str(r#""run  read openid""#).expect("text");
        assert_eq!(text.names(), ["run", "read", "openid"]);
        let list: ScopeClaim = serde_json::from_str(r#"["kill"]"#).expect("list");
        assert_eq!(list.names(), ["kill"]);
    }

    #[test]
    fn a_token_without_a_scope_claim_gets_the_default_which_is_none() {
        use OAuthScope::{Read, Run};
        let all = BTreeSet::from(OAuthScope::ALL);
        assert!(granted_scopes(None, &all, &BTreeSet::new()).is_empty());
        let run_read = BTreeSet::from([Run, Read]);
        assert_eq!(granted_scopes(None, &all, &run_read), run_read);
        // An empty claim is a claim: it grants nothing, whatever the default.
        let empty: ScopeClaim = serde_json::from_str(r#""""#).expect("claim");
        assert!(granted_scopes(Some(&empty), &all, &run_read).is_empty());
    }

    #[test]
    fn only_an_at_jwt_typ_is_an_access_token() {
        for yes in [
            "at+jwt",
            "AT+JWT",
            "application/at+jwt",
            "Application/At+JWT",
        ] {
            assert!(is_access_token_type(Some(yes)), "{yes}");
        }
        for no in [
            None,
            Some("JWT"),
            Some("jwt"),
            Some(""),
            Some("application/jwt"),
        ] {
            assert!(!is_access_token_type(no), "{no:?}");
        }
        for no in ["at+jwt+x", "application/", "text/at+jwt", "id_token+jwt"] {
            assert!(!is_access_token_type(Some(no)), "{no}");
        }
    }

    #[test]
    fn oauth_scopes_is_the_ceiling_of_every_token() {
        use OAuthScope::{Kill, Read, Run};
        let read_only = BTreeSet::from([Read]);
        let none = BTreeSet::new();
        let claim: ScopeClaim = serde_json::from_str(r#""run read kill openid""#).expect("claim");
        assert_eq!(granted_scopes(Some(&claim), &read_only, &none), read_only);
        let all = BTreeSet::from(OAuthScope::ALL);
        assert_eq!(
            granted_scopes(Some(&claim), &all, &none),
            BTreeSet::from([Run, Read, Kill])
        );
        let kill: ScopeClaim = serde_json::from_str(r#"["kill"]"#).expect("claim");
        assert!(granted_scopes(Some(&kill), &read_only, &all).is_empty());
        let s = load(&[ISSUER, RESOURCE, ("OAUTH_SCOPES", "read")])
            .ok()
            .flatten()
            .expect("on");
        assert_eq!(s.scopes, read_only);
        assert_eq!(
            s.metadata()["scopes_supported"],
            serde_json::json!(["read"])
        );
    }
}
