//! Heartbeat and graceful shutdown.

use crate::common;

use std::time::Duration;

use common::*;
use futures_util::StreamExt;
use serde_json::json;
use tandem::Config;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

/// A WebSocket on `addr` that will say nothing and answer nothing (no
/// pong: a frozen tab), kept as raw TCP so that reading it answers nothing
/// either.
async fn silent_socket(addr: std::net::SocketAddr) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(
        b"GET /ahp HTTP/1.1\r\nHost: tandem\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    .await
    .expect("handshake");
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        let n = tokio::time::timeout(WAIT, s.read(&mut byte))
            .await
            .expect("handshake answer in time")
            .expect("read");
        assert_eq!(n, 1, "the server answers the handshake");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    s
}

/// Read `s` as raw frames until the server closes it: the close frame's
/// reason, or `Err` when the socket ended or was reset without one.
async fn close_reason(s: &mut tokio::net::TcpStream) -> Result<String, String> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    loop {
        // Whole server frames (unmasked) at the front of `buf`.
        let mut at = 0;
        while buf.len() >= at + 2 {
            let (op, len7) = (buf[at] & 0x0f, (buf[at + 1] & 0x7f) as usize);
            let (len, head) = match len7 {
                126 if buf.len() >= at + 4 => {
                    (u16::from_be_bytes([buf[at + 2], buf[at + 3]]) as usize, 4)
                }
                127 if buf.len() >= at + 10 => {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&buf[at + 2..at + 10]);
                    (u64::from_be_bytes(b) as usize, 10)
                }
                126 | 127 => break,
                n => (n, 2),
            };
            if buf.len() < at + head + len {
                break;
            }
            if op == 0x8 {
                let payload = &buf[at + head..at + head + len];
                return Ok(String::from_utf8_lossy(payload.get(2..).unwrap_or_default()).into());
            }
            at += head + len;
        }
        let mut chunk = [0u8; 4096];
        match s.read(&mut chunk).await {
            Ok(0) => return Err("ended".into()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(e.to_string()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_socket_is_closed_after_the_idle_timeout() {
    let config = Config {
        // The active client answers every ping within the idle timeout
        // with room to spare on a loaded machine; the test waits on the
        // close, so a long timeout costs nothing.
        heartbeat_interval: Duration::from_millis(500),
        idle_timeout: Duration::from_secs(3),
        ..Config::default()
    };
    let server = TestServer::start_with(config).await;
    // An active client, connected first: its idle deadline would come
    // before the silent socket's.
    let active = server.client("active").await;
    let mut silent = silent_socket(server.addr).await;
    let close = tokio::time::timeout(WAIT, close_reason(&mut silent))
        .await
        .expect("closed in time");
    // The socket reads everything, so the server's close reaches it.
    let reason = close.expect("a close frame");
    assert!(reason.contains("idle"), "{reason:?}");
    // The active client, connected longer than the silent one, is still
    // served.
    active
        .client
        .ping()
        .await
        .expect("an active client stays connected");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_sockets_with_a_reason_and_keeps_what_was_accepted() {
    let dir = temp_dir("term");
    let data = dir.join("data");
    let mut server = ServerProcess::spawn(&data, &[]);
    let mut c = server.client("c").await;
    let (_s, chat) = c.create_session().await;
    let seq = c.dispatch(&chat, draft("keep me")).await;
    assert!(c.wait_echo(None, seq).await.rejection_reason.is_none());
    let (mut ws, _) = tokio_tungstenite::connect_async(server.url())
        .await
        .expect("connect");
    let status = std::process::Command::new("kill")
        .args(["-TERM", &server.pid().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let close = tokio::time::timeout(WAIT, async {
        while let Some(Ok(m)) = ws.next().await {
            if let Message::Close(c) = m {
                return c;
            }
        }
        None
    })
    .await
    .expect("closed in time")
    .expect("a close frame");
    assert_eq!(close.code, CloseCode::Away);
    assert!(close.reason.contains("shutting down"), "{close:?}");
    let exited = server
        .wait_exit(Duration::from_secs(20))
        .expect("the server exits by itself");
    assert!(exited.success(), "clean exit: {exited:?}");
    // What was accepted is there after the restart.
    let server = ServerProcess::spawn(&data, &[]);
    let c = server.client("after").await;
    let state = c.subscribe_chat(&chat).await.state;
    assert_eq!(state.draft.map(|d| d.text).as_deref(), Some("keep me"));
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_reading_is_evicted_and_let_go() {
    use futures_util::SinkExt;
    let config = Config {
        heartbeat_interval: Duration::from_millis(250),
        idle_timeout: Duration::from_secs(2),
        outbound_limit_bytes: 64 * 1024,
        ..Config::default()
    };
    let server = TestServer::start_with(config).await;
    let mut writer = server.client("writer").await;
    let (_session, chat) = writer.create_session().await;

    // A client with a tiny receive window that subscribes, then never
    // reads again (and never closes its socket).
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket.set_recv_buffer_size(4096).expect("small window");
    socket.connect(&server.addr.into()).expect("connect");
    socket.set_nonblocking(true).expect("nonblocking");
    let tcp = tokio::net::TcpStream::from_std(socket.into()).expect("tokio stream");
    let (mut ws, _) = tokio_tungstenite::client_async(server.url(), tcp)
        .await
        .expect("upgrade");
    for frame in [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": "stuck"}}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "subscribe", "params": {"channel": chat}}),
    ] {
        ws.send(Message::text(frame.to_string()))
            .await
            .expect("send");
    }
    loop {
        let m = tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("replies in time")
            .expect("open")
            .expect("frame");
        if m.to_text().unwrap_or("").contains("\"id\":2") {
            break;
        }
    }
    assert_eq!(healthz(server.addr).await["connections"], 2);

    // Far more than the window, the kernel's buffers (4 MiB at most here)
    // and the queue limit: the queue overflows and the connection is closed
    // and unregistered — or, if even the close cannot be written, let go by
    // the heartbeat after the idle timeout.
    let text = "x".repeat(20_000);
    for _ in 0..400 {
        let seq = writer.dispatch(&chat, draft(&text)).await;
        writer.wait_echo(None, seq).await;
    }
    wait_connections(server.addr, 1).await;
    // The writer is unaffected.
    writer
        .client
        .ping()
        .await
        .expect("the writer is still served");
    drop(ws);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_close_is_answered_with_its_own_code() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;
    let server = TestServer::start().await;
    for (sent, answered) in [
        (CloseCode::Library(4001), CloseCode::Library(4001)),
        (CloseCode::Away, CloseCode::Away),
        (CloseCode::Normal, CloseCode::Normal),
    ] {
        let (mut ws, _) = tokio_tungstenite::connect_async(server.url())
            .await
            .expect("connect");
        ws.send(Message::Close(Some(CloseFrame {
            code: sent,
            reason: "bye".into(),
        })))
        .await
        .expect("close");
        let close = tokio::time::timeout(WAIT, async {
            while let Some(Ok(m)) = ws.next().await {
                if let Message::Close(c) = m {
                    return c;
                }
            }
            None
        })
        .await
        .expect("answered in time")
        .expect("a close frame");
        assert_eq!(close.code, answered);
    }
    wait_connections(server.addr, 0).await;
    server.stop().await;
}

/// `/healthz` accounts for what disposing sessions leaves: the server
/// binary reports its allocator's figures and hands the freed pages back,
/// the ring states its whole footprint and SQLite its caches; the disposed
/// channels and their journal lengths are gone. (It also shows the store's
/// group-commit figures.)
#[tokio::test]
async fn disposed_sessions_leave_only_the_stated_budgets() {
    let dir = temp_dir("dispose-memory");
    let server = ServerProcess::spawn(&dir.join("data"), &[]);
    let mut c = server.client("disposer").await;
    let mut sessions = Vec::new();
    for _ in 0..20 {
        let (session, chat) = c.create_session().await;
        for i in 0..5 {
            let seq = c.dispatch(&chat, draft(&format!("draft {i}"))).await;
            c.wait_echo(None, seq).await;
        }
        sessions.push(session);
    }
    let before = healthz(server.addr).await;
    assert_eq!(
        before["channels"], 41,
        "root, 20 sessions, 20 chats: {before}"
    );
    // The store's group commits: at least the 40 creations and 100 drafts,
    // in no more commits than writes.
    let commits = &before["storeCommits"];
    let writes = commits["writes"].as_u64().expect("writes committed");
    let groups = commits["commits"].as_u64().expect("commits");
    assert!(writes >= 140 && (1..=writes).contains(&groups), "{before}");
    for session in &sessions {
        let _: serde_json::Value = c
            .client
            .request("disposeSession", json!({ "channel": session }))
            .await
            .expect("disposeSession");
    }
    let after = eventually("every disposed channel is gone", || async {
        let now = healthz(server.addr).await;
        (now["channels"] == 1).then_some(now)
    })
    .await;
    let ring = after["replayRingBytes"].as_u64().expect("ring bytes");
    let footprint = after["replayRingFootprintBytes"]
        .as_u64()
        .expect("ring footprint");
    assert!(ring > 0 && footprint > ring, "{after}");
    assert!(
        after["storeMemoryBytes"].as_u64().unwrap_or(0) > 0,
        "{after}"
    );
    let allocated = after["allocator"]["allocatedBytes"]
        .as_u64()
        .expect("the binary reports its allocator");
    let resident = after["allocator"]["residentBytes"]
        .as_u64()
        .expect("resident bytes");
    assert!(allocated > 0 && resident >= allocated, "{after}");
}
