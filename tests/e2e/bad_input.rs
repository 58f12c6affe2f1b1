//! Malformed and out-of-order frames on a raw WebSocket: each is answered
//! with the right JSON-RPC error (or deliberately not at all), and neither the
//! connection nor the server is harmed.

use crate::common;

use common::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tandem::Config;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn raw(server: &TestServer) -> Ws {
    let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(server.url()))
        .await
        .expect("connect timed out")
        .expect("connect");
    ws
}

/// Next text frame as JSON, skipping Ping/Pong; panics on anything else.
async fn recv_json(ws: &mut Ws) -> Value {
    loop {
        let msg = tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("timed out waiting for a frame")
            .expect("socket ended")
            .expect("socket error");
        match msg {
            Message::Text(t) => return serde_json::from_str(&t).expect("reply is JSON"),
            Message::Ping(_) | Message::Pong(_) => {}
            other => panic!("unexpected frame {other:?}"),
        }
    }
}

/// Send `msg` and return the next text frame as JSON.
async fn ask(ws: &mut Ws, msg: Message) -> Value {
    tokio::time::timeout(WAIT, ws.send(msg))
        .await
        .expect("send timed out")
        .expect("send");
    recv_json(ws).await
}

async fn ask_text(ws: &mut Ws, text: &str) -> Value {
    ask(ws, Message::text(text.to_owned())).await
}

fn assert_error(reply: &Value, code: i64, id: Value, what: &str) {
    assert_eq!(reply["error"]["code"], code, "{what}: {reply}");
    assert_eq!(reply["id"], id, "{what}: {reply}");
    assert!(reply.get("result").is_none(), "{what}: {reply}");
}

async fn assert_ping(ws: &mut Ws, id: i64) {
    let reply = ask_text(
        ws,
        &json!({"jsonrpc":"2.0","id":id,"method":"ping","params":{"channel":"ahp-root://"}})
            .to_string(),
    )
    .await;
    assert_eq!(reply["id"], id, "{reply}");
    assert_eq!(reply["result"], Value::Null, "{reply}");
    assert!(reply.get("error").is_none(), "{reply}");
}

const INIT: &str = r#"{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"channel":"ahp-root://","protocolVersions":["1.0.0"],"clientId":"raw"}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_get_the_right_errors_and_the_connection_survives() {
    let server = TestServer::start().await;
    let setup = server.client("setup").await;
    let (session, _chat) = setup.create_session().await;
    let mut ws = raw(&server).await;

    // Before `initialize`.
    let before: Vec<(&str, Message, i64, Value)> = vec![
        ("invalid JSON", Message::text("{not json"), -32700, Value::Null),
        ("JSON array", Message::text("[1,2,3]"), -32600, Value::Null),
        (
            "missing jsonrpc",
            Message::text(r#"{"id":11,"method":"ping"}"#),
            -32600,
            json!(11),
        ),
        (
            "binary frame",
            Message::binary(b"{\"jsonrpc\":\"2.0\",\"id\":12,\"method\":\"ping\"}".to_vec()),
            -32600,
            Value::Null,
        ),
        (
            "subscribe before initialize",
            Message::text(
                json!({"jsonrpc":"2.0","id":13,"method":"subscribe","params":{"channel":"ahp-root://"}})
                    .to_string(),
            ),
            -32600,
            json!(13),
        ),
    ];
    for (what, msg, code, id) in before {
        let reply = ask(&mut ws, msg).await;
        assert_error(&reply, code, id, what);
    }

    let init = ask_text(&mut ws, INIT).await;
    assert_eq!(init["id"], "init", "{init}");
    assert!(init["result"]["protocolVersion"].is_string(), "{init}");

    // After `initialize`.
    let after: Vec<(&str, Value, i64, Value)> = vec![
        (
            "unknown method",
            json!({"jsonrpc":"2.0","id":21,"method":"no/such/method","params":{"channel":"ahp-root://"}}),
            -32601,
            json!(21),
        ),
        (
            "wrong params",
            json!({"jsonrpc":"2.0","id":22,"method":"subscribe","params":{"channel":5}}),
            -32602,
            json!(22),
        ),
        (
            "unknown chat",
            json!({"jsonrpc":"2.0","id":23,"method":"subscribe","params":{"channel":"ahp-chat:/nope"}}),
            -32008,
            json!(23),
        ),
        (
            "unknown session",
            json!({"jsonrpc":"2.0","id":"s","method":"subscribe","params":{"channel": format!("{session}-nope")}}),
            -32001,
            json!("s"),
        ),
        (
            "dispatchAction notification with bad params",
            json!({"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":"ahp-chat:/nope","clientSeq":"one"}}),
            -32602,
            Value::Null,
        ),
        (
            "initialize twice",
            serde_json::from_str(INIT).unwrap(),
            -32600,
            json!("init"),
        ),
    ];
    for (what, msg, code, id) in after {
        let reply = ask_text(&mut ws, &msg.to_string()).await;
        assert_error(&reply, code, id, what);
    }

    // A valid action for an unknown channel is dropped without any reply: the
    // next frame is the reply to the ping sent after it.
    ws.send(Message::text(
        json!({"jsonrpc":"2.0","method":"dispatchAction","params":{
            "channel":"ahp-chat:/nope","clientSeq":1,
            "action":{"type":"chat/draftChanged","draft":{"text":"x","origin":{"kind":"user"}}}
        }})
        .to_string(),
    ))
    .await
    .expect("send dispatch");
    assert_ping(&mut ws, 31).await;

    // The connection still works, and so does a brand-new official client.
    assert_ping(&mut ws, 32).await;
    let other = server.client("after-bad-input").await;
    let (_s, chat) = other.create_session().await;
    assert!(chat.starts_with("ahp-chat:"), "{chat}");
    other.client.shutdown().await;
    setup.client.shutdown().await;
    let _ = ws.close(None).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_frame_is_refused_with_close_1009_and_the_server_lives_on() {
    let server = TestServer::start_with(Config {
        max_frame_bytes: 64 * 1024,
        ..Config::default()
    })
    .await;
    let mut ws = raw(&server).await;
    assert_ping(&mut ws, 1).await;

    let big = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"ping","params":{{"channel":"ahp-root://","pad":"{}"}}}}"#,
        "x".repeat(100 * 1024)
    );
    // The server may close while we are still writing; a failed send is fine.
    let _ = tokio::time::timeout(WAIT, ws.send(Message::text(big))).await;

    let mut error_frame = None;
    let mut close = None;
    let deadline = tokio::time::Instant::now() + WAIT;
    while let Ok(Some(msg)) = tokio::time::timeout_at(deadline, ws.next()).await {
        match msg {
            Ok(Message::Text(t)) => error_frame = Some(serde_json::from_str::<Value>(&t).unwrap()),
            Ok(Message::Close(f)) => {
                close = f;
                break;
            }
            Ok(_) => {}
            Err(e) => {
                panic!("socket error before the close frame: {e} (error frame: {error_frame:?})")
            }
        }
    }
    if let Some(err) = &error_frame {
        assert_error(err, -32600, Value::Null, "oversized frame");
        let msg = err["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("too large"), "{err}");
    }
    let close = close.expect("a close frame");
    assert_eq!(close.code, CloseCode::Size, "{close:?}");

    // The server still serves others.
    let mut again = raw(&server).await;
    assert_ping(&mut again, 7).await;
    let _ = again.close(None).await;
    server.stop().await;
}
