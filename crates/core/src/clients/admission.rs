//! What one connection knows of its client, and what the per-client limits
//! let each of its requests do.
//!
//! - A peer not in `server.trusted_proxies` is the client, known (and its
//!   connection counted) when the connection opens.
//! - A trusted peer may start the connection with a PROXY v2 header: the
//!   client it names is known, and counted, once the header is read.
//! - A trusted peer that sends none (or a `LOCAL` one, or one without an IP
//!   address) names the client of each request in `X-Forwarded-For`, else the
//!   request is the proxy's own: the connection is counted against the client
//!   of its latest request (a proxy that reuses a connection for another
//!   client moves it to that client's count).
//!
//! A connection over `max_connections_per_ip` is served its probes only
//! (`/healthz`, `/readyz`, then close), as one past `max_connections` is;
//! any other request is answered 429 and the connection closed. Probes are
//! never refused by a client limit, nor counted as held.

use super::proxy::{parse_proxy_header, ProxyError, ProxyHeader};
use super::table::{ClientLimits, ClientTable, Seat, RETRY_HELD_S};
use super::{canonical, last_forwarded_hop, Limit, Refusal, TrustedProxies};
use crate::http::wants_event_stream;
use crate::http::{Frame, Method};
use std::net::IpAddr;

/// What a request may do ([`Admission::admit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Answer it.
    Serve,
    /// Answer it; one of the client's held requests was taken for it: give
    /// it back ([`Admission::unhold`]) unless the answer holds the request.
    Held,
    /// A probe on a connection over its client's cap: answer it, then close.
    ProbeThenClose,
    /// Answer 429; `close`: then close the connection.
    Refuse { refusal: Refusal, close: bool },
}

/// A connection's client and what it holds of the client's limits.
#[derive(Debug, Default)]
pub struct Admission {
    /// The socket's peer (`None`: not known; nothing is limited).
    peer: Option<IpAddr>,
    /// The peer is a trusted proxy and nothing was read yet: a PROXY v2
    /// header may come first.
    proxy_header: bool,
    /// Each request names its client (`X-Forwarded-For`).
    per_request: bool,
    /// The per-client limits apply to this connection's requests.
    limited: bool,
    /// The limits (the table's, copied: the common request reads them here).
    limits: ClientLimits,
    /// The client the connection is counted against, when it is fixed (the
    /// peer, or named by a PROXY header): the common request needs only this.
    seat: Option<Seat>,
    /// The client of the latest request, when each request names its own.
    named: Option<Seat>,
    /// Over `max_connections_per_ip`: probes only.
    over_cap: bool,
    /// One of the client's held requests is this connection's (an event
    /// stream, a parked long-poll, or a request that may become one).
    holding: bool,
}

impl Admission {
    /// A connection from `peer`. `limited`: the per-client limits are on and
    /// apply to its listener (the main one).
    pub fn new(
        peer: IpAddr,
        limited: bool,
        trusted: &TrustedProxies,
        table: &ClientTable,
    ) -> Admission {
        let peer = canonical(peer);
        let mut a = Admission {
            peer: Some(peer),
            proxy_header: trusted.trusts(peer),
            limited,
            limits: *table.limits(),
            ..Admission::default()
        };
        if limited && !a.proxy_header {
            a.sit(peer, table);
        }
        a
    }

    /// Count the connection against `addr`, or mark it over the cap.
    fn sit(&mut self, addr: IpAddr, table: &ClientTable) {
        match table.enter(addr) {
            Ok(seat) if self.per_request => {
                self.named = Some(seat);
                self.over_cap = false;
            }
            Ok(seat) => {
                self.seat = Some(seat);
                self.over_cap = false;
            }
            Err(_) => self.over_cap = true,
        }
    }

    /// The client the connection is counted against now.
    fn current(&self) -> Option<&Seat> {
        self.seat.as_ref().or(self.named.as_ref())
    }

    /// Whether the connection's first bytes may be a PROXY v2 header.
    #[inline]
    pub fn awaits_proxy_header(&self) -> bool {
        self.proxy_header
    }

    /// The connection's first bytes, from a trusted proxy: how many of them
    /// are a PROXY v2 header (0: none came), or `None` while too few are in
    /// to tell. A malformed header is an error (400, then close).
    pub fn take_proxy_header(
        &mut self,
        buf: &[u8],
        table: &ClientTable,
    ) -> Result<Option<usize>, ProxyError> {
        let (len, source) = match parse_proxy_header(buf)? {
            ProxyHeader::Partial => return Ok(None),
            ProxyHeader::Absent => (0, None),
            ProxyHeader::Complete { len, source } => (len, source),
        };
        self.proxy_header = false;
        match source {
            Some(client) if self.limited => self.sit(canonical(client), table),
            Some(_) => {}
            None => self.per_request = true,
        }
        Ok(Some(len))
    }

    /// Whether the per-client limits apply to this connection's requests
    /// ([`Admission::admit_common`], then [`Admission::admit`] unless it took
    /// the request, is then called for each).
    #[inline]
    pub fn limited(&self) -> bool {
        self.limited
    }

    /// Over `max_connections_per_ip`: served its probes only, until its probe
    /// deadline.
    pub fn over_cap(&self) -> bool {
        self.over_cap
    }

    /// The client the connection is counted against, once known.
    pub fn client(&self) -> Option<IpAddr> {
        self.current().map(Seat::addr)
    }

    /// The common request, inlined where the connection answers: a fixed
    /// client under its connection cap, a request that cannot be held, and
    /// (with a rate limit) a request in the bucket, taken: one
    /// compare-and-swap (callgrind: 28 instructions a pipelined poll with
    /// every limit on, of ~1,700). `false`: nothing was taken; ask
    /// [`Admission::admit`]. A probe takes a request from the bucket when
    /// there is one, and is answered when there is none.
    #[inline]
    pub fn admit_common(&mut self, frame: &Frame, now_ms: u64) -> bool {
        let Some(seat) = &self.seat else {
            return false;
        };
        let l = &self.limits;
        !(l.streams > 0 && may_be_held(frame))
            && (!l.rate_limited() || seat.client().try_take_request(l, now_ms * 1000))
    }

    /// What the complete request `frame` (its ranges index `buf`) may do at
    /// `now_us` (the server's clock), when [`Admission::admit_common`] did not
    /// take it: a client not yet known or over its cap, a bucket found empty,
    /// a request that may be held (an event stream, a long-poll: one of the
    /// client's held requests is taken for it, [`Admit::Held`]), a request of
    /// a client a proxy names (`X-Forwarded-For`).
    pub fn admit(&mut self, frame: &Frame, buf: &[u8], table: &ClientTable, now_us: u64) -> Admit {
        if self.per_request {
            if let Some(peer) = self.peer {
                let head = buf.get(..frame.body.start).unwrap_or_default();
                let named = last_forwarded_hop(head).unwrap_or(peer);
                if self.client() != Some(named) {
                    // Nothing is held between requests: a held one ends first.
                    self.unhold();
                    if let Some(old) = self.named.take() {
                        table.leave(old, now_us);
                    }
                    self.sit(named, table);
                }
            }
        }
        let probe = is_probe(frame, buf);
        if self.over_cap {
            if probe {
                return Admit::ProbeThenClose;
            }
            let refusal = Refusal {
                limit: Limit::Connections,
                retry_after_s: RETRY_HELD_S,
            };
            return Admit::Refuse {
                refusal,
                close: true,
            };
        }
        let Some(seat) = self.current() else {
            return Admit::Serve;
        };
        if probe {
            return Admit::Serve;
        }
        let limits = table.limits();
        if limits.rate_limited() {
            if let Err(refusal) = seat.client().take_request(limits, now_us) {
                return Admit::Refuse {
                    refusal,
                    close: false,
                };
            }
        }
        if limits.streams > 0 && may_be_held(frame) {
            return self.hold_for(frame, buf);
        }
        Admit::Serve
    }

    /// A request that may be held, its token taken: take one of the client's
    /// held requests for it, unless it will not be held after all.
    #[inline(never)]
    fn hold_for(&mut self, frame: &Frame, buf: &[u8]) -> Admit {
        let Some(seat) = self.current() else {
            return Admit::Serve;
        };
        if !may_hold(frame, buf) || is_probe(frame, buf) {
            return Admit::Serve;
        }
        if let Err(refusal) = seat.client().hold(&self.limits) {
            return Admit::Refuse {
                refusal,
                close: false,
            };
        }
        self.holding = true;
        Admit::Held
    }

    /// The held request ended (answered, closed, or it was not held after
    /// all): the client's count goes down.
    #[inline]
    pub fn unhold(&mut self) {
        if std::mem::take(&mut self.holding) {
            if let Some(seat) = self.current() {
                seat.client().unhold();
            }
        }
    }

    /// The connection closed: give back what it held.
    pub fn release(&mut self, table: &ClientTable, now_us: u64) {
        self.unhold();
        for seat in [self.seat.take(), self.named.take()].into_iter().flatten() {
            table.leave(seat, now_us);
        }
    }
}

/// `/healthz` and `/readyz`, whatever the method: never refused by a client limit.
#[inline]
fn is_probe(frame: &Frame, buf: &[u8]) -> bool {
    matches!(buf.get(frame.path.clone()), Some(b"/healthz" | b"/readyz"))
}

/// Whether a request may be held at all: an event stream asks with `Accept`,
/// a long-poll has a query (`wait_ms`); a plain poll has neither and stops here.
#[inline]
fn may_be_held(frame: &Frame) -> bool {
    frame.accept.is_some() || !frame.query.is_empty()
}

/// A request that may be held: an event stream, or a long-poll (`wait_ms`).
fn may_hold(frame: &Frame, buf: &[u8]) -> bool {
    match frame.method {
        Method::Get if wants_event_stream(frame, buf) => true,
        Method::Get | Method::Head => buf
            .get(frame.query.clone())
            .unwrap_or_default()
            .split(|&b| b == b'&')
            .any(|p| p.starts_with(b"wait_ms=")),
        _ => false,
    }
}
