//! The egress proxy: the only way out for a task run with an allow-list.
//!
//! Such a task's container sits on the egress network, an internal Docker
//! bridge (no route out, no DNS forwarding, inter-container traffic off) whose
//! only open door is this proxy, on the bridge's gateway address, opened by the
//! host firewall for the proxies' ports and sockets bound to that address
//! alone (`firewall::rules`, `Wanted::egress`). The proxy runs inside the
//! worker: it knows each task's container address, so it tells tasks apart by
//! their source address (a task holds no capability to forge one) and applies
//! each its own list, and it writes what it saw into each task's record.
//!
//! It speaks HTTP CONNECT (HTTPS and anything over TLS) and plain HTTP
//! (absolute-form requests), decides each against the task's list and
//! `Policy`, resolves names itself and connects only to the addresses it
//! checked, and for CONNECT reads the TLS server name and refuses one that is
//! not allowed. Built on hyper (the HTTP parsing) and rustls (reading the
//! ClientHello): docs/egress.md says why not Squid.

mod policy;
mod proxy;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use shared::egress::{AllowList, EgressLog, Verdict};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
pub use policy::{FixedHosts, Policy, Resolver};

/// The proxy: its address and the tasks it serves. Clones share it.
#[derive(Clone)]
pub struct EgressProxy(Arc<Inner>);

struct Inner {
    addr: SocketAddr,
    policy: Policy,
    metrics: Metrics,
    leases: Mutex<HashMap<IpAddr, Arc<Entry>>>,
}

/// One task's standing with the proxy.
struct Entry {
    task_id: String,
    allow: AllowList,
    log: Mutex<EgressLog>,
    changed: AtomicBool,
    /// Tunnels and forwarded requests still open (their bytes come at the end).
    /// A watch, not an atomic, so `EgressLease::settled` sleeps until the count
    /// reaches zero instead of polling it. Changed only by `opened` and
    /// `OpenGuard`'s drop.
    open: watch::Sender<usize>,
    /// Connections the task may still open (`MAX_CONNECTIONS_PER_TASK`).
    slots: Arc<Semaphore>,
    /// Cancelled when the task ends: every connection of its is closed.
    ended: CancellationToken,
}

/// At most this many connections of one task through the proxy at once: one
/// task cannot take all of the worker's descriptors.
pub const MAX_CONNECTIONS_PER_TASK: usize = 128;

impl EgressProxy {
    /// Listens on `ip` (the egress bridge's gateway), on the first free port
    /// of `ports` (each worker on a host has its own), and serves until `stop`.
    pub async fn start(
        ip: IpAddr,
        ports: std::ops::RangeInclusive<u16>,
        policy: Policy,
        metrics: Metrics,
        stop: CancellationToken,
    ) -> std::io::Result<EgressProxy> {
        let mut bound = None;
        for port in ports {
            match TcpListener::bind((ip, port)).await {
                Ok(l) => {
                    bound = Some(l);
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
                Err(e) => return Err(e),
            }
        }
        let listener = bound.ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "every port of EGRESS_PROXY_PORTS is taken (one per worker on a host)",
            )
        })?;
        let proxy = EgressProxy(Arc::new(Inner {
            addr: listener.local_addr()?,
            policy,
            metrics,
            leases: Mutex::new(HashMap::new()),
        }));
        tokio::spawn(proxy::serve(proxy.clone(), listener, stop));
        tracing::info!(addr = %proxy.0.addr, "egress proxy listening");
        Ok(proxy)
    }

    /// `http://<address>:<port>`, what a task's `HTTP_PROXY` holds.
    pub fn url(&self) -> String {
        format!("http://{}", self.0.addr)
    }

    /// The variables that point a task's tools at the proxy, in both cases
    /// (curl reads only the lower-case `http_proxy`; others read either).
    pub fn env(&self) -> Vec<(String, String)> {
        let url = self.url();
        let no_proxy = "localhost,127.0.0.1,::1".to_owned();
        [
            ("HTTP_PROXY", url.clone()),
            ("HTTPS_PROXY", url.clone()),
            ("NO_PROXY", no_proxy.clone()),
            ("http_proxy", url.clone()),
            ("https_proxy", url),
            ("no_proxy", no_proxy),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// Lets the container at `ip` through for `task_id` under `allow`, until
    /// the returned lease is dropped.
    pub fn lease(&self, ip: IpAddr, task_id: &str, allow: AllowList) -> EgressLease {
        let entry = Self::entry_for(task_id, allow);
        let old = self.leases().insert(ip, entry.clone());
        if let Some(old) = old {
            // Its container is gone (the engine gave its address away).
            tracing::warn!(%ip, task_id = %old.task_id, "egress lease replaced");
        }
        EgressLease {
            proxy: self.clone(),
            ip,
            entry,
        }
    }

    /// `lease`, unless another task holds `ip`: then `None`. For a warm
    /// container, whose address was read when it was made: should it have
    /// died idle, the engine may have given that address to another task's
    /// container since, whose lease must not be taken over.
    pub fn try_lease(&self, ip: IpAddr, task_id: &str, allow: AllowList) -> Option<EgressLease> {
        let entry = Self::entry_for(task_id, allow);
        match self.leases().entry(ip) {
            std::collections::hash_map::Entry::Occupied(_) => return None,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(entry.clone());
            }
        }
        Some(EgressLease {
            proxy: self.clone(),
            ip,
            entry,
        })
    }

    fn entry_for(task_id: &str, allow: AllowList) -> Arc<Entry> {
        Arc::new(Entry {
            task_id: task_id.to_owned(),
            allow,
            log: Mutex::new(EgressLog::default()),
            changed: AtomicBool::new(false),
            open: watch::Sender::new(0),
            slots: Arc::new(Semaphore::new(MAX_CONNECTIONS_PER_TASK)),
            ended: CancellationToken::new(),
        })
    }

    fn leases(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Arc<Entry>>> {
        // A panic while holding it leaves a map still worth using.
        self.0.leases.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The task at `ip`, if one holds a lease.
    fn entry(&self, ip: IpAddr) -> Option<Arc<Entry>> {
        self.leases().get(&ip).cloned()
    }

    /// Removes `entry` from `ip`, if it is still there: the address may
    /// already be another task's.
    fn forget(&self, ip: IpAddr, entry: &Arc<Entry>) {
        let mut leases = self.leases();
        if leases.get(&ip).is_some_and(|e| Arc::ptr_eq(e, entry)) {
            leases.remove(&ip);
        }
    }

    fn policy(&self) -> &Policy {
        &self.0.policy
    }
}

impl Entry {
    fn log(&self) -> std::sync::MutexGuard<'_, EgressLog> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts an attempt (in the log and the metrics).
    fn record(&self, metrics: &Metrics, host: &str, port: u16, verdict: Verdict) {
        self.log().record(host, port, verdict);
        self.changed.store(true, Ordering::SeqCst);
        metrics.egress_attempt(verdict.allowed());
        let allowed = verdict.allowed();
        tracing::debug!(task_id = %self.task_id, host, port, ?verdict, allowed, "egress");
    }

    /// Marks a connection open until the returned guard is dropped.
    fn opened(self: &Arc<Self>) -> OpenGuard {
        // Bounded by the task's slots: each caller holds one of its permits.
        // `send_modify` changes the count even with no receiver subscribed.
        self.open.send_modify(|n| *n += 1);
        OpenGuard(self.clone())
    }

    fn add_bytes(&self, host: &str, port: u16, verdict: Verdict, out: u64, inb: u64) {
        self.log().add_bytes(host, port, verdict, out, inb);
        self.changed.store(true, Ordering::SeqCst);
    }
}

/// An open connection of a task's (see `Entry::opened`).
struct OpenGuard(Arc<Entry>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        // Each guard was counted once in `opened`, so this never goes below
        // zero; saturating all the same, so a drop can never panic.
        self.0.open.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A task's standing with the proxy; dropped when its container ends.
pub struct EgressLease {
    proxy: EgressProxy,
    ip: IpAddr,
    entry: Arc<Entry>,
}

impl EgressLease {
    /// Whether the log changed since it was last read (`log_json`).
    pub fn changed(&self) -> bool {
        self.entry.changed.load(Ordering::SeqCst)
    }

    /// Ends the task's standing at once: its address no longer maps to it
    /// (the engine may give the address to another container as soon as this
    /// one is removed) and its open connections are closed. The log stays.
    pub fn revoke(&self) {
        self.proxy.forget(self.ip, &self.entry);
        self.entry.ended.cancel();
    }

    /// Waits (at most `limit`) for the task's connections to close, so the
    /// log published at its end has their bytes: its processes are gone, so
    /// each closes as soon as the proxy reads the end.
    pub async fn settled(&self, limit: std::time::Duration) {
        // `wait_for` looks at the count as it is when subscribed before it
        // sleeps, and a close after that marks the value changed and wakes it:
        // no close between the look and the sleep can be missed. Its error
        // (the sender gone) cannot happen while `entry` is held; either way,
        // and on the deadline, the log is published as it stands.
        let mut open = self.entry.open.subscribe();
        let _ = tokio::time::timeout(limit, open.wait_for(|n| *n == 0)).await;
    }

    /// The whole log as JSON (marking it read).
    pub fn log_json(&self) -> Vec<u8> {
        self.entry.changed.store(false, Ordering::SeqCst);
        serde_json::to_vec(&*self.entry.log()).unwrap_or_default()
    }
}

impl Drop for EgressLease {
    fn drop(&mut self) {
        self.revoke();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A proxy with no listener: leases and their counts only.
    fn proxy() -> EgressProxy {
        EgressProxy(Arc::new(Inner {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            policy: Policy {
                ports: vec![443],
                blocked: crate::firewall::Refusals::fixed(&[]),
                resolver: Resolver::Dns,
            },
            metrics: Metrics::default(),
            leases: Mutex::new(HashMap::new()),
        }))
    }

    fn lease(proxy: &EgressProxy) -> EgressLease {
        let allow = AllowList::parse(&["pkgs.test"]).expect("an allow-list");
        proxy.lease(IpAddr::from([172, 30, 0, 2]), "t1", allow)
    }

    #[test]
    fn a_warm_claim_never_takes_over_another_tasks_address() {
        let proxy = proxy();
        let ip = IpAddr::from([172, 30, 0, 2]);
        let held = lease(&proxy);
        let allow = AllowList::parse(&["other.test"]).expect("an allow-list");
        assert!(proxy.try_lease(ip, "t2", allow.clone()).is_none());
        assert_eq!(
            proxy.entry(ip).map(|e| e.task_id.clone()).as_deref(),
            Some("t1")
        );
        drop(held);
        let mine = proxy.try_lease(ip, "t2", allow).expect("a free address");
        assert_eq!(
            proxy.entry(ip).map(|e| e.task_id.clone()).as_deref(),
            Some("t2")
        );
        drop(mine);
        assert!(proxy.entry(ip).is_none());
    }

    #[tokio::test]
    async fn settled_returns_at_once_with_nothing_open() {
        let proxy = proxy();
        let lease = lease(&proxy);
        let t = tokio::time::Instant::now();
        lease.settled(Duration::from_secs(5)).await;
        assert!(t.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn settled_wakes_when_the_last_connection_closes() {
        let proxy = proxy();
        let lease = lease(&proxy);
        let (a, b) = (lease.entry.opened(), lease.entry.opened());
        assert_eq!(*lease.entry.open.borrow(), 2);
        tokio::spawn(async move {
            drop(a);
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(b);
        });
        let t = tokio::time::Instant::now();
        lease.settled(Duration::from_secs(5)).await;
        assert_eq!(*lease.entry.open.borrow(), 0);
        assert!(t.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn settled_waits_no_longer_than_its_limit() {
        let proxy = proxy();
        let lease = lease(&proxy);
        let _open = lease.entry.opened();
        let t = tokio::time::Instant::now();
        lease.settled(Duration::from_millis(100)).await;
        let waited = t.elapsed();
        assert!(waited >= Duration::from_millis(100), "{waited:?}");
        assert!(waited < Duration::from_secs(2), "{waited:?}");
        assert_eq!(*lease.entry.open.borrow(), 1);
    }
}
