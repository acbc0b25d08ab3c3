//! How a worker writes its connections' answers and waits for readiness: one
//! small trait, [`Transmit`], with two writers.
//!
//! - [`SendNow`] (the default): each connection's answers go out with one
//!   `send`/`writev` as soon as they are rendered; the wait is `epoll_wait`.
//! - [`Ring`] (`server.io_uring = true`, see [`super::uring`]): answers wait for
//!   the end of the loop turn, then one `io_uring_enter` writes them all and, on
//!   Linux 6.15+, also waits for the next readiness events.
//!
//! The worker does not know which one it has, except to fall back to
//! [`SendNow`] when the ring fails.
//!
//! What it is not: the io_uring plumbing itself ([`super::uring`]), or what an
//! answer says (the core renders it).

use super::conns::{Conn, Slab};
pub(super) use super::uring::Sent;
use super::uring::{self, SendBatch};
use mio::net::TcpStream;
use mio::{Events, Poll};
use pollbox_core::buffers::{BufferPool, SendQueue};
use std::io::{self, IoSlice, Write};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Most buffers passed to one `writev`.
const MAX_IOV: usize = 64;

/// One readiness event.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ready {
    pub token: usize,
    pub readable: bool,
    /// The peer shut down its side, or the socket has an error.
    pub hup: bool,
}

pub(super) trait Transmit {
    /// Called once on the worker thread before the loop.
    fn start(&mut self) -> io::Result<()> {
        Ok(())
    }

    /// Write the answers queued for `slot` now, or note them for the end of the
    /// turn. `urgent`: the connection waits on this write (it is closing, or
    /// paused until its queue drains), so it goes out now whatever the writer.
    fn send(&mut self, slot: usize, c: &mut Conn, pool: &mut BufferPool, urgent: bool) -> Sent;

    /// End the loop turn: write what was noted and wait at most `timeout` for
    /// readiness. Events go to `ready`; the noted writes' results to `done`
    /// (their queues already advanced). On an error the writer is unusable:
    /// `done` then lists the noted writes as [`Sent::Deferred`] (not sent) and
    /// `ready` what the wait had returned.
    fn turn(
        &mut self,
        poll: &mut Poll,
        conns: &mut Slab,
        pool: &mut BufferPool,
        timeout: Duration,
        ready: &mut Vec<Ready>,
        done: &mut Vec<(usize, Sent)>,
    ) -> io::Result<()>;

    /// Heap bytes the writer holds.
    fn heap_bytes(&self) -> usize;
}

/// Write as much of `q` as the socket takes, with one `write`/`writev` per round.
pub(super) fn write_now(stream: &mut TcpStream, q: &mut SendQueue, pool: &mut BufferPool) -> Sent {
    let mut total = 0;
    while !q.is_empty() {
        let res = {
            let mut chunks = q.chunks();
            match (chunks.next(), chunks.next()) {
                // The common case: the answers of one read sit in one buffer.
                (Some(one), None) => stream.write(one),
                _ => {
                    let mut iov = [IoSlice::new(&[]); MAX_IOV];
                    let mut n = 0;
                    for (slot, chunk) in iov.iter_mut().zip(q.chunks()) {
                        *slot = IoSlice::new(chunk);
                        n += 1;
                    }
                    stream.write_vectored(&iov[..n])
                }
            }
        };
        match res {
            Ok(0) => return Sent::Failed,
            Ok(k) => {
                total += k;
                q.advance(k, pool);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return Sent::Failed,
        }
    }
    if total == 0 && !q.is_empty() {
        Sent::WouldBlock
    } else {
        Sent::Bytes(total)
    }
}

/// epoll's flags as mio reads them.
fn ready_from_epoll(token: u64, flags: u32) -> Ready {
    const IN: u32 = (libc::EPOLLIN | libc::EPOLLPRI) as u32;
    const HUP: u32 = libc::EPOLLHUP as u32;
    const RDHUP: u32 = libc::EPOLLRDHUP as u32;
    const ERR: u32 = libc::EPOLLERR as u32;
    let read_closed = flags & HUP != 0 || (flags & IN != 0 && flags & RDHUP != 0);
    Ready {
        token: token as usize,
        readable: flags & IN != 0,
        hup: read_closed || flags & ERR != 0,
    }
}

/// Wait with `epoll_wait` (through mio).
fn epoll_wait(
    poll: &mut Poll,
    events: &mut Events,
    timeout: Duration,
    ready: &mut Vec<Ready>,
) -> io::Result<()> {
    match poll.poll(events, Some(timeout)) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(()),
        Err(e) => return Err(e),
    }
    ready.extend(events.iter().map(|ev| Ready {
        token: ev.token().0,
        readable: ev.is_readable(),
        hup: ev.is_read_closed() || ev.is_error(),
    }));
    Ok(())
}

/// `send` as soon as answers are rendered; `epoll_wait`.
pub(super) struct SendNow {
    events: Events,
}

impl SendNow {
    pub(super) fn new() -> SendNow {
        SendNow {
            events: Events::with_capacity(1024),
        }
    }
}

impl Default for SendNow {
    fn default() -> Self {
        SendNow::new()
    }
}

impl Transmit for SendNow {
    fn send(&mut self, _slot: usize, c: &mut Conn, pool: &mut BufferPool, _urgent: bool) -> Sent {
        write_now(&mut c.stream, c.core.send_queue(), pool)
    }

    fn turn(
        &mut self,
        poll: &mut Poll,
        _conns: &mut Slab,
        _pool: &mut BufferPool,
        timeout: Duration,
        ready: &mut Vec<Ready>,
        _done: &mut Vec<(usize, Sent)>,
    ) -> io::Result<()> {
        epoll_wait(poll, &mut self.events, timeout, ready)
    }

    fn heap_bytes(&self) -> usize {
        self.events.capacity() * std::mem::size_of::<libc::epoll_event>()
    }
}

/// Answers written at the end of the turn, all in one `io_uring_enter`.
pub(super) struct Ring {
    batch: Box<SendBatch>,
    /// Connections with answers noted this turn.
    noted: Vec<usize>,
    /// Scratch: the slots of one submission's entries, by entry index.
    entries: Vec<usize>,
    /// For kernels without IORING_OP_EPOLL_WAIT: the wait stays epoll_wait.
    events: Events,
    raw: Vec<(u64, u32)>,
}

impl Ring {
    /// A ring waiting on `poll`'s events too where the kernel can. Call
    /// [`Transmit::start`] on the thread that will use it.
    pub(super) fn new(poll: &Poll) -> io::Result<Ring> {
        let mut batch = SendBatch::new()?;
        batch.attach_epoll(poll.as_raw_fd());
        Ok(Ring {
            batch: Box::new(batch),
            noted: Vec::with_capacity(uring::MAX_BATCH),
            entries: Vec::with_capacity(uring::MAX_BATCH),
            events: Events::with_capacity(1024),
            raw: Vec::with_capacity(uring::MAX_EVENTS),
        })
    }

    /// Queue an entry for each noted connection, up to a submission's worth (the
    /// rest stay noted); `entries` says whose is which.
    fn push_noted(&mut self, conns: &mut Slab) {
        self.entries.clear();
        let mut i = 0;
        while i < self.noted.len() {
            if self.batch.is_full() {
                break;
            }
            let slot = self.noted[i];
            i += 1;
            let Some(c) = conns.get_mut(slot) else {
                continue;
            };
            if !c.queued {
                // Closed since (the slot may hold a newer connection), or sent.
                continue;
            }
            c.queued = false;
            // SAFETY: the connection (its send queue and socket) stays in the
            // slab untouched until this batch's submission has returned: `turn`
            // submits right after this and applies the results after that, and
            // nothing else runs in between.
            if unsafe { self.batch.push(c.stream.as_raw_fd(), c.core.send_queue()) }.is_some() {
                self.entries.push(slot);
            }
        }
        self.noted.drain(..i);
    }

    /// Apply the results of the submission `entries` describes.
    fn apply_results(
        &mut self,
        conns: &mut Slab,
        pool: &mut BufferPool,
        done: &mut Vec<(usize, Sent)>,
    ) {
        for (i, &slot) in self.entries.iter().enumerate() {
            let sent = self.batch.result(i);
            if let (Sent::Bytes(n), Some(c)) = (sent, conns.get_mut(slot)) {
                c.core.send_queue().advance(n, pool);
            }
            done.push((slot, sent));
        }
        self.entries.clear();
    }

    /// The ring failed: report every noted write as not sent.
    fn failed(&mut self, conns: &mut Slab, done: &mut Vec<(usize, Sent)>, ready: &mut Vec<Ready>) {
        self.batch.disarm();
        self.raw.clear();
        self.batch.take_events(&mut self.raw);
        ready.extend(self.raw.iter().map(|&(t, f)| ready_from_epoll(t, f)));
        for slot in self.entries.drain(..).chain(self.noted.drain(..)) {
            if let Some(c) = conns.get_mut(slot) {
                c.queued = false;
            }
            done.push((slot, Sent::Deferred));
        }
    }
}

impl Transmit for Ring {
    /// The ring's single issuer is the worker thread: enable it there.
    fn start(&mut self) -> io::Result<()> {
        self.batch.enable()
    }

    fn send(&mut self, slot: usize, c: &mut Conn, pool: &mut BufferPool, urgent: bool) -> Sent {
        if urgent {
            return write_now(&mut c.stream, c.core.send_queue(), pool);
        }
        if !c.queued {
            c.queued = true;
            self.noted.push(slot);
        }
        Sent::Deferred
    }

    fn turn(
        &mut self,
        poll: &mut Poll,
        conns: &mut Slab,
        pool: &mut BufferPool,
        timeout: Duration,
        ready: &mut Vec<Ready>,
        done: &mut Vec<(usize, Sent)>,
    ) -> io::Result<()> {
        let waits = self.batch.waits_for_events();
        // Writes beyond one submission go out now; the last ones ride with the wait.
        loop {
            self.push_noted(conns);
            if waits && self.noted.is_empty() {
                break;
            }
            if self.entries.is_empty() && self.noted.is_empty() {
                break;
            }
            if let Err(e) = self.batch.submit() {
                self.failed(conns, done, ready);
                return Err(e);
            }
            self.apply_results(conns, pool, done);
        }
        if !waits {
            return epoll_wait(poll, &mut self.events, timeout, ready);
        }
        if let Err(e) = self.batch.submit_and_wait(timeout) {
            self.failed(conns, done, ready);
            return Err(e);
        }
        self.apply_results(conns, pool, done);
        self.raw.clear();
        self.batch.take_events(&mut self.raw);
        ready.extend(self.raw.iter().map(|&(t, f)| ready_from_epoll(t, f)));
        Ok(())
    }

    fn heap_bytes(&self) -> usize {
        self.batch.heap_bytes()
            + (self.noted.capacity() + self.entries.capacity()) * std::mem::size_of::<usize>()
            + self.raw.capacity() * std::mem::size_of::<(u64, u32)>()
            + self.events.capacity() * std::mem::size_of::<libc::epoll_event>()
    }
}
