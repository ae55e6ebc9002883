//! What operators watch: the metrics a real api and worker serve (behind the
//! metrics token), the Grafana dashboard's queries against them, and per-owner
//! usage in the metrics and the ctl.

use std::collections::BTreeSet;
use std::time::Duration;

use redis::AsyncCommands;
use script_runner_e2e::*;
use serde_json::{Value, json};

use super::*;
/// The api's /metrics (moved here from the api's edge tests: it needs a worker
/// running tasks).
#[tokio::test]
async fn metrics_report_the_queue_the_workers_and_every_outcome_behind_the_token() {
    let stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    run_to_end(&client, "python3.13", "true", json!({})).await;
    run_to_end(&client, "python3.13", "exit 3", json!({})).await;
    let sleeper = start_sleeper(&client, "up").await;
    call_ok(&client, "kill_task", json!({ "task_id": sleeper })).await;

    let url = format!("{}/metrics", stack.url);
    let anonymous = reqwest::get(&url).await.expect("metrics");
    assert_eq!(anonymous.status(), 401);
    let http = reqwest::Client::new();
    // The idle count must come from a heartbeat written after the work ended,
    // not one left from before it started: drop the current one and wait for
    // the next (the worker is absent from the metrics until it comes).
    wait_until(
        "the kill to be recorded",
        Duration::from_secs(30),
        || async {
            let s = call_ok(&client, "get_task_status", json!({ "task_id": sleeper })).await;
            (s["state"] == "killed").then_some(())
        },
    )
    .await;
    stack.drop_heartbeat("main").await;
    let text = wait_until("the metrics to show every outcome and an idle worker", Duration::from_secs(30), || async {
        let resp = http.get(&url).header("authorization", format!("Bearer {TOKEN}")).send().await.ok()?;
        let text = resp.text().await.ok()?;
        (text.contains("script_runner_tasks_finished_total{state=\"killed\",reason_kind=\"killed-by-user\"} 1\n")
            && text.contains(&format!("script_runner_worker_tasks_running{{worker=\"{}\"}} 0\n", stack.worker_name)))
        .then_some(text)
    })
    .await;
    for line in [
        "script_runner_redis_up 1\n",
        "script_runner_tasks_submitted_total 3\n",
        "script_runner_tasks_finished_total{state=\"succeeded\",reason_kind=\"exited\"} 1\n",
        "script_runner_tasks_finished_total{state=\"failed\",reason_kind=\"exited\"} 1\n",
        "script_runner_workers_alive 1\n",
        "script_runner_jobs_queued 0\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
    stack.shutdown().await;
}

/// Every metric name a PromQL expression names (`script_runner_...`).
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("script_runner_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

#[tokio::test]
async fn the_dashboard_queries_only_metrics_a_real_api_and_worker_serve() {
    let metrics_port = free_port();
    let mut options = ops_options(metrics_port);
    // Cold starts only, so each count below is exactly the two tasks' (the pool's
    // own metrics are checked in e2e/tests/pool.rs).
    options.extra_env.push(("POOL_SIZE", "0".to_owned()));
    options.extra_env.push(("EGRESS_POOL_SIZE", "0".to_owned()));
    let stack = Stack::start(options).await;
    let client = stack.client().await;
    run_to_end(&client, "python3.13", "echo hi", json!({})).await;
    run_to_end(&client, "python3.13", "exit 1", json!({})).await;

    let api = scrape_until(
        "the api's metrics to show a finished task",
        format!("{}/metrics", stack.url),
        Some(TOKEN),
        "script_runner_tasks_finished_total{",
    )
    .await;
    // Containers are removed after their task is recorded: wait for both.
    let worker = scrape_until(
        "the worker's metrics to show both removals",
        format!("http://127.0.0.1:{metrics_port}/metrics"),
        None,
        "script_runner_worker_container_remove_seconds_count 2\n",
    )
    .await;
    check_worker_saw_two_tasks(&worker, &stack.worker_name);

    let served: BTreeSet<String> = exposition::read(&api)
        .sample_names()
        .into_iter()
        .chain(exposition::read(&worker).sample_names())
        .collect();
    let queried = dashboard_queries(&served);
    // The list: queue depth, running, throughput by state, latencies, workers alive.
    for must in [
        "script_runner_jobs_queued",
        "script_runner_jobs_running",
        "script_runner_tasks_finished_total",
        "script_runner_workers_alive",
        "script_runner_worker_container_start_seconds_bucket",
        "script_runner_worker_task_run_seconds_bucket",
    ] {
        assert!(queried.contains(must), "the dashboard does not show {must}");
    }
    stack.shutdown().await;
}

/// `url`'s metrics once they contain `want` (a 200 every time).
async fn scrape_until(what: &str, url: String, token: Option<&str>, want: &str) -> String {
    let http = reqwest::Client::new();
    wait_until(what, Duration::from_secs(30), || async {
        let mut request = http.get(&url);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let r = request.send().await.ok()?;
        assert_eq!(r.status(), 200, "{url}");
        let text = r.text().await.ok()?;
        text.contains(want).then_some(text)
    })
    .await
}

/// What the worker saw of its own work: exactly the two tasks run here, and its
/// identity and firewall.
fn check_worker_saw_two_tasks(worker: &str, worker_name: &str) {
    for want in [
        "script_runner_worker_task_run_seconds_count{runtime=\"python3.13\"}",
        "script_runner_worker_container_create_seconds_count",
        "script_runner_worker_container_start_seconds_count",
        "script_runner_worker_container_remove_seconds_count",
        "script_runner_worker_docker_errors_total{op=\"create\"}",
        "script_runner_worker_slots 2\n",
        &format!("script_runner_worker_info{{worker=\"{worker_name}\""),
    ] {
        assert!(
            worker.contains(want),
            "{want:?} not in the worker's metrics:\n{worker}"
        );
    }
    // The stack's workers install the firewall (the default).
    assert!(
        worker.contains("script_runner_worker_firewall_enabled 1\n"),
        "{worker}"
    );
    let served = exposition::read(worker);
    for (name, labels) in [
        (
            "script_runner_worker_task_run_seconds_count",
            &[("runtime", "python3.13")][..],
        ),
        ("script_runner_worker_container_create_seconds_count", &[]),
        ("script_runner_worker_container_start_seconds_count", &[]),
        ("script_runner_worker_container_remove_seconds_count", &[]),
    ] {
        assert_eq!(
            served.count(name, labels),
            Some(2),
            "{name}{labels:?} in:\n{worker}"
        );
    }
}

/// Every metric the dashboard's panels query, after checking each panel is laid
/// out, uses a provisioned datasource, and queries only metrics in `served`.
fn dashboard_queries(served: &BTreeSet<String>) -> BTreeSet<String> {
    let raw = std::fs::read_to_string(repo_path("deploy/grafana/dashboards/script-runner.json"))
        .expect("dashboard file");
    let dash: Value = serde_json::from_str(&raw).expect("the dashboard is valid JSON");
    assert_eq!(dash["uid"], "script-runner");
    let datasources = std::fs::read_to_string(repo_path(
        "deploy/grafana/provisioning/datasources/prometheus.yml",
    ))
    .expect("datasource provisioning");
    let mut ids = BTreeSet::new();
    let mut queried = BTreeSet::new();
    for p in dash["panels"].as_array().expect("panels") {
        let title = p["title"].as_str().expect("every panel has a title");
        assert!(
            ids.insert(p["id"].as_u64().expect("panel id")),
            "duplicate id at {title}"
        );
        for k in ["x", "y", "w", "h"] {
            assert!(p["gridPos"][k].is_u64(), "{title}: gridPos.{k}");
        }
        if p["type"] == "row" {
            continue;
        }
        let uid = p["datasource"]["uid"].as_str().expect("datasource uid");
        assert!(
            datasources.contains(&format!("uid: {uid}")),
            "{title}: datasource {uid} is not provisioned"
        );
        let targets = p["targets"].as_array().filter(|t| !t.is_empty());
        for t in targets.unwrap_or_else(|| panic!("{title} has no query")) {
            let expr = t["expr"].as_str().expect("expr");
            let names = metric_names(expr);
            assert!(
                !names.is_empty(),
                "{title}: {expr} queries no script-runner metric"
            );
            for name in names {
                assert!(
                    served.contains(&name),
                    "{title}: {name} is served by neither the api nor the worker"
                );
                queried.insert(name);
            }
        }
    }
    queried
}

/// Per-owner usage totals, end to end: tasks whose records carry an owner (as
/// the api's SUBMIT writes it for an API key; set here by hand before any
/// worker runs them, the api side being another part of issue 18) are counted
/// by the worker's FINISH, and `/metrics` and `script-runner-ctl usage` show
/// each owner's totals; the admin key's task (no owner) counts for nobody.
#[tokio::test]
async fn per_owner_usage_totals_show_in_metrics_and_the_ctl() {
    let mut stack = Stack::start(Options {
        start_worker: false,
        ..Options::default()
    })
    .await;
    let client = stack.client().await;
    let burn = "python3 -c \"import time\nwhile time.process_time() < 0.5: pass\"";
    let alice = [
        run(&client, "python3.13", burn, json!({})).await,
        run(
            &client,
            "python3.13",
            "head -c 1048576 /dev/zero > /workspace/f",
            json!({}),
        )
        .await,
    ];
    let bob = run(&client, "python3.13", "true", json!({})).await;
    let admin = run(&client, "python3.13", "true", json!({})).await;
    let keys = stack.keys();
    let mut r = stack.redis_conn().await;
    // The test stands in for an api that submitted them for these owners: it
    // changes the owner and signs the spec again with the test stack's key.
    let signer = shared::spec::SpecSigner::from_base64(testkit::SIGNING_KEY).expect("test key");
    for (id, owner) in [
        (&alice[0], "alice"),
        (&alice[1], "alice"),
        (&bob, "oauth:bob"),
    ] {
        let () = r
            .hset(keys.task(id), "owner", owner)
            .await
            .expect("hset owner");
        let hash: std::collections::HashMap<String, Vec<u8>> =
            r.hgetall(keys.task(id)).await.expect("hgetall");
        let stored = hash
            .iter()
            .filter_map(|(k, v)| k.parse::<shared::Field>().ok().map(|f| (f, v)));
        let signature = signer.sign(&shared::spec::message(id, stored, &Default::default()));
        let () = r
            .hset(keys.task(id), "spec_signature", signature)
            .await
            .expect("hset spec_signature");
    }
    stack.start_worker("main", &[]).await;
    for id in alice.iter().chain([&bob, &admin]) {
        wait_status(
            &client,
            id,
            "the task to end",
            Duration::from_secs(60),
            is_final,
        )
        .await;
    }

    let text = scrape_until(
        "the metrics to show both owners",
        format!("{}/metrics", stack.url),
        Some(TOKEN),
        "script_runner_owner_tasks{owner=\"oauth:bob\"} 1\n",
    )
    .await;
    assert!(
        text.contains("script_runner_owner_tasks{owner=\"alice\"} 2\n"),
        "{text}"
    );
    assert!(
        !text.contains("{owner=\"(other)\"}"),
        "every owner is named: {text}"
    );
    let served = exposition::read(&text);
    let cpu = |owner: &str| {
        served
            .value("script_runner_owner_cpu_seconds", &[("owner", owner)])
            .unwrap_or(-1.0)
    };
    assert!((0.5..2.0).contains(&cpu("alice")), "{text}");
    assert!(cpu("oauth:bob") < cpu("alice"), "{text}");

    let report = ctl_json(&stack, &["--json", "usage"]).await;
    let owners: Vec<&str> = report["owners"]
        .as_array()
        .map(|o| o.iter().filter_map(|u| u["owner"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(owners, ["alice", "oauth:bob"], "heaviest first: {report}");
    assert_eq!(
        report["all"]["tasks"], 3,
        "the admin key's task is nobody's: {report}"
    );
    assert!(
        report["owners"][0]["workspace_bytes"].as_u64() >= Some(1 << 20),
        "{report}"
    );
    let text = ctl(&stack, &["usage"]).await;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("alice") && text.contains("(all)"), "{text}");
    // The ledger the CPU quota reads: one entry per task of hers.
    let ledger: Vec<String> = r
        .zrange(keys.owner_cpu("alice"), 0, -1)
        .await
        .expect("zrange");
    assert_eq!(ledger.len(), 2, "{ledger:?}");
    stack.shutdown().await;
}
