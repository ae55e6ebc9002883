//! What tasks may not reach besides `BLOCKED`, and how it is kept current.
//!
//! The host's subnets and `TASK_BLOCKED_CIDRS` are read once at start. The
//! Redis hosts are read again on every heartbeat ([`Refusals::refresh`]): with
//! sentinels, a replica or sentinel added later (or a node given a new
//! address) would otherwise stay reachable by tasks until the worker restarts.
//! Addresses are only ever added: a node that leaves stays refused until the
//! worker restarts, which costs nothing but a rule, whereas forgetting one too
//! early (a sentinel that briefly lists fewer replicas) would open it.
//!
//! The firewall's rules and the egress proxy (which connects from the host,
//! where the rules do not apply) both watch the same value.

use std::net::Ipv4Addr;
use std::sync::Arc;

use ipnet::Ipv4Net;
use store::redis_pool::RedisTarget;
use tokio::sync::watch;

use super::FirewallError;
use super::host;
use super::rules::{BLOCKED, Destination};

/// One reading of what is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    subnets: Vec<Ipv4Net>,
    /// Every Redis host address seen since start, sorted.
    redis: Vec<Ipv4Net>,
    /// `TASK_BLOCKED_CIDRS` as written.
    blocked_cidrs: Vec<Destination>,
}

impl Refused {
    pub fn subnets(&self) -> &[Ipv4Net] {
        &self.subnets
    }

    /// The destinations the task chains refuse besides `BLOCKED` and the
    /// subnets: the Redis hosts, then `TASK_BLOCKED_CIDRS`.
    pub fn extra(&self) -> Vec<Destination> {
        let redis = self.redis.iter().copied().map(Destination::Net);
        redis.chain(self.blocked_cidrs.iter().cloned()).collect()
    }

    /// Everything refused, `BLOCKED` included, as IPv4 networks (an entry of
    /// `TASK_BLOCKED_CIDRS` that is not one is skipped: the firewall refuses
    /// to start with it, see `Destination::Verbatim`).
    pub fn networks(&self) -> Vec<Ipv4Net> {
        self.all().collect()
    }

    /// Whether `ip` is in any refused network (what `networks` lists, unallocated:
    /// the egress proxy asks for every address it connects to).
    pub fn refuses(&self, ip: Ipv4Addr) -> bool {
        self.all().any(|n| n.contains(&ip))
    }

    fn all(&self) -> impl Iterator<Item = Ipv4Net> + '_ {
        let cidrs = self.blocked_cidrs.iter().filter_map(|d| match d {
            Destination::Net(net) => Some(*net),
            Destination::Verbatim(_) => None,
        });
        BLOCKED
            .iter()
            .chain(&self.subnets)
            .chain(&self.redis)
            .copied()
            .chain(cidrs)
    }

    /// This reading with `found` added to the Redis hosts; the addresses that
    /// were new, if any.
    fn with_redis(&self, found: &[Ipv4Net]) -> Option<(Refused, Vec<Ipv4Net>)> {
        let added: Vec<Ipv4Net> = found
            .iter()
            .filter(|n| !self.redis.contains(n))
            .copied()
            .collect();
        if added.is_empty() {
            return None;
        }
        let mut next = self.clone();
        next.redis.extend(&added);
        next.redis.sort();
        next.redis.dedup();
        Some((next, added))
    }
}

/// The current [`Refused`], shared by the firewall and the egress proxy, and
/// the Redis it follows. Clones share it.
#[derive(Clone)]
pub struct Refusals {
    now: Arc<watch::Sender<Arc<Refused>>>,
    redis: Option<RedisTarget>,
}

impl std::fmt::Debug for Refusals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refusals")
            .field("now", &self.now.borrow())
            .field("follows_redis", &self.redis.is_some())
            .finish()
    }
}

impl Refusals {
    /// Reads the host's subnets and the Redis hosts (with sentinels, theirs and
    /// every node's they know). An error if the Redis hosts cannot be listed:
    /// a worker must not start with them reachable.
    pub async fn read(
        blocked_cidrs: &[String],
        redis: &RedisTarget,
    ) -> Result<Refusals, FirewallError> {
        let refused = Refused {
            subnets: host::host_subnets().await?,
            redis: host::redis_addresses(redis, true).await?,
            blocked_cidrs: blocked_cidrs
                .iter()
                .map(|e| Destination::parse(e))
                .collect(),
        };
        for d in &refused.blocked_cidrs {
            if let Destination::Verbatim(n) = d {
                tracing::warn!(network = %n, "not an IPv4 network; the egress proxy skips it");
            }
        }
        Ok(Refusals {
            now: Arc::new(watch::channel(Arc::new(refused)).0),
            redis: Some(redis.clone()),
        })
    }

    /// A fixed reading refusing `networks` besides `BLOCKED`, that never
    /// changes: for tests of the egress proxy.
    pub fn fixed(networks: &[Ipv4Net]) -> Refusals {
        let refused = Refused {
            subnets: networks.to_vec(),
            redis: Vec::new(),
            blocked_cidrs: Vec::new(),
        };
        Refusals {
            now: Arc::new(watch::channel(Arc::new(refused)).0),
            redis: None,
        }
    }

    /// The reading now.
    pub fn now(&self) -> Arc<Refused> {
        self.now.borrow().clone()
    }

    /// A receiver that sees each change.
    pub fn watch(&self) -> watch::Receiver<Arc<Refused>> {
        self.now.subscribe()
    }

    /// Lists the Redis hosts again and adds any address not refused yet; the
    /// addresses added. An error (no sentinel answered, a name that does not
    /// resolve) changes nothing: what was refused stays refused.
    pub async fn refresh(&self) -> Result<Vec<Ipv4Net>, FirewallError> {
        let Some(redis) = &self.redis else {
            return Ok(Vec::new());
        };
        let found = host::redis_addresses(redis, false).await?;
        let mut added = Vec::new();
        self.now
            .send_if_modified(|now| match now.with_redis(&found) {
                Some((next, new)) => {
                    *now = Arc::new(next);
                    added = new;
                    true
                }
                None => false,
            });
        Ok(added)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().expect("a network")
    }

    fn reading() -> Refused {
        Refused {
            subnets: vec![net("192.0.2.0/24")],
            redis: vec![net("203.0.113.7/32")],
            blocked_cidrs: ["198.51.100.9/24", "example.com"]
                .map(Destination::parse)
                .to_vec(),
        }
    }

    #[test]
    fn the_egress_proxy_refuses_every_network_the_rules_do_but_a_verbatim_entry() {
        let refused = reading();
        let networks = refused.networks();
        assert_eq!(networks[..BLOCKED.len()], BLOCKED);
        assert_eq!(
            networks[BLOCKED.len()..],
            [
                net("192.0.2.0/24"),
                net("203.0.113.7/32"),
                net("198.51.100.9/24")
            ]
        );
        for ip in ["192.0.2.1", "203.0.113.7", "198.51.100.200", "10.0.0.1"] {
            assert!(refused.refuses(ip.parse().expect("ip")), "{ip}");
        }
        assert!(!refused.refuses("8.8.8.8".parse().expect("ip")));
    }

    #[test]
    fn a_redis_host_seen_later_is_added_and_none_is_ever_dropped() {
        let refused = reading();
        // The same hosts, or fewer (a sentinel that lists fewer replicas for
        // a moment): nothing changes.
        assert_eq!(refused.with_redis(&[net("203.0.113.7/32")]), None);
        assert_eq!(refused.with_redis(&[]), None);
        // A public address: a central Redis's replica on another host.
        let public = "8.8.4.4".parse().expect("ip");
        assert!(!refused.refuses(public));
        let (next, added) = refused
            .with_redis(&[net("203.0.113.7/32"), net("8.8.4.4/32")])
            .expect("a new host");
        assert_eq!(added, [net("8.8.4.4/32")]);
        assert_eq!(next.redis, [net("8.8.4.4/32"), net("203.0.113.7/32")]);
        assert_eq!(
            next.extra()[..2],
            [
                Destination::Net(net("8.8.4.4/32")),
                Destination::Net(net("203.0.113.7/32"))
            ]
        );
        assert!(next.refuses(public));
        assert!(next.networks().contains(&net("8.8.4.4/32")));
    }
}
