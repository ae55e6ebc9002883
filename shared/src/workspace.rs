//! Persistent workspaces without I/O: who a workspace is (`WorkspaceId`), what a
//! version holds (`Manifest`, over content-addressed blobs named by `BlobDigest`),
//! the two records Redis keeps (`WorkspaceRecord`, `VersionRecord`) and the rules
//! every path and mode in a manifest obeys.
//!
//! A workspace is a chain of immutable versions. Version 0 is the empty one every
//! workspace starts at; a task that runs on a workspace starts from one version
//! and, when it ends, its `/workspace` becomes the next version. Files live once,
//! as blobs named by their SHA-256, so a version that changes one file stores one
//! file, and a fork is a new workspace whose first version names the same
//! manifest.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::names::{UnknownName, stored_names};
use crate::owner::Owner;

/// A workspace's id: a UUID, made by the api. Parsed once, so a path or a key
/// built from it holds nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkspaceId(uuid::Uuid);

/// A text that is no workspace id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a workspace id: ids are the UUIDs run_script and fork_workspace return")]
pub struct BadWorkspaceId(pub String);

impl WorkspaceId {
    /// An id from 16 bytes (the api's are random).
    pub fn from_bytes(bytes: [u8; 16]) -> WorkspaceId {
        WorkspaceId(uuid::Uuid::from_bytes(bytes))
    }

    /// Only the hyphenated form, the one this service prints.
    pub fn parse(text: &str) -> Result<WorkspaceId, BadWorkspaceId> {
        match uuid::Uuid::try_parse(text) {
            Ok(u) if text.len() == 36 => Ok(WorkspaceId(u)),
            _ => Err(BadWorkspaceId(text.chars().take(64).collect())),
        }
    }
}

impl fmt::Display for WorkspaceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

impl Serialize for WorkspaceId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for WorkspaceId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        WorkspaceId::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// A string in the UUID form (`parse` takes the hyphenated one only).
impl schemars::JsonSchema for WorkspaceId {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "WorkspaceId".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "string", "format": "uuid"})
    }
}

/// A blob's name: the SHA-256 of its bytes, as 64 lower-case hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct BlobDigest(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a SHA-256 digest (64 lower-case hex digits)")]
pub struct BadDigest(pub String);

impl BlobDigest {
    pub fn of(bytes: &[u8]) -> BlobDigest {
        BlobDigest::from_hasher(Sha256::new_with_prefix(bytes))
    }

    /// The digest a streaming hasher reached.
    pub fn from_hasher(hasher: Sha256) -> BlobDigest {
        BlobDigest(
            hasher
                .finalize()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
        )
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for BlobDigest {
    type Error = BadDigest;

    fn try_from(s: String) -> Result<Self, BadDigest> {
        let ok = s.len() == 64 && s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
        if ok {
            Ok(BlobDigest(s))
        } else {
            Err(BadDigest(s))
        }
    }
}

impl From<BlobDigest> for String {
    fn from(d: BlobDigest) -> String {
        d.0
    }
}

impl fmt::Display for BlobDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The permission bits a manifest keeps: read, write and execute for owner,
/// group and others. Set-user-ID, set-group-ID and sticky bits are dropped, so
/// no restored file can raise privileges.
pub const MODE_MASK: u32 = 0o777;

/// The longest path a manifest holds, in bytes (Linux's `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;

/// One entry of a version: a directory, a regular file or a symbolic link, at
/// a relative path under `/workspace`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub path: String,
    #[serde(flatten)]
    pub kind: EntryKind,
}

/// What an entry is. Nothing else is kept: no devices, pipes or sockets, and a
/// hard link is stored as the file it names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EntryKind {
    Dir {
        mode: u32,
    },
    File {
        mode: u32,
        size: u64,
        sha256: BlobDigest,
    },
    /// Kept as a link, whatever it points at: it resolves inside a container
    /// only, never while the worker packs or restores a version.
    Symlink {
        target: String,
    },
}

/// Why a manifest or an entry is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error(
        "{path:?} is not a path a workspace can hold: paths are relative, with no empty, `.` or `..` part, no NUL, at most {MAX_PATH_BYTES} bytes"
    )]
    BadPath { path: String },
    #[error("{path:?} appears twice in the workspace")]
    Duplicate { path: String },
    #[error("{path:?} is inside {parent:?}, which is not a directory of the workspace")]
    NoParent { path: String, parent: String },
    #[error("the link {path:?} has an empty target or one with a NUL byte")]
    BadLink { path: String },
    #[error("the workspace version holds more than {max} files")]
    TooManyFiles { max: u64 },
    #[error("the workspace version holds more than {max} bytes")]
    TooLarge { max: u64 },
    #[error("{path:?} has mode {mode:o}: a workspace keeps only permission bits (0777)")]
    BadMode { path: String, mode: u32 },
    #[error("the manifest is not valid JSON: {0}")]
    Json(String),
}

/// Checks one path: relative, each part a real name.
pub fn check_path(path: &str) -> Result<(), ManifestError> {
    let bad = path.is_empty()
        || path.len() > MAX_PATH_BYTES
        || path.starts_with('/')
        || path.contains('\0')
        || path
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..");
    if bad {
        Err(ManifestError::BadPath {
            path: path.chars().take(200).collect(),
        })
    } else {
        Ok(())
    }
}

/// How long after a task's end its worker may still be saving its /workspace,
/// in ms: the workspace stays busy that long (SUBMIT), and a worker gives up a
/// save that would take longer (WS_COMMIT would refuse it once another task
/// took the workspace).
pub const SAVE_GRACE_MS: u64 = 600_000;

/// The caps on one version (`WORKSPACE_MAX_BYTES`, `WORKSPACE_MAX_FILES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionLimits {
    pub max_bytes: u64,
    /// Entries of any kind: files, directories and links.
    pub max_files: u64,
}

impl VersionLimits {
    /// For reading a stored manifest whatever today's caps: a version made
    /// under larger ones is still named, and only its shape is checked.
    pub const UNCAPPED: VersionLimits = VersionLimits {
        max_bytes: u64::MAX,
        max_files: u64::MAX,
    };
}

/// A version's files: every entry, sorted by path, each parent a directory
/// listed before its children.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Manifest {
    /// The manifest's format, for readers of later versions.
    pub format: u32,
    pub entries: Vec<Entry>,
}

/// The manifest format this version writes and reads.
pub const MANIFEST_FORMAT: u32 = 1;

impl Manifest {
    /// A manifest of `entries` (in any order), checked: paths, duplicates,
    /// parents, links and the caps.
    pub fn new(mut entries: Vec<Entry>, limits: VersionLimits) -> Result<Manifest, ManifestError> {
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        let manifest = Manifest {
            format: MANIFEST_FORMAT,
            entries,
        };
        manifest.check(limits)?;
        Ok(manifest)
    }

    fn check(&self, limits: VersionLimits) -> Result<(), ManifestError> {
        if self.entries.len() as u64 > limits.max_files {
            return Err(ManifestError::TooManyFiles {
                max: limits.max_files,
            });
        }
        if self.bytes() > limits.max_bytes {
            return Err(ManifestError::TooLarge {
                max: limits.max_bytes,
            });
        }
        let mut dirs = BTreeSet::new();
        let mut previous: Option<&str> = None;
        for e in &self.entries {
            check_path(&e.path)?;
            if previous == Some(e.path.as_str()) {
                return Err(ManifestError::Duplicate {
                    path: e.path.clone(),
                });
            }
            previous = Some(&e.path);
            if let Some((parent, _)) = e.path.rsplit_once('/')
                && !dirs.contains(parent)
            {
                return Err(ManifestError::NoParent {
                    path: e.path.clone(),
                    parent: parent.to_owned(),
                });
            }
            let mode = match &e.kind {
                EntryKind::Dir { mode } | EntryKind::File { mode, .. } => *mode,
                EntryKind::Symlink { .. } => 0,
            };
            if mode & !MODE_MASK != 0 {
                return Err(ManifestError::BadMode {
                    path: e.path.clone(),
                    mode,
                });
            }
            match &e.kind {
                EntryKind::Dir { .. } => {
                    dirs.insert(e.path.as_str());
                }
                EntryKind::Symlink { target } if target.is_empty() || target.contains('\0') => {
                    return Err(ManifestError::BadLink {
                        path: e.path.clone(),
                    });
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The bytes of its files.
    pub fn bytes(&self) -> u64 {
        self.files().map(|(_, size, _)| size).sum()
    }

    /// Its entries of every kind.
    pub fn count(&self) -> u64 {
        self.entries.len() as u64
    }

    /// Its regular files: path, size and blob.
    pub fn files(&self) -> impl Iterator<Item = (&str, u64, &BlobDigest)> {
        self.entries.iter().filter_map(|e| match &e.kind {
            EntryKind::File { size, sha256, .. } => Some((e.path.as_str(), *size, sha256)),
            _ => None,
        })
    }

    /// The blobs it names, each once.
    pub fn blobs(&self) -> BTreeSet<&BlobDigest> {
        self.files().map(|(_, _, d)| d).collect()
    }

    /// Its stored form (JSON); its digest names it in the blob store.
    pub fn to_json(&self) -> Vec<u8> {
        // Plain strings and numbers: serializing cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// A stored manifest, checked as `new` checks one.
    pub fn from_json(bytes: &[u8], limits: VersionLimits) -> Result<Manifest, ManifestError> {
        let m: Manifest =
            serde_json::from_slice(bytes).map_err(|e| ManifestError::Json(e.to_string()))?;
        Manifest::new(m.entries, limits)
    }
}

/// The fields of a workspace's hash (`Keys::workspace`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantArray,
    strum::Display,
)]
#[strum(serialize_all = "snake_case", const_into_str)]
#[strum(parse_err_ty = UnknownName, parse_err_fn = WorkspaceField::unknown)]
pub enum WorkspaceField {
    /// `Owner::as_stored()` (`""` for the admin).
    Owner,
    CreatedAt,
    /// When a task or a tool last used it (the idle expiry counts from here).
    LastUsedAt,
    /// The version a task starts from when it names none (0: empty).
    Head,
    /// The number the next version gets.
    NextVersion,
    /// The task running on it, while one is (else absent).
    Busy,
    /// `<workspace id>@<version>` it was forked from.
    ForkedFrom,
    /// What its kept versions hold, summed (each version counted whole):
    /// what it counts against its owner's cap (`WORKSPACE_OWNER_MAX_MB`).
    Bytes,
}

stored_names!(WorkspaceField, parse "workspace field");

/// The fields of the blob store's sweep (`Keys::workspace_sweep`, kept by
/// WS_SWEEP; WS_COMMIT reads `Epoch`, WS_FORK counts `Forks` up).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantArray,
    strum::Display,
)]
#[strum(serialize_all = "snake_case", const_into_str)]
#[strum(parse_err_ty = UnknownName, parse_err_fn = SweepField::unknown)]
pub enum SweepField {
    /// Counted up as each delete phase starts: a save commits only in the
    /// epoch it began in.
    Epoch,
    /// Counted up by each fork of a version.
    Forks,
    /// The worker sweeping, while one is.
    Holder,
    /// `listing` (reading what is stored and named) or `deleting`.
    Phase,
    /// When the holder's lease ends (ms, Redis's clock).
    Until,
    /// When the last sweep began (ms, Redis's clock): every worker tries to
    /// sweep, and the first to find none within the interval does.
    Began,
}

stored_names!(SweepField, parse "sweep field");

/// The sweep's phases (`SweepField::Phase`), as WS_SWEEP writes them.
pub const SWEEP_PHASES: [&str; 2] = ["listing", "deleting"];

/// The fields of a version's hash (`Keys::workspace_version`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantArray,
    strum::Display,
)]
#[strum(serialize_all = "snake_case", const_into_str)]
#[strum(parse_err_ty = UnknownName, parse_err_fn = VersionField::unknown)]
pub enum VersionField {
    /// The manifest's blob digest.
    Manifest,
    /// The task that made it (absent for a fork's first version).
    TaskId,
    /// The version it started from.
    Parent,
    Bytes,
    Files,
    CreatedAt,
}

stored_names!(VersionField, parse "workspace version field");

/// A workspace, as its hash holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceRecord {
    pub id: WorkspaceId,
    pub owner: Owner,
    pub created_at: i64,
    pub last_used_at: i64,
    pub head: u64,
    pub busy: Option<String>,
    pub forked_from: Option<String>,
    /// Its kept versions' bytes, summed (0 when none was counted yet).
    pub bytes: u64,
}

/// A version, as its hash holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VersionRecord {
    pub version: u64,
    pub manifest: BlobDigest,
    pub task_id: Option<String>,
    pub parent: Option<u64>,
    pub bytes: u64,
    pub files: u64,
    pub created_at: i64,
}

/// The caps WS_COMMIT holds a new version to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkspaceCaps {
    /// `WORKSPACE_VERSIONS_KEPT`: the newest versions a workspace keeps.
    pub versions_kept: u64,
    /// `WORKSPACE_OWNER_MAX_MB`, in bytes: the most an owner's workspaces may
    /// hold together (their kept versions' bytes, each counted whole); 0: no
    /// cap. The admin key's are not capped.
    pub owner_max_bytes: u64,
}

/// A stored workspace or version hash that does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the stored {what} {field} is not valid: {value:?}")]
pub struct BadStored {
    pub what: &'static str,
    pub field: &'static str,
    pub value: String,
}

fn get<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn number<T: std::str::FromStr>(
    pairs: &[(String, String)],
    what: &'static str,
    field: &'static str,
) -> Result<T, BadStored> {
    let v = get(pairs, field).unwrap_or("");
    v.parse().map_err(|_| BadStored {
        what,
        field,
        value: v.chars().take(80).collect(),
    })
}

impl WorkspaceRecord {
    /// From an `HGETALL`; `Ok(None)` for an empty hash (no such workspace).
    pub fn from_hash(
        id: WorkspaceId,
        pairs: &[(String, String)],
    ) -> Result<Option<WorkspaceRecord>, BadStored> {
        if pairs.is_empty() {
            return Ok(None);
        }
        let w = "workspace";
        Ok(Some(WorkspaceRecord {
            id,
            owner: Owner::from_stored(get(pairs, WorkspaceField::Owner.as_str()).unwrap_or("")),
            created_at: number(pairs, w, WorkspaceField::CreatedAt.as_str())?,
            last_used_at: number(pairs, w, WorkspaceField::LastUsedAt.as_str())?,
            head: number(pairs, w, WorkspaceField::Head.as_str())?,
            busy: get(pairs, WorkspaceField::Busy.as_str())
                .filter(|b| !b.is_empty())
                .map(str::to_owned),
            forked_from: get(pairs, WorkspaceField::ForkedFrom.as_str()).map(str::to_owned),
            bytes: get(pairs, WorkspaceField::Bytes.as_str())
                .and_then(|b| b.parse().ok())
                .unwrap_or(0),
        }))
    }
}

impl VersionRecord {
    /// From an `HGETALL`; `Ok(None)` for an empty hash (no such version).
    pub fn from_hash(
        version: u64,
        pairs: &[(String, String)],
    ) -> Result<Option<VersionRecord>, BadStored> {
        if pairs.is_empty() {
            return Ok(None);
        }
        let w = "workspace version";
        let manifest = get(pairs, VersionField::Manifest.as_str()).unwrap_or("");
        Ok(Some(VersionRecord {
            version,
            manifest: BlobDigest::try_from(manifest.to_owned()).map_err(|_| BadStored {
                what: w,
                field: VersionField::Manifest.as_str(),
                value: manifest.chars().take(80).collect(),
            })?,
            task_id: get(pairs, VersionField::TaskId.as_str()).map(str::to_owned),
            parent: get(pairs, VersionField::Parent.as_str()).and_then(|p| p.parse().ok()),
            bytes: number(pairs, w, VersionField::Bytes.as_str())?,
            files: number(pairs, w, VersionField::Files.as_str())?,
            created_at: number(pairs, w, VersionField::CreatedAt.as_str())?,
        }))
    }
}

/// Where workspace blobs are kept (`WORKSPACE_STORE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// A directory on this host (`file:///path`, or an absolute path): one
    /// host, or a volume every api and worker mounts.
    Local(std::path::PathBuf),
    /// An S3 bucket (`s3://bucket/prefix`), on AWS or any S3-compatible server
    /// (`WORKSPACE_S3_ENDPOINT`).
    S3 { bucket: String, prefix: String },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a workspace store: give an absolute path (or file:///path) for a directory, or s3://bucket[/prefix]"
)]
pub struct BadStoreLocation(pub String);

impl StoreLocation {
    pub fn parse(text: &str) -> Result<StoreLocation, BadStoreLocation> {
        let bad = || BadStoreLocation(text.to_owned());
        if let Some(rest) = text.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            let ok = !bucket.is_empty()
                && bucket
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_'));
            if !ok || prefix.split('/').any(|p| p == "." || p == "..") {
                return Err(bad());
            }
            return Ok(StoreLocation::S3 {
                bucket: bucket.to_owned(),
                prefix: prefix.trim_matches('/').to_owned(),
            });
        }
        let path = text.strip_prefix("file://").unwrap_or(text);
        if !path.starts_with('/') {
            return Err(bad());
        }
        Ok(StoreLocation::Local(path.into()))
    }
}

/// What a `run_script` call asked of workspaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkspaceUse {
    /// A new, empty workspace.
    New,
    /// An existing one, from `version` (its head when `None`).
    Existing {
        id: WorkspaceId,
        version: Option<u64>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: VersionLimits = VersionLimits {
        max_bytes: 1000,
        max_files: 10,
    };

    fn file(path: &str, size: u64) -> Entry {
        Entry {
            path: path.into(),
            kind: EntryKind::File {
                mode: 0o644,
                size,
                sha256: BlobDigest::of(path.as_bytes()),
            },
        }
    }

    fn dir(path: &str) -> Entry {
        Entry {
            path: path.into(),
            kind: EntryKind::Dir { mode: 0o755 },
        }
    }

    #[test]
    fn ids_round_trip_and_nothing_else_parses() {
        let id = WorkspaceId::parse("0f5e3c1a-9b2d-4c7e-8a11-23456789abcd").expect("parses");
        assert_eq!(id.to_string(), "0f5e3c1a-9b2d-4c7e-8a11-23456789abcd");
        for bad in [
            "",
            "../etc",
            "0f5e3c1a9b2d4c7e8a1123456789abcd",
            "0f5e3c1a-9b2d-4c7e-8a11-23456789abcg",
            "0f5e3c1a-9b2d-4c7e-8a11-23456789abc/",
        ] {
            assert!(WorkspaceId::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            WorkspaceId::from_bytes([0xab; 16]).to_string(),
            "abababab-abab-abab-abab-abababababab"
        );
    }

    #[test]
    fn paths_are_relative_names_only() {
        for ok in ["a", "a/b.txt", "node_modules/.bin/x", ".venv/bin/python"] {
            assert_eq!(check_path(ok), Ok(()), "{ok}");
        }
        for bad in ["", "/etc", "a//b", "a/./b", "../x", "a/..", "a\0b", "a/"] {
            assert!(check_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_manifest_is_sorted_and_checked() {
        let m = Manifest::new(vec![file("d/x", 5), dir("d"), file("a", 3)], LIMITS).expect("valid");
        let paths: Vec<_> = m.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["a", "d", "d/x"]);
        assert_eq!((m.bytes(), m.count(), m.blobs().len()), (8, 3, 2));
        let back = Manifest::from_json(&m.to_json(), LIMITS).expect("reads back");
        assert_eq!(back, m);

        let orphan = Manifest::new(vec![file("d/x", 5)], LIMITS);
        assert!(matches!(orphan, Err(ManifestError::NoParent { .. })));
        let twice = Manifest::new(vec![file("a", 1), file("a", 2)], LIMITS);
        assert!(matches!(twice, Err(ManifestError::Duplicate { .. })));
        let big = Manifest::new(vec![file("a", 1001)], LIMITS);
        assert_eq!(big, Err(ManifestError::TooLarge { max: 1000 }));
        let many = Manifest::new((0..11).map(|i| file(&format!("f{i}"), 1)).collect(), LIMITS);
        assert_eq!(many, Err(ManifestError::TooManyFiles { max: 10 }));
        let link = Entry {
            path: "l".into(),
            kind: EntryKind::Symlink {
                target: String::new(),
            },
        };
        assert!(matches!(
            Manifest::new(vec![link], LIMITS),
            Err(ManifestError::BadLink { .. })
        ));
    }

    #[test]
    fn a_stored_manifest_is_checked_like_a_new_one() {
        let evil = br#"{"format":1,"entries":[{"path":"../x","type":"file","mode":420,"size":1,"sha256":"0000000000000000000000000000000000000000000000000000000000000000"}]}"#;
        assert!(matches!(
            Manifest::from_json(evil, LIMITS),
            Err(ManifestError::BadPath { .. })
        ));
        let bad_digest =
            br#"{"format":1,"entries":[{"path":"x","type":"file","mode":420,"size":1,"sha256":"../../etc/passwd"}]}"#;
        assert!(matches!(
            Manifest::from_json(bad_digest, LIMITS),
            Err(ManifestError::Json(_))
        ));
    }

    #[test]
    fn store_locations_parse() {
        assert_eq!(
            StoreLocation::parse("/var/lib/sr"),
            Ok(StoreLocation::Local("/var/lib/sr".into()))
        );
        assert_eq!(
            StoreLocation::parse("file:///data"),
            Ok(StoreLocation::Local("/data".into()))
        );
        assert_eq!(
            StoreLocation::parse("s3://bucket/a/b/"),
            Ok(StoreLocation::S3 {
                bucket: "bucket".into(),
                prefix: "a/b".into()
            })
        );
        for bad in ["relative/dir", "s3://", "s3://b/../x", "http://x"] {
            assert!(StoreLocation::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn records_read_back_from_their_hashes() {
        let id = WorkspaceId::from_bytes([1; 16]);
        let pairs = |kv: &[(&str, &str)]| -> Vec<(String, String)> {
            kv.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let ws = WorkspaceRecord::from_hash(
            id,
            &pairs(&[
                ("owner", "alice"),
                ("created_at", "5"),
                ("last_used_at", "7"),
                ("head", "2"),
                ("next_version", "3"),
                ("busy", ""),
            ]),
        )
        .expect("reads")
        .expect("exists");
        assert_eq!((ws.head, ws.busy.as_deref()), (2, None));
        assert_eq!(WorkspaceRecord::from_hash(id, &[]), Ok(None));
        let bad = WorkspaceRecord::from_hash(id, &pairs(&[("owner", "a"), ("created_at", "x")]));
        assert!(bad.is_err());
        let digest = BlobDigest::of(b"m").to_string();
        let v = VersionRecord::from_hash(
            1,
            &pairs(&[
                ("manifest", &digest),
                ("bytes", "3"),
                ("files", "1"),
                ("created_at", "9"),
            ]),
        )
        .expect("reads")
        .expect("exists");
        assert_eq!((v.version, v.bytes, v.parent), (1, 3, None));
    }
}
