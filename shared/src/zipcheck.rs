//! Zip safety rules, checked by the api at submit time (so a bad archive is refused
//! before a task exists) and again by the worker as it extracts (so a worker never
//! trusts what reached it through Redis).
//!
//! Refused: entries whose path is absolute or has a `..` component, symlinks,
//! devices, fifos and sockets, encrypted entries, and archives over the caps on
//! entry count, expanded size or compression ratio. Declared sizes can lie, so the
//! extractor must also count the bytes it really writes (see `ZipLimits`).

use std::io::Cursor;
use std::path::{Component, Path, PathBuf};

/// Caps on what an archive may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZipLimits {
    /// Entries (files and directories) at most.
    pub max_entries: usize,
    /// Sum of the uncompressed sizes at most, in bytes.
    pub max_expanded_bytes: u64,
    /// Largest uncompressed/compressed ratio of any one entry bigger than 1 MiB.
    pub max_ratio: u64,
}

/// Largest uncompressed/compressed ratio of an entry bigger than 1 MiB.
const MAX_RATIO: u64 = 200;

impl Default for ZipLimits {
    /// The declared defaults of `ZIP_MAX_ENTRIES` and `ZIP_MAX_EXPANDED_BYTES`.
    fn default() -> Self {
        // The only panic outside tests that the lints allow: a default that
        // does not parse is a bug in this file, caught by its unit test.
        #[allow(clippy::expect_used)]
        ZipLimits::from_lookup(&|_: &str| None).expect("the declared defaults parse (unit-tested)")
    }
}

impl ZipLimits {
    /// `ZIP_MAX_ENTRIES` and `ZIP_MAX_EXPANDED_BYTES` through `var` (`None` when
    /// unset), which api and worker both read: the api checks at submit, the
    /// worker again at extraction.
    pub fn from_lookup(
        var: &impl Fn(&str) -> Option<String>,
    ) -> Result<ZipLimits, crate::envvar::VarError> {
        use crate::envvar::{ZIP_MAX_ENTRIES, ZIP_MAX_EXPANDED_BYTES};
        Ok(ZipLimits {
            max_entries: ZIP_MAX_ENTRIES.range(var, 1, 1_000_000)? as usize,
            max_expanded_bytes: ZIP_MAX_EXPANDED_BYTES.range(var, 1, 1 << 40)?,
            max_ratio: MAX_RATIO,
        })
    }
}

/// Why an archive was refused. Messages are shown to the client as they are.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ZipError {
    #[error("zip_base64 is not a readable zip archive ({0})")]
    NotAZip(String),
    #[error("the zip has {count} entries; at most {max} are allowed")]
    TooManyEntries { count: usize, max: usize },
    #[error("zip entry {0:?} has an unsafe path: absolute paths and '..' are not allowed")]
    UnsafePath(String),
    #[error("zip entry {0:?} is a symbolic link; only regular files and directories are allowed")]
    Symlink(String),
    #[error(
        "zip entry {0:?} is a device, fifo or socket; only regular files and directories are allowed"
    )]
    SpecialFile(String),
    #[error("zip entry {0:?} is encrypted; encrypted archives are not supported")]
    Encrypted(String),
    #[error("the zip expands to more than {max} bytes; at most {max} bytes are allowed")]
    TooLarge { max: u64 },
    #[error("zip entry {name:?} has a compression ratio above {max}:1 (a zip bomb?)")]
    RatioTooHigh { name: String, max: u64 },
}

/// One entry that passed the checks, in archive order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafeEntry {
    /// Index in the archive.
    pub index: usize,
    /// Relative path with only normal components.
    pub path: PathBuf,
    pub is_dir: bool,
    /// The entry's Unix mode has the owner-execute bit (a script or binary made
    /// with `chmod +x`). Only this bit is carried over: setuid, setgid, sticky
    /// and the other permission bits of the archive are never applied.
    pub executable: bool,
}

const S_IFMT: u32 = 0o170_000;
const S_IFREG: u32 = 0o100_000;
const S_IFDIR: u32 = 0o040_000;
const S_IFLNK: u32 = 0o120_000;
const S_IXUSR: u32 = 0o100;

/// Checks an archive against `limits` and lists its entries with safe paths.
pub fn check_zip(bytes: &[u8], limits: &ZipLimits) -> Result<Vec<SafeEntry>, ZipError> {
    let mut archive =
        zip::ZipArchive::new(Cursor::new(bytes)).map_err(|e| ZipError::NotAZip(e.to_string()))?;
    if archive.len() > limits.max_entries {
        return Err(ZipError::TooManyEntries {
            count: archive.len(),
            max: limits.max_entries,
        });
    }
    let mut entries = Vec::with_capacity(archive.len());
    let mut expanded: u64 = 0;
    for index in 0..archive.len() {
        let file = archive
            .by_index_raw(index)
            .map_err(|e| ZipError::NotAZip(e.to_string()))?;
        let name = file
            .name()
            .map_err(|e| ZipError::NotAZip(e.to_string()))?
            .into_owned();
        let path = safe_relative_path(&name).ok_or_else(|| ZipError::UnsafePath(name.clone()))?;
        let file_type = file.unix_mode().map(|m| m & S_IFMT).unwrap_or(0);
        if file.is_symlink() || file_type == S_IFLNK {
            return Err(ZipError::Symlink(name));
        }
        if !matches!(file_type, 0 | S_IFREG | S_IFDIR) {
            return Err(ZipError::SpecialFile(name));
        }
        if file.encrypted() {
            return Err(ZipError::Encrypted(name));
        }
        let size = file.size();
        expanded = expanded.saturating_add(size);
        if expanded > limits.max_expanded_bytes {
            return Err(ZipError::TooLarge {
                max: limits.max_expanded_bytes,
            });
        }
        if size > 1024 * 1024 && size / file.compressed_size().max(1) > limits.max_ratio {
            return Err(ZipError::RatioTooHigh {
                name,
                max: limits.max_ratio,
            });
        }
        let is_dir = file.is_dir() || file_type == S_IFDIR;
        let executable = !is_dir && file.unix_mode().is_some_and(|m| m & S_IXUSR != 0);
        entries.push(SafeEntry {
            index,
            path,
            is_dir,
            executable,
        });
    }
    Ok(entries)
}

/// `name` as a relative path of normal components only, or `None` if it is
/// absolute, has a `..`, a drive prefix, a NUL, or is empty.
fn safe_relative_path(name: &str) -> Option<PathBuf> {
    if name.contains('\0') || name.starts_with('\\') {
        return None;
    }
    // Zip paths use '/', but some tools write '\'; treat both as separators.
    let normalized = name.replace('\\', "/");
    let mut out = PathBuf::new();
    for comp in Path::new(&normalized).components() {
        match comp {
            Component::Normal(part) => {
                if part
                    .to_str()
                    .is_some_and(|p| p.len() >= 2 && p.as_bytes()[1] == b':')
                {
                    return None; // "C:" drive prefix
                }
                out.push(part);
            }
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use zip::write::SimpleFileOptions;

    fn build(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
        for (name, data) in entries {
            if name.ends_with('/') {
                w.add_directory(*name, SimpleFileOptions::default())
                    .expect("dir");
            } else {
                w.start_file(*name, SimpleFileOptions::default())
                    .expect("start");
                w.write_all(data).expect("write");
            }
        }
        w.finish().expect("finish").into_inner()
    }

    #[test]
    fn nested_files_pass_with_their_paths() {
        let z = build(&[("a/", b""), ("a/b/c.txt", b"hi"), ("./top.py", b"print(1)")]);
        let e = check_zip(&z, &ZipLimits::default()).expect("safe");
        let paths: Vec<_> = e
            .iter()
            .map(|e| e.path.to_string_lossy().into_owned())
            .collect();
        assert_eq!(paths, ["a", "a/b/c.txt", "top.py"]);
        assert!(e[0].is_dir && !e[1].is_dir);
    }

    #[test]
    fn traversal_and_absolute_paths_are_refused() {
        for bad in [
            "../evil",
            "a/../../evil",
            "/etc/passwd",
            "\\evil",
            "C:/x",
            "a\\..\\..\\x",
        ] {
            let z = build(&[(bad, b"x")]);
            assert!(
                matches!(
                    check_zip(&z, &ZipLimits::default()),
                    Err(ZipError::UnsafePath(_))
                ),
                "{bad} was accepted"
            );
        }
    }

    #[test]
    fn symlinks_are_refused() {
        let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
        w.add_symlink("link", "/etc/passwd", SimpleFileOptions::default())
            .expect("symlink");
        let z = w.finish().expect("finish").into_inner();
        assert_eq!(
            check_zip(&z, &ZipLimits::default()),
            Err(ZipError::Symlink("link".into()))
        );
    }

    /// Rewrites the first central-directory entry as made on Unix with `mode`
    /// (the writer will not produce device entries itself).
    fn with_unix_mode(mut zip: Vec<u8>, mode: u32) -> Vec<u8> {
        let at = zip
            .windows(4)
            .position(|w| w == [0x50, 0x4b, 0x01, 0x02])
            .expect("central directory");
        zip[at + 5] = 3; // version made by: Unix
        zip[at + 38..at + 42].copy_from_slice(&(mode << 16).to_le_bytes());
        zip
    }

    #[test]
    fn devices_and_fifos_are_refused() {
        for (mode, what) in [
            (0o020_644, "char device"),
            (0o060_644, "block device"),
            (0o010_644, "fifo"),
        ] {
            let z = with_unix_mode(build(&[("dev", b"")]), mode);
            assert_eq!(
                check_zip(&z, &ZipLimits::default()),
                Err(ZipError::SpecialFile("dev".into())),
                "{what} accepted"
            );
        }
        let regular = with_unix_mode(build(&[("file", b"x")]), 0o100_644);
        assert!(check_zip(&regular, &ZipLimits::default()).is_ok());
    }

    #[test]
    fn the_owner_execute_bit_is_reported_and_nothing_else() {
        let z = with_unix_mode(build(&[("run.sh", b"#!/bin/sh")]), 0o100_755);
        let e = check_zip(&z, &ZipLimits::default()).expect("safe");
        assert!(e[0].executable);
        // setuid + setgid + sticky with owner-execute: still only "executable".
        let z = with_unix_mode(build(&[("suid", b"x")]), 0o107_755);
        assert!(check_zip(&z, &ZipLimits::default()).expect("safe")[0].executable);
        // Group and other execute alone do not make the owner's file executable.
        for mode in [0o100_644, 0o100_611, 0o104_644] {
            let z = with_unix_mode(build(&[("data", b"x")]), mode);
            assert!(
                !check_zip(&z, &ZipLimits::default()).expect("safe")[0].executable,
                "{mode:o}"
            );
        }
        let dir = with_unix_mode(build(&[("d/", b"")]), 0o040_755);
        assert!(!check_zip(&dir, &ZipLimits::default()).expect("safe")[0].executable);
    }

    #[test]
    fn caps_on_entries_size_and_ratio_hold() {
        let limits = ZipLimits {
            max_entries: 2,
            max_expanded_bytes: 10,
            max_ratio: 100,
        };
        let z = build(&[("a", b""), ("b", b""), ("c", b"")]);
        assert_eq!(
            check_zip(&z, &limits),
            Err(ZipError::TooManyEntries { count: 3, max: 2 })
        );
        let z = build(&[("a", b"0123456789x")]);
        assert_eq!(check_zip(&z, &limits), Err(ZipError::TooLarge { max: 10 }));
        let zeros = vec![0u8; 4 * 1024 * 1024];
        let z = build(&[("bomb", &zeros)]);
        let roomy = ZipLimits {
            max_expanded_bytes: u64::MAX,
            ..limits
        };
        assert!(matches!(
            check_zip(&z, &roomy),
            Err(ZipError::RatioTooHigh { .. })
        ));
    }

    #[test]
    fn garbage_is_not_a_zip() {
        assert!(matches!(
            check_zip(b"hello", &ZipLimits::default()),
            Err(ZipError::NotAZip(_))
        ));
    }
}
