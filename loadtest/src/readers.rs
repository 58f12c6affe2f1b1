//! The subscribers' reading threads: once a subscriber is connected and
//! subscribed (over tokio-tungstenite), its socket moves to one of a few
//! plain threads — one per core — that wait on it with their own `epoll` and
//! read it with one `recv` per readiness into a buffer the thread reuses.
//! WebSocket frames are cut with tungstenite's own header parser.
//!
//! Why not a tokio task per socket: on loopback the load generator shares
//! the machine's cores with the server under test, and reading a frame
//! through a task (readiness, waker, scheduling, tungstenite's buffers)
//! cost about as much of a core again as the kernel's receive path — more
//! per frame than the server spent writing it — so at tens of thousands of
//! frames a second the reader, not the server, set the median latency of
//! any server fast enough. Here a frame costs the `recv` and the checks.
//!
//! A thread answers pings (masked pongs, as a client must), follows
//! fragmented messages, and ends a subscriber on a close frame, a broken
//! socket or bad framing (the reason lands in [`Receiver::closed`]), or when
//! its run stops; either way the [`Receiver`] goes back through a oneshot.

use std::io::{Cursor, Read as _, Write as _};
use std::net::TcpStream;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::Context as _;
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Control, Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::{Frame, FrameHeader};

use crate::clock::now_ns;
use crate::conn::Ws;
use crate::engine::{Receiver, Run};

/// Token of a thread's wake-up `eventfd` in its `epoll` set.
const WAKE: u64 = u64::MAX;
/// How often (ns) a thread looks for subscribers whose run has stopped.
const STOP_CHECK_NS: u64 = 10_000_000;
/// Bytes read per `recv`.
const READ_CHUNK: usize = 64 * 1024;
/// Largest frame or message accepted (as `conn::ws_config` allows).
const MAX_MESSAGE: u64 = 256 << 20;

static THREADS: OnceLock<usize> = OnceLock::new();
static POOL: OnceLock<Vec<Arc<Thread>>> = OnceLock::new();
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// How many reading threads to start (before the first subscriber); the
/// default is one per core.
pub fn set_threads(n: usize) {
    let _ = THREADS.set(n.max(1));
}

/// A subscriber handed to a reading thread.
struct Adopted {
    stream: TcpStream,
    rx: Receiver,
    run: Arc<Run>,
    done: oneshot::Sender<Receiver>,
}

/// One reading thread's mailbox.
struct Thread {
    epoll: OwnedFd,
    /// An `eventfd`: eight bytes written wake the thread.
    wake: std::fs::File,
    /// Subscribers not yet picked up, and whether the thread has ended (it
    /// takes no more once it has: see [`Ending`]).
    inbox: Mutex<Inbox>,
}

#[derive(Default)]
struct Inbox {
    waiting: Vec<Adopted>,
    ended: bool,
}

impl Thread {
    fn inbox(&self) -> std::sync::MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Marks a reading thread ended however it ends (its `epoll` failed, or a
/// panic): subscribers still waiting for it are handed back at once with
/// the reason, and later ones go to no thread, so nobody waits on a thread
/// that is gone. Those it was reading are handed back by the loop, or
/// dropped by the unwinding (their oneshot then reports the thread gone).
struct Ending<'a>(&'a Thread);

impl Drop for Ending<'_> {
    fn drop(&mut self) {
        let waiting = {
            let mut inbox = self.0.inbox();
            inbox.ended = true;
            std::mem::take(&mut inbox.waiting)
        };
        for mut a in waiting {
            a.rx.closed = Some("the reading thread ended".into());
            let _ = a.done.send(a.rx);
        }
    }
}

/// Move a connected, subscribed socket to a reading thread; the returned
/// oneshot yields its [`Receiver`] once the run stops or the socket ends.
///
/// Frames tungstenite has already buffered would be lost, so this is for
/// subscribers whose chat is quiet until the run's publishers start (as in
/// every scenario that uses [`crate::engine::spawn_subscribers`]); a lost
/// frame would show as loss in the run's checks.
pub fn adopt(ws: Ws, rx: Receiver, run: Arc<Run>) -> anyhow::Result<oneshot::Receiver<Receiver>> {
    let stream = ws
        .into_inner()
        .into_std()
        .context("taking the subscriber's socket from tokio")?;
    stream
        .set_nonblocking(true)
        .context("making the subscriber's socket non-blocking")?;
    let (done, result) = oneshot::channel();
    let pool = pool()?;
    let t = &pool[NEXT.fetch_add(1, Ordering::Relaxed) % pool.len()];
    {
        let mut inbox = t.inbox();
        if inbox.ended {
            anyhow::bail!("the reading thread has ended");
        }
        inbox.waiting.push(Adopted {
            stream,
            rx,
            run,
            done,
        });
    }
    (&t.wake)
        .write_all(&1u64.to_ne_bytes())
        .context("waking a reading thread")?;
    Ok(result)
}

fn pool() -> anyhow::Result<&'static Vec<Arc<Thread>>> {
    static STARTING: Mutex<()> = Mutex::new(());
    if let Some(p) = POOL.get() {
        return Ok(p);
    }
    // Subscribers connect many at a time: one of them starts the threads.
    let _starting = STARTING.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = POOL.get() {
        return Ok(p);
    }
    let n = *THREADS.get_or_init(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
    });
    let mut threads = Vec::with_capacity(n);
    for i in 0..n {
        threads.push(start(i)?);
    }
    Ok(POOL.get_or_init(|| threads))
}

fn start(i: usize) -> anyhow::Result<Arc<Thread>> {
    // SAFETY: no pointers; non-negative results are fresh descriptors.
    let (ep, ev) = unsafe {
        (
            libc::epoll_create1(libc::EPOLL_CLOEXEC),
            libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC),
        )
    };
    if ep < 0 || ev < 0 {
        return Err(std::io::Error::last_os_error()).context("creating a reading thread's epoll");
    }
    // SAFETY: both are open and owned by nothing else.
    let (epoll, wake) = unsafe { (OwnedFd::from_raw_fd(ep), std::fs::File::from_raw_fd(ev)) };
    ctl(&epoll, libc::EPOLL_CTL_ADD, wake.as_raw_fd(), WAKE)
        .context("watching a reading thread's eventfd")?;
    let t = Arc::new(Thread {
        epoll,
        wake,
        inbox: Mutex::new(Inbox::default()),
    });
    let mine = t.clone();
    std::thread::Builder::new()
        .name(format!("receivers-{i}"))
        // Lives as long as the process: later phases, rounds and scenarios
        // read on the same threads.
        .spawn(move || run_thread(&mine))
        .context("starting a reading thread")?;
    Ok(t)
}

fn ctl(epoll: &OwnedFd, op: libc::c_int, fd: libc::c_int, token: u64) -> std::io::Result<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: token,
    };
    // SAFETY: `ev` is a valid epoll_event for the duration of the call.
    if unsafe { libc::epoll_ctl(epoll.as_raw_fd(), op, fd, &mut ev) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A subscriber being read.
struct Conn {
    a: Adopted,
    /// The start of a frame whose end has not arrived yet.
    partial: Vec<u8>,
    /// A fragmented message so far: (is text, payload).
    message: Option<(bool, Vec<u8>)>,
}

fn run_thread(t: &Thread) {
    let _ending = Ending(t);
    let mut conns: Vec<Option<Conn>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    let mut buf = vec![0u8; READ_CHUNK];
    let mut last_check = now_ns();
    loop {
        // SAFETY: `events` has room for the count passed.
        let n = unsafe {
            libc::epoll_wait(
                t.epoll.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as libc::c_int,
                (STOP_CHECK_NS / 1_000_000) as libc::c_int,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            // Nothing sensible is left to do: every subscriber of this
            // thread ends, and its run reports them closed.
            for c in conns.iter_mut().filter_map(Option::take) {
                finish(
                    t,
                    c,
                    Some(format!("the reading thread's epoll failed: {e}")),
                );
            }
            return;
        }
        for ev in &events[..n as usize] {
            let token = ev.u64;
            if token == WAKE {
                adopt_new(t, &mut conns, &mut free);
                continue;
            }
            let k = token as usize;
            let Some(c) = conns.get_mut(k).and_then(Option::as_mut) else {
                continue;
            };
            if let Err(reason) = read(c, &mut buf) {
                end(t, &mut conns, &mut free, k, Some(reason));
            }
        }
        let now = now_ns();
        if now - last_check >= STOP_CHECK_NS {
            last_check = now;
            for k in 0..conns.len() {
                // Its run stopped, or nobody waits for it any more (a
                // scenario that failed before stopping its run).
                if conns[k]
                    .as_ref()
                    .is_some_and(|c| c.a.run.stopped() || c.a.done.is_closed())
                {
                    end(t, &mut conns, &mut free, k, None);
                }
            }
        }
    }
}

fn adopt_new(t: &Thread, conns: &mut Vec<Option<Conn>>, free: &mut Vec<usize>) {
    // Reset the eventfd's count (level-triggered: else it stays ready).
    let _ = (&t.wake).read(&mut [0u8; 8]);
    let new = std::mem::take(&mut t.inbox().waiting);
    for a in new {
        let k = free.pop().unwrap_or_else(|| {
            conns.push(None);
            conns.len() - 1
        });
        let fd = a.stream.as_raw_fd();
        let c = Conn {
            a,
            partial: Vec::new(),
            message: None,
        };
        if let Err(e) = ctl(&t.epoll, libc::EPOLL_CTL_ADD, fd, k as u64) {
            free.push(k);
            finish(t, c, Some(format!("watching the socket: {e}")));
            continue;
        }
        conns[k] = Some(c);
    }
}

/// Stop reading the subscriber in slot `k` and free the slot.
fn end(
    t: &Thread,
    conns: &mut [Option<Conn>],
    free: &mut Vec<usize>,
    k: usize,
    closed: Option<String>,
) {
    if let Some(c) = conns[k].take() {
        free.push(k);
        finish(t, c, closed);
    }
}

/// Stop reading `c`: its samples go to the run, its receiver back.
fn finish(t: &Thread, mut c: Conn, closed: Option<String>) {
    let _ = ctl(&t.epoll, libc::EPOLL_CTL_DEL, c.a.stream.as_raw_fd(), 0);
    if closed.is_some() && c.a.rx.closed.is_none() {
        c.a.rx.closed = closed;
    }
    c.a.rx.flush(&c.a.run);
    let _ = c.a.done.send(c.a.rx);
}

/// One `recv`, and every complete frame in it; `Err` ends the subscriber.
fn read(c: &mut Conn, buf: &mut [u8]) -> Result<(), String> {
    let n = match (&c.a.stream).read(buf) {
        Ok(0) => return Err("connection ended".into()),
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Ok(()),
        Err(e) => return Err(e.to_string()),
    };
    let now = now_ns();
    if c.partial.is_empty() {
        let used = frames(c, &buf[..n], now)?;
        c.partial.extend_from_slice(&buf[used..n]);
    } else {
        let mut data = std::mem::take(&mut c.partial);
        data.extend_from_slice(&buf[..n]);
        let used = frames(c, &data, now)?;
        data.drain(..used);
        c.partial = data;
    }
    Ok(())
}

/// Handle the complete frames at the start of `data`; returns the bytes
/// they took.
fn frames(c: &mut Conn, data: &[u8], now: u64) -> Result<usize, String> {
    let mut pos = 0;
    loop {
        let mut cur = Cursor::new(&data[pos..]);
        let (header, len) = match FrameHeader::parse(&mut cur) {
            Ok(Some(h)) => h,
            Ok(None) => return Ok(pos),
            Err(e) => return Err(format!("bad frame from the server: {e}")),
        };
        let start = pos + cur.position() as usize;
        let end = usize::try_from(len)
            .ok()
            .filter(|_| len <= MAX_MESSAGE)
            .and_then(|l| start.checked_add(l))
            .ok_or_else(|| format!("a frame of {len} bytes (at most {MAX_MESSAGE})"))?;
        if end > data.len() {
            return Ok(pos);
        }
        pos = end;
        if header.mask.is_some() {
            return Err("masked frame from the server".into());
        }
        frame(c, &header, &data[start..end], now)?;
    }
}

fn frame(c: &mut Conn, header: &FrameHeader, payload: &[u8], now: u64) -> Result<(), String> {
    match header.opcode {
        OpCode::Data(Data::Text) | OpCode::Data(Data::Binary) if header.is_final => {
            if c.message.is_some() {
                return Err("a new message inside a fragmented one".into());
            }
            if header.opcode == OpCode::Data(Data::Text) {
                text(c, payload, now)?;
            }
        }
        OpCode::Data(Data::Text) | OpCode::Data(Data::Binary) => {
            if c.message.is_some() {
                return Err("a new message inside a fragmented one".into());
            }
            let is_text = header.opcode == OpCode::Data(Data::Text);
            c.message = Some((is_text, payload.to_vec()));
        }
        OpCode::Data(Data::Continue) => {
            let Some((_, so_far)) = c.message.as_mut() else {
                return Err("a continuation frame outside a message".into());
            };
            so_far.extend_from_slice(payload);
            if so_far.len() as u64 > MAX_MESSAGE {
                return Err(format!("a message over {MAX_MESSAGE} bytes"));
            }
            if header.is_final {
                if let Some((true, whole)) = c.message.take() {
                    text(c, &whole, now)?;
                }
            }
        }
        OpCode::Control(Control::Ping) => pong(c, payload)?,
        OpCode::Control(Control::Pong) => {}
        OpCode::Control(Control::Close) => {
            let code = payload
                .get(..2)
                .map(|b| u16::from_be_bytes([b[0], b[1]]).to_string())
                .unwrap_or_else(|| "no code".into());
            let reason = String::from_utf8_lossy(payload.get(2..).unwrap_or_default());
            return Err(format!("closed by the server: {code} {reason}"));
        }
        other => return Err(format!("frame with opcode {other}")),
    }
    Ok(())
}

fn text(c: &mut Conn, payload: &[u8], now: u64) -> Result<(), String> {
    let t = std::str::from_utf8(payload).map_err(|e| format!("text frame not UTF-8: {e}"))?;
    c.a.rx.on_text(&c.a.run, t, now);
    Ok(())
}

/// Answer a ping; a client's frames are masked (RFC 6455 §5.3).
fn pong(c: &mut Conn, payload: &[u8]) -> Result<(), String> {
    let mut f = Frame::pong(payload.to_vec());
    // Any key will do on loopback; the clock's low bits vary per pong.
    f.header_mut().mask = Some((now_ns() as u32).to_ne_bytes());
    let mut out = Vec::with_capacity(payload.len() + 8);
    f.format(&mut out)
        .map_err(|e| format!("formatting a pong: {e}"))?;
    match (&c.a.stream).write(&out) {
        Ok(n) if n == out.len() => Ok(()),
        // A subscriber sends nothing else, so its socket's buffer is empty
        // and a pong fits; if it ever did not, half a frame on the wire
        // would garble the stream: the subscriber ends instead.
        Ok(_) => Err("a pong did not fit the socket's send buffer".into()),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
            Err("a pong did not fit the socket's send buffer".into())
        }
        Err(e) => Err(format!("writing a pong: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;
    use crate::proto;

    /// A subscriber over a loopback pair (blocking, so each `read` waits for
    /// the bytes written before it), and the server's end.
    fn conn() -> (Conn, TcpStream, oneshot::Receiver<Receiver>) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let client = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (server, _) = l.accept().expect("accept");
        let (done, result) = oneshot::channel();
        let c = Conn {
            a: Adopted {
                stream: client,
                rx: Receiver::new(0, "ahp-chat:/c".into(), 0, 1, 0),
                run: Run::new(1, 8),
                done,
            },
            partial: Vec::new(),
            message: None,
        };
        (c, server, result)
    }

    fn action(seq: u64, n: u64) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","method":"action","params":{{"channel":"ahp-chat:/c","action":{},"serverSeq":{seq}}}}}"#,
            proto::draft_action(&proto::stamp(0, n, now_ns(), 0))
        )
    }

    fn frame(opcode: OpCode, fin: bool, payload: &[u8]) -> Vec<u8> {
        let header = FrameHeader {
            is_final: fin,
            opcode,
            ..FrameHeader::default()
        };
        let mut out = Vec::new();
        Frame::from_payload(header, payload.to_vec().into())
            .format(&mut out)
            .expect("format");
        out
    }

    const TEXT: OpCode = OpCode::Data(Data::Text);

    #[test]
    fn frames_split_anywhere_are_read_whole_and_in_order() {
        let (mut c, mut server, _) = conn();
        let mut bytes = frame(TEXT, true, action(1, 1).as_bytes());
        bytes.extend(frame(TEXT, true, action(2, 2).as_bytes()));
        let mut buf = vec![0u8; READ_CHUNK];
        // One byte at a time: every header and payload is split at every
        // point.
        for chunk in bytes.chunks(1) {
            server.write_all(chunk).expect("write");
            read(&mut c, &mut buf).expect("read");
        }
        assert_eq!(c.a.rx.delivered, 2);
        assert!(c.partial.is_empty(), "nothing left over");
        let i = c.a.rx.integrity(&c.a.run);
        assert_eq!((i.duplicated, i.reordered), (0, 0));
    }

    #[test]
    fn a_fragmented_message_with_a_ping_inside_is_read_and_the_ping_answered() {
        let (mut c, mut server, _) = conn();
        let text = action(1, 1);
        let (a, b) = text.as_bytes().split_at(text.len() / 2);
        let mut bytes = frame(TEXT, false, a);
        bytes.extend(frame(
            OpCode::Control(Control::Ping),
            true,
            b"are you there",
        ));
        bytes.extend(frame(OpCode::Data(Data::Continue), true, b));
        server.write_all(&bytes).expect("write");
        let mut buf = vec![0u8; READ_CHUNK];
        for _ in 0..bytes.len() {
            if c.a.rx.delivered > 0 {
                break;
            }
            read(&mut c, &mut buf).expect("read");
        }
        assert_eq!(c.a.rx.delivered, 1);
        // The pong: masked, as a client's frames must be, with the payload.
        let mut got = vec![0u8; 64];
        let n = server.read(&mut got).expect("pong");
        let mut cur = Cursor::new(&got[..n]);
        let (h, len) = FrameHeader::parse(&mut cur)
            .expect("header")
            .expect("whole");
        assert_eq!(h.opcode, OpCode::Control(Control::Pong));
        let mask = h.mask.expect("masked");
        let start = cur.position() as usize;
        let payload: Vec<u8> = got[start..start + len as usize]
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ mask[i % 4])
            .collect();
        assert_eq!(payload, b"are you there");
    }

    #[test]
    fn a_close_frame_ends_the_subscriber_with_its_reason() {
        let (mut c, mut server, _) = conn();
        let mut close = 4008u16.to_be_bytes().to_vec();
        close.extend(b"too slow");
        server
            .write_all(&frame(OpCode::Control(Control::Close), true, &close))
            .expect("write");
        let err = read(&mut c, &mut vec![0u8; READ_CHUNK]).expect_err("closed");
        assert!(err.contains("4008") && err.contains("too slow"), "{err}");
    }

    #[test]
    fn a_masked_or_interleaved_frame_is_a_protocol_error() {
        let (mut c, mut server, _) = conn();
        let mut masked = Frame::message(b"x".to_vec(), TEXT, true);
        masked.header_mut().mask = Some([1, 2, 3, 4]);
        let mut bytes = Vec::new();
        masked.format(&mut bytes).expect("format");
        server.write_all(&bytes).expect("write");
        let err = read(&mut c, &mut vec![0u8; READ_CHUNK]).expect_err("masked");
        assert!(err.contains("masked"), "{err}");

        let (mut c, mut server, _) = conn();
        let mut bytes = frame(TEXT, false, b"{");
        bytes.extend(frame(TEXT, true, b"{}"));
        server.write_all(&bytes).expect("write");
        let err = read(&mut c, &mut vec![0u8; READ_CHUNK]).expect_err("interleaved");
        assert!(err.contains("inside a fragmented one"), "{err}");

        // A header announcing more than any message may hold ends the
        // subscriber at once, rather than buffering forever.
        let (mut c, mut server, _) = conn();
        let mut huge = vec![0x81, 127];
        huge.extend((MAX_MESSAGE + 1).to_be_bytes());
        server.write_all(&huge).expect("write");
        let err = read(&mut c, &mut vec![0u8; READ_CHUNK]).expect_err("too big");
        assert!(err.contains("at most"), "{err}");
    }

    #[tokio::test]
    async fn an_adopted_subscriber_reads_until_the_run_stops_then_hands_back_its_receiver() {
        // A real WebSocket pair: a tungstenite server on a loopback socket.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr");
        // Frames sent before the socket is adopted could sit in
        // tungstenite's buffer (see `adopt`): the server sends once it is.
        let (adopted, go) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let (s, _) = l.accept().await.expect("accept");
            let mut ws = tokio_tungstenite::accept_async(s).await.expect("handshake");
            go.await.expect("adopted");
            use futures_util::SinkExt as _;
            for n in 1..=3 {
                ws.send(tokio_tungstenite::tungstenite::Message::text(action(n, n)))
                    .await
                    .expect("send");
            }
            ws
        });
        let ep = crate::conn::Endpoint::new(&format!("ws://{addr}/"), 1)
            .await
            .expect("endpoint");
        let ws = ep.connect().await.expect("connect");
        let run = Run::new(1, 8);
        let rx = Receiver::new(0, "ahp-chat:/c".into(), 0, 1, 0);
        let result = adopt(ws, rx, run.clone()).expect("adopt");
        adopted.send(()).expect("server waiting");
        let _server_ws = server.await.expect("server");
        // The three frames arrive, then the run stops and the receiver comes
        // back with them counted.
        let t0 = now_ns();
        while run.deliveries.load() < 3 && now_ns() - t0 < 5_000_000_000 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        run.stop();
        let rx = tokio::time::timeout(std::time::Duration::from_secs(5), result)
            .await
            .expect("handed back within the stop check")
            .expect("a receiver");
        assert_eq!(rx.delivered, 3);
        assert_eq!(rx.closed, None);
    }
}
