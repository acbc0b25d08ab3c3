//! A connection's life through failures: the requests in flight counted as
//! errors, the socket dropped, a reconnect after a back-off, the connect
//! finished or failed.
//!
//! What it is not: what a connection holds (`connection`), the sending and
//! reading of requests (`driver`).

use std::io;

use mio::net::TcpStream;
use mio::{Interest, Token};

use super::connection::State;
use super::driver::Driver;
use crate::stats::ErrorKind;

/// Wait before reconnecting after a failed connect.
const RECONNECT_BACKOFF_NS: u64 = 100_000_000;

impl Driver<'_> {
    /// Counts connection `i`'s unanswered requests as `kind` errors and drops it;
    /// it reconnects after `backoff` (if the run is still on).
    pub(super) fn fail(&mut self, i: usize, kind: ErrorKind, now: u64, backoff: u64) {
        self.fail_inflight(i, kind);
        let c = &mut self.conns[i];
        if let Some(mut stream) = c.stream.take() {
            let _ = self.poll.registry().deregister(&mut stream);
        }
        c.out.clear();
        c.out_pos = 0;
        c.want_write = false;
        c.in_start = 0;
        c.in_end = 0;
        let retry_at = now + backoff;
        c.state = State::Down { retry_at };
        if now < self.plan.end_ns {
            self.schedule(i, retry_at);
        }
    }

    pub(super) fn fail_inflight(&mut self, i: usize, kind: ErrorKind) {
        let warmup_ns = self.plan.warmup_ns;
        while let Some(request) = self.conns[i].inflight.pop_front() {
            let stats = self.stats.op(request.op);
            stats.unanswered += 1;
            if request.intended >= warmup_ns {
                stats.errors[kind as usize] += 1;
                self.tally.errors += 1;
            }
        }
    }

    pub(super) fn reconnect(&mut self, i: usize, now: u64) {
        if now >= self.plan.end_ns {
            return;
        }
        let attempt = TcpStream::connect(self.plan.addr).and_then(|mut stream| {
            self.poll.registry().register(
                &mut stream,
                Token(i),
                Interest::READABLE | Interest::WRITABLE,
            )?;
            Ok(stream)
        });
        match attempt {
            Ok(stream) => {
                let c = &mut self.conns[i];
                c.stream = Some(stream);
                c.state = State::Connecting;
            }
            Err(_) => self.connect_failed(i, now),
        }
    }

    pub(super) fn finish_connect(&mut self, i: usize, now: u64) {
        let Some(stream) = self.conns[i].stream.as_mut() else {
            return;
        };
        match stream.take_error() {
            Ok(None) => {}
            Ok(Some(_)) | Err(_) => return self.connect_failed(i, now),
        }
        match stream.peer_addr() {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotConnected => return, // still going
            Err(_) => return self.connect_failed(i, now),
        }
        let _ = stream.set_nodelay(true);
        if self
            .poll
            .registry()
            .reregister(stream, Token(i), Interest::READABLE)
            .is_err()
        {
            return self.connect_failed(i, now);
        }
        self.conns[i].state = State::Open;
        self.pump(i, now);
    }

    pub(super) fn connect_failed(&mut self, i: usize, now: u64) {
        if now >= self.plan.warmup_ns {
            self.stats.connection_errors[ErrorKind::Connect as usize] += 1;
            self.tally.errors += 1;
        }
        self.fail(i, ErrorKind::Connect, now, RECONNECT_BACKOFF_NS);
    }
}
