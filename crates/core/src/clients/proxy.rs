//! The PROXY protocol, version 2 (HAProxy's `proxy-protocol.txt`, section
//! 2.2): the binary header a proxy sends at the start of a connection to say
//! whose connection it relays. Bytes in, what they say out.
//!
//! ```text
//! 12 bytes  signature  \r\n\r\n\0\r\nQUIT\n
//!  1 byte   version (high nibble, 2) and command (low: 0 LOCAL, 1 PROXY)
//!  1 byte   family (high: 0 UNSPEC, 1 INET, 2 INET6, 3 UNIX) and
//!           transport (low: 0 UNSPEC, 1 STREAM, 2 DGRAM)
//!  2 bytes  length of what follows, big-endian
//!  ...      addresses (INET: 4+4+2+2 bytes, INET6: 16+16+2+2, UNIX: 108+108),
//!           then TLVs, skipped
//! ```
//!
//! Only a connection from `server.trusted_proxies` is looked at: from anyone
//! else the signature is not a header but a request line that is not one (400).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The signature every version 2 header starts with. No HTTP request starts
/// with it (a NUL is not allowed in a request line), so a connection from a
/// trusted proxy may send one or not.
pub const SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// The longest header taken (addresses and TLVs): HAProxy's TLVs (ALPN,
/// authority, unique id, SSL details) are far shorter.
pub const MAX_PROXY_HEADER: usize = 16 + 1024;

/// What the first bytes of a connection from a trusted proxy are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyHeader {
    /// Not a PROXY v2 header: the bytes are the connection's first request.
    Absent,
    /// Too few bytes to tell, or a header not yet complete.
    Partial,
    /// A header of `len` bytes. `source`: the client it names; `None` for
    /// `LOCAL` (the proxy's own connection, a health check), an `UNSPEC` or
    /// `UNIX` family: the connection is then the proxy's own.
    Complete { len: usize, source: Option<IpAddr> },
}

/// Why a header that starts with the signature is refused (400, then close).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    #[error("malformed PROXY protocol header: version {0}, not 2")]
    Version(u8),
    #[error("malformed PROXY protocol header: unknown command {0}")]
    Command(u8),
    #[error("malformed PROXY protocol header: unknown address family {0}")]
    Family(u8),
    #[error("malformed PROXY protocol header: unknown transport {0}")]
    Transport(u8),
    #[error("malformed PROXY protocol header: {len} bytes of addresses, too short for its family")]
    TooShort { len: usize },
    #[error("malformed PROXY protocol header: {len} bytes, over 1040")]
    TooLong { len: usize },
}

/// Read a PROXY v2 header at the start of `buf` (the connection's first bytes).
pub fn parse_proxy_header(buf: &[u8]) -> Result<ProxyHeader, ProxyError> {
    let seen = buf.len().min(SIGNATURE.len());
    if buf[..seen] != SIGNATURE[..seen] {
        return Ok(ProxyHeader::Absent);
    }
    let Some(fixed) = buf.first_chunk::<16>() else {
        return Ok(ProxyHeader::Partial);
    };
    let (version, command) = (fixed[12] >> 4, fixed[12] & 0x0f);
    let (family, transport) = (fixed[13] >> 4, fixed[13] & 0x0f);
    let body = usize::from(u16::from_be_bytes([fixed[14], fixed[15]]));
    let len = 16 + body;
    if version != 2 {
        return Err(ProxyError::Version(version));
    }
    if command > 1 {
        return Err(ProxyError::Command(command));
    }
    if transport > 2 {
        return Err(ProxyError::Transport(transport));
    }
    let need = match family {
        0 => 0,
        1 => 12,
        2 => 36,
        3 => 216,
        f => return Err(ProxyError::Family(f)),
    };
    if len > MAX_PROXY_HEADER {
        return Err(ProxyError::TooLong { len });
    }
    // A LOCAL header's addresses, if any, are ignored; a PROXY header's must fit.
    if command == 1 && body < need {
        return Err(ProxyError::TooShort { len: body });
    }
    let Some(header) = buf.get(..len) else {
        return Ok(ProxyHeader::Partial);
    };
    let addrs = &header[16..];
    let source = match (command, family) {
        (1, 1) => {
            let mut a = [0u8; 4];
            a.copy_from_slice(&addrs[..4]);
            Some(IpAddr::V4(Ipv4Addr::from(a)))
        }
        (1, 2) => {
            let mut a = [0u8; 16];
            a.copy_from_slice(&addrs[..16]);
            Some(IpAddr::V6(Ipv6Addr::from(a)))
        }
        _ => None,
    };
    Ok(ProxyHeader::Complete { len, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header as HAProxy writes it: `command`, `family_transport`, the
    /// addresses and TLVs in `rest`.
    fn header(command: u8, family_transport: u8, rest: &[u8]) -> Vec<u8> {
        let mut h = SIGNATURE.to_vec();
        h.push(0x20 | command);
        h.push(family_transport);
        h.extend_from_slice(&(rest.len() as u16).to_be_bytes());
        h.extend_from_slice(rest);
        h
    }

    fn tcp4(src: [u8; 4]) -> Vec<u8> {
        let mut rest = src.to_vec();
        rest.extend_from_slice(&[10, 0, 0, 2]);
        rest.extend_from_slice(&40000u16.to_be_bytes());
        rest.extend_from_slice(&8080u16.to_be_bytes());
        header(1, 0x11, &rest)
    }

    #[test]
    fn a_tcp4_header_names_its_source() {
        let mut bytes = tcp4([203, 0, 113, 7]);
        let len = bytes.len();
        bytes.extend_from_slice(b"GET /healthz HTTP/1.1\r\n\r\n");
        assert_eq!(
            parse_proxy_header(&bytes),
            Ok(ProxyHeader::Complete {
                len,
                source: Some("203.0.113.7".parse().unwrap()),
            })
        );
        assert_eq!(len, 28);
    }

    #[test]
    fn a_tcp6_header_with_tlvs_names_its_source_and_skips_them() {
        let src: Ipv6Addr = "2001:db8::42".parse().unwrap();
        let mut rest = src.octets().to_vec();
        rest.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
        rest.extend_from_slice(&[0x9c, 0x40, 0x1f, 0x90]);
        // PP2_TYPE_ALPN "h2", PP2_TYPE_UNIQUE_ID of 4 bytes.
        rest.extend_from_slice(&[0x01, 0x00, 0x02, b'h', b'2', 0x05, 0x00, 0x04, 1, 2, 3, 4]);
        let bytes = header(1, 0x21, &rest);
        assert_eq!(
            parse_proxy_header(&bytes),
            Ok(ProxyHeader::Complete {
                len: bytes.len(),
                source: Some(IpAddr::V6(src)),
            })
        );
    }

    #[test]
    fn local_unspec_and_unix_name_no_client() {
        // LOCAL (a health check), with and without addresses.
        for bytes in [header(0, 0x00, &[]), {
            let mut h = tcp4([1, 2, 3, 4]);
            h[12] = 0x20;
            h
        }] {
            assert_eq!(
                parse_proxy_header(&bytes),
                Ok(ProxyHeader::Complete {
                    len: bytes.len(),
                    source: None
                })
            );
        }
        let unspec = header(1, 0x00, &[]);
        assert_eq!(
            parse_proxy_header(&unspec),
            Ok(ProxyHeader::Complete {
                len: 16,
                source: None
            })
        );
        let unix = header(1, 0x31, &[0u8; 216]);
        assert_eq!(
            parse_proxy_header(&unix),
            Ok(ProxyHeader::Complete {
                len: 232,
                source: None
            })
        );
    }

    #[test]
    fn every_prefix_of_a_header_waits_for_more() {
        let bytes = tcp4([198, 51, 100, 1]);
        for cut in 0..bytes.len() {
            assert_eq!(
                parse_proxy_header(&bytes[..cut]),
                Ok(ProxyHeader::Partial),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn http_is_not_a_header() {
        for bytes in [
            &b"GET / HTTP/1.1\r\n"[..],
            b"\r\nGET / HTTP/1.1\r\n",
            b"\r\n\r\nG",
            b"\r\n\r\n\0\r\nQUIX\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n",
        ] {
            assert_eq!(
                parse_proxy_header(bytes),
                Ok(ProxyHeader::Absent),
                "{bytes:?}"
            );
        }
    }

    #[test]
    fn malformed_headers_say_what_is_wrong() {
        let mut v1 = tcp4([1, 2, 3, 4]);
        v1[12] = 0x11;
        let mut command = tcp4([1, 2, 3, 4]);
        command[12] = 0x22;
        let mut family = tcp4([1, 2, 3, 4]);
        family[13] = 0x41;
        let mut transport = tcp4([1, 2, 3, 4]);
        transport[13] = 0x13;
        let short = header(1, 0x21, &[0u8; 12]);
        let mut long = header(1, 0x11, &[0u8; 12]);
        long[14..16].copy_from_slice(&2000u16.to_be_bytes());
        for (bytes, want, says) in [
            (v1, ProxyError::Version(1), "version 1"),
            (command, ProxyError::Command(2), "command 2"),
            (family, ProxyError::Family(4), "family 4"),
            (transport, ProxyError::Transport(3), "transport 3"),
            (short, ProxyError::TooShort { len: 12 }, "too short"),
            (long, ProxyError::TooLong { len: 2016 }, "2016 bytes"),
        ] {
            // Known as soon as the fixed 16 bytes are in.
            assert_eq!(parse_proxy_header(&bytes[..16]), Err(want));
            assert_eq!(parse_proxy_header(&bytes), Err(want));
            assert!(want.to_string().contains(says), "{want}");
            assert!(want
                .to_string()
                .starts_with("malformed PROXY protocol header"));
        }
    }

    proptest::proptest! {
        /// Any bytes after the signature: an answer, never a panic; and a
        /// header found is never longer than the bytes.
        #[test]
        fn any_bytes_after_the_signature(rest in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            let mut bytes = SIGNATURE.to_vec();
            bytes.extend_from_slice(&rest);
            if let Ok(ProxyHeader::Complete { len, .. }) = parse_proxy_header(&bytes) {
                proptest::prop_assert!(len <= bytes.len());
            }
        }

        /// A valid header followed by anything is read the same, and names
        /// its source.
        #[test]
        fn a_header_then_anything(src in proptest::num::u32::ANY, tail in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let mut bytes = tcp4(src.to_be_bytes());
            bytes.extend_from_slice(&tail);
            proptest::prop_assert_eq!(
                parse_proxy_header(&bytes),
                Ok(ProxyHeader::Complete {
                    len: 28,
                    source: Some(IpAddr::V4(Ipv4Addr::from(src))),
                })
            );
        }
    }

    #[test]
    fn any_bytes_give_an_answer_never_a_panic() {
        // Every short input over a few alphabets that matter.
        let alphabet = [0u8, 0x0a, 0x0d, 0x21, 0x11, 0x20, 0xff, b'Q'];
        let mut bytes = SIGNATURE.to_vec();
        for a in alphabet {
            for b in alphabet {
                for c in alphabet {
                    bytes.truncate(12);
                    bytes.extend_from_slice(&[a, b, 0, c]);
                    let _ = parse_proxy_header(&bytes);
                    let _ = parse_proxy_header(&bytes[..13]);
                }
            }
        }
    }
}
