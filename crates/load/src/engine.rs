//! One load thread: a mio event loop over the connections it owns.
//!
//! Timing, in nanoseconds since the run's origin:
//! - open-loop: connection `i` of `C` intends to send its `k`-th request at
//!   `i/R + k·C/R`. A request that cannot go out on time (the connection is waiting on
//!   a pipeline-full of answers, or is reconnecting) waits, and its latency is still
//!   counted from its intended time, so a stalled server shows up in the percentiles
//!   instead of silently slowing the generator down (coordinated omission, corrected as
//!   wrk2 does);
//! - closed-loop: every connection keeps `--pipeline` requests in flight and latency is
//!   counted from the moment a request is queued for writing.
//!
//! Requests intended before the warm-up's end are answered and validated but left out
//! of the statistics. Nothing new is sent after the run's end; answers are awaited for a
//! drain period, and what is still unanswered then counts as a timeout.
//!
//! Hot path: requests are rendered into the connection's reused output buffer and all
//! requests due at once go out in one `write`; answers are framed with httparse straight
//! from the connection's reused input buffer. Steady state allocates nothing.
//!
//! Its parts, one job each: `event_loop` (a thread's run: its connections set up,
//! the loop over timers and readiness), `pacing` (when each connection sends: the
//! open-loop schedule, the closed-loop pipeline), `driver` (rendering requests,
//! writing them, reading and framing answers), `answer_check` (each answer against
//! its request), `connection` (a connection's state and its failures and
//! reconnects), `versions` and `key_sets` (what a connection remembers between
//! answers).

mod answer_check;
mod connection;
mod driver;
mod event_loop;
mod failures;
mod key_sets;
mod pacing;
mod versions;

pub use event_loop::drive;

use std::net::SocketAddr;

use crate::keys::KeySampler;
use crate::mix::Mix;
use crate::request::Requests;

/// Key sets each connection draws for `poll_many` and `longpoll_many`.
pub const KEY_SETS: usize = 4;

/// What every thread of a run shares, read-only.
pub struct Plan {
    pub addr: SocketAddr,
    pub requests: Requests,
    pub mix: Mix,
    pub keys: KeySampler,
    pub key_count: u32,
    /// Keys of each `poll_many` and `longpoll_many` request.
    pub keys_per_request: usize,
    pub pipeline: usize,
    /// Open-loop: nanoseconds between two requests of one connection.
    pub interval_ns: Option<f64>,
    /// Connections in the whole run (for the open-loop stagger).
    pub connections: usize,
    pub warmup_ns: u64,
    /// End of the measured window: nothing is sent from here on.
    pub end_ns: u64,
    /// How long after `end_ns` to wait for outstanding answers.
    pub drain_ns: u64,
    pub seed: u64,
    /// With `--sse`: each key's newest ingested version and when it was sent.
    pub published: Option<std::sync::Arc<crate::sse::Published>>,
}

#[cfg(test)]
mod tests;
