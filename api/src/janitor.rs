//! The idle expiry of persistent workspaces (`WORKSPACE_IDLE_SECONDS`): every
//! api replica looks now and then for workspaces no task used for that long
//! and deletes them (`Store::expire_idle_workspaces`, one WS_DELETE each, which
//! checks again in Redis, so replicas looking at once delete each one once).
//! The api does it rather than the workers: deleting any owner's workspace is
//! the api's and the admin's right, and no worker host's Redis user has it.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::db::Store;

/// Workspaces deleted per pass at most; a longer backlog goes over passes.
const BATCH: usize = 100;

/// How often a replica looks: often enough against `idle` (a quarter of it),
/// never more than once a minute in production, nor busier than 4 times a
/// second with a tiny test setting.
fn period(idle: Duration) -> Duration {
    (idle / 4).clamp(Duration::from_millis(250), Duration::from_secs(60))
}

/// Runs until `stop`.
pub async fn run(store: Store, idle: Duration, stop: CancellationToken) {
    let mut every = tokio::time::interval(period(idle));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = stop.cancelled() => return,
        }
        // Redis down: nothing to do until it is back, and the next pass tries.
        if let Err(e) = store.expire_idle_workspaces(idle, BATCH).await {
            tracing::warn!(error = %e, "the idle workspace expiry could not look");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_period_is_a_quarter_of_the_idle_time_within_bounds() {
        assert_eq!(
            period(Duration::from_secs(2_592_000)),
            Duration::from_secs(60)
        );
        assert_eq!(period(Duration::from_secs(2)), Duration::from_millis(500));
        assert_eq!(
            period(Duration::from_millis(100)),
            Duration::from_millis(250)
        );
    }
}
