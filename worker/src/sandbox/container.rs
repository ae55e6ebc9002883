//! A task container's life after creation: attach, start, wait, kill, remove;
//! and the removal of every container a worker left behind (by its label).

use std::collections::HashMap;

use bollard::errors::Error as DockerError;
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, DownloadFromContainerOptionsBuilder,
    KillContainerOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
};
use futures_util::StreamExt;

use super::{Attached, LABEL_WORKER, Sandbox, SandboxError};
use crate::metrics::Op;

impl Sandbox {
    /// Attaches to stdin, stdout and stderr (the container must have been
    /// created with an open stdin). Call before `start` so no byte is missed.
    pub async fn attach(&self, id: &str) -> Result<Attached, SandboxError> {
        let opts = AttachContainerOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .stdin(true)
            .stream(true)
            .logs(false)
            .build();
        let attach = self.docker.attach_container(id, Some(opts));
        let attached = self.metrics.docker(Op::Attach, attach).await?;
        Ok(Attached {
            output: attached.output,
            input: attached.input,
        })
    }

    pub async fn start(&self, id: &str) -> Result<(), SandboxError> {
        Ok(self
            .metrics
            .docker(Op::Start, self.docker.start_container(id, None))
            .await?)
    }

    /// Waits for the container to exit; returns its exit code.
    pub async fn wait(&self, id: &str) -> Result<i64, SandboxError> {
        let mut s = self.docker.wait_container(id, None);
        match s.next().await {
            Some(Ok(r)) => Ok(r.status_code),
            // bollard reports a non-zero exit as an error: it is a normal exit.
            Some(Err(DockerError::DockerContainerWaitError { code, .. })) => Ok(code),
            Some(Err(e)) => Err(e.into()),
            None => Err(SandboxError::WaitEnded),
        }
    }

    /// Whether the kernel OOM-killed the container (unreliable on cgroup v2).
    pub async fn oom_killed(&self, id: &str) -> bool {
        self.docker
            .inspect_container(id, None)
            .await
            .ok()
            .and_then(|c| c.state)
            .and_then(|s| s.oom_killed)
            .unwrap_or(false)
    }

    /// The container's address on the egress network (an allow-list task's),
    /// which the egress proxy knows it by.
    pub async fn egress_address(&self, id: &str) -> Result<std::net::IpAddr, SandboxError> {
        let net = &self.limits.egress_network;
        let c = self.docker.inspect_container(id, None).await?;
        c.network_settings
            .and_then(|n| n.networks)
            .and_then(|mut n| n.remove(net))
            .and_then(|e| e.ip_address)
            .and_then(|ip| ip.parse().ok())
            .ok_or_else(|| SandboxError::NoEgressAddress(net.clone()))
    }

    pub async fn kill(&self, id: &str) {
        let opts = KillContainerOptionsBuilder::default()
            .signal("SIGKILL")
            .build();
        if let Err(e) = self.docker.kill_container(id, Some(opts)).await {
            tracing::debug!(container = id, error = %e, "kill (container may have exited already)");
        }
    }

    /// Freezes every process of a container (the freezer cgroup) without
    /// ending any: a workspace task's end. Its /workspace stays until the
    /// container is killed, so it can still be read (`workspace_archive`);
    /// nothing of the task runs meanwhile. False if the engine refused.
    pub async fn pause(&self, id: &str) -> bool {
        match self.docker.pause_container(id).await {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(container = id, error = %e, "pause (container may have exited already)");
                false
            }
        }
    }

    /// Whether the container is paused (so its /workspace is still mounted and
    /// nothing changes it).
    pub async fn is_paused(&self, id: &str) -> bool {
        self.docker
            .inspect_container(id, None)
            .await
            .ok()
            .and_then(|c| c.state)
            .and_then(|s| s.paused)
            .unwrap_or(false)
    }

    /// A tar of the container's /workspace, as the engine reads it (from the
    /// tmpfs volume, on the host side: no process of the task's is involved).
    /// Paths start `workspace/`.
    pub fn workspace_archive(
        &self,
        id: &str,
    ) -> impl futures_util::Stream<Item = Result<bytes::Bytes, DockerError>> + '_ {
        let opts = DownloadFromContainerOptionsBuilder::default()
            .path("/workspace")
            .build();
        self.docker.download_from_container(id, Some(opts))
    }

    /// Removes a container whatever its state, and says whether it is gone
    /// (removed now, or not there). Errors are logged: the orphan sweep at the
    /// next start catches what is left. A caller that is about to touch what
    /// the container could write (a lent cache) must not when it is not gone.
    pub async fn remove(&self, id: &str) -> bool {
        let opts = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        let remove = self.docker.remove_container(id, Some(opts));
        match self.metrics.docker(Op::Remove, remove).await {
            Ok(()) => true,
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => true,
            Err(e) => {
                tracing::warn!(container = id, error = %e, "could not remove task container");
                false
            }
        }
    }

    /// Removes every container on this host that worker `owner` made (task and
    /// warm pool containers alike): this worker's own at start-up (left by a
    /// previous run that died), or a dead worker's that shared this Docker engine.
    /// With `created_before` (Unix seconds), only containers created before then:
    /// a dead worker's, not those of a new process that took its name meanwhile.
    /// Returns the names of the containers removed.
    pub async fn remove_containers_of(
        &self,
        owner: &str,
        created_before: Option<i64>,
    ) -> Result<Vec<String>, SandboxError> {
        let filters =
            HashMap::from([("label".to_owned(), vec![format!("{LABEL_WORKER}={owner}")])]);
        let opts = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let containers = self.docker.list_containers(Some(opts)).await?;
        let mut removed = Vec::new();
        for c in containers {
            if created_before.is_some_and(|t| c.created.is_none_or(|made| made >= t)) {
                continue;
            }
            if let Some(id) = c.id {
                self.remove(&id).await;
                let name = c.names.and_then(|n| n.into_iter().next()).unwrap_or(id);
                removed.push(name.trim_start_matches('/').to_owned());
            }
        }
        Ok(removed)
    }
}
