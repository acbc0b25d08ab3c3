//! `server.trusted_proxies`: address blocks (CIDRs) whose connections may
//! name the client they carry.

use std::net::IpAddr;

/// One address block: `10.0.0.0/8`, `fd00::/8`, or a bare address (one host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    /// The block's first address (no bit set past the prefix).
    net: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parse one entry; the error says what is wrong with it (the caller
    /// names the key).
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let net: IpAddr = addr.parse().map_err(|_| {
            format!("`{s}` is not an address or a CIDR (like 10.0.0.0/8, 127.0.0.1 or fd00::/8)")
        })?;
        let bits = match net {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        let prefix = match prefix {
            None => bits,
            Some(p) => match p.parse::<u8>() {
                Ok(n) if n <= bits && !p.starts_with('+') => n,
                _ => {
                    return Err(format!(
                        "`{s}`: the prefix length must be 0 to {bits} for this address"
                    ))
                }
            },
        };
        let cidr = Cidr { net, prefix };
        if cidr.masked(net) != net {
            return Err(format!(
                "`{s}` has bits set past its /{prefix} prefix: write {}/{prefix}",
                cidr.masked(net)
            ));
        }
        Ok(cidr)
    }

    /// Whether `ip` is in the block. An IPv4 block holds IPv4 addresses only;
    /// callers hand IPv4-mapped IPv6 addresses in as IPv4 ([`canonical`]).
    pub fn contains(&self, ip: IpAddr) -> bool {
        matches!(
            (self.net, ip),
            (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_))
        ) && self.masked(ip) == self.net
    }

    /// `ip` with the bits past the prefix cleared (same family as `ip`).
    fn masked(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(a) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V4((u32::from(a) & mask).into())
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V6((u128::from(a) & mask).into())
            }
        }
    }
}

/// The address a client is counted as: an IPv4-mapped IPv6 address
/// (`::ffff:192.0.2.1`, what a dual-stack socket reports) is its IPv4 one.
#[inline]
pub fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// `server.trusted_proxies`, parsed.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Vec<Cidr>);

impl TrustedProxies {
    /// From the config's entries (checked by `Config::validate`: an entry
    /// that does not parse is not there).
    pub fn new(entries: &[String]) -> TrustedProxies {
        TrustedProxies(entries.iter().filter_map(|e| Cidr::parse(e).ok()).collect())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether a connection from `peer` may name its client.
    pub fn trusts(&self, peer: IpAddr) -> bool {
        let peer = canonical(peer);
        self.0.iter().any(|c| c.contains(peer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn blocks_hold_their_addresses_only() {
        let c = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(c.contains(ip("10.1.0.0")));
        assert!(c.contains(ip("10.1.255.255")));
        assert!(!c.contains(ip("10.2.0.1")));
        assert!(!c.contains(ip("::ffff:10.1.0.1")), "callers canonicalise");
        let host = Cidr::parse("127.0.0.1").unwrap();
        assert!(host.contains(ip("127.0.0.1")));
        assert!(!host.contains(ip("127.0.0.2")));
        let all = Cidr::parse("0.0.0.0/0").unwrap();
        assert!(all.contains(ip("203.0.113.9")));
        assert!(!all.contains(ip("::1")));
        let v6 = Cidr::parse("fd00::/8").unwrap();
        assert!(v6.contains(ip("fd12:3456::1")));
        assert!(!v6.contains(ip("fe80::1")));
        assert!(!v6.contains(ip("10.0.0.1")));
        assert!(Cidr::parse("::/0").unwrap().contains(ip("2001:db8::1")));
        assert!(Cidr::parse("::1/128").unwrap().contains(ip("::1")));
    }

    #[test]
    fn bad_entries_say_what_is_wrong() {
        for (entry, says) in [
            ("10.0.0.0/33", "0 to 32"),
            ("fd00::/129", "0 to 128"),
            ("10.0.0.0/-1", "0 to 32"),
            ("10.0.0.0/+8", "0 to 32"),
            ("10.0.0.0/", "0 to 32"),
            ("10.0.0.1/8", "write 10.0.0.0/8"),
            ("fd00::1/8", "write fd00::/8"),
            ("localhost", "not an address"),
            ("10.0.0.0/8/8", "0 to 32"),
            ("", "not an address"),
            ("[::1]", "not an address"),
        ] {
            let e = Cidr::parse(entry).unwrap_err();
            assert!(e.contains(says), "{entry}: {e}");
        }
    }

    #[test]
    fn a_mapped_peer_is_trusted_as_its_ipv4_address() {
        let t = TrustedProxies::new(&["127.0.0.0/8".into(), "fd00::/8".into()]);
        assert!(t.trusts(ip("127.0.0.1")));
        assert!(t.trusts(ip("::ffff:127.0.0.1")));
        assert!(t.trusts(ip("fd00::5")));
        assert!(!t.trusts(ip("192.0.2.1")));
        assert!(!t.trusts(ip("::1")));
        assert!(TrustedProxies::new(&[]).is_empty());
    }
}
