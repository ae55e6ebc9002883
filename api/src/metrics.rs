//! `GET /metrics`: Prometheus text exposition of what Redis knows about the whole
//! deployment (every api replica reports the same numbers): jobs queued and
//! running, live workers and their busy slots, tasks submitted and finished by
//! state and reason. Behind the bearer token, like `/mcp`. Since every replica
//! reads the same Redis, scrape one replica (or aggregate with `max`, not `sum`).

use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, prometheus_text};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use shared::usage::OwnerTotals;
use store::usage::UsageTotals;

use crate::db::{Snapshot, Store};

pub async fn handler(State(store): State<Store>) -> Response {
    // Bounded like /healthz: a hung Redis must not hold a scrape.
    let read = match tokio::time::timeout(Duration::from_secs(2), store.snapshot()).await {
        Ok(Ok(s)) => Some(s),
        failed => {
            let why = match failed {
                Ok(Err(e)) => e.to_string(),
                _ => "Redis did not answer within 2 s".to_owned(),
            };
            tracing::warn!(error = %why, "metrics: Redis unreadable");
            // Still a 200, not 503: Prometheus discards the body of a failed
            // scrape, and `script_runner_redis_up 0` is the sample worth recording.
            None
        }
    };
    match render(read) {
        Ok(text) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, prometheus_text::CONTENT_TYPE)],
            text,
        )
            .into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "metrics could not be encoded");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// The exposition of one scrape: what Redis held (`None`: it could not be read).
fn render(read: Option<Snapshot>) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape(read)));
    let mut text = String::new();
    prometheus_text::encode(&mut text, &registry)?;
    Ok(text)
}

/// The numbers live in Redis, not in this process (every replica reports the
/// same), so they are read once per scrape and encoded as constants: the
/// totals Redis keeps are counters, the rest gauges.
#[derive(Debug)]
struct Scrape(Option<Snapshot>);

impl Collector for Scrape {
    fn encode(&self, mut out: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let up = u64::from(self.0.is_some());
        gauge(
            &mut out,
            "script_runner_redis_up",
            "Whether this scrape could read Redis.",
            up,
        )?;
        let Some(s) = &self.0 else {
            return Ok(());
        };
        let queued = s.jobs_in_stream.saturating_sub(s.jobs_pending);
        gauge(
            &mut out,
            "script_runner_jobs_queued",
            "Jobs waiting for a worker with a free slot.",
            queued,
        )?;
        gauge(
            &mut out,
            "script_runner_jobs_running",
            "Jobs a worker has read and not yet finished.",
            s.jobs_pending,
        )?;
        gauge(
            &mut out,
            "script_runner_workers_alive",
            "Workers whose heartbeat is alive.",
            s.workers.len() as u64,
        )?;
        let mut busy = out.encode_descriptor(
            "script_runner_worker_tasks_running",
            "Tasks each live worker is running.",
            None,
            MetricType::Gauge,
        )?;
        for (worker, running) in &s.workers {
            let labels = [("worker", worker.as_str())];
            ConstGauge::new(*running).encode(busy.encode_family(&labels)?)?;
        }
        // A counter's name goes without `_total`: the encoder appends it.
        let submitted = out.encode_descriptor(
            "script_runner_tasks_submitted",
            "Tasks accepted by run_script.",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(s.submitted).encode(submitted)?;
        let mut finished = out.encode_descriptor(
            "script_runner_tasks_finished",
            "Tasks that reached a final state, by state and reason kind.",
            None,
            MetricType::Counter,
        )?;
        for ((state, kind), n) in &s.finished {
            let labels = [("state", state.as_str()), ("reason_kind", kind.as_str())];
            ConstCounter::new(*n).encode(finished.encode_family(&labels)?)?;
        }
        owners(&mut out, &s.usage)
    }
}

/// The label of the owners past the `METRICS_OWNERS` heaviest: in
/// parentheses, so no key name can be mistaken for it.
pub const OTHER_OWNERS: &str = "(other)";

/// One whole-number figure of an owner's totals.
type Figure = fn(&OwnerTotals) -> u64;

/// Per-owner usage totals, labelled by owner: the heaviest `METRICS_OWNERS`
/// by CPU by name, the rest summed as `OTHER_OWNERS`. Gauges, not counters:
/// an owner moving into the named ones leaves `(other)`, which then drops.
fn owners(out: &mut DescriptorEncoder, u: &UsageTotals) -> Result<(), std::fmt::Error> {
    let rest = u.rest();
    let mut series: Vec<(&str, &OwnerTotals)> =
        u.owners.iter().map(|(o, t)| (o.as_str(), t)).collect();
    if u.owner_count > u.owners.len() as u64 {
        series.push((OTHER_OWNERS, &rest));
    }
    let mut cpu = out.encode_descriptor(
        "script_runner_owner_cpu_seconds",
        "CPU seconds an owner's tasks used, as their containers' cgroups reported at the end.",
        None,
        MetricType::Gauge,
    )?;
    for (owner, t) in &series {
        let labels = [("owner", *owner)];
        ConstGauge::new(t.cpu_ms as f64 / 1000.0).encode(cpu.encode_family(&labels)?)?;
    }
    let counts: [(&str, &str, Figure); 3] = [
        (
            "script_runner_owner_tasks",
            "Tasks of an owner (API key name, or oauth:<subject>) that ended with their usage \
             recorded; the owners past the 100 heaviest by CPU as owner=\"(other)\".",
            |t| t.tasks,
        ),
        (
            "script_runner_owner_peak_memory_bytes",
            "The highest peak memory of any one of an owner's tasks.",
            |t| t.peak_memory_bytes,
        ),
        (
            "script_runner_owner_workspace_bytes",
            "Bytes in /workspace at the end of an owner's tasks, summed.",
            |t| t.workspace_bytes,
        ),
    ];
    for (name, help, value) in counts {
        let mut family = out.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (owner, t) in &series {
            let labels = [("owner", *owner)];
            let v = i64::try_from(value(t)).unwrap_or(i64::MAX);
            ConstGauge::new(v).encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

fn gauge(
    out: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    ConstGauge::new(value).encode(out.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Every family the api serves: name, type and label names. The dashboard
    /// (deploy/grafana) and any alert query these; a rename fails here.
    const FAMILIES: &[(&str, &str, &[&str])] = &[
        ("script_runner_redis_up", "gauge", &[]),
        ("script_runner_jobs_queued", "gauge", &[]),
        ("script_runner_jobs_running", "gauge", &[]),
        ("script_runner_workers_alive", "gauge", &[]),
        ("script_runner_worker_tasks_running", "gauge", &["worker"]),
        ("script_runner_tasks_submitted_total", "counter", &[]),
        (
            "script_runner_tasks_finished_total",
            "counter",
            &["reason_kind", "state"],
        ),
        ("script_runner_owner_tasks", "gauge", &["owner"]),
        ("script_runner_owner_cpu_seconds", "gauge", &["owner"]),
        ("script_runner_owner_peak_memory_bytes", "gauge", &["owner"]),
        ("script_runner_owner_workspace_bytes", "gauge", &["owner"]),
    ];

    fn text(read: Option<Snapshot>) -> String {
        render(read).expect("the metrics encode")
    }

    #[test]
    fn the_api_serves_exactly_the_listed_families() {
        let s = Snapshot {
            jobs_in_stream: 1,
            jobs_pending: 0,
            workers: BTreeMap::from([("w1".to_owned(), 0)]),
            submitted: 1,
            finished: BTreeMap::from([(("succeeded".to_owned(), "exited".to_owned()), 1)]),
            usage: UsageTotals {
                owners: vec![("alice".to_owned(), OwnerTotals::default())],
                owner_count: 1,
                all: OwnerTotals::default(),
            },
        };
        let served = testkit::exposition::families(&text(Some(s)));
        assert_eq!(served, testkit::exposition::listed(FAMILIES));
    }

    #[test]
    fn renders_prometheus_text_as_before() {
        let s = Snapshot {
            jobs_in_stream: 5,
            jobs_pending: 2,
            workers: BTreeMap::from([("w\"1".to_owned(), 2)]),
            submitted: 9,
            finished: BTreeMap::from([(("failed".to_owned(), "exit\\ed".to_owned()), 4)]),
            usage: UsageTotals {
                owners: vec![(
                    "oauth:a\"b".to_owned(),
                    OwnerTotals {
                        tasks: 2,
                        cpu_ms: 2500,
                        peak_memory_bytes: 7,
                        workspace_bytes: 8,
                    },
                )],
                owner_count: 3,
                all: OwnerTotals {
                    tasks: 5,
                    cpu_ms: 3000,
                    peak_memory_bytes: 9,
                    workspace_bytes: 10,
                },
            },
        };
        let text = text(Some(s));
        for line in [
            "# HELP script_runner_redis_up Whether this scrape could read Redis.\n\
             # TYPE script_runner_redis_up gauge\nscript_runner_redis_up 1\n",
            "script_runner_jobs_queued 3\n",
            "script_runner_jobs_running 2\n",
            // Label values escaped.
            "script_runner_worker_tasks_running{worker=\"w\\\"1\"} 2\n",
            "script_runner_tasks_finished_total{state=\"failed\",reason_kind=\"exit\\\\ed\"} 4\n",
            // Owners by name, the rest (two more owners) as one series.
            "script_runner_owner_cpu_seconds{owner=\"oauth:a\\\"b\"} 2.5\n",
            "script_runner_owner_cpu_seconds{owner=\"(other)\"} 0.5\n",
            "script_runner_owner_tasks{owner=\"(other)\"} 3\n",
            "script_runner_owner_peak_memory_bytes{owner=\"(other)\"} 9\n",
            "script_runner_owner_workspace_bytes{owner=\"(other)\"} 2\n",
            "# HELP script_runner_tasks_submitted_total Tasks accepted by run_script.\n\
             # TYPE script_runner_tasks_submitted_total counter\n\
             script_runner_tasks_submitted_total 9\n",
        ] {
            assert!(text.contains(line), "{line:?} not in:\n{text}");
        }
    }

    #[test]
    fn an_unreadable_redis_is_one_sample() {
        assert_eq!(
            text(None),
            "# HELP script_runner_redis_up Whether this scrape could read Redis.\n\
             # TYPE script_runner_redis_up gauge\nscript_runner_redis_up 0\n"
        );
    }
}
