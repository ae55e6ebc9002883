//! Host firewall rules that keep tasks away from everything but the internet.
//!
//! Docker's bridge gives a container a route to the host and, through it, to the
//! host's networks: Redis, the api, the cloud metadata service, other hosts on the
//! LAN. The worker closes that at start (idempotently, atomically) with two chains
//! matched on the tasks' bridge interface:
//!
//! - `SR-TASKS-IN`, jumped to from `INPUT`: a task may not talk to the host at all
//!   (any port, any of the host's addresses).
//! - `SR-TASKS-FWD`, jumped to from `DOCKER-USER` (which Docker evaluates first in
//!   `FORWARD`): a task may not reach private, link-local (169.254.0.0/16, the
//!   metadata service), shared, loopback or multicast ranges, nor any subnet the
//!   host is attached to, nor `TASK_BLOCKED_CIDRS`. The host's own DNS servers
//!   stay reachable on port 53 so names still resolve. Everything else (the
//!   internet) is forwarded and masqueraded as usual.
//!
//! Rejections answer at once (TCP reset / ICMP), so a probe fails fast instead of
//! hanging. Traffic between tasks is already dropped by Docker (ICC off).

use std::net::Ipv4Addr;

use tokio::process::Command;

pub const CHAIN_IN: &str = "SR-TASKS-IN";
pub const CHAIN_FWD: &str = "SR-TASKS-FWD";

/// Always refused from a task, whatever the host's networks.
const BLOCKED: [&str; 9] = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "224.0.0.0/4",
    "240.0.0.0/4",
];

#[derive(Debug, thiserror::Error)]
pub enum FirewallError {
    #[error(
        "cannot run {0}: {1} (the worker needs root and iptables to isolate tasks; \
         set TASK_FIREWALL=off only on a machine you do not mind tasks reaching)"
    )]
    Spawn(&'static str, std::io::Error),
    #[error("{cmd} failed: {stderr}")]
    Failed { cmd: String, stderr: String },
}

/// Installs or refreshes the rules for tasks on bridge interface `bridge`.
pub async fn install(bridge: &str, extra_blocked: &[String]) -> Result<(), FirewallError> {
    let dns = nameservers().await;
    let subnets = host_subnets().await?;
    let rules = ruleset(&dns, &subnets, extra_blocked);
    restore(&rules).await?;
    ensure_jump("INPUT", bridge, CHAIN_IN).await?;
    ensure_jump("DOCKER-USER", bridge, CHAIN_FWD).await?;
    tracing::info!(
        bridge,
        blocked = subnets.len() + BLOCKED.len() + extra_blocked.len(),
        "task firewall installed"
    );
    Ok(())
}

/// The two chains in `iptables-restore` form. Declaring a chain flushes it, and
/// the whole table commits at once, so rules are never half-applied.
fn ruleset(dns: &[Ipv4Addr], subnets: &[String], extra: &[String]) -> String {
    let mut r = String::from("*filter\n");
    r += &format!(":{CHAIN_IN} - [0:0]\n:{CHAIN_FWD} - [0:0]\n");
    r += &format!("-A {CHAIN_IN} -p tcp -j REJECT --reject-with tcp-reset\n");
    r += &format!("-A {CHAIN_IN} -j REJECT --reject-with icmp-port-unreachable\n");
    for ns in dns {
        for proto in ["udp", "tcp"] {
            r += &format!("-A {CHAIN_FWD} -d {ns}/32 -p {proto} --dport 53 -j RETURN\n");
        }
    }
    for cidr in BLOCKED
        .iter()
        .map(|s| s.to_string())
        .chain(subnets.iter().cloned())
        .chain(extra.iter().cloned())
    {
        r += &format!("-A {CHAIN_FWD} -d {cidr} -p tcp -j REJECT --reject-with tcp-reset\n");
        r += &format!("-A {CHAIN_FWD} -d {cidr} -j REJECT --reject-with icmp-net-prohibited\n");
    }
    r += &format!("-A {CHAIN_FWD} -j RETURN\nCOMMIT\n");
    r
}

async fn restore(rules: &str) -> Result<(), FirewallError> {
    use tokio::io::AsyncWriteExt;
    let mut child = Command::new("iptables-restore")
        .args(["-w", "--noflush"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| FirewallError::Spawn("iptables-restore", e))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(rules.as_bytes())
            .await
            .map_err(|e| FirewallError::Spawn("iptables-restore", e))?;
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| FirewallError::Spawn("iptables-restore", e))?;
    if !out.status.success() {
        return Err(FirewallError::Failed {
            cmd: "iptables-restore".into(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(())
}

/// Puts `-i bridge -j target` first in `chain` unless it is already there. Two
/// workers starting at once can both insert it (check and insert are separate
/// calls), so extra copies are deleted; two workers deleting at once could then
/// remove them all, so presence is checked again afterwards. The end state always
/// has the jump (and, short of such a race, exactly one copy).
async fn ensure_jump(chain: &str, bridge: &str, target: &str) -> Result<(), FirewallError> {
    let rule = ["-i", bridge, "-j", target];
    let check = [&["-C", chain][..], &rule].concat();
    let insert = [&["-I", chain, "1"][..], &rule].concat();
    if iptables(&check).await.is_err() {
        iptables(&insert).await?;
    }
    let listing = iptables(&["-S", chain]).await?;
    let wanted = format!("-A {chain} -i {bridge} -j {target}");
    let copies = listing.lines().filter(|l| l.trim() == wanted).count();
    for _ in 1..copies {
        // Another worker may be deleting the same copy: a failure here is fine.
        let _ = iptables(&[&["-D", chain][..], &rule].concat()).await;
    }
    if iptables(&check).await.is_err() {
        iptables(&insert).await?;
    }
    Ok(())
}

/// Runs `iptables -w args`; its stdout on success.
async fn iptables(args: &[&str]) -> Result<String, FirewallError> {
    let out = Command::new("iptables")
        .arg("-w")
        .args(args)
        .output()
        .await
        .map_err(|e| FirewallError::Spawn("iptables", e))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(FirewallError::Failed {
            cmd: format!("iptables {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// IPv4 name servers Docker forwards tasks' DNS queries to (they must stay
/// reachable). With systemd-resolved, /etc/resolv.conf names only 127.0.0.53
/// and Docker uses the upstream servers from systemd's own file instead.
async fn nameservers() -> Vec<Ipv4Addr> {
    for path in ["/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"] {
        let conf = tokio::fs::read_to_string(path).await.unwrap_or_default();
        let servers = parse_nameservers(&conf);
        if !servers.is_empty() {
            return servers;
        }
    }
    Vec::new()
}

fn parse_nameservers(conf: &str) -> Vec<Ipv4Addr> {
    conf.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse::<Ipv4Addr>().ok())
        .filter(|a| !a.is_loopback())
        .collect()
}

/// Every IPv4 subnet the host has an address in, e.g. its LAN (where Redis may live).
async fn host_subnets() -> Result<Vec<String>, FirewallError> {
    let out = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .await
        .map_err(|e| FirewallError::Spawn("ip", e))?;
    // A failed `ip` must not read as "no subnets": that would install fewer
    // rejections and leave the host's own networks open to tasks.
    if !out.status.success() {
        return Err(FirewallError::Failed {
            cmd: "ip -o -4 addr show".into(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    let subnets = parse_subnets(&String::from_utf8_lossy(&out.stdout));
    if subnets.is_empty() {
        return Err(FirewallError::Failed {
            cmd: "ip -o -4 addr show".into(),
            stderr: "listed no IPv4 network besides loopback".into(),
        });
    }
    Ok(subnets)
}

fn parse_subnets(ip_output: &str) -> Vec<String> {
    let mut nets: Vec<String> = ip_output
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "inet")?;
            let (addr, len) = words.next()?.split_once('/')?;
            let (addr, len): (Ipv4Addr, u32) = (addr.parse().ok()?, len.parse().ok()?);
            if addr.is_loopback() || len > 32 {
                return None;
            }
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            Some(format!("{}/{len}", Ipv4Addr::from(u32::from(addr) & mask)))
        })
        .collect();
    nets.sort();
    nets.dedup();
    nets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_subnets_are_networks_not_addresses() {
        let out = "1: lo    inet 127.0.0.1/8 scope host lo\n\
                   2: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\n\
                   3: docker0    inet 172.17.0.1/16 brd 172.17.255.255 scope global docker0\n";
        assert_eq!(parse_subnets(out), ["172.17.0.0/16", "192.0.2.0/24"]);
    }

    #[test]
    fn dns_exceptions_come_before_the_rejections() {
        let dns =
            parse_nameservers("# x\nnameserver 10.0.0.53\nnameserver 127.0.0.53\nnameserver ::1\n");
        assert_eq!(dns, [Ipv4Addr::new(10, 0, 0, 53)]);
        let r = ruleset(&dns, &["192.0.2.0/24".into()], &["203.0.113.0/24".into()]);
        let dns_at = r.find("-d 10.0.0.53/32 -p udp --dport 53 -j RETURN");
        let reject_at = r.find("-d 10.0.0.0/8 -p tcp -j REJECT");
        assert!(dns_at.is_some() && reject_at.is_some() && dns_at < reject_at);
        assert!(r.contains("-d 169.254.0.0/16 -p tcp -j REJECT"));
        assert!(r.contains("-d 192.0.2.0/24 -j REJECT"));
        assert!(r.contains("-d 203.0.113.0/24 -p tcp -j REJECT"));
        assert!(r.ends_with("-j RETURN\nCOMMIT\n"));
    }
}
