//! Owners: quotas in SUBMIT, ownership in KILL, the API key scripts, and the
//! usage FINISH counts to an owner.

use super::*;
use script_runner_store::apikeys;
use shared::apikey::{ApiKeyRecord, Scopes};
use shared::scripts::Quota;

/// SUBMIT of task `id` as `owner` (`None`: the admin key) with `limits`.
async fn submit_as(
    c: &mut MultiplexedConnection,
    id: &str,
    owner: Option<&str>,
    limits: Limits,
) -> SubmitReply {
    let submit = Submit {
        task_id: id,
        inputs: &Default::default(),
        index_horizon_ms: 86_400_000,
        max_queued: 100,
        owner: &owner_of(owner),
        limits,
        signer: super::signer(),
        workspace: None,
    };
    let record = TaskRecord {
        owner: owner.map(Owner::from_stored),
        ..TaskRecord::new(TaskState::Queued)
    };
    run(c, ScriptCall::submit(&keys(), &submit, &record)).await
}

async fn set_state(c: &mut MultiplexedConnection, id: &str, state: TaskState) {
    let _: () = c
        .hset(keys().task(id), "state", state.as_str())
        .await
        .expect("hset");
}

#[tokio::test]
async fn task_quotas_count_the_owners_queued_and_active_tasks_and_drop_ended_ones() {
    let redis = Redis::start().await;
    let mut c = conn(&redis).await;
    let queued_2 = Limits {
        max_queued: Some(2),
        ..Limits::default()
    };
    assert_eq!(
        submit_as(&mut c, "a1", Some("alice"), queued_2).await,
        SubmitReply::Queued
    );
    assert_eq!(
        submit_as(&mut c, "a2", Some("alice"), queued_2).await,
        SubmitReply::Queued
    );
    let refused = SubmitReply::Tasks {
        quota: Quota::MaxQueued,
        limit: 2,
        count: 2,
    };
    assert_eq!(
        submit_as(&mut c, "a3", Some("alice"), queued_2).await,
        refused
    );
    assert!(
        !c.exists::<_, bool>(keys().task("a3"))
            .await
            .expect("exists")
    );
    // Another owner, and the admin, are not held by alice's quota.
    assert_eq!(
        submit_as(&mut c, "b1", Some("bob"), queued_2).await,
        SubmitReply::Queued
    );
    assert_eq!(
        submit_as(&mut c, "x1", None, queued_2).await,
        SubmitReply::Queued
    );
    // A running task no longer counts as queued; an ended one leaves the set.
    set_state(&mut c, "a1", TaskState::Running).await;
    assert_eq!(
        submit_as(&mut c, "a3", Some("alice"), queued_2).await,
        SubmitReply::Queued
    );
    set_state(&mut c, "a2", TaskState::Succeeded).await;
    assert_eq!(
        submit_as(&mut c, "a4", Some("alice"), queued_2).await,
        SubmitReply::Queued
    );
    let active: Vec<String> = c
        .zrange(keys().owner_active("alice"), 0, -1)
        .await
        .expect("zrange");
    assert_eq!(active, ["a1", "a3", "a4"], "a2 ended and was dropped");

    // max_running counts queued and running together, and refuses.
    let running_2 = Limits {
        max_running: Some(2),
        ..Limits::default()
    };
    assert_eq!(
        submit_as(&mut c, "c1", Some("carol"), running_2).await,
        SubmitReply::Queued
    );
    assert_eq!(
        submit_as(&mut c, "c2", Some("carol"), running_2).await,
        SubmitReply::Queued
    );
    set_state(&mut c, "c1", TaskState::Running).await;
    let refused = SubmitReply::Tasks {
        quota: Quota::MaxRunning,
        limit: 2,
        count: 2,
    };
    assert_eq!(
        submit_as(&mut c, "c3", Some("carol"), running_2).await,
        refused
    );
    // An expired record counts as ended.
    let _: () = c.del(keys().task("c1")).await.expect("del");
    assert_eq!(
        submit_as(&mut c, "c3", Some("carol"), running_2).await,
        SubmitReply::Queued
    );

    // The owner's own index has every task it submitted; the admin writes no
    // owner key.
    let listed: Vec<String> = c
        .zrange(keys().owner_tasks("alice"), 0, -1)
        .await
        .expect("zrange");
    assert_eq!(listed, ["a1", "a2", "a3", "a4"]);
    assert!(
        c.pttl::<_, i64>(keys().owner_tasks("alice"))
            .await
            .expect("pttl")
            > 0
    );
    for k in [keys().owner_tasks(""), keys().owner_active("")] {
        assert!(!c.exists::<_, bool>(&k).await.expect("exists"), "{k}");
    }
    // A task submitted without a task-count quota still counts once one is
    // set (a key's limits changed, or another replica's OAUTH_* limits), and
    // the active set is bounded like the owner's index.
    assert_eq!(
        submit_as(&mut c, "d1", Some("dave"), Limits::default()).await,
        SubmitReply::Queued
    );
    assert!(
        c.pttl::<_, i64>(keys().owner_active("dave"))
            .await
            .expect("pttl")
            > 0
    );
    let running_1 = Limits {
        max_running: Some(1),
        ..Limits::default()
    };
    assert_eq!(
        submit_as(&mut c, "d2", Some("dave"), running_1).await,
        SubmitReply::Tasks {
            quota: Quota::MaxRunning,
            limit: 1,
            count: 1,
        }
    );

    // A quota of 0 refuses the first task too (the ctl refuses to set one).
    for (limits, quota) in [
        (
            Limits {
                max_running: Some(0),
                ..Limits::default()
            },
            Quota::MaxRunning,
        ),
        (
            Limits {
                max_queued: Some(0),
                ..Limits::default()
            },
            Quota::MaxQueued,
        ),
    ] {
        assert_eq!(
            submit_as(&mut c, "e1", Some("erin"), limits).await,
            SubmitReply::Tasks {
                quota,
                limit: 0,
                count: 0,
            }
        );
        assert!(
            !c.exists::<_, bool>(keys().task("e1"))
                .await
                .expect("exists")
        );
    }
}

#[tokio::test]
async fn the_cpu_quota_sums_the_last_day_and_says_when_it_frees_up() {
    let redis = Redis::start().await;
    let mut c = conn(&redis).await;
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut c).await.expect("time");
    let now = shared::time::redis_time_ms((secs, micros));
    let (hour, day) = (3_600_000, 86_400_000);
    let ledger = keys().owner_cpu("alice");
    // As FINISH writes them: `<task_id>:<cpu_ms>` by finished_at.
    let _: () = redis::pipe()
        .zadd(&ledger, "old:90000", now - day - hour)
        .zadd(&ledger, "x:3000", now - 2 * hour)
        .zadd(&ledger, "y:2000", now - hour)
        .query_async(&mut c)
        .await
        .expect("zadd");
    let cpu = |s| Limits {
        cpu_seconds_per_day: Some(s),
        ..Limits::default()
    };
    // 5 s used in the last day, 4 allowed: refused until x is a day old.
    let refused = SubmitReply::Cpu {
        limit_ms: 4000,
        used_ms: 5000,
        frees_at_ms: now - 2 * hour + day,
    };
    assert_eq!(
        submit_as(&mut c, "a1", Some("alice"), cpu(4)).await,
        refused
    );
    // The entry older than a day was dropped on the way.
    let left: Vec<String> = c.zrange(&ledger, 0, -1).await.expect("zrange");
    assert_eq!(left, ["x:3000", "y:2000"]);
    // At 1 s only dropping both would do: y's age-out time.
    let SubmitReply::Cpu { frees_at_ms, .. } = submit_as(&mut c, "a1", Some("alice"), cpu(1)).await
    else {
        panic!("refused by the CPU quota");
    };
    assert_eq!(frees_at_ms, now - hour + day);
    assert_eq!(
        submit_as(&mut c, "a1", Some("alice"), cpu(6)).await,
        SubmitReply::Queued
    );
    assert_eq!(
        submit_as(&mut c, "b1", Some("bob"), cpu(1)).await,
        SubmitReply::Queued
    );
}

#[tokio::test]
async fn kill_answers_another_owners_task_as_missing_and_leaves_it() {
    let redis = Redis::start().await;
    let mut c = conn(&redis).await;
    assert_eq!(
        submit_as(&mut c, ID, Some("alice"), Limits::default()).await,
        SubmitReply::Queued
    );
    let kill_as =
        |owner: &Owner| ScriptCall::kill(&keys(), ID, "r", ReasonKind::KilledByUser, 600, owner);
    let reply: (String, i64) = run(&mut c, kill_as(&Owner::Key("bob".into()))).await;
    assert_eq!(reply, (scripts::MISSING.to_owned(), 0));
    let state: String = c.hget(TASK, "state").await.expect("hget");
    assert_eq!(state, "queued");
    let reply: (String, i64) = run(&mut c, kill_as(&Owner::Key("alice".into()))).await;
    assert_eq!(reply, ("killed".to_owned(), 1));
}

#[tokio::test]
async fn keys_are_stored_hashed_and_rotate_and_revoke_at_once() {
    let redis = Redis::start().await;
    let mut c = conn(&redis).await;
    let k = keys();
    let record = ApiKeyRecord {
        name: "ci".into(),
        scopes: Scopes::parse("run,read").expect("scopes"),
        limits: Limits {
            max_queued: Some(5),
            ..Limits::default()
        },
        allow_hosts: None,
        created_at: None,
        last_used_at: None,
    };
    let key = apikeys::create(&mut c, &k, &record).await.expect("create");
    let again = apikeys::create(&mut c, &k, &record).await;
    assert!(
        matches!(again, Err(apikeys::ApiKeyError::NameTaken(_))),
        "{again:?}"
    );
    let found = apikeys::lookup(&mut c, &k, key.expose().as_bytes())
        .await
        .expect("lookup")
        .expect("the key is known");
    assert_eq!((found.name.as_str(), found.limits), ("ci", record.limits));
    // The first use wrote last_used_at; the next within a minute does not.
    let stored = k.api_key(&key.hash());
    let first: i64 = c.hget(&stored, "last_used_at").await.expect("hget");
    let _ = apikeys::lookup(&mut c, &k, key.expose().as_bytes())
        .await
        .expect("lookup");
    let second: i64 = c.hget(&stored, "last_used_at").await.expect("hget");
    assert_eq!(first, second);

    let new = apikeys::rotate(&mut c, &k, "ci").await.expect("rotate");
    let old_found = apikeys::lookup(&mut c, &k, key.expose().as_bytes())
        .await
        .expect("lookup");
    assert!(old_found.is_none(), "the old key is refused at once");
    let new_found = apikeys::lookup(&mut c, &k, new.expose().as_bytes())
        .await
        .expect("lookup");
    assert_eq!(
        new_found.map(|r| (r.name, r.scopes)),
        Some(("ci".into(), record.scopes))
    );

    apikeys::revoke(&mut c, &k, "ci").await.expect("revoke");
    let gone = apikeys::lookup(&mut c, &k, new.expose().as_bytes())
        .await
        .expect("lookup");
    assert!(gone.is_none());
    assert!(apikeys::list(&mut c, &k).await.expect("list").is_empty());
    // The revoked key's tasks keep "ci" as their owner: no new key gets the name.
    let reused = apikeys::create(&mut c, &k, &record).await;
    match &reused {
        Err(e @ apikeys::ApiKeyError::NameRevoked(_)) => {
            assert!(e.to_string().contains("choose another name"), "{e}")
        }
        other => panic!("a revoked name was given to a new key: {other:?}"),
    }
    assert!(apikeys::list(&mut c, &k).await.expect("list").is_empty());
    let missing = apikeys::revoke(&mut c, &k, "ci").await;
    assert!(matches!(missing, Err(apikeys::ApiKeyError::NoSuchKey(_))));
    let bad = apikeys::rotate(&mut c, &k, "Not A Name").await;
    assert!(matches!(bad, Err(apikeys::ApiKeyError::Key(_))));
}

async fn totals(c: &mut MultiplexedConnection, key: &str) -> OwnerTotals {
    let h: std::collections::HashMap<String, String> = c.hgetall(key).await.expect("hgetall");
    OwnerTotals::from_hash(&h)
}

#[tokio::test]
async fn finish_records_usage_once_and_counts_it_to_the_owner() {
    let redis = Redis::start().await;
    let mut c = conn(&redis).await;
    let k = keys();
    let usage = Usage {
        cpu_ms: Some(2_000),
        peak_memory_bytes: Some(200 << 20),
        workspace_bytes: Some(5 << 20),
        estimated: false,
    };
    // An entry older than the ledger's day, left by an earlier task.
    let old_ms = redis::cmd("TIME")
        .query_async::<(u64, u64)>(&mut c)
        .await
        .expect("time")
        .0
        * 1000
        - CPU_LEDGER_WINDOW_MS
        - 1_000;
    let _: () = c
        .zadd(k.owner_cpu("alice"), "0:9", old_ms)
        .await
        .expect("zadd");

    queued_task_of(&mut c, Some("alice")).await;
    assert_eq!(run(&mut c, claim("a", "1-0")).await, "running");
    // A kill recorded first does not stop the worker recording what ran.
    let _killed = run(&mut c, kill("stop")).await;
    assert_eq!(
        run(&mut c, finish_with("a", &alice_key(), usage)).await,
        "killed"
    );
    // Retried (its first reply lost): counted once.
    run(&mut c, finish_with("a", &alice_key(), usage)).await;
    assert_eq!(field(&mut c, "usage_cpu_ms").await.as_deref(), Some("2000"));
    assert_eq!(
        field(&mut c, "usage_peak_memory_bytes").await.as_deref(),
        Some("209715200")
    );
    assert_eq!(
        field(&mut c, "usage_workspace_bytes").await.as_deref(),
        Some("5242880")
    );
    assert_eq!(field(&mut c, "usage_estimated").await, None);
    let ledger: Vec<String> = c.zrange(k.owner_cpu("alice"), 0, -1).await.expect("zrange");
    assert_eq!(
        ledger,
        vec!["1:2000".to_owned()],
        "the old entry is trimmed"
    );
    let alice = OwnerTotals {
        tasks: 1,
        cpu_ms: 2_000,
        peak_memory_bytes: 200 << 20,
        workspace_bytes: 5 << 20,
    };
    assert_eq!(totals(&mut c, &k.owner_usage("alice")).await, alice);
    assert_eq!(totals(&mut c, &k.usage_totals()).await, alice);
    let ranked: Vec<(String, f64)> = c
        .zrange_withscores(k.usage_owners(), 0, -1)
        .await
        .expect("zrange");
    assert_eq!(ranked, vec![("alice".to_owned(), 2000.0)]);

    // A second task of hers with a lower peak: sums grow, the peak stays the
    // highest. Its usage is the worker's estimate (its container was gone at
    // the end): marked so, and counted like any other.
    queued_task_of(&mut c, Some("alice")).await;
    run(&mut c, claim("a", "2-0")).await;
    let small = Usage {
        cpu_ms: Some(500),
        peak_memory_bytes: Some(1 << 20),
        workspace_bytes: None,
        estimated: true,
    };
    run(&mut c, finish_with("a", &alice_key(), small)).await;
    assert_eq!(field(&mut c, "usage_estimated").await.as_deref(), Some("1"));
    let t = totals(&mut c, &k.owner_usage("alice")).await;
    assert_eq!(
        (t.tasks, t.cpu_ms, t.peak_memory_bytes, t.workspace_bytes),
        (2, 2_500, 200 << 20, 5 << 20)
    );

    // The admin key's task (no owner): its record gets usage, nobody's totals do.
    queued_task_of(&mut c, None).await;
    run(&mut c, claim("a", "3-0")).await;
    run(&mut c, finish_with("a", &Owner::Admin, usage)).await;
    assert_eq!(field(&mut c, "usage_cpu_ms").await.as_deref(), Some("2000"));
    assert_eq!(totals(&mut c, &k.usage_totals()).await.tasks, 2);
    let owners: u64 = c.zcard(k.usage_owners()).await.expect("zcard");
    assert_eq!(owners, 1);

    // No figure at all (the container was gone): nothing written, nothing counted.
    queued_task_of(&mut c, Some("alice")).await;
    run(&mut c, claim("a", "4-0")).await;
    run(&mut c, finish_with("a", &alice_key(), Usage::default())).await;
    assert_eq!(field(&mut c, "usage_cpu_ms").await, None);
    assert_eq!(totals(&mut c, &k.owner_usage("alice")).await.tasks, 2);
}
