//! The per-client limits over real sockets (docs/private-boxes.md#per-client-limits):
//! connections, held requests and the request rate of one client, each
//! answered 429 with `Retry-After` and the limit named, and counted; the
//! client from a direct peer, from a trusted proxy's PROXY v2 header or its
//! `X-Forwarded-For`; probes and the metrics listener never refused.
//!
//! Clients on loopback are told apart by their source address: 127.0.0.1
//! and 127.0.0.2 are two peers. Counters are read from the exposition
//! directly (a scrape over HTTP would be a request of the client under test).
//! No assertion depends on timing: the rate limit's bucket is larger than
//! what can refill while the test runs up to its first refusal.

mod common;

use common::*;
use pollbox_core::config::Config;
use pollbox_server::Server;
use socket2::{Domain, Socket, Type};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

const POLL: &[u8] = b"GET /v1/boxes/a HTTP/1.1\r\nHost: t\r\n\r\n";
const STREAM: &[u8] = b"GET /v1/boxes/a HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n";

/// A connection to `to` from the loopback address `from` (127.0.0.x).
fn connect_from(from: &str, to: SocketAddr) -> Reader {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    let src: SocketAddr = format!("{from}:0").parse().unwrap();
    s.bind(&src.into()).expect("bind the source address");
    s.connect(&to.into()).expect("connect");
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_nodelay(true).unwrap();
    Reader::new(s)
}

/// A counter or gauge from the exposition, summed over series whose labels
/// contain `labels`.
fn metric(s: &Server, name: &str, labels: &str) -> f64 {
    let mut out = Vec::new();
    s.render_metrics(&mut out);
    String::from_utf8_lossy(&out)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            (n == name && rest.contains(labels)).then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

fn refused(s: &Server, limit: &str) -> f64 {
    metric(
        s,
        "pollbox_limit_refused_total",
        &format!("limit=\"{limit}\""),
    )
}

/// A 429 for `key`, with `Retry-After` a whole number of seconds, at least 1.
fn assert_429(r: &Resp, key: &str) -> u64 {
    assert_eq!(r.status, 429, "{}", r.text());
    let j = r.json();
    assert_eq!(j["limit"], key, "{}", r.text());
    assert!(j["error"].as_str().unwrap().starts_with("too many "), "{j}");
    let retry: u64 = r
        .header("Retry-After")
        .expect("Retry-After")
        .parse()
        .expect("whole seconds");
    assert!(retry >= 1);
    retry
}

/// A PROXY protocol v2 header for a TCP connection from `client`.
fn proxy_v2(client: IpAddr) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.push(0x21); // version 2, PROXY
    let mut rest = Vec::new();
    match client {
        IpAddr::V4(a) => {
            h.push(0x11); // TCP over IPv4
            rest.extend_from_slice(&a.octets());
            rest.extend_from_slice(&[127, 0, 0, 1]);
        }
        IpAddr::V6(a) => {
            h.push(0x21); // TCP over IPv6
            rest.extend_from_slice(&a.octets());
            rest.extend_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());
        }
    }
    rest.extend_from_slice(&51000u16.to_be_bytes());
    rest.extend_from_slice(&8080u16.to_be_bytes());
    h.extend_from_slice(&(rest.len() as u16).to_be_bytes());
    h.extend_from_slice(&rest);
    h
}

fn with(edit: impl FnOnce(&mut Config)) -> Server {
    let mut c = config();
    edit(&mut c);
    start(c)
}

/// Send `req` and read its answer.
fn ask(r: &mut Reader, req: &[u8]) -> Resp {
    r.send(req);
    r.read(req.starts_with(b"HEAD "))
}

/// A connection the server has adopted and counted: its first answer is in.
fn open_counted(from: &str, to: SocketAddr) -> Reader {
    let mut r = connect_from(from, to);
    assert_eq!(ask(&mut r, POLL).status, 404);
    r
}

#[test]
fn a_direct_client_past_its_connections_gets_429_and_the_close() {
    let s = with(|c| c.limits.max_connections_per_ip = 2);
    let a = s.addr();
    let first = open_counted("127.0.0.1", a);
    let _second = open_counted("127.0.0.1", a);
    let mut third = connect_from("127.0.0.1", a);
    let r = ask(&mut third, POLL);
    assert_429(&r, "max_connections_per_ip");
    assert_eq!(r.json()["error"], "too many connections");
    assert_eq!(r.header("Connection"), Some("close"));
    assert!(third.closed(), "closed after the answer");
    assert_eq!(refused(&s, "connections"), 1.0);
    // Another client has its own budget.
    let _other = open_counted("127.0.0.2", a);
    // One closes: the client may open another (the close reaches the server
    // when it does; until then, each try is one more refusal).
    drop(first);
    let mut tries = 0;
    let back = loop {
        tries += 1;
        let mut r = connect_from("127.0.0.1", a);
        let resp = ask(&mut r, POLL);
        if resp.status != 429 || tries == 300 {
            break resp;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(back.status, 404, "{}", back.text());
    // The third's refusal, and one a try before the last.
    assert_eq!(refused(&s, "connections"), f64::from(tries));
    s.shutdown().unwrap();
}

#[test]
fn a_client_past_its_streams_gets_429_and_keeps_its_connection() {
    let s = with(|c| c.limits.max_streams_per_ip = 2);
    let a = s.addr();
    assert_eq!(post(a, "/v1/boxes/a", r#"{"value":1}"#).status, 200);
    let mut streams = Vec::new();
    for _ in 0..2 {
        let mut r = connect_from("127.0.0.1", a);
        r.send(STREAM);
        r.read_until_contains("data:");
        streams.push(r);
    }
    let mut c = connect_from("127.0.0.1", a);
    let r = ask(&mut c, STREAM);
    assert_429(&r, "max_streams_per_ip");
    assert_eq!(r.json()["error"], "too many streams");
    assert_ne!(r.header("Connection"), Some("close"));
    // A long-poll is held too; a poll is not, on the same connection.
    let r = ask(
        &mut c,
        b"GET /v1/boxes/a?after=999999999999999&wait_ms=20000 HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    assert_429(&r, "max_streams_per_ip");
    assert_eq!(ask(&mut c, POLL).status, 200);
    assert_eq!(refused(&s, "streams"), 2.0);
    // Another client streams.
    let mut other = connect_from("127.0.0.2", a);
    other.send(STREAM);
    other.read_until_contains("data:");
    // A stream that ends gives its place back (once the server sees it end).
    drop(streams.pop());
    let mut tries = 0;
    let head = loop {
        tries += 1;
        let mut t = connect_from("127.0.0.1", a);
        t.send(STREAM);
        let head = t.read_through("\r\n\r\n");
        if head.starts_with("HTTP/1.1 200") || tries == 300 {
            break head;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s.shutdown().unwrap();
}

#[test]
fn a_client_past_its_request_rate_gets_429_with_the_seconds_to_wait() {
    // A bucket of 20 that refills one a second: 20 requests go through
    // however slow the machine; the first refusal comes by request 20 + the
    // seconds the test has run, long before 200.
    let s = with(|c| {
        c.limits.requests_per_s_per_ip = 1;
        c.limits.requests_burst_per_ip = 20;
    });
    let a = s.addr();
    let mut c = connect_from("127.0.0.1", a);
    let mut answers = Vec::new();
    let refusal = loop {
        let r = ask(&mut c, POLL);
        if r.status == 429 || answers.len() == 200 {
            break r;
        }
        answers.push(r.status);
    };
    assert!(answers.len() >= 20, "the burst goes through: {answers:?}");
    assert!(answers.iter().all(|&s| s == 404));
    assert_eq!(assert_429(&refusal, "requests_per_s_per_ip"), 1);
    assert_eq!(refusal.json()["error"], "too many requests");
    assert_ne!(refusal.header("Connection"), Some("close"));
    assert_eq!(refused(&s, "requests"), 1.0);
    assert_eq!(
        metric(&s, "pollbox_http_requests_total", "code=\"429\""),
        1.0
    );
    // The connection goes on, its probes answered with the bucket empty;
    // another client's bucket is full.
    for probe in ["/healthz", "/readyz"].repeat(5) {
        let r = ask(
            &mut c,
            format!("GET {probe} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes(),
        );
        assert_eq!(r.status, 200, "{probe}");
    }
    assert_eq!(refused(&s, "requests"), 1.0, "probes are not refused");
    let mut other = connect_from("127.0.0.2", a);
    for _ in 0..20 {
        assert_eq!(ask(&mut other, POLL).status, 404);
    }
    s.shutdown().unwrap();
}

#[test]
fn behind_a_trusted_proxy_each_client_named_in_a_proxy_header_has_its_own_budget() {
    let s = with(|c| {
        c.server.trusted_proxies = vec!["127.0.0.1".into()];
        c.limits.max_connections_per_ip = 1;
        c.limits.requests_per_s_per_ip = 1;
        c.limits.requests_burst_per_ip = 20;
    });
    let a = s.addr();
    let alice: IpAddr = "203.0.113.1".parse().unwrap();
    let bob: IpAddr = "2001:db8::b0b".parse().unwrap();
    // The proxy's connections for alice and bob: one each is within the cap.
    let mut pa = connect_from("127.0.0.1", a);
    pa.send(&proxy_v2(alice));
    assert_eq!(ask(&mut pa, POLL).status, 404);
    let mut pb = connect_from("127.0.0.1", a);
    pb.send(&proxy_v2(bob));
    assert_eq!(ask(&mut pb, POLL).status, 404);
    // A second connection of alice's is over hers.
    let mut pa2 = connect_from("127.0.0.1", a);
    pa2.send(&[&proxy_v2(alice)[..], POLL].concat());
    assert_429(&pa2.read(false), "max_connections_per_ip");
    assert!(pa2.closed());
    assert_eq!(refused(&s, "connections"), 1.0);
    // alice spends her bucket; bob's is untouched.
    let mut spent = 1;
    let r = loop {
        let r = ask(&mut pa, POLL);
        if r.status == 429 || spent == 200 {
            break r;
        }
        spent += 1;
    };
    assert!(spent >= 20, "{spent}");
    assert_429(&r, "requests_per_s_per_ip");
    for _ in 0..19 {
        assert_eq!(ask(&mut pb, POLL).status, 404);
    }
    assert_eq!(refused(&s, "requests"), 1.0);
    // A PROXY header from a peer that is not trusted is no header: a bad request.
    let mut u = connect_from("127.0.0.2", a);
    u.send(&[&proxy_v2(bob)[..], POLL].concat());
    assert_eq!(u.read(false).status, 400);
    s.shutdown().unwrap();
}

#[test]
fn x_forwarded_for_names_the_client_from_a_trusted_peer_only() {
    let s = with(|c| {
        c.server.trusted_proxies = vec!["127.0.0.1/32".into()];
        c.limits.requests_per_s_per_ip = 1;
        c.limits.requests_burst_per_ip = 20;
    });
    let a = s.addr();
    let from = |who: &str| {
        format!("GET /v1/boxes/a HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: 192.0.2.99, {who}\r\n\r\n")
    };
    // Through the trusted proxy, on one connection: 198.51.100.1 spends its
    // bucket, 198.51.100.2 then has a full one.
    let mut p = connect_from("127.0.0.1", a);
    let mut spent = 0;
    let r = loop {
        let r = ask(&mut p, from("198.51.100.1").as_bytes());
        if r.status == 429 || spent == 200 {
            break r;
        }
        spent += 1;
    };
    assert!(spent >= 20, "{spent}");
    assert_429(&r, "requests_per_s_per_ip");
    for _ in 0..20 {
        assert_eq!(ask(&mut p, from("198.51.100.2").as_bytes()).status, 404);
    }
    // From a peer that is not trusted the field is ignored: every request is
    // the peer's, one bucket whatever each names.
    let mut d = connect_from("127.0.0.2", a);
    let mut spent = 0;
    let r = loop {
        let r = ask(
            &mut d,
            from(&format!("198.51.100.{}", 10 + spent)).as_bytes(),
        );
        if r.status == 429 || spent == 200 {
            break r;
        }
        spent += 1;
    };
    assert!((20..200).contains(&spent), "{spent}");
    assert_429(&r, "requests_per_s_per_ip");
    assert_eq!(refused(&s, "requests"), 2.0);
    s.shutdown().unwrap();
}

#[test]
fn probes_and_the_metrics_listener_are_never_refused_by_a_client_limit() {
    let s = with(|c| {
        c.server.metrics_listen = "127.0.0.1:0".into();
        c.limits.max_connections_per_ip = 1;
        c.limits.max_streams_per_ip = 1;
        c.limits.requests_per_s_per_ip = 1;
        c.limits.requests_burst_per_ip = 1;
    });
    let a = s.addr();
    let m = s.metrics_addr().expect("metrics listener");
    // The one connection, its stream: every limit reached.
    let mut w = connect_from("127.0.0.2", a);
    let ingest = b"POST /v1/boxes/a HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\n\r\n{\"value\":1}";
    assert_eq!(ask(&mut w, ingest).status, 200);
    let mut held = connect_from("127.0.0.1", a);
    held.send(STREAM);
    held.read_until_contains("data:");
    for probe in ["/healthz", "/readyz"].repeat(10) {
        // Each on a connection over the cap: answered, then closed.
        let mut c = connect_from("127.0.0.1", a);
        let r = ask(
            &mut c,
            format!("GET {probe} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes(),
        );
        assert_eq!(r.status, 200, "{probe}: {}", r.text());
        assert!(c.closed());
    }
    let mut c = Reader::new(connect(m));
    for _ in 0..10 {
        let r = ask(&mut c, b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n");
        assert_eq!(r.status, 200);
        assert!(r
            .text()
            .contains("pollbox_limit_refused_total{limit=\"connections\"} 0"));
    }
    // And the same connections' other requests are refused.
    let mut c = connect_from("127.0.0.1", a);
    assert_429(&ask(&mut c, POLL), "max_connections_per_ip");
    assert_eq!(refused(&s, "connections"), 1.0);
    // The clients remembered: 127.0.0.1, and 127.0.0.2 until its bucket refills.
    let clients = metric(&s, "pollbox_limit_clients", "");
    assert!((1.0..=2.0).contains(&clients), "{clients}");
    s.shutdown().unwrap();
}
