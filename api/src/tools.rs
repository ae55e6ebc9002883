//! The MCP tools. Inputs are validated here, at the edge: a bad input becomes a
//! tool result with `isError: true` and a message that says what to fix, and no
//! task is created.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use base64::Engine as _;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::{DecodePaddingMode, general_purpose};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{
    CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock, CreateTaskResult,
    CustomRequest, CustomResult, DetailedTask, GetTaskParams, GetTaskResult, Implementation,
    IntoContents, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use shared::options::{CollectedFile, CollectedFiles, Network};
use shared::tail::{DEFAULT_TAIL_BYTES, TAIL_CAP, render_tail};
use shared::time::{rfc3339_ms, task_clock};
use shared::{Field, TaskState};

use crate::config::Config;
use crate::mcp_tasks;
use crate::store::{ListCursor, ListedTask, NewTask, Store, StoreError, Submitted, TaskRecord};

/// Standard alphabet; padding optional, since models often drop it.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// A tool call that ran but could not do what was asked. The message is shown to
/// the model as is, so it says what was wrong and what is allowed.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("unknown runtime {given:?}: use one of {allowed}")]
    UnknownRuntime { given: String, allowed: String },
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
    Env(#[from] shared::options::EnvError),
    #[error("{0}")]
    Collect(#[from] shared::options::CollectError),
    #[error(
        "task {0} is still {1}: its files are collected when it ends; poll get_task_status until the state is final"
    )]
    NotFinished(String, TaskState),
    #[error("{0}")]
    Zip(#[from] shared::zipcheck::ZipError),
    #[error("timeout_seconds must be at least 1 (got {0}); omit it for the default of {1} s")]
    TimeoutTooSmall(i64, u64),
    #[error("tail_bytes must be between 0 and {TAIL_CAP} (got {0})")]
    BadTailBytes(i64),
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
        "cursor {0:?} is not one list_tasks returned; pass next_cursor exactly as given, or omit it for the newest tasks"
    )]
    BadCursor(String),
    #[error("limit must be between 1 and {MAX_LIST_LIMIT} (got {0})")]
    BadLimit(i64),
    #[error("{0}; try again shortly")]
    Store(#[from] StoreError),
}

/// Tasks per `list_tasks` page by default, and at most.
const DEFAULT_LIST_LIMIT: usize = 20;
const MAX_LIST_LIMIT: usize = 100;
/// Index entries one `list_tasks` call examines at most (a rare state filter
/// returns a short page and a cursor rather than scanning everything).
const MAX_LIST_EXAMINED: usize = 1000;
/// The command's first line is shown up to this many characters.
const LIST_COMMAND_CHARS: usize = 200;

impl IntoContents for ToolError {
    fn into_contents(self) -> Vec<ContentBlock> {
        vec![ContentBlock::text(self.to_string())]
    }
}

/// Input of `run_script`. Unknown arguments are refused, naming the known ones,
/// so a model that guessed a name (`timeout`, `language`) learns the right one.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunScriptInput {
    /// The runtime (container image) to run in, e.g. "python3.13", "python3.8" or
    /// "node24". The server's instructions list the configured runtimes.
    pub runtime: String,
    /// The shell one-liner to run, base64-encoded (standard alphabet). It runs as
    /// `sh -c <command>` with /workspace as the working directory.
    pub command_base64: String,
    /// Optional source files: a zip archive, base64-encoded. It is extracted into
    /// /workspace (folders kept) before the command runs. No symlinks, absolute
    /// paths or "..".
    #[serde(default)]
    pub zip_base64: Option<String>,
    /// Optional wall-clock limit in seconds (default 300). Larger values are
    /// lowered to the server's cap; the effective value is returned.
    #[serde(default, deserialize_with = "timeout_seconds")]
    pub timeout_seconds: Option<i64>,
    /// Optional standard input for the script, base64-encoded (at most 1 MiB by
    /// default). It is delivered in full, then closed, so a script reading to the
    /// end sees EOF. Without it, stdin is empty.
    #[serde(default)]
    pub stdin_base64: Option<String>,
    /// Optional environment variables for the script, e.g. {"DEBUG": "1"}. Names
    /// are letters, digits and '_' (not starting with a digit); HOME, PATH, PWD
    /// and names starting with SR_ or SCRIPT_RUNNER_ are reserved. At most 64
    /// variables, 32 KiB in all.
    #[serde(default, deserialize_with = "env_map")]
    pub env: Option<BTreeMap<String, String>>,
    /// "internet" (the default: the internet is reachable, this service and
    /// private networks are not) or "none" (no network at all).
    #[serde(default)]
    pub network: Option<Network>,
    /// Optional files to keep after the run: paths or shell globs relative to
    /// /workspace (e.g. ["out/*.txt", "report.html"]; a directory is taken
    /// whole). Regular files only, no links followed, at most 1000 files and
    /// 16 MiB; fetch them with get_task_files once the task is final.
    #[serde(default)]
    pub collect: Option<Vec<String>>,
}

/// Output of `get_task_files`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct TaskFilesOutput {
    pub task_id: String,
    /// The task's state (final).
    pub state: TaskState,
    /// The files collected: path relative to /workspace and size in bytes.
    pub files: Vec<CollectedFile>,
    /// True when more matched than the caps allow (1000 files, 16 MiB): the
    /// listing and the zip hold what fitted.
    pub truncated: bool,
    /// The files as a zip archive, base64; null when nothing was collected.
    pub zip_base64: Option<String>,
}

/// Output of `run_script`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct RunScriptOutput {
    /// The id to pass to get_task_status and kill_task.
    pub task_id: String,
    /// Always "queued": the task waits for a free worker slot.
    pub state: TaskState,
    /// The effective timeout, after the server's cap.
    pub timeout_seconds: u64,
}

/// Input of `kill_task`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskIdInput {
    /// The task_id returned by run_script.
    pub task_id: String,
}

/// Input of `get_task_status`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StatusInput {
    /// The task_id returned by run_script.
    pub task_id: String,
    /// How many bytes of the end of stdout and of stderr to return (default 4096,
    /// capped at 65536). 0 returns no output, only the state.
    #[serde(default, deserialize_with = "tail_bytes")]
    pub tail_bytes: Option<i64>,
}

// Models often send numbers as strings ("300") or as 300.0. Accept those, and
// otherwise say which argument is wrong: serde's own message ("invalid type:
// string, expected i64") does not name it.
fn timeout_seconds<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    whole_number("timeout_seconds", d)
}

fn tail_bytes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    whole_number("tail_bytes", d)
}

fn limit<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    whole_number("limit", d)
}

/// serde's own message for a wrong type ("invalid type: integer `1`, expected a
/// string") names neither the argument nor the variable.
fn env_map<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    use serde_json::Value;
    let value = Option::<Value>::deserialize(d)?;
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let Value::Object(map) = value else {
        return Err(serde::de::Error::custom(format!(
            "env must be an object of names to string values, e.g. {{\"DEBUG\": \"1\"}}; got {value}"
        )));
    };
    map.into_iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k, s)),
            other => Err(serde::de::Error::custom(format!(
                "env value of {k} must be a string (got {other}); quote numbers, e.g. \"1\""
            ))),
        })
        .collect::<Result<_, _>>()
        .map(Some)
}

fn whole_number<'de, D: serde::Deserializer<'de>>(
    name: &str,
    d: D,
) -> Result<Option<i64>, D::Error> {
    use serde_json::Value;
    let value = Option::<Value>::deserialize(d)?;
    let parsed = match &value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n.as_i64().or_else(|| n.as_f64().and_then(integral)),
        Some(Value::String(s)) => s
            .trim()
            .parse()
            .ok()
            .or_else(|| s.trim().parse().ok().and_then(integral)),
        Some(_) => None,
    };
    parsed.map(Some).ok_or_else(|| {
        let shown = value.map(|v| v.to_string()).unwrap_or_default();
        serde::de::Error::custom(format!("{name} must be a whole number, got {shown}"))
    })
}

/// A float with no fractional part as an i64, saturating: a huge timeout is
/// then lowered to the cap like any other, rather than refused.
fn integral(f: f64) -> Option<i64> {
    (f.is_finite() && f.fract() == 0.0).then_some(f as i64)
}

/// A tool's arguments, whose errors name the argument at fault: serde's own
/// message ("invalid type: integer `5`, expected a string") names none, and a
/// model cannot tell which of seven arguments to fix. The schema is `T`'s.
#[derive(Debug)]
pub struct Named<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Named<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde_path_to_error::deserialize(d).map(Named).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let message = inner.to_string();
            // "." is the arguments object itself (an unknown or missing
            // argument, whose message names it); our own messages start with
            // the argument's name already.
            let first = path.split(['.', '[']).next().unwrap_or_default();
            let named = message.starts_with(first) || message.contains(&format!("`{first}`"));
            if path == "." || first.is_empty() || named {
                inner
            } else {
                serde::de::Error::custom(format!("{path}: {message}"))
            }
        })
    }
}

impl<T: JsonSchema> JsonSchema for Named<T> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        T::schema_name()
    }
    fn schema_id() -> std::borrow::Cow<'static, str> {
        T::schema_id()
    }
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        T::json_schema(generator)
    }
    fn inline_schema() -> bool {
        T::inline_schema()
    }
}

/// Output of `get_task_status`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct TaskStatus {
    pub task_id: String,
    /// queued | running | succeeded | failed | killed | timed-out. The last four are final.
    pub state: TaskState,
    /// The container's exit code once it exited, else null.
    pub exit_code: Option<i64>,
    /// A short sentence for every final state (e.g. "exited with code 3",
    /// "timed out after 300 s"); null while queued or running.
    pub reason: Option<String>,
    /// The runtime the task runs in.
    pub runtime: String,
    /// Wall time since the container started (so far, while running); null if it never started.
    pub runtime_seconds: Option<f64>,
    /// Seconds since the last byte on stdout or stderr (since start if none yet),
    /// up to the end for a finished task; null if it never started. Growing while
    /// running means the script may be stuck.
    pub seconds_since_last_output: Option<f64>,
    /// The last tail_bytes bytes of stdout, cut on a character boundary.
    pub stdout_tail: String,
    /// The last tail_bytes bytes of stderr, cut on a character boundary.
    pub stderr_tail: String,
    /// True when stdout holds more than stdout_tail shows.
    pub stdout_truncated: bool,
    /// True when stderr holds more than stderr_tail shows.
    pub stderr_truncated: bool,
    /// Total bytes the script wrote to stdout.
    pub stdout_bytes: u64,
    /// Total bytes the script wrote to stderr.
    pub stderr_bytes: u64,
    /// The effective timeout.
    pub timeout_seconds: u64,
    /// When run_script accepted it (RFC 3339, UTC).
    pub created_at: Option<String>,
    /// When its container started; null if it has not.
    pub started_at: Option<String>,
    /// When it reached its final state; null until then.
    pub finished_at: Option<String>,
}

/// Input of `list_tasks`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListTasksInput {
    /// Only tasks in this state (queued, running, succeeded, failed, killed,
    /// timed-out); all states if omitted.
    #[serde(default)]
    pub state: Option<TaskState>,
    /// The next_cursor of the previous page; omit for the newest tasks.
    #[serde(default)]
    pub cursor: Option<String>,
    /// Tasks per page, 1 to 100 (default 20).
    #[serde(default, deserialize_with = "limit")]
    pub limit: Option<i64>,
}

/// One task in `list_tasks`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct TaskSummary {
    pub task_id: String,
    pub state: TaskState,
    pub runtime: String,
    /// When run_script accepted it (RFC 3339, UTC).
    pub created_at: String,
    /// When it reached its final state; null until then.
    pub finished_at: Option<String>,
    /// The container's exit code once it exited, else null.
    pub exit_code: Option<i64>,
    /// The sentence for a final state; null while queued or running.
    pub reason: Option<String>,
    /// The first line of the command (at most 200 characters).
    pub command: String,
}

/// Output of `list_tasks`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ListTasksOutput {
    /// Newest first.
    pub tasks: Vec<TaskSummary>,
    /// Pass as cursor for the next page; null when there are no more tasks. A
    /// page may hold fewer than limit tasks (even none) when a state filter
    /// skipped many: keep going while next_cursor is not null.
    pub next_cursor: Option<String>,
}

/// Output of `kill_task`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct KillOutput {
    pub task_id: String,
    /// The task's state after the call: "killed", or the final state it already had.
    pub state: TaskState,
    /// True if this call stopped it; false if it had already finished.
    pub killed: bool,
}

/// One MCP server per request (the transport is stateless); cheap to build since
/// it only clones handles.
#[derive(Clone)]
pub struct ScriptRunner {
    store: Store,
    config: Arc<Config>,
}

#[tool_router]
impl ScriptRunner {
    pub fn new(store: Store, config: Arc<Config>) -> ScriptRunner {
        ScriptRunner { store, config }
    }

    #[tool(
        name = "run_script",
        description = "Start a shell one-liner in a fresh, isolated container and return its task_id at once \
(state \"queued\"); it never waits for the script. The command (base64) runs as `sh -c <command>` in /workspace, \
where the optional base64 zip of source files is extracted first. Then poll get_task_status with the task_id \
until the state is final (succeeded, failed, killed, timed-out); use kill_task to stop it, list_tasks to find \
recent tasks. Optional: stdin_base64 (input, then EOF), env (extra variables), network \"none\" (no network at \
all; the default reaches the internet but never this service), collect (files to fetch afterwards with \
get_task_files). The container has no access to this service, \
memory/CPU/process caps and a wall-clock timeout (default 300 s, capped by the server). A client that declares \
the MCP tasks extension gets a task to poll with tasks/get instead.",
        output_schema = rmcp::handler::server::common::schema_for_output::<RunScriptOutput>(),
        annotations(
            title = "Run a script",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn run_script(
        &self,
        Parameters(Named(input)): Parameters<Named<RunScriptInput>>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ToolError> {
        let cfg = &self.config;
        let image =
            cfg.runtimes
                .image(&input.runtime)
                .ok_or_else(|| ToolError::UnknownRuntime {
                    given: input.runtime.clone(),
                    allowed: cfg.runtimes.names_list(),
                })?;
        let command = decode_command(&input.command_base64, cfg.max_command_bytes)?;
        let timeout_seconds = match input.timeout_seconds {
            None => cfg.default_timeout_seconds,
            Some(t) if t < 1 => {
                return Err(ToolError::TimeoutTooSmall(t, cfg.default_timeout_seconds));
            }
            Some(t) => (t as u64).min(cfg.max_timeout_seconds),
        };
        let zip = match input.zip_base64.as_deref() {
            None => None,
            Some(b64) => {
                let bytes = decode_base64("zip_base64", b64)?;
                if bytes.len() > cfg.max_zip_bytes {
                    return Err(ToolError::ZipTooLarge {
                        size: bytes.len(),
                        max: cfg.max_zip_bytes,
                    });
                }
                shared::zipcheck::check_zip(&bytes, &cfg.zip_limits)?;
                Some(bytes)
            }
        };
        let stdin = match input.stdin_base64.as_deref() {
            None => None,
            Some(b64) => {
                let bytes = decode_base64("stdin_base64", b64)?;
                if bytes.len() > cfg.max_stdin_bytes {
                    return Err(ToolError::StdinTooLarge {
                        size: bytes.len(),
                        max: cfg.max_stdin_bytes,
                    });
                }
                Some(bytes)
            }
        };
        let env_json = match input.env.as_ref().filter(|e| !e.is_empty()) {
            None => None,
            Some(env) => {
                shared::options::check_env(env)?;
                Some(serde_json::to_string(env).map_err(|e| StoreError::Corrupt(e.to_string()))?)
            }
        };
        let collect_json = match input.collect.as_ref().filter(|c| !c.is_empty()) {
            None => None,
            Some(patterns) => {
                shared::options::check_collect(patterns)?;
                Some(
                    serde_json::to_string(patterns)
                        .map_err(|e| StoreError::Corrupt(e.to_string()))?,
                )
            }
        };
        let task_id = uuid::Uuid::new_v4().to_string();
        let submitted = self
            .store
            .submit(&NewTask {
                id: &task_id,
                runtime: &input.runtime,
                image,
                command: &command,
                timeout_seconds,
                zip: zip.as_deref(),
                stdin: stdin.as_deref(),
                env_json,
                network: input.network.unwrap_or_default(),
                collect_json,
                index_horizon_ms: (cfg.retention_seconds + cfg.max_timeout_seconds) * 1000,
                max_queued: cfg.max_queued_tasks,
            })
            .await?;
        if let Submitted::Full(backlog) = submitted {
            return Err(ToolError::QueueFull(backlog));
        }
        tracing::info!(%task_id, runtime = %input.runtime, timeout_seconds, "task queued");
        // A client that declared the tasks extension gets a task handle (only now
        // that the record exists, so tasks/get on any replica finds it).
        if ctx
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks())
        {
            return Ok(CallToolResponse::Task(CreateTaskResult::new(
                self.new_mcp_task(&task_id).await?,
            )));
        }
        let output = RunScriptOutput {
            task_id,
            state: TaskState::Queued,
            timeout_seconds,
        };
        let value = serde_json::to_value(output).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        Ok(CallToolResult::structured(value).into())
    }

    #[tool(
        name = "get_task_status",
        description = "Get a task's state, exit code, reason and the last bytes of its stdout and stderr \
(tail_bytes each, default 4096, at most 65536; *_truncated is true when there is more than the tail shows, \
*_bytes are the totals). States: queued, running, then one final state: succeeded, failed, killed or timed-out. \
While running, seconds_since_last_output tells a stuck script (growing) from a busy one (staying low). \
Poll every few seconds until the state is final.",
        annotations(
            title = "Get task status",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn get_task_status(
        &self,
        Parameters(Named(input)): Parameters<Named<StatusInput>>,
    ) -> Result<Json<TaskStatus>, ToolError> {
        let task_id = parse_task_id(&input.task_id)?;
        let tail_bytes = match input.tail_bytes {
            None => DEFAULT_TAIL_BYTES,
            Some(n) if n < 0 => return Err(ToolError::BadTailBytes(n)),
            Some(n) => (n as u64).min(TAIL_CAP as u64) as usize,
        };
        self.status(task_id, tail_bytes).await.map(Json)
    }

    #[tool(
        name = "kill_task",
        description = "Stop a task: a queued one never starts, a running one has its container killed. \
Its state becomes \"killed\" at once. Killing a task that already finished is not an error: killed is false \
and state is its final state.",
        annotations(
            title = "Kill a task",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn kill_task(
        &self,
        Parameters(Named(input)): Parameters<Named<TaskIdInput>>,
    ) -> Result<Json<KillOutput>, ToolError> {
        let task_id = parse_task_id(&input.task_id)?;
        let (state, killed) = self
            .store
            .kill(&task_id, self.config.retention_seconds)
            .await?
            .ok_or_else(|| ToolError::UnknownTask(task_id.clone()))?;
        if killed {
            tracing::info!(%task_id, "task killed by kill_task");
        }
        Ok(Json(KillOutput {
            task_id,
            state,
            killed,
        }))
    }

    #[tool(
        name = "get_task_files",
        description = "Get the files a finished task collected (run_script's collect argument): a listing \
(name, size) and the files as a base64 zip. Call it once get_task_status says the state is final. At most \
1000 files and 16 MiB are kept (truncated says when more matched); they expire with the task.",
        annotations(
            title = "Get a task's files",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn get_task_files(
        &self,
        Parameters(Named(input)): Parameters<Named<TaskIdInput>>,
    ) -> Result<Json<TaskFilesOutput>, ToolError> {
        let task_id = parse_task_id(&input.task_id)?;
        let (state, listing, zip) = self
            .store
            .files(&task_id)
            .await?
            .ok_or_else(|| ToolError::UnknownTask(task_id.clone()))?;
        if !state.is_terminal() {
            return Err(ToolError::NotFinished(task_id, state));
        }
        let listing: CollectedFiles = match listing {
            None => CollectedFiles::default(),
            Some(json) => serde_json::from_str(&json)
                .map_err(|e| StoreError::Corrupt(format!("task {task_id} files: {e}")))?,
        };
        Ok(Json(TaskFilesOutput {
            task_id,
            state,
            files: listing.files,
            truncated: listing.truncated,
            zip_base64: zip.map(|z| general_purpose::STANDARD.encode(z)),
        }))
    }

    #[tool(
        name = "list_tasks",
        description = "List recent tasks, newest first: task_id, state, runtime, created and finished times, \
exit code, reason and the first line of the command. Filter with state (e.g. \"running\" or \"failed\"); \
page with limit (1-100, default 20) and the returned next_cursor until it is null. Use get_task_status for \
a task's output. Tasks are kept for the server's retention period.",
        annotations(
            title = "List tasks",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_tasks(
        &self,
        Parameters(Named(input)): Parameters<Named<ListTasksInput>>,
    ) -> Result<Json<ListTasksOutput>, ToolError> {
        let limit = match input.limit {
            None => DEFAULT_LIST_LIMIT,
            Some(n) if n < 1 || n > MAX_LIST_LIMIT as i64 => return Err(ToolError::BadLimit(n)),
            Some(n) => n as usize,
        };
        let cursor = input.cursor.as_deref().map(parse_cursor).transpose()?;
        let wanted = input.state;
        let (tasks, next) = self
            .store
            .list(cursor.as_ref(), limit, MAX_LIST_EXAMINED, |t| {
                wanted.is_none_or(|w| t.state == w)
            })
            .await?;
        Ok(Json(ListTasksOutput {
            tasks: tasks.into_iter().map(summary).collect(),
            next_cursor: next.map(|c| format!("{}.{}", c.created_ms, c.task_id)),
        }))
    }
}

impl ScriptRunner {
    /// A task's status as `get_task_status` reports it.
    async fn status(&self, task_id: String, tail_bytes: usize) -> Result<TaskStatus, ToolError> {
        let record = self
            .store
            .get(&task_id)
            .await?
            .ok_or_else(|| ToolError::UnknownTask(task_id.clone()))?;
        status_from_record(task_id, &record, tail_bytes)
    }

    /// The MCP task for a task just submitted.
    async fn new_mcp_task(&self, task_id: &str) -> Result<rmcp::model::Task, ToolError> {
        let status = self.status(task_id.to_owned(), 0).await?;
        Ok(self.detailed_task(status)?.task)
    }

    fn detailed_task(&self, status: TaskStatus) -> Result<DetailedTask, ToolError> {
        let ttl_ms = self.config.retention_seconds * 1000;
        mcp_tasks::detailed_task(status, ttl_ms)
            .map_err(|e| ToolError::Store(StoreError::Corrupt(e.to_string())))
    }

    /// `tasks/get` and `tasks/cancel` name a task by id: a malformed or unknown
    /// one is the protocol's invalid-params error (these are not tool calls).
    fn task_param(raw: &str) -> Result<String, McpError> {
        parse_task_id(raw).map_err(|e| McpError::invalid_params(e.to_string(), None))
    }
}

/// A tool error met while answering a `tasks/*` request: unknown ids are invalid
/// params; anything else (Redis down) is an internal error.
fn protocol_error(e: ToolError) -> McpError {
    match e {
        ToolError::UnknownTask(_) | ToolError::MalformedTaskId(_) => {
            McpError::invalid_params(e.to_string(), None)
        }
        other => McpError::internal_error(other.to_string(), None),
    }
}

fn parse_cursor(raw: &str) -> Result<ListCursor, ToolError> {
    let bad = || ToolError::BadCursor(raw.chars().take(80).collect());
    let (ms, id) = raw.trim().split_once('.').ok_or_else(bad)?;
    Ok(ListCursor {
        created_ms: ms.parse().map_err(|_| bad())?,
        task_id: uuid::Uuid::parse_str(id).map_err(|_| bad())?.to_string(),
    })
}

fn summary(t: ListedTask) -> TaskSummary {
    let first_line = t.command.lines().next().unwrap_or_default();
    TaskSummary {
        reason: if t.state.is_terminal() {
            t.reason
        } else {
            None
        },
        task_id: t.task_id,
        state: t.state,
        runtime: t.runtime,
        created_at: rfc3339_ms(t.created_ms),
        finished_at: t.finished_ms.map(rfc3339_ms),
        exit_code: t.exit_code,
        command: first_line.chars().take(LIST_COMMAND_CHARS).collect(),
    }
}

/// The tools, built once. `tool_router()` (from `#[tool_router]`) builds every
/// tool's definition anew (JSON schemas generated, names checked), and the
/// stateless transport makes a `ScriptRunner` per request: building it per call
/// cost about a tenth of the api's CPU time under load (BENCHMARKS.md).
static TOOLS: LazyLock<ToolRouter<ScriptRunner>> = LazyLock::new(ScriptRunner::tool_router);

#[tool_handler(router = TOOLS)]
impl ServerHandler for ScriptRunner {
    /// rmcp parses every method it knows into its own type, and hands a request
    /// it cannot parse here as an unknown method. Under a known name that means
    /// params of the wrong shape: answer -32602 with what is wrong, as JSON-RPC
    /// asks, rather than "method not found".
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        use rmcp::model::{
            CallToolRequest, CancelTaskRequest, GetTaskRequest, InitializeRequest, ListToolsRequest,
        };
        let method = request.method;
        let value = serde_json::json!({ "method": method, "params": request.params });
        let why = match method.as_str() {
            "tools/call" => serde_json::from_value::<CallToolRequest>(value).err(),
            "tools/list" => serde_json::from_value::<ListToolsRequest>(value).err(),
            "initialize" => serde_json::from_value::<InitializeRequest>(value).err(),
            "tasks/get" => serde_json::from_value::<GetTaskRequest>(value).err(),
            "tasks/cancel" => serde_json::from_value::<CancelTaskRequest>(value).err(),
            _ => None,
        };
        Err(match why {
            Some(e) => McpError::invalid_params(format!("invalid params for {method}: {e}"), None),
            None => McpError::new(
                rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                format!("method not found: {method}"),
                None,
            ),
        })
    }

    /// `tasks/get`: the task's current state from its record, on any replica.
    async fn get_task(
        &self,
        request: GetTaskParams,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let task_id = Self::task_param(&request.task_id)?;
        let status = self
            .status(task_id, DEFAULT_TAIL_BYTES)
            .await
            .map_err(protocol_error)?;
        let task = self.detailed_task(status).map_err(protocol_error)?;
        Ok(GetTaskResult::new(task))
    }

    /// `tasks/cancel`: `kill_task`. A task already final is left as it is.
    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let task_id = Self::task_param(&request.task_id)?;
        let killed = self
            .store
            .kill(&task_id, self.config.retention_seconds)
            .await
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        match killed {
            None => Err(McpError::invalid_params(
                ToolError::UnknownTask(task_id).to_string(),
                None,
            )),
            Some((_, true)) => {
                tracing::info!(%task_id, "task killed by tasks/cancel");
                Ok(())
            }
            Some(_) => Ok(()),
        }
    }

    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tasks()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(
                Implementation::new("script-runner", env!("CARGO_PKG_VERSION"))
                    .with_title("script-runner: run scripts in disposable containers"),
            )
            .with_instructions(format!(
                "Runs shell one-liners in disposable, isolated containers. Call run_script (runtime, \
                 base64 command, optional base64 zip, stdin, env, network), then poll get_task_status until the \
                 state is final; get_task_files returns the files it collected; kill_task stops a task; \
                 list_tasks lists recent ones. Runtimes: {}. Default timeout {} s, at most {} s.",
                self.config.runtimes.names_list(),
                self.config.default_timeout_seconds,
                self.config.max_timeout_seconds
            ))
    }
}

fn decode_base64(field: &'static str, value: &str) -> Result<Vec<u8>, ToolError> {
    // Models wrap long base64 at 76 columns; whitespace is never data.
    let compact: String = value.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    BASE64
        .decode(compact.as_bytes())
        .or_else(|_| general_purpose::URL_SAFE_NO_PAD.decode(compact.trim_end_matches('=')))
        .map_err(|e| ToolError::BadBase64 {
            field,
            detail: e.to_string(),
        })
}

fn decode_command(b64: &str, max: usize) -> Result<String, ToolError> {
    let bytes = decode_base64("command_base64", b64)?;
    if bytes.len() > max {
        return Err(ToolError::CommandTooLong {
            size: bytes.len(),
            max,
        });
    }
    let command = String::from_utf8(bytes).map_err(|_| ToolError::CommandNotUtf8)?;
    if command.trim().is_empty() {
        return Err(ToolError::EmptyCommand);
    }
    if command.contains('\0') {
        return Err(ToolError::CommandHasNul);
    }
    Ok(command)
}

fn parse_task_id(raw: &str) -> Result<String, ToolError> {
    uuid::Uuid::parse_str(raw.trim())
        .map(|u| u.to_string())
        .map_err(|_| ToolError::MalformedTaskId(raw.chars().take(80).collect()))
}

fn status_from_record(
    task_id: String,
    r: &TaskRecord,
    tail_bytes: usize,
) -> Result<TaskStatus, ToolError> {
    let corrupt =
        |what: &str| ToolError::Store(StoreError::Corrupt(format!("task {task_id}: {what}")));
    let state: TaskState = r
        .text(Field::State)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| corrupt("missing or unknown state"))?;
    let started = r.int(Field::StartedAt);
    let finished = r.int(Field::FinishedAt);
    let (runtime_seconds, seconds_since_last_output) =
        task_clock(started, r.int(Field::LastOutputAt), finished, r.now_ms);
    let stdout_bytes = r.int(Field::StdoutBytes).unwrap_or(0).max(0) as u64;
    let stderr_bytes = r.int(Field::StderrBytes).unwrap_or(0).max(0) as u64;
    let stdout = render_tail(
        r.bytes(Field::StdoutTail).unwrap_or_default(),
        tail_bytes,
        stdout_bytes,
    );
    let stderr = render_tail(
        r.bytes(Field::StderrTail).unwrap_or_default(),
        tail_bytes,
        stderr_bytes,
    );
    Ok(TaskStatus {
        task_id,
        state,
        exit_code: r.int(Field::ExitCode),
        reason: if state.is_terminal() {
            r.text(Field::Reason)
        } else {
            None
        },
        runtime: r.text(Field::Runtime).unwrap_or_default(),
        runtime_seconds,
        seconds_since_last_output,
        stdout_tail: stdout.text,
        stderr_tail: stderr.text,
        stdout_truncated: stdout.truncated,
        stderr_truncated: stderr.truncated,
        stdout_bytes,
        stderr_bytes,
        timeout_seconds: r.int(Field::TimeoutSeconds).unwrap_or(0).max(0) as u64,
        created_at: r.int(Field::CreatedAt).map(rfc3339_ms),
        started_at: started.map(rfc3339_ms),
        finished_at: finished.map(rfc3339_ms),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_decode_with_or_without_padding_and_wrapping() {
        assert_eq!(
            decode_command("ZWNobyBoaQ==", 100).ok().as_deref(),
            Some("echo hi")
        );
        assert_eq!(
            decode_command("ZWNobyBoaQ", 100).ok().as_deref(),
            Some("echo hi")
        );
        assert_eq!(
            decode_command("ZWNo\nbyBoaQ==", 100).ok().as_deref(),
            Some("echo hi")
        );
    }

    #[test]
    fn bad_commands_say_what_is_wrong() {
        let msg = |r: Result<String, ToolError>| r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg(decode_command("!!!", 100)).contains("command_base64 is not valid base64"));
        assert!(msg(decode_command("ICAg", 100)).contains("empty command"));
        assert!(msg(decode_command("ZWNobyBoaQ==", 3)).contains("at most 3"));
        assert!(msg(decode_command("/w==", 100)).contains("not UTF-8"));
    }

    #[test]
    fn task_ids_must_be_uuids() {
        assert!(parse_task_id("nope").is_err());
        let id = uuid::Uuid::new_v4().to_string();
        assert_eq!(parse_task_id(&format!(" {id} ")).ok(), Some(id));
    }
}

/// Property tests of the argument parsers: arbitrary input never panics and is
/// either accepted or refused with a message naming the argument; valid input
/// comes back as it was sent.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    /// Any JSON value, nested a little.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
            ".{0,12}".prop_map(Value::from),
            "[0-9 .e+-]{0,8}".prop_map(Value::from),
            Just(json!("internet")),
            Just(json!("none")),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map("[A-Za-z_]{1,6}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn parse<T: for<'de> Deserialize<'de>>(args: Value) -> Result<T, String> {
        serde_json::from_value::<Named<T>>(args)
            .map(|Named(t)| t)
            .map_err(|e| e.to_string())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn run_script_arguments_parse_or_name_the_argument(
            field in prop::sample::select(vec![
                "runtime", "command_base64", "zip_base64", "timeout_seconds",
                "stdin_base64", "env", "network", "collect",
            ]),
            value in json_value(),
        ) {
            let mut args = json!({ "runtime": "python3.13", "command_base64": "dHJ1ZQ==" });
            args[field] = value.clone();
            if let Err(message) = parse::<RunScriptInput>(args) {
                prop_assert!(message.contains(field), "{field}={value}: {message}");
            }
        }

        #[test]
        fn status_and_list_arguments_parse_or_name_the_argument(
            field in prop::sample::select(vec!["task_id", "tail_bytes", "state", "cursor", "limit"]),
            value in json_value(),
        ) {
            let (mut args, listing) = match field {
                "task_id" | "tail_bytes" => (json!({ "task_id": "x" }), false),
                _ => (json!({}), true),
            };
            args[field] = value.clone();
            let result = if listing {
                parse::<ListTasksInput>(args).map(|_| ())
            } else {
                parse::<StatusInput>(args).map(|_| ())
            };
            if let Err(message) = result {
                prop_assert!(message.contains(field), "{field}={value}: {message}");
            }
        }

        #[test]
        fn whole_numbers_come_back_as_sent(n in any::<i64>(), pad in "[ \t]{0,2}") {
            for sent in [json!(n), json!(format!("{pad}{n}{pad}"))] {
                let args = json!({ "runtime": "r", "command_base64": "x", "timeout_seconds": sent });
                let parsed = parse::<RunScriptInput>(args).map(|i| i.timeout_seconds);
                prop_assert_eq!(parsed, Ok(Some(n)));
            }
            // As a float too, where a float holds it exactly.
            if n.unsigned_abs() < 1 << 53 {
                let args = json!({ "runtime": "r", "command_base64": "x", "timeout_seconds": n as f64 });
                let parsed = parse::<RunScriptInput>(args).map(|i| i.timeout_seconds);
                prop_assert_eq!(parsed, Ok(Some(n)));
            }
        }

        #[test]
        fn env_values_come_back_as_sent(env in prop::collection::btree_map("[A-Z_]{1,6}", ".{0,10}", 0..5)) {
            let args = json!({ "runtime": "r", "command_base64": "x", "env": env });
            let parsed = parse::<RunScriptInput>(args).map(|i| i.env);
            prop_assert_eq!(parsed, Ok(Some(env)));
        }

        #[test]
        fn base64_comes_back_as_sent_however_it_is_written(
            bytes in prop::collection::vec(any::<u8>(), 0..300),
            width in 4usize..100,
            crlf in any::<bool>(),
            padded in any::<bool>(),
            url_safe in any::<bool>(),
        ) {
            let text = match (url_safe, padded) {
                (false, true) => general_purpose::STANDARD.encode(&bytes),
                (false, false) => general_purpose::STANDARD_NO_PAD.encode(&bytes),
                (true, _) => general_purpose::URL_SAFE_NO_PAD.encode(&bytes),
            };
            let sep = if crlf { "\r\n" } else { "\n" };
            let wrapped = text
                .as_bytes()
                .chunks(width)
                .map(|c| String::from_utf8_lossy(c).into_owned())
                .collect::<Vec<_>>()
                .join(sep);
            prop_assert_eq!(decode_base64("zip_base64", &wrapped).ok(), Some(bytes));
        }

        #[test]
        fn any_text_as_base64_decodes_or_names_the_argument(text in ".{0,40}") {
            if let Err(e) = decode_base64("stdin_base64", &text) {
                prop_assert!(e.to_string().starts_with("stdin_base64 "), "{e}");
            }
        }

        #[test]
        fn commands_come_back_as_sent_or_say_what_is_wrong(command in "(.|\n){0,60}") {
            let max = 40;
            let result = decode_command(&general_purpose::STANDARD.encode(&command), max);
            let expected_ok = command.len() <= max && !command.trim().is_empty() && !command.contains('\0');
            match result {
                Ok(c) => prop_assert!(expected_ok && c == command),
                Err(e) => {
                    prop_assert!(!expected_ok);
                    let m = e.to_string();
                    prop_assert!(m.contains("command"), "{m}");
                }
            }
        }

        #[test]
        fn task_ids_are_uuids_in_any_usual_form(id in any::<u128>(), form in 0..4u8, pad in "[ \t\n]{0,2}") {
            let uuid = uuid::Uuid::from_u128(id);
            let written = match form {
                0 => uuid.hyphenated().to_string(),
                1 => uuid.simple().to_string().to_uppercase(),
                2 => uuid.braced().to_string(),
                _ => uuid.urn().to_string(),
            };
            let parsed = parse_task_id(&format!("{pad}{written}{pad}")).ok();
            prop_assert_eq!(parsed, Some(uuid.hyphenated().to_string()));
        }

        #[test]
        fn other_text_is_not_a_task_id_and_the_refusal_says_so(text in ".{0,50}") {
            match parse_task_id(&text) {
                Ok(id) => prop_assert!(uuid::Uuid::parse_str(text.trim()).is_ok() && id.len() == 36),
                Err(e) => prop_assert!(e.to_string().starts_with("task_id "), "{e}"),
            }
        }
    }
}
