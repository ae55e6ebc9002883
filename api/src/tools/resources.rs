//! Results as MCP resources. A task's collected files and a workspace
//! version's files have URIs (`ResourceUri`): `get_task_files` and
//! `read_files` answer with a `resource_link` for each, and `resources/read`
//! returns one, text or base64 by its content, checked against its owner: a
//! resource of another owner is answered exactly like one that does not exist.
//! `resources/list` pages through the caller's finished tasks' collected files,
//! newest first; `resources/templates/list` names the two URI forms.
//!
//! The task console is a resource too: `ui://script-runner/console`, an MCP
//! App (SEP-1865) in one HTML file (`console.html`), linked from the tools
//! that answer about a task or a workspace (`describe::with_console`). A host without
//! Apps ignores the link and sees the same results as before.

use std::io::Read as _;

use base64::Engine as _;
use base64::engine::general_purpose;
use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};
use rmcp::model::{
    CacheScope, ContentBlock, ListResourceTemplatesResult, ListResourcesResult, MetaObject,
    PaginatedRequestParams, ProtocolVersion, ReadResourceResult, Resource, ResourceContents,
    ResourceTemplate,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use shared::options::CollectedFiles;
use shared::workspace::{EntryKind, VersionLimits, WorkspaceId};

use super::args::{MAX_READ_BYTES, parse_cursor, parse_task_id};
use super::describe::{CONSOLE_MIME, CONSOLE_URI};
use super::error::{ErrorCode, ToolError};
use super::runner::{ScriptRunner, allowed};
use crate::auth::Scope;

/// The console's page, served as `CONSOLE_URI`.
const CONSOLE_HTML: &str = include_str!("console.html");

/// The console as `resources/read` returns it. `prefersBorder`: it is a
/// panel of its own, not part of the conversation's text.
fn console() -> ReadResourceResult {
    let mut meta = MetaObject::new();
    meta.insert(
        "ui".to_owned(),
        serde_json::json!({ "prefersBorder": true }),
    );
    let contents = ResourceContents::text(CONSOLE_HTML, CONSOLE_URI)
        .with_mime_type(CONSOLE_MIME)
        .with_meta(meta);
    ReadResourceResult::new(vec![contents])
}

/// The most bytes `resources/read` returns (a larger file is refused, naming
/// the tool that reads its start): `read_files`' own cap.
pub const MAX_RESOURCE_BYTES: u64 = MAX_READ_BYTES;

/// How long a client may keep the templates (`ttlMs`): they change only with
/// the server's version.
pub const TEMPLATES_TTL_MS: u64 = 3_600_000;

/// How long a client may keep a page of `resources/list`: tasks end and expire
/// all the time, so briefly, and for that caller alone.
pub const LIST_TTL_MS: u64 = 10_000;

/// Tasks one `resources/list` page looks at (each may have several files).
const LIST_TASKS: usize = 20;

/// Resources past which a page ends at the next task's boundary (a task's
/// files are never split between pages, so a page holds at most this plus
/// one task's `MAX_COLLECT_FILES`).
const LIST_RESOURCES: usize = 200;

/// Index entries one page examines at most, as `list_tasks`.
const LIST_EXAMINED: usize = 1000;

/// What a path segment escapes in a URI: controls, the space, and what a URI
/// gives a meaning to. `/` is kept: it separates the segments.
const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'@')
    .add(b'[')
    .add(b'\\')
    .add(b']')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

/// A resource this server has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResourceUri {
    /// `task://<task_id>/files/<path>`: a file the task collected.
    TaskFile { task_id: String, path: String },
    /// `workspace://<workspace_id>@<version>/<path>`: a file of a version.
    WorkspaceFile {
        id: WorkspaceId,
        version: u64,
        path: String,
    },
}

impl ResourceUri {
    /// The resource `uri` names, if it is one of ours.
    pub fn parse(uri: &str) -> Option<ResourceUri> {
        if let Some(rest) = uri.strip_prefix("task://") {
            let (task_id, path) = rest.split_once("/files/")?;
            return Some(ResourceUri::TaskFile {
                task_id: parse_task_id(task_id).ok()?,
                path: decode(path)?,
            });
        }
        let rest = uri.strip_prefix("workspace://")?;
        let (at, path) = rest.split_once('/')?;
        let (id, version) = at.split_once('@')?;
        Some(ResourceUri::WorkspaceFile {
            id: WorkspaceId::parse(id).ok()?,
            version: version.parse().ok().filter(|v| *v > 0)?,
            path: decode(path)?,
        })
    }

    /// A `resource_link` to this resource, named by its path.
    pub fn link(&self, size: u64) -> ContentBlock {
        let path = match self {
            ResourceUri::TaskFile { path, .. } | ResourceUri::WorkspaceFile { path, .. } => path,
        };
        ContentBlock::resource_link(self.resource(path, size))
    }

    fn resource(&self, name: &str, size: u64) -> Resource {
        Resource::new(self.to_string(), name).with_size(size)
    }
}

impl std::fmt::Display for ResourceUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResourceUri::TaskFile { task_id, path } => {
                write!(f, "task://{task_id}/files/{}", encode(path))
            }
            ResourceUri::WorkspaceFile { id, version, path } => {
                write!(f, "workspace://{id}@{version}/{}", encode(path))
            }
        }
    }
}

fn encode(path: &str) -> String {
    path.split('/')
        .map(|s| utf8_percent_encode(s, SEGMENT).to_string())
        .collect::<Vec<_>>()
        .join("/")
}

fn decode(path: &str) -> Option<String> {
    let path = percent_decode_str(path).decode_utf8().ok()?;
    (!path.is_empty()).then(|| path.into_owned())
}

/// The answer to a resource that is not there, or not the caller's.
fn not_found(uri: &str) -> McpError {
    McpError::resource_not_found(
        format!("no resource {uri}"),
        Some(serde_json::json!({ "uri": uri })),
    )
}

/// Whether a list answer may carry cache hints (`ttlMs`, `cacheScope`): they
/// exist from protocol 2026-07-28 on (rmcp's own rule). Every list method's.
pub(super) fn hints(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.protocol_version()
        .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28)
}

impl ScriptRunner {
    /// `resources/read`.
    pub(super) async fn read_resource_at(
        &self,
        uri: &str,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<ReadResourceResult, McpError> {
        let who = allowed(ctx, Scope::Read, "resources/read").map_err(ToolError::into_protocol)?;
        if uri == CONSOLE_URI {
            return Ok(console());
        }
        let Some(resource) = ResourceUri::parse(uri) else {
            return Err(McpError::invalid_params(
                format!(
                    "{uri:?} is not a resource of this server: use task://<task_id>/files/<path>, \
                     workspace://<workspace_id>@<version>/<path> or {CONSOLE_URI}"
                ),
                Some(ErrorCode::InvalidArgument.data()),
            ));
        };
        let too_large = |path: &str, size: u64, tool: &str| {
            McpError::invalid_params(
                format!(
                    "{path} is {size} bytes; resources/read returns at most {MAX_RESOURCE_BYTES}: \
                     use {tool}"
                ),
                Some(ErrorCode::TooLarge.data()),
            )
        };
        let bytes = match &resource {
            ResourceUri::TaskFile { task_id, path } => {
                let (state, _, zip) = self
                    .store
                    .files(task_id, |owner| who.sees(owner))
                    .await
                    .map_err(|e| ToolError::from(e).into_protocol())?
                    .ok_or_else(|| not_found(uri))?;
                // A task's files exist once it has ended.
                let zip = zip
                    .filter(|_| state.is_terminal())
                    .ok_or_else(|| not_found(uri))?;
                let wanted = path.clone();
                let entry = tokio::task::spawn_blocking(move || zip_entry(&zip, &wanted))
                    .await
                    .map_err(|e| McpError::internal_error(e.to_string(), None))?;
                match entry {
                    ZipEntry::Missing => return Err(not_found(uri)),
                    ZipEntry::TooLarge(size) => {
                        return Err(too_large(path, size, "get_task_files"));
                    }
                    ZipEntry::Bytes(bytes) => bytes,
                }
            }
            ResourceUri::WorkspaceFile { id, version, path } => {
                let (_, n, record) = self
                    .store
                    .workspace_version(id, who.owner(), Some(*version))
                    .await
                    .map_err(|e| ToolError::from(e).into_protocol())?
                    .ok_or_else(|| not_found(uri))?;
                let record = record.ok_or_else(|| not_found(uri))?;
                let blobs = self.blobs().map_err(ToolError::into_protocol)?;
                let manifest = blobs
                    .manifest(&record.manifest, VersionLimits::UNCAPPED)
                    .await
                    .map_err(|e| ToolError::from_blob_of(e, *id, n).into_protocol())?;
                // Files only: a directory or a link is no resource.
                let Some((size, sha256)) = manifest.entries.iter().find_map(|e| match &e.kind {
                    EntryKind::File { size, sha256, .. } if e.path == *path => {
                        Some((*size, sha256))
                    }
                    _ => None,
                }) else {
                    return Err(not_found(uri));
                };
                if size > MAX_RESOURCE_BYTES {
                    return Err(too_large(path, size, "read_files with max_bytes"));
                }
                blobs
                    .head_bytes(sha256, size, size)
                    .await
                    .map_err(|e| ToolError::from_blob_of(e, *id, n).into_protocol())?
                    .to_vec()
            }
        };
        let contents = match String::from_utf8(bytes) {
            Ok(text) => ResourceContents::text(text, uri),
            Err(e) => ResourceContents::blob(general_purpose::STANDARD.encode(e.into_bytes()), uri)
                .with_mime_type("application/octet-stream"),
        };
        Ok(ReadResourceResult::new(vec![contents]))
    }

    /// `resources/list`: the collected files of the caller's finished tasks,
    /// newest task first, `LIST_TASKS` tasks a page.
    pub(super) async fn list_resources_of(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let who = allowed(ctx, Scope::Read, "resources/list").map_err(ToolError::into_protocol)?;
        let cursor = request
            .and_then(|r| r.cursor)
            .map(|c| parse_cursor(&c))
            .transpose()
            .map_err(ToolError::into_protocol)?;
        let (tasks, next) = self
            .store
            .list(
                who.owner(),
                cursor.as_ref(),
                LIST_TASKS,
                LIST_EXAMINED,
                |t| t.state.is_terminal(),
            )
            .await
            .map_err(|e| ToolError::from(e).into_protocol())?;
        // The console first, on the first page.
        let mut resources = Vec::new();
        if cursor.is_none() {
            resources.push(
                Resource::new(CONSOLE_URI, "console")
                    .with_title("Task console")
                    .with_description("A live view of a task: state, output tails, kill, files, workspace versions.")
                    .with_mime_type(CONSOLE_MIME),
            );
        }
        let mut next = next.map(|c| format!("{}.{}", c.created_ms, c.task_id));
        for t in tasks {
            if resources.len() >= LIST_RESOURCES {
                // Full: the page ends with the task before this one, which
                // `next` names already.
                break;
            }
            let here = format!("{}.{}", t.created_ms, t.task_id);
            let Some(json) = self
                .store
                .collected(&t.task_id)
                .await
                .map_err(|e| ToolError::from(e).into_protocol())?
            else {
                continue;
            };
            // A listing that does not read is skipped here; get_task_files
            // names the fault.
            let Ok(listing) = serde_json::from_str::<CollectedFiles>(&json) else {
                continue;
            };
            for f in listing.files {
                let uri = ResourceUri::TaskFile {
                    task_id: t.task_id.clone(),
                    path: f.name.clone(),
                };
                resources.push(uri.resource(&f.name, f.size));
            }
            if resources.len() >= LIST_RESOURCES {
                next = Some(here);
            }
        }
        let mut result = ListResourcesResult::with_all_items(resources);
        result.next_cursor = next;
        Ok(if hints(ctx) {
            result
                .with_ttl_ms(LIST_TTL_MS)
                .with_cache_scope(CacheScope::Private)
        } else {
            result
        })
    }

    /// `resources/templates/list`: the two URI forms, on one page.
    pub(super) fn resource_templates(
        &self,
        ctx: &RequestContext<RoleServer>,
    ) -> ListResourceTemplatesResult {
        let templates = vec![
            ResourceTemplate::new("task://{task_id}/files/{+path}", "task-file").with_description(
                "A file a finished task collected (run_script's collect), as get_task_files lists it.",
            ),
            ResourceTemplate::new("workspace://{workspace_id}@{version}/{+path}", "workspace-file")
                .with_description(
                    "A file of a workspace version, as read_files shows it (files only; at most 1 MiB).",
                ),
        ];
        let result = ListResourceTemplatesResult::with_all_items(templates);
        if hints(ctx) {
            // The same for every caller: any cache may share it.
            result
                .with_ttl_ms(TEMPLATES_TTL_MS)
                .with_cache_scope(CacheScope::Public)
        } else {
            result
        }
    }
}

/// One file of a task's collected zip, as `resources/read` returns it.
enum ZipEntry {
    Missing,
    TooLarge(u64),
    Bytes(Vec<u8>),
}

/// The file `path` of `zip` (blocking: run on the blocking pool).
fn zip_entry(zip: &[u8], path: &str) -> ZipEntry {
    let Ok(mut archive) = zip::ZipArchive::new(std::io::Cursor::new(zip)) else {
        return ZipEntry::Missing;
    };
    let Ok(mut file) = archive.by_name(path) else {
        return ZipEntry::Missing;
    };
    if !file.is_file() {
        return ZipEntry::Missing;
    }
    let size = file.size();
    if size > MAX_RESOURCE_BYTES {
        return ZipEntry::TooLarge(size);
    }
    let mut bytes = Vec::with_capacity(size as usize);
    // No further than the header says, whatever the entry inflates to.
    match (&mut file).take(size).read_to_end(&mut bytes) {
        Ok(_) => ZipEntry::Bytes(bytes),
        Err(_) => ZipEntry::Missing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_round_trip_with_their_paths_escaped() {
        let task = ResourceUri::TaskFile {
            task_id: "0f5e3c1a-0000-4000-8000-000000000001".into(),
            path: "out/a b#1?.txt".into(),
        };
        let text = task.to_string();
        assert_eq!(
            text,
            "task://0f5e3c1a-0000-4000-8000-000000000001/files/out/a%20b%231%3F.txt"
        );
        assert_eq!(ResourceUri::parse(&text), Some(task));
        let id = WorkspaceId::parse("0f5e3c1a-0000-4000-8000-000000000002").expect("an id");
        let ws = ResourceUri::WorkspaceFile {
            id,
            version: 3,
            path: "src/ünï@.py".into(),
        };
        assert_eq!(ResourceUri::parse(&ws.to_string()), Some(ws));
    }

    #[test]
    fn what_is_not_a_resource_of_ours_is_none() {
        for uri in [
            "file:///etc/passwd",
            "task://not-a-uuid/files/a",
            "task://0f5e3c1a-0000-4000-8000-000000000001/files/",
            "task://0f5e3c1a-0000-4000-8000-000000000001/a",
            "workspace://0f5e3c1a-0000-4000-8000-000000000002/a",
            "workspace://0f5e3c1a-0000-4000-8000-000000000002@0/a",
            "workspace://0f5e3c1a-0000-4000-8000-000000000002@x/a",
        ] {
            assert_eq!(ResourceUri::parse(uri), None, "{uri}");
        }
    }
}
