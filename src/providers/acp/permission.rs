//! `session/request_permission` as a tool approval: the agent's own options
//! are what people choose from, and exactly one answer goes back — the
//! option chosen, the agent's matching option when the session's policy
//! decided, or ACP's `cancelled` when the turn was cancelled or the request
//! could not be put to anyone.

use agent_client_protocol::v1::schema::{
    PermissionOptionKind, RequestPermissionOutcome, RequestPermissionRequest,
    RequestPermissionResponse, SelectedPermissionOutcome,
};

use crate::interactions::{Interaction, Outcome, Settlement, ToolOption, ToolOptionKind};

use super::map::json_of;

/// The tool approval people see for `request`. The tool's name (what
/// session grants and denials are kept by) is the agent's tool name when it
/// gives one, else the call's title.
pub fn interaction(request: &RequestPermissionRequest) -> Interaction {
    let f = &request.tool_call.fields;
    let tool_name = f
        .name
        .clone()
        .or_else(|| f.title.clone())
        .unwrap_or_else(|| "tool call".to_owned());
    let input = f
        .raw_input
        .as_ref()
        .map(|v| v.to_string())
        .unwrap_or_else(|| "{}".to_owned());
    Interaction::ToolApproval {
        tool_call_id: request.tool_call.tool_call_id.to_string(),
        tool_name,
        input,
        read_only: false,
        editable: false,
        options: Some(options(request)),
        title: f.title.clone(),
    }
}

/// The agent's options as tool options.
pub fn options(request: &RequestPermissionRequest) -> Vec<ToolOption> {
    request
        .options
        .iter()
        .map(|o| ToolOption {
            id: o.option_id.to_string(),
            label: o.name.clone(),
            kind: kind_of(o.kind),
        })
        .collect()
}

fn kind_of(kind: PermissionOptionKind) -> ToolOptionKind {
    match kind {
        PermissionOptionKind::AllowOnce => ToolOptionKind::AllowOnce,
        PermissionOptionKind::AllowAlways => ToolOptionKind::AllowAlways,
        PermissionOptionKind::RejectAlways => ToolOptionKind::RejectAlways,
        _ => ToolOptionKind::RejectOnce,
    }
}

/// Whether the settlement lets the call run.
pub fn approved(s: &Settlement) -> bool {
    s.outcome == Outcome::Approved
}

/// ACP's `cancelled` answer.
pub fn cancelled() -> RequestPermissionResponse {
    RequestPermissionResponse::new(RequestPermissionOutcome::Cancelled)
}

/// The one answer the agent gets for `request`, settled as `s`.
pub fn answer(request: &RequestPermissionRequest, s: &Settlement) -> RequestPermissionResponse {
    let offered = options(request);
    let allow = match s.outcome {
        Outcome::Approved => true,
        Outcome::Denied => false,
        _ => return cancelled(),
    };
    // The option a person chose, if it is the agent's own.
    let chosen = s
        .selected_option_id
        .as_deref()
        .and_then(|id| offered.iter().find(|o| o.id == id))
        .filter(|o| o.kind.allows() == allow);
    // Decided by the session's policy: the agent's once-option of that
    // direction, else its always-option.
    let preference = if allow {
        [ToolOptionKind::AllowOnce, ToolOptionKind::AllowAlways]
    } else {
        [ToolOptionKind::RejectOnce, ToolOptionKind::RejectAlways]
    };
    let fallback = || {
        preference
            .iter()
            .find_map(|k| offered.iter().find(|o| o.kind == *k))
    };
    match chosen.or_else(fallback) {
        Some(o) => RequestPermissionResponse::new(RequestPermissionOutcome::Selected(
            SelectedPermissionOutcome::new(o.id.clone()),
        )),
        None => {
            tracing::debug!(request = %json_of(request), "no option of the decided kind; answering cancelled");
            cancelled()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request() -> RequestPermissionRequest {
        serde_json::from_value(json!({
            "sessionId": "s-1",
            "toolCall": {"toolCallId": "tc-1", "title": "Run x", "rawInput": {"tool": "x"}},
            "options": [
                {"optionId": "a1", "name": "Allow once", "kind": "allow_once"},
                {"optionId": "a2", "name": "Always allow", "kind": "allow_always"},
                {"optionId": "r1", "name": "Reject", "kind": "reject_once"},
                {"optionId": "r2", "name": "Always reject", "kind": "reject_always"}
            ]
        }))
        .expect("a valid request")
    }

    fn selected(r: &RequestPermissionResponse) -> Value {
        json_of(&r.outcome)
    }
    use serde_json::Value;

    #[test]
    fn people_choose_from_the_agents_own_options() {
        let Interaction::ToolApproval {
            tool_name,
            input,
            options,
            ..
        } = interaction(&request())
        else {
            panic!("a tool approval");
        };
        assert_eq!(tool_name, "Run x");
        assert_eq!(input, r#"{"tool":"x"}"#);
        let kinds: Vec<_> = options
            .iter()
            .flatten()
            .map(|o| (o.id.as_str(), o.kind))
            .collect();
        assert_eq!(
            kinds,
            [
                ("a1", ToolOptionKind::AllowOnce),
                ("a2", ToolOptionKind::AllowAlways),
                ("r1", ToolOptionKind::RejectOnce),
                ("r2", ToolOptionKind::RejectAlways)
            ]
        );
    }

    #[test]
    fn the_answer_is_the_chosen_option_or_the_policys_or_cancelled() {
        let r = request();
        let chose = |outcome, id: Option<&str>| Settlement {
            selected_option_id: id.map(str::to_owned),
            ..Settlement::bare(outcome)
        };
        let picked = |s: &Settlement| selected(&answer(&r, s));
        assert_eq!(
            picked(&chose(Outcome::Approved, Some("a2")))["optionId"],
            "a2"
        );
        assert_eq!(
            picked(&chose(Outcome::Denied, Some("r2")))["optionId"],
            "r2"
        );
        // Decided by the session's mode, a grant or a denial.
        assert_eq!(picked(&chose(Outcome::Approved, None))["optionId"], "a1");
        assert_eq!(picked(&chose(Outcome::Denied, None))["optionId"], "r1");
        // Cancelled turn, aborted request: ACP's cancelled outcome.
        for o in [Outcome::Interrupted, Outcome::Aborted, Outcome::TimedOut] {
            assert_eq!(picked(&chose(o, None))["outcome"], "cancelled");
        }
    }
}
