//! The WebSocket itself: a TCP stream taken over from actix-http's HTTP/1
//! dispatcher once the upgrade is answered ([`Upgraded`]).
//!
//! Three parties use the socket. The connection's [`Outbound`] writes to it
//! directly ([`Wire`]): a publisher pushing a frame to a connection with
//! nothing else in flight writes it on its own thread, one `write` per
//! delivery, with no task to wake. The [`writer`] task writes everything
//! else — what a direct write could not finish, backlogs, frames held for
//! the pacing deadline, pings and the close — and is the only one that
//! waits for room. The [`Reader`] feeds the client's bytes to
//! [`super::Inbound`].
//!
//! Writes are paced: on a connection written less than `--write-pacing-ms`
//! ago (twice that under a stream faster than one frame per 1.8 times it),
//! pushed frames wait until that much time has passed, so under a heavy
//! stream they go out several per write (replies, pongs and closes never
//! wait).
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
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_codec::Framed;
use actix_http::h1;
use actix_http::ws::Parser;
use actix_web::rt::net::TcpStream;
use bytes::{Bytes, BytesMut};
use futures_util::Stream;
use tokio::sync::Notify;
use tokio::time::Sleep;

use super::close::{cause_name, close_reason, MAX_CLOSE_REASON};
use super::inbound::Inbound;
use super::outbound::{encode_frames, encoded_len, CloseCause, Outbound, Take, Taken, Wire};
use super::Meter;

/// A WebSocket whose upgrade was answered, taken over from the HTTP/1
/// dispatcher: from here on its socket is ours, and the dispatcher and its
/// buffers are gone.
pub struct Upgraded {
    socket: Arc<Socket>,
    /// Bytes the dispatcher read past the request (the client's first
    /// frames may have come with it).
    early: Bytes,
}

impl Upgraded {
    /// Take the socket out of the dispatcher's hands once the handshake's
    /// answer is written; bytes and closes are counted on `meter`.
    pub fn take_over(framed: Framed<TcpStream, h1::Codec>, meter: Arc<dyn Meter>) -> Self {
        let parts = framed.into_parts();
        Self {
            socket: Socket::new(parts.io, meter),
            early: parts.read_buf.freeze(),
        }
    }

    /// The client's address.
    pub fn peer(&self) -> Option<std::net::SocketAddr> {
        self.socket.tcp.peer_addr().ok()
    }

    /// Serve `out` on this socket: pushers write to it directly, pushed
    /// frames at most once per `pacing` (see [`Outbound::attach`]). Returns
    /// the client's frames, each refused beyond `frame_limit` bytes, and the
    /// writer to start once the connection above is ready.
    pub fn serve(
        self,
        out: &Arc<Outbound>,
        pacing: Duration,
        frame_limit: usize,
    ) -> (Inbound, Writer) {
        out.attach(self.socket.clone(), pacing);
        let inbound = Inbound::new(Reader::new(self.socket.clone(), self.early), frame_limit);
        let writer = Writer {
            out: out.clone(),
            socket: self.socket,
        };
        (inbound, writer)
    }
}

/// A connection's writer task, not started yet (see [`Upgraded::serve`]).
pub struct Writer {
    out: Arc<Outbound>,
    socket: Arc<Socket>,
}

impl Writer {
    /// Start writing on the current actix worker; `on_gone` is called once
    /// the socket is done, however it ends. A connection whose peer never
    /// takes its close stops being written (see [`Outbound::set_on_abandon`]).
    pub fn spawn(self, on_gone: OnGone) {
        let out = self.out.clone();
        let task = actix_web::rt::spawn(writer(self.out, self.socket, on_gone));
        let abort = task.abort_handle();
        out.set_on_abandon(move || abort.abort());
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
    /// Bytes written and closes are counted here.
    meter: Arc<dyn Meter>,
    /// The reader is done (end of stream, error, or dropped).
    read_done: AtomicBool,
    read_done_notify: Notify,
}

impl Socket {
    /// Wrap an upgraded stream.
    pub fn new(tcp: TcpStream, meter: Arc<dyn Meter>) -> Arc<Self> {
        Arc::new(Self {
            tcp,
            meter,
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
            self.meter.sent(n as u64);
        }
        written
    }

    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        Some(self.tcp.as_raw_fd())
    }

    fn sent(&self, n: usize) {
        self.meter.sent(n as u64);
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
    meter: Arc<dyn Meter>,
    /// The close frame was written (and counted, and logged).
    close_written: bool,
}

impl Drop for Gone {
    fn drop(&mut self) {
        if !self.close_written {
            // Closed without its close frame going out: evicted while the
            // socket took nothing (abandoned), or the socket failed.
            if let Some(cause) = self.out.close_cause() {
                self.meter.closed(&cause);
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
async fn writer(out: Arc<Outbound>, socket: Arc<Socket>, on_gone: OnGone) {
    let mut gone = Gone {
        out: out.clone(),
        on_gone: Some(on_gone),
        meter: socket.meter.clone(),
        close_written: false,
    };
    let mut pacer = Pacer {
        out: &out,
        timer: None,
    };
    loop {
        let taken = poll_fn(|cx| pacer.poll_take(cx)).await;
        let more = taken.more;
        let (buf, closing) = encode(&out, taken, &*socket.meter);
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
fn encode(out: &Outbound, taken: Taken, meter: &dyn Meter) -> (BytesMut, bool) {
    let mut buf = BytesMut::with_capacity(
        taken.head.len() + encoded_len(&taken.frames) + 4 + MAX_CLOSE_REASON,
    );
    buf.extend_from_slice(&taken.head);
    encode_frames(&mut buf, taken.frames);
    let closing = taken.close.is_some();
    if let Some(cause) = taken.close {
        meter.closed(&cause);
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
                .filter(|due| !passed && *due > tokio::time::Instant::now());
            match (self.out.poll_take(cx, due.is_some()), due) {
                (Take::Ready(taken), _) => return Poll::Ready(taken),
                (Take::Empty, None) => return Poll::Pending,
                (Take::Empty | Take::Paced, Some(due)) => {
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
#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ServerSeq;
    use crate::transport::outbound::Frame;
    use crate::transport::{FakeWire, Push};

    fn envelope(seq: u64, text: &str) -> Push<'static> {
        Push::Envelope(ServerSeq::new(seq), text.to_owned().into())
    }

    /// A meter that counts nothing.
    struct Unmetered;

    impl Meter for Unmetered {
        fn sent(&self, _: u64) {}
        fn closed(&self, _: &CloseCause) {}
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[tokio::test]
    async fn the_last_acknowledgement_is_read_off_a_real_socket() {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let socket = Socket::new(server, Arc::new(Unmetered));
        let wrote = std::time::Instant::now();
        assert_eq!(socket.try_write(b"hello").unwrap(), 5);
        let mut got = [0u8; 5];
        client.read_exact(&mut got).await.unwrap();
        // Until the acknowledgement is in (the client's kernel may delay
        // it): nothing left unacknowledged.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while socket.unacked() != Some(0) {
            assert!(std::time::Instant::now() < deadline, "never acknowledged");
            tokio::task::yield_now().await;
        }
        // It came after the write, so it is no older than the write.
        let age = socket.last_ack_age_ms().expect("TCP_INFO answers");
        assert!(
            u128::from(age) <= wrote.elapsed().as_millis() + 1,
            "acknowledged {age} ms ago, written {:?} ago",
            wrote.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_writer_holds_pushed_frames_until_the_pacing_deadline_and_never_urgent_ones() {
        let pacing = Duration::from_millis(5);
        let out = Arc::new(Outbound::new(1 << 20));
        let wire = FakeWire::with_room(usize::MAX);
        out.attach(wire.clone(), pacing);
        // An idle connection: the pusher writes at once.
        out.push(envelope(1, "a"));
        assert_eq!(wire.texts(), ["a"]);
        let written = tokio::time::Instant::now();
        // Within the interval: it waits for the writer, which waits for the
        // deadline, on the runtime's clock.
        out.push(envelope(2, "b"));
        assert_eq!(wire.texts(), ["a"]);
        let mut pacer = Pacer {
            out: &out,
            timer: None,
        };
        let taken = poll_fn(|cx| pacer.poll_take(cx)).await;
        assert_eq!(
            written.elapsed(),
            pacing,
            "taken at the deadline, not before"
        );
        let texts: Vec<&str> = taken
            .frames
            .iter()
            .filter_map(|f| match f {
                Frame::Text { data, .. } => Some(&**data),
                _ => None,
            })
            .collect();
        assert_eq!(texts, ["b"]);
        out.wrote(false);
        // Within the next interval, an echo does not wait, and takes the
        // envelope queued before it along.
        let wrote_b = tokio::time::Instant::now();
        out.push(envelope(3, "c"));
        assert_eq!(wire.texts(), ["a"], "c waits");
        out.push(Push::Echo(ServerSeq::new(4), "d".into()));
        assert_eq!(wire.texts(), ["a", "c", "d"]);
        assert_eq!(wrote_b.elapsed(), Duration::ZERO);
    }

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
}
