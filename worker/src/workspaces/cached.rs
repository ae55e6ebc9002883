//! This host's side of the blob store (`blobs::BlobStore`): a bounded cache
//! of the blobs it used last, so a task restored on the host that saved its
//! version downloads nothing, and the store reached through it (a blob is
//! uploaded from the cache, and downloaded into it).

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path as FsPath, PathBuf};
use std::time::{Duration, SystemTime};

use blobs::{BlobError, BlobStore, StoreConfig};
use futures_util::StreamExt;
use sha2::{Digest as _, Sha256};
use shared::workspace::{BlobDigest, Manifest, VersionLimits};
use tokio::io::AsyncWriteExt;

/// The blob store and this host's cache of it.
#[derive(Debug, Clone)]
pub struct CachedStore {
    store: BlobStore,
    cache: BlobCache,
}

impl CachedStore {
    /// Opens the store, with its cache in `cache_dir` (made if missing)
    /// holding at most `cache_bytes`.
    pub fn open(
        config: &StoreConfig,
        cache_dir: PathBuf,
        cache_bytes: u64,
    ) -> Result<CachedStore, BlobError> {
        let store = BlobStore::open(config)?;
        // What a worker that died mid-write left is never a blob: gone.
        let tmp = cache_dir.join("tmp");
        if tmp.symlink_metadata().is_ok() {
            std::fs::remove_dir_all(&tmp)?;
        }
        std::fs::create_dir_all(&tmp)?;
        Ok(CachedStore {
            store,
            cache: BlobCache {
                dir: cache_dir,
                cap_bytes: cache_bytes,
            },
        })
    }

    pub fn store(&self) -> &BlobStore {
        &self.store
    }

    pub fn cache(&self) -> &BlobCache {
        &self.cache
    }

    pub async fn put_manifest(&self, m: &Manifest) -> Result<BlobDigest, BlobError> {
        self.store.put_manifest(m).await
    }

    pub async fn manifest(
        &self,
        d: &BlobDigest,
        limits: VersionLimits,
    ) -> Result<Manifest, BlobError> {
        self.store.manifest(d, limits).await
    }

    /// Makes sure the store holds blob `d`, whose bytes are the cached file:
    /// uploaded unless the store has a copy written within `blobs::FRESH_FOR`.
    /// Returns whether it was uploaded.
    pub async fn store_blob(&self, d: &BlobDigest) -> Result<bool, BlobError> {
        if self.store.has_fresh(d).await {
            return Ok(false);
        }
        self.store.upload(d, &self.cache.path(d)).await?;
        Ok(true)
    }

    /// The cached file of blob `d`, downloaded into the cache first if this
    /// host does not have it (and checked against its name on the way).
    pub async fn fetch(&self, d: &BlobDigest) -> Result<PathBuf, BlobError> {
        let cached = self.cache.path(d);
        if tokio::fs::symlink_metadata(&cached).await.is_ok() {
            self.cache.touch(&cached).await;
            return Ok(cached);
        }
        let tmp = self.cache.tmp_path();
        let result = async {
            let mut stream = self.store.stream(d).await?;
            let mut out = tokio::fs::File::create(&tmp).await?;
            let mut hash = Sha256::new();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                hash.update(&chunk);
                out.write_all(&chunk).await?;
            }
            out.flush().await?;
            if &BlobDigest::from_hasher(hash) != d {
                return Err(BlobError::Corrupt(d.clone()));
            }
            self.cache.insert(&tmp, d).await?;
            Ok(cached)
        }
        .await;
        if result.is_err() {
            let _ = tokio::fs::remove_file(&tmp).await;
        }
        result
    }
}

/// This host's blob cache: `<dir>/<sha256>`, each file a blob's bytes, with a
/// `tmp/` for files being written. Only the worker writes here.
#[derive(Debug, Clone)]
pub struct BlobCache {
    dir: PathBuf,
    cap_bytes: u64,
}

impl BlobCache {
    #[cfg(test)]
    pub fn for_tests(dir: PathBuf) -> BlobCache {
        BlobCache {
            dir,
            cap_bytes: u64::MAX,
        }
    }

    pub fn path(&self, d: &BlobDigest) -> PathBuf {
        self.dir.join(d.as_str())
    }

    /// A fresh name in `tmp/`.
    pub fn tmp_path(&self) -> PathBuf {
        self.dir.join("tmp").join(uuid::Uuid::new_v4().to_string())
    }

    /// Moves a written file into place as blob `d` (a rename: readers see all
    /// of it or nothing).
    pub async fn insert(&self, tmp: &FsPath, d: &BlobDigest) -> std::io::Result<()> {
        tokio::fs::rename(tmp, self.path(d)).await
    }

    /// The blobs of `wanted` this cache lacks; those it has are marked as just
    /// used (blocking: call on the blocking pool).
    pub fn missing(&self, wanted: Vec<BlobDigest>) -> Vec<BlobDigest> {
        let now = SystemTime::now();
        wanted
            .into_iter()
            .filter(|d| {
                let found = std::fs::File::options()
                    .write(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(self.path(d))
                    .and_then(|f| f.set_modified(now));
                found.is_err()
            })
            .collect()
    }

    /// Marks a blob as just used, so eviction takes it last.
    async fn touch(&self, path: &FsPath) {
        let path = path.to_path_buf();
        let _ = tokio::task::spawn_blocking(move || {
            std::fs::File::options()
                .write(true)
                .open(&path)
                .and_then(|f| f.set_modified(SystemTime::now()))
        })
        .await;
    }

    /// Removes the least recently used blobs until the cache is under its cap
    /// (blocking: call on the blocking pool). The store keeps every blob, so
    /// an evicted one is only downloaded again. A blob used within the save
    /// grace is never removed: a restore or a save under way may still read it.
    pub fn evict(&self) -> std::io::Result<u64> {
        let mut files = Vec::new();
        let mut total = 0u64;
        let in_use = Duration::from_millis(shared::workspace::SAVE_GRACE_MS);
        // An entry gone meanwhile (another eviction) is skipped, not an error.
        for entry in std::fs::read_dir(&self.dir)?.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_file() {
                total += meta.len();
                let Ok(used) = meta.modified() else { continue };
                files.push((used, meta.len(), entry.path()));
            }
        }
        files.sort();
        let mut removed = 0;
        for (used, len, path) in files {
            if total <= self.cap_bytes || used.elapsed().is_ok_and(|age| age < in_use) {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
                removed += 1;
            }
        }
        Ok(removed)
    }
}
