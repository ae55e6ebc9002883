//! The worker's own Prometheus metrics, served on `WORKER_METRICS_ADDR` (off by
//! default): how long the Docker engine takes to create, start and remove task
//! containers, how long tasks run (by runtime), Docker API errors, whether the
//! task firewall is installed and intact (and how often it was repaired), and the worker's identity and slots.
//!
//! What the whole deployment does (queue, outcomes) is the api's `/metrics`,
//! read from Redis; these are what only the worker's host can see. The numbers
//! belong to one worker (its `Sandbox` holds them), so several workers in one
//! process (as in the tests) each report their own.
//!
//! `prometheus-client` keeps and encodes them, in the Prometheus text format
//! (0.0.4) the dashboard's Prometheus has always scraped here.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use prometheus_client::encoding::{EncodeLabelSet, prometheus_text};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use shared::options::Network;

/// Upper bounds (seconds) for Docker call latencies.
const DOCKER_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Upper bounds (seconds) for task run times.
const RUN_BUCKETS: &[f64] = &[
    0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];

/// A Docker engine call, as the metrics name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Op {
    Create,
    Start,
    Remove,
    Attach,
    /// Handing a container its task: the handoff written and taken by its
    /// prelude.
    Handoff,
    /// The exec that reads a container's /workspace size at the end of its
    /// task, where the host cannot (`Sandbox::workspace_bytes`).
    Probe,
}

impl Op {
    const ALL: [Op; 6] = [
        Op::Create,
        Op::Start,
        Op::Remove,
        Op::Attach,
        Op::Handoff,
        Op::Probe,
    ];
    /// The calls whose latency is a histogram of its own (an attach is only
    /// counted when it fails).
    const TIMED: [Op; 5] = [Op::Create, Op::Start, Op::Remove, Op::Handoff, Op::Probe];

    fn as_str(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Start => "start",
            Op::Remove => "remove",
            Op::Attach => "attach",
            Op::Handoff => "handoff",
            Op::Probe => "probe",
        }
    }
}

/// How a task's container came to it, when the worker keeps a warm pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// No idle container fitted: a new one.
    Cold,
    /// An idle pool container.
    Warm,
    /// A pool container that could not start the task (it had died): a new one.
    Fallback,
}

/// What a task got of its owner's dependency cache when it was claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheLend {
    /// The owner's cache, with files from earlier tasks.
    Hit,
    /// The owner's cache, empty (its first task here, or just cleared/evicted).
    Miss,
    /// None: another task of the owner holds it.
    Busy,
}

impl CacheLend {
    const ALL: [CacheLend; 3] = [CacheLend::Hit, CacheLend::Miss, CacheLend::Busy];

    fn label(self) -> &'static str {
        match self {
            CacheLend::Hit => "hit",
            CacheLend::Miss => "miss",
            CacheLend::Busy => "busy",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

impl Claim {
    const ALL: [Claim; 3] = [Claim::Cold, Claim::Warm, Claim::Fallback];

    fn label(self) -> &'static str {
        match self {
            Claim::Cold => "cold",
            Claim::Warm => "warm",
            Claim::Fallback => "fallback",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OpLabel {
    op: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RuntimeLabel {
    runtime: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PoolLabel {
    runtime: String,
    network: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PathLabel {
    path: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct InfoLabels {
    worker: String,
    host: String,
    version: String,
}

/// A family without labels: its one sample shows only once it is set, so a
/// scrape before the worker knows its slots reads no sample rather than a 0.
type Unset = [(&'static str, &'static str); 0];

type RunTimes = Family<RuntimeLabel, Histogram, fn() -> Histogram>;

#[derive(Debug)]
struct Inner {
    registry: Registry,
    latency: BTreeMap<Op, Histogram>,
    errors: Family<OpLabel, Counter>,
    run: RunTimes,
    pool_idle: Family<PoolLabel, Gauge>,
    pool_claims: Family<PathLabel, Counter>,
    info: Family<InfoLabels, Gauge>,
    slots: Family<Unset, Gauge>,
    firewall: Family<Unset, Gauge>,
    firewall_intact: Family<Unset, Gauge>,
    firewall_repairs: Counter,
    specs_rejected: Counter,
    cache_lends: Family<ResultLabel, Counter>,
    cache_evicted_files: Counter,
    cache_evicted_owners: Counter,
    egress: Family<VerdictLabel, Counter>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct VerdictLabel {
    verdict: &'static str,
}

/// One worker's metrics; clones share them.
#[derive(Debug, Clone)]
pub struct Metrics(Arc<Inner>);

impl Default for Metrics {
    fn default() -> Metrics {
        // The registry ends every help text with a period, and a counter's name
        // with `_total`: neither is written here.
        let mut registry = Registry::default();
        let info = Family::default();
        registry.register(
            "script_runner_worker_info",
            "This worker: name, host and version (always 1)",
            info.clone(),
        );
        let slots = Family::default();
        registry.register(
            "script_runner_worker_slots",
            "Tasks this worker runs at once at most (WORKER_CONCURRENCY)",
            slots.clone(),
        );
        let firewall = Family::default();
        registry.register(
            "script_runner_worker_firewall_enabled",
            "1 if the task firewall was installed at start, 0 if TASK_FIREWALL=off",
            firewall.clone(),
        );
        let firewall_intact = Family::default();
        registry.register(
            "script_runner_worker_firewall_intact",
            "1 if the last check found the task firewall's rules and jumps in place (or \
             reinstalled them), 0 if they could not be reinstalled: no task starts then",
            firewall_intact.clone(),
        );
        let firewall_repairs = Counter::default();
        registry.register(
            "script_runner_worker_firewall_repairs",
            "Times a check found the task firewall's rules or jumps missing or altered and \
             reinstalled them",
            firewall_repairs.clone(),
        );
        let specs_rejected = Counter::default();
        registry.register(
            "script_runner_worker_specs_rejected",
            "Tasks refused because their spec's signature did not hold (a record written or \
             changed in Redis by anything but the api); nothing of them ran",
            specs_rejected.clone(),
        );
        let latency = Op::TIMED
            .into_iter()
            .map(|op| {
                let h = Histogram::new(DOCKER_BUCKETS.iter().copied());
                registry.register(
                    format!("script_runner_worker_container_{}_seconds", op.as_str()),
                    format!(
                        "Time the Docker engine took to {} a task container",
                        op.as_str()
                    ),
                    h.clone(),
                );
                (op, h)
            })
            .collect();
        let run: RunTimes =
            Family::new_with_constructor(|| Histogram::new(RUN_BUCKETS.iter().copied()));
        registry.register(
            "script_runner_worker_task_run_seconds",
            "How long task containers ran, from start to exit or kill, by runtime",
            run.clone(),
        );
        let pool_idle = Family::default();
        registry.register(
            "script_runner_worker_pool_idle",
            "Warm pool containers waiting idle for a task, by runtime and network (POOL_SIZE \
             for internet, EGRESS_POOL_SIZE for allow)",
            pool_idle.clone(),
        );
        let pool_claims = Family::default();
        registry.register(
            "script_runner_worker_pool_claims",
            "Tasks started in a warm pool container (warm), a new one (cold), or a new \
             one after the warm one they took could not start them (fallback)",
            pool_claims.clone(),
        );
        let errors = Family::default();
        registry.register(
            "script_runner_worker_docker_errors",
            "Docker API calls that failed, by call",
            errors.clone(),
        );
        let cache_lends = Family::default();
        registry.register(
            "script_runner_worker_cache_lends",
            "Tasks that got their owner's dependency cache with files (hit), empty \
             (miss), or none because another of the owner's tasks held it (busy)",
            cache_lends.clone(),
        );
        let cache_evicted_files = Counter::default();
        registry.register(
            "script_runner_worker_cache_evicted_files",
            "Files removed from owners' dependency caches over CACHE_MB_PER_OWNER",
            cache_evicted_files.clone(),
        );
        let cache_evicted_owners = Counter::default();
        registry.register(
            "script_runner_worker_cache_evicted_owners",
            "Owners' dependency caches removed whole: over CACHE_TOTAL_MB, or cleared",
            cache_evicted_owners.clone(),
        );
        let egress = Family::default();
        registry.register(
            "script_runner_worker_egress_connections",
            "Connections and requests of allow-list tasks through the egress proxy, \
             allowed or refused",
            egress.clone(),
        );
        for verdict in ["allowed", "refused"] {
            let _ = egress.get_or_create(&VerdictLabel { verdict });
        }
        for result in CacheLend::ALL {
            let _ = cache_lends.get_or_create(&ResultLabel {
                result: result.label(),
            });
        }
        // Every path and call shows from the start, at 0: a rate() over a
        // series that appears only at its first increment misses that one.
        for path in Claim::ALL {
            let _ = pool_claims.get_or_create(&PathLabel { path: path.label() });
        }
        for op in Op::ALL {
            let _ = errors.get_or_create(&OpLabel { op: op.as_str() });
        }
        Metrics(Arc::new(Inner {
            registry,
            latency,
            errors,
            run,
            pool_idle,
            pool_claims,
            info,
            slots,
            firewall,
            firewall_intact,
            firewall_repairs,
            specs_rejected,
            cache_lends,
            egress,
            cache_evicted_files,
            cache_evicted_owners,
        }))
    }
}

impl Metrics {
    /// Runs a Docker call, timing it (create, start, remove) and counting its error.
    pub async fn docker<T, E>(
        &self,
        op: Op,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let t = Instant::now();
        let r = call.await;
        if let Some(h) = self.0.latency.get(&op) {
            h.observe(t.elapsed().as_secs_f64());
        }
        if r.is_err() {
            self.0
                .errors
                .get_or_create(&OpLabel { op: op.as_str() })
                .inc();
        }
        r
    }

    /// A task's container ran for `ran` (start to exit or kill).
    pub fn task_ran(&self, runtime: &str, ran: Duration) {
        let runtime = RuntimeLabel {
            runtime: runtime.to_owned(),
        };
        self.0
            .run
            .get_or_create(&runtime)
            .observe(ran.as_secs_f64());
    }

    /// How many warm containers of a runtime on a network wait idle now.
    pub fn set_pool_idle(&self, (runtime, network): &(shared::RuntimeName, Network), idle: usize) {
        let label = PoolLabel {
            runtime: runtime.to_string(),
            network: network.as_str(),
        };
        let idle = i64::try_from(idle).unwrap_or(i64::MAX);
        self.0.pool_idle.get_or_create(&label).set(idle);
    }

    /// Whether a task got its owner's dependency cache, and with files in it.
    pub fn cache_lend(&self, result: CacheLend) {
        let result = ResultLabel {
            result: result.label(),
        };
        self.0.cache_lends.get_or_create(&result).inc();
    }

    pub fn cache_evicted(&self, files: u64, owners: u64) {
        self.0.cache_evicted_files.inc_by(files);
        self.0.cache_evicted_owners.inc_by(owners);
    }

    /// How a task's container came to it (counted when a pool is on).
    pub fn pool_claim(&self, path: Claim) {
        let path = PathLabel { path: path.label() };
        self.0.pool_claims.get_or_create(&path).inc();
    }

    /// One attempt through the egress proxy (`crate::egress`).
    pub fn egress_attempt(&self, allowed: bool) {
        let verdict = if allowed { "allowed" } else { "refused" };
        self.0.egress.get_or_create(&VerdictLabel { verdict }).inc();
    }

    /// Whether the task firewall was installed at start (`TASK_FIREWALL`).
    pub fn set_firewall(&self, installed: bool) {
        self.0.firewall.get_or_create(&[]).set(i64::from(installed));
    }

    /// What the last firewall check found (see `firewall::Firewall::ensure`).
    pub fn set_firewall_intact(&self, intact: bool) {
        self.0
            .firewall_intact
            .get_or_create(&[])
            .set(i64::from(intact));
    }

    /// A check found the firewall missing or altered and reinstalled it.
    pub fn firewall_repaired(&self) {
        self.0.firewall_repairs.inc();
    }

    /// A task's spec did not verify (`shared::spec`): it ended `spec-rejected`.
    pub fn spec_rejected(&self) {
        self.0.specs_rejected.inc();
    }

    pub fn set_identity(&self, worker: &str, host: &str, version: &str, slots: usize) {
        // One sample, whatever was set before.
        self.0.info.clear();
        let labels = InfoLabels {
            worker: worker.to_owned(),
            host: host.to_owned(),
            version: version.to_owned(),
        };
        self.0.info.get_or_create(&labels).set(1);
        let slots = i64::try_from(slots).unwrap_or(i64::MAX);
        self.0.slots.get_or_create(&[]).set(slots);
    }

    /// The Prometheus text exposition of everything above.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_text::encode(&mut out, &self.0.registry)?;
        Ok(out)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("WORKER_METRICS_ADDR {addr}: {error}")]
pub struct ServeError {
    addr: SocketAddr,
    error: std::io::Error,
}

/// Binds `addr` and serves `GET /metrics` there until the handle is aborted.
/// Binding fails at start, so a worker never runs without the metrics asked for.
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
) -> Result<tokio::task::JoinHandle<()>, ServeError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|error| ServeError { addr, error })?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || async move {
            match metrics.render() {
                Ok(text) => (
                    [(header::CONTENT_TYPE, prometheus_text::CONTENT_TYPE)],
                    text,
                )
                    .into_response(),
                Err(e) => {
                    tracing::warn!(error = %e, "worker metrics could not be encoded");
                    StatusCode::INTERNAL_SERVER_ERROR.into_response()
                }
            }
        }),
    );
    tracing::info!(%addr, "serving worker metrics on /metrics");
    Ok(tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "worker metrics server stopped");
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The encoded text, or the test fails.
    fn text(m: &Metrics) -> String {
        m.render().expect("the metrics encode")
    }

    #[test]
    fn histograms_render_cumulative_buckets_sum_and_count() {
        let m = Metrics::default();
        for ran in [
            Duration::from_micros(62_500),
            Duration::from_millis(500),
            Duration::from_secs(4),
        ] {
            m.task_ran("py", ran);
        }
        let out = text(&m);
        // Bounds as Prometheus writes them (`1`, not `1.0`), cumulative counts.
        for line in [
            "script_runner_worker_task_run_seconds_bucket{runtime=\"py\",le=\"0.1\"} 1\n",
            "script_runner_worker_task_run_seconds_bucket{runtime=\"py\",le=\"1\"} 2\n",
            "script_runner_worker_task_run_seconds_bucket{runtime=\"py\",le=\"3600\"} 3\n",
            "script_runner_worker_task_run_seconds_bucket{runtime=\"py\",le=\"+Inf\"} 3\n",
            "script_runner_worker_task_run_seconds_sum{runtime=\"py\"} 4.5625\n",
            "script_runner_worker_task_run_seconds_count{runtime=\"py\"} 3\n",
            "script_runner_worker_container_create_seconds_bucket{le=\"30\"} 0\n\
             script_runner_worker_container_create_seconds_bucket{le=\"+Inf\"} 0\n\
             script_runner_worker_container_create_seconds_sum 0.0\n\
             script_runner_worker_container_create_seconds_count 0\n",
        ] {
            assert!(out.contains(line), "{line:?} not in:\n{out}");
        }
    }

    #[test]
    fn identity_shows_once_set_with_its_label_values_escaped() {
        let m = Metrics::default();
        let before = text(&m);
        assert!(!before.contains("script_runner_worker_slots "), "{before}");
        assert!(!before.contains("script_runner_worker_info{"), "{before}");
        m.set_identity("w\"1", "host\\a", "0.1.0", 4);
        m.set_identity("w1", "host-a", "0.1.0", 4);
        m.set_identity("w\"1", "host\\a", "0.1.0", 2);
        let out = text(&m);
        assert!(out.contains("script_runner_worker_slots 2\n"), "{out}");
        assert!(
            out.contains(
                "script_runner_worker_info{worker=\"w\\\"1\",host=\"host\\\\a\",version=\"0.1.0\"} 1\n"
            ),
            "{out}"
        );
        assert_eq!(
            out.matches("script_runner_worker_info{").count(),
            1,
            "{out}"
        );
    }

    /// Every family the worker serves: name, type and label names. The
    /// dashboard (deploy/grafana) and any alert query these; a rename fails here.
    const FAMILIES: &[(&str, &str, &[&str])] = &[
        (
            "script_runner_worker_info",
            "gauge",
            &["host", "version", "worker"],
        ),
        ("script_runner_worker_slots", "gauge", &[]),
        ("script_runner_worker_firewall_enabled", "gauge", &[]),
        ("script_runner_worker_firewall_intact", "gauge", &[]),
        (
            "script_runner_worker_firewall_repairs_total",
            "counter",
            &[],
        ),
        ("script_runner_worker_specs_rejected_total", "counter", &[]),
        (
            "script_runner_worker_container_create_seconds",
            "histogram",
            &[],
        ),
        (
            "script_runner_worker_container_start_seconds",
            "histogram",
            &[],
        ),
        (
            "script_runner_worker_container_remove_seconds",
            "histogram",
            &[],
        ),
        (
            "script_runner_worker_container_handoff_seconds",
            "histogram",
            &[],
        ),
        (
            "script_runner_worker_container_probe_seconds",
            "histogram",
            &[],
        ),
        (
            "script_runner_worker_task_run_seconds",
            "histogram",
            &["runtime"],
        ),
        (
            "script_runner_worker_pool_idle",
            "gauge",
            &["runtime", "network"],
        ),
        (
            "script_runner_worker_pool_claims_total",
            "counter",
            &["path"],
        ),
        (
            "script_runner_worker_egress_connections_total",
            "counter",
            &["verdict"],
        ),
        (
            "script_runner_worker_docker_errors_total",
            "counter",
            &["op"],
        ),
        (
            "script_runner_worker_cache_lends_total",
            "counter",
            &["result"],
        ),
        (
            "script_runner_worker_cache_evicted_files_total",
            "counter",
            &[],
        ),
        (
            "script_runner_worker_cache_evicted_owners_total",
            "counter",
            &[],
        ),
    ];

    #[tokio::test]
    async fn the_worker_serves_exactly_the_listed_families() {
        let m = Metrics::default();
        m.set_identity("w1", "host-a", "0.1.0", 4);
        m.set_firewall(true);
        m.set_firewall_intact(true);
        m.task_ran("python3.13", Duration::from_millis(1500));
        m.set_pool_idle(
            &(
                shared::RuntimeName::from_stored("python3.13"),
                Network::Allow,
            ),
            2,
        );
        m.pool_claim(Claim::Warm);
        for op in Op::ALL {
            let _ = m.docker(op, async { Ok::<_, ()>(()) }).await;
        }
        let served = testkit::exposition::families(&text(&m));
        assert_eq!(served, testkit::exposition::listed(FAMILIES));
    }

    #[tokio::test]
    async fn docker_calls_are_timed_and_their_errors_counted() {
        let m = Metrics::default();
        let _ = m.docker(Op::Attach, async { Err::<(), _>("boom") }).await;
        let _ = m.docker(Op::Start, async { Ok::<_, ()>(()) }).await;
        let out = text(&m);
        for line in [
            "script_runner_worker_docker_errors_total{op=\"attach\"} 1\n",
            // Every call's series is there before its first error.
            "script_runner_worker_docker_errors_total{op=\"create\"} 0\n",
            "script_runner_worker_pool_claims_total{path=\"fallback\"} 0\n",
            "script_runner_worker_container_start_seconds_count 1\n",
            "# TYPE script_runner_worker_container_start_seconds histogram\n",
            "# TYPE script_runner_worker_docker_errors_total counter\n",
        ] {
            assert!(out.contains(line), "{line:?} not in:\n{out}");
        }
    }
}
