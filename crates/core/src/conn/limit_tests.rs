//! The per-client limits as a connection applies them, without sockets: the
//! client from the peer, a PROXY v2 header or `X-Forwarded-For`, and the 429s.

use super::tests::{rig_with, Applied, Rig};
use super::*;
use crate::clients::proxy::SIGNATURE;
use crate::clients::Limit;
use crate::config::Config;
use std::net::IpAddr;

/// The connection tests' rig, its config checked as a server's is.
fn rig(edit: impl FnOnce(&mut Config)) -> Rig {
    rig_with(|config| {
        edit(config);
        config.validate().unwrap();
    })
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

const POLL: &[u8] = b"GET /v1/boxes/a HTTP/1.1\r\nHost: x\r\n\r\n";
const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";

impl Rig {
    fn from(&self, peer: &str) -> Connection {
        Connection::from_peer(self.now_ms, Listener::Main, ip(peer), &self.service)
    }

    fn close(&mut self, mut c: Connection) {
        c.release(&mut self.cx());
    }

    fn clients(&self) -> &crate::clients::ClientTable {
        &self.service.node().clients
    }
}

/// A 429 naming `limit`, with `Retry-After: retry`.
fn assert_429(out: &str, key: &str, retry: u64) {
    assert!(
        out.starts_with("HTTP/1.1 429 Too Many Requests\r\n"),
        "{out}"
    );
    assert!(
        out.contains(&format!("\r\nRetry-After: {retry}\r\n")),
        "{out}"
    );
    assert!(
        out.ends_with(&format!("\",\"limit\":\"{key}\"}}")),
        "names the limit: {out}"
    );
    assert!(out.contains("\r\n\r\n{\"error\":\"too many "), "{out}");
}

fn proxy_v2(command: u8, source: Option<IpAddr>) -> Vec<u8> {
    let mut h = SIGNATURE.to_vec();
    h.push(0x20 | command);
    let rest = match source {
        Some(IpAddr::V4(a)) => {
            h.push(0x11);
            let mut r = a.octets().to_vec();
            r.extend_from_slice(&[127, 0, 0, 1, 0x9c, 0x40, 0x1f, 0x90]);
            r
        }
        Some(IpAddr::V6(a)) => {
            h.push(0x21);
            let mut r = a.octets().to_vec();
            r.extend_from_slice(&[0; 16]);
            r.extend_from_slice(&[0x9c, 0x40, 0x1f, 0x90]);
            r
        }
        None => {
            h.push(0x00);
            Vec::new()
        }
    };
    h.extend_from_slice(&(rest.len() as u16).to_be_bytes());
    h.extend_from_slice(&rest);
    h
}

#[test]
fn by_default_no_client_is_tracked() {
    let mut r = rig(|_| {});
    let mut c = r.from("192.0.2.1");
    for _ in 0..100 {
        r.feed(&mut c, POLL);
    }
    assert_eq!(c.client(), None);
    assert!(r.clients().is_empty());
    assert!(r.host.limit_refused.is_empty());
    // And a PROXY header from anyone is a bad request, not a header, and
    // the answer names the setting.
    let mut c = r.from("127.0.0.1");
    let mut bytes = proxy_v2(1, Some(ip("203.0.113.7")));
    bytes.extend_from_slice(POLL);
    r.feed(&mut c, &bytes);
    let out = r.sent(&mut c);
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    assert!(out.contains("not in server.trusted_proxies"), "{out}");
}

#[test]
fn past_max_connections_per_ip_a_connection_gets_its_probe_or_429_and_the_close() {
    let mut r = rig(|c| c.limits.max_connections_per_ip = 2);
    let a = r.from("192.0.2.1");
    let b = r.from("192.0.2.1");
    assert_eq!(a.client(), Some(ip("192.0.2.1")));
    // Another client has its own two.
    let other = r.from("192.0.2.2");
    assert_eq!(other.client(), Some(ip("192.0.2.2")));
    // The third of one client: a request is refused and the connection closed.
    let mut c = r.from("192.0.2.1");
    assert_eq!(c.client(), None);
    r.feed(&mut c, POLL);
    let out = r.sent(&mut c);
    assert_429(&out, "max_connections_per_ip", 1);
    assert!(out.contains("Connection: close\r\n"), "{out}");
    assert!(c.finished());
    assert_eq!(r.host.limit_refused, vec![Limit::Connections]);
    // Its probe is answered (then the close).
    let mut c = r.from("192.0.2.1");
    r.feed(&mut c, HEALTHZ);
    let out = r.sent(&mut c);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("Connection: close\r\n") && c.finished());
    // Silent: refused at the probe deadline; bytes do not extend it.
    let mut c = r.from("192.0.2.1");
    r.feed(&mut c, b"GET /v1/bo");
    assert_eq!(c.deadline(), r.now_ms + PROBE_WAIT_MS);
    r.now_ms += PROBE_WAIT_MS;
    c.on_timer(&mut r.cx());
    assert_429(&r.sent(&mut c), "max_connections_per_ip", 1);
    assert_eq!(r.host.limit_refused.len(), 2);
    // One closes: the client may open another.
    r.close(a);
    let mut d = r.from("192.0.2.1");
    r.feed(&mut d, POLL);
    assert!(r.sent(&mut d).starts_with("HTTP/1.1 404"));
    for c in [b, d, other] {
        r.close(c);
    }
    assert!(r.clients().is_empty(), "nothing left behind");
}

#[test]
fn the_request_rate_is_a_bucket_per_client_and_probes_are_never_refused() {
    let mut r = rig(|c| {
        c.limits.requests_per_s_per_ip = 1;
        c.limits.requests_burst_per_ip = 3;
    });
    let mut a = r.from("192.0.2.1");
    let mut b = r.from("192.0.2.1");
    // Three of one client, on two connections, pipelined or not.
    r.feed(&mut a, &[POLL, POLL].concat());
    r.feed(&mut b, POLL);
    for _ in 0..5 {
        r.feed(&mut a, HEALTHZ);
    }
    let out = r.sent(&mut a);
    assert_eq!(out.matches("HTTP/1.1 404").count(), 2, "{out}");
    assert_eq!(out.matches("HTTP/1.1 200").count(), 5, "{out}");
    r.sent(&mut b);
    r.feed(&mut b, &[POLL, HEALTHZ].concat());
    let out = r.sent(&mut b);
    assert_429(
        out.split("HTTP/1.1 200").next().unwrap(),
        "requests_per_s_per_ip",
        1,
    );
    assert!(
        out.contains("HTTP/1.1 200"),
        "the probe after it is answered: {out}"
    );
    assert!(
        !b.finished() && b.closing().is_none(),
        "the connection stays"
    );
    assert_eq!(r.host.limit_refused, vec![Limit::Requests]);
    // Another client is not touched.
    let mut c = r.from("192.0.2.9");
    r.feed(&mut c, POLL);
    assert!(r.sent(&mut c).starts_with("HTTP/1.1 404"));
    // A second later, one more.
    r.now_ms += 1_000;
    r.feed(&mut b, &[POLL, POLL].concat());
    let out = r.sent(&mut b);
    assert!(out.starts_with("HTTP/1.1 404"), "{out}");
    assert_eq!(out.matches("HTTP/1.1 429").count(), 1, "{out}");
}

#[test]
fn held_requests_are_capped_per_client_and_given_back_when_they_end() {
    let mut r = rig(|c| c.limits.max_streams_per_ip = 2);
    r.ingest("a", 1);
    let v = r.service.version(b"a");
    let long_poll = format!("GET /v1/boxes/a?after={v}&wait_ms=5000 HTTP/1.1\r\nHost: x\r\n\r\n");
    let stream = b"GET /v1/boxes/a HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n";
    // A long-poll answered at once gives its place back: more than the cap
    // of them, one after the other, are all answered.
    let at_once = "GET /v1/boxes/a?after=0&wait_ms=5000 HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut c = r.from("192.0.2.1");
    let mut seen_c = Applied::default();
    r.feed(&mut c, at_once.repeat(3).as_bytes());
    assert_eq!(r.sent(&mut c).matches("HTTP/1.1 200").count(), 3);
    let mut parked = r.from("192.0.2.1");
    let mut seen_parked = Applied::default();
    r.feed(&mut parked, long_poll.as_bytes());
    assert!(seen_parked.apply(&mut parked).watch().is_some(), "parked");
    let mut streaming = r.from("192.0.2.1");
    r.feed(&mut streaming, stream);
    assert!(streaming.streaming());
    assert_eq!(r.sent(&mut streaming).matches("HTTP/1.1 200").count(), 1);
    // A third of either: 429, and the connection stays.
    r.feed(&mut c, long_poll.as_bytes());
    assert_429(&r.sent(&mut c), "max_streams_per_ip", 1);
    r.feed(&mut c, stream);
    assert_429(&r.sent(&mut c), "max_streams_per_ip", 1);
    assert!(c.closing().is_none());
    // A poll is not held: answered. At the cap, a long-poll is refused even
    // when it would be answered at once (it is counted before it is answered).
    r.feed(&mut c, POLL);
    assert!(r.sent(&mut c).starts_with("HTTP/1.1 200"));
    assert_eq!(r.host.limit_refused, vec![Limit::Streams, Limit::Streams]);
    r.feed(&mut c, at_once.as_bytes());
    assert_429(&r.sent(&mut c), "max_streams_per_ip", 1);
    // The parked poll is answered: its place is free.
    r.ingest("a", 1);
    parked.on_box_updated(&mut r.cx());
    assert!(r.sent(&mut parked).starts_with("HTTP/1.1 200"));
    let v = r.service.version(b"a");
    let long_poll = format!("GET /v1/boxes/a?after={v}&wait_ms=5000 HTTP/1.1\r\nHost: x\r\n\r\n");
    r.feed(&mut c, long_poll.as_bytes());
    assert!(seen_c.apply(&mut c).watch().is_some(), "parked now");
    // A stream that ends gives its place back too.
    r.close(streaming);
    let mut d = r.from("192.0.2.1");
    r.feed(&mut d, stream);
    assert!(d.streaming());
    for c in [parked, c, d] {
        r.close(c);
    }
    assert!(r.clients().is_empty());
}

#[test]
fn a_trusted_proxys_header_names_the_client() {
    let mut r = rig(|c| {
        c.server.trusted_proxies = vec!["127.0.0.0/8".into()];
        c.limits.max_connections_per_ip = 1;
    });
    let alice = ip("203.0.113.7");
    let mut a = r.from("127.0.0.1");
    // The header alone, then the request: split anywhere.
    let header = proxy_v2(1, Some(alice));
    r.feed(&mut a, &header[..5]);
    assert_eq!(a.client(), None);
    r.feed(&mut a, &header[5..]);
    assert_eq!(a.client(), Some(alice));
    r.feed(&mut a, POLL);
    assert!(r.sent(&mut a).starts_with("HTTP/1.1 404"));
    // Another connection of the same client is over its cap; another
    // client's is not, through the same proxy.
    let mut again = r.from("127.0.0.1");
    r.feed(&mut again, &[&header[..], POLL].concat());
    assert_429(&r.sent(&mut again), "max_connections_per_ip", 1);
    let bob = ip("2001:db8::b0b");
    let mut b = r.from("127.0.0.1");
    r.feed(&mut b, &[&proxy_v2(1, Some(bob))[..], POLL].concat());
    assert!(r.sent(&mut b).starts_with("HTTP/1.1 404"));
    assert_eq!(b.client(), Some(bob));
    // A header naming a client over its cap: the probe deadline runs.
    let mut c = r.from("127.0.0.1");
    r.feed(&mut c, &header);
    assert_eq!(c.deadline(), r.now_ms + PROBE_WAIT_MS);
    // LOCAL (a health check): the proxy's own connection.
    let mut h = r.from("127.0.0.1");
    r.feed(&mut h, &[&proxy_v2(0, None)[..], HEALTHZ].concat());
    assert!(r.sent(&mut h).starts_with("HTTP/1.1 200"));
    assert_eq!(h.client(), Some(ip("127.0.0.1")));
    // No header at all is fine too.
    let mut p = r.from("127.0.0.2");
    r.feed(&mut p, POLL);
    assert!(r.sent(&mut p).starts_with("HTTP/1.1 404"));
    assert_eq!(p.client(), Some(ip("127.0.0.2")));
    for c in [a, again, b, c, h, p] {
        r.close(c);
    }
    assert!(r.clients().is_empty());
}

#[test]
fn a_malformed_proxy_header_is_a_400_and_the_close() {
    let mut r = rig(|c| c.server.trusted_proxies = vec!["::1".into(), "127.0.0.1".into()]);
    let mut header = proxy_v2(1, Some(ip("203.0.113.7")));
    header[12] = 0x11;
    let mut c = r.from("::1");
    r.feed(&mut c, &[&header[..], POLL].concat());
    let out = r.sent(&mut c);
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    assert!(
        out.ends_with("{\"error\":\"malformed PROXY protocol header: version 1, not 2\"}"),
        "{out}"
    );
    assert!(c.closing().is_some());
    // With no limit on, the header is still read (and its client not kept).
    let mut ok = r.from("::ffff:127.0.0.1");
    r.feed(
        &mut ok,
        &[&proxy_v2(1, Some(ip("203.0.113.7")))[..], POLL].concat(),
    );
    assert!(r.sent(&mut ok).starts_with("HTTP/1.1 404"));
    assert_eq!(ok.client(), None);
}

#[test]
fn x_forwarded_for_names_the_client_from_a_trusted_peer_only() {
    let mut r = rig(|c| {
        c.server.trusted_proxies = vec!["10.0.0.0/8".into()];
        c.limits.requests_per_s_per_ip = 1;
        c.limits.requests_burst_per_ip = 1;
    });
    let from = |who: &str| {
        format!(
            "GET /v1/boxes/a HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 192.0.2.200, {who}\r\n\r\n"
        )
    };
    // Through the proxy: one budget per named client, on one connection.
    let mut p = r.from("10.1.2.3");
    for who in ["198.51.100.1", "198.51.100.2", "198.51.100.1"] {
        r.feed(&mut p, from(who).as_bytes());
    }
    let out = r.sent(&mut p);
    assert_eq!(statuses(&out), ["404", "404", "429"], "{out}");
    assert_eq!(p.client(), Some(ip("198.51.100.1")));
    // A request without the field is the proxy's own.
    r.feed(&mut p, POLL);
    assert!(r.sent(&mut p).starts_with("HTTP/1.1 404"));
    assert_eq!(p.client(), Some(ip("10.1.2.3")));
    // From anyone else the field is ignored: one budget, the peer's.
    let mut d = r.from("192.0.2.50");
    r.feed(&mut d, from("198.51.100.3").as_bytes());
    r.feed(&mut d, from("198.51.100.4").as_bytes());
    let out = r.sent(&mut d);
    assert_eq!(statuses(&out), ["404", "429"], "{out}");
    assert_eq!(d.client(), Some(ip("192.0.2.50")));
}

#[test]
fn a_proxy_moves_a_connection_between_clients_counts() {
    let mut r = rig(|c| {
        c.server.trusted_proxies = vec!["10.0.0.1".into()];
        c.limits.max_connections_per_ip = 1;
    });
    let from = |who: &str| {
        format!("GET /v1/boxes/a HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: {who}\r\n\r\n")
    };
    let mut p = r.from("10.0.0.1");
    r.feed(&mut p, from("198.51.100.1").as_bytes());
    let mut q = r.from("10.0.0.1");
    r.feed(&mut q, from("198.51.100.2").as_bytes());
    // p now carries .2's request: .2 has q already.
    r.feed(&mut p, from("198.51.100.2").as_bytes());
    let out = r.sent(&mut p);
    assert_eq!(statuses(&out), ["404", "429"], "{out}");
    assert!(out.contains("Connection: close\r\n"));
    // q moves to .1, whose count p gave back.
    r.feed(&mut q, from("198.51.100.1").as_bytes());
    assert_eq!(statuses(&r.sent(&mut q)), ["404", "404"]);
    assert_eq!(q.client(), Some(ip("198.51.100.1")));
    r.close(p);
    r.close(q);
    assert!(r.clients().is_empty());
}

fn statuses(out: &str) -> Vec<&str> {
    out.match_indices("HTTP/1.1 ")
        .map(|(i, _)| &out[i + 9..i + 12])
        .collect()
}
