//! A worker's connections: each one's socket beside its core state machine, in
//! a slab whose slots are reused (a generation tells a reused slot's new
//! connection from a timer or wake-up meant for the old one).
//!
//! What it is not: the connection's state (that is the core's
//! [`Connection`]), or the wake-up registry shared between workers.

use super::waiting::Registration;
use mio::net::TcpStream;
use pollbox_core::conn::Connection;
use pollbox_core::wheel::TimerId;

/// A connection's socket and state machine, with what the worker made for
/// it when applying its actions (its timer, its registration) and what only
/// the socket knows. Nothing here copies the state machine's state.
pub(super) struct Conn {
    pub stream: TcpStream,
    pub core: Connection,
    pub gen: u32,
    /// The wheel entry armed for the connection ([`Action::Arm`]).
    ///
    /// [`Action::Arm`]: pollbox_core::conn::Action::Arm
    pub timer: Option<TimerId>,
    /// Where its watch is registered ([`Action::Watch`]).
    ///
    /// [`Action::Watch`]: pollbox_core::conn::Action::Watch
    pub watch: Option<Registration>,
    /// Reading stopped before the socket said WouldBlock (parked, back-pressure):
    /// with edge-triggered readiness no new edge comes for those bytes, so read
    /// again as soon as the connection wants to.
    pub unread: bool,
    /// epoll said the peer shut down its side (EPOLLRDHUP): read to EOF.
    pub peer_hup: bool,
    /// Its answers wait for the end of the loop turn (batched writes).
    pub queued: bool,
    /// Its write side was shut down (lingering, or closing).
    pub write_shut: bool,
    /// On the worker's list of connections waiting for buffer budget.
    pub starved: bool,
    /// Its socket's `TCP_NOTSENT_LOWAT` was set (an event stream's).
    pub lowat_set: bool,
    /// On the worker's list of rooms waiting for a new cut.
    pub room_listed: bool,
    /// On the worker's list of rooms whose listing takes its next step at
    /// the next turn.
    pub room_stepping: bool,
}

impl Conn {
    pub(super) fn new(stream: TcpStream, core: Connection, gen: u32) -> Conn {
        Conn {
            stream,
            core,
            gen,
            timer: None,
            watch: None,
            unread: false,
            peer_hup: false,
            queued: false,
            write_shut: false,
            starved: false,
            lowat_set: false,
            room_listed: false,
            room_stepping: false,
        }
    }
}

/// The connections, by slot. A connection being worked on is taken out of its
/// slot and put back (or closed) when done.
///
/// Each connection is boxed: a slot is a pointer, so taking a connection out
/// and putting it back (every event) moves 8 bytes, not the ~1.2 KB of a
/// `Conn`; and the slab growing (its `Vec` doubles) copies pointers, so no
/// connection's bytes are ever copied, and no capacity of whole `Conn`s is
/// left empty. With the slots inline, 10,000 event streams held 16,384
/// slots (19 MB) and left the 8,192 of the copy before as dirty pages: ~2 KB
/// per stream (BENCHMARKS.md, "Memory per open event stream").
#[derive(Default)]
pub(super) struct Slab {
    slots: Vec<Option<Box<Conn>>>,
    free: Vec<usize>,
    next_gen: u32,
    open: usize,
}

impl Slab {
    /// A slot and generation for a new connection (fill it with [`Slab::put`]).
    pub(super) fn vacant(&mut self) -> (usize, u32) {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        self.next_gen = self.next_gen.wrapping_add(1);
        self.open += 1;
        (slot, self.next_gen)
    }

    /// Give back a slot that [`Slab::vacant`] handed out (the connection closed).
    pub(super) fn release(&mut self, slot: usize) {
        self.free.push(slot);
        self.open -= 1;
    }

    pub(super) fn take(&mut self, slot: usize) -> Option<Box<Conn>> {
        self.slots.get_mut(slot).and_then(Option::take)
    }

    /// Take the connection only if it is generation `gen`.
    pub(super) fn take_gen(&mut self, slot: usize, gen: u32) -> Option<Box<Conn>> {
        match self.slots.get(slot) {
            Some(Some(c)) if c.gen == gen => self.take(slot),
            _ => None,
        }
    }

    pub(super) fn put(&mut self, slot: usize, conn: Box<Conn>) {
        self.slots[slot] = Some(conn);
    }

    pub(super) fn get_mut(&mut self, slot: usize) -> Option<&mut Conn> {
        self.slots.get_mut(slot).and_then(Option::as_deref_mut)
    }

    /// Slots that may hold a connection.
    pub(super) fn slots(&self) -> std::ops::Range<usize> {
        0..self.slots.len()
    }

    /// Open connections (taken out ones included).
    pub(super) fn is_empty(&self) -> bool {
        self.open == 0
    }

    /// Heap bytes of the slab itself and of its open connections' boxes (at
    /// the allocator's size class).
    pub(super) fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Option<Box<Conn>>>()
            + self.open * pollbox_core::boxes::size_class(std::mem::size_of::<Conn>())
            + self.free.capacity() * std::mem::size_of::<usize>()
    }
}
