//! The subscriber's side of `agent-stream`: read one socket until the turn
//! ends, check every chunk arrives once and in order, keep the text and each
//! chunk's receive time.

use std::borrow::Cow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use hdrhistogram::Histogram;
use serde::Deserialize;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

use crate::clock::monotonic_ns;
use crate::conn::Ws;
use crate::proto;
use crate::stats::{new_hist, record_ns, Seen, SeqChecker, SeqOrder};

/// One chunk token: its number, and the agent's stamp when it has one
/// (`<i>@<ns>`; a scripted `<i>:----` has none).
pub(super) fn token(t: &str) -> Option<(u64, Option<u64>)> {
    let end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let index = t[..end].parse().ok()?;
    match t[end..].strip_prefix('@') {
        Some(stamp) => Some((index, Some(stamp.parse().ok()?))),
        None if t[end..].starts_with(':') || end == t.len() => Some((index, None)),
        None => None,
    }
}

/// The fields of an action the receivers look at.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ActionLite<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    turn_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
}

/// What one subscriber saw of the turn.
pub(super) struct Watch {
    pub(super) order: SeqOrder,
    pub(super) chunks: SeqChecker,
    /// Receive time (`CLOCK_MONOTONIC` ns) of chunk i at index i − 1; 0 = not yet.
    pub(super) arrivals: Vec<u64>,
    /// Agent's stamp → this subscriber, per chunk.
    pub(super) latency: Histogram<u64>,
    /// The deltas' text, concatenated.
    pub(super) text: String,
    pub(super) deltas: u64,
    pub(super) bad_tokens: u64,
    /// How the turn ended here (`chat/turnComplete` is the good end).
    pub(super) end: Option<String>,
    /// Why the socket ended early.
    pub(super) closed: Option<String>,
}

impl Watch {
    pub(super) fn new(from_seq: u64, chunks: u32) -> Self {
        Self {
            order: SeqOrder::after(from_seq),
            chunks: SeqChecker::default(),
            arrivals: vec![0; chunks as usize],
            latency: new_hist(),
            text: String::new(),
            deltas: 0,
            bad_tokens: 0,
            end: None,
            closed: None,
        }
    }

    /// One frame; returns whether the turn has ended.
    fn on_text(&mut self, text: &str, turn_id: &str, now: u64) -> bool {
        let Some(env) = proto::parse_action(text) else {
            return false;
        };
        if env.rejection_reason.is_some() {
            return false;
        }
        self.order.observe(env.server_seq);
        let Ok(action) = serde_json::from_str::<ActionLite>(env.action) else {
            return false;
        };
        if action.turn_id.as_deref() != Some(turn_id) {
            return false;
        }
        match action.kind.as_ref() {
            "chat/delta" => {
                let content = action.content.as_deref().unwrap_or("");
                self.deltas += 1;
                self.text.push_str(content);
                for t in content.split(' ').filter(|t| !t.is_empty()) {
                    let Some((i, stamp)) = token(t).filter(|(i, _)| *i >= 1) else {
                        self.bad_tokens += 1;
                        continue;
                    };
                    if self.chunks.observe(i) == Seen::Duplicate {
                        continue;
                    }
                    if let Some(slot) = self.arrivals.get_mut(i as usize - 1) {
                        *slot = now;
                    }
                    if let Some(stamp) = stamp {
                        record_ns(&mut self.latency, now.saturating_sub(stamp));
                    }
                }
                false
            }
            "chat/turnComplete" | "chat/turnCancelled" | "chat/error" => {
                self.end = Some(action.kind.into_owned());
                true
            }
            _ => false,
        }
    }
}

/// Read one subscriber's socket until its turn ends or `stop`.
pub(super) async fn watch_turn(
    mut ws: Ws,
    pending: Vec<String>,
    mut w: Watch,
    turn_id: Arc<str>,
    done: Arc<AtomicUsize>,
    mut stop: watch::Receiver<bool>,
) -> Watch {
    let mut ended = false;
    for text in pending {
        ended |= w.on_text(&text, &turn_id, monotonic_ns());
    }
    while !ended {
        let msg = tokio::select! {
            m = ws.next() => m,
            _ = stop.wait_for(|s| *s) => break,
        };
        let now = monotonic_ns();
        match msg {
            Some(Ok(Message::Text(t))) => ended = w.on_text(t.as_str(), &turn_id, now),
            Some(Ok(Message::Close(c))) => {
                w.closed = Some(format!("closed by the server: {c:?}"));
                break;
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                w.closed = Some(e.to_string());
                break;
            }
            None => {
                w.closed = Some("connection closed".into());
                break;
            }
        }
    }
    if ended {
        done.fetch_add(1, Ordering::Relaxed);
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), ws.close(None)).await;
    w
}

/// The ACP agent's text is only known once it is received: it must be
/// chunks 1..=N in order, each stamped, stamps never going back.
pub(super) fn well_formed_stamped(text: &str, chunks: u32) -> bool {
    let mut last_stamp = 0;
    let mut n = 0;
    for t in text.split(' ').filter(|t| !t.is_empty()) {
        n += 1;
        match token(t) {
            Some((i, Some(stamp))) if i == n && stamp >= last_stamp => last_stamp = stamp,
            _ => return false,
        }
    }
    n == u64::from(chunks) && text.ends_with(' ')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tokens_of_both_agents_parse() {
        assert_eq!(token("12@345"), Some((12, Some(345))));
        assert_eq!(token("0012:-----"), Some((12, None)));
        assert_eq!(token("7"), Some((7, None)));
        assert_eq!(token("x7"), None);
        assert_eq!(token("7@"), None);
    }

    #[test]
    fn stamped_text_must_be_complete_and_in_order() {
        assert!(well_formed_stamped("1@10 2@10 3@12 ", 3));
        assert!(!well_formed_stamped("1@10 3@12 ", 2));
        assert!(!well_formed_stamped("1@10 2@9 ", 2));
        assert!(!well_formed_stamped("1@10 2@11", 2));
        assert!(!well_formed_stamped("1@10 2 ", 2));
    }

    #[test]
    fn a_watch_counts_duplicates_and_the_end_of_its_turn() {
        let frame = |seq: u64, action: serde_json::Value| {
            format!(
                r#"{{"jsonrpc":"2.0","method":"action","params":{{"channel":"ahp-chat:/c","action":{action},"serverSeq":{seq}}}}}"#
            )
        };
        let delta =
            |c: &str| json!({"type": "chat/delta", "turnId": "t", "partId": "p", "content": c});
        let mut w = Watch::new(0, 3);
        assert!(!w.on_text(&frame(1, delta("1@100 ")), "t", 150));
        assert!(!w.on_text(&frame(2, delta("2@200 ")), "t", 260));
        assert!(!w.on_text(&frame(2, delta("2@200 ")), "t", 270));
        assert!(!w.on_text(
            &frame(
                3,
                json!({"type": "chat/delta", "turnId": "other", "partId": "p", "content": "9 "})
            ),
            "t",
            280
        ));
        assert!(w.on_text(
            &frame(
                4,
                json!({"type": "chat/turnComplete", "turnId": "t", "duration": 1})
            ),
            "t",
            300
        ));
        assert_eq!(w.text, "1@100 2@200 2@200 ");
        assert_eq!(
            (w.chunks.unique, w.chunks.duplicates, w.order.duplicates),
            (2, 1, 1)
        );
        assert_eq!(w.arrivals, vec![150, 260, 0]);
        assert_eq!(w.end.as_deref(), Some("chat/turnComplete"));
    }
}
