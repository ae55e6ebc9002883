//! The state machine's Lua scripts, run against a real Redis: terminal states are
//! final, a worker never writes (or runs) another's task, and the stream helpers
//! move jobs atomically.

mod common;

use common::Redis;
use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, Script};
use shared::scripts;

const TASK: &str = "t:task:1";
const ZIP: &str = "t:task:1:zip";
const STATS: &str = "t:stats";
const STDIN: &str = "t:task:1:stdin";

async fn conn(r: &Redis) -> MultiplexedConnection {
    r.client()
        .get_multiplexed_async_connection()
        .await
        .expect("redis")
}

/// Runs a state script as `worker` with `args` after it.
async fn as_worker(
    c: &mut MultiplexedConnection,
    script: &str,
    worker: &str,
    args: &[&str],
) -> String {
    let script = Script::new(script);
    let mut inv = script.key(TASK);
    inv.key(ZIP).key(STATS).key(STDIN).arg(worker);
    for a in args {
        inv.arg(*a);
    }
    inv.invoke_async(c).await.expect("script")
}

async fn field(c: &mut MultiplexedConnection, f: &str) -> Option<String> {
    c.hget(TASK, f).await.expect("hget")
}

async fn queued_task(c: &mut MultiplexedConnection) {
    let _: () = c.del(&[TASK, ZIP, STDIN]).await.expect("del");
    let _: () = c
        .hset_multiple(TASK, &[("state", "queued"), ("runtime", "python3.13")])
        .await
        .expect("hset");
    let _: () = c.set(ZIP, "zip-bytes").await.expect("set");
    let _: () = c.set(STDIN, "stdin-bytes").await.expect("set");
}

#[tokio::test]
async fn only_one_worker_can_claim_and_only_it_can_write() {
    let redis = Redis::start().await;
    let mut c = conn(&redis).await;
    queued_task(&mut c).await;

    assert_eq!(
        as_worker(&mut c, scripts::CLAIM, "a", &["1-0"]).await,
        "running"
    );
    // A second claim does not hand the task out again: not to another worker,
    // nor to the same one from another entry (a duplicate job)...
    assert_eq!(
        as_worker(&mut c, scripts::CLAIM, "b", &["1-0"]).await,
        scripts::NOT_OWNER
    );
    assert_eq!(
        as_worker(&mut c, scripts::CLAIM, "a", &["2-0"]).await,
        scripts::NOT_OWNER
    );
    // ...but the same worker retrying the same claim (its first reply lost) is
    // told it holds the task, so it runs it rather than leaving it running unrun.
    assert_eq!(
        as_worker(&mut c, scripts::CLAIM, "a", &["1-0"]).await,
        "running"
    );
    assert_eq!(field(&mut c, "worker").await.as_deref(), Some("a"));

    // A non-owner is told so and writes nothing.
    assert_eq!(
        as_worker(&mut c, scripts::STARTED, "b", &["cid-b"]).await,
        scripts::NOT_OWNER
    );
    let progress = ["out", "err", "3", "3", "0"];
    assert_eq!(
        as_worker(&mut c, scripts::PROGRESS, "b", &progress).await,
        scripts::NOT_OWNER
    );
    assert_eq!(field(&mut c, "container").await, None);
    assert_eq!(field(&mut c, "stdout_tail").await, None);
    let finish = ["succeeded", "exited", "exited with code 0", "0", "600"];
    assert_eq!(
        as_worker(&mut c, scripts::FINISH, "b", &finish).await,
        "running"
    );
    assert_eq!(field(&mut c, "state").await.as_deref(), Some("running"));

    // The owner's writes land.
    assert_eq!(
        as_worker(&mut c, scripts::STARTED, "a", &["cid-a"]).await,
        "running"
    );
    assert_eq!(
        as_worker(&mut c, scripts::PROGRESS, "a", &progress).await,
        "running"
    );
    assert_eq!(field(&mut c, "stdout_tail").await.as_deref(), Some("out"));
    assert!(
        field(&mut c, "started_at").await.is_some()
            && field(&mut c, "last_output_at").await.is_some()
    );
}

#[tokio::test]
async fn a_terminal_state_is_never_overwritten() {
    let redis = Redis::start().await;
    let mut c = conn(&redis).await;
    queued_task(&mut c).await;
    as_worker(&mut c, scripts::CLAIM, "a", &["1-0"]).await;

    // kill_task wins the race with the worker's own finish.
    let kill = Script::new(scripts::KILL);
    let (state, killed): (String, i64) = kill
        .key(TASK)
        .key(ZIP)
        .key(STATS)
        .key(STDIN)
        .arg("killed by kill_task")
        .arg("killed-by-user")
        .arg(600)
        .invoke_async(&mut c)
        .await
        .expect("kill");
    assert_eq!((state.as_str(), killed), ("killed", 1));
    let zip: Option<String> = c.get(ZIP).await.expect("get");
    assert_eq!(zip, None, "a killed task's zip is dropped");
    let stdin: Option<String> = c.get(STDIN).await.expect("get");
    assert_eq!(stdin, None, "a killed task's stdin is dropped");

    let finish = ["succeeded", "exited", "exited with code 0", "0", "600"];
    assert_eq!(
        as_worker(&mut c, scripts::FINISH, "a", &finish).await,
        "killed"
    );
    assert_eq!(field(&mut c, "state").await.as_deref(), Some("killed"));
    assert_eq!(
        field(&mut c, "reason").await.as_deref(),
        Some("killed by kill_task")
    );
    assert_eq!(field(&mut c, "exit_code").await, None);
    // The output that arrived until the end is still recorded.
    let progress = ["last words", "", "10", "0", "0"];
    assert_eq!(
        as_worker(&mut c, scripts::PROGRESS, "a", &progress).await,
        "killed"
    );
    assert_eq!(
        field(&mut c, "stdout_tail").await.as_deref(),
        Some("last words")
    );
    // A second kill changes nothing and says so.
    let (state, killed): (String, i64) = kill
        .key(TASK)
        .key(ZIP)
        .key(STATS)
        .key(STDIN)
        .arg("again")
        .arg("killed-by-user")
        .arg(600)
        .invoke_async(&mut c)
        .await
        .expect("kill");
    assert_eq!((state.as_str(), killed), ("killed", 0));
    assert_eq!(
        field(&mut c, "reason").await.as_deref(),
        Some("killed by kill_task")
    );
    // Counted once, as what it really ended as.
    let stats: std::collections::HashMap<String, i64> = c.hgetall(STATS).await.expect("stats");
    assert_eq!(
        stats,
        std::collections::HashMap::from([("finished:killed:killed-by-user".to_owned(), 1)])
    );
    let ttl: i64 = c.ttl(TASK).await.expect("ttl");
    assert!(ttl > 0 && ttl <= 600, "a final record expires: ttl {ttl}");
}

#[tokio::test]
async fn a_queued_task_cannot_be_started_or_finished_without_a_claim() {
    let redis = Redis::start().await;
    let mut c = conn(&redis).await;
    queued_task(&mut c).await;
    assert_eq!(
        as_worker(&mut c, scripts::STARTED, "a", &["cid"]).await,
        scripts::NOT_OWNER
    );
    let finish = ["failed", "exited", "exited with code 1", "1", "600"];
    assert_eq!(
        as_worker(&mut c, scripts::FINISH, "a", &finish).await,
        "queued"
    );
    assert_eq!(field(&mut c, "state").await.as_deref(), Some("queued"));
    assert_eq!(
        as_worker(&mut c, scripts::CLAIM, "a", &["1-0"]).await,
        "running"
    );
    assert_eq!(
        as_worker(&mut c, scripts::CLAIM, "b", &["1-0"]).await,
        scripts::NOT_OWNER
    );
    let _: () = c.del(TASK).await.expect("del");
    assert_eq!(
        as_worker(&mut c, scripts::CLAIM, "a", &["1-0"]).await,
        "missing"
    );
}

#[tokio::test]
async fn requeue_moves_a_job_and_forget_spares_live_or_busy_workers() {
    let redis = Redis::start().await;
    let mut c = conn(&redis).await;
    let (jobs, group) = ("t:jobs", "workers");
    let _: () = c
        .xgroup_create_mkstream(jobs, group, "0")
        .await
        .expect("group");
    let _: String = c
        .xadd(jobs, "*", &[("task_id", "one")])
        .await
        .expect("xadd");
    let reply: redis::streams::StreamReadReply = c
        .xread_options(
            &[jobs],
            &[">"],
            &redis::streams::StreamReadOptions::default()
                .group(group, "dead")
                .count(1),
        )
        .await
        .expect("read");
    let entry = reply.keys[0].ids[0].id.clone();

    // The dead worker holds a job: it is not forgotten.
    let forget = Script::new(scripts::FORGET_WORKER);
    async fn forget_dead(
        forget: &Script,
        c: &mut MultiplexedConnection,
        jobs: &str,
        group: &str,
    ) -> i64 {
        let mut inv = forget.key(jobs);
        inv.key("t:worker:dead")
            .key("t:workers")
            .arg(group)
            .arg("dead");
        inv.invoke_async(c).await.expect("forget")
    }
    let kept = forget_dead(&forget, &mut c, jobs, group).await;
    assert_eq!(kept, 0);

    // Requeue: the old entry leaves the stream and the dead worker's pending list,
    // a new one with the same task waits for anyone.
    let _: i64 = Script::new(scripts::REQUEUE)
        .key(jobs)
        .arg(group)
        .arg(&entry)
        .arg("one")
        .invoke_async(&mut c)
        .await
        .expect("requeue");
    // Settling the same entry twice does not queue the task twice.
    let again: i64 = Script::new(scripts::REQUEUE)
        .key(jobs)
        .arg(group)
        .arg(&entry)
        .arg("one")
        .invoke_async(&mut c)
        .await
        .expect("requeue");
    assert_eq!(again, 0);
    let all: redis::streams::StreamRangeReply = c.xrange_all(jobs).await.expect("range");
    assert_eq!(all.ids.len(), 1);
    assert_ne!(all.ids[0].id, entry);
    assert_eq!(all.ids[0].get::<String>("task_id").as_deref(), Some("one"));

    // Alive again (heartbeat present): not forgotten either.
    let _: () = c.sadd("t:workers", "dead").await.expect("sadd");
    let _: () = c
        .set_ex("t:worker:dead", "running=0", 30)
        .await
        .expect("heartbeat");
    let alive = forget_dead(&forget, &mut c, jobs, group).await;
    assert_eq!(alive, 0);

    // Dead and idle: forgotten, from the group and the registry.
    let _: () = c.del("t:worker:dead").await.expect("del");
    let gone = forget_dead(&forget, &mut c, jobs, group).await;
    assert_eq!(gone, 1);
    let members: Vec<String> = c.smembers("t:workers").await.expect("smembers");
    assert!(members.is_empty());
    let consumers: redis::streams::StreamInfoConsumersReply =
        c.xinfo_consumers(jobs, group).await.expect("consumers");
    assert!(consumers.consumers.is_empty());
}

#[tokio::test]
async fn submit_indexes_the_task_and_trims_entries_past_the_horizon() {
    let redis = Redis::start().await;
    let mut c = conn(&redis).await;
    let keys = shared::Keys::new("t");
    let index = keys.task_index();
    // An entry from long ago (1970), whose record has surely expired.
    let _: () = c.zadd(&index, "old", 1000).await.expect("zadd");
    let submit = Script::new(scripts::SUBMIT);
    let entry: String = submit
        .key(keys.task("new"))
        .key(keys.task_zip("new"))
        .key(keys.task_stdin("new"))
        .key(keys.stats())
        .key(keys.jobs())
        .key(&index)
        .arg("new")
        .arg("")
        .arg("some stdin")
        .arg(86_400_000)
        .arg(10)
        .arg("state")
        .arg("queued")
        .invoke_async(&mut c)
        .await
        .expect("submit");
    assert!(entry.contains('-'), "a stream entry id: {entry}");
    let members: Vec<String> = c.zrange(&index, 0, -1).await.expect("zrange");
    assert_eq!(
        members,
        ["new"],
        "the old entry is trimmed, the new one indexed"
    );
    let created: i64 = c
        .hget(keys.task("new"), "created_at")
        .await
        .expect("created_at");
    let score: f64 = c.zscore(&index, "new").await.expect("zscore");
    assert_eq!(score as i64, created, "indexed by its created_at");
    let stdin: Option<String> = c.get(keys.task_stdin("new")).await.expect("get");
    assert_eq!(stdin.as_deref(), Some("some stdin"));
    let zip: Option<String> = c.get(keys.task_zip("new")).await.expect("get");
    assert_eq!(zip, None, "no zip given, none stored");
}
