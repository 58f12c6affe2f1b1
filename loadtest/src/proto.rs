//! The few AHP frames the load generator sends, built by hand (they are on
//! the hot path), and a borrowing parser for what it receives.
//!
//! Every measured action carries a *stamp* `lt:<publisher>:<n>:<send_ns>` in
//! its text: the publisher's index, its own counter (1, 2, …) and the
//! scheduled send time on [`crate::clock`]. Receivers find it with
//! [`find_stamp`] whatever the action type.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

/// Marker that starts a stamp.
pub const MARK: &str = "lt:";

/// What a stamp says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// Global publisher index.
    pub publisher: u32,
    /// The publisher's counter, from 1.
    pub n: u64,
    /// Scheduled send time, nanoseconds on the process clock.
    pub t_ns: u64,
}

/// The stamp text for an action, padded with `pad` bytes of filler.
pub fn stamp(publisher: u32, n: u64, t_ns: u64, pad: usize) -> String {
    let mut s = format!("{MARK}{publisher}:{n}:{t_ns}");
    if pad > 0 {
        s.push(' ');
        s.extend(std::iter::repeat_n('x', pad));
    }
    s
}

/// Find and decode the first stamp in `s` (raw JSON of an action, or text).
pub fn find_stamp(s: &str) -> Option<Stamp> {
    static FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(MARK));
    let at = FINDER.find(s.as_bytes())?;
    let mut parts = s[at + MARK.len()..].split(|c: char| !c.is_ascii_digit());
    let publisher = parts.next()?.parse().ok()?;
    let n = parts.next()?.parse().ok()?;
    let t_ns = parts.next()?.parse().ok()?;
    Some(Stamp { publisher, n, t_ns })
}

/// A JSON string literal.
pub fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// A JSON-RPC request frame.
pub fn request(id: u64, method: &str, params: &Value) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":{},"params":{params}}}"#,
        json_str(method)
    )
}

/// `dispatchAction` on `channel_json` (an already-quoted JSON string).
pub fn dispatch(id: u64, channel_json: &str, client_seq: u64, action_json: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"dispatchAction","params":{{"channel":{channel_json},"clientSeq":{client_seq},"action":{action_json}}}}}"#
    )
}

/// `chat/draftChanged` with a user draft whose text is `text` (no escaping
/// needed: stamps and padding are plain ASCII).
pub fn draft_action(text: &str) -> String {
    format!(
        r#"{{"type":"chat/draftChanged","draft":{{"text":"{text}","origin":{{"kind":"user"}}}}}}"#
    )
}

/// `chat/inputAnswerChanged` setting a text draft answer.
pub fn answer_action(request_id_json: &str, question_id_json: &str, text: &str) -> String {
    format!(
        r#"{{"type":"chat/inputAnswerChanged","requestId":{request_id_json},"questionId":{question_id_json},"answer":{{"state":"draft","value":{{"kind":"text","value":"{text}"}}}}}}"#
    )
}

/// Any frame from the server, borrowed.
#[derive(Deserialize)]
pub struct Incoming<'a> {
    #[serde(borrow, default)]
    pub method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub params: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub error: Option<&'a RawValue>,
}

impl Incoming<'_> {
    /// The numeric id of a response.
    pub fn id_u64(&self) -> Option<u64> {
        self.id.and_then(|r| r.get().parse().ok())
    }
}

/// The `params` of an `action` notification, borrowed.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvelopeLite<'a> {
    #[serde(borrow)]
    pub channel: Cow<'a, str>,
    /// The action's raw JSON.
    #[serde(borrow, deserialize_with = "raw_json")]
    pub action: &'a str,
    pub server_seq: u64,
    #[serde(borrow, default)]
    pub origin: Option<OriginLite<'a>>,
    #[serde(borrow, default)]
    pub rejection_reason: Option<Cow<'a, str>>,
}

fn raw_json<'de, D: serde::Deserializer<'de>>(d: D) -> Result<&'de str, D::Error> {
    <&RawValue>::deserialize(d).map(RawValue::get)
}

/// `origin` of an envelope.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OriginLite<'a> {
    #[serde(borrow)]
    pub client_id: Cow<'a, str>,
    pub client_seq: u64,
}

/// Decode a frame; `None` when it is not JSON-RPC we understand.
pub fn parse(text: &str) -> Option<Incoming<'_>> {
    serde_json::from_str(text).ok()
}

/// An `action` notification decoded in one pass (the receivers' hot path).
#[derive(Deserialize)]
struct ActionFrame<'a> {
    #[serde(borrow)]
    method: Cow<'a, str>,
    #[serde(borrow)]
    params: EnvelopeLite<'a>,
}

/// The envelope of a frame if it is an `action` notification.
pub fn parse_action(text: &str) -> Option<EnvelopeLite<'_>> {
    if let Some(env) = parse_action_fast(text) {
        return Some(env);
    }
    match serde_json::from_str::<ActionFrame>(text) {
        Ok(f) if f.method == "action" => Some(f.params),
        Ok(_) => None,
        // Not shaped like an action notification (a reply, another
        // notification): the slow path decides.
        Err(_) => parse(text).as_ref().and_then(action_envelope),
    }
}

/// The receivers' hot path: an accepted envelope in exactly the layout the
/// server writes (`channel`, `action`, `serverSeq`, optional `origin`, no
/// escapes outside the action) is cut out without a JSON parser. Anything
/// else returns `None` and goes through serde.
///
/// The action ends at the last `,"serverSeq":` — that byte sequence cannot
/// occur inside a JSON string (its quote would be escaped), and what follows
/// it is checked to the end.
fn parse_action_fast(text: &str) -> Option<EnvelopeLite<'_>> {
    const HEAD: &str = r#"{"jsonrpc":"2.0","method":"action","params":{"channel":""#;
    const SEQ: &str = r#","serverSeq":"#;
    static SEQ_FINDER: std::sync::LazyLock<memchr::memmem::FinderRev<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::FinderRev::new(SEQ));
    let rest = text.strip_prefix(HEAD)?;
    let q = quote_or_escape(rest)?;
    let (channel, rest) = (&rest[..q], rest[q..].strip_prefix(r#"","action":"#)?);
    let k = SEQ_FINDER.rfind(rest.as_bytes())?;
    let (action, tail) = (&rest[..k], &rest[k + SEQ.len()..]);
    let (server_seq, tail) = leading_u64(tail)?;
    let origin = if tail == "}}" {
        None
    } else {
        let tail = tail.strip_prefix(r#","origin":{"clientId":""#)?;
        let q = quote_or_escape(tail)?;
        let (client_id, tail) = (&tail[..q], tail[q..].strip_prefix(r#"","clientSeq":"#)?);
        let (client_seq, tail) = leading_u64(tail)?;
        if tail != "}}}" {
            return None;
        }
        Some(OriginLite {
            client_id: Cow::Borrowed(client_id),
            client_seq,
        })
    };
    if action.is_empty() {
        return None;
    }
    Some(EnvelopeLite {
        channel: Cow::Borrowed(channel),
        action,
        server_seq,
        origin,
        rejection_reason: None,
    })
}

/// Where the first `"` or backslash of `s` is (both ASCII: a char boundary).
fn quote_or_escape(s: &str) -> Option<usize> {
    memchr::memchr2(b'"', b'\\', s.as_bytes())
}

/// A decimal number at the start of `s`, and what follows it.
fn leading_u64(s: &str) -> Option<(u64, &str)> {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    Some((s[..end].parse().ok()?, &s[end..]))
}

/// The envelope of an `action` notification frame.
pub fn action_envelope<'a>(inc: &Incoming<'a>) -> Option<EnvelopeLite<'a>> {
    if inc.method.as_deref() != Some("action") {
        return None;
    }
    serde_json::from_str(inc.params?.get()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ahp_types::actions::StateAction;

    #[test]
    fn stamps_round_trip_inside_json() {
        let s = stamp(7, 42, 123_456_789, 5);
        let action = draft_action(&s);
        assert_eq!(
            find_stamp(&action),
            Some(Stamp {
                publisher: 7,
                n: 42,
                t_ns: 123_456_789
            })
        );
        assert_eq!(find_stamp("no stamp"), None);
        assert_eq!(find_stamp("lt:1:2"), None);
    }

    #[test]
    fn hand_built_actions_are_the_official_types() {
        let d: StateAction = serde_json::from_str(&draft_action(&stamp(0, 1, 2, 0))).unwrap();
        assert!(matches!(d, StateAction::ChatDraftChanged(_)), "{d:?}");
        let a: StateAction = serde_json::from_str(&answer_action(
            &json_str("r1"),
            &json_str("q1"),
            &stamp(0, 1, 2, 0),
        ))
        .unwrap();
        assert!(matches!(a, StateAction::ChatInputAnswerChanged(_)), "{a:?}");
        let frame = dispatch(3, &json_str("ahp-chat:/x"), 9, &draft_action("hi"));
        let v: Value = serde_json::from_str(&frame).unwrap();
        assert_eq!(v["params"]["clientSeq"], 9);
        assert_eq!(v["method"], "dispatchAction");
    }

    #[test]
    fn parses_action_notifications() {
        let f = r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"ahp-chat:/c","action":{"type":"chat/draftChanged","draft":{"text":"lt:1:2:3","origin":{"kind":"user"}}},"serverSeq":17,"origin":{"clientId":"p","clientSeq":2}}}"#;
        let inc = parse(f).unwrap();
        let env = action_envelope(&inc).unwrap();
        assert_eq!(env.server_seq, 17);
        assert_eq!(env.origin.as_ref().unwrap().client_seq, 2);
        assert_eq!(find_stamp(env.action).unwrap().n, 2);
        assert_eq!(parse_action(f).unwrap().server_seq, 17);
        assert!(parse_action(r#"{"jsonrpc":"2.0","id":5,"result":null}"#).is_none());
        let reply = parse(r#"{"jsonrpc":"2.0","id":5,"result":null}"#).unwrap();
        assert_eq!(reply.id_u64(), Some(5));
        assert!(action_envelope(&reply).is_none());
    }

    #[test]
    fn the_fast_path_agrees_with_serde() {
        let frames = [
            r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"ahp-chat:/c","action":{"type":"chat/draftChanged","draft":{"text":"lt:1:2:3 \",\"serverSeq\":9","origin":{"kind":"user"}}},"serverSeq":17,"origin":{"clientId":"p","clientSeq":2}}}"#,
            r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"ahp-chat:/c","action":{"serverSeq":5},"serverSeq":18}}"#,
            r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"ahp-chat:/c","action":{"type":"x"},"serverSeq":19,"origin":{"clientId":"p","clientSeq":3},"rejectionReason":"no"}}"#,
            r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"ahp-chat:/\u0063","action":{"type":"x"},"serverSeq":20}}"#,
            r#"{"jsonrpc":"2.0","method":"action","params":{"action":{"type":"x"},"channel":"c","serverSeq":21}}"#,
        ];
        for f in frames {
            let slow: ActionFrame = serde_json::from_str(f).expect(f);
            let got = parse_action(f).expect(f);
            assert_eq!(got.channel, slow.params.channel, "{f}");
            assert_eq!(got.action, slow.params.action, "{f}");
            assert_eq!(got.server_seq, slow.params.server_seq, "{f}");
            assert_eq!(got.rejection_reason, slow.params.rejection_reason, "{f}");
            assert_eq!(
                got.origin.map(|o| (o.client_id, o.client_seq)),
                slow.params.origin.map(|o| (o.client_id, o.client_seq)),
                "{f}"
            );
        }
        assert!(parse_action_fast(frames[0]).is_some());
        assert!(parse_action_fast(frames[1]).is_some());
        assert!(
            parse_action_fast(frames[2]).is_none(),
            "rejections go through serde"
        );
        assert!(
            parse_action_fast(frames[3]).is_none(),
            "escapes go through serde"
        );
    }
}
