//! Who we are, and every result saying so: MCP 2026-07-28 asks servers to put
//! `io.modelcontextprotocol/serverInfo` (name and version) in each result's
//! `_meta`. rmcp does so only for `server/discover`; `stamp` does it for the
//! results our handlers build (`server`).
//!
//! Not stamped, since rmcp builds them after our handler returns and offers no
//! hook: the empty results of `ping` and `tasks/cancel`.

use std::sync::LazyLock;

use rmcp::model::{Implementation, MetaObject};
use serde_json::Value;

/// The `_meta` key of the server's identity in a result.
pub const SERVER_INFO_META_KEY: &str = "io.modelcontextprotocol/serverInfo";

/// This server's name, version and title.
pub fn implementation() -> Implementation {
    Implementation::new("script-runner", env!("CARGO_PKG_VERSION"))
        .with_title("script-runner: run scripts in disposable containers")
}

static INFO: LazyLock<Value> =
    LazyLock::new(|| serde_json::to_value(implementation()).unwrap_or(Value::Null));

/// Adds the server's identity to a result's `_meta`.
pub fn stamp(meta: &mut Option<MetaObject>) {
    if !INFO.is_null() {
        meta.get_or_insert_default()
            .insert(SERVER_INFO_META_KEY.to_owned(), INFO.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stamp_names_the_server_and_its_version() {
        let mut meta = None;
        stamp(&mut meta);
        let info = meta.and_then(|m| m.get(SERVER_INFO_META_KEY).cloned());
        let info = info.unwrap_or_default();
        assert_eq!(info["name"], "script-runner");
        assert_eq!(info["version"], env!("CARGO_PKG_VERSION"));
    }
}
