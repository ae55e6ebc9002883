//! The tasks' bridge network: one per host, shared by the workers on it, with a
//! fixed bridge interface name (the firewall matches on it), inter-container
//! traffic off (tasks cannot reach each other) and IPv6 off (the firewall rules
//! are IPv4 only).

use std::collections::HashMap;

use bollard::errors::Error as DockerError;
use bollard::models::NetworkCreateRequest;

use super::{Sandbox, SandboxError};

const OPT_BRIDGE_NAME: &str = "com.docker.network.bridge.name";
const OPT_ICC: &str = "com.docker.network.bridge.enable_icc";

impl Sandbox {
    /// Creates the tasks' bridge network if it does not exist. A network of that
    /// name made otherwise (an older worker, by hand) is replaced when no task
    /// uses it.
    pub async fn ensure_network(&self) -> Result<(), SandboxError> {
        let (name, bridge) = (&self.limits.network, &self.limits.bridge);
        self.ensure_bridge(name, bridge, false).await
    }

    /// The same for the egress network of allow-list tasks, which is
    /// `internal` (Docker gives its containers no route out and its DNS
    /// server forwards no name); returns its gateway address, where the
    /// egress proxy listens.
    pub async fn ensure_egress_network(&self) -> Result<std::net::Ipv4Addr, SandboxError> {
        let (name, bridge) = (&self.limits.egress_network, &self.limits.egress_bridge);
        self.ensure_bridge(name, bridge, true).await?;
        let net = self.docker.inspect_network(name, None).await?;
        net.ipam
            .and_then(|i| i.config)
            .unwrap_or_default()
            .iter()
            .find_map(|c| c.gateway.as_deref()?.parse().ok())
            .ok_or_else(|| SandboxError::NoGateway(name.clone()))
    }

    async fn ensure_bridge(
        &self,
        name: &String,
        bridge: &String,
        internal: bool,
    ) -> Result<(), SandboxError> {
        if let Ok(existing) = self.docker.inspect_network(name, None).await {
            let opts = existing.options.clone().unwrap_or_default();
            let ours = opts.get(OPT_BRIDGE_NAME) == Some(bridge)
                && opts.get(OPT_ICC).map(String::as_str) == Some("false")
                && existing.enable_ipv6 != Some(true)
                && existing.internal.unwrap_or(false) == internal;
            if ours {
                return Ok(());
            }
            if existing.containers.is_some_and(|c| !c.is_empty()) {
                return Err(SandboxError::NetworkInUse {
                    name: name.clone(),
                    bridge: bridge.clone(),
                });
            }
            tracing::warn!(network = %name, "replacing task network that lacks the isolation options");
            match self.docker.remove_network(name).await {
                // Another worker on this host removed it first.
                Ok(())
                | Err(DockerError::DockerResponseServerError {
                    status_code: 404, ..
                }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let options = HashMap::from([
            (OPT_BRIDGE_NAME.to_owned(), bridge.clone()),
            (OPT_ICC.to_owned(), "false".to_owned()),
            (
                "com.docker.network.bridge.enable_ip_masquerade".to_owned(),
                (!internal).to_string(),
            ),
        ]);
        let req = NetworkCreateRequest {
            name: name.clone(),
            driver: Some("bridge".into()),
            options: Some(options),
            // Pinned off whatever the daemon's default: the firewall is IPv4 only.
            enable_ipv6: Some(false),
            internal: Some(internal),
            labels: Some(HashMap::from([(
                "script-runner".to_owned(),
                "tasks".to_owned(),
            )])),
            ..Default::default()
        };
        match self.docker.create_network(req).await {
            Ok(_) => Ok(()),
            // Another worker on this host created it first.
            Err(e) if self.docker.inspect_network(name, None).await.is_ok() => {
                tracing::debug!(error = %e, "network appeared concurrently");
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }
}
