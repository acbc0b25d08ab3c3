//! One connection of a load thread: what it holds (its socket, buffers, requests in
//! flight, and what it remembers between answers) and its state (open,
//! connecting, down until a retry).
//!
//! What it is not: its life through failures (`failures`), the sending and
//! reading of requests (`driver`), nor when they are sent (`pacing`).

use std::collections::VecDeque;

use mio::net::TcpStream;

use super::key_sets::KeySets;
use super::versions::Versions;
use crate::keys::Rng;
use crate::mix::Op;

/// A request waiting for its answer.
#[derive(Debug, Clone, Copy)]
pub(super) struct InFlight {
    pub(super) op: Op,
    /// The key; for the many-box operations, the key set's index.
    pub(super) key: u32,
    /// Intended send time.
    pub(super) intended: u64,
    /// Long-poll: the version sent as `after`. Many-box operations: the
    /// [`etag_id`](super::key_sets::etag_id) of the `If-None-Match` sent, 0 if none.
    pub(super) after: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    Open,
    Connecting,
    Down { retry_at: u64 },
}

pub(super) struct Conn {
    /// Index among all connections of the run.
    pub(super) global: usize,
    pub(super) stream: Option<TcpStream>,
    pub(super) state: State,
    pub(super) out: Vec<u8>,
    pub(super) out_pos: usize,
    /// The socket refused part of `out`; wait for writability.
    pub(super) want_write: bool,
    pub(super) input: Vec<u8>,
    pub(super) in_start: usize,
    pub(super) in_end: usize,
    pub(super) inflight: VecDeque<InFlight>,
    pub(super) rng: Rng,
    pub(super) versions: Versions,
    pub(super) sets: KeySets,
    /// Open-loop: requests taken from the schedule so far.
    pub(super) sent: u64,
    /// Wake-up pending in the heap, if any.
    pub(super) wake_at: Option<u64>,
}
