//! `collect`: the files a script leaves in /workspace, taken after its run.
//!
//! /workspace is a tmpfs that vanishes with the container, so the container's
//! prelude archives the matching files itself once the script has exited, into
//! a FIFO on the host mounted into the container. The worker reads that pipe
//! into memory, at most `MAX_COLLECT_BYTES`, and keeps regular files with safe
//! relative paths, at most `MAX_COLLECT_FILES`; nothing reaches the host's disk.
//! The result is stored as a zip with the task record, for `get_task_files`.

use std::io::{Cursor, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use shared::options::{CollectedFile, CollectedFiles, MAX_COLLECT_BYTES, MAX_COLLECT_FILES};
use tokio::io::AsyncReadExt;
use tokio::task::JoinHandle;

use crate::queue::Collected;

/// The collection pipe of one task, and the reader draining it.
pub struct Collector {
    fifo: PathBuf,
    reader: JoinHandle<std::io::Result<Vec<u8>>>,
}

impl Collector {
    /// Makes the pipe `TASKS_DIR/<task_id>.collect` (writable by the task user
    /// `task_user`, `TASK_USER`) and starts reading it: the read waits until the
    /// container's prelude opens the pipe after the script.
    pub async fn start(
        tasks_dir: &Path,
        task_id: &str,
        task_user: &str,
    ) -> std::io::Result<Collector> {
        let fifo = tasks_dir.join(format!("{task_id}.collect"));
        let path = fifo.clone();
        let owner = crate::source::parse_owner(task_user);
        tokio::task::spawn_blocking(move || {
            let _ = std::fs::remove_file(&path);
            make_fifo(&path, owner)
        })
        .await
        .map_err(std::io::Error::other)??;
        Ok(Collector::open(fifo))
    }

    /// Starts reading a pipe made earlier (a warm pool container's).
    pub fn open(fifo: PathBuf) -> Collector {
        let path = fifo.clone();
        let reader = tokio::spawn(async move {
            let file = tokio::fs::File::open(&path).await?;
            let mut buf = Vec::new();
            file.take(MAX_COLLECT_BYTES + 1)
                .read_to_end(&mut buf)
                .await?;
            Ok(buf)
        });
        Collector { fifo, reader }
    }

    pub fn fifo(&self) -> &Path {
        &self.fifo
    }

    /// After the container has stopped: ends the read (a prelude that never
    /// wrote, e.g. a killed task, leaves the reader waiting for a writer, so the
    /// worker opens and closes the write end itself), removes the pipe, and
    /// turns what was read into the stored zip. `None` when nothing was read.
    pub async fn finish(self) -> Option<Collected> {
        let fifo = self.fifo.clone();
        let _ = tokio::task::spawn_blocking(move || {
            use std::os::unix::fs::OpenOptionsExt;
            // Non-blocking: with no reader left this fails at once (ENXIO).
            std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&fifo)
                .map(drop)
        })
        .await;
        let read = tokio::time::timeout(Duration::from_secs(10), self.reader).await;
        let _ = tokio::fs::remove_file(&self.fifo).await;
        let bytes = match read {
            Ok(Ok(Ok(bytes))) => bytes,
            other => {
                tracing::warn!(fifo = %self.fifo.display(), ?other, "collecting files failed");
                return None;
            }
        };
        let cut = bytes.len() as u64 > MAX_COLLECT_BYTES;
        tokio::task::spawn_blocking(move || pack(&bytes, cut))
            .await
            .ok()
            .flatten()
    }
}

/// Makes a FIFO at `path` that the task's user can write and nobody else can
/// open: owned by `owner` (the task's `uid:gid`) with mode 0600. The worker,
/// root, reads it whatever its mode. When it cannot be given to the task's user
/// (`TASK_USER` is a name, or the worker is not root and may not chown), it is
/// 0622: anyone may write, only the worker read; `TASKS_DIR` (0700) still keeps
/// other local users from reaching it. Blocking: it runs `mkfifo`.
pub fn make_fifo(path: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    // Made 0600 (`-m` is not subject to the umask), then given away: at no
    // moment may anyone but the worker open it.
    let made = std::process::Command::new("mkfifo")
        .arg("-m")
        .arg("0600")
        .arg(path)
        .status()?;
    if !made.success() {
        return Err(std::io::Error::other(format!(
            "mkfifo {} failed: {made}",
            path.display()
        )));
    }
    let given = match owner {
        Some((uid, gid)) => std::os::unix::fs::chown(path, Some(uid), Some(gid)),
        None => Err(std::io::ErrorKind::Unsupported.into()),
    };
    match given {
        Ok(()) => Ok(()),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::Unsupported
            ) =>
        {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(FIFO_MODE_SHARED))
        }
        Err(e) => Err(e),
    }
}

/// A collection pipe's mode when it cannot belong to the task's user.
pub const FIFO_MODE_SHARED: u32 = 0o622;

/// The regular files of a tar archive (possibly cut short) as a zip and its
/// listing. `cut`: the archive was longer than what was read.
fn pack(archive: &[u8], cut: bool) -> Option<Collected> {
    let mut listing = CollectedFiles {
        files: Vec::new(),
        truncated: cut,
    };
    let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .unix_permissions(0o644);
    let mut tar = tar::Archive::new(archive);
    let Ok(entries) = tar.entries() else {
        return None;
    };
    for entry in entries {
        // A cut archive ends in a broken entry: what came before is kept.
        let Ok(mut entry) = entry else {
            listing.truncated = true;
            break;
        };
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let Some(name) = entry.path().ok().and_then(|p| safe_name(&p)) else {
            continue;
        };
        if listing.files.len() == MAX_COLLECT_FILES {
            listing.truncated = true;
            break;
        }
        let mut data = Vec::new();
        let size = entry.header().size().unwrap_or(0);
        if entry.read_to_end(&mut data).is_err() || data.len() as u64 != size {
            listing.truncated = true;
            break;
        }
        if zip.start_file(name.as_str(), opts).is_err() || zip.write_all(&data).is_err() {
            return None;
        }
        listing.files.push(CollectedFile { name, size });
    }
    if listing.files.is_empty() && !listing.truncated {
        return None;
    }
    let zip = zip.finish().ok()?.into_inner();
    Some(Collected {
        zip,
        listing: serde_json::to_string(&listing).ok()?,
    })
}

/// A path of normal components only, as text.
fn safe_name(p: &Path) -> Option<String> {
    let normal = p.components().all(|c| matches!(c, Component::Normal(_)));
    (normal && p.components().next().is_some())
        .then(|| p.to_str().map(str::to_owned))
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, *data).expect("append");
        }
        b.into_inner().expect("tar")
    }

    #[test]
    fn the_pipe_belongs_to_the_task_user_and_only_a_named_user_gets_a_shared_one() {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let dir = std::env::temp_dir().join(format!("sr-fifo-test-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir(&dir).expect("dir");
        let root = crate::source::effective_uid().expect("euid") == 0;
        let (pipe, named) = (dir.join("p.collect"), dir.join("n.collect"));
        make_fifo(&pipe, Some((65534, 65534))).expect("fifo");
        make_fifo(&named, None).expect("fifo");
        let meta = |p: &Path| std::fs::symlink_metadata(p).expect("stat");
        let m = meta(&pipe);
        assert!(m.file_type().is_fifo());
        if root {
            assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (65534, 65534, 0o600));
        } else {
            assert_eq!(m.mode() & 0o7777, FIFO_MODE_SHARED);
        }
        assert_eq!(meta(&named).mode() & 0o7777, FIFO_MODE_SHARED);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn regular_files_are_kept_byte_for_byte() {
        let t = tar_of(&[("out/report.txt", b"hello"), ("plot.png", &[0, 1, 2, 255])]);
        let c = pack(&t, false).expect("files");
        let listing: CollectedFiles = serde_json::from_str(&c.listing).expect("json");
        assert_eq!(listing.files.len(), 2);
        assert!(!listing.truncated);
        let mut z = zip::ZipArchive::new(Cursor::new(c.zip)).expect("zip");
        let mut s = Vec::new();
        z.by_name("plot.png")
            .expect("plot")
            .read_to_end(&mut s)
            .expect("read");
        assert_eq!(s, [0, 1, 2, 255]);
    }

    #[test]
    fn a_cut_archive_keeps_what_came_before_and_says_so() {
        let t = tar_of(&[("a", b"aaaa"), ("b", &[7u8; 4096])]);
        let c = pack(&t[..2048], true).expect("files");
        let listing: CollectedFiles = serde_json::from_str(&c.listing).expect("json");
        assert_eq!(
            listing.files,
            [CollectedFile {
                name: "a".into(),
                size: 4
            }]
        );
        assert!(listing.truncated);
    }
}
