//! The driver of one thread's connections: it renders each request into its
//! connection's reused output buffer, writes what is due in one `write`, reads
//! answers into the reused input buffer, frames them, and counts each verdict.
//!
//! What it is not: the decision of when to send (`pacing`), nor the event loop that
//! calls it (`event_loop`), nor the checks of an answer (`answer_check`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, Read, Write};
use std::time::Instant;

use mio::{Interest, Poll, Token};

use super::answer_check::check;
use super::connection::{Conn, InFlight};
use super::key_sets::etag_id;
use super::{Plan, KEY_SETS};
use crate::mix::Op;
use crate::progress::Tally;
use crate::response::parse_response;
use crate::stats::{ErrorKind, Stats};

pub(super) struct Driver<'p> {
    pub(super) plan: &'p Plan,
    pub(super) origin: Instant,
    pub(super) poll: Poll,
    pub(super) conns: Vec<Conn>,
    /// Pending wake-ups `(due, connection)`; stale entries are skipped when popped.
    pub(super) heap: BinaryHeap<Reverse<(u64, usize)>>,
    pub(super) stats: Stats,
    pub(super) tally: Tally,
}

impl Driver<'_> {
    #[inline]
    pub(super) fn now(&self) -> u64 {
        Instant::now()
            .saturating_duration_since(self.origin)
            .as_nanos() as u64
    }

    /// Renders one request into connection `i`'s output buffer.
    #[inline]
    pub(super) fn issue(&mut self, i: usize, intended: u64) {
        let plan = self.plan;
        let c = &mut self.conns[i];
        let op = plan.mix.pick(c.rng.next_u32());
        let mut key = 0;
        let mut after = 0;
        match op {
            Op::Poll => {
                key = plan.keys.sample(&mut c.rng);
                plan.requests.write_poll(&mut c.out, key);
            }
            Op::Ingest => {
                key = plan.keys.sample(&mut c.rng);
                plan.requests.write_ingest(&mut c.out, key, &mut c.rng);
            }
            Op::Batch => plan
                .requests
                .write_batch(&mut c.out, &plan.keys, &mut c.rng),
            Op::LongPoll => {
                key = plan.keys.sample(&mut c.rng);
                after = c.versions.get(key);
                plan.requests.write_longpoll(&mut c.out, key, after);
            }
            Op::PollMany | Op::LongPollMany => {
                key = c.rng.below(KEY_SETS as u32);
                let etag = c.sets.etag(key);
                after = etag.map_or(0, etag_id);
                if op == Op::PollMany {
                    plan.requests
                        .write_poll_many(&mut c.out, c.sets.keys(key), etag);
                } else {
                    plan.requests
                        .write_longpoll_many(&mut c.out, c.sets.keys(key), etag);
                }
            }
        }
        c.inflight.push_back(InFlight {
            op,
            key,
            intended,
            after,
        });
    }

    /// Writes as much of connection `i`'s output as the socket takes.
    pub(super) fn flush(&mut self, i: usize, now: u64) {
        let c = &mut self.conns[i];
        let Some(stream) = c.stream.as_mut() else {
            return;
        };
        while c.out_pos < c.out.len() {
            match stream.write(&c.out[c.out_pos..]) {
                Ok(0) => return self.fail(i, ErrorKind::Io, now, 0),
                Ok(n) => c.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if !c.want_write {
                        c.want_write = true;
                        let r = self.poll.registry().reregister(
                            stream,
                            Token(i),
                            Interest::READABLE | Interest::WRITABLE,
                        );
                        if r.is_err() {
                            return self.fail(i, ErrorKind::Io, now, 0);
                        }
                    }
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.fail(i, ErrorKind::Io, now, 0),
            }
        }
        c.out.clear();
        c.out_pos = 0;
        if c.want_write {
            c.want_write = false;
            if self
                .poll
                .registry()
                .reregister(stream, Token(i), Interest::READABLE)
                .is_err()
            {
                self.fail(i, ErrorKind::Io, now, 0);
            }
        }
    }

    /// Reads what connection `i` has, handles every complete answer, then sends what
    /// became due.
    pub(super) fn read(&mut self, i: usize, mut now: u64) {
        loop {
            let c = &mut self.conns[i];
            if c.in_end == c.input.len() {
                if c.in_start > 0 {
                    c.input.copy_within(c.in_start..c.in_end, 0);
                    c.in_end -= c.in_start;
                    c.in_start = 0;
                } else {
                    // One answer larger than the buffer: make room for it.
                    let len = c.input.len();
                    c.input.resize(len * 2, 0);
                }
            }
            let Some(stream) = c.stream.as_mut() else {
                return;
            };
            let space = c.input.len() - c.in_end;
            match stream.read(&mut c.input[c.in_end..]) {
                Ok(0) => return self.fail(i, ErrorKind::Closed, now, 0),
                Ok(n) => {
                    c.in_end += n;
                    now = self.now();
                    if !self.answers(i, now) {
                        return;
                    }
                    // A short read emptied the socket; the next data raises a new edge.
                    if n < space {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.fail(i, ErrorKind::Io, now, 0),
            }
        }
        self.pump(i, now);
    }

    /// Handles the complete answers in connection `i`'s input; false when the
    /// connection was given up.
    pub(super) fn answers(&mut self, i: usize, now: u64) -> bool {
        let plan = self.plan;
        loop {
            let c = &mut self.conns[i];
            let response = match parse_response(&c.input[c.in_start..c.in_end]) {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(_) => {
                    self.fail(i, ErrorKind::Protocol, now, 0);
                    return false;
                }
            };
            let Some(request) = c.inflight.pop_front() else {
                // An answer nobody asked for.
                self.fail(i, ErrorKind::Protocol, now, 0);
                return false;
            };
            let (status, len, close) = (response.status, response.len, response.close);
            let verdict = check(
                plan,
                &mut c.versions,
                &mut c.sets,
                &request,
                status,
                response.body,
                response.etag,
            );
            c.in_start += len;
            let latency = now.saturating_sub(request.intended);
            let measured = request.intended >= plan.warmup_ns;
            let stats = self.stats.op(request.op);
            if measured {
                stats.requests += 1;
                if now <= plan.end_ns {
                    stats.answered_in_window += 1;
                    stats.accepted_in_window += verdict.accepted;
                }
                stats.latency.saturating_record(latency);
                stats.count_status(status);
                match (request.op, status) {
                    (Op::Poll | Op::LongPoll, 404) => stats.not_found += 1,
                    (Op::LongPoll | Op::PollMany | Op::LongPollMany, 304) => {
                        stats.not_modified += 1
                    }
                    _ => {}
                }
                stats.not_found += verdict.missing;
                stats.accepted += verdict.accepted;
                if let Some(kind) = verdict.error {
                    stats.errors[kind as usize] += 1;
                    self.tally.errors += 1;
                }
            } else {
                stats.warmup += 1;
            }
            self.tally.answered += 1;
            self.tally.latency.saturating_record(latency);
            if close {
                // The server said it closes: what else is in flight will not be answered.
                self.fail(i, ErrorKind::Closed, now, 0);
                return false;
            }
        }
        let c = &mut self.conns[i];
        if c.in_start == c.in_end {
            c.in_start = 0;
            c.in_end = 0;
        }
        true
    }
}
