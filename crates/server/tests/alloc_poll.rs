//! The steady-state poll path allocates nothing: a counting global allocator
//! around 10,000 polls over a real socket, after warm-up. The client loop here
//! is allocation-free too (fixed buffers, httparse), so every allocation the
//! counter sees during the measured window is the server's.

mod common;
use common::*;
use std::io::{Read, Write};

#[global_allocator]
static ALLOC: pollbox_test_alloc::Counting = pollbox_test_alloc::Counting::new();

/// The counter is process-wide: the tests here run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Send a poll and read exactly one response into `buf` without allocating.
fn poll_once(s: &mut std::net::TcpStream, req: &[u8], buf: &mut [u8]) -> u16 {
    s.write_all(req).unwrap();
    let mut have = 0;
    loop {
        let n = match s.read(&mut buf[have..]) {
            // A blocking read may be interrupted (io_uring's task work on this
            // process's threads can do that); a client reads again.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => r.unwrap(),
        };
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

/// Warm up, then count the allocations of 10,000 polls (plain and
/// conditional, alternating) on one keep-alive connection.
/// `cond` is `req` less its blank line: the conditional poll adds the
/// box's ETag to it.
fn steady_state_allocations(c: pollbox_core::config::Config, req: &[u8], cond: &str) -> u64 {
    let s = start(c);
    let a = s.addr();
    let posted = post(a, "/v1/boxes/hot", r#"{"value":5,"player":"p-7"}"#);
    assert_eq!(posted.status, 200);
    let cond = format!("{cond}If-None-Match: \"{}\"\r\n\r\n", posted.version());
    let cond = cond.as_bytes();
    let mut stream = connect(a);
    let mut buf = vec![0u8; 4096];
    // Warm-up: pools, buffers, the Date cache, a few ticks.
    for _ in 0..2000 {
        assert_eq!(poll_once(&mut stream, req, &mut buf), 200);
        assert_eq!(poll_once(&mut stream, cond, &mut buf), 304);
    }
    let before = ALLOC.total();
    for i in 0..10_000 {
        let r = if i % 2 == 0 { req } else { cond };
        let code = poll_once(&mut stream, r, &mut buf);
        assert!(code == 200 || code == 304);
    }
    let after = ALLOC.total();
    drop(stream);
    s.shutdown().unwrap();
    after - before
}

#[test]
fn ten_thousand_polls_allocate_nothing() {
    let _serial = serial();
    let mut c = config();
    c.server.workers = 1;
    let req = b"GET /v1/boxes/hot HTTP/1.1\r\nHost: t\r\n\r\n";
    let cond = "GET /v1/boxes/hot HTTP/1.1\r\nHost: t\r\n";
    assert_eq!(
        steady_state_allocations(c, req, cond),
        0,
        "allocations during 10,000 steady-state polls"
    );
}

/// The same with CORS on and the polls coming from an allowed origin: every
/// answer carries the CORS headers (checked first),
/// and still nothing is allocated. Box expiry is on too: the per-tick sweep
/// allocates nothing either.
#[test]
fn ten_thousand_polls_from_an_allowed_origin_allocate_nothing() {
    let _serial = serial();
    let mut c = config();
    c.server.workers = 1;
    c.http.cors_origins = vec![
        "https://game.example".into(),
        "http://localhost:5173".into(),
    ];
    c.boxes.ttl_s = 3600;
    let req = b"GET /v1/boxes/hot HTTP/1.1\r\nHost: t\r\nOrigin: http://localhost:5173\r\n\r\n";
    let cond = "GET /v1/boxes/hot HTTP/1.1\r\nHost: t\r\nOrigin: http://localhost:5173\r\n";
    // The answers really carry the headers.
    let s = start(c.clone());
    assert_eq!(post(s.addr(), "/v1/boxes/hot", "{}").status, 200);
    let (r, _) = raw(s.addr(), req);
    assert_eq!(
        r.header("Access-Control-Allow-Origin"),
        Some("http://localhost:5173")
    );
    s.shutdown().unwrap();
    assert_eq!(
        steady_state_allocations(c, req, cond),
        0,
        "allocations during 10,000 steady-state polls with CORS"
    );
}

/// With `auth.read = "token"` and a signed token (ES256, the slowest to
/// verify) in every poll: the token is verified on the connection's first
/// request and kept, so the polls after it allocate nothing either.
#[test]
fn ten_thousand_polls_with_a_cached_token_allocate_nothing() {
    let _serial = serial();
    let dir = std::env::temp_dir().join(format!("pollbox-alloc-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let jwks = dir.join("jwks.json");
    std::fs::write(
        &jwks,
        include_str!("../../core/src/auth/testdata/jwks.json"),
    )
    .unwrap();
    let tokens: std::collections::HashMap<String, String> =
        serde_json::from_str(include_str!("../../core/src/auth/testdata/tokens.json")).unwrap();
    let token = &tokens["es_far"];
    let mut c = config();
    c.server.workers = 1;
    c.auth.read = pollbox_core::config::ReadAccess::Token;
    c.auth.jwt.keys_file = jwks.display().to_string();
    let s = start(c);
    let a = s.addr();
    let body = r#"{"value":5,"player":"p-7"}"#;
    let post = format!(
        "POST /v1/boxes/hot HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let (r, _) = raw(a, post.as_bytes());
    assert_eq!(r.status, 200);
    let req =
        format!("GET /v1/boxes/hot HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\n\r\n");
    let (r, _) = raw(a, b"GET /v1/boxes/hot HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(r.status, 401, "the token is needed");
    let mut stream = connect(a);
    let mut buf = vec![0u8; 4096];
    for _ in 0..2000 {
        assert_eq!(poll_once(&mut stream, req.as_bytes(), &mut buf), 200);
    }
    let before = ALLOC.total();
    for _ in 0..10_000 {
        assert_eq!(poll_once(&mut stream, req.as_bytes(), &mut buf), 200);
    }
    let after = ALLOC.total();
    drop(stream);
    s.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        after - before,
        0,
        "allocations during 10,000 polls with a cached token"
    );
}

/// A poll of many pre-rendered boxes (docs/http.md#many-boxes-at-once), plain
/// and conditional (304) in turn, allocates nothing either: the keys are
/// decoded into the worker's buffers, the payloads copied into its body.
#[test]
fn ten_thousand_polls_of_twenty_boxes_allocate_nothing() {
    let _serial = serial();
    let mut c = config();
    c.server.workers = 1;
    let s = start(c);
    let a = s.addr();
    let keys: Vec<String> = (0..20).map(|i| format!("box-{i}")).collect();
    for k in &keys {
        let r = post(
            a,
            &format!("/v1/boxes/{k}"),
            r#"{"value":5,"player":"p-7"}"#,
        );
        assert_eq!(r.status, 200);
    }
    let req = format!(
        "GET /v1/boxes?keys={},missing HTTP/1.1\r\nHost: t\r\n\r\n",
        keys.join(",")
    );
    let r = raw(a, req.as_bytes()).0;
    assert_eq!(r.status, 200);
    assert!(r.text().ends_with(",null]"), "{}", r.text());
    let etag = r.header("ETag").expect("an ETag").to_string();
    let cond = format!(
        "{}If-None-Match: {etag}\r\n\r\n",
        req.strip_suffix("\r\n").unwrap()
    );
    let (req, cond) = (req.as_bytes(), cond.as_bytes());
    let mut stream = connect(a);
    let mut buf = vec![0u8; 16 * 1024];
    for _ in 0..2000 {
        assert_eq!(poll_once(&mut stream, req, &mut buf), 200);
        assert_eq!(poll_once(&mut stream, cond, &mut buf), 304);
    }
    let before = ALLOC.total();
    for i in 0..10_000 {
        let (r, want) = if i % 2 == 0 { (req, 200) } else { (cond, 304) };
        assert_eq!(poll_once(&mut stream, r, &mut buf), want);
    }
    let after = ALLOC.total();
    drop(stream);
    s.shutdown().unwrap();
    assert_eq!(
        after - before,
        0,
        "allocations during 10,000 steady-state polls of 20 boxes"
    );
}

/// Positive control: the counter sees the server's allocations (a cold
/// server allocates while it starts and serves its first requests), so zero
/// above means zero.
#[test]
fn the_counter_sees_the_servers_allocations() {
    let _serial = serial();
    let before = ALLOC.total();
    let mut c = config();
    c.server.workers = 1;
    let s = start(c);
    assert_eq!(post(s.addr(), "/v1/boxes/cold", "{}").status, 200);
    assert!(ALLOC.total() > before);
    s.shutdown().unwrap();
}

/// Read a subscriber's stream until an event with `"ver":<ver>,` has come,
/// without allocating (fixed buffer, searched in place).
fn await_version(s: &mut std::net::TcpStream, buf: &mut [u8], ver: u64) {
    let mut pat = [0u8; 32];
    let mut digits = itoa::Buffer::new();
    let d = digits.format(ver).as_bytes();
    pat[..6].copy_from_slice(b"\"ver\":");
    pat[6..6 + d.len()].copy_from_slice(d);
    pat[6 + d.len()] = b',';
    let pat = &pat[..7 + d.len()];
    let mut have = 0;
    loop {
        if have == buf.len() {
            // Older events (or heartbeats) filled it: keep the tail only.
            buf.copy_within(have - 64.., 0);
            have = 64;
        }
        let n = match s.read(&mut buf[have..]) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => r.unwrap(),
        };
        assert!(n > 0, "stream closed");
        have += n;
        if buf[..have].windows(pat.len()).any(|w| w == pat) {
            return;
        }
    }
}

/// Warm up, then count the allocations of 2,000 ingests of one box, each
/// awaited by `subs` event-stream subscribers.
fn ingest_allocations(subs: usize) -> u64 {
    let mut c = config();
    c.server.workers = 1;
    let s = start(c);
    let a = s.addr();
    let body = r#"{"value":5,"player":"p-7"}"#;
    let ingest = format!(
        "POST /v1/boxes/hot HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let posted = post(a, "/v1/boxes/hot", body);
    assert_eq!(posted.status, 200);
    let mut ver = posted.version();
    let mut streams: Vec<std::net::TcpStream> = (0..subs)
        .map(|_| {
            let mut st = connect(a);
            st.write_all(
                b"GET /v1/boxes/hot HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n",
            )
            .unwrap();
            st
        })
        .collect();
    let mut bufs: Vec<Vec<u8>> = (0..subs).map(|_| vec![0u8; 16 * 1024]).collect();
    for (st, b) in streams.iter_mut().zip(bufs.iter_mut()) {
        await_version(st, b, ver);
    }
    let mut w = connect(a);
    let mut buf = vec![0u8; 4096];
    let mut round = |n: usize, ver: &mut u64| {
        for _ in 0..n {
            assert_eq!(poll_once(&mut w, ingest.as_bytes(), &mut buf), 200);
            *ver += 1;
            for (st, b) in streams.iter_mut().zip(bufs.iter_mut()) {
                await_version(st, b, *ver);
            }
        }
    };
    // Warm-up: pools, buffers, the arena, a few ticks.
    round(1000, &mut ver);
    let before = ALLOC.total();
    round(2000, &mut ver);
    let after = ALLOC.total();
    drop(streams);
    s.shutdown().unwrap();
    after - before
}

/// An event costs its subscribers no allocation: the payload is copied from
/// the box table into each stream's queue with its `id:`/`data:` framing, and
/// the wake-up travels as a hash. (Compared with the same ingests and no
/// subscriber, so only what the events add is counted.)
#[test]
fn events_to_subscribers_allocate_nothing() {
    let _serial = serial();
    let alone = ingest_allocations(0);
    let with_subs = ingest_allocations(4);
    assert_eq!(alone, 0, "steady-state ingests allocated");
    assert_eq!(
        with_subs, alone,
        "allocations of 2,000 events to 4 subscribers"
    );
}
