//! Who is on a connection, and what they may do.
//!
//! With a secret configured, every WebSocket upgrade must carry a bearer
//! token (`Authorization: Bearer …`, or `?token=…` for browsers): a JWT signed
//! with HS256 that names a role, an expiry, and optionally the sessions it may
//! use. Without a secret the server trusts its callers — and so only listens
//! on loopback.

use std::collections::HashSet;
use std::sync::Arc;

use ahp_types::actions::StateAction;
use ahp_types::state::PendingMessageKind;
use jsonwebtoken::{decode, encode, Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

/// What a token lets its holder be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A person's client: sessions, chats, answers, approvals.
    Client,
    /// An agent: everything a client may do, plus registering providers.
    Agent,
    /// Everything, on every session.
    Admin,
}

/// The claims of a Tandem token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Subject (who; limits per token count by it).
    pub sub: String,
    /// Role.
    pub role: Role,
    /// Expiry, seconds since the Unix epoch.
    pub exp: u64,
    /// Session URIs the token may use; absent means any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<Vec<String>>,
}

/// The authenticated party on a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Subject of the token (`local` without authentication).
    pub subject: String,
    /// Role.
    pub role: Role,
    /// Sessions it may use; `None` means any.
    pub sessions: Option<Arc<HashSet<String>>>,
}

impl Principal {
    /// A caller on a server without authentication (loopback only).
    pub fn local() -> Self {
        Self {
            subject: "local".into(),
            role: Role::Admin,
            sessions: None,
        }
    }

    /// May it see and act on session `uri`?
    pub fn may_use_session(&self, uri: &str) -> bool {
        match self.role {
            Role::Admin => true,
            Role::Client | Role::Agent => self.sessions.as_ref().is_none_or(|s| s.contains(uri)),
        }
    }

    /// Is it limited to some sessions (so it must learn nothing about the
    /// others)?
    pub fn is_scoped(&self) -> bool {
        self.role != Role::Admin && self.sessions.is_some()
    }

    /// May it register providers?
    pub fn may_register_providers(&self) -> bool {
        match self.role {
            Role::Agent | Role::Admin => true,
            Role::Client => false,
        }
    }

    /// May it register a provider id bound to the token subject `owner`?
    /// Its owner may (a reconnect), and an admin may (an operator replacing a
    /// broken agent); nobody else, or a provider id would pass to any agent
    /// once its connection drops.
    pub fn may_take_over_provider(&self, owner: &str) -> bool {
        match self.role {
            Role::Admin => true,
            Role::Client | Role::Agent => self.subject == owner,
        }
    }
}

/// Is `action` a person's act — a decision or an answer that only a person
/// may give? Only client connections may send these: a connection that
/// serves a provider, or whose token has the `agent` role, is refused
/// whatever its role, on every chat. Otherwise an agent could approve its own
/// tool call (and grant it for the session), answer its own questions, or
/// switch its session to `always-allow`.
///
/// | action | why it is a person's |
/// |---|---|
/// | `chat/toolCallConfirmed` | approves or denies a tool call; `approve-session` grants the tool |
/// | `chat/toolCallResultConfirmed` | accepts a tool's result |
/// | `chat/inputAnswerChanged` | an answer to a question, draft or submitted |
/// | `chat/inputCompleted` | accepts, declines or cancels an input request |
/// | `chat/draftChanged` | the person's message being typed |
/// | `chat/pendingMessageSet` (kind `steering`) | settles an open request `clarified` |
/// | `session/configChanged` | holds the session's approval policy (`approvalMode`) |
///
/// Agents keep the rest of the client-dispatchable list: `chat/turnStarted`,
/// `chat/turnCancelled`, `chat/truncated`, queued messages
/// (`chat/pendingMessageSet` of kind `queued`, `chat/pendingMessageRemoved`,
/// `chat/queuedMessagesReordered`), client tools (`chat/toolCallComplete`,
/// `chat/toolCallContentChanged`), and the session's title, read, archived
/// and active-client actions.
pub fn is_persons_act(action: &StateAction) -> bool {
    match action {
        StateAction::ChatToolCallConfirmed(_)
        | StateAction::ChatToolCallResultConfirmed(_)
        | StateAction::ChatInputAnswerChanged(_)
        | StateAction::ChatInputCompleted(_)
        | StateAction::ChatDraftChanged(_)
        | StateAction::SessionConfigChanged(_) => true,
        StateAction::ChatPendingMessageSet(a) => a.kind == PendingMessageKind::Steering,
        _ => false,
    }
}

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No token was presented.
    #[error("authentication required: send `Authorization: Bearer <token>` or `?token=<token>`")]
    Missing,
    /// The token has expired.
    #[error("the token has expired")]
    Expired,
    /// Bad signature, bad shape, wrong algorithm.
    #[error("invalid token: {0}")]
    Invalid(String),
}

/// Verifies (and mints) tokens with one shared secret.
pub struct Authenticator {
    decoding: DecodingKey,
    encoding: EncodingKey,
}

impl Authenticator {
    /// Keys from the shared secret (at least 16 bytes).
    pub fn new(secret: &[u8]) -> Result<Self, AuthError> {
        if secret.len() < 16 {
            return Err(AuthError::Invalid(
                "the secret must be at least 16 bytes".into(),
            ));
        }
        let bad = |e: jsonwebtoken::errors::Error| AuthError::Invalid(e.to_string());
        Ok(Self {
            decoding: DecodingKey::from_secret(secret).map_err(bad)?,
            encoding: EncodingKey::from_secret(secret).map_err(bad)?,
        })
    }

    /// Sign `claims`.
    pub fn mint(&self, claims: &Claims) -> Result<String, AuthError> {
        encode(&Header::new(Algorithm::HS256), claims, &self.encoding)
            .map_err(|e| AuthError::Invalid(e.to_string()))
    }

    /// Check a presented token.
    pub fn verify(&self, token: &str) -> Result<Principal, AuthError> {
        let mut v = Validation::new(Algorithm::HS256);
        v.leeway = 0;
        v.set_required_spec_claims(&["exp", "sub"]);
        let data = decode::<Claims>(token, &self.decoding, &v).map_err(|e| match e.kind() {
            jsonwebtoken::errors::ErrorKind::ExpiredSignature => AuthError::Expired,
            _ => AuthError::Invalid(e.to_string()),
        })?;
        let c = data.claims;
        Ok(Principal {
            subject: c.sub,
            role: c.role,
            sessions: c.sessions.map(|s| Arc::new(s.into_iter().collect())),
        })
    }
}

/// Seconds since the Unix epoch.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(role: Role, exp: u64, sessions: Option<Vec<&str>>) -> Claims {
        Claims {
            sub: "alice".into(),
            role,
            exp,
            sessions: sessions.map(|s| s.into_iter().map(String::from).collect()),
        }
    }

    #[test]
    fn tokens_round_trip_and_scope_sessions() {
        let a = Authenticator::new(b"a-test-secret-of-32-bytes-length").expect("key");
        let t = a
            .mint(&claims(
                Role::Client,
                now_secs() + 60,
                Some(vec!["ahp-session:/x"]),
            ))
            .expect("mint");
        let p = a.verify(&t).expect("valid");
        assert_eq!(p.role, Role::Client);
        assert!(p.may_use_session("ahp-session:/x"));
        assert!(!p.may_use_session("ahp-session:/y"));
        assert!(!p.may_register_providers());
        let admin = a
            .verify(
                &a.mint(&claims(Role::Admin, now_secs() + 60, Some(vec![])))
                    .expect("mint"),
            )
            .expect("valid");
        assert!(
            admin.may_use_session("ahp-session:/y"),
            "admin sees everything"
        );
    }

    #[test]
    fn a_provider_id_passes_only_to_its_owner_or_an_admin() {
        let who = |subject: &str, role| Principal {
            subject: subject.into(),
            role,
            sessions: None,
        };
        assert!(who("alice", Role::Agent).may_take_over_provider("alice"));
        assert!(!who("mallory", Role::Agent).may_take_over_provider("alice"));
        assert!(!who("mallory", Role::Client).may_take_over_provider("alice"));
        assert!(who("ops", Role::Admin).may_take_over_provider("alice"));
    }

    #[test]
    fn steering_is_a_persons_act_and_queueing_is_not() {
        let act =
            |v: serde_json::Value| -> StateAction { serde_json::from_value(v).expect("action") };
        let message = serde_json::json!({"text": "x", "origin": {"kind": "user"}});
        let steering = act(
            serde_json::json!({"type": "chat/pendingMessageSet", "kind": "steering", "id": "s", "message": message}),
        );
        let queued = act(
            serde_json::json!({"type": "chat/pendingMessageSet", "kind": "queued", "id": "q", "message": message}),
        );
        let confirm = act(
            serde_json::json!({"type": "chat/toolCallConfirmed", "turnId": "t", "toolCallId": "c", "approved": true}),
        );
        let cancel =
            act(serde_json::json!({"type": "chat/turnCancelled", "turnId": "t", "duration": 1}));
        assert!(is_persons_act(&steering));
        assert!(!is_persons_act(&queued));
        assert!(is_persons_act(&confirm));
        assert!(!is_persons_act(&cancel));
    }

    #[test]
    fn expired_forged_and_garbage_tokens_are_refused() {
        let a = Authenticator::new(b"a-test-secret-of-32-bytes-length").expect("key");
        let old = a
            .mint(&claims(Role::Agent, now_secs() - 10, None))
            .expect("mint");
        assert_eq!(a.verify(&old), Err(AuthError::Expired));
        let forged = Authenticator::new(b"another-secret-of-enough-length!")
            .expect("key")
            .mint(&claims(Role::Admin, now_secs() + 60, None))
            .expect("mint");
        assert!(matches!(a.verify(&forged), Err(AuthError::Invalid(_))));
        assert!(matches!(a.verify("not.a.jwt"), Err(AuthError::Invalid(_))));
    }
}
