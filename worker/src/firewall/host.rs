//! What the firewall reads from and writes to the host: `iptables`, and the
//! addresses that must be refused (the Redis host, the host's own subnets) or
//! kept (its name servers).

use std::net::{IpAddr, Ipv4Addr};
use store::redis_pool::RedisTarget;

use ipnet::Ipv4Net;
use tokio::process::Command;

use super::FirewallError;

/// Runs `program args`: its stdout on success, else an error with what it
/// said on stderr. Every command here but `iptables-restore` (which takes
/// stdin) goes through it.
async fn run(program: &'static str, args: &[&str]) -> Result<String, FirewallError> {
    let out = Command::new(program)
        .args(args)
        .output()
        .await
        .map_err(|e| FirewallError::Spawn(program, e))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(FirewallError::Failed {
            cmd: format!("{program} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// The filter table, as `iptables-save` prints it.
pub async fn save() -> Result<String, FirewallError> {
    run("iptables-save", &["-t", "filter"]).await
}

/// Feeds `rules` to `iptables-restore --noflush`: the chains it declares are
/// flushed and refilled in one commit; nothing else is touched.
pub async fn restore(rules: &str) -> Result<(), FirewallError> {
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
pub async fn ensure_jump(chain: &str, bridge: &str, target: &str) -> Result<(), FirewallError> {
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
pub async fn iptables(args: &[&str]) -> Result<String, FirewallError> {
    run("iptables", &[&["-w"], args].concat()).await
}

/// The IPv4 addresses of the Redis hosts (`RedisTarget::hosts`: `REDIS_URL`'s,
/// or the sentinels and every node they know), as `/32` ranges. Only host names
/// are looked at: no password is ever logged.
pub async fn redis_addresses(redis: &RedisTarget) -> Result<Vec<String>, FirewallError> {
    let hosts = redis.hosts().await.map_err(FirewallError::RedisHosts)?;
    let mut nets = Vec::new();
    for (host, port) in hosts {
        let host = host.trim_matches(['[', ']']).to_owned();
        let lookup = tokio::net::lookup_host((host.clone(), port)).await;
        let addrs = match lookup {
            Ok(addrs) => addrs,
            Err(error) => return Err(FirewallError::Resolve { host, error }),
        };
        nets.extend(addrs.filter_map(|a| match a.ip() {
            IpAddr::V4(v4) => Some(format!("{v4}/32")),
            IpAddr::V6(_) => None,
        }));
    }
    nets.sort();
    nets.dedup();
    Ok(nets)
}

/// IPv4 name servers Docker forwards tasks' DNS queries to (they must stay
/// reachable). With systemd-resolved, /etc/resolv.conf names only 127.0.0.53
/// and Docker uses the upstream servers from systemd's own file instead.
pub async fn nameservers() -> Vec<Ipv4Addr> {
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
pub async fn host_subnets() -> Result<Vec<String>, FirewallError> {
    // A failed `ip` must not read as "no subnets": that would install fewer
    // rejections and leave the host's own networks open to tasks.
    let subnets = parse_subnets(&run("ip", &["-o", "-4", "addr", "show"]).await?);
    if subnets.is_empty() {
        return Err(FirewallError::Failed {
            cmd: "ip -o -4 addr show".into(),
            stderr: "listed no IPv4 network besides loopback".into(),
        });
    }
    Ok(subnets)
}

/// The IPv6 addresses on `bridge` that route beyond the link (global and
/// unique-local; `scope global` in `ip`'s terms). Link-local ones do not count:
/// every bridge has one, and a task's own IPv6 is off (Docker turns it off in
/// containers on a network without IPv6), so nothing of the task can use it.
/// A bridge that does not exist yet has none.
pub async fn ipv6_addresses(bridge: &str) -> Result<Vec<String>, FirewallError> {
    let args = ["-o", "-6", "addr", "show", "dev", bridge, "scope", "global"];
    match run("ip", &args).await {
        Ok(listing) => Ok(parse_inet6(&listing)),
        Err(FirewallError::Failed { stderr, .. }) if stderr.contains("does not exist") => {
            Ok(Vec::new())
        }
        Err(e) => Err(e),
    }
}

fn parse_inet6(ip_output: &str) -> Vec<String> {
    ip_output
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "inet6")?;
            words.next().map(str::to_owned)
        })
        .collect()
}

fn parse_subnets(ip_output: &str) -> Vec<String> {
    let mut nets: Vec<String> = ip_output
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "inet")?;
            let net: Ipv4Net = words.next()?.parse().ok()?;
            // The network the address is in, not the address: 192.0.2.0/24.
            (!net.addr().is_loopback()).then(|| net.trunc().to_string())
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
                   3: docker0    inet 172.17.0.1/16 brd 172.17.255.255 scope global docker0\n\
                   4: wg0    inet 10.9.0.1 peer 10.9.0.2/32 scope global wg0\n\
                   5: odd0    inet 10.8.0.1/33 scope global odd0\n\
                   6: all0    inet 198.51.100.7/0 scope global all0\n";
        assert_eq!(
            parse_subnets(out),
            ["0.0.0.0/0", "172.17.0.0/16", "192.0.2.0/24"]
        );
    }

    #[test]
    fn ipv6_addresses_are_read_from_ip_output() {
        let out = "7: sr-tasks0    inet6 fd00:5352::1/64 scope global \\       valid_lft forever preferred_lft forever\n\
                   7: sr-tasks0    inet6 2001:db8::7/64 scope global dynamic \\       valid_lft 86000sec\n";
        assert_eq!(parse_inet6(out), ["fd00:5352::1/64", "2001:db8::7/64"]);
        assert!(parse_inet6("").is_empty());
    }

    #[test]
    fn name_servers_but_loopback_ones() {
        let dns =
            parse_nameservers("# x\nnameserver 10.0.0.53\nnameserver 127.0.0.53\nnameserver ::1\n");
        assert_eq!(dns, [Ipv4Addr::new(10, 0, 0, 53)]);
    }

    #[tokio::test]
    async fn the_redis_address_is_blocked_even_when_public() {
        let at = |url: &str| RedisTarget::url(url).expect("a Redis URL");
        let nets = redis_addresses(&at("rediss://worker:secret@203.0.113.7:6380")).await;
        assert_eq!(nets.ok(), Some(vec!["203.0.113.7/32".to_owned()]));
        let nets = redis_addresses(&at("redis://127.0.0.1")).await;
        assert_eq!(nets.ok(), Some(vec!["127.0.0.1/32".to_owned()]));
        let nets = redis_addresses(&at("redis+unix:///run/redis.sock")).await;
        assert_eq!(nets.ok(), Some(vec![]));
    }
}
