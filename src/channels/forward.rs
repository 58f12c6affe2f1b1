//! What one cluster node asks of another: a client's action or a request
//! on a channel the other node owns ([`crate::store::cluster`]), and the
//! answer. Encoded as JSON on the link.

use ahp_types::actions::{ActionOrigin, StateAction};
use serde::{Deserialize, Serialize};

use crate::channels::chat::TextTarget;
use crate::coedit::TextOp;
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
        /// The person who sent it, named by the forwarding node.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<crate::people::Person>,
    },
    /// `createSession`, placed on the node asked (it runs the session).
    #[serde(rename_all = "camelCase")]
    CreateSession {
        /// The new session's URI.
        session: String,
        /// Its agent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        provider: Option<String>,
        /// The token subject that owns it.
        owner: String,
        /// Sessions that subject may own at once.
        max_sessions: usize,
    },
    /// `createChat` in `session`.
    CreateChat {
        /// Session URI.
        session: String,
        /// The new chat's URI.
        chat: String,
        /// Who asks (`None`: the host), for the owner to check.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<crate::people::Person>,
    },
    /// `disposeChat` of one of `session`'s chats.
    DisposeChat {
        /// Session URI.
        session: String,
        /// The chat.
        chat: String,
        /// Who asks (`None`: the host), for the owner to check.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<crate::people::Person>,
    },
    /// `disposeSession`.
    DisposeSession {
        /// Session URI.
        session: String,
        /// Who asks (`None`: the host), for the owner to check.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<crate::people::Person>,
    },
    /// `tandem/setAccess` in `session`.
    SetAccess {
        /// Session URI.
        session: String,
        /// Whose level.
        subject: String,
        /// The level (`None`: remove the entry).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        access: Option<crate::people::Access>,
        /// Who asks (`None`: the host), for the owner to check.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<crate::people::Person>,
    },
    /// A change to `session`'s invite links.
    Invites {
        /// Session URI.
        session: String,
        /// The change.
        change: crate::channels::session::InviteOp,
        /// Who asks, for the owner to check.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<crate::people::Person>,
    },
    /// Hand `session` (and its chats) over to the asking node, where its
    /// agent's provider is connected, or where most of its watchers are.
    Handoff {
        /// Session URI.
        session: String,
        /// The connections watching the session or its chats on the asking
        /// node (`None`: the session's agent is connected there).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        watchers: Option<usize>,
    },
    /// `tandem/openText` on `channel` (a chat) for `author`.
    OpenText {
        /// Chat URI.
        channel: String,
        /// Which text.
        target: TextTarget,
        /// The editor (its connection's client id).
        author: String,
    },
    /// `tandem/editText` on `channel` (a chat): `author`'s edit `seq`
    /// made on revision `base`.
    EditText {
        /// Chat URI.
        channel: String,
        /// Which text.
        target: TextTarget,
        /// The editor.
        author: String,
        /// The editor's number for the edit.
        seq: u64,
        /// The revision it was made on.
        base: u64,
        /// The edit.
        edit: TextOp,
        /// Who asks (`None`: the host), for the owner to check.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<crate::people::Person>,
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
        /// The error's data, if it has some.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<serde_json::Value>,
    },
    /// This node does not own the channel (any more).
    NotOwner,
    /// The request's result.
    Value {
        /// What the owner answered.
        value: serde_json::Value,
    },
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

/// Hand `request` to the node that owns `channel` over `link` (`None`:
/// this node is not in a cluster) and wait for its answer.
pub async fn ask_owner(
    link: Option<std::sync::Arc<dyn crate::store::cluster::ClusterLink>>,
    channel: &crate::ids::ChannelUri,
    request: ForwardRequest,
) -> Result<ForwardReply, RpcError> {
    let link = link.ok_or_else(|| RpcError::internal("not a cluster node"))?;
    let body = link
        .forward(channel, request.encode())
        .await
        .map_err(RpcError::internal)?;
    Ok(ForwardReply::decode(&body))
}

impl ForwardReply {
    /// The answer on the wire.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// An answer off the wire (one that does not decode is a failure).
    pub fn decode(body: &[u8]) -> Self {
        serde_json::from_slice(body).unwrap_or_else(|e| {
            ForwardReply::failed(RpcError::internal(format!(
                "the owner's answer does not decode: {e}"
            )))
        })
    }

    /// A failed request's answer.
    pub fn failed(e: RpcError) -> Self {
        ForwardReply::Failed {
            code: e.code,
            message: e.message,
            data: e.data.map(|d| *d),
        }
    }

    /// A request's outcome as an answer.
    pub fn of(res: Result<(), RpcError>) -> Self {
        match res {
            Ok(()) => ForwardReply::Done,
            Err(e) => ForwardReply::failed(e),
        }
    }

    /// A request's result as an answer.
    pub fn of_value<T: Serialize>(res: Result<T, RpcError>) -> Self {
        match res
            .and_then(|v| serde_json::to_value(v).map_err(|e| RpcError::internal(e.to_string())))
        {
            Ok(value) => ForwardReply::Value { value },
            Err(e) => ForwardReply::failed(e),
        }
    }

    /// The answer as a request's outcome.
    pub fn into_result(self) -> Result<(), RpcError> {
        self.into_value().map(|_| ())
    }

    /// The answer as a request's result (`Done` is `null`).
    pub fn into_value(self) -> Result<serde_json::Value, RpcError> {
        match self {
            ForwardReply::Done => Ok(serde_json::Value::Null),
            ForwardReply::Value { value } => Ok(value),
            ForwardReply::Rejected { reason } => Err(RpcError::invalid_request(reason)),
            ForwardReply::Failed {
                code,
                message,
                data,
            } => Err(match data {
                Some(d) => RpcError::new(code, message).with_data(d),
                None => RpcError::new(code, message),
            }),
            ForwardReply::NotOwner => Err(RpcError::internal(
                "the channel is changing hands between nodes; try again",
            )),
        }
    }

    /// The answer as a request's result of type `T`.
    pub fn into_typed<T: serde::de::DeserializeOwned>(self) -> Result<T, RpcError> {
        let value = self.into_value()?;
        serde_json::from_value(value)
            .map_err(|e| RpcError::internal(format!("the owner's answer does not decode: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_requests_and_answers_cross_the_link_whole() {
        let edit = ForwardRequest::EditText {
            channel: "ahp-chat:/c".into(),
            target: TextTarget::Draft { draft: true },
            author: "ann".into(),
            seq: 3,
            base: 7,
            edit: serde_json::from_value(json!([2, "ab", -1])).unwrap(),
            by: Some(crate::people::Person {
                name: "Ann".into(),
                subject: "ann".into(),
                client_id: "ann-laptop".into(),
                standing: crate::people::Standing {
                    admin: false,
                    grants: [("ahp-session:/s".into(), crate::people::Access::Viewer)].into(),
                },
            }),
        };
        let back = ForwardRequest::decode(&edit.encode()).unwrap();
        assert_eq!(
            serde_json::to_value(&back).unwrap(),
            serde_json::to_value(&edit).unwrap()
        );

        let conflict = RpcError::new(crate::protocol::errors::CONFLICT, "re-base")
            .with_data(json!({"text": "abc", "rev": 9, "taken": 2}));
        let answer = ForwardReply::decode(&ForwardReply::failed(conflict).encode());
        let e = answer.into_value().unwrap_err();
        assert_eq!(e.code, crate::protocol::errors::CONFLICT);
        assert_eq!(
            e.data.as_deref(),
            Some(&json!({"text": "abc", "rev": 9, "taken": 2}))
        );

        let rev = ForwardReply::decode(&ForwardReply::of_value(Ok(12u64)).encode());
        assert_eq!(rev.into_typed::<u64>().unwrap(), 12);
        // A plain refusal carries no data.
        let refused = ForwardReply::of(Err(RpcError::invalid_request("settled")));
        assert!(!String::from_utf8(refused.encode())
            .unwrap()
            .contains("data"));
    }
}
