//! Dependency caches (pip's, npm's) kept per owner on each worker host: how an
//! owner's cache is named, and how a clear request is recorded. The worker
//! keeps the caches (`worker::cache`); the ctl asks for clears
//! (`Keys::cache_clears`). docs/sandbox.md describes the design.

use std::borrow::Cow;

use sha2::{Digest, Sha256};

use crate::owner::{ADMIN_NAME, Owner};

/// The field of `Keys::cache_clears` that clears every owner's cache.
pub const ALL_OWNERS: &str = "*";

/// An owner's cache name: the SHA-256 (hex) of its stored name (`ADMIN_NAME` for
/// the admin), so any owner (`oauth:<sub>`, an API key's name, the admin) is a
/// safe directory name and a field the ctl can compute from the name alone.
pub fn owner_id(owner: &Owner) -> String {
    let name = match owner {
        Owner::Admin => Cow::Borrowed(ADMIN_NAME),
        other => other.as_stored(),
    };
    Sha256::digest(name.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The clear generations a cache was made under: its owner's and every
/// owner's (`ALL_OWNERS`), as `HMGET` returns them (absent: 0). A cache whose
/// generations differ from the current ones was cleared since: it is emptied
/// before use. Compared for equality only, so a counter reset cannot hide a
/// clear unless both reset together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Generations {
    pub owner: u64,
    pub all: u64,
}

impl Generations {
    /// From the two `HMGET` values (absent or unparsable: 0).
    pub fn from_values(owner: Option<&str>, all: Option<&str>) -> Generations {
        let n = |v: Option<&str>| v.and_then(|v| v.trim().parse().ok()).unwrap_or(0);
        Generations {
            owner: n(owner),
            all: n(all),
        }
    }

    /// The text a worker stores beside a cache: `<owner> <all>`.
    pub fn to_text(self) -> String {
        format!("{} {}", self.owner, self.all)
    }

    /// Reads `to_text`; `None` for anything else.
    pub fn parse(text: &str) -> Option<Generations> {
        let mut words = text.split_whitespace();
        let owner = words.next()?.parse().ok()?;
        let all = words.next()?.parse().ok()?;
        words.next().is_none().then_some(Generations { owner, all })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_get_distinct_hex_names_and_the_admin_one_of_its_own() {
        let a = owner_id(&Owner::Key("alice".into()));
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, owner_id(&Owner::Key("bob".into())));
        assert_ne!(owner_id(&Owner::Admin), a);
        assert_eq!(owner_id(&Owner::OAuth("x/../y".into())).len(), 64);
        // The names caches already have on disk: the stored name's hash.
        assert_eq!(
            owner_id(&Owner::OAuth("x".into())),
            Sha256::digest(b"oauth:x")
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
    }

    #[test]
    fn generations_round_trip_and_default_to_zero() {
        let g = Generations::from_values(Some("3"), None);
        assert_eq!(g, Generations { owner: 3, all: 0 });
        assert_eq!(Generations::parse(&g.to_text()), Some(g));
        assert_eq!(Generations::parse("3"), None);
        assert_eq!(Generations::parse("1 2 3"), None);
    }
}
