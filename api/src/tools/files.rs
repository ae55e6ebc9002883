//! `read_files`: a version's files as text (or base64), matched by path
//! patterns and bounded like the tails, read from the workers' blob store, so
//! an agent sees what a task left without running one or unpacking a zip. Its
//! arguments, its answer and the tool (a router of its own, added to `calls`'s
//! in `runner`).

use base64::Engine as _;
use base64::engine::general_purpose;
use bytes::Bytes;
use futures_util::StreamExt;
use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use shared::workspace::{BlobDigest, Entry, EntryKind, Manifest, VersionLimits, WorkspaceId};

use super::args::{
    DEFAULT_READ_BYTES, MAX_LISTED, MAX_PATTERNS, MAX_READ_BYTES, Named, parse_version,
    parse_workspace_id, version,
};
use super::error::ToolError;
use super::resources::ResourceUri;
use super::runner::{ScriptRunner, allowed};
use crate::auth::Scope;

/// The longest pattern.
const MAX_PATTERN_LEN: usize = 1024;

/// How many files `read_files` reads from the store at once.
const READS_AT_ONCE: usize = 16;

/// Input of `read_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFilesInput {
    /// The workspace to read: a workspace_id run_script (with workspace
    /// "new") or fork_workspace returned.
    pub workspace_id: String,
    /// Optional: the version to read (get_workspace lists the kept ones).
    /// Default: its head, the newest.
    #[serde(default, deserialize_with = "version")]
    pub version: Option<i64>,
    /// Paths in /workspace, relative to it (a leading "/workspace/" is
    /// dropped), or patterns: `*` and `?` within one path segment, `**` across
    /// segments, `{a,b}` alternatives, `[abc]` classes. E.g. ["README.md",
    /// "src/**/*.py"]. 1 to {max_patterns}.
    pub paths: Vec<String>,
    /// Optional: the most content bytes returned, all files together (1 to
    /// {max_read_bytes}; default {default_read_bytes}). Files are read in path
    /// order until it is used up; a file cut short, and every file after,
    /// says `truncated`.
    #[serde(default)]
    pub max_bytes: Option<i64>,
    /// Optional: also answer with a resource_link content item per file cut
    /// short (default false; each file's uri is in the answer either way).
    #[serde(default)]
    pub resource_links: Option<bool>,
}

/// One entry of the version that a pattern matched.
#[derive(Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub struct FileContent {
    /// Relative to /workspace.
    pub path: String,
    /// "file" or "symlink" (directories are not listed: match their files).
    pub kind: FileKind,
    /// A file's size in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// A file's permission bits, e.g. "0755".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// A link's target, as stored (never followed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// The file's bytes as text, when they are UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// The file's bytes as base64, when they are not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_base64: Option<String>,
    /// A file's uri for resources/read, which returns it whole:
    /// workspace://<workspace_id>@<version>/<path>.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    /// True: only the start of the file is here, or none of it (max_bytes
    /// was used up).
    pub truncated: bool,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Symlink,
}

/// Output of `read_files`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ReadFilesOutput {
    pub workspace_id: WorkspaceId,
    /// The version read.
    pub version: u64,
    /// The matched files and links, in path order (at most {max_listed}).
    pub files: Vec<FileContent>,
    /// True: more entries matched than are listed; narrow the patterns.
    pub more: bool,
    /// The patterns that matched nothing in this version.
    pub unmatched: Vec<String>,
}

/// `paths` checked and compiled: each pattern, and the set of all. Each also
/// matches the path it spells, as it is: a file named `a[1].txt` is found by
/// its name, though as a pattern `[1]` is a class.
#[derive(Debug)]
pub struct Patterns {
    given: Vec<String>,
    literal: Vec<String>,
    each: Vec<globset::GlobMatcher>,
    all: GlobSet,
}

impl Patterns {
    pub fn parse(paths: &[String]) -> Result<Patterns, ToolError> {
        if paths.is_empty() || paths.len() > MAX_PATTERNS {
            return Err(ToolError::BadPatternCount {
                got: paths.len(),
                max: MAX_PATTERNS,
            });
        }
        let mut set = GlobSetBuilder::new();
        let mut each = Vec::with_capacity(paths.len());
        let mut literal = Vec::with_capacity(paths.len());
        for raw in paths {
            let glob = pattern(raw)?;
            literal.push(relative(raw).to_owned());
            each.push(glob.compile_matcher());
            set.add(glob);
        }
        // Each compiled alone above: only the set's size can fail here.
        let all = set.build().map_err(|e| ToolError::BadPattern {
            pattern: paths.join(" ").chars().take(120).collect(),
            why: format!("the patterns together are too complex ({e})"),
        })?;
        Ok(Patterns {
            given: paths.to_vec(),
            literal,
            each,
            all,
        })
    }
}

/// A pattern relative to /workspace: a leading "/workspace/" or "./" dropped.
fn relative(raw: &str) -> &str {
    raw.strip_prefix("/workspace/")
        .or_else(|| raw.strip_prefix("./"))
        .unwrap_or(raw)
}

/// One pattern: relative to /workspace, `*` within a segment.
fn pattern(raw: &str) -> Result<Glob, ToolError> {
    let bad = |why: &str| ToolError::BadPattern {
        pattern: raw.chars().take(120).collect(),
        why: why.to_owned(),
    };
    if raw.len() > MAX_PATTERN_LEN {
        return Err(bad(&format!("longer than {MAX_PATTERN_LEN} bytes")));
    }
    let rel = relative(raw);
    if rel.is_empty() {
        return Err(bad("empty"));
    }
    if rel.starts_with('/') {
        return Err(bad(
            "an absolute path outside /workspace; give paths relative to /workspace",
        ));
    }
    if rel.split('/').any(|s| s == "..") {
        return Err(bad("\"..\" leaves /workspace"));
    }
    GlobBuilder::new(rel)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map_err(|e| bad(&e.kind().to_string()))
}

/// The entries of `manifest` the patterns match (files and links, in path
/// order, at most `MAX_LISTED`), whether there were more, and the patterns
/// that matched none.
pub fn select<'m>(manifest: &'m Manifest, p: &Patterns) -> (Vec<&'m Entry>, bool, Vec<String>) {
    let mut hit = vec![false; p.each.len()];
    let mut picked = Vec::new();
    let mut more = false;
    for entry in &manifest.entries {
        let named = |i: usize| p.literal[i] == entry.path;
        if matches!(entry.kind, EntryKind::Dir { .. })
            || !(p.all.is_match(&entry.path) || (0..p.literal.len()).any(named))
        {
            continue;
        }
        for (i, m) in p.each.iter().enumerate() {
            hit[i] |= m.is_match(&entry.path) || named(i);
        }
        if picked.len() < MAX_LISTED {
            picked.push(entry);
        } else {
            more = true;
        }
    }
    let unmatched = p
        .given
        .iter()
        .zip(hit)
        .filter(|(_, h)| !h)
        .map(|(g, _)| g.clone())
        .collect();
    (picked, more, unmatched)
}

/// A file's first bytes as the answer shows them: text when they are UTF-8
/// (a character cut at the end of a truncated read is dropped), else base64.
pub fn content(bytes: &[u8], truncated: bool) -> (Option<String>, Option<String>) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (Some(text.to_owned()), None),
        Err(e) if truncated && e.error_len().is_none() => {
            let text = String::from_utf8_lossy(&bytes[..e.valid_up_to()]).into_owned();
            (Some(text), None)
        }
        Err(_) => (None, Some(general_purpose::STANDARD.encode(bytes))),
    }
}

fn mode_text(mode: u32) -> String {
    format!("{:04o}", mode & 0o7777)
}

#[tool_router(router = files_router, vis = "pub(super)")]
impl ScriptRunner {
    #[tool(
        name = "read_files",
        description = "Read files of one of your workspaces' versions (its head unless version is given) \
without running a task: paths are relative to /workspace and may be patterns (\"src/**/*.py\", \"*.json\"). \
Each match comes back in path order with its size and mode, and its content as text (or content_base64 for \
binary files), up to max_bytes in all (default {default_read_bytes}, at most {max_read_bytes}); a file cut \
short says truncated. Links are listed with their target, never followed. unmatched lists the patterns that \
matched nothing. Each file's uri (workspace://<workspace_id>@<version>/<path>) is where resources/read returns \
it whole; with resource_links, a file cut short also comes as a resource_link content item.",
        output_schema = rmcp::handler::server::common::schema_for_output::<ReadFilesOutput>(),
        annotations(
            title = "Read workspace files",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn read_files(
        &self,
        Parameters(Named(input)): Parameters<Named<ReadFilesInput>>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        let who = allowed(&ctx, Scope::Read, "read_files")?;
        let id = parse_workspace_id(&input.workspace_id)?;
        let version = parse_version(input.version)?;
        let budget = match input.max_bytes {
            None => DEFAULT_READ_BYTES,
            Some(n) if n >= 1 && n as u64 <= MAX_READ_BYTES => n as u64,
            Some(n) => {
                return Err(ToolError::BadReadBytes {
                    got: n,
                    max: MAX_READ_BYTES,
                });
            }
        };
        let patterns = Patterns::parse(&input.paths)?;
        let (_, n, record) = self
            .store
            .workspace_version(&id, who.owner(), version)
            .await?
            .ok_or(ToolError::UnknownWorkspace(id))?;
        let manifest = match (n, record) {
            (0, _) => Manifest::default(),
            (_, None) => {
                return Err(ToolError::UnknownVersion {
                    workspace: id,
                    version: n,
                });
            }
            (_, Some(v)) => {
                let blobs = self.blobs()?;
                blobs
                    .manifest(&v.manifest, VersionLimits::UNCAPPED)
                    .await
                    .map_err(|e| ToolError::from_blob_of(e, id, n))?
            }
        };
        let (picked, more, unmatched) = select(&manifest, &patterns);
        // What each file gets of the budget, in path order, is known from the
        // sizes alone: the reads then go at once, `READS_AT_ONCE` at a time
        // (one round trip each to an S3 store), and come back in order.
        let mut left = budget;
        let takes: Vec<u64> = picked
            .iter()
            .map(|e| match &e.kind {
                EntryKind::File { size, .. } => {
                    let take = left.min(*size);
                    left -= take;
                    take
                }
                _ => 0,
            })
            .collect();
        // Owned, each read's blob, size and share: a stream of borrowed ones
        // makes the future not `Send` (rust-lang/rust#102211).
        let wanted: Vec<Option<(BlobDigest, u64, u64)>> = picked
            .iter()
            .zip(&takes)
            .map(|(e, &take)| match &e.kind {
                EntryKind::File { size, sha256, .. } if take > 0 => {
                    Some((sha256.clone(), *size, take))
                }
                _ => None,
            })
            .collect();
        // Only a file to read needs the store.
        let store = match wanted.iter().any(Option::is_some) {
            true => Some(self.blobs()?.clone()),
            false => None,
        };
        let reads: Vec<Result<Bytes, ToolError>> = futures_util::stream::iter(wanted)
            .map(|want| {
                let store = store.clone();
                async move {
                    match (want, store) {
                        (Some((sha256, size, take)), Some(store)) => store
                            .head_bytes(&sha256, size, take)
                            .await
                            .map_err(|e| ToolError::from_blob_of(e, id, n)),
                        _ => Ok(Bytes::new()),
                    }
                }
            })
            .buffered(READS_AT_ONCE)
            .collect()
            .await;
        let mut files = Vec::with_capacity(picked.len());
        for (entry, bytes) in picked.into_iter().zip(reads) {
            let bytes = bytes?;
            files.push(match &entry.kind {
                EntryKind::Symlink { target } => FileContent {
                    path: entry.path.clone(),
                    kind: FileKind::Symlink,
                    size: None,
                    mode: None,
                    target: Some(target.clone()),
                    content: None,
                    content_base64: None,
                    uri: None,
                    truncated: false,
                },
                EntryKind::File { mode, size, .. } => {
                    let truncated = (bytes.len() as u64) < *size;
                    let (content, content_base64) = content(&bytes, truncated);
                    FileContent {
                        path: entry.path.clone(),
                        kind: FileKind::File,
                        size: Some(*size),
                        mode: Some(mode_text(*mode)),
                        target: None,
                        content,
                        content_base64,
                        uri: Some(
                            ResourceUri::WorkspaceFile {
                                id,
                                version: n,
                                path: entry.path.clone(),
                            }
                            .to_string(),
                        ),
                        truncated,
                    }
                }
                EntryKind::Dir { .. } => continue,
            });
        }
        // Asked for (`resource_links`): a link for each file cut short, which
        // resources/read returns whole (the others are here in full). Only
        // when asked: agent frameworks that meet a non-text item turn the
        // answer into a list (Pydantic AI) or a file attachment their model
        // API refuses (LangChain on OpenAI). Version 0 has no files.
        let links: Vec<_> = files
            .iter()
            .filter(|f| {
                input.resource_links == Some(true) && f.kind == FileKind::File && f.truncated
            })
            .map(|f| {
                let uri = ResourceUri::WorkspaceFile {
                    id,
                    version: n,
                    path: f.path.clone(),
                };
                uri.link(f.size.unwrap_or(0))
            })
            .collect();
        let output = ReadFilesOutput {
            workspace_id: id,
            version: n,
            files,
            more,
            unmatched,
        };
        let value = serde_json::to_value(output).map_err(ToolError::Encode)?;
        let mut result = CallToolResult::structured(value);
        result.content.extend(links);
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::workspace::BlobDigest;

    fn file(path: &str) -> Entry {
        Entry {
            path: path.to_owned(),
            kind: EntryKind::File {
                mode: 0o644,
                size: 1,
                sha256: BlobDigest::of(b"x"),
            },
        }
    }

    fn dir(path: &str) -> Entry {
        Entry {
            path: path.to_owned(),
            kind: EntryKind::Dir { mode: 0o755 },
        }
    }

    fn paths(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn patterns_match_within_segments_and_across_with_double_stars() {
        let m = Manifest::new(
            vec![
                dir("src"),
                dir("src/pkg"),
                file("README.md"),
                file("src/a.py"),
                file("src/pkg/b.py"),
                file("src/pkg/c.txt"),
            ],
            VersionLimits::UNCAPPED,
        )
        .expect("manifest");
        let names = |p: &[&str]| {
            let (picked, more, unmatched) = select(&m, &Patterns::parse(&paths(p)).expect("ok"));
            assert!(!more);
            let got: Vec<&str> = picked.iter().map(|e| e.path.as_str()).collect();
            (got.join(" "), unmatched)
        };
        assert_eq!(names(&["src/*.py"]).0, "src/a.py");
        assert_eq!(names(&["src/**/*.py"]).0, "src/a.py src/pkg/b.py");
        assert_eq!(names(&["/workspace/README.md"]).0, "README.md");
        // A directory is not an entry shown; its files are.
        assert_eq!(names(&["src", "src/pkg/*"]).0, "src/pkg/b.py src/pkg/c.txt");
        assert_eq!(
            names(&["*.md", "nothing/**"]),
            ("README.md".to_owned(), paths(&["nothing/**"]))
        );
    }

    #[test]
    fn a_path_with_pattern_characters_is_also_matched_as_itself() {
        let m = Manifest::new(
            vec![file("a[1].txt"), file("a1.txt"), file("b.txt")],
            VersionLimits::UNCAPPED,
        )
        .expect("manifest");
        let (picked, _, unmatched) =
            select(&m, &Patterns::parse(&paths(&["./a[1].txt"])).expect("ok"));
        let got: Vec<&str> = picked.iter().map(|e| e.path.as_str()).collect();
        // As a pattern it is "a1.txt"; as itself, the file of that name.
        assert_eq!(got, ["a1.txt", "a[1].txt"]);
        assert!(unmatched.is_empty());
    }

    #[test]
    fn bad_patterns_are_refused_naming_them() {
        for (p, why) in [
            ("/etc/passwd", "absolute"),
            ("../x", ".."),
            ("a/[b", "unclosed"),
            ("", "empty"),
        ] {
            let e = Patterns::parse(&paths(&[p])).expect_err(p).to_string();
            assert!(e.contains(why), "{p}: {e}");
        }
        let none = Patterns::parse(&[]).expect_err("none").to_string();
        assert!(none.contains("1 to 64"), "{none}");
    }

    #[test]
    fn content_is_text_when_it_reads_as_text_and_base64_otherwise() {
        assert_eq!(content(b"hi\n", false), (Some("hi\n".into()), None));
        assert_eq!(content(&[0xff, 0x00], false), (None, Some("/wA=".into())));
        // "é" cut in half at the end of a truncated read: the half is dropped.
        assert_eq!(content(&[b'a', 0xc3], true), (Some("a".into()), None));
        assert_eq!(content(&[b'a', 0xc3], false), (None, Some("YcM=".into())));
    }
}
