//! A task's /workspace, read as the tar the Docker engine makes of it (the
//! archive API, while the container still exists), becomes a `Manifest` over
//! blobs in this host's cache. Blocking: run on the blocking pool.
//!
//! Nothing from the tar is ever created on the host but blob files in the
//! cache, named by their digest: paths, links and modes only go into the
//! manifest. So a link in the workspace is kept as a link and followed by no
//! one here, and no path in the tar can reach outside the cache.

use std::collections::HashMap;
use std::io::{self, Read, Write};

use sha2::{Digest as _, Sha256};
use shared::workspace::{
    BlobDigest, Entry, EntryKind, MODE_MASK, Manifest, ManifestError, VersionLimits, check_path,
};
use tar::EntryType;

use super::WorkspaceError;
use super::cached::BlobCache;

/// What `pack` made.
#[derive(Debug)]
pub struct Packed {
    pub manifest: Manifest,
    /// Entries that are no file, directory or link (devices, pipes, sockets):
    /// left out.
    pub skipped: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error("reading the task's /workspace: {0}")]
    Io(#[from] io::Error),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("the workspace holds {path:?}, which is not valid UTF-8; workspace paths must be")]
    NotUtf8 { path: String },
}

/// The name a tar of `/workspace` gives the directory itself.
const ROOT: &str = "workspace";

/// Reads the tar in `reader` into a manifest, each file's bytes hashed into the
/// cache on the way. Stops at the first cap crossed.
pub fn pack(
    reader: impl Read,
    cache: &BlobCache,
    limits: VersionLimits,
) -> Result<Packed, PackError> {
    let mut archive = tar::Archive::new(reader);
    let mut entries: Vec<Entry> = Vec::new();
    let mut files: HashMap<String, (u32, u64, BlobDigest)> = HashMap::new();
    let (mut bytes, mut skipped) = (0u64, 0u64);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let raw = entry.path_bytes().into_owned();
        let Ok(text) = String::from_utf8(raw) else {
            let path = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            return Err(PackError::NotUtf8 { path });
        };
        let text = text.trim_end_matches('/');
        let path = match text.strip_prefix(ROOT) {
            Some("") => continue,
            Some(rest) if rest.starts_with('/') => rest[1..].to_owned(),
            _ => {
                skipped += 1;
                continue;
            }
        };
        check_path(&path)?;
        if entries.len() as u64 >= limits.max_files {
            return Err(ManifestError::TooManyFiles {
                max: limits.max_files,
            }
            .into());
        }
        let mode = entry.header().mode()? & MODE_MASK;
        let kind = match entry.header().entry_type() {
            EntryType::Directory => EntryKind::Dir { mode },
            EntryType::Regular | EntryType::Continuous => {
                let size = entry.header().size()?;
                count_bytes(&mut bytes, size, limits)?;
                let (digest, _) = hash_into_cache(&mut entry, cache)?;
                files.insert(path.clone(), (mode, size, digest.clone()));
                EntryKind::File {
                    mode,
                    size,
                    sha256: digest,
                }
            }
            EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| String::from_utf8_lossy(&t).into_owned())
                    .unwrap_or_default();
                EntryKind::Symlink { target }
            }
            // A hard link names a file earlier in the same tar: stored as
            // that file again (same blob), never as a link out.
            EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| String::from_utf8_lossy(&t).into_owned())
                    .unwrap_or_default();
                let target = target.strip_prefix("workspace/").unwrap_or(&target);
                match files.get(target).cloned() {
                    Some((mode, size, digest)) => {
                        count_bytes(&mut bytes, size, limits)?;
                        files.insert(path.clone(), (mode, size, digest.clone()));
                        EntryKind::File {
                            mode,
                            size,
                            sha256: digest,
                        }
                    }
                    None => {
                        skipped += 1;
                        continue;
                    }
                }
            }
            _ => {
                skipped += 1;
                continue;
            }
        };
        entries.push(Entry { path, kind });
    }
    Ok(Packed {
        manifest: Manifest::new(entries, limits)?,
        skipped,
    })
}

/// Adds a file's `size` to the version's `bytes`, refusing past the cap.
fn count_bytes(bytes: &mut u64, size: u64, limits: VersionLimits) -> Result<(), PackError> {
    *bytes = bytes.saturating_add(size);
    if *bytes > limits.max_bytes {
        return Err(ManifestError::TooLarge {
            max: limits.max_bytes,
        }
        .into());
    }
    Ok(())
}

/// Streams one file's bytes into a fresh cache file while hashing them, then
/// names it by its digest (dropping it if the cache already has that blob).
/// Returns the digest and how many bytes were hashed.
pub(super) fn hash_into_cache(
    reader: &mut impl Read,
    cache: &BlobCache,
) -> io::Result<(BlobDigest, u64)> {
    let tmp = cache.tmp_path();
    let result = (|| {
        let mut out = std::fs::File::create(&tmp)?;
        let mut hash = Sha256::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut hashed = 0u64;
        loop {
            let n = reader.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hashed += n as u64;
            hash.update(&buf[..n]);
            out.write_all(&buf[..n])?;
        }
        out.flush()?;
        let digest = BlobDigest::from_hasher(hash);
        let target = cache.path(&digest);
        if target.symlink_metadata().is_ok() {
            std::fs::remove_file(&tmp)?;
            // Just used: the eviction keeps it while the save uploads it.
            std::fs::File::options()
                .write(true)
                .open(&target)?
                .set_modified(std::time::SystemTime::now())?;
        } else {
            std::fs::rename(&tmp, &target)?;
        }
        Ok((digest, hashed))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The files of `write_files`' zip (made by the api: one entry per file,
/// named by its path), each hashed into the cache (blocking).
pub(super) fn hash_zip(
    zip: &[u8],
    cache: &BlobCache,
) -> Result<Vec<shared::edit::Written>, WorkspaceError> {
    let bad = |e: zip::result::ZipError| WorkspaceError::EditFiles(e.to_string());
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(zip)).map_err(bad)?;
    let mut written = Vec::with_capacity(archive.len());
    for i in 0..archive.len() {
        let mut file = archive.by_index(i).map_err(bad)?;
        let path = file.name().map_err(bad)?.into_owned();
        // Not `is_file()`: the api names each entry by its path, and zip
        // takes a name ending in `\` for a directory. A link the api never
        // makes; refused so no zip can carry one into a version.
        if file.is_symlink() {
            return Err(WorkspaceError::EditFiles(format!("{path:?} is a link")));
        }
        // The size the version records is the bytes hashed, never the
        // header's word for it; and no more than one byte past it is read,
        // so an entry that inflates past its header cannot fill the cache.
        let said = file.size();
        let (sha256, size) = hash_into_cache(&mut (&mut file).take(said + 1), cache)
            .map_err(WorkspaceError::Cache)?;
        if size != said {
            return Err(WorkspaceError::EditFiles(format!(
                "{path:?} holds {size} bytes, its header says {said}"
            )));
        }
        written.push(shared::edit::Written { path, size, sha256 });
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: VersionLimits = VersionLimits {
        max_bytes: 1 << 20,
        max_files: 100,
    };

    fn tar_of(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        b.into_inner().expect("tar")
    }

    fn header(kind: EntryType, mode: u32, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h
    }

    fn cache() -> (tempdir::Dir, BlobCache) {
        let dir = tempdir::Dir::new();
        std::fs::create_dir_all(dir.path().join("tmp")).expect("tmp");
        let cache = BlobCache::for_tests(dir.path().to_path_buf());
        (dir, cache)
    }

    mod tempdir {
        pub struct Dir(std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                let p = std::env::temp_dir().join(format!("sr-pack-{}", uuid::Uuid::new_v4()));
                std::fs::create_dir_all(&p).expect("temp dir");
                Dir(p)
            }
            pub fn path(&self) -> &std::path::Path {
                &self.0
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn files_dirs_and_links_are_kept_as_they_are_and_setuid_is_dropped() {
        let tar = tar_of(|b| {
            b.append_data(
                &mut header(EntryType::Directory, 0o755, 0),
                "workspace/",
                &[][..],
            )
            .expect("root");
            b.append_data(
                &mut header(EntryType::Directory, 0o700, 0),
                "workspace/bin",
                &[][..],
            )
            .expect("dir");
            b.append_data(
                &mut header(EntryType::Regular, 0o4755, 3),
                "workspace/bin/run",
                &b"hi\n"[..],
            )
            .expect("file");
            let mut link = header(EntryType::Symlink, 0o777, 0);
            b.append_link(&mut link, "workspace/py", "/usr/bin/python3")
                .expect("symlink");
            let mut hard = header(EntryType::Link, 0o644, 0);
            b.append_link(&mut hard, "workspace/same", "workspace/bin/run")
                .expect("hard link");
            let mut fifo = header(EntryType::Fifo, 0o644, 0);
            b.append_data(&mut fifo, "workspace/pipe", &[][..])
                .expect("fifo");
        });
        let (_dir, cache) = cache();
        let packed = pack(&tar[..], &cache, LIMITS).expect("packs");
        let m = &packed.manifest;
        let kinds: Vec<(&str, &EntryKind)> = m
            .entries
            .iter()
            .map(|e| (e.path.as_str(), &e.kind))
            .collect();
        let digest = BlobDigest::of(b"hi\n");
        assert_eq!(
            kinds,
            [
                ("bin", &EntryKind::Dir { mode: 0o700 }),
                (
                    "bin/run",
                    &EntryKind::File {
                        mode: 0o755,
                        size: 3,
                        sha256: digest.clone()
                    }
                ),
                (
                    "py",
                    &EntryKind::Symlink {
                        target: "/usr/bin/python3".into()
                    }
                ),
                (
                    "same",
                    &EntryKind::File {
                        mode: 0o755,
                        size: 3,
                        sha256: digest.clone()
                    }
                ),
            ]
        );
        assert_eq!(packed.skipped, 1, "the pipe");
        assert_eq!(
            std::fs::read(cache.path(&digest)).expect("cached"),
            b"hi\n",
            "one blob for both names"
        );
    }

    #[test]
    fn the_caps_stop_a_pack() {
        let big = tar_of(|b| {
            b.append_data(
                &mut header(EntryType::Regular, 0o644, 2 << 20),
                "workspace/big",
                &vec![0u8; 2 << 20][..],
            )
            .expect("file");
        });
        let (_dir, cache) = cache();
        assert!(matches!(
            pack(&big[..], &cache, LIMITS),
            Err(PackError::Manifest(ManifestError::TooLarge { .. }))
        ));
        let many = tar_of(|b| {
            for i in 0..101 {
                b.append_data(
                    &mut header(EntryType::Regular, 0o644, 0),
                    format!("workspace/f{i}"),
                    &[][..],
                )
                .expect("file");
            }
        });
        assert!(matches!(
            pack(&many[..], &cache, LIMITS),
            Err(PackError::Manifest(ManifestError::TooManyFiles { .. }))
        ));
    }

    fn zip_of(build: impl FnOnce(&mut zip::ZipWriter<io::Cursor<Vec<u8>>>)) -> Vec<u8> {
        let mut w = zip::ZipWriter::new(io::Cursor::new(Vec::new()));
        build(&mut w);
        w.finish().expect("zip").into_inner()
    }

    #[test]
    fn write_files_zip_is_hashed_into_the_cache_by_its_bytes() {
        let (_dir, cache) = cache();
        let opts = zip::write::SimpleFileOptions::default();
        let zip = zip_of(|w| {
            w.start_file("a/b.txt", opts).expect("entry");
            w.write_all(b"hello").expect("bytes");
            // A name zip takes for a directory's, and still one of the api's files.
            w.start_file("odd\\", opts).expect("entry");
            w.write_all(b"x").expect("bytes");
        });
        let written = hash_zip(&zip, &cache).expect("hashed");
        let got: Vec<_> = written.iter().map(|w| (w.path.as_str(), w.size)).collect();
        assert_eq!(got, [("a/b.txt", 5), ("odd\\", 1)]);
        assert_eq!(written[0].sha256, BlobDigest::of(b"hello"));
        let cached = std::fs::read(cache.path(&written[0].sha256)).expect("in the cache");
        assert_eq!(cached, b"hello");
    }

    #[test]
    fn write_files_zip_with_a_link_is_refused() {
        let (_dir, cache) = cache();
        let opts = zip::write::SimpleFileOptions::default();
        let zip = zip_of(|w| {
            w.add_symlink("l", "/etc/passwd", opts).expect("link");
        });
        let err = hash_zip(&zip, &cache).expect_err("a link");
        assert!(err.to_string().contains("is a link"), "{err}");
    }
}
