//! # pollbox-server
//!
//! The I/O shell around `pollbox-core`: it owns sockets, threads, clocks and
//! files, moves bytes between the sockets and each connection's state machine
//! in the core, and counts. What a request gets back and what happens on a
//! connection next are decided in the core ([`pollbox_core::service`],
//! [`pollbox_core::conn`]).
//!
//! Where things are: [`worker`] (the event loop and everything only a worker
//! touches: accept, readiness, read, hand bytes to the connection, write; the
//! sockets beside their state machines, how bytes are written — `send` or
//! io_uring —, what connections wait on, and the server as the core sees it),
//! [`wakeups`] (long-poll wake-ups across workers), [`metrics`] (the
//! exposition), [`stats`] (per-worker counters), [`listener`] (sockets),
//! [`placement`] (where accepted connections are served), [`alloc_stats`]
//! (jemalloc's figures), [`snapshot_file`] (snapshot files: atomic save, load,
//! the writer thread), [`log`] (the Kafka client of a node built from a log),
//! [`auth_files`] (the key set and token files, read again on SIGHUP and when
//! they change), [`lifecycle`] (ready, draining, the workers stopped),
//! [`wal`] (the write-ahead file: append, group commit, apply, recovery).
//!
//! What it is not: a general HTTP server, or a place where protocol rules live.

#![warn(unreachable_pub)]

pub mod alloc_stats;
mod auth_files;
mod clock;
mod cores;
mod failpoint;
mod lifecycle;
mod listener;
pub mod log;
pub mod metrics;
mod migrate;
mod placement;
mod preflight;
mod shared;
mod snapshot_file;
mod start_error;
pub mod stats;
mod thread_priority;
mod wakeups;
mod wal;
mod worker;
mod worker_threads;

pub(crate) use cores::available_cores;
pub use migrate::{migrate, Migrated};
pub use start_error::StartError;
pub use worker::STREAM_NOTSENT_LOWAT;

use pollbox_core::config::Config;
use pollbox_core::service::Node;
use preflight::Preflight;
use shared::Shared;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// A running server.
pub struct Server {
    shared: Arc<Shared>,
    addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    threads: Vec<JoinHandle<io::Result<()>>>,
    wakers: Vec<Arc<mio::Waker>>,
    snapshot_path: Option<PathBuf>,
    snapshot_stop: Arc<(Mutex<bool>, Condvar)>,
    /// The snapshot thread, which hands the chain back when it stops.
    snapshot_thread: Option<JoinHandle<snapshot_file::Snapshots>>,
    /// The threads consuming the log and serving its delivery reports
    /// (`[log]` set).
    log_thread: Option<log::LogThreads>,
    /// The write-ahead file's writing and applying threads (`[wal]` set).
    wal_threads: Option<wal::writer::Threads>,
    /// The thread reading the auth files again when they change.
    auth_reloader: Option<auth_files::Reloader>,
    /// Keeps another pollbox off the address while this one runs.
    _claim: listener::Claim,
}

impl Server {
    /// Check everything [`Server::start`] checks before it binds (the
    /// config, the files it names, the listen address, the snapshot and its
    /// directory) and return the effective config (`check-config`).
    pub fn check(config: Config) -> Result<Config, StartError> {
        Preflight::run(config, false).map(|p| p.config)
    }

    /// Load the snapshot (if configured), bind, and start the workers.
    pub fn start(config: Config) -> Result<Server, StartError> {
        failpoint::init();
        let Preflight {
            config,
            plan,
            boxes,
            position,
            chain,
            snapshot_path,
            addr,
            started,
            wal,
        } = Preflight::run(config, true)?;
        if snapshot_path.is_some() {
            // Removals from now on go into the next delta.
            boxes.track_changes();
        }
        let logged = config.log.enabled();
        let wal = wal.map(Arc::new);
        let log_state = logged.then(|| Arc::new(log::LogState::new(&config.log, position)));
        let n = config.effective_workers(available_cores());
        let (actual, listeners, claim) =
            listener::bind_all(addr, n).map_err(|source| StartError::Listen {
                addr: config.server.listen.clone(),
                source,
            })?;
        // From here on versions past the snapshot's may be served: a crash
        // must find it unsealed (and re-stamp its versions).
        if let Some(p) = &snapshot_path {
            snapshot_file::unseal(p).map_err(|e| StartError::Snapshot {
                path: p.display().to_string(),
                reason: format!("cannot remove its seal: {e}"),
            })?;
        }
        let metrics_listener =
            listener::bind_metrics(&config.server.metrics_listen).map_err(|source| {
                StartError::Listen {
                    addr: config.server.metrics_listen.clone(),
                    source,
                }
            })?;
        let metrics_addr = metrics_listener
            .as_ref()
            .map(|l| l.local_addr())
            .transpose()?;
        let (polls, wakers) = worker_threads::new_polls(n)?;
        let auth_files = auth_files::AuthFiles::new(&config);
        let compact_percent = config.snapshot.compact_percent;
        let wakeups = Arc::new(wakeups::Wakeups::new(wakers.clone()));
        let producer = start_producer(&config, log_state.as_ref())?;
        let node = Node::new(config, plan, boxes);
        let shared = Arc::new(Shared::new(
            node,
            &wakers,
            wakeups,
            started,
            shared::Sources {
                log: log_state,
                producer,
                wal: wal.clone(),
            },
            auth_files,
        ));
        let wal_threads = match &wal {
            Some(w) => Some(wal::writer::spawn(wal::writer::Writing {
                node: shared.node().clone(),
                wal: w.clone(),
                wakeups: shared.wakeups().clone(),
            })?),
            None => None,
        };
        let threads = worker_threads::start_workers(&shared, listeners, polls, metrics_listener)?;
        let snapshot_stop = Arc::new((Mutex::new(false), Condvar::new()));
        let snapshot_thread = match &snapshot_path {
            Some(p) => {
                let snapshots =
                    snapshot_file::Snapshots::new(p.clone(), chain).compact_at(compact_percent);
                let writing = snapshot_file::Writing {
                    node: shared.node().clone(),
                    log: shared.log().cloned(),
                    wal: shared.wal().cloned(),
                    started: shared.started(),
                    stats: shared.snapshots().clone(),
                };
                let stop = snapshot_stop.clone();
                Some(
                    std::thread::Builder::new()
                        .name("pollbox-snapshot".into())
                        .spawn(move || snapshot_file::writer_loop(writing, stop, snapshots))?,
                )
            }
            None => None,
        };
        let log_thread = match shared.log() {
            Some(l) => Some(log::spawn(log::LogParts {
                node: shared.node().clone(),
                log: l.clone(),
                wakeups: shared.wakeups().clone(),
                lifecycle: shared.lifecycle().clone(),
                producer: shared.producer().cloned(),
                listen: actual,
            })?),
            None => None,
        };
        let auth_reloader =
            auth_files::Reloader::spawn(shared.node().clone(), shared.auth_files().clone())?;
        shared.lifecycle().set_ready();
        Ok(Server {
            shared,
            addr: actual,
            metrics_addr,
            threads,
            wakers,
            snapshot_path,
            snapshot_stop,
            snapshot_thread,
            log_thread,
            wal_threads,
            auth_reloader,
            _claim: claim,
        })
    }

    /// The address the workers listen on (the real port when 0 was asked).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The node: its config, box table and tokens.
    pub fn node(&self) -> &Arc<Node> {
        self.shared.node()
    }

    /// Ready, draining, the workers stopped (a handle that outlives a
    /// [`Server::shutdown`] in progress, for who waits on it).
    pub fn lifecycle(&self) -> &Arc<lifecycle::Lifecycle> {
        self.shared.lifecycle()
    }

    /// Each worker's counters, by worker index.
    pub fn stats(&self) -> &[stats::WorkerStats] {
        self.shared.stats()
    }

    /// Who waits on which key (parked polls and event streams).
    pub fn wakeups(&self) -> &wakeups::Wakeups {
        self.shared.wakeups()
    }

    /// Connections open now, on every worker.
    pub fn open_connections(&self) -> usize {
        self.shared.open_connections()
    }

    /// How many workers run.
    pub fn workers(&self) -> usize {
        self.shared.workers()
    }

    /// Workers writing in io_uring batches (`server.io_uring`; the rest use `send`).
    pub fn uring_workers(&self) -> usize {
        self.shared.uring_workers()
    }

    /// The `/metrics` exposition now, appended to `out`.
    pub fn render_metrics(&self, out: &mut Vec<u8>) {
        metrics::render(&self.shared, out);
    }

    /// Read the key set and static token files again, now (what SIGHUP
    /// does; a change of a file does it too): the workers take the new keys
    /// at their next tick. On a failure the keys and tokens in use stay.
    /// Returns the new generation, or why nothing changed.
    pub fn reload_auth(&self, why: &str) -> Result<u64, String> {
        auth_files::reload(self.shared.node(), self.shared.auth_files(), why)
    }

    /// Graceful stop: stop accepting, finish requests in flight, write the
    /// snapshot. Returns the first error met.
    pub fn shutdown(mut self) -> Result<(), String> {
        if let Some(w) = self.auth_reloader.take() {
            w.stop();
        }
        self.shared.lifecycle().start_draining();
        for w in &self.wakers {
            let _ = w.wake();
        }
        let mut first_err = None;
        for t in self.threads.drain(..) {
            match t.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_err.get_or_insert(format!("worker failed: {e}"));
                }
                Err(_) => {
                    first_err.get_or_insert("a worker panicked".to_string());
                }
            }
        }
        self.shared.lifecycle().stop_workers();
        // The workers answered what they waited for: the file's threads
        // write, sync and apply what is left, and end.
        if let (Some(w), Some(t)) = (self.shared.wal(), self.wal_threads.take()) {
            w.stop();
            t.join();
        }
        {
            let (lock, cv) = &*self.snapshot_stop;
            if let Ok(mut stop) = lock.lock() {
                *stop = true;
            }
            cv.notify_all();
        }
        let snapshots = self.snapshot_thread.take().and_then(|t| t.join().ok());
        // The log's threads see `workers_stopped` within one wait.
        if let Some(t) = self.log_thread.take() {
            t.join();
        }
        if let Some(p) = &self.snapshot_path {
            // A thread that panicked lost its chain: the final file is a base.
            let mut snapshots =
                snapshots.unwrap_or_else(|| snapshot_file::Snapshots::new(p.clone(), None));
            let position = match self.shared.wal() {
                Some(w) => Some(w.position()),
                None => self.shared.log().and_then(|l| l.position()),
            };
            let (boxes, now_ms) = (&self.shared.node().boxes, self.shared.table_now_ms());
            // Every worker has stopped: no version past this snapshot's was
            // served, so the next start may keep its versions (the seal names
            // the chain's newest file).
            if let Err(e) = snapshots
                .save(boxes, now_ms, position.as_ref())
                .and_then(|saved| snapshot_file::seal(p, saved.newest_crc))
            {
                first_err.get_or_insert(format!("final snapshot to {}: {e}", p.display()));
            } else if let (Some(w), Some(pos)) = (self.shared.wal(), &position) {
                w.snapshot_covers(pos);
            }
        }
        match first_err {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
}

/// SIGTERM and SIGINT (drain and stop), and SIGHUP (read the auth files
/// again), caught. Install them before the server announces its address, so
/// a signal sent right after start-up still drains gracefully.
pub struct ShutdownSignals(signal_hook::iterator::Signals);

impl ShutdownSignals {
    pub fn install() -> Result<ShutdownSignals, String> {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])
            .map(ShutdownSignals)
            .map_err(|e| format!("cannot install signal handlers: {e}"))
    }
}

/// Serve until SIGTERM or SIGINT, then shut down gracefully; on SIGHUP read
/// the key set and static token files again ([`Server::reload_auth`]).
pub fn serve_until_signal(server: Server, mut signals: ShutdownSignals) -> Result<(), String> {
    for sig in signals.0.forever() {
        if sig == signal_hook::consts::SIGHUP {
            let _ = server.reload_auth("SIGHUP");
            continue;
        }
        let snapshot = if server.snapshot_path.is_some() {
            ", write the snapshot"
        } else {
            ""
        };
        eprintln!("pollbox: signal {sig}: draining (stop accepting, finish requests{snapshot})");
        break;
    }
    let boxes = server.shared.node().boxes.len();
    let r = server.shutdown();
    if r.is_ok() {
        eprintln!("pollbox: stopped cleanly ({boxes} boxes)");
    }
    r
}

/// On a node of a log (`log`): the producer ingest writes to.
fn start_producer(
    config: &Config,
    log: Option<&Arc<log::LogState>>,
) -> Result<Option<Arc<log::Producer>>, StartError> {
    let Some(l) = log else {
        return Ok(None);
    };
    let p = log::Producer::new(&config.log, l.clone())
        .map_err(|e| StartError::Log(format!("cannot create the Kafka producer: {e}")))?;
    Ok(Some(Arc::new(p)))
}
