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
/// are looked at: no password is ever logged. `strict` (at start): a name that
/// does not resolve is an error; otherwise (a refresh) it is logged and
/// skipped, so one removed node's stale name does not keep a new one open.
pub async fn redis_addresses(
    redis: &RedisTarget,
    strict: bool,
) -> Result<Vec<Ipv4Net>, FirewallError> {
    let hosts = redis.hosts().await.map_err(FirewallError::RedisHosts)?;
    let mut nets = Vec::new();
    for (host, port) in hosts {
        let host = host.trim_matches(['[', ']']).to_owned();
        let lookup = tokio::net::lookup_host((host.clone(), port)).await;
        let addrs = match lookup {
            Ok(addrs) => addrs,
            Err(error) if strict => return Err(FirewallError::Resolve { host, error }),
            Err(error) => {
                tracing::warn!(host, error = %error, "a Redis host does not resolve; skipped");
                continue;
            }
        };
        nets.extend(addrs.filter_map(|a| match a.ip() {
            IpAddr::V4(v4) => Some(Ipv4Net::from(v4)),
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
pub async fn host_subnets() -> Result<Vec<Ipv4Net>, FirewallError> {
    // A failed `ip` must not read as "no subnets": that would install fewer
    // rejections and leave the host's own networks open to tasks. Nor may output
    // that does not read as `ip -j`'s: it is an error too.
    let args = ["-j", "-4", "addr", "show"];
    let subnets = subnets(&read_links(&args, &run("ip", &args).await?)?);
    if subnets.is_empty() {
        return Err(FirewallError::Failed {
            cmd: "ip -j -4 addr show".into(),
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
    let args = ["-j", "-6", "addr", "show", "dev", bridge, "scope", "global"];
    match run("ip", &args).await {
        Ok(listing) => Ok(inet6(&read_links(&args, &listing)?)),
        Err(FirewallError::Failed { stderr, .. }) if stderr.contains("does not exist") => {
            Ok(Vec::new())
        }
        Err(e) => Err(e),
    }
}

/// One interface in `ip -j addr show`: only its addresses are read. `ip` prints
/// `{}` for an interface its filter left out (and for an address within one), so
/// every field may be missing; unknown fields are ignored.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct Link {
    addr_info: Vec<AddrInfo>,
}

/// One address of an interface, as `ip -j` prints it: `local` is the
/// interface's own address; `address`, present only when it differs, is a
/// point-to-point address's peer (and stands alone when the kernel gave no
/// local address). Kept as text so one odd entry cannot spoil the listing.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct AddrInfo {
    family: Option<String>,
    local: Option<String>,
    address: Option<String>,
    prefixlen: Option<u8>,
}

impl AddrInfo {
    /// The interface's own address and its prefix length, for an entry of
    /// `family`'s.
    fn own(&self, family: &str) -> Option<(&str, u8)> {
        if self.family.as_deref() != Some(family) {
            return None;
        }
        let addr = self.local.as_deref().or(self.address.as_deref())?;
        Some((addr, self.prefixlen?))
    }

    /// A point-to-point address: its prefix is the peer's, not a network of
    /// the host's own.
    fn has_peer(&self) -> bool {
        self.local.is_some() && self.address.is_some()
    }
}

/// `ip -j`'s listing of interfaces, read; `args` name the command in the error.
fn read_links(args: &[&str], json: &str) -> Result<Vec<Link>, FirewallError> {
    serde_json::from_str(json).map_err(|e| FirewallError::Failed {
        cmd: format!("ip {}", args.join(" ")),
        stderr: format!("printed what does not read as its JSON listing: {e}"),
    })
}

/// Every IPv6 address in `links`, as `address/prefix`.
fn inet6(links: &[Link]) -> Vec<String> {
    links
        .iter()
        .flat_map(|l| &l.addr_info)
        // Every one counts, a point-to-point one too: any global address
        // means the IPv4 rules do not cover the bridge.
        .filter_map(|a| a.own("inet6"))
        .map(|(addr, len)| format!("{addr}/{len}"))
        .collect()
}

/// The networks of the IPv4 addresses in `links`, loopback's left out, sorted
/// and without repeats.
fn subnets(links: &[Link]) -> Vec<Ipv4Net> {
    let mut nets: Vec<Ipv4Net> = links
        .iter()
        .flat_map(|l| &l.addr_info)
        // A point-to-point address is left out, as the text listing left it
        // (`inet 10.9.0.1 peer 10.9.0.2/32`: no prefix after the address, so it
        // never read as a network): the far end is one machine, not a subnet
        // the host is on.
        .filter(|a| !a.has_peer())
        .filter_map(|a| {
            let (addr, len) = a.own("inet")?;
            let net = Ipv4Net::new(addr.parse().ok()?, len).ok()?;
            // The network the address is in, not the address: 192.0.2.0/24.
            (!net.addr().is_loopback()).then_some(net.trunc())
        })
        .collect();
    nets.sort();
    nets.dedup();
    nets
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links(json: &str) -> Vec<Link> {
        read_links(&["-j"], json).expect("`ip -j` output")
    }

    /// Networks as `iptables-save` prints a rule's `-d`.
    fn shown(nets: &[Ipv4Net]) -> Vec<String> {
        nets.iter().map(Ipv4Net::to_string).collect()
    }

    #[test]
    fn host_subnets_are_networks_not_addresses() {
        // `ip -j -4 addr show` as iproute2 6.1 prints it (one line), with a
        // point-to-point address, an impossible prefix and a /0 added.
        let out = r#"[{"ifindex":1,"ifname":"lo","flags":["LOOPBACK","UP","LOWER_UP"],"mtu":65536,"qdisc":"noqueue","operstate":"UNKNOWN","group":"default","txqlen":1000,"addr_info":[{"family":"inet","local":"127.0.0.1","prefixlen":8,"scope":"host","label":"lo","valid_life_time":4294967295,"preferred_life_time":4294967295}]},{"ifindex":2,"ifname":"eth0","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"],"mtu":1500,"qdisc":"pfifo_fast","operstate":"UP","group":"default","txqlen":1000,"addr_info":[{"family":"inet","local":"192.0.2.2","prefixlen":24,"broadcast":"192.0.2.255","scope":"global","label":"eth0","valid_life_time":4294967295,"preferred_life_time":4294967295},{"family":"inet","local":"192.0.2.9","prefixlen":24,"broadcast":"192.0.2.255","scope":"global","secondary":true,"label":"eth0","valid_life_time":4294967295,"preferred_life_time":4294967295}]},{"ifindex":3,"ifname":"docker0","flags":["NO-CARRIER","BROADCAST","MULTICAST","UP"],"mtu":1500,"qdisc":"noqueue","operstate":"DOWN","group":"default","addr_info":[{"family":"inet","local":"172.17.0.1","prefixlen":16,"broadcast":"172.17.255.255","scope":"global","label":"docker0","valid_life_time":4294967295,"preferred_life_time":4294967295}]},{"ifindex":4,"ifname":"wg0","flags":["POINTOPOINT","NOARP","UP","LOWER_UP"],"mtu":1420,"qdisc":"noqueue","operstate":"UNKNOWN","group":"default","txqlen":1000,"addr_info":[{"family":"inet","local":"10.9.0.1","address":"10.9.0.2","prefixlen":32,"scope":"global","label":"wg0","valid_life_time":4294967295,"preferred_life_time":4294967295}]},{"ifindex":5,"ifname":"odd0","addr_info":[{"family":"inet","local":"10.8.0.1","prefixlen":33,"scope":"global","label":"odd0"}]},{"ifindex":6,"ifname":"all0","addr_info":[{"family":"inet","local":"198.51.100.7","prefixlen":0,"scope":"global","label":"all0"}]}]"#;
        assert_eq!(
            shown(&subnets(&links(out))),
            ["0.0.0.0/0", "172.17.0.0/16", "192.0.2.0/24"]
        );
    }

    #[test]
    fn interfaces_and_addresses_a_filter_left_out_are_empty_objects() {
        // `ip -j -4 addr show type bridge` on a host with lo and eth0 besides.
        let out = r#"[{},{},{"ifindex":5,"ifname":"docker0","flags":["NO-CARRIER","BROADCAST","MULTICAST","UP"],"mtu":1500,"qdisc":"noqueue","operstate":"DOWN","group":"default","addr_info":[{"family":"inet","local":"172.17.0.1","prefixlen":16,"broadcast":"172.17.255.255","scope":"global","label":"docker0","valid_life_time":4294967295,"preferred_life_time":4294967295},{}]}]"#;
        assert_eq!(shown(&subnets(&links(out))), ["172.17.0.0/16"]);
        assert!(subnets(&links("[]")).is_empty());
    }

    #[test]
    fn output_that_is_not_ip_json_is_an_error_not_an_empty_listing() {
        let text = "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n";
        assert!(read_links(&["-j", "-4", "addr", "show"], text).is_err());
        assert!(read_links(&["-j"], "").is_err());
    }

    #[test]
    fn ipv6_addresses_are_read_from_ip_output() {
        // `ip -j -6 addr show dev sr-tasks0 scope global`, with a
        // point-to-point address added: the bridge's link-local address, left
        // out by the filter, is the trailing `{}`.
        let out = r#"[{"ifindex":7,"ifname":"sr-tasks0","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"],"mtu":1500,"operstate":"UP","txqlen":1000,"addr_info":[{"family":"inet6","local":"fd00:5352::1","prefixlen":64,"scope":"global","valid_life_time":4294967295,"preferred_life_time":4294967295},{"family":"inet6","local":"2001:db8::7","prefixlen":64,"scope":"global","dynamic":true,"mngtmpaddr":true,"valid_life_time":86000,"preferred_life_time":14000},{"family":"inet6","local":"fd00:9::1","address":"fd00:9::2","prefixlen":128,"scope":"global","valid_life_time":4294967295,"preferred_life_time":4294967295},{}]}]"#;
        assert_eq!(
            inet6(&links(out)),
            ["fd00:5352::1/64", "2001:db8::7/64", "fd00:9::1/128"]
        );
        // A bridge with no global address prints an empty list.
        assert!(inet6(&links("[]")).is_empty());
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
        let nets = redis_addresses(&at("rediss://worker:secret@203.0.113.7:6380"), true).await;
        assert_eq!(
            nets.ok().as_deref().map(shown),
            Some(vec!["203.0.113.7/32".to_owned()])
        );
        let nets = redis_addresses(&at("redis://127.0.0.1"), true).await;
        assert_eq!(
            nets.ok().as_deref().map(shown),
            Some(vec!["127.0.0.1/32".to_owned()])
        );
        let nets = redis_addresses(&at("redis+unix:///run/redis.sock"), true).await;
        assert_eq!(nets.ok(), Some(vec![]));
    }
}
