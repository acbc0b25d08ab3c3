//! Where the server stands in its life: ready (listening, the snapshot
//! loaded), draining (a graceful stop begun), the workers stopped (the drain
//! over). Each flag is set once, by [`crate::Server`], and read by the
//! workers, the log's consumer and the probes.

use std::sync::atomic::{AtomicBool, Ordering};

/// The server's lifecycle flags, each set once and never cleared.
#[derive(Debug, Default)]
pub struct Lifecycle {
    ready: AtomicBool,
    draining: AtomicBool,
    /// Every worker has exited (the drain is over): the log's consumer stops.
    /// It goes on while the workers drain, so an ingest in flight at a
    /// SIGTERM is answered with its record's fate, not 503 at its deadline.
    workers_stopped: AtomicBool,
}

impl Lifecycle {
    /// Listening, the snapshot loaded: the server may be ready (with a log,
    /// once caught up too: the server's readiness, `Shared::is_ready`, reads
    /// both).
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// Whether [`Lifecycle::set_ready`] was called.
    pub fn is_started(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// A graceful stop begins: stop accepting, finish requests in flight.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Whether the drain has begun, and what was written before it began is
    /// seen.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Whether the drain has begun, as a hint (no ordering with what was
    /// written before it began: for checks that only decide what to skip).
    pub fn is_draining_relaxed(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Every worker has exited.
    pub fn stop_workers(&self) {
        self.workers_stopped.store(true, Ordering::Release);
    }

    /// Whether every worker has exited (the drain is over).
    pub fn workers_stopped(&self) -> bool {
        self.workers_stopped.load(Ordering::Acquire)
    }
}
