//! `script-runner-ctl cache clear`: asks every worker to empty an owner's
//! dependency caches (or every owner's). The caches live on the worker hosts,
//! which the ctl cannot reach; it counts up the owner's clear generation in
//! Redis (`Keys::cache_clears`, one `HINCRBY`), and each worker empties a cache
//! whose generation changed before it lends it to the next task.

use redis::AsyncCommands;
use shared::cache::{ALL_OWNERS, owner_id};

use crate::{Config, CtlError};

/// Whose caches to clear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Whose {
    /// One owner: an API key's name or `oauth:<subject>`.
    Owner(String),
    /// The admin key's tasks.
    Admin,
    /// Every owner's.
    All,
}

/// Records the clear; the new generation.
pub async fn clear(config: &Config, whose: &Whose) -> Result<u64, CtlError> {
    let pool = config.pool(1).await?;
    let mut conn = pool.get().await?;
    let field = match whose {
        Whose::Owner(name) => owner_id(Some(name)),
        Whose::Admin => owner_id(None),
        Whose::All => ALL_OWNERS.to_owned(),
    };
    Ok(conn.hincr(config.keys.cache_clears(), field, 1).await?)
}
