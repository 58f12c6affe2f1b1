//! The built-in `scripted` agent: deterministic behaviour driven by the user
//! message, so people and tests can exercise every interaction without a
//! model. See `docs/protocol.md`, "The `scripted` agent".

use std::collections::BTreeMap;
use std::time::Duration;

use ahp_types::actions::{
    ChatDeltaAction, ChatResponsePartAction, ChatToolCallCompleteAction, ChatTurnCompleteAction,
    StateAction,
};
use ahp_types::state::{
    AgentCapabilities, AgentInfo, ChatInputAnswer, ChatInputQuestion, ChatInputRequest,
    MarkdownResponsePart, MultipleChatsCapability, ResponsePart, ToolCallResult, ToolResultContent,
    ToolResultTextContent,
};
use serde::Deserialize;
use serde_json::json;

use super::{Agent, AgentTurn, ChatHandle};
use crate::channels::Rejection;
use crate::interactions::{Interaction, Outcome, Settlement};
use crate::time::millis_since;

/// Provider id of the built-in agent.
pub const PROVIDER_ID: &str = "scripted";

/// How many deltas `/slow` streams when the message does not say.
const SLOW_DEFAULT_CHUNKS: usize = 20;

/// The built-in agent. Stateless: every turn runs as its own task.
pub struct ScriptedAgent;

impl Agent for ScriptedAgent {
    fn info(&self) -> AgentInfo {
        AgentInfo {
            provider: PROVIDER_ID.into(),
            display_name: "Scripted agent".into(),
            description: "Built-in agent driven by commands: /ask, /tool, /tool-ro, /demo, /slow; anything else is echoed.".into(),
            models: Vec::new(),
            protected_resources: None,
            customizations: None,
            capabilities: Some(AgentCapabilities {
                multiple_chats: Some(MultipleChatsCapability::default()),
                multiple_working_directories: None,
            }),
        }
    }

    fn start_turn(&self, turn: AgentTurn) {
        actix::spawn(async move {
            let chat = turn.handle.chat.clone();
            if let Err(r) = run(turn.handle, turn.message.text).await {
                // The turn was cancelled or the chat went away: nothing to do.
                tracing::debug!(%chat, reason = %r, "scripted turn stopped");
            }
        });
    }
}

/// `/ask` payload.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AskSpec {
    message: Option<String>,
    url: Option<String>,
    questions: Option<Vec<ChatInputQuestion>>,
    auto_resolution_ms: Option<u64>,
}

async fn run(h: ChatHandle, text: String) -> Result<(), Rejection> {
    let text = text.trim();
    let (command, rest) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
    let rest = rest.trim();
    match command {
        "/ask" => ask(&h, rest).await,
        "/tool" | "/tool-ro" => {
            let (name, input) = rest.split_once(char::is_whitespace).unwrap_or((rest, "{}"));
            if name.is_empty() {
                return finish(&h, "error: usage: /tool <name> <json>").await;
            }
            let input = input.trim();
            if let Err(e) = serde_json::from_str::<serde_json::Value>(input) {
                return finish(&h, &format!("error: tool input is not JSON: {e}")).await;
            }
            match tool(&h, name, input, command == "/tool-ro").await? {
                Some(line) => finish(&h, &line).await,
                None => Ok(()),
            }
        }
        "/demo" => demo(&h).await,
        "/slow" => {
            let (spec, body) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            match parse_slow(spec) {
                Some((ms, chunks)) => slow(&h, ms, chunks, body).await,
                None => finish(&h, "error: usage: /slow <ms>[x<chunks>] <text>").await,
            }
        }
        _ => finish(&h, &format!("echo: {text}")).await,
    }
}

async fn ask(h: &ChatHandle, payload: &str) -> Result<(), Rejection> {
    let spec: AskSpec = match serde_json::from_str(if payload.is_empty() { "{}" } else { payload })
    {
        Ok(s) => s,
        Err(e) => {
            return finish(
                h,
                &format!(
                    "error: /ask expects {{message?, url?, questions?, autoResolutionMs?}}: {e}"
                ),
            )
            .await
        }
    };
    let request = ChatInputRequest {
        id: uuid::Uuid::new_v4().to_string(),
        message: spec.message,
        url: spec.url,
        questions: spec.questions,
        answers: None,
    };
    let settled = h
        .interact(Interaction::Input {
            request,
            auto_resolution_ms: spec.auto_resolution_ms,
        })
        .await;
    report(h, &settled).await
}

/// Append `settled: <outcome>` and the final answers, then complete — unless
/// the turn is gone, in which case there is nobody to tell.
async fn report(h: &ChatHandle, s: &Settlement) -> Result<(), Rejection> {
    if s.outcome == Outcome::Interrupted {
        return Ok(());
    }
    // `aborted` with the turn still running (a refused request) is reported;
    // if the turn is gone the emit below fails and nothing is written.
    let answers: BTreeMap<String, ChatInputAnswer> = s.answers.clone().unwrap_or_default();
    let mut body = json!({"answers": answers});
    if let Some(c) = &s.clarification {
        body["clarification"] = json!(c);
    }
    if s.outcome == Outcome::Aborted {
        body["reason"] = json!(s.reason);
    }
    let text = format!("settled: {}\n{}", s.outcome.as_str(), body);
    finish(h, &text).await
}

/// Ask approval for a tool call and run it. `None` when the turn is gone.
async fn tool(
    h: &ChatHandle,
    name: &str,
    input: &str,
    read_only: bool,
) -> Result<Option<String>, Rejection> {
    let tool_call_id = format!("call-{}", uuid::Uuid::new_v4());
    let s = h
        .interact(Interaction::ToolApproval {
            options: None,
            tool_call_id: tool_call_id.clone(),
            tool_name: name.into(),
            input: input.into(),
            read_only,
            editable: true,
            title: None,
        })
        .await;
    match s.outcome {
        Outcome::Approved => {
            let used = s
                .edited_tool_input
                .clone()
                .unwrap_or_else(|| input.to_owned());
            h.emit(StateAction::ChatToolCallComplete(
                ChatToolCallCompleteAction {
                    turn_id: h.turn_id.clone(),
                    tool_call_id,
                    meta: None,
                    result: ToolCallResult {
                        success: true,
                        past_tense_message: format!("Ran `{name}`").into(),
                        content: Some(vec![ToolResultContent::Text(ToolResultTextContent {
                            text: used,
                        })]),
                        structured_content: None,
                        error: None,
                    },
                    requires_result_confirmation: None,
                },
            ))
            .await?;
            Ok(Some(format!("tool {name}: approved")))
        }
        Outcome::Denied => Ok(Some(format!("tool {name}: denied"))),
        _ => Ok(None),
    }
}

async fn demo(h: &ChatHandle) -> Result<(), Rejection> {
    let questions: Vec<ChatInputQuestion> = serde_json::from_value(json!([
        {"kind": "text", "id": "name", "title": "Name", "message": "What should we call the release?", "required": true, "min": 1, "max": 40},
        {"kind": "integer", "id": "replicas", "title": "Replicas", "message": "How many replicas?", "required": true, "min": 1, "max": 10, "defaultValue": 2},
        {"kind": "boolean", "id": "canary", "title": "Canary", "message": "Roll out to a canary first?", "defaultValue": true},
        {"kind": "single-select", "id": "region", "title": "Region", "message": "Where should it run?", "required": true, "allowFreeformInput": true, "options": [
            {"id": "eu-west", "label": "EU West", "description": "Dublin", "recommended": true},
            {"id": "us-east", "label": "US East", "description": "Virginia"},
            {"id": "ap-south", "label": "AP South", "description": "Mumbai"}
        ]},
        {"kind": "multi-select", "id": "checks", "title": "Checks", "message": "Which checks must pass?", "min": 1, "max": 3, "options": [
            {"id": "unit", "label": "Unit tests"},
            {"id": "e2e", "label": "End-to-end tests"},
            {"id": "lint", "label": "Lint"},
            {"id": "perf", "label": "Performance budget", "description": "p99 under 25 ms"}
        ]}
    ]))
    .map_err(|e| Rejection::new(format!("demo questions: {e}")))?;
    let settled = h
        .interact(Interaction::Input {
            request: ChatInputRequest {
                id: uuid::Uuid::new_v4().to_string(),
                message: Some("Plan the release".into()),
                url: None,
                questions: Some(questions),
                answers: None,
            },
            auto_resolution_ms: None,
        })
        .await;
    if matches!(settled.outcome, Outcome::Interrupted | Outcome::Aborted) {
        return Ok(());
    }
    let answers =
        serde_json::to_string(&settled.answers.clone().unwrap_or_default()).unwrap_or_default();
    let input =
        json!({"plan": serde_json::from_str::<serde_json::Value>(&answers).unwrap_or_default()})
            .to_string();
    let Some(tool_line) = tool(h, "deploy", &input, false).await? else {
        return Ok(());
    };
    finish(
        h,
        &format!(
            "settled: {}\n{answers}\n{tool_line}",
            settled.outcome.as_str()
        ),
    )
    .await
}

/// `/slow`'s first word: `<ms>` or `<ms>x<chunks>`.
fn parse_slow(spec: &str) -> Option<(u64, Option<usize>)> {
    match spec.split_once('x') {
        Some((ms, chunks)) => Some((ms.parse().ok()?, Some(chunks.parse().ok()?))),
        None => Some((spec.parse().ok()?, None)),
    }
}

/// Streams `text` in `chunks` deltas (default: up to [`SLOW_DEFAULT_CHUNKS`]),
/// at most one per character, spread evenly over `ms`. Chunk `i` is due
/// `i × ms / chunks` after the start, whatever the previous emits took, so
/// a long stream (the load generator's `agent-stream` asks for thousands)
/// keeps its rate instead of drifting by the timer's rounding at every step.
async fn slow(h: &ChatHandle, ms: u64, chunks: Option<usize>, text: &str) -> Result<(), Rejection> {
    let part_id = uuid::Uuid::new_v4().to_string();
    h.emit(markdown(&h.turn_id, &part_id, "")).await?;
    let chars: Vec<char> = text.chars().collect();
    let chunks = chunks
        .unwrap_or(SLOW_DEFAULT_CHUNKS)
        .clamp(1, chars.len().max(1));
    let size = chars.len().div_ceil(chunks).max(1);
    let pause = Duration::from_millis(ms) / chunks as u32;
    let start = tokio::time::Instant::now();
    for (i, chunk) in chars.chunks(size).enumerate() {
        tokio::time::sleep_until(start + pause * (i as u32 + 1)).await;
        h.emit(StateAction::ChatDelta(ChatDeltaAction {
            turn_id: h.turn_id.clone(),
            part_id: part_id.clone(),
            content: chunk.iter().collect(),
            meta: None,
        }))
        .await?;
    }
    complete(h).await
}

fn markdown(turn_id: &str, part_id: &str, content: &str) -> StateAction {
    StateAction::ChatResponsePart(ChatResponsePartAction {
        turn_id: turn_id.to_owned(),
        part: ResponsePart::Markdown(MarkdownResponsePart {
            id: part_id.to_owned(),
            content: content.to_owned(),
        }),
        meta: None,
    })
}

/// One markdown part, then complete the turn.
async fn finish(h: &ChatHandle, text: &str) -> Result<(), Rejection> {
    h.emit(markdown(
        &h.turn_id,
        &uuid::Uuid::new_v4().to_string(),
        text,
    ))
    .await?;
    complete(h).await
}

async fn complete(h: &ChatHandle) -> Result<(), Rejection> {
    h.emit(StateAction::ChatTurnComplete(ChatTurnCompleteAction {
        turn_id: h.turn_id.clone(),
        duration: millis_since(&h.started_at),
        meta: None,
    }))
    .await
}
