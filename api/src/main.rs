//! `script-runner-api`: loads the config from the environment, binds, serves until
//! SIGINT/SIGTERM.

use anyhow::Context;
use script_runner_api::{Config, run};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(log_filter(std::env::var("RUST_LOG").ok().as_deref()))
        .init();
    // rediss:// goes through rustls, which needs a crypto provider chosen once per
    // process; an Err only means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = Config::from_env().context("invalid configuration")?;
    script_runner_api::http::raise_fd_limit(config.http.max_connections);
    let listener = script_runner_api::http::bind(config.listen_addr)
        .with_context(|| format!("cannot listen on {}", config.listen_addr))?;
    run(listener, config, store::shutdown_signal()).await?;
    Ok(())
}

/// `RUST_LOG` (default `info`), with rmcp at `warn` unless it names rmcp. On a
/// stateless server rmcp logs three INFO lines per request (a service started,
/// its input ended, it finished): under load that was about 8% of the api's CPU
/// time and nearly all of its log (BENCHMARKS.md). A filter that does not parse
/// falls back to the default, as before.
fn log_filter(rust_log: Option<&str>) -> EnvFilter {
    const DEFAULT: &str = "info,rmcp=warn";
    let spec = match rust_log.map(str::trim).filter(|s| !s.is_empty()) {
        None => DEFAULT.to_owned(),
        Some(s) if s.contains("rmcp") => s.to_owned(),
        Some(s) => format!("{s},rmcp=warn"),
    };
    EnvFilter::try_new(spec).unwrap_or_else(|_| EnvFilter::new(DEFAULT))
}

#[cfg(test)]
mod tests {
    use super::log_filter;

    /// The filter's directives, in a fixed order: tracing-subscriber prints them
    /// most specific first.
    fn directives(rust_log: Option<&str>) -> Vec<String> {
        let mut d: Vec<String> = log_filter(rust_log)
            .to_string()
            .split(',')
            .map(str::to_owned)
            .collect();
        d.sort();
        d
    }

    #[test]
    fn rmcp_is_quiet_unless_named() {
        assert_eq!(directives(None), ["info", "rmcp=warn"]);
        assert_eq!(directives(Some("debug")), ["debug", "rmcp=warn"]);
        assert_eq!(directives(Some("info,rmcp=info")), ["info", "rmcp=info"]);
        assert_eq!(directives(Some("=^=")), ["info", "rmcp=warn"]);
    }
}
