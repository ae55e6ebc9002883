//! The Redis store every binary shares: the task repository (`tasks`), the
//! pool with our timeouts, the Lua scripts run from their typed calls, API
//! keys, the jobs stream's pending summary, the per-owner usage totals, the
//! start-up check of Redis's setup, and the shutdown signal.
//!
//! `shared/` holds what api and worker agree on and does no I/O; what they both
//! need and does I/O lives here instead, so neither binary carries a twin copy.

pub mod apikeys;
pub mod jobs;
pub mod redis_error;
pub mod redis_pool;
pub mod redis_setup;
pub mod redis_target;
pub mod scripts;
pub mod tasks;
pub mod usage;
pub mod workspaces;

/// Resolves on SIGINT or SIGTERM (whichever comes first), for a graceful stop.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutting down");
}
