//! Every row of the bad-input table (docs/http.md#bad-input) over a real
//! socket: the specific answer, the close where the table says so, and other
//! clients undisturbed.

mod common;
use common::*;
use std::time::Duration;

fn assert_error(r: &Resp, status: u16, needle: &str) {
    assert_eq!(r.status, status, "{}", r.text());
    assert!(r.text().contains(needle), "want {needle:?} in {}", r.text());
}

#[test]
fn bodies_that_are_not_what_we_take() {
    let s = start(config());
    let a = s.addr();
    let r = post(a, "/v1/ingest", r#"{"key":"a","value":1"#);
    assert_error(&r, 400, "invalid json");
    let r = post(a, "/v1/ingest", "{\"key\":\"a\",\"player\":\"\u{e9}\"}");
    assert_eq!(r.status, 200, "valid UTF-8 is fine: {}", r.text());
    let body = b"{\"key\":\"a\xff\xfe\"}";
    let mut bad = format!(
        "POST /v1/ingest HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    bad.extend_from_slice(body);
    let (r, _) = raw(a, &bad);
    assert_error(&r, 400, "invalid json");
    assert_error(&post(a, "/v1/ingest", "42"), 400, "error");
    assert_error(
        &post(a, "/v1/ingest", r#"{"value":1}"#),
        422,
        "missing key: no member named key",
    );
    assert_error(&post(a, "/v1/ingest", r#"{"key":7}"#), 422, "key");
    assert_error(&post(a, "/v1/ingest", r#"{"key":""}"#), 422, "key");
    let long = "k".repeat(129);
    assert_error(
        &post(a, "/v1/ingest", &format!(r#"{{"key":"{long}"}}"#)),
        422,
        "key",
    );
    assert_error(&post(a, "/v1/boxes/t", r#"{"value":"5"}"#), 422, "field v");
    assert_error(&post(a, "/v1/boxes/t", r#"{"value":1.5}"#), 422, "field v");
    assert_error(
        &post(a, "/v1/boxes/t", r#"{"player":"ABCDEFGHIJKLMNOPQ"}"#),
        422,
        "field by",
    );
    let max = post(a, "/v1/boxes/t", &format!(r#"{{"value":{}}}"#, i64::MAX));
    assert_eq!(max.status, 200);
    assert_error(&post(a, "/v1/boxes/t", r#"{"value":1}"#), 422, "overflow");
    // The rejected message changed nothing.
    let r = get(a, "/v1/boxes/t");
    assert_eq!(r.version(), max.version(), "{}", r.text());
    s.shutdown().unwrap();
}

#[test]
fn framing_errors_answer_then_close() {
    let s = start(config());
    let a = s.addr();
    let cases: &[(&[u8], u16)] = &[
        (b"GARBAGE\r\n\r\n", 400),
        (
            b"GET /healthz HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            400,
        ),
        (
            b"POST /v1/ingest HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
            400,
        ),
        (
            b"POST /v1/ingest HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            400,
        ),
        (b"GET /healthz HTTP/1.1\r\nHost: t\r\nX: a\r\n folded\r\n\r\n", 400),
        (
            b"POST /v1/ingest HTTP/1.1\r\nHost: t\r\nContent-Length: 2000000\r\n\r\n",
            413,
        ),
    ];
    for (req, status) in cases {
        let (r, mut rd) = raw(a, req);
        assert_eq!(
            r.status,
            *status,
            "{:?}: {}",
            String::from_utf8_lossy(req),
            r.text()
        );
        assert_eq!(r.header("Connection"), Some("close"));
        assert!(rd.closed(), "{:?} must close", String::from_utf8_lossy(req));
    }
    // Head too large, and too many headers.
    let mut big = b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Big: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 9000));
    big.extend_from_slice(b"\r\n\r\n");
    let (r, mut rd) = raw(a, &big);
    assert_eq!(r.status, 431);
    assert!(rd.closed());
    let mut many = b"GET /healthz HTTP/1.1\r\nHost: t\r\n".to_vec();
    for i in 0..65 {
        many.extend_from_slice(format!("X-{i}: 1\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    let (r, mut rd) = raw(a, &many);
    assert_eq!(r.status, 431);
    assert!(rd.closed());
    // A body over max_body_bytes sent chunked.
    let mut chunked =
        b"POST /v1/ingest HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..20 {
        chunked.extend_from_slice(b"10000\r\n");
        chunked.extend(std::iter::repeat_n(b' ', 0x10000));
        chunked.extend_from_slice(b"\r\n");
    }
    let mut rd = Reader::new(connect(a));
    let _ = std::io::Write::write_all(&mut rd.stream, &chunked);
    let r = rd.read(false);
    assert_eq!(r.status, 413);
    s.shutdown().unwrap();
}

#[test]
fn slow_header_gets_408_while_others_are_served() {
    let mut c = config();
    c.limits.header_timeout_ms = 300;
    let s = start(c);
    let a = s.addr();
    let mut slow = Reader::new(connect(a));
    slow.send(b"GET /healthz HTTP/1.1\r\nHost:");
    // Meanwhile another client is served normally, repeatedly.
    for _ in 0..20 {
        assert_eq!(get(a, "/healthz").status, 200);
        std::thread::sleep(Duration::from_millis(5));
    }
    let r = slow.read(false);
    assert_eq!(r.status, 408);
    assert!(slow.closed());
    s.shutdown().unwrap();
}

#[test]
fn stalled_body_gets_408_and_idle_connection_is_closed() {
    let mut c = config();
    c.limits.body_timeout_ms = 300;
    c.limits.idle_timeout_ms = 300;
    let s = start(c);
    let a = s.addr();
    let mut rd = Reader::new(connect(a));
    rd.send(b"POST /v1/ingest HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{\"key\":");
    let r = rd.read(false);
    assert_eq!(r.status, 408);
    assert!(rd.closed());

    let (r, mut idle) = raw(a, b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(r.status, 200);
    // No request follows: the server closes it silently after idle_timeout_ms.
    assert!(idle.closed());
    s.shutdown().unwrap();
}

#[test]
fn connection_cap_answers_503_and_spares_existing_connections() {
    let mut c = config();
    c.limits.max_connections = 4;
    let s = start(c);
    let a = s.addr();
    let mut kept: Vec<Reader> = (0..4)
        .map(|_| {
            let (r, rd) = raw(a, b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
            assert_eq!(r.status, 200);
            rd
        })
        .collect();
    let (r, mut extra) = raw(a, b"GET /v1/boxes/x HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(r.status, 503);
    assert!(r.text().contains("too many connections"), "{}", r.text());
    assert!(extra.closed());
    // One that says nothing is refused too, a moment later.
    let mut silent = Reader::new(connect(a));
    assert_eq!(silent.read(false).status, 503);
    for rd in &mut kept {
        rd.send(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
        assert_eq!(rd.read(false).status, 200);
    }
    drop(kept);
    // Slots come back once connections close.
    let mut ok = false;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(20));
        if get(a, "/v1/boxes/x").status == 404 {
            ok = true;
            break;
        }
    }
    assert!(ok);
    s.shutdown().unwrap();
}

#[test]
fn probes_and_the_metrics_listener_are_answered_at_max_connections() {
    let mut c = config();
    c.limits.max_connections = 4;
    c.server.metrics_listen = "127.0.0.1:0".into();
    let s = start(c);
    let a = s.addr();
    // The cap filled with event streams, as a crowd of browsers would.
    let streams: Vec<Reader> = (0..4)
        .map(|i| {
            let req = format!(
                "GET /v1/boxes/s{i} HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n"
            );
            let mut rd = Reader::new(connect(a));
            rd.send(req.as_bytes());
            let head = rd.read_until_contains("\r\n\r\n");
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            rd
        })
        .collect();
    assert_eq!(get(a, "/v1/boxes/s0").status, 503, "the cap is reached");
    for _ in 0..3 {
        assert_eq!(get(a, "/healthz").status, 200);
        let ready = get(a, "/readyz");
        assert_eq!((ready.status, ready.text()), (200, "ready".to_string()));
    }
    let m = s.metrics_addr().expect("metrics listener");
    for _ in 0..3 {
        let r = get(m, "/metrics");
        assert_eq!(r.status, 200);
        assert!(
            r.text()
                .contains("pollbox_connections_rejected_total{reason=\"max_connections\"} 1\n"),
            "{}",
            r.text()
        );
    }
    drop(streams);
    s.shutdown().unwrap();
}

#[test]
fn ingest_tokens_and_max_boxes() {
    let mut c = config();
    c.auth.ingest_tokens = vec!["s3cret".into(), "other".into()];
    c.boxes.max_boxes = 2;
    let s = start(c);
    let a = s.addr();
    assert_error(&post(a, "/v1/boxes/x", r#"{"value":1}"#), 401, "token");
    let req = |tok: &str, key: &str| {
        let body = r#"{"value":1}"#;
        raw(
            a,
            format!(
                "POST /v1/boxes/{key} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {tok}\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .0
    };
    assert_eq!(req("wrong", "x").status, 401);
    assert_eq!(req("s3cret", "x").status, 200);
    assert_eq!(req("other", "y").status, 200);
    let r = req("s3cret", "z");
    assert_error(&r, 507, "too many boxes");
    // Existing boxes keep working, polls need no token.
    assert_eq!(req("s3cret", "x").status, 200);
    assert_eq!(get(a, "/v1/boxes/x").status, 200);
    s.shutdown().unwrap();
}

#[test]
fn http11_without_exactly_one_host_is_400_and_closed() {
    let s = start(config());
    let a = s.addr();
    for (req, reason) in [
        (&b"GET /healthz HTTP/1.1\r\n\r\n"[..], "without a Host"),
        (
            b"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            "more than one Host",
        ),
    ] {
        let (r, mut rest) = raw(a, req);
        assert_eq!(r.status, 400);
        assert!(r.text().contains(reason), "{}", r.text());
        assert_eq!(r.header("connection"), Some("close"));
        assert!(rest.closed());
    }
    let (r, _) = raw(a, b"GET /healthz HTTP/1.0\r\n\r\n");
    assert_eq!(r.status, 200, "HTTP/1.0 may omit Host");
    s.shutdown().unwrap();
}

/// docs/http.md#bad-input: an error answer to a client that is still sending is
/// written, the write side shut down, and the unread input drained (bounded) before
/// the close, so the client reads the answer and then the end of the stream, not a
/// reset; a client that never stops sending is cut off at the bound.
#[test]
fn error_answers_linger_so_the_client_reads_them() {
    use std::io::{Read, Write};
    let s = start(config());
    let a = s.addr();
    let mut c = connect(a);
    // 2 MiB announced (over max_body_bytes): 413 at once, while 256 KiB of the
    // body is already on its way.
    c.write_all(b"POST /v1/boxes/big HTTP/1.1\r\nHost: t\r\nContent-Length: 2097152\r\n\r\n")
        .unwrap();
    c.write_all(&vec![b'x'; 256 << 10]).unwrap();
    let mut got = Vec::new();
    let end = c.read_to_end(&mut got);
    assert!(
        end.is_ok(),
        "a reset instead of the end of the stream: {end:?}"
    );
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.contains("Connection: close"), "{text}");

    // The server is still reading what comes (dropping it) up to the bound;
    // past it the client is cut off.
    let chunk = vec![b'y'; 64 << 10];
    let mut sent = 256usize << 10;
    let cut = loop {
        match c.write(&chunk) {
            Ok(n) => sent += n,
            Err(e) => break e,
        }
        assert!(sent < 64 << 20, "never cut off ({sent} bytes)");
    };
    assert!(
        matches!(
            cut.kind(),
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
        ),
        "{cut:?}"
    );
    assert!(
        sent >= pollbox_core::conn::LINGER_BYTES,
        "cut off before the bound: {sent}"
    );
    assert_eq!(get(a, "/healthz").status, 200);
    s.shutdown().unwrap();
}
