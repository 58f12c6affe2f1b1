//! An external agent on a provider connection, built on the official client:
//! `tandem/*` notifications (which the official client does not route) are
//! teed off to the test.

use ahp::transport::{Transport, TransportMessage};
use ahp::{Client, ClientError, ClientEvent, SubscriptionEvent, TransportError};
use ahp_types::actions::ActionEnvelope;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::{action, client_config, WAIT};

/// The official WebSocket transport, with `tandem/*` notifications teed off.
struct TeeTransport {
    inner: ahp_ws::WebSocketTransport,
    tandem: mpsc::UnboundedSender<Value>,
}

impl Transport for TeeTransport {
    async fn send(&mut self, msg: TransportMessage) -> Result<(), TransportError> {
        self.inner.send(msg).await
    }

    async fn recv(&mut self) -> Result<Option<TransportMessage>, TransportError> {
        loop {
            let Some(msg) = self.inner.recv().await? else {
                return Ok(None);
            };
            let text = match &msg {
                TransportMessage::Text(t) => t.clone(),
                _ => return Ok(Some(msg)),
            };
            let v: Value = serde_json::from_str(&text).unwrap_or_default();
            if v.get("id").is_none()
                && v["method"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("tandem/"))
            {
                let _ = self.tandem.send(v);
                continue;
            }
            return Ok(Some(msg));
        }
    }

    async fn close(&mut self) -> Result<(), TransportError> {
        self.inner.close().await
    }
}

/// An external agent built on the official client.
pub struct Provider {
    pub client: Client,
    /// Its `clientId`.
    pub id: String,
    /// `tandem/*` notifications, in arrival order.
    pub notes: mpsc::UnboundedReceiver<Value>,
    /// Every other event (its own echoes among them).
    pub events: ahp::ClientEventStream,
}

impl Provider {
    /// Connect to `url` (which may carry `?token=…`) and initialize as
    /// `client_id`, without registering anything.
    pub async fn open(url: &str, client_id: &str) -> Self {
        let (tx, notes) = mpsc::unbounded_channel();
        let inner = ahp_ws::WebSocketTransport::connect(url)
            .await
            .expect("connect");
        let client = Client::connect(TeeTransport { inner, tandem: tx }, client_config())
            .await
            .expect("client");
        let events = client.events();
        client
            .initialize(client_id.into(), vec!["1.0.0".into()], vec![])
            .await
            .expect("initialize");
        Self {
            client,
            id: client_id.into(),
            notes,
            events,
        }
    }

    /// Connect and register `provider`.
    pub async fn connect(url: &str, provider: &str) -> Self {
        let p = Self::open(url, &format!("agent-{provider}")).await;
        p.register(provider).await.expect("register");
        p
    }

    /// `tandem/registerProvider`.
    pub async fn register(&self, provider: &str) -> Result<Value, ClientError> {
        self.client
            .request(
                "tandem/registerProvider",
                json!({"channel": "ahp-root://", "provider": provider, "displayName": "Test agent"}),
            )
            .await
    }

    /// The next `tandem/turn`: (chat, turn id, message text).
    pub async fn next_turn(&mut self) -> (String, String, String) {
        loop {
            let n = tokio::time::timeout(WAIT, self.notes.recv())
                .await
                .expect("a turn")
                .expect("open");
            if n["method"] == "tandem/turn" {
                let p = &n["params"];
                return (
                    p["channel"].as_str().unwrap_or_default().into(),
                    p["turnId"].as_str().unwrap_or_default().into(),
                    p["message"]["text"].as_str().unwrap_or_default().into(),
                );
            }
        }
    }

    pub async fn interact(&self, chat: &str, turn: &str, interaction: Value) -> Value {
        self.client
            .request(
                "tandem/requestInteraction",
                json!({"channel": chat, "turnId": turn, "interaction": interaction}),
            )
            .await
            .expect("requestInteraction")
    }

    /// Ask for an interaction without waiting: the answer arrives through the
    /// returned task once a person settles it.
    pub fn interact_later(
        &self,
        chat: &str,
        turn: &str,
        interaction: Value,
    ) -> tokio::task::JoinHandle<Result<Value, ClientError>> {
        let client = self.client.clone();
        let params = json!({"channel": chat, "turnId": turn, "interaction": interaction});
        tokio::spawn(async move {
            client
                .request::<_, Value>("tandem/requestInteraction", params)
                .await
        })
    }

    /// Dispatch an action; returns its `clientSeq`.
    pub async fn act(&self, chat: &str, a: Value) -> i64 {
        self.client
            .dispatch(chat.into(), action(a))
            .await
            .expect("dispatch")
            .client_seq
    }

    /// The echo (or rejection) of our own dispatch `client_seq`.
    pub async fn wait_echo(&mut self, client_seq: i64) -> ActionEnvelope {
        loop {
            let ev = tokio::time::timeout(WAIT, self.events.recv())
                .await
                .expect("timed out waiting for an echo")
                .expect("client closed");
            if let ClientEvent {
                event: SubscriptionEvent::Action(env),
                ..
            } = ev
            {
                if env
                    .origin
                    .as_ref()
                    .is_some_and(|o| o.client_id == self.id && o.client_seq == client_seq)
                {
                    return env;
                }
            }
        }
    }

    pub async fn finish(&self, chat: &str, turn: &str, text: &str) {
        self.act(chat, json!({"type": "chat/responsePart", "turnId": turn, "part": {"kind": "markdown", "id": uuid::Uuid::new_v4().to_string(), "content": text}})).await;
        self.act(
            chat,
            json!({"type": "chat/turnComplete", "turnId": turn, "duration": 1}),
        )
        .await;
    }
}

/// `createSession` with `provider`; returns (session, default chat).
pub async fn session_with(c: &super::TestClient, provider: &str) -> (String, String) {
    let session = format!("ahp-session:/{}", uuid::Uuid::new_v4());
    session_at(c, &session, provider).await;
    let chat = c
        .subscribe_session(&session)
        .await
        .default_chat
        .expect("default chat");
    (session, chat)
}

/// `createSession` of `session` with `provider`.
pub async fn session_at(c: &super::TestClient, session: &str, provider: &str) {
    let _: Value = c
        .client
        .request(
            "createSession",
            json!({"channel": session, "provider": provider}),
        )
        .await
        .expect("createSession");
}
