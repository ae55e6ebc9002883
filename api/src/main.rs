//! `script-runner-api`: loads the config from the environment, binds, serves until
//! SIGINT/SIGTERM.

use anyhow::Context;
use script_runner_api::{Config, run};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    // rediss:// goes through rustls, which needs a crypto provider chosen once per
    // process; an Err only means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = Config::from_env().context("invalid configuration")?;
    script_runner_api::http::raise_fd_limit(config.http.max_connections);
    let listener = script_runner_api::http::bind(config.listen_addr)
        .with_context(|| format!("cannot listen on {}", config.listen_addr))?;
    run(listener, config, support::shutdown_signal()).await?;
    Ok(())
}
