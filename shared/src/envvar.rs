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

/// The variables both binaries read, with literal defaults.
pub const COMMON_VARS: [Var; 7] = [
    REDIS_URL,
    REDIS_KEY_PREFIX,
    TASK_RETENTION_SECONDS,
    ZIP_MAX_ENTRIES,
    ZIP_MAX_EXPANDED_BYTES,
    REDIS_CLIENT_CERT,
    REDIS_CLIENT_KEY,
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
    /// `REDIS_URL` (default `redis://127.0.0.1:6379`).
    pub redis_url: String,
    /// `REDIS_KEY_PREFIX` (default `sr`).
    pub keys: crate::Keys,
    /// `TASK_RETENTION_SECONDS`: how long a finished task's record is kept
    /// (default a day, 60 s to a year).
    pub retention_seconds: u64,
    /// `REDIS_CLIENT_CERT` and `REDIS_CLIENT_KEY`: the client certificate (PEM, with
    /// any intermediates) and its private key presented on a `rediss://` connection,
    /// for a Redis that requires mutual TLS. Both or neither; read at start by
    /// `support::redis_pool::target`.
    pub redis_client_cert: Option<ClientCertFiles>,
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
            redis_client_cert,
            redis_url,
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
            load(&both).map(|c| c.redis_client_cert),
            Ok(Some(ClientCertFiles {
                cert: "/c.crt".into(),
                key: "/c.key".into()
            }))
        );
        assert_eq!(load(&[tls]).map(|c| c.redis_client_cert), Ok(None));
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
