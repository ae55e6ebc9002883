//! Dependency caches (pip's, npm's) kept per owner on each worker host: how an
//! owner's cache is named, and how a clear request is recorded. The worker
//! keeps the caches (`worker::cache`); the ctl asks for clears
//! (`Keys::cache_clears`). docs/sandbox.md describes the design.

use sha2::{Digest, Sha256};

/// The field of `Keys::cache_clears` that clears every owner's cache.
pub const ALL_OWNERS: &str = "*";

/// The cache name of the admin key's tasks (which have no owner).
const ADMIN: &str = "(admin)";

/// An owner's cache name: the SHA-256 (hex) of the owner, so any owner
/// (`oauth:<sub>`, an API key's name, the admin) is a safe directory name and a
/// field the ctl can compute from the name alone. `None` is the admin key.
pub fn owner_id(owner: Option<&str>) -> String {
    let owner = owner.unwrap_or(ADMIN);
    Sha256::digest(owner.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Why a name cannot be an owner's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is no owner: an owner is an API key's name ([a-z0-9][a-z0-9._-]{{0,62}}) \
     or oauth:<subject> (the token's `sub`, not empty, no control characters)"
)]
pub struct BadOwner(pub String);

/// Checks that `owner` can be the owner of a task: an API key's name
/// (`apikey::check_name`) or `oauth:<subject>`. A name of neither shape owns
/// nothing, so a clear for it would clear nothing.
pub fn check_owner(owner: &str) -> Result<(), BadOwner> {
    let ok = match owner.strip_prefix("oauth:") {
        Some(sub) => !sub.is_empty() && !sub.chars().any(char::is_control),
        None => crate::apikey::check_name(owner).is_ok(),
    };
    if ok {
        Ok(())
    } else {
        Err(BadOwner(owner.to_owned()))
    }
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
    fn owners_are_key_names_or_oauth_subjects() {
        for good in ["alice", "ci-bot.2", "oauth:x", "oauth:auth0|abc/def"] {
            assert_eq!(check_owner(good), Ok(()), "{good}");
        }
        for bad in ["", "Alice", "-x", "oauth:", "oauth:a\nb", "alice:x", "a b"] {
            assert_eq!(check_owner(bad), Err(BadOwner(bad.to_owned())), "{bad}");
        }
    }

    #[test]
    fn owners_get_distinct_hex_names_and_the_admin_one_of_its_own() {
        let a = owner_id(Some("alice"));
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, owner_id(Some("bob")));
        assert_ne!(owner_id(None), a);
        assert_eq!(owner_id(Some("oauth:x/../y")).len(), 64);
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
