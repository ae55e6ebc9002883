//! `GET /metrics`: Prometheus text exposition of what Redis knows about the whole
//! deployment (every api replica reports the same numbers): jobs queued and
//! running, live workers and their busy slots, tasks submitted and finished by
//! state and reason. Behind the bearer token, like `/mcp`. Since every replica
//! reads the same Redis, scrape one replica (or aggregate with `max`, not `sum`).

use std::fmt::Write as _;
use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::store::{Snapshot, Store};

pub async fn handler(State(store): State<Store>) -> Response {
    let content_type = [(header::CONTENT_TYPE, "text/plain; version=0.0.4")];
    // Bounded like /healthz: a hung Redis must not hold a scrape.
    match tokio::time::timeout(Duration::from_secs(2), store.snapshot()).await {
        Ok(Ok(s)) => (StatusCode::OK, content_type, render(&s)).into_response(),
        failed => {
            let why = match failed {
                Ok(Err(e)) => e.to_string(),
                _ => "Redis did not answer within 2 s".to_owned(),
            };
            tracing::warn!(error = %why, "metrics: Redis unreadable");
            // 200, not 503: Prometheus discards the body of a failed scrape, and
            // this sample is the one worth recording.
            let body = "# HELP script_runner_redis_up Whether this scrape could read Redis.\n\
                        # TYPE script_runner_redis_up gauge\nscript_runner_redis_up 0\n";
            (StatusCode::OK, content_type, body).into_response()
        }
    }
}

fn render(s: &Snapshot) -> String {
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    };
    let plain = |v: u64| vec![(String::new(), v)];
    metric(
        "script_runner_redis_up",
        "gauge",
        "Whether this scrape could read Redis.",
        &plain(1),
    );
    let queued = s.jobs_in_stream.saturating_sub(s.jobs_pending);
    metric(
        "script_runner_jobs_queued",
        "gauge",
        "Jobs waiting for a worker with a free slot.",
        &plain(queued),
    );
    metric(
        "script_runner_jobs_running",
        "gauge",
        "Jobs a worker has read and not yet finished.",
        &plain(s.jobs_pending),
    );
    metric(
        "script_runner_workers_alive",
        "gauge",
        "Workers whose heartbeat is alive.",
        &plain(s.workers.len() as u64),
    );
    let busy: Vec<(String, u64)> = s
        .workers
        .iter()
        .map(|(name, running)| (format!("{{worker=\"{}\"}}", escape(name)), *running))
        .collect();
    metric(
        "script_runner_worker_tasks_running",
        "gauge",
        "Tasks each live worker is running.",
        &busy,
    );
    metric(
        "script_runner_tasks_submitted_total",
        "counter",
        "Tasks accepted by run_script.",
        &plain(s.submitted),
    );
    let finished: Vec<(String, u64)> = s
        .finished
        .iter()
        .map(|((state, kind), n)| {
            (
                format!(
                    "{{state=\"{}\",reason_kind=\"{}\"}}",
                    escape(state),
                    escape(kind)
                ),
                *n,
            )
        })
        .collect();
    metric(
        "script_runner_tasks_finished_total",
        "counter",
        "Tasks that reached a final state, by state and reason kind.",
        &finished,
    );
    out
}

/// Label values may not contain a raw backslash, quote or newline.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn renders_prometheus_text() {
        let s = Snapshot {
            jobs_in_stream: 5,
            jobs_pending: 2,
            workers: BTreeMap::from([("w1".to_owned(), 2)]),
            submitted: 9,
            finished: BTreeMap::from([(("failed".to_owned(), "exited".to_owned()), 4)]),
        };
        let text = render(&s);
        assert!(text.contains("script_runner_jobs_queued 3\n"));
        assert!(text.contains("script_runner_jobs_running 2\n"));
        assert!(text.contains("script_runner_worker_tasks_running{worker=\"w1\"} 2\n"));
        assert!(text.contains(
            "script_runner_tasks_finished_total{state=\"failed\",reason_kind=\"exited\"} 4\n"
        ));
        assert!(text.contains("# TYPE script_runner_tasks_submitted_total counter\nscript_runner_tasks_submitted_total 9\n"));
        assert_eq!(escape("a\"b\\c"), "a\\\"b\\\\c");
    }
}
