//! The WebSocket itself: a TCP stream taken over from actix-http's HTTP/1
//! dispatcher once the upgrade is answered ([`super::upgrade`]).
//!
//! Three parties use the socket. The connection's [`Outbound`] writes to it
//! directly ([`Wire`]): a publisher pushing a frame to a connection with
//! nothing else in flight writes it on its own thread, one `write` per
//! delivery, with no task to wake. The [`writer`] task writes everything
//! else — what a direct write could not finish, backlogs, frames held for
//! the pacing deadline, pings and the close — and is the only one that
//! waits for room. The [`Reader`] feeds the client's bytes to
//! [`super::inbound::Inbound`].
//!
//! Writes are paced: on a connection written less than `--write-pacing-ms`
//! ago (twice that under a stream faster than one frame per 1.8 times it),
//! pushed frames wait until that much time has passed, so under a heavy
//! stream they go out several per write (replies, pongs and closes never
//! wait). One [`heartbeat`] task pings the connections that showed
//! no sign of life lately, closes the idle ones and lets go of those whose
//! close cannot be written.
//!
//! An idle connection holds no buffer: reads go through a per-thread
//! buffer and only an incomplete frame is kept; frames are encoded per write.
//!
//! The socket knows nothing of the connection actor above it: it is handed
//! an [`OnGone`] callback to call once the socket is done.

use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use actix_http::ws::{CloseCode, CloseReason, Parser};
use actix_web::rt::net::TcpStream;
use bytes::{Bytes, BytesMut};
use futures_util::Stream;
use tokio::sync::Notify;
use tokio::time::Sleep;

use super::admission::{Connections, OpenConn};
use crate::metrics::Metrics;
use crate::publish::outbound::{
    encode_frames, encoded_len, Beat, CloseCause, Outbound, Take, Taken, Wire,
};

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

/// Called once when the socket is done (closed by us, by the peer, or
/// failed), so whoever serves the connection lets it go.
pub type OnGone = Box<dyn FnOnce() + Send>;

/// How long, after sending its close, the server keeps reading while the
/// client answers with its own and closes, once the client has everything
/// (or when the kernel cannot tell): closing a socket the client still
/// writes to (its close, a pong to a ping it has only just read) resets the
/// connection, and a reset throws away whatever the server's kernel had not
/// yet delivered, the close frame among it.
const LINGER: Duration = Duration::from_secs(1);

/// While the client is still taking the bytes sent before the close, the
/// server keeps lingering, as long as the client takes some within this
/// long, and at most [`MAX_LINGER`] in all.
const LINGER_STALL: Duration = Duration::from_secs(5);

/// The longest the server keeps a closed connection's socket for a client
/// still reading its backlog.
const MAX_LINGER: Duration = Duration::from_secs(30);

/// How often a lingering writer looks at what the client has taken.
const LINGER_TICK: Duration = Duration::from_millis(100);

/// Bytes one read takes at most.
const READ_CHUNK: usize = 16 * 1024;

/// One connection's TCP stream, shared by its reader, its writer task and
/// direct writes.
pub struct Socket {
    tcp: TcpStream,
    /// Bytes written and evictions are counted here.
    metrics: Arc<Metrics>,
    /// The reader is done (end of stream, error, or dropped).
    read_done: AtomicBool,
    read_done_notify: Notify,
}

impl Socket {
    /// Wrap an upgraded stream.
    pub fn new(tcp: TcpStream, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            tcp,
            metrics,
            read_done: AtomicBool::new(false),
            read_done_notify: Notify::new(),
        })
    }

    fn mark_read_done(&self) {
        if !self.read_done.swap(true, Ordering::AcqRel) {
            self.read_done_notify.notify_waiters();
        }
    }

    /// Wait until the reader is done, at most `limit`.
    async fn read_done_within(&self, limit: Duration) {
        let notified = self.read_done_notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if !self.read_done.load(Ordering::Acquire) {
            let _ = tokio::time::timeout(limit, notified).await;
        }
    }

    /// Bytes written to the socket that the client has not acknowledged
    /// yet (`SIOCOUTQ`), where the kernel can tell.
    fn unacked(&self) -> Option<usize> {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let mut n: libc::c_int = 0;
            // SAFETY: SIOCOUTQ (= TIOCOUTQ) writes one int through the
            // pointer, which points at a live c_int; the descriptor is
            // open for as long as `self.tcp` is.
            let rc = unsafe { libc::ioctl(self.tcp.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
            (rc == 0).then_some(n.max(0) as usize)
        }
        #[cfg(not(target_os = "linux"))]
        None
    }

    /// After the close is written: keep the socket (its reader discarding
    /// what arrives) until the client closes, while the client is still
    /// taking what was sent before the close; then at most [`LINGER`] once
    /// it has everything.
    async fn linger(&self) {
        let started = tokio::time::Instant::now();
        let mut unacked = self.unacked();
        let mut progress = started;
        loop {
            self.read_done_within(LINGER_TICK).await;
            if self.read_done.load(Ordering::Acquire) {
                return;
            }
            let now = tokio::time::Instant::now();
            let waited = now - started;
            let left = self.unacked();
            if left.is_some_and(|left| unacked.is_some_and(|before| left < before)) {
                progress = now;
            }
            unacked = left;
            // Where the kernel cannot tell, as if the client had it all.
            let has_all = left.is_none_or(|left| left == 0);
            if (has_all && waited >= LINGER)
                || now - progress >= LINGER_STALL
                || waited >= MAX_LINGER
            {
                return;
            }
        }
    }

    /// Write all of `buf`, waiting for room.
    async fn write_all(&self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            match self.try_write(buf) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => buf = &buf[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.tcp.writable().await?,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl Wire for Socket {
    fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        let written = self.tcp.try_write(buf);
        if let Ok(n) = written {
            self.metrics.sent_bytes.increment(n as u64);
        }
        written
    }

    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        Some(self.tcp.as_raw_fd())
    }

    fn sent(&self, n: usize) {
        self.metrics.sent_bytes.increment(n as u64);
    }

    fn last_ack_age_ms(&self) -> Option<u64> {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            use std::os::fd::AsRawFd;
            // SAFETY: `tcp_info` is plain integers, valid when zeroed.
            let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
            // SAFETY: the kernel writes at most `len` bytes into `info`,
            // which lives across the call; the descriptor is open for as
            // long as `self.tcp` is.
            let rc = unsafe {
                libc::getsockopt(
                    self.tcp.as_raw_fd(),
                    libc::IPPROTO_TCP,
                    libc::TCP_INFO,
                    (&raw mut info).cast(),
                    &mut len,
                )
            };
            (rc == 0).then_some(u64::from(info.tcpi_last_ack_recv))
        }
        #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
        None
    }
}

thread_local! {
    /// Where reads land before the bytes are handed on (one per thread).
    static READ_BUF: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0; READ_CHUNK]);
}

/// The client's bytes, as they arrive. Ends at the end of the stream or on
/// an error.
pub struct Reader {
    socket: Arc<Socket>,
    /// Bytes that arrived with the upgrade request, handed on first.
    early: Option<Bytes>,
}

impl Reader {
    /// Read `socket`, starting with `early` (bytes read with the request).
    pub fn new(socket: Arc<Socket>, early: Bytes) -> Self {
        Self {
            socket,
            early: (!early.is_empty()).then_some(early),
        }
    }
}

impl Stream for Reader {
    type Item = io::Result<Bytes>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(early) = this.early.take() {
            return Poll::Ready(Some(Ok(early)));
        }
        if this.socket.read_done.load(Ordering::Acquire) {
            return Poll::Ready(None);
        }
        loop {
            if let Err(e) = std::task::ready!(this.socket.tcp.poll_read_ready(cx)) {
                this.socket.mark_read_done();
                return Poll::Ready(Some(Err(e)));
            }
            let read = READ_BUF.with_borrow_mut(|buf| read_once(&this.socket.tcp, buf));
            match read {
                Ok(bytes) if bytes.is_empty() => {
                    this.socket.mark_read_done();
                    return Poll::Ready(None);
                }
                Ok(bytes) => return Poll::Ready(Some(Ok(bytes))),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => {
                    this.socket.mark_read_done();
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }
}

/// One read of what the client sent. A read that did not fill `buf` took
/// everything the kernel held, so the socket's readiness is forgotten with
/// it: the next poll waits for the client's next bytes instead of asking
/// the kernel once more only to hear "would block" (one system call saved
/// per client frame). The readiness forgotten is the one seen before the
/// read, so bytes that arrive after it are not missed.
fn read_once(tcp: &TcpStream, buf: &mut [u8]) -> io::Result<Bytes> {
    use std::io::Read;
    let socket = socket2::SockRef::from(tcp);
    let mut short = None;
    let read = tcp.try_io(tokio::io::Interest::READABLE, || {
        let n = (&*socket).read(buf)?;
        if n > 0 && n < buf.len() {
            // Reported as "would block" so tokio clears the readiness.
            short = Some(n);
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    match (read, short) {
        (_, Some(n)) | (Ok(n), None) => Ok(Bytes::copy_from_slice(&buf[..n])),
        (Err(e), None) => Err(e),
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.socket.mark_read_done();
    }
}

/// Lets the connection go however the writer ends (done, failed, aborted).
struct Gone {
    out: Arc<Outbound>,
    on_gone: Option<OnGone>,
    metrics: Arc<Metrics>,
    /// The close frame was written (and counted, and logged).
    close_written: bool,
}

impl Drop for Gone {
    fn drop(&mut self) {
        if !self.close_written {
            // Closed without its close frame going out: evicted while the
            // socket took nothing (abandoned), or the socket failed.
            if let Some(cause) = self.out.close_cause() {
                self.metrics.closed(&cause);
                tracing::info!(
                    conn = %self.out.id(),
                    cause = cause_name(&cause),
                    "connection closed without its close frame (the socket took nothing more)"
                );
            } else {
                tracing::info!(conn = %self.out.id(), cause = "socket", "connection closed: the socket ended");
            }
        }
        // Nobody writes to the socket any more; the connection has nothing
        // left to serve.
        self.out.detach();
        self.out.close(CloseCause::Normal);
        if let Some(gone) = self.on_gone.take() {
            gone();
        }
    }
}

/// The connection's writer: writes what the pushers left to it, at most
/// one write of pushed frames per pacing interval (see
/// [`Outbound::paced_until`]), then the close. Calls `on_gone` when it
/// ends, however it ends.
pub async fn writer(out: Arc<Outbound>, socket: Arc<Socket>, on_gone: OnGone) {
    let mut gone = Gone {
        out: out.clone(),
        on_gone: Some(on_gone),
        metrics: socket.metrics.clone(),
        close_written: false,
    };
    let mut pacer = Pacer {
        out: &out,
        timer: None,
    };
    loop {
        let taken = poll_fn(|cx| pacer.poll_take(cx)).await;
        let more = taken.more;
        let (buf, closing) = encode(&out, taken, &socket.metrics);
        gone.close_written |= closing;
        if socket.write_all(&buf).await.is_err() {
            return;
        }
        out.wrote(more);
        if closing {
            let _ = socket2::SockRef::from(&socket.tcp).shutdown(std::net::Shutdown::Write);
            socket.linger().await;
            return;
        }
    }
}

/// The bytes of one write: what a direct write left, the frames, the close.
fn encode(out: &Outbound, taken: Taken, metrics: &Metrics) -> (BytesMut, bool) {
    let mut buf = BytesMut::with_capacity(
        taken.head.len() + encoded_len(&taken.frames) + 4 + MAX_CLOSE_REASON,
    );
    buf.extend_from_slice(&taken.head);
    encode_frames(&mut buf, taken.frames);
    let closing = taken.close.is_some();
    if let Some(cause) = taken.close {
        metrics.closed(&cause);
        let reason = close_reason(&cause);
        tracing::info!(
            conn = %out.id(),
            code = u16::from(reason.code),
            reason = reason.description.as_deref().unwrap_or(""),
            cause = cause_name(&cause),
            "connection closed"
        );
        Parser::write_close(&mut buf, Some(reason), false);
    }
    (buf, closing)
}

/// A close's cause in a log line.
fn cause_name(cause: &CloseCause) -> &'static str {
    match cause {
        CloseCause::Overflow => "overflow",
        CloseCause::Protocol(_) => "idle",
        CloseCause::TooLarge(_) => "too_large",
        CloseCause::Malformed(_) => "malformed",
        CloseCause::InvalidText(_) => "invalid_text",
        CloseCause::Normal => "server",
        CloseCause::ClientClosed(_) => "client",
        CloseCause::Shutdown => "shutdown",
        CloseCause::TokenExpired => "token_expired",
    }
}

/// The writer's view of the queue, with its pacing deadline.
struct Pacer<'a> {
    out: &'a Outbound,
    /// The pacing deadline's timer, kept once a connection has needed one.
    timer: Option<Pin<Box<Sleep>>>,
}

impl Pacer<'_> {
    /// Take what is queued; pushed frames wait for the pacing deadline.
    /// Within the pacing window only the timer (or an urgent frame) wakes
    /// the writer, so a busy connection costs one wake-up per write.
    fn poll_take(&mut self, cx: &mut Context<'_>) -> Poll<Taken> {
        let mut passed = false;
        loop {
            let due = self
                .out
                .paced_until()
                .filter(|due| !passed && *due > std::time::Instant::now());
            match (self.out.poll_take(cx, due.is_some()), due) {
                (Take::Ready(taken), _) => return Poll::Ready(taken),
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

/// How often the heartbeat wakes: each connection is beaten once per
/// interval, in the tick its id falls in, so the pings (and the pongs
/// coming back) are spread over the interval. Beating 10,000 connections at
/// once took both cores of a 2-core server for about 300 ms, and every
/// action published meanwhile waited that long.
const BEAT_TICK: Duration = Duration::from_millis(100);
/// Most ticks one interval is cut into.
const MAX_BEAT_SLICES: u64 = 256;

/// Look at every connection each `interval` (a share of them each tick):
/// ping those with no sign of life since the last look (see
/// [`Outbound::beat`]), close those with none for `idle_timeout`, and let
/// go of those whose close could not be written for as long. Runs until
/// the server's system stops.
pub async fn heartbeat(connections: Arc<Connections>, interval: Duration, idle_timeout: Duration) {
    let interval = interval.max(Duration::from_millis(10));
    let idle_ms = idle_timeout.as_millis() as u64;
    let interval_ms = interval.as_millis() as u64;
    let abandon_beats = idle_timeout
        .as_millis()
        .div_ceil(interval.as_millis())
        .max(1) as u32;
    let slices = beat_slices(interval);
    let mut tick = tokio::time::interval(interval / slices as u32);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut slot = 0;
    // This interval's connections by slot, listed at its first tick (a
    // connection opened since waits for the next interval; one closed since
    // is skipped).
    let mut round: Vec<Vec<Weak<OpenConn>>> = Vec::new();
    loop {
        tick.tick().await;
        if slot == 0 {
            round = connections.by_slot(slices);
        }
        let beaten = std::mem::take(&mut round[slot as usize]);
        slot = (slot + 1) % slices;
        for open in beaten.iter().filter_map(Weak::upgrade) {
            let c = &open.out;
            match c.beat(idle_ms, abandon_beats, interval_ms) {
                Beat::Idle => tracing::info!(conn = %c.id(), "closing an idle connection"),
                Beat::Abandoned => tracing::info!(
                    conn = %c.id(),
                    "letting go of a connection whose peer never took its close"
                ),
                Beat::Pinged | Beat::Acknowledged | Beat::Closing => {}
            }
        }
    }
}

/// Ticks one heartbeat `interval` is cut into: one per [`BEAT_TICK`], at
/// least one, at most [`MAX_BEAT_SLICES`].
fn beat_slices(interval: Duration) -> u64 {
    (interval.as_millis() / BEAT_TICK.as_millis()).clamp(1, u128::from(MAX_BEAT_SLICES)) as u64
}

#[cfg(test)]
mod tests {
    use super::super::inbound::ReadError;
    use super::*;

    #[tokio::test]
    async fn a_short_read_forgets_the_readiness_and_misses_nothing_after_it() {
        use tokio::io::{AsyncWriteExt, Interest};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let ready = |tcp: &TcpStream| tcp.try_io(Interest::READABLE, || Ok(())).is_ok();
        let mut buf = vec![0; 64];

        client.write_all(b"one").await.unwrap();
        server.readable().await.unwrap();
        assert_eq!(&read_once(&server, &mut buf).unwrap()[..], b"one");
        assert!(
            !ready(&server),
            "drained: the next poll waits for the client"
        );
        client.write_all(b"two").await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), server.readable())
            .await
            .expect("bytes after a short read wake the reader")
            .unwrap();
        assert_eq!(&read_once(&server, &mut buf).unwrap()[..], b"two");

        // A read that fills the buffer may have left bytes: still ready.
        client.write_all(&[7; 100]).await.unwrap();
        let mut got = Vec::new();
        while got.len() < 64 {
            server.readable().await.unwrap();
            got.extend_from_slice(&read_once(&server, &mut buf).unwrap_or_default());
        }
        if got.len() == 64 {
            assert!(ready(&server), "a full read keeps the readiness");
        }
        while got.len() < 100 {
            server.readable().await.unwrap();
            got.extend_from_slice(&read_once(&server, &mut buf).unwrap_or_default());
        }
        assert_eq!(got, [7; 100]);

        // The end of the stream reads as nothing.
        drop(client);
        server.readable().await.unwrap();
        assert!(read_once(&server, &mut buf).unwrap().is_empty());
    }

    #[test]
    fn the_heartbeat_spreads_its_pings_over_the_interval() {
        // The default 20 s: 200 ticks of 100 ms, each connection in one.
        assert_eq!(beat_slices(Duration::from_secs(20)), 200);
        assert_eq!(beat_slices(Duration::from_secs(60)), MAX_BEAT_SLICES);
        // Short intervals (tests) beat everyone at each tick.
        assert_eq!(beat_slices(Duration::from_millis(50)), 1);
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
