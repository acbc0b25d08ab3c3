//! Starting the workers: a poll and a waker each, the fixed start-up memory
//! counted once they are built, a thread each (pinned where the config says),
//! and the process's exit when one panics.
//!
//! What it is not: the worker's loop ([`crate::worker`]) or the stop
//! ([`crate::Server::shutdown`]).

use crate::cores::{allowed_cores, pin_to_core};
use crate::shared::Shared;
use crate::start_error::StartError;
use crate::{alloc_stats, worker};
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

/// Exit code of a process whose worker panicked (EX_SOFTWARE).
pub(crate) const WORKER_PANIC_EXIT: i32 = 70;

/// A poll a worker, and the waker of each.
pub(crate) fn new_polls(n: usize) -> io::Result<(Vec<mio::Poll>, Vec<Arc<mio::Waker>>)> {
    let mut polls = Vec::with_capacity(n);
    let mut wakers = Vec::with_capacity(n);
    for _ in 0..n {
        let poll = mio::Poll::new()?;
        wakers.push(Arc::new(mio::Waker::new(poll.registry(), worker::WAKER)?));
        polls.push(poll);
    }
    Ok((polls, wakers))
}

/// Build a worker a listener (worker 0 also serves `metrics`), count the
/// fixed start-up memory, and run each worker on its thread, `pollbox-w{i}`.
pub(crate) fn start_workers(
    shared: &Arc<Shared>,
    listeners: Vec<mio::net::TcpListener>,
    polls: Vec<mio::Poll>,
    mut metrics: Option<mio::net::TcpListener>,
) -> Result<Vec<JoinHandle<io::Result<()>>>, StartError> {
    // Worker i goes to the i-th core this process may run on (its affinity mask,
    // e.g. `taskset -c 8-15`), not to core i, so pinning stays inside the mask.
    let cores = if shared.node().config.server.pin_workers {
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
    let counted: usize = shared.node().boxes.accounted_bytes()
        + workers
            .iter()
            .map(worker::Worker::accounted_bytes)
            .sum::<usize>();
    shared.set_runtime_bytes(
        (alloc_stats::read_global_fresh().allocated as usize).saturating_sub(counted),
    );
    let mut threads = Vec::with_capacity(workers.len());
    // Each worker writes the table as a lane of its own (docs/boxes.md#watermarks);
    // a node of a log's lanes are its partitions (set by the consuming threads),
    // a write-ahead file's its one (set when it is read at start).
    if !shared.node().config.ingest_waits() {
        shared.node().boxes.lanes().for_writers(workers.len());
    }
    for (i, w) in workers.into_iter().enumerate() {
        let core = (!cores.is_empty()).then(|| cores[i % cores.len()]);
        threads.push(
            std::thread::Builder::new()
                .name(format!("pollbox-w{i}"))
                .spawn(move || {
                    if let Some(core) = core {
                        pin_to_core(core);
                    }
                    pollbox_core::boxes::enter_lane(1 + i);
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
