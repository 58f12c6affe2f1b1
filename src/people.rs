//! People: who is behind a connection, and what they may do in a session.
//!
//! A connection speaks for one [`Person`]: a display name bound by the
//! server to the connection's token subject (the token's `name` claim;
//! without authentication, a name the client chose), so no client can act
//! under someone else's name. Every act of a person that the record keeps —
//! a message, an answer, an approval, a cancellation, a change of the
//! approval mode — is stamped by the host with that person, in the
//! journaled state (see `docs/protocol.md`, "People").
//!
//! What a person may do in a session is an [`Access`] level; each level
//! includes the ones below it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// What someone may do in one session. Each level includes the ones
/// before it.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// Watches: sees the session, its chats and who is there; sends
    /// nothing that changes them.
    Viewer,
    /// Also sends messages, types drafts and answers questions.
    Participant,
    /// Also approves or denies tool calls and changes the approval mode.
    Approver,
    /// Also invites people, sets their access, and disposes of the session.
    Owner,
}

impl Access {
    /// Its name on the wire and in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Viewer => "viewer",
            Access::Participant => "participant",
            Access::Approver => "approver",
            Access::Owner => "owner",
        }
    }
}

impl std::fmt::Display for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Longest display name, in characters.
pub const MAX_NAME_CHARS: usize = 80;

/// A display name as the server keeps it: trimmed, control characters
/// dropped, at most [`MAX_NAME_CHARS`]; `None` when nothing is left.
pub fn clean_name(raw: &str) -> Option<String> {
    let name: String = raw
        .trim()
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_NAME_CHARS)
        .collect();
    let name = name.trim().to_owned();
    (!name.is_empty()).then_some(name)
}

/// The person behind a connection, as the record names them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Person {
    /// What others see.
    pub name: String,
    /// The token subject (`local` without authentication).
    pub subject: String,
    /// The connection's `clientId` (the device).
    pub client_id: String,
    /// What their credential grants, for the session to decide their
    /// [`Access`] (travels with a forwarded request; not in the record).
    #[serde(default)]
    pub standing: Standing,
}

/// What a connection's credential says of its holder's access.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Standing {
    /// An admin (or anyone, without authentication): owner everywhere.
    #[serde(default)]
    pub admin: bool,
    /// Access the token (or the invite it came through) gives in given
    /// sessions: session URI → level.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub grants: BTreeMap<String, Access>,
}

/// `_meta` key of a session's access table ([`AccessTable`]).
pub const ACCESS_META: &str = "tandem/access";

/// Who may do what in one session, besides the server's default: its
/// `_meta["tandem/access"]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AccessTable {
    /// Levels set for subjects: the creator (owner) and whom an owner set.
    #[serde(default)]
    pub members: BTreeMap<String, Access>,
}

impl AccessTable {
    /// A new session's: `creator` owns it.
    pub fn new(creator: Option<&str>) -> Self {
        let members = creator
            .map(|c| BTreeMap::from([(c.to_owned(), Access::Owner)]))
            .unwrap_or_default();
        Self { members }
    }

    /// The table in a session's `_meta` (empty when it has none).
    pub fn of_meta(meta: Option<&Map<String, Value>>) -> Self {
        meta.and_then(|m| m.get(ACCESS_META))
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .unwrap_or_default()
    }

    /// As it is kept in the session's `_meta`.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    /// What `by` may do in `session`: owner for an admin; else the level
    /// the session set for their subject; else their token's for this
    /// session; else `default` (the server's `--session-access`).
    pub fn level_of(&self, session: &str, by: &Person, default: Access) -> Access {
        if by.standing.admin {
            return Access::Owner;
        }
        self.members
            .get(&by.subject)
            .or_else(|| by.standing.grants.get(session))
            .copied()
            .unwrap_or(default)
    }

    /// `Ok` when `by` may do what needs `need` in `session`; else why not,
    /// naming the role it needs.
    pub fn permit(
        &self,
        session: &str,
        by: &Person,
        default: Access,
        need: Access,
        what: &str,
    ) -> Result<(), String> {
        let have = self.level_of(session, by, default);
        if have >= need {
            return Ok(());
        }
        Err(format!(
            "{what} needs the {need} role in this session; {} is a {have}",
            by.name
        ))
    }
}

/// The level an action needs of a person: approving and changing the
/// session's config (its approval mode) need an approver, cutting the
/// history an owner, anything else a participant.
pub fn needed_for(action: &ahp_types::actions::StateAction) -> Access {
    use ahp_types::actions::StateAction as A;
    match action {
        A::ChatToolCallConfirmed(_)
        | A::ChatToolCallResultConfirmed(_)
        | A::SessionConfigChanged(_) => Access::Approver,
        A::ChatTruncated(_) => Access::Owner,
        _ => Access::Participant,
    }
}

/// `_meta` key of a message's author (`Message._meta`).
pub const AUTHOR_META: &str = "tandem/author";
/// `_meta` key of a person's act recorded as a system notification
/// (`SystemNotificationResponsePart._meta`).
pub const ACT_META: &str = "tandem/act";

impl Person {
    /// As it is written into the record (without the standing).
    pub fn to_json(&self) -> Value {
        json!({"name": self.name, "subject": self.subject, "clientId": self.client_id})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_include_the_ones_before() {
        assert!(Access::Viewer < Access::Participant);
        assert!(Access::Participant < Access::Approver);
        assert!(Access::Approver < Access::Owner);
        let parsed: Access = serde_json::from_value(json!("approver")).expect("a level");
        assert_eq!(parsed, Access::Approver);
        assert_eq!(Access::Owner.to_string(), "owner");
    }

    fn someone(subject: &str) -> Person {
        Person {
            name: subject.to_uppercase(),
            subject: subject.into(),
            client_id: format!("{subject}-laptop"),
            standing: Standing::default(),
        }
    }

    #[test]
    fn a_session_decides_levels_over_tokens_and_admins_own_everything() {
        let s = "ahp-session:/s";
        let v = Access::Viewer;
        let mut table = AccessTable::new(Some("ann"));
        let ann = someone("ann");
        let mut bob = someone("bob");
        assert_eq!(table.level_of(s, &ann, v), Access::Owner);
        assert_eq!(table.level_of(s, &bob, v), Access::Viewer);
        bob.standing.grants.insert(s.into(), Access::Approver);
        assert_eq!(table.level_of(s, &bob, v), Access::Approver);
        assert_eq!(
            table.level_of("ahp-session:/other", &bob, v),
            Access::Viewer
        );
        table.members.insert("bob".into(), Access::Participant);
        assert_eq!(table.level_of(s, &bob, v), Access::Participant);
        let need = Access::Approver;
        let why = table
            .permit(s, &bob, v, need, "approving")
            .expect_err("a participant does not approve");
        assert_eq!(
            why,
            "approving needs the approver role in this session; BOB is a participant"
        );
        let mut root = someone("root");
        root.standing.admin = true;
        assert_eq!(table.level_of(s, &root, v), Access::Owner);
    }

    #[test]
    fn the_table_round_trips_through_meta() {
        let table = AccessTable::new(Some("ann"));
        let meta = Map::from_iter([(ACCESS_META.to_owned(), table.to_json())]);
        assert_eq!(AccessTable::of_meta(Some(&meta)), table);
        assert_eq!(AccessTable::of_meta(None), AccessTable::default());
    }

    #[test]
    fn names_are_trimmed_bounded_and_never_empty() {
        assert_eq!(clean_name("  Ann  ").as_deref(), Some("Ann"));
        assert_eq!(clean_name("A\u{7}nn\n").as_deref(), Some("Ann"));
        assert_eq!(clean_name("   "), None);
        assert_eq!(clean_name("\n\t"), None);
        let long = "é".repeat(200);
        assert_eq!(
            clean_name(&long).map(|n| n.chars().count()),
            Some(MAX_NAME_CHARS)
        );
    }
}
