//! The buffered bytes of all connections stay within
//! `limits.max_buffered_bytes`, whatever clients send, and other clients are
//! served meanwhile (docs/http.md#limits). In-process, with jemalloc as the
//! global allocator (as in the shipped binary), so the process's RSS is the
//! server's.

mod common;
use common::*;
use std::io::{ErrorKind, Write};
use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn metric(a: std::net::SocketAddr, name: &str) -> f64 {
    get(a, "/metrics")
        .text()
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("{name} missing"))
}

const BUDGET: usize = 64 << 20;
/// What the process may hold beyond the budget: the pools, the arenas, the box
/// table, the test's own client side, jemalloc's dirty pages (measured: see
/// docs/reliability.md).
const OVERHEAD: usize = 64 << 20;

#[test]
fn two_thousand_trickled_megabyte_bodies_stay_within_max_buffered_bytes() {
    let mut c = config();
    c.server.workers = 2;
    c.limits.max_buffered_bytes = BUDGET;
    let s = start(c);
    let a = s.addr();
    // A well-behaved client, connected before the flood.
    let mut steady = Reader::new(connect(a));
    steady.send(
        b"POST /v1/boxes/steady HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\n\r\n{\"value\":1}",
    );
    assert_eq!(steady.read(false).status, 200);
    let before = rss();

    let mut conns: Vec<(std::net::TcpStream, usize)> = (0..2000)
        .map(|i| {
            let mut c = connect(a);
            c.write_all(
                format!(
                    "POST /v1/boxes/t{i} HTTP/1.1\r\nHost: t\r\nContent-Length: 1048576\r\n\r\n"
                )
                .as_bytes(),
            )
            .unwrap();
            c.set_nonblocking(true).unwrap();
            (c, 0)
        })
        .collect();
    let chunk = vec![b' '; 64 << 10];
    let mut pushed = 0usize;
    let mut polls = 0;
    let start = Instant::now();
    let mut peak = 0;
    while start.elapsed() < Duration::from_secs(4) {
        for (c, sent) in conns.iter_mut() {
            // Never the whole body: the server can only buffer it.
            let room = (1 << 20) - 1 - *sent;
            if room == 0 {
                continue;
            }
            match c.write(&chunk[..room.min(chunk.len())]) {
                Ok(n) => {
                    *sent += n;
                    pushed += n;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("attack connection failed: {e}"),
            }
        }
        // Others are served throughout.
        steady.send(b"GET /v1/boxes/steady HTTP/1.1\r\nHost: t\r\n\r\n");
        assert_eq!(steady.read(false).status, 200);
        polls += 1;
        peak = peak.max(rss());
    }
    let buffered = metric(a, "pollbox_buffered_bytes");
    eprintln!(
        "pushed {} MiB on 2000 connections; RSS {} -> peak {} MiB (budget {} MiB); \
         pollbox_buffered_bytes {:.1} MiB; {polls} polls answered",
        pushed >> 20,
        before >> 20,
        peak >> 20,
        BUDGET >> 20,
        buffered / 1048576.0
    );
    assert!(
        pushed > 2 * BUDGET,
        "the attack pushed too little to test anything"
    );
    assert!(
        peak < before + BUDGET + OVERHEAD,
        "RSS grew from {before} to {peak}, over the budget + overhead"
    );
    assert!(buffered <= BUDGET as f64, "buffered {buffered}");
    // A new connection while the buffers are full: 503, not a reset or a hang.
    let (r, _) = raw(a, b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
    assert!(r.status == 503 || r.status == 200, "{}", r.status);
    drop(conns);
    steady.send(b"GET /v1/boxes/steady HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(steady.read(false).status, 200);
    s.shutdown().unwrap();
}
