//! Reads of the per-owner usage totals that FINISH keeps (`Keys::usage_owners`,
//! `Keys::owner_usage`, `Keys::usage_totals`), for the api's `/metrics` and
//! `script-runner-ctl usage`. Bounded: the heaviest `limit` owners by CPU, one
//! `ZREVRANGE` and one `HGETALL` each, in one round trip after the first.

use std::collections::HashMap;

use redis::RedisResult;
use redis::aio::ConnectionLike;
use shared::Keys;
use shared::usage::OwnerTotals;

/// The heaviest owners' totals and what every owner used in all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageTotals {
    /// The heaviest owners by CPU, heaviest first.
    pub owners: Vec<(String, OwnerTotals)>,
    /// How many owners have usage at all.
    pub owner_count: u64,
    /// Over every owner (tasks of the admin key, which have no owner, aside).
    pub all: OwnerTotals,
}

impl UsageTotals {
    /// What the owners past the listed ones used (their peak: the highest of
    /// all, since a maximum cannot be subtracted).
    pub fn rest(&self) -> OwnerTotals {
        let listed = self
            .owners
            .iter()
            .fold(OwnerTotals::default(), |sum, (_, t)| sum.plus(t));
        self.all.less(&listed)
    }
}

/// The `limit` heaviest owners by total CPU, their totals, and the totals over
/// every owner.
pub async fn top_owners(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    limit: usize,
) -> RedisResult<UsageTotals> {
    let (owners, owner_count, all): (Vec<String>, u64, HashMap<String, String>) = redis::pipe()
        .cmd("ZREVRANGE")
        .arg(keys.usage_owners())
        .arg(0)
        .arg(limit.max(1) as i64 - 1)
        .cmd("ZCARD")
        .arg(keys.usage_owners())
        .cmd("HGETALL")
        .arg(keys.usage_totals())
        .query_async(conn)
        .await?;
    let owners = if limit == 0 || owners.is_empty() {
        Vec::new()
    } else {
        let mut pipe = redis::pipe();
        for o in &owners {
            pipe.cmd("HGETALL").arg(keys.owner_usage(o));
        }
        let hashes: Vec<HashMap<String, String>> = pipe.query_async(conn).await?;
        owners
            .into_iter()
            .zip(hashes.iter().map(OwnerTotals::from_hash))
            .take(limit)
            .collect()
    };
    Ok(UsageTotals {
        owners,
        owner_count,
        all: OwnerTotals::from_hash(&all),
    })
}
