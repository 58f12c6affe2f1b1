//! JSON-RPC 2.0 framing for the AHP WebSocket: decoding one text frame into a
//! request or notification, and encoding replies and notifications as text.
//!
//! Requests are decoded into a loose shape first (`Incoming`) because a peer
//! may send any JSON; only the method's own params are decoded into the
//! `ahp-types` structs, so a bad param yields `-32602` with the request's id
//! instead of a parse failure that loses it.

pub mod errors;
pub mod methods;

use serde_json::Value;

pub use errors::RpcError;

/// One decoded client frame.
#[derive(Debug)]
pub struct Incoming {
    /// The JSON-RPC id; `None` for a notification. Kept as raw JSON so string
    /// and number ids are echoed back exactly as sent.
    pub id: Option<Value>,
    /// Method name, e.g. `subscribe`.
    pub method: String,
    /// Raw params (`null` when absent).
    pub params: Value,
}

/// Decode one text frame. On failure returns the error to send back, with the
/// id when one could be read (JSON-RPC: `null` when it could not).
pub fn decode(text: &str) -> Result<Incoming, (Value, RpcError)> {
    let value: Value = serde_json::from_str(text).map_err(|e| {
        (
            Value::Null,
            RpcError::parse_error(format!("invalid JSON: {e}")),
        )
    })?;
    let Value::Object(mut obj) = value else {
        return Err((
            Value::Null,
            RpcError::invalid_request("a JSON-RPC message must be a JSON object"),
        ));
    };
    let id = obj.remove("id");
    let reply_id = match &id {
        Some(v @ (Value::Number(_) | Value::String(_))) => v.clone(),
        _ => Value::Null,
    };
    if let Some(v) = &id {
        if !matches!(v, Value::Number(_) | Value::String(_) | Value::Null) {
            return Err((
                Value::Null,
                RpcError::invalid_request("`id` must be a number or a string"),
            ));
        }
    }
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err((
            reply_id,
            RpcError::invalid_request("`jsonrpc` must be \"2.0\""),
        ));
    }
    let method = match obj.remove("method") {
        Some(Value::String(m)) => m,
        Some(_) => {
            return Err((
                reply_id,
                RpcError::invalid_request("`method` must be a string"),
            ));
        }
        None => {
            // A response from the client (to a server request) carries no method.
            if obj.contains_key("result") || obj.contains_key("error") {
                return Ok(Incoming {
                    id,
                    method: String::new(),
                    params: Value::Object(obj),
                });
            }
            return Err((reply_id, RpcError::invalid_request("missing `method`")));
        }
    };
    let params = obj.remove("params").unwrap_or(Value::Null);
    if !matches!(params, Value::Object(_) | Value::Array(_) | Value::Null) {
        return Err((
            reply_id,
            RpcError::invalid_request("`params` must be an object or an array"),
        ));
    }
    Ok(Incoming {
        id: id.filter(|v| !v.is_null()),
        method,
        params,
    })
}

/// Encode a success response.
pub fn encode_result(id: &Value, result: &Value) -> String {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string()
}

/// Encode a success response whose `result` is already serialized JSON.
pub fn encode_raw_result(id: &Value, result_json: &str) -> String {
    let id = serde_json::to_string(id).unwrap_or_else(|_| "null".into());
    format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{result_json}}}")
}

/// Encode an error response.
pub fn encode_error(id: &Value, err: &RpcError) -> String {
    let mut error = serde_json::json!({"code": err.code, "message": err.message});
    if let Some(data) = &err.data {
        error["data"] = (**data).clone();
    }
    serde_json::json!({"jsonrpc": "2.0", "id": id, "error": error}).to_string()
}

/// Encode a notification.
pub fn encode_notification(method: &str, params: &Value) -> String {
    serde_json::json!({"jsonrpc": "2.0", "method": method, "params": params}).to_string()
}

/// Encode a server → client request (used for `tandem/*` calls to providers).
pub fn encode_request(id: u64, method: &str, params: &Value) -> String {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_request_and_notification() {
        let r = decode(
            r#"{"jsonrpc":"2.0","id":7,"method":"ping","params":{"channel":"ahp-root://"}}"#,
        )
        .expect("valid request");
        assert_eq!(r.id, Some(Value::from(7)));
        assert_eq!(r.method, "ping");
        let n = decode(r#"{"jsonrpc":"2.0","method":"dispatchAction","params":{}}"#)
            .expect("valid notification");
        assert!(n.id.is_none());
    }

    #[test]
    fn rejects_malformed_frames_with_the_right_codes() {
        let cases = [
            ("not json", errors::PARSE_ERROR, Value::Null),
            ("[1,2]", errors::INVALID_REQUEST, Value::Null),
            (
                r#"{"id":1,"method":"ping"}"#,
                errors::INVALID_REQUEST,
                Value::from(1),
            ),
            (
                r#"{"jsonrpc":"2.0","id":"a","method":5}"#,
                errors::INVALID_REQUEST,
                Value::from("a"),
            ),
            (
                r#"{"jsonrpc":"2.0","id":2}"#,
                errors::INVALID_REQUEST,
                Value::from(2),
            ),
            (
                r#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#,
                errors::INVALID_REQUEST,
                Value::Null,
            ),
            (
                r#"{"jsonrpc":"2.0","id":3,"method":"ping","params":5}"#,
                errors::INVALID_REQUEST,
                Value::from(3),
            ),
        ];
        for (frame, code, id) in cases {
            let (got_id, err) = decode(frame).expect_err(frame);
            assert_eq!(err.code, code, "{frame}");
            assert_eq!(got_id, id, "{frame}");
        }
    }

    #[test]
    fn raw_result_embeds_preserialized_json() {
        let s = encode_raw_result(&Value::from("x"), r#"{"a":1}"#);
        let v: Value = serde_json::from_str(&s).expect("valid json");
        assert_eq!(v["result"]["a"], 1);
        assert_eq!(v["id"], "x");
    }
}
