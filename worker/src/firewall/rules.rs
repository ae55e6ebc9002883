//! The rules themselves, without I/O: what one worker wants in its chains,
//! each line as `iptables-save` prints it, and what is wrong with a listing.
//!
//! Each tasks' bridge has its own two chains, `SR-IN-<bridge>` and
//! `SR-FWD-<bridge>`, so workers on one host with other networks, other Redis
//! hosts or other `TASK_BLOCKED_CIDRS` never rewrite each other's rules. Two
//! workers on one bridge share its chains: each keeps the other's rejections
//! (see `merged`), and the order of rejections does not matter to the check.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

/// `SR-IN-<bridge>`, jumped to from `INPUT` for the bridge.
pub const IN_PREFIX: &str = "SR-IN-";
/// `SR-FWD-<bridge>`, jumped to for the bridge first in `FORWARD` and first in
/// `DOCKER-USER`.
pub const FWD_PREFIX: &str = "SR-FWD-";
/// The chains every worker shared before each bridge got its own (up to
/// 2026-12-01): a worker removes its bridge's jumps into them at start.
pub const LEGACY_CHAINS: [(&str, &str); 2] =
    [("INPUT", "SR-TASKS-IN"), ("DOCKER-USER", "SR-TASKS-FWD")];

/// Docker's jump into `DOCKER-USER`, which it keeps first in `FORWARD`.
const DOCKER_USER_JUMP: &str = "-A FORWARD -j DOCKER-USER";

/// The one policy of `FORWARD` the worker runs under: Docker's (it sets it when
/// it turns forwarding on). Docker's rules for a bridge leave to the policy
/// what they do not accept, such as connections from the host's other networks
/// into the bridge: under `ACCEPT` those are forwarded.
pub const FORWARD_POLICY: &str = "DROP";

/// The policy of `FORWARD` in `listing` (`:FORWARD DROP [0:0]`), if it has one.
pub fn forward_policy(listing: &str) -> Option<&str> {
    listing.lines().find_map(|l| {
        let mut words = l.trim().strip_prefix(":FORWARD ")?.split_whitespace();
        words.next()
    })
}

/// setup-host.sh's allow-list for Redis's TLS port (`--allow-workers`),
/// jumped to first in `DOCKER-USER` for connections to that port.
pub const REDIS_TLS_CHAIN: &str = "SR-REDIS-TLS";

/// Always refused from a task, whatever the host's networks: every range of
/// IANA's IPv4 special-purpose address registry (RFC 6890) that is not globally
/// reachable, multicast, and the cloud metadata and host-agent addresses outside
/// those ranges. (`docs/sandbox.md` lists them with their reasons.)
pub const BLOCKED: [Ipv4Net; 16] = [
    // "This network" (RFC 791).
    net(0, 0, 0, 0, 8),
    // Private-use (RFC 1918).
    net(10, 0, 0, 0, 8),
    // Shared address space, carrier-grade NAT (RFC 6598); Alibaba Cloud's
    // metadata service is 100.100.100.200.
    net(100, 64, 0, 0, 10),
    // Loopback (RFC 1122).
    net(127, 0, 0, 0, 8),
    // Link-local (RFC 3927): the metadata service of AWS, GCP, Azure, OCI,
    // DigitalOcean, OpenStack (169.254.169.254), AWS ECS (169.254.170.2),
    // Tencent (169.254.0.23).
    net(169, 254, 0, 0, 16),
    // Private-use (RFC 1918).
    net(172, 16, 0, 0, 12),
    // IETF protocol assignments (RFC 6890): DS-Lite, NAT64 discovery, Oracle
    // Cloud's older metadata address 192.0.0.192. Two /32s in it are globally
    // reachable anycast (PCP 192.0.0.9, TURN 192.0.0.10): no task needs them.
    net(192, 0, 0, 0, 24),
    // Documentation, TEST-NET-1 (RFC 5737).
    net(192, 0, 2, 0, 24),
    // 6to4 relay anycast (RFC 3068, deprecated by RFC 7526).
    net(192, 88, 99, 0, 24),
    // Private-use (RFC 1918).
    net(192, 168, 0, 0, 16),
    // Benchmarking (RFC 2544).
    net(198, 18, 0, 0, 15),
    // Documentation, TEST-NET-2 (RFC 5737).
    net(198, 51, 100, 0, 24),
    // Documentation, TEST-NET-3 (RFC 5737).
    net(203, 0, 113, 0, 24),
    // Multicast (RFC 5771): not in the special-purpose registry, but nothing a
    // task does needs it, and local groups reach the host's LAN.
    net(224, 0, 0, 0, 4),
    // Reserved (RFC 1112), which holds the limited broadcast 255.255.255.255/32.
    net(240, 0, 0, 0, 4),
    // Azure's wireserver (host agent, and DNS on Azure hosts: the host's own DNS
    // servers stay reachable on port 53 through the exceptions before these).
    net(168, 63, 129, 16, 32),
];

/// `a.b.c.d/len`, checked when the constant is built.
const fn net(a: u8, b: u8, c: u8, d: u8, len: u8) -> Ipv4Net {
    Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), len)
}

/// One destination tasks may not reach, kept typed until `ruleset` writes it
/// as `iptables-save` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// An IPv4 network; a bare address is its `/32`.
    Net(Ipv4Net),
    /// A `TASK_BLOCKED_CIDRS` entry that is neither: the worker does not
    /// refuse that variable itself (docs/configuration.md), so the entry
    /// reaches `iptables-restore` as written, which refuses it or prints back
    /// another rule than the one written (a host name as its address); either
    /// way the firewall is not in place and the worker does not start.
    Verbatim(String),
}

impl Destination {
    /// A `TASK_BLOCKED_CIDRS` entry: `a.b.c.d/len`, or `a.b.c.d` for one address.
    pub fn parse(entry: &str) -> Destination {
        entry
            .parse::<Ipv4Net>()
            .or_else(|_| entry.parse::<Ipv4Addr>().map(Ipv4Net::from))
            .map_or_else(
                |_| Destination::Verbatim(entry.to_owned()),
                Destination::Net,
            )
    }
}

/// Every rule and jump one worker installs for its bridge, each line as
/// `iptables-save` prints it, so a listing compares line by line.
#[derive(Debug)]
pub struct Wanted {
    pub bridge: String,
    /// `SR-IN-<bridge>`.
    pub chain_in: String,
    /// `SR-FWD-<bridge>`.
    pub chain_fwd: String,
    /// The input chain's rules, in order.
    pub input: Vec<String>,
    /// The forward chain's rules, in order (its last is the final RETURN).
    pub forward: Vec<String>,
}

impl Wanted {
    pub fn new(
        bridge: &str,
        dns: &[Ipv4Addr],
        subnets: &[Ipv4Net],
        extra: &[Destination],
    ) -> Wanted {
        let chain_in = format!("{IN_PREFIX}{bridge}");
        let chain_fwd = format!("{FWD_PREFIX}{bridge}");
        let rules = ruleset(&chain_in, &chain_fwd, dns, subnets, extra);
        Wanted {
            bridge: bridge.to_owned(),
            input: rules_of(&rules, &chain_in),
            forward: rules_of(&rules, &chain_fwd),
            chain_in,
            chain_fwd,
        }
    }

    /// The egress bridge's chains: a task there may reach the egress proxies
    /// and nothing else, on the host or beyond (the network is internal too;
    /// these refuse at once rather than let a probe hang, and keep the host's
    /// own services closed, which internal alone does not).
    ///
    /// The one door: TCP to the bridge's gateway address, on the proxies'
    /// ports (`EGRESS_PROXY_PORTS`), where a socket is bound to that address
    /// itself (`-m socket` ignores sockets bound to the wildcard address, so a
    /// host service listening on 0.0.0.0 stays shut even on those ports).
    /// Every worker on the host has its own port in the range, and this one
    /// rule, the same for all, opens each of them.
    pub fn egress(
        bridge: &str,
        gateway: Ipv4Addr,
        ports: &std::ops::RangeInclusive<u16>,
    ) -> Wanted {
        let (lo, hi) = (ports.start(), ports.end());
        // As iptables-save prints it: one port alone, a range with ':'.
        let dport = if lo == hi {
            lo.to_string()
        } else {
            format!("{lo}:{hi}")
        };
        let chain_in = format!("{IN_PREFIX}{bridge}");
        let chain_fwd = format!("{FWD_PREFIX}{bridge}");
        Wanted {
            bridge: bridge.to_owned(),
            input: vec![
                format!(
                    "-A {chain_in} -d {gateway}/32 -p tcp -m tcp --dport {dport} -m socket -j ACCEPT"
                ),
                format!("-A {chain_in} -p tcp -j REJECT --reject-with tcp-reset"),
                format!("-A {chain_in} -j REJECT --reject-with icmp-port-unreachable"),
            ],
            forward: vec![
                format!("-A {chain_fwd} -p tcp -j REJECT --reject-with tcp-reset"),
                format!("-A {chain_fwd} -j REJECT --reject-with icmp-net-prohibited"),
            ],
            chain_in,
            chain_fwd,
        }
    }

    /// Each parent chain with the chain it jumps to for this bridge.
    ///
    /// The forward chain is jumped to twice. First in `FORWARD` itself: rules
    /// that something else inserts there (a hand's `iptables -I FORWARD 1 ...
    /// -j ACCEPT`, Tailscale's `ts-forward`) are evaluated before Docker's jump
    /// into `DOCKER-USER`, so a jump only in `DOCKER-USER` could be bypassed,
    /// and a check of `DOCKER-USER` alone would never see it. And first in
    /// `DOCKER-USER`, which Docker moves back to the top of `FORWARD` whenever it
    /// creates a network: with our jump first in it, Docker's jump may come
    /// before ours in `FORWARD` (see `may_come_first`). A packet then passes the
    /// chain twice; it only refuses, so the second pass changes nothing.
    pub fn jumps(&self) -> [(&'static str, &str); 3] {
        [
            ("INPUT", &self.chain_in),
            ("FORWARD", &self.chain_fwd),
            ("DOCKER-USER", &self.chain_fwd),
        ]
    }

    /// Each chain with the rules this worker wants in it.
    pub fn chains(&self) -> [(&str, &[String]); 2] {
        [
            (&self.chain_in, &self.input),
            (&self.chain_fwd, &self.forward),
        ]
    }

    pub fn jump(&self, parent: &str, target: &str) -> String {
        format!("-A {parent} -i {} -j {target}", self.bridge)
    }

    /// What is wrong in `listing` (`iptables-save -t filter`), empty if nothing.
    /// Each chain must hold every one of this worker's rules before its final
    /// RETURN (what follows a RETURN is never reached), in any order: what
    /// matters is that each is there and nothing lets traffic out early. Rules
    /// it does not have are allowed only if they refuse (a REJECT or DROP) or
    /// are a DNS exception: another worker on the same bridge with other
    /// networks, `TASK_BLOCKED_CIDRS` or name servers adds those. Each jump
    /// (`jumps`: `INPUT`, `FORWARD`, `DOCKER-USER`) must be there with nothing
    /// before it that may not be (`may_come_first`), whatever that rule
    /// matches: moving our jump to the front is always safe, since our chains
    /// only refuse. (`FORWARD`'s policy is the host's, not repaired: see
    /// `forward_policy`.)
    pub fn problems(&self, listing: &str) -> Vec<String> {
        let mut problems = Vec::new();
        for (chain, wanted) in self.chains() {
            let rules = rules_of(listing, chain);
            let terminal = wanted.last().filter(|r| is_final_return(r, chain));
            let reached = match terminal {
                Some(t) => match rules.iter().position(|r| r == t) {
                    Some(at) => &rules[..at],
                    None => {
                        problems.push(format!("the final RETURN of {chain} is missing"));
                        &rules[..]
                    }
                },
                None => &rules[..],
            };
            for rule in reached {
                if !wanted.contains(rule) && !tolerated(rule, chain) {
                    problems.push(format!("unexpected rule {rule:?}"));
                }
            }
            let body = &wanted[..wanted.len() - usize::from(terminal.is_some())];
            let missing = body.iter().filter(|w| !reached.contains(w)).count();
            if missing > 0 {
                problems.push(format!(
                    "{missing} of {} rules missing from {chain}",
                    wanted.len()
                ));
            }
        }
        for (parent, target) in self.jumps() {
            if let Some(problem) = self.jump_problem(listing, parent, target) {
                problems.push(problem);
            }
        }
        problems
    }

    /// What is wrong with this worker's jump from `parent` to `target` in
    /// `listing`: missing, or something ahead of it that may not be. In
    /// `FORWARD`, what follows Docker's jump into `DOCKER-USER` is not looked at
    /// while that jump leads to ours first (`passes_our_rules`): every packet of
    /// the bridge has met our rules by then. Docker inserts each new network's
    /// rules on top of `FORWARD` and then moves its jump back above them, so
    /// they sit between its jump and ours, harmlessly.
    fn jump_problem(&self, listing: &str, parent: &str, target: &str) -> Option<String> {
        let jump = self.jump(parent, target);
        let rules = rules_of(listing, parent);
        let Some(at) = rules.iter().position(|r| *r == jump) else {
            return Some(format!("jump {jump:?} missing"));
        };
        for rule in &rules[..at] {
            if parent == "FORWARD" && self.passes_our_rules(rule, listing) {
                return None;
            }
            if !self.may_come_first(rule, listing) {
                return Some(format!("{rule:?} comes before jump {jump:?}"));
            }
        }
        None
    }

    /// Whether `rule` in `FORWARD` is Docker's jump into `DOCKER-USER` while our
    /// jump there has nothing ahead of it that may not be.
    fn passes_our_rules(&self, rule: &str, listing: &str) -> bool {
        rule == DOCKER_USER_JUMP
            && self
                .jump_problem(listing, "DOCKER-USER", &self.chain_fwd)
                .is_none()
    }

    /// Both chains in `iptables-restore --noflush` form: this worker's rules
    /// plus what `listing` shows that is tolerated there (see `merged`).
    /// Declaring a chain flushes it, and the table commits at once, so the
    /// rules are never half-applied.
    pub fn restore_input(&self, listing: &str) -> String {
        let mut r = String::from("*filter\n");
        for (chain, _) in self.chains() {
            r += &format!(":{chain} - [0:0]\n");
        }
        for (chain, wanted) in self.chains() {
            for rule in merged(wanted, &rules_of(listing, chain), chain) {
                r += &rule;
                r.push('\n');
            }
        }
        r += "COMMIT\n";
        r
    }

    /// Whether `parent` has this worker's jump, but after something that may
    /// not come first (so it must be moved to the front).
    pub fn jump_is_late(&self, listing: &str, parent: &str, target: &str) -> bool {
        let jump = self.jump(parent, target);
        rules_of(listing, parent).contains(&jump)
            && self.jump_problem(listing, parent, target).is_some()
    }
}

/// `wanted` with the tolerated rules `current` has besides: DNS exceptions
/// first, then this worker's rules, then other rejections before its last rule.
fn merged(wanted: &[String], current: &[String], chain: &str) -> Vec<String> {
    let others: Vec<&String> = current
        .iter()
        .filter(|r| !wanted.contains(r) && tolerated(r, chain))
        .collect();
    let (last, body) = match wanted.split_last() {
        Some((last, body)) => (Some(last), body),
        None => (None, wanted),
    };
    let mut out: Vec<String> = others
        .iter()
        .filter(|r| is_dns_exception(r, chain))
        .map(|r| (*r).clone())
        .collect();
    out.extend(body.iter().cloned());
    out.extend(
        others
            .iter()
            .filter(|r| !is_dns_exception(r, chain))
            .map(|r| (*r).clone()),
    );
    out.extend(last.cloned());
    out.dedup();
    out
}

/// The `-A` lines of `chain` in an `iptables-save` listing, in order.
pub fn rules_of(listing: &str, chain: &str) -> Vec<String> {
    let prefix = format!("-A {chain} ");
    listing
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with(&prefix))
        .map(str::to_owned)
        .collect()
}

/// A rule that can only refuse (REJECT or DROP, no jump elsewhere).
fn refuses(rule: &str) -> bool {
    let words: Vec<&str> = rule.split_whitespace().collect();
    let target = words
        .windows(2)
        .find(|w| w[0] == "-j" || w[0] == "-g")
        .map(|w| (w[0], w[1]));
    matches!(target, Some(("-j", "REJECT" | "DROP")))
}

/// A rule that refuses, or a task DNS exception as `ruleset` writes it.
fn tolerated(rule: &str, chain: &str) -> bool {
    refuses(rule) || is_dns_exception(rule, chain)
}

/// `-A <chain> -j RETURN`.
fn is_final_return(rule: &str, chain: &str) -> bool {
    rule == format!("-A {chain} -j RETURN")
}

/// `-A SR-FWD-<bridge> -d <addr>/32 -p udp|tcp -m udp|tcp --dport 53 -j RETURN`.
fn is_dns_exception(rule: &str, chain: &str) -> bool {
    let words: Vec<&str> = rule.split_whitespace().collect();
    match words[..] {
        [
            "-A",
            c,
            "-d",
            addr,
            "-p",
            p,
            "-m",
            m,
            "--dport",
            "53",
            "-j",
            "RETURN",
        ] => {
            c == chain
                && chain.starts_with(FWD_PREFIX)
                && p == m
                && matches!(p, "udp" | "tcp")
                && addr
                    .strip_suffix("/32")
                    .is_some_and(|a| a.parse::<Ipv4Addr>().is_ok())
        }
        _ => false,
    }
}

impl Wanted {
    /// Whether `rule` may sit before this worker's jump in a parent chain: a
    /// jump from *another* bridge into that bridge's own chain (or the shared
    /// chains of old), which no packet of this bridge takes; or setup-host.sh's
    /// jump into `SR-REDIS-TLS` (Redis's TLS port's allow-list) while that
    /// chain only returns or drops. A jump for this bridge into any chain but
    /// its own would run before its rules, so it never may; nor may anything
    /// else, whatever it matches (see `jump_problem` for Docker's jump).
    fn may_come_first(&self, rule: &str, listing: &str) -> bool {
        let words: Vec<&str> = rule.split_whitespace().collect();
        if let ["-A", _, "-i", iface, "-j", target] = words[..] {
            let own_chain = target
                .strip_prefix(IN_PREFIX)
                .or_else(|| target.strip_prefix(FWD_PREFIX))
                .is_some_and(|b| b == iface);
            let legacy = LEGACY_CHAINS.iter().any(|(_, c)| *c == target);
            return iface != self.bridge && (own_chain || legacy);
        }
        words.ends_with(&["-j", REDIS_TLS_CHAIN])
            && rules_of(listing, REDIS_TLS_CHAIN)
                .iter()
                .all(|r| r.ends_with("-j RETURN") || r.ends_with("-j DROP"))
    }
}

/// Both chains' rules in `iptables-restore` form, each rule as `iptables-save`
/// prints it back.
fn ruleset(
    chain_in: &str,
    chain_fwd: &str,
    dns: &[Ipv4Addr],
    subnets: &[Ipv4Net],
    extra: &[Destination],
) -> String {
    let mut r = String::new();
    r += &format!("-A {chain_in} -p tcp -j REJECT --reject-with tcp-reset\n");
    r += &format!("-A {chain_in} -j REJECT --reject-with icmp-port-unreachable\n");
    for ns in dns {
        for proto in ["udp", "tcp"] {
            r += &format!("-A {chain_fwd} -d {ns}/32 -p {proto} -m {proto} --dport 53 -j RETURN\n");
        }
    }
    for to in BLOCKED
        .iter()
        .chain(subnets)
        .copied()
        .map(Destination::Net)
        .chain(extra.iter().cloned())
    {
        let d = destination(&to);
        r += &format!("-A {chain_fwd}{d} -p tcp -j REJECT --reject-with tcp-reset\n");
        r += &format!("-A {chain_fwd}{d} -j REJECT --reject-with icmp-net-prohibited\n");
    }
    r += &format!("-A {chain_fwd} -j RETURN\n");
    r
}

/// ` -d <network>/<len>` as `iptables-save` prints it: the network address,
/// `/32` for one address, nothing at all for `/0`. A `Verbatim` entry as given.
fn destination(to: &Destination) -> String {
    match to {
        Destination::Net(net) if net.prefix_len() == 0 => String::new(),
        Destination::Net(net) => format!(" -d {}", net.trunc()),
        Destination::Verbatim(entry) => format!(" -d {entry}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_exceptions_come_before_the_rejections() {
        let dns = [Ipv4Addr::new(10, 0, 0, 53)];
        let r = ruleset(
            "I",
            "F",
            &dns,
            &[net(192, 0, 2, 0, 24)],
            &[Destination::parse("203.0.113.0/24")],
        );
        let dns_at = r.find("-d 10.0.0.53/32 -p udp -m udp --dport 53 -j RETURN");
        let reject_at = r.find("-d 10.0.0.0/8 -p tcp -j REJECT");
        assert!(dns_at.is_some() && reject_at.is_some() && dns_at < reject_at);
        assert!(r.contains("-d 169.254.0.0/16 -p tcp -j REJECT"));
        assert!(r.contains("-d 192.0.2.0/24 -j REJECT"));
        assert!(r.contains("-d 203.0.113.0/24 -p tcp -j REJECT"));
        assert!(r.ends_with("-A F -j RETURN\n"));
    }

    /// IANA's IPv4 special-purpose registry, the entries not globally reachable
    /// (RFC 6890 and its updates), as of 2026.
    const NOT_GLOBAL: [&str; 15] = [
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.88.99.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "240.0.0.0/4",
        "255.255.255.255/32",
    ];

    #[test]
    fn special_purpose_ranges_and_metadata_addresses_are_rejected_and_the_internet_is_not() {
        let rules = ruleset("I", "F", &[], &[], &[]);
        let rejected: Vec<Ipv4Net> = rules
            .lines()
            .filter(|l| l.contains("-j REJECT --reject-with icmp-net-prohibited"))
            .filter_map(|l| l.split_whitespace().nth(3)?.parse().ok())
            .collect();
        let covered = |n: &Ipv4Net| rejected.iter().any(|r| r.contains(n));
        for range in NOT_GLOBAL {
            let n: Ipv4Net = range.parse().expect("range");
            assert!(covered(&n), "{range} is not rejected:\n{rules}");
        }
        // Metadata services and host agents: AWS, GCP, Azure, OCI (both), Alibaba,
        // AWS ECS, Tencent, Azure's wireserver.
        for addr in [
            "169.254.169.254",
            "192.0.0.192",
            "100.100.100.200",
            "169.254.170.2",
            "169.254.0.23",
            "168.63.129.16",
        ] {
            let n: Ipv4Net = format!("{addr}/32").parse().expect("address");
            assert!(covered(&n), "{addr} is not rejected:\n{rules}");
        }
        for public in [
            "1.1.1.1",
            "8.8.8.8",
            "151.101.0.223",
            "192.0.1.1",
            "198.20.0.1",
        ] {
            let n: Ipv4Net = format!("{public}/32").parse().expect("address");
            assert!(!covered(&n), "{public} is rejected:\n{rules}");
        }
    }

    /// A listing as `iptables-save -t filter` prints one with `w` installed,
    /// `extra_in_fwd` before its final RETURN.
    fn listing_of(w: &Wanted, extra_in_fwd: &[&str]) -> String {
        let mut l = String::from("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n");
        l += "-A INPUT -i sr-tasks0 -j SR-IN-sr-tasks0\n-A INPUT -p tcp --dport 22 -j ACCEPT\n";
        // As after Docker created a network: its jump back on top.
        l += "-A FORWARD -j DOCKER-USER\n-A FORWARD -i other0 -j SR-FWD-other0\n";
        // A network Docker created since: its rules above ours, below its jump.
        l += "-A FORWARD -o br-new -j DOCKER\n-A FORWARD -i br-new ! -o br-new -j ACCEPT\n";
        l +=
            "-A FORWARD -i sr-tasks0 -j SR-FWD-sr-tasks0\n-A FORWARD -j DOCKER-ISOLATION-STAGE-1\n";
        l += "-A FORWARD -i sr-tasks0 ! -o sr-tasks0 -j ACCEPT\n";
        l += "-A DOCKER-USER -i other0 -j SR-FWD-other0\n-A DOCKER-USER -i old0 -j SR-TASKS-FWD\n";
        l += "-A DOCKER-USER -i sr-tasks0 -j SR-FWD-sr-tasks0\n-A DOCKER-USER -j RETURN\n";
        l += "-A SR-FWD-other0 -d 10.0.0.0/8 -j RETURN\n";
        for r in &w.input {
            l += &format!("{r}\n");
        }
        let (last, body) = w.forward.split_last().expect("rules");
        for r in body {
            l += &format!("{r}\n");
        }
        for r in extra_in_fwd {
            l += &format!("{r}\n");
        }
        l += &format!("{last}\nCOMMIT\n");
        l
    }

    fn wanted() -> Wanted {
        Wanted::new(
            "sr-tasks0",
            &[Ipv4Addr::new(10, 0, 0, 53)],
            &[net(192, 0, 2, 0, 24)],
            &[
                Destination::parse("203.0.113.7"),
                Destination::parse("198.51.100.9/24"),
            ],
        )
    }

    #[test]
    fn rules_are_written_as_iptables_save_prints_them_in_the_bridges_own_chains() {
        let w = wanted();
        assert_eq!(
            (w.chain_in.as_str(), w.chain_fwd.as_str()),
            ("SR-IN-sr-tasks0", "SR-FWD-sr-tasks0")
        );
        assert_eq!(
            w.forward[0],
            "-A SR-FWD-sr-tasks0 -d 10.0.0.53/32 -p udp -m udp --dport 53 -j RETURN"
        );
        assert!(
            w.forward.contains(
                &"-A SR-FWD-sr-tasks0 -d 203.0.113.7/32 -p tcp -j REJECT --reject-with tcp-reset"
                    .into()
            )
        );
        assert!(w.forward.contains(
            &"-A SR-FWD-sr-tasks0 -d 198.51.100.0/24 -j REJECT --reject-with icmp-net-prohibited".into()
        ));
        assert_eq!(destination(&Destination::parse("0.0.0.0/0")), "");
        assert_eq!(
            w.forward.last().map(String::as_str),
            Some("-A SR-FWD-sr-tasks0 -j RETURN")
        );
        // Another bridge's chain (which lets 10/8 out) is none of its business.
        assert_eq!(w.problems(&listing_of(&w, &[])), Vec::<String>::new());
    }

    #[test]
    fn blocked_cidrs_entries_are_written_as_iptables_save_prints_them_or_as_given() {
        // iptables-save prints a range's network address and `/32` for one
        // address: a rule written so compares equal to the listing.
        let d = |entry: &str| destination(&Destination::parse(entry));
        assert_eq!(d("203.0.113.7"), " -d 203.0.113.7/32");
        assert_eq!(d("203.0.113.7/32"), " -d 203.0.113.7/32");
        assert_eq!(d("198.51.100.9/24"), " -d 198.51.100.0/24");
        assert_eq!(d("0.0.0.0/0"), "");
        // No IPv4 network: handed to iptables-restore as written, to refuse.
        for bad in [
            "example.com",
            "10.0.0.0/255.0.0.0",
            "10.0.0.0/33",
            "fd00::/8",
        ] {
            assert_eq!(Destination::parse(bad), Destination::Verbatim(bad.into()));
            assert_eq!(d(bad), format!(" -d {bad}"));
        }
    }

    #[test]
    fn a_flushed_chain_a_lost_jump_an_opening_or_an_early_return_is_a_problem() {
        let w = wanted();
        let whole = listing_of(&w, &[]);
        let flushed: String = whole
            .lines()
            .filter(|l| !l.starts_with("-A SR-FWD-sr-tasks0"))
            .map(|l| format!("{l}\n"))
            .collect();
        let p = w.problems(&flushed);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(
            p[0].contains("final RETURN of SR-FWD-sr-tasks0 is missing"),
            "{p:?}"
        );
        assert!(p[1].contains("missing from SR-FWD-sr-tasks0"), "{p:?}");

        let no_jump = whole.replace("-A INPUT -i sr-tasks0 -j SR-IN-sr-tasks0\n", "");
        let p = w.problems(&no_jump);
        assert_eq!(
            p,
            ["jump \"-A INPUT -i sr-tasks0 -j SR-IN-sr-tasks0\" missing"]
        );

        let opened = listing_of(&w, &["-A SR-FWD-sr-tasks0 -d 169.254.169.254/32 -j RETURN"]);
        let p = w.problems(&opened);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].starts_with("unexpected rule"), "{p:?}");

        // A RETURN moved up: the rejections after it are never reached.
        let ret = "-A SR-FWD-sr-tasks0 -j RETURN\n";
        let early = whole.replacen(ret, "", 1).replacen(
            "-A SR-FWD-sr-tasks0 -d 10.0.0.0/8",
            &format!("{ret}-A SR-FWD-sr-tasks0 -d 10.0.0.0/8"),
            1,
        );
        let p = w.problems(&early);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("missing from SR-FWD-sr-tasks0"), "{p:?}");

        let late = whole.replace(
            "-A DOCKER-USER -i other0",
            "-A DOCKER-USER -j ACCEPT\n-A DOCKER-USER -i other0",
        );
        // Late in DOCKER-USER, so late in FORWARD too (behind Docker's jump).
        let p = w.problems(&late);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p.iter().all(|p| p.contains("comes before jump")), "{p:?}");
        assert!(w.jump_is_late(&late, "DOCKER-USER", "SR-FWD-sr-tasks0"));
        assert!(w.jump_is_late(&late, "FORWARD", "SR-FWD-sr-tasks0"));
        assert!(!w.jump_is_late(&whole, "DOCKER-USER", "SR-FWD-sr-tasks0"));
    }

    #[test]
    fn anything_that_could_accept_ahead_of_the_jump_in_forward_is_a_problem() {
        let w = wanted();
        let whole = listing_of(&w, &[]);
        let fwd = "-A FORWARD -i sr-tasks0 -j SR-FWD-sr-tasks0";
        // Docker's jump into DOCKER-USER may come first: ours is first there.
        assert_eq!(w.problems(&whole), Vec::<String>::new());
        assert!(!w.jump_is_late(&whole, "FORWARD", "SR-FWD-sr-tasks0"));
        let on_top = |rules: &str| whole.replacen("-A FORWARD -j DOCKER-USER\n", rules, 1);
        for (what, rules) in [
            (
                "a hand's ACCEPT for the bridge",
                "-A FORWARD -i sr-tasks0 -j ACCEPT\n-A FORWARD -j DOCKER-USER\n",
            ),
            (
                "Tailscale's chain (which accepts what goes to tailscale0)",
                "-A FORWARD -j ts-forward\n-A FORWARD -j DOCKER-USER\n",
            ),
            (
                "an ACCEPT of traffic into the bridge (from one task to another)",
                "-A FORWARD -o sr-tasks0 -j ACCEPT\n-A FORWARD -j DOCKER-USER\n",
            ),
            (
                "Docker's other chains",
                "-A FORWARD -j DOCKER-ISOLATION-STAGE-1\n-A FORWARD -j DOCKER-USER\n",
            ),
            (
                // Published ports of another network's containers, which a
                // task could reach at their private addresses.
                "another network's rules above Docker's jump",
                "-A FORWARD -o br-new -j DOCKER\n-A FORWARD -j DOCKER-USER\n",
            ),
        ] {
            let listing = on_top(rules);
            let p = w.problems(&listing);
            assert!(
                p.len() == 1 && p[0].ends_with(&format!("comes before jump {fwd:?}")),
                "{what}: {p:?}"
            );
            assert!(
                w.jump_is_late(&listing, "FORWARD", "SR-FWD-sr-tasks0"),
                "{what}"
            );
        }
        // Docker's jump comes first, but DOCKER-USER accepts ahead of ours:
        // both jumps are late.
        let user = "-A DOCKER-USER -i sr-tasks0 -j SR-FWD-sr-tasks0\n";
        let bypassed = whole.replacen(user, &format!("-A DOCKER-USER -j ACCEPT\n{user}"), 1);
        let p = w.problems(&bypassed);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("comes before jump \"-A FORWARD"), "{p:?}");
        assert!(p[1].contains("comes before jump \"-A DOCKER-USER"), "{p:?}");
        // Our jump gone from FORWARD: missing, even with DOCKER-USER's intact.
        let gone = whole.replacen(&format!("{fwd}\n"), "", 1);
        assert_eq!(w.problems(&gone), [format!("jump {fwd:?} missing")]);
    }

    #[test]
    fn the_forward_policy_is_read_from_the_listing() {
        let w = wanted();
        let whole = listing_of(&w, &[]);
        assert_eq!(forward_policy(&whole), Some(FORWARD_POLICY));
        let open = whole.replace(":FORWARD DROP [0:0]", ":FORWARD ACCEPT [12:3456]");
        assert_eq!(forward_policy(&open), Some("ACCEPT"));
        assert_eq!(
            forward_policy("*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n"),
            None
        );
    }

    #[test]
    fn only_other_bridges_own_jumps_and_the_redis_tls_allow_list_may_come_first() {
        let w = wanted();
        let whole = listing_of(&w, &[]);
        let ours = "-A DOCKER-USER -i sr-tasks0 -j SR-FWD-sr-tasks0\n";
        let before = |rules: &str| whole.replacen(ours, &format!("{rules}{ours}"), 1);
        let tls_jump = "-A DOCKER-USER -p tcp -m conntrack --ctstate DNAT --ctorigdstport 6380 \
                        --ctdir ORIGINAL -j SR-REDIS-TLS\n";
        let allow = "-A SR-REDIS-TLS -s 192.0.2.0/24 -j RETURN\n-A SR-REDIS-TLS -j DROP\n";
        assert_eq!(
            w.problems(&before(&format!("{tls_jump}{allow}"))),
            Vec::<String>::new()
        );
        for (what, rules) in [
            (
                "a jump for this bridge into another chain",
                "-A DOCKER-USER -i sr-tasks0 -j SR-FWD-evil\n".to_owned(),
            ),
            (
                "another bridge's jump into a chain not its own",
                "-A DOCKER-USER -i other0 -j SR-FWD-sr-tasks0x\n".to_owned(),
            ),
            (
                "this bridge into the old shared chain",
                "-A DOCKER-USER -i sr-tasks0 -j SR-TASKS-FWD\n".to_owned(),
            ),
            (
                "an allow-list that accepts",
                format!("{tls_jump}-A SR-REDIS-TLS -j ACCEPT\n"),
            ),
        ] {
            // DOCKER-USER's jump is late, and FORWARD's behind Docker's jump.
            let p = w.problems(&before(&rules));
            assert!(
                p.len() == 2
                    && p[0].contains("comes before jump \"-A FORWARD")
                    && p[1].contains("comes before jump \"-A DOCKER-USER"),
                "{what}: {p:?}"
            );
        }
    }

    #[test]
    fn another_workers_rejections_in_any_order_and_dns_exceptions_are_kept_not_fought() {
        let w = wanted();
        let theirs = [
            "-A SR-FWD-sr-tasks0 -d 11.22.33.0/24 -j REJECT --reject-with icmp-net-prohibited",
            "-A SR-FWD-sr-tasks0 -d 10.9.9.9/32 -p tcp -m tcp --dport 53 -j RETURN",
        ];
        let listing = listing_of(&w, &theirs);
        assert_eq!(w.problems(&listing), Vec::<String>::new());
        // A worker that sees the host's subnets in another order writes our
        // rejections in another order: no reason to rewrite them.
        let mut reordered = w.forward.clone();
        let last = reordered.pop().expect("final RETURN");
        reordered.reverse();
        reordered.push(last);
        let whole = listing_of(&w, &[]);
        let swapped = whole.replace(&w.forward.join("\n"), &reordered.join("\n"));
        assert_ne!(swapped, whole);
        assert_eq!(w.problems(&swapped), Vec::<String>::new());

        let merged = merged(&w.forward, &rules_of(&listing, &w.chain_fwd), &w.chain_fwd);
        assert_eq!(merged[0], theirs[1], "their DNS exception comes first");
        assert_eq!(merged[merged.len() - 2], theirs[0]);
        assert_eq!(merged.last(), w.forward.last());
        assert_eq!(merged.len(), w.forward.len() + 2);
        let restore = w.restore_input(&listing);
        assert!(
            restore.starts_with("*filter\n:SR-IN-sr-tasks0 - [0:0]\n:SR-FWD-sr-tasks0 - [0:0]\n")
        );
        assert!(!restore.contains("SR-FWD-other0"), "{restore}");
    }
}
