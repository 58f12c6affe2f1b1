//! The WebSocket itself, on actix-http's HTTP/1 dispatcher.
//!
//! The upgrade response's body is [`OutBody`]: when the dispatcher has room
//! in its write buffer it polls the body, which takes *everything* queued on
//! the connection's [`Outbound`] and encodes it into one chunk, so a burst of
//! envelopes costs one wake-up and one socket write per connection. No task
//! or channel sits between the publishers and the socket. Writes are paced:
//! on a connection written less than `--write-pacing-ms` ago, pushed frames
//! wait until that much time has passed, so under a heavy stream they go
//! out several per write (replies, pongs and closes never wait). Frames from the
//! client arrive through [`Inbound`], which decodes and reassembles them
//! within the frame limit. One [`heartbeat`] task pings every connection,
//! closes the idle ones and lets go of those whose close cannot be written.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use actix::Addr;
use actix_codec::Decoder;
use actix_http::body::{BodySize, MessageBody};
use actix_http::ws::ProtocolError;
use actix_http::ws::{CloseCode, CloseReason, Codec, Frame as WsFrame, Item, OpCode, Parser};
use actix_web::dev::Payload;
use bytes::{Bytes, BytesMut};
use bytestring::ByteString;
use futures_util::Stream;
use tokio::time::Sleep;

use super::connection::{Connection, SocketGone};
use crate::channels::core::Shared;
use crate::publish::outbound::{Beat, CloseCause, Frame, Outbound, Take, Taken};

/// RFC 6455: a close frame's reason is at most 123 bytes (strict clients
/// such as Chromium fail the connection on longer ones).
const MAX_CLOSE_REASON: usize = 123;

/// The close code for an expired token: in the range RFC 6455 leaves to
/// applications, and mirroring HTTP 401 so a client can tell it from other
/// policy closes (1008) — reconnecting with the same token would be refused.
pub const TOKEN_EXPIRED_CLOSE_CODE: u16 = 4401;

/// The close reason sent with [`TOKEN_EXPIRED_CLOSE_CODE`].
pub const TOKEN_EXPIRED_REASON: &str = "token expired: reconnect with a fresh token";

/// Whether a close code may be sent (1005, 1006, 1015 and unassigned ranges
/// may not).
fn sendable(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

/// The close frame for `cause`.
pub fn close_reason(cause: &CloseCause) -> CloseReason {
    let (code, text) = match cause {
        CloseCause::Overflow => (
            CloseCode::Policy,
            "outbound buffer overflow: the client read too slowly; reconnect to resume".to_owned(),
        ),
        CloseCause::Protocol(msg) => (CloseCode::Policy, msg.clone()),
        CloseCause::TooLarge(msg) => (CloseCode::Size, msg.clone()),
        CloseCause::Malformed(msg) => (CloseCode::Protocol, msg.clone()),
        CloseCause::InvalidText(msg) => (CloseCode::Invalid, msg.clone()),
        CloseCause::Normal => (CloseCode::Normal, String::new()),
        // RFC 6455 §5.5.1: echo the client's code, unless it is one that
        // must not appear on the wire.
        CloseCause::ClientClosed(Some(code)) if sendable(*code) => {
            (CloseCode::from(*code), String::new())
        }
        CloseCause::ClientClosed(_) => (CloseCode::Normal, String::new()),
        CloseCause::Shutdown => (CloseCode::Away, "server shutting down".to_owned()),
        CloseCause::TokenExpired => (
            CloseCode::Other(TOKEN_EXPIRED_CLOSE_CODE),
            TOKEN_EXPIRED_REASON.to_owned(),
        ),
    };
    let mut text = text;
    if text.len() > MAX_CLOSE_REASON {
        let mut end = MAX_CLOSE_REASON;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    CloseReason {
        code,
        description: (!text.is_empty()).then_some(text),
    }
}

/// The upgrade response's body: the connection's outbound frames.
pub struct OutBody {
    out: Arc<Outbound>,
    conn: Addr<Connection>,
    /// The close frame has been written.
    closed: bool,
    /// Least time between two writes of pushed frames (zero: no pacing).
    pacing: Duration,
    /// When frames were last taken.
    last_write: Option<Instant>,
    /// The pacing deadline's timer, kept once a connection has needed one.
    timer: Option<Pin<Box<Sleep>>>,
}

impl OutBody {
    /// The body writing `out` for the connection actor `conn`, at most one
    /// write of pushed frames per `pacing`.
    pub fn new(out: Arc<Outbound>, conn: Addr<Connection>, pacing: Duration) -> Self {
        Self {
            out,
            conn,
            closed: false,
            pacing,
            last_write: None,
            timer: None,
        }
    }

    /// Take what is queued; pushed frames wait for the pacing deadline.
    /// Within the pacing window only the timer (or an urgent frame) wakes
    /// the socket, so a busy connection costs one wake-up per write.
    fn poll_take(&mut self, cx: &mut Context<'_>) -> Poll<Taken> {
        let mut passed = false;
        loop {
            let due = self
                .last_write
                .map(|t| t + self.pacing)
                .filter(|due| !passed && !self.pacing.is_zero() && *due > Instant::now());
            match (self.out.poll_take(cx, due.is_some()), due) {
                (Take::Ready(taken), _) => {
                    // A backlog goes out as fast as the socket takes it.
                    self.last_write = (!taken.more).then(Instant::now);
                    return Poll::Ready(taken);
                }
                (Take::Empty, None) => return Poll::Pending,
                (Take::Empty | Take::Paced, Some(due)) => {
                    let due = due.into();
                    let timer = match self.timer.as_mut() {
                        Some(timer) => {
                            if timer.deadline() != due {
                                timer.as_mut().reset(due);
                            }
                            timer
                        }
                        None => self.timer.insert(Box::pin(tokio::time::sleep_until(due))),
                    };
                    if timer.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    // The deadline passed meanwhile: look again without pacing.
                    passed = true;
                }
                (Take::Paced, None) => unreachable!("paced only when asked to pace"),
            }
        }
    }
}

fn encoded_len(frame: &Frame) -> usize {
    let payload = match frame {
        Frame::Text { data, .. } => data.len(),
        Frame::Ping => 0,
        Frame::Pong(p) => p.len(),
    };
    payload + 10
}

impl MessageBody for OutBody {
    type Error = Infallible;

    fn size(&self) -> BodySize {
        BodySize::Stream
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let this = self.get_mut();
        if this.closed {
            return Poll::Ready(None);
        }
        let taken = ready!(this.poll_take(cx));
        let size = taken.frames.iter().map(encoded_len).sum::<usize>() + 2 + MAX_CLOSE_REASON;
        let mut buf = BytesMut::with_capacity(size);
        for frame in taken.frames {
            match frame {
                Frame::Text { data, .. } => {
                    Parser::write_message(&mut buf, data.as_bytes(), OpCode::Text, true, false)
                }
                Frame::Ping => Parser::write_message(&mut buf, b"", OpCode::Ping, true, false),
                Frame::Pong(payload) => {
                    let payload = &payload[..payload.len().min(125)];
                    Parser::write_message(&mut buf, payload, OpCode::Pong, true, false)
                }
            }
        }
        if let Some(cause) = taken.close {
            match &cause {
                CloseCause::Shutdown | CloseCause::Normal | CloseCause::ClientClosed(_) => {
                    tracing::debug!(conn = this.out.id().0, ?cause, "closing connection")
                }
                _ => tracing::info!(conn = this.out.id().0, ?cause, "closing connection"),
            }
            Parser::write_close(&mut buf, Some(close_reason(&cause)), false);
            this.closed = true;
        }
        Poll::Ready(Some(Ok(buf.freeze())))
    }
}

impl Drop for OutBody {
    fn drop(&mut self) {
        // The socket is done (closed by us, by the peer, or failed): the
        // connection actor has nothing left to serve.
        self.out.close(CloseCause::Normal);
        self.conn.do_send(SocketGone);
    }
}

/// A frame from the client, continuations reassembled.
#[derive(Debug)]
pub enum Received {
    /// A whole text message.
    Text(ByteString),
    /// A whole binary message (not part of AHP).
    Binary,
    /// A ping with its payload.
    Ping(Bytes),
    /// A pong.
    Pong,
    /// The client closes.
    Close(Option<CloseReason>),
}

/// Why reading from the client stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// A message (or frame) over the limit, in bytes.
    TooLarge(usize),
    /// A malformed frame.
    Protocol(String),
    /// A text message that is not UTF-8.
    InvalidUtf8,
}

impl ReadError {
    /// How the connection closes for this error (the message says why).
    pub fn close_cause(&self) -> CloseCause {
        let msg = self.to_string();
        match self {
            ReadError::TooLarge(_) => CloseCause::TooLarge(msg),
            ReadError::Protocol(_) => CloseCause::Malformed(msg),
            ReadError::InvalidUtf8 => CloseCause::InvalidText(msg),
        }
    }
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::TooLarge(limit) => write!(f, "frame too large: the limit is {limit} bytes"),
            ReadError::Protocol(msg) => write!(f, "WebSocket protocol error: {msg}"),
            ReadError::InvalidUtf8 => write!(f, "a text frame is not valid UTF-8"),
        }
    }
}

/// The longest frame header: 2 bytes, an 8-byte length, a 4-byte mask.
const MAX_HEADER: usize = 14;

/// The payload length a frame header announces, once enough of it is in.
fn announced_len(buf: &[u8]) -> Option<u64> {
    match *buf.get(1)? & 0x7f {
        126 => Some(u16::from_be_bytes(buf.get(2..4)?.try_into().ok()?).into()),
        127 => Some(u64::from_be_bytes(buf.get(2..10)?.try_into().ok()?)),
        n => Some(n.into()),
    }
}

/// The client's frames: decoded, continuations reassembled up to the limit.
/// Ends after a close frame, an error, or the end of the stream.
pub struct Inbound {
    payload: Payload,
    codec: Codec,
    buf: BytesMut,
    /// A fragmented message being reassembled: is it text, and its bytes.
    parts: Option<(bool, BytesMut)>,
    limit: usize,
    eof: bool,
    done: bool,
}

impl Inbound {
    /// Read `payload`, refusing frames and messages over `limit` bytes.
    pub fn new(payload: Payload, limit: usize) -> Self {
        Self {
            payload,
            codec: Codec::new().max_size(limit),
            buf: BytesMut::new(),
            parts: None,
            limit,
            eof: false,
            done: false,
        }
    }

    fn fail(&mut self, e: ReadError) -> Poll<Option<Result<Received, ReadError>>> {
        self.done = true;
        self.parts = None;
        Poll::Ready(Some(Err(e)))
    }

    /// Add a fragment; the whole message once the last one is in.
    fn fragment(&mut self, item: Item) -> Result<Option<Received>, ReadError> {
        let (first, bytes, last) = match item {
            Item::FirstText(b) => (Some(true), b, false),
            Item::FirstBinary(b) => (Some(false), b, false),
            Item::Continue(b) => (None, b, false),
            Item::Last(b) => (None, b, true),
        };
        if let Some(text) = first {
            self.parts = Some((text, BytesMut::new()));
        }
        let Some((text, parts)) = self.parts.as_mut() else {
            return Err(ReadError::Protocol(
                "continuation frame without a first frame".into(),
            ));
        };
        if parts.len() + bytes.len() > self.limit {
            return Err(ReadError::TooLarge(self.limit));
        }
        parts.extend_from_slice(&bytes);
        if !last {
            return Ok(None);
        }
        let text = *text;
        let (_, whole) = self.parts.take().expect("checked above");
        if text {
            text_message(whole.freeze()).map(Some)
        } else {
            Ok(Some(Received::Binary))
        }
    }
}

fn text_message(bytes: Bytes) -> Result<Received, ReadError> {
    ByteString::try_from(bytes)
        .map(Received::Text)
        .map_err(|_| ReadError::InvalidUtf8)
}

impl Stream for Inbound {
    type Item = Result<Received, ReadError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            let frame = match this.codec.decode(&mut this.buf) {
                Ok(frame) => frame,
                Err(ProtocolError::Overflow) => return this.fail(ReadError::TooLarge(this.limit)),
                Err(e) => return this.fail(ReadError::Protocol(e.to_string())),
            };
            let received = match frame {
                Some(WsFrame::Text(bytes)) => text_message(bytes).map(Some),
                Some(WsFrame::Binary(_)) => Ok(Some(Received::Binary)),
                Some(WsFrame::Continuation(item)) => this.fragment(item),
                Some(WsFrame::Ping(bytes)) => Ok(Some(Received::Ping(bytes))),
                Some(WsFrame::Pong(_)) => Ok(Some(Received::Pong)),
                Some(WsFrame::Close(reason)) => {
                    this.done = true;
                    Ok(Some(Received::Close(reason)))
                }
                None if this.eof => {
                    this.done = true;
                    return Poll::Ready(None);
                }
                None => {
                    // `buf` now starts with an incomplete frame: refuse it
                    // as soon as it announces (or reaches) more than the
                    // limit, rather than buffering it whole first.
                    let announced = announced_len(&this.buf).unwrap_or(0);
                    if announced > this.limit as u64 || this.buf.len() > this.limit + MAX_HEADER {
                        return this.fail(ReadError::TooLarge(this.limit));
                    }
                    if this.buf.is_empty() {
                        // Do not keep a read buffer on an idle connection.
                        this.buf = BytesMut::new();
                    }
                    match ready!(Pin::new(&mut this.payload).poll_next(cx)) {
                        Some(Ok(bytes)) if this.buf.is_empty() => this.buf = BytesMut::from(bytes),
                        Some(Ok(bytes)) => this.buf.extend_from_slice(&bytes),
                        // The connection failed or ended: nothing more to read.
                        Some(Err(_)) | None => this.eof = true,
                    }
                    continue;
                }
            };
            match received {
                Ok(Some(r)) => return Poll::Ready(Some(Ok(r))),
                Ok(None) => continue,
                Err(e) => return this.fail(e),
            }
        }
    }
}

/// Ping every connection each `interval`; close those whose client sent
/// nothing for `idle_timeout`, and let go of those whose close could not be
/// written for as long. Runs until the server's system stops.
pub async fn heartbeat(shared: Arc<Shared>, interval: Duration, idle_timeout: Duration) {
    let interval = interval.max(Duration::from_millis(10));
    let idle_ms = idle_timeout.as_millis() as u64;
    let abandon_beats = idle_timeout
        .as_millis()
        .div_ceil(interval.as_millis())
        .max(1) as u32;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let conns: Vec<Arc<Outbound>> = shared.connections.iter().map(|c| c.clone()).collect();
        for c in conns {
            match c.beat(idle_ms, abandon_beats) {
                Beat::Idle => tracing::info!(conn = c.id().0, "closing an idle connection"),
                Beat::Abandoned => tracing::info!(
                    conn = c.id().0,
                    "letting go of a connection whose peer never took its close"
                ),
                Beat::Pinged | Beat::Closing => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inbound(chunks: Vec<Vec<u8>>, limit: usize) -> Inbound {
        let stream = futures_util::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, actix_web::error::PayloadError>(Bytes::from(c))),
        );
        Inbound::new(
            Payload::Stream {
                payload: Box::pin(stream),
            },
            limit,
        )
    }

    /// A masked client frame.
    fn client_frame(op: OpCode, fin: bool, payload: &[u8]) -> Vec<u8> {
        let mut buf = BytesMut::new();
        Parser::write_message(&mut buf, payload, op, fin, true);
        buf.to_vec()
    }

    async fn all(mut inbound: Inbound) -> Vec<Result<Received, ReadError>> {
        use futures_util::StreamExt;
        let mut got = Vec::new();
        while let Some(r) = inbound.next().await {
            got.push(r);
        }
        got
    }

    #[actix_web::test]
    async fn reassembles_fragments_split_across_reads() {
        let mut bytes = client_frame(OpCode::Text, false, b"{\"a\":");
        bytes.extend(client_frame(OpCode::Ping, true, b"hi"));
        bytes.extend(client_frame(OpCode::Continue, true, b"1}"));
        bytes.extend(client_frame(OpCode::Close, true, &[0x03, 0xe8]));
        bytes.extend(client_frame(OpCode::Text, true, b"after close"));
        // Split into 3-byte reads to cross every frame boundary.
        let chunks = bytes.chunks(3).map(<[u8]>::to_vec).collect();
        let got = all(inbound(chunks, 1024)).await;
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(matches!(&got[0], Ok(Received::Ping(p)) if &p[..] == b"hi"));
        assert!(matches!(&got[1], Ok(Received::Text(t)) if t == "{\"a\":1}"));
        assert!(matches!(&got[2], Ok(Received::Close(Some(r))) if r.code == CloseCode::Normal));
    }

    #[actix_web::test]
    async fn refuses_oversize_frames_and_messages() {
        let big = client_frame(OpCode::Text, true, &[b'x'; 100]);
        let got = all(inbound(vec![big], 64)).await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].as_ref().unwrap_err(), &ReadError::TooLarge(64));

        let mut parts = client_frame(OpCode::Text, false, &[b'x'; 30]);
        parts.extend(client_frame(OpCode::Continue, false, &[b'x'; 30]));
        parts.extend(client_frame(OpCode::Continue, true, &[b'x'; 30]));
        let got = all(inbound(vec![parts], 64)).await;
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].as_ref().unwrap_err(), &ReadError::TooLarge(64));
    }

    #[actix_web::test]
    async fn refuses_a_huge_frame_from_its_header_without_buffering_it() {
        use futures_util::StreamExt;
        // A header announcing 2^40 bytes, then an endless trickle of data:
        // refused at once, and the stream is never read to its end.
        let mut header = vec![0x81, 0xff];
        header.extend((1u64 << 40).to_be_bytes());
        header.extend([1, 2, 3, 4]);
        let endless = futures_util::stream::iter(
            std::iter::once(header).chain(std::iter::repeat(vec![b'x'; 4096])),
        )
        .map(|c| Ok::<_, actix_web::error::PayloadError>(Bytes::from(c)));
        let mut inbound = Inbound::new(
            Payload::Stream {
                payload: Box::pin(endless),
            },
            1024,
        );
        assert_eq!(
            inbound.next().await.unwrap().unwrap_err(),
            ReadError::TooLarge(1024)
        );
        assert!(inbound.next().await.is_none());
        assert!(inbound.buf.len() <= 1024 + MAX_HEADER);
    }

    #[actix_web::test]
    async fn refuses_invalid_utf8_and_stray_continuations() {
        let got = all(inbound(
            vec![client_frame(OpCode::Text, true, &[0xff, 0xfe])],
            64,
        ))
        .await;
        assert!(matches!(&got[..], [Err(ReadError::InvalidUtf8)]));
        assert_eq!(
            close_reason(&ReadError::InvalidUtf8.close_cause()).code,
            CloseCode::Invalid
        );
        let got = all(inbound(
            vec![client_frame(OpCode::Continue, true, b"x")],
            64,
        ))
        .await;
        assert!(matches!(&got[..], [Err(ReadError::Protocol(_))]), "{got:?}");
    }

    #[test]
    fn close_reasons_fit_a_control_frame() {
        let long = CloseCause::Protocol("é".repeat(200));
        let reason = close_reason(&long);
        assert!(reason.description.unwrap().len() <= MAX_CLOSE_REASON);
        assert_eq!(
            close_reason(&ReadError::TooLarge(10).close_cause()).code,
            CloseCode::Size
        );
        assert_eq!(
            close_reason(&ReadError::Protocol("x".into()).close_cause()).code,
            CloseCode::Protocol
        );
        assert_eq!(close_reason(&CloseCause::Shutdown).code, CloseCode::Away);
        let expired = close_reason(&CloseCause::TokenExpired);
        assert_eq!(expired.code, CloseCode::Other(TOKEN_EXPIRED_CLOSE_CODE));
        assert!(expired
            .description
            .is_some_and(|d| d.len() <= MAX_CLOSE_REASON));
        assert_eq!(close_reason(&CloseCause::Normal).description, None);
        assert_eq!(
            close_reason(&CloseCause::ClientClosed(Some(4001))).code,
            CloseCode::Other(4001)
        );
        assert_eq!(
            close_reason(&CloseCause::ClientClosed(Some(1005))).code,
            CloseCode::Normal
        );
        assert_eq!(
            close_reason(&CloseCause::ClientClosed(None)).code,
            CloseCode::Normal
        );
    }
}
