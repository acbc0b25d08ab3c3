//! Who a connection's requests come from, and the per-client limits
//! (docs/private-boxes.md#per-client-limits): connections, held requests
//! (event streams and parked long-polls) and a request rate, each counted
//! per client address and answered 429 past its limit.
//!
//! The client is the socket's peer; for a peer in `server.trusted_proxies`,
//! the address its PROXY protocol v2 header names ([`proxy`]), or else the
//! last `X-Forwarded-For` hop of each request ([`forwarded`]). The table of
//! clients ([`table`]) is shared by every worker; what a connection knows of
//! its client, and what each of its requests may do, is [`admission`].
//!
//! What it is not: a firewall. A client refused is still read and answered;
//! the limits keep one client from taking what others need.

pub mod admission;
pub mod cidr;
pub mod forwarded;
pub mod proxy;
pub mod table;

pub use admission::{Admission, Admit};
pub use cidr::{canonical, Cidr, TrustedProxies};
pub use forwarded::last_forwarded_hop;
pub use proxy::{parse_proxy_header, ProxyError, ProxyHeader};
pub use table::{Client, ClientLimits, ClientTable, Seat};

/// The limit a refusal is for: the `limit` label of
/// `pollbox_limit_refused_total` and the key its answer names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// `max_connections_per_ip` (the connection is closed after the answer).
    Connections,
    /// `max_streams_per_ip`.
    Streams,
    /// `requests_per_s_per_ip` / `requests_burst_per_ip`.
    Requests,
}

impl Limit {
    pub const ALL: [Limit; 3] = [Limit::Connections, Limit::Streams, Limit::Requests];

    pub fn index(self) -> usize {
        self as usize
    }

    /// The metric's label.
    pub fn label(self) -> &'static str {
        match self {
            Limit::Connections => "connections",
            Limit::Streams => "streams",
            Limit::Requests => "requests",
        }
    }

    /// The config key, as the answer names it.
    pub fn key(self) -> &'static str {
        match self {
            Limit::Connections => "max_connections_per_ip",
            Limit::Streams => "max_streams_per_ip",
            Limit::Requests => "requests_per_s_per_ip",
        }
    }

    /// The answer's `error`.
    pub fn message(self) -> &'static str {
        match self {
            Limit::Connections => "too many connections",
            Limit::Streams => "too many streams",
            Limit::Requests => "too many requests",
        }
    }
}

/// A request a per-client limit refuses: 429 with `Retry-After`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub limit: Limit,
    /// Whole seconds, at least 1.
    pub retry_after_s: u64,
}
