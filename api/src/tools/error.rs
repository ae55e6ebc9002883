//! A tool call that ran but could not do what was asked: `ToolError`, the stable
//! code each error carries beside its message, and how both reach a client.
//!
//! A tool error is a tool result with `isError: true`: the message as its text
//! content (what a model reads) and `{"code", "message"}` as its
//! `structuredContent` (what a program branches on). A `tasks/*` request that
//! fails is a JSON-RPC error instead, with `{"code"}` as its `data`.

use rmcp::ErrorData as McpError;
use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, ErrorCode as RpcCode};
use serde::Serialize;
use shared::TaskState;
use shared::apikey::{Scope, Scopes};
use shared::egress::EgressError;
use shared::options::{CollectError, EnvError, Network, Networks};
use shared::tail::TAIL_CAP;
use shared::workspace::{BadWorkspaceId, WorkspaceId};
use shared::zipcheck::ZipError;

use crate::config::MAX_WAIT_SECONDS;

/// How many times `run_script` submits on a workspace's head when the head
/// moved between its read and the submit, before it says the workspace is busy.
pub const MOVED_ATTEMPTS: u32 = 3;
use crate::db::StoreError;

/// What kind of error a tool call met, for a client to branch on without
/// parsing the message (which may change). Serialised in snake_case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// An argument is malformed, missing, unknown or out of range: fix it.
    InvalidArgument,
    /// An input (command, zip, stdin, env, collect) exceeds the server's limit:
    /// make it smaller.
    TooLarge,
    /// The runtime is not one this server offers (its instructions list them).
    UnknownRuntime,
    /// No task with this id: never created here, or its record expired.
    UnknownTask,
    /// The task has not reached a final state yet: poll, then call again.
    NotFinished,
    /// The service is at capacity: try again once some tasks have finished.
    QueueFull,
    /// No workspace with this id that the caller may use: never made here, or
    /// deleted (another owner's is answered alike).
    UnknownWorkspace,
    /// The workspace has no such version kept: get_workspace lists them.
    UnknownVersion,
    /// A task is using the workspace: wait for it to end, or fork_workspace.
    WorkspaceBusy,
    /// write_files' edit reached a worker and made no version: the message
    /// says why (a cap on a version or on the owner's workspaces, the store
    /// failing, the edit killed). The workspace is as it was.
    FilesNotWritten,
    /// The API key lacks the scope this call needs, or may not use the
    /// network asked for: use a key that has it.
    MissingScope,
    /// One of the API key's quotas is used up: the message says which, its
    /// value and when it frees up.
    QuotaExceeded,
    /// The task store (Redis) is unreachable or failed: try again shortly.
    Unavailable,
    /// The server met data it cannot read, or could not encode its answer:
    /// trying again will not help.
    Internal,
    /// No tool of that name (a protocol error of `tools/call`).
    UnknownTool,
    /// No method of that name (a protocol error).
    UnknownMethod,
}

impl ErrorCode {
    /// The JSON-RPC `error.data` of a protocol error with this code.
    pub fn data(self) -> serde_json::Value {
        serde_json::json!({ "code": self })
    }
}

/// A tool call that ran but could not do what was asked. The message is shown to
/// the model as is, so it says what was wrong and what is allowed.
/// What a caller without a scope presented: its refusal says how to get it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    ApiKey,
    /// An OAuth access token.
    AccessToken,
}

impl Credential {
    fn remedy(self, needed: Scope) -> String {
        match self {
            Credential::ApiKey => format!("ask the operator for a key with {needed}"),
            Credential::AccessToken => format!(
                "sign in again asking for the {needed} scope (a token without a scope claim has \
                 only the operator's OAUTH_DEFAULT_SCOPES, none by default)"
            ),
        }
    }
}

impl std::fmt::Display for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Credential::ApiKey => "API key",
            Credential::AccessToken => "access token",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("unknown runtime {given:?}: use one of {allowed}")]
    UnknownRuntime { given: String, allowed: String },
    #[error(
        "runtime is missing: give runtime (or runtime_name, the same argument for clients that keep \"runtime\" for themselves, such as LangChain's MCP adapters), one of {allowed}"
    )]
    NoRuntime { allowed: String },
    #[error(
        "runtime {runtime:?} and runtime_name {runtime_name:?} name different runtimes: give one of the two"
    )]
    TwoRuntimes {
        runtime: String,
        runtime_name: String,
    },
    #[error(
        "{field} is not valid base64 ({detail}); encode with the standard alphabet, e.g. `printf '%s' 'echo hi' | base64 -w0`"
    )]
    BadBase64 { field: &'static str, detail: String },
    #[error(
        "command_base64 decodes to bytes that are not UTF-8 text; encode a UTF-8 shell one-liner"
    )]
    CommandNotUtf8,
    #[error(
        "command_base64 decodes to an empty command; give a shell one-liner such as `python3 main.py`"
    )]
    EmptyCommand,
    #[error("command_base64 decodes to a command containing a NUL byte, which a shell cannot run")]
    CommandHasNul,
    #[error("the command is {size} bytes; at most {max} are allowed (put long code in zip_base64)")]
    CommandTooLong { size: usize, max: usize },
    #[error("the zip is {size} bytes; at most {max} are allowed")]
    ZipTooLarge { size: usize, max: usize },
    #[error(
        "stdin_base64 decodes to {size} bytes; at most {max} are allowed (put larger input in zip_base64 and redirect it)"
    )]
    StdinTooLarge { size: usize, max: usize },
    #[error("{0}")]
    Env(#[from] EnvError),
    #[error("{0}")]
    Collect(#[from] CollectError),
    #[error("{0}")]
    Egress(#[from] EgressError),
    #[error(
        "this API key may not run tasks with network \"{asked}\"; it may use: {allowed} (pass \
         one of those as network, or ask the operator)"
    )]
    NetworkNotAllowed { asked: Network, allowed: Networks },
    #[error(
        "task {0} is still {1}: its files are collected when it ends; poll get_task_status until the state is final"
    )]
    NotFinished(String, TaskState),
    #[error("{0}")]
    Zip(#[from] ZipError),
    #[error("timeout_seconds must be at least 1 (got {0}); omit it for the default of {1} s")]
    TimeoutTooSmall(i64, u64),
    #[error("tail_bytes must be between 0 and {TAIL_CAP} (got {0})")]
    BadTailBytes(i64),
    #[error("wait_seconds must be between 0 and {MAX_WAIT_SECONDS} (got {0})")]
    BadWaitSeconds(i64),
    #[error(
        "task_id {0:?} is not a task id: pass the task_id exactly as run_script returned it (a UUID)"
    )]
    MalformedTaskId(String),
    #[error(
        "no task with id {0}: it was never created here, or its record expired after the retention period"
    )]
    UnknownTask(String),
    #[error(
        "the service is at capacity ({0} tasks queued or running); wait for some to finish and try again"
    )]
    QueueFull(u64),
    #[error(
        "workspace_id {0:?} is not a workspace id: pass the workspace_id exactly as run_script or fork_workspace returned it (a UUID)"
    )]
    MalformedWorkspaceId(String),
    #[error(
        "no workspace with id {0}: it was never made here, or it was deleted; list_workspaces lists yours, and run_script with workspace \"new\" makes one"
    )]
    UnknownWorkspace(WorkspaceId),
    #[error(
        "workspace {workspace} has no version {version}: it was never made, or it is no longer kept (only the newest are); get_workspace lists the kept versions, and omitting version uses the head"
    )]
    UnknownVersion {
        workspace: WorkspaceId,
        version: u64,
    },
    #[error(
        "workspace {workspace} is busy: task {task} is using it (one task at a time per workspace, until its /workspace is saved); wait for that task to end (get_task_status with wait_seconds), or fork_workspace to run from the same version at once"
    )]
    WorkspaceBusy {
        workspace: WorkspaceId,
        task: String,
    },
    #[error(
        "workspace {0} is busy: its head moved on each of {MOVED_ATTEMPTS} tries, as tasks on it ended and were saved; try again, or fork_workspace to run from one version at once"
    )]
    WorkspaceMoving(WorkspaceId),
    #[error(
        "quota workspace bytes reached: your workspaces would hold {would_hold} bytes, over this server's cap of {cap} bytes (WORKSPACE_OWNER_MAX_MB) on what one owner's kept versions hold together; delete_workspace ones no longer needed, then try again"
    )]
    WorkspaceQuota { would_hold: u64, cap: u64 },
    #[error("version must be a version number, 0 or more (got {0}); omit it for the head")]
    BadVersion(i64),
    #[error("paths must hold 1 to {max} paths or patterns (got {got})")]
    BadPatternCount { got: usize, max: usize },
    #[error(
        "path pattern {pattern:?} is not valid: {why}; give paths relative to /workspace, with `*` and `?` within a segment, `**` across segments, `{{a,b}}` and `[abc]`"
    )]
    BadPattern { pattern: String, why: String },
    #[error("max_bytes must be between 1 and {max} (got {got})")]
    BadReadBytes { got: i64, max: u64 },
    #[error("write_files needs files to write or paths to delete; both are empty")]
    NothingToWrite,
    #[error(
        "write_files got {files} files and {deletes} deletes; at most {max_files} files and {max_deletes} deletes per call (split the edit over several calls)"
    )]
    TooManyWrites {
        files: usize,
        deletes: usize,
        max_files: usize,
        max_deletes: usize,
    },
    #[error("{what} entry {path:?} is not valid: {why}")]
    BadWrite {
        what: &'static str,
        path: String,
        why: String,
    },
    #[error(
        "the files hold more than {max} bytes together, the most one write_files call may write; split them over several calls"
    )]
    WriteTooLarge { max: usize },
    /// The edit does not fit the version it starts from.
    #[error(
        "the edit cannot be made: {0}; read_files or get_workspace shows what the version holds"
    )]
    EditRefused(String),
    #[error("the files could not be packed ({0}); this is a server fault")]
    WriteFailed(String),
    /// The blocking thread that decodes and hashes a large zip was lost.
    #[error("the zip and stdin could not be decoded ({0}); this is a server fault")]
    InputsLost(String),
    /// The worker could not make the edit: the workspace is as it was.
    #[error("write_files task {task_id} made no version: {reason}")]
    FilesNotWritten { task_id: String, reason: String },
    /// The blob store failed or is not reachable from this api replica.
    #[error(
        "the workspace's files could not be read from the workspace store ({0}); try again shortly"
    )]
    WorkspaceStore(String),
    /// The store holds something other than what the version names.
    #[error("the workspace's files in the store do not read ({0}); this is a server fault")]
    WorkspaceData(String),
    #[error(
        "cursor {0:?} is not one list_workspaces returned; pass next_cursor exactly as given, or omit it for the newest workspaces"
    )]
    BadWorkspaceCursor(String),
    #[error(
        "this {credential} lacks the {needed} scope, which {call} needs (it has: {have}); {}",
        credential.remedy(*needed)
    )]
    MissingScope {
        needed: Scope,
        call: &'static str,
        have: Scopes,
        credential: Credential,
    },
    #[error(
        "quota max_queued reached: this API key may have at most {limit} tasks waiting in the queue and has {count}; it frees up as soon as one of them starts or ends (or kill_task one)"
    )]
    QuotaQueued { limit: u64, count: u64 },
    #[error(
        "quota max_running reached: this API key may have at most {limit} tasks queued or running at once and has {count}; more are refused, not queued: it frees up as soon as one of them ends (or kill_task one)"
    )]
    QuotaRunning { limit: u64, count: u64 },
    #[error(
        "quota cpu_seconds_per_day reached: this API key's tasks used {used_seconds} CPU seconds in the last 24 hours, of {limit_seconds} allowed; it frees up at {frees_at}, when enough of that use is 24 hours old"
    )]
    QuotaCpu {
        limit_seconds: u64,
        used_seconds: u64,
        frees_at: String,
    },
    /// The request reached a tool without passing authentication (a wiring
    /// fault): refused rather than run with no owner.
    #[error("the request carries no authenticated caller; this is a server fault")]
    NoPrincipal,
    #[error(
        "cursor {0:?} is not one list_tasks returned; pass next_cursor exactly as given, or omit it for the newest tasks"
    )]
    BadCursor(String),
    #[error("limit must be between 1 and {max} (got {got})")]
    BadLimit { got: i64, max: usize },
    /// A task record that does not read as one (a field missing or garbled):
    /// not the store failing, so no "try again".
    #[error("task {task_id}'s record cannot be read ({what}); this is a server fault")]
    CorruptRecord { task_id: String, what: String },
    /// Our own answer failed to serialise: a bug, not bad input nor Redis.
    #[error("the answer could not be encoded ({0}); this is a server fault")]
    Encode(#[source] serde_json::Error),
    #[error("{}{}", .0, retry_hint(.0))]
    Store(#[from] StoreError),
}

/// Only a store that failed (rather than one that returned nonsense) is worth
/// another try.
fn retry_hint(e: &StoreError) -> &'static str {
    match e {
        StoreError::Redis(_)
        | StoreError::Pool(_)
        | StoreError::BuildPool(_)
        | StoreError::NotReplicated(_) => "; try again shortly",
        StoreError::Record { .. }
        | StoreError::Workspace { .. }
        | StoreError::Reply { .. }
        | StoreError::ApiKey(_) => "",
    }
}

impl From<BadWorkspaceId> for ToolError {
    fn from(e: BadWorkspaceId) -> ToolError {
        ToolError::MalformedWorkspaceId(e.0)
    }
}

impl ToolError {
    /// A blob store error met reading version `version` of `workspace`, as
    /// the caller reads it: an object gone means the version was dropped (and
    /// swept) since it was looked up, which another try will not change; the
    /// store failing is worth another try; what it holds not reading is not.
    pub fn from_blob_of(e: blobs::BlobError, workspace: WorkspaceId, version: u64) -> ToolError {
        if e.is_not_found() {
            return ToolError::UnknownVersion { workspace, version };
        }
        ToolError::from_blob(e)
    }

    /// A blob store error as the caller reads it: the store failing is worth
    /// another try, what it holds not reading is not.
    pub fn from_blob(e: blobs::BlobError) -> ToolError {
        match e {
            blobs::BlobError::Store(_) | blobs::BlobError::Cache(_) => {
                ToolError::WorkspaceStore(e.to_string())
            }
            blobs::BlobError::Corrupt(_) | blobs::BlobError::Manifest(_) => {
                ToolError::WorkspaceData(e.to_string())
            }
        }
    }

    /// The stable code beside the message.
    pub fn code(&self) -> ErrorCode {
        use ErrorCode as C;
        match self {
            ToolError::UnknownRuntime { .. } => C::UnknownRuntime,
            ToolError::NoRuntime { .. }
            | ToolError::TwoRuntimes { .. }
            | ToolError::BadBase64 { .. }
            | ToolError::CommandNotUtf8
            | ToolError::EmptyCommand
            | ToolError::CommandHasNul
            | ToolError::TimeoutTooSmall(..)
            | ToolError::BadTailBytes(_)
            | ToolError::BadWaitSeconds(_)
            | ToolError::MalformedTaskId(_)
            | ToolError::BadCursor(_)
            | ToolError::BadLimit { .. }
            | ToolError::MalformedWorkspaceId(_)
            | ToolError::BadVersion(_)
            | ToolError::BadPatternCount { .. }
            | ToolError::BadPattern { .. }
            | ToolError::BadReadBytes { .. }
            | ToolError::NothingToWrite
            | ToolError::BadWrite { .. }
            | ToolError::EditRefused(_)
            | ToolError::BadWorkspaceCursor(_) => C::InvalidArgument,
            ToolError::TooManyWrites { .. } | ToolError::WriteTooLarge { .. } => C::TooLarge,
            ToolError::WriteFailed(_) | ToolError::InputsLost(_) => C::Internal,
            ToolError::FilesNotWritten { .. } => C::FilesNotWritten,
            ToolError::WorkspaceStore(_) => C::Unavailable,
            ToolError::WorkspaceQuota { .. } => C::QuotaExceeded,
            ToolError::WorkspaceData(_) => C::Internal,
            ToolError::UnknownWorkspace(_) => C::UnknownWorkspace,
            ToolError::UnknownVersion { .. } => C::UnknownVersion,
            ToolError::WorkspaceBusy { .. } | ToolError::WorkspaceMoving(_) => C::WorkspaceBusy,
            ToolError::CommandTooLong { .. }
            | ToolError::ZipTooLarge { .. }
            | ToolError::StdinTooLarge { .. } => C::TooLarge,
            ToolError::Env(e) => match e {
                EnvError::TooMany(_) | EnvError::TooLarge(_) => C::TooLarge,
                EnvError::BadName(_) | EnvError::Reserved(_) | EnvError::NulInValue(_) => {
                    C::InvalidArgument
                }
            },
            ToolError::NetworkNotAllowed { .. } => C::MissingScope,
            ToolError::Egress(e) => match e {
                EgressError::TooMany(_) => C::TooLarge,
                // Not a malformed entry: one this caller may not name.
                EgressError::OutsideCeiling { .. } => C::MissingScope,
                _ => C::InvalidArgument,
            },
            ToolError::Collect(e) => match e {
                CollectError::TooMany(_) => C::TooLarge,
                CollectError::BadPattern(_) => C::InvalidArgument,
            },
            ToolError::Zip(e) => match e {
                ZipError::TooManyEntries { .. }
                | ZipError::TooLarge { .. }
                | ZipError::RatioTooHigh { .. } => C::TooLarge,
                ZipError::NotAZip(_)
                | ZipError::UnsafePath(_)
                | ZipError::Symlink(_)
                | ZipError::SpecialFile(_)
                | ZipError::Encrypted(_) => C::InvalidArgument,
            },
            ToolError::NotFinished(..) => C::NotFinished,
            ToolError::UnknownTask(_) => C::UnknownTask,
            ToolError::QueueFull(_) => C::QueueFull,
            ToolError::MissingScope { .. } => C::MissingScope,
            ToolError::QuotaQueued { .. }
            | ToolError::QuotaRunning { .. }
            | ToolError::QuotaCpu { .. } => C::QuotaExceeded,
            ToolError::CorruptRecord { .. } | ToolError::Encode(_) | ToolError::NoPrincipal => {
                C::Internal
            }
            ToolError::Store(
                StoreError::Redis(_)
                | StoreError::Pool(_)
                | StoreError::BuildPool(_)
                | StoreError::NotReplicated(_),
            ) => C::Unavailable,
            ToolError::Store(
                StoreError::Record { .. }
                | StoreError::Workspace { .. }
                | StoreError::Reply { .. }
                | StoreError::ApiKey(_),
            ) => C::Internal,
        }
    }

    /// The same error met while answering a `tasks/*` request, which is not a
    /// tool call: a JSON-RPC error with the code as its `data`. Bad or unknown
    /// ids are the client's (invalid params); anything else is the server's.
    pub fn into_protocol(self) -> McpError {
        let code = self.code();
        let rpc = match code {
            ErrorCode::InvalidArgument
            | ErrorCode::UnknownTask
            | ErrorCode::UnknownRuntime
            | ErrorCode::TooLarge
            | ErrorCode::NotFinished
            | ErrorCode::UnknownWorkspace
            | ErrorCode::UnknownVersion
            | ErrorCode::UnknownTool => RpcCode::INVALID_PARAMS,
            ErrorCode::UnknownMethod => RpcCode::METHOD_NOT_FOUND,
            ErrorCode::MissingScope => RpcCode::INVALID_REQUEST,
            ErrorCode::QueueFull
            | ErrorCode::WorkspaceBusy
            | ErrorCode::FilesNotWritten
            | ErrorCode::QuotaExceeded
            | ErrorCode::Unavailable
            | ErrorCode::Internal => RpcCode::INTERNAL_ERROR,
        };
        McpError::new(rpc, self.to_string(), Some(code.data()))
    }
}

/// The `structuredContent` of a tool error.
#[derive(Debug, Serialize)]
struct ErrorBody<'a> {
    code: ErrorCode,
    message: &'a str,
}

/// A tool error result: the message as text, and code and message as
/// structured content. rmcp marks it `isError: true` (it is the `Err` of a
/// tool's `Result`).
pub fn error_result(code: ErrorCode, message: String) -> CallToolResult {
    let body = ErrorBody {
        code,
        message: &message,
    };
    // Two plain fields: serialising cannot fail, but a request path does not panic.
    let value = serde_json::to_value(&body).unwrap_or_else(|_| serde_json::json!({}));
    let mut result = CallToolResult::structured_error(value);
    result.content = vec![ContentBlock::text(message)];
    result
}

impl IntoCallToolResult for ToolError {
    fn into_call_tool_result(self) -> Result<CallToolResponse, McpError> {
        Ok(error_result(self.code(), self.to_string()).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_serialise_in_snake_case() {
        assert_eq!(
            serde_json::to_value(ErrorCode::InvalidArgument).ok(),
            Some(serde_json::json!("invalid_argument"))
        );
        assert_eq!(
            ErrorCode::QueueFull.data(),
            serde_json::json!({ "code": "queue_full" })
        );
    }

    #[test]
    fn an_error_result_has_the_message_as_text_and_both_as_structured_content() {
        let result = match ToolError::QueueFull(7).into_call_tool_result() {
            Ok(CallToolResponse::Complete(r)) => r,
            _ => panic!("a complete result"),
        };
        let text = result.content.first().and_then(|c| c.as_text());
        assert!(text.is_some_and(|t| t.text.starts_with("the service is at capacity (7")));
        let body = result.structured_content.unwrap_or_default();
        assert_eq!(body["code"], "queue_full");
        assert_eq!(
            body["message"].as_str().map(|m| m.contains("7 tasks")),
            Some(true)
        );
    }

    #[test]
    fn only_a_failing_store_says_try_again() {
        let corrupt = ToolError::Store(StoreError::Reply {
            script: "submit",
            reply: "??".into(),
        });
        assert_eq!(corrupt.code(), ErrorCode::Internal);
        assert!(!corrupt.to_string().contains("try again"));
        let protocol = ToolError::UnknownTask("t".into()).into_protocol();
        assert_eq!(protocol.code, RpcCode::INVALID_PARAMS);
        assert_eq!(
            protocol.data,
            Some(serde_json::json!({ "code": "unknown_task" }))
        );
    }
}
