//! One worker: a thread with its own `mio::Poll`, listener(s), connections,
//! [`Service`] (arena, projector, pre-rendered heads) and timer wheel.
//! Workers share only the [`Shared`] state.
//!
//! This is the loop and nothing else: wait for readiness (or the next tick),
//! accept (`worker/accept.rs`), and give each ready connection its turn
//! (`worker/settle.rs`): read into its buffer and hand the bytes to its
//! state machine ([`pollbox_core::conn`]), apply the actions it pushed —
//! watch keys where ingests wake it ([`waiting`], [`crate::wakeups`]),
//! await a log request's reports, arm its timer, close it — and write its
//! answers ([`transmit`]). At each tick (`worker/tick.rs`,
//! `epoch_ms`) reset the arena, refresh the `Date`, fire the timers and run
//! one bounded step of box expiry.
//!
//! Its parts that no other thread touches live beside it: [`conns`] (the
//! sockets beside their state machines), [`transmit`] (how bytes are
//! written: `send`, or io_uring in [`uring`]), [`waiting`] (what its
//! connections wait on) and [`host`] (the server as the core sees it:
//! counting, wake-ups, `/metrics`).

use crate::shared::Shared;
use conns::{Conn, Slab};
use host::WorkerHost;
use mio::net::TcpListener;
use mio::{Interest, Poll, Token};
use pollbox_core::buffers::Buffers;
use pollbox_core::conn::Ctx;
use pollbox_core::service::{Listener, Service};
use pollbox_core::wheel::Wheel;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use transmit::{Ready, Ring, SendNow, Sent, Transmit};
use waiting::Waiting;

/// Connections of the main listener served past `max_connections`, for
/// their probes only: a server full of event streams still answers
/// `/healthz` and `/readyz` (each other request on them is a 503 and a
/// close, and the header timeout ends an idle one).
pub(crate) const PROBE_RESERVE: usize = 64;

/// Quiet ticks in a row (the busy share has decayed, a spike's arena is
/// given back) before a worker waits [`QUIET_WAIT_MS`] instead of a tick.
const QUIET_TICKS_BEFORE_SLEEP: u32 = 16;
/// The longest wait of a quiet worker: an idle node wakes 4 times a second,
/// not 62 (BENCHMARKS.md, "The Kafka log": an idle node's CPU).
const QUIET_WAIT_MS: u64 = 250;

const LISTENER: Token = Token(0);
pub(crate) const WAKER: Token = Token(1);
const METRICS_LISTENER: Token = Token(2);
const FIRST_CONN: usize = 3;

// A connection's token holds its generation in the high 32 bits.
const _: () = assert!(usize::BITS >= 64, "connection tokens need 64 bits");

/// A connection's token: its slot and its generation. A turn's events are read
/// before they are served (and ingesting connections' events wait in `later`),
/// so an event may come after its connection closed and its slot went to a new
/// one: with the generation in the token that event finds no connection,
/// instead of handing the new one the old one's hang-up.
pub(super) fn conn_token(slot: usize, gen: u32) -> Token {
    Token(((gen as usize) << 32) | (slot + FIRST_CONN))
}

/// The slot and generation a connection's token names (`None`: not a
/// connection's).
fn slot_gen(token: usize) -> Option<(usize, u32)> {
    let slot = (token & 0xffff_ffff).checked_sub(FIRST_CONN)?;
    Some((slot, (token >> 32) as u32))
}

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
        pollbox_core::conn::Ctx {
            now_ms: $w.clocks.now_ms,
            service: &mut $w.service,
            buffers: &mut $w.buffers,
            host: &mut $w.host,
        }
    };
}

mod accept;
mod conns;
mod host;
mod settle;
mod tick;
mod transmit;
mod uring;
mod waiting;

#[cfg(test)]
mod tests;

/// A wheel entry: which connection (slot, generation) to look at.
#[derive(Clone, Copy)]
struct ConnTimer {
    slot: usize,
    gen: u32,
}

/// One worker's state, grouped by job. The groups are plain fields (no
/// box, no pointer): the loop reaches each part as directly as a flat struct.
pub(crate) struct Worker {
    id: usize,
    /// The listeners, the poll and the connections.
    sockets: Sockets,
    /// How answers are written: `send`, or an io_uring batch.
    transmit: Box<dyn Transmit + Send>,
    /// The core's side: arena, projector, pre-rendered heads.
    service: Service,
    buffers: Buffers,
    host: WorkerHost,
    /// What its connections wait on (keys, log requests).
    waiting: Waiting,
    clocks: Clocks,
    timers: Timers,
    load: Load,
    counts: Counts,
    scratch: Scratch,
}

/// The worker's sockets: its poll, its listeners and its connections.
struct Sockets {
    poll: Poll,
    listener: Option<TcpListener>,
    /// `metrics_listen`, on worker 0 only.
    metrics_listener: Option<TcpListener>,
    conns: Slab,
}

/// The loop's clock and the tick's schedule.
struct Clocks {
    /// The server's start: one clock for every worker, since boxes' expiry
    /// stamps are compared across workers.
    started: Instant,
    now_ms: u64,
    epoch_ms: u64,
    next_tick_ms: u64,
    /// Ticks in a row that found nothing to do ([`Worker::is_quiet`]).
    quiet_ticks: u32,
    draining_since: Option<Instant>,
}

/// What the tick looks at again: the connections' timers, and the
/// connections waiting for buffer budget.
struct Timers {
    wheel: Wheel<ConnTimer>,
    /// Connections waiting for buffer budget, tried again at each tick.
    starved: Vec<(usize, u32)>,
    /// Room streams with something marked past their cut, flushed again at
    /// each tick with a new one (`Worker::list_room`).
    rooms: Vec<(usize, u32)>,
    /// Room streams whose listing goes on with nothing queued (its steps
    /// found nothing to send), given their next step at the next turn
    /// (`Worker::list_room`).
    listing: Vec<(usize, u32)>,
}

/// Time spent waiting for events since `busy_since`, and the busy share
/// (per mille, smoothed over ~8 ticks) published for placement.
struct Load {
    idle_ns: u64,
    busy_since: Instant,
    busy: u32,
}

/// Bytes moved and held, published at each tick.
struct Counts {
    read_bytes: u64,
    sent_bytes: u64,
    /// Connections' send queues, summed (their read buffers: `buffers`).
    conn_send_bytes: usize,
    /// Bytes of what parked polls and event streams keep (keys, where a stream
    /// of many boxes stands with each, the hashes they are registered under).
    conn_watch_bytes: usize,
}

/// Scratch lists, kept between turns so a turn allocates nothing.
struct Scratch {
    ready: Vec<Ready>,
    /// Ingesting connections of a turn, served after the others, and those the
    /// last turn left for this one ([`Worker::serve`]).
    later: Vec<Ready>,
    done: Vec<(usize, Sent)>,
    fired: Vec<ConnTimer>,
    woken: Vec<(usize, u32)>,
    /// Prefix streams and long-polls to look at with the cut just taken.
    rooms: Vec<(usize, u32)>,
    /// The twin of `Timers::listing`, kept so stepping allocates nothing.
    listing: Vec<(usize, u32)>,
    refusal: Vec<u8>,
}

impl Worker {
    pub(crate) fn new(
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
        let epoch_ms = shared.node().config.server.epoch_ms;
        let started = shared.started();
        let transmit: Box<dyn Transmit + Send> = if shared.node().config.server.io_uring {
            match Ring::new(&poll) {
                Ok(r) => {
                    shared.uring_started();
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
            sockets: Sockets {
                poll,
                listener: Some(listener),
                metrics_listener,
                conns: Slab::default(),
            },
            transmit,
            service: Service::new(shared.node().clone(), SystemTime::now()),
            // This worker's share of max_buffered_bytes.
            buffers: Buffers::new(
                shared.node().config.limits.max_buffered_bytes / shared.workers().max(1),
            ),
            host: WorkerHost::new(shared, id),
            waiting: Waiting::new(id),
            clocks: Clocks {
                started,
                now_ms: 0,
                epoch_ms,
                next_tick_ms: epoch_ms,
                quiet_ticks: 0,
                draining_since: None,
            },
            timers: Timers {
                wheel: Wheel::new(epoch_ms, 512, 0),
                starved: Vec::new(),
                rooms: Vec::new(),
                listing: Vec::new(),
            },
            load: Load {
                idle_ns: 0,
                busy_since: Instant::now(),
                busy: 0,
            },
            counts: Counts {
                read_bytes: 0,
                sent_bytes: 0,
                conn_send_bytes: 0,
                conn_watch_bytes: 0,
            },
            scratch: Scratch {
                ready: Vec::with_capacity(1024),
                later: Vec::with_capacity(1024),
                done: Vec::with_capacity(uring::MAX_BATCH),
                fired: Vec::with_capacity(256),
                woken: Vec::with_capacity(64),
                rooms: Vec::with_capacity(64),
                listing: Vec::new(),
                refusal: Vec::with_capacity(256),
            },
        })
    }

    fn shared(&self) -> &Shared {
        self.host.shared()
    }

    /// Bytes this worker accounts for now (arena and buffers), before it runs.
    pub(crate) fn accounted_bytes(&self) -> usize {
        self.service.arena().capacity_bytes() + self.buffer_total()
    }

    /// Connection read buffers, pooled buffers, the service's scratch and
    /// the projector's slots, the slab and the writer.
    fn buffer_total(&self) -> usize {
        self.buffers.read_held()
            + self.buffers.pooled_bytes()
            + self.service.working_bytes()
            + self.sockets.conns.heap_bytes()
            + self.counts.conn_watch_bytes
            + self.waiting.heap_bytes()
            + self.transmit.heap_bytes()
            + (self.scratch.ready.capacity() + self.scratch.later.capacity())
                * std::mem::size_of::<Ready>()
            + self.scratch.done.capacity() * std::mem::size_of::<(usize, Sent)>()
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
        self.clocks.now_ms = self.clocks.started.elapsed().as_millis() as u64;
        self.clocks.now_ms
    }

    /// Run until shutdown has been asked for and every connection is done.
    // Never inlined into its thread's closure: the loop is the unit the poll
    // path's instruction counts are taken over (benches/poll/callgrind.sh).
    #[inline(never)]
    pub(crate) fn run(mut self) -> io::Result<()> {
        if let Err(e) = self.transmit.start() {
            self.fall_back(e);
        }
        loop {
            // A worker with nothing to do waits longer than a tick: an idle
            // node does not wake every epoch_ms.
            let sleep = self.clocks.quiet_ticks >= QUIET_TICKS_BEFORE_SLEEP && self.is_quiet();
            // Ingesting connections left from the last turn: only look.
            let timeout = if !self.scratch.later.is_empty() || !self.timers.listing.is_empty() {
                0
            } else if sleep {
                QUIET_WAIT_MS
            } else {
                self.clocks.next_tick_ms.saturating_sub(self.clock())
            };
            let (mut ready, mut done) = (
                std::mem::take(&mut self.scratch.ready),
                std::mem::take(&mut self.scratch.done),
            );
            let waiting = Instant::now();
            let turn = self.transmit.turn(
                &mut self.sockets.poll,
                &mut self.sockets.conns,
                &mut self.buffers.send,
                Duration::from_millis(timeout),
                &mut ready,
                &mut done,
            );
            self.load.idle_ns += waiting.elapsed().as_nanos() as u64;
            if let Err(e) = turn {
                self.fall_back(e);
            }
            if self.clock() >= self.clocks.next_tick_ms && sleep {
                // From a quiet wait, late on purpose: a tick first (not an
                // overrun), so the Date header and the wheel are current
                // before anything is served.
                self.clocks.next_tick_ms = self.clocks.now_ms;
                self.tick();
            }
            for (slot, sent) in done.drain(..) {
                self.after_turn_write(slot, sent);
            }
            // One epoch pin for the turn's events, so each box-table read in
            // them only bumps a counter (never held across the wait above).
            let batch = pollbox_core::boxes::read_batch();
            self.serve(&mut ready, &mut done);
            self.step_listings();
            drop(batch);
            (self.scratch.ready, self.scratch.done) = (ready, done);
            if self.clock() >= self.clocks.next_tick_ms {
                self.tick();
            }
            if self.shared().lifecycle().is_draining() && self.drain_step() {
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
        let mut later = std::mem::take(&mut self.scratch.later);
        for ev in ready.drain(..) {
            self.serve_or_defer(ev, &mut later);
        }
        let mut i = 0;
        while i < later.len() && self.clock() < self.clocks.next_tick_ms {
            self.on_event(later[i]);
            if self.pages(later[i]) {
                // Another step of its page, after what became ready.
                later.push(later[i]);
            }
            i += 1;
            if i == later.len() {
                break;
            }
            let turn = self.transmit.turn(
                &mut self.sockets.poll,
                &mut self.sockets.conns,
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
        self.scratch.later = later;
    }

    /// Serve `ev` now, or add it to `later` if it is a connection that ingests
    /// (or, once served, builds a page of a prefix: its next steps come
    /// later, between other connections' turns).
    fn serve_or_defer(&mut self, ev: Ready, later: &mut Vec<Ready>) {
        let ingests = self.conn_of(ev).is_some_and(|c| c.core.ingesting());
        if ingests {
            later.push(ev);
        } else {
            self.on_event(ev);
            if self.pages(ev) {
                later.push(ev);
            }
        }
    }

    /// Whether `ev`'s connection builds a page of a prefix.
    fn pages(&mut self, ev: Ready) -> bool {
        self.conn_of(ev).is_some_and(|c| c.core.paging())
    }

    /// The connection `ev` is for, if it is still open.
    fn conn_of(&mut self, ev: Ready) -> Option<&mut Conn> {
        let (slot, gen) = slot_gen(ev.token)?;
        self.sockets.conns.get_mut(slot).filter(|c| c.gen == gen)
    }

    /// The ring cannot be used: write with `send` from now on.
    fn fall_back(&mut self, e: io::Error) {
        eprintln!(
            "pollbox: worker {}: io_uring failed ({e}); writing with send from now on",
            self.id
        );
        self.transmit = Box::new(SendNow::new());
        self.shared().uring_stopped();
    }

    fn on_event(&mut self, ev: Ready) {
        match Token(ev.token) {
            LISTENER => self.accept(Listener::Main),
            METRICS_LISTENER => self.accept(Listener::Metrics),
            WAKER => self.on_wake(),
            Token(t) => {
                let Some((slot, gen)) = slot_gen(t) else {
                    return;
                };
                // A closed connection's event (its slot may hold another now).
                let Some(mut c) = self.sockets.conns.take_gen(slot, gen) else {
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

    /// Bytes of all this worker's connections' buffers (`pollbox_buffered_bytes`).
    fn buffered(&self) -> usize {
        self.buffers.read_held() + self.counts.conn_send_bytes
    }
}
