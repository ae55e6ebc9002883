//! Parsing of configuration values. Each binary reads its environment and hands the
//! raw strings here, so both report a bad value the same way: naming the variable,
//! the value and what is allowed.

use std::fmt::Display;
use std::str::FromStr;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{name}={value:?} is not valid: {expected}")]
pub struct VarError {
    pub name: String,
    pub value: String,
    pub expected: String,
}

impl VarError {
    pub fn new(name: &str, value: &str, expected: impl Display) -> VarError {
        VarError {
            name: name.to_owned(),
            value: value.to_owned(),
            expected: expected.to_string(),
        }
    }
}

/// A configuration variable and its default, declared once: the code parses the
/// default from here, and a test checks that the table in
/// docs/configuration.md and `.env.example` state the same value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Var {
    pub name: &'static str,
    /// The default as an operator would write it; `""` means unset (empty).
    pub default: &'static str,
}

impl Var {
    pub const fn new(name: &'static str, default: &'static str) -> Var {
        Var { name, default }
    }

    /// The value `var` gives (`None`: unset or blank), else the default.
    pub fn get(&self, var: &impl Fn(&str) -> Option<String>) -> String {
        var(self.name).unwrap_or_else(|| self.default.to_owned())
    }

    /// The value parsed as `T`; `expected` says what is allowed.
    pub fn parse<T: FromStr>(
        &self,
        var: &impl Fn(&str) -> Option<String>,
        expected: &str,
    ) -> Result<T, VarError> {
        let v = self.get(var);
        v.trim()
            .parse()
            .map_err(|_| VarError::new(self.name, &v, expected))
    }

    /// A whole number in `min..=max`.
    pub fn range(
        &self,
        var: &impl Fn(&str) -> Option<String>,
        min: u64,
        max: u64,
    ) -> Result<u64, VarError> {
        let expected = format!("a whole number from {min} to {max}");
        let v: u64 = self.parse(var, &expected)?;
        if (min..=max).contains(&v) {
            Ok(v)
        } else {
            Err(VarError::new(self.name, &v.to_string(), expected))
        }
    }

    /// A name of 1 to `max_len` characters from `A-Z a-z 0-9 . _ -`, which is
    /// safe as a Redis key part, a Docker name and a Linux interface name.
    pub fn name_value(
        &self,
        var: &impl Fn(&str) -> Option<String>,
        max_len: usize,
    ) -> Result<String, VarError> {
        let v = self.get(var);
        let ok = (1..=max_len).contains(&v.len())
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
            && v.starts_with(|c: char| c.is_ascii_alphanumeric());
        if ok {
            Ok(v)
        } else {
            Err(VarError::new(
                self.name,
                &v,
                format!(
                    "1 to {max_len} characters from letters, digits, '.', '_' and '-', \
                     starting with a letter or digit"
                ),
            ))
        }
    }
}

pub const REDIS_URL: Var = Var::new("REDIS_URL", "redis://127.0.0.1:6379");
pub const REDIS_KEY_PREFIX: Var = Var::new("REDIS_KEY_PREFIX", crate::Keys::DEFAULT_PREFIX);
pub const TASK_RETENTION_SECONDS: Var = Var::new("TASK_RETENTION_SECONDS", "86400");
pub const ZIP_MAX_ENTRIES: Var = Var::new("ZIP_MAX_ENTRIES", "10000");
pub const ZIP_MAX_EXPANDED_BYTES: Var = Var::new("ZIP_MAX_EXPANDED_BYTES", "268435456");
pub const REDIS_CLIENT_CERT: Var = Var::new("REDIS_CLIENT_CERT", "");
pub const REDIS_CLIENT_KEY: Var = Var::new("REDIS_CLIENT_KEY", "");
pub const REDIS_SENTINELS: Var = Var::new("REDIS_SENTINELS", "");
pub const REDIS_SENTINEL_MASTER: Var = Var::new("REDIS_SENTINEL_MASTER", "mymaster");
pub const REDIS_MIN_REPLICAS_ACK: Var = Var::new("REDIS_MIN_REPLICAS_ACK", "0");
pub const REDIS_REPLICA_ACK_TIMEOUT_MS: Var = Var::new("REDIS_REPLICA_ACK_TIMEOUT_MS", "1000");
/// Empty: the built-in catalogue (`runtimes::DEFAULT_RUNTIMES`) alone; entries
/// replace or add to it, so its text is no default of the variable.
pub const RUNTIME_IMAGES: Var = Var::new("RUNTIME_IMAGES", "");

/// The variables both binaries read, with their defaults (`""`: empty).
pub const COMMON_VARS: [Var; 12] = [
    REDIS_URL,
    REDIS_KEY_PREFIX,
    TASK_RETENTION_SECONDS,
    ZIP_MAX_ENTRIES,
    ZIP_MAX_EXPANDED_BYTES,
    REDIS_CLIENT_CERT,
    REDIS_CLIENT_KEY,
    REDIS_SENTINELS,
    REDIS_SENTINEL_MASTER,
    REDIS_MIN_REPLICAS_ACK,
    REDIS_REPLICA_ACK_TIMEOUT_MS,
    RUNTIME_IMAGES,
];

/// `raw` parsed as `T`, or `default` when unset or blank.
pub fn parse_or<T: FromStr>(
    name: &str,
    raw: Option<&str>,
    default: T,
    expected: &str,
) -> Result<T, VarError> {
    match raw.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(default),
        Some(v) => v.parse().map_err(|_| VarError::new(name, v, expected)),
    }
}

/// A whole number in `min..=max`, or `default` when unset.
pub fn parse_range(
    name: &str,
    raw: Option<&str>,
    default: u64,
    min: u64,
    max: u64,
) -> Result<u64, VarError> {
    let expected = format!("a whole number from {min} to {max}");
    let v: u64 = parse_or(name, raw, default, &expected)?;
    if (min..=max).contains(&v) {
        Ok(v)
    } else {
        Err(VarError::new(name, &v.to_string(), expected))
    }
}

/// A comma-separated list with blanks dropped.
pub fn parse_list(raw: Option<&str>, default: &str) -> Vec<String> {
    raw.filter(|v| !v.trim().is_empty())
        .unwrap_or(default)
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A lookup over fixed `(name, value)` pairs, as tests and tools configure a
/// binary without touching the process environment.
pub fn lookup_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let map: std::collections::HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    move |name| map.get(name).cloned()
}

/// `get` with a blank value counting as unset, as in most `.env` use: every
/// variable then falls back to its default the same way in both binaries.
pub fn non_blank(get: impl Fn(&str) -> Option<String>) -> impl Fn(&str) -> Option<String> {
    move |name| get(name).filter(|v| !v.trim().is_empty())
}

/// The settings api and worker must agree on, read the same way by both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Common {
    /// Where Redis is and how to reach it.
    pub redis: RedisSettings,
    /// `REDIS_KEY_PREFIX` (default `sr`).
    pub keys: crate::Keys,
    /// `TASK_RETENTION_SECONDS`: how long a finished task's record is kept
    /// (default a day, 60 s to a year).
    pub retention_seconds: u64,
}

/// Where Redis is, how to reach it, and what counts as a write it acknowledged.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisSettings {
    /// `REDIS_URL` (default `redis://127.0.0.1:6379`). With sentinels, only its
    /// scheme (TLS or not), user, password and database are used: the sentinels
    /// name the host.
    pub url: String,
    /// `REDIS_CLIENT_CERT` and `REDIS_CLIENT_KEY`: the client certificate (PEM, with
    /// any intermediates) and its private key presented on a `rediss://` connection,
    /// for a Redis that requires mutual TLS. Both or neither; read at start by
    /// `store::redis_pool::target`.
    pub client_cert: Option<ClientCertFiles>,
    /// `REDIS_SENTINELS` and `REDIS_SENTINEL_MASTER`: follow the primary Redis
    /// Sentinel names instead of `REDIS_URL`'s host (`None`: no sentinels).
    pub sentinels: Option<Sentinels>,
    /// `REDIS_MIN_REPLICAS_ACK` and `REDIS_REPLICA_ACK_TIMEOUT_MS` (`None`: 0,
    /// a write counts once the primary has it).
    pub replica_ack: Option<ReplicaAck>,
}

/// Leaves `url` out (its password): a binary's `Config` shows it redacted.
impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("client_cert", &self.client_cert)
            .field("sentinels", &self.sentinels)
            .field("replica_ack", &self.replica_ack)
            .finish_non_exhaustive()
    }
}

/// The sentinels to ask, as URLs (`redis://host:port` for a bare `host:port`),
/// and the name of the primary they watch. `Debug` hides their passwords.
#[derive(Clone, PartialEq, Eq)]
pub struct Sentinels {
    pub addrs: Vec<String>,
    pub master: String,
}

impl std::fmt::Debug for Sentinels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hosts: Vec<&str> = self
            .addrs
            .iter()
            .map(|a| a.rsplit_once('@').map_or(a.as_str(), |(_, h)| h))
            .collect();
        f.debug_struct("Sentinels")
            .field("hosts", &hosts)
            .field("master", &self.master)
            .finish()
    }
}

/// Writes whose loss would lose a task or run it twice are acknowledged only
/// once `replicas` replicas have them (Redis `WAIT`), waiting at most `timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaAck {
    pub replicas: u32,
    pub timeout: std::time::Duration,
}

impl Sentinels {
    /// `REDIS_SENTINELS` and `REDIS_SENTINEL_MASTER`; `None` when no sentinel is set.
    pub fn from_lookup(
        var: &impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Sentinels>, VarError> {
        // Checked even without sentinels: a bad name is found before it is needed.
        let master = REDIS_SENTINEL_MASTER.get(var);
        let valid_master = !master.is_empty()
            && master.len() <= 128
            && master
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !valid_master {
            return Err(VarError::new(
                REDIS_SENTINEL_MASTER.name,
                &master,
                "the name the sentinels monitor the primary under: 1 to 128 characters from \
                 letters, digits, '.', '_' and '-'",
            ));
        }
        let raw = REDIS_SENTINELS.get(var);
        let entries = parse_list(Some(&raw), "");
        if entries.is_empty() {
            return Ok(None);
        }
        let expected = "comma-separated sentinel addresses, each host:port, or \
                        redis://[user:password@]host:port or rediss://... for a sentinel \
                        with ACL credentials or TLS";
        let mut addrs = Vec::with_capacity(entries.len());
        // An entry is shown back without its credentials: errors reach the logs.
        let shown = |e: &str| match e.rsplit_once('@') {
            Some((before, host)) => {
                let scheme = before.split_once("://").map_or("", |(s, _)| s);
                format!("{scheme}://***@{host}")
            }
            None => e.to_owned(),
        };
        for entry in entries {
            let (scheme, rest) = match entry.split_once("://") {
                Some((s @ ("redis" | "rediss"), rest)) => (s, rest),
                Some(_) => {
                    return Err(VarError::new(
                        REDIS_SENTINELS.name,
                        &shown(&entry),
                        expected,
                    ));
                }
                None => ("redis", entry.as_str()),
            };
            let hostport = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
            let ok = hostport.rsplit_once(':').is_some_and(|(host, port)| {
                !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
            }) && !hostport.contains('/');
            if !ok {
                return Err(VarError::new(
                    REDIS_SENTINELS.name,
                    &shown(&entry),
                    expected,
                ));
            }
            addrs.push(format!("{scheme}://{rest}"));
        }
        Ok(Some(Sentinels { addrs, master }))
    }
}

impl ReplicaAck {
    /// `REDIS_MIN_REPLICAS_ACK` and `REDIS_REPLICA_ACK_TIMEOUT_MS`; `None` for 0 replicas.
    pub fn from_lookup(
        var: &impl Fn(&str) -> Option<String>,
    ) -> Result<Option<ReplicaAck>, VarError> {
        let replicas = REDIS_MIN_REPLICAS_ACK.range(var, 0, 16)?;
        // Below the connections' 10 s reply timeout, which would cut a longer WAIT.
        let timeout_ms = REDIS_REPLICA_ACK_TIMEOUT_MS.range(var, 10, 5_000)?;
        Ok((replicas > 0).then(|| ReplicaAck {
            replicas: replicas as u32,
            timeout: std::time::Duration::from_millis(timeout_ms),
        }))
    }
}

/// The files of a TLS client certificate: paths only (`shared` reads no file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCertFiles {
    pub cert: String,
    pub key: String,
}

impl Common {
    /// `var` returns a variable's value, `None` when unset or blank.
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Common, VarError> {
        let redis_url = REDIS_URL.get(&var);
        let redis_client_cert = match (
            var(REDIS_CLIENT_CERT.name).filter(|v| !v.trim().is_empty()),
            var(REDIS_CLIENT_KEY.name).filter(|v| !v.trim().is_empty()),
        ) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                if !redis_url.trim_start().starts_with("rediss://") {
                    return Err(VarError::new(
                        REDIS_CLIENT_CERT.name,
                        &cert,
                        "set only with a rediss:// REDIS_URL (a client certificate needs TLS)",
                    ));
                }
                Some(ClientCertFiles { cert, key })
            }
            (Some(v), None) | (None, Some(v)) => {
                let set = if v == var(REDIS_CLIENT_CERT.name).unwrap_or_default() {
                    REDIS_CLIENT_CERT
                } else {
                    REDIS_CLIENT_KEY
                };
                return Err(VarError::new(
                    set.name,
                    &v,
                    "REDIS_CLIENT_CERT and REDIS_CLIENT_KEY go together: set both or neither",
                ));
            }
        };
        Ok(Common {
            redis: RedisSettings {
                url: redis_url,
                client_cert: redis_client_cert,
                sentinels: Sentinels::from_lookup(&var)?,
                replica_ack: ReplicaAck::from_lookup(&var)?,
            },
            // Every key is `<prefix>:...`: a ':' or a glob character in the
            // prefix would let two deployments' keys (and SCANs) meet.
            keys: crate::Keys::new(REDIS_KEY_PREFIX.name_value(&var, 64)?),
            retention_seconds: TASK_RETENTION_SECONDS.range(
                &var,
                MIN_RETENTION_SECONDS,
                365 * 86_400,
            )?,
        })
    }
}

/// The shortest `TASK_RETENTION_SECONDS`: an ended task's record, and its
/// events stream (at most `keys::FINAL_EVENTS_TTL_SECONDS`), live at least so
/// long.
pub const MIN_RETENTION_SECONDS: u64 = 60;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_names_the_variable_and_the_bounds() {
        assert_eq!(parse_range("X", None, 5, 1, 10), Ok(5));
        assert_eq!(parse_range("X", Some(" 7 "), 5, 1, 10), Ok(7));
        let e = parse_range("X", Some("0"), 5, 1, 10)
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some("X=\"0\" is not valid: a whole number from 1 to 10")
        );
        assert!(parse_range("X", Some("ten"), 5, 1, 10).is_err());
    }

    #[test]
    fn a_client_certificate_needs_its_key_and_tls() {
        let load = |pairs: &[(&str, &str)]| Common::from_lookup(lookup_of(pairs));
        let tls = ("REDIS_URL", "rediss://w:p@redis.example:6380");
        let both = [
            tls,
            ("REDIS_CLIENT_CERT", "/c.crt"),
            ("REDIS_CLIENT_KEY", "/c.key"),
        ];
        assert_eq!(
            load(&both).map(|c| c.redis.client_cert),
            Ok(Some(ClientCertFiles {
                cert: "/c.crt".into(),
                key: "/c.key".into()
            }))
        );
        assert_eq!(load(&[tls]).map(|c| c.redis.client_cert), Ok(None));
        let half = load(&[tls, ("REDIS_CLIENT_CERT", "/c.crt")]);
        assert!(half.is_err_and(|e| e.expected.contains("set both or neither")));
        let plain = load(&[
            ("REDIS_URL", "redis://127.0.0.1:6379"),
            ("REDIS_CLIENT_CERT", "/c.crt"),
            ("REDIS_CLIENT_KEY", "/c.key"),
        ]);
        assert!(plain.is_err_and(|e| e.expected.contains("rediss://")));
    }

    #[test]
    fn sentinels_are_host_port_or_urls_and_a_bad_one_is_named() {
        let load = |pairs: &[(&str, &str)]| Common::from_lookup(lookup_of(pairs)).map(|c| c.redis);
        assert_eq!(load(&[]).map(|r| r.sentinels), Ok(None));
        let s = load(&[(
            "REDIS_SENTINELS",
            "10.0.0.1:26379, rediss://sent:pw@s2.example:26380",
        )]);
        assert_eq!(
            s.map(|r| r.sentinels),
            Ok(Some(Sentinels {
                addrs: vec![
                    "redis://10.0.0.1:26379".into(),
                    "rediss://sent:pw@s2.example:26380".into()
                ],
                master: "mymaster".into()
            }))
        );
        for bad in [
            "s1",
            "s1:0",
            "s1:port",
            "http://s1:26379",
            ":26379",
            "s1:26379/0",
        ] {
            let e = load(&[("REDIS_SENTINELS", bad)]).err();
            assert!(
                e.as_ref()
                    .is_some_and(|e| e.name == "REDIS_SENTINELS" && e.value == bad),
                "{bad}: {e:?}"
            );
        }
        let e = load(&[
            ("REDIS_SENTINELS", "s1:26379"),
            ("REDIS_SENTINEL_MASTER", "a b"),
        ])
        .err();
        assert!(e.is_some_and(|e| e.name == "REDIS_SENTINEL_MASTER"));
        let shown = format!(
            "{:?}",
            load(&[("REDIS_SENTINELS", "redis://u:secret@s1:1")])
        );
        assert!(!shown.contains("secret"), "{shown}");
        let bad = load(&[("REDIS_SENTINELS", "rediss://u:secret@s1")]).err();
        assert!(
            bad.as_ref()
                .is_some_and(|e| !e.to_string().contains("secret") && e.value == "rediss://***@s1"),
            "{bad:?}"
        );
    }

    #[test]
    fn replica_acks_are_off_by_default_and_bounded() {
        let load = |pairs: &[(&str, &str)]| Common::from_lookup(lookup_of(pairs)).map(|c| c.redis);
        assert_eq!(load(&[]).map(|r| r.replica_ack), Ok(None));
        assert_eq!(
            load(&[("REDIS_MIN_REPLICAS_ACK", "1")]).map(|r| r.replica_ack),
            Ok(Some(ReplicaAck {
                replicas: 1,
                timeout: std::time::Duration::from_millis(1000)
            }))
        );
        assert!(load(&[("REDIS_MIN_REPLICAS_ACK", "17")]).is_err());
        assert!(load(&[("REDIS_REPLICA_ACK_TIMEOUT_MS", "5")]).is_err());
        let shown = format!("{:?}", load(&[("REDIS_URL", "redis://w:hunter2@r:6379")]));
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn names_are_checked_for_length_and_characters() {
        let set = |v: &'static str| move |_: &str| Some(v.to_owned());
        assert_eq!(
            REDIS_KEY_PREFIX.name_value(&|_: &str| None, 64),
            Ok("sr".to_owned())
        );
        assert!(REDIS_KEY_PREFIX.name_value(&set("a:b"), 64).is_err());
        assert!(REDIS_KEY_PREFIX.name_value(&set("sr*"), 64).is_err());
        assert!(REDIS_KEY_PREFIX.name_value(&set("-x"), 64).is_err());
        let long = REDIS_KEY_PREFIX.name_value(&set("abcdefghijklmnop"), 15);
        assert!(long.is_err_and(|e| e.expected.starts_with("1 to 15 characters")));
    }

    #[test]
    fn lists_drop_blanks() {
        assert_eq!(parse_list(Some("a, ,b"), "z"), ["a", "b"]);
        assert_eq!(parse_list(None, "z,y"), ["z", "y"]);
    }
}
