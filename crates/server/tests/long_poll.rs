//! Long-poll (docs/http.md#long-polls): `GET /v1/boxes/{key}?after=V&wait_ms=N`.

mod common;
use common::*;

fn version_of(r: &Resp) -> u64 {
    r.json()["ver"].as_u64().unwrap()
}

/// `n` ingests into `key`, each on a fresh connection; returns the version
/// the first one answered (a standalone server starts a new box at the wall
/// clock, not at 1) after checking that each answered the next one.
fn ingest_on_fresh_connections(a: std::net::SocketAddr, key: &str, n: usize) -> u64 {
    let mut first = None;
    for i in 0..n {
        let r = post(
            a,
            &format!("/v1/boxes/{key}"),
            &format!(r#"{{"value":{i}}}"#),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let v = version_of(&r);
        assert_eq!(v, *first.get_or_insert(v) + i as u64, "{}", r.text());
    }
    first.expect("at least one ingest")
}

#[test]
fn parked_polls_on_every_worker_wake_on_an_ingest_from_any_worker() {
    let mut c = config();
    c.server.workers = 4;
    let s = start(c);
    let a = s.addr();
    let first = ingest_on_fresh_connections(a, "lp", 1);
    // 32 connections spread over the 4 workers by SO_REUSEPORT, each parked.
    let mut parked: Vec<Reader> = (0..32)
        .map(|_| {
            let mut r = Reader::new(connect(a));
            r.send(
                format!("GET /v1/boxes/lp?after={first}&wait_ms=20000 HTTP/1.1\r\nHost: t\r\n\r\n")
                    .as_bytes(),
            );
            r
        })
        .collect();
    // Wait until every poll is parked (metrics say so), then ingest once.
    wait_parked(a, 32);
    assert_eq!(ingest_on_fresh_connections(a, "lp", 1), first + 1);
    // A 304 would only come after 20 s (past the reader's timeout): a 200 with
    // the next version means the wake-up crossed workers.
    for r in &mut parked {
        let resp = r.read(false);
        assert_eq!(resp.status, 200);
        assert_eq!(version_of(&resp), first + 1);
        assert_eq!(
            resp.header("ETag"),
            Some(format!("\"{}\"", first + 1).as_str())
        );
    }
    s.shutdown().unwrap();
}

#[test]
fn answers_at_once_when_already_past_and_304_at_the_deadline() {
    let s = start(config());
    let a = s.addr();
    let first = ingest_on_fresh_connections(a, "k", 3);
    let r = get(a, &format!("/v1/boxes/k?after={first}&wait_ms=10000"));
    assert_eq!((r.status, version_of(&r)), (200, first + 2));
    let r = get(a, &format!("/v1/boxes/k?after={}&wait_ms=200", first + 2));
    assert_eq!(r.status, 304);
    assert_eq!(
        r.header("ETag"),
        Some(format!("\"{}\"", first + 2).as_str())
    );
    assert!(r.body.is_empty());
    // A key that does not exist yet: wait for its creation.
    let mut w = Reader::new(connect(a));
    w.send(b"GET /v1/boxes/newborn?after=0&wait_ms=20000 HTTP/1.1\r\nHost: t\r\n\r\n");
    std::thread::sleep(std::time::Duration::from_millis(100));
    let created = ingest_on_fresh_connections(a, "newborn", 1);
    let r = w.read(false);
    assert_eq!((r.status, version_of(&r)), (200, created));
    // A bad query is a 400.
    assert_eq!(get(a, "/v1/boxes/k?after=x&wait_ms=10").status, 400);
    s.shutdown().unwrap();
}

#[test]
fn wait_is_capped_by_max_wait_ms_and_pipelined_requests_follow_in_order() {
    let mut c = config();
    c.limits.max_wait_ms = 300;
    let s = start(c);
    let a = s.addr();
    let first = ingest_on_fresh_connections(a, "cap", 1);
    let mut r = Reader::new(connect(a));
    // Asks for 10 minutes; the cap answers 304 after 300 ms (the reader gives up after 10 s).
    r.send(
        format!("GET /v1/boxes/cap?after={first}&wait_ms=600000 HTTP/1.1\r\nHost: t\r\n\r\nGET /healthz HTTP/1.1\r\nHost: t\r\n\r\nGET /v1/boxes/cap HTTP/1.1\r\nHost: t\r\n\r\n")
            .as_bytes(),
    );
    assert_eq!(r.read(false).status, 304);
    assert_eq!(r.read(false).status, 200);
    let last = r.read(false);
    assert_eq!((last.status, version_of(&last)), (200, first));
    s.shutdown().unwrap();
}

#[test]
fn a_thousand_parked_polls_and_shutdown_answers_them() {
    let mut c = config();
    c.server.workers = 2;
    let s = start(c);
    let a = s.addr();
    let mut parked: Vec<Reader> = (0..1000)
        .map(|i| {
            let mut r = Reader::new(connect(a));
            r.send(
                format!(
                    "GET /v1/boxes/many-{}?after=0&wait_ms=30000 HTTP/1.1\r\nHost: t\r\n\r\n",
                    i % 10
                )
                .as_bytes(),
            );
            r
        })
        .collect();
    wait_parked(a, 1000);
    ingest_on_fresh_connections(a, "many-3", 1);
    for (i, r) in parked.iter_mut().enumerate().filter(|(i, _)| i % 10 == 3) {
        let resp = r.read(false);
        assert_eq!(resp.status, 200, "poll {i}");
    }
    // Graceful shutdown answers the rest (304: nothing changed) and closes.
    s.shutdown().unwrap();
    for (i, r) in parked.iter_mut().enumerate().filter(|(i, _)| i % 10 != 3) {
        let resp = r.read(false);
        assert!(
            resp.status == 304 || resp.status == 404,
            "poll {i}: {}",
            resp.status
        );
        assert_eq!(resp.header("Connection"), Some("close"));
    }
}

#[test]
fn wait_ms_zero_with_nothing_newer_is_304() {
    let s = start(config());
    let a = s.addr();
    let first = ingest_on_fresh_connections(a, "zero", 1);
    let r = get(a, &format!("/v1/boxes/zero?after={first}&wait_ms=0"));
    assert_eq!(r.status, 304);
    assert_eq!(r.header("etag"), Some(format!("\"{first}\"").as_str()));
    assert_eq!(get(a, "/v1/boxes/zero?after=0&wait_ms=0").status, 200);
    s.shutdown().unwrap();
}

#[test]
fn parked_polls_whose_clients_hang_up_are_dropped_before_their_deadline() {
    let s = start(config());
    let a = s.addr();
    let mut clients: Vec<_> = (0..100)
        .map(|i| {
            let mut c = connect(a);
            let req = format!(
                "GET /v1/boxes/gone-{i}?after=0&wait_ms=600000 HTTP/1.1\r\nHost: t\r\n\r\n"
            );
            std::io::Write::write_all(&mut c, req.as_bytes()).unwrap();
            c
        })
        .collect();
    wait_parked(a, 100);
    for c in clients.drain(..) {
        drop(c);
    }
    // Long before the 600 s deadline every slot is free again.
    wait_parked(a, 0);
    assert_eq!(s.wakeups().parked_keys(), 0);
    s.shutdown().unwrap();
}

/// A parked poll holds no buffer while it waits: 500 of them add less than
/// 1 KiB each to `pollbox_buffered_bytes` (a send buffer kept per parked poll
/// was 16 KiB each, and 16,000 of them filled the default budget).
#[test]
fn parked_polls_hold_no_buffers() {
    let s = start(config());
    let a = s.addr();
    let first = ingest_on_fresh_connections(a, "held", 1);
    let buffered = || {
        get(a, "/metrics")
            .text()
            .lines()
            .find_map(|l| l.strip_prefix("pollbox_buffered_bytes "))
            .and_then(|v| v.parse::<u64>().ok())
            .expect("pollbox_buffered_bytes")
    };
    let before = buffered();
    let mut parked: Vec<Reader> = (0..500)
        .map(|_| {
            let mut r = Reader::new(connect(a));
            r.send(
                format!(
                    "GET /v1/boxes/held?after={first}&wait_ms=30000 HTTP/1.1\r\nHost: t\r\n\r\n"
                )
                .as_bytes(),
            );
            r
        })
        .collect();
    wait_parked(a, 500);
    let during = buffered();
    assert!(
        during.saturating_sub(before) < 500 * 1024,
        "500 parked polls hold {} bytes of buffers",
        during - before
    );
    ingest_on_fresh_connections(a, "held", 1);
    for r in &mut parked {
        assert_eq!(r.read(false).status, 200);
    }
    s.shutdown().unwrap();
}
