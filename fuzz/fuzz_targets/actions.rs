//! Validation and reduction of arbitrary action sequences (one JSON action per
//! line) against a chat with an open input request and a pending tool call:
//! never panic, and a refused action leaves the state byte-identical.
#![no_main]

use std::collections::HashSet;

use ahp::reducers::{apply_action_to_chat, ReduceOutcome};
use ahp_types::actions::StateAction;
use ahp_types::state::ChatState;
use libfuzzer_sys::fuzz_target;
use tandem::channels::validate::client_chat_action;

fn base() -> ChatState {
    serde_json::from_str(include_str!("../base_chat.json")).expect("base state")
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut state = base();
    let mut used: HashSet<String> = ["turn-1".to_owned()].into();
    for line in text.lines().take(64) {
        let Ok(raw) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let action: StateAction = serde_json::from_value(raw.clone()).unwrap_or(StateAction::Unknown(raw));
        let before = serde_json::to_string(&state).expect("state serializes");
        if client_chat_action(&state, &action, "fuzz", &used).is_ok()
            && apply_action_to_chat(&mut state, &action) == ReduceOutcome::Applied
        {
            if let StateAction::ChatTurnStarted(a) = &action {
                used.insert(a.turn_id.clone());
            }
            continue;
        }
        assert_eq!(before, serde_json::to_string(&state).expect("state serializes"), "a refused action changed the state");
    }
});
