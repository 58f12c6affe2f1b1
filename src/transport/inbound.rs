//! The client's side of the WebSocket: [`Inbound`] decodes the frames
//! arriving on the socket ([`super::socket::Reader`]) with actix-http's codec and
//! reassembles fragmented messages, refusing any frame or message over the
//! frame limit as soon as its header announces it.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use actix_codec::Decoder;
use actix_http::ws::{CloseReason, Codec, Frame as WsFrame, Item, ProtocolError};
use bytes::{Bytes, BytesMut};
use bytestring::ByteString;
use futures_util::Stream;

use super::CloseCause;

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
    payload: Bytestream,
    codec: Codec,
    buf: BytesMut,
    /// A fragmented message being reassembled: is it text, and its bytes.
    parts: Option<(bool, BytesMut)>,
    limit: usize,
    eof: bool,
    done: bool,
}

/// Where the client's bytes come from.
pub type Bytestream = Pin<Box<dyn Stream<Item = std::io::Result<Bytes>>>>;

impl Inbound {
    /// Read `payload`, refusing frames and messages over `limit` bytes.
    pub fn new(
        payload: impl Stream<Item = std::io::Result<Bytes>> + 'static,
        limit: usize,
    ) -> Self {
        Self {
            payload: Box::pin(payload),
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

#[cfg(test)]
mod tests {
    use actix_http::ws::{CloseCode, OpCode, Parser};

    use super::super::close_reason;
    use super::*;

    fn inbound(chunks: Vec<Vec<u8>>, limit: usize) -> Inbound {
        let stream = futures_util::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, std::io::Error>(Bytes::from(c))),
        );
        Inbound::new(stream, limit)
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
        .map(|c| Ok::<_, std::io::Error>(Bytes::from(c)));
        let mut inbound = Inbound::new(endless, 1024);
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
}
