//! The egress proxy: the only way out for a task run with an allow-list.
//!
//! Such a task's container sits on the egress network, an internal Docker
//! bridge (no route out, no DNS forwarding, inter-container traffic off) whose
//! only open door is this proxy, on the bridge's gateway address, opened by the
//! host firewall for its port alone (`firewall`). The proxy runs inside the
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
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
pub use policy::{Policy, parse_test_resolve};

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
}

impl EgressProxy {
    /// Listens on `addr` (the egress bridge's gateway) and serves until `stop`.
    pub async fn start(
        addr: SocketAddr,
        policy: Policy,
        metrics: Metrics,
        stop: CancellationToken,
    ) -> std::io::Result<EgressProxy> {
        let listener = TcpListener::bind(addr).await?;
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

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.0.addr
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
        let entry = Arc::new(Entry {
            task_id: task_id.to_owned(),
            allow,
            log: Mutex::new(EgressLog::default()),
            changed: AtomicBool::new(false),
        });
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

    fn leases(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Arc<Entry>>> {
        // A panic while holding it leaves a map still worth using.
        self.0.leases.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The task at `ip`, if one holds a lease.
    fn entry(&self, ip: IpAddr) -> Option<Arc<Entry>> {
        self.leases().get(&ip).cloned()
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

    fn add_bytes(&self, host: &str, port: u16, verdict: Verdict, out: u64, inb: u64) {
        self.log().add_bytes(host, port, verdict, out, inb);
        self.changed.store(true, Ordering::SeqCst);
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

    /// The whole log as JSON (marking it read).
    pub fn log_json(&self) -> Vec<u8> {
        self.entry.changed.store(false, Ordering::SeqCst);
        serde_json::to_vec(&*self.entry.log()).unwrap_or_default()
    }
}

impl Drop for EgressLease {
    fn drop(&mut self) {
        let mut leases = self.proxy.leases();
        // Only its own: the address may already be another task's.
        if leases
            .get(&self.ip)
            .is_some_and(|e| Arc::ptr_eq(e, &self.entry))
        {
            leases.remove(&self.ip);
        }
    }
}
