//! The approval policy of a session (`docs/protocol.md`, "Approval
//! policy") as pure functions over the session's config and `_meta`: which
//! mode is configured and which is in effect, when a tool call is confirmed
//! without asking, and how a grant is recorded. The session and chat actors
//! call these; the state they read and write is published and journaled like
//! any other, so the policy survives a restart.

use ahp_types::state::{
    SessionConfigPropertySchema, SessionConfigState, ToolCallConfirmationReason,
};
use serde_json::{Map, Value};

use crate::people::Person;

/// Session config key for the approval mode.
pub const APPROVAL_MODE: &str = "approvalMode";
/// `_meta` key: the approval mode in effect (it follows the configured one at
/// the next approval checkpoint).
pub const EFFECTIVE_MODE_META: &str = "tandem/effectiveApprovalMode";
/// `_meta` key: tool names approved for the whole session.
pub const GRANTS_META: &str = "tandem/toolGrants";
/// `_meta` key: tool names refused for the whole session.
pub const DENIALS_META: &str = "tandem/toolDenials";
/// The default mode: tool calls that change data wait for a person.
pub const ASK: &str = "ask";
/// The mode where tool calls run without asking.
pub const ALWAYS_ALLOW: &str = "always-allow";

/// The session config property that declares the approval mode.
pub fn approval_mode_property() -> SessionConfigPropertySchema {
    SessionConfigPropertySchema {
        r#type: "string".into(),
        title: "Approval mode".into(),
        description: Some("`ask`: tool calls that change data wait for a person. `always-allow`: they run without asking.".into()),
        default: Some(Value::from(ASK)),
        r#enum: Some(vec![Value::from(ASK), Value::from(ALWAYS_ALLOW)]),
        enum_labels: Some(vec!["Ask".into(), "Always allow".into()]),
        enum_descriptions: None,
        read_only: None,
        items: None,
        min_items: None,
        max_items: None,
        properties: None,
        required: None,
        additional_properties: None,
        enum_dynamic: None,
        session_mutable: Some(true),
    }
}

/// The `_meta` of a new session: the default mode in effect, no grants.
pub fn initial_meta() -> Map<String, Value> {
    Map::from_iter([
        (EFFECTIVE_MODE_META.to_owned(), Value::from(ASK)),
        (GRANTS_META.to_owned(), Value::Array(Vec::new())),
    ])
}

/// The mode the session's config asks for (`ask` when unset).
pub fn configured_mode(config: Option<&SessionConfigState>) -> &str {
    config
        .and_then(|c| c.values.get(APPROVAL_MODE))
        .and_then(Value::as_str)
        .unwrap_or(ASK)
}

/// At an approval checkpoint the configured mode becomes the effective one:
/// the session's new `_meta` when that changes it, `None` when the mode is
/// already in effect (nothing is published).
pub fn checkpoint(
    meta: Option<&Map<String, Value>>,
    configured: &str,
) -> Option<Map<String, Value>> {
    let effective = meta
        .and_then(|m| m.get(EFFECTIVE_MODE_META))
        .and_then(Value::as_str);
    if effective == Some(configured) {
        return None;
    }
    let mut meta = meta.cloned().unwrap_or_default();
    meta.insert(EFFECTIVE_MODE_META.to_owned(), Value::from(configured));
    Some(meta)
}

/// Whether calls of `tool` are approved for the whole session.
pub fn granted(meta: Option<&Map<String, Value>>, tool: &str) -> bool {
    listed(meta, GRANTS_META, tool)
}

/// Whether calls of `tool` are refused for the whole session ("reject
/// always" on an agent's own options).
pub fn denied(meta: Option<&Map<String, Value>>, tool: &str) -> bool {
    listed(meta, DENIALS_META, tool)
}

/// Record a grant for `tool` (taking back a denial of it): the session's new
/// `_meta`, or `None` when the tool is granted already.
pub fn grant(meta: Option<&Map<String, Value>>, tool: &str) -> Option<Map<String, Value>> {
    record(meta, GRANTS_META, DENIALS_META, tool)
}

/// Record a denial for `tool` (taking back a grant of it): the session's new
/// `_meta`, or `None` when the tool is denied already.
pub fn deny(meta: Option<&Map<String, Value>>, tool: &str) -> Option<Map<String, Value>> {
    record(meta, DENIALS_META, GRANTS_META, tool)
}

/// `_meta` key of who decided each granted or denied tool: tool name →
/// `{by, at, allow}`.
pub const DECIDED_BY_META: &str = "tandem/toolDecidedBy";

/// `_meta` key of who last changed each session config property: property
/// → `{by, at}`.
pub const CONFIG_BY_META: &str = "tandem/configChangedBy";

/// Note in `meta` that `by` granted (`allow`) or denied `tool` for the
/// session, now.
pub fn record_decider(meta: &mut Map<String, Value>, tool: &str, allow: bool, by: &Person) {
    let entry =
        serde_json::json!({"by": by.to_json(), "at": crate::time::now_rfc3339(), "allow": allow});
    by_key(meta, DECIDED_BY_META).insert(tool.to_owned(), entry);
}

/// Note in `meta` that `by` changed the config properties `keys`, now.
pub fn record_config_change<'a>(
    meta: &mut Map<String, Value>,
    keys: impl IntoIterator<Item = &'a String>,
    by: &Person,
) {
    let at = crate::time::now_rfc3339();
    let changed = by_key(meta, CONFIG_BY_META);
    for k in keys {
        changed.insert(k.clone(), serde_json::json!({"by": by.to_json(), "at": at}));
    }
}

/// The object under `key` in `meta`, made if missing (or not an object).
fn by_key<'m>(meta: &'m mut Map<String, Value>, key: &str) -> &'m mut Map<String, Value> {
    let slot = meta
        .entry(key.to_owned())
        .or_insert_with(|| Value::Object(Map::new()));
    if !slot.is_object() {
        *slot = Value::Object(Map::new());
    }
    slot.as_object_mut().expect("made an object above")
}

fn listed(meta: Option<&Map<String, Value>>, key: &str, tool: &str) -> bool {
    meta.and_then(|m| m.get(key))
        .and_then(Value::as_array)
        .is_some_and(|g| g.iter().any(|t| t.as_str() == Some(tool)))
}

fn record(
    meta: Option<&Map<String, Value>>,
    into: &str,
    out_of: &str,
    tool: &str,
) -> Option<Map<String, Value>> {
    if listed(meta, into, tool) {
        return None;
    }
    let mut meta = meta.cloned().unwrap_or_default();
    let mut list = meta
        .get(into)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    list.push(Value::from(tool));
    meta.insert(into.to_owned(), Value::Array(list));
    if let Some(Value::Array(other)) = meta.get_mut(out_of) {
        other.retain(|t| t.as_str() != Some(tool));
    }
    Some(meta)
}

/// What the session's policy says about a tool call that needs approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auto {
    /// A person decides.
    Ask,
    /// Confirmed without asking, for this reason.
    Approve(ToolCallConfirmationReason),
    /// Refused without asking (the tool is denied for the session).
    Deny,
}

/// The decision at a checkpoint: a denial of this very tool wins, then the
/// mode or a grant approves, otherwise a person is asked.
pub fn decide(mode: &str, granted: bool, denied: bool) -> Auto {
    if denied {
        return Auto::Deny;
    }
    match auto_confirmation(mode, granted) {
        Some(reason) => Auto::Approve(reason),
        None => Auto::Ask,
    }
}

/// How a tool call that needs approval is confirmed at a checkpoint, given
/// the mode now in effect and whether a grant covers the tool: without
/// asking (`setting`) under `always-allow` or a grant, otherwise not at all
/// (a person decides).
pub fn auto_confirmation(mode: &str, granted: bool) -> Option<ToolCallConfirmationReason> {
    (mode == ALWAYS_ALLOW || granted).then_some(ToolCallConfirmationReason::Setting)
}

/// Whether a tool call needs approval at all: one declared read-only does not.
pub fn needs_approval(read_only: bool) -> bool {
    !read_only
}

/// Whether a confirmation records a grant: an approval with the
/// `approve-session` option.
pub fn grants_for_session(approved: bool, selected_option_id: Option<&str>) -> bool {
    approved && selected_option_id == Some(super::options::APPROVE_SESSION)
}

/// Whether an agent's own confirmation of a tool call must pass the
/// session's checkpoint: it confirms a tool that needs approval.
pub fn agent_confirmation_checked(claimed: bool, read_only: bool) -> bool {
    claimed && needs_approval(read_only)
}

/// Whether a `session/configChanged` sets only values the config already has
/// (it is refused as no change, so the same mode set again emits nothing).
pub fn changes_nothing(current: Option<&Map<String, Value>>, change: &Map<String, Value>) -> bool {
    change
        .iter()
        .all(|(k, v)| current.and_then(|vals| vals.get(k)) == Some(v))
}

/// Why a tool call was confirmed without asking, as the agent is told.
pub fn auto_reason(reason: &ToolCallConfirmationReason) -> &'static str {
    match reason {
        ToolCallConfirmationReason::NotNeeded => "read-only tool",
        _ => "allowed by the session's approval policy",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interactions::{options, tool_options};

    fn config(mode: Option<&str>) -> SessionConfigState {
        let mut values = Map::new();
        if let Some(m) = mode {
            values.insert(APPROVAL_MODE.into(), Value::from(m));
        }
        SessionConfigState {
            schema: ahp_types::state::SessionConfigSchema {
                r#type: "object".into(),
                properties: std::collections::HashMap::from([(
                    APPROVAL_MODE.to_owned(),
                    approval_mode_property(),
                )]),
                required: None,
            },
            values,
        }
    }

    #[test]
    fn the_config_schema_declares_ask_and_always_allow_with_ask_the_default() {
        let p = approval_mode_property();
        assert_eq!(
            p.r#enum,
            Some(vec![Value::from("ask"), Value::from("always-allow")])
        );
        assert_eq!(p.default, Some(Value::from("ask")));
        assert_eq!(
            p.session_mutable,
            Some(true),
            "set with session/configChanged"
        );
    }

    #[test]
    fn the_mode_is_read_from_config_values_and_defaults_to_ask() {
        assert_eq!(configured_mode(None), "ask");
        assert_eq!(configured_mode(Some(&config(None))), "ask");
        assert_eq!(
            configured_mode(Some(&config(Some("always-allow")))),
            "always-allow"
        );
    }

    #[test]
    fn a_new_session_has_ask_in_effect_and_no_grants() {
        let meta = initial_meta();
        assert_eq!(meta[EFFECTIVE_MODE_META], Value::from("ask"));
        assert!(!granted(Some(&meta), "write"));
    }

    #[test]
    fn a_mode_change_takes_effect_at_the_checkpoint_and_is_published_in_meta() {
        let meta = initial_meta();
        let after = checkpoint(Some(&meta), "always-allow").expect("the mode changes");
        assert_eq!(after[EFFECTIVE_MODE_META], Value::from("always-allow"));
        assert_eq!(after[GRANTS_META], meta[GRANTS_META], "grants are kept");
        assert_eq!(
            checkpoint(Some(&after), "always-allow"),
            None,
            "already in effect"
        );
        assert_eq!(
            checkpoint(None, "ask").map(|m| m[EFFECTIVE_MODE_META].clone()),
            Some(Value::from("ask"))
        );
    }

    #[test]
    fn a_pending_confirmation_keeps_the_mode_it_was_opened_under() {
        // The decision is taken once, at the checkpoint, from the mode in
        // effect then; a later change only alters the next checkpoint.
        let opened_under = auto_confirmation(ASK, false);
        assert_eq!(opened_under, None, "pending: a person decides");
        let meta = checkpoint(Some(&initial_meta()), ALWAYS_ALLOW);
        assert!(meta.is_some(), "the next checkpoint applies the new mode");
        assert_eq!(opened_under, None);
    }

    #[test]
    fn setting_the_same_values_again_changes_nothing() {
        let current = config(Some("ask")).values;
        let same = Map::from_iter([(APPROVAL_MODE.to_owned(), Value::from("ask"))]);
        let other = Map::from_iter([(APPROVAL_MODE.to_owned(), Value::from("always-allow"))]);
        assert!(changes_nothing(Some(&current), &same));
        assert!(!changes_nothing(Some(&current), &other));
        assert!(!changes_nothing(None, &same));
    }

    #[test]
    fn the_mode_and_grants_live_in_session_state_so_they_survive_restart() {
        // Everything the policy reads is in SessionState (config and _meta),
        // which is journaled; a state rebuilt from JSON answers the same.
        let meta = grant(
            checkpoint(Some(&initial_meta()), ALWAYS_ALLOW).as_ref(),
            "write",
        )
        .expect("a new grant");
        let reread: Map<String, Value> =
            serde_json::from_str(&serde_json::to_string(&meta).expect("serializes"))
                .expect("parses");
        assert!(granted(Some(&reread), "write"));
        assert_eq!(checkpoint(Some(&reread), ALWAYS_ALLOW), None);
        let cfg: SessionConfigState = serde_json::from_value(
            serde_json::to_value(config(Some(ALWAYS_ALLOW))).expect("serializes"),
        )
        .expect("parses");
        assert_eq!(configured_mode(Some(&cfg)), ALWAYS_ALLOW);
    }

    #[test]
    fn confirmations_offer_approve_once_approve_session_and_deny() {
        let ids: Vec<String> = tool_options().into_iter().map(|o| o.id).collect();
        assert_eq!(ids, ["approve-once", "approve-session", "deny"]);
    }

    #[test]
    fn only_approving_with_approve_session_records_a_grant() {
        assert!(grants_for_session(true, Some(options::APPROVE_SESSION)));
        assert!(!grants_for_session(true, Some(options::APPROVE_ONCE)));
        assert!(!grants_for_session(true, None));
        assert!(!grants_for_session(false, Some(options::APPROVE_SESSION)));
    }

    #[test]
    fn a_grant_is_recorded_once_per_tool_name() {
        let meta = grant(Some(&initial_meta()), "write").expect("a new grant");
        assert!(granted(Some(&meta), "write"));
        assert!(!granted(Some(&meta), "delete"), "only that tool");
        assert_eq!(
            grant(Some(&meta), "write"),
            None,
            "nothing to publish twice"
        );
        let both = grant(Some(&meta), "delete").expect("another tool");
        assert_eq!(both[GRANTS_META], serde_json::json!(["write", "delete"]));
    }

    #[test]
    fn a_granted_tool_or_always_allow_is_confirmed_by_setting() {
        assert_eq!(
            auto_confirmation(ASK, true),
            Some(ToolCallConfirmationReason::Setting)
        );
        assert_eq!(
            auto_confirmation(ALWAYS_ALLOW, false),
            Some(ToolCallConfirmationReason::Setting)
        );
        assert_eq!(auto_confirmation(ASK, false), None);
    }

    #[test]
    fn by_default_only_a_read_only_tool_needs_no_approval() {
        assert!(!needs_approval(true));
        assert!(needs_approval(false));
        assert_eq!(
            auto_reason(&ToolCallConfirmationReason::NotNeeded),
            "read-only tool"
        );
    }

    #[test]
    fn an_agent_confirming_a_tool_that_changes_data_goes_through_the_checkpoint() {
        assert!(agent_confirmation_checked(true, false));
        assert!(!agent_confirmation_checked(true, true), "read-only: kept");
        assert!(
            !agent_confirmation_checked(false, false),
            "not confirmed: pending anyway"
        );
        // At the checkpoint, without mode or grant, it becomes pending.
        assert_eq!(auto_confirmation(ASK, false), None);
    }

    #[test]
    fn a_denial_wins_over_mode_and_takes_back_a_grant() {
        let granted = grant(Some(&initial_meta()), "rm").expect("granted");
        let denied_meta = deny(Some(&granted), "rm").expect("denied");
        assert!(denied(Some(&denied_meta), "rm"));
        assert!(
            !super::granted(Some(&denied_meta), "rm"),
            "the grant is taken back"
        );
        assert_eq!(deny(Some(&denied_meta), "rm"), None, "recorded once");
        assert_eq!(decide(ALWAYS_ALLOW, false, true), Auto::Deny);
        assert_eq!(
            decide(ASK, true, false),
            Auto::Approve(ToolCallConfirmationReason::Setting)
        );
        assert_eq!(decide(ASK, false, false), Auto::Ask);
        let regranted = grant(Some(&denied_meta), "rm").expect("granted again");
        assert!(!denied(Some(&regranted), "rm"));
    }
}
