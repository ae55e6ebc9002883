//! A version's files, from this host's blob cache into a fresh host directory
//! that the task's container sees read-only and copies into its /workspace
//! (as it copies a zip's files). Blocking: run on the blocking pool, once every
//! blob is in the cache (`BlobStore::fetch`).
//!
//! The directory is built from the manifest alone, in its order (a parent
//! before its children): directories are made, files copied from the cache
//! into new files opened with `O_NOFOLLOW | O_EXCL`, links made as links
//! (`symlink` never follows its target). A manifest's parents are always its
//! own directories, never a link, so nothing here is reached through a link.
//! Entries belong to the task's user, so a file only its owner may read stays
//! readable by the task; where the worker may not give files away, they are
//! made readable by all instead.

use std::fs;
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use shared::workspace::{EntryKind, Manifest};

use super::blobs::BlobCache;

/// Fills `dir` (an empty directory) with `manifest`'s entries.
pub fn restore(
    manifest: &Manifest,
    cache: &BlobCache,
    dir: &Path,
    owner: Option<(u32, u32)>,
) -> io::Result<()> {
    let chown = |path: &Path| -> bool {
        owner
            .is_some_and(|(uid, gid)| std::os::unix::fs::lchown(path, Some(uid), Some(gid)).is_ok())
    };
    let mut dirs = Vec::new();
    for entry in &manifest.entries {
        let path = dir.join(&entry.path);
        match &entry.kind {
            EntryKind::Dir { mode } => {
                fs::create_dir(&path)?;
                dirs.push((path, *mode));
            }
            EntryKind::File { mode, sha256, .. } => {
                let mut from = fs::File::open(cache.path(sha256))?;
                let mut to = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&path)?;
                io::copy(&mut from, &mut to)?;
                let given = chown(&path);
                let mode = if given { *mode } else { *mode | 0o444 };
                to.set_permissions(fs::Permissions::from_mode(mode))?;
            }
            EntryKind::Symlink { target } => {
                std::os::unix::fs::symlink(target, &path)?;
                chown(&path);
            }
        }
    }
    // Last, deepest first: a directory without write permission is still
    // filled first.
    for (path, mode) in dirs.into_iter().rev() {
        let given = chown(&path);
        // Not given away: the worker's own, so it must be able to remove it.
        let mode = if given { mode } else { mode | 0o755 };
        fs::set_permissions(&path, fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}
