//! Forged work never runs: a worker runs only task specs the api signed
//! (`shared::spec`), so a worker host whose Redis password leaked cannot run
//! a command as any owner on the other hosts, whether it writes a record of its
//! own or changes a queued one, and whether or not it has been revoked since.

use std::time::Duration;

use redis::AsyncCommands;
use script_runner_e2e::*;
use serde_json::json;
use shared::keys::JOB_TASK_ID;
use shared::options::{CacheUse, Network};
use shared::{Field, Owner, RuntimeName, TaskRecord, TaskState};

use crate::redis_acl::entrypoint_user_named;

/// A record as an api would write it for `owner`, but unsigned (or carrying
/// `signature`): what a forger with a worker host's password can write.
fn forged_record(owner: &str, command: &str, signature: Option<String>) -> TaskRecord {
    TaskRecord {
        runtime: Some(RuntimeName::from_stored("python3.13")),
        image: Some(runtime_image()),
        command: Some(command.to_owned()),
        timeout_seconds: Some(30),
        has_zip: Some(false),
        has_stdin: Some(false),
        network: Some(Network::Internet),
        cache: Some(CacheUse::Owner),
        stdout_bytes: Some(0),
        stderr_bytes: Some(0),
        owner: Some(Owner::from_stored(owner)),
        spec_signature: signature,
        ..TaskRecord::new(TaskState::Queued)
    }
}

/// Writes `record` as task `id` and appends its job, on `conn` (the forger's).
async fn plant(
    conn: &mut redis::aio::MultiplexedConnection,
    keys: &shared::Keys,
    id: &str,
    record: &TaskRecord,
) {
    let mut hset = redis::cmd("HSET");
    hset.arg(keys.task(id));
    for (f, v) in record.to_fields() {
        hset.arg(f.as_str()).arg(v);
    }
    let _: i64 = hset
        .query_async(conn)
        .await
        .expect("a worker host's user may HSET a task record");
    let _: String = conn
        .xadd(keys.jobs(), "*", &[(JOB_TASK_ID, id)])
        .await
        .expect("a worker host's user may XADD a job");
}

/// `id`'s record as Redis holds it once it has ended.
async fn ended(stack: &Stack, id: &str) -> TaskRecord {
    let key = stack.keys().task(id);
    let conn = stack.redis_conn().await;
    wait_until(
        &format!("task {id} to end"),
        Duration::from_secs(60),
        || {
            let (mut conn, key) = (conn.clone(), key.clone());
            async move {
                let hash: std::collections::HashMap<String, Vec<u8>> =
                    conn.hgetall(key).await.expect("hgetall");
                let record = TaskRecord::from_hash(hash).expect("a readable record")?;
                record.state.is_terminal().then_some(record)
            }
        },
    )
    .await
}

#[tokio::test]
async fn forged_or_altered_records_are_refused_and_never_start_a_container() {
    // No worker yet: everything is planted while the tasks wait, then one
    // honest worker (no warm pool, so any container it creates is a task's)
    // meets them.
    let mut stack = Stack::start(Options {
        start_worker: false,
        ..Options::default()
    })
    .await;
    let keys = stack.keys();
    let client = stack.client().await;

    // Real tasks, submitted through the api and so signed, then changed in Redis.
    let altered = [
        (Field::Command, "echo planted".as_bytes()),
        (Field::Owner, b"alice"),
        (
            Field::Env,
            br#"{"PIP_INDEX_URL":"http://attacker.invalid/"}"#,
        ),
    ];
    let mut real = Vec::new();
    for _ in &altered {
        real.push(run(&client, "python3.13", "echo mine", json!({})).await);
    }
    let copied_signature: Option<String> = stack
        .redis_conn()
        .await
        .hget(keys.task(&real[0]), Field::SpecSignature.as_str())
        .await
        .expect("hget");
    assert!(copied_signature.is_some(), "the api signs what it submits");

    // The forger: a worker host's own Redis user, with the deployment's rules.
    let url = entrypoint_user_named(&stack.redis, "worker", "worker-evil", &stack.prefix).await;
    let mut evil = redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("the worker host's user logs in");
    for ((field, value), id) in altered.iter().zip(&real) {
        let () = evil
            .hset(keys.task(id), field.as_str(), *value)
            .await
            .expect("a worker host's user may HSET a task record");
    }
    // Records of its own: one unsigned, one with a real task's signature.
    let unsigned = uuid::Uuid::new_v4().to_string();
    let resigned = uuid::Uuid::new_v4().to_string();
    let plants = [
        (&unsigned, forged_record("alice", "echo planted", None)),
        (
            &resigned,
            forged_record("alice", "echo planted", copied_signature),
        ),
    ];
    for (id, record) in &plants {
        plant(&mut evil, &keys, id, record).await;
    }
    // Then the host is revoked, as `add-worker.sh --revoke` does: what it
    // planted is still there for the other hosts to meet.
    let mut admin = stack.redis_conn().await;
    let removed: i64 = redis::cmd("ACL")
        .arg("DELUSER")
        .arg("worker-evil")
        .query_async(&mut admin)
        .await
        .expect("ACL DELUSER");
    assert_eq!(removed, 1);

    let since = docker_now();
    let metrics_port = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    stack
        .start_worker(
            "honest",
            &[
                ("POOL_SIZE", "0"),
                ("EGRESS_POOL_SIZE", "0"),
                ("WORKER_METRICS_ADDR", &metrics_addr),
            ],
        )
        .await;
    let worker = stack.worker("honest");
    let refused: Vec<&String> = real.iter().chain([&unsigned, &resigned]).collect();
    for id in &refused {
        let r = ended(&stack, id).await;
        assert_eq!(
            (r.state, r.reason_kind.map(|k| k.as_str())),
            (TaskState::Failed, Some("spec-rejected")),
            "{id}: {r:?}"
        );
        let reason = r.reason.unwrap_or_default();
        assert!(reason.contains("signed"), "{id}: {reason}");
        assert_eq!(r.started_at, None, "{id} never started");
        assert_eq!(r.stdout_bytes, Some(0), "{id} printed nothing");
        assert_eq!(r.usage_cpu_ms, None, "{id} used nothing");
    }
    assert_eq!(
        containers_created(&worker, &since),
        Vec::<String>::new(),
        "no container was created for any of them"
    );

    // Each refusal is counted where ops watch.
    let page = worker_metrics(metrics_port).await;
    let rejected = exposition::read(&page).count("script_runner_worker_specs_rejected_total", &[]);
    assert_eq!(rejected, Some(refused.len() as u64), "{page}");

    // Nothing was counted to the owner the forged records name.
    let alice_usage: std::collections::HashMap<String, String> = admin
        .hgetall(keys.owner_usage("alice"))
        .await
        .expect("hgetall");
    assert!(alice_usage.is_empty(), "{alice_usage:?}");

    // And what the api signs still runs, on the same worker.
    let ok = run_to_end(&client, "python3.13", "echo mine", json!({})).await;
    assert_eq!(
        (ok["state"].as_str(), ok["stdout_tail"].as_str()),
        (Some("succeeded"), Some("mine\n")),
        "{ok}"
    );
    stack.shutdown().await;
}
