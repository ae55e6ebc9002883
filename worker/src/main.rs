//! `script-runner-worker`: loads the config from the environment and runs until
//! SIGINT/SIGTERM.

use anyhow::Context;
use script_runner_worker::{Config, run};

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    // rediss:// goes through rustls, which needs a crypto provider chosen once per
    // process; an Err only means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Loaded before the runtime starts: it reads /etc/hostname, a blocking call.
    let config = Config::from_env().context("invalid configuration")?;
    tokio::runtime::Runtime::new()?.block_on(async {
        run(config, store::shutdown_signal())
            .await
            .context("worker failed")
    })
}
