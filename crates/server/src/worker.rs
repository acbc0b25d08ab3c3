//! One worker: a thread with its own `mio::Poll`, listener, connections,
//! arena, timer wheel and send queues. Workers share only the box table, the
//! config and their stats (each written by its own worker).
//!
//! Loop: wait for readiness or the next tick; accept; read into each
//! connection's buffer, frame and answer every complete request, then write the
//! batch of responses; at each tick (`epoch_ms`) reset the arena, refresh the
//! `Date`, and fire timers (timeouts, long-poll deadlines).

use crate::dispatch::{self, After, Ctx, Handled, Park};
use crate::send_queue::SendQueue;
use crate::stats::RouteLabel;
use crate::uring::{SendBatch, Sent};
use crate::Shared;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use pollbox_core::http::{Frame, Framer, FramerState, Limits, Method, Progress};
use pollbox_core::wheel::{TimerId, Wheel};
use std::collections::HashMap;
use std::io::{self, Read};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const LISTENER: Token = Token(0);
pub const WAKER: Token = Token(1);
const FIRST_CONN: usize = 2;

/// Read buffers are this size (larger for large bodies). A connection holds one
/// only while it has bytes of an unfinished request; between requests it goes
/// back to the worker's pool, so idle keep-alive connections cost no buffer.
const READ_BUF: usize = 16 * 1024;
/// Initial (and kept) size of a worker's arena.
const ARENA_WORKING_BYTES: usize = 512 * 1024;
/// Most idle read buffers a worker keeps.
const READ_POOL_MAX: usize = 256;
/// A connection with this many unsent bytes is not read until it drains.
const SEND_BACKPRESSURE: usize = 256 * 1024;
/// How long a draining worker waits for requests in flight.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// A long-poll waiting on this connection.
struct Parked {
    frame: Frame,
    /// The decoded key, to find this poll in the worker's index.
    key: Box<[u8]>,
    after: u64,
    deadline_ms: u64,
}

struct Conn {
    stream: TcpStream,
    slot: usize,
    gen: u32,
    /// Received bytes live in `rbuf[rstart..rend]`; `rbuf.len()` is its capacity.
    rbuf: Vec<u8>,
    rstart: usize,
    rend: usize,
    framer: Framer,
    sendq: SendQueue,
    /// When the connection times out (ms on the worker clock), by its state.
    deadline_ms: u64,
    /// The deadline the wheel holds for it.
    armed_ms: u64,
    timer: Option<TimerId>,
    /// When the current request's head started (header timeout runs from it).
    head_started_ms: Option<u64>,
    /// Bytes of the current partial request seen at the last check (body progress).
    partial_seen: usize,
    close_after_flush: bool,
    peer_closed: bool,
    /// epoll said the peer shut down its side (EPOLLRDHUP).
    peer_hup: bool,
    read_paused: bool,
    /// In the worker's `to_flush` list (batched writes).
    flush_queued: bool,
    parked: Option<Parked>,
    /// Bytes this connection adds to the worker's accounted totals.
    acc_read: usize,
    acc_send: usize,
}

/// A wheel entry: which connection (slot, generation) to look at.
#[derive(Clone, Copy)]
struct ConnTimer {
    slot: usize,
    gen: u32,
}

pub struct Worker {
    id: usize,
    poll: Poll,
    listener: Option<TcpListener>,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    next_gen: u32,
    wheel: Wheel<ConnTimer>,
    fired: Vec<ConnTimer>,
    ctx: Ctx,
    limits: Limits,
    started: Instant,
    now_ms: u64,
    epoch_ms: u64,
    next_tick_ms: u64,
    /// Parked long-polls on this worker, by key.
    parked: HashMap<Box<[u8]>, Vec<(usize, u32)>>,
    /// Idle read buffers, each `READ_BUF` long.
    read_pool: Vec<Vec<u8>>,
    read_bytes: u64,
    sent_bytes: u64,
    buffer_bytes: usize,
    send_bytes: usize,
    draining_since: Option<Instant>,
    /// Batched writes (`server.io_uring`); `None` writes each queue with `send`.
    batch: Option<Box<SendBatch>>,
    /// Connections with responses to write at the end of this loop turn.
    to_flush: Vec<usize>,
    /// Scratch: the list being written while `to_flush` collects the next round.
    flush_round: Vec<usize>,
    /// Scratch: the slots of one submission's entries, by entry index.
    batch_slots: Vec<usize>,
}

impl Worker {
    pub fn new(
        id: usize,
        shared: Arc<Shared>,
        listener: TcpListener,
        poll: Poll,
    ) -> io::Result<Worker> {
        let cfg = &shared.config;
        let mut listener = listener;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let epoch_ms = cfg.server.epoch_ms;
        let limits = Limits {
            max_header_bytes: cfg.limits.max_header_bytes,
            max_headers: cfg.limits.max_headers,
            max_body_bytes: cfg.limits.max_body_bytes,
        };
        // The arena's working size: 512 KiB holds an epoch of ~800 messages of
        // 512 B per worker. Busier epochs grow it (bumpalo adds chunks; a reset
        // keeps the largest up to 4× this and replaces a bigger one), so its
        // resident pages follow the real load.
        let working = ARENA_WORKING_BYTES.min(cfg.limits.arena_limit_bytes);
        let ctx = Ctx {
            projector: pollbox_core::projection::Projector::new(shared.plan.clone()),
            epoch: pollbox_core::epoch::Epoch::new(working, cfg.limits.arena_limit_bytes),
            pool: crate::send_queue::BufferPool::new(1024),
            date: pollbox_core::http::DateCache::new(),
            heads: dispatch::HeadCache::new(b""),
            key: Vec::with_capacity(cfg.boxes.max_key_bytes.max(256)),
            body: Vec::with_capacity(16 * 1024),
            worker: id,
            shared,
        };
        let mut w = Worker {
            id,
            poll,
            listener: Some(listener),
            conns: Vec::new(),
            free: Vec::new(),
            next_gen: 1,
            wheel: Wheel::new(epoch_ms, 512, 0),
            fired: Vec::with_capacity(256),
            ctx,
            limits,
            started: Instant::now(),
            now_ms: 0,
            epoch_ms,
            next_tick_ms: epoch_ms,
            parked: HashMap::new(),
            read_pool: Vec::with_capacity(READ_POOL_MAX),
            read_bytes: 0,
            sent_bytes: 0,
            buffer_bytes: 0,
            send_bytes: 0,
            draining_since: None,
            batch: None,
            to_flush: Vec::with_capacity(crate::uring::MAX_BATCH),
            flush_round: Vec::with_capacity(crate::uring::MAX_BATCH),
            batch_slots: Vec::with_capacity(crate::uring::MAX_BATCH),
        };
        if w.ctx.shared.config.server.io_uring {
            match SendBatch::new() {
                Ok(mut b) => {
                    use std::os::fd::AsRawFd;
                    b.attach_epoll(w.poll.as_raw_fd());
                    w.batch = Some(Box::new(b));
                    w.ctx.shared.uring_workers.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    eprintln!("pollbox: worker {id}: io_uring unavailable ({e}); writing with send")
                }
            }
        }
        w.ctx.date.update(std::time::SystemTime::now());
        w.ctx.heads.refresh(w.ctx.date.get());
        Ok(w)
    }

    /// Bytes this worker accounts for now (arena and buffers), before it runs.
    pub fn accounted_bytes(&self) -> usize {
        self.ctx.epoch.capacity_bytes() + self.buffer_total()
    }

    /// Connection read buffers, pooled send buffers, the worker's scratch,
    /// simd-json's working memory and the connection slab.
    fn buffer_total(&self) -> usize {
        self.buffer_bytes
            + self.read_pool.len() * READ_BUF
            + self.ctx.pool.pooled_bytes()
            + self.ctx.key.capacity()
            + self.ctx.body.capacity()
            + self.ctx.projector.working_bytes()
            + self.conns.capacity() * std::mem::size_of::<Option<Conn>>()
            + self.batch.as_ref().map_or(0, |b| b.heap_bytes())
            + (self.to_flush.capacity() + self.flush_round.capacity() + self.batch_slots.capacity())
                * std::mem::size_of::<usize>()
    }

    fn clock(&mut self) -> u64 {
        self.now_ms = self.started.elapsed().as_millis() as u64;
        self.now_ms
    }

    /// Run until shutdown has been asked for and every connection is done.
    pub fn run(mut self) -> io::Result<()> {
        if let Some(mut b) = self.batch.take() {
            match b.enable() {
                Ok(()) => self.batch = Some(b),
                Err(e) => self.ring_failed(b, e),
            }
        }
        if self.batch.as_ref().is_some_and(|b| b.waits_for_events()) {
            return self.run_ring();
        }
        let mut events = Events::with_capacity(1024);
        loop {
            let now = self.clock();
            let timeout = self.next_tick_ms.saturating_sub(now);
            match self
                .poll
                .poll(&mut events, Some(Duration::from_millis(timeout)))
            {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            self.clock();
            for ev in events.iter() {
                self.on_event(
                    ev.token(),
                    ev.is_readable(),
                    ev.is_writable(),
                    ev.is_read_closed() || ev.is_error(),
                );
            }
            self.flush_batch();
            if self.clock() >= self.next_tick_ms {
                self.tick();
                self.flush_batch();
            }
            if self.ctx.shared.draining.load(Ordering::Acquire) && self.drain_step() {
                return Ok(());
            }
        }
    }

    /// The loop when the ring also waits for the events: each turn, one
    /// `io_uring_enter` writes the last turn's responses and sleeps until the next
    /// events or the next tick.
    fn run_ring(mut self) -> io::Result<()> {
        let mut raw: Vec<(u64, u32)> = Vec::with_capacity(crate::uring::MAX_EVENTS);
        loop {
            let now = self.clock();
            let timeout = self.next_tick_ms.saturating_sub(now);
            if !self.flush_and_wait(Duration::from_millis(timeout), &mut raw) {
                // The ring failed (already reported): handle what it returned and
                // go on with epoll_wait and send.
                self.handle_raw(&mut raw);
                return self.run();
            }
            self.clock();
            self.handle_raw(&mut raw);
            if self.clock() >= self.next_tick_ms {
                self.tick();
            }
            if self.ctx.shared.draining.load(Ordering::Acquire) && self.drain_step() {
                return Ok(());
            }
        }
    }

    /// Handle readiness events taken from the ring (`(token, epoll flags)`), with
    /// mio's reading of the flags.
    fn handle_raw(&mut self, raw: &mut Vec<(u64, u32)>) {
        const IN: u32 = (libc::EPOLLIN | libc::EPOLLPRI) as u32;
        const OUT: u32 = libc::EPOLLOUT as u32;
        const HUP: u32 = libc::EPOLLHUP as u32;
        const RDHUP: u32 = libc::EPOLLRDHUP as u32;
        const ERR: u32 = libc::EPOLLERR as u32;
        for &(token, flags) in raw.iter() {
            let read_closed = flags & HUP != 0 || (flags & IN != 0 && flags & RDHUP != 0);
            self.on_event(
                Token(token as usize),
                flags & IN != 0,
                flags & OUT != 0,
                read_closed || flags & ERR != 0,
            );
        }
        raw.clear();
    }

    fn on_event(&mut self, token: Token, readable: bool, writable: bool, hup: bool) {
        match token {
            LISTENER => self.accept(),
            WAKER => self.on_wake(),
            Token(t) => {
                let slot = t - FIRST_CONN;
                if hup {
                    // Read to EOF this time: no later edge announces it.
                    if let Some(Some(c)) = self.conns.get_mut(slot) {
                        c.peer_hup = true;
                    }
                }
                self.on_conn_event(slot, readable, writable);
            }
        }
    }

    fn stats(&self) -> &crate::stats::WorkerStats {
        &self.ctx.shared.stats[self.id]
    }

    fn accept(&mut self) {
        loop {
            let Some(listener) = self.listener.as_ref() else {
                return;
            };
            let (mut stream, _) = match listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of fds and the like: log once per burst and retry on the next event.
                    eprintln!("pollbox: worker {}: accept failed: {e}", self.id);
                    return;
                }
            };
            let shared = &self.ctx.shared;
            let open = shared.open_connections.fetch_add(1, Ordering::AcqRel);
            if open >= shared.config.limits.max_connections {
                shared.open_connections.fetch_sub(1, Ordering::AcqRel);
                self.stats().rejected[0].inc();
                self.refuse(&mut stream, "too many connections");
                continue;
            }
            let _ = stream.set_nodelay(true);
            let slot = match self.free.pop() {
                Some(s) => s,
                None => {
                    self.conns.push(None);
                    self.conns.len() - 1
                }
            };
            if let Err(e) = self.poll.registry().register(
                &mut stream,
                Token(slot + FIRST_CONN),
                Interest::READABLE | Interest::WRITABLE,
            ) {
                eprintln!("pollbox: worker {}: register failed: {e}", self.id);
                shared.open_connections.fetch_sub(1, Ordering::AcqRel);
                self.free.push(slot);
                continue;
            }
            let gen = self.next_gen;
            self.next_gen = self.next_gen.wrapping_add(1);
            let deadline = self.now_ms + self.ctx.shared.config.limits.idle_timeout_ms;
            let timer = self.wheel.insert(deadline, ConnTimer { slot, gen });
            self.conns[slot] = Some(Conn {
                stream,
                slot,
                gen,
                rbuf: Vec::new(),
                rstart: 0,
                rend: 0,
                framer: Framer::new(self.limits),
                sendq: SendQueue::default(),
                deadline_ms: deadline,
                armed_ms: deadline,
                timer: Some(timer),
                head_started_ms: None,
                partial_seen: 0,
                close_after_flush: false,
                peer_closed: false,
                peer_hup: false,
                read_paused: false,
                flush_queued: false,
                parked: None,
                acc_read: 0,
                acc_send: 0,
            });
            let st = self.stats();
            st.connections_total.inc();
            st.connections_open.inc();
        }
    }

    /// Answer 503 to a connection over the cap, best effort, and drop it.
    fn refuse(&mut self, stream: &mut TcpStream, what: &str) {
        let mut q = SendQueue::default();
        dispatch::unavailable(&mut self.ctx, &mut q, what);
        let _ = q.flush(stream, &mut self.ctx.pool);
        q.clear(&mut self.ctx.pool);
        let _ = stream.shutdown(std::net::Shutdown::Write);
    }

    fn on_conn_event(&mut self, slot: usize, readable: bool, writable: bool) {
        let Some(mut conn) = self.conns.get_mut(slot).and_then(Option::take) else {
            return;
        };
        let mut alive = true;
        if self.batch.is_some() {
            // Written with the others at the end of the turn.
            self.queue_flush(slot, &mut conn);
        } else if writable || !conn.sendq.is_empty() {
            alive = self.flush(&mut conn);
        }
        if alive && (readable || conn.read_paused) && conn.parked.is_none() {
            alive = self.read_and_serve(slot, &mut conn);
        }
        self.finish_event(slot, conn, alive);
    }

    /// Put the connection back or close it, and settle its accounting.
    fn finish_event(&mut self, slot: usize, mut conn: Conn, alive: bool) {
        let alive = alive && !(conn.close_after_flush && conn.sendq.is_empty());
        if !alive {
            self.close(slot, conn);
            return;
        }
        if conn.rstart == conn.rend && conn.parked.is_none() {
            self.give_back_rbuf(&mut conn);
        }
        let r = conn.rbuf.len();
        let s = conn.sendq.capacity_bytes();
        self.buffer_bytes = self.buffer_bytes + r - conn.acc_read;
        self.send_bytes = self.send_bytes + s - conn.acc_send;
        conn.acc_read = r;
        conn.acc_send = s;
        self.conns[slot] = Some(conn);
    }

    fn take_rbuf(&mut self) -> Vec<u8> {
        self.read_pool.pop().unwrap_or_else(|| vec![0; READ_BUF])
    }

    /// Return the connection's read buffer to the pool (it holds no bytes we need).
    fn give_back_rbuf(&mut self, conn: &mut Conn) {
        conn.rstart = 0;
        conn.rend = 0;
        if conn.rbuf.is_empty() {
            return;
        }
        let b = std::mem::take(&mut conn.rbuf);
        if b.len() == READ_BUF && self.read_pool.len() < READ_POOL_MAX {
            self.read_pool.push(b);
        }
    }

    fn close(&mut self, slot: usize, mut conn: Conn) {
        let _ = self.poll.registry().deregister(&mut conn.stream);
        if let Some(t) = conn.timer.take() {
            self.wheel.cancel(t);
        }
        if let Some(p) = conn.parked.take() {
            self.unpark_index(&p.key, slot, conn.gen);
        }
        conn.sendq.clear(&mut self.ctx.pool);
        self.give_back_rbuf(&mut conn);
        self.buffer_bytes -= conn.acc_read;
        self.send_bytes -= conn.acc_send;
        self.free.push(slot);
        self.ctx
            .shared
            .open_connections
            .fetch_sub(1, Ordering::AcqRel);
        self.stats().connections_open.sub(1);
    }

    /// Write what is queued. Returns false if the connection is dead.
    fn flush(&mut self, conn: &mut Conn) -> bool {
        if conn.sendq.is_empty() {
            return true;
        }
        match conn.sendq.flush(&mut conn.stream, &mut self.ctx.pool) {
            Ok(n) => {
                self.sent_bytes += n as u64;
                true
            }
            Err(_) => false,
        }
    }

    /// Read everything available, answer every complete request, write the batch
    /// (or, with batched writes, queue it for the end of the turn).
    fn read_and_serve(&mut self, slot: usize, conn: &mut Conn) -> bool {
        if self.batch.is_some() {
            let alive = self.read_some(slot, conn);
            self.queue_flush(slot, conn);
            return alive;
        }
        loop {
            if !self.read_some(slot, conn) || !self.flush(conn) {
                return false;
            }
            // Paused for back-pressure and the flush drained the queue without
            // the socket saying WouldBlock: no writable edge will come, and the
            // client may have sent everything already (no readable edge either),
            // so read on now.
            if !(conn.read_paused && conn.sendq.pending() < SEND_BACKPRESSURE) {
                return true;
            }
        }
    }

    /// Put the connection on the list written at the end of the turn.
    fn queue_flush(&mut self, slot: usize, conn: &mut Conn) {
        if !conn.flush_queued && !conn.sendq.is_empty() {
            conn.flush_queued = true;
            self.to_flush.push(slot);
        }
    }

    /// Write every queued connection's responses: one `io_uring_enter` per up to
    /// `MAX_BATCH` connections. A connection whose socket took only part goes
    /// round again; one that would block waits for its writable edge; one paused
    /// for back-pressure whose queue drained is read again (and its answers go in
    /// the next round).
    fn flush_batch(&mut self) {
        let Some(mut batch) = self.batch.take() else {
            return;
        };
        while !self.to_flush.is_empty() {
            self.push_queued(&mut batch);
            if self.batch_slots.is_empty() {
                continue;
            }
            if let Err(e) = batch.submit() {
                self.ring_failed(batch, e);
                return;
            }
            self.settle_sends(&batch);
        }
        self.batch = Some(batch);
    }

    /// The ring's loop turn: write the queued responses and wait for the next
    /// events (at most `timeout`) in one `io_uring_enter`, then settle the writes
    /// and put the events in `raw`. Connections whose writes need an answer before
    /// the next events (paused for back-pressure, or closing) are written first,
    /// on their own. Returns false if the ring failed (the worker then falls back
    /// to epoll_wait and send; `raw` holds the events it still returned).
    fn flush_and_wait(&mut self, timeout: Duration, raw: &mut Vec<(u64, u32)>) -> bool {
        let urgent = self.to_flush.iter().any(|&slot| {
            matches!(self.conns.get(slot), Some(Some(c)) if c.flush_queued && (c.read_paused || c.close_after_flush))
        });
        if urgent {
            self.flush_batch();
        }
        let Some(mut batch) = self.batch.take() else {
            return false;
        };
        // Sends beyond one submission go out now; the last ones ride with the wait.
        loop {
            self.push_queued(&mut batch);
            if self.to_flush.is_empty() {
                break;
            }
            if let Err(e) = batch.submit() {
                batch.disarm();
                batch.take_events(raw);
                self.ring_failed(batch, e);
                return false;
            }
            self.settle_sends(&batch);
        }
        if let Err(e) = batch.submit_and_wait(timeout) {
            batch.disarm();
            batch.take_events(raw);
            self.ring_failed(batch, e);
            return false;
        }
        self.settle_sends(&batch);
        batch.take_events(raw);
        self.batch = Some(batch);
        true
    }

    /// Queue an entry for each connection on `to_flush` (up to a submission's
    /// worth; the rest stay on `to_flush`); `batch_slots` says whose is which.
    fn push_queued(&mut self, batch: &mut SendBatch) {
        let mut round = std::mem::take(&mut self.flush_round);
        std::mem::swap(&mut round, &mut self.to_flush);
        self.batch_slots.clear();
        for &slot in &round {
            let Some(Some(conn)) = self.conns.get_mut(slot) else {
                continue;
            };
            if !conn.flush_queued {
                // Closed since (the slot may hold a newer connection).
                continue;
            }
            if batch.is_full() {
                self.to_flush.push(slot);
                continue;
            }
            conn.flush_queued = false;
            use std::os::fd::AsRawFd;
            // SAFETY: the connection (its send queue and socket) stays in
            // `self.conns` untouched until the batch's next submission has
            // returned: the callers submit right after this, and settle after.
            if unsafe { batch.push(conn.stream.as_raw_fd(), &conn.sendq) }.is_some() {
                self.batch_slots.push(slot);
            }
        }
        round.clear();
        self.flush_round = round;
    }

    /// Apply the results of the submission `batch_slots` describes.
    fn settle_sends(&mut self, batch: &SendBatch) {
        for i in 0..self.batch_slots.len() {
            let slot = self.batch_slots[i];
            let Some(mut conn) = self.conns.get_mut(slot).and_then(Option::take) else {
                continue;
            };
            let mut alive = true;
            match batch.result(i) {
                Sent::Bytes(n) => {
                    self.sent_bytes += n as u64;
                    conn.sendq.advance(n, &mut self.ctx.pool);
                    // A partial write: the socket is full, the rest goes when it
                    // says writable (or in the next round, which then says so).
                    self.queue_flush(slot, &mut conn);
                }
                Sent::WouldBlock => {}
                Sent::Failed => alive = false,
            }
            if alive
                && conn.read_paused
                && conn.sendq.pending() < SEND_BACKPRESSURE
                && conn.parked.is_none()
            {
                // Paused for back-pressure and drained without the socket saying
                // WouldBlock: no edge will come, read on now (with the batch taken,
                // this reads and writes at once, as without it).
                alive = self.read_and_serve(slot, &mut conn);
            }
            self.finish_event(slot, conn, alive);
        }
        self.batch_slots.clear();
    }

    /// The ring cannot be used: write what was queued with send, and from now on.
    fn ring_failed(&mut self, batch: Box<SendBatch>, e: io::Error) {
        eprintln!(
            "pollbox: worker {}: io_uring failed ({e}); writing with send from now on",
            self.id
        );
        drop(batch);
        self.ctx
            .shared
            .uring_workers
            .fetch_sub(1, Ordering::Relaxed);
        let queued: Vec<usize> = self
            .batch_slots
            .drain(..)
            .chain(std::mem::take(&mut self.to_flush))
            .collect();
        for slot in queued {
            if let Some(mut conn) = self.conns.get_mut(slot).and_then(Option::take) {
                conn.flush_queued = false;
                let alive = self.flush(&mut conn);
                self.finish_event(slot, conn, alive);
            }
        }
    }

    /// Read and serve until the socket is drained or reading must pause.
    /// Returns false if the connection is dead.
    fn read_some(&mut self, slot: usize, conn: &mut Conn) -> bool {
        conn.read_paused = false;
        loop {
            if conn.close_after_flush || conn.parked.is_some() {
                break;
            }
            if conn.sendq.pending() >= SEND_BACKPRESSURE {
                // Do not read more from a client that does not read its answers.
                conn.read_paused = true;
                break;
            }
            if conn.rbuf.is_empty() {
                conn.rbuf = self.take_rbuf();
            }
            if conn.rend == conn.rbuf.len() && !self.make_room(conn) {
                // The request does not fit in any buffer we allow.
                let e = match conn.framer.state() {
                    FramerState::Body => pollbox_core::http::HttpError::BodyTooLarge,
                    _ => pollbox_core::http::HttpError::HeadTooLarge,
                };
                dispatch::framing_error(&mut self.ctx, &mut conn.sendq, e);
                conn.close_after_flush = true;
                break;
            }
            match conn.stream.read(&mut conn.rbuf[conn.rend..]) {
                Ok(0) => {
                    conn.peer_closed = true;
                    self.serve(slot, conn);
                    // Answer what was received, then close.
                    conn.close_after_flush = true;
                    break;
                }
                Ok(n) => {
                    let filled = conn.rend + n == conn.rbuf.len();
                    conn.rend += n;
                    self.read_bytes += n as u64;
                    self.serve(slot, conn);
                    if !filled && !conn.peer_hup {
                        // A short read drained the socket: with edge-triggered
                        // epoll, bytes arriving later raise a new event, so the
                        // read that would only say WouldBlock is skipped (one
                        // syscall less per request).
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
        }
        true
    }

    /// Make space at the end of the read buffer: compact, or grow within limits.
    fn make_room(&mut self, conn: &mut Conn) -> bool {
        if conn.rstart > 0 {
            conn.rbuf.copy_within(conn.rstart..conn.rend, 0);
            conn.rend -= conn.rstart;
            conn.rstart = 0;
            return true;
        }
        let max = self.limits.max_header_bytes + self.limits.max_body_bytes + 64 * 1024;
        let len = conn.rbuf.len();
        if len >= max {
            return false;
        }
        conn.rbuf.resize((len * 2).max(READ_BUF).min(max), 0);
        true
    }

    /// Frame and answer every complete request in the buffer.
    fn serve(&mut self, slot: usize, conn: &mut Conn) {
        let draining = self.ctx.shared.draining.load(Ordering::Relaxed);
        let start = Instant::now();
        while !conn.close_after_flush && conn.parked.is_none() && conn.rstart < conn.rend {
            let slice = &mut conn.rbuf[conn.rstart..conn.rend];
            match conn.framer.advance(slice) {
                Ok(Progress::Partial { send_continue }) => {
                    if send_continue {
                        let t = conn.sendq.tail(&mut self.ctx.pool);
                        t.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
                        conn.sendq.commit(25);
                        self.stats().request(RouteLabel::Other, 100);
                    }
                    break;
                }
                Ok(Progress::Complete(frame)) => {
                    let consumed = frame.consumed;
                    let handled = dispatch::handle(
                        &mut self.ctx,
                        &frame,
                        &conn.rbuf[conn.rstart..conn.rend],
                        &mut conn.sendq,
                        draining,
                    );
                    self.stats()
                        .duration
                        .observe_ns(start.elapsed().as_nanos() as u64);
                    match handled {
                        Handled::Answered(After::KeepAlive) => {}
                        Handled::Answered(After::Close) => conn.close_after_flush = true,
                        Handled::Park(p) => {
                            self.park(slot, conn, frame.clone(), p);
                            // The frame's bytes stay in the buffer until answered.
                            return;
                        }
                    }
                    conn.rstart += consumed;
                    conn.head_started_ms = None;
                    conn.partial_seen = 0;
                }
                Err(e) => {
                    dispatch::framing_error(&mut self.ctx, &mut conn.sendq, e);
                    self.stats()
                        .duration
                        .observe_ns(start.elapsed().as_nanos() as u64);
                    conn.close_after_flush = true;
                }
            }
        }
        if conn.rstart == conn.rend {
            conn.rstart = 0;
            conn.rend = 0;
        }
        self.update_deadline(conn);
    }

    /// Choose the connection's deadline from its state.
    fn update_deadline(&mut self, conn: &mut Conn) {
        let l = &self.ctx.shared.config.limits;
        let partial = conn.rend - conn.rstart;
        let deadline = match (partial, conn.framer.state()) {
            _ if conn.parked.is_some() => return,
            (0, _) => self.now_ms + l.idle_timeout_ms,
            (_, FramerState::Body) => {
                // Body timeout runs from the last byte of progress.
                if partial != conn.partial_seen {
                    conn.partial_seen = partial;
                    self.now_ms + l.body_timeout_ms
                } else {
                    conn.deadline_ms
                }
            }
            _ => {
                // Header timeout runs from the first byte of the head.
                let started = *conn.head_started_ms.get_or_insert(self.now_ms);
                started + l.header_timeout_ms
            }
        };
        self.set_deadline(conn, deadline);
    }

    fn set_deadline(&mut self, conn: &mut Conn, deadline: u64) {
        conn.deadline_ms = deadline;
        if conn.timer.is_none() || deadline < conn.armed_ms {
            if let Some(t) = conn.timer.take() {
                self.wheel.cancel(t);
            }
            let slot = conn.slot;
            conn.timer = Some(self.wheel.insert(
                deadline,
                ConnTimer {
                    slot,
                    gen: conn.gen,
                },
            ));
            conn.armed_ms = deadline;
        }
    }

    fn tick(&mut self) {
        let tick_start = Instant::now();
        let late = self.now_ms.saturating_sub(self.next_tick_ms);
        if late >= self.epoch_ms {
            self.stats().epoch_overruns.inc();
        }
        self.next_tick_ms =
            self.now_ms + self.epoch_ms - (late % self.epoch_ms).min(self.epoch_ms - 1);
        // Reset happens only between requests, so no parsed value is alive here.
        let reset_start = Instant::now();
        let r = self.ctx.epoch.reset();
        let reset_ns = reset_start.elapsed().as_nanos() as u64;
        let st = &self.ctx.shared.stats[self.id];
        st.arena_resets.inc();
        st.arena_reset.observe_ns(reset_ns);
        st.arena_used_before_reset.set(r.used_before as u64);
        st.arena_capacity.set(r.capacity_after as u64);
        st.arena_high_water
            .set(self.ctx.epoch.high_water_bytes() as u64);
        if r.replaced {
            st.arena_replaced.inc();
        }
        self.ctx.date.update(std::time::SystemTime::now());
        self.ctx.heads.refresh(self.ctx.date.get());
        let st = &self.ctx.shared.stats[self.id];
        st.bytes_received.set(self.read_bytes);
        st.bytes_sent.set(self.sent_bytes);
        st.buffer_bytes.set(self.buffer_total() as u64);
        st.send_queue_bytes.set(self.send_bytes as u64);
        crate::alloc_stats::publish_thread_counters(st);
        self.fired.clear();
        let mut fired = std::mem::take(&mut self.fired);
        self.wheel.advance(self.now_ms, &mut fired);
        for t in fired.drain(..) {
            self.on_timer(t);
        }
        self.fired = fired;
        let work = tick_start.elapsed().as_nanos() as u64;
        let st = &self.ctx.shared.stats[self.id];
        if work > st.epoch_work_max_ns.get() {
            st.epoch_work_max_ns.set(work);
        }
    }

    fn on_timer(&mut self, t: ConnTimer) {
        let Some(mut conn) = self.conns.get_mut(t.slot).and_then(Option::take) else {
            return;
        };
        if conn.gen != t.gen {
            self.conns[t.slot] = Some(conn);
            return;
        }
        conn.timer = None;
        if let Some(p) = &conn.parked {
            if p.deadline_ms <= self.now_ms {
                self.answer_parked(t.slot, &mut conn, true);
                let alive = self.after_unpark(t.slot, &mut conn);
                self.finish_event(t.slot, conn, alive);
            } else {
                let d = p.deadline_ms;
                self.set_deadline(&mut conn, d);
                self.conns[t.slot] = Some(conn);
            }
            return;
        }
        if conn.deadline_ms > self.now_ms {
            let d = conn.deadline_ms;
            self.set_deadline(&mut conn, d);
            self.conns[t.slot] = Some(conn);
            return;
        }
        if conn.rend > conn.rstart && conn.framer.state() != FramerState::Idle {
            // A request started and did not finish in time: 408, then close.
            dispatch::timeout(&mut self.ctx, &mut conn.sendq);
            conn.close_after_flush = true;
            let _ = self.flush(&mut conn);
            let _ = conn.stream.shutdown(std::net::Shutdown::Write);
            self.close(t.slot, conn);
        } else if !conn.sendq.is_empty() {
            // The client does not read its answers: give up on it.
            self.close(t.slot, conn);
        } else {
            self.close(t.slot, conn);
        }
    }

    // ---- long-poll ----

    fn park(&mut self, slot: usize, conn: &mut Conn, frame: Frame, p: Park) {
        let deadline = self.now_ms + p.wait_ms;
        let key: Box<[u8]> = self.ctx.key.as_slice().into();
        self.ctx.shared.waiters.register(&key, self.id);
        self.parked
            .entry(key.clone())
            .or_default()
            .push((slot, conn.gen));
        conn.parked = Some(Parked {
            frame,
            key,
            after: p.after,
            deadline_ms: deadline,
        });
        self.stats().parked_polls.inc();
        // Keep just the bytes from the parked request on: the read buffer goes
        // back to the pool, so a parked poll costs about its request's size.
        let rest = conn.rbuf[conn.rstart..conn.rend].to_vec();
        self.give_back_rbuf(conn);
        conn.rend = rest.len();
        conn.rbuf = rest;
        if let Some(t) = conn.timer.take() {
            self.wheel.cancel(t);
        }
        self.set_deadline(conn, deadline);
        // An ingest may have landed between the version check and registration.
        let key = &self.ctx.key;
        if self.ctx.shared.boxes.version(key).unwrap_or(0) > p.after {
            self.answer_parked(slot, conn, false);
        }
    }

    /// Take a parked poll off this worker's index (it is answered or gone).
    fn unpark_index(&mut self, key: &[u8], slot: usize, gen: u32) {
        let Some(list) = self.parked.get_mut(key) else {
            return;
        };
        let found = list.iter().position(|&(s, g)| s == slot && g == gen);
        if let Some(i) = found {
            list.swap_remove(i);
        }
        let now_empty = list.is_empty();
        if found.is_some() {
            self.stats().parked_polls.sub(1);
        }
        if now_empty {
            self.parked.remove(key);
            self.ctx.shared.waiters.unregister(key, self.id);
        }
    }

    /// Answer the connection's parked long-poll (200 with the new payload, or 304
    /// when `timed_out` and nothing changed) and take it off the index.
    fn answer_parked(&mut self, slot: usize, conn: &mut Conn, timed_out: bool) {
        let Some(p) = conn.parked.take() else {
            return;
        };
        self.unpark_index(&p.key, slot, conn.gen);
        let buf = &conn.rbuf[conn.rstart..conn.rend];
        self.ctx.key.clear();
        self.ctx.key.extend_from_slice(&p.key);
        let version = self.ctx.shared.boxes.version(&self.ctx.key).unwrap_or(0);
        let changed = version > p.after;
        let draining = self.ctx.shared.draining.load(Ordering::Relaxed);
        let after = dispatch::answer_poll(
            &mut self.ctx,
            &mut conn.sendq,
            &p.frame,
            buf,
            RouteLabel::LongPoll,
            p.frame.method == Method::Head,
            p.frame.keep_alive && !draining,
            timed_out && !changed,
        );
        if after == After::Close {
            conn.close_after_flush = true;
        }
        conn.rstart += p.frame.consumed;
        conn.head_started_ms = None;
        conn.partial_seen = 0;
    }

    /// After a parked poll was answered: serve what was pipelined behind it, write.
    fn after_unpark(&mut self, slot: usize, conn: &mut Conn) -> bool {
        self.serve(slot, conn);
        if !self.flush(conn) {
            return false;
        }
        // Bytes may have arrived while parked (edge-triggered: read them now).
        if !conn.close_after_flush && conn.parked.is_none() {
            return self.read_and_serve(slot, conn);
        }
        true
    }

    /// Another worker (or this one) applied an update to keys we wait on.
    fn on_wake(&mut self) {
        while let Ok(key) = self.ctx.shared.wake_rx[self.id].try_recv() {
            self.wake_key(&key);
        }
    }

    /// Answer every parked poll of `key` whose version has moved past its `after`.
    pub fn wake_key(&mut self, key: &[u8]) {
        let Some(list) = self.parked.get(key) else {
            return;
        };
        let version = self.ctx.shared.boxes.version(key).unwrap_or(0);
        let ready: Vec<(usize, u32)> = list.clone();
        for (slot, gen) in ready {
            let Some(mut conn) = self.conns.get_mut(slot).and_then(Option::take) else {
                continue;
            };
            let due = conn.gen == gen && conn.parked.as_ref().is_some_and(|p| version > p.after);
            if !due {
                self.conns[slot] = Some(conn);
                continue;
            }
            self.answer_parked(slot, &mut conn, false);
            let alive = self.after_unpark(slot, &mut conn);
            self.finish_event(slot, conn, alive);
        }
    }

    // ---- shutdown ----

    /// One step of draining. Returns true when the worker may exit.
    fn drain_step(&mut self) -> bool {
        let since = *self.draining_since.get_or_insert_with(Instant::now);
        if let Some(mut l) = self.listener.take() {
            let _ = self.poll.registry().deregister(&mut l);
        }
        let overdue = since.elapsed() >= DRAIN_LIMIT;
        for slot in 0..self.conns.len() {
            let idle = match &self.conns[slot] {
                Some(c) => {
                    overdue || (c.sendq.is_empty() && c.rend == c.rstart && c.parked.is_none())
                }
                None => continue,
            };
            if idle {
                if let Some(c) = self.conns[slot].take() {
                    self.close(slot, c);
                }
            }
        }
        // Parked polls end now with their current state.
        let parked: Vec<usize> = self
            .conns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.as_ref().is_some_and(|c| c.parked.is_some()))
            .map(|(i, _)| i)
            .collect();
        for slot in parked {
            if let Some(mut conn) = self.conns[slot].take() {
                self.answer_parked(slot, &mut conn, true);
                conn.close_after_flush = true;
                let alive = self.flush(&mut conn);
                self.finish_event(slot, conn, alive);
            }
        }
        self.conns.iter().all(Option::is_none)
    }
}
