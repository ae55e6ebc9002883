//! A task's source files on the host: `TASKS_DIR/<task_id>`, only when it sent a
//! zip. The container sees it read-only and copies it into its own /workspace (a
//! tmpfs), so no script ever writes to, or plants a link in, a host directory.
//!
//! The zip is extracted here by the worker, checked again with `shared::zipcheck`
//! and with the bytes actually written counted against the cap, since declared
//! sizes can lie. The worker only ever creates plain files and directories, and
//! removal never follows a link (`remove_dir_all` does not). Files keep the
//! zip's owner-execute bit (0755, else 0644) and nothing else of its mode. Everything here is
//! blocking file I/O, so callers run it on the blocking pool.

use std::fs;
use std::io::{self, Cursor, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use shared::zipcheck::{ZipError, ZipLimits, check_zip};

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{0}")]
    Zip(#[from] ZipError),
    #[error(
        "the zip expands to more bytes than its entries declare, or than the {0} bytes allowed"
    )]
    ExpandedTooLarge(u64),
    #[error("cannot read zip entry {name}: {source}")]
    OpenEntry {
        name: String,
        source: zip::result::ZipError,
    },
    #[error("cannot read zip entry {name}: {source}")]
    ReadEntry { name: String, source: io::Error },
    #[error("file system error: {0}")]
    Io(#[from] io::Error),
}

/// Extracts `zip` into a fresh `tasks_dir/task_id`, readable by anyone (the task
/// runs as an unprivileged user) and writable by no one else; files the zip
/// marks executable for their owner are executable by anyone.
pub fn prepare(
    tasks_dir: &Path,
    task_id: &str,
    zip: &[u8],
    limits: &ZipLimits,
) -> Result<PathBuf, SourceError> {
    let dir = tasks_dir.join(task_id);
    // A leftover from a crashed run of the same task is discarded, not reused.
    if dir.symlink_metadata().is_ok() {
        fs::remove_dir_all(&dir)?;
    }
    fs::create_dir(&dir)?;
    fill(&dir, zip, limits)?;
    Ok(dir)
}

/// Extracts `zip` into `dir`, an empty directory that already exists (a warm
/// pool container's source directory, mounted before the task was known), with
/// the same checks and modes as `prepare`.
pub fn fill(dir: &Path, zip: &[u8], limits: &ZipLimits) -> Result<(), SourceError> {
    extract(dir, zip, limits)?;
    make_readable(dir)?;
    Ok(())
}

fn extract(dir: &Path, bytes: &[u8], limits: &ZipLimits) -> Result<(), SourceError> {
    let entries = check_zip(bytes, limits)?;
    let mut archive =
        zip::ZipArchive::new(Cursor::new(bytes)).map_err(|e| ZipError::NotAZip(e.to_string()))?;
    let mut budget = limits.max_expanded_bytes;
    for entry in entries {
        let target = dir.join(&entry.path);
        if entry.is_dir {
            fs::create_dir_all(&target)?;
            continue;
        }
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent)?;
        }
        let name = entry.path.display().to_string();
        let mut file = archive
            .by_index(entry.index)
            .map_err(|source| SourceError::OpenEntry {
                name: name.clone(),
                source,
            })?;
        let mut out = fs::File::create(&target)?;
        // Read one byte past the budget: if it arrives, the archive lied.
        let copied = io::copy(&mut (&mut file).take(budget + 1), &mut out);
        let too_large = SourceError::ExpandedTooLarge(limits.max_expanded_bytes);
        let written = match copied {
            Ok(n) => n,
            // The zip reader (zip 9) refuses to go past an entry's declared size,
            // with an InvalidData error of its own wording: the archive lied about
            // how far it expands, which is the same refusal. Only its message
            // tells it from a bad checksum; the unit test below pins it.
            Err(e)
                if e.kind() == io::ErrorKind::InvalidData
                    && e.to_string().contains("declared uncompressed size") =>
            {
                return Err(too_large);
            }
            Err(source) => return Err(SourceError::ReadEntry { name, source }),
        };
        if written > budget {
            return Err(too_large);
        }
        budget -= written;
        out.flush()?;
        // fchmod is not subject to the umask.
        out.set_permissions(fs::Permissions::from_mode(file_mode(entry.executable)))?;
    }
    Ok(())
}

/// Directories 0755, whatever the worker's umask (files got their mode when
/// they were written).
fn make_readable(dir: &Path) -> io::Result<()> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        if !path.symlink_metadata()?.is_dir() {
            continue;
        }
        for child in fs::read_dir(&path)? {
            stack.push(child?.path());
        }
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

/// A file's mode: 0755 when the zip marked it executable for its owner, else
/// 0644. Never setuid, setgid or sticky, whatever the archive says; the copy
/// into /workspace belongs to the task's user.
fn file_mode(executable: bool) -> u32 {
    if executable { 0o755 } else { 0o644 }
}

/// Removes a workspace. `remove_dir_all` unlinks symlinks a script planted
/// instead of following them.
pub fn remove(dir: &Path) {
    if let Err(e) = fs::remove_dir_all(dir)
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %dir.display(), error = %e, "could not remove workspace");
    }
}

/// What `make_private` found `TASKS_DIR` to be.
#[derive(Debug, PartialEq, Eq)]
pub enum Privacy {
    /// Open to nobody but its owner already.
    Private,
    /// Was open to others with this mode, and is 0700 now.
    Tightened(u32),
}

/// Makes `TASKS_DIR` the worker's alone (0700): what clients sent, the pool's
/// directories and the collection pipes live in it, and no other local user has
/// any business there. The containers need no path through it: each reaches its
/// own directory and pipe through its mounts. A directory open to others is
/// tightened when it is the worker's own (owned by its effective user, no sticky
/// bit); a shared one (`/tmp`, another user's) is refused rather than changed
/// under its other users.
pub fn make_private(dir: &Path) -> io::Result<Privacy> {
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::other("not a directory"));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 == 0 {
        return Ok(Privacy::Private);
    }
    let me = effective_uid()?;
    if mode & 0o1000 != 0 || meta.uid() != me {
        return Err(io::Error::other(format!(
            "mode {mode:04o}, owned by uid {}, lets other users in; the worker \
             tightens only a directory of its own (owned by uid {me}, no sticky bit) \
             and will not change a shared one: make it 0700 or point TASKS_DIR at \
             a directory of the worker's own",
            meta.uid()
        )));
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    Ok(Privacy::Tightened(mode))
}

/// This process's effective uid (`/proc/self/status`, no libc call).
pub fn effective_uid() -> io::Result<u32> {
    let status = fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1)?.parse().ok())
        .ok_or_else(|| io::Error::other("no effective uid in /proc/self/status"))
}

/// `"uid:gid"` (or `"uid"`) as numbers; `None` for a user name.
pub fn parse_owner(user: &str) -> Option<(u32, u32)> {
    let (u, g) = user.split_once(':').unwrap_or((user, user));
    Some((u.parse().ok()?, g.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use zip::write::SimpleFileOptions;

    fn zip_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
        for (name, data) in entries {
            w.start_file(*name, SimpleFileOptions::default())
                .expect("start");
            w.write_all(data).expect("write");
        }
        w.finish().expect("finish").into_inner()
    }

    fn tempdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("sr-ws-test-{}", uuid::Uuid::new_v4()));
        fs::create_dir_all(&d).expect("tempdir");
        d
    }

    #[test]
    fn extracts_nested_files_and_removes_them() {
        let root = tempdir();
        let z = zip_of(&[("main.py", b"print(1)"), ("pkg/sub/data.txt", b"hello")]);
        let ws = prepare(&root, "t1", &z, &ZipLimits::default()).expect("prepare");
        assert_eq!(
            fs::read(ws.join("pkg/sub/data.txt")).ok().as_deref(),
            Some(&b"hello"[..])
        );
        remove(&ws);
        assert!(!ws.exists());
        remove(&root);
    }

    #[test]
    fn only_the_owner_execute_bit_survives_extraction() {
        let root = tempdir();
        let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
        for (name, mode) in [
            ("run.sh", 0o755),
            ("suid", 0o4755),
            ("sgid-sticky", 0o3775),
            ("plain", 0o600),
            ("group-exec", 0o654),
        ] {
            let opts = SimpleFileOptions::default().unix_permissions(mode);
            w.start_file(name, opts).expect("start");
            w.write_all(b"#!/bin/sh\necho hi\n").expect("write");
        }
        let z = w.finish().expect("finish").into_inner();
        let ws = prepare(&root, "t4", &z, &ZipLimits::default()).expect("prepare");
        let mode = |name: &str| {
            fs::metadata(ws.join(name))
                .map(|m| m.permissions().mode() & 0o7777)
                .expect("metadata")
        };
        assert_eq!(mode("run.sh"), 0o755);
        assert_eq!(mode("suid"), 0o755);
        assert_eq!(mode("sgid-sticky"), 0o755);
        assert_eq!(mode("plain"), 0o644);
        assert_eq!(mode("group-exec"), 0o644);
        remove(&root);
    }

    #[test]
    fn tasks_dir_is_made_private_or_refused_when_shared() {
        let mode = |p: &Path| {
            fs::metadata(p)
                .map(|m| m.permissions().mode() & 0o7777)
                .expect("metadata")
        };
        let root = tempdir();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(make_private(&root).ok(), Some(Privacy::Tightened(0o755)));
        assert_eq!(mode(&root), 0o700);
        assert_eq!(make_private(&root).ok(), Some(Privacy::Private));
        // A shared directory (sticky, like /tmp) is refused, not changed.
        let shared = root.join("shared");
        fs::create_dir(&shared).expect("shared");
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).expect("chmod");
        let err = make_private(&shared).err().map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e.contains("mode 1777")),
            "{err:?}"
        );
        assert_eq!(mode(&shared), 0o1777);
        remove(&root);
    }

    #[test]
    fn removal_does_not_follow_a_planted_symlink() {
        let root = tempdir();
        let outside = root.join("outside");
        fs::create_dir(&outside).expect("outside");
        fs::write(outside.join("precious"), b"keep").expect("precious");
        let ws =
            prepare(&root, "t2", &zip_of(&[("f", b"x")]), &ZipLimits::default()).expect("prepare");
        std::os::unix::fs::symlink(&outside, ws.join("link")).expect("symlink");
        remove(&ws);
        assert!(!ws.exists());
        assert!(outside.join("precious").exists());
        remove(&root);
    }

    /// Rewrites every declared uncompressed size (local headers and central
    /// directory) to `size`, leaving the data and its CRC as they are: an
    /// archive whose sizes lie.
    fn lie_about_sizes(mut z: Vec<u8>, size: u32) -> Vec<u8> {
        let patch = |z: &mut Vec<u8>, sig: &[u8; 4], offset: usize| {
            let mut i = 0;
            while i + offset + 4 <= z.len() {
                if &z[i..i + 4] == sig {
                    z[i + offset..i + offset + 4].copy_from_slice(&size.to_le_bytes());
                }
                i += 1;
            }
        };
        patch(&mut z, b"PK\x03\x04", 22);
        patch(&mut z, b"PK\x01\x02", 24);
        z
    }

    #[test]
    fn the_expanded_cap_holds_while_writing_when_declared_sizes_lie() {
        let root = tempdir();
        let z = lie_about_sizes(zip_of(&[("a", &[b'x'; 600]), ("b", &[b'y'; 600])]), 10);
        let limits = ZipLimits {
            max_expanded_bytes: 1000,
            ..ZipLimits::default()
        };
        // The pre-check believes the archive (20 bytes declared)...
        assert!(check_zip(&z, &limits).is_ok());
        // ...the bytes actually written do not.
        let err = prepare(&root, "t3", &z, &limits).err();
        assert!(
            matches!(err, Some(SourceError::ExpandedTooLarge(1000))),
            "{err:?}"
        );
        remove(&root);
    }
}
