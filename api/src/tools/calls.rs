//! The five task tools (`workspaces` has the four workspace tools, `files`
//! `read_files`, `edits` `write_files`): `run_script`, `get_task_status`,
//! `kill_task`, `get_task_files` and `list_tasks`, and the SUBMIT loop
//! `write_files` shares (`submit_task`). Their arguments are in `args`, their
//! answers in `output`, their errors in `error`; the descriptions here hold
//! `{placeholders}` that `describe` fills in from the config.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{CallToolResponse, CallToolResult, CreateTaskResult, MetaObject};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, tool, tool_router};
use shared::options::{CollectedFiles, Networks};
use shared::tail::{DEFAULT_TAIL_BYTES, TAIL_CAP};
use shared::{TaskRecord, TaskState};

use super::args::{
    DEFAULT_LIST_LIMIT, ListTasksInput, MAX_LIST_LIMIT, Named, RunScriptInput, StatusInput,
    TaskFilesInput, TaskIdInput, decode_base64, decode_command, parse_cursor, parse_task_id,
    wait_duration,
};
use super::edits::EditCheck;
use super::error::{MOVED_ATTEMPTS, ToolError};
use super::output::{
    KillOutput, ListTasksOutput, RunScriptOutput, TaskFile, TaskFilesOutput, TaskStatus,
};
use super::progress::Progress;
use super::resources::ResourceUri;
use super::runner::{ScriptRunner, allowed};
use super::status::{Until, Wait};
use super::tasks::WORKSPACE_META_KEY;
use crate::auth::{Grant, Principal, Scope};
use crate::config::{Config, OPERATOR_CEILING};
use crate::db::StoreError;
use shared::apikey::Limits;
use shared::scripts::{Quota, Submit, SubmitReply, SubmitWorkspace, WsRefusal};
use shared::spec;
use shared::workspace::{SAVE_GRACE_MS, WorkspaceId, WorkspaceUse};

/// Index entries one `list_tasks` call examines at most (a rare state filter
/// returns a short page and a cursor rather than scanning everything).
const MAX_LIST_EXAMINED: usize = 1000;

#[tool_router(vis = "pub(super)")]
impl ScriptRunner {
    #[tool(
        name = "run_script",
        description = "Start a shell one-liner in a fresh, isolated container and return its task_id at once \
(state \"queued\"). With wait_seconds (at most {max_wait_seconds}) it waits that long for the script: if it \
ends in time, the answer is what get_task_status returns (final state, exit_code, output), so a short script \
costs one call. The command (base64) runs as `sh -c <command>` in /workspace, \
where the optional base64 zip of source files is extracted first. Otherwise call get_task_status with the task_id \
(with wait_seconds, it answers as soon as something changes) until the state is final (succeeded, failed, killed, timed-out); use kill_task to stop it, list_tasks to find \
recent tasks. Optional: stdin_base64 (input, then EOF), env (extra variables), network \"none\" (no network at \
all), \"internet\" (the internet but never this service) or {\"allow\": [\"pypi.org\"]} (only those hosts, through \
a proxy set in HTTP_PROXY/HTTPS_PROXY; no DNS), collect (files to fetch afterwards with \
get_task_files), cache \"none\" (empty pip/npm caches; by default they persist between your tasks), workspace \"new\" or \
{\"id\": \"<workspace_id>\"} (files that carry over: the task starts from the workspace's newest version and its /workspace \
becomes the next one when it ends; see list_workspaces, get_workspace, fork_workspace). The container has no access to this service, \
memory/CPU/process caps and a wall-clock timeout (default {default_timeout_seconds} s, at most \
{max_timeout_seconds} s). A client that declares \
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
        Parameters(Named(mut input)): Parameters<Named<RunScriptInput>>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ToolError> {
        let who = allowed(&ctx, Scope::Run, "run_script")?;
        let cfg = &self.config;
        let asked = input.runtime_asked(|| cfg.runtimes.names_list())?;
        let (runtime, image) =
            cfg.runtimes
                .lookup(asked)
                .ok_or_else(|| ToolError::UnknownRuntime {
                    given: asked.to_owned(),
                    allowed: cfg.runtimes.names_list(),
                })?;
        let command = decode_command(&input.command_base64, cfg.max_command_bytes)?;
        let wait = wait_duration(input.wait_seconds)?;
        let timeout_seconds = match input.timeout_seconds {
            None => cfg.default_timeout_seconds,
            Some(t) if t < 1 => {
                return Err(ToolError::TimeoutTooSmall(t, cfg.default_timeout_seconds));
            }
            Some(t) => (t as u64).min(cfg.max_timeout_seconds),
        };
        let inputs = decode_inputs(
            input.zip_base64.take(),
            input.stdin_base64.take(),
            cfg.clone(),
        )
        .await?;
        // Checked here and stored typed: the record's env and collect are the
        // client's own values (an empty one stores nothing).
        let env = input.env.filter(|e| !e.is_empty());
        if let Some(env) = &env {
            shared::options::check_env(env)?;
        }
        let collect = input.collect.filter(|c| !c.is_empty());
        if let Some(patterns) = &collect {
            shared::options::check_collect(patterns)?;
        }
        let egress = match &input.network {
            None => cfg.egress_default.clone(),
            Some(v) => shared::egress::Egress::from_json(v)?,
        };
        if let Principal::Owner(g) = &who
            && !g.limits.allows_network(egress.network())
        {
            return Err(ToolError::NetworkNotAllowed {
                asked: egress.network(),
                allowed: g.limits.networks.unwrap_or(Networks::ALL),
            });
        }
        // An allow-list names only hosts the operator, and the key, allow.
        if let Some(list) = egress.allow_list() {
            if let Some(ceiling) = &cfg.egress_ceiling {
                list.check_within(ceiling, OPERATOR_CEILING)?;
            }
            if let Principal::Owner(Grant {
                allow_hosts: Some(ceiling),
                ..
            }) = &who
            {
                list.check_within(ceiling, "the hosts this API key allows (its --allow-hosts)")?;
            }
        }
        // A new workspace's id is made here. An existing one's base version is
        // a signed field of the record: the head is read before the submit, and
        // SUBMIT checks it is still the head (`must_be_head`).
        let (workspace_id, workspace_base, submit_workspace) = match input.workspace {
            None => (None, None, None),
            Some(WorkspaceUse::New) => (
                Some(WorkspaceId::from_bytes(*uuid::Uuid::new_v4().as_bytes())),
                Some(0),
                Some(SubmitWorkspace {
                    new: true,
                    must_be_head: false,
                    save_grace_ms: SAVE_GRACE_MS,
                }),
            ),
            // Without a version the base is the head, read below.
            Some(WorkspaceUse::Existing { id, version }) => (
                Some(id),
                version,
                Some(SubmitWorkspace {
                    new: false,
                    must_be_head: version.is_none(),
                    save_grace_ms: SAVE_GRACE_MS,
                }),
            ),
        };
        let task_id = uuid::Uuid::new_v4().to_string();
        let mut record = TaskRecord {
            runtime: Some(runtime.clone()),
            image: Some(image.to_owned()),
            command: Some(command),
            timeout_seconds: Some(timeout_seconds),
            has_zip: Some(inputs.zip().is_some()),
            has_stdin: Some(inputs.stdin().is_some()),
            env,
            network: Some(egress.network()),
            egress_allow: egress.allow_list().cloned(),
            cache: Some(input.cache.unwrap_or_default()),
            collect,
            stdout_bytes: Some(0),
            stderr_bytes: Some(0),
            owner: Some(who.owner().clone()).filter(|o| !o.is_admin()),
            workspace_id,
            workspace_base,
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
            workspace: submit_workspace,
        };
        self.submit_task(&who, &submit, &mut record, None).await?;
        let owner = who.owner();
        match workspace_id {
            Some(id) => tracing::info!(
                %task_id, %owner, %runtime, timeout_seconds, workspace_id = %id,
                workspace_base = record.workspace_base.unwrap_or(0), "task queued"
            ),
            None => tracing::info!(%task_id, %owner, %runtime, timeout_seconds, "task queued"),
        }
        // A client that declared the tasks extension gets a task handle (only now
        // that the record exists, so tasks/get on any replica finds it).
        if ctx
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks())
        {
            let mut created = CreateTaskResult::new(self.new_mcp_task(&who, &task_id).await?);
            // A "new" caller learns its workspace at once here too.
            if let Some(id) = workspace_id {
                let mut meta = MetaObject::new();
                meta.insert(WORKSPACE_META_KEY.into(), serde_json::json!(id));
                created.meta = Some(meta);
            }
            return Ok(CallToolResponse::Task(created));
        }
        let mut state = TaskState::Queued;
        if !wait.is_zero() {
            match self
                .status_waiting(
                    &who,
                    task_id.clone(),
                    DEFAULT_TAIL_BYTES,
                    Wait {
                        wait,
                        until: Until::Final,
                        progress: Progress::of(&ctx),
                        seen: None,
                    },
                )
                .await
            {
                // Ended in time: the call answers what get_task_status would.
                Ok(status) if status.view.state.is_terminal() => {
                    let value = serde_json::to_value(status).map_err(ToolError::Encode)?;
                    return Ok(CallToolResult::structured(value).into());
                }
                Ok(status) => state = status.view.state,
                // The task exists: an error now must not read as "not
                // created" (a client would submit it again).
                Err(e) => tracing::warn!(%task_id, error = %e, "waiting for a new task failed"),
            }
        }
        let output = RunScriptOutput {
            task_id,
            state,
            timeout_seconds,
            workspace_id,
        };
        let value = serde_json::to_value(output).map_err(ToolError::Encode)?;
        Ok(CallToolResult::structured(value).into())
    }

    #[tool(
        name = "get_task_status",
        description = "Get a task's state, exit code, reason and the last bytes of its stdout and stderr \
(tail_bytes each, default {default_tail_bytes}, at most {tail_cap}; *_truncated is true when there is more than the tail shows, \
*_bytes are the totals). States: queued, running, then one final state: succeeded, failed, killed or timed-out. \
While running, seconds_since_last_output tells a stuck script (growing) from a busy one (staying low). \
Call again until the state is final; with wait_seconds (at most {max_wait_seconds}) the call waits for \
the next change of state or new output, instead of polling.",
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
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<TaskStatus>, ToolError> {
        let who = allowed(&ctx, Scope::Read, "get_task_status")?;
        let task_id = parse_task_id(&input.task_id)?;
        let tail_bytes = match input.tail_bytes {
            None => DEFAULT_TAIL_BYTES,
            Some(n) if n < 0 => return Err(ToolError::BadTailBytes(n)),
            Some(n) => (n as u64).min(TAIL_CAP as u64) as usize,
        };
        let wait = wait_duration(input.wait_seconds)?;
        let wait = Wait {
            wait,
            until: Until::Change,
            progress: Progress::of(&ctx),
            seen: input.seen,
        };
        self.status_waiting(&who, task_id, tail_bytes, wait)
            .await
            .map(Json)
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
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<KillOutput>, ToolError> {
        let who = allowed(&ctx, Scope::Kill, "kill_task")?;
        let task_id = parse_task_id(&input.task_id)?;
        let (state, killed) = self
            .store
            .kill(&task_id, self.config.retention_seconds, who.owner())
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
{max_collect_files} files and {max_collect_size} are kept (truncated says when more matched); they expire with the task. \
Each file's uri (task://<task_id>/files/<path>) is what resources/read returns it at; with resource_links, \
each also comes as a resource_link content item.",
        output_schema = rmcp::handler::server::common::schema_for_output::<TaskFilesOutput>(),
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
        Parameters(Named(input)): Parameters<Named<TaskFilesInput>>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        let who = allowed(&ctx, Scope::Read, "get_task_files")?;
        let task_id = parse_task_id(&input.task_id)?;
        let (state, listing, zip) = self
            .store
            .files(&task_id, |owner| who.sees(owner))
            .await?
            .ok_or_else(|| ToolError::UnknownTask(task_id.clone()))?;
        if !state.is_terminal() {
            return Err(ToolError::NotFinished(task_id, state));
        }
        let listing: CollectedFiles = match listing {
            None => CollectedFiles::default(),
            Some(json) => serde_json::from_str(&json).map_err(|e| ToolError::CorruptRecord {
                task_id: task_id.clone(),
                what: format!("its files listing: {e}"),
            })?,
        };
        let mut links = Vec::new();
        let files = listing
            .files
            .into_iter()
            .map(|f| {
                let uri = ResourceUri::TaskFile {
                    task_id: task_id.clone(),
                    path: f.name.clone(),
                };
                if input.resource_links == Some(true) {
                    links.push(uri.link(f.size));
                }
                TaskFile {
                    uri: uri.to_string(),
                    name: f.name,
                    size: f.size,
                }
            })
            .collect();
        let output = TaskFilesOutput {
            task_id,
            state,
            files,
            truncated: listing.truncated,
            zip_base64: zip.map(|z| general_purpose::STANDARD.encode(z)),
        };
        let value = serde_json::to_value(output).map_err(ToolError::Encode)?;
        let mut result = CallToolResult::structured(value);
        result.content.extend(links);
        Ok(result)
    }

    #[tool(
        name = "list_tasks",
        description = "List recent tasks, newest first: task_id, state, runtime, created and finished times, \
exit code, reason and the first line of the command. Filter with state (e.g. \"running\" or \"failed\"); \
page with limit (1-{max_list_limit}, default {default_list_limit}) and the returned next_cursor until it is null. Use get_task_status for \
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
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ListTasksOutput>, ToolError> {
        let who = allowed(&ctx, Scope::Read, "list_tasks")?;
        let limit = match input.limit {
            None => DEFAULT_LIST_LIMIT,
            Some(n) if n < 1 || n > MAX_LIST_LIMIT as i64 => {
                return Err(ToolError::BadLimit {
                    got: n,
                    max: MAX_LIST_LIMIT,
                });
            }
            Some(n) => n as usize,
        };
        let cursor = input.cursor.as_deref().map(parse_cursor).transpose()?;
        let wanted = input.state;
        let (tasks, next) = self
            .store
            .list(
                who.owner(),
                cursor.as_ref(),
                limit,
                MAX_LIST_EXAMINED,
                |t| wanted.is_none_or(|w| t.state == w),
            )
            .await?;
        Ok(Json(ListTasksOutput {
            tasks: tasks.into_iter().map(Into::into).collect(),
            next_cursor: next.map(|c| format!("{}.{}", c.created_ms, c.task_id)),
        }))
    }
}

impl ScriptRunner {
    /// SUBMITs `record`, each refusal as the tool error that says it. On a
    /// workspace's head the head is read first, for the record to be signed
    /// with, and read again if it moved before the submit. A `write_files`
    /// edit is checked against each base before it is submitted on it.
    pub(super) async fn submit_task(
        &self,
        who: &Principal,
        submit: &Submit<'_>,
        record: &mut TaskRecord,
        edit: Option<EditCheck<'_>>,
    ) -> Result<(), ToolError> {
        let workspace_id = record.workspace_id;
        let mut attempt = 1;
        let submitted = loop {
            if let (
                Some(id),
                Some(SubmitWorkspace {
                    must_be_head: true, ..
                }),
            ) = (workspace_id, submit.workspace)
            {
                let ws = self
                    .store
                    .workspace(&id, who.owner())
                    .await?
                    .ok_or(ToolError::UnknownWorkspace(id))?;
                record.workspace_base = Some(ws.head);
            }
            if let (Some(edit), Some(id), Some(base)) = (&edit, workspace_id, record.workspace_base)
            {
                self.check_edit(who, id, base, edit).await?;
            }
            let reply = self.store.submit(submit, record).await?;
            // The head moved since the read (a task on it was just saved):
            // again, from the new head.
            if let SubmitReply::Workspace {
                why: WsRefusal::Moved,
                ..
            } = reply
                && attempt < MOVED_ATTEMPTS
            {
                attempt += 1;
                continue;
            }
            break reply;
        };
        match submitted {
            SubmitReply::Queued => Ok(()),
            SubmitReply::Full(backlog) => Err(ToolError::QueueFull(backlog)),
            SubmitReply::Tasks {
                quota: Quota::MaxQueued,
                limit,
                count,
            } => Err(ToolError::QuotaQueued { limit, count }),
            SubmitReply::Tasks { limit, count, .. } => {
                Err(ToolError::QuotaRunning { limit, count })
            }
            SubmitReply::Cpu {
                limit_ms,
                used_ms,
                frees_at_ms,
            } => Err(ToolError::QuotaCpu {
                limit_seconds: limit_ms / 1000,
                used_seconds: used_ms / 1000,
                frees_at: shared::time::rfc3339_ms(frees_at_ms),
            }),
            SubmitReply::Workspace { why, detail } => {
                Err(self.workspace_refusal(workspace_id, record.workspace_base, why, detail))
            }
        }
    }
}

impl ScriptRunner {
    /// A workspace script's (or SUBMIT's) refusal as the tool error a client reads.
    /// `asked` is the version the call named or read (for a `no_version` whose
    /// detail does not read).
    pub(super) fn workspace_refusal(
        &self,
        workspace: Option<WorkspaceId>,
        asked: Option<u64>,
        why: WsRefusal,
        detail: String,
    ) -> ToolError {
        let Some(workspace) = workspace else {
            return unexpected(why, detail);
        };
        match why {
            WsRefusal::Missing => ToolError::UnknownWorkspace(workspace),
            WsRefusal::Busy => ToolError::WorkspaceBusy {
                workspace,
                task: detail,
            },
            WsRefusal::NoVersion => ToolError::UnknownVersion {
                workspace,
                version: detail.parse().ok().or(asked).unwrap_or_default(),
            },
            WsRefusal::Moved => ToolError::WorkspaceMoving(workspace),
            WsRefusal::OverCap => ToolError::WorkspaceQuota {
                would_hold: detail.parse().unwrap_or_default(),
                cap: self.config.workspace_owner_max_bytes,
            },
            WsRefusal::NotYours
            | WsRefusal::NotBusy
            | WsRefusal::SweepMoved
            | WsRefusal::Sweeping
            | WsRefusal::SweepHeld
            | WsRefusal::Swept
            | WsRefusal::SweepLost => unexpected(why, detail),
        }
    }
}

/// A refusal no call of the api's can get (a worker's, from WS_COMMIT or
/// WS_SWEEP).
fn unexpected(why: WsRefusal, detail: String) -> ToolError {
    ToolError::Store(StoreError::Reply {
        script: "workspace",
        reply: format!("{} {detail}", why.as_str()),
    })
}
/// Decodes and checks `run_script`'s zip and stdin, and hashes them for the
/// spec. Base64, the zip's directory check and SHA-256 of up to
/// `MAX_ZIP_BYTES` are tens of milliseconds of CPU: past
/// `Inputs::HASH_INLINE_MAX` they run on a blocking thread, not the runtime.
async fn decode_inputs(
    zip: Option<String>,
    stdin: Option<String>,
    cfg: Arc<Config>,
) -> Result<spec::Inputs, ToolError> {
    let size = base64_len(&zip) + base64_len(&stdin);
    let decode = move || {
        let zip = match zip.as_deref() {
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
        let stdin = match stdin.as_deref() {
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
        Ok(spec::Inputs::hash(zip, stdin))
    };
    if size <= spec::Inputs::HASH_INLINE_MAX {
        return decode();
    }
    tokio::task::spawn_blocking(decode)
        .await
        .map_err(|e| ToolError::InputsLost(e.to_string()))?
}

fn base64_len(b64: &Option<String>) -> usize {
    b64.as_ref().map_or(0, String::len)
}
