//! The state machine's Lua scripts, run against a real Redis: terminal states are
//! final, a worker never writes (or runs) another's task, and the stream helpers
//! move jobs atomically.

// Test code: a failed expectation is a panic (the workspace lints deny these in product code).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::Redis;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use script_runner_store::scripts::Reply;
use shared::apikey::Limits;
use shared::scripts::SubmitReply;
use shared::scripts::{self, Ended, KillReply, Progress, ScriptCall, Submit, TaskStateReply};
use shared::task::Outcome;
use shared::usage::{CPU_LEDGER_WINDOW_MS, OwnerTotals, Usage};
use shared::{Keys, Owner, ReasonKind, TaskRecord, TaskState};

/// The task every test here works on: `t:task:1` and its zip and stdin.
const ID: &str = "1";
const TASK: &str = "t:task:1";
const ZIP: &str = "t:task:1:zip";
const STATS: &str = "t:stats";
const STDIN: &str = "t:task:1:stdin";

fn keys() -> Keys {
    Keys::new("t")
}

async fn conn(r: &Redis) -> MultiplexedConnection {
    r.client()
        .get_multiplexed_async_connection()
        .await
        .expect("redis")
}

/// Runs a typed call as the binaries do, and gives its reply back in the form
/// the script sent it (`Wire`), so assertions read like the scripts' headers.
async fn run<R: Reply + Wire>(c: &mut MultiplexedConnection, call: ScriptCall<R>) -> R::Raw {
    script_runner_store::scripts::invoke(c, &call)
        .await
        .expect("script")
        .wire()
}

/// A typed reply as the script's wire reply.
trait Wire {
    type Raw;
    fn wire(self) -> Self::Raw;
}

impl Wire for TaskStateReply {
    type Raw = String;
    fn wire(self) -> String {
        match self {
            TaskStateReply::Missing => scripts::MISSING.to_owned(),
            TaskStateReply::NotOwner => scripts::NOT_OWNER.to_owned(),
            TaskStateReply::State(s) => s.as_str().to_owned(),
        }
    }
}

impl Wire for KillReply {
    type Raw = (String, i64);
    fn wire(self) -> (String, i64) {
        match self {
            KillReply::Missing => (scripts::MISSING.to_owned(), 0),
            KillReply::State(s, killed) => (s.as_str().to_owned(), i64::from(killed)),
        }
    }
}

impl Wire for bool {
    type Raw = i64;
    fn wire(self) -> i64 {
        i64::from(self)
    }
}

impl Wire for SubmitReply {
    type Raw = SubmitReply;
    fn wire(self) -> SubmitReply {
        self
    }
}

fn claim(worker: &str, entry: &str) -> ScriptCall<TaskStateReply> {
    ScriptCall::claim(&keys(), ID, worker, entry)
}

fn started(worker: &str, container: &str) -> ScriptCall<TaskStateReply> {
    ScriptCall::started(&keys(), ID, worker, container)
}

fn progress(worker: &str, out: &[u8], err: &[u8]) -> ScriptCall<TaskStateReply> {
    let p = Progress {
        stdout_tail: out,
        stderr_tail: err,
        stdout_bytes: out.len() as u64,
        stderr_bytes: err.len() as u64,
        output_age_ms: Some(0),
        egress_log: None,
    };
    ScriptCall::progress(&keys(), ID, worker, &p)
}

/// FINISH as `worker` with an exit `code` (0: succeeded), kept 600 s.
fn finish(worker: &str, code: i64) -> ScriptCall<TaskStateReply> {
    let outcome = Outcome {
        state: if code == 0 {
            TaskState::Succeeded
        } else {
            TaskState::Failed
        },
        kind: ReasonKind::Exited,
        reason: format!("exited with code {code}"),
        exit_code: Some(code),
    };
    ScriptCall::finish(&keys(), ID, worker, &outcome, 600, &Ended::default())
}

fn alice_key() -> Owner {
    Owner::Key("alice".into())
}

/// The owner a test names (`None`: the admin).
fn owner_of(name: Option<&str>) -> Owner {
    name.map_or(Owner::Admin, Owner::from_stored)
}

/// FINISH as `worker` (exit 0) with `usage`, for the task of `owner`.
fn finish_with(worker: &str, owner: &Owner, usage: Usage) -> ScriptCall<TaskStateReply> {
    let outcome = Outcome {
        state: TaskState::Succeeded,
        kind: ReasonKind::Exited,
        reason: "exited with code 0".to_owned(),
        exit_code: Some(0),
    };
    let ended = Ended {
        usage,
        owner,
        ..Ended::default()
    };
    ScriptCall::finish(&keys(), ID, worker, &outcome, 600, &ended)
}

fn kill(reason: &str) -> ScriptCall<KillReply> {
    ScriptCall::kill(
        &keys(),
        ID,
        reason,
        ReasonKind::KilledByUser,
        600,
        &Owner::Admin,
    )
}

async fn field(c: &mut MultiplexedConnection, f: &str) -> Option<String> {
    c.hget(TASK, f).await.expect("hget")
}

async fn queued_task(c: &mut MultiplexedConnection) {
    queued_task_of(c, None).await;
}

async fn queued_task_of(c: &mut MultiplexedConnection, owner: Option<&str>) {
    let _: () = c.del(&[TASK, ZIP, STDIN]).await.expect("del");
    let record = TaskRecord {
        runtime: Some(shared::RuntimeName::from_stored("python3.13")),
        owner: owner.map(Owner::from_stored),
        ..TaskRecord::new(TaskState::Queued)
    };
    let fields: Vec<(&str, Vec<u8>)> = record
        .to_fields()
        .into_iter()
        .map(|(f, v)| (f.as_str(), v))
        .collect();
    let _: () = c.hset_multiple(TASK, &fields).await.expect("hset");
    let _: () = c.set(ZIP, "zip-bytes").await.expect("set");
    let _: () = c.set(STDIN, "stdin-bytes").await.expect("set");
}

#[tokio::test]
async fn only_one_worker_can_claim_and_only_it_can_write() {
    let redis = Redis::start().await;
    let mut c = conn(&redis).await;
    queued_task(&mut c).await;

    assert_eq!(run(&mut c, claim("a", "1-0")).await, "running");
    // A second claim does not hand the task out again: not to another worker,
    // nor to the same one from another entry (a duplicate job)...
    assert_eq!(run(&mut c, claim("b", "1-0")).await, scripts::NOT_OWNER);
    assert_eq!(run(&mut c, claim("a", "2-0")).await, scripts::NOT_OWNER);
    // ...but the same worker retrying the same claim (its first reply lost) is
    // told it holds the task, so it runs it rather than leaving it running unrun.
    assert_eq!(run(&mut c, claim("a", "1-0")).await, "running");
    assert_eq!(field(&mut c, "worker").await.as_deref(), Some("a"));

    // A non-owner is told so and writes nothing.
    assert_eq!(run(&mut c, started("b", "cid-b")).await, scripts::NOT_OWNER);
    assert_eq!(
        run(&mut c, progress("b", b"out", b"err")).await,
        scripts::NOT_OWNER
    );
    assert_eq!(field(&mut c, "container").await, None);
    assert_eq!(field(&mut c, "stdout_tail").await, None);
    assert_eq!(run(&mut c, finish("b", 0)).await, "running");
    assert_eq!(field(&mut c, "state").await.as_deref(), Some("running"));

    // The owner's writes land.
    assert_eq!(run(&mut c, started("a", "cid-a")).await, "running");
    assert_eq!(run(&mut c, progress("a", b"out", b"err")).await, "running");
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
    run(&mut c, claim("a", "1-0")).await;

    // kill_task wins the race with the worker's own finish.
    let (state, killed): (String, i64) = run(&mut c, kill("killed by kill_task")).await;
    assert_eq!((state.as_str(), killed), ("killed", 1));
    let zip: Option<String> = c.get(ZIP).await.expect("get");
    assert_eq!(zip, None, "a killed task's zip is dropped");
    let stdin: Option<String> = c.get(STDIN).await.expect("get");
    assert_eq!(stdin, None, "a killed task's stdin is dropped");

    assert_eq!(run(&mut c, finish("a", 0)).await, "killed");
    assert_eq!(field(&mut c, "state").await.as_deref(), Some("killed"));
    assert_eq!(
        field(&mut c, "reason").await.as_deref(),
        Some("killed by kill_task")
    );
    assert_eq!(field(&mut c, "exit_code").await, None);
    // The output that arrived until the end is still recorded, but wakes no
    // waiter: the ended task's events stream gets no entry (one could outlive
    // its expiry and make the stream again, with no TTL).
    let events: usize = c.xlen(keys().task_events(ID)).await.expect("xlen");
    assert_eq!(
        run(&mut c, progress("a", b"last words", b"")).await,
        "killed"
    );
    assert_eq!(
        field(&mut c, "stdout_tail").await.as_deref(),
        Some("last words")
    );
    let after: usize = c.xlen(keys().task_events(ID)).await.expect("xlen");
    assert_eq!(after, events, "no event after the end");
    // A second kill changes nothing and says so.
    let (state, killed): (String, i64) = run(&mut c, kill("again")).await;
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
    assert_events_expire_soon(&mut c).await;
}

/// The ended task's events stream expires `FINAL_EVENTS_TTL_SECONDS` after its
/// end, not with its record (600 s here).
async fn assert_events_expire_soon(c: &mut MultiplexedConnection) {
    let events: i64 = c.ttl(keys().task_events(ID)).await.expect("ttl");
    let most = shared::keys::FINAL_EVENTS_TTL_SECONDS as i64;
    assert!(
        events > 0 && events <= most,
        "an ended task's events stream expires within {most} s: ttl {events}"
    );
}

#[tokio::test]
async fn an_ended_tasks_events_expire_long_before_its_record() {
    let redis = Redis::start().await;
    let mut c = conn(&redis).await;
    queued_task(&mut c).await;
    assert_eq!(run(&mut c, claim("a", "1-0")).await, "running");
    assert_eq!(run(&mut c, finish("a", 0)).await, "succeeded");
    let record: i64 = c.ttl(TASK).await.expect("ttl");
    assert!(record > 500, "the record is kept 600 s: ttl {record}");
    assert_events_expire_soon(&mut c).await;
}

#[tokio::test]
async fn a_queued_task_cannot_be_started_or_finished_without_a_claim() {
    let redis = Redis::start().await;
    let mut c = conn(&redis).await;
    queued_task(&mut c).await;
    assert_eq!(run(&mut c, started("a", "cid")).await, scripts::NOT_OWNER);
    assert_eq!(run(&mut c, finish("a", 1)).await, "queued");
    assert_eq!(field(&mut c, "state").await.as_deref(), Some("queued"));
    assert_eq!(run(&mut c, claim("a", "1-0")).await, "running");
    assert_eq!(run(&mut c, claim("b", "1-0")).await, scripts::NOT_OWNER);
    let _: () = c.del(TASK).await.expect("del");
    assert_eq!(run(&mut c, claim("a", "1-0")).await, "missing");
}

#[tokio::test]
async fn requeue_moves_a_job_and_forget_spares_live_or_busy_workers() {
    let redis = Redis::start().await;
    let mut c = conn(&redis).await;
    let (jobs, group) = (&keys().jobs(), shared::keys::WORKER_GROUP);
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
    let forget_dead = || ScriptCall::forget_worker(&keys(), "dead");
    let kept = run(&mut c, forget_dead()).await;
    assert_eq!(kept, 0);

    // Requeue: the old entry leaves the stream and the dead worker's pending list,
    // a new one with the same task waits for anyone.
    let requeue = || ScriptCall::requeue(&keys(), &entry, "one");
    let first: i64 = run(&mut c, requeue()).await;
    assert_eq!(first, 1);
    // Settling the same entry twice does not queue the task twice.
    let again: i64 = run(&mut c, requeue()).await;
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
    let alive = run(&mut c, forget_dead()).await;
    assert_eq!(alive, 0);

    // Dead and idle: forgotten, from the group and the registry.
    let _: () = c.del("t:worker:dead").await.expect("del");
    let gone = run(&mut c, forget_dead()).await;
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
    let keys = keys();
    let index = keys.task_index();
    // An entry from long ago (1970), whose record has surely expired.
    let _: () = c.zadd(&index, "old", 1000).await.expect("zadd");
    let submit = Submit {
        task_id: "new",
        inputs: &shared::spec::Inputs::hash(None, Some(b"some stdin".to_vec())),
        index_horizon_ms: 86_400_000,
        max_queued: 10,
        owner: &Owner::Admin,
        limits: Limits::default(),
        signer: signer(),
        workspace: None,
    };
    let record = TaskRecord::new(TaskState::Queued);
    let queued = run(&mut c, ScriptCall::submit(&keys, &submit, &record)).await;
    assert_eq!(queued, SubmitReply::Queued, "a stream entry id");
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

/// What SUBMIT stores reads back as the record the api wrote (plus the
/// creation time from Redis's clock), and a full stream refuses, storing nothing.
#[tokio::test]
async fn a_submitted_record_reads_back_typed_and_a_full_stream_refuses() {
    let redis = Redis::start().await;
    let mut c = conn(&redis).await;
    let keys = keys();
    let record = TaskRecord {
        runtime: Some(shared::RuntimeName::from_stored("python3.13")),
        command: Some("echo 'hi'".into()),
        timeout_seconds: Some(30),
        has_zip: Some(false),
        has_stdin: Some(false),
        env: Some([("A".to_owned(), "b c".to_owned())].into()),
        network: Some(shared::options::Network::None),
        collect: Some(vec!["out/*".into()]),
        stdout_bytes: Some(0),
        ..TaskRecord::new(TaskState::Queued)
    };
    let none = shared::spec::Inputs::default();
    let submit = |id| Submit {
        task_id: id,
        inputs: &none,
        index_horizon_ms: 86_400_000,
        max_queued: 1,
        owner: &Owner::Admin,
        limits: Limits::default(),
        signer: signer(),
        workspace: None,
    };
    let _queued = run(&mut c, ScriptCall::submit(&keys, &submit("a"), &record)).await;
    let hash: std::collections::HashMap<String, Vec<u8>> =
        c.hgetall(keys.task("a")).await.expect("hgetall");
    let back = TaskRecord::from_hash(hash)
        .expect("well-formed")
        .expect("a record");
    assert!(back.created_at.is_some_and(|t| t > 0));
    // Stored signed: the signature holds over what was stored.
    let verifier = shared::spec::SpecVerifier::from_list(&signer().public_base64()).unwrap();
    let message = shared::spec::message("a", record.to_fields(), &Default::default());
    let signature = back.spec_signature.as_deref();
    assert_eq!(verifier.verify(&message, signature), Ok(signer().key_id()));
    assert_eq!(
        TaskRecord {
            created_at: None,
            spec_signature: None,
            ..back
        },
        record
    );
    // One job in the stream and a cap of one: refused with the backlog.
    let refused = run(&mut c, ScriptCall::submit(&keys, &submit("b"), &record)).await;
    assert_eq!(refused, SubmitReply::Full(1));
    let exists: bool = c.exists(keys.task("b")).await.expect("exists");
    assert!(!exists, "a refused task stores nothing");
}

/// The api's signer in these tests (what it signs is checked in `shared::spec`
/// and, against a worker, in the e2e suite).
fn signer() -> &'static shared::spec::SpecSigner {
    static SIGNER: std::sync::OnceLock<shared::spec::SpecSigner> = std::sync::OnceLock::new();
    SIGNER.get_or_init(|| shared::spec::SpecSigner::from_seed(&[1; 32]))
}

// Owners: quotas in SUBMIT, ownership in KILL, the API key scripts and usage.

#[path = "transitions/owners.rs"]
mod owners;

/// `master_repl_offset`: how far the replication stream has gone.
async fn repl_offset(c: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(c)
        .await
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("master_repl_offset:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("master_repl_offset")
}

/// A claim or kill retried after its first reply was lost (or its WAIT came
/// up short) finds the change made; it must still write, or the retry's WAIT
/// (REDIS_MIN_REPLICAS_ACK) would confirm nothing about the first.
#[tokio::test]
async fn a_retried_claim_or_kill_writes_so_its_wait_covers_the_first() {
    let r = Redis::start().await;
    // The replication stream only moves while a replica is attached.
    let _replica = Redis::start_replica_of(&r).await;
    let mut c = conn(&r).await;
    queued_task(&mut c).await;
    let first: String = run(&mut c, claim("w1", "1-0")).await;
    assert_eq!(first, "running");
    let before = repl_offset(&mut c).await;
    let again: String = run(&mut c, claim("w1", "1-0")).await;
    assert_eq!(again, "running");
    assert!(
        repl_offset(&mut c).await > before,
        "a retried claim wrote nothing"
    );

    let (state, killed): (String, i64) = run(&mut c, kill("stop")).await;
    assert_eq!((state.as_str(), killed), ("killed", 1));
    let before = repl_offset(&mut c).await;
    let (state, killed): (String, i64) = run(&mut c, kill("stop")).await;
    assert_eq!((state.as_str(), killed), ("killed", 0));
    assert!(
        repl_offset(&mut c).await > before,
        "a retried kill wrote nothing"
    );
    assert_eq!(field(&mut c, "state").await.as_deref(), Some("killed"));
}
