//! Listening sockets: one per worker on the same address (`SO_REUSEPORT`), so
//! the kernel spreads new connections over the workers without a shared accept.

use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::SocketAddr;

/// Bind one non-blocking listener with `SO_REUSEPORT` on `addr`.
pub fn bind_reuseport(addr: SocketAddr) -> io::Result<mio::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    #[cfg(unix)]
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    Ok(mio::net::TcpListener::from_std(socket.into()))
}

/// Bind `n` listeners on `addr`. When `addr` has port 0, the first bind picks
/// the port and the others join it, so every worker serves the same address.
pub fn bind_all(
    addr: SocketAddr,
    n: usize,
) -> io::Result<(SocketAddr, Vec<mio::net::TcpListener>)> {
    let first = bind_reuseport(addr)?;
    let actual = first.local_addr()?;
    let mut all = vec![first];
    for _ in 1..n {
        all.push(bind_reuseport(actual)?);
    }
    Ok((actual, all))
}
