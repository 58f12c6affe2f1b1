//! JSON-RPC 2.0 framing for the AHP WebSocket: decoding one text frame into a
//! request or notification, and encoding replies and notifications as text.
//!
//! Requests are decoded into a loose shape first (`Incoming`) because a peer
//! may send any JSON; only the method's own params are decoded into the
//! `ahp-types` structs, so a bad param yields `-32602` with the request's id
//! instead of a parse failure that loses it.
//!
//! A well-formed request (every action a client dispatches) is read in one
//! pass that keeps its params as their raw text, so they are parsed once,
//! straight into the method's struct. Anything else — a malformed frame, a
//! field of the wrong type, a repeated key — is decoded again the thorough
//! way, which finds the error to send back; both ways accept exactly the
//! same frames and decode them to the same request.

pub(crate) mod action;
pub(crate) mod errors;
pub mod methods;

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
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
    /// The params, not yet decoded into the method's struct.
    pub params: Params,
}

/// A request's params before [`methods::decode_params`] reads them.
#[derive(Debug, Clone)]
pub enum Params {
    /// Parsed into a JSON value (`null` when absent).
    Value(Value),
    /// An object or array, as the client wrote it.
    Raw(Box<RawValue>),
}

/// The members of a request as they appear in the frame, for the one-pass
/// read. Any member of an unexpected JSON type fails it (and so does a
/// repeated member): the thorough decode then runs.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
}

/// The one-pass read of a well-formed request; `None` sends the frame to
/// the thorough decode (which also handles a client's responses).
fn decode_request(text: &str) -> Option<Incoming> {
    let e: Envelope<'_> = serde_json::from_str(text).ok()?;
    if e.jsonrpc.as_deref() != Some("2.0") {
        return None;
    }
    let method = e.method?.into_owned();
    let id = match e.id {
        None => None,
        Some(raw) => match serde_json::from_str::<Value>(raw.get()).ok()? {
            Value::Null => None,
            v @ (Value::Number(_) | Value::String(_)) => Some(v),
            _ => return None,
        },
    };
    let params = match e.params {
        // `Option` reads a `null` member as absent.
        None => Params::Value(Value::Null),
        Some(raw) if raw.get().starts_with(['{', '[']) => Params::Raw(raw.to_owned()),
        Some(_) => return None,
    };
    Some(Incoming { id, method, params })
}

/// Decode one text frame. On failure returns the error to send back, with the
/// id when one could be read (JSON-RPC: `null` when it could not).
pub fn decode(text: &str) -> Result<Incoming, (Value, RpcError)> {
    if let Some(incoming) = decode_request(text) {
        return Ok(incoming);
    }
    decode_thoroughly(text)
}

/// Decode one text frame through a JSON value, naming what is wrong with it.
fn decode_thoroughly(text: &str) -> Result<Incoming, (Value, RpcError)> {
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
                    params: Params::Value(Value::Object(obj)),
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
        params: Params::Value(params),
    })
}

/// Encode a success response.
pub fn encode_result(id: &Value, result: &Value) -> String {
    use std::fmt::Write;
    // Written straight out (every dispatched action is answered with one):
    // the same text as serializing the object, without building it.
    let mut out = String::with_capacity(48);
    let _ = write!(
        out,
        "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{result}}}"
    );
    out
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
    fn a_result_reads_as_the_serialized_object() {
        for (id, result) in [
            (Value::from(7), Value::Null),
            (
                Value::from("a\"b"),
                serde_json::json!({"x": [1, "é\n"], "a": null}),
            ),
        ] {
            assert_eq!(
                encode_result(&id, &result),
                serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string()
            );
        }
    }

    /// The one-pass read and the thorough decode agree on every frame the
    /// first accepts, and the first declines whatever the second refuses.
    #[test]
    fn the_one_pass_read_decodes_as_the_thorough_one() {
        let frames = [
            r#"{"jsonrpc":"2.0","id":7,"method":"dispatchAction","params":{"channel":"ahp-chat:/a","clientSeq":1,"action":{"type":"chat/draftChanged","draft":{"text":"x"}}}}"#,
            r#"{"method":"ping","jsonrpc":"2.0"}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"ping","params":null}"#,
            r#"{"jsonrpc":"2.0","id":"s","method":"subscribe","params":[1,2]}"#,
            r#"{"jsonrpc":"2\u002e0","id":1.5,"method":"p\u0069ng","extra":{"a":1}}"#,
            r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":true,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":3,"method":"ping","params":"x"}"#,
            r#"{"jsonrpc":"2.0","id":4,"result":{}}"#,
            r#"{"jsonrpc":"1.0","id":5,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":6,"method":7}"#,
        ];
        for frame in frames {
            let thorough = decode_thoroughly(frame);
            match decode_request(frame) {
                Some(fast) => {
                    let slow = thorough.expect(frame);
                    assert_eq!(fast.id, slow.id, "{frame}");
                    assert_eq!(fast.method, slow.method, "{frame}");
                    let as_value = |p: Params| match p {
                        Params::Value(v) => v,
                        Params::Raw(r) => serde_json::from_str(r.get()).expect("raw JSON"),
                    };
                    assert_eq!(as_value(fast.params), as_value(slow.params), "{frame}");
                }
                None => {
                    // Declined: either refused, or a frame only the thorough
                    // decode reads (a client's response, a repeated key).
                    if let Ok(slow) = thorough {
                        assert!(
                            slow.method.is_empty() || frame.contains(r#""id":1,"id":2"#),
                            "{frame}"
                        );
                    }
                }
            }
        }
        assert!(decode_request(frames[0]).is_some());
        assert!(decode_request(frames[4]).is_some());
    }

    #[test]
    fn raw_params_refused_read_as_before() {
        use ahp_types::commands::DispatchActionParams;
        let frame = r#"{"jsonrpc":"2.0","id":1,"method":"dispatchAction","params":{"channel":"ahp-chat:/a","clientSeq":"x","action":{}}}"#;
        let fast = decode(frame).expect("a well-formed request");
        assert!(matches!(fast.params, Params::Raw(_)));
        let slow = decode_thoroughly(frame).expect("a well-formed request");
        let a = methods::decode_params::<DispatchActionParams>("dispatchAction", fast.params)
            .expect_err("bad params");
        let b = methods::decode_params::<DispatchActionParams>("dispatchAction", slow.params)
            .expect_err("bad params");
        assert_eq!(a.code, errors::INVALID_PARAMS);
        assert_eq!(a.message, b.message);
        assert!(!a.message.contains("line"), "{}", a.message);
    }

    #[test]
    fn raw_result_embeds_preserialized_json() {
        let s = encode_raw_result(&Value::from("x"), r#"{"a":1}"#);
        let v: Value = serde_json::from_str(&s).expect("valid json");
        assert_eq!(v["result"]["a"], 1);
        assert_eq!(v["id"], "x");
    }
}
