//! Listening sockets: one per worker on the same address (`SO_REUSEPORT`), so
//! the kernel spreads new connections over the workers without a shared accept;
//! and the check that no other process listens there first.

use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::SocketAddr;

/// Bind one non-blocking listener with `SO_REUSEPORT` on `addr`.
pub(crate) fn bind_reuseport(addr: SocketAddr) -> io::Result<mio::net::TcpListener> {
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
/// Fails with [`io::ErrorKind::AddrInUse`] when another process listens on
/// `addr` (see [`claim`]); the [`Claim`] is to be held while the listeners are.
pub(crate) fn bind_all(
    addr: SocketAddr,
    n: usize,
) -> io::Result<(SocketAddr, Vec<mio::net::TcpListener>, Claim)> {
    // Port 0: the kernel picks a port no socket is bound to, so nobody else
    // listens there.
    let claim = if addr.port() == 0 {
        Claim::default()
    } else {
        claim(addr)?
    };
    let first = bind_reuseport(addr)?;
    let actual = first.local_addr()?;
    let mut all = vec![first];
    for _ in 1..n {
        all.push(bind_reuseport(actual)?);
    }
    Ok((actual, all, claim))
}

/// Keeps `addr` this server's against another pollbox starting at the same
/// moment (see [`claim`]); dropped when the server is.
#[derive(Debug, Default)]
pub(crate) struct Claim {
    #[cfg(target_os = "linux")]
    _name: Option<std::os::unix::net::UnixListener>,
}

/// Refuse `addr` when another process listens on it, before our listeners are
/// bound. `SO_REUSEPORT` would not: it lets any socket of the same user that
/// sets it too join the port, so a second pollbox would start, sharing the
/// port with the first (two box tables, each connection landing in either).
///
/// Two checks. A plain socket, with `SO_REUSEADDR` and without `SO_REUSEPORT`,
/// as any server's, is bound to `addr`: the kernel refuses it ("address in
/// use") while a socket listens on an address that overlaps (the same, or a
/// wildcard that covers it), whoever holds it. Connections of an earlier run
/// (`TIME_WAIT`) do not count, and a socket that only binds, without
/// listening, keeps neither our listeners nor another process's out; it is
/// closed at once. That leaves two pollboxes started at the same moment: both
/// could pass it before either listens. So first, an abstract Unix socket
/// named after `addr` is bound (Linux), and held while the server runs: the
/// name is free only once the server holding it has gone, crash included,
/// and it lives in the network namespace, as the port does. (Two started at
/// the same moment on different addresses that overlap, `0.0.0.0:P` and
/// `127.0.0.1:P`, are not told apart.)
fn claim(addr: SocketAddr) -> io::Result<Claim> {
    let claim = Claim {
        #[cfg(target_os = "linux")]
        _name: claim_name(addr)?,
    };
    let plain = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    plain.set_reuse_address(true)?;
    plain.bind(&addr.into())?;
    Ok(claim)
}

/// The abstract Unix socket `pollbox <addr>`, or `None` where Unix sockets are
/// not allowed (a sandbox): the plain bind still refuses a server that listens.
#[cfg(target_os = "linux")]
fn claim_name(addr: SocketAddr) -> io::Result<Option<std::os::unix::net::UnixListener>> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener};
    let name = UnixAddr::from_abstract_name(format!("pollbox {addr}"))?;
    match UnixListener::bind_addr(&name) {
        Ok(l) => Ok(Some(l)),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => Err(e),
        Err(_) => Ok(None),
    }
}

/// The first address `a` (`ip:port` or `name:port`) resolves to, IPv4 first
/// (a name like `localhost` may resolve to ::1 where IPv6 is off).
pub(crate) fn resolve(a: &str) -> io::Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    a.to_socket_addrs()?
        .min_by_key(SocketAddr::is_ipv6)
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the name resolves to no address"))
}

/// The listener of `server.metrics_listen` (none when it is empty). Worker 0
/// serves it, with the same connection state machine as every other listener
/// (it routes only `/metrics` there).
pub(crate) fn bind_metrics(addr: &str) -> io::Result<Option<mio::net::TcpListener>> {
    if addr.is_empty() {
        return Ok(None);
    }
    let l = resolve(addr)
        .and_then(std::net::TcpListener::bind)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))?;
    Ok(Some(mio::net::TcpListener::from_std(l)))
}
