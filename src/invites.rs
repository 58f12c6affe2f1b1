//! Invite links: an owner lets people into one session with a role, until
//! a time, for a number of people, without minting a token for each.
//!
//! A link carries a code `<id>.<secret>`; the session keeps only the
//! secret's digest, in its `_meta["tandem/invites"]` ([`INVITES_META`]) —
//! journaled like the rest of its state, so every node and every restart
//! honours the same links. Whoever opens `/ahp?invite=<code>` is let
//! into that session alone, as a
//! guest with the link's role and a name of their choosing; their subject
//! is `invite:<id>/<guest>`, where `<guest>` stands for the device the
//! page keeps (`guest=` on the upgrade), so a reload is the same person and
//! counts once against the link's uses. A link that is revoked or expires
//! closes the sockets that came in through it and lets nobody in again.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::people::Access;

/// `_meta` key of a session's invite links ([`InviteTable`]).
pub const INVITES_META: &str = "tandem/invites";

/// The longest a link may live: 30 days.
pub const MAX_TTL_SECS: u64 = 30 * 24 * 3600;

/// How long a revoked or expired link stays listed before it is dropped
/// from the session's state (its acts stay in the audit log).
const KEEP_ENDED_SECS: u64 = 7 * 24 * 3600;

/// Who made a link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Maker {
    /// Their name.
    pub name: String,
    /// Their subject.
    pub subject: String,
}

/// One link, as the session keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Invite {
    /// `sha256:<hex>` of the code's secret.
    pub digest: String,
    /// The role it gives.
    pub access: Access,
    /// When it was made (RFC 3339).
    pub created_at: String,
    /// Who made it.
    pub created_by: Maker,
    /// When it stops letting anyone in, seconds since the Unix epoch.
    pub expires_at_secs: u64,
    /// How many people may come in through it (`None`: any number).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uses: Option<u32>,
    /// The guests who came in through it (their `<guest>` tags), in order.
    #[serde(default)]
    pub guests: Vec<String>,
    /// When an owner revoked it, seconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at_secs: Option<u64>,
}

/// Why a link lets nobody in (now).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// An owner revoked it.
    Revoked,
    /// Its time is up.
    Expired,
    /// As many people came in as it allows.
    UsedUp,
    /// No such link, or the code's secret is wrong.
    Unknown,
}

impl Closed {
    /// Said to the person who tried it (and in the close frame of a socket
    /// that came in through it).
    pub fn reason(self) -> &'static str {
        match self {
            Closed::Revoked => "this invite link was revoked",
            Closed::Expired => "this invite link has expired",
            Closed::UsedUp => "this invite link has been used as many times as it allows",
            Closed::Unknown => "no such invite link",
        }
    }
}

impl Invite {
    /// Whether the link is still open at `now` (seconds): revoked, expired,
    /// or open.
    pub fn ended(&self, now: u64) -> Option<Closed> {
        if self.revoked_at_secs.is_some() {
            Some(Closed::Revoked)
        } else if now >= self.expires_at_secs {
            Some(Closed::Expired)
        } else {
            None
        }
    }

    /// Whether `guest` may come in at `now` with a code whose secret has
    /// `digest`: a guest who came in before may come back while the link
    /// is open; a new one needs a use left.
    pub fn admits(&self, digest: &str, guest: &str, now: u64) -> Result<(), Closed> {
        if !constant_eq(digest.as_bytes(), self.digest.as_bytes()) {
            return Err(Closed::Unknown);
        }
        if let Some(c) = self.ended(now) {
            return Err(c);
        }
        let known = self.guests.iter().any(|g| g == guest);
        match self.uses {
            Some(n) if !known && self.guests.len() >= n as usize => Err(Closed::UsedUp),
            _ => Ok(()),
        }
    }

    /// As `tandem/listInvites` shows it (no digest).
    pub fn listing(&self, id: &str, now: u64) -> Value {
        let state = match self.ended(now) {
            Some(Closed::Revoked) => "revoked",
            Some(_) => "expired",
            None => "open",
        };
        serde_json::json!({
            "id": id,
            "access": self.access,
            "createdAt": self.created_at,
            "createdBy": self.created_by,
            "expiresAt": rfc3339(self.expires_at_secs),
            "uses": self.uses,
            "used": self.guests.len(),
            "state": state,
        })
    }
}

/// A session's links: id → link, its `_meta["tandem/invites"]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InviteTable(pub BTreeMap<String, Invite>);

impl InviteTable {
    /// The table in a session's `_meta` (empty when it has none).
    pub fn of_meta(meta: Option<&Map<String, Value>>) -> Self {
        meta.and_then(|m| m.get(INVITES_META))
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .unwrap_or_default()
    }

    /// As the session keeps it.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    /// Drop the links that ended more than a week before `now`.
    pub fn prune(&mut self, now: u64) {
        self.0.retain(|_, i| {
            let ended = i.revoked_at_secs.unwrap_or(i.expires_at_secs);
            now < ended.saturating_add(KEEP_ENDED_SECS)
        });
    }
}

/// A new link's code: its id and the code handed out (`<id>.<secret>`).
pub fn new_code() -> (String, String) {
    let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
    let secret = uuid::Uuid::new_v4().simple().to_string();
    let code = format!("{id}.{secret}");
    (id, code)
}

/// A code's id and the digest of its secret; `None` when it is not shaped
/// like one.
pub fn parse_code(code: &str) -> Option<(&str, String)> {
    let (id, secret) = code.split_once('.')?;
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(id, 12) && hex(secret, 32)).then(|| (id, digest(secret)))
}

/// The tag a guest is known by: a digest of what their page keeps, so the
/// record does not hold it.
pub fn guest_tag(device: &str) -> String {
    digest(device)["sha256:".len()..].chars().take(16).collect()
}

/// `sha256:<hex>` of `s`.
fn digest(s: &str) -> String {
    crate::digest::sha256(s.as_bytes())
}

fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// RFC 3339 of `secs` since the Unix epoch.
pub fn rfc3339(secs: u64) -> String {
    jiff::Timestamp::from_second(secs.min(i64::MAX as u64) as i64)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Someone who came in through a link: what their connection keeps of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guest {
    /// The link's id.
    pub id: String,
    /// Its session.
    pub session: crate::ids::ChannelUri,
    /// The digest of the code's secret they came with.
    pub digest: String,
    /// Their guest tag.
    pub tag: String,
    /// The role the link gives.
    pub access: Access,
    /// The name they gave on the upgrade (`name=`), if any.
    pub name: Option<String>,
}

/// A guest subject: `invite:<id>/<tag>`.
pub fn guest_subject(id: &str, tag: &str) -> String {
    format!("invite:{id}/{tag}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(uses: Option<u32>) -> (String, String, Invite) {
        let (id, code) = new_code();
        let (_, d) = parse_code(&code).expect("a code parses");
        let invite = Invite {
            digest: d,
            access: Access::Viewer,
            created_at: "2026-01-01T00:00:00Z".into(),
            created_by: Maker {
                name: "Ann".into(),
                subject: "ann".into(),
            },
            expires_at_secs: 1_000,
            uses,
            guests: Vec::new(),
            revoked_at_secs: None,
        };
        (id, code, invite)
    }

    #[test]
    fn a_code_is_an_id_and_a_secret_and_only_its_digest_is_kept() {
        let (id, code, invite) = link(None);
        let (pid, d) = parse_code(&code).unwrap();
        assert_eq!(pid, id);
        assert!(!serde_json::to_string(&invite)
            .unwrap()
            .contains(code.split('.').nth(1).unwrap()));
        assert!(invite.admits(&d, "g", 999).is_ok());
        let (_, other) = parse_code(&new_code().1).unwrap();
        assert_eq!(invite.admits(&other, "g", 999), Err(Closed::Unknown));
        assert!(parse_code("nope").is_none());
        assert!(parse_code(&format!("{id}.zz")).is_none());
    }

    #[test]
    fn a_link_ends_when_revoked_or_expired_and_counts_people_not_visits() {
        let (_, code, mut invite) = link(Some(1));
        let (_, d) = parse_code(&code).unwrap();
        assert_eq!(invite.admits(&d, "g1", 1_000), Err(Closed::Expired));
        invite.guests.push("g1".into());
        assert!(
            invite.admits(&d, "g1", 10).is_ok(),
            "the same guest comes back"
        );
        assert_eq!(invite.admits(&d, "g2", 10), Err(Closed::UsedUp));
        invite.revoked_at_secs = Some(5);
        assert_eq!(invite.admits(&d, "g1", 10), Err(Closed::Revoked));
        assert_eq!(invite.listing("x", 10)["state"], "revoked");
    }

    #[test]
    fn ended_links_are_pruned_after_a_week() {
        let (id, _, invite) = link(None);
        let mut t = InviteTable(BTreeMap::from([(id, invite)]));
        t.prune(1_000 + KEEP_ENDED_SECS - 1);
        assert_eq!(t.0.len(), 1);
        t.prune(1_000 + KEEP_ENDED_SECS);
        assert!(t.0.is_empty());
    }
}
