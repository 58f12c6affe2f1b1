//! `tandem/openText` and `tandem/editText`: several people typing in one of
//! a chat's texts (see `channels::chat::texts`). An edit is checked like the
//! action it becomes — the connection may use the chat, speaks for a person,
//! and has dispatches left in its budget — and answered with the revision
//! it made once that is durable.

use actix::prelude::*;
use ahp_types::actions::{ChatInputAnswerChangedAction, StateAction};
use serde::Deserialize;
use serde_json::json;

use super::connection::Connection;
use super::routes::no_chat;
use crate::channels::chat::TextTarget;
use crate::channels::ChannelAddr;
use crate::coedit::TextOp;
use crate::ids::ChannelUri;
use crate::protocol::{errors, RpcError};

/// `tandem/openText` params.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OpenTextParams {
    /// The chat.
    pub channel: ChannelUri,
    /// `{"requestId", "questionId"}` or `{"draft": true}`.
    pub target: TextTarget,
}

/// `tandem/editText` params.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EditTextParams {
    /// The chat.
    pub channel: ChannelUri,
    /// Which text.
    pub target: TextTarget,
    /// The revision the edit was made on.
    pub base: u64,
    /// The editor's number for this edit: from 1, one more each time.
    pub seq: u64,
    /// The edit (`[5, "ab", -3]`).
    pub op: TextOp,
}

impl Connection {
    /// The editor this connection is: its client id.
    fn author(&self) -> Result<String, RpcError> {
        self.client_id
            .as_ref()
            .map(|c| c.to_string())
            .ok_or_else(|| RpcError::invalid_request("editing needs the connection's `clientId`"))
    }

    /// Refused unless this connection speaks for a person (an agent cannot
    /// type into an answer, as it cannot send `chat/inputAnswerChanged`).
    fn may_edit(&self, channel: &str) -> Result<(), RpcError> {
        self.permit(channel)?;
        let probe = StateAction::ChatInputAnswerChanged(ChatInputAnswerChangedAction {
            request_id: String::new(),
            question_id: String::new(),
            answer: None,
        });
        match self.persons_act_refusal(&probe) {
            Some(why) => Err(RpcError::new(errors::PERMISSION_DENIED, why)),
            None => Ok(()),
        }
    }

    /// `tandem/openText`.
    pub(super) fn open_text(
        &mut self,
        id: Option<serde_json::Value>,
        p: OpenTextParams,
        ctx: &mut Context<Self>,
    ) -> Result<(), RpcError> {
        self.may_edit(&p.channel)?;
        let author = self.author()?;
        let opened = self.ask(
            &p.channel,
            |c| c.open_text(p.target, author, false),
            no_chat,
        )?;
        self.reply_when(id, opened, ctx, |state| {
            serde_json::to_value(state).unwrap_or_default()
        });
        Ok(())
    }

    /// `tandem/editText`.
    pub(super) fn edit_text(
        &mut self,
        id: Option<serde_json::Value>,
        p: EditTextParams,
        frame_bytes: usize,
        ctx: &mut Context<Self>,
    ) -> Result<(), RpcError> {
        self.may_edit(&p.channel)?;
        let author = self.author()?;
        if p.seq == 0 {
            return Err(RpcError::invalid_params(
                "invalid params for `tandem/editText`: `seq` starts at 1",
            ));
        }
        let shared = self.app.shared.clone();
        let limits = &shared.config.limits;
        if frame_bytes > limits.max_action_bytes {
            return Err(RpcError::invalid_params(format!(
                "too large: a `tandem/editText` of {frame_bytes} bytes is over the limit of {} bytes",
                limits.max_action_bytes
            )));
        }
        if !self.take_dispatch_token(frame_bytes) {
            return Err(RpcError::invalid_request(format!(
                "rate limited: more than {} dispatches or {} bytes of actions per second",
                limits.dispatches_per_sec, limits.dispatch_bytes_per_sec
            )));
        }
        let by = self.person();
        let edit = |c: &ChannelAddr| c.edit_text(p.target, author, p.seq, p.base, p.op, by, false);
        let edited = self.ask(&p.channel, edit, no_chat)?;
        self.reply_when(id, edited, ctx, |rev| json!({ "rev": rev }));
        Ok(())
    }
}
