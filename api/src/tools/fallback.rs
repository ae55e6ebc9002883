//! The answer to a request rmcp could not parse into one of its own types.
//!
//! rmcp parses every method it knows into its own type, and hands a request it
//! cannot parse to `on_custom_request` as an unknown method. Under a known name
//! that means params of the wrong shape: answer -32602 with what is wrong, as
//! JSON-RPC asks, rather than "method not found".

use rmcp::ErrorData as McpError;
use rmcp::model::{
    CallToolRequest, CancelTaskRequest, CustomRequest, ErrorCode as RpcCode, GetTaskRequest,
    InitializeRequest, ListToolsRequest,
};

use super::error::ErrorCode;

/// The JSON-RPC error for `request`, with our code as its `data`.
pub fn refuse(request: CustomRequest) -> McpError {
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
    match why {
        Some(e) => McpError::invalid_params(
            format!("invalid params for {method}: {e}"),
            Some(ErrorCode::InvalidArgument.data()),
        ),
        None => McpError::new(
            RpcCode::METHOD_NOT_FOUND,
            format!("method not found: {method}"),
            Some(ErrorCode::UnknownMethod.data()),
        ),
    }
}
