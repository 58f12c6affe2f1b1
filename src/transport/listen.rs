//! The listening socket and the options of each accepted one.

/// Pending connections the kernel queues before `accept`: a reconnect storm
/// of thousands of clients must not overflow it (the default is 128).
pub const LISTEN_BACKLOG: i32 = 4096;

/// Bind a listening socket on `addr` with a deep accept backlog.
pub fn bind(addr: std::net::SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    Ok(socket.into())
}

/// Per-connection socket options: no Nagle delay (envelopes are small and
/// the server does its own write pacing), and let the kernel drop a peer
/// that acknowledges nothing we send — not even zero-window probes — for
/// `idle_timeout`, so a client that stopped reading cannot pin a socket.
pub fn tune_socket(tcp: &actix_web::rt::net::TcpStream, idle_timeout: std::time::Duration) {
    let _ = tcp.set_nodelay(true);
    #[cfg(target_os = "linux")]
    {
        let _ = socket2::SockRef::from(tcp).set_tcp_user_timeout(Some(idle_timeout));
    }
    #[cfg(not(target_os = "linux"))]
    let _ = idle_timeout;
}
