//! Method names the server answers, and typed decoding of their params.

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{Params, RpcError};

pub const INITIALIZE: &str = "initialize";
pub const RECONNECT: &str = "reconnect";
pub const PING: &str = "ping";
pub const SUBSCRIBE: &str = "subscribe";
pub const UNSUBSCRIBE: &str = "unsubscribe";
pub const DISPATCH_ACTION: &str = "dispatchAction";
pub const CREATE_SESSION: &str = "createSession";
pub const DISPOSE_SESSION: &str = "disposeSession";
pub const LIST_SESSIONS: &str = "listSessions";
pub const CREATE_CHAT: &str = "createChat";
pub const DISPOSE_CHAT: &str = "disposeChat";
pub const FETCH_TURNS: &str = "fetchTurns";
pub const SESSION_CONFIG_COMPLETIONS: &str = "sessionConfigCompletions";
/// Tandem extension: an agent connection registers a provider.
pub const REGISTER_PROVIDER: &str = "tandem/registerProvider";
/// Tandem extension: a provider waits for a person.
pub const REQUEST_INTERACTION: &str = "tandem/requestInteraction";
/// Tandem extension: the unsettled interactions of a session.
pub const LIST_PENDING: &str = "tandem/listPending";
/// Tandem extension: a text of a chat to edit together, and its revision.
pub const OPEN_TEXT: &str = "tandem/openText";
/// Tandem extension: one editor's edit of a chat's text.
pub const EDIT_TEXT: &str = "tandem/editText";
/// Tandem extension: where this connection's person is in a chat.
pub const SET_PRESENCE: &str = "tandem/setPresence";
/// Tandem extension: everyone present on a chat.
pub const LIST_PRESENCE: &str = "tandem/listPresence";
/// Tandem extension: name this connection's person (without
/// authentication).
pub const SET_NAME: &str = "tandem/setName";
/// Tandem extension: who the caller is in a session and what they may do.
pub const ACCESS: &str = "tandem/access";
/// Tandem extension: an owner sets what someone may do in a session.
pub const SET_ACCESS: &str = "tandem/setAccess";
/// Tandem extension: an owner makes an invite link for a session.
pub const CREATE_INVITE: &str = "tandem/createInvite";
/// Tandem extension: a session's invite links.
pub const LIST_INVITES: &str = "tandem/listInvites";
/// Tandem extension: an owner ends an invite link.
pub const REVOKE_INVITE: &str = "tandem/revokeInvite";
/// Tandem extension: a page of a session's audit log.
pub const AUDIT_LOG: &str = "tandem/auditLog";
/// Tandem extension: the caller's notification settings (and the Web Push
/// key).
pub const NOTIFY_SETTINGS: &str = "tandem/notifySettings";
/// Tandem extension: the caller's notification choice for a session.
pub const SET_NOTIFY: &str = "tandem/setNotify";
/// Tandem extension: register a browser for Web Push.
pub const PUSH_SUBSCRIBE: &str = "tandem/pushSubscribe";
/// Tandem extension: forget a browser registered for Web Push.
pub const PUSH_UNSUBSCRIBE: &str = "tandem/pushUnsubscribe";

/// Decode a method's params into its `ahp-types` struct; a mismatch is
/// `-32602 Invalid params` naming the method and serde's reason.
pub fn decode_params<T: DeserializeOwned>(method: &str, params: Params) -> Result<T, RpcError> {
    let value = match params {
        Params::Value(v) => v,
        Params::Raw(raw) => match serde_json::from_str(raw.get()) {
            Ok(p) => return Ok(p),
            // Read again as a value: the error then reads as it always has
            // (no position in the frame), and a repeated key counts once.
            Err(_) => serde_json::from_str(raw.get()).unwrap_or(Value::Null),
        },
    };
    serde_json::from_value(value)
        .map_err(|e| RpcError::invalid_params(format!("invalid params for `{method}`: {e}")))
}
