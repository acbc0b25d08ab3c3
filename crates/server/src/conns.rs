//! A worker's connections: each one's socket beside its core state machine, in
//! a slab whose slots are reused (a generation tells a reused slot's new
//! connection from a timer or wake-up meant for the old one).

use mio::net::TcpStream;
use pollbox_core::conn::Connection;
use pollbox_core::wheel::TimerId;

pub struct Conn {
    pub stream: TcpStream,
    pub core: Connection,
    pub gen: u32,
    /// The wheel entry armed for the connection, and its deadline.
    pub timer: Option<TimerId>,
    pub armed_ms: u64,
    /// Reading stopped before the socket said WouldBlock (parked, back-pressure):
    /// with edge-triggered readiness no new edge comes for those bytes, so read
    /// again as soon as the connection wants to.
    pub unread: bool,
    /// epoll said the peer shut down its side (EPOLLRDHUP): read to EOF.
    pub peer_hup: bool,
    /// The key hash this connection is registered under in the worker's parked
    /// index (a parked long-poll's or an event stream's key).
    pub registered: Option<u64>,
    /// What registered it: an event stream (else a long-poll).
    pub registered_stream: bool,
    /// The hashes of the keys a many-box long-poll is registered on (empty
    /// otherwise: `registered` is then the key's hash).
    pub registered_keys: Vec<u64>,
    /// Its answers wait for the end of the loop turn (batched writes).
    pub queued: bool,
    /// Its write side was shut down (lingering, or closing).
    pub write_shut: bool,
    /// Send-queue bytes this connection adds to the worker's total (its read
    /// buffer is counted by the worker's `Buffers`).
    pub accounted: usize,
    /// What `watched` last counted for it (its watch state: keys, where a
    /// stream of many boxes stands, the hashes it is registered under).
    pub watched: usize,
    /// On the worker's list of connections waiting for buffer budget.
    pub starved: bool,
    /// Its socket's `TCP_NOTSENT_LOWAT` was set (an event stream's).
    pub lowat_set: bool,
    /// The log request it is registered under in the worker's index (a node
    /// of a log's ingest waiting for its records).
    pub awaiting: Option<u64>,
}

impl Conn {
    pub fn new(stream: TcpStream, core: Connection, gen: u32) -> Conn {
        Conn {
            stream,
            core,
            gen,
            timer: None,
            armed_ms: 0,
            unread: false,
            peer_hup: false,
            awaiting: None,
            registered: None,
            registered_stream: false,
            registered_keys: Vec::new(),
            queued: false,
            write_shut: false,
            accounted: 0,
            watched: 0,
            starved: false,
            lowat_set: false,
        }
    }
}

/// The connections, by slot. A connection being worked on is taken out of its
/// slot and put back (or closed) when done.
#[derive(Default)]
pub struct Slab {
    slots: Vec<Option<Conn>>,
    free: Vec<usize>,
    next_gen: u32,
    open: usize,
}

impl Slab {
    /// A slot and generation for a new connection (fill it with [`Slab::put`]).
    pub fn vacant(&mut self) -> (usize, u32) {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        self.next_gen = self.next_gen.wrapping_add(1);
        self.open += 1;
        (slot, self.next_gen)
    }

    /// Give back a slot that [`Slab::vacant`] handed out (the connection closed).
    pub fn release(&mut self, slot: usize) {
        self.free.push(slot);
        self.open -= 1;
    }

    pub fn take(&mut self, slot: usize) -> Option<Conn> {
        self.slots.get_mut(slot).and_then(Option::take)
    }

    /// Take the connection only if it is generation `gen`.
    pub fn take_gen(&mut self, slot: usize, gen: u32) -> Option<Conn> {
        match self.slots.get(slot) {
            Some(Some(c)) if c.gen == gen => self.take(slot),
            _ => None,
        }
    }

    /// Always inlined: a call moves the connection (hundreds of bytes) once
    /// more on every event (callgrind: a `memcpy` of ~150 instructions).
    #[inline(always)]
    pub fn put(&mut self, slot: usize, conn: Conn) {
        self.slots[slot] = Some(conn);
    }

    pub fn get_mut(&mut self, slot: usize) -> Option<&mut Conn> {
        self.slots.get_mut(slot).and_then(Option::as_mut)
    }

    /// Slots that may hold a connection.
    pub fn slots(&self) -> std::ops::Range<usize> {
        0..self.slots.len()
    }

    /// Open connections (taken out ones included).
    pub fn is_empty(&self) -> bool {
        self.open == 0
    }

    /// Heap bytes of the slab itself.
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Option<Conn>>()
            + self.free.capacity() * std::mem::size_of::<usize>()
    }
}
