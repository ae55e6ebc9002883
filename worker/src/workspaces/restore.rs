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
use std::io::{self, Read};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use shared::workspace::{EntryKind, MODE_MASK, Manifest};

use super::cached::BlobCache;

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
            EntryKind::File { mode, sha256, size } => {
                let mut from = fs::File::open(cache.path(sha256))?;
                let mut to = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&path)?;
                // At most the manifest's size, and exactly it: a cached blob
                // cut short (or a manifest that lies) is refused.
                let copied = io::copy(&mut (&mut from).take(size + 1), &mut to)?;
                if copied != *size {
                    return Err(io::Error::other(format!(
                        "{}: {copied} bytes in the cache, {size} in the manifest",
                        entry.path
                    )));
                }
                let given = chown(&path);
                // The owner may always read it, so the container's copy of it
                // cannot fail (a 000 file comes back 400).
                let mode = (*mode & MODE_MASK) | 0o400;
                let mode = if given { mode } else { mode | 0o444 };
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
        // The owner may always list and enter it (as for files); not given
        // away, it is the worker's own, which must be able to remove it.
        let mode = (mode & MODE_MASK) | 0o500;
        let mode = if given { mode } else { mode | 0o755 };
        fs::set_permissions(&path, fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}
