//! API keys: what a key may do (`Scope`, `Scopes`), how much (`Limits`), what
//! it is called (`check_name`), how it is stored (`ApiKeyField`,
//! `ApiKeyRecord`) and how a presented key is looked up (`key_hash`).
//!
//! A key is `srk_` and 32 random bytes in base64url (made by
//! `store::apikeys::generate`, which reads the OS's randomness). Redis holds
//! only its SHA-256, hex: the record lives under `Keys::api_key(<sha256>)`, and
//! `Keys::api_key_names()` maps each name to its hash. A fast hash is right
//! here (docs/security.md says why): the secret has 256 bits of entropy, so
//! there is nothing for a slow hash to protect against a guesser.

use std::collections::BTreeMap;
use std::fmt;

use sha2::{Digest, Sha256};

use crate::egress::AllowList;
use crate::names::{UnknownName, stored_names};
use crate::options::{Network, Networks};

/// Every API key starts with this, so a key is recognisable in a config file
/// (and by secret scanners), and never mistaken for the admin token.
pub const KEY_PREFIX: &str = "srk_";

/// How long a key's `last_used_at` may lag: the api writes it at most once per
/// this many milliseconds per key, so using a key costs no write per request.
pub const LAST_USED_INTERVAL_MS: u64 = 60_000;

/// The SHA-256 of a presented key, lower-case hex: its record's name in Redis.
pub fn key_hash(key: &[u8]) -> String {
    let digest = Sha256::digest(key);
    let mut hex = String::with_capacity(64);
    for b in digest.iter() {
        hex.push_str(&format!("{b:02x}"));
    }
    hex
}

/// What a key may do. Stored as its name in the key's `scopes` field.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantArray,
    strum::Display,
)]
#[strum(serialize_all = "snake_case", const_into_str)]
#[strum(parse_err_ty = UnknownName, parse_err_fn = Scope::unknown)]
pub enum Scope {
    /// `run_script`.
    Run,
    /// `get_task_status`, `get_task_files`, `list_tasks`, `tasks/get`.
    Read,
    /// `kill_task`, `tasks/cancel`.
    Kill,
}

stored_names!(Scope, parse "scope");

/// A set of scopes, shown and stored as `run,read,kill` (declaration order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Scopes(u8);

impl Scopes {
    pub const ALL: Scopes = Scopes(0b111);
    pub const NONE: Scopes = Scopes(0);

    fn bit(s: Scope) -> u8 {
        1 << (s as u8)
    }

    pub fn with(self, s: Scope) -> Scopes {
        Scopes(self.0 | Scopes::bit(s))
    }

    pub fn contains(self, s: Scope) -> bool {
        self.0 & Scopes::bit(s) != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = Scope> {
        Scope::ALL
            .iter()
            .copied()
            .filter(move |&s| self.contains(s))
    }

    /// A comma-separated list (`run,read`); blanks around names are ignored.
    /// Empty, or naming an unknown scope, is an error naming the allowed ones.
    pub fn parse(list: &str) -> Result<Scopes, KeyError> {
        let mut scopes = Scopes::NONE;
        for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            let s: Scope = word
                .parse()
                .map_err(|_| KeyError::UnknownScope(word.to_owned()))?;
            scopes = scopes.with(s);
        }
        if scopes.is_empty() {
            return Err(KeyError::NoScopes);
        }
        Ok(scopes)
    }
}

impl fmt::Display for Scopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().map(Scope::as_str).collect();
        if names.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&names.join(","))
        }
    }
}

/// A key's quotas; `None` is unlimited (the service-wide `MAX_QUEUED_TASKS`
/// still applies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// The key's tasks in state queued at once.
    pub max_queued: Option<u64>,
    /// The key's tasks active (queued or running) at once; more are refused.
    pub max_running: Option<u64>,
    /// CPU seconds the key's tasks may use per rolling 24 hours.
    pub cpu_seconds_per_day: Option<u64>,
    /// The egress policies its tasks may ask for (`None`: all three).
    pub networks: Option<Networks>,
}

impl Limits {
    /// Whether the key's tasks may run with `network`.
    pub fn allows_network(&self, network: Network) -> bool {
        self.networks.is_none_or(|n| n.contains(network))
    }
}

/// A key name, an owner name, a scope list or a stored key record that is
/// not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error(
        "key name {0:?} is not allowed: use 1 to 63 characters, lower-case letters, digits, '.', '_' and '-', starting with a letter or digit"
    )]
    BadName(String),
    #[error("unknown scope {0:?}: use run, read and kill, comma-separated")]
    UnknownScope(String),
    #[error("no scopes given: use one or more of run, read and kill, comma-separated")]
    NoScopes,
    #[error("the API key record's field {field} is malformed ({value:?})")]
    BadField { field: &'static str, value: String },
    #[error("the API key record has no {0}")]
    MissingField(&'static str),
}

/// The longest key name.
pub const MAX_NAME_LEN: usize = 63;

/// A key name is `[a-z0-9][a-z0-9._-]{0,62}`: safe inside a Redis key, a
/// metric label and a log line, and never containing `:` (so it cannot pass
/// for an `oauth:<subject>` owner).
pub fn check_name(name: &str) -> Result<(), KeyError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.bytes().enumerate().all(|(i, b)| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || (i > 0 && b".-_".contains(&b))
        });
    if ok {
        Ok(())
    } else {
        Err(KeyError::BadName(name.to_owned()))
    }
}

/// The fields of an API key record (`Keys::api_key`). Stored under its
/// `as_str()` name, the variant's in snake case.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantArray,
    strum::Display,
)]
#[strum(serialize_all = "snake_case", const_into_str)]
#[strum(parse_err_ty = UnknownName, parse_err_fn = ApiKeyField::unknown)]
pub enum ApiKeyField {
    /// The key's name: the owner of its tasks.
    Name,
    /// `Scopes` as text, e.g. `run,read,kill`.
    Scopes,
    MaxQueued,
    MaxRunning,
    CpuSecondsPerDay,
    /// `Networks` as text, e.g. `none,allow`; absent: all.
    Networks,
    /// The hosts its allow-list tasks may name at most (`AllowList::to_stored`);
    /// absent: any (within the operator's `EGRESS_ALLOW_HOSTS`).
    AllowHosts,
    /// When it was created (or last rotated: the record moves with the key).
    CreatedAt,
    /// When it was last used, to within `LAST_USED_INTERVAL_MS`.
    LastUsedAt,
}

stored_names!(ApiKeyField, parse "API key field");

/// An API key's record, typed (never the key: Redis does not have it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyRecord {
    pub name: String,
    pub scopes: Scopes,
    pub limits: Limits,
    /// The ceiling on its tasks' allow-lists (`--allow-hosts`); `None`: none.
    pub allow_hosts: Option<AllowList>,
    pub created_at: Option<i64>,
    pub last_used_at: Option<i64>,
}

impl ApiKeyRecord {
    /// The pairs to store at creation (`created_at` comes from Redis's clock,
    /// `last_used_at` from use).
    pub fn to_fields(&self) -> Vec<(ApiKeyField, String)> {
        let mut out = vec![
            (ApiKeyField::Name, self.name.clone()),
            (ApiKeyField::Scopes, self.scopes.to_string()),
        ];
        let l = &self.limits;
        for (f, v) in [
            (ApiKeyField::MaxQueued, l.max_queued),
            (ApiKeyField::MaxRunning, l.max_running),
            (ApiKeyField::CpuSecondsPerDay, l.cpu_seconds_per_day),
        ] {
            if let Some(v) = v {
                out.push((f, v.to_string()));
            }
        }
        if let Some(n) = l.networks {
            out.push((ApiKeyField::Networks, n.to_string()));
        }
        if let Some(hosts) = &self.allow_hosts {
            out.push((ApiKeyField::AllowHosts, hosts.to_stored()));
        }
        out
    }

    /// A record from an `HGETALL`; `Ok(None)` for an empty hash (no such key).
    pub fn from_hash<K: AsRef<str>, V: AsRef<str>>(
        hash: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Option<ApiKeyRecord>, KeyError> {
        let map: BTreeMap<ApiKeyField, String> = hash
            .into_iter()
            .filter_map(|(k, v)| {
                let f = k.as_ref().parse::<ApiKeyField>().ok()?;
                Some((f, v.as_ref().to_owned()))
            })
            .collect();
        if map.is_empty() {
            return Ok(None);
        }
        let num = |f: ApiKeyField| -> Result<Option<u64>, KeyError> {
            map.get(&f)
                .map(|v| {
                    v.parse().map_err(|_| KeyError::BadField {
                        field: f.as_str(),
                        value: v.clone(),
                    })
                })
                .transpose()
        };
        let name = map
            .get(&ApiKeyField::Name)
            .cloned()
            .ok_or(KeyError::MissingField(ApiKeyField::Name.as_str()))?;
        let scopes = map
            .get(&ApiKeyField::Scopes)
            .ok_or(KeyError::MissingField(ApiKeyField::Scopes.as_str()))?;
        let scopes = Scopes::parse(scopes).map_err(|_| KeyError::BadField {
            field: ApiKeyField::Scopes.as_str(),
            value: scopes.clone(),
        })?;
        let signed = |f| num(f).map(|v| v.map(|v| v as i64));
        Ok(Some(ApiKeyRecord {
            name,
            scopes,
            limits: Limits {
                max_queued: num(ApiKeyField::MaxQueued)?,
                max_running: num(ApiKeyField::MaxRunning)?,
                cpu_seconds_per_day: num(ApiKeyField::CpuSecondsPerDay)?,
                networks: map
                    .get(&ApiKeyField::Networks)
                    .map(|v| {
                        Networks::parse(v).map_err(|_| KeyError::BadField {
                            field: ApiKeyField::Networks.as_str(),
                            value: v.clone(),
                        })
                    })
                    .transpose()?,
            },
            allow_hosts: map
                .get(&ApiKeyField::AllowHosts)
                .map(|v| {
                    AllowList::from_stored(v).map_err(|_| KeyError::BadField {
                        field: ApiKeyField::AllowHosts.as_str(),
                        value: v.clone(),
                    })
                })
                .transpose()?,
            created_at: signed(ApiKeyField::CreatedAt)?,
            last_used_at: signed(ApiKeyField::LastUsedAt)?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_a_closed_alphabet() {
        for good in ["a", "ci", "alice.smith", "team-1_bot", &"x".repeat(63)] {
            assert_eq!(check_name(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "-a",
            ".a",
            "Alice",
            "a b",
            "a:b",
            "oauth:x",
            "é",
            &"x".repeat(64),
        ] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        let msg = check_name("A")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(msg.contains("lower-case letters, digits"), "{msg}");
    }

    #[test]
    fn scopes_parse_and_print_in_order() {
        assert_eq!(
            Scopes::parse("kill, run").map(|s| s.to_string()),
            Ok("run,kill".into())
        );
        assert_eq!(Scopes::ALL.to_string(), "run,read,kill");
        assert_eq!(Scopes::parse(""), Err(KeyError::NoScopes));
        assert_eq!(
            Scopes::parse("run,write"),
            Err(KeyError::UnknownScope("write".into()))
        );
        let read = Scopes::parse("read").unwrap_or_default();
        assert!(read.contains(Scope::Read) && !read.contains(Scope::Run));
    }

    #[test]
    fn the_hash_is_sha256_hex() {
        // echo -n abc | sha256sum
        assert_eq!(
            key_hash(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn records_round_trip() {
        let r = ApiKeyRecord {
            name: "ci".into(),
            scopes: Scopes::parse("run,read").unwrap_or_default(),
            limits: Limits {
                max_queued: Some(5),
                max_running: None,
                cpu_seconds_per_day: Some(3600),
                networks: Networks::parse("none,allow").ok(),
            },
            allow_hosts: AllowList::parse(&["pypi.org", "*.pythonhosted.org"]).ok(),
            created_at: None,
            last_used_at: None,
        };
        let fields: Vec<(String, String)> = r
            .to_fields()
            .into_iter()
            .map(|(f, v)| (f.as_str().to_owned(), v))
            .chain([("created_at".to_owned(), "7".to_owned())])
            .collect();
        let back = ApiKeyRecord::from_hash(fields).ok().flatten();
        assert_eq!(
            back,
            Some(ApiKeyRecord {
                created_at: Some(7),
                ..r
            })
        );
        let none: Vec<(String, String)> = vec![];
        assert_eq!(ApiKeyRecord::from_hash(none), Ok(None));
    }
}
