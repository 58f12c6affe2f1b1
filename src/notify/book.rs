//! What the notifier keeps of people in the store's settings
//! ([`crate::store::Settings`]): each person's browsers registered for Web
//! Push, with what their credential allowed when they registered, and
//! their choice per session (all, approvals only, off).
//!
//! Keys: `push/people/<subject>` (a [`Holder`], JSON), and
//! `notify/modes/<subject>` (session → [`Mode`], JSON).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::people::{Person, Standing};
use crate::store::{JournalError, Settings};

/// Browsers one person may keep registered; a new one past it replaces
/// the oldest.
pub const MAX_DEVICES: usize = 10;

const PEOPLE: &str = "push/people/";
const MODES: &str = "notify/modes/";

/// What a person wants to be told of in a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Every request they can answer.
    #[default]
    All,
    /// Tool approvals only.
    Approvals,
    /// Nothing.
    Off,
}

impl Mode {
    /// Whether a request of `kind` is told under this mode.
    pub fn wants(self, kind: crate::metrics::InteractionKind) -> bool {
        match self {
            Mode::All => true,
            Mode::Approvals => kind == crate::metrics::InteractionKind::Tool,
            Mode::Off => false,
        }
    }
}

/// One browser's push subscription.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// The push service's URL for it.
    pub endpoint: String,
    /// Its P-256 public key (base64url of the uncompressed point).
    pub p256dh: String,
    /// Its 16-byte authentication secret (base64url).
    pub auth: String,
    /// When it was registered (Unix seconds).
    pub at_secs: u64,
}

/// The link a guest registered through.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViaInvite {
    /// The link's id.
    pub id: String,
    /// Its session.
    pub session: String,
}

/// A person with browsers registered, and what their credential allowed
/// when they last registered one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    /// Their token subject.
    pub subject: String,
    /// Their name then.
    pub name: String,
    /// What their credential grants.
    #[serde(default)]
    pub standing: Standing,
    /// The sessions it may open (`None`: any).
    #[serde(default)]
    pub sessions: Option<Vec<String>>,
    /// The invite link they came in through, for a guest.
    #[serde(default)]
    pub invite: Option<ViaInvite>,
    /// Their browsers, oldest first.
    #[serde(default)]
    pub devices: Vec<Device>,
}

impl Holder {
    /// Whether their credential may open `session` at all.
    pub fn may_open(&self, session: &str) -> bool {
        self.sessions
            .as_ref()
            .is_none_or(|s| s.iter().any(|x| x == session))
            && self.invite.as_ref().is_none_or(|i| i.session == session)
    }

    /// The person, for the session's roles.
    pub fn person(&self) -> Person {
        Person {
            name: self.name.clone(),
            subject: self.subject.clone(),
            client_id: String::new(),
            standing: self.standing.clone(),
        }
    }
}

/// The people's records, over the store's settings.
pub struct Book {
    settings: Arc<dyn Settings>,
}

fn decode<T: serde::de::DeserializeOwned>(key: &str, v: &[u8]) -> Result<T, JournalError> {
    serde_json::from_slice(v)
        .map_err(|e| JournalError::Unavailable(format!("setting `{key}` cannot be read: {e}")))
}

fn encode(v: &impl Serialize) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

impl Book {
    /// The records in `settings`.
    pub fn new(settings: Arc<dyn Settings>) -> Self {
        Self { settings }
    }

    /// The store's settings (for the push key).
    pub fn settings(&self) -> &Arc<dyn Settings> {
        &self.settings
    }

    /// `subject`'s record, if they registered a browser.
    pub fn holder(&self, subject: &str) -> Result<Option<Holder>, JournalError> {
        let key = format!("{PEOPLE}{subject}");
        self.settings
            .get(&key)?
            .map(|v| decode(&key, &v))
            .transpose()
    }

    /// Everyone with a browser registered.
    pub fn holders(&self) -> Result<Vec<Holder>, JournalError> {
        let mut out = Vec::new();
        for (key, v) in self.settings.list(PEOPLE)? {
            match decode::<Holder>(&key, &v) {
                Ok(h) if !h.devices.is_empty() => out.push(h),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "push subscriptions skipped"),
            }
        }
        Ok(out)
    }

    /// Register `device` for the person `who` (their credential as it is
    /// now replaces the one kept): the same endpoint replaces its earlier
    /// subscription; past [`MAX_DEVICES`] the oldest goes. Their count of
    /// browsers.
    pub fn subscribe(&self, who: Holder, device: Device) -> Result<usize, JournalError> {
        let mut h = self.holder(&who.subject)?.unwrap_or_else(|| who.clone());
        h.name = who.name;
        h.standing = who.standing;
        h.sessions = who.sessions;
        h.invite = who.invite;
        h.devices.retain(|d| d.endpoint != device.endpoint);
        h.devices.push(device);
        let over = h.devices.len().saturating_sub(MAX_DEVICES);
        h.devices.drain(..over);
        self.store(&h)?;
        Ok(h.devices.len())
    }

    /// Forget `subject`'s browser at `endpoint`; their count left.
    pub fn unsubscribe(&self, subject: &str, endpoint: &str) -> Result<usize, JournalError> {
        let Some(mut h) = self.holder(subject)? else {
            return Ok(0);
        };
        h.devices.retain(|d| d.endpoint != endpoint);
        self.store(&h)?;
        Ok(h.devices.len())
    }

    fn store(&self, h: &Holder) -> Result<(), JournalError> {
        let key = format!("{PEOPLE}{}", h.subject);
        if h.devices.is_empty() {
            self.settings.delete(&key)
        } else {
            self.settings.put(&key, &encode(h))
        }
    }

    /// `subject`'s choice for `session`.
    pub fn mode(&self, subject: &str, session: &str) -> Result<Mode, JournalError> {
        Ok(self
            .modes(subject)?
            .get(session)
            .copied()
            .unwrap_or_default())
    }

    fn modes(&self, subject: &str) -> Result<BTreeMap<String, Mode>, JournalError> {
        let key = format!("{MODES}{subject}");
        Ok(self
            .settings
            .get(&key)?
            .map(|v| decode(&key, &v))
            .transpose()?
            .unwrap_or_default())
    }

    /// Keep `subject`'s choice for `session`.
    pub fn set_mode(&self, subject: &str, session: &str, mode: Mode) -> Result<(), JournalError> {
        let mut modes = self.modes(subject)?;
        if mode == Mode::default() {
            modes.remove(session);
        } else {
            modes.insert(session.to_owned(), mode);
        }
        let key = format!("{MODES}{subject}");
        if modes.is_empty() {
            self.settings.delete(&key)
        } else {
            self.settings.put(&key, &encode(&modes))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemorySettings;

    fn ann() -> Holder {
        Holder {
            subject: "ann".into(),
            name: "Ann".into(),
            standing: Standing::default(),
            sessions: None,
            invite: None,
            devices: Vec::new(),
        }
    }

    fn device(n: usize) -> Device {
        Device {
            endpoint: format!("https://push.example/{n}"),
            p256dh: "k".into(),
            auth: "a".into(),
            at_secs: n as u64,
        }
    }

    #[test]
    fn a_person_keeps_ten_browsers_the_same_endpoint_once_and_can_leave() {
        let book = Book::new(Arc::new(MemorySettings::default()));
        for n in 0..12 {
            book.subscribe(ann(), device(n)).expect("subscribe");
        }
        assert_eq!(book.subscribe(ann(), device(11)).expect("again"), 10);
        let h = book.holder("ann").expect("read").expect("kept");
        assert_eq!(
            h.devices.first().map(|d| d.at_secs),
            Some(2),
            "the oldest went"
        );
        assert_eq!(h.devices.last().map(|d| d.at_secs), Some(11));
        assert_eq!(book.holders().expect("list").len(), 1);
        for n in 2..12 {
            book.unsubscribe("ann", &device(n).endpoint).expect("leave");
        }
        assert!(book.holder("ann").expect("read").is_none());
        assert!(book.holders().expect("list").is_empty());
    }

    #[test]
    fn choices_are_per_session_and_all_unless_set() {
        let book = Book::new(Arc::new(MemorySettings::default()));
        assert_eq!(book.mode("ann", "s1").expect("mode"), Mode::All);
        book.set_mode("ann", "s1", Mode::Approvals).expect("set");
        book.set_mode("ann", "s2", Mode::Off).expect("set");
        assert_eq!(book.mode("ann", "s1").expect("mode"), Mode::Approvals);
        assert_eq!(book.mode("ann", "s2").expect("mode"), Mode::Off);
        assert_eq!(book.mode("bob", "s1").expect("mode"), Mode::All);
        use crate::metrics::InteractionKind as K;
        assert!(Mode::Approvals.wants(K::Tool) && !Mode::Approvals.wants(K::Input));
        assert!(!Mode::Off.wants(K::Tool) && Mode::All.wants(K::Url));
    }

    #[test]
    fn a_scoped_or_guest_credential_opens_only_its_sessions() {
        let mut h = ann();
        assert!(h.may_open("s1"));
        h.sessions = Some(vec!["s1".into()]);
        assert!(h.may_open("s1") && !h.may_open("s2"));
        h.sessions = None;
        h.invite = Some(ViaInvite {
            id: "i".into(),
            session: "s2".into(),
        });
        assert!(!h.may_open("s1") && h.may_open("s2"));
    }
}
