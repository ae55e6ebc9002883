//! `write_files`: files written into a workspace as its next version, without
//! a container, so an agent never has to build a base64 zip. Its arguments,
//! its answer and the tool (a router of its own, added to `calls`'s in
//! `runner`).
//!
//! The api checks and signs the edit; a worker makes it (`worker/src/runner/
//! edit.rs`). The edit is a task on the ordinary path: its files travel as the
//! task's zip (made here, one entry per file), its deletes in the signed
//! `edit_deletes` field, and SUBMIT's one-task-per-workspace rule holds for it
//! as for a script. Why not write the version here: on one host the blob store
//! is a directory only the worker may write, and the sweep's fence against
//! deleting a save's blobs is the worker's.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use shared::apikey::Limits;
use shared::edit::Written;
use shared::scripts::{Submit, SubmitWorkspace};
use shared::spec;
use shared::view::StatusView;
use shared::workspace::{
    BlobDigest, Manifest, SAVE_GRACE_MS, VersionLimits, WorkspaceId, check_path,
};
use shared::{ReasonKind, TaskRecord, TaskState};

use super::args::{Named, parse_version, parse_workspace_id, version};
use super::error::ToolError;
use super::runner::{ScriptRunner, allowed};
use super::status::{Until, Wait, status_from_record};
use crate::auth::{Principal, Scope};

/// The most files one call writes, and the most paths it deletes.
pub const MAX_WRITE_FILES: usize = 1000;
pub const MAX_DELETES: usize = 1000;

/// How long `write_files` waits for its edit before it answers with the task
/// still under way (a busy queue).
pub const WRITE_WAIT: Duration = Duration::from_secs(30);

/// How an edit's task stands when `write_files` answers: `settled` once its
/// version, or why none will be made, is known.
struct EditEnd {
    view: StatusView,
    settled: bool,
}

/// Input of `write_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFilesInput {
    /// The workspace to write to: a workspace_id run_script (with workspace
    /// "new") or fork_workspace returned.
    pub workspace_id: String,
    /// Optional: the version to start from (get_workspace lists the kept
    /// ones). Default: its head. The edit becomes the next version either way.
    #[serde(default, deserialize_with = "version")]
    pub version: Option<i64>,
    /// Files to write, 0 to {max_write_files}: each a path relative to
    /// /workspace and its content as text, or as content_base64 for binary
    /// bytes. A file written over keeps its mode; a new one is 0644, and
    /// missing parent directories are made. {max_zip} in all.
    #[serde(default)]
    pub files: Vec<FileToWrite>,
    /// Optional: paths to delete first (0 to {max_deletes}), each with
    /// everything under it; a path that is not there is no error.
    #[serde(default)]
    pub delete: Vec<String>,
}

/// One file for `write_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileToWrite {
    /// Relative to /workspace (a leading "/workspace/" is dropped), e.g.
    /// "src/main.py".
    pub path: String,
    /// The file's text (UTF-8). Give this or content_base64.
    #[serde(default)]
    pub content: Option<String>,
    /// The file's bytes, base64. Give this or content.
    #[serde(default)]
    pub content_base64: Option<String>,
}

/// Output of `write_files`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct WriteFilesOutput {
    /// The task that made the edit (get_task_status shows it too).
    pub task_id: String,
    pub workspace_id: WorkspaceId,
    /// "succeeded" once the version is made; "queued" or "running" when the
    /// edit took longer than {write_wait_seconds} s to be made (a busy
    /// service): poll get_task_status with the task_id. An edit killed, or
    /// whose worker was lost, after its worker took it may still have made
    /// its version: the version decides, not the state.
    pub state: TaskState,
    /// The version the edit made (the workspace's head from then on); null
    /// while it is not known yet (get_task_status and get_workspace show it
    /// once it is).
    pub version: Option<u64>,
    /// Files written and paths deleted.
    pub written: usize,
    pub deleted: usize,
}

/// What `submit_task` checks against each base version of a `write_files`
/// call before it submits on it (`ScriptRunner::check_edit`).
#[derive(Debug, Clone, Copy)]
pub struct EditCheck<'a> {
    pub written: &'a [Written],
    pub deletes: &'a [String],
}

/// `files` and `delete` checked: each path relative to /workspace.
#[derive(Debug)]
struct Edit {
    files: Vec<(String, Vec<u8>)>,
    deletes: Vec<String>,
}

/// A path as given, relative to /workspace, checked.
fn relative(given: &str, what: &'static str) -> Result<String, ToolError> {
    let rel = given.strip_prefix("/workspace/").unwrap_or(given);
    check_path(rel).map_err(|_| ToolError::BadWrite {
        what,
        path: given.chars().take(200).collect(),
        why: "a path relative to /workspace is needed: no leading '/', no '.' or '..' \
              segments, no empty segment, no NUL, at most 4096 bytes"
            .into(),
    })?;
    Ok(rel.to_owned())
}

impl Edit {
    fn parse(input: WriteFilesInput, max_bytes: usize) -> Result<Edit, ToolError> {
        if input.files.is_empty() && input.delete.is_empty() {
            return Err(ToolError::NothingToWrite);
        }
        if input.files.len() > MAX_WRITE_FILES || input.delete.len() > MAX_DELETES {
            return Err(ToolError::TooManyWrites {
                files: input.files.len(),
                deletes: input.delete.len(),
                max_files: MAX_WRITE_FILES,
                max_deletes: MAX_DELETES,
            });
        }
        let mut seen = BTreeSet::new();
        let mut total = 0usize;
        let mut files = Vec::with_capacity(input.files.len());
        for f in input.files {
            let path = relative(&f.path, "files")?;
            if !seen.insert(path.clone()) {
                return Err(ToolError::BadWrite {
                    what: "files",
                    path,
                    why: "it is given twice; give each path once".into(),
                });
            }
            let bytes = match (f.content, f.content_base64) {
                (Some(text), None) => text.into_bytes(),
                (None, Some(b64)) => general_purpose::STANDARD.decode(b64.trim()).map_err(|e| {
                    ToolError::BadWrite {
                        what: "files",
                        path: path.clone(),
                        why: format!("content_base64 is not valid base64 ({e})"),
                    }
                })?,
                _ => {
                    return Err(ToolError::BadWrite {
                        what: "files",
                        path,
                        why: "give exactly one of content (text) and content_base64 (bytes)".into(),
                    });
                }
            };
            total += bytes.len();
            if total > max_bytes {
                return Err(ToolError::WriteTooLarge { max: max_bytes });
            }
            files.push((path, bytes));
        }
        let deletes = input
            .delete
            .iter()
            .map(|d| relative(d, "delete"))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Edit { files, deletes })
    }

    /// Each file's path, size and digest, and the zip that carries them to the
    /// worker (stored, not deflated: the bytes are checked by digest, and the
    /// blob store keeps them as they are). CPU-bound: on the blocking pool.
    fn pack(files: &[(String, Vec<u8>)]) -> Result<(Vec<Written>, Vec<u8>), std::io::Error> {
        let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .large_file(true);
        let mut written = Vec::with_capacity(files.len());
        for (path, bytes) in files {
            zip.start_file(path.as_str(), options)
                .map_err(std::io::Error::other)?;
            zip.write_all(bytes)?;
            written.push(Written {
                path: path.clone(),
                size: bytes.len() as u64,
                sha256: BlobDigest::of(bytes),
            });
        }
        let zip = zip.finish().map_err(std::io::Error::other)?.into_inner();
        Ok((written, zip))
    }
}

#[tool_router(router = edits_router, vis = "pub(super)")]
impl ScriptRunner {
    #[tool(
        name = "write_files",
        description = "Write files into one of your workspaces as its next version, without running a task \
or building a zip: files [{path, content}] (or content_base64 for binary) are written over its head (or \
over version, if given), after the paths in delete are removed with everything under them. Parent directories \
are made; a file written over keeps its mode. The answer comes when the version is made (at most \
{write_wait_seconds} s): its number, which the next run_script on the workspace starts from. One task at a \
time per workspace: a workspace a task is using is refused as busy. read_files reads files back.",
        output_schema = rmcp::handler::server::common::schema_for_output::<WriteFilesOutput>(),
        annotations(
            title = "Write workspace files",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn write_files(
        &self,
        Parameters(Named(input)): Parameters<Named<WriteFilesInput>>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<WriteFilesOutput>, ToolError> {
        let who = allowed(&ctx, Scope::Run, "write_files")?;
        let cfg = &self.config;
        let id = parse_workspace_id(&input.workspace_id)?;
        let version = parse_version(input.version)?;
        let Edit { files, deletes } = Edit::parse(input, cfg.max_zip_bytes)?;
        // Packing and hashing (what the spec signs of the zip) are CPU-bound.
        let (written, inputs) = tokio::task::spawn_blocking(move || {
            Edit::pack(&files).map(|(written, zip)| {
                let zip = Some(zip).filter(|_| !written.is_empty());
                (written, spec::Inputs::hash(zip, None))
            })
        })
        .await
        .map_err(|e| ToolError::WriteFailed(e.to_string()))?
        .map_err(|e| ToolError::WriteFailed(e.to_string()))?;
        let task_id = uuid::Uuid::new_v4().to_string();
        let mut record = TaskRecord {
            has_zip: Some(!written.is_empty()),
            has_stdin: Some(false),
            stdout_bytes: Some(0),
            stderr_bytes: Some(0),
            owner: Some(who.owner().clone()).filter(|o| !o.is_admin()),
            workspace_id: Some(id),
            workspace_base: version,
            edit_deletes: Some(deletes.clone()),
            ..TaskRecord::new(TaskState::Queued)
        };
        let submit = Submit {
            task_id: &task_id,
            inputs: &inputs,
            index_horizon_ms: (cfg.retention_seconds + cfg.max_timeout_seconds) * 1000,
            max_queued: cfg.max_queued_tasks,
            owner: who.owner(),
            limits: match &who {
                Principal::Admin => Limits::default(),
                Principal::Owner(g) => g.limits,
            },
            signer: &cfg.signer,
            workspace: Some(SubmitWorkspace {
                new: false,
                must_be_head: version.is_none(),
                save_grace_ms: SAVE_GRACE_MS,
            }),
        };
        // The edit is checked here against the version it will be made from,
        // so a write under a file or over a directory is the caller's error
        // at once, and no task is made.
        let check = EditCheck {
            written: &written,
            deletes: &deletes,
        };
        self.submit_task(&who, &submit, &mut record, Some(check))
            .await?;
        tracing::info!(
            %task_id, owner = %who.owner(), workspace_id = %id,
            workspace_base = record.workspace_base.unwrap_or(0),
            files = written.len(), deletes = deletes.len(), "edit queued"
        );
        let EditEnd { view, settled } = self.edit_end(&who, &task_id).await?;
        let made = view.workspace.as_ref().and_then(|w| w.workspace_version);
        if settled && made.is_none() {
            // The note says why no version was made, where there is one (a
            // kill's reason says only that it was killed).
            let note = view.workspace.and_then(|w| w.workspace_note);
            return Err(ToolError::FilesNotWritten {
                task_id,
                reason: note.or(view.reason).unwrap_or_default(),
            });
        }
        Ok(Json(WriteFilesOutput {
            task_id,
            workspace_id: id,
            state: view.state,
            version: made,
            written: written.len(),
            deleted: deletes.len(),
        }))
    }
}

impl ScriptRunner {
    /// The edit task's status once its version (or why it made none) is
    /// recorded, or as it is after `WRITE_WAIT`. Its end and its version are
    /// two writes: a kill ends the task at once while its worker goes on and
    /// commits (or notes why not), and a worker lost after its commit ends it
    /// `worker-lost` with the version made, so the version decides, not the
    /// state.
    async fn edit_end(&self, who: &Principal, task_id: &str) -> Result<EditEnd, ToolError> {
        let deadline = tokio::time::Instant::now() + WRITE_WAIT;
        let status = self
            .status_waiting(
                who,
                task_id.to_owned(),
                0,
                Wait {
                    wait: WRITE_WAIT,
                    until: Until::Final,
                    progress: None,
                    seen: None,
                },
            )
            .await?;
        let mut view = status.view;
        // Whether a worker took the task, once the record is read.
        let mut claimed = None;
        loop {
            let recorded = view
                .workspace
                .as_ref()
                .is_some_and(|w| w.workspace_version.is_some() || w.workspace_note.is_some());
            let settled = if !view.state.is_terminal() {
                Some(false)
            } else if recorded || view.reason_kind == Some(ReasonKind::SpecRejected) {
                Some(true)
            } else {
                match claimed {
                    // Killed before any worker took it: none ever will (CLAIM
                    // takes only a queued task), so no version is coming.
                    Some(false) => Some(true),
                    Some(true) if tokio::time::Instant::now() >= deadline => Some(false),
                    _ => None,
                }
            };
            if let Some(settled) = settled {
                return Ok(EditEnd { view, settled });
            }
            // Taken: its worker still commits, or notes why not. Neither
            // write comes with an event to wait on, and an edit's commit
            // follows within milliseconds of its blobs being stored, so a
            // short poll.
            if claimed.is_some() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let read = self.status_read(who, task_id).await?;
            view = status_from_record(task_id.to_owned(), &read, 0)?.view;
            if claimed.is_none() {
                // Once: a worker's name, once written, stays.
                claimed = Some(self.store.claimed(task_id).await?);
            }
        }
    }

    /// The edit applied to version `base` of `id`, as the worker will apply
    /// it (`shared::edit::edit`), but for the caps on a version, which are
    /// the workers' settings and are checked there.
    pub(super) async fn check_edit(
        &self,
        who: &Principal,
        id: WorkspaceId,
        base: u64,
        edit: &EditCheck<'_>,
    ) -> Result<(), ToolError> {
        let manifest = if base == 0 {
            Manifest::new(Vec::new(), VersionLimits::UNCAPPED)
                .map_err(|e| ToolError::WorkspaceData(e.to_string()))?
        } else {
            let (_, _, record) = self
                .store
                .workspace_version(&id, who.owner(), Some(base))
                .await?
                .ok_or(ToolError::UnknownWorkspace(id))?;
            let record = record.ok_or(ToolError::UnknownVersion {
                workspace: id,
                version: base,
            })?;
            self.blobs()?
                .manifest(&record.manifest, VersionLimits::UNCAPPED)
                .await
                .map_err(|e| ToolError::from_blob_of(e, id, base))?
        };
        shared::edit::edit(
            &manifest,
            edit.written,
            edit.deletes,
            VersionLimits::UNCAPPED,
        )
        .map(drop)
        .map_err(|e| ToolError::EditRefused(e.to_string()))
    }
}
