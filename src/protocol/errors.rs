//! JSON-RPC and AHP error codes, and the error value every handler returns.

use serde_json::Value;

pub use ahp_types::errors::ahp_error_codes::*;
pub use ahp_types::errors::json_rpc_error_codes::*;

/// An error answered to a JSON-RPC request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message} ({code})")]
pub struct RpcError {
    /// JSON-RPC or AHP error code.
    pub code: i32,
    /// Human-readable reason.
    pub message: String,
    /// Optional structured detail (boxed: errors travel in `Err` variants).
    pub data: Option<Box<Value>>,
}

impl RpcError {
    /// Build an error with a code and message.
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// Attach structured data.
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(Box::new(data));
        self
    }

    /// `-32700`.
    pub fn parse_error(message: impl Into<String>) -> Self {
        Self::new(PARSE_ERROR, message)
    }

    /// `-32600`.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(INVALID_REQUEST, message)
    }

    /// `-32601`.
    pub fn method_not_found(method: &str) -> Self {
        Self::new(METHOD_NOT_FOUND, format!("method not found: {method}"))
    }

    /// `-32602`.
    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(INVALID_PARAMS, message)
    }

    /// `-32603`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(INTERNAL_ERROR, message)
    }
}
