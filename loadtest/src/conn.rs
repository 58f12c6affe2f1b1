//! A lean AHP client over raw WebSocket frames (tokio-tungstenite +
//! serde_json) for connecting, setup and control; once subscribed, a
//! subscriber's socket is read by [`crate::readers`], so a process holds
//! thousands and reads them cheaply.
//! The official `ahp` client keeps a broadcast buffer per subscription, which
//! is right for an application and too heavy for 10,000 sockets.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::proto;

/// A client WebSocket.
pub type Ws = WebSocketStream<TcpStream>;

/// How long a setup request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Small buffers: thousands of these live in one process, and each read
/// zero-fills `read_buffer_size` bytes first.
pub fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(4 * 1024)
        .write_buffer_size(0)
        .max_message_size(Some(256 << 20))
        .max_frame_size(Some(256 << 20))
}

/// Where to connect, and from which loopback source addresses.
pub struct Endpoint {
    /// `ws://host:port/path`.
    pub url: String,
    /// The resolved server address.
    pub addr: SocketAddr,
    sources: Vec<IpAddr>,
    next: AtomicUsize,
}

impl Endpoint {
    /// Resolve `ws://host:port/path`. With `source_ips > 1` and an IPv4
    /// loopback server, connections are spread over source addresses
    /// 127.0.0.1, 127.0.0.2, … so more than ~28,000 sockets fit in the
    /// ephemeral port range.
    pub async fn new(url: &str, source_ips: usize) -> anyhow::Result<Self> {
        let rest = url
            .strip_prefix("ws://")
            .ok_or_else(|| anyhow!("only ws:// URLs are supported, got `{url}`"))?;
        let hostport = rest.split('/').next().unwrap_or(rest);
        let addr = tokio::net::lookup_host(hostport)
            .await
            .with_context(|| format!("resolving {hostport}"))?
            .next()
            .ok_or_else(|| anyhow!("{hostport} resolves to nothing"))?;
        let sources = match addr.ip() {
            IpAddr::V4(ip) if ip.is_loopback() && source_ips > 1 => (0..source_ips.min(250))
                .map(|i| IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1 + i as u8)))
                .collect(),
            _ => Vec::new(),
        };
        Ok(Self {
            url: url.to_owned(),
            addr,
            sources,
            next: AtomicUsize::new(0),
        })
    }

    /// Open a WebSocket (no AHP yet).
    pub async fn connect(&self) -> anyhow::Result<Ws> {
        let sock = if self.addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        if !self.sources.is_empty() {
            let i = self.next.fetch_add(1, Ordering::Relaxed) % self.sources.len();
            sock.bind(SocketAddr::new(self.sources[i], 0))?;
        }
        let stream = sock
            .connect(self.addr)
            .await
            .with_context(|| format!("connecting to {}", self.addr))?;
        stream.set_nodelay(true)?;
        let (ws, _) = tokio_tungstenite::client_async_with_config(
            self.url.as_str(),
            stream,
            Some(ws_config()),
        )
        .await
        .context("WebSocket handshake")?;
        Ok(ws)
    }

    /// Open a WebSocket and `initialize` as `client_id`.
    pub async fn client(&self, client_id: &str) -> anyhow::Result<Client> {
        let mut c = Client::new(self.connect().await?);
        c.initialize(client_id).await?;
        Ok(c)
    }
}

static NEXT_NAME: AtomicU64 = AtomicU64::new(1);

/// A process-unique name fragment (`<pid>-<counter>-<time>`).
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}-{}",
        std::process::id(),
        NEXT_NAME.fetch_add(1, Ordering::Relaxed),
        crate::clock::now_ns() % 1_000_000_000
    )
}

/// A chat's snapshot as `subscribe` returned it.
pub struct Snapshot {
    /// `fromSeq`: envelopes after it are not in `state`.
    pub from_seq: u64,
    /// The raw `state` object.
    pub state: Value,
}

/// Request/response on one socket, for setup and control. Notifications that
/// arrive while waiting for a response are kept in `pending`.
pub struct Client {
    /// The socket.
    pub ws: Ws,
    next_id: u64,
    /// Notification frames read while waiting for responses, in order.
    pub pending: VecDeque<String>,
    /// `serverSeq` from `initialize`.
    pub init_seq: u64,
}

impl Client {
    /// Wrap a connected socket.
    pub fn new(ws: Ws) -> Self {
        Self {
            ws,
            next_id: 1,
            pending: VecDeque::new(),
            init_seq: 0,
        }
    }

    /// A fresh request id (also for hand-built frames).
    pub fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Send one text frame.
    pub async fn send(&mut self, text: String) -> anyhow::Result<()> {
        self.ws.send(Message::text(text)).await?;
        Ok(())
    }

    /// Next text frame from the socket (pending notifications first).
    pub async fn next_text(&mut self, timeout: Duration) -> anyhow::Result<String> {
        if let Some(t) = self.pending.pop_front() {
            return Ok(t);
        }
        self.read_text(timeout).await
    }

    async fn read_text(&mut self, timeout: Duration) -> anyhow::Result<String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let msg = tokio::time::timeout_at(deadline, self.ws.next())
                .await
                .map_err(|_| anyhow!("no frame from the server within {timeout:?}"))?;
            match msg {
                Some(Ok(Message::Text(t))) => return Ok(t.as_str().to_owned()),
                Some(Ok(Message::Close(c))) => bail!("server closed the connection: {c:?}"),
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(e.into()),
                None => bail!("connection closed"),
            }
        }
    }

    /// Send a request and wait for its response; returns the raw `result`.
    pub async fn request(&mut self, method: &str, params: Value) -> anyhow::Result<String> {
        let id = self.next_id();
        self.send(proto::request(id, method, &params)).await?;
        self.wait_response(id, method).await
    }

    /// Wait for the response to request `id`.
    pub async fn wait_response(&mut self, id: u64, what: &str) -> anyhow::Result<String> {
        loop {
            let text = self.read_text(REQUEST_TIMEOUT).await?;
            let Some(inc) = proto::parse(&text) else {
                bail!("unparseable frame while waiting for `{what}`: {text}");
            };
            if inc.method.is_some() {
                self.pending.push_back(text);
                continue;
            }
            if inc.id_u64() != Some(id) {
                continue;
            }
            if let Some(err) = inc.error {
                bail!("`{what}` failed: {}", err.get());
            }
            return Ok(inc
                .result
                .map(|r| r.get().to_owned())
                .unwrap_or_else(|| "null".into()));
        }
    }

    /// `initialize` with protocol 1.0.0; remembers the server's `serverSeq`.
    pub async fn initialize(&mut self, client_id: &str) -> anyhow::Result<u64> {
        let res = self
            .request(
                "initialize",
                json!({"channel": "ahp-root://", "clientId": client_id, "protocolVersions": ["1.0.0"]}),
            )
            .await?;
        let v: Value = serde_json::from_str(&res)?;
        self.init_seq = v["serverSeq"].as_u64().unwrap_or(0);
        Ok(self.init_seq)
    }

    /// `subscribe` and return the snapshot.
    pub async fn subscribe(&mut self, uri: &str) -> anyhow::Result<Snapshot> {
        let res = self.request("subscribe", json!({"channel": uri})).await?;
        let mut v: Value = serde_json::from_str(&res)?;
        let snap = v
            .get_mut("snapshot")
            .map(Value::take)
            .ok_or_else(|| anyhow!("`subscribe {uri}` returned no snapshot: {res}"))?;
        Ok(Snapshot {
            from_seq: snap["fromSeq"].as_u64().unwrap_or(0),
            state: snap.get("state").cloned().unwrap_or(Value::Null),
        })
    }

    /// `createSession` with the scripted agent; returns (session, default chat).
    pub async fn create_session(&mut self) -> anyhow::Result<(String, String)> {
        self.create_session_with("scripted").await
    }

    /// `createSession` with `provider` (an ACP agent's session is ready, and
    /// has its default chat, once the agent process answered); returns
    /// (session, default chat).
    pub async fn create_session_with(
        &mut self,
        provider: &str,
    ) -> anyhow::Result<(String, String)> {
        let session = format!("ahp-session:/{}", unique("loadtest"));
        self.request(
            "createSession",
            json!({"channel": session, "provider": provider}),
        )
        .await?;
        // The default chat appears once the session is ready.
        let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
        loop {
            let snap = self.subscribe(&session).await?;
            self.request("unsubscribe", json!({"channel": session}))
                .await?;
            if let Some(chat) = snap.state["defaultChat"].as_str() {
                return Ok((session, chat.to_owned()));
            }
            if tokio::time::Instant::now() > deadline {
                bail!("session {session} has no default chat");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Close politely (bounded).
    pub async fn close(mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(2), self.ws.close(None)).await;
    }
}
