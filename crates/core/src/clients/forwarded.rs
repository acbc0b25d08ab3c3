//! `X-Forwarded-For`: the client a trusted proxy names in a request's head.
//! Only the last hop counts (the one the trusted proxy appended); what came
//! before it was written by whoever sent the request and proves nothing.

use std::net::{IpAddr, SocketAddr};

/// The last hop of the last `X-Forwarded-For` field of a complete request
/// head (`head`: the request line, the header lines and the blank line, as
/// the framer accepted them). `None` when there is no such field or its last
/// hop is not an address (`unknown`, an obfuscated name): the request is
/// then the proxy's own. A hop may carry a port (`192.0.2.1:4711`,
/// `[2001:db8::1]:4711`) or brackets, which are dropped.
pub fn last_forwarded_hop(head: &[u8]) -> Option<IpAddr> {
    const NAME: &[u8] = b"x-forwarded-for:";
    let mut last = None;
    // Header lines start after a CRLF; the request line never matches.
    let mut lines = head.split(|&b| b == b'\n').skip(1);
    for line in &mut lines {
        if line.len() > NAME.len() && line[..NAME.len()].eq_ignore_ascii_case(NAME) {
            last = Some(&line[NAME.len()..]);
        }
    }
    let value = last?;
    let hop = value.rsplit(|&b| b == b',').next()?;
    let hop = std::str::from_utf8(hop)
        .ok()?
        .trim_matches([' ', '\t', '\r']);
    parse_hop(hop).map(|ip| ip.to_canonical())
}

fn parse_hop(hop: &str) -> Option<IpAddr> {
    if let Ok(ip) = hop.parse() {
        return Some(ip);
    }
    if let Ok(sa) = hop.parse::<SocketAddr>() {
        return Some(sa.ip());
    }
    hop.strip_prefix('[')?.strip_suffix(']')?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hop(head: &str) -> Option<String> {
        last_forwarded_hop(head.as_bytes()).map(|ip| ip.to_string())
    }

    #[test]
    fn the_last_hop_of_the_last_field_names_the_client() {
        let head = "GET /v1/boxes/a HTTP/1.1\r\nHost: x\r\n\
                    X-Forwarded-For: 198.51.100.1, 203.0.113.9\r\n\r\n";
        assert_eq!(hop(head).as_deref(), Some("203.0.113.9"));
        let two = "GET / HTTP/1.1\r\nx-forwarded-for: 10.9.9.9\r\nHost: x\r\n\
                   X-FORWARDED-FOR:192.0.2.5 \r\n\r\n";
        assert_eq!(hop(two).as_deref(), Some("192.0.2.5"));
        let v6 = "GET / HTTP/1.1\r\nX-Forwarded-For: 1.1.1.1,2001:db8::7\r\n\r\n";
        assert_eq!(hop(v6).as_deref(), Some("2001:db8::7"));
    }

    #[test]
    fn ports_brackets_and_mapped_addresses_are_dropped() {
        for (value, want) in [
            ("192.0.2.1:4711", "192.0.2.1"),
            ("[2001:db8::1]:4711", "2001:db8::1"),
            ("[2001:db8::1]", "2001:db8::1"),
            ("::ffff:192.0.2.1", "192.0.2.1"),
            ("\t192.0.2.9\t", "192.0.2.9"),
        ] {
            let head = format!("GET / HTTP/1.1\r\nX-Forwarded-For: {value}\r\n\r\n");
            assert_eq!(hop(&head).as_deref(), Some(want), "{value}");
        }
    }

    #[test]
    fn no_field_or_no_address_names_nobody() {
        for head in [
            "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET / HTTP/1.1\r\nX-Forwarded-For: unknown\r\n\r\n",
            "GET / HTTP/1.1\r\nX-Forwarded-For: 192.0.2.1, _hidden\r\n\r\n",
            "GET / HTTP/1.1\r\nX-Forwarded-For:\r\n\r\n",
            "GET / HTTP/1.1\r\nX-Forwarded-For-Not: 192.0.2.1\r\n\r\n",
            "GET /X-Forwarded-For:192.0.2.1 HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nX-Real-IP: 192.0.2.1\r\n\r\n",
        ] {
            assert_eq!(hop(head), None, "{head:?}");
        }
    }
}
