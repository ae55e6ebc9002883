//! The MCP tools and the tasks extension. Inputs are validated here, at the
//! edge: a bad input becomes a tool result with `isError: true`, a message that
//! says what to fix and a stable code, and no task is created.
//!
//! One job per module; each imports only those above it in this list:
//! - `error`: `ToolError`, its `ErrorCode`s, and how both reach a client;
//! - `args`: the tools' arguments, their lenient deserializers and decoders
//!   (add a tool argument here, then use it in `calls`);
//! - `output`: what the tools answer;
//! - `describe`: fills the limits into the descriptions and schemas from the config,
//!   and links the task console (an MCP App) from the tools it shows;
//! - `runner`: `ScriptRunner`, the state every handler works with;
//! - `progress`: `notifications/progress` for a waiting call that asked for them;
//! - `resources`: results as MCP resources (links, `resources/read`, the lists);
//! - `status`: a task record as `get_task_status` shows it, and the waits;
//! - `tasks`: `tasks/get` and `tasks/cancel` (the MCP tasks extension);
//! - `calls`: the five task tools, and the SUBMIT loop `write_files` shares;
//! - `workspaces`: the four workspace tools (a router of their own);
//! - `files`: `read_files`, with its own arguments and answer (a router of its
//!   own, which `runner` adds to `calls`'s);
//! - `edits`: `write_files`, likewise (it submits through `calls`' SUBMIT
//!   loop, and checks its edit with `files`' manifest reads);
//! - `fallback`: the answer to a request rmcp could not parse;
//! - `server_info`: who we are, stamped in every result's `_meta`;
//! - `server`: rmcp's `ServerHandler`, dispatching to the above.

mod args;
mod calls;
mod describe;
mod edits;
mod error;
mod fallback;
mod files;
mod output;
mod progress;
mod resources;
mod runner;
mod server;
mod server_info;
mod status;
mod tasks;
mod workspaces;

pub use edits::WriteFilesOutput;
pub use error::{ErrorCode, ToolError};
pub use files::{FileContent, FileKind, ReadFilesOutput};
pub use output::{
    DeleteWorkspaceOutput, ForkWorkspaceOutput, ForkedFrom, GetWorkspaceOutput, KillOutput,
    ListTasksOutput, ListWorkspacesOutput, RunScriptOutput, TaskFilesOutput, TaskStatus,
    TaskSummary, VersionSummary, WorkspaceSummary,
};
pub use runner::ScriptRunner;
pub use server::TOOL_LIST_TTL_MS;
pub use server_info::SERVER_INFO_META_KEY;
pub use tasks::{REASON_KIND_META_KEY, STATE_META_KEY, WORKSPACE_META_KEY};
