//! A room's direct writes batched in one system call, on real sockets.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;

use super::wire::{decode, env, park};
use super::*;

/// The server side of a loopback TCP connection, as a [`Wire`].
struct TcpWire {
    tcp: TcpStream,
    /// Bytes the batched path reported written ([`Wire::sent`]).
    batched: AtomicUsize,
}

impl Wire for TcpWire {
    fn try_write(&self, buf: &[u8]) -> std::io::Result<usize> {
        use std::io::Write;
        (&self.tcp).write(buf)
    }

    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.tcp.as_raw_fd())
    }

    fn sent(&self, n: usize) {
        self.batched.fetch_add(n, Ordering::SeqCst);
    }
}

/// `n` connections on loopback: the queues, their wires and the clients'
/// ends.
fn room(n: usize) -> (Vec<Arc<Outbound>>, Vec<Arc<TcpWire>>, Vec<TcpStream>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (mut outs, mut wires, mut clients) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        let client = TcpStream::connect(addr).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        let wire = Arc::new(TcpWire {
            tcp: server,
            batched: AtomicUsize::new(0),
        });
        let out = Arc::new(Outbound::new(16 << 20));
        out.attach(wire.clone(), Duration::ZERO);
        outs.push(out);
        wires.push(wire);
        clients.push(client);
    }
    (outs, wires, clients)
}

/// How long a read or a wait for room may take before the test fails.
const WAIT: Duration = Duration::from_secs(20);

/// Read from `client` until `want` whole frames arrived (or [`WAIT`]
/// passed without a byte).
fn read_frames(client: &mut TcpStream, want: usize) -> Vec<String> {
    client.set_read_timeout(Some(WAIT)).unwrap();
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    while decode(&bytes).len() < want {
        match client.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => bytes.extend_from_slice(&chunk[..n]),
        }
    }
    decode(&bytes)
}

/// Wait until `tcp` has room for more (`poll` for `POLLOUT`); fail after
/// [`WAIT`].
fn wait_writable(tcp: &TcpStream) {
    let mut fd = libc::pollfd {
        fd: tcp.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one pollfd, alive across the call; the descriptor is open for
    // as long as `tcp` is.
    let n = unsafe { libc::poll(&mut fd, 1, WAIT.as_millis() as libc::c_int) };
    assert!(n == 1, "the socket never had room again ({n})");
}

/// Whether this thread's flushes go through io_uring (the kernel may
/// forbid it: then the room is written one connection at a time, and the
/// batching itself is not what a test can see).
fn batching(wires: &[Arc<TcpWire>]) -> bool {
    let batched = wires.iter().any(|w| w.batched.load(Ordering::SeqCst) > 0);
    if !batched {
        eprintln!("io_uring refused here: the room was written one connection at a time");
    }
    batched
}

#[test]
fn a_room_written_in_batches_gets_every_frame_in_order_on_every_connection() {
    // More connections than one batch holds, so two submissions.
    let n = super::super::batch::BATCH + 30;
    let (outs, wires, mut clients) = room(n);
    let now = Instant::now();
    for seq in 1..=3 {
        for (i, out) in outs.iter().enumerate() {
            out.push_deferred(env(seq, &format!("{i}:{seq}")), now);
        }
    }
    Outbound::flush_all(&outs, true);
    for (i, client) in clients.iter_mut().enumerate() {
        let want: Vec<String> = (1..=3).map(|s| format!("{i}:{s}")).collect();
        assert_eq!(read_frames(client, 3), want, "connection {i}");
    }
    for (i, (out, wire)) in outs.iter().zip(&wires).enumerate() {
        assert_eq!(out.queued_bytes(), 0);
        // Three text frames, each a two-byte header and its text.
        let whole: usize = (1..=3).map(|s| 2 + format!("{i}:{s}").len()).sum();
        let batched = wire.batched.load(Ordering::SeqCst);
        assert!(
            batched == 0 || batched == whole,
            "{batched} of {whole} bytes"
        );
    }
    if batching(&wires) {
        assert!(
            wires.iter().all(|w| w.batched.load(Ordering::SeqCst) > 0),
            "every connection of the room went in a batch"
        );
    }
}

#[test]
fn what_a_full_socket_did_not_take_in_a_batch_goes_first_from_the_socket_side() {
    let (outs, wires, mut clients) = room(2);
    // The first client reads nothing for now, and small buffers on both
    // ends make its socket fill.
    socket2::SockRef::from(&wires[0].tcp)
        .set_send_buffer_size(16 * 1024)
        .unwrap();
    socket2::SockRef::from(&clients[0])
        .set_recv_buffer_size(16 * 1024)
        .unwrap();
    let socket_side = park(&outs[0], false);
    // Far more than both small buffers hold, under the decoder's 1 MiB.
    let big = "x".repeat(512 * 1024);
    let now = Instant::now();
    outs[0].push_deferred(env(1, &big), now);
    outs[1].push_deferred(env(1, "small"), now);
    Outbound::flush_all(&outs, true);
    assert_eq!(read_frames(&mut clients[1], 1), ["small"]);
    assert_eq!(
        socket_side.0.load(Ordering::SeqCst),
        1,
        "the socket side is woken for what is left"
    );
    let Some(taken) = take(&outs[0]) else {
        panic!("the rest waits for the socket side");
    };
    assert!(taken.frames.is_empty());
    let head = taken.head;
    assert!(!head.is_empty() && head.len() < big.len());
    // What went out plus what is left is the frame, once.
    let reader = std::thread::spawn(move || {
        let mut c = clients.swap_remove(0);
        read_frames(&mut c, 1)
    });
    let mut rest = &head[..];
    while !rest.is_empty() {
        match wires[0].try_write(rest) {
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => wait_writable(&wires[0].tcp),
            Err(e) => panic!("{e}"),
        }
    }
    let got = reader.join().unwrap();
    assert!(
        got.len() == 1 && got[0] == big,
        "the big frame arrived whole, once"
    );
    if batching(&wires) {
        let batched = wires[0].batched.load(Ordering::SeqCst);
        assert!(
            batched > 0,
            "the full socket took part of its frame in the batch"
        );
    }
}

#[test]
fn a_connection_busy_elsewhere_is_written_after_the_batch_not_waited_for() {
    let (outs, _wires, mut clients) = room(4);
    let now = Instant::now();
    for (i, out) in outs.iter().enumerate() {
        out.push_deferred(env(1, &format!("to {i}")), now);
    }
    // Another thread holds connection 2 until the others were read.
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let busy = outs[2].clone();
    let holder = std::thread::spawn(move || {
        let st = busy.state.lock();
        locked_tx.send(()).unwrap();
        let _ = release_rx.recv();
        drop(st);
    });
    locked_rx.recv().unwrap();
    let room_outs = outs.clone();
    let flusher = std::thread::spawn(move || Outbound::flush_all(&room_outs, true));
    // The others are written while connection 2 is still held: a batch
    // that waited for it would leave them unwritten, and their reads would
    // run out of time.
    for i in [0, 1, 3] {
        assert_eq!(read_frames(&mut clients[i], 1), [format!("to {i}")]);
    }
    release_tx.send(()).unwrap();
    // And the busy one once it is free, by the same flush.
    flusher.join().unwrap();
    holder.join().unwrap();
    assert_eq!(read_frames(&mut clients[2], 1), ["to 2"]);
}

#[test]
fn connections_without_a_descriptor_are_written_directly_within_a_batch() {
    let (mut outs, wires, mut clients) = room(3);
    let fake = FakeWire::with_room(1 << 20);
    let plain = Arc::new(Outbound::new(1 << 20));
    plain.attach(fake.clone(), Duration::ZERO);
    outs.insert(1, plain);
    let now = Instant::now();
    for (i, out) in outs.iter().enumerate() {
        out.push_deferred(env(1, &format!("to {i}")), now);
    }
    Outbound::flush_all(&outs, true);
    assert_eq!(fake.texts(), ["to 1"]);
    for (client, i) in clients.iter_mut().zip([0, 2, 3]) {
        assert_eq!(read_frames(client, 1), [format!("to {i}")]);
    }
    batching(&wires);
}
