//! OAuth 2.1 resource-server mode (optional, off by default): the api accepts
//! access tokens an authorization server issued for it, beside its own keys.
//!
//! - `OAuthSettings`: `OAUTH_*`, read and checked at start (`from_lookup`), and
//!   what the api publishes about itself: the RFC 9728 Protected Resource
//!   Metadata (`metadata`) and where it lives (`metadata_path`, `metadata_url`).
//! - `OAuth`: the validator. `authenticate(token)` checks a JWT access token
//!   against the issuer's published keys (JWKS, found through its RFC 8414 or
//!   OpenID metadata): signature with an allowed algorithm, `iss` equal to the
//!   issuer, `aud` containing this server's resource (RFC 8707), `exp` and `nbf`.
//!   Keys are cached; a token naming an unknown key id makes it fetch them
//!   again (at most once per `REFETCH_GAP`), so a rotation at the issuer is
//!   picked up without a restart, and they are refetched anyway once older
//!   than `OAUTH_JWKS_REFRESH_SECONDS`. A token whose key is cached never waits
//!   on the issuer: stale keys are refreshed in the background and used
//!   meanwhile; only a token whose key is not cached waits for a fetch, at most
//!   `UNKNOWN_KEY_WAIT`. One fetch runs at a time.
//!
//! A token is never logged, and no error here carries it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use shared::envvar::{Var, VarError, parse_list};
use tokio::sync::{Mutex, RwLock};
use url::Url;

/// The root Protected Resource Metadata path (RFC 9728 §3).
pub const METADATA_ROOT: &str = "/.well-known/oauth-protected-resource";

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

pub const OAUTH_ISSUER: Var = Var::new("OAUTH_ISSUER", "");
pub const OAUTH_RESOURCE: Var = Var::new("OAUTH_RESOURCE", "");
pub const OAUTH_SCOPES: Var = Var::new("OAUTH_SCOPES", "run,read,kill");
pub const OAUTH_MAX_QUEUED: Var = Var::new("OAUTH_MAX_QUEUED", "");
pub const OAUTH_MAX_RUNNING: Var = Var::new("OAUTH_MAX_RUNNING", "");
pub const OAUTH_CPU_SECONDS_PER_DAY: Var = Var::new("OAUTH_CPU_SECONDS_PER_DAY", "");
pub const OAUTH_JWKS_REFRESH_SECONDS: Var = Var::new("OAUTH_JWKS_REFRESH_SECONDS", "3600");
pub const OAUTH_ALGORITHMS: Var = Var::new("OAUTH_ALGORITHMS", "RS256,PS256,ES256,EdDSA");

/// What a grant allows: `run` submits, `read` reads status, lists and files,
/// `kill` kills. The scope names tokens carry (`scope` claim) and the
/// metadata's `scopes_supported`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OAuthScope {
    Run,
    Read,
    Kill,
}

impl OAuthScope {
    pub const ALL: [OAuthScope; 3] = [OAuthScope::Run, OAuthScope::Read, OAuthScope::Kill];

    pub fn as_str(self) -> &'static str {
        match self {
            OAuthScope::Run => "run",
            OAuthScope::Read => "read",
            OAuthScope::Kill => "kill",
        }
    }

    pub fn parse(name: &str) -> Option<OAuthScope> {
        OAuthScope::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

/// The quotas every OAuth owner gets (`OAUTH_MAX_QUEUED`, `OAUTH_MAX_RUNNING`,
/// `OAUTH_CPU_SECONDS_PER_DAY`); `None` is no limit. The same shape as an API
/// key's `auth::Limits`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OAuthLimits {
    pub max_queued: Option<u64>,
    pub max_running: Option<u64>,
    pub cpu_seconds_per_day: Option<u64>,
}

/// Who a valid token speaks for: `owner` is `oauth:<sub>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthGrant {
    pub owner: String,
    pub scopes: BTreeSet<OAuthScope>,
    pub limits: OAuthLimits,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OAuthConfigError {
    #[error(
        "{set} is set but {missing} is not: OAuth needs both (the authorization server's issuer \
         URL and this server's public URL of /mcp), or neither to leave it off"
    )]
    Half {
        set: &'static str,
        missing: &'static str,
    },
    #[error(transparent)]
    Var(#[from] VarError),
}

/// `OAUTH_*`, checked at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthSettings {
    /// `OAUTH_ISSUER`, exactly as tokens carry it in `iss`.
    pub issuer: String,
    /// `OAUTH_RESOURCE`, this server's public URL of `/mcp`: the audience
    /// tokens must carry.
    pub resource: String,
    /// `OAUTH_SCOPES`: the most any token may do (the operator's ceiling: a
    /// token's `scope` claim is intersected with it), and what a token without
    /// a `scope` claim may do.
    pub scopes: BTreeSet<OAuthScope>,
    pub limits: OAuthLimits,
    /// `OAUTH_JWKS_REFRESH_SECONDS`: cached keys older than this are fetched again.
    pub jwks_refresh: Duration,
    /// `OAUTH_ALGORITHMS`: the signature algorithms accepted (asymmetric only).
    pub algorithms: Vec<Algorithm>,
    issuer_url: Url,
    resource_url: Url,
}

impl OAuthSettings {
    /// `None` when OAuth is off (neither `OAUTH_ISSUER` nor `OAUTH_RESOURCE`).
    /// Every variable is read and checked either way, so a typo is found
    /// before the day OAuth is turned on.
    pub fn from_lookup(
        var: &impl Fn(&str) -> Option<String>,
    ) -> Result<Option<OAuthSettings>, OAuthConfigError> {
        let issuer = var(OAUTH_ISSUER.name);
        let resource = var(OAUTH_RESOURCE.name);
        let ceiling = scopes(var)?;
        let limits = OAuthLimits {
            max_queued: optional_count(var, OAUTH_MAX_QUEUED)?,
            max_running: optional_count(var, OAUTH_MAX_RUNNING)?,
            cpu_seconds_per_day: optional_count(var, OAUTH_CPU_SECONDS_PER_DAY)?,
        };
        let jwks_refresh =
            Duration::from_secs(OAUTH_JWKS_REFRESH_SECONDS.range(var, 60, 7 * 86_400)?);
        let algorithms = algorithms(var)?;
        let (issuer, resource) = match (issuer, resource) {
            (None, None) => return Ok(None),
            (Some(_), None) => {
                return Err(OAuthConfigError::Half {
                    set: OAUTH_ISSUER.name,
                    missing: OAUTH_RESOURCE.name,
                });
            }
            (None, Some(_)) => {
                return Err(OAuthConfigError::Half {
                    set: OAUTH_RESOURCE.name,
                    missing: OAUTH_ISSUER.name,
                });
            }
            (Some(i), Some(r)) => (i.trim().to_owned(), r.trim().to_owned()),
        };
        let issuer_url = web_url(OAUTH_ISSUER, &issuer)?;
        let resource_url = web_url(OAUTH_RESOURCE, &resource)?;
        Ok(Some(OAuthSettings {
            issuer,
            resource,
            scopes: ceiling,
            limits,
            jwks_refresh,
            algorithms,
            issuer_url,
            resource_url,
        }))
    }

    /// Where this server's metadata lives (RFC 9728 §3.1): the well-known
    /// prefix, then the resource's path (`/.well-known/oauth-protected-resource/mcp`
    /// for `https://host/mcp`). The api serves it there and at the root path.
    pub fn metadata_path(&self) -> String {
        let path = self.resource_url.path().trim_end_matches('/');
        format!("{METADATA_ROOT}{path}")
    }

    /// Where the api serves the metadata: the path-suffixed URL RFC 9728
    /// defines for a resource with a path (the one MCP clients try first), and
    /// the root one for clients that try only that; once when they are the
    /// same (a resource without a path, `https://host` or `https://host/`).
    pub fn metadata_paths(&self) -> Vec<String> {
        let mut paths = vec![self.metadata_path()];
        if paths[0] != METADATA_ROOT {
            paths.push(METADATA_ROOT.to_owned());
        }
        paths
    }

    /// The metadata's absolute URL, for `WWW-Authenticate: Bearer resource_metadata=...`.
    pub fn metadata_url(&self) -> String {
        let origin = self.resource_url.origin().ascii_serialization();
        format!("{origin}{}", self.metadata_path())
    }

    /// The Protected Resource Metadata document (RFC 9728 §2).
    pub fn metadata(&self) -> serde_json::Value {
        serde_json::json!({
            "resource": self.resource,
            "authorization_servers": [self.issuer],
            "bearer_methods_supported": ["header"],
            "scopes_supported": self.scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
            "resource_name": "script-runner",
        })
    }
}

/// `OAUTH_SCOPES`: a comma-separated subset of run, read, kill.
fn scopes(var: &impl Fn(&str) -> Option<String>) -> Result<BTreeSet<OAuthScope>, VarError> {
    let raw = OAUTH_SCOPES.get(var);
    parse_list(Some(&raw), "")
        .iter()
        .map(|s| OAuthScope::parse(s))
        .collect::<Option<BTreeSet<_>>>()
        .ok_or_else(|| {
            VarError::new(
                OAUTH_SCOPES.name,
                &raw,
                "a comma-separated list of run, read and kill",
            )
        })
}

/// A quota: empty is no limit, else 1 to 10000000.
fn optional_count(var: &impl Fn(&str) -> Option<String>, v: Var) -> Result<Option<u64>, VarError> {
    match var(v.name) {
        None => Ok(None),
        Some(_) => v.range(var, 1, 10_000_000).map(Some),
    }
}

/// `OAUTH_ALGORITHMS`: asymmetric JWS algorithms only. HS* would let anyone
/// holding the issuer's public key sign tokens; `none` signs nothing.
fn algorithms(var: &impl Fn(&str) -> Option<String>) -> Result<Vec<Algorithm>, VarError> {
    const EXPECTED: &str = "a comma-separated list of RS256, RS384, RS512, PS256, PS384, PS512, \
                            ES256, ES384 and EdDSA (no HS* and no none: tokens must be signed \
                            with the issuer's private key)";
    let raw = OAUTH_ALGORITHMS.get(var);
    let algs = parse_list(Some(&raw), "")
        .iter()
        .map(|s| s.parse::<Algorithm>().ok().filter(|a| !is_symmetric(*a)))
        .collect::<Option<Vec<_>>>()
        .filter(|a| !a.is_empty())
        .ok_or_else(|| VarError::new(OAUTH_ALGORITHMS.name, &raw, EXPECTED))?;
    Ok(algs)
}

fn is_symmetric(alg: Algorithm) -> bool {
    matches!(alg, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512)
}

/// An absolute `https` URL without fragment; `http` only for a loopback host
/// (a test or a development set-up on one machine).
fn web_url(v: Var, raw: &str) -> Result<Url, VarError> {
    let bad = |why: &str| VarError::new(v.name, raw, why);
    let url = Url::parse(raw).map_err(|e| bad(&format!("an absolute URL ({e})")))?;
    if url.fragment().is_some() || url.query().is_some() {
        return Err(bad("a URL without query or fragment"));
    }
    match url.scheme() {
        "https" => Ok(url),
        "http" if is_loopback(&url) => Ok(url),
        _ => Err(bad(
            "an https:// URL (http:// only for localhost or a loopback address)",
        )),
    }
}

fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        None => false,
    }
}

/// Why a token was refused. The messages say what was wrong, never the token.
#[derive(Debug, thiserror::Error)]
pub enum OAuthError {
    #[error("the token is not a well-formed JWT ({0})")]
    Malformed(jsonwebtoken::errors::Error),
    #[error("the token is signed with {0:?}, which OAUTH_ALGORITHMS does not allow")]
    Algorithm(Algorithm),
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
/// operator's ceiling) allows; without a claim, the ceiling itself.
fn granted_scopes(
    claim: Option<&ScopeClaim>,
    ceiling: &BTreeSet<OAuthScope>,
) -> BTreeSet<OAuthScope> {
    match claim {
        Some(claim) => claim
            .names()
            .into_iter()
            .filter_map(OAuthScope::parse)
            .filter(|s| ceiling.contains(s))
            .collect(),
        None => ceiling.clone(),
    }
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

#[derive(Default)]
struct KeyCache {
    keys: Vec<CachedKey>,
    fetched_at: Option<Instant>,
    /// Why the last fetch failed (`None` after one succeeded).
    last_error: Option<String>,
}

struct CachedKey {
    kid: Option<String>,
    /// The JWK's `alg`, if it names one: the only algorithm it may verify.
    alg: Option<Algorithm>,
    key: DecodingKey,
}

#[derive(Default)]
struct FetchState {
    jwks_uri: Option<Url>,
    last_attempt: Option<Instant>,
}

impl FetchState {
    /// True (and the attempt counted) unless one was made within `REFETCH_GAP`.
    fn start_attempt(&mut self) -> bool {
        let due = self.last_attempt.is_none_or(|t| t.elapsed() >= REFETCH_GAP);
        if due {
            self.last_attempt = Some(Instant::now());
        }
        due
    }
}

impl KeyCache {
    fn find(&self, kid: Option<&str>, alg: Algorithm) -> Option<DecodingKey> {
        let usable =
            |k: &&CachedKey| k.key.family() == alg.family() && k.alg.is_none_or(|a| a == alg);
        match kid {
            Some(kid) => self
                .keys
                .iter()
                .filter(usable)
                .find(|k| k.kid.as_deref() == Some(kid))
                .map(|k| k.key.clone()),
            // No key id: only unambiguous when one key could have signed it.
            None => {
                let mut candidates = self.keys.iter().filter(usable);
                match (candidates.next(), candidates.next()) {
                    (Some(k), None) => Some(k.key.clone()),
                    _ => None,
                }
            }
        }
    }

    fn is_fresh(&self, max_age: Duration) -> bool {
        self.fetched_at.is_some_and(|t| t.elapsed() < max_age)
    }
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
        );
        Ok(OAuthGrant {
            owner: format!("oauth:{sub}"),
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

/// A signing key from the JWKS, or `None` for one this api must not or cannot use.
fn usable_key(jwk: &Jwk) -> Option<CachedKey> {
    if matches!(jwk.common.public_key_use, Some(ref u) if *u != PublicKeyUse::Signature) {
        return None;
    }
    if matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_)) {
        return None;
    }
    let alg = match jwk.common.key_algorithm {
        Some(a) => Some(a.to_string().parse::<Algorithm>().ok()?),
        None => None,
    };
    let key = DecodingKey::from_jwk(jwk).ok()?;
    Some(CachedKey {
        kid: jwk.common.key_id.clone(),
        alg,
        key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(vars: &[(&str, &str)]) -> Result<Option<OAuthSettings>, OAuthConfigError> {
        let lookup = shared::envvar::non_blank(shared::envvar::lookup_of(vars));
        OAuthSettings::from_lookup(&lookup)
    }

    const ISSUER: (&str, &str) = ("OAUTH_ISSUER", "https://id.example.com/realms/sr");
    const RESOURCE: (&str, &str) = ("OAUTH_RESOURCE", "https://mcp.example.com/mcp");

    #[test]
    fn off_unless_both_are_set() {
        assert_eq!(load(&[]), Ok(None));
        assert_eq!(
            load(&[ISSUER]),
            Err(OAuthConfigError::Half {
                set: "OAUTH_ISSUER",
                missing: "OAUTH_RESOURCE"
            })
        );
        let e = load(&[RESOURCE]).err().map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.contains("OAUTH_RESOURCE is set but OAUTH_ISSUER is not")));
        let s = load(&[ISSUER, RESOURCE]).ok().flatten().expect("on");
        assert_eq!(s.scopes, BTreeSet::from(OAuthScope::ALL));
        assert_eq!(s.limits, OAuthLimits::default());
        assert_eq!(
            s.algorithms,
            [
                Algorithm::RS256,
                Algorithm::PS256,
                Algorithm::ES256,
                Algorithm::EdDSA
            ]
        );
    }

    #[test]
    fn metadata_lives_under_the_resource_path() {
        let s = load(&[ISSUER, RESOURCE]).ok().flatten().expect("on");
        assert_eq!(
            s.metadata_path(),
            "/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            s.metadata_url(),
            "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"
        );
        let m = s.metadata();
        assert_eq!(m["resource"], "https://mcp.example.com/mcp");
        assert_eq!(m["authorization_servers"][0], ISSUER.1);
        assert_eq!(
            m["scopes_supported"],
            serde_json::json!(["run", "read", "kill"])
        );
        let root = load(&[ISSUER, ("OAUTH_RESOURCE", "https://mcp.example.com/")])
            .ok()
            .flatten()
            .expect("on");
        assert_eq!(root.metadata_path(), METADATA_ROOT);
        assert_eq!(root.metadata_paths(), [METADATA_ROOT]);
        assert_eq!(
            s.metadata_paths(),
            [s.metadata_path(), METADATA_ROOT.into()]
        );
    }

    #[test]
    fn bad_values_are_refused_naming_the_variable() {
        for (vars, name) in [
            (
                &[("OAUTH_ISSUER", "http://id.example.com"), RESOURCE][..],
                "OAUTH_ISSUER",
            ),
            (
                &[ISSUER, ("OAUTH_RESOURCE", "mcp.example.com/mcp")][..],
                "OAUTH_RESOURCE",
            ),
            (
                &[ISSUER, ("OAUTH_RESOURCE", "https://x/mcp#a")][..],
                "OAUTH_RESOURCE",
            ),
            (&[("OAUTH_SCOPES", "run,write")][..], "OAUTH_SCOPES"),
            (
                &[("OAUTH_ALGORITHMS", "RS256,HS256")][..],
                "OAUTH_ALGORITHMS",
            ),
            (&[("OAUTH_ALGORITHMS", "none")][..], "OAUTH_ALGORITHMS"),
            (&[("OAUTH_MAX_RUNNING", "0")][..], "OAUTH_MAX_RUNNING"),
            (
                &[("OAUTH_JWKS_REFRESH_SECONDS", "5")][..],
                "OAUTH_JWKS_REFRESH_SECONDS",
            ),
        ] {
            let e = load(vars).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.starts_with(&format!("{name}=")), "{vars:?}: {e}");
        }
        // Loopback issuers may use http (tests, one-machine set-ups).
        assert!(
            load(&[
                ("OAUTH_ISSUER", "http://127.0.0.1:9000/oauth"),
                ("OAUTH_RESOURCE", "http://localhost:8080/mcp"),
            ])
            .is_ok_and(|s| s.is_some())
        );
    }

    /// An RSA public key (2048 bits) as a JWK, with `extra` members merged in.
    fn rsa_jwk(extra: serde_json::Value) -> Jwk {
        let mut v = serde_json::json!({
            "kty": "RSA",
            "e": "AQAB",
            "n": "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw"
        });
        if let (Some(obj), serde_json::Value::Object(more)) = (v.as_object_mut(), extra) {
            obj.extend(more);
        }
        serde_json::from_value(v).expect("a JWK")
    }

    #[test]
    fn only_signing_keys_of_a_usable_kind_are_kept() {
        let signing = usable_key(&rsa_jwk(
            serde_json::json!({"kid": "a", "alg": "RS256", "use": "sig"}),
        ));
        assert!(
            signing
                .is_some_and(|k| k.kid.as_deref() == Some("a") && k.alg == Some(Algorithm::RS256))
        );
        assert!(usable_key(&rsa_jwk(serde_json::json!({"kid": "e", "use": "enc"}))).is_none());
        // A symmetric key in a JWKS is never used: whoever reads the JWKS could sign.
        let oct: Jwk =
            serde_json::from_value(serde_json::json!({"kty": "oct", "k": "c2VjcmV0", "kid": "h"}))
                .expect("an oct JWK");
        assert!(usable_key(&oct).is_none());
    }

    #[test]
    fn a_key_verifies_only_its_own_kid_family_and_algorithm() {
        let key = |extra| usable_key(&rsa_jwk(extra)).expect("usable");
        let cache = KeyCache {
            keys: vec![
                key(serde_json::json!({"kid": "a", "alg": "RS256"})),
                key(serde_json::json!({"kid": "b"})),
            ],
            fetched_at: Some(Instant::now()),
            last_error: None,
        };
        assert!(cache.find(Some("a"), Algorithm::RS256).is_some());
        assert!(
            cache.find(Some("a"), Algorithm::PS256).is_none(),
            "the JWK says RS256"
        );
        assert!(
            cache.find(Some("b"), Algorithm::PS256).is_some(),
            "no alg: any RSA one"
        );
        assert!(
            cache.find(Some("b"), Algorithm::ES256).is_none(),
            "an RSA key is no EC key"
        );
        assert!(cache.find(Some("c"), Algorithm::RS256).is_none());
        // Without a kid only an unambiguous key will do: two RSA keys are not.
        assert!(cache.find(None, Algorithm::RS256).is_none());
        let one = KeyCache {
            keys: vec![key(serde_json::json!({}))],
            fetched_at: None,
            last_error: None,
        };
        assert!(one.find(None, Algorithm::RS256).is_some());
        assert!(!one.is_fresh(Duration::from_secs(60)));
    }

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
    fn oauth_scopes_is_the_ceiling_of_every_token() {
        use OAuthScope::{Kill, Read, Run};
        let read_only = BTreeSet::from([Read]);
        let claim: ScopeClaim = serde_json::from_str(r#""run read kill openid""#).expect("claim");
        assert_eq!(granted_scopes(Some(&claim), &read_only), read_only);
        assert_eq!(granted_scopes(None, &read_only), read_only);
        let all = BTreeSet::from(OAuthScope::ALL);
        assert_eq!(
            granted_scopes(Some(&claim), &all),
            BTreeSet::from([Run, Read, Kill])
        );
        let kill: ScopeClaim = serde_json::from_str(r#"["kill"]"#).expect("claim");
        assert!(granted_scopes(Some(&kill), &read_only).is_empty());
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
