//! Crash recovery with real processes: a worker is SIGKILLed mid-task, and either
//! comes back under its name or is replaced by another worker's reaper; a worker
//! stops on SIGTERM; Redis goes away mid-task. No task is lost, every in-flight
//! task gets a final state, and no container is left behind.

use std::time::Duration;

use redis::AsyncCommands;
use script_runner_e2e::*;
use serde_json::json;

fn without_worker() -> Options {
    Options {
        start_worker: false,
        ..Options::default()
    }
}

#[tokio::test]
async fn a_lost_worker_s_tasks_are_settled_by_another_worker_and_none_is_lost() {
    let mut stack = Stack::start(without_worker()).await;
    let client = stack.client().await;
    let fast_heartbeat = [
        ("WORKER_HEARTBEAT_SECONDS", "1"),
        ("WORKER_CONCURRENCY", "1"),
    ];
    let mut doomed = stack.spawn_worker_process("doomed", &fast_heartbeat).await;

    let running = start_sleeper(&client, "working").await;
    // Its only slot is taken: this one waits in the stream.
    let waiting = run(&client, "python3.13", "echo second", json!({})).await;
    assert_eq!(status(&client, &waiting).await["state"], "queued");

    doomed.kill();
    assert!(
        !containers_of_task(&running).is_empty(),
        "the orphan container should outlive its worker"
    );

    stack
        .start_worker("rescuer", &[("WORKER_HEARTBEAT_SECONDS", "1")])
        .await;
    let lost = wait_status(
        &client,
        &running,
        "the lost task to be settled",
        Duration::from_secs(60),
        is_final,
    )
    .await;
    assert_eq!(lost["state"], "killed", "{lost}");
    assert_eq!(lost["reason"], "worker lost");
    let second = wait_status(
        &client,
        &waiting,
        "the queued task to run",
        Duration::from_secs(60),
        is_final,
    )
    .await;
    assert_eq!(
        (second["state"].as_str(), second["stdout_tail"].as_str()),
        (Some("succeeded"), Some("second\n"))
    );
    // Same Docker engine: the rescuer removed what the dead worker left.
    wait_container_gone(&running).await;
    // And forgot the dead worker once it held nothing.
    stack.wait_forgotten(&stack.worker("doomed")).await;
    stack.shutdown().await;
}

#[tokio::test]
async fn a_restarted_worker_marks_its_in_flight_tasks_killed_and_removes_their_containers() {
    let mut stack = Stack::start(without_worker()).await;
    let client = stack.client().await;
    let mut worker = stack.spawn_worker_process("phoenix", &[]).await;
    let id = start_sleeper(&client, "up").await;

    worker.kill();
    // As if its heartbeat had expired, so the wait below is for the new process.
    stack.drop_heartbeat("phoenix").await;
    let _worker = stack.spawn_worker_process("phoenix", &[]).await;

    let s = wait_status(
        &client,
        &id,
        "the task to be settled",
        Duration::from_secs(30),
        is_final,
    )
    .await;
    assert_eq!(s["state"], "killed", "{s}");
    assert_eq!(s["reason"], "worker restarted");
    wait_container_gone(&id).await;
    // The restarted worker takes new work as usual.
    let next = run_to_end(&client, "python3.13", "echo back", json!({})).await;
    assert_eq!(next["stdout_tail"], "back\n");
    stack.shutdown().await;
}

#[tokio::test]
async fn sigterm_gives_running_tasks_the_grace_period_then_records_them_killed() {
    let mut stack = Stack::start(without_worker()).await;
    let client = stack.client().await;
    let worker = stack
        .spawn_worker_process("leaver", &[("SHUTDOWN_GRACE_SECONDS", "1")])
        .await;
    let id = start_sleeper(&client, "up").await;
    // The point of the test: the task is still running when SIGTERM arrives.
    let before = call_ok(&client, "get_task_status", json!({ "task_id": id })).await;
    assert_eq!(before["state"], "running", "{before}");

    worker.terminate();
    let s = wait_status(
        &client,
        &id,
        "the task to be stopped",
        Duration::from_secs(30),
        is_final,
    )
    .await;
    assert_eq!(s["state"], "killed", "{s}");
    assert_eq!(s["reason"], "worker shut down before the task finished");
    wait_container_gone(&id).await;
    assert!(
        worker.exited_cleanly().await,
        "the worker should exit 0 after SIGTERM"
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn a_stopping_worker_keeps_heartbeating_so_its_grace_period_is_honoured() {
    let mut stack = Stack::start(without_worker()).await;
    let client = stack.client().await;
    let quick = [
        ("WORKER_HEARTBEAT_SECONDS", "1"),
        ("SHUTDOWN_GRACE_SECONDS", "60"),
        ("WORKER_CONCURRENCY", "1"),
    ];
    let leaving = stack.spawn_worker_process("leaving", &quick).await;
    // Long enough after the signal for a watcher to take a silent worker for dead
    // several times over (it needs about two heartbeat periods: 2 s).
    let id = start_until_output(&client, "echo up; sleep 10; echo done", json!({}), "up\n").await;
    // Another worker's reaper watches while the first one drains.
    stack
        .start_worker("watcher", &[("WORKER_HEARTBEAT_SECONDS", "1")])
        .await;
    leaving.terminate();
    let s = wait_status(
        &client,
        &id,
        "the task to finish",
        Duration::from_secs(60),
        is_final,
    )
    .await;
    assert_eq!(
        s["state"], "succeeded",
        "the reaper took a draining worker for dead: {s}"
    );
    assert_eq!(s["stdout_tail"], "up\ndone\n");
    assert!(leaving.exited_cleanly().await);
    stack.shutdown().await;
}

#[tokio::test]
async fn leftover_files_of_ended_tasks_are_collected_and_nothing_else_is_touched() {
    let stack = Stack::start(Options {
        extra_env: vec![
            ("WORKER_HEARTBEAT_SECONDS", "1".into()),
            ("TASK_RETENTION_SECONDS", "60".into()),
        ],
        ..Options::default()
    })
    .await;
    let client = stack.client().await;
    let make = |name: &str| {
        let dir = stack.tasks_dir().join(name);
        std::fs::create_dir_all(dir.join("sub")).expect("dir");
        std::fs::write(dir.join("sub/file.py"), "print(1)").expect("file");
        dir
    };
    // What must stay is made first, so the pass that removes the rest has seen it.
    // No record here but recent: perhaps another deployment's live task.
    let foreign_task_dir = make(&uuid::Uuid::new_v4().to_string());
    let not_a_task = make("not-a-task");
    // A task that ended (its own worker removed its files; these stand for a
    // dead worker's leftovers).
    let ended = run_to_end(&client, "python3.13", "true", json!({})).await;
    let ended_dir = make(ended["task_id"].as_str().unwrap_or_default());
    // No record here and older than the retention: an expired task's.
    let expired_dir = make(&uuid::Uuid::new_v4().to_string());
    let two_hours_ago = std::time::SystemTime::now() - Duration::from_secs(7200);
    std::fs::File::open(&expired_dir)
        .and_then(|f| f.set_modified(two_hours_ago))
        .expect("backdate");

    wait_until(
        "the ended and expired tasks' files to be removed",
        Duration::from_secs(30),
        || async { (!ended_dir.exists() && !expired_dir.exists()).then_some(()) },
    )
    .await;
    assert!(
        foreign_task_dir.exists(),
        "a recent directory with no record here was removed"
    );
    assert!(
        not_a_task.exists(),
        "a directory that is not a task's was removed"
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn a_redis_outage_mid_task_loses_nothing_and_the_api_says_so_meanwhile() {
    let mut stack = Stack::start(Options::default()).await;
    let client = stack.client().await;
    let id = start_until_output(
        &client,
        "echo before; sleep 4; echo after",
        json!({}),
        "before\n",
    )
    .await;

    stack.redis.stop();
    // While Redis is down the api answers with an error result, not a hang or a crash.
    let msg = call_err(&client, "get_task_status", json!({ "task_id": id })).await;
    assert!(msg.contains("Redis") && msg.contains("try again"), "{msg}");
    let health = reqwest::get(format!("{}/healthz", stack.url))
        .await
        .expect("healthz");
    assert_eq!(health.status(), 503);
    // The task ends during the outage: its container exits and is removed while
    // the worker cannot record anything.
    wait_container_gone(&id).await;
    stack.redis.restart().await;

    let s = wait_status(
        &client,
        &id,
        "the result to be recorded",
        Duration::from_secs(90),
        is_final,
    )
    .await;
    assert_eq!(s["state"], "succeeded", "{s}");
    assert_eq!(s["stdout_tail"], "before\nafter\n");
    // And the worker takes new work again.
    let next = run_to_end(&client, "python3.13", "echo again", json!({})).await;
    assert_eq!(next["stdout_tail"], "again\n");
    stack.shutdown().await;
}

#[tokio::test]
async fn a_job_read_but_never_run_by_a_live_worker_is_put_back_and_runs() {
    let mut stack = Stack::start(without_worker()).await;
    stack
        .start_worker(
            "keeper",
            &[
                ("WORKER_HEARTBEAT_SECONDS", "1"),
                ("WORKER_CONCURRENCY", "1"),
            ],
        )
        .await;
    let client = stack.client().await;
    let blocker = start_sleeper(&client, "busy").await;
    let orphan = run(&client, "python3.13", "echo rescued", json!({})).await;

    // The worker's one slot is taken, so it is not reading. Read the job under its
    // name as if the reply to its XREADGROUP had been lost on the way.
    let mut r = stack.redis_conn().await;
    let opts = redis::streams::StreamReadOptions::default()
        .group("workers", stack.worker("keeper"))
        .count(1);
    let read: redis::streams::StreamReadReply = r
        .xread_options(&[stack.keys().jobs()], &[">"], &opts)
        .await
        .expect("read");
    assert_eq!(
        read.keys[0].ids.len(),
        1,
        "the job should have been waiting in the stream"
    );

    // Free the slot: the orphaned entry is put back in the stream and runs.
    call_ok(&client, "kill_task", json!({ "task_id": blocker })).await;
    let s = wait_status(
        &client,
        &orphan,
        "the orphaned job to run",
        Duration::from_secs(60),
        is_final,
    )
    .await;
    assert_eq!(
        (s["state"].as_str(), s["stdout_tail"].as_str()),
        (Some("succeeded"), Some("rescued\n")),
        "{s}"
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn a_task_cannot_outlive_its_timeout_even_when_its_worker_dies() {
    let mut stack = Stack::start(without_worker()).await;
    let client = stack.client().await;
    let mut worker = stack.spawn_worker_process("short-lived", &[]).await;
    let id = start_until_output(
        &client,
        "echo up; sleep 300",
        json!({ "timeout_seconds": 3 }),
        "up\n",
    )
    .await;
    worker.kill();
    // Nobody is left to enforce the timeout from outside: the container's own
    // deadline (timeout + 5 s) stops the script long before its 300 s sleep ends.
    let containers = containers_of_task(&id);
    assert!(
        !containers.is_empty(),
        "the container should outlive its worker"
    );
    wait_until(
        "the container to stop by itself",
        Duration::from_secs(60),
        || async {
            let out = std::process::Command::new("docker")
                .args(["inspect", "-f", "{{.State.Running}}", &containers])
                .output()
                .ok()?;
            (String::from_utf8_lossy(&out.stdout).trim() == "false").then_some(())
        },
    )
    .await;
    stack.shutdown().await;
}

/// Found by the fault run (tests/reliability/faults.py): a worker restarting
/// (so its heartbeat missing for a moment) just before Redis went down was taken
/// for dead by another worker's reaper the moment Redis came back. The reaper's
/// suspicion, begun before the outage, kept ageing through passes that could see
/// nothing, and every heartbeat had expired during the outage.
#[tokio::test]
async fn a_suspicion_from_before_a_redis_outage_does_not_get_a_live_worker_reaped() {
    let mut stack = Stack::start(without_worker()).await;
    let client = stack.client().await;
    let frozen = stack
        .spawn_worker_process(
            "frozen",
            &[
                ("WORKER_HEARTBEAT_SECONDS", "1"),
                ("WORKER_CONCURRENCY", "1"),
            ],
        )
        .await;
    let id = start_until_output(&client, "echo up; sleep 20; echo done", json!({}), "up\n").await;
    // The watcher passes every 2 s and takes a worker for dead once it has seen
    // its heartbeat missing for 6 s.
    stack
        .start_worker("watcher", &[("WORKER_HEARTBEAT_SECONDS", "6")])
        .await;

    // The first worker stalls: its heartbeat expires, and the watcher sees it
    // missing (its reaper's EXISTS on that key is the only EXISTS anyone sends).
    frozen.pause();
    stack.wait_reaper_suspects(&stack.worker("frozen")).await;

    // Redis goes away for longer than the watcher's whole period, and comes back
    // with every heartbeat expired.
    stack.redis.stop();
    tokio::time::sleep(Duration::from_secs(7)).await;
    stack.redis.restart().await;
    // The watcher looks at the stalled worker again before it can heartbeat.
    wait_until(
        "the watcher's first look after the outage",
        Duration::from_secs(10),
        || async { (calls_of(&stack, "exists").await? > 0).then_some(()) },
    )
    .await;
    frozen.resume();

    let s = wait_status(
        &client,
        &id,
        "the task to finish",
        Duration::from_secs(60),
        is_final,
    )
    .await;
    assert_eq!(
        (s["state"].as_str(), s["reason"].as_str()),
        (Some("succeeded"), Some("exited with code 0")),
        "a live worker was taken for dead after the outage: {s}"
    );
    assert_eq!(s["stdout_tail"], "up\ndone\n");
    stack.shutdown().await;
}

/// The worker registry holds whatever a worker's Redis user added to it; a
/// name that is no worker's is never reaped, so never becomes a path. Planted
/// here: `../x`, `..`, an empty name, and one that, were it joined to TASKS_DIR
/// as `cache-<name>`, would resolve through this worker's own cache directory
/// to a directory outside TASKS_DIR (and its `.gone-cache-` twin, which the
/// test makes so that the unchecked rename would succeed). Two real dead
/// workers' names, planted at the same time and after, are forgotten: by then
/// the reaper has passed the bad names many times.
#[tokio::test]
async fn a_planted_worker_name_that_is_no_name_never_becomes_a_path() {
    let stack = Stack::start(Options {
        extra_env: vec![("WORKER_HEARTBEAT_SECONDS", "1".into())],
        ..Options::default()
    })
    .await;
    let tmp = stack
        .tasks_dir()
        .parent()
        .expect("TASKS_DIR has a parent")
        .to_path_buf();
    let victim = tmp.join(format!("sr-victim-{}", stack.prefix));
    std::fs::create_dir_all(&victim).expect("victim dir");
    std::fs::write(victim.join("keep"), "outside TASKS_DIR").expect("victim file");
    let an_hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::open(&victim)
        .and_then(|f| f.set_modified(an_hour_ago))
        .expect("backdate");
    let worker = &stack.worker_name;
    assert!(
        stack.tasks_dir().join(format!("cache-{worker}")).is_dir(),
        "the worker's cache directory, which the planted name goes through"
    );
    std::fs::create_dir(stack.tasks_dir().join(format!(".gone-cache-{worker}")))
        .expect(".gone-cache- twin");
    let escaping = format!("{worker}/../../sr-victim-{}", stack.prefix);
    let bad = [escaping.as_str(), "../x", "..", ""];

    let keys = stack.keys();
    let mut r = stack.redis_conn().await;
    let first_dead = stack.worker("dead");
    let () = r
        .sadd(
            keys.workers(),
            bad.iter().chain([&first_dead.as_str()]).collect::<Vec<_>>(),
        )
        .await
        .expect("sadd");
    stack.wait_forgotten(&first_dead).await;
    let second_dead = stack.worker("dead-too");
    let () = r.sadd(keys.workers(), &second_dead).await.expect("sadd");
    stack.wait_forgotten(&second_dead).await;

    assert_eq!(
        std::fs::read_to_string(victim.join("keep")).ok().as_deref(),
        Some("outside TASKS_DIR"),
        "the directory outside TASKS_DIR was touched"
    );
    let beside: Vec<String> = std::fs::read_dir(&tmp)
        .expect("read the temporary directory")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&format!("sr-victim-{}", stack.prefix)))
        .collect();
    assert_eq!(
        beside,
        [format!("sr-victim-{}", stack.prefix)],
        "made or renamed beside it"
    );
    let mut left: Vec<String> = r.smembers(keys.workers()).await.expect("smembers");
    left.sort();
    let mut want: Vec<String> = bad.iter().map(|s| (*s).to_owned()).collect();
    want.push(worker.clone());
    want.sort();
    assert_eq!(
        left, want,
        "the bad names are skipped, never forgotten as workers"
    );
    stack.shutdown().await;
    let _ = std::fs::remove_dir_all(&victim);
}
