//! Reading a `dispatchAction`'s params, the frequent action types straight
//! from the frame's text.
//!
//! `StateAction` is an internally tagged enum with an untagged fallback
//! (`Unknown`), so its derived `Deserialize` first copies the whole action
//! into serde's buffered `Content` tree (an allocation per key and string),
//! then reads the variant out of that copy. A draft keystroke or an
//! agent's streamed delta paid for that on every frame. Here the `type` is
//! read first, and the action types agents stream and people type are
//! read straight into their struct from the text. Anything else — another
//! type, a missing or repeated `type`, a body the struct refuses, params
//! that do not fit — goes through the derived path, so what is accepted,
//! what becomes `Unknown`, and every error text stay exactly as they were.

use std::borrow::Cow;

use ahp_types::actions::StateAction;
use ahp_types::commands::DispatchActionParams;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::methods::{decode_params, DISPATCH_ACTION};
use super::{Params, RpcError};

/// `dispatchAction` params with the action left as text.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Direct<'a> {
    channel: String,
    client_seq: i64,
    #[serde(borrow)]
    action: &'a RawValue,
}

/// Only an action's `type` (every other member skipped, a repeated `type`
/// refused).
#[derive(Deserialize)]
struct Tag<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
}

/// The action types read straight into their struct: what people type
/// and agents stream, turn by turn.
macro_rules! direct_types {
    ($($tag:literal => $variant:ident),* $(,)?) => {
        /// Their `type` values.
        #[cfg(test)]
        pub(super) const DIRECT_TYPES: &[&str] = &[$($tag),*];

        /// The action of type `kind` read from `raw`, if `kind` is one of
        /// them and its struct takes `raw`.
        fn by_type(kind: &str, raw: &str) -> Option<StateAction> {
            match kind {
                $($tag => serde_json::from_str(raw).ok().map(StateAction::$variant),)*
                _ => None,
            }
        }
    };
}

direct_types! {
    "chat/draftChanged" => ChatDraftChanged,
    "chat/inputAnswerChanged" => ChatInputAnswerChanged,
    "chat/delta" => ChatDelta,
    "chat/reasoning" => ChatReasoning,
    "chat/responsePart" => ChatResponsePart,
    "chat/toolCallStart" => ChatToolCallStart,
    "chat/toolCallDelta" => ChatToolCallDelta,
    "chat/turnComplete" => ChatTurnComplete,
    "chat/usage" => ChatUsage,
    "chat/activityChanged" => ChatActivityChanged,
    "chat/isReadChanged" => ChatIsReadChanged,
}

/// The action in `raw` if it is of one of the direct types and its struct
/// takes it; `None` sends it through the derived path.
pub(super) fn direct_action(raw: &str) -> Option<StateAction> {
    let tag: Tag<'_> = serde_json::from_str(raw).ok()?;
    by_type(&tag.kind, raw)
}

/// Decode `dispatchAction` params: once their members are read, the action
/// directly when it is of a direct type, else through its derived decode
/// (from its own text: the params are not read again); params that do not
/// fit go to [`decode_params`] (same result, same errors).
pub fn decode_dispatch(params: Params) -> Result<DispatchActionParams, RpcError> {
    if let Params::Raw(raw) = &params {
        if let Ok(p) = serde_json::from_str::<Direct<'_>>(raw.get()) {
            let text = p.action.get();
            let action = direct_action(text).or_else(|| serde_json::from_str(text).ok());
            if let Some(action) = action {
                return Ok(DispatchActionParams {
                    channel: p.channel,
                    client_seq: p.client_seq,
                    action,
                });
            }
        }
    }
    decode_params(DISPATCH_ACTION, params)
}

#[cfg(test)]
#[path = "action_tests.rs"]
mod tests;
