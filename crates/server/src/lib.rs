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
//! they change), [`lifecycle`] (ready, draining, the workers stopped).
//!
//! What it is not: a general HTTP server, or a place where protocol rules live.

pub mod alloc_stats;
pub mod auth_files;
pub mod failpoint;
pub mod lifecycle;
pub mod listener;
pub mod log;
pub mod metrics;
pub mod placement;
pub mod snapshot_file;
pub mod stats;
pub mod wakeups;
pub mod worker;

use pollbox_core::boxes::BoxTable;
use pollbox_core::config::Config;
use pollbox_core::plan::Plan;
use pollbox_core::service::Node;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// State every worker shares.
pub struct Shared {
    /// The config, the box table and the tokens (what the core shares).
    pub node: Arc<Node>,
    /// One per worker.
    pub stats: Vec<stats::WorkerStats>,
    pub open_connections: AtomicUsize,
    /// Workers writing in io_uring batches (`server.io_uring`; the rest use `send`).
    pub uring_workers: AtomicUsize,
    /// Ready, draining, the workers stopped (the log's threads hold it too).
    pub lifecycle: Arc<lifecycle::Lifecycle>,
    /// Who waits on which key, and each worker's inbox (the log's threads
    /// and the producer's delivery reports hold them too).
    pub waiters: Arc<wakeups::Waiters>,
    /// Where accepted connections are served (by load), and the hand-over.
    pub placement: placement::Placement,
    /// The server's clock starts here: every worker's `now_ms` (so box expiry
    /// stamps agree between workers) and the snapshots'.
    pub started: Instant,
    pub workers: usize,
    /// The snapshot thread's figures, for metrics (the snapshot thread holds
    /// them too).
    pub snapshots: Arc<snapshot_file::SnapshotStats>,
    /// Bytes jemalloc had allocated, when start-up finished, outside the parts
    /// pollbox accounts (the Rust runtime, argument parsing, the config, the
    /// workers' fixed structures). Measured once; it does not grow.
    pub runtime_bytes: AtomicUsize,
    /// Where the node stands in its log (`[log]` set), else `None`.
    pub log: Option<Arc<log::LogState>>,
    /// What ingest produces to, on a node of a log (the consuming thread
    /// holds it too: it serves its delivery reports).
    pub producer: Option<Arc<log::produce::Producer>>,
    /// The key set and static token files, read again while serving (the
    /// watcher thread holds them too).
    pub auth_files: Arc<auth_files::AuthFiles>,
}

impl Shared {
    /// The state of a server of `node`, a worker for each of `wakers` (whom
    /// `waiters` wake); not ready yet.
    fn new(
        node: Node,
        wakers: &[Arc<mio::Waker>],
        waiters: Arc<wakeups::Waiters>,
        started: Instant,
        log: Option<Arc<log::LogState>>,
        producer: Option<Arc<log::produce::Producer>>,
        auth_files: auth_files::AuthFiles,
    ) -> Shared {
        let n = wakers.len();
        Shared {
            node: Arc::new(node),
            stats: (0..n).map(|_| stats::WorkerStats::default()).collect(),
            open_connections: AtomicUsize::new(0),
            uring_workers: AtomicUsize::new(0),
            lifecycle: Arc::default(),
            waiters,
            placement: placement::Placement::new(wakers),
            started,
            workers: n,
            snapshots: Arc::default(),
            runtime_bytes: AtomicUsize::new(0),
            log,
            producer,
            auth_files: Arc::new(auth_files),
        }
    }

    /// Listening, the snapshot loaded, and with a log: caught up with the log
    /// as it stood at start.
    pub fn is_ready(&self) -> bool {
        self.lifecycle.is_started()
            && self
                .log
                .as_ref()
                .is_none_or(|l| l.caught_up() && !l.halted())
    }

    /// Milliseconds since the server started (the clock of timeouts).
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// The clock box expiry counts on, from a worker's `now_ms`: on a
    /// standalone node the server's own (ms since start, so a snapshot's idle
    /// times carry over a restart); on a node of a log the wall clock (ms
    /// since the Unix epoch), the clock of the records' timestamps, so every
    /// node and every replay expires the same boxes.
    pub fn table_clock(&self, now_ms: u64) -> u64 {
        table_clock(self.log.is_some(), now_ms)
    }

    /// [`Shared::table_clock`] now.
    pub fn table_now_ms(&self) -> u64 {
        self.table_clock(self.now_ms())
    }
}

/// The clock box expiry counts on, from the server's `now_ms` (ms since
/// start): on a standalone node that clock itself, on a node of a log
/// (`logged`) the wall clock ([`Shared::table_clock`]).
pub(crate) fn table_clock(logged: bool, now_ms: u64) -> u64 {
    if logged {
        wall_ms()
    } else {
        now_ms
    }
}

/// Run the calling thread at nice 19 (and the threads it starts from now on,
/// which inherit it): on a core it shares with a worker it gets what the
/// worker leaves, so it never stands in front of a readable poll for long.
pub(crate) fn lower_priority(what: &str) {
    // SAFETY: gettid takes no arguments and cannot fail; setpriority with
    // PRIO_PROCESS and a thread id changes only that thread's nice value (Linux).
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) };
    if r != 0 {
        eprintln!(
            "pollbox: {what} thread keeps its priority ({})",
            std::io::Error::last_os_error()
        );
    }
}

/// Microseconds since the Unix epoch: a standalone node's version clock
/// (`pollbox_core::boxes::VersionClock`).
pub fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Milliseconds since the Unix epoch.
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Why the server did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid config: {0}")]
    Config(#[from] pollbox_core::config::ConfigError),
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: String, source: io::Error },
    #[error("snapshot {path}: {reason}")]
    Snapshot { path: String, reason: String },
    #[error("log: {0}")]
    Log(String),
    #[error("{0}")]
    Io(#[from] io::Error),
}

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
    /// The thread consuming the log (`[log]` set).
    log_thread: Option<JoinHandle<()>>,
    /// The thread reading the auth files again when they change.
    auth_watcher: Option<auth_files::Watcher>,
    /// Keeps another pollbox off the address while this one runs.
    _claim: listener::Claim,
}

/// What a start needs before it binds: the config with the secrets its files
/// hold, the compiled plan, the boxes and log position of the snapshot, the
/// address to listen on. [`Server::check`] stops here (`check-config`).
struct Preflight {
    config: Config,
    plan: Arc<Plan>,
    boxes: BoxTable,
    position: Option<pollbox_core::log::Position>,
    /// The chain the next snapshot extends (`None`: it starts a base).
    chain: Option<snapshot_file::Chain>,
    snapshot_path: Option<PathBuf>,
    addr: SocketAddr,
    started: Instant,
}

/// Read a file a config names (a token list, client properties).
fn read_named(key: &str, path: &str) -> Result<String, StartError> {
    std::fs::read_to_string(path).map_err(|e| {
        StartError::Config(pollbox_core::config::ConfigError::Invalid {
            key: key.into(),
            reason: format!("cannot read {path}: {e}"),
        })
    })
}

/// The first address `a` (`ip:port` or `name:port`) resolves to, IPv4 first
/// (a name like `localhost` may resolve to ::1 where IPv6 is off).
pub fn resolve(a: &str) -> io::Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    a.to_socket_addrs()?
        .min_by_key(SocketAddr::is_ipv6)
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the name resolves to no address"))
}

impl Preflight {
    fn run(mut config: Config) -> Result<Preflight, StartError> {
        config.validate()?;
        if !config.auth.ingest_tokens_file.is_empty() {
            let f = config.auth.ingest_tokens_file.clone();
            config.add_tokens(false, &read_named("auth.ingest_tokens_file", &f)?, &f)?;
        }
        if !config.auth.metrics_tokens_file.is_empty() {
            let f = config.auth.metrics_tokens_file.clone();
            config.add_tokens(true, &read_named("auth.metrics_tokens_file", &f)?, &f)?;
        }
        if !config.auth.jwt.keys_file.is_empty() {
            let f = config.auth.jwt.keys_file.clone();
            config.add_jwks(&read_named("auth.jwt.keys_file", &f)?, &f)?;
        }
        for i in 0..config.auth.token.len() {
            let f = config.auth.token[i].token_file.clone();
            if !f.is_empty() {
                let key = format!("auth.token[{i}].token_file");
                config.add_static_token(i, &read_named(&key, &f)?, &f)?;
            }
        }
        if !config.log.client_file.is_empty() {
            let f = config.log.client_file.clone();
            config.add_client_properties(&read_named("log.client_file", &f)?, &f)?;
        }
        let addr = resolve(&config.server.listen).map_err(|source| StartError::Listen {
            addr: config.server.listen.clone(),
            source,
        })?;
        if !config.server.metrics_listen.is_empty() {
            resolve(&config.server.metrics_listen).map_err(|source| StartError::Listen {
                addr: config.server.metrics_listen.clone(),
                source,
            })?;
        }
        let started = Instant::now();
        let plan = Arc::new(Plan::compile(&config.boxes)?);
        let snapshot_path =
            (!config.snapshot.path.is_empty()).then(|| PathBuf::from(&config.snapshot.path));
        let logged = config.log.enabled();
        // A node of a log takes its versions from the log; a standalone one
        // starts new boxes past the wall clock (docs/boxes.md#versions-and-etags).
        let new_table = || match logged {
            true => BoxTable::new(plan.clone()),
            false => BoxTable::with_version_clock(plan.clone(), wall_us),
        };
        let (boxes, position, chain) = match &snapshot_path {
            Some(p) => {
                snapshot_file::check_dir(p)?;
                let now_ms = if logged {
                    wall_ms()
                } else {
                    started.elapsed().as_millis() as u64
                };
                match snapshot_file::load(new_table, now_ms, p) {
                    Ok(Some(loaded)) => {
                        if logged {
                            check_position(&config, p, loaded.position.as_ref())?;
                        }
                        (loaded.table, loaded.position, loaded.chain)
                    }
                    Ok(None) => (new_table(), None, None),
                    Err(e) => {
                        return Err(StartError::Snapshot {
                            path: p.display().to_string(),
                            reason: format!(
                                "{e}; refusing to start (move the file away to start empty)"
                            ),
                        })
                    }
                }
            }
            None => (new_table(), None, None),
        };
        Ok(Preflight {
            config,
            plan,
            boxes,
            position,
            chain,
            snapshot_path,
            addr,
            started,
        })
    }
}

impl Server {
    /// Check everything [`Server::start`] checks before it binds (the
    /// config, the files it names, the listen address, the snapshot and its
    /// directory) and return the effective config (`check-config`).
    pub fn check(config: Config) -> Result<Config, StartError> {
        Preflight::run(config).map(|p| p.config)
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
        } = Preflight::run(config)?;
        if snapshot_path.is_some() {
            // Removals from now on go into the next delta.
            boxes.track_changes();
        }
        let logged = config.log.enabled();
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
        let metrics_listener = bind_metrics(&config.server.metrics_listen)?;
        let metrics_addr = metrics_listener
            .as_ref()
            .map(|l| l.local_addr())
            .transpose()?;
        let (polls, wakers) = new_polls(n)?;
        let auth_files = auth_files::AuthFiles::new(&config);
        let compact_percent = config.snapshot.compact_percent;
        let waiters = Arc::new(wakeups::Waiters::new(wakers.clone()));
        let producer = start_producer(&config, log_state.as_ref(), &waiters)?;
        let node = Node::new(config, plan, boxes);
        let shared = Arc::new(Shared::new(
            node, &wakers, waiters, started, log_state, producer, auth_files,
        ));
        let threads = start_workers(&shared, listeners, polls, metrics_listener)?;
        let snapshot_stop = Arc::new((Mutex::new(false), Condvar::new()));
        let snapshot_thread = match &snapshot_path {
            Some(p) => {
                let snapshots =
                    snapshot_file::Snapshots::new(p.clone(), chain).compact_at(compact_percent);
                let writing = snapshot_file::Writing {
                    node: shared.node.clone(),
                    log: shared.log.clone(),
                    started: shared.started,
                    stats: shared.snapshots.clone(),
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
        let log_thread = match &shared.log {
            Some(l) => Some(log::consume::spawn(log::consume::Consuming {
                node: shared.node.clone(),
                log: l.clone(),
                waiters: shared.waiters.clone(),
                lifecycle: shared.lifecycle.clone(),
                producer: shared.producer.clone(),
                started: shared.started,
            })?),
            None => None,
        };
        let auth_watcher =
            auth_files::Watcher::spawn(shared.node.clone(), shared.auth_files.clone())?;
        shared.lifecycle.set_ready();
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
            auth_watcher,
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

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Read the key set and static token files again, now (what SIGHUP
    /// does; a change of a file does it too): the workers take the new keys
    /// at their next tick. On a failure the keys and tokens in use stay.
    /// Returns the new generation, or why nothing changed.
    pub fn reload_auth(&self, why: &str) -> Result<u64, String> {
        auth_files::reload(&self.shared.node, &self.shared.auth_files, why)
    }

    /// Graceful stop: stop accepting, finish requests in flight, write the
    /// snapshot. Returns the first error met.
    pub fn shutdown(mut self) -> Result<(), String> {
        if let Some(w) = self.auth_watcher.take() {
            w.stop();
        }
        self.shared.lifecycle.start_draining();
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
        self.shared.lifecycle.stop_workers();
        {
            let (lock, cv) = &*self.snapshot_stop;
            if let Ok(mut stop) = lock.lock() {
                *stop = true;
            }
            cv.notify_all();
        }
        let snapshots = self.snapshot_thread.take().and_then(|t| t.join().ok());
        // The consumer sees `workers_stopped` within one wait for records.
        if let Some(t) = self.log_thread.take() {
            let _ = t.join();
        }
        if let Some(p) = &self.snapshot_path {
            // A thread that panicked lost its chain: the final file is a base.
            let mut snapshots =
                snapshots.unwrap_or_else(|| snapshot_file::Snapshots::new(p.clone(), None));
            let position = self.shared.log.as_ref().and_then(|l| l.position());
            let (boxes, now_ms) = (&self.shared.node.boxes, self.shared.table_now_ms());
            // Every worker has stopped: no version past this snapshot's was
            // served, so the next start may keep its versions (the seal names
            // the chain's newest file).
            if let Err(e) = snapshots
                .save(boxes, now_ms, position.as_ref())
                .and_then(|saved| snapshot_file::seal(p, saved.newest_crc))
            {
                first_err.get_or_insert(format!("final snapshot to {}: {e}", p.display()));
            }
        }
        match first_err {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
}

/// On a node of a log, the snapshot must say where in which topic its boxes
/// stand: a standalone node's snapshot (no position) or another topic's would
/// be completed wrongly by a replay.
fn check_position(
    config: &Config,
    path: &std::path::Path,
    position: Option<&pollbox_core::log::Position>,
) -> Result<(), StartError> {
    let refuse = |reason: String| StartError::Snapshot {
        path: path.display().to_string(),
        reason,
    };
    match position {
        None => Err(refuse(
            "it holds no log position (written by a standalone node): a replay cannot \
             complete it; move it away to build this node from the log, or give it a \
             peer's snapshot"
                .into(),
        )),
        Some(p) if p.topic != config.log.topic => Err(refuse(format!(
            "it was written from topic {:?}, this node reads {:?} (log.topic); move it away",
            p.topic, config.log.topic
        ))),
        Some(_) => Ok(()),
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
    let boxes = server.shared.node.boxes.len();
    let r = server.shutdown();
    if r.is_ok() {
        eprintln!("pollbox: stopped cleanly ({boxes} boxes)");
    }
    r
}

/// Exit code of a process whose worker panicked (EX_SOFTWARE).
pub const WORKER_PANIC_EXIT: i32 = 70;

/// The listener of `server.metrics_listen` (none when it is empty). Worker 0
/// serves it, with the same connection state machine as every other listener
/// (it routes only `/metrics` there).
fn bind_metrics(addr: &str) -> Result<Option<mio::net::TcpListener>, StartError> {
    if addr.is_empty() {
        return Ok(None);
    }
    let l = resolve(addr)
        .and_then(std::net::TcpListener::bind)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|source| StartError::Listen {
            addr: addr.to_string(),
            source,
        })?;
    Ok(Some(mio::net::TcpListener::from_std(l)))
}

/// A poll a worker, and the waker of each.
fn new_polls(n: usize) -> io::Result<(Vec<mio::Poll>, Vec<Arc<mio::Waker>>)> {
    let mut polls = Vec::with_capacity(n);
    let mut wakers = Vec::with_capacity(n);
    for _ in 0..n {
        let poll = mio::Poll::new()?;
        wakers.push(Arc::new(mio::Waker::new(poll.registry(), worker::WAKER)?));
        polls.push(poll);
    }
    Ok((polls, wakers))
}

/// On a node of a log (`log`): the producer ingest writes to.
fn start_producer(
    config: &Config,
    log: Option<&Arc<log::LogState>>,
    waiters: &Arc<wakeups::Waiters>,
) -> Result<Option<Arc<log::produce::Producer>>, StartError> {
    let Some(l) = log else {
        return Ok(None);
    };
    let p = log::produce::Producer::new(&config.log, l.clone(), waiters.clone())
        .map_err(|e| StartError::Log(format!("cannot create the Kafka producer: {e}")))?;
    Ok(Some(Arc::new(p)))
}

/// Build a worker a listener (worker 0 also serves `metrics`), count the
/// fixed start-up memory, and run each worker on its thread, `pollbox-w{i}`.
fn start_workers(
    shared: &Arc<Shared>,
    listeners: Vec<mio::net::TcpListener>,
    polls: Vec<mio::Poll>,
    mut metrics: Option<mio::net::TcpListener>,
) -> Result<Vec<JoinHandle<io::Result<()>>>, StartError> {
    // Worker i goes to the i-th core this process may run on (its affinity mask,
    // e.g. `taskset -c 8-15`), not to core i, so pinning stays inside the mask.
    let cores = if shared.node.config.server.pin_workers {
        allowed_cores()
    } else {
        Vec::new()
    };
    let mut workers = Vec::with_capacity(polls.len());
    for (i, (l, poll)) in listeners.into_iter().zip(polls).enumerate() {
        let metrics = if i == 0 { metrics.take() } else { None };
        workers.push(worker::Worker::new(i, shared.clone(), l, metrics, poll)?);
    }
    // Everything allocated so far that is not a box, an arena or a buffer
    // counted by the workers is fixed start-up memory.
    let counted: usize = shared.node.boxes.accounted_bytes()
        + workers
            .iter()
            .map(worker::Worker::accounted_bytes)
            .sum::<usize>();
    shared.runtime_bytes.store(
        (alloc_stats::read_global_fresh().allocated as usize).saturating_sub(counted),
        Ordering::Relaxed,
    );
    let mut threads = Vec::with_capacity(workers.len());
    for (i, w) in workers.into_iter().enumerate() {
        let core = (!cores.is_empty()).then(|| cores[i % cores.len()]);
        threads.push(
            std::thread::Builder::new()
                .name(format!("pollbox-w{i}"))
                .spawn(move || {
                    if let Some(core) = core {
                        pin_to_core(core);
                    }
                    exit_on_panic(i, || w.run())
                })?,
        );
    }
    Ok(threads)
}

/// Run a worker; if it panics, end the process (docs/operations.md#worker-panics): a server with a
/// silently missing worker would go on taking connections on its listener's
/// share of the port and never answer them. The panic message is already on
/// stderr (the default hook); the snapshot is not written, since the table may
/// be mid-update — the supervisor restarts from the last one.
fn exit_on_panic(worker: usize, run: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
        Ok(r) => r,
        Err(_) => {
            eprintln!("pollbox: worker {worker} panicked; exiting with {WORKER_PANIC_EXIT} so a supervisor restarts the process");
            std::process::exit(WORKER_PANIC_EXIT);
        }
    }
}

/// Cores this process may run on (1 when the OS cannot say): the worker
/// count when `server.workers` is 0, and the cores workers are pinned to.
pub fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The cores the calling thread may run on (its affinity mask), in ascending
/// order; empty when the OS will not say.
fn allowed_cores() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes only inside `set`,
    // and CPU_ISSET reads inside it for indices below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

fn pin_to_core(core: usize) {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET only write inside it (core is
    // below CPU_SETSIZE: it came from allowed_cores), and sched_setaffinity(0, ...)
    // reads it for the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(core, &mut set);
        let _ = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinning_binds_the_thread_to_one_core() {
        let allowed = allowed_cores();
        assert!(!allowed.is_empty());
        let want = *allowed.last().unwrap();
        let ncpu = libc::CPU_SETSIZE as usize;
        let cpus = std::thread::spawn(move || {
            pin_to_core(want);
            // SAFETY: as in pin_to_core; sched_getaffinity writes into `set`.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                assert_eq!(
                    libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
                    0
                );
                (0..ncpu)
                    .filter(|&c| libc::CPU_ISSET(c, &set))
                    .collect::<Vec<_>>()
            }
        })
        .join()
        .unwrap();
        assert_eq!(cpus, vec![want]);
    }

    #[test]
    fn allowed_cores_follow_the_affinity_mask() {
        let all = allowed_cores();
        let last = *all.last().unwrap();
        let seen = std::thread::spawn(move || {
            pin_to_core(last);
            allowed_cores()
        })
        .join()
        .unwrap();
        assert_eq!(seen, vec![last]);
    }
}
