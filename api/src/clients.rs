//! Telling clients apart, and each client's share of the api's limits.
//!
//! The caps in `crate::http` (connections, bodies in flight) bound the api as a
//! whole; without shares, one client that floods it could hold all of them and
//! lock every other client out. So each client also gets a share:
//!
//! - `MAX_CONNECTIONS_PER_CLIENT` open connections per peer address, checked at
//!   accept. A trusted proxy's connections are not counted: they carry many
//!   clients' requests, and the global `MAX_CONNECTIONS` still bounds them.
//! - `MAX_REQUESTS_PER_CLIENT` requests in flight per client (every route but
//!   `/healthz`), which is what bounds a client behind a proxy.
//! - `MAX_BODY_BYTES_PER_CLIENT` of request bodies held at once per client.
//!
//! Past a share the client gets 429 with `Retry-After`; other clients are served.
//!
//! A client is its IP address (IPv6: its /64, which one host usually holds
//! whole). When the connection comes from a proxy listed in `TRUSTED_PROXIES`,
//! the client is the last address in `X-Forwarded-For`: the one that proxy
//! appended. Earlier entries were written by whoever sent the request and are
//! never believed. A client's address is only ever a key to a counter here.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use axum::http::HeaderMap;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::throttle::{self, Throttle};

/// A `TRUSTED_PROXIES` entry that is neither an address nor a network.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not an IP address or a network such as 10.0.0.0/8 \
     (a prefix length is at most 32, or 128 for IPv6)"
)]
pub struct BadProxy(pub String);

/// One `TRUSTED_PROXIES` entry: a network in CIDR notation (`10.0.0.0/8`,
/// `fd00::/8`) or one address.
pub fn parse_proxy(s: &str) -> Result<IpNet, BadProxy> {
    let net = s
        .parse::<IpNet>()
        .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| BadProxy(s.to_owned()))?;
    // Peers are matched by their IPv4 address when they have one (see
    // `canonical`), so an IPv4 network written as IPv6 is that IPv4 network.
    Ok(match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => v6
            .addr()
            .to_ipv4_mapped()
            .and_then(|v4| Ipv4Net::new(v4, v6.prefix_len() - 96).ok())
            .map_or(net, IpNet::V4),
        net => net,
    })
}

/// An IPv4 address written as IPv6 (`::ffff:a.b.c.d`, as a dual-stack listener
/// sees IPv4 peers) is the IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// Who a request or connection is counted against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientKey(IpAddr);

impl ClientKey {
    /// The key of a client at `ip`: the address, or an IPv6 address's /64.
    pub fn of(ip: IpAddr) -> ClientKey {
        match canonical(ip) {
            IpAddr::V6(v6) => {
                let net = Ipv6Net::new(v6, 64).map_or(v6, |n| n.network());
                ClientKey(IpAddr::V6(net))
            }
            v4 => ClientKey(v4),
        }
    }
}

impl fmt::Display for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V6(net) => write!(f, "{net}/64"),
            v4 => write!(f, "{v4}"),
        }
    }
}

/// The proxies whose `X-Forwarded-For` is believed (`TRUSTED_PROXIES`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    pub fn new(nets: Vec<IpNet>) -> TrustedProxies {
        TrustedProxies(nets)
    }

    pub fn trusts(&self, peer: IpAddr) -> bool {
        let peer = canonical(peer);
        self.0.iter().any(|net| net.contains(&peer))
    }

    /// The client a request from `peer` is counted against: the last
    /// `X-Forwarded-For` address when `peer` is a trusted proxy that set one,
    /// else `peer` itself.
    pub fn client_of(&self, peer: IpAddr, headers: &HeaderMap) -> ClientKey {
        if !self.trusts(peer) {
            return ClientKey::of(peer);
        }
        // Several X-Forwarded-For lines make one list, in order (RFC 9110 5.3).
        let last_hop = headers
            .get_all("x-forwarded-for")
            .iter()
            .next_back()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.rsplit(',').next())
            .and_then(|hop| forwarded_ip(hop.trim()));
        ClientKey::of(last_hop.unwrap_or(peer))
    }
}

/// An address as proxies write it in `X-Forwarded-For`: bare, or IPv6 in
/// brackets, either with a port; an IPv6 zone (`%eth0`) is dropped.
fn forwarded_ip(hop: &str) -> Option<IpAddr> {
    let unzoned;
    let hop = match hop.split_once('%') {
        Some((addr, rest)) => {
            // The zone runs to the closing bracket, if any: "[fe80::1%eth0]:80".
            unzoned = format!("{addr}{}", rest.find(']').map_or("", |i| &rest[i..]));
            unzoned.as_str()
        }
        None => hop,
    };
    if let Ok(ip) = hop.parse() {
        return Some(ip);
    }
    if let Ok(sock) = hop.parse::<std::net::SocketAddr>() {
        return Some(sock.ip());
    }
    hop.strip_prefix('[')?.strip_suffix(']')?.parse().ok()
}

/// How much of one limit each client holds. A client appears only while it
/// holds something, so the table is never larger than what the global caps
/// already bound.
pub struct Tally<K> {
    max: usize,
    held: Mutex<HashMap<K, usize>>,
}

impl<K: Eq + Hash + Copy> Tally<K> {
    pub fn new(max: usize) -> Arc<Tally<K>> {
        Arc::new(Tally {
            max,
            held: Mutex::new(HashMap::new()),
        })
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// Takes `n` for `key` if that keeps it within the share; the share is
    /// given back when the returned `Share` drops.
    pub fn take(self: &Arc<Self>, key: K, n: usize) -> Option<Share<K>> {
        let mut share = Share {
            tally: self.clone(),
            key,
            n: 0,
        };
        share.grow(n).then_some(share)
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<K, usize>> {
        // Nothing can panic while the lock is held; if it ever did, the counts
        // are still whole numbers worth going on with.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What `key` holds now (for tests and logs).
    pub fn held(&self, key: &K) -> usize {
        self.table().get(key).copied().unwrap_or(0)
    }
}

/// Part of a client's share, given back on drop.
pub struct Share<K: Eq + Hash + Copy> {
    tally: Arc<Tally<K>>,
    key: K,
    n: usize,
}

impl<K: Eq + Hash + Copy> Share<K> {
    /// Takes `more` on top, if that keeps the client within its share.
    pub fn grow(&mut self, more: usize) -> bool {
        if more == 0 {
            return true;
        }
        let mut table = self.tally.table();
        let held = table.get(&self.key).copied().unwrap_or(0);
        if held + more > self.tally.max {
            return false;
        }
        table.insert(self.key, held + more);
        self.n += more;
        true
    }
}

impl<K: Eq + Hash + Copy> Drop for Share<K> {
    fn drop(&mut self) {
        if self.n == 0 {
            return;
        }
        let mut table = self.tally.table();
        if let Some(held) = table.get_mut(&self.key) {
            *held = held.saturating_sub(self.n);
            if *held == 0 {
                table.remove(&self.key);
            }
        }
    }
}

/// The per-client limits, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Connections,
    Requests,
    BodyBytes,
}

impl Limit {
    /// The variable that sets it.
    pub fn var(self) -> &'static str {
        match self {
            Limit::Connections => "MAX_CONNECTIONS_PER_CLIENT",
            Limit::Requests => "MAX_REQUESTS_PER_CLIENT",
            Limit::BodyBytes => "MAX_BODY_BYTES_PER_CLIENT",
        }
    }
}

/// Logs refusals past one limit: the first at once, then at most one line per
/// `throttle::EVERY`, which counts the refusals since the last line.
pub struct RefusalLog {
    limit: Limit,
    throttle: Throttle,
}

impl RefusalLog {
    pub fn new(limit: Limit) -> RefusalLog {
        RefusalLog {
            limit,
            throttle: Throttle::new(),
        }
    }

    /// Counts a refusal of `client`; returns whether a line was written.
    pub fn refused(&self, client: ClientKey, max: usize) -> bool {
        let Some(refused) = self.throttle.tick() else {
            return false;
        };
        tracing::warn!(
            %client,
            limit = self.limit.var(),
            max,
            refused,
            "a client is past its share: answered 429 (this is the first refusal in {} s, \
             `refused` counts it and those not logged since the last such line)",
            throttle::EVERY.as_secs()
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn networks_parse_and_contain_what_they_should() {
        let trusted = |net: &str| TrustedProxies::new(vec![parse_proxy(net).expect(net)]);
        let net = trusted("10.1.0.0/16");
        assert!(net.trusts(ip("10.1.255.3")));
        assert!(!net.trusts(ip("10.2.0.1")));
        assert!(net.trusts(ip("::ffff:10.1.0.9")));
        let one = trusted("127.0.0.1");
        assert!(one.trusts(ip("127.0.0.1")) && !one.trusts(ip("127.0.0.2")));
        let mapped = trusted("::ffff:10.1.0.0/112");
        assert!(mapped.trusts(ip("10.1.2.3")) && !mapped.trusts(ip("10.2.0.1")));
        let all = trusted("0.0.0.0/0");
        assert!(all.trusts(ip("8.8.8.8")) && !all.trusts(ip("::1")));
        let v6 = trusted("fd00::/8");
        assert!(v6.trusts(ip("fd12::1")) && !v6.trusts(ip("fe80::1")));
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "proxy",
            "10.0.0/8",
            "10.0.0.0/x",
            "",
        ] {
            let e = parse_proxy(bad).err().map(|e| e.to_string());
            let e = e.unwrap_or_default();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }

    #[test]
    fn a_client_is_its_address_or_its_ipv6_slash_64() {
        assert_eq!(
            ClientKey::of(ip("::ffff:1.2.3.4")),
            ClientKey::of(ip("1.2.3.4"))
        );
        assert_eq!(
            ClientKey::of(ip("2001:db8:1:2:aaaa::1")),
            ClientKey::of(ip("2001:db8:1:2:bbbb::2"))
        );
        assert_ne!(
            ClientKey::of(ip("2001:db8:1:2::1")),
            ClientKey::of(ip("2001:db8:1:3::1"))
        );
        assert_eq!(
            ClientKey::of(ip("2001:db8:1:2::1")).to_string(),
            "2001:db8:1:2::/64"
        );
    }

    #[test]
    fn only_a_trusted_proxy_s_last_hop_is_believed() {
        let proxies = TrustedProxies::new(vec!["172.16.0.0/12".parse().expect("net")]);
        let headers = |values: &[&str]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append("x-forwarded-for", v.parse().expect("header value"));
            }
            h
        };
        let key = |s: &str| ClientKey::of(ip(s));
        let proxy = ip("172.18.0.5");
        // The client may write anything before what the proxy appends.
        let cases: [(&[&str], &str); 8] = [
            (&["6.6.6.6, 203.0.113.7"], "203.0.113.7"),
            (&["6.6.6.6", "203.0.113.7"], "203.0.113.7"),
            (&["[2001:db8::1]:4711"], "2001:db8::1"),
            (&["203.0.113.7:4711"], "203.0.113.7"),
            (&["fe80::1%eth0"], "fe80::1"),
            (&["[fe80::2%2]:80"], "fe80::2"),
            // No usable hop: the proxy itself.
            (&[], "172.18.0.5"),
            (&["unknown"], "172.18.0.5"),
        ];
        for (hops, client) in cases {
            assert_eq!(
                proxies.client_of(proxy, &headers(hops)),
                key(client),
                "{hops:?}"
            );
        }
        // Anyone else's X-Forwarded-For is ignored.
        let direct = ip("198.51.100.1");
        let spoofed = headers(&["6.6.6.6, 203.0.113.7"]);
        assert_eq!(proxies.client_of(direct, &spoofed), key("198.51.100.1"));
    }

    #[test]
    fn refusals_are_logged_once_then_at_most_every_ten_seconds() {
        let log = RefusalLog::new(Limit::Requests);
        let client = ClientKey::of(ip("10.0.0.1"));
        assert!(log.refused(client, 4), "the first is logged at once");
        assert!(!log.refused(client, 4) && !log.refused(client, 4));
        assert_eq!(log.throttle.unlogged(), 2);
    }

    #[test]
    fn shares_hold_up_to_the_max_and_are_given_back_on_drop() {
        let tally = Tally::new(3);
        let a = ClientKey::of(ip("10.0.0.1"));
        let b = ClientKey::of(ip("10.0.0.2"));
        let first = tally.take(a, 2).expect("within the share");
        assert!(tally.take(a, 2).is_none(), "past a's share");
        let mut second = tally.take(a, 1).expect("the last one");
        assert!(!second.grow(1));
        assert_eq!(tally.held(&a), 3);
        let other = tally.take(b, 3).expect("b has its own share");
        drop(first);
        assert!(second.grow(2));
        drop(second);
        drop(other);
        assert!(
            tally.table().is_empty(),
            "nothing left once all is given back"
        );
        assert!(tally.take(a, 4).is_none());
        let nothing = tally.take(a, 0).expect("taking nothing always fits");
        assert!(
            tally.table().is_empty(),
            "a refusal or an empty share leaves no entry"
        );
        drop(nothing);
    }
}
