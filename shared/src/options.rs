//! Per-task options a client may set in `run_script` beside the command: the
//! network a task gets and its extra environment. The api validates them at
//! submit; the worker applies them as recorded.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::names::{UnknownName, stored_names};

/// The network a task's container gets.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantArray,
    strum::Display,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase", const_into_str)]
#[strum(parse_err_ty = UnknownName, parse_err_fn = Network::unknown)]
pub enum Network {
    /// The isolated task bridge: the internet is reachable, the service, this
    /// host and private networks are not.
    #[default]
    Internet,
    /// No network at all: only a loopback interface.
    None,
    /// Only the hosts of the task's allow-list (`Field::EgressAllow`), through
    /// the worker's egress proxy: no route out, no DNS (`crate::egress`).
    Allow,
}

stored_names!(Network, parse "network");

/// A set of network kinds: what an API key may ask for (`Limits::networks`).
/// Shown and stored as `internet,none,allow` (declaration order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Networks(u8);

impl Networks {
    pub const ALL: Networks = Networks(0b111);

    fn bit(n: Network) -> u8 {
        1 << (n as u8)
    }

    pub fn contains(self, n: Network) -> bool {
        self.0 & Networks::bit(n) != 0
    }

    pub fn iter(self) -> impl Iterator<Item = Network> {
        Network::ALL
            .iter()
            .copied()
            .filter(move |&n| self.contains(n))
    }

    /// A comma-separated list (`none,allow`). Empty, or naming an unknown
    /// kind, is an error naming the kinds.
    pub fn parse(list: &str) -> Result<Networks, UnknownName> {
        let mut set = 0;
        for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            set |= Networks::bit(word.parse()?);
        }
        if set == 0 {
            return Err(Network::unknown(list));
        }
        Ok(Networks(set))
    }
}

impl std::fmt::Display for Networks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.iter().map(Network::as_str).collect();
        f.write_str(&names.join(","))
    }
}

/// Whether a task's pip and npm caches persist: the owner's own, kept on the
/// worker host between its tasks (docs/sandbox.md, dependency caches), or none.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantArray,
    strum::Display,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase", const_into_str)]
#[strum(parse_err_ty = UnknownName, parse_err_fn = CacheUse::unknown)]
pub enum CacheUse {
    /// The owner's caches on the worker host, if free (not lent to another of
    /// its running tasks) and the worker keeps caches.
    #[default]
    Owner,
    /// Empty caches in the task's /tmp; the owner's are neither read nor written.
    None,
}

stored_names!(CacheUse, parse "cache");

/// At most this many extra environment variables per task.
pub const MAX_ENV_VARS: usize = 64;
/// At most this many bytes of names and values together.
pub const MAX_ENV_BYTES: usize = 32 * 1024;
/// Names the sandbox sets and relies on: `PATH` finds the in-container deadline
/// (`timeout`) and the shell, `HOME` is the writable home.
pub const RESERVED_ENV: [&str; 3] = ["HOME", "PATH", "PWD"];
/// Prefixes kept for the service's own variables.
pub const RESERVED_ENV_PREFIXES: [&str; 2] = ["SCRIPT_RUNNER_", "SR_"];

/// Why an `env` map was refused. Shown to the client as is.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EnvError {
    #[error(
        "env name {0:?} is not valid: use letters, digits and '_', not starting with a digit (e.g. API_URL)"
    )]
    BadName(String),
    #[error(
        "env name {0:?} is reserved by the sandbox (HOME, PATH, PWD and names starting with SCRIPT_RUNNER_ or SR_); choose another name"
    )]
    Reserved(String),
    #[error("env value of {0} contains a NUL byte, which a process environment cannot hold")]
    NulInValue(String),
    #[error("env has {0} variables; at most {MAX_ENV_VARS} are allowed")]
    TooMany(usize),
    #[error(
        "env holds {0} bytes of names and values; at most {MAX_ENV_BYTES} are allowed (put larger data in zip_base64)"
    )]
    TooLarge(usize),
}

/// Checks a task's extra environment.
pub fn check_env(env: &BTreeMap<String, String>) -> Result<(), EnvError> {
    if env.len() > MAX_ENV_VARS {
        return Err(EnvError::TooMany(env.len()));
    }
    let bytes: usize = env.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_ENV_BYTES {
        return Err(EnvError::TooLarge(bytes));
    }
    for (name, value) in env {
        let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(EnvError::BadName(name.clone()));
        }
        if RESERVED_ENV.contains(&name.as_str())
            || RESERVED_ENV_PREFIXES.iter().any(|p| name.starts_with(p))
        {
            return Err(EnvError::Reserved(name.clone()));
        }
        if value.contains('\0') {
            return Err(EnvError::NulInValue(name.clone()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn ordinary_names_pass_and_bad_or_reserved_ones_are_named() {
        assert_eq!(check_env(&env(&[("API_URL", "x"), ("_a1", "")])), Ok(()));
        assert_eq!(
            check_env(&env(&[("1X", "v")])),
            Err(EnvError::BadName("1X".into()))
        );
        assert_eq!(
            check_env(&env(&[("A-B", "v")])),
            Err(EnvError::BadName("A-B".into()))
        );
        assert_eq!(
            check_env(&env(&[("PATH", "/tmp")])),
            Err(EnvError::Reserved("PATH".into()))
        );
        assert_eq!(
            check_env(&env(&[("SR_X", "1")])),
            Err(EnvError::Reserved("SR_X".into()))
        );
        assert_eq!(
            check_env(&env(&[("A", "a\0b")])),
            Err(EnvError::NulInValue("A".into()))
        );
    }

    #[test]
    fn size_and_count_are_bounded() {
        let many: BTreeMap<String, String> = (0..=MAX_ENV_VARS)
            .map(|i| (format!("V{i}"), String::new()))
            .collect();
        assert_eq!(check_env(&many), Err(EnvError::TooMany(MAX_ENV_VARS + 1)));
        let big = env(&[("BIG", &"x".repeat(MAX_ENV_BYTES))]);
        assert!(matches!(check_env(&big), Err(EnvError::TooLarge(_))));
    }

    #[test]
    fn cache_uses_round_trip() {
        for c in [CacheUse::Owner, CacheUse::None] {
            assert_eq!(c.as_str().parse::<CacheUse>(), Ok(c));
        }
        assert_eq!(CacheUse::default(), CacheUse::Owner);
    }

    #[test]
    fn networks_round_trip() {
        for n in [Network::Internet, Network::None, Network::Allow] {
            assert_eq!(n.as_str().parse::<Network>(), Ok(n));
            assert_eq!(
                serde_json::to_value(n).ok(),
                Some(serde_json::json!(n.as_str()))
            );
        }
        assert_eq!(Network::default(), Network::Internet);
        let set = Networks::parse("allow, none").unwrap();
        assert_eq!(set.to_string(), "none,allow");
        assert!(!set.contains(Network::Internet));
        assert_eq!(
            Networks::parse(&Networks::ALL.to_string()),
            Ok(Networks::ALL)
        );
        assert!(Networks::parse("").is_err());
        let e = Networks::parse("none,wifi").unwrap_err().to_string();
        assert!(e.contains("wifi"), "{e}");
    }
}

/// At most this many `collect` patterns.
pub const MAX_COLLECT_PATTERNS: usize = 20;
/// At most this many characters in one pattern.
pub const MAX_COLLECT_PATTERN_LEN: usize = 256;
/// Bytes of collected files kept per task at most (the archive read from the
/// task, about the files' total). The worker enforces it; the tool
/// descriptions quote it.
pub const MAX_COLLECT_BYTES: u64 = 16 << 20;
/// Collected files kept per task at most.
pub const MAX_COLLECT_FILES: usize = 1000;

/// Why a `collect` list was refused. Shown to the client as is.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CollectError {
    #[error("collect has {0} patterns; at most {MAX_COLLECT_PATTERNS} are allowed")]
    TooMany(usize),
    #[error(
        "collect pattern {0:?} is not allowed: give a path or shell glob relative to /workspace (e.g. \"out/*.txt\" or \"report.html\"), without \"..\", a leading '/', newlines or more than 256 characters"
    )]
    BadPattern(String),
}

/// Checks `collect`: paths or shell globs relative to /workspace.
pub fn check_collect(patterns: &[String]) -> Result<(), CollectError> {
    if patterns.len() > MAX_COLLECT_PATTERNS {
        return Err(CollectError::TooMany(patterns.len()));
    }
    for p in patterns {
        let bad = p.trim().is_empty()
            || p.len() > MAX_COLLECT_PATTERN_LEN
            || p.starts_with('/')
            || p.contains(['\n', '\r', '\0'])
            || p.split('/').any(|c| c == "..");
        if bad {
            return Err(CollectError::BadPattern(p.chars().take(80).collect()));
        }
    }
    Ok(())
}

/// One collected file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CollectedFile {
    /// Path relative to /workspace.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
}

/// What a task's `collect` gathered after its run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectedFiles {
    pub files: Vec<CollectedFile>,
    /// True when more matched than the caps allow (or the archive was cut).
    pub truncated: bool,
}

#[cfg(test)]
mod collect_tests {
    use super::*;

    #[test]
    fn patterns_stay_under_the_workspace() {
        let ok: Vec<String> = vec!["out/*.txt".into(), "report.html".into(), "dist".into()];
        assert_eq!(check_collect(&ok), Ok(()));
        for bad in ["/etc/passwd", "../x", "a/../../b", "", "a\nb"] {
            assert!(
                matches!(
                    check_collect(&[bad.to_owned()]),
                    Err(CollectError::BadPattern(_))
                ),
                "{bad:?}"
            );
        }
        let many: Vec<String> = (0..=MAX_COLLECT_PATTERNS)
            .map(|i| format!("f{i}"))
            .collect();
        assert_eq!(check_collect(&many), Err(CollectError::TooMany(21)));
    }
}
