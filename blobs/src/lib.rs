//! Where a workspace's files live: content-addressed blobs and manifests in an
//! `object_store` (a local directory, or any S3 server). The worker writes
//! versions here (through its host cache, `worker::workspaces::blobs`) and
//! restores them; the api reads files of a version (`read_files`).
//!
//! Layout in the store, under its prefix: `blobs/<first two hex digits>/<sha256>`
//! (a file's bytes) and `manifests/<sha256>` (a version's `Manifest`, JSON). A
//! blob is written whole or not at all (a local file is renamed into place, an
//! S3 object appears when its upload completes), and read back whole it is
//! checked against its name, so no reader ever sees half of one, or a wrong one.

pub mod config;
pub mod http;

use std::path::Path as FsPath;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutPayload};
use shared::workspace::{BlobDigest, Manifest, ManifestError, StoreLocation, VersionLimits};
use tokio::io::AsyncWriteExt;

pub use config::{S3Settings, StoreConfig};

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

impl BlobError {
    /// The store holds no such object: deleted by the sweep once no kept
    /// version named it (a reader of a version dropped meanwhile meets this).
    pub fn is_not_found(&self) -> bool {
        matches!(self, BlobError::Store(object_store::Error::NotFound { .. }))
    }
}

/// The blob store.
#[derive(Debug, Clone)]
pub struct BlobStore {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
}

/// The two kinds of object the store holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// A file's bytes, `blobs/<2 hex>/<sha256>`.
    Blob,
    /// A version's manifest, `manifests/<sha256>`.
    Manifest,
}

/// An object in the store, as a listing found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub kind: Kind,
    pub digest: BlobDigest,
    /// When it was last written (a save that finds a blob stale writes it again).
    pub written: SystemTime,
}

/// A blob written within this long is not uploaded again by a save that needs
/// it: a blob older than this is written again (refreshing its age), so a sweep
/// that deletes only unreferenced blobs older than the save grace never deletes
/// one a committing version names.
pub const FRESH_FOR: Duration = Duration::from_secs(shared::workspace::SAVE_GRACE_MS / 2000);

impl BlobStore {
    /// Opens the store (a local directory is made if missing).
    pub fn open(config: &StoreConfig) -> Result<BlobStore, BlobError> {
        let s3 = &config.s3;
        let (store, prefix): (Arc<dyn ObjectStore>, Path) = match &config.location {
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
                    .with_http_connector(http::RustlsConnector);
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
        Ok(BlobStore { store, prefix })
    }

    fn blob_path(&self, d: &BlobDigest) -> Path {
        let hex = d.as_str();
        self.prefix.clone().join("blobs").join(&hex[..2]).join(hex)
    }

    fn manifest_path(&self, d: &BlobDigest) -> Path {
        self.prefix.clone().join("manifests").join(d.as_str())
    }

    fn path(&self, kind: Kind, d: &BlobDigest) -> Path {
        match kind {
            Kind::Blob => self.blob_path(d),
            Kind::Manifest => self.manifest_path(d),
        }
    }

    /// Every object of `kind` the store holds, in no order. A name that is no
    /// digest (not written by this service) is left out, so nothing here ever
    /// deletes it.
    pub fn list(&self, kind: Kind) -> BoxStream<'static, Result<Listed, BlobError>> {
        let dir = match kind {
            Kind::Blob => "blobs",
            Kind::Manifest => "manifests",
        };
        let under = self.prefix.clone().join(dir);
        self.store
            .list(Some(&under))
            .filter_map(move |item| {
                let listed = match item {
                    Ok(meta) => meta
                        .location
                        .filename()
                        .and_then(|name| BlobDigest::try_from(name.to_owned()).ok())
                        .map(|digest| {
                            Ok(Listed {
                                kind,
                                digest,
                                written: meta.last_modified.into(),
                            })
                        }),
                    Err(e) => Some(Err(BlobError::from(e))),
                };
                std::future::ready(listed)
            })
            .boxed()
    }

    /// Deletes these objects (S3 in batches); the count deleted. One already
    /// gone counts as deleted.
    pub async fn delete(&self, objects: Vec<(Kind, BlobDigest)>) -> Result<u64, BlobError> {
        let paths: Vec<object_store::Result<Path>> =
            objects.iter().map(|(k, d)| Ok(self.path(*k, d))).collect();
        let mut done = self
            .store
            .delete_stream(futures_util::stream::iter(paths).boxed());
        let mut count = 0;
        while let Some(result) = done.next().await {
            match result {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => count += 1,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(count)
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

    /// Whether the store holds blob `d`, written within `FRESH_FOR`.
    pub async fn has_fresh(&self, d: &BlobDigest) -> bool {
        match self.store.head(&self.blob_path(d)).await {
            Ok(meta) => {
                let written: SystemTime = meta.last_modified.into();
                written.elapsed().is_ok_and(|age| age < FRESH_FOR)
            }
            Err(_) => false,
        }
    }

    /// Uploads blob `d` from `file` (its bytes, as the caller checked).
    pub async fn upload(&self, d: &BlobDigest, file: &FsPath) -> Result<(), BlobError> {
        let file = tokio::fs::File::open(file).await?;
        let mut upload =
            object_store::buffered::BufWriter::new(self.store.clone(), self.blob_path(d));
        let mut reader = tokio::io::BufReader::new(file);
        tokio::io::copy(&mut reader, &mut upload).await?;
        upload.shutdown().await?;
        Ok(())
    }

    /// Blob `d`'s bytes as they come; the caller checks them against `d`.
    pub async fn stream(
        &self,
        d: &BlobDigest,
    ) -> Result<BoxStream<'static, Result<Bytes, BlobError>>, BlobError> {
        let stream = self.store.get(&self.blob_path(d)).await?.into_stream();
        Ok(stream.map(|c| c.map_err(BlobError::from)).boxed())
    }

    /// The first `limit` bytes of blob `d`, whose size is `size`: all of it,
    /// checked against its name, when it fits; else only that many, which a
    /// digest of the whole cannot check (the reader is told it is cut).
    pub async fn head_bytes(
        &self,
        d: &BlobDigest,
        size: u64,
        limit: u64,
    ) -> Result<Bytes, BlobError> {
        let path = self.blob_path(d);
        if size <= limit {
            let bytes = self.store.get(&path).await?.bytes().await?;
            if &BlobDigest::of(&bytes) != d {
                return Err(BlobError::Corrupt(d.clone()));
            }
            return Ok(bytes);
        }
        let options = GetOptions {
            range: Some(GetRange::Bounded(0..limit)),
            ..GetOptions::default()
        };
        Ok(self.store.get_opts(&path, options).await?.bytes().await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a reader of a dropped, swept version meets, as the api tells it
    /// apart from a store that failed.
    #[tokio::test]
    async fn an_object_not_there_is_not_found_and_a_present_one_reads() {
        let dir = std::env::temp_dir().join(format!("blobs-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let config = StoreConfig::from_lookup(&|_| None, &dir).expect("config");
        let store = BlobStore::open(&config).expect("store");
        let limits = shared::workspace::VersionLimits {
            max_bytes: 1 << 20,
            max_files: 10,
        };
        let missing = BlobDigest::of(b"never stored");
        let gone = store.manifest(&missing, limits).await.expect_err("absent");
        assert!(gone.is_not_found(), "{gone:?}");
        let gone = store.head_bytes(&missing, 5, 5).await.expect_err("absent");
        assert!(gone.is_not_found(), "{gone:?}");
        let m = Manifest::new(Vec::new(), limits).expect("empty");
        let d = store.put_manifest(&m).await.expect("put");
        assert_eq!(store.manifest(&d, limits).await.ok(), Some(m));
        let corrupt = BlobError::Corrupt(d);
        assert!(!corrupt.is_not_found());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
