//! A session's audit log: an append-only record of every person's act that
//! mattered — a settled answer, an approval or denial (with the tool and a
//! digest of its input), a grant, a mode change, a role change, an invite
//! created, used or revoked.
//!
//! An actor that takes such an act puts its entry on its core
//! ([`crate::channels::core::ChannelCore::audit`]); the next append stores
//! the entries with the batch that holds the act, so an entry exists
//! exactly when its act does. Entries are read back with
//! [`crate::store::Journal::audit_page`] (`tandem/auditLog`, `tandem audit
//! export`). They name people (`{name, subject, clientId}`), never a token.

use serde_json::{json, Map, Value};

use crate::digest::sha256;
use crate::ids::ChannelUri;
use crate::people::Person;
use crate::store::AuditRecord;
use crate::time::now_rfc3339;

/// What an act was, as named in its entry's `kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditKind {
    /// A form or question settled (`response`: accept, decline, cancel).
    Answered,
    /// A tool call approved once.
    Approved,
    /// A tool call approved for the rest of the session ("always allow").
    Granted,
    /// A tool call denied (`reason`, when given).
    Denied,
    /// A turn stopped.
    TurnCancelled,
    /// A session config property changed (the approval mode among them).
    ConfigChanged,
    /// An owner set someone's role.
    RoleChanged,
    /// An owner created an invite link.
    InviteCreated,
    /// Someone came in through an invite link.
    InviteUsed,
    /// An owner revoked an invite link.
    InviteRevoked,
}

impl AuditKind {
    /// The entry's `kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            AuditKind::Answered => "answered",
            AuditKind::Approved => "approved",
            AuditKind::Granted => "granted",
            AuditKind::Denied => "denied",
            AuditKind::TurnCancelled => "turnCancelled",
            AuditKind::ConfigChanged => "configChanged",
            AuditKind::RoleChanged => "roleChanged",
            AuditKind::InviteCreated => "inviteCreated",
            AuditKind::InviteUsed => "inviteUsed",
            AuditKind::InviteRevoked => "inviteRevoked",
        }
    }
}

/// The entry of `by`'s act of `kind` in `session` (and `chat`), with
/// `fields` beside `at`, `kind`, `by`, `session` and `chat`.
pub fn entry(
    kind: AuditKind,
    by: &Person,
    session: &ChannelUri,
    chat: Option<&ChannelUri>,
    fields: Value,
) -> AuditRecord {
    let mut e = Map::new();
    e.insert("at".into(), now_rfc3339().into());
    e.insert("kind".into(), kind.as_str().into());
    e.insert("by".into(), by.to_json());
    e.insert("session".into(), session.as_str().into());
    if let Some(c) = chat {
        e.insert("chat".into(), c.as_str().into());
    }
    if let Value::Object(f) = fields {
        e.extend(f.into_iter().filter(|(_, v)| !v.is_null()));
    }
    AuditRecord {
        session: session.clone(),
        entry: Value::Object(e).to_string().into(),
    }
}

/// The digest of a tool call's `toolInput` (its text when inline, the
/// reference's JSON when it is a content reference), if it has one.
pub fn input_digest(tool_call: &impl serde::Serialize) -> Option<String> {
    let v = serde_json::to_value(tool_call).ok()?;
    match v.get("toolInput")? {
        Value::String(s) => Some(sha256(s.as_bytes())),
        Value::Null => None,
        other => Some(sha256(other.to_string().as_bytes())),
    }
}

/// The fields of an approval's entry.
pub fn decision(tool: &str, input_digest: Option<String>, reason: Option<&str>) -> Value {
    json!({"toolName": tool, "inputDigest": input_digest, "reason": reason})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann() -> Person {
        Person {
            name: "Ann".into(),
            subject: "ann".into(),
            client_id: "c1".into(),
            standing: Default::default(),
        }
    }

    #[test]
    fn an_entry_names_the_act_the_person_and_the_place() {
        let r = entry(
            AuditKind::Denied,
            &ann(),
            &"ahp-session:/s".into(),
            Some(&"ahp-chat:/c".into()),
            decision("deploy", Some(sha256(b"{}")), Some("not today")),
        );
        assert_eq!(r.session.as_str(), "ahp-session:/s");
        let v: Value = serde_json::from_str(&r.entry).unwrap();
        assert_eq!(v["kind"], "denied");
        assert_eq!(v["by"]["name"], "Ann");
        assert_eq!(v["chat"], "ahp-chat:/c");
        assert_eq!(v["toolName"], "deploy");
        assert_eq!(v["reason"], "not today");
        assert!(v["at"].as_str().unwrap().ends_with('Z'));
        // Absent fields are left out, not null.
        let r = entry(
            AuditKind::Approved,
            &ann(),
            &"ahp-session:/s".into(),
            None,
            decision("deploy", None, None),
        );
        let v: Value = serde_json::from_str(&r.entry).unwrap();
        assert!(v.get("reason").is_none() && v.get("chat").is_none());
    }
}
