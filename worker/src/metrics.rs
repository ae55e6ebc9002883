//! The worker's own Prometheus metrics, served on `WORKER_METRICS_ADDR` (off by
//! default): how long the Docker engine takes to create, start and remove task
//! containers, how long tasks run (by runtime), Docker API errors, whether the
//! task firewall is installed, and the worker's identity and slots.
//!
//! What the whole deployment does (queue, outcomes) is the api's `/metrics`,
//! read from Redis; these are what only the worker's host can see. The numbers
//! belong to one worker (its `Sandbox` holds them), so several workers in one
//! process (as in the tests) each report their own.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

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
    /// Handing a warm pool container its task (create and start the process).
    Exec,
}

impl Op {
    const ALL: [Op; 5] = [Op::Create, Op::Start, Op::Remove, Op::Attach, Op::Exec];

    fn as_str(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Start => "start",
            Op::Remove => "remove",
            Op::Attach => "attach",
            Op::Exec => "exec",
        }
    }
}

#[derive(Debug, Clone)]
struct Histogram {
    bounds: &'static [f64],
    /// Observations at or below each bound (not cumulative; summed when rendered).
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|b| s <= *b) {
            self.counts[i] += 1;
        }
        self.sum += s;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (bound, n) in self.bounds.iter().zip(&self.counts) {
            cumulative += n;
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}"
            );
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}",
            self.count
        );
        let braces = |l: &str| {
            if l.is_empty() {
                String::new()
            } else {
                format!("{{{l}}}")
            }
        };
        let _ = writeln!(out, "{name}_sum{} {}", braces(labels), self.sum);
        let _ = writeln!(out, "{name}_count{} {}", braces(labels), self.count);
    }
}

/// How a task's container came to it, when the worker keeps a warm pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// No idle container fitted: a new one.
    Cold = 0,
    /// An idle pool container.
    Warm = 1,
    /// A pool container that could not start the task (it had died): a new one.
    Fallback = 2,
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

#[derive(Debug, Clone)]
struct Registry {
    latency: BTreeMap<Op, Histogram>,
    errors: BTreeMap<Op, u64>,
    run: BTreeMap<String, Histogram>,
    firewall: Option<bool>,
    identity: Option<Identity>,
    /// Idle warm containers by runtime, and tasks by how they started.
    pool_idle: BTreeMap<String, usize>,
    pool_claims: [u64; 3],
}

#[derive(Debug, Clone)]
struct Identity {
    worker: String,
    host: String,
    version: String,
    slots: usize,
}

/// One worker's metrics; clones share them.
#[derive(Debug, Clone)]
pub struct Metrics(Arc<Mutex<Registry>>);

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics(Arc::new(Mutex::new(Registry {
            latency: [Op::Create, Op::Start, Op::Remove, Op::Exec]
                .into_iter()
                .map(|op| (op, Histogram::new(DOCKER_BUCKETS)))
                .collect(),
            errors: Op::ALL.into_iter().map(|op| (op, 0)).collect(),
            run: BTreeMap::new(),
            firewall: None,
            identity: None,
            pool_idle: BTreeMap::new(),
            pool_claims: [0; 3],
        })))
    }
}

impl Metrics {
    /// Only ever held for an update or a render, never across an await.
    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs a Docker call, timing it (create, start, remove) and counting its error.
    pub async fn docker<T, E>(
        &self,
        op: Op,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let t = Instant::now();
        let r = call.await;
        let took = t.elapsed();
        let mut m = self.registry();
        if let Some(h) = m.latency.get_mut(&op) {
            h.observe(took);
        }
        if r.is_err() {
            *m.errors.entry(op).or_default() += 1;
        }
        r
    }

    /// A task's container ran for `ran` (start to exit or kill).
    pub fn task_ran(&self, runtime: &str, ran: Duration) {
        self.registry()
            .run
            .entry(runtime.to_owned())
            .or_insert_with(|| Histogram::new(RUN_BUCKETS))
            .observe(ran);
    }

    /// How many warm containers of `runtime` wait idle now.
    pub fn set_pool_idle(&self, runtime: &str, idle: usize) {
        self.registry().pool_idle.insert(runtime.to_owned(), idle);
    }

    /// How a task's container came to it (counted when a pool is on).
    pub fn pool_claim(&self, path: Claim) {
        self.registry().pool_claims[path as usize] += 1;
    }

    /// Whether the task firewall was installed at start (`TASK_FIREWALL`).
    pub fn set_firewall(&self, installed: bool) {
        self.registry().firewall = Some(installed);
    }

    pub fn set_identity(&self, worker: &str, host: &str, version: &str, slots: usize) {
        self.registry().identity = Some(Identity {
            worker: worker.to_owned(),
            host: host.to_owned(),
            version: version.to_owned(),
            slots,
        });
    }

    /// The Prometheus text exposition of everything above.
    pub fn render(&self) -> String {
        let m = self.registry().clone();
        let mut out = String::new();
        let head = |out: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        if let Some(id) = &m.identity {
            head(
                &mut out,
                "script_runner_worker_info",
                "gauge",
                "This worker: name, host and version (always 1).",
            );
            let _ = writeln!(
                out,
                "script_runner_worker_info{{worker=\"{}\",host=\"{}\",version=\"{}\"}} 1",
                escape(&id.worker),
                escape(&id.host),
                escape(&id.version)
            );
            head(
                &mut out,
                "script_runner_worker_slots",
                "gauge",
                "Tasks this worker runs at once at most (WORKER_CONCURRENCY).",
            );
            let _ = writeln!(out, "script_runner_worker_slots {}", id.slots);
        }
        if let Some(on) = m.firewall {
            head(
                &mut out,
                "script_runner_worker_firewall_enabled",
                "gauge",
                "1 if the task firewall was installed at start, 0 if TASK_FIREWALL=off.",
            );
            let _ = writeln!(
                out,
                "script_runner_worker_firewall_enabled {}",
                u8::from(on)
            );
        }
        for (op, h) in &m.latency {
            let name = format!("script_runner_worker_container_{}_seconds", op.as_str());
            head(
                &mut out,
                &name,
                "histogram",
                &format!(
                    "Time the Docker engine took to {} a task container.",
                    op.as_str()
                ),
            );
            h.render(&mut out, &name, "");
        }
        let run = "script_runner_worker_task_run_seconds";
        head(
            &mut out,
            run,
            "histogram",
            "How long task containers ran, from start to exit or kill, by runtime.",
        );
        for (runtime, h) in &m.run {
            h.render(&mut out, run, &format!("runtime=\"{}\"", escape(runtime)));
        }
        let idle = "script_runner_worker_pool_idle";
        head(
            &mut out,
            idle,
            "gauge",
            "Warm pool containers waiting idle for a task, by runtime (POOL_SIZE).",
        );
        for (runtime, n) in &m.pool_idle {
            let _ = writeln!(out, "{idle}{{runtime=\"{}\"}} {n}", escape(runtime));
        }
        let claims = "script_runner_worker_pool_claims_total";
        head(
            &mut out,
            claims,
            "counter",
            "Tasks started in a warm pool container (warm), a new one (cold), or a new \
             one after the warm one they took could not start them (fallback).",
        );
        for (path, n) in Claim::ALL.iter().map(|c| c.label()).zip(m.pool_claims) {
            let _ = writeln!(out, "{claims}{{path=\"{path}\"}} {n}");
        }
        let errors = "script_runner_worker_docker_errors_total";
        head(
            &mut out,
            errors,
            "counter",
            "Docker API calls that failed, by call.",
        );
        for (op, n) in &m.errors {
            let _ = writeln!(out, "{errors}{{op=\"{}\"}} {n}", op.as_str());
        }
        out
    }
}

/// Label values may not contain a raw backslash, quote or newline.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
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
            (
                [(
                    axum::http::header::CONTENT_TYPE,
                    "text/plain; version=0.0.4",
                )],
                metrics.render(),
            )
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

    #[test]
    fn histograms_render_cumulative_buckets_sum_and_count() {
        let mut h = Histogram::new(&[0.1, 1.0]);
        h.observe(Duration::from_micros(62_500));
        h.observe(Duration::from_millis(500));
        h.observe(Duration::from_secs(4));
        let mut out = String::new();
        h.render(&mut out, "x", "runtime=\"py\"");
        assert!(
            out.contains("x_bucket{runtime=\"py\",le=\"0.1\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("x_bucket{runtime=\"py\",le=\"1\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("x_bucket{runtime=\"py\",le=\"+Inf\"} 3\n"),
            "{out}"
        );
        assert!(out.contains("x_sum{runtime=\"py\"} 4.5625\n"), "{out}");
        assert!(out.contains("x_count{runtime=\"py\"} 3\n"), "{out}");
        let mut bare = String::new();
        Histogram::new(&[1.0]).render(&mut bare, "y", "");
        assert!(
            bare.contains("y_bucket{le=\"1\"} 0\ny_bucket{le=\"+Inf\"} 0\ny_sum 0\ny_count 0\n"),
            "{bare}"
        );
    }

    #[tokio::test]
    async fn docker_calls_are_timed_and_their_errors_counted() {
        let m = Metrics::default();
        let _ = m.docker(Op::Attach, async { Err::<(), _>("boom") }).await;
        let _ = m.docker(Op::Start, async { Ok::<_, ()>(()) }).await;
        let text = m.render();
        assert!(text.contains("script_runner_worker_docker_errors_total{op=\"attach\"} 1\n"));
        assert!(text.contains("script_runner_worker_container_start_seconds_count 1\n"));
        assert!(text.contains("script_runner_worker_docker_errors_total{op=\"attach\"}"));
        assert!(text.contains("# TYPE script_runner_worker_container_start_seconds histogram"));
    }
}
