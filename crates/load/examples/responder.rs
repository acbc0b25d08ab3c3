//! A minimal single-threaded keep-alive HTTP/1.1 responder for checking the load
//! generator's own speed (it is not pollbox): every `GET /v1/boxes/{key}` gets a
//! pollbox-shaped payload for that key, everything else a 404.
//!
//! `cargo run --release -p pollbox-load --example responder -- 127.0.0.1:8099`, then
//! e.g. `taskset -c 1 pollbox load --url http://127.0.0.1:8099 --mix poll` against
//! `taskset -c 1 wrk -t1 -c16 http://127.0.0.1:8099/v1/boxes/lg-1`.

use std::collections::HashMap;
use std::io::{self, Read, Write};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

const LISTENER: Token = Token(usize::MAX);

struct Conn {
    stream: TcpStream,
    input: Vec<u8>,
    filled: usize,
    out: Vec<u8>,
}

fn main() -> io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8099".to_string());
    let mut listener = TcpListener::bind(addr.parse().map_err(io::Error::other)?)?;
    let mut poll = Poll::new()?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    eprintln!("responder on {}", listener.local_addr()?);
    let mut conns: HashMap<usize, Conn> = HashMap::new();
    let mut next = 0usize;
    let mut events = Events::with_capacity(1024);
    loop {
        poll.poll(&mut events, None)?;
        for event in events.iter() {
            if event.token() == LISTENER {
                while let Ok((mut stream, _)) = listener.accept() {
                    stream.set_nodelay(true)?;
                    poll.registry()
                        .register(&mut stream, Token(next), Interest::READABLE)?;
                    conns.insert(
                        next,
                        Conn {
                            stream,
                            input: vec![0; 16 * 1024],
                            filled: 0,
                            out: Vec::with_capacity(16 * 1024),
                        },
                    );
                    next += 1;
                }
                continue;
            }
            let id = event.token().0;
            let Some(conn) = conns.get_mut(&id) else {
                continue;
            };
            if !serve(conn) {
                if let Some(mut c) = conns.remove(&id) {
                    let _ = poll.registry().deregister(&mut c.stream);
                }
            }
        }
    }
}

/// Reads and answers what the connection has; false to close it.
fn serve(conn: &mut Conn) -> bool {
    loop {
        if conn.filled == conn.input.len() {
            conn.input.resize(conn.input.len() * 2, 0);
        }
        match conn.stream.read(&mut conn.input[conn.filled..]) {
            Ok(0) => return false,
            Ok(n) => {
                conn.filled += n;
                let mut start = 0;
                loop {
                    let mut headers = [httparse::EMPTY_HEADER; 16];
                    let mut req = httparse::Request::new(&mut headers);
                    let head = match req.parse(&conn.input[start..conn.filled]) {
                        Ok(httparse::Status::Complete(h)) => h,
                        Ok(httparse::Status::Partial) => break,
                        Err(_) => return false,
                    };
                    let body = req
                        .headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                        .and_then(|h| std::str::from_utf8(h.value).ok()?.parse::<usize>().ok())
                        .unwrap_or(0);
                    if conn.filled - start < head + body {
                        break;
                    }
                    let path = req.path.unwrap_or("");
                    match path.strip_prefix("/v1/boxes/") {
                        Some(key) if req.method == Some("GET") => {
                            let key = key.split('?').next().unwrap_or(key);
                            const TAIL: &[u8] = b"\",\"ver\":2,\"v\":5,\"sum\":12,\"n\":2,\"by\":\"p-7\"}";
                            let payload_len = 6 + key.len() + TAIL.len();
                            conn.out.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nETag: \"2\"\r\nContent-Length: ");
                            conn.out.extend_from_slice(itoa::Buffer::new().format(payload_len).as_bytes());
                            conn.out.extend_from_slice(b"\r\n\r\n{\"k\":\"");
                            conn.out.extend_from_slice(key.as_bytes());
                            conn.out.extend_from_slice(TAIL);
                        }
                        _ => conn.out.extend_from_slice(
                            b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
                        ),
                    }
                    start += head + body;
                }
                conn.input.copy_within(start..conn.filled, 0);
                conn.filled -= start;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    if !conn.out.is_empty() {
        // Answers are small; a full socket buffer here means a misbehaving client.
        if conn.stream.write_all(&conn.out).is_err() {
            return false;
        }
        conn.out.clear();
    }
    true
}
