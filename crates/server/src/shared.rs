//! The state every worker shares, and that the server's other threads are
//! handed pieces of: the node (config, box table, tokens), each worker's
//! counters, the open connection count, the lifecycle, the wake-ups, the
//! placement, the clocks' start, the log's position and producer, the auth
//! files. Its fields are private: each part reads what it needs through a
//! method, and the threads that outlive a borrow hold their own `Arc`s.
//!
//! What it is not: a worker's own state ([`crate::worker`]), or the place
//! where any of these pieces is implemented.

use crate::auth_files::AuthFiles;
use crate::clock::table_clock;
use crate::lifecycle::Lifecycle;
use crate::log::{LogState, Producer};
use crate::placement::Placement;
use crate::snapshot_file::SnapshotStats;
use crate::stats::WorkerStats;
use crate::wakeups::Wakeups;
use crate::wal::Wal;
use pollbox_core::service::Node;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// State every worker shares.
pub(crate) struct Shared {
    /// The config, the box table and the tokens (what the core shares).
    node: Arc<Node>,
    /// One per worker.
    stats: Vec<WorkerStats>,
    open_connections: AtomicUsize,
    /// Workers writing in io_uring batches (`server.io_uring`; the rest use `send`).
    uring_workers: AtomicUsize,
    /// Ready, draining, the workers stopped (the log's threads hold it too).
    lifecycle: Arc<Lifecycle>,
    /// Who waits on which key, and each worker's inbox (the log's threads
    /// and the producer's delivery reports hold them too).
    wakeups: Arc<Wakeups>,
    /// Where accepted connections are served (by load), and the hand-over.
    placement: Placement,
    /// The server's clock starts here: every worker's `now_ms` (so box expiry
    /// stamps agree between workers) and the snapshots'.
    started: Instant,
    workers: usize,
    /// The snapshot thread's figures, for metrics (the snapshot thread holds
    /// them too).
    snapshots: Arc<SnapshotStats>,
    /// Bytes jemalloc had allocated, when start-up finished, outside the parts
    /// pollbox accounts (the Rust runtime, argument parsing, the config, the
    /// workers' fixed structures). Measured once; it does not grow.
    runtime_bytes: AtomicUsize,
    /// Where the node stands in its log (`[log]` set), else `None`.
    log: Option<Arc<LogState>>,
    /// What ingest produces to, on a node of a log (the consuming thread
    /// holds it too: it serves its delivery reports).
    producer: Option<Arc<Producer>>,
    /// The key set and static token files, read again while serving (the
    /// watcher thread holds them too).
    auth_files: Arc<AuthFiles>,
    /// The write-ahead file (`[wal]` set): what ingest appends to.
    wal: Option<Arc<Wal>>,
}

/// Where ingest goes besides the table: a Kafka log (its state and
/// producer), or the write-ahead file; all `None` on a plain standalone
/// node.
pub(crate) struct Sources {
    pub log: Option<Arc<LogState>>,
    pub producer: Option<Arc<Producer>>,
    pub wal: Option<Arc<Wal>>,
}

impl Shared {
    /// The state of a server of `node`, a worker for each of `wakers` (whom
    /// `waiters` wake); not ready yet.
    pub(crate) fn new(
        node: Node,
        wakers: &[Arc<mio::Waker>],
        wakeups: Arc<Wakeups>,
        started: Instant,
        sources: Sources,
        auth_files: AuthFiles,
    ) -> Shared {
        let Sources { log, producer, wal } = sources;
        let n = wakers.len();
        Shared {
            node: Arc::new(node),
            stats: (0..n).map(|_| WorkerStats::default()).collect(),
            open_connections: AtomicUsize::new(0),
            uring_workers: AtomicUsize::new(0),
            lifecycle: Arc::default(),
            wakeups,
            placement: Placement::new(wakers),
            started,
            workers: n,
            snapshots: Arc::default(),
            runtime_bytes: AtomicUsize::new(0),
            log,
            producer,
            auth_files: Arc::new(auth_files),
            wal,
        }
    }

    /// The config, the box table and the tokens.
    #[inline]
    pub(crate) fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// Each worker's counters, by worker index.
    #[inline]
    pub(crate) fn stats(&self) -> &[WorkerStats] {
        &self.stats
    }

    /// A connection was accepted: count it. Returns how many were open before.
    #[inline]
    pub(crate) fn connection_opened(&self) -> usize {
        self.open_connections.fetch_add(1, Ordering::AcqRel)
    }

    /// A connection counted by [`Shared::connection_opened`] was closed (or
    /// refused after all).
    #[inline]
    pub(crate) fn connection_closed(&self) {
        self.open_connections.fetch_sub(1, Ordering::AcqRel);
    }

    /// Connections open now, on every worker.
    pub(crate) fn open_connections(&self) -> usize {
        self.open_connections.load(Ordering::Acquire)
    }

    /// A worker writes with io_uring.
    pub(crate) fn uring_started(&self) {
        self.uring_workers.fetch_add(1, Ordering::Relaxed);
    }

    /// A worker's ring failed: it writes with `send` from now on.
    pub(crate) fn uring_stopped(&self) {
        self.uring_workers.fetch_sub(1, Ordering::Relaxed);
    }

    /// Workers writing in io_uring batches.
    pub(crate) fn uring_workers(&self) -> usize {
        self.uring_workers.load(Ordering::Relaxed)
    }

    /// Ready, draining, the workers stopped.
    #[inline]
    pub(crate) fn lifecycle(&self) -> &Arc<Lifecycle> {
        &self.lifecycle
    }

    /// Who waits on which key, and each worker's inbox.
    #[inline]
    pub(crate) fn wakeups(&self) -> &Arc<Wakeups> {
        &self.wakeups
    }

    /// Where accepted connections are served, and the hand-over.
    #[inline]
    pub(crate) fn placement(&self) -> &Placement {
        &self.placement
    }

    /// When the server's clock started.
    #[inline]
    pub(crate) fn started(&self) -> Instant {
        self.started
    }

    /// How many workers run.
    pub(crate) fn workers(&self) -> usize {
        self.workers
    }

    /// The snapshot thread's figures.
    pub(crate) fn snapshots(&self) -> &Arc<SnapshotStats> {
        &self.snapshots
    }

    /// Fixed start-up memory outside what pollbox accounts, measured once
    /// the workers are built.
    pub(crate) fn set_runtime_bytes(&self, bytes: usize) {
        self.runtime_bytes.store(bytes, Ordering::Relaxed);
    }

    /// [`Shared::set_runtime_bytes`]'s figure (0 before it).
    pub(crate) fn runtime_bytes(&self) -> usize {
        self.runtime_bytes.load(Ordering::Relaxed)
    }

    /// Where the node stands in its log (`[log]` set).
    #[inline]
    pub(crate) fn log(&self) -> Option<&Arc<LogState>> {
        self.log.as_ref()
    }

    /// What ingest produces to, on a node of a log.
    #[inline]
    pub(crate) fn producer(&self) -> Option<&Arc<Producer>> {
        self.producer.as_ref()
    }

    /// The write-ahead file (`[wal]` set).
    #[inline]
    pub(crate) fn wal(&self) -> Option<&Arc<Wal>> {
        self.wal.as_ref()
    }

    /// The key set and static token files.
    pub(crate) fn auth_files(&self) -> &Arc<AuthFiles> {
        &self.auth_files
    }

    /// Listening, the snapshot loaded, and with a log: caught up with the log
    /// as it stood at start, still applying it, its clients working.
    pub(crate) fn is_ready(&self) -> bool {
        self.lifecycle.is_started()
            && self.log.as_ref().is_none_or(|l| l.ready())
            && self.wal.as_ref().is_none_or(|w| w.failed().is_none())
            && self.node.presence.caught_up()
    }

    /// Milliseconds since the server started (the clock of timeouts).
    pub(crate) fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// The clock box expiry counts on, from a worker's `now_ms`: on a
    /// standalone node the server's own (ms since start, so a snapshot's idle
    /// times carry over a restart); on a node of a log the wall clock (ms
    /// since the Unix epoch), the clock of the records' timestamps, so every
    /// node and every replay expires the same boxes.
    pub(crate) fn table_clock(&self, now_ms: u64) -> u64 {
        table_clock(self.log.is_some() || self.wal.is_some(), now_ms)
    }

    /// [`Shared::table_clock`] now.
    pub(crate) fn table_now_ms(&self) -> u64 {
        self.table_clock(self.now_ms())
    }
}
