//! One worker: a thread with its own `mio::Poll`, listener(s), connections,
//! [`Service`] (arena, projector, pre-rendered heads) and timer wheel.
//! Workers share only the [`Shared`] state.
//!
//! This is the loop and nothing else: wait for readiness (or the next tick),
//! accept, read into each connection's buffer and hand the bytes to its state
//! machine ([`pollbox_core::conn`]), then do what the connection asks — write
//! its answers ([`crate::transmit`]), park it where ingests wake it
//! ([`crate::wakeups`]), arm its deadline, close it. At each tick (`epoch_ms`)
//! reset the arena, refresh the `Date`, fire the timers and run one bounded
//! step of box expiry.

use crate::conns::{Conn, Slab};
use crate::host::WorkerHost;
use crate::stats::Rejected;
use crate::transmit::{Ready, Ring, SendNow, Sent, Transmit};
use crate::waiting::Waiting;
use crate::Shared;
use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Poll, Token};
use pollbox_core::buffers::Buffers;
use pollbox_core::conn::{Action, Connection, Ctx, SEND_BACKPRESSURE};
use pollbox_core::service::{Listener, Service};
use pollbox_core::wheel::Wheel;
use std::io::{self, Read, Write};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// Connections of the main listener served past `max_connections`, for
/// their probes only: a server full of event streams still answers
/// `/healthz` and `/readyz` (each other request on them is a 503 and a
/// close, and the header timeout ends an idle one).
pub const PROBE_RESERVE: usize = 64;

/// Quiet ticks in a row (the busy share has decayed, a spike's arena is
/// given back) before a worker waits [`QUIET_WAIT_MS`] instead of a tick.
const QUIET_TICKS_BEFORE_SLEEP: u32 = 16;
/// The longest wait of a quiet worker: an idle node wakes 4 times a second,
/// not 62 (BENCHMARKS.md, "The Kafka log": an idle node's CPU).
const QUIET_WAIT_MS: u64 = 250;

const LISTENER: Token = Token(0);
pub const WAKER: Token = Token(1);
const METRICS_LISTENER: Token = Token(2);
const FIRST_CONN: usize = 3;

/// Unsent bytes the kernel holds for an event stream (`TCP_NOTSENT_LOWAT`): a
/// subscriber that stops reading is then queued no more than this in its socket
/// plus one event in the server, and is sent the newest version when it reads
/// again, not the backlog of a grown send buffer.
pub const STREAM_NOTSENT_LOWAT: u32 = 16 * 1024;

/// How long a draining worker waits for requests in flight.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// The state machine's view of this worker, for one call.
macro_rules! cx {
    ($w:expr) => {
        Ctx {
            now_ms: $w.now_ms,
            service: &mut $w.service,
            buffers: &mut $w.buffers,
            host: &mut $w.host,
        }
    };
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
    /// `metrics_listen`, on worker 0 only.
    metrics_listener: Option<TcpListener>,
    conns: Slab,
    service: Service,
    buffers: Buffers,
    host: WorkerHost,
    transmit: Box<dyn Transmit + Send>,
    wheel: Wheel<ConnTimer>,
    /// What its connections wait on (keys, log requests).
    waiting: Waiting,
    started: Instant,
    now_ms: u64,
    epoch_ms: u64,
    next_tick_ms: u64,
    /// Ticks in a row that found nothing to do ([`Worker::is_quiet`]).
    quiet_ticks: u32,
    draining_since: Option<Instant>,
    /// Time spent waiting for events since `busy_since`, and the busy share
    /// (per mille, smoothed over ~8 ticks) published for placement.
    idle_ns: u64,
    busy_since: Instant,
    busy: u32,
    read_bytes: u64,
    sent_bytes: u64,
    /// Connections' send queues, summed (their read buffers: `buffers`).
    conn_send_bytes: usize,
    /// Bytes of what parked polls and event streams keep (keys, where a stream
    /// of many boxes stands with each, the hashes they are registered under).
    conn_watch_bytes: usize,
    /// Connections waiting for buffer budget, tried again at each tick.
    starved: Vec<(usize, u32)>,
    // Scratch lists, kept between turns.
    ready: Vec<Ready>,
    /// Ingesting connections of a turn, served after the others, and those the
    /// last turn left for this one ([`Worker::serve`]).
    later: Vec<Ready>,
    done: Vec<(usize, Sent)>,
    fired: Vec<ConnTimer>,
    woken: Vec<(usize, u32)>,
    refusal: Vec<u8>,
}

impl Worker {
    pub fn new(
        id: usize,
        shared: Arc<Shared>,
        mut listener: TcpListener,
        mut metrics_listener: Option<TcpListener>,
        poll: Poll,
    ) -> io::Result<Worker> {
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        if let Some(l) = metrics_listener.as_mut() {
            poll.registry()
                .register(l, METRICS_LISTENER, Interest::READABLE)?;
        }
        let epoch_ms = shared.node.config.server.epoch_ms;
        let started = shared.started;
        let transmit: Box<dyn Transmit + Send> = if shared.node.config.server.io_uring {
            match Ring::new(&poll) {
                Ok(r) => {
                    shared.uring_workers.fetch_add(1, Ordering::Relaxed);
                    Box::new(r)
                }
                Err(e) => {
                    eprintln!(
                        "pollbox: worker {id}: io_uring unavailable ({e}); writing with send"
                    );
                    Box::new(SendNow::new())
                }
            }
        } else {
            Box::new(SendNow::new())
        };
        Ok(Worker {
            id,
            poll,
            listener: Some(listener),
            metrics_listener,
            conns: Slab::default(),
            service: Service::new(shared.node.clone(), SystemTime::now()),
            // This worker's share of max_buffered_bytes.
            buffers: Buffers::new(
                shared.node.config.limits.max_buffered_bytes / shared.workers.max(1),
            ),
            host: WorkerHost::new(shared, id),
            transmit,
            wheel: Wheel::new(epoch_ms, 512, 0),
            waiting: Waiting::new(id),
            // One clock for every worker: boxes' expiry stamps are compared
            // across workers.
            started,
            now_ms: 0,
            epoch_ms,
            next_tick_ms: epoch_ms,
            quiet_ticks: 0,
            draining_since: None,
            idle_ns: 0,
            busy_since: Instant::now(),
            busy: 0,
            read_bytes: 0,
            sent_bytes: 0,
            starved: Vec::new(),
            conn_send_bytes: 0,
            conn_watch_bytes: 0,
            ready: Vec::with_capacity(1024),
            later: Vec::with_capacity(1024),
            done: Vec::with_capacity(crate::uring::MAX_BATCH),
            fired: Vec::with_capacity(256),
            woken: Vec::with_capacity(64),
            refusal: Vec::with_capacity(256),
        })
    }

    fn shared(&self) -> &Shared {
        &self.host.shared
    }

    /// Bytes this worker accounts for now (arena and buffers), before it runs.
    pub fn accounted_bytes(&self) -> usize {
        self.service.arena().capacity_bytes() + self.buffer_total()
    }

    /// Connection read buffers, pooled buffers, the service's scratch and
    /// the projector's slots, the slab and the writer.
    fn buffer_total(&self) -> usize {
        self.buffers.read_held()
            + self.buffers.pooled_bytes()
            + self.service.working_bytes()
            + self.conns.heap_bytes()
            + self.conn_watch_bytes
            + self.waiting.heap_bytes()
            + self.transmit.heap_bytes()
            + (self.ready.capacity() + self.later.capacity()) * std::mem::size_of::<Ready>()
            + self.done.capacity() * std::mem::size_of::<(usize, Sent)>()
    }

    /// Hand the connection's state machine this worker's context for one
    /// call, the answers it writes timed together (`WorkerHost::finish`).
    #[inline]
    fn timed<R>(&mut self, f: impl FnOnce(&mut Ctx<'_, WorkerHost>) -> R) -> R {
        self.host.start();
        let r = f(&mut cx!(self));
        self.host.finish();
        r
    }

    fn clock(&mut self) -> u64 {
        self.now_ms = self.started.elapsed().as_millis() as u64;
        self.now_ms
    }

    /// Run until shutdown has been asked for and every connection is done.
    pub fn run(mut self) -> io::Result<()> {
        if let Err(e) = self.transmit.start() {
            self.fall_back(e);
        }
        loop {
            // A worker with nothing to do waits longer than a tick: an idle
            // node does not wake every epoch_ms.
            let sleep = self.quiet_ticks >= QUIET_TICKS_BEFORE_SLEEP && self.is_quiet();
            // Ingesting connections left from the last turn: only look.
            let timeout = if !self.later.is_empty() {
                0
            } else if sleep {
                QUIET_WAIT_MS
            } else {
                self.next_tick_ms.saturating_sub(self.clock())
            };
            let (mut ready, mut done) = (
                std::mem::take(&mut self.ready),
                std::mem::take(&mut self.done),
            );
            let waiting = Instant::now();
            let turn = self.transmit.turn(
                &mut self.poll,
                &mut self.conns,
                &mut self.buffers.send,
                Duration::from_millis(timeout),
                &mut ready,
                &mut done,
            );
            self.idle_ns += waiting.elapsed().as_nanos() as u64;
            if let Err(e) = turn {
                self.fall_back(e);
            }
            if self.clock() >= self.next_tick_ms && sleep {
                // From a quiet wait, late on purpose: a tick first (not an
                // overrun), so the Date header and the wheel are current
                // before anything is served.
                self.next_tick_ms = self.now_ms;
                self.tick();
            }
            for (slot, sent) in done.drain(..) {
                self.after_turn_write(slot, sent);
            }
            // One epoch pin for the turn's events, so each box-table read in
            // them only bumps a counter (never held across the wait above).
            let batch = pollbox_core::boxes::read_batch();
            self.serve(&mut ready, &mut done);
            drop(batch);
            (self.ready, self.done) = (ready, done);
            if self.clock() >= self.next_tick_ms {
                self.tick();
            }
            if self.shared().draining.load(Ordering::Acquire) && self.drain_step() {
                return Ok(());
            }
        }
    }

    /// Serve a turn's events. Connections whose last request was an ingest
    /// go last, one at a time, and between two of them the worker looks
    /// (without waiting) for connections that became readable meanwhile and
    /// serves their polls first: a poll waits behind at most the ingest being
    /// applied, not behind every batch of the turn (docs/operations.md#workers).
    /// Each connection's own requests are answered in order, as always. Once
    /// the tick is due the turn ends: the ingesting connections not yet served
    /// wait in `later` for the next turn, after the tick and after the polls
    /// that turn finds, so neither the tick nor a poll waits behind a backlog
    /// of ingest (a generator catching up can queue tens of milliseconds).
    fn serve(&mut self, ready: &mut Vec<Ready>, done: &mut Vec<(usize, Sent)>) {
        let mut later = std::mem::take(&mut self.later);
        for ev in ready.drain(..) {
            self.serve_or_defer(ev, &mut later);
        }
        let mut i = 0;
        while i < later.len() && self.clock() < self.next_tick_ms {
            self.on_event(later[i]);
            i += 1;
            if i == later.len() {
                break;
            }
            let turn = self.transmit.turn(
                &mut self.poll,
                &mut self.conns,
                &mut self.buffers.send,
                Duration::ZERO,
                ready,
                done,
            );
            if let Err(e) = turn {
                self.fall_back(e);
            }
            self.clock();
            for (slot, sent) in done.drain(..) {
                self.after_turn_write(slot, sent);
            }
            for ev in ready.drain(..) {
                self.serve_or_defer(ev, &mut later);
            }
        }
        later.drain(..i);
        self.later = later;
    }

    /// Serve `ev` now, or add it to `later` if it is a connection that ingests.
    fn serve_or_defer(&mut self, ev: Ready, later: &mut Vec<Ready>) {
        let ingests = Token(ev.token)
            .0
            .checked_sub(FIRST_CONN)
            .and_then(|slot| self.conns.get_mut(slot))
            .is_some_and(|c| c.core.ingesting());
        if ingests {
            later.push(ev);
        } else {
            self.on_event(ev);
        }
    }

    /// The ring cannot be used: write with `send` from now on.
    fn fall_back(&mut self, e: io::Error) {
        eprintln!(
            "pollbox: worker {}: io_uring failed ({e}); writing with send from now on",
            self.id
        );
        self.transmit = Box::new(SendNow::new());
        self.shared().uring_workers.fetch_sub(1, Ordering::Relaxed);
    }

    fn on_event(&mut self, ev: Ready) {
        match Token(ev.token) {
            LISTENER => self.accept(Listener::Main),
            METRICS_LISTENER => self.accept(Listener::Metrics),
            WAKER => self.on_wake(),
            Token(t) => {
                let slot = t - FIRST_CONN;
                let Some(mut c) = self.conns.take(slot) else {
                    return;
                };
                c.peer_hup |= ev.hup;
                if ev.readable {
                    c.unread = true;
                }
                self.settle(slot, c);
            }
        }
    }

    fn accept(&mut self, listener: Listener) {
        loop {
            let l = match listener {
                Listener::Main => self.listener.as_ref(),
                Listener::Metrics => self.metrics_listener.as_ref(),
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
                && self.host.shared.node.config.server.place_by_load
                && !self.host.shared.draining.load(Ordering::Acquire)
            {
                // Served where the load is least (crate::placement).
                let shared = &self.host.shared;
                let to = shared.placement.place(self.id, &shared.stats);
                if to != self.id {
                    match shared.placement.hand(to, stream) {
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
    fn adopt(&mut self, mut stream: TcpStream, mut listener: Listener) {
        if self.host.shared.draining.load(Ordering::Acquire) {
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
        let shared = &self.host.shared;
        let open = shared.open_connections.fetch_add(1, Ordering::AcqRel);
        let cap = shared.node.config.limits.max_connections;
        if listener == Listener::Main && open >= cap {
            if open >= cap.saturating_add(PROBE_RESERVE) {
                shared.open_connections.fetch_sub(1, Ordering::AcqRel);
                self.host.stats().rejected(Rejected::MaxConnections);
                self.refuse(&mut stream, "too many connections");
                return;
            }
            listener = Listener::Probes;
        }
        let _ = stream.set_nodelay(true);
        let (slot, gen) = self.conns.vacant();
        if let Err(e) = self.poll.registry().register(
            &mut stream,
            Token(slot + FIRST_CONN),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            eprintln!("pollbox: worker {}: register failed: {e}", self.id);
            self.host
                .shared
                .open_connections
                .fetch_sub(1, Ordering::AcqRel);
            self.conns.release(slot);
            return;
        }
        // Its client (the per-client limits): the peer, or whom a trusted
        // proxy names. A socket already disconnected has no peer, and no
        // request to limit.
        let core = match stream.peer_addr() {
            Ok(peer) => Connection::from_peer(self.now_ms, listener, peer.ip(), &self.service),
            Err(_) => Connection::new(self.now_ms, listener, &self.service),
        };
        let st = self.host.stats();
        st.connections_total.inc();
        st.connections_open.inc();
        self.settle(slot, Box::new(Conn::new(stream, core, gen)));
    }

    /// Answer 503 to a connection over the cap, best effort, and drop it.
    fn refuse(&mut self, stream: &mut TcpStream, what: &str) {
        let mut out = std::mem::take(&mut self.refusal);
        out.clear();
        self.timed(|cx| cx.service.closing_error(503, what, &mut out, cx.host));
        let _ = stream.write(&out);
        let _ = stream.shutdown(std::net::Shutdown::Write);
        self.refusal = out;
    }

    /// Do what the connection asks until it asks for nothing more: read (when it
    /// stopped early and may go on), apply its actions, write its answers;
    /// then close it or put it back.
    fn settle(&mut self, slot: usize, mut c: Box<Conn>) {
        let mut close = false;
        loop {
            if c.unread && c.core.wants_read() && !self.read(&mut c) {
                return self.close(slot, c);
            }
            if c.peer_hup {
                // The client shut its side: a poll it parked is read by nobody,
                // so its slot is freed now, not at the deadline.
                c.core.peer_hung_up();
            }
            if c.core.has_actions() {
                close |= self.apply(slot, &mut c);
            }
            if !c.core.send_queue().is_empty() {
                let urgent = c.core.closing().is_some()
                    || c.core.send_queue().pending() >= SEND_BACKPRESSURE;
                let sent = self
                    .transmit
                    .send(slot, &mut c, &mut self.buffers.send, urgent);
                match sent {
                    Sent::Bytes(n) => self.sent_bytes += n as u64,
                    Sent::Failed => return self.close(slot, c),
                    Sent::WouldBlock | Sent::Deferred => {}
                }
            }
            // An event stream whose box moved while its queue was not empty
            // sends the newest version now that the queue drained.
            if c.core.stream_dirty() && c.core.send_queue().is_empty() {
                let sent = self.timed(|cx| c.core.on_send_drained(cx));
                if sent {
                    continue;
                }
            }
            if c.core.shuts_down_write() && !c.write_shut {
                // The answer is out (or the connection ends now): the client reads
                // it, then the end of the stream.
                let _ = c.stream.shutdown(std::net::Shutdown::Write);
                c.write_shut = true;
                if c.core.wants_read() {
                    // Lingering: drop what the client still sends, which may already
                    // be in the socket (no edge will announce it).
                    c.unread = true;
                    continue;
                }
            }
            // Reading stopped for back-pressure and the write drained the queue
            // without the socket saying WouldBlock: no edge will come, read on.
            // (Not if reading stopped for want of buffer budget: that waits for
            // the next tick.)
            if !(c.unread && c.core.wants_read()) || c.core.starved() {
                break;
            }
        }
        // What the writes changed (the close, the bytes), and the timer.
        if self.apply(slot, &mut c) || close {
            return self.close(slot, c);
        }
        if c.core.starved() && !c.starved {
            c.starved = true;
            self.starved.push((slot, c.gen));
        }
        self.conns.put(slot, c);
    }

    /// Apply what the connection asked since the last time, once each.
    /// Returns whether it asked to be closed.
    fn apply(&mut self, slot: usize, c: &mut Conn) -> bool {
        let mut close = false;
        loop {
            let mut watched = false;
            let conn = (slot, c.gen);
            let shared = &self.host.shared;
            let stats = &shared.stats[self.id];
            for a in c.core.actions() {
                match a {
                    Action::Watch(w) => {
                        c.watch = Some(self.waiting.watch(w, conn, &shared.waiters, stats));
                        if w.stream && !c.lowat_set {
                            // A reader that stops reading: the kernel takes at most
                            // this much unsent data for it (not the 4 MB a send
                            // buffer grows to), then the stream waits with one event
                            // queued and coalesces. Bytes in flight are not
                            // limited, so a stream over a long round trip is not
                            // slowed.
                            let _ = socket2::SockRef::from(&c.stream)
                                .set_tcp_notsent_lowat(STREAM_NOTSENT_LOWAT);
                            c.lowat_set = true;
                        }
                        watched = true;
                    }
                    Action::Unwatch => {
                        if let Some(r) = c.watch.take() {
                            self.waiting.unwatch(r, conn, &shared.waiters, stats);
                        }
                    }
                    Action::Await(ticket) => self.waiting.await_reports(ticket, conn),
                    Action::Unawait(ticket) => self.waiting.unawait(ticket),
                    Action::Arm(at) => {
                        if let Some(t) = c.timer.take() {
                            self.wheel.cancel(t);
                        }
                        c.timer = Some(self.wheel.insert(at, ConnTimer { slot, gen: c.gen }));
                    }
                    Action::Bytes { send, watch } => {
                        self.conn_send_bytes = self.conn_send_bytes.wrapping_add_signed(send);
                        self.conn_watch_bytes = self.conn_watch_bytes.wrapping_add_signed(watch);
                    }
                    Action::Close => close = true,
                }
            }
            if !watched {
                return close;
            }
            // An ingest may have landed between the version check and the
            // registration: look again now that wake-ups reach it.
            self.timed(|cx| c.core.on_box_updated(cx));
        }
    }

    /// Read what the socket has, answering as it comes, until it would block or
    /// the connection stops reading. Returns false if the connection is dead.
    fn read(&mut self, c: &mut Conn) -> bool {
        self.host.start();
        let alive = self.read_answering(c);
        self.host.finish();
        alive
    }

    /// [`Worker::read`]'s loop; the answers of each read are timed together
    /// (`WorkerHost::finish`).
    fn read_answering(&mut self, c: &mut Conn) -> bool {
        loop {
            let mut cx = cx!(self);
            let Some(buf) = c.core.read_buffer(&mut cx) else {
                // Stopped early: `unread` stays set.
                return true;
            };
            let room = buf.len();
            match c.stream.read(buf) {
                Ok(0) => {
                    c.core.eof(&mut cx);
                    c.unread = false;
                    return true;
                }
                Ok(n) => {
                    c.core.received(n, &mut cx);
                    self.host.finish();
                    self.read_bytes += n as u64;
                    if n < room && !c.peer_hup {
                        // A short read drained the socket: with edge-triggered
                        // epoll, bytes arriving later raise a new event, so the
                        // read that would only say WouldBlock is skipped (one
                        // syscall less per request).
                        c.unread = false;
                        return true;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    c.unread = false;
                    return true;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
        }
    }

    /// Settle the result of a write made at the end of the turn.
    fn after_turn_write(&mut self, slot: usize, sent: Sent) {
        let Some(c) = self.conns.take(slot) else {
            return;
        };
        match sent {
            Sent::Bytes(n) => self.sent_bytes += n as u64,
            Sent::Failed => return self.close(slot, c),
            Sent::WouldBlock | Sent::Deferred => {}
        }
        self.settle(slot, c);
    }

    /// Bytes of all this worker's connections' buffers (`pollbox_buffered_bytes`).
    fn buffered(&self) -> usize {
        self.buffers.read_held() + self.conn_send_bytes
    }

    fn close(&mut self, slot: usize, mut c: Box<Conn>) {
        let _ = self.poll.registry().deregister(&mut c.stream);
        // Released, the connection asks for what it had to be undone (its
        // watch, its awaited request, its bytes).
        c.core.release(&mut cx!(self));
        self.apply(slot, &mut c);
        if let Some(t) = c.timer.take() {
            self.wheel.cancel(t);
        }
        self.conns.release(slot);
        let shared = &self.host.shared;
        shared.open_connections.fetch_sub(1, Ordering::AcqRel);
        shared.stats[self.id].connections_open.sub(1);
    }

    /// Publish the share of the time since the last tick this worker spent
    /// not waiting for events, smoothed, for placing new connections.
    fn publish_busy(&mut self, now: Instant) {
        let window = now.duration_since(self.busy_since).as_nanos() as u64;
        if window == 0 {
            return;
        }
        let busy = 1000 - (self.idle_ns.min(window) * 1000 / window) as u32;
        self.busy = (self.busy * 7 + busy) / 8;
        self.idle_ns = 0;
        self.busy_since = now;
        self.host.shared.placement.set_busy(self.id, self.busy);
    }

    fn tick(&mut self) {
        let tick_start = Instant::now();
        let late = self.now_ms.saturating_sub(self.next_tick_ms);
        if late >= self.epoch_ms {
            self.host.stats().epoch_overruns.inc();
        }
        self.next_tick_ms =
            self.now_ms + self.epoch_ms - (late % self.epoch_ms).min(self.epoch_ms - 1);
        let reset_start = Instant::now();
        let r = self.service.reset_arena();
        let reset_ns = reset_start.elapsed().as_nanos() as u64;
        self.service.set_time(SystemTime::now());
        if self.service.follow_access() {
            self.recheck_held_tokens();
        }
        let buffers = self.buffer_total() as u64;
        let high_water = self.service.arena().high_water_bytes() as u64;
        let st = self.host.stats();
        st.arena_resets.inc();
        st.arena_reset.observe_ns(reset_ns);
        st.arena_used_before_reset.set(r.used_before as u64);
        st.arena_capacity.set(r.capacity_after as u64);
        st.arena_high_water.set(high_water);
        if r.replaced {
            st.arena_replaced.inc();
        }
        st.bytes_received.set(self.read_bytes);
        st.bytes_sent.set(self.sent_bytes);
        st.buffer_bytes.set(buffers);
        st.send_queue_bytes.set(self.conn_send_bytes as u64);
        crate::alloc_stats::publish_thread_counters(st);
        st.buffered_bytes.set(self.buffered() as u64);
        // Connections that waited for buffer budget try again (others may have
        // given buffers back since).
        for (slot, gen) in std::mem::take(&mut self.starved) {
            if let Some(mut c) = self.conns.take_gen(slot, gen) {
                c.starved = false;
                c.unread = true;
                self.settle(slot, c);
            }
        }
        self.publish_busy(tick_start);
        let mut fired = std::mem::take(&mut self.fired);
        self.wheel.advance(self.now_ms, &mut fired);
        for t in fired.drain(..) {
            let Some(mut c) = self.conns.take_gen(t.slot, t.gen) else {
                continue;
            };
            c.timer = None;
            self.timed(|cx| c.core.on_timer(cx));
            self.settle(t.slot, c);
        }
        self.fired = fired;
        // A bounded step of box expiry (SweepBudget::PER_TICK): the boxes'
        // long-polls are woken through the same path as an ingest's.
        let table_ms = self.host.shared.table_clock(self.now_ms);
        self.service.expire(table_ms, &mut self.host);
        // Clients gone whose request bucket has refilled are forgotten, a
        // shard a tick (docs/private-boxes.md#per-client-limits).
        let clients = &self.host.shared.node.clients;
        if clients.limits().rate_limited() {
            clients.sweep(self.now_ms.saturating_mul(1000));
        }
        self.quiet_ticks = if self.is_quiet() {
            self.quiet_ticks.saturating_add(1)
        } else {
            0
        };
        let work = tick_start.elapsed().as_nanos() as u64;
        let st = self.host.stats();
        st.tick.observe_ns(work);
        if work > st.epoch_work_max_ns.get() {
            st.epoch_work_max_ns.set(work);
        }
    }

    /// This worker took a new read of the key set and static token files:
    /// held requests whose token it no longer holds end now (a 401, or
    /// `event: expired`), not at their token's end. Only on a re-read.
    fn recheck_held_tokens(&mut self) {
        for slot in self.conns.slots() {
            if !self
                .conns
                .get_mut(slot)
                .is_some_and(|c| c.core.holds_token())
            {
                continue;
            }
            let Some(mut c) = self.conns.take(slot) else {
                continue;
            };
            self.timed(|cx| c.core.on_access_changed(cx));
            self.settle(slot, c);
        }
    }

    /// Nothing a tick would do: no connection (so no timer), no arena memory
    /// to give back, no box that may expire, not shutting down.
    fn is_quiet(&self) -> bool {
        let shared = self.shared();
        let arena = self.service.arena();
        self.conns.is_empty()
            && self.later.is_empty()
            && self.starved.is_empty()
            && arena.capacity_bytes() <= arena.working_size().saturating_mul(4)
            && (shared.node.config.boxes.ttl_s == 0 || shared.node.boxes.is_empty())
            && !shared.draining.load(Ordering::Relaxed)
    }

    /// Another worker (or this one) applied an update to keys we wait on; or,
    /// on a node of a log, records our ingests wait for met their fate.
    fn on_wake(&mut self) {
        while let Some(stream) = self.host.shared.placement.next(self.id) {
            self.adopt(stream, Listener::Main);
        }
        while let Some(r) = self.host.shared.waiters.next_report(self.id) {
            let Some((slot, gen)) = self.waiting.awaiting(r.request) else {
                continue; // answered already (timed out) or closed
            };
            let Some(mut c) = self.conns.take_gen(slot, gen) else {
                continue;
            };
            self.timed(|cx| c.core.on_log_report(r.index, r.report, cx));
            self.settle(slot, c);
        }
        while let Some(wake) = self.host.shared.waiters.next(self.id) {
            self.woken.clear();
            self.waiting.woken(wake, &mut self.woken);
            for i in 0..self.woken.len() {
                let (slot, gen) = self.woken[i];
                let Some(mut c) = self.conns.take_gen(slot, gen) else {
                    continue;
                };
                // A stream of many boxes looks only at the keys with the
                // woken hash (the keys were registered in their order).
                let watch = c.watch.as_ref();
                let moved = |i: usize| watch.is_some_and(|r| r.moved(wake, i));
                self.timed(|cx| c.core.on_keys_updated(&moved, cx));
                self.settle(slot, c);
            }
        }
    }

    /// One step of draining. Returns true when the worker may exit.
    fn drain_step(&mut self) -> bool {
        if self.draining_since.is_none() {
            // Stop accepting: the port refuses new connections, which a load
            // balancer retries on another node whatever their method (it
            // cannot retry a POST that a 503 answered). The metrics listener
            // stays for the drain.
            if let Some(mut l) = self.listener.take() {
                let _ = self.poll.registry().deregister(&mut l);
            }
        }
        let since = *self.draining_since.get_or_insert_with(Instant::now);
        let overdue = since.elapsed() >= DRAIN_LIMIT;
        for slot in self.conns.slots() {
            if let Some(mut c) = self.conns.take(slot) {
                // Bytes already in the socket are a request in flight, not idleness.
                if c.core.wants_read() && !self.read(&mut c) {
                    self.close(slot, c);
                    continue;
                }
                self.timed(|cx| c.core.drain(overdue, cx));
                self.settle(slot, c);
            }
        }
        self.conns.is_empty()
    }
}
