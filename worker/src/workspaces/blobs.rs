//! Where a workspace's files live: content-addressed blobs and manifests in an
//! `object_store` (a local directory, or any S3 server), and this host's bounded
//! cache of the blobs it used last, so a task restored on the host that saved
//! its version downloads nothing.
//!
//! Layout in the store, under its prefix: `blobs/<first two hex digits>/<sha256>`
//! (a file's bytes) and `manifests/<sha256>` (a version's `Manifest`, JSON). A
//! blob is written whole or not at all (a local file is renamed into place, an
//! S3 object appears when its upload completes), and read back it is checked
//! against its name, so no reader ever sees half of one, or a wrong one.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use sha2::{Digest as _, Sha256};
use shared::workspace::{BlobDigest, Manifest, ManifestError, StoreLocation, VersionLimits};
use tokio::io::AsyncWriteExt;

/// What the S3 store needs besides its bucket (`WORKSPACE_S3_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct S3Settings {
    /// `WORKSPACE_S3_ENDPOINT`: an S3-compatible server's URL (Garage, MinIO,
    /// Ceph, R2); empty: AWS.
    pub endpoint: Option<String>,
    /// `WORKSPACE_S3_REGION`.
    pub region: String,
    /// `WORKSPACE_S3_ACCESS_KEY_ID` and `WORKSPACE_S3_SECRET_ACCESS_KEY`.
    pub access_key_id: String,
    pub secret_access_key: String,
}

#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    #[error("the workspace store: {0}")]
    Store(#[from] object_store::Error),
    #[error("the workspace blob cache: {0}")]
    Cache(#[from] std::io::Error),
    #[error("blob {0} in the workspace store does not hold what its name says")]
    Corrupt(BlobDigest),
    #[error("a stored manifest: {0}")]
    Manifest(#[from] ManifestError),
}

/// The blob store and this host's cache of it.
#[derive(Debug, Clone)]
pub struct BlobStore {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    cache: BlobCache,
}

/// A blob written within this long is not uploaded again by a save that needs
/// it: a blob older than this is written again (refreshing its age), so the
/// reaper's sweep, which deletes only unreferenced blobs older than the save
/// grace, never deletes one a committing version names.
pub const FRESH_FOR: Duration = Duration::from_secs(shared::workspace::SAVE_GRACE_MS / 2000);

impl BlobStore {
    /// Opens the store at `location`, with its cache in `cache_dir` (made if
    /// missing) holding at most `cache_bytes`.
    pub fn open(
        location: &StoreLocation,
        s3: &S3Settings,
        cache_dir: PathBuf,
        cache_bytes: u64,
    ) -> Result<BlobStore, BlobError> {
        let (store, prefix): (Arc<dyn ObjectStore>, Path) = match location {
            StoreLocation::Local(dir) => {
                std::fs::create_dir_all(dir)?;
                let fs = object_store::local::LocalFileSystem::new_with_prefix(dir)?;
                (Arc::new(fs), Path::default())
            }
            StoreLocation::S3 { bucket, prefix } => {
                let mut b = object_store::aws::AmazonS3Builder::new()
                    .with_bucket_name(bucket)
                    .with_region(&s3.region)
                    .with_access_key_id(&s3.access_key_id)
                    .with_secret_access_key(&s3.secret_access_key)
                    .with_http_connector(super::http::RustlsConnector);
                if let Some(endpoint) = &s3.endpoint {
                    b = b
                        .with_endpoint(endpoint)
                        .with_allow_http(endpoint.starts_with("http://"))
                        // Path-style: Garage, MinIO and most servers want it.
                        .with_virtual_hosted_style_request(false);
                }
                (Arc::new(b.build()?), Path::from(prefix.as_str()))
            }
        };
        // What a worker that died mid-write left is never a blob: gone.
        let tmp = cache_dir.join("tmp");
        if tmp.symlink_metadata().is_ok() {
            std::fs::remove_dir_all(&tmp)?;
        }
        std::fs::create_dir_all(&tmp)?;
        Ok(BlobStore {
            store,
            prefix,
            cache: BlobCache {
                dir: cache_dir,
                cap_bytes: cache_bytes,
            },
        })
    }

    pub fn cache(&self) -> &BlobCache {
        &self.cache
    }

    fn blob_path(&self, d: &BlobDigest) -> Path {
        let hex = d.as_str();
        self.prefix.clone().join("blobs").join(&hex[..2]).join(hex)
    }

    fn manifest_path(&self, d: &BlobDigest) -> Path {
        self.prefix.clone().join("manifests").join(d.as_str())
    }

    /// Stores a manifest under its digest, which it returns.
    pub async fn put_manifest(&self, m: &Manifest) -> Result<BlobDigest, BlobError> {
        let json = m.to_json();
        let digest = BlobDigest::of(&json);
        self.store
            .put(&self.manifest_path(&digest), PutPayload::from(json))
            .await?;
        Ok(digest)
    }

    /// Reads a manifest and checks it against its name and the caps.
    pub async fn manifest(
        &self,
        d: &BlobDigest,
        limits: VersionLimits,
    ) -> Result<Manifest, BlobError> {
        let bytes = self
            .store
            .get(&self.manifest_path(d))
            .await?
            .bytes()
            .await?;
        if &BlobDigest::of(&bytes) != d {
            return Err(BlobError::Corrupt(d.clone()));
        }
        Ok(Manifest::from_json(&bytes, limits)?)
    }

    /// Makes sure the store holds blob `d`, whose bytes are the cached file:
    /// uploaded unless the store has a copy written within `FRESH_FOR`.
    /// Returns whether it was uploaded.
    pub async fn store_blob(&self, d: &BlobDigest) -> Result<bool, BlobError> {
        let path = self.blob_path(d);
        if let Ok(meta) = self.store.head(&path).await {
            let written: SystemTime = meta.last_modified.into();
            if written.elapsed().is_ok_and(|age| age < FRESH_FOR) {
                return Ok(false);
            }
        }
        let file = tokio::fs::File::open(self.cache.path(d)).await?;
        let mut upload = object_store::buffered::BufWriter::new(self.store.clone(), path);
        let mut reader = tokio::io::BufReader::new(file);
        tokio::io::copy(&mut reader, &mut upload).await?;
        upload.shutdown().await?;
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
            let mut stream = self.store.get(&self.blob_path(d)).await?.into_stream();
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
