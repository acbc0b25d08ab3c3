//! The steady-state poll path allocates nothing: a counting global allocator
//! around 10,000 polls over a real socket, after warm-up. The client loop here
//! is allocation-free too (fixed buffers, httparse), so every allocation the
//! counter sees during the measured window is the server's.

mod common;
use common::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Send a poll and read exactly one response into `buf` without allocating.
fn poll_once(s: &mut std::net::TcpStream, req: &[u8], buf: &mut [u8]) -> u16 {
    s.write_all(req).unwrap();
    let mut have = 0;
    loop {
        let n = s.read(&mut buf[have..]).unwrap();
        assert!(n > 0, "server closed");
        have += n;
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut r = httparse::Response::new(&mut headers);
        if let Ok(httparse::Status::Complete(head)) = r.parse(&buf[..have]) {
            let len = r
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .and_then(|h| std::str::from_utf8(h.value).ok()?.parse::<usize>().ok())
                .unwrap();
            // A 304 carries the 200's Content-Length but no body.
            let len = if r.code == Some(304) { 0 } else { len };
            if have >= head + len {
                assert_eq!(have, head + len, "exactly one response");
                return r.code.unwrap();
            }
        }
    }
}

#[test]
fn ten_thousand_polls_allocate_nothing() {
    let mut c = config();
    c.server.workers = 1;
    let s = start(c);
    let a = s.addr();
    assert_eq!(
        post(a, "/v1/boxes/hot", r#"{"value":5,"player":"p-7"}"#).status,
        200
    );
    let mut stream = connect(a);
    let req = b"GET /v1/boxes/hot HTTP/1.1\r\nHost: t\r\n\r\n";
    let cond = b"GET /v1/boxes/hot HTTP/1.1\r\nHost: t\r\nIf-None-Match: \"1\"\r\n\r\n";
    let mut buf = vec![0u8; 4096];
    // Warm-up: pools, buffers, the Date cache, a few ticks.
    for _ in 0..2000 {
        assert_eq!(poll_once(&mut stream, req, &mut buf), 200);
        assert_eq!(poll_once(&mut stream, cond, &mut buf), 304);
    }
    let before = ALLOCS.load(Ordering::SeqCst);
    for i in 0..10_000 {
        let r = if i % 2 == 0 { &req[..] } else { &cond[..] };
        let code = poll_once(&mut stream, r, &mut buf);
        assert!(code == 200 || code == 304);
    }
    let after = ALLOCS.load(Ordering::SeqCst);
    assert_eq!(
        after - before,
        0,
        "allocations during 10,000 steady-state polls"
    );
    drop(stream);
    s.shutdown().unwrap();
}
