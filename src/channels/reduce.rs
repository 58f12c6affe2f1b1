//! Reducing an action into a channel's state with the official reducer of
//! its kind; an action the reducer does not apply is a rejection.

use ahp::reducers::{
    apply_action_to_chat, apply_action_to_root, apply_action_to_session, ReduceOutcome,
};
use ahp_types::actions::StateAction;
use ahp_types::state::{ChatState, RootState, SessionState};

use super::validate::{action_type, Rejection};

/// A channel's state as the commit path sees it: reduced by one of the
/// official reducers and serialized as is for snapshots.
pub trait ChannelState: serde::Serialize {
    /// The channel kind, as named in rejection reasons.
    const KIND: &'static str;
    /// Appended to the reason of an action that changed nothing.
    const NO_EFFECT_HINT: &'static str = "";
    /// The official reducer for this kind of channel.
    fn apply(&mut self, action: &StateAction) -> ReduceOutcome;
}

impl ChannelState for ChatState {
    const KIND: &'static str = "chat";
    const NO_EFFECT_HINT: &'static str = " (unknown turn, part or id)";
    fn apply(&mut self, action: &StateAction) -> ReduceOutcome {
        apply_action_to_chat(self, action)
    }
}

impl ChannelState for SessionState {
    const KIND: &'static str = "session";
    fn apply(&mut self, action: &StateAction) -> ReduceOutcome {
        apply_action_to_session(self, action)
    }
}

impl ChannelState for RootState {
    const KIND: &'static str = "root";
    fn apply(&mut self, action: &StateAction) -> ReduceOutcome {
        apply_action_to_root(self, action)
    }
}

/// Reduce `action` into `state`; an action the reducer does not apply is a
/// rejection (and leaves the state as it was).
pub fn reduce<S: ChannelState>(state: &mut S, action: &StateAction) -> Result<(), Rejection> {
    match state.apply(action) {
        ReduceOutcome::Applied => Ok(()),
        ReduceOutcome::NoOp => Err(Rejection::new(format!(
            "`{}` has no effect on this {}{}",
            action_type(action),
            S::KIND,
            S::NO_EFFECT_HINT
        ))),
        ReduceOutcome::OutOfScope => Err(Rejection::new(format!(
            "`{}` is not a {} action",
            action_type(action),
            S::KIND
        ))),
        ReduceOutcome::Invalid(e) => Err(Rejection::new(e.to_string())),
    }
}
