//! New connections: accepted from this worker's listeners or handed over
//! by another worker ([`crate::placement`]), served, or refused (shutting
//! down, over a limit) with a 503.

use super::conns::Conn;
use super::{conn_token, Worker, PROBE_RESERVE};
use crate::stats::Rejected;
use mio::net::TcpStream;
use mio::Interest;
use pollbox_core::conn::Connection;
use pollbox_core::service::Listener;
use std::io::{self, Write};

impl Worker {
    pub(super) fn accept(&mut self, listener: Listener) {
        loop {
            let l = match listener {
                Listener::Main => self.sockets.listener.as_ref(),
                Listener::Metrics => self.sockets.metrics_listener.as_ref(),
                Listener::Probes => None,
            };
            let Some(l) = l else {
                return;
            };
            let (mut stream, _) = match l.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of fds and the like: log once per burst and retry on the next event.
                    eprintln!("pollbox: worker {}: accept failed: {e}", self.id);
                    return;
                }
            };
            if listener == Listener::Main
                && self.host.shared().node().config.server.place_by_load
                && !self.host.shared().lifecycle().is_draining()
            {
                // Served where the load is least (crate::placement).
                let shared = self.host.shared();
                let to = shared.placement().place(self.id, shared.stats());
                if to != self.id {
                    match shared.placement().hand(to, stream) {
                        Ok(()) => continue,
                        Err(s) => stream = s,
                    }
                }
            }
            self.adopt(stream, listener);
        }
    }

    /// Serve a connection accepted here or handed over by another worker, or
    /// refuse it (shutting down, over a limit). Past `max_connections` a
    /// connection of the main listener is still served for its probes
    /// (`/healthz`, `/readyz`: [`Listener::Probes`]), up to
    /// [`PROBE_RESERVE`] of them; the metrics listener is never capped.
    pub(super) fn adopt(&mut self, mut stream: TcpStream, mut listener: Listener) {
        if self.host.shared().lifecycle().is_draining() {
            // Shutting down: say so, so a load balancer retries elsewhere.
            self.host.stats().rejected(Rejected::Draining);
            self.refuse(&mut stream, "shutting down");
            return;
        }
        if self.buffered() >= self.buffers.budget() {
            // This worker's share of max_buffered_bytes is used up.
            self.host.stats().rejected(Rejected::MaxBufferedBytes);
            self.refuse(&mut stream, "server buffers full (max_buffered_bytes)");
            return;
        }
        let shared = self.host.shared();
        let open = shared.connection_opened();
        let cap = shared.node().config.limits.max_connections;
        if listener == Listener::Main && open >= cap {
            if open >= cap.saturating_add(PROBE_RESERVE) {
                shared.connection_closed();
                self.host.stats().rejected(Rejected::MaxConnections);
                self.refuse(&mut stream, "too many connections");
                return;
            }
            listener = Listener::Probes;
        }
        let _ = stream.set_nodelay(true);
        let (slot, gen) = self.sockets.conns.vacant();
        if let Err(e) = self.sockets.poll.registry().register(
            &mut stream,
            conn_token(slot, gen),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            eprintln!("pollbox: worker {}: register failed: {e}", self.id);
            self.host.shared().connection_closed();
            self.sockets.conns.release(slot);
            return;
        }
        // Its client (the per-client limits): the peer, or whom a trusted
        // proxy names. A socket already disconnected has no peer, and no
        // request to limit.
        let core = match stream.peer_addr() {
            Ok(peer) => {
                Connection::from_peer(self.clocks.now_ms, listener, peer.ip(), &self.service)
            }
            Err(_) => Connection::new(self.clocks.now_ms, listener, &self.service),
        };
        let st = self.host.stats();
        st.connections_total.inc();
        st.connections_open.inc();
        self.settle(slot, Box::new(Conn::new(stream, core, gen)));
    }

    /// Answer 503 to a connection over the cap, best effort, and drop it.
    pub(super) fn refuse(&mut self, stream: &mut TcpStream, what: &str) {
        let mut out = std::mem::take(&mut self.scratch.refusal);
        out.clear();
        self.timed(|cx| cx.service.closing_error(503, what, &mut out, cx.host));
        let _ = stream.write(&out);
        let _ = stream.shutdown(std::net::Shutdown::Write);
        self.scratch.refusal = out;
    }
}
