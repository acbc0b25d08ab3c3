//! The worker's dispatch of a turn's events, over real sockets.

use super::transmit::Ready;
use super::{conn_token, Worker, LISTENER, WAKER};
use crate::auth_files::AuthFiles;
use crate::preflight::Preflight;
use crate::shared::{Shared, Sources};
use pollbox_core::config::Config;
use pollbox_core::service::Node;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

/// One worker of an embedded node, not running: the test hands it events.
fn worker() -> (Worker, SocketAddr) {
    let config = Config::embedded();
    let auth_files = AuthFiles::new(&config);
    let p = Preflight::run(config, false).expect("preflight");
    let listener = mio::net::TcpListener::bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let poll = mio::Poll::new().expect("poll");
    let wakers = vec![Arc::new(
        mio::Waker::new(poll.registry(), WAKER).expect("waker"),
    )];
    let wakeups = Arc::new(crate::wakeups::Wakeups::new(wakers.clone()));
    let node = Node::new(p.config, p.plan, p.boxes);
    let sources = Sources {
        log: None,
        producer: None,
        wal: None,
    };
    let shared = Arc::new(Shared::new(
        node, &wakers, wakeups, p.started, sources, auth_files,
    ));
    let w = Worker::new(0, shared, listener, None, poll).expect("worker");
    (w, addr)
}

/// Accept what connected; returns the generation of the connection in `slot`.
fn accept(w: &mut Worker, slot: usize) -> u32 {
    w.on_event(Ready {
        token: LISTENER.0,
        readable: true,
        hup: false,
    });
    w.sockets.conns.get_mut(slot).expect("accepted").gen
}

/// A connection closed while its hang-up was still among the turn's events
/// (closed by a failed send to it, say), and a new connection took its slot in
/// the same turn: the old event finds no connection, and the new one, an event
/// stream, streams on.
#[test]
fn a_closed_connections_event_never_reaches_the_next_in_its_slot() {
    let (mut w, addr) = worker();
    let a = TcpStream::connect(addr).expect("connect a");
    let gen_a = accept(&mut w, 0);
    drop(a);
    let c = w.sockets.conns.take(0).expect("a");
    w.close(0, c);
    let mut b = TcpStream::connect(addr).expect("connect b");
    let gen_b = accept(&mut w, 0);
    assert_ne!(gen_a, gen_b, "the slot is reused by a new generation");
    b.write_all(
        b"GET /v1/boxes/room-0/~presence HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n",
    )
    .expect("write");
    w.on_event(Ready {
        token: conn_token(0, gen_b).0,
        readable: true,
        hup: false,
    });
    // a's hang-up, read before a closed.
    w.on_event(Ready {
        token: conn_token(0, gen_a).0,
        readable: true,
        hup: true,
    });
    assert!(
        w.sockets.conns.get_mut(0).is_some_and(|c| c.gen == gen_b),
        "b was closed by a's event"
    );
    // b has its stream's head and first event, and no end of stream.
    b.set_nonblocking(true).expect("nonblocking");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match b.read(&mut buf) {
            Ok(0) => panic!("b's stream ended: {}", String::from_utf8_lossy(&got)),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => panic!("b: {e}"),
        }
    }
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.starts_with("HTTP/1.1 200") && text.contains("\"count\":0"),
        "{text}"
    );
}
