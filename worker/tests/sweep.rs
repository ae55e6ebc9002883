//! The blob store's sweep against a real Redis, a real Docker engine and a
//! real store (a local directory): it deletes what no kept version names, and
//! never a blob a committed version names, even when it runs in the middle of
//! a save (the save's commit is refused, its blobs are sent again, and the
//! version is committed whole).

// Test code: a failed expectation is a panic (the workspace lints deny these in product code).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use blobs::{BlobStore, Kind, StoreConfig};
use futures_util::TryStreamExt;
use redis::AsyncCommands;
use script_runner_worker::config::SandboxLimits;
use script_runner_worker::queue::Queue;
use script_runner_worker::sandbox::Sandbox;
use script_runner_worker::workspaces::sweep::{self, Committed, Outcome, Sweeper};
use script_runner_worker::workspaces::{WorkspaceConfig, Workspaces};
use shared::apikey::Limits;
use shared::scripts::{ScriptCall, Submit, SubmitReply, SubmitWorkspace, WsRefusal, WsReply};
use shared::workspace::{BlobDigest, StoreLocation, VersionLimits, WorkspaceCaps, WorkspaceId};
use shared::{Keys, Owner, TaskRecord, TaskState};
use store::redis_pool::RedisTarget;
use testkit::Redis;
use tokio_util::sync::CancellationToken;

const WORKER: &str = "sweep-test";

/// Removes the test's containers and directories however the test ends.
struct Cleanup {
    containers: Vec<String>,
    dirs: Vec<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for c in &self.containers {
            let _ = Command::new("docker").args(["rm", "-f", c]).output();
        }
        for d in &self.dirs {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

struct Rig {
    redis: Redis,
    conn: redis::aio::MultiplexedConnection,
    keys: Keys,
    queue: Queue,
    workspaces: Workspaces,
    store: BlobStore,
    sandbox: Sandbox,
    cleanup: Cleanup,
}

fn limits() -> SandboxLimits {
    SandboxLimits {
        memory_mib: 256,
        cpus: 1.0,
        pids: 64,
        nofile: 1024,
        tmpfs_mib: 16,
        user: "65534:65534".into(),
        disk_mib: 16,
        network: "none".into(),
        bridge: "none".into(),
        egress_network: "none".into(),
        egress_bridge: "none".into(),
        firewall: false,
        blocked_cidrs: Vec::new(),
        oci_runtime: None,
    }
}

const CAPS: WorkspaceCaps = WorkspaceCaps {
    versions_kept: 3,
    owner_max_bytes: 0,
};

async fn rig() -> Rig {
    rig_on(None).await
}

/// A rig whose store is `s3` (the `WORKSPACE_*` variables of a real S3
/// server), or else a local directory.
async fn rig_on(s3: Option<Vec<(&'static str, String)>>) -> Rig {
    let redis = Redis::start().await;
    let keys = Keys::new(testkit::unique_prefix('s'));
    let target = RedisTarget::url(&redis.url()).expect("redis url");
    let queue = Queue::new(&target, keys.clone(), WORKER.into(), None).expect("queue");
    let base = std::env::temp_dir().join(format!("sweep-test-{}", uuid::Uuid::new_v4().simple()));
    let store = match s3 {
        Some(env) => {
            let var = |name: &str| env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone());
            StoreConfig::from_lookup(&var, &base).expect("the S3 settings")
        }
        None => StoreConfig {
            location: StoreLocation::Local(base.join("store")),
            s3: Default::default(),
        },
    };
    let config = WorkspaceConfig {
        store,
        cache_bytes: 64 << 20,
        limits: VersionLimits {
            max_bytes: 64 << 20,
            max_files: 10_000,
        },
        versions_kept: CAPS.versions_kept,
        owner_max_bytes: 0,
        sweep_every: Duration::ZERO,
    };
    let workspaces = Workspaces::open(&config, base.join("cache"), "65534:65534").expect("open");
    let store = BlobStore::open(&config.store).expect("store");
    let sandbox = Sandbox::connect(limits(), WORKER.into())
        .await
        .expect("sandbox");
    let conn = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    Rig {
        redis,
        conn,
        keys,
        queue,
        workspaces,
        store,
        sandbox,
        cleanup: Cleanup {
            containers: Vec::new(),
            dirs: vec![base],
        },
    }
}

impl Rig {
    /// A paused container whose /workspace holds what `script` wrote there,
    /// like a task's at its end.
    fn paused_container(&mut self, script: &str) -> String {
        let name = format!("sweep-test-{}", uuid::Uuid::new_v4().simple());
        let run = Command::new("docker")
            .args([
                "run",
                "-d",
                "--name",
                &name,
                &testkit::runtime_image(),
                "sh",
                "-c",
            ])
            .arg(format!(
                "mkdir -p /workspace && cd /workspace && {script} && touch /tmp/ready && sleep 600"
            ))
            .output()
            .expect("docker run");
        assert!(run.status.success(), "docker run: {run:?}");
        self.cleanup.containers.push(name.clone());
        let ready = (0..200).any(|_| {
            let probe = Command::new("docker")
                .args(["exec", &name, "test", "-e", "/tmp/ready"])
                .output()
                .expect("docker exec");
            probe.status.success() || {
                std::thread::sleep(Duration::from_millis(50));
                false
            }
        });
        assert!(ready, "the container wrote its /workspace within 10 s");
        let pause = Command::new("docker")
            .args(["pause", &name])
            .output()
            .expect("docker pause");
        assert!(pause.status.success(), "docker pause: {pause:?}");
        name
    }

    /// A task on workspace `ws` (made by it when `new`), claimed by this
    /// worker, as SUBMIT and CLAIM leave it.
    async fn claimed_task(&self, ws: &WorkspaceId, base: u64, new: bool) -> String {
        let mut conn = self.connection().await;
        let task = uuid::Uuid::new_v4().simple().to_string();
        let mut record = TaskRecord::new(TaskState::Queued);
        record.workspace_id = Some(*ws);
        record.workspace_base = Some(base);
        let submit = Submit {
            task_id: &task,
            inputs: &Default::default(),
            index_horizon_ms: 86_400_000,
            max_queued: 1000,
            owner: &Owner::Admin,
            limits: Limits::default(),
            signer: signer(),
            workspace: Some(SubmitWorkspace {
                new,
                must_be_head: false,
                save_grace_ms: 600_000,
            }),
        };
        let call = ScriptCall::submit(&self.keys, &submit, &record);
        let queued = store::scripts::invoke(&mut conn, &call)
            .await
            .expect("submit");
        assert_eq!(queued, SubmitReply::Queued);
        let call = ScriptCall::claim(&self.keys, &task, WORKER, "0-1");
        let claimed = store::scripts::invoke(&mut conn, &call)
            .await
            .expect("claim");
        assert_eq!(
            claimed,
            shared::scripts::TaskStateReply::State(TaskState::Running)
        );
        task
    }

    async fn connection(&self) -> redis::aio::MultiplexedConnection {
        self.redis
            .client()
            .get_multiplexed_async_connection()
            .await
            .expect("redis")
    }

    /// Every object the store holds.
    async fn stored(&self) -> HashSet<(Kind, BlobDigest)> {
        let mut all = HashSet::new();
        for kind in [Kind::Blob, Kind::Manifest] {
            let listed: Vec<_> = self.store.list(kind).try_collect().await.expect("list");
            all.extend(listed.into_iter().map(|o| (o.kind, o.digest)));
        }
        all
    }

    /// What every kept version names, each checked to be in the store: the
    /// invariant the sweep keeps.
    async fn assert_every_version_whole(&self) -> usize {
        let stored = self.stored().await;
        let versions = self.queue.kept_versions().await.expect("versions");
        for (ws, v) in &versions {
            assert!(
                stored.contains(&(Kind::Manifest, v.manifest.clone())),
                "workspace {ws} version {} lost its manifest",
                v.version
            );
            let m = self
                .workspaces
                .manifest(&v.manifest)
                .await
                .expect("manifest");
            for b in m.blobs() {
                assert!(
                    stored.contains(&(Kind::Blob, b.clone())),
                    "workspace {ws} version {} lost blob {b}",
                    v.version
                );
            }
        }
        versions.len()
    }

    fn sweeper(&self) -> Sweeper {
        // No minimum age and no interval: every unnamed object goes, at once.
        Sweeper::new(
            self.queue.clone(),
            &self.workspaces,
            Duration::ZERO,
            Duration::ZERO,
            CancellationToken::new(),
        )
    }
}

fn signer() -> &'static shared::spec::SpecSigner {
    static SIGNER: std::sync::OnceLock<shared::spec::SpecSigner> = std::sync::OnceLock::new();
    SIGNER.get_or_init(|| shared::spec::SpecSigner::from_seed(&[1; 32]))
}

fn swept(outcome: Outcome) -> sweep::Swept {
    match outcome {
        Outcome::Swept(s) => s,
        other => panic!("the sweep did not run: {other:?}"),
    }
}

#[tokio::test]
async fn a_sweep_in_the_middle_of_a_save_never_takes_a_blob_the_version_names() {
    a_sweep_in_the_middle_of_a_save(rig().await).await;
}

#[tokio::test]
async fn a_sweep_in_the_middle_of_a_save_on_s3_never_takes_a_blob_the_version_names() {
    // Its own bucket on a real Garage, which lists, deletes and dates
    // objects as an operator's S3 server does.
    let garage = testkit::garage::Garage::start().await;
    a_sweep_in_the_middle_of_a_save(rig_on(Some(garage.worker_env())).await).await;
}

async fn a_sweep_in_the_middle_of_a_save(mut rig: Rig) {
    let stop = CancellationToken::new();
    let ws = WorkspaceId::from_bytes(*uuid::Uuid::new_v4().as_bytes());
    let task = rig.claimed_task(&ws, 0, true).await;
    let container = rig.paused_container("echo one > a.txt && mkdir lib && echo two > lib/b.txt");

    // The save checks and sends its blobs...
    let epoch = sweep::epoch(&rig.queue, &stop).await.expect("epoch");
    let mut stored = rig
        .workspaces
        .save(&rig.sandbox, &container, None, epoch)
        .await
        .expect("save");
    assert_eq!(stored.uploaded, 2, "both files' blobs were sent");
    // ...then a sweep runs before its commit: nothing names them yet, so it
    // deletes them (and the manifest).
    let s = swept(rig.sweeper().sweep().await.expect("sweep"));
    assert_eq!(s.deleted, 3, "{s:?}");
    assert!(rig.stored().await.is_empty(), "the store is empty");

    // The commit is refused (the sweep moved the epoch), the blobs are sent
    // again, and the version is committed whole.
    let reply = sweep::commit(
        &rig.queue,
        &rig.workspaces,
        &stop,
        &task,
        (ws, 0),
        &mut stored,
        CAPS,
    )
    .await
    .expect("commit");
    assert_eq!(reply, Committed::Reply(WsReply::Done(1)));
    assert_eq!(stored.uploaded, 4, "the two blobs were sent again");
    assert_eq!(rig.assert_every_version_whole().await, 1);

    // A sweep now deletes nothing the version names.
    let s = swept(rig.sweeper().sweep().await.expect("sweep"));
    assert_eq!((s.unnamed, s.deleted), (0, 0), "{s:?}");
    assert_eq!(rig.assert_every_version_whole().await, 1);
}

#[tokio::test]
async fn the_sweep_deletes_what_dropped_versions_named_and_keeps_what_a_fork_names() {
    let mut rig = rig().await;
    let stop = CancellationToken::new();
    let ws = WorkspaceId::from_bytes(*uuid::Uuid::new_v4().as_bytes());
    // Five versions, each with a file of its own and one they share; three are kept.
    let mut base = 0;
    for n in 1..=5 {
        let task = rig.claimed_task(&ws, base, n == 1).await;
        let c = rig.paused_container(&format!("echo shared > s.txt && echo {n} > own.txt"));
        let epoch = sweep::epoch(&rig.queue, &stop).await.expect("epoch");
        let mut stored = rig
            .workspaces
            .save(&rig.sandbox, &c, None, epoch)
            .await
            .expect("save");
        let reply = sweep::commit(
            &rig.queue,
            &rig.workspaces,
            &stop,
            &task,
            (ws, base),
            &mut stored,
            CAPS,
        )
        .await
        .expect("commit");
        assert_eq!(reply, Committed::Reply(WsReply::Done(n)));
        base = n;
    }
    // A fork of the oldest kept version, then its source workspace deleted:
    // what the fork names must stay.
    let fork = WorkspaceId::from_bytes(*uuid::Uuid::new_v4().as_bytes());
    let call = ScriptCall::ws_fork(&rig.keys, &Owner::Admin, &ws, Some(3), &fork, 0);
    let forked = store::scripts::invoke(&mut rig.conn, &call)
        .await
        .expect("fork");
    assert_eq!(forked, WsReply::Done(3));
    let forks: u64 = rig
        .conn
        .hget(rig.keys.workspace_sweep(), "forks")
        .await
        .expect("forks");
    assert_eq!(forks, 1, "the fork was counted for the sweep");
    let call = ScriptCall::ws_delete(&rig.keys, &Owner::Admin, &ws, &Owner::Admin);
    let deleted = store::scripts::invoke(&mut rig.conn, &call)
        .await
        .expect("delete");
    assert!(deleted, "the source workspace is deleted");

    // 11 objects: the shared blob, five own blobs and five manifests. Only
    // the fork's version (the source's 3) is still named: versions 1 and 2
    // were dropped, and 4 and 5 went with their workspace.
    assert_eq!(rig.stored().await.len(), 11);
    let s = swept(rig.sweeper().sweep().await.expect("sweep"));
    assert_eq!((s.listed, s.unnamed, s.deleted), (11, 8, 8), "{s:?}");
    assert_eq!(
        rig.assert_every_version_whole().await,
        1,
        "the fork's version"
    );
    assert_eq!(rig.stored().await.len(), 3, "its manifest and two blobs");

    // The interval holds: a second sweep within it is refused.
    let hour = Duration::from_secs(3600);
    let mut every = Sweeper::new(
        rig.queue.clone(),
        &rig.workspaces,
        Duration::ZERO,
        hour,
        CancellationToken::new(),
    );
    assert_eq!(
        every.sweep().await.expect("sweep"),
        Outcome::NotNow(WsRefusal::Swept)
    );
}

#[tokio::test]
async fn ws_sweep_lets_one_worker_sweep_and_no_save_begin_while_it_deletes() {
    let mut rig = rig().await;
    let keys = rig.keys.clone();
    let mut op = async |op, worker: &str, every: u64| {
        let call = ScriptCall::ws_sweep(&keys, op, worker, 60_000, every);
        store::scripts::invoke(&mut rig.conn, &call)
            .await
            .expect("ws_sweep")
    };
    use shared::scripts::SweepOp::{Begin, Delete, End, Look, Renew};
    let why = |r: WsReply| match r {
        WsReply::Refused { why, .. } => Some(why),
        WsReply::Done(_) => None,
    };
    assert_eq!(
        op(Look, "", 0).await,
        WsReply::Done(0),
        "epoch 0 before any sweep"
    );
    assert_eq!(op(Begin, "w1", 0).await, WsReply::Done(0), "no forks yet");
    assert_eq!(why(op(Begin, "w2", 0).await), Some(WsRefusal::SweepHeld));
    assert_eq!(
        op(Look, "", 0).await,
        WsReply::Done(0),
        "saves begin while it lists"
    );
    assert_eq!(op(Delete, "w1", 0).await, WsReply::Done(0));
    assert_eq!(
        why(op(Look, "", 0).await),
        Some(WsRefusal::Sweeping),
        "but not while it deletes"
    );
    assert_eq!(
        why(op(Renew, "w2", 0).await),
        Some(WsRefusal::SweepLost),
        "only the holder renews"
    );
    assert_eq!(op(Renew, "w1", 0).await, WsReply::Done(0));
    assert_eq!(op(End, "w1", 0).await, WsReply::Done(1));
    assert_eq!(
        op(Look, "", 0).await,
        WsReply::Done(1),
        "the delete phase moved the epoch"
    );
    assert_eq!(
        why(op(End, "w1", 0).await),
        Some(WsRefusal::SweepLost),
        "ended once"
    );
    assert_eq!(
        why(op(Begin, "w2", 3_600_000).await),
        Some(WsRefusal::Swept),
        "swept within the hour"
    );
    assert_eq!(op(Begin, "w2", 0).await, WsReply::Done(0));
    // A holder that dies holds it no longer than its lease.
    let short = ScriptCall::ws_sweep(&rig.keys, Renew, "w2", 200, 0);
    let renewed = store::scripts::invoke(&mut rig.conn, &short)
        .await
        .expect("renew");
    assert_eq!(renewed, WsReply::Done(0));
    let take = ScriptCall::ws_sweep(&rig.keys, Begin, "w3", 60_000, 0);
    testkit::wait_until(
        "w3 takes the sweep once w2's lease ran out",
        Duration::from_secs(10),
        || async {
            let r = store::scripts::invoke(&mut rig.connection().await, &take)
                .await
                .ok()?;
            (r == WsReply::Done(0)).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn saves_racing_sweeps_that_never_stop_all_commit_whole_versions() {
    const WORKSPACES: u64 = 3;
    const ROUNDS: u64 = 4;
    let mut rig = rig().await;
    let stop = CancellationToken::new();
    let ids: Vec<WorkspaceId> = (0..WORKSPACES)
        .map(|_| WorkspaceId::from_bytes(*uuid::Uuid::new_v4().as_bytes()))
        .collect();
    // Every save's files differ (so its blobs are unnamed until its commit),
    // and each has a big one, so a save takes a while; one file stays the
    // same, which a save does not send again (its base has it).
    let mut containers = Vec::new();
    for w in 0..WORKSPACES {
        let mut rounds = Vec::new();
        for r in 1..=ROUNDS {
            rounds.push(rig.paused_container(&format!(
                "echo {w} > same.txt && echo {w}-{r} > own.txt && head -c 4000000 /dev/urandom > big.bin"
            )));
        }
        containers.push(rounds);
    }
    // Sweeps one after another, with no minimum age, all the while.
    let sweeping = CancellationToken::new();
    let mut sweeper = rig.sweeper();
    let sweeps = tokio::spawn({
        let sweeping = sweeping.clone();
        async move {
            let mut deleted = 0;
            while !sweeping.is_cancelled() {
                if let Outcome::Swept(s) = sweeper.sweep().await.expect("sweep") {
                    deleted += s.deleted;
                }
                // A breath between sweeps: back to back, each could move the
                // epoch under every retry of a save.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            deleted
        }
    });
    let mut tasks = Vec::new();
    for (w, ws) in ids.iter().enumerate() {
        let mut claimed = Vec::new();
        // One task at a time per workspace: each is submitted after the last commit.
        claimed.push(rig.claimed_task(ws, 0, true).await);
        tasks.push((ws, claimed, &containers[w]));
    }
    let rig = &rig;
    let saves = tasks.into_iter().map(|(ws, mut claimed, rounds)| {
        let stop = stop.clone();
        async move {
            let (mut base, mut base_manifest) = (0, None);
            for (r, container) in rounds.iter().enumerate() {
                let task = claimed.pop().expect("a claimed task");
                let epoch = sweep::epoch(&rig.queue, &stop).await.expect("epoch");
                let mut stored = rig
                    .workspaces
                    .save(&rig.sandbox, container, base_manifest.as_ref(), epoch)
                    .await
                    .expect("save");
                let reply = sweep::commit(
                    &rig.queue,
                    &rig.workspaces,
                    &stop,
                    &task,
                    (*ws, base),
                    &mut stored,
                    CAPS,
                )
                .await
                .expect("commit");
                assert_eq!(
                    reply,
                    Committed::Reply(WsReply::Done(r as u64 + 1)),
                    "round {r}"
                );
                base = r as u64 + 1;
                base_manifest = Some(
                    rig.workspaces
                        .manifest(&stored.manifest)
                        .await
                        .expect("read"),
                );
                if base < ROUNDS {
                    claimed.push(rig.claimed_task(ws, base, false).await);
                }
            }
        }
    });
    futures_util::future::join_all(saves).await;
    sweeping.cancel();
    let deleted = sweeps.await.expect("the sweeps");
    assert!(
        deleted > 0,
        "the sweeps deleted the dropped versions' objects"
    );
    let kept = rig.assert_every_version_whole().await;
    assert_eq!(kept as u64, WORKSPACES * CAPS.versions_kept);
}
