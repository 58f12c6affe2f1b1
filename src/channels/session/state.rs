//! A session's state at creation and its entry in root's catalog.

use ahp_types::state::{
    SessionConfigPropertySchema, SessionConfigSchema, SessionConfigState, SessionLifecycle,
    SessionState, SessionStatus, SessionSummary,
};
use serde_json::Value;

use crate::interactions::policy;

/// The state of a session nobody has written to yet: the approval mode,
/// and the config properties its agent adds (`extra`), in its config; its
/// `creator` (a token subject) as its owner.
pub fn new_session_state(
    provider: String,
    extra: Vec<(String, SessionConfigPropertySchema)>,
    creator: Option<&str>,
) -> SessionState {
    let mut meta = policy::initial_meta();
    meta.insert(
        crate::people::ACCESS_META.into(),
        crate::people::AccessTable::new(creator).to_json(),
    );
    let mut values = serde_json::Map::new();
    values.insert(policy::APPROVAL_MODE.into(), Value::from(policy::ASK));
    let mut properties = std::collections::HashMap::new();
    for (key, schema) in extra {
        if let Some(default) = &schema.default {
            values.insert(key.clone(), default.clone());
        }
        properties.insert(key, schema);
    }
    properties.insert(
        policy::APPROVAL_MODE.to_owned(),
        policy::approval_mode_property(),
    );
    SessionState {
        provider,
        title: "New session".into(),
        status: SessionStatus::Idle.bits(),
        activity: None,
        origin: None,
        project: None,
        working_directories: None,
        annotations: None,
        lifecycle: SessionLifecycle::Creating,
        creation_error: None,
        server_tools: None,
        active_clients: Vec::new(),
        chats: Vec::new(),
        default_chat: None,
        config: Some(SessionConfigState {
            schema: SessionConfigSchema {
                r#type: "object".into(),
                properties,
                required: None,
            },
            values,
        }),
        customizations: None,
        changesets: None,
        input_needed: None,
        meta: Some(meta),
    }
}

/// The catalog entry for a session state.
pub fn summary_of(uri: &str, s: &SessionState, created_at: &str) -> SessionSummary {
    let modified_at = s
        .chats
        .iter()
        .map(|c| c.modified_at.as_str())
        .max()
        .unwrap_or(created_at)
        .to_owned();
    // Activity bits from the default chat; InputNeeded and Error promoted from any chat.
    let activity_mask = (1u32 << 5) - 1;
    let default = s
        .chats
        .iter()
        .find(|c| Some(&c.resource) == s.default_chat.as_ref())
        .map(|c| c.status & activity_mask)
        .unwrap_or(SessionStatus::Idle.bits());
    let mut status = (s.status & !activity_mask) | default;
    if s.input_needed.as_ref().is_some_and(|v| !v.is_empty())
        || s.chats.iter().any(|c| {
            c.status & SessionStatus::InputNeeded.bits() == SessionStatus::InputNeeded.bits()
        })
    {
        status = (status & !activity_mask) | SessionStatus::InputNeeded.bits();
    } else if s
        .chats
        .iter()
        .any(|c| c.status & SessionStatus::Error.bits() != 0)
    {
        status |= SessionStatus::Error.bits();
    }
    SessionSummary {
        provider: s.provider.clone(),
        title: s.title.clone(),
        status,
        activity: s.activity.clone(),
        origin: None,
        project: None,
        working_directories: s.working_directories.clone(),
        annotations: None,
        resource: uri.to_owned(),
        created_at: created_at.to_owned(),
        modified_at,
        changes: None,
        meta: None,
        chats: Some(
            s.chats
                .iter()
                .map(|c| ahp_types::state::SessionChatSummary {
                    resource: c.resource.clone(),
                    title: c.title.clone(),
                    origin: c.origin.clone(),
                    interactivity: c.interactivity,
                    status: Some(c.status),
                    changes: None,
                })
                .collect(),
        ),
        default_chat: s.default_chat.clone(),
    }
}
