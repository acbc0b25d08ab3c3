//! The Kafka log (docs/operations.md#the-kafka-log): the client around
//! [`pollbox_core::log`]. With `[log] brokers` set, the topic is the source of
//! truth and this node a replica of the boxes built from it.
//!
//! - [`consume`]: the consuming threads (`log.consumers`), each with its own
//!   client and its share of the partitions, read the topic from the
//!   offsets the snapshot holds (the log's start without one), hand each
//!   record to their own core's [`Replica`](pollbox_core::log::Replica) and
//!   wake the long-polls and event streams of the key, as an HTTP ingest
//!   does. They never take a lock a poll needs: polls go on while they
//!   apply.
//! - [`produce`]: what this node's clients ingest goes to the topic, a
//!   request's records as one batch a partition; their delivery reports
//!   (each with its record's offset and a ticket naming the waiting
//!   connection) are served by a thread of their own.
//! - [`acks`]: where an acknowledged record meets its apply, whichever comes
//!   first: the connection is answered when both happened.
//! - [`reports`]: those outcomes, gathered over one pass of the consuming
//!   thread (or one delivery report) and handed to each worker with one
//!   wake-up.
//! - [`LogState`]: where the node stands (the next offset of each partition,
//!   the end of the log as it stood at start, caught up or not), shared with
//!   the producer's delivery reports (the records the log did not take), the
//!   snapshot writer (the position it stores), `/readyz` and `/metrics`.
//!
//! What it is not: the rules of a record (the core's), or a consumer group:
//! every node reads every partition and commits nothing; its position lives
//! in its snapshot.

pub mod acks;
pub mod consume;
pub mod produce;
pub mod reports;
pub mod topic;

use crate::stats::Histogram;
use pollbox_core::config::LogConfig;
use pollbox_core::log::Position;
use rdkafka::config::ClientConfig;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::OnceLock;

/// The client properties of every pollbox client: the operator's
/// `[log.client]`, then the brokers.
pub fn client_config(cfg: &LogConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    for (k, v) in &cfg.client {
        c.set(k, v);
    }
    c.set("bootstrap.servers", &cfg.brokers);
    c
}

/// Exit code of a node whose snapshot the log cannot complete, or whose log
/// is misconfigured (EX_CONFIG): restarting it would not help.
pub const LOG_REFUSED_EXIT: i32 = 78;

/// One partition as this node sees it. Aligned to 128 bytes: each is
/// written by the consuming thread that owns it, and two threads' partitions
/// side by side would share a cache line (or the pair the CPU prefetches).
#[derive(Debug)]
#[repr(align(128))]
pub struct PartitionState {
    /// The next offset to apply: every record before it is applied.
    pub next: AtomicI64,
    /// The log's end (high watermark) as last seen, for the lag.
    pub end: AtomicI64,
    /// The end when the node started: `/readyz` waits for it.
    pub end_at_start: AtomicI64,
    /// This node's acknowledged records meet their apply here.
    pub acks: acks::PartitionAcks,
}

impl PartitionState {
    /// A partition whose next record to apply is `next`, the log's end
    /// `end`.
    pub fn new(next: i64, end: i64) -> PartitionState {
        PartitionState {
            next: AtomicI64::new(next),
            end: AtomicI64::new(end),
            end_at_start: AtomicI64::new(end),
            acks: acks::PartitionAcks::default(),
        }
    }
}

/// Records by what they did (`pollbox_log_records_total{result}`).
/// `wrong_partition`: not in its key's home partition (a producer that does
/// not partition by murmur2), applied by no node. `out_of_order`: a record
/// older than its box, read after the node caught up, so not a replay
/// (never expected: a key's records are in one partition).
pub const RESULTS: [&str; 7] = [
    "applied",
    "deleted",
    "no_box",
    "replayed",
    "invalid",
    "wrong_partition",
    "out_of_order",
];

/// Where this node stands in the log.
pub struct LogState {
    pub topic: String,
    /// The position the snapshot held (none: the log's start).
    pub loaded: Option<Position>,
    /// Known once the topic's metadata was read; index = partition id.
    partitions: OnceLock<Box<[PartitionState]>>,
    /// Every partition reached the end it had at start.
    caught_up: AtomicBool,
    /// The last attempt to reach the log worked.
    pub connected: AtomicBool,
    /// A reading of the topic at start failed (the log is away): until the
    /// topic is read, an ingest is 503 at once. Before the first attempt
    /// ends it is produced all the same (the client holds it until the
    /// topic's partitions are known), so a node that was just started, or
    /// restarted behind a load balancer, answers what it takes then.
    start_failed: AtomicBool,
    /// Why the node stopped applying the log for good (the topic's
    /// partition count changed): unready, ingest refused.
    halted: OnceLock<String>,
    /// The topic can lose acknowledged records and `log.allow_unsafe_topic`
    /// let it through.
    unsafe_topic: AtomicBool,
    /// By [`RESULTS`].
    pub records: [AtomicU64; 7],
    /// Errors the client reported while consuming (transport, broker).
    pub consume_errors: AtomicU64,
    /// Records the log did not take (delivery failed or timed out).
    pub produce_errors: AtomicU64,
    /// From producing a record to its answer being free to go: the log's
    /// acknowledgement (`acks=all`) and this node's apply, whichever came
    /// last; for this node's records.
    pub ack: Histogram<14>,
}

/// Upper bounds (seconds) of the acknowledgement latency histogram.
pub const ACK_BUCKETS: [f64; 14] = [
    0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.010, 0.025, 0.050, 0.100, 0.250, 0.5, 1.0, 2.5, 5.0,
];

impl LogState {
    pub fn new(config: &LogConfig, loaded: Option<Position>) -> LogState {
        LogState {
            topic: config.topic.clone(),
            loaded,
            partitions: OnceLock::new(),
            caught_up: AtomicBool::new(false),
            connected: AtomicBool::new(false),
            start_failed: AtomicBool::new(false),
            halted: OnceLock::new(),
            unsafe_topic: AtomicBool::new(false),
            records: Default::default(),
            consume_errors: AtomicU64::new(0),
            produce_errors: AtomicU64::new(0),
            ack: Histogram::new(&ACK_BUCKETS),
        }
    }

    /// The partitions, once known.
    pub fn partitions(&self) -> Option<&[PartitionState]> {
        self.partitions.get().map(|p| &p[..])
    }

    pub(crate) fn set_partitions(&self, p: Box<[PartitionState]>) {
        let _ = self.partitions.set(p);
    }

    /// Whether the node stopped applying the log for good.
    pub fn halted(&self) -> bool {
        self.halted.get().is_some()
    }

    /// Stop applying the log for good, saying why (once).
    pub(crate) fn halt(&self, why: String) {
        if self.halted.set(why.clone()).is_ok() {
            eprintln!("pollbox: log: {why}; stopped applying the log, not ready");
        }
    }

    /// Whether the topic can lose acknowledged records (and was taken).
    pub fn unsafe_topic(&self) -> bool {
        self.unsafe_topic.load(Ordering::Relaxed)
    }

    pub(crate) fn set_unsafe_topic(&self) {
        self.unsafe_topic.store(true, Ordering::Relaxed);
    }

    /// Whether ingest can be produced: the node still applies the log, and
    /// the topic was read or its first reading has not failed yet. Otherwise
    /// an ingest is answered 503 at once rather than after `ack_timeout_ms`.
    pub fn takes_ingest(&self) -> bool {
        !self.halted()
            && (self.partitions().is_some() || !self.start_failed.load(Ordering::Relaxed))
    }

    /// A reading of the topic at start failed (see [`LogState::takes_ingest`]).
    pub(crate) fn start_failed(&self) {
        self.start_failed.store(true, Ordering::Relaxed);
    }

    /// Whether the node has applied the log up to where it ended at start.
    pub fn caught_up(&self) -> bool {
        self.caught_up.load(Ordering::Acquire)
    }

    /// Check whether every partition reached its end at start, and remember
    /// it: true only for the call that found it first (of all the consuming
    /// threads, one says so).
    pub(crate) fn catch_up(&self) -> bool {
        let Some(parts) = self.partitions() else {
            return false;
        };
        let done = parts
            .iter()
            .all(|p| p.next.load(Ordering::Acquire) >= p.end_at_start.load(Ordering::Relaxed));
        done && self
            .caught_up
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The position to store with a snapshot. Taken before the snapshot
    /// walks the boxes, so they reflect at least every record before it.
    pub fn position(&self) -> Option<Position> {
        match self.partitions() {
            // Nothing read yet: the snapshot's position, or the log's start.
            None => Some(self.loaded.clone().unwrap_or_else(|| Position {
                topic: self.topic.clone(),
                next: Default::default(),
            })),
            Some(parts) => Some(Position {
                topic: self.topic.clone(),
                next: parts
                    .iter()
                    .enumerate()
                    .map(|(i, p)| (i as i32, p.next.load(Ordering::Acquire)))
                    .collect(),
            }),
        }
    }

    pub(crate) fn count(&self, result: &str) {
        if let Some(i) = RESULTS.iter().position(|r| *r == result) {
            self.records[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}
