//! What one cluster node asks of another: a client's action or a request
//! on a channel the other node owns ([`crate::store::cluster`]), and the
//! answer. Encoded as JSON on the link.

use ahp_types::actions::{ActionOrigin, StateAction};
use serde::{Deserialize, Serialize};

use crate::protocol::RpcError;

/// A request forwarded to the owner of a channel.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum ForwardRequest {
    /// `dispatchAction` on `channel`.
    #[serde(rename_all = "camelCase")]
    Dispatch {
        /// Channel URI.
        channel: String,
        /// The dispatching client.
        origin: ActionOrigin,
        /// The action (a `StateAction`).
        action: serde_json::Value,
        /// Checked as the session's agent's.
        as_agent: bool,
    },
    /// `createChat` in `session`.
    CreateChat {
        /// Session URI.
        session: String,
        /// The new chat's URI.
        chat: String,
    },
    /// `disposeChat` of one of `session`'s chats.
    DisposeChat {
        /// Session URI.
        session: String,
        /// The chat.
        chat: String,
    },
    /// `disposeSession`.
    DisposeSession {
        /// Session URI.
        session: String,
    },
    /// Hand `session` (and its chats) over to the asking node, where its
    /// agent's provider is connected.
    Handoff {
        /// Session URI.
        session: String,
    },
}

/// The owner's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "camelCase")]
pub enum ForwardReply {
    /// Done (an action: journaled and published).
    Done,
    /// The action was rejected.
    Rejected {
        /// Why.
        reason: String,
    },
    /// The request failed.
    Failed {
        /// JSON-RPC error code.
        code: i32,
        /// Why.
        message: String,
    },
    /// This node does not own the channel (any more).
    NotOwner,
}

impl ForwardRequest {
    /// The request on the wire.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// A request off the wire.
    pub fn decode(body: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(body)
            .map_err(|e| format!("a forwarded request does not decode: {e}"))
    }

    /// The action of a dispatch, decoded.
    pub fn action(value: serde_json::Value) -> StateAction {
        serde_json::from_value(value.clone()).unwrap_or(StateAction::Unknown(value))
    }
}

impl ForwardReply {
    /// The answer on the wire.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// An answer off the wire (one that does not decode is a failure).
    pub fn decode(body: &[u8]) -> Self {
        serde_json::from_slice(body).unwrap_or_else(|e| ForwardReply::Failed {
            code: crate::protocol::errors::INTERNAL_ERROR,
            message: format!("the owner's answer does not decode: {e}"),
        })
    }

    /// A request's outcome as an answer.
    pub fn of(res: Result<(), RpcError>) -> Self {
        match res {
            Ok(()) => ForwardReply::Done,
            Err(e) => ForwardReply::Failed {
                code: e.code,
                message: e.message,
            },
        }
    }

    /// The answer as a request's outcome.
    pub fn into_result(self) -> Result<(), RpcError> {
        match self {
            ForwardReply::Done => Ok(()),
            ForwardReply::Rejected { reason } => Err(RpcError::invalid_request(reason)),
            ForwardReply::Failed { code, message } => Err(RpcError::new(code, message)),
            ForwardReply::NotOwner => Err(RpcError::internal(
                "the channel is changing hands between nodes; try again",
            )),
        }
    }
}
