use ahp_types::actions::StateAction;
use ahp_types::commands::DispatchActionParams;

use super::{decode_dispatch, direct_action, DIRECT_TYPES};
use crate::protocol::methods::{decode_params, DISPATCH_ACTION};
use crate::protocol::{decode, RpcError};

/// One well-formed action of every direct type, with optional members
/// present and absent, `_meta`, escapes and members in another order.
const WELL_FORMED: &[&str] = &[
    r#"{"type":"chat/draftChanged","draft":{"text":"lt:0:1:2 xx","origin":{"kind":"user"}}}"#,
    r#"{"type":"chat/draftChanged"}"#,
    r#"{"draft":{"text":"caf\u00e9 \"quoted\"\n","origin":{"kind":"user"}},"type":"chat/draftChanged"}"#,
    r#"{"type":"chat/inputAnswerChanged","requestId":"r1","questionId":"q1","answer":{"state":"draft","value":{"kind":"text","value":"yes"}}}"#,
    r#"{"type":"chat/inputAnswerChanged","requestId":"r1","questionId":"q1"}"#,
    r#"{"type":"chat/delta","turnId":"t1","partId":"p1","content":"Hel","_meta":{"k":[1,2.5,null]}}"#,
    r#"{"type":"chat/reasoning","turnId":"t1","partId":"p2","content":"thinking"}"#,
    r#"{"type":"chat/responsePart","turnId":"t1","part":{"kind":"markdown","id":"p1","content":"Hello"}}"#,
    r#"{"type":"chat/toolCallStart","turnId":"t1","toolCallId":"c1","toolName":"read","displayName":"Read file","intention":"look"}"#,
    r#"{"type":"chat/toolCallDelta","turnId":"t1","toolCallId":"c1","content":"{\"path\":"}"#,
    r#"{"type":"chat/turnComplete","turnId":"t1","duration":1200}"#,
    r#"{"type":"chat/usage","turnId":"t1","usage":{"inputTokens":10,"outputTokens":20,"model":"m"}}"#,
    r#"{"type":"chat/activityChanged","activity":"typing"}"#,
    r#"{"type":"chat/activityChanged"}"#,
    r#"{"type":"chat/isReadChanged","isRead":true}"#,
];

/// Actions the direct read must leave to the derived path: other types,
/// no or a repeated `type`, bodies their struct refuses (the derived path
/// makes these `Unknown`), not an object.
const LEFT_TO_THE_DERIVED_PATH: &[&str] = &[
    r#"{"type":"session/titleChanged","title":"New"}"#,
    r#"{"type":"chat/turnStarted","turnId":"t1","startedAt":"2026-01-01T00:00:00Z","message":{"text":"hi","origin":{"kind":"user"}}}"#,
    r#"{"type":"chat/somethingNew","x":1}"#,
    r#"{"draft":{"text":"no type","origin":{"kind":"user"}}}"#,
    r#"{"type":"chat/draftChanged","type":"chat/delta","turnId":"t1","partId":"p","content":"c"}"#,
    r#"{"type":"chat/draftChanged","draft":5}"#,
    r#"{"type":"chat/delta","turnId":"t1","content":"no part id"}"#,
    r#"{"type":"chat/turnComplete","turnId":"t1","duration":"long"}"#,
    r#"{"type":"chat/isReadChanged","isRead":true,"isRead":false}"#,
    r#"{"type":5}"#,
    r#""chat/draftChanged""#,
    r#"[1,2]"#,
    r#"null"#,
];

fn derived(raw: &str) -> StateAction {
    serde_json::from_str(raw).expect("the derived path takes every JSON value")
}

#[test]
fn every_direct_type_has_a_well_formed_example() {
    for kind in DIRECT_TYPES {
        let tag = format!(r#""type":"{kind}""#);
        assert!(
            WELL_FORMED.iter().any(|raw| raw.contains(&tag)),
            "no example of {kind}"
        );
    }
}

#[test]
fn a_direct_type_reads_as_the_derived_path_reads_it() {
    for raw in WELL_FORMED {
        let direct = direct_action(raw).unwrap_or_else(|| panic!("not read directly: {raw}"));
        let slow = derived(raw);
        assert!(!matches!(slow, StateAction::Unknown(_)), "{raw}");
        assert_eq!(direct, slow, "{raw}");
    }
}

#[test]
fn anything_else_is_left_to_the_derived_path() {
    for raw in LEFT_TO_THE_DERIVED_PATH {
        assert_eq!(direct_action(raw), None, "{raw}");
    }
}

/// `decode_dispatch` against the generic decode of the same frame.
fn both(
    frame: &str,
) -> (
    Result<DispatchActionParams, RpcError>,
    Result<DispatchActionParams, RpcError>,
) {
    let fast = decode_dispatch(decode(frame).expect("a request").params);
    let slow = decode_params::<DispatchActionParams>(
        DISPATCH_ACTION,
        decode(frame).expect("a request").params,
    );
    (fast, slow)
}

#[test]
fn dispatch_params_decode_as_before_whatever_the_frame() {
    let mut frames: Vec<String> = WELL_FORMED
        .iter()
        .chain(LEFT_TO_THE_DERIVED_PATH)
        .map(|action| {
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"dispatchAction","params":{{"channel":"ahp-chat:s/c","clientSeq":3,"action":{action}}}}}"#
            )
        })
        .collect();
    frames.extend(
        [
            // Members in another order, an unknown member, escapes.
            r#"{"jsonrpc":"2.0","method":"dispatchAction","params":{"action":{"type":"chat/activityChanged"},"extra":true,"clientSeq":-1,"channel":"ahp-chat:s\/c"}}"#,
            // Missing, mistyped and repeated members.
            r#"{"jsonrpc":"2.0","id":2,"method":"dispatchAction","params":{"channel":"c","action":{"type":"chat/activityChanged"}}}"#,
            r#"{"jsonrpc":"2.0","id":3,"method":"dispatchAction","params":{"channel":"c","clientSeq":"1","action":{"type":"chat/activityChanged"}}}"#,
            r#"{"jsonrpc":"2.0","id":4,"method":"dispatchAction","params":{"channel":"c","clientSeq":1,"clientSeq":2,"action":{"type":"chat/activityChanged"}}}"#,
            r#"{"jsonrpc":"2.0","id":5,"method":"dispatchAction","params":{"channel":"c","clientSeq":1}}"#,
            r#"{"jsonrpc":"2.0","id":6,"method":"dispatchAction","params":{"channel":7,"clientSeq":1,"action":{"type":"chat/activityChanged"}}}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"dispatchAction","params":[1]}"#,
            r#"{"jsonrpc":"2.0","id":8,"method":"dispatchAction"}"#,
        ]
        .map(String::from),
    );
    for frame in &frames {
        let (fast, slow) = both(frame);
        assert_eq!(fast, slow, "{frame}");
    }
    // The error cases did fail, and with the method named.
    let (fast, _) = both(&frames[frames.len() - 1]);
    let err = fast.expect_err("no params");
    assert!(
        err.message.contains("invalid params for `dispatchAction`"),
        "{}",
        err.message
    );
}
