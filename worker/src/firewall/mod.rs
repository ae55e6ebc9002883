//! Host firewall rules that keep tasks away from everything but the internet.
//!
//! Docker's bridge gives a container a route to the host and, through it, to the
//! host's networks: Redis, the api, the cloud metadata service, other hosts on the
//! LAN. The worker closes that at start (idempotently, atomically) with two chains
//! of the tasks' bridge interface's own, and keeps them (`Firewall::ensure`, before
//! every task and on every heartbeat):
//!
//! - `SR-IN-<bridge>`, jumped to from `INPUT`: a task may not talk to the host at
//!   all (any port, any of the host's addresses).
//! - `SR-FWD-<bridge>`, jumped to first in `FORWARD` and first in `DOCKER-USER`
//!   (which Docker keeps first in `FORWARD`), so nothing inserted ahead of
//!   Docker's jump can accept a task's packet before it: a task may not reach IANA's special-purpose ranges that are not
//!   globally reachable (private, link-local with the metadata service, shared,
//!   loopback, documentation, benchmarking, reserved), multicast, or the cloud
//!   metadata and wireserver addresses outside them (`BLOCKED`), nor any subnet the
//!   host is attached to, nor the address of the Redis this worker uses (which
//!   may be public: a central Redis serving workers on other hosts), nor
//!   `TASK_BLOCKED_CIDRS`. The host's own DNS servers
//!   stay reachable on port 53 so names still resolve. Everything else (the
//!   internet) is forwarded and masqueraded as usual.
//!
//! Rejections answer at once (TCP reset / ICMP), so a probe fails fast instead of
//! hanging. Traffic between tasks is already dropped by Docker (ICC off).
//!
//! `rules` decides what the chains hold and what is wrong with a listing (no
//! I/O); `host` runs `iptables` and reads the host's addresses.

mod host;
mod refused;
mod rules;

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use tokio::sync::{Mutex, watch};

use crate::metrics::Metrics;
use host::{ensure_jump, iptables, restore, save};
pub use refused::{Refusals, Refused};
pub use rules::{BLOCKED, FWD_PREFIX, IN_PREFIX};
use rules::{FORWARD_POLICY, LEGACY_CHAINS, Wanted, forward_policy};

/// How long a check (and its repair) may take before the rules count as not
/// in place: a task never waits on a stuck `iptables` longer than this.
const CHECK_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum FirewallError {
    #[error(
        "cannot run {0}: {1} (the worker needs root and iptables to isolate tasks; \
         set TASK_FIREWALL=off only on a machine you do not mind tasks reaching)"
    )]
    Spawn(&'static str, std::io::Error),
    #[error("{cmd} failed: {stderr}")]
    Failed { cmd: String, stderr: String },
    #[error("cannot list the Redis hosts to block them for tasks: {0}")]
    RedisHosts(redis::RedisError),
    #[error("cannot resolve the Redis host {host:?} to block it for tasks: {error}")]
    Resolve { host: String, error: std::io::Error },
    #[error("the rules are not in place and could not be reinstalled: {0}")]
    Unrepaired(String),
    #[error("checking the rules took more than {0} s (is iptables stuck on its lock?)")]
    TooSlow(u64),
    #[error(
        "the FORWARD chain's policy is {policy}, not {FORWARD_POLICY}: the host forwards \
         whatever no rule refuses, such as connections from its other networks into the \
         tasks' bridge; set it back with `iptables -P FORWARD {FORWARD_POLICY}` (what Docker \
         sets when it turns forwarding on)"
    )]
    ForwardPolicy { policy: String },
    #[error(
        "the tasks' bridge {bridge} has IPv6 address {addresses}, which the rules (IPv4) \
         do not cover: tasks could reach the host and its networks over IPv6; remove the \
         address, or the IPv6 setting of the task network that made it"
    )]
    BridgeHasIpv6 { bridge: String, addresses: String },
}

/// The egress bridge and the address its proxies listen on.
#[derive(Debug, Clone)]
pub struct EgressDoor<'a> {
    pub bridge: &'a str,
    pub gateway: Ipv4Addr,
    /// `EGRESS_PROXY_PORTS`.
    pub ports: std::ops::RangeInclusive<u16>,
}

/// Installs the rules for tasks on bridge interface `bridge` (refusing what
/// `refusals` holds besides `BLOCKED`, as it changes) and returns the guard
/// that keeps them.
pub async fn install(
    bridge: &str,
    refusals: &Refusals,
    egress: Option<EgressDoor<'_>>,
    metrics: Metrics,
) -> Result<Firewall, FirewallError> {
    let dns = host::nameservers().await;
    let mut refused = refusals.watch();
    let now = refused.borrow_and_update().clone();
    let mut wanted = vec![Wanted::new(bridge, &dns, now.subnets(), &now.extra())];
    if let Some(door) = egress {
        wanted.push(Wanted::egress(door.bridge, door.gateway, &door.ports));
    }
    // A worker of an older version jumped from this bridge into chains every
    // worker shared; ours replace those jumps (the shared chains stay for
    // workers of other bridges that still use them).
    for (parent, legacy) in LEGACY_CHAINS {
        while iptables(&["-D", parent, "-i", bridge, "-j", legacy])
            .await
            .is_ok()
        {}
    }
    // What another worker on this bridge added stays (see `rules::merged`).
    let listing = save().await?;
    for w in &wanted {
        reinstall(w, &listing).await?;
    }
    let blocked = wanted[0].forward.len();
    let firewall = Firewall(Arc::new(Guard {
        metrics,
        checked: Mutex::new(Checked {
            verified: None,
            wanted,
            refused,
            pending: false,
            dns,
        }),
        intact: AtomicBool::new(false),
    }));
    // Read back at once (with the repair's retries, in case another worker
    // rewrote the chains meanwhile): rules that do not read back as written
    // would otherwise be "repaired" on every check.
    {
        let checked = firewall.0.checked.lock().await;
        firewall.check_and_repair(&checked.wanted).await?;
    }
    firewall.0.intact.store(true, Ordering::SeqCst);
    firewall.0.metrics.set_firewall_intact(true);
    tracing::info!(bridge, blocked, "task firewall installed");
    Ok(firewall)
}

/// The installed firewall, checked and repaired on demand. Clones share it.
#[derive(Debug, Clone)]
pub struct Firewall(Arc<Guard>);

#[derive(Debug)]
struct Guard {
    metrics: Metrics,
    /// Held through each check, so checks never overlap.
    checked: Mutex<Checked>,
    /// What the last check found (or its repair made).
    intact: AtomicBool,
}

#[derive(Debug)]
struct Checked {
    /// When the last check that found the rules in place began.
    verified: Option<Instant>,
    /// The task bridge's chains, and the egress bridge's.
    wanted: Vec<Wanted>,
    /// What the task bridge's chains refuse, as it changes.
    refused: watch::Receiver<Arc<Refused>>,
    /// A change of `refused` not yet written (a reinstall that failed or was
    /// cut short is tried again first, not found later as a "repair").
    pending: bool,
    /// The name servers tasks may reach on port 53 (read at start).
    dns: Vec<Ipv4Addr>,
}

impl Firewall {
    /// Makes sure every rule and jump is in place now: reads the filter table
    /// (one `iptables-save`, a few ms) and, if anything is missing or altered,
    /// reinstalls the rules (a warning naming what was wrong, and
    /// `script_runner_worker_firewall_repairs_total`). Callers at the same
    /// moment share one check, but never one that began before they asked.
    /// An error means the rules are not in place: no task may start.
    pub async fn ensure(&self) -> Result<(), FirewallError> {
        let asked = Instant::now();
        let mut checked = self.0.checked.lock().await;
        // New refusals (a Redis host seen since the last check) make new task
        // chains, written before this check (not counted as a repair).
        if checked.refused.has_changed().unwrap_or(false) {
            let now = checked.refused.borrow_and_update().clone();
            let task = &checked.wanted[0];
            let rebuilt = Wanted::new(&task.bridge, &checked.dns, now.subnets(), &now.extra());
            tracing::info!(
                bridge = %task.bridge,
                "the Redis hosts changed; the task firewall refuses them all now"
            );
            checked.wanted[0] = rebuilt;
            checked.verified = None;
            checked.pending = true;
        }
        if checked.verified.is_some_and(|at| at >= asked) {
            return Ok(());
        }
        let began = Instant::now();
        let pending = checked.pending;
        let check = async {
            if pending {
                reinstall(&checked.wanted[0], &save().await?).await?;
            }
            self.check_and_repair(&checked.wanted).await
        };
        let r = tokio::time::timeout(CHECK_LIMIT, check)
            .await
            .unwrap_or(Err(FirewallError::TooSlow(CHECK_LIMIT.as_secs())));
        if r.is_ok() {
            checked.pending = false;
        }
        checked.verified = r.is_ok().then_some(began);
        self.0.intact.store(r.is_ok(), Ordering::SeqCst);
        self.0.metrics.set_firewall_intact(r.is_ok());
        if let Err(e) = &r {
            tracing::error!(error = %e, "task firewall is not in place; no task starts until it is");
        }
        r
    }

    /// What the last check found: false once a check failed to repair the rules.
    pub fn intact(&self) -> bool {
        self.0.intact.load(Ordering::SeqCst)
    }

    async fn check_and_repair(&self, wanted: &[Wanted]) -> Result<(), FirewallError> {
        for wanted in wanted {
            self.check_and_repair_one(wanted).await?;
        }
        Ok(())
    }

    async fn check_and_repair_one(&self, wanted: &Wanted) -> Result<(), FirewallError> {
        // The rules are IPv4 only, so a bridge that routes IPv6 has none: nothing
        // to repair (the address is the operator's or the engine's), no task
        // starts until it is gone.
        let v6 = host::ipv6_addresses(&wanted.bridge).await?;
        if !v6.is_empty() {
            return Err(FirewallError::BridgeHasIpv6 {
                bridge: wanted.bridge.clone(),
                addresses: v6.join(", "),
            });
        }
        let mut listing = save().await?;
        // The policy is the host's (Docker's, or the operator's on a host that
        // routes): not ours to change under whatever else relies on it, so as
        // with an IPv6 address, no task starts until it is back.
        let policy = forward_policy(&listing).unwrap_or("(none listed)");
        if policy != FORWARD_POLICY {
            return Err(FirewallError::ForwardPolicy {
                policy: policy.to_owned(),
            });
        }
        let found = wanted.problems(&listing);
        if found.is_empty() {
            return Ok(());
        }
        // Another worker rewriting the chains at the same moment can undo a
        // repair: a few attempts.
        for _ in 0..3 {
            reinstall(wanted, &listing).await?;
            listing = save().await?;
            if wanted.problems(&listing).is_empty() {
                self.0.metrics.firewall_repaired();
                tracing::warn!(
                    problems = %found.join("; "),
                    "task firewall was missing or altered; reinstalled it"
                );
                return Ok(());
            }
        }
        Err(FirewallError::Unrepaired(
            wanted.problems(&listing).join("; "),
        ))
    }
}

/// Rewrites both chains (atomically) with this worker's rules plus what
/// `listing` shows that is tolerated there, then puts each jump first.
async fn reinstall(wanted: &Wanted, listing: &str) -> Result<(), FirewallError> {
    restore(&wanted.restore_input(listing)).await?;
    for (parent, target) in wanted.jumps() {
        if wanted.jump_is_late(listing, parent, target) {
            // There, but after something else: moved to the front.
            let _ = iptables(&["-D", parent, "-i", &wanted.bridge, "-j", target]).await;
        }
        ensure_jump(parent, &wanted.bridge, target).await?;
    }
    Ok(())
}
