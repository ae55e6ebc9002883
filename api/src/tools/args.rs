//! The tools' arguments: their types (whose doc comments become the input
//! schemas, `{placeholders}` filled in by `describe`), the lenient
//! deserializers models need, and the decoders that turn a raw argument into
//! what a tool uses (base64, command, task id, cursor).

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::{DecodePaddingMode, general_purpose};
use schemars::JsonSchema;
use serde::Deserialize;
use shared::TaskState;
use shared::options::CacheUse;
use shared::workspace::{WorkspaceId, WorkspaceUse};

use super::error::ToolError;
use crate::config::MAX_WAIT_SECONDS;
use crate::db::{ListCursor, WorkspaceCursor};

/// Standard alphabet; padding optional, since models often drop it.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Tasks per `list_tasks` page by default, and at most.
pub const DEFAULT_LIST_LIMIT: usize = 20;
pub const MAX_LIST_LIMIT: usize = 100;

/// Input of `run_script`. Unknown arguments are refused, naming the known ones,
/// so a model that guessed a name (`timeout`, `language`) learns the right one.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunScriptInput {
    /// The runtime (container image) to run in, e.g. "python3.13", "python3.8" or
    /// "node24". The server's instructions list the configured runtimes.
    /// Required: give this or runtime_name.
    #[serde(default)]
    pub runtime: Option<String>,
    /// The same as runtime, under a second name for clients that keep an
    /// argument named "runtime" for themselves (LangChain's MCP adapters).
    /// Give one of the two; both, only if they are the same.
    #[serde(default)]
    pub runtime_name: Option<String>,
    /// The shell one-liner to run, base64-encoded (standard alphabet). It runs as
    /// `sh -c <command>` with /workspace as the working directory.
    pub command_base64: String,
    /// Optional source files: a zip archive, base64-encoded. It is extracted into
    /// /workspace (folders kept) before the command runs. No symlinks, absolute
    /// paths or "..". At most {max_zip}.
    #[serde(default)]
    pub zip_base64: Option<String>,
    /// Optional wall-clock limit in seconds (default {default_timeout_seconds}).
    /// Larger values are lowered to the server's cap of {max_timeout_seconds};
    /// the effective value is returned.
    #[serde(default, deserialize_with = "timeout_seconds")]
    pub timeout_seconds: Option<i64>,
    /// Optional standard input for the script, base64-encoded (at most
    /// {max_stdin}). It is delivered in full, then closed, so a script reading to
    /// the end sees EOF. Without it, stdin is empty.
    #[serde(default)]
    pub stdin_base64: Option<String>,
    /// Optional environment variables for the script, e.g. {"DEBUG": "1"}. Names
    /// are letters, digits and '_' (not starting with a digit); HOME, PATH, PWD
    /// and names starting with SR_ or SCRIPT_RUNNER_ are reserved. At most
    /// {max_env_vars} variables, {max_env_size} in all.
    #[serde(default, deserialize_with = "env_map")]
    pub env: Option<BTreeMap<String, String>>,
    /// What the script may reach: "internet" (the internet is reachable, this
    /// service and private networks are not), "none" (no network at all), or
    /// {"allow": ["pypi.org", "*.npmjs.org"]}: only those hosts (exact names,
    /// or "*." for every name under a domain; at most {max_allow_entries}),
    /// over HTTP and HTTPS through a proxy the sandbox sets in HTTP_PROXY and
    /// HTTPS_PROXY; no DNS, no other port. Default: {egress_default}.
    #[serde(default)]
    #[schemars(schema_with = "network_schema")]
    pub network: Option<serde_json::Value>,
    /// Optional files to keep after the run: paths or shell globs relative to
    /// /workspace (e.g. ["out/*.txt", "report.html"]; a directory is taken
    /// whole). Regular files only, no links followed, at most
    /// {max_collect_files} files and {max_collect_size}; fetch them with
    /// get_task_files once the task is final.
    #[serde(default)]
    pub collect: Option<Vec<String>>,
    /// "owner" (the default: pip's and npm's caches are kept on the worker
    /// between your tasks, never shared with anyone else's; a second task of
    /// yours running at the same time starts with empty ones) or "none" (empty
    /// caches; yours are neither read nor changed).
    #[serde(default)]
    pub cache: Option<CacheUse>,
    /// Optional: wait up to this many seconds (0 to {max_wait_seconds}, default
    /// 0) for the task to end. If it ends in time, the result is what
    /// get_task_status returns (a final state, exit_code, output tails);
    /// otherwise the task_id and its current state, as without it. A short
    /// script then costs one call.
    #[serde(default, deserialize_with = "wait_seconds")]
    pub wait_seconds: Option<i64>,
    /// Optional: run on a persistent workspace, so files carry over between
    /// tasks. "new" makes an empty one (its workspace_id is in the result);
    /// {"id": "<workspace_id>"} starts from that workspace's head (its newest
    /// version), {"id": "<workspace_id>", "version": N} from version N (0 is
    /// the empty one; get_workspace lists the kept ones). The task starts
    /// with that version's files in /workspace (zip_base64, if given, is
    /// unpacked over them), and when it ends, whatever the end (succeeded,
    /// failed, timed-out or killed), its /workspace becomes the workspace's
    /// next version and its head. One task at a time per workspace: while one
    /// is using it, another is refused (workspace_busy; fork_workspace makes a
    /// copy to run on at once).
    #[serde(default, deserialize_with = "workspace_use")]
    #[schemars(schema_with = "workspace_schema")]
    pub workspace: Option<WorkspaceUse>,
}

/// `workspace`'s schema: "new", or an object naming a workspace and
/// optionally a version (`workspace_use` checks it, naming what is wrong).
fn workspace_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "anyOf": [
            {"type": "string", "enum": ["new"]},
            {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "format": "uuid"},
                    "version": {"type": "integer", "minimum": 0}
                },
                "required": ["id"],
                "additionalProperties": false
            }
        ]
    })
}

/// What `workspace` may be, for the refusals.
const WORKSPACE_FORMS: &str =
    "\"new\", or {\"id\": \"<workspace_id>\"} with an optional \"version\": N";

/// `workspace`: "new", `{"id": ..., "version": N}` (version optional), or,
/// as leniently as the other arguments, the id alone as a string, and
/// `workspace_id` for `id` (the name the other tools use) and a version sent
/// as a string ("3").
fn workspace_use<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<WorkspaceUse>, D::Error> {
    use serde::de::Error as _;
    use serde_json::Value;
    let value = Option::<Value>::deserialize(d)?;
    let id = |text: &str| {
        WorkspaceId::parse(text.trim()).map_err(|_| {
            D::Error::custom(format!(
                "workspace id {:?} is not a workspace id: pass the workspace_id run_script or fork_workspace returned (a UUID)",
                text.chars().take(80).collect::<String>()
            ))
        })
    };
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().eq_ignore_ascii_case("new") => {
            Ok(Some(WorkspaceUse::New))
        }
        Some(Value::String(s)) if uuid::Uuid::try_parse(s.trim()).is_ok() => {
            Ok(Some(WorkspaceUse::Existing {
                id: id(&s)?,
                version: None,
            }))
        }
        Some(Value::Object(mut map)) => {
            let given = match (map.remove("id"), map.remove("workspace_id")) {
                (Some(v), None) | (None, Some(v)) => v,
                (None, None) => {
                    return Err(D::Error::custom(format!(
                        "workspace needs an \"id\": pass {WORKSPACE_FORMS}"
                    )));
                }
                (Some(_), Some(_)) => {
                    return Err(D::Error::custom(
                        "workspace has both \"id\" and \"workspace_id\": pass one, \"id\"",
                    ));
                }
            };
            let Value::String(text) = &given else {
                return Err(D::Error::custom(format!(
                    "workspace id must be a string (the workspace_id, a UUID), got {given}"
                )));
            };
            let id = id(text)?;
            let version = match map.remove("version") {
                None | Some(Value::Null) => None,
                Some(v) => match whole(&v) {
                    Some(n) if n >= 0 => Some(n as u64),
                    Some(n) => {
                        return Err(D::Error::custom(format!(
                            "workspace version must be 0 or more (got {n}); omit it for the head"
                        )));
                    }
                    None => {
                        return Err(D::Error::custom(format!(
                            "workspace version must be a whole number, got {v}"
                        )));
                    }
                },
            };
            if let Some(extra) = map.keys().next() {
                return Err(D::Error::custom(format!(
                    "workspace has no field {extra:?}: pass {WORKSPACE_FORMS}"
                )));
            }
            Ok(Some(WorkspaceUse::Existing { id, version }))
        }
        Some(other) => Err(D::Error::custom(format!(
            "workspace must be {WORKSPACE_FORMS}; got {}",
            shown(&other)
        ))),
    }
}

/// A JSON value as a refusal quotes it, cut to a readable length.
fn shown(v: &serde_json::Value) -> String {
    let text = v.to_string();
    if text.chars().count() > 80 {
        format!("{}...", text.chars().take(80).collect::<String>())
    } else {
        text
    }
}

/// `network`'s schema: one of two names, or an object with an allow-list
/// (`shared::egress::Egress::from_json` checks it, naming what is wrong).
fn network_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "anyOf": [
            {"type": "string", "enum": ["internet", "none"]},
            {
                "type": "object",
                "properties": {
                    "allow": {
                        "type": "array",
                        "items": {"type": "string"},
                        "minItems": 1,
                        "maxItems": shared::egress::MAX_ALLOW_ENTRIES
                    }
                },
                "required": ["allow"],
                "additionalProperties": false
            }
        ]
    })
}

/// Input of `kill_task`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskIdInput {
    /// The task_id returned by run_script.
    pub task_id: String,
}

/// Input of `get_task_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskFilesInput {
    /// The task_id returned by run_script.
    pub task_id: String,
    /// Optional: also answer with a resource_link content item per file
    /// (default false). Each file's uri is in the answer either way. Off by
    /// default: some agent frameworks turn a link into a file attachment that
    /// their model API refuses (LangChain on OpenAI Chat Completions).
    #[serde(default)]
    pub resource_links: Option<bool>,
}

/// Input of `get_task_status`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StatusInput {
    /// The task_id returned by run_script.
    pub task_id: String,
    /// How many bytes of the end of stdout and of stderr to return (default
    /// {default_tail_bytes}, capped at {tail_cap}). 0 returns no output, only
    /// the state.
    #[serde(default, deserialize_with = "tail_bytes")]
    pub tail_bytes: Option<i64>,
    /// Optional: wait up to this many seconds (0 to {max_wait_seconds}, default
    /// 0) for a change: the answer comes as soon as the state changes or new
    /// output arrives, else at the end of the wait with the current status.
    #[serde(default, deserialize_with = "wait_seconds")]
    pub wait_seconds: Option<i64>,
    /// Optional, with wait_seconds: what the previous answer said, as
    /// {"state": ..., "stdout_bytes": N, "stderr_bytes": M}. A task that has
    /// moved on from it answers at once, so a change between two calls is
    /// never waited past.
    #[serde(default)]
    pub seen: Option<Seen>,
}

/// What a caller saw of a task (`get_task_status`' `seen`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Seen {
    pub state: TaskState,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
}

/// `wait_seconds` as a duration, refused outside 0..=`MAX_WAIT_SECONDS`.
pub fn wait_duration(given: Option<i64>) -> Result<std::time::Duration, ToolError> {
    match given {
        None => Ok(std::time::Duration::ZERO),
        Some(n) if (0..=MAX_WAIT_SECONDS).contains(&n) => {
            Ok(std::time::Duration::from_secs(n as u64))
        }
        Some(n) => Err(ToolError::BadWaitSeconds(n)),
    }
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

fn wait_seconds<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    whole_number("wait_seconds", d)
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
        Some(v) => whole(v),
    };
    parsed.map(Some).ok_or_else(|| {
        let shown = value.map(|v| v.to_string()).unwrap_or_default();
        serde::de::Error::custom(format!("{name} must be a whole number, got {shown}"))
    })
}

/// A number, or a number written as a string, that is whole: as an i64.
fn whole(value: &serde_json::Value) -> Option<i64> {
    use serde_json::Value;
    match value {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().and_then(integral)),
        Value::String(s) => s
            .trim()
            .parse()
            .ok()
            .or_else(|| s.trim().parse().ok().and_then(integral)),
        _ => None,
    }
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
    /// Tasks per page, 1 to {max_list_limit} (default {default_list_limit}).
    #[serde(default, deserialize_with = "limit")]
    pub limit: Option<i64>,
}

/// Input of `list_workspaces`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListWorkspacesInput {
    /// The next_cursor of the previous page; omit for the newest workspaces.
    #[serde(default)]
    pub cursor: Option<String>,
    /// Workspaces per page, 1 to {max_list_limit} (default {default_list_limit}).
    #[serde(default, deserialize_with = "limit")]
    pub limit: Option<i64>,
}

/// Input of `get_workspace` and `delete_workspace`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceIdInput {
    /// The workspace_id run_script (with workspace "new") or fork_workspace
    /// returned.
    pub workspace_id: String,
}

/// Input of `fork_workspace`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkWorkspaceInput {
    /// The workspace to fork: a workspace_id run_script (with workspace
    /// "new") or fork_workspace returned.
    pub workspace_id: String,
    /// Optional: the version to fork (0 is the empty one; get_workspace lists
    /// the kept ones). Default: its head, the newest.
    #[serde(default, deserialize_with = "version")]
    pub version: Option<i64>,
}

pub(super) fn version<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    whole_number("version", d)
}

/// `read_files`: the most content bytes one call returns (all files
/// together), and the default.
pub const MAX_READ_BYTES: u64 = 1 << 20;
pub const DEFAULT_READ_BYTES: u64 = 64 << 10;
/// `read_files`: the most paths or patterns one call may give.
pub const MAX_PATTERNS: usize = 64;
/// `read_files`: the most entries one answer lists (content or not).
pub const MAX_LISTED: usize = 1000;

/// A version argument: 0 or more.
pub(super) fn parse_version(given: Option<i64>) -> Result<Option<u64>, ToolError> {
    match given {
        None => Ok(None),
        Some(n) if n >= 0 => Ok(Some(n as u64)),
        Some(n) => Err(ToolError::BadVersion(n)),
    }
}

pub(super) fn parse_workspace_id(raw: &str) -> Result<WorkspaceId, ToolError> {
    WorkspaceId::parse(raw.trim())
        .map_err(|_| ToolError::MalformedWorkspaceId(raw.chars().take(80).collect()))
}

/// A `list_workspaces` cursor: `<score>.<workspace id>`, as `workspace_cursor`
/// writes it.
pub(super) fn parse_workspace_cursor(raw: &str) -> Result<WorkspaceCursor, ToolError> {
    let bad = || ToolError::BadWorkspaceCursor(raw.chars().take(80).collect());
    let (score, id) = raw.trim().split_once('.').ok_or_else(bad)?;
    Ok(WorkspaceCursor {
        score: score.parse().map_err(|_| bad())?,
        id: WorkspaceId::parse(id).map_err(|_| bad())?,
    })
}

pub(super) fn workspace_cursor(c: &WorkspaceCursor) -> String {
    format!("{}.{}", c.score, c.id)
}

pub(super) fn decode_base64(field: &'static str, value: &str) -> Result<Vec<u8>, ToolError> {
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

impl RunScriptInput {
    /// The runtime asked for, under either name. Neither is in the schema's
    /// `required`: "one of the two" would be a top-level `anyOf`, which the
    /// Anthropic API refuses in any tool's input schema (every request that
    /// lists the tool fails), so the rule is checked here instead.
    pub(super) fn runtime_asked(
        &self,
        allowed: impl FnOnce() -> String,
    ) -> Result<&str, ToolError> {
        match (self.runtime.as_deref(), self.runtime_name.as_deref()) {
            (Some(runtime), Some(runtime_name)) if runtime != runtime_name => {
                Err(ToolError::TwoRuntimes {
                    runtime: runtime.to_owned(),
                    runtime_name: runtime_name.to_owned(),
                })
            }
            (Some(asked), _) | (None, Some(asked)) => Ok(asked),
            (None, None) => Err(ToolError::NoRuntime { allowed: allowed() }),
        }
    }
}

pub(super) fn decode_command(b64: &str, max: usize) -> Result<String, ToolError> {
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

pub(super) fn parse_task_id(raw: &str) -> Result<String, ToolError> {
    uuid::Uuid::parse_str(raw.trim())
        .map(|u| u.to_string())
        .map_err(|_| ToolError::MalformedTaskId(raw.chars().take(80).collect()))
}

pub(super) fn parse_cursor(raw: &str) -> Result<ListCursor, ToolError> {
    let bad = || ToolError::BadCursor(raw.chars().take(80).collect());
    let (ms, id) = raw.trim().split_once('.').ok_or_else(bad)?;
    Ok(ListCursor {
        created_ms: ms.parse().map_err(|_| bad())?,
        task_id: uuid::Uuid::parse_str(id).map_err(|_| bad())?.to_string(),
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
    fn workspace_refusals_say_what_is_allowed() {
        let parse = |w: serde_json::Value| {
            let args = serde_json::json!({ "runtime": "r", "command_base64": "x", "workspace": w });
            serde_json::from_value::<Named<RunScriptInput>>(args)
                .map(|Named(i)| i.workspace)
                .map_err(|e| e.to_string())
        };
        let id = "0f5e3c1a-9b2d-4c7e-8a11-23456789abcd";
        assert_eq!(parse(serde_json::json!("new")), Ok(Some(WorkspaceUse::New)));
        assert_eq!(
            parse(serde_json::json!(" NEW ")),
            Ok(Some(WorkspaceUse::New))
        );
        assert_eq!(parse(serde_json::Value::Null), Ok(None));
        let refused = |w: serde_json::Value| parse(w).err().unwrap_or_default();
        for (sent, says) in [
            (
                serde_json::json!("old"),
                "workspace must be \"new\", or {\"id\"",
            ),
            (serde_json::json!(7), "got 7"),
            (serde_json::json!({}), "workspace needs an \"id\""),
            (
                serde_json::json!({ "id": "nope" }),
                "workspace id \"nope\" is not a workspace id",
            ),
            (
                serde_json::json!({ "id": 5 }),
                "workspace id must be a string",
            ),
            (
                serde_json::json!({ "id": id, "version": -1 }),
                "workspace version must be 0 or more (got -1)",
            ),
            (
                serde_json::json!({ "id": id, "version": "latest" }),
                "workspace version must be a whole number",
            ),
            (
                serde_json::json!({ "id": id, "head": 1 }),
                "workspace has no field \"head\"",
            ),
            (
                serde_json::json!({ "id": id, "workspace_id": id }),
                "both \"id\" and \"workspace_id\"",
            ),
            (
                serde_json::json!("0f5e3c1a9b2d4c7e8a1123456789abcd"),
                "is not a workspace id",
            ),
        ] {
            let message = refused(sent.clone());
            assert!(message.contains(says), "{sent}: {message}");
        }
        assert_eq!(
            parse_version(Some(-2)).map_err(|e| e.to_string()),
            Err(
                "version must be a version number, 0 or more (got -2); omit it for the head"
                    .to_owned()
            )
        );
        assert!(parse_workspace_id("../x").is_err());
        let cursor = WorkspaceCursor {
            score: 17,
            id: WorkspaceId::from_bytes([4; 16]),
        };
        assert_eq!(
            parse_workspace_cursor(&workspace_cursor(&cursor)).ok(),
            Some(cursor)
        );
        assert!(parse_workspace_cursor("17").is_err());
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
                "stdin_base64", "env", "network", "collect", "cache", "wait_seconds",
                "workspace",
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
        fn workspace_tool_arguments_parse_or_name_the_argument(
            field in prop::sample::select(vec!["workspace_id", "version", "cursor", "limit"]),
            value in json_value(),
        ) {
            let id = "0f5e3c1a-9b2d-4c7e-8a11-23456789abcd";
            let result = match field {
                "workspace_id" | "version" => {
                    let mut args = json!({ "workspace_id": id });
                    args[field] = value.clone();
                    parse::<ForkWorkspaceInput>(args).map(|_| ())
                }
                _ => {
                    let mut args = json!({});
                    args[field] = value.clone();
                    parse::<ListWorkspacesInput>(args).map(|_| ())
                }
            };
            if let Err(message) = result {
                prop_assert!(message.contains(field), "{field}={value}: {message}");
            }
        }

        #[test]
        fn workspaces_come_back_as_sent_in_any_usual_form(
            id in any::<u128>(),
            version in prop::option::of(0..u32::MAX as u64),
            form in 0..4u8,
            upper in any::<bool>(),
        ) {
            let text = uuid::Uuid::from_u128(id).hyphenated().to_string();
            let text = if upper { text.to_uppercase() } else { text };
            // The id alone, or an object with a version as a number, a
            // string or a float, under either name.
            let workspace = match (form, version) {
                (0, None) => json!(text),
                (1, v) => json!({ "id": text, "version": v }),
                (2, Some(v)) => json!({ "workspace_id": text, "version": v.to_string() }),
                (_, v) => json!({ "id": format!(" {text} "), "version": v.map(|v| v as f64) }),
            };
            let args = json!({ "runtime": "r", "command_base64": "x", "workspace": workspace });
            let parsed = parse::<RunScriptInput>(args).map(|i| i.workspace);
            let want = WorkspaceUse::Existing {
                id: WorkspaceId::from_bytes(*uuid::Uuid::from_u128(id).as_bytes()),
                version,
            };
            prop_assert_eq!(parsed, Ok(Some(want)));
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
