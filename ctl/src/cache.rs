//! `script-runner-ctl cache clear`: asks every worker to empty an owner's
//! dependency caches (or every owner's). The caches live on the worker hosts,
//! which the ctl cannot reach; it counts up the owner's clear generation in
//! Redis (`Keys::cache_clears`, one `HINCRBY`), and each worker empties a cache
//! whose generation changed before it lends it to the next task.

use redis::AsyncCommands;
use shared::Owner;
use shared::cache::{ALL_OWNERS, owner_id};
use shared::owner::BadOwner;

use crate::{Config, CtlError};

/// Whose caches to clear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Whose {
    /// One owner: an API key or an OAuth subject.
    Owner(Owner),
    /// The admin key's tasks.
    Admin,
    /// Every owner's.
    All,
}

impl Whose {
    /// One owner, if `name` can own tasks (a key's name or `oauth:<subject>`):
    /// any other name would clear nothing, silently.
    pub fn owner(name: &str) -> Result<Whose, BadOwner> {
        Ok(Whose::Owner(Owner::parse(name)?))
    }
}

/// What a clear did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cleared {
    /// The owner's (or every owner's) new clear generation.
    pub generation: u64,
    /// For one owner: whether any task of theirs finished here with its usage
    /// recorded. False is likely a typo, or an owner with no such task yet:
    /// the clear is recorded either way. `None` for `--admin` and `--all`.
    pub known: Option<bool>,
}

/// Records the clear.
pub async fn clear(config: &Config, whose: &Whose) -> Result<Cleared, CtlError> {
    let pool = config.pool(1).await?;
    let mut conn = pool.get().await?;
    let (field, known) = match whose {
        Whose::Owner(owner) => {
            let name = owner.as_stored();
            let score: Option<f64> = conn.zscore(config.keys.usage_owners(), &*name).await?;
            (owner_id(owner), Some(score.is_some()))
        }
        Whose::Admin => (owner_id(&Owner::Admin), None),
        Whose::All => (ALL_OWNERS.to_owned(), None),
    };
    let generation = conn.hincr(config.keys.cache_clears(), field, 1).await?;
    Ok(Cleared { generation, known })
}
