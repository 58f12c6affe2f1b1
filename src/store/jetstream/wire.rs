//! What the journal writes to NATS: the batch message of a channel's
//! subject, and the values of its buckets.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::store::{ChannelInfo, ChannelKind, JournalError};

/// One batch message.
#[derive(Serialize, Deserialize)]
pub(super) struct BatchMsg<'a> {
    #[serde(borrow)]
    pub(super) records: Vec<&'a RawValue>,
    #[serde(default, borrow)]
    pub(super) turns: Vec<TurnMsg<'a>>,
    #[serde(default, rename = "truncateTurnsFrom")]
    pub(super) truncate_turns_from: Option<u64>,
    /// Who dispatched each record (empty when none was a client's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) origins: Vec<Option<ahp_types::actions::ActionOrigin>>,
}

#[derive(Serialize, Deserialize)]
pub(super) struct TurnMsg<'a> {
    pub(super) index: u64,
    #[serde(borrow)]
    pub(super) json: &'a RawValue,
}

/// A snapshot as kept in the bucket.
#[derive(Serialize, Deserialize)]
pub(super) struct SnapshotMsg<'a> {
    /// Actions it covers.
    #[serde(rename = "atSeq")]
    pub(super) at_seq: u64,
    /// The stream sequence the tail is read from.
    #[serde(rename = "fromStreamSeq")]
    pub(super) from_stream_seq: u64,
    /// Turns stored when it was taken.
    #[serde(rename = "turnCount")]
    pub(super) turn_count: u64,
    #[serde(borrow)]
    pub(super) state: &'a RawValue,
}

#[derive(Serialize, Deserialize)]
pub(super) struct ChannelMsg {
    pub(super) uri: String,
    pub(super) kind: String,
    pub(super) session: Option<String>,
    pub(super) provider: String,
    pub(super) title: String,
    #[serde(rename = "createdAt")]
    pub(super) created_at: String,
    pub(super) owner: Option<String>,
}

impl ChannelMsg {
    pub(super) fn of(i: &ChannelInfo) -> Self {
        Self {
            uri: i.uri.to_string(),
            kind: i.kind.as_str().to_owned(),
            session: i.session.as_ref().map(|s| s.to_string()),
            provider: i.provider.clone(),
            title: i.title.clone(),
            created_at: i.created_at.clone(),
            owner: i.owner.clone(),
        }
    }

    pub(super) fn info(self) -> Option<ChannelInfo> {
        Some(ChannelInfo {
            uri: self.uri.into(),
            kind: ChannelKind::parse(&self.kind)?,
            session: self.session.map(Into::into),
            provider: self.provider,
            title: self.title,
            created_at: self.created_at,
            owner: self.owner,
        })
    }
}

#[derive(Serialize, Deserialize)]
pub(super) struct OwnerMsg {
    pub(super) provider: String,
    pub(super) subject: String,
}

/// A stored record as raw JSON, to embed it unchanged.
pub(super) fn raw(json: &str) -> Result<&RawValue, JournalError> {
    serde_json::from_str(json).map_err(|e| {
        JournalError::Unavailable(format!("a journal record is not JSON ({e}): {json:.80}"))
    })
}
