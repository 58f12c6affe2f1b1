//! Walkthrough: two AHP clients answer one agent question together.
//!
//! Start the server (`cargo run -- serve`), then run
//! `cargo run --example two_clients` (optionally with a `ws://…/ahp` URL).
//! Client A starts a turn with `/ask`, A drafts one answer, B drafts the
//! other, B submits, and both print the settled turn.

use std::time::Duration;

use ahp::{Client, ClientConfig, SubscriptionEvent};
use ahp_types::actions::{ChatTurnStartedAction, StateAction};
use ahp_types::state::{Message, MessageKind, MessageOrigin, ResponsePart, SnapshotState};
use serde_json::{json, Value};

async fn connect(url: &str, id: &str) -> anyhow::Result<Client> {
    let client = Client::connect(
        ahp_ws::WebSocketTransport::connect(url).await?,
        ClientConfig::default(),
    )
    .await?;
    client
        .initialize(id.into(), vec!["1.0.0".into()], vec![])
        .await?;
    Ok(client)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "ws://127.0.0.1:7420/ahp".into());
    let a = connect(&url, "walkthrough-a").await?;
    let b = connect(&url, "walkthrough-b").await?;

    let session = format!("ahp-session:/{}", uuid::Uuid::new_v4());
    let _: Value = a
        .request(
            "createSession",
            json!({"channel": session, "provider": "scripted"}),
        )
        .await?;
    let (snap, _) = a.subscribe(session.clone()).await?;
    let Some(SnapshotState::Session(s)) = snap.snapshot.map(|s| s.state) else {
        anyhow::bail!("no session snapshot")
    };
    let chat = s
        .default_chat
        .ok_or_else(|| anyhow::anyhow!("no default chat"))?;
    let (_, mut sub_a) = a.subscribe(chat.clone()).await?;
    let (_, mut sub_b) = b.subscribe(chat.clone()).await?;
    println!("session {session}\nchat    {chat}");

    let ask = json!({"message": "Release plan", "questions": [
        {"kind": "text", "id": "version", "message": "Version?", "required": true},
        {"kind": "text", "id": "owner", "message": "Owner?", "required": true}
    ]});
    a.dispatch(
        chat.clone(),
        StateAction::ChatTurnStarted(ChatTurnStartedAction {
            turn_id: uuid::Uuid::new_v4().to_string(),
            started_at: tandem::time::now_rfc3339(),
            message: Message {
                text: format!("/ask {ask}"),
                origin: MessageOrigin {
                    kind: MessageKind::User,
                },
                attachments: None,
                model: None,
                agent: None,
                meta: None,
            },
            queued_message_id: None,
            meta: None,
        }),
    )
    .await?;

    let request_id = loop {
        if let Some(SubscriptionEvent::Action(env)) =
            tokio::time::timeout(Duration::from_secs(10), sub_b.recv()).await?
        {
            if let StateAction::ChatInputRequested(r) = env.action {
                println!("B sees the question: {:?}", r.request.message);
                break r.request.id;
            }
        }
    };
    let draft = |q: &str, v: &str, state: &str| json!({"type": "chat/inputAnswerChanged", "requestId": request_id, "questionId": q, "answer": {"state": state, "value": {"kind": "text", "value": v}}});
    a.dispatch(
        chat.clone(),
        serde_json::from_value(draft("version", "2.4.0", "draft"))?,
    )
    .await?;
    b.dispatch(
        chat.clone(),
        serde_json::from_value(draft("owner", "payments", "draft"))?,
    )
    .await?;
    b.dispatch(chat.clone(), serde_json::from_value(json!({"type": "chat/inputCompleted", "requestId": request_id, "response": "accept", "answers": {
        "version": draft("version", "2.4.0", "submitted")["answer"], "owner": draft("owner", "payments", "submitted")["answer"]}}))?).await?;

    for (name, sub) in [("A", &mut sub_a), ("B", &mut sub_b)] {
        loop {
            let Some(SubscriptionEvent::Action(env)) =
                tokio::time::timeout(Duration::from_secs(10), sub.recv()).await?
            else {
                continue;
            };
            match &env.action {
                StateAction::ChatInputAnswerChanged(c) => println!(
                    "{name} sees draft {} (seq {})",
                    c.question_id, env.server_seq
                ),
                StateAction::ChatResponsePart(p) => {
                    if let ResponsePart::Markdown(m) = &p.part {
                        println!(
                            "{name} sees the agent resume:\n  {}",
                            m.content.replace('\n', "\n  ")
                        );
                    }
                }
                StateAction::ChatTurnComplete(_) => break,
                _ => {}
            }
        }
    }
    a.shutdown().await;
    b.shutdown().await;
    Ok(())
}
