//! `write_files`' change to a workspace version, as a pure function over its
//! manifest: paths deleted (with everything under them), then files written,
//! their parents made as directories where missing. The worker applies it
//! (`worker/src/runner/edit.rs`) after storing the written files' blobs.

use std::collections::BTreeMap;

use crate::workspace::{
    BlobDigest, Entry, EntryKind, Manifest, ManifestError, VersionLimits, check_path,
};

/// A file `write_files` writes: its path, and its bytes' size and digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub path: String,
    pub size: u64,
    pub sha256: BlobDigest,
}

/// Why an edit cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    #[error("{path:?} is a directory of the workspace: a file cannot be written over it")]
    IsDirectory { path: String },
    #[error(
        "{path:?} cannot be written: {parent:?} is a file or a link in the workspace, not a directory"
    )]
    ParentNotDirectory { path: String, parent: String },
    #[error(transparent)]
    Manifest(#[from] ManifestError),
}

/// The mode of a file written new (one written over keeps its mode) and of a
/// directory made for it.
pub const NEW_FILE_MODE: u32 = 0o644;
pub const NEW_DIR_MODE: u32 = 0o755;

/// `base` with `deletes` removed (a path and all under it; a path not there is
/// no error), then `writes` made, checked against `limits`.
pub fn edit(
    base: &Manifest,
    writes: &[Written],
    deletes: &[String],
    limits: VersionLimits,
) -> Result<Manifest, EditError> {
    let mut entries: BTreeMap<String, EntryKind> = base
        .entries
        .iter()
        .map(|e| (e.path.clone(), e.kind.clone()))
        .collect();
    for d in deletes {
        check_path(d)?;
        entries.remove(d.as_str());
        // What lies under `d/` sorts between `d/` and `d0` ('0' follows '/'),
        // so a delete costs its subtree, not the whole manifest.
        let under: Vec<String> = entries
            .range(format!("{d}/")..format!("{d}0"))
            .map(|(p, _)| p.clone())
            .collect();
        for p in under {
            entries.remove(&p);
        }
    }
    for w in writes {
        check_path(&w.path)?;
        // Each parent: a directory already, or made one.
        let mut at = 0;
        while let Some(slash) = w.path[at..].find('/') {
            let parent = &w.path[..at + slash];
            match entries.get(parent) {
                Some(EntryKind::Dir { .. }) => {}
                Some(_) => {
                    return Err(EditError::ParentNotDirectory {
                        path: w.path.clone(),
                        parent: parent.to_owned(),
                    });
                }
                None => {
                    entries.insert(parent.to_owned(), EntryKind::Dir { mode: NEW_DIR_MODE });
                }
            }
            at += slash + 1;
        }
        let mode = match entries.get(&w.path) {
            Some(EntryKind::Dir { .. }) => {
                return Err(EditError::IsDirectory {
                    path: w.path.clone(),
                });
            }
            Some(EntryKind::File { mode, .. }) => *mode,
            Some(EntryKind::Symlink { .. }) | None => NEW_FILE_MODE,
        };
        entries.insert(
            w.path.clone(),
            EntryKind::File {
                mode,
                size: w.size,
                sha256: w.sha256.clone(),
            },
        );
    }
    let entries = entries
        .into_iter()
        .map(|(path, kind)| Entry { path, kind })
        .collect();
    Ok(Manifest::new(entries, limits)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: VersionLimits = VersionLimits {
        max_bytes: 1000,
        max_files: 10,
    };

    fn file(path: &str, mode: u32, body: &[u8]) -> Entry {
        Entry {
            path: path.into(),
            kind: EntryKind::File {
                mode,
                size: body.len() as u64,
                sha256: BlobDigest::of(body),
            },
        }
    }

    fn dir(path: &str) -> Entry {
        Entry {
            path: path.into(),
            kind: EntryKind::Dir { mode: 0o700 },
        }
    }

    fn written(path: &str, body: &[u8]) -> Written {
        Written {
            path: path.into(),
            size: body.len() as u64,
            sha256: BlobDigest::of(body),
        }
    }

    fn base() -> Manifest {
        let link = Entry {
            path: "link".into(),
            kind: EntryKind::Symlink {
                target: "/etc/passwd".into(),
            },
        };
        let entries = vec![
            dir("src"),
            file("src/main.py", 0o755, b"print(1)"),
            dir("src/old"),
            file("src/old/a.txt", 0o644, b"a"),
            file("README", 0o600, b"hi"),
            link,
        ];
        Manifest::new(entries, LIMITS).expect("a manifest")
    }

    fn paths(m: &Manifest) -> Vec<&str> {
        m.entries.iter().map(|e| e.path.as_str()).collect()
    }

    #[test]
    fn deletes_take_a_path_and_all_under_it_then_writes_make_their_parents() {
        let m = edit(
            &base(),
            &[
                written("src/new/deep/b.txt", b"b"),
                written("top.txt", b"t"),
            ],
            &["src/old".into(), "not/there".into()],
            LIMITS,
        )
        .expect("edited");
        assert_eq!(
            paths(&m),
            [
                "README",
                "link",
                "src",
                "src/main.py",
                "src/new",
                "src/new/deep",
                "src/new/deep/b.txt",
                "top.txt"
            ]
        );
        let made = m
            .entries
            .iter()
            .find(|e| e.path == "src/new")
            .expect("made");
        assert_eq!(made.kind, EntryKind::Dir { mode: NEW_DIR_MODE });
    }

    #[test]
    fn a_delete_keeps_the_names_that_only_begin_like_it() {
        let neighbours = [
            written("src/old.txt", b"1"),
            written("src/olden/x", b"2"),
            written("src/old/c", b"3"),
        ];
        let m = edit(&base(), &neighbours, &[], LIMITS).expect("written");
        let m = edit(&m, &[], &["src/old".into()], LIMITS).expect("deleted");
        assert_eq!(
            paths(&m),
            [
                "README",
                "link",
                "src",
                "src/main.py",
                "src/old.txt",
                "src/olden",
                "src/olden/x"
            ]
        );
    }

    #[test]
    fn a_file_written_over_keeps_its_mode_and_one_over_a_link_replaces_it() {
        let m = edit(
            &base(),
            &[
                written("src/main.py", b"print(2)"),
                written("link", b"now a file"),
            ],
            &[],
            LIMITS,
        )
        .expect("edited");
        let kind = |p: &str| {
            m.entries
                .iter()
                .find(|e| e.path == p)
                .map(|e| e.kind.clone())
        };
        assert_eq!(
            kind("src/main.py"),
            Some(EntryKind::File {
                mode: 0o755,
                size: 8,
                sha256: BlobDigest::of(b"print(2)")
            })
        );
        assert!(matches!(
            kind("link"),
            Some(EntryKind::File {
                mode: NEW_FILE_MODE,
                ..
            })
        ));
    }

    #[test]
    fn a_write_over_a_directory_under_a_file_or_past_the_caps_is_refused() {
        let refused = |writes: &[Written]| edit(&base(), writes, &[], LIMITS).unwrap_err();
        assert_eq!(
            refused(&[written("src", b"x")]),
            EditError::IsDirectory { path: "src".into() }
        );
        assert_eq!(
            refused(&[written("README/x", b"x")]),
            EditError::ParentNotDirectory {
                path: "README/x".into(),
                parent: "README".into()
            }
        );
        // Through a link, never: a link is no directory here.
        assert!(matches!(
            refused(&[written("link/x", b"x")]),
            EditError::ParentNotDirectory { .. }
        ));
        assert!(matches!(
            refused(&[written("../x", b"x")]),
            EditError::Manifest(ManifestError::BadPath { .. })
        ));
        let big = Written {
            path: "big".into(),
            size: 2000,
            sha256: BlobDigest::of(b"big"),
        };
        assert!(matches!(
            refused(&[big]),
            EditError::Manifest(ManifestError::TooLarge { .. })
        ));
        assert!(matches!(
            edit(&base(), &[], &["/abs".into()], LIMITS).unwrap_err(),
            EditError::Manifest(ManifestError::BadPath { .. })
        ));
    }
}
