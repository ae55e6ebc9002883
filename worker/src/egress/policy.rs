//! What the egress proxy lets through: the ports it opens, the addresses it
//! never connects to, and name resolution (its own, so a task's allowed name
//! cannot be pointed at this host or a private network: DNS rebinding).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::IpNet;
use shared::egress::{AllowList, Verdict, fold_host};

use crate::firewall::Refusals;

/// How long resolving one name may take.
const LOOKUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The proxy's rules besides each task's list.
#[derive(Debug, Clone)]
pub struct Policy {
    /// `EGRESS_PORTS`: the only ports a task may ask for.
    pub ports: Vec<u16>,
    /// Never connected to: the task firewall's refusals (special-purpose
    /// ranges, this host's networks, the Redis hosts as they are seen,
    /// `TASK_BLOCKED_CIDRS`).
    pub blocked: Refusals,
    /// Where names come from: DNS, in every binary.
    pub resolver: Resolver,
}

/// Where the proxy's answers for names come from. `Dns` in every binary:
/// `Fixed` is for tests that stand a local server in for public hosts, and
/// only Rust code sets it (`Config::egress`, after `from_lookup`); no variable
/// reaches it, so a deployed worker can never be told to take a private
/// address for a public one.
#[derive(Debug, Clone, Default)]
pub enum Resolver {
    #[default]
    Dns,
    Fixed(FixedHosts),
}

/// A test's stand-ins for public hosts (`Resolver::Fixed`).
#[derive(Debug, Clone, Default)]
pub struct FixedHosts {
    /// Names answered without DNS; any other name goes to DNS.
    answers: HashMap<String, Vec<IpAddr>>,
    /// Addresses taken as public although `blocked` holds them.
    public: Vec<IpNet>,
}

impl FixedHosts {
    /// `name` answered with `ips` (the name folded as the proxy folds hosts).
    pub fn answer(mut self, name: &str, ips: &[IpAddr]) -> FixedHosts {
        self.answers
            .entry(fold_host(name))
            .or_default()
            .extend_from_slice(ips);
        self
    }

    /// `net` taken as public.
    pub fn public(mut self, net: IpNet) -> FixedHosts {
        self.public.push(net);
        self
    }
}

impl Policy {
    /// Decides one attempt at `host:port` for a task with `allow`: the
    /// addresses to connect to, every one of them checked, or why not.
    pub async fn decide(
        &self,
        allow: &AllowList,
        host: &str,
        port: u16,
    ) -> Result<Vec<SocketAddr>, Verdict> {
        let host = fold_host(host);
        if host.parse::<IpAddr>().is_ok() || host.starts_with('[') {
            // Lists hold names only: an address is never on one.
            return Err(Verdict::NotAllowed);
        }
        if !allow.allows(&host) {
            return Err(Verdict::NotAllowed);
        }
        if !self.ports.contains(&port) {
            return Err(Verdict::Port);
        }
        let fixed = match &self.resolver {
            Resolver::Fixed(f) => f.answers.get(&host),
            Resolver::Dns => None,
        };
        let addrs: Vec<SocketAddr> = match fixed {
            Some(ips) => ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect(),
            // Fully qualified (the final dot), so no search domain of the
            // host's resolv.conf turns an allowed name into an internal one;
            // bounded, so a slow name server cannot hold the proxy.
            None => {
                let lookup = tokio::net::lookup_host((format!("{host}."), port));
                match tokio::time::timeout(LOOKUP_TIMEOUT, lookup).await {
                    Ok(Ok(a)) => a.collect(),
                    _ => return Err(Verdict::Unresolved),
                }
            }
        };
        // Any private answer refuses the name: a name that points inside once
        // may do so on the next lookup too.
        if addrs.iter().any(|a| !self.is_public(a.ip())) {
            return Err(Verdict::PrivateAddress);
        }
        // IPv4 only, as for `internet` tasks: the refused set (the host's own
        // networks, the Redis host, TASK_BLOCKED_CIDRS) is IPv4, and the host's
        // IPv6 networks are not in it.
        let v4: Vec<SocketAddr> = addrs.into_iter().filter(SocketAddr::is_ipv4).collect();
        if v4.is_empty() {
            return Err(Verdict::Unresolved);
        }
        Ok(v4)
    }

    /// Whether the proxy may connect to `ip`.
    pub fn is_public(&self, ip: IpAddr) -> bool {
        if let Resolver::Fixed(f) = &self.resolver
            && f.public.iter().any(|n| n.contains(&ip))
        {
            return true;
        }
        match ip {
            IpAddr::V4(v4) => self.is_public_v4(v4),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => self.is_public_v4(v4),
                None => is_global_v6(v6),
            },
        }
    }

    fn is_public_v4(&self, ip: Ipv4Addr) -> bool {
        !self.blocked.now().refuses(ip)
    }
}

/// IPv6 that is globally reachable, by IANA's special-purpose registry's
/// larger entries: not loopback, unspecified, unique local, link-local,
/// multicast, documentation, NAT64 (which reaches IPv4 behind it), 6to4 or
/// Teredo (likewise), or discard-only.
fn is_global_v6(ip: Ipv6Addr) -> bool {
    const NOT_GLOBAL: [(&str, u8); 11] = [
        ("::", 128),
        ("::1", 128),
        ("fc00::", 7),
        ("fe80::", 10),
        ("ff00::", 8),
        ("2001:db8::", 32),
        ("64:ff9b::", 96),
        ("2002::", 16),
        ("2001::", 32),
        // IPv4-compatible (deprecated), and NAT64 for local use (RFC 8215).
        ("::", 96),
        ("64:ff9b:1::", 48),
    ];
    let blocked = NOT_GLOBAL.iter().any(|(net, len)| {
        net.parse::<Ipv6Addr>()
            .ok()
            .and_then(|a| ipnet::Ipv6Net::new(a, *len).ok())
            .is_some_and(|n| n.contains(&ip))
    });
    !blocked && !ip.segments().starts_with(&[0x0100, 0, 0, 0])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn policy() -> Policy {
        Policy {
            ports: vec![80, 443],
            blocked: Refusals::fixed(&[]),
            resolver: Resolver::Fixed(
                FixedHosts::default()
                    .answer("pkgs.test", &[ip("127.0.0.1")])
                    .answer("rebind.test", &[ip("10.1.2.3")])
                    .answer("mixed.test", &[ip("127.0.0.1"), ip("192.168.1.1")])
                    .answer("six.test", &[ip("2a04:4e42::223")])
                    .public("127.0.0.1/32".parse().unwrap()),
            ),
        }
    }

    #[tokio::test]
    async fn each_refusal_has_its_reason() {
        let p = policy();
        let l =
            AllowList::parse(&["pkgs.test", "rebind.test", "mixed.test", "nx.invalid"]).unwrap();
        assert!(p.decide(&l, "PKGS.test.", 443).await.is_ok());
        assert_eq!(
            p.decide(&l, "other.test", 443).await,
            Err(Verdict::NotAllowed)
        );
        assert_eq!(
            p.decide(&l, "127.0.0.1", 443).await,
            Err(Verdict::NotAllowed)
        );
        assert_eq!(p.decide(&l, "pkgs.test", 22).await, Err(Verdict::Port));
        assert_eq!(
            p.decide(&l, "rebind.test", 443).await,
            Err(Verdict::PrivateAddress)
        );
        assert_eq!(
            p.decide(&l, "mixed.test", 80).await,
            Err(Verdict::PrivateAddress)
        );
        assert_eq!(
            p.decide(&l, "nx.invalid", 80).await,
            Err(Verdict::Unresolved)
        );
    }

    #[test]
    fn special_addresses_are_not_public() {
        let p = Policy {
            resolver: Resolver::Dns,
            ..policy()
        };
        for ip in [
            "127.0.0.1",
            "10.0.0.1",
            "169.254.169.254",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
        ] {
            assert!(!p.is_public(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["151.101.0.223", "2a04:4e42::223"] {
            assert!(p.is_public(ip.parse().unwrap()), "{ip}");
        }
    }
}
