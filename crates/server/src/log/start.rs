//! Starting the log's threads, and stopping them: the consuming threads
//! (`pollbox-log`, which starts `pollbox-log-N`), the delivery thread
//! (`pollbox-acks`, with a producer), the log-end thread
//! (`pollbox-log-end`) and the presence thread (`pollbox-presence`), each
//! handed its parts (each part owned by its
//! module and shared).
//!
//! They stop once the workers have (`Lifecycle::workers_stopped`): an
//! ingest in flight at a SIGTERM is answered with its record's fate.
//! [`LogThreads::join`] waits for the consuming and delivery threads; the
//! log-end and presence threads, asleep or waiting on a broker, are left to
//! end on their own.

use super::consume::{self, Consuming};
use super::context::LogState;
use super::deliveries::{self, Delivering};
use super::ends::{self, Ends};
use super::produce::Producer;
use crate::lifecycle::Lifecycle;
use crate::wakeups::Wakeups;
use pollbox_core::service::Node;
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

/// What the log's threads are handed, by the server.
pub(crate) struct LogParts {
    /// The config, the plan and the box table.
    pub(crate) node: Arc<Node>,
    /// Where the node stands in the log.
    pub(crate) log: Arc<LogState>,
    /// Who waits on a key, and the workers records are reported to.
    pub(crate) wakeups: Arc<Wakeups>,
    /// Draining, and the workers stopped.
    pub(crate) lifecycle: Arc<Lifecycle>,
    /// The node's producer (none: ingest is not produced).
    pub(crate) producer: Option<Arc<Producer>>,
    /// Where the node listens (the default name of the node on the presence
    /// topic).
    pub(crate) listen: std::net::SocketAddr,
}

/// The log's threads that a shutdown waits for.
pub(crate) struct LogThreads {
    consuming: JoinHandle<()>,
    delivering: Option<JoinHandle<()>>,
}

impl LogThreads {
    /// Wait for the consuming threads and the delivery thread to end (the
    /// workers have stopped: each sees it within one wait).
    pub(crate) fn join(self) {
        let _ = self.consuming.join();
        if let Some(d) = self.delivering {
            let _ = d.join();
        }
    }
}

/// Start the log's threads.
pub(crate) fn spawn(parts: LogParts) -> io::Result<LogThreads> {
    let LogParts {
        node,
        log,
        wakeups,
        lifecycle,
        producer,
        listen,
    } = parts;
    let pr = super::presence::Presencing {
        node: node.clone(),
        wakeups: wakeups.clone(),
        lifecycle: lifecycle.clone(),
        listen,
    };
    // Not waited for at shutdown, as the log-end thread: at a broker that
    // does not answer it may be in a request for seconds; it sees the
    // workers stopped at its next turn.
    std::thread::Builder::new()
        .name("pollbox-presence".into())
        .spawn(move || super::presence::run(&pr))?;
    let mut delivering = None;
    if let Some(producer) = producer {
        let e = Ends {
            producer: producer.clone(),
            log: log.clone(),
            lifecycle: lifecycle.clone(),
        };
        std::thread::Builder::new()
            .name("pollbox-log-end".into())
            .spawn(move || ends::follow(&e))?;
        let d = Delivering {
            producer,
            log: log.clone(),
            wakeups: wakeups.clone(),
            lifecycle: lifecycle.clone(),
        };
        delivering = Some(
            std::thread::Builder::new()
                .name("pollbox-acks".into())
                .spawn(move || deliveries::serve(&d))?,
        );
    }
    let c = Arc::new(Consuming {
        node,
        log,
        wakeups,
        lifecycle,
    });
    let consuming = std::thread::Builder::new()
        .name("pollbox-log".into())
        .spawn(move || consume::run(&c))?;
    Ok(LogThreads {
        consuming,
        delivering,
    })
}
