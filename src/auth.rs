//! Who is on a connection, and what they may do.
//!
//! With a secret configured, every WebSocket upgrade must carry a bearer
//! token (`Authorization: Bearer …`, or `?token=…` for browsers): a JWT signed
//! with HS256 that names a role, an expiry, and optionally the sessions it may
//! use. Without a secret the server trusts its callers — and so only listens
//! on loopback.
//!
//! The secret is used as raw bytes. A secret that is set but unusable
//! (empty, too short, an environment variable that is not UTF-8) stops the
//! server from starting: silently serving without authentication, or with a
//! weaker key than the operator meant, is worse than not serving.

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ahp_types::actions::StateAction;
use ahp_types::state::PendingMessageKind;
use jsonwebtoken::{decode, encode, Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::ids::ChannelUri;

/// What a token lets its holder be.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A person's client: sessions, chats, answers, approvals.
    #[default]
    Client,
    /// An agent: everything a client may do, plus registering providers.
    Agent,
    /// Everything, on every session.
    Admin,
}

impl Role {
    /// Its name in tokens and logs (`client`, `agent`, `admin`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Client => "client",
            Role::Agent => "agent",
            Role::Admin => "admin",
        }
    }
}

/// The claims of a Tandem token.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// The person's display name (what others see: presence, authors,
    /// "approved by"); absent: the subject.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What the holder may do in given sessions (session URI → access),
    /// over what the session itself grants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<std::collections::BTreeMap<String, crate::people::Access>>,
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
    /// When its token expires, seconds since the Unix epoch (`None`: never,
    /// as without authentication). An open socket is closed at that moment:
    /// a token checked only at the upgrade would otherwise live as long as
    /// the connection.
    pub expires_at_secs: Option<u64>,
    /// The display name its token gives (`None`: none given, or no
    /// authentication — then the client may choose one).
    pub name: Option<String>,
    /// Access its token gives in given sessions.
    pub access: Arc<std::collections::BTreeMap<String, crate::people::Access>>,
    /// The invite link it came in through, instead of a token.
    pub invite: Option<Arc<crate::invites::Guest>>,
}

impl Principal {
    /// A caller on a server without authentication (loopback only).
    pub fn local() -> Self {
        Self {
            subject: "local".into(),
            role: Role::Admin,
            sessions: None,
            expires_at_secs: None,
            name: None,
            access: Arc::default(),
            invite: None,
        }
    }

    /// Time left until its token expires (zero once it has); `None` when it
    /// never does.
    pub fn expires_in(&self) -> Option<Duration> {
        let exp = self.expires_at_secs?;
        let at = UNIX_EPOCH.checked_add(Duration::from_secs(exp));
        Some(match at {
            Some(at) => at.duration_since(SystemTime::now()).unwrap_or_default(),
            // Beyond what the clock can represent: as good as never.
            None => Duration::MAX,
        })
    }

    /// May it see and act on session `uri`?
    pub fn may_use_session(&self, uri: &ChannelUri) -> bool {
        match self.role {
            Role::Admin => true,
            Role::Client | Role::Agent => self
                .sessions
                .as_ref()
                .is_none_or(|s| s.contains(uri.as_str())),
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

/// The shortest secret accepted, in bytes: RFC 7518 §3.2 requires an HS256
/// key of at least the hash's size (256 bits).
pub const MIN_SECRET_BYTES: usize = 32;

/// The environment variable that may hold the secret.
pub const SECRET_ENV: &str = "TANDEM_AUTH_SECRET";

/// Where a secret came from (named in errors so the operator knows what to fix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// `--auth-secret-file`.
    File(PathBuf),
    /// [`SECRET_ENV`].
    Env,
    /// Handed to the library in `Config::auth_secret`.
    Config,
}

impl std::fmt::Display for SecretSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SecretSource::File(p) => write!(f, "the secret file {}", p.display()),
            SecretSource::Env => write!(f, "{SECRET_ENV}"),
            SecretSource::Config => write!(f, "the configured auth secret"),
        }
    }
}

/// Why a secret that is set cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// The file could not be read.
    #[error("cannot read the secret file {path}: {reason}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        reason: String,
    },
    /// Set, but nothing (or only whitespace) in it.
    #[error("{0} is set but empty: give a secret of at least {MIN_SECRET_BYTES} bytes, or unset it to run without authentication on loopback")]
    Empty(SecretSource),
    /// The environment variable is not UTF-8 (use a file for a binary secret).
    #[error("{0} is not valid UTF-8: put a binary secret in a file and pass --auth-secret-file")]
    NotUtf8(SecretSource),
    /// Shorter than [`MIN_SECRET_BYTES`].
    #[error("{from} holds {len} bytes; a secret must be at least {MIN_SECRET_BYTES} bytes (e.g. `head -c 32 /dev/urandom | base64`)")]
    TooShort {
        /// Where it came from.
        from: SecretSource,
        /// Its length after trimming.
        len: usize,
    },
    /// The JWT library would not make a key of it.
    #[error("the secret cannot be used as an HS256 key: {0}")]
    Refused(String),
}

/// A secret as given, minus trailing ASCII whitespace (a file written by
/// `echo` ends with a newline, and an exported variable may too), checked
/// for length. Only the end is trimmed, and the same way for every source,
/// so the file and the variable holding the same text give the same key.
pub fn clean_secret(raw: &[u8], source: SecretSource) -> Result<Vec<u8>, SecretError> {
    let bytes = raw.trim_ascii_end();
    if bytes.is_empty() {
        return Err(SecretError::Empty(source));
    }
    if bytes.len() < MIN_SECRET_BYTES {
        return Err(SecretError::TooShort {
            from: source,
            len: bytes.len(),
        });
    }
    Ok(bytes.to_vec())
}

/// The secret from `file` if given, else from the value of [`SECRET_ENV`]
/// (`env`, `None` when unset). `Ok(None)`: no secret at all.
pub fn load_secret(
    file: Option<&Path>,
    env: Option<OsString>,
) -> Result<Option<Vec<u8>>, SecretError> {
    if let Some(path) = file {
        let raw = std::fs::read(path).map_err(|e| SecretError::Unreadable {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        return clean_secret(&raw, SecretSource::File(path.to_owned())).map(Some);
    }
    let Some(value) = env else {
        return Ok(None);
    };
    let value = value
        .into_string()
        .map_err(|_| SecretError::NotUtf8(SecretSource::Env))?;
    clean_secret(value.as_bytes(), SecretSource::Env).map(Some)
}

/// Verifies (and mints) tokens with one shared secret.
pub struct Authenticator {
    decoding: DecodingKey,
    encoding: EncodingKey,
}

impl Authenticator {
    /// Keys from the shared secret, used byte for byte (at least
    /// [`MIN_SECRET_BYTES`]).
    pub fn new(secret: &[u8]) -> Result<Self, SecretError> {
        if secret.len() < MIN_SECRET_BYTES {
            return Err(SecretError::TooShort {
                from: SecretSource::Config,
                len: secret.len(),
            });
        }
        let refused = |e: jsonwebtoken::errors::Error| SecretError::Refused(e.to_string());
        Ok(Self {
            decoding: DecodingKey::from_secret(secret).map_err(refused)?,
            encoding: EncodingKey::from_secret(secret).map_err(refused)?,
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
        // RFC 7519: `exp` is the time "on or after which" the token must not
        // be accepted (the library alone accepts it during that second), and
        // the moment an open socket is closed.
        v.reject_tokens_expiring_in_less_than = 1;
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
            expires_at_secs: Some(c.exp),
            name: c.name.as_deref().and_then(crate::people::clean_name),
            access: Arc::new(c.access.unwrap_or_default()),
            invite: None,
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
            ..Claims::default()
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
        assert!(p.may_use_session(&"ahp-session:/x".into()));
        assert!(!p.may_use_session(&"ahp-session:/y".into()));
        assert!(!p.may_register_providers());
        let admin = a
            .verify(
                &a.mint(&claims(Role::Admin, now_secs() + 60, Some(vec![])))
                    .expect("mint"),
            )
            .expect("valid");
        assert!(
            admin.may_use_session(&"ahp-session:/y".into()),
            "admin sees everything"
        );
    }

    #[test]
    fn a_provider_id_passes_only_to_its_owner_or_an_admin() {
        let who = |subject: &str, role| Principal {
            subject: subject.into(),
            role,
            ..Principal::local()
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
        let now = a
            .mint(&claims(Role::Agent, now_secs(), None))
            .expect("mint");
        assert_eq!(a.verify(&now), Err(AuthError::Expired), "on `exp` itself");
        let forged = Authenticator::new(b"another-secret-of-enough-length!")
            .expect("key")
            .mint(&claims(Role::Admin, now_secs() + 60, None))
            .expect("mint");
        assert!(matches!(a.verify(&forged), Err(AuthError::Invalid(_))));
        assert!(matches!(a.verify("not.a.jwt"), Err(AuthError::Invalid(_))));
    }

    fn temp_file(bytes: &[u8]) -> PathBuf {
        let p = std::env::temp_dir().join(format!("tandem-secret-{}", uuid::Uuid::new_v4()));
        std::fs::write(&p, bytes).expect("write the secret file");
        p
    }

    #[test]
    fn secrets_are_raw_bytes_trimmed_only_at_the_end_alike_from_both_sources() {
        let text = "0123456789abcdef0123456789abcdef";
        let file = temp_file(format!("{text}\n").as_bytes());
        let from_file = load_secret(Some(&file), None).expect("file secret");
        let from_env = load_secret(None, Some(format!("{text} \r\n").into())).expect("env");
        assert_eq!(from_file.as_deref(), Some(text.as_bytes()));
        assert_eq!(from_file, from_env, "the same text gives the same key");
        // Leading whitespace is part of the secret.
        let lead = load_secret(None, Some(format!(" {text}").into())).expect("env");
        assert_eq!(lead.map(|s| s.len()), Some(33));
        // Two binary secrets stay distinct (a lossy UTF-8 conversion made
        // both the same run of U+FFFD).
        let (a, b) = (temp_file(&[0xff; 32]), temp_file(&[0xfe; 32]));
        let (ka, kb) = (
            load_secret(Some(&a), None).expect("binary a"),
            load_secret(Some(&b), None).expect("binary b"),
        );
        assert_eq!(ka.as_deref(), Some(&[0xff; 32][..]));
        assert_ne!(ka, kb);
        for f in [file, a, b] {
            let _ = std::fs::remove_file(f);
        }
    }

    #[test]
    fn a_set_but_unusable_secret_is_an_error_not_no_auth() {
        assert_eq!(load_secret(None, None), Ok(None), "unset: no auth");
        assert_eq!(
            load_secret(None, Some("".into())),
            Err(SecretError::Empty(SecretSource::Env))
        );
        assert_eq!(
            load_secret(None, Some(" \n".into())),
            Err(SecretError::Empty(SecretSource::Env))
        );
        #[cfg(unix)]
        {
            use std::os::unix::ffi::OsStringExt;
            let binary = OsString::from_vec(vec![0xff; 40]);
            assert_eq!(
                load_secret(None, Some(binary)),
                Err(SecretError::NotUtf8(SecretSource::Env))
            );
        }
        assert_eq!(
            load_secret(None, Some("x".repeat(MIN_SECRET_BYTES - 1).into())),
            Err(SecretError::TooShort {
                from: SecretSource::Env,
                len: MIN_SECRET_BYTES - 1
            })
        );
        let short = temp_file(&[0xff; 6]);
        let err = load_secret(Some(&short), None).expect_err("6 bytes");
        assert!(
            matches!(err, SecretError::TooShort { len: 6, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("at least 32 bytes"), "{err}");
        let _ = std::fs::remove_file(short);
        let missing = std::env::temp_dir().join("tandem-no-such-secret-file");
        assert!(matches!(
            load_secret(Some(&missing), Some("y".repeat(40).into())),
            Err(SecretError::Unreadable { .. })
        ));
        assert!(Authenticator::new(&[b'k'; MIN_SECRET_BYTES - 1]).is_err());
        assert!(Authenticator::new(&[b'k'; MIN_SECRET_BYTES]).is_ok());
    }

    #[test]
    fn a_principal_knows_when_its_token_expires() {
        let a = Authenticator::new(b"a-test-secret-of-32-bytes-length").expect("key");
        let exp = now_secs() + 100;
        let p = a
            .verify(&a.mint(&claims(Role::Client, exp, None)).expect("mint"))
            .expect("valid");
        assert_eq!(p.expires_at_secs, Some(exp));
        let left = p.expires_in().expect("expires");
        assert!(left > Duration::from_secs(98) && left <= Duration::from_secs(100));
        assert_eq!(Principal::local().expires_in(), None);
        let past = Principal {
            expires_at_secs: Some(1),
            ..Principal::local()
        };
        assert_eq!(past.expires_in(), Some(Duration::ZERO));
        let far = Principal {
            expires_at_secs: Some(u64::MAX),
            ..Principal::local()
        };
        assert!(far
            .expires_in()
            .is_some_and(|d| d > Duration::from_secs(1 << 40)));
    }
}
