//! `OAUTH_*`: read and checked at start (`OAuthSettings::from_lookup`), and
//! what the api publishes about itself from them: the RFC 9728 Protected
//! Resource Metadata (`metadata`) and where it lives (`metadata_path`,
//! `metadata_url`).

use std::collections::BTreeSet;
use std::time::Duration;

use jsonwebtoken::Algorithm;
use shared::envvar::{Var, VarError, parse_list};
use url::Url;

/// The root Protected Resource Metadata path (RFC 9728 §3).
pub const METADATA_ROOT: &str = "/.well-known/oauth-protected-resource";

pub const OAUTH_ISSUER: Var = Var::new("OAUTH_ISSUER", "");
pub const OAUTH_RESOURCE: Var = Var::new("OAUTH_RESOURCE", "");
pub const OAUTH_SCOPES: Var = Var::new("OAUTH_SCOPES", "run,read,kill");
/// Empty: a token without a `scope` (or `scp`) claim may do nothing.
pub const OAUTH_DEFAULT_SCOPES: Var = Var::new("OAUTH_DEFAULT_SCOPES", "");
/// Only tokens whose JOSE header says `typ: at+jwt` (RFC 9068) pass.
pub const OAUTH_REQUIRE_AT_JWT: Var = Var::new("OAUTH_REQUIRE_AT_JWT", "true");
pub const OAUTH_MAX_QUEUED: Var = Var::new("OAUTH_MAX_QUEUED", "");
pub const OAUTH_MAX_RUNNING: Var = Var::new("OAUTH_MAX_RUNNING", "");
pub const OAUTH_CPU_SECONDS_PER_DAY: Var = Var::new("OAUTH_CPU_SECONDS_PER_DAY", "");
/// Empty: every egress policy.
pub const OAUTH_NETWORKS: Var = Var::new("OAUTH_NETWORKS", "");
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
    /// `OAUTH_NETWORKS`: the egress policies their tasks may ask for.
    pub networks: Option<shared::options::Networks>,
}

/// Who a valid token speaks for: `owner` is its subject (`Owner::OAuth`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthGrant {
    pub owner: shared::Owner,
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
    #[error(
        "OAUTH_DEFAULT_SCOPES names {0}, which OAUTH_SCOPES does not allow: the default of a \
         token without a scope claim must be within the ceiling of every token"
    )]
    DefaultAboveCeiling(&'static str),
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
    /// token's `scope` claim is intersected with it).
    pub scopes: BTreeSet<OAuthScope>,
    /// `OAUTH_DEFAULT_SCOPES`: what a token without a `scope` (or `scp`) claim
    /// may do, within `scopes`; empty by default: nothing.
    pub default_scopes: BTreeSet<OAuthScope>,
    /// `OAUTH_REQUIRE_AT_JWT`: refuse a token whose header's `typ` is not
    /// `at+jwt` (RFC 9068), such as an ID token of the same issuer.
    pub require_at_jwt: bool,
    pub limits: OAuthLimits,
    /// `OAUTH_JWKS_REFRESH_SECONDS`: cached keys older than this are fetched again.
    pub jwks_refresh: Duration,
    /// `OAUTH_ALGORITHMS`: the signature algorithms accepted (asymmetric only).
    pub algorithms: Vec<Algorithm>,
    pub(super) issuer_url: Url,
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
        let ceiling = scopes(var, OAUTH_SCOPES)?;
        let default_scopes = scopes(var, OAUTH_DEFAULT_SCOPES)?;
        if let Some(above) = default_scopes.iter().find(|s| !ceiling.contains(s)) {
            return Err(OAuthConfigError::DefaultAboveCeiling(above.as_str()));
        }
        let require_at_jwt = OAUTH_REQUIRE_AT_JWT.parse(var, "true or false")?;
        let limits = OAuthLimits {
            max_queued: optional_count(var, OAUTH_MAX_QUEUED)?,
            max_running: optional_count(var, OAUTH_MAX_RUNNING)?,
            cpu_seconds_per_day: optional_count(var, OAUTH_CPU_SECONDS_PER_DAY)?,
            networks: match var(OAUTH_NETWORKS.name) {
                None => None,
                Some(raw) => Some(shared::options::Networks::parse(&raw).map_err(|_| {
                    VarError::new(
                        OAUTH_NETWORKS.name,
                        &raw,
                        "internet, none and allow, comma-separated",
                    )
                })?),
            },
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
            default_scopes,
            require_at_jwt,
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

/// `OAUTH_SCOPES` or `OAUTH_DEFAULT_SCOPES`: a comma-separated subset of run,
/// read, kill.
fn scopes(var: &impl Fn(&str) -> Option<String>, v: Var) -> Result<BTreeSet<OAuthScope>, VarError> {
    let raw = v.get(var);
    parse_list(Some(&raw), "")
        .iter()
        .map(|s| OAuthScope::parse(s))
        .collect::<Option<BTreeSet<_>>>()
        .ok_or_else(|| VarError::new(v.name, &raw, "a comma-separated list of run, read and kill"))
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

pub(super) fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        None => false,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::oauth) fn load(
        vars: &[(&str, &str)],
    ) -> Result<Option<OAuthSettings>, OAuthConfigError> {
        let lookup = shared::envvar::non_blank(shared::envvar::lookup_of(vars));
        OAuthSettings::from_lookup(&lookup)
    }

    pub(in crate::oauth) const ISSUER: (&str, &str) =
        ("OAUTH_ISSUER", "https://id.example.com/realms/sr");
    pub(in crate::oauth) const RESOURCE: (&str, &str) =
        ("OAUTH_RESOURCE", "https://mcp.example.com/mcp");

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
        assert!(s.default_scopes.is_empty(), "no claim, no scope");
        assert!(s.require_at_jwt);
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
    fn the_default_scopes_lie_within_the_ceiling() {
        use OAuthScope::{Read, Run};
        let s = load(&[ISSUER, RESOURCE, ("OAUTH_DEFAULT_SCOPES", "run, read")])
            .ok()
            .flatten()
            .expect("on");
        assert_eq!(s.default_scopes, BTreeSet::from([Run, Read]));
        assert_eq!(
            load(&[
                ISSUER,
                RESOURCE,
                ("OAUTH_SCOPES", "read"),
                ("OAUTH_DEFAULT_SCOPES", "read,kill"),
            ]),
            Err(OAuthConfigError::DefaultAboveCeiling("kill"))
        );
        let off = load(&[ISSUER, RESOURCE, ("OAUTH_REQUIRE_AT_JWT", "false")])
            .ok()
            .flatten()
            .expect("on");
        assert!(!off.require_at_jwt);
    }

    #[test]
    fn oauth_users_can_be_limited_to_some_networks() {
        let s = load(&[ISSUER, RESOURCE, ("OAUTH_NETWORKS", "none, allow")])
            .ok()
            .flatten()
            .expect("on");
        let networks = s.limits.networks.expect("limited");
        assert_eq!(networks.to_string(), "none,allow");
        let e = load(&[ISSUER, RESOURCE, ("OAUTH_NETWORKS", "wifi")])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.starts_with("OAUTH_NETWORKS="), "{e}");
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
                &[("OAUTH_DEFAULT_SCOPES", "all")][..],
                "OAUTH_DEFAULT_SCOPES",
            ),
            (
                &[("OAUTH_REQUIRE_AT_JWT", "yes")][..],
                "OAUTH_REQUIRE_AT_JWT",
            ),
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
}
