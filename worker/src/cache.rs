//! The owners' dependency caches on this worker host: pip's and npm's files,
//! kept between the tasks of one owner, never shared between owners
//! (docs/sandbox.md, "Dependency caches", says why this design).
//!
//! Layout, under `TASKS_DIR/cache-<worker>/` (the worker's alone, 0700):
//! - `owners/<owner_id>/`: an owner's cache while no task holds it, owned by
//!   the task user; `owners/<owner_id>.gen`: the clear generations it was made
//!   under (`shared::cache::Generations`).
//! - `lent/<task_id>/`: a cold task's mount directory (the worker's, 0755).
//!
//! A task container gets a directory of the worker's mounted at `CACHE_MOUNT`
//! (a pool container at its creation, a cold one at its own). Lending an
//! owner's cache is one `rename` of `owners/<id>` into that directory, as
//! `c`: O(1), and it works for a pool container that is already running,
//! since a bind mount is a live view of its host directory. The task's
//! `PIP_CACHE_DIR` and `npm_config_cache` point into it. Giving it back is the
//! rename the other way, after the container is gone (so nothing of the task
//! runs while the worker walks the tree); then links and special files are
//! removed, the owner's cap is applied (oldest files first), and the total cap
//! (least recently used owners first). A cache is lent to one task at a time:
//! a second task of the same owner running meanwhile gets none (its tools use
//! their default, empty, directories in its /tmp).
//!
//! The task cannot replace `c` (its parent is the worker's), and every walk
//! here uses `symlink_metadata` and never follows a link, so nothing the task
//! leaves in its cache makes the worker touch anything outside it.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use shared::WorkerName;
use shared::cache::Generations;

use crate::config::CacheConfig;
use crate::metrics::{CacheLend, Metrics};

/// Where a task container sees its cache directory (a cache lent to it is
/// `c` inside).
pub const CACHE_MOUNT: &str = "/.sr-cache";

/// Where worker `worker` keeps its caches: a `WorkerName`, so one directory
/// of `tasks_dir`, whatever a name read from Redis held.
fn root_of(tasks_dir: &Path, worker: &WorkerName) -> PathBuf {
    tasks_dir.join(format!("cache-{worker}"))
}

/// Makes a worker's cache directory (the worker's alone) with `owners/` and
/// `lent/`, where missing.
fn make_root(root: &Path) -> io::Result<()> {
    for dir in [root.to_path_buf(), root.join("owners"), root.join("lent")] {
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    fs::set_permissions(root, fs::Permissions::from_mode(0o700))
}

/// Where `open` sets the previous run's `lent/` aside until `drop_stale`
/// (with a suffix of its own).
const STALE_LENT: &str = "lent.stale";

/// The name a lent cache has inside its mount directory.
const LENT_NAME: &str = "c";

/// The variables that point the tools at a lent cache, and where.
const TOOL_DIRS: [(&str, &str); 2] = [("PIP_CACHE_DIR", "pip"), ("npm_config_cache", "npm")];

/// An owner's cache, lent to one task.
#[derive(Debug)]
pub struct Lease {
    owner_id: String,
    /// The mount directory it was renamed into.
    mount: PathBuf,
    /// Whether the mount directory is a cold task's own (`lent/<task_id>`),
    /// removed when the cache comes back.
    own_mount: bool,
}

impl Lease {
    /// The variables a task with this cache gets, before its own (a task may
    /// still point a tool elsewhere through `env`).
    pub fn env(&self) -> Vec<(String, String)> {
        TOOL_DIRS
            .iter()
            .map(|(var, dir)| {
                (
                    (*var).to_owned(),
                    format!("{CACHE_MOUNT}/{LENT_NAME}/{dir}"),
                )
            })
            .collect()
    }

    /// A cold task's mount directory, to mount at `CACHE_MOUNT`; `None` for a
    /// pool container's (mounted already).
    pub fn cold_mount(&self) -> Option<&Path> {
        self.own_mount.then_some(self.mount.as_path())
    }
}

/// What the worker knows of one owner's cache.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Disk bytes (allocated blocks) when it last came back.
    bytes: u64,
    last_used: SystemTime,
    lent: bool,
    /// Lent, but its task has ended: it comes back as soon as the task's
    /// container is removed.
    returning: bool,
}

/// The caches of this worker. Clones share them.
#[derive(Clone)]
pub struct Caches {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    root: PathBuf,
    config: CacheConfig,
    /// The task user, who owns an owner's cache directory.
    owner: (u32, u32),
    metrics: Metrics,
    entries: Mutex<HashMap<String, Entry>>,
    /// Woken when a cache comes back.
    returned: tokio::sync::Notify,
}

/// How long a task waits for its owner's cache whose previous task has ended
/// but whose container is still being removed (the task's record is final
/// before that, so the owner's next task often comes meanwhile).
const RETURN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Caches {
    /// No caches (`CACHE_MB_PER_OWNER=0`).
    pub fn off() -> Caches {
        Caches { inner: None }
    }

    /// Opens this worker's caches under `TASKS_DIR/cache-<worker>`: sets aside
    /// caches that were lent when a previous run died (for `drop_stale`), and
    /// measures the others. With
    /// caches turned off, removes what a previous run kept. Blocking.
    pub fn open(
        tasks_dir: &Path,
        worker: &WorkerName,
        config: CacheConfig,
        task_user: &str,
        metrics: Metrics,
    ) -> io::Result<Caches> {
        let root = root_of(tasks_dir, worker);
        if !config.enabled() {
            remove_tree(&root);
            return Ok(Caches::off());
        }
        let Some(owner) = crate::source::parse_owner(task_user) else {
            return Err(io::Error::other(format!(
                "TASK_USER {task_user:?} is not uid:gid"
            )));
        };
        // The previous run's lent caches go aside at once (a rename), and are
        // removed only after recovery removed that run's containers
        // (`drop_stale`): until then a container may still write into them,
        // and a removal racing it could leave files behind.
        // Each run's under a name of its own, so one a failed start left is
        // never removed here, before recovery, nor in the way of this rename.
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let stale = root.join(format!("{STALE_LENT}.{nanos}"));
        match fs::rename(root.join("lent"), &stale) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        make_root(&root)?;
        // An owner's cache is given to the task user: a worker that may not
        // (not root) keeps none, rather than failing at every task.
        let probe = root.join("probe");
        remove_tree(&probe);
        fs::create_dir(&probe)?;
        let given = std::os::unix::fs::chown(&probe, Some(owner.0), Some(owner.1));
        remove_tree(&probe);
        given?;
        let mut entries = HashMap::new();
        for e in fs::read_dir(root.join("owners"))? {
            let e = e?;
            let Ok(name) = e.file_name().into_string() else {
                continue;
            };
            let meta = e.path().symlink_metadata()?;
            if meta.is_dir() && is_owner_id(&name) {
                let bytes = match walk(&e.path()) {
                    Ok(walked) => walked.bytes(),
                    Err(err) => {
                        tracing::warn!(owner_id = name, error = %err, "dependency cache cannot be walked; dropped");
                        remove_tree(&e.path());
                        continue;
                    }
                };
                // The worker's own `.gen` file says when it was last lent: the
                // directory's times are the task's to set.
                let last_used =
                    fs::symlink_metadata(root.join("owners").join(format!("{name}.gen")))
                        .and_then(|m| m.modified())
                        .unwrap_or(SystemTime::UNIX_EPOCH);
                entries.insert(
                    name,
                    Entry {
                        bytes,
                        last_used,
                        lent: false,
                        returning: false,
                    },
                );
            }
        }
        // A cap lowered since the last run applies now, not at each owner's
        // next return.
        for id in over_total(&mut entries, config.total_bytes) {
            remove_tree(&root.join("owners").join(&id));
            let _ = fs::remove_file(root.join("owners").join(format!("{id}.gen")));
            entries.remove(&id);
        }
        tracing::info!(
            owners = entries.len(),
            dir = %root.display(),
            "dependency caches opened"
        );
        Ok(Caches {
            inner: Some(Arc::new(Inner {
                root,
                config,
                owner,
                metrics,
                entries: Mutex::new(entries),
                returned: tokio::sync::Notify::new(),
            })),
        })
    }

    pub fn enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Removes every cache of worker `worker` on this host: the reaper's, for a
    /// worker it found lost (silent since `silent_since`) and forgot, so caches
    /// left under names that never come back (a worker re-created under a new
    /// name) do not fill the disk. Left alone if a process back under that
    /// name opened them since (`open` always changes the directory itself);
    /// otherwise renamed away first, so such a process starting meanwhile
    /// makes a new directory instead of losing files from under it.
    pub async fn remove_of(tasks_dir: &Path, worker: &WorkerName, silent_since: SystemTime) {
        let root = root_of(tasks_dir, worker);
        let gone = tasks_dir.join(format!(
            ".gone-cache-{worker}-{}",
            uuid::Uuid::new_v4().simple()
        ));
        let _ = tokio::task::spawn_blocking(move || {
            let opened = fs::symlink_metadata(&root).and_then(|m| m.modified());
            if opened.is_ok_and(|t| t <= silent_since) && fs::rename(&root, &gone).is_ok() {
                remove_tree(&gone);
            }
        })
        .await;
    }

    /// Removes the previous runs' lent caches, which `open` set aside: call it
    /// once recovery has removed those runs' containers.
    pub async fn drop_stale(&self) {
        if let Some(inner) = &self.inner {
            let root = inner.root.clone();
            let _ = tokio::task::spawn_blocking(move || {
                for e in fs::read_dir(&root).into_iter().flatten().flatten() {
                    if e.file_name().to_string_lossy().starts_with(STALE_LENT) {
                        remove_tree(&e.path());
                    }
                }
            })
            .await;
        }
    }

    /// A cold task's mount directory to be: `lent/<task_id>`.
    pub fn cold_mount(&self, task_id: &str) -> Option<PathBuf> {
        self.inner
            .as_ref()
            .map(|i| i.root.join("lent").join(task_id))
    }

    /// Lends owner `owner_id`'s cache into `mount` (a pool container's mount
    /// directory, or with `own_mount` a cold task's, made here), emptied first
    /// if a clear was asked for since it was made (`current`). `None`: no
    /// cache for this task (turned off, held by another task of the owner, or
    /// the file system refused; logged).
    pub async fn lend(
        &self,
        owner_id: &str,
        current: Generations,
        mount: PathBuf,
        own_mount: bool,
    ) -> Option<Lease> {
        let inner = self.inner.clone()?;
        let deadline = tokio::time::Instant::now() + RETURN_WAIT;
        loop {
            let returned = inner.returned.notified();
            tokio::pin!(returned);
            // Registered before the state is read, so a return in between
            // still wakes this wait.
            returned.as_mut().enable();
            {
                let mut entries = inner.lock();
                let entry = entries.entry(owner_id.to_owned()).or_insert(Entry {
                    bytes: 0,
                    last_used: SystemTime::now(),
                    lent: false,
                    returning: false,
                });
                if !entry.lent {
                    entry.lent = true;
                    break;
                }
                if !entry.returning {
                    inner.metrics.cache_lend(CacheLend::Busy);
                    return None;
                }
            }
            if tokio::time::timeout_at(deadline, returned).await.is_err() {
                inner.metrics.cache_lend(CacheLend::Busy);
                return None;
            }
        }
        let id = owner_id.to_owned();
        let lent = {
            let inner = inner.clone();
            let mount = mount.clone();
            tokio::task::spawn_blocking(move || inner.lend(&id, current, &mount, own_mount)).await
        };
        match lent.map_err(io::Error::other).and_then(|r| r) {
            Ok(result) => {
                inner.metrics.cache_lend(result);
                Some(Lease {
                    owner_id: owner_id.to_owned(),
                    mount,
                    own_mount,
                })
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not lend a dependency cache; the task runs without");
                if let Some(entry) = inner.lock().get_mut(owner_id) {
                    entry.lent = false;
                    entry.returning = false;
                }
                inner.returned.notify_waiters();
                if own_mount {
                    let _ = tokio::task::spawn_blocking(move || remove_tree(&mount)).await;
                }
                None
            }
        }
    }

    /// Says that a lease's task has ended: the owner's next task waits for the
    /// cache (`RETURN_WAIT` at most) rather than going without.
    pub fn returning(&self, lease: &Lease) {
        if let Some(inner) = &self.inner
            && let Some(entry) = inner.lock().get_mut(&lease.owner_id)
        {
            entry.returning = true;
        }
    }

    /// Drops a lent cache without looking into it: for a task whose container
    /// could not be removed, so something may still be writing in it. The
    /// worker never walks a tree a task can still change; `remove_dir_all`
    /// does not follow links.
    pub async fn forfeit(&self, lease: Lease) {
        let Some(inner) = self.inner.clone() else {
            return;
        };
        tracing::warn!(
            owner_id = lease.owner_id,
            "dependency cache dropped: its task's container may still be running"
        );
        inner.lock().remove(&lease.owner_id);
        let _ = tokio::task::spawn_blocking(move || {
            remove_tree(&lease.mount.join(LENT_NAME));
            if lease.own_mount {
                remove_tree(&lease.mount);
            }
        })
        .await;
        inner.metrics.cache_evicted(0, 1);
        inner.returned.notify_waiters();
    }

    /// Takes a cache back once its task's container is gone, and applies the
    /// caps. Never fails: a cache that cannot be taken back is dropped.
    pub async fn give_back(&self, lease: Lease) {
        let Some(inner) = self.inner.clone() else {
            return;
        };
        let owner_id = lease.owner_id.clone();
        let done = {
            let inner = inner.clone();
            tokio::task::spawn_blocking(move || inner.give_back(lease)).await
        };
        if let Err(e) = done {
            tracing::warn!(error = %e, "giving a dependency cache back stopped");
            inner.lock().remove(&owner_id);
        }
        inner.returned.notify_waiters();
    }
}

impl Inner {
    /// Only held for a lookup or an update, never across file I/O.
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn owner_dir(&self, owner_id: &str) -> PathBuf {
        self.root.join("owners").join(owner_id)
    }

    fn generations_file(&self, owner_id: &str) -> PathBuf {
        self.root.join("owners").join(format!("{owner_id}.gen"))
    }

    fn lend(
        &self,
        owner_id: &str,
        current: Generations,
        mount: &Path,
        own_mount: bool,
    ) -> io::Result<CacheLend> {
        // Made again if gone: a reaper that took this worker for lost while it
        // restarted under its name removed them (`Caches::remove_of`).
        make_root(&self.root)?;
        let dir = self.owner_dir(owner_id);
        let gen_file = self.generations_file(owner_id);
        let recorded = fs::read_to_string(&gen_file)
            .ok()
            .and_then(|t| Generations::parse(&t));
        let exists = dir.symlink_metadata().is_ok_and(|m| m.is_dir());
        if exists && recorded != Some(current) {
            // Cleared since it was made (or made by a run that did not record
            // its generations): emptied before anyone uses it.
            tracing::info!(owner_id, "dependency cache cleared as asked");
            fs::remove_dir_all(&dir)?;
            self.metrics.cache_evicted(0, 1);
        }
        let fresh = !dir.symlink_metadata().is_ok_and(|m| m.is_dir());
        if fresh {
            fs::create_dir(&dir)?;
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
            std::os::unix::fs::chown(&dir, Some(self.owner.0), Some(self.owner.1))?;
        }
        if recorded != Some(current) || fresh {
            fs::write(&gen_file, current.to_text())?;
        }
        let result = if fs::read_dir(&dir)?.next().is_some() {
            CacheLend::Hit
        } else {
            CacheLend::Miss
        };
        if own_mount {
            fs::create_dir(mount)?;
            fs::set_permissions(mount, fs::Permissions::from_mode(0o755))?;
        }
        fs::rename(&dir, mount.join(LENT_NAME))?;
        Ok(result)
    }

    fn give_back(&self, lease: Lease) {
        let lent = lease.mount.join(LENT_NAME);
        let dir = self.owner_dir(&lease.owner_id);
        // The task could not replace `c` (its parent is the worker's), but a
        // cache that is not a plain directory any more is not taken back.
        let back = match lent.symlink_metadata() {
            Ok(m) if m.is_dir() => fs::rename(&lent, &dir),
            Ok(_) => Err(io::Error::other("the lent cache is no longer a directory")),
            Err(e) => Err(e),
        };
        if lease.own_mount {
            remove_tree(&lease.mount);
        }
        let bytes = match back.and_then(|()| trim(&dir, self.config.per_owner_bytes)) {
            Ok(evicted) => {
                self.metrics.cache_evicted(evicted.files, 0);
                Some(evicted.kept_bytes)
            }
            Err(e) => {
                tracing::warn!(owner_id = lease.owner_id, error = %e, "dependency cache not taken back; dropped");
                remove_tree(&lent);
                remove_tree(&dir);
                None
            }
        };
        let now = SystemTime::now();
        let victims = {
            let mut entries = self.lock();
            match bytes {
                Some(bytes) => {
                    entries.insert(
                        lease.owner_id.clone(),
                        Entry {
                            bytes,
                            last_used: now,
                            lent: false,
                            returning: false,
                        },
                    );
                }
                None => {
                    entries.remove(&lease.owner_id);
                }
            }
            over_total(&mut entries, self.config.total_bytes)
        };
        for id in &victims {
            tracing::info!(
                owner_id = id,
                "dependency cache evicted: CACHE_TOTAL_MB reached"
            );
            remove_tree(&self.owner_dir(id));
            let _ = fs::remove_file(self.generations_file(id));
        }
        // Held as lent while they were removed, so no task was lent a
        // half-removed cache; forgotten only now.
        {
            let mut entries = self.lock();
            for id in &victims {
                entries.remove(id);
            }
        }
        self.metrics.cache_evicted(0, victims.len() as u64);
    }
}

/// Picks the least recently used caches (not lent) to remove until the total
/// is within `cap`, and marks them lent (busy) until the caller has removed
/// them and forgets them.
fn over_total(entries: &mut HashMap<String, Entry>, cap: u64) -> Vec<String> {
    let mut total: u64 = entries.values().map(|e| e.bytes).sum();
    let mut idle: Vec<(SystemTime, String)> = entries
        .iter()
        .filter(|(_, e)| !e.lent)
        .map(|(id, e)| (e.last_used, id.clone()))
        .collect();
    idle.sort();
    let mut victims = Vec::new();
    for (_, id) in idle {
        if total <= cap {
            break;
        }
        if let Some(e) = entries.get_mut(&id) {
            e.lent = true;
            total = total.saturating_sub(e.bytes);
            victims.push(id);
        }
    }
    victims
}

/// A regular file in a cache.
struct File {
    path: PathBuf,
    /// Allocated bytes (a sparse file costs what it occupies).
    bytes: u64,
    /// The later of its last access and change, as far as the mount keeps
    /// them: how recently a task used it.
    used: SystemTime,
}

/// What `trim` left and removed.
struct Trimmed {
    kept_bytes: u64,
    files: u64,
}

/// Keeps only directories and regular files in `dir` (links, pipes and the
/// like are removed, never followed), then removes the least recently used
/// files until the rest fits in `cap`. An error (a part of the tree that
/// cannot be read, or directories alone over the cap) means the caller drops
/// the whole cache: a tree the worker cannot account for is not kept.
fn trim(dir: &Path, cap: u64) -> io::Result<Trimmed> {
    let walked = walk(dir)?;
    let mut total = walked.bytes();
    let mut files = walked.files;
    let mut removed = 0;
    if total > cap {
        files.sort_by_key(|f| f.used);
        for f in files {
            if total <= cap {
                break;
            }
            if fs::remove_file(&f.path).is_ok() {
                total = total.saturating_sub(f.bytes);
                removed += 1;
            }
        }
    }
    if total > cap {
        return Err(io::Error::other(format!(
            "still {total} bytes over a cap of {cap} with its files removed"
        )));
    }
    Ok(Trimmed {
        kept_bytes: total,
        files: removed,
    })
}

/// What `walk` found: the regular files, and what the directories themselves
/// occupy (counted, so a tree of empty directories is not free).
struct Walked {
    files: Vec<File>,
    dir_bytes: u64,
}

impl Walked {
    fn bytes(&self) -> u64 {
        self.dir_bytes + self.files.iter().map(|f| f.bytes).sum::<u64>()
    }
}

/// Every regular file under `dir`, walked without following a link;
/// anything else that is not a directory is removed on the way (the tools
/// keep plain files, and the worker keeps nothing it would have to follow).
/// Only called on a tree no task can change any more (its container is
/// gone). A directory that cannot be read (nested past `PATH_MAX`, say) is an
/// error, not a part skipped: its files would escape both caps.
fn walk(dir: &Path) -> io::Result<Walked> {
    let mut found = Walked {
        files: Vec::new(),
        dir_bytes: 0,
    };
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d)? {
            let path = e?.path();
            let meta = path.symlink_metadata()?;
            let kind = meta.file_type();
            if kind.is_dir() {
                found.dir_bytes += meta.blocks() * 512;
                stack.push(path);
            } else if kind.is_file() {
                found.files.push(File {
                    path,
                    bytes: meta.blocks() * 512,
                    used: meta
                        .accessed()
                        .unwrap_or(SystemTime::UNIX_EPOCH)
                        .max(meta.modified().unwrap_or(SystemTime::UNIX_EPOCH)),
                });
            } else {
                // A link (or pipe, socket): unlink removes the entry itself.
                fs::remove_file(&path)?;
            }
        }
    }
    Ok(found)
}

/// An owner's cache name: `shared::cache::owner_id`'s 64 hex digits.
fn is_owner_id(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Removes a directory tree, never following a link (`remove_dir_all` does
/// not); a missing one is fine.
fn remove_tree(dir: &Path) {
    if let Err(e) = fs::remove_dir_all(dir)
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %dir.display(), error = %e, "could not remove a cache directory");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sr-cache-unit-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).expect("tmp dir");
        d
    }

    #[test]
    fn trimming_removes_links_without_following_them_and_the_oldest_files_first() {
        let base = tmp("trim");
        let outside = base.join("outside");
        fs::create_dir(&outside).expect("outside");
        fs::write(outside.join("precious"), vec![1u8; 64 * 1024]).expect("precious");
        let cache = base.join("cache");
        fs::create_dir_all(cache.join("pip/http")).expect("cache");
        symlink(&outside, cache.join("pip/escape")).expect("link dir");
        symlink(outside.join("precious"), cache.join("npm-link")).expect("link file");
        let old = cache.join("pip/http/old");
        let new = cache.join("pip/http/new");
        fs::write(&old, vec![2u8; 64 * 1024]).expect("old");
        fs::write(&new, vec![3u8; 64 * 1024]).expect("new");
        let past = SystemTime::now() - std::time::Duration::from_secs(3600);
        fs::File::options()
            .write(true)
            .open(&old)
            .and_then(|f| f.set_times(fs::FileTimes::new().set_accessed(past).set_modified(past)))
            .expect("age old");
        let t = trim(&cache, 100 * 1024).expect("trimmed");
        assert_eq!(t.files, 1);
        assert!(!old.exists() && new.exists());
        assert!(cache.join("pip/escape").symlink_metadata().is_err());
        assert!(cache.join("npm-link").symlink_metadata().is_err());
        assert_eq!(
            fs::read(outside.join("precious")).expect("kept").len(),
            64 * 1024
        );
        let _ = fs::remove_dir_all(&base);
    }

    fn entry(last_used: SystemTime, lent: bool) -> Entry {
        Entry {
            bytes: 50,
            last_used,
            lent,
            returning: false,
        }
    }

    #[test]
    fn the_total_cap_evicts_least_recently_used_idle_owners() {
        let t0 = SystemTime::UNIX_EPOCH;
        let at = |s| t0 + std::time::Duration::from_secs(s);
        let mut entries = HashMap::from([
            ("old".to_owned(), entry(at(1), false)),
            ("busy".to_owned(), entry(at(0), true)),
            ("mid".to_owned(), entry(at(2), false)),
            ("new".to_owned(), entry(at(3), false)),
        ]);
        let victims = over_total(&mut entries, 100);
        assert_eq!(victims, ["old", "mid"]);
        // Held as lent (no task is lent one being removed) until forgotten.
        assert!(victims.iter().all(|id| entries[id].lent));
        assert!(entries.contains_key("busy") && entries.contains_key("new"));
        for id in &victims {
            entries.remove(id);
        }
        assert!(over_total(&mut entries, 100).is_empty());
    }
}
