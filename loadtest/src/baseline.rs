//! The baseline: a minimal WebSocket broadcast server on plain tokio +
//! tungstenite that answers the same AHP frames the load generator uses and
//! sends the same `action` envelopes, with no validation, no reducer, no
//! journal and no replay. What Tandem does on top of it — actors, validation,
//! reducing, journaling, byte-bounded queues — is what the ratio of their
//! fan-out rates prices.
//!
//! Like Tandem it assigns one server-wide `serverSeq` and pushes each
//! envelope, serialized once, to every subscriber's queue under one lock; a
//! writer task per connection drains its queue, writing every frame that is
//! ready before one flush.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::{SinkExt, StreamExt};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

type Tx = mpsc::UnboundedSender<Utf8Bytes>;

#[derive(Default)]
struct Hub {
    seq: u64,
    /// Channel → (connection id, queue).
    channels: HashMap<String, Vec<(u64, Tx)>>,
}

/// Shared server state.
#[derive(Default)]
pub struct Baseline {
    hub: Mutex<Hub>,
    next_conn: AtomicU64,
}

#[derive(Deserialize)]
struct Req<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<&'a str>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Params<'a> {
    #[serde(borrow, default)]
    channel: Option<&'a str>,
    #[serde(borrow, default)]
    client_id: Option<&'a str>,
    #[serde(default)]
    client_seq: Option<u64>,
    #[serde(borrow, default)]
    action: Option<&'a RawValue>,
    #[serde(borrow, default)]
    subscriptions: Option<Vec<&'a str>>,
}

fn reply(id: &str, result: &str) -> Utf8Bytes {
    Utf8Bytes::from(format!(
        r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#
    ))
}

impl Baseline {
    fn subscribe(&self, conn: u64, tx: &Tx, channel: &str) -> u64 {
        let mut hub = self.hub.lock();
        let subs = hub.channels.entry(channel.to_owned()).or_default();
        if !subs.iter().any(|(c, _)| *c == conn) {
            subs.push((conn, tx.clone()));
        }
        hub.seq
    }

    fn unsubscribe_all(&self, conn: u64) {
        let mut hub = self.hub.lock();
        for subs in hub.channels.values_mut() {
            subs.retain(|(c, _)| *c != conn);
        }
    }

    fn publish(&self, channel: &str, action: &str, origin: &str, sender: (u64, &Tx)) {
        let channel_json = crate::proto::json_str(channel);
        let mut hub = self.hub.lock();
        hub.seq += 1;
        let seq = hub.seq;
        let frame = Utf8Bytes::from(format!(
            r#"{{"jsonrpc":"2.0","method":"action","params":{{"channel":{channel_json},"action":{action},"serverSeq":{seq},"origin":{origin}}}}}"#
        ));
        let mut to_sender = true;
        if let Some(subs) = hub.channels.get(channel) {
            for (c, tx) in subs {
                to_sender &= *c != sender.0;
                let _ = tx.send(frame.clone());
            }
        }
        if to_sender {
            let _ = sender.1.send(frame);
        }
    }

    /// Answer one request frame.
    fn handle(&self, conn: u64, tx: &Tx, client_id: &mut String, text: &str) {
        let Ok(req) = serde_json::from_str::<Req>(text) else {
            let _ = tx.send(Utf8Bytes::from_static(
                r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error"}}"#,
            ));
            return;
        };
        let id = req.id.map(|r| r.get()).unwrap_or("null");
        let params: Params = req
            .params
            .and_then(|p| serde_json::from_str(p.get()).ok())
            .unwrap_or(Params {
                channel: None,
                client_id: None,
                client_seq: None,
                action: None,
                subscriptions: None,
            });
        let channel = params.channel.unwrap_or("");
        match req.method.unwrap_or("") {
            "initialize" => {
                *client_id = params.client_id.unwrap_or("anonymous").to_owned();
                let seq = self.hub.lock().seq;
                let _ = tx.send(reply(
                    id,
                    &format!(
                        r#"{{"protocolVersion":"1.0.0","serverSeq":{seq},"serverInfo":{{"name":"tandem-baseline"}},"snapshots":[]}}"#
                    ),
                ));
            }
            "reconnect" => {
                *client_id = params.client_id.unwrap_or("anonymous").to_owned();
                for ch in params.subscriptions.unwrap_or_default() {
                    self.subscribe(conn, tx, ch);
                }
                let _ = tx.send(reply(id, r#"{"type":"snapshot","snapshots":[]}"#));
            }
            "subscribe" => {
                // A session's snapshot names a default chat; a chat's is empty.
                let state = match channel.strip_prefix("ahp-session:/") {
                    Some(sid) => format!(
                        r#"{{"defaultChat":{}}}"#,
                        crate::proto::json_str(&format!("ahp-chat:/{sid}-default"))
                    ),
                    None => "{}".to_owned(),
                };
                let seq = self.subscribe(conn, tx, channel);
                let _ = tx.send(reply(
                    id,
                    &format!(
                        r#"{{"snapshot":{{"resource":{},"state":{state},"fromSeq":{seq}}}}}"#,
                        crate::proto::json_str(channel)
                    ),
                ));
            }
            "unsubscribe" => {
                let mut hub = self.hub.lock();
                if let Some(subs) = hub.channels.get_mut(channel) {
                    subs.retain(|(c, _)| *c != conn);
                }
                drop(hub);
                let _ = tx.send(reply(id, "null"));
            }
            "dispatchAction" => {
                let _ = tx.send(reply(id, "null"));
                let origin = format!(
                    r#"{{"clientId":{},"clientSeq":{}}}"#,
                    crate::proto::json_str(client_id),
                    params.client_seq.unwrap_or(0)
                );
                let action = params.action.map(|a| a.get()).unwrap_or("null");
                self.publish(channel, action, &origin, (conn, tx));
            }
            // ping, createSession, and everything else: accepted as is.
            _ => {
                if req.id.is_some() {
                    let _ = tx.send(reply(id, "null"));
                }
            }
        }
    }
}

/// Serve until the process ends.
pub async fn serve(listener: TcpListener) -> anyhow::Result<()> {
    let state = Arc::new(Baseline::default());
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        tokio::spawn(async move {
            // Frames ready together are written with one flush (the default
            // 128 KiB write buffer), as a tuned server would.
            let config = WebSocketConfig::default().read_buffer_size(16 * 1024);
            let Ok(ws) = tokio_tungstenite::accept_async_with_config(stream, Some(config)).await
            else {
                return;
            };
            let conn = state.next_conn.fetch_add(1, Ordering::Relaxed);
            let (mut sink, mut stream) = ws.split();
            let (tx, mut rx) = mpsc::unbounded_channel::<Utf8Bytes>();
            let writer = tokio::spawn(async move {
                while let Some(first) = rx.recv().await {
                    if sink.feed(Message::Text(first)).await.is_err() {
                        return;
                    }
                    while let Ok(more) = rx.try_recv() {
                        if sink.feed(Message::Text(more)).await.is_err() {
                            return;
                        }
                    }
                    if sink.flush().await.is_err() {
                        return;
                    }
                }
            });
            let mut client_id = String::new();
            while let Some(Ok(msg)) = stream.next().await {
                match msg {
                    Message::Text(t) => state.handle(conn, &tx, &mut client_id, t.as_str()),
                    Message::Close(_) => break,
                    _ => {}
                }
            }
            state.unsubscribe_all(conn);
            drop(tx);
            let _ = writer.await;
        });
    }
}

/// Run the baseline on `bind` with its own runtime (one worker per core),
/// until Ctrl-C or, with `seconds`, for that long.
pub fn run_standalone(bind: &str, seconds: Option<f64>) -> anyhow::Result<()> {
    crate::sys::raise_nofile_limit();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let listener = TcpListener::bind(bind).await?;
        eprintln!(
            "tandem-baseline listening on ws://{}/ahp",
            listener.local_addr()?
        );
        let limit = async {
            match seconds {
                Some(s) => tokio::time::sleep(std::time::Duration::from_secs_f64(s)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = serve(listener) => r,
            _ = tokio::signal::ctrl_c() => Ok(()),
            _ = limit => Ok(()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::Endpoint;
    use serde_json::{json, Value};

    #[tokio::test]
    async fn broadcasts_dispatches_to_subscribers_and_echoes_the_sender() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}/ahp", listener.local_addr().unwrap());
        let server = tokio::spawn(serve(listener));
        let ep = Endpoint::new(&url, 1).await.unwrap();
        let mut setup = ep.client("setup").await.unwrap();
        let (_, chat) = setup.create_session().await.unwrap();
        let mut sub = ep.client("sub").await.unwrap();
        let snap = sub.subscribe(&chat).await.unwrap();
        let mut publisher = ep.client("pub").await.unwrap();
        let action = crate::proto::draft_action("lt:0:1:5");
        let id = publisher.next_id();
        publisher
            .send(crate::proto::dispatch(
                id,
                &crate::proto::json_str(&chat),
                1,
                &action,
            ))
            .await
            .unwrap();
        publisher.wait_response(id, "dispatchAction").await.unwrap();
        let echo: Value = serde_json::from_str(
            &publisher
                .next_text(crate::conn::REQUEST_TIMEOUT)
                .await
                .unwrap(),
        )
        .unwrap();
        let got: Value =
            serde_json::from_str(&sub.next_text(crate::conn::REQUEST_TIMEOUT).await.unwrap())
                .unwrap();
        assert_eq!(got["params"]["serverSeq"], json!(snap.from_seq + 1));
        assert_eq!(got["params"]["origin"]["clientId"], "pub");
        assert_eq!(got["params"]["action"]["draft"]["text"], "lt:0:1:5");
        assert_eq!(echo["params"], got["params"]);
        server.abort();
    }
}
