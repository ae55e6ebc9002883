//! The tool descriptions and schemas quote the limits this server runs with, not
//! copies of their defaults: the `#[tool]` descriptions and the argument and
//! output doc comments say `{max_stdin}` or `{default_timeout_seconds}`, and
//! `with_limits` fills those in from the config (and the shared constants and
//! enums: `{reason_kinds}` is `ReasonKind::ALL`) once, when the tools are built.

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::JsonObject;
use serde_json::Value;
use shared::ReasonKind;
use shared::options::{MAX_COLLECT_BYTES, MAX_COLLECT_FILES, MAX_ENV_BYTES, MAX_ENV_VARS};
use shared::tail::{DEFAULT_TAIL_BYTES, TAIL_CAP};

use super::args::{
    DEFAULT_LIST_LIMIT, DEFAULT_READ_BYTES, MAX_LIST_LIMIT, MAX_LISTED, MAX_PATTERNS,
    MAX_READ_BYTES,
};
use super::output::LIST_COMMAND_CHARS;
use crate::config::Config;

/// `router` with every placeholder in its tools' descriptions and schemas
/// replaced by the value `config` gives it.
pub fn with_limits<S>(mut router: ToolRouter<S>, config: &Config) -> ToolRouter<S> {
    let values = placeholders(config);
    for route in router.map.values_mut() {
        let tool = &mut route.attr;
        if let Some(text) = &tool.description {
            tool.description = Some(fill(text, &values).into());
        }
        // The schemas are shared (rmcp caches one per type): replace, not edit.
        tool.input_schema = Arc::new(fill_object(&tool.input_schema, &values));
        if let Some(schema) = &tool.output_schema {
            tool.output_schema = Some(Arc::new(fill_object(schema, &values)));
        }
    }
    router
}

/// The task console's URI (an MCP App, served by `resources`) and its MIME
/// type, the Apps profile.
pub const CONSOLE_URI: &str = "ui://script-runner/console";
pub const CONSOLE_MIME: &str = "text/html;profile=mcp-app";

/// The tools whose results the console shows: a task's (it follows the task
/// to its end) or a workspace's (its versions).
const CONSOLE_TOOLS: [&str; 6] = [
    "run_script",
    "get_task_status",
    "get_workspace",
    "fork_workspace",
    "read_files",
    "write_files",
];

/// `router` with the console linked from `CONSOLE_TOOLS` (`_meta.ui.resourceUri`,
/// and the flat `ui/resourceUri` that hosts of the first Apps drafts read).
pub fn with_console<S>(mut router: ToolRouter<S>) -> ToolRouter<S> {
    for route in router.map.values_mut() {
        let tool = &mut route.attr;
        if CONSOLE_TOOLS.contains(&tool.name.as_ref()) {
            let meta = tool.meta.get_or_insert_default();
            meta.insert(
                "ui".to_owned(),
                serde_json::json!({ "resourceUri": CONSOLE_URI }),
            );
            meta.insert("ui/resourceUri".to_owned(), serde_json::json!(CONSOLE_URI));
        }
    }
    router
}

/// Each placeholder and its value.
fn placeholders(config: &Config) -> Vec<(&'static str, String)> {
    vec![
        (
            "{default_timeout_seconds}",
            config.default_timeout_seconds.to_string(),
        ),
        (
            "{max_timeout_seconds}",
            config.max_timeout_seconds.to_string(),
        ),
        ("{max_stdin}", size(config.max_stdin_bytes as u64)),
        ("{max_zip}", size(config.max_zip_bytes as u64)),
        ("{max_env_vars}", MAX_ENV_VARS.to_string()),
        (
            "{max_allow_entries}",
            shared::egress::MAX_ALLOW_ENTRIES.to_string(),
        ),
        (
            "{egress_default}",
            config.egress_default.to_json().to_string(),
        ),
        ("{max_env_size}", size(MAX_ENV_BYTES as u64)),
        ("{max_collect_files}", MAX_COLLECT_FILES.to_string()),
        ("{max_collect_size}", size(MAX_COLLECT_BYTES)),
        ("{default_tail_bytes}", DEFAULT_TAIL_BYTES.to_string()),
        ("{tail_cap}", TAIL_CAP.to_string()),
        (
            "{max_wait_seconds}",
            crate::config::MAX_WAIT_SECONDS.to_string(),
        ),
        ("{default_list_limit}", DEFAULT_LIST_LIMIT.to_string()),
        ("{max_list_limit}", MAX_LIST_LIMIT.to_string()),
        ("{list_command_chars}", LIST_COMMAND_CHARS.to_string()),
        ("{reason_kinds}", reason_kinds()),
        ("{max_read_bytes}", size(MAX_READ_BYTES)),
        ("{default_read_bytes}", size(DEFAULT_READ_BYTES)),
        ("{max_patterns}", MAX_PATTERNS.to_string()),
        ("{max_listed}", MAX_LISTED.to_string()),
        (
            "{max_write_files}",
            super::edits::MAX_WRITE_FILES.to_string(),
        ),
        ("{max_deletes}", super::edits::MAX_DELETES.to_string()),
        (
            "{write_wait_seconds}",
            super::edits::WRITE_WAIT.as_secs().to_string(),
        ),
    ]
}

/// Every reason kind, in the enum's order, as a sentence lists them: "exited,
/// timed-out, ... or not-replicated".
fn reason_kinds() -> String {
    let names: Vec<&str> = ReasonKind::ALL.iter().map(|k| k.as_str()).collect();
    match names.split_last() {
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// A byte count as a reader would write it: "16 MiB", "32 KiB", "1000 bytes".
fn size(bytes: u64) -> String {
    match bytes {
        0 => "0 bytes".to_owned(),
        b if b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

fn fill(text: &str, values: &[(&str, String)]) -> String {
    values
        .iter()
        .fold(text.to_owned(), |t, (name, value)| t.replace(name, value))
}

fn fill_object(object: &JsonObject, values: &[(&str, String)]) -> JsonObject {
    object
        .iter()
        .map(|(k, v)| (k.clone(), fill_value(v, values)))
        .collect()
}

fn fill_value(value: &Value, values: &[(&str, String)]) -> Value {
    match value {
        Value::String(s) => Value::String(fill(s, values)),
        Value::Array(items) => Value::Array(items.iter().map(|v| fill_value(v, values)).collect()),
        Value::Object(o) => Value::Object(fill_object(o, values)),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ScriptRunner;

    fn config(extra: &[(&str, &str)]) -> Config {
        let mut vars = vec![
            (
                "SCRIPT_RUNNER_TOKEN",
                "0123456789abcdef0123456789abcdef0123",
            ),
            (
                "TASK_SIGNING_KEY",
                "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=",
            ),
        ];
        vars.extend_from_slice(extra);
        Config::from_lookup(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        })
        .unwrap_or_else(|e| panic!("config: {e}"))
    }

    /// Every `{word}` left in `text`.
    fn placeholders_left(text: &str) -> Vec<String> {
        text.split('{')
            .skip(1)
            .filter_map(|rest| rest.split_once('}').map(|(name, _)| name))
            .filter(|name| {
                !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            })
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn every_placeholder_is_filled_from_the_config() {
        let config = config(&[
            ("DEFAULT_TIMEOUT_SECONDS", "77"),
            ("MAX_TIMEOUT_SECONDS", "999"),
            ("MAX_STDIN_BYTES", "2097152"),
        ]);
        let tools = with_limits(ScriptRunner::routes(), &config).list_all();
        assert_eq!(tools.len(), 11);
        // schemars keeps the doc comments' line breaks.
        let text = serde_json::to_string(&tools)
            .unwrap_or_default()
            .replace("\\n", " ");
        assert_eq!(placeholders_left(&text), Vec::<String>::new());
        let run = tools.iter().find(|t| t.name == "run_script");
        let description = run
            .and_then(|t| t.description.as_deref())
            .unwrap_or_default();
        assert!(description.contains("default 77 s"), "{description}");
        let timeout = run
            .and_then(|t| t.input_schema.get("properties"))
            .and_then(|p| p.get("timeout_seconds"))
            .and_then(|t| t.get("description"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        assert!(
            timeout.contains("default 77") && timeout.contains("999"),
            "{timeout}"
        );
        assert!(text.contains("at most 2 MiB"), "stdin limit not shown");
        assert!(
            text.contains("1000 files and 16 MiB"),
            "collect limits not shown"
        );
    }

    #[test]
    fn get_task_status_lists_every_reason_kind() {
        let tools = with_limits(ScriptRunner::routes(), &config(&[])).list_all();
        let description = tools
            .iter()
            .find(|t| t.name == "get_task_status")
            .and_then(|t| t.output_schema.as_ref())
            .and_then(|s| s.get("properties"))
            .and_then(|p| p.get("reason_kind"))
            .and_then(|k| k.get("description"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        // The list between "...branch on: " and "; null ...", word by word.
        let listed: Vec<&str> = description
            .split_once(": ")
            .and_then(|(_, rest)| rest.split_once(';'))
            .map(|(list, _)| {
                list.split([',', ' '])
                    .filter(|w| !w.is_empty() && *w != "or")
            })
            .into_iter()
            .flatten()
            .collect();
        let every: Vec<&str> = ReasonKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(listed, every, "{description}");
    }

    #[test]
    fn sizes_read_as_a_person_writes_them() {
        assert_eq!(size(16 << 20), "16 MiB");
        assert_eq!(size(32 << 10), "32 KiB");
        assert_eq!(size(1000), "1000 bytes");
        assert_eq!(size(0), "0 bytes");
    }
}
