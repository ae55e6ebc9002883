//! The heartbeat: this worker's key in Redis, renewed every third of its time to
//! live, which tells the reapers of every worker that it is alive (and ops what
//! it runs, on which host, at which version). Each beat also checks the task
//! firewall.

use tokio_util::sync::CancellationToken;

use crate::ctx::Ctx;
use crate::slots::Slots;

/// Renews the heartbeat until `stop`. A failed renewal is logged: a live worker
/// whose heartbeat lapses through a Redis outage is not condemned for it (see the
/// reaper).
pub async fn run(ctx: Ctx, slots: Slots, stop: CancellationToken) {
    let ttl = ctx.config.heartbeat_ttl;
    let host = host_name().await;
    let version = env!("CARGO_PKG_VERSION");
    let metrics = ctx.sandbox.metrics();
    metrics.set_identity(ctx.queue.worker(), &host, version, ctx.config.concurrency);
    let mut every = tokio::time::interval(ttl / 3);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = stop.cancelled() => return,
        }
        let beat = shared::keys::Heartbeat {
            running: slots.running() as u64,
            slots: Some(ctx.config.concurrency as u64),
            host: Some(host.clone()),
            version: Some(version.to_owned()),
            ttl_seconds: Some(ttl.as_secs()),
        };
        // A Redis node added since (a replica, a sentinel) is refused from
        // here on, by the rules (the check below) and by the egress proxy.
        // Beside the beat, not before it (sentinels are slowest during a
        // failover), and bounded, for a sentinel that does not answer.
        let (beat, refreshed) = tokio::join!(
            ctx.queue.heartbeat(ttl, &beat),
            tokio::time::timeout(ttl / 3, ctx.refusals.refresh()),
        );
        if let Err(e) = beat {
            tracing::warn!(error = %e, "heartbeat failed");
        }
        match refreshed {
            Ok(Ok(added)) if !added.is_empty() => tracing::info!(
                added = %added.iter().map(ToString::to_string).collect::<Vec<_>>().join(" "),
                "new Redis hosts; tasks may not reach them"
            ),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(
                error = %e,
                "cannot list the Redis hosts again; those known stay refused"
            ),
            Err(_) => tracing::warn!(
                "listing the Redis hosts took longer than a heartbeat; those known stay refused"
            ),
        }
        // Reinstalled if a firewall reload took it away; a failure is logged
        // and keeps tasks from starting (see `Firewall::ensure`). After the
        // beat, and bounded, so an `iptables` stuck on its lock never lets the
        // heartbeat lapse.
        if let Some(firewall) = &ctx.firewall
            && tokio::time::timeout(ttl / 3, firewall.ensure())
                .await
                .is_err()
        {
            tracing::warn!(
                "the task firewall check took longer than a heartbeat; left for the next one"
            );
        }
    }
}

/// This host's name, for ops (the heartbeat, the metrics).
async fn host_name() -> String {
    tokio::fs::read_to_string("/etc/hostname")
        .await
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}
