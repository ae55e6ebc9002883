//! Persistent workspaces on the worker: a version restored into a host
//! directory before the task's container starts (`restore`), and the task's
//! /workspace, read from its container once the task has ended (whatever the
//! end), stored as the next version (`pack`, then the blobs and the manifest
//! uploaded) over the blob store (the `blobs` crate) and this host's cache of
//! it (`cached`).
//!
//! The worker only moves bytes: which version a task starts from and whether
//! its version becomes the head are Redis's (SUBMIT made the workspace busy
//! with the task; WS_COMMIT, run by `Queue::ws_commit` after everything here
//! is stored, moves the head). A save that fails, or a worker that dies
//! mid-save, leaves the head where it was: nothing names the blobs it stored.

pub mod cached;
mod pack;
mod restore;
pub mod sweep;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures_util::{StreamExt, TryStreamExt};
use shared::workspace::{BlobDigest, Manifest, VersionLimits, WorkspaceCaps};

use crate::sandbox::Sandbox;
use blobs::{BlobError, StoreConfig};
use cached::CachedStore;
use pack::PackError;

/// The worker's workspace settings (`WORKSPACE_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceConfig {
    /// `WORKSPACE_STORE` and `WORKSPACE_S3_*`: where blobs are kept.
    pub store: StoreConfig,
    /// `WORKSPACE_CACHE_MB`: this host's blob cache, in bytes.
    pub cache_bytes: u64,
    /// `WORKSPACE_MAX_MB` and `WORKSPACE_MAX_FILES`: the caps on one version.
    pub limits: VersionLimits,
    /// `WORKSPACE_VERSIONS_KEPT`: the newest versions a workspace keeps.
    pub versions_kept: u64,
    /// `WORKSPACE_OWNER_MAX_MB`, in bytes (0: no cap).
    pub owner_max_bytes: u64,
    /// `WORKSPACE_SWEEP_SECONDS`: how often the store is swept of blobs no
    /// kept version names (`sweep`); zero: never.
    pub sweep_every: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error(transparent)]
    Blob(#[from] BlobError),
    #[error(transparent)]
    Pack(#[from] PackError),
    #[error("reading the task's /workspace from the engine: {0}")]
    Archive(#[source] bollard::errors::Error),
    #[error("restoring the workspace's files: {0}")]
    Restore(#[source] std::io::Error),
    #[error("the workspace step stopped: {0}")]
    Join(#[from] tokio::task::JoinError),
    /// What `write_files` asked cannot be made of its version.
    #[error(transparent)]
    Edit(#[from] shared::edit::EditError),
    #[error("reading the files to write: {0}")]
    EditFiles(String),
    #[error("writing to this host's blob cache: {0}")]
    Cache(#[source] std::io::Error),
}

/// A version stored whole, ready for WS_COMMIT.
#[derive(Debug)]
pub struct StoredVersion {
    pub manifest: BlobDigest,
    pub bytes: u64,
    pub entries: u64,
    /// Blobs sent to the store (the rest it had, or this host's base had).
    pub uploaded: u64,
    pub took: Duration,
    /// The sweep epoch the save began in (WS_SWEEP `look`), which WS_COMMIT
    /// checks: a sweep's delete phase since may have deleted a blob it found.
    pub epoch: u64,
    /// What was stored, for `Workspaces::resend` after such a phase: the
    /// manifest, and its blobs the base did not have.
    content: Manifest,
    new: Vec<BlobDigest>,
}

impl StoredVersion {
    /// What WS_COMMIT is told of it.
    pub fn as_saved(&self) -> shared::scripts::Saved<'_> {
        shared::scripts::Saved::Version {
            manifest: &self.manifest,
            bytes: self.bytes,
            files: self.entries,
            epoch: self.epoch,
        }
    }
}

/// This worker's workspaces: the blob store, its cache and the caps.
#[derive(Debug, Clone)]
pub struct Workspaces {
    blobs: CachedStore,
    config: WorkspaceConfig,
    /// The task user, who owns restored files (`TASK_USER`).
    owner: Option<(u32, u32)>,
}

/// How many blobs move at once.
const CONCURRENCY: usize = 8;

impl Workspaces {
    pub fn open(
        config: &WorkspaceConfig,
        cache_dir: PathBuf,
        task_user: &str,
    ) -> Result<Workspaces, BlobError> {
        Ok(Workspaces {
            blobs: CachedStore::open(&config.store, cache_dir, config.cache_bytes)?,
            config: config.clone(),
            owner: crate::source::parse_owner(task_user),
        })
    }

    /// What WS_COMMIT holds a new version to.
    pub fn caps(&self) -> WorkspaceCaps {
        WorkspaceCaps {
            versions_kept: self.config.versions_kept,
            owner_max_bytes: self.config.owner_max_bytes,
        }
    }

    /// Fills `dir` (empty) with the version `m`:
    /// every blob fetched into this host's cache first (downloaded only if
    /// missing there), then the files copied out of it.
    pub async fn restore(&self, m: &Manifest, dir: &Path) -> Result<(), WorkspaceError> {
        let blobs: Vec<BlobDigest> = m.blobs().into_iter().cloned().collect();
        // Which this host has, looked up (and marked as used) in one blocking
        // step rather than one per blob: only the others are fetched.
        let cache = self.blobs.cache().clone();
        let missing = tokio::task::spawn_blocking(move || cache.missing(blobs)).await?;
        futures_util::stream::iter(missing)
            .map(|d| async move { self.blobs.fetch(&d).await })
            .buffer_unordered(CONCURRENCY)
            .try_collect::<Vec<_>>()
            .await?;
        let (cache, dir, owner) = (self.blobs.cache().clone(), dir.to_path_buf(), self.owner);
        let m = m.clone();
        tokio::task::spawn_blocking(move || restore::restore(&m, &cache, &dir, owner))
            .await?
            .map_err(WorkspaceError::Restore)?;
        Ok(())
    }

    /// Stores the /workspace of `container` (paused or exited but not removed)
    /// as a version: packed into the cache, then each blob the store lacks
    /// sent, then the manifest. `base` is the version it started from, whose
    /// blobs the store holds already (a kept version's blobs are never swept,
    /// and the base stays kept until this task's own commit). `epoch`: the
    /// sweep epoch looked up before this began.
    pub async fn save(
        &self,
        sandbox: &Sandbox,
        container: &str,
        base: Option<&Manifest>,
        epoch: u64,
    ) -> Result<StoredVersion, WorkspaceError> {
        let started = Instant::now();
        let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(16);
        let (cache, limits) = (self.blobs.cache().clone(), self.config.limits);
        let packer =
            tokio::task::spawn_blocking(move || pack::pack(ChannelReader::new(rx), &cache, limits));
        let mut archive = std::pin::pin!(sandbox.workspace_archive(container));
        let mut fed = Ok(());
        while let Some(chunk) = archive.next().await {
            match chunk {
                // The packer stopped early (a cap): its error says why.
                Ok(bytes) => {
                    if tx.send(bytes).await.is_err() {
                        break;
                    }
                }
                Err(e) => {
                    fed = Err(WorkspaceError::Archive(e));
                    break;
                }
            }
        }
        drop(tx);
        let packed = packer.await?;
        fed?;
        let packed = packed?;
        if packed.skipped > 0 {
            tracing::info!(
                container,
                skipped = packed.skipped,
                "workspace entries that are no file, directory or link were left out"
            );
        }
        let known = base.map(Manifest::blobs).unwrap_or_default();
        let new: Vec<BlobDigest> = packed
            .manifest
            .blobs()
            .into_iter()
            .filter(|d| !known.contains(d))
            .cloned()
            .collect();
        let (manifest, uploaded) = self.upload(&packed.manifest, &new).await?;
        let cache = self.blobs.cache().clone();
        tokio::task::spawn_blocking(move || cache.evict());
        Ok(StoredVersion {
            manifest,
            bytes: packed.manifest.bytes(),
            entries: packed.manifest.count(),
            uploaded,
            took: started.elapsed(),
            epoch,
            content: packed.manifest,
            new,
        })
    }

    /// Stores `write_files`' edit of `base` as a version: the files in `zip`
    /// (each entry a file, named by its path) hashed into the cache, then the
    /// edit (`shared::edit::edit`: `deletes` first) checked against the caps,
    /// then the blobs `base` lacks and the manifest sent. `epoch`: as `save`'s.
    /// The version, and how many files were written.
    pub async fn edit(
        &self,
        base: &Manifest,
        zip: Option<std::sync::Arc<[u8]>>,
        deletes: &[String],
        epoch: u64,
    ) -> Result<(StoredVersion, usize), WorkspaceError> {
        let stored = self.edit_stored(base, zip, deletes, epoch).await;
        // Whatever came of it: the files hashed into the cache count against
        // its cap from now on, a refused edit's as well.
        let cache = self.blobs.cache().clone();
        tokio::task::spawn_blocking(move || cache.evict());
        stored
    }

    /// `edit`'s work, before the cache is evicted.
    async fn edit_stored(
        &self,
        base: &Manifest,
        zip: Option<std::sync::Arc<[u8]>>,
        deletes: &[String],
        epoch: u64,
    ) -> Result<(StoredVersion, usize), WorkspaceError> {
        let started = Instant::now();
        let cache = self.blobs.cache().clone();
        let written = match zip {
            None => Vec::new(),
            Some(zip) => {
                tokio::task::spawn_blocking(move || pack::hash_zip(&zip, &cache)).await??
            }
        };
        let manifest = shared::edit::edit(base, &written, deletes, self.config.limits)?;
        let known = base.blobs();
        let new: Vec<BlobDigest> = manifest
            .blobs()
            .into_iter()
            .filter(|d| !known.contains(d))
            .cloned()
            .collect();
        let (digest, uploaded) = self.upload(&manifest, &new).await?;
        let stored = StoredVersion {
            manifest: digest,
            bytes: manifest.bytes(),
            entries: manifest.count(),
            uploaded,
            took: started.elapsed(),
            epoch,
            content: manifest,
            new,
        };
        Ok((stored, written.len()))
    }

    /// Sends `stored` again, for a commit in sweep epoch `epoch`: each of its
    /// new blobs the store no longer holds fresh (a delete phase ran since it
    /// was checked), then its manifest. Their bytes are still in this host's
    /// cache, which keeps what a save used for the save grace.
    pub async fn resend(
        &self,
        stored: &mut StoredVersion,
        epoch: u64,
    ) -> Result<(), WorkspaceError> {
        let (manifest, uploaded) = self.upload(&stored.content, &stored.new).await?;
        (stored.manifest, stored.epoch) = (manifest, epoch);
        stored.uploaded += uploaded;
        Ok(())
    }

    /// Sends each of `new` the store lacks (or holds stale), then `content`:
    /// the manifest's digest and the count of blobs sent.
    async fn upload(
        &self,
        content: &Manifest,
        new: &[BlobDigest],
    ) -> Result<(BlobDigest, u64), WorkspaceError> {
        // Owned digests: a stream of borrowed ones makes the future not `Send`
        // (rust-lang/rust#102211).
        let sent = futures_util::stream::iter(new.to_vec())
            .map(|d| async move { self.blobs.store_blob(&d).await })
            .buffer_unordered(CONCURRENCY)
            .try_collect::<Vec<bool>>()
            .await?;
        let manifest = self.blobs.put_manifest(content).await?;
        Ok((manifest, sent.into_iter().filter(|&s| s).count() as u64))
    }

    /// The blob store itself, for the sweep.
    pub fn store(&self) -> &blobs::BlobStore {
        self.blobs.store()
    }

    /// How often the store is swept (zero: never).
    pub fn sweep_every(&self) -> Duration {
        self.config.sweep_every
    }

    /// The caps a stored manifest is read under.
    pub fn limits(&self) -> VersionLimits {
        self.config.limits
    }

    /// The manifest of a version, for a save that starts from it.
    pub async fn manifest(&self, digest: &BlobDigest) -> Result<Manifest, WorkspaceError> {
        Ok(self.blobs.manifest(digest, self.config.limits).await?)
    }
}

/// The archive's bytes, as the blocking packer reads them.
struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<bytes::Bytes>,
    chunk: bytes::Bytes,
}

impl ChannelReader {
    fn new(rx: tokio::sync::mpsc::Receiver<bytes::Bytes>) -> ChannelReader {
        ChannelReader {
            rx,
            chunk: bytes::Bytes::new(),
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.chunk.is_empty() {
            match self.rx.blocking_recv() {
                Some(c) => self.chunk = c,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk[..n]);
        self.chunk = self.chunk.slice(n..);
        Ok(n)
    }
}
