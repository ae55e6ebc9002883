//! The MCP server: rmcp's `ServerHandler` for `ScriptRunner`, dispatching to the
//! tools (`calls`), the tasks extension (`tasks`) and the fallback, and saying
//! who we are (`get_info`, and `serverInfo` in each result's `_meta`).

use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CancelTaskParams, CustomRequest,
    CustomResult, ErrorCode as RpcCode, GetTaskParams, GetTaskResult, InitializeRequestParams,
    InitializeResult, ListResourceTemplatesResult, ListResourcesResult, ListToolsResult,
    PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities,
    ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};

use super::error::{ErrorCode, error_result};
use super::fallback;
use super::resources::hints;
use super::runner::ScriptRunner;
use super::server_info::{implementation, stamp};

/// How long a client may keep the tool list (`tools/list`'s `ttlMs`). The list
/// changes only when the server restarts with another configuration (the
/// descriptions quote its limits), so an hour-old copy is at worst an hour
/// late with a changed default.
pub const TOOL_LIST_TTL_MS: u64 = 3_600_000;

/// rmcp's message for a `tools/call` naming no tool it has.
const TOOL_NOT_FOUND: &str = "tool not found";

impl ServerHandler for ScriptRunner {
    /// rmcp's own `initialize` (as its documentation shows), stamped.
    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        context.peer.set_peer_info(request.clone());
        let mut result = self.negotiate_initialize(&request)?;
        stamp(&mut result.meta);
        Ok(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let mut response = self.call_with_codes(request, context).await?;
        match &mut response {
            CallToolResponse::Complete(result) => stamp(&mut result.meta),
            CallToolResponse::Task(task) => stamp(&mut task.meta),
            // Not produced here (an MRTR round, or a variant rmcp may add).
            _ => {}
        }
        Ok(response)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut result = ListToolsResult::with_all_items(self.tools.list_all());
        stamp(&mut result.meta);
        Ok(if hints(&context) {
            // The list is the same for every caller: any cache may share it.
            result
                .with_ttl_ms(TOOL_LIST_TTL_MS)
                .with_cache_scope(CacheScope::Public)
        } else {
            result
        })
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let mut result = self.read_resource_at(&request.uri, &ctx).await?;
        stamp(&mut result.meta);
        Ok(result.into())
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let mut result = self.list_resources_of(request, &ctx).await?;
        stamp(&mut result.meta);
        Ok(result)
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let mut result = self.resource_templates(&ctx);
        stamp(&mut result.meta);
        Ok(result)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.get(name).cloned()
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        Err(fallback::refuse(request))
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let mut result = self.get_mcp_task(request, &ctx).await?;
        stamp(&mut result.meta);
        Ok(result)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.cancel_mcp_task(request, &ctx).await
    }

    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .enable_tasks()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(implementation())
            .with_instructions(format!(
                "Runs shell one-liners in disposable, isolated containers. Call run_script (runtime, \
                 base64 command, optional base64 zip, stdin, env, network), then poll get_task_status until the \
                 state is final; get_task_files returns the files it collected; kill_task stops a task; \
                 list_tasks lists recent ones. With workspace \"new\" (then {{\"id\": ...}}), files persist \
                 from task to task as versions (list_workspaces, get_workspace, fork_workspace, \
                 delete_workspace); write_files makes a version from plain-text files without a \
                 container, and read_files reads a version's files as text. Runtimes: {}. Default timeout {} s, at most {} s.",
                self.config.runtimes.names_list(),
                self.config.default_timeout_seconds,
                self.config.max_timeout_seconds
            ))
    }
}

impl ScriptRunner {
    /// A tool call through the router, every error given its code.
    async fn call_with_codes(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let call = ToolCallContext::new(self, request, context);
        match self.tools.call(call).await {
            // Arguments that do not deserialize are answered by rmcp with a
            // text-only error result; ours always carry a code, so give it one.
            Ok(CallToolResponse::Complete(result))
                if result.is_error == Some(true) && result.structured_content.is_none() =>
            {
                let message = result
                    .content
                    .first()
                    .and_then(|c| c.as_text())
                    .map(|t| t.text.clone())
                    .unwrap_or_default();
                Ok(error_result(ErrorCode::InvalidArgument, message).into())
            }
            Err(mut e) if e.code == RpcCode::INVALID_PARAMS && e.message == TOOL_NOT_FOUND => {
                e.data = Some(ErrorCode::UnknownTool.data());
                Err(e)
            }
            other => other,
        }
    }
}
