//! The workspace tools: `list_workspaces`, `get_workspace`, `fork_workspace`
//! and `delete_workspace` (a router of their own, which `runner` adds to
//! `calls`'s). Their arguments are in `args`, their answers in `output`; a
//! refusal of WS_FORK's reads through `calls`' `workspace_refusal`.

use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, tool, tool_router};
use shared::scripts::WsReply;
use shared::workspace::WorkspaceId;

use super::args::{
    DEFAULT_LIST_LIMIT, ForkWorkspaceInput, ListWorkspacesInput, MAX_LIST_LIMIT, Named,
    WorkspaceIdInput, parse_version, parse_workspace_cursor, parse_workspace_id, workspace_cursor,
};
use super::error::ToolError;
use super::output::{
    DeleteWorkspaceOutput, ForkWorkspaceOutput, ForkedFrom, GetWorkspaceOutput,
    ListWorkspacesOutput,
};
use super::runner::{ScriptRunner, allowed};
use crate::auth::Scope;

#[tool_router(router = workspaces_router, vis = "pub(super)")]
impl ScriptRunner {
    #[tool(
        name = "list_workspaces",
        description = "List your persistent workspaces, newest first: workspace_id, head (the newest version, \
which a task starts from by default), busy_task (the task using it, if one is), created_at, last_used_at and \
forked_from. Page with limit (1-{max_list_limit}, default {default_list_limit}) and the returned next_cursor until \
it is null. get_workspace shows one with its versions; run_script with workspace {\"id\": ...} runs on one.",
        annotations(
            title = "List workspaces",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_workspaces(
        &self,
        Parameters(Named(input)): Parameters<Named<ListWorkspacesInput>>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ListWorkspacesOutput>, ToolError> {
        let who = allowed(&ctx, Scope::Read, "list_workspaces")?;
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
        let cursor = input
            .cursor
            .as_deref()
            .map(parse_workspace_cursor)
            .transpose()?;
        let (workspaces, next) = self
            .store
            .list_workspaces(who.owner(), cursor.as_ref(), limit)
            .await?;
        Ok(Json(ListWorkspacesOutput {
            workspaces: workspaces.into_iter().map(Into::into).collect(),
            next_cursor: next.as_ref().map(workspace_cursor),
        }))
    }

    #[tool(
        name = "get_workspace",
        description = "Get one of your workspaces and its kept versions: each version's number, the task that \
made it (its /workspace when it ended), bytes, files (entry count), created_at and parent (the version that task \
started from). Start a task from any of them with run_script workspace {\"id\": ..., \"version\": N} (a roll \
back), or fork one with fork_workspace. Version 0 is the empty one every workspace starts at.",
        annotations(
            title = "Get a workspace",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn get_workspace(
        &self,
        Parameters(Named(input)): Parameters<Named<WorkspaceIdInput>>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<GetWorkspaceOutput>, ToolError> {
        let who = allowed(&ctx, Scope::Read, "get_workspace")?;
        let id = parse_workspace_id(&input.workspace_id)?;
        let (ws, versions) = self
            .store
            .workspace_with_versions(&id, who.owner())
            .await?
            .ok_or(ToolError::UnknownWorkspace(id))?;
        Ok(Json(GetWorkspaceOutput {
            workspace: ws.into(),
            versions: versions.into_iter().map(Into::into).collect(),
        }))
    }

    #[tool(
        name = "fork_workspace",
        description = "Make a new workspace from a version of one of yours (its head unless version is given), \
at once and whatever its size: no file is copied. Returns the new workspace_id; tasks on the two then diverge, \
and the original stays as it was. Use it to run on a workspace that is busy, or to try two things from one state.",
        annotations(
            title = "Fork a workspace",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn fork_workspace(
        &self,
        Parameters(Named(input)): Parameters<Named<ForkWorkspaceInput>>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ForkWorkspaceOutput>, ToolError> {
        let who = allowed(&ctx, Scope::Run, "fork_workspace")?;
        let source = parse_workspace_id(&input.workspace_id)?;
        let version = parse_version(input.version)?;
        let new = WorkspaceId::from_bytes(*uuid::Uuid::new_v4().as_bytes());
        let reply = self
            .store
            .fork_workspace(
                who.owner(),
                &source,
                version,
                &new,
                self.config.workspace_owner_max_bytes,
            )
            .await?;
        match reply {
            WsReply::Done(forked) => {
                tracing::info!(workspace_id = %new, source = %source, version = forked, "workspace forked");
                Ok(Json(ForkWorkspaceOutput {
                    workspace_id: new,
                    forked_from: ForkedFrom {
                        workspace_id: source,
                        version: forked,
                    },
                    head: u64::from(forked != 0),
                }))
            }
            WsReply::Refused { why, detail } => {
                Err(self.workspace_refusal(Some(source), version, why, detail))
            }
        }
    }

    #[tool(
        name = "delete_workspace",
        description = "Delete one of your workspaces and all its versions; its id is then unknown. Forks made \
from it are not affected. A task still running on it keeps running, but its files are not saved.",
        annotations(
            title = "Delete a workspace",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn delete_workspace(
        &self,
        Parameters(Named(input)): Parameters<Named<WorkspaceIdInput>>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<DeleteWorkspaceOutput>, ToolError> {
        let who = allowed(&ctx, Scope::Run, "delete_workspace")?;
        let id = parse_workspace_id(&input.workspace_id)?;
        if !self.store.delete_workspace(who.owner(), &id).await? {
            return Err(ToolError::UnknownWorkspace(id));
        }
        tracing::info!(workspace_id = %id, owner = %who.owner(), "workspace deleted");
        Ok(Json(DeleteWorkspaceOutput {
            workspace_id: id,
            deleted: true,
        }))
    }
}
