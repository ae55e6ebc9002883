//! Who a task is for: the admin token, an API key, or an OAuth subject. Parsed
//! once, here, from the one string Redis holds (a task record's `owner` field,
//! the owner's keys `Keys::owner_*`, the scripts' owner argument): the key's
//! name, or `oauth:<subject>`. A key's name never holds a `:`
//! (`apikey::check_name`), so the two never meet. The admin's tasks have no
//! owner field, and the scripts take `""` for the admin.

use std::borrow::Cow;
use std::fmt;

/// How an OAuth subject's stored name starts.
pub const OAUTH_PREFIX: &str = "oauth:";

/// A task's owner; for the api, also who is calling.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Owner {
    /// `SCRIPT_RUNNER_TOKEN`: sees every task, has no quota.
    Admin,
    /// An API key, by its name.
    Key(String),
    /// An OAuth access token's `sub`.
    OAuth(String),
}

/// How the admin is shown (and the name its dependency cache is named from,
/// `cache::owner_id`, so it must not change).
pub const ADMIN_NAME: &str = "(admin)";

/// The admin, for code that needs a `&'static Owner`.
pub static ADMIN: Owner = Owner::Admin;

/// Why a name cannot be an owner's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is no owner: an owner is an API key's name ([a-z0-9][a-z0-9._-]{{0,62}}) \
     or oauth:<subject> (the token's `sub`, not empty, no control characters)"
)]
pub struct BadOwner(pub String);

impl Owner {
    /// The owner a stored name names (a record's `owner` field, an entry of
    /// `Keys::usage_owners`): what the api wrote, so not checked again.
    pub fn from_stored(name: &str) -> Owner {
        match name.strip_prefix(OAUTH_PREFIX) {
            Some(sub) => Owner::OAuth(sub.to_owned()),
            None if name.is_empty() => Owner::Admin,
            None => Owner::Key(name.to_owned()),
        }
    }

    /// An owner a person typed (the ctl's `--owner`): an API key's name
    /// (`apikey::check_name`) or `oauth:<subject>`. A name of neither shape
    /// owns nothing.
    pub fn parse(name: &str) -> Result<Owner, BadOwner> {
        let ok = match name.strip_prefix(OAUTH_PREFIX) {
            Some(sub) => !sub.is_empty() && !sub.chars().any(char::is_control),
            None => crate::apikey::check_name(name).is_ok(),
        };
        if ok {
            Ok(Owner::from_stored(name))
        } else {
            Err(BadOwner(name.to_owned()))
        }
    }

    /// The stored name: the key's name, `oauth:<subject>`, or `""` for the
    /// admin (which the scripts read as "no owner").
    pub fn as_stored(&self) -> Cow<'_, str> {
        match self {
            Owner::Admin => Cow::Borrowed(""),
            Owner::Key(name) => Cow::Borrowed(name),
            Owner::OAuth(sub) => Cow::Owned(format!("{OAUTH_PREFIX}{sub}")),
        }
    }

    pub fn is_admin(&self) -> bool {
        *self == Owner::Admin
    }
}

/// The stored name; the admin as `(admin)`.
impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owner::Admin => f.write_str(ADMIN_NAME),
            other => f.write_str(&other.as_stored()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_names_read_back_as_their_owner() {
        for owner in [
            Owner::Admin,
            Owner::Key("alice".into()),
            Owner::OAuth("x/../y".into()),
        ] {
            assert_eq!(Owner::from_stored(&owner.as_stored()), owner);
        }
        assert_eq!(Owner::OAuth("s".into()).as_stored(), "oauth:s");
        assert_eq!(Owner::Admin.to_string(), "(admin)");
    }

    #[test]
    fn owners_typed_are_key_names_or_oauth_subjects() {
        for good in ["alice", "ci-2", "oauth:auth0|12", "oauth:a b"] {
            assert!(Owner::parse(good).is_ok(), "{good}");
        }
        for bad in ["", "Alice", "a:b", "oauth:", "oauth:\n", "../x"] {
            assert_eq!(Owner::parse(bad), Err(BadOwner(bad.to_owned())), "{bad}");
        }
    }
}
