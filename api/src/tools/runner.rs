//! `ScriptRunner`: what every tool and `tasks/*` handler works with.

use std::sync::Arc;

use blobs::BlobStore;

use rmcp::RoleServer;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::service::RequestContext;
use tokio_util::sync::CancellationToken;

use super::describe;
use super::error::{Credential, ToolError};
use crate::auth::{Principal, Scope};
use crate::config::Config;
use crate::db::Store;

/// One MCP server per request (the transport is stateless); cheap to clone
/// since it only holds handles. Build one with `new` at start and clone it per
/// request: `new` builds the tool definitions (schemas generated, limits filled
/// in from the config), which per request cost about a tenth of the api's CPU
/// time under load (BENCHMARKS.md).
#[derive(Clone)]
pub struct ScriptRunner {
    pub(super) store: Store,
    pub(super) config: Arc<Config>,
    pub(super) tools: Arc<ToolRouter<ScriptRunner>>,
    /// Cancelled when the replica shuts down: waiting calls answer at once.
    pub(super) shutdown: CancellationToken,
    /// The workers' blob store, for `read_files`; why not, if it did not open
    /// at start (the other tools work without it).
    pub(super) blobs: Result<BlobStore, Arc<str>>,
}

impl ScriptRunner {
    pub fn new(store: Store, config: Arc<Config>, shutdown: CancellationToken) -> ScriptRunner {
        let tools = describe::with_limits(ScriptRunner::routes(), &config);
        let tools = Arc::new(describe::with_console(tools));
        let blobs = BlobStore::open(&config.workspace_store).map_err(|e| {
            tracing::warn!(error = %e, "the workspace store did not open: read_files will answer that");
            Arc::from(e.to_string())
        });
        ScriptRunner {
            store,
            config,
            tools,
            shutdown,
            blobs,
        }
    }

    /// Every tool: `calls`'s, `workspaces`'s, `files`'s and `edits`'s.
    pub(super) fn routes() -> ToolRouter<ScriptRunner> {
        ScriptRunner::tool_router()
            + ScriptRunner::workspaces_router()
            + ScriptRunner::files_router()
            + ScriptRunner::edits_router()
    }

    /// The blob store, or the tool error that says why there is none.
    pub(super) fn blobs(&self) -> Result<&BlobStore, ToolError> {
        self.blobs
            .as_ref()
            .map_err(|e| ToolError::WorkspaceStore(e.to_string()))
    }
}

/// The caller of a request (put there by `auth::require_bearer`), if it holds
/// `scope` for `call`; a missing scope is a tool error naming it and the
/// key's scopes.
pub(super) fn allowed(
    ctx: &RequestContext<RoleServer>,
    scope: Scope,
    call: &'static str,
) -> Result<Principal, ToolError> {
    let principal = ctx
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|p| p.extensions.get::<Principal>())
        .cloned()
        .ok_or(ToolError::NoPrincipal)?;
    let have = principal.scopes();
    if have.contains(scope) {
        Ok(principal)
    } else {
        let credential = match principal.owner() {
            shared::Owner::OAuth(_) => Credential::AccessToken,
            _ => Credential::ApiKey,
        };
        Err(ToolError::MissingScope {
            needed: scope,
            call,
            have,
            credential,
        })
    }
}
