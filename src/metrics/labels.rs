//! The label values the metrics use: classes of refusals, evictions,
//! kinds and outcomes of requests for a person, and what waits now.

use crate::transport::CloseCause;

/// Why an action was refused, as a small set of classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectClass {
    /// The connection may not do this (its token, or a person's act sent
    /// by an agent).
    NotAllowed,
    /// Over the dispatch budget.
    RateLimited,
    /// Over a size limit.
    TooLarge,
    /// The store refused or is away.
    Store,
    /// Another cluster node runs the channel and did not take it.
    Cluster,
    /// The action does not apply to the state (a settled request, a turn
    /// that is not active, a bad answer…).
    Invalid,
}

impl RejectClass {
    pub(super) const ALL: [RejectClass; 6] = [
        RejectClass::NotAllowed,
        RejectClass::RateLimited,
        RejectClass::TooLarge,
        RejectClass::Store,
        RejectClass::Cluster,
        RejectClass::Invalid,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectClass::NotAllowed => "not_allowed",
            RejectClass::RateLimited => "rate_limited",
            RejectClass::TooLarge => "too_large",
            RejectClass::Store => "store",
            RejectClass::Cluster => "cluster",
            RejectClass::Invalid => "invalid",
        }
    }

    /// The class of a rejection's reason (the text the dispatcher gets).
    pub fn of(reason: &str) -> Self {
        let r = reason.to_ascii_lowercase();
        if r.starts_with("permissiondenied") || r.contains("person's act") || r.contains("may not")
        {
            RejectClass::NotAllowed
        } else if r.starts_with("rate limited") {
            RejectClass::RateLimited
        } else if r.starts_with("too large") || r.contains("over the limit") {
            RejectClass::TooLarge
        } else if r.contains("the store") || r.starts_with("not stored") {
            RejectClass::Store
        } else if r.contains("another node") || r.contains("changing hands") {
            RejectClass::Cluster
        } else {
            RejectClass::Invalid
        }
    }
}

/// Why the server closed a connection it did not want to keep.
pub(super) const EVICTIONS: [&str; 7] = [
    "overflow",
    "idle",
    "too_large",
    "malformed",
    "invalid_text",
    "token_expired",
    "invite_ended",
];

/// The eviction label of a close, `None` for an ordinary close.
pub(super) fn eviction(cause: &CloseCause) -> Option<usize> {
    let i = match cause {
        CloseCause::Overflow => 0,
        CloseCause::Protocol(_) => 1,
        CloseCause::TooLarge(_) => 2,
        CloseCause::Malformed(_) => 3,
        CloseCause::InvalidText(_) => 4,
        CloseCause::TokenExpired => 5,
        CloseCause::InviteEnded(_) => 6,
        CloseCause::Normal | CloseCause::ClientClosed(_) | CloseCause::Shutdown => return None,
    };
    Some(i)
}

/// What kind of interaction a person is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InteractionKind {
    /// Questions (a form, a confirmation, free text).
    Input,
    /// A URL to visit.
    Url,
    /// A tool call to approve.
    Tool,
}

impl InteractionKind {
    pub(super) const ALL: [InteractionKind; 3] = [
        InteractionKind::Input,
        InteractionKind::Url,
        InteractionKind::Tool,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            InteractionKind::Input => "input",
            InteractionKind::Url => "url",
            InteractionKind::Tool => "tool",
        }
    }
}

/// How an interaction ended, as the metrics count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Completed with `accept`.
    Answered,
    /// Completed with `decline`.
    Declined,
    /// Completed with `cancel`.
    Cancelled,
    /// Tool call approved.
    Approved,
    /// Tool call denied.
    Denied,
    /// The turn was cancelled (or truncated away) while it was open.
    Interrupted,
    /// The turn ended (completed, failed) while it was open.
    Abandoned,
}

impl Settled {
    pub(super) const ALL: [Settled; 7] = [
        Settled::Answered,
        Settled::Declined,
        Settled::Cancelled,
        Settled::Approved,
        Settled::Denied,
        Settled::Interrupted,
        Settled::Abandoned,
    ];

    /// Whether a request of `kind` can end this way.
    pub(super) fn happens_to(self, kind: InteractionKind) -> bool {
        match self {
            Settled::Interrupted | Settled::Abandoned => true,
            Settled::Approved | Settled::Denied => kind == InteractionKind::Tool,
            Settled::Answered | Settled::Declined | Settled::Cancelled => {
                kind != InteractionKind::Tool
            }
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Settled::Answered => "answered",
            Settled::Declined => "declined",
            Settled::Cancelled => "cancelled",
            Settled::Approved => "approved",
            Settled::Denied => "denied",
            Settled::Interrupted => "interrupted",
            Settled::Abandoned => "abandoned",
        }
    }
}

/// How a `reconnect` was answered.
#[derive(Debug, Clone, Copy)]
pub enum ReconnectAnswer {
    /// The missed envelopes.
    Replay,
    /// Fresh snapshots.
    Snapshot,
}

/// A request for a person open now (the admin view's "waiting" list).
#[derive(Debug, Clone)]
pub struct Waiting {
    /// The session.
    pub session: String,
    /// The chat.
    pub chat: String,
    /// The input request's or tool call's id.
    pub id: String,
    /// Its kind.
    pub kind: InteractionKind,
    /// What it asks (the request's message, or the tool's name).
    pub title: String,
    /// When it was opened.
    pub since: std::time::Instant,
}
