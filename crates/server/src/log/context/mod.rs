//! What the log's threads share, below all of them: where the node stands in
//! the log ([`LogState`]: each partition's next offset and end, caught up,
//! halted, failed, connected, the log's counters), each partition's meeting
//! place of an acknowledgement and its apply ([`PartitionAcks`]), the tag a
//! record carries to its delivery report ([`DeliveryTag`]), what a record did
//! ([`RecordResult`]), the clients' errors by kind ([`ErrorKind`]) and the
//! reports handed to the workers ([`PassReports`]).
//!
//! What it is not: a thread. Each field is written through a method of its
//! own, by the threads its doc names; `/readyz`, `/metrics` and the snapshot
//! writer only read.

mod acks;
mod client_errors;
mod reports;
mod results;
mod tag;

pub(crate) use acks::{Ack, PartitionAcks};
pub(crate) use client_errors::{Client, ErrorKind};
pub(crate) use reports::PassReports;
pub(crate) use results::{RecordCounts, RecordResult};
pub(crate) use tag::{DeliveryTag, REQUEST_MASK};

use crate::stats::Histogram;
use client_errors::ClientErrors;
use pollbox_core::config::LogConfig;
use pollbox_core::log::Position;
use rdkafka::error::RDKafkaErrorCode;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Instant;

/// One partition as this node sees it. Aligned to 128 bytes: each is
/// written by the consuming thread that owns it, and two threads' partitions
/// side by side would share a cache line (or the pair the CPU prefetches).
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct PartitionState {
    /// The next offset to apply, and this node's acknowledged records
    /// meeting their apply.
    acks: PartitionAcks,
    /// The log's end (high watermark) as last read, for the lag.
    end: AtomicI64,
    /// The end when the node started: `/readyz` waits for it.
    end_at_start: i64,
    /// What the partition's versions are past its offsets (0 but on a
    /// migrated topic: `pollbox_core::log::Bases`). Moved with `next`
    /// under this lock, so a snapshot's position never pairs a next offset
    /// with a base from a record past it.
    base: Mutex<u64>,
}

impl PartitionState {
    /// A partition whose next record to apply is `next`, the log's end
    /// `end`.
    pub(crate) fn new(next: i64, end: i64, base: u64) -> PartitionState {
        PartitionState {
            acks: PartitionAcks::new(next),
            end: AtomicI64::new(end),
            end_at_start: end,
            base: Mutex::new(base),
        }
    }

    /// A record raised the partition's base to `base`: `advance` (which
    /// moves `next` past the record) runs under the base's lock.
    pub(crate) fn raised(&self, base: u64, advance: impl FnOnce()) {
        let mut b = self.base.lock().unwrap_or_else(PoisonError::into_inner);
        *b = base;
        advance();
    }

    /// The next offset to apply and the base at it, as one.
    pub(crate) fn next_and_base(&self) -> (i64, u64) {
        let b = self.base.lock().unwrap_or_else(PoisonError::into_inner);
        (self.next(), *b)
    }

    /// Where an acknowledgement meets its apply (and `next` lives).
    #[inline]
    pub(crate) fn acks(&self) -> &PartitionAcks {
        &self.acks
    }

    /// The next offset to apply: every record before it is applied.
    #[inline]
    pub(crate) fn next(&self) -> i64 {
        self.acks.next()
    }

    /// The log's end as last read.
    pub(crate) fn end(&self) -> i64 {
        self.end.load(Ordering::Relaxed)
    }

    /// The log-end thread read the end again.
    pub(crate) fn set_end(&self, end: i64) {
        self.end.store(end, Ordering::Relaxed);
    }

    /// Records in the log not applied yet.
    pub(crate) fn lag(&self) -> i64 {
        (self.end() - self.next()).max(0)
    }
}

/// Where this node stands in the log.
pub(crate) struct LogState {
    topic: String,
    /// The position the snapshot held (none: the log's start).
    loaded: Option<Position>,
    /// Known once the topic's metadata was read; index = partition id.
    partitions: OnceLock<Box<[PartitionState]>>,
    /// Every partition reached the end it had at start.
    caught_up: AtomicBool,
    /// The last exchange with the log worked ([`LogState::exchanged`]).
    connected: AtomicBool,
    /// A reading of the topic at start failed (the log is away): until the
    /// topic is read, an ingest is 503 at once. Before the first attempt
    /// ends it is produced all the same (the client holds it until the
    /// topic's partitions are known), so a node that was just started, or
    /// restarted behind a load balancer, answers what it takes then.
    start_failed: AtomicBool,
    /// Why the node stopped applying the log for good (the topic's
    /// partition count changed): unready, ingest refused.
    halted: OnceLock<String>,
    /// Why a client of the log failed for good (librdkafka's fatal error,
    /// e.g. the idempotent producer's): unready, ingest refused, until the
    /// node restarts.
    failed: OnceLock<String>,
    /// The topic can lose acknowledged records and `log.allow_unsafe_topic`
    /// let it through.
    unsafe_topic: AtomicBool,
    /// By [`RecordResult`].
    records: [AtomicU64; RecordResult::COUNT],
    /// Errors the consumers reported while consuming (transport, broker).
    consume_errors: AtomicU64,
    /// Records the log did not take (delivery failed).
    produce_errors: AtomicU64,
    /// Every client's errors, by kind, and when each kind was last said.
    client_errors: ClientErrors,
    /// From producing a record to its answer being free to go: the log's
    /// acknowledgement (`acks=all`) and this node's apply, whichever came
    /// last; for this node's records.
    ack: Histogram<14>,
}

/// Upper bounds (seconds) of the acknowledgement latency histogram.
pub(crate) const ACK_BUCKETS: [f64; 14] = [
    0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.010, 0.025, 0.050, 0.100, 0.250, 0.5, 1.0, 2.5, 5.0,
];

impl LogState {
    pub(crate) fn new(config: &LogConfig, loaded: Option<Position>) -> LogState {
        LogState {
            topic: config.topic.clone(),
            loaded,
            partitions: OnceLock::new(),
            caught_up: AtomicBool::new(false),
            connected: AtomicBool::new(false),
            start_failed: AtomicBool::new(false),
            halted: OnceLock::new(),
            failed: OnceLock::new(),
            unsafe_topic: AtomicBool::new(false),
            records: Default::default(),
            consume_errors: AtomicU64::new(0),
            produce_errors: AtomicU64::new(0),
            client_errors: ClientErrors::default(),
            ack: Histogram::new(&ACK_BUCKETS),
        }
    }

    /// The topic's name.
    pub(crate) fn topic(&self) -> &str {
        &self.topic
    }

    /// The position the snapshot held, if any.
    pub(crate) fn loaded(&self) -> Option<&Position> {
        self.loaded.as_ref()
    }

    /// The partitions, once known.
    #[inline]
    pub(crate) fn partitions(&self) -> Option<&[PartitionState]> {
        self.partitions.get().map(|p| &p[..])
    }

    /// The topic was read at start: its partitions, from where this node
    /// applies them. The log answered.
    pub(crate) fn set_partitions(&self, p: Box<[PartitionState]>) {
        let _ = self.partitions.set(p);
        self.exchanged(true);
    }

    /// A reading of the topic at start failed (see
    /// [`LogState::takes_ingest`]): the log did not answer.
    pub(crate) fn start_failed(&self) {
        self.start_failed.store(true, Ordering::Relaxed);
        self.exchanged(false);
    }

    /// Whether the last exchange with the log worked.
    pub(crate) fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// An exchange with the log worked (`true`) or failed. Written only when
    /// it changes: every consuming thread tells it a record, and a store a
    /// record would bounce its cache line between them.
    #[inline]
    pub(crate) fn exchanged(&self, worked: bool) {
        if self.connected.load(Ordering::Relaxed) != worked {
            self.connected.store(worked, Ordering::Relaxed);
        }
    }

    /// Whether the node stopped applying the log for good.
    pub(crate) fn halted(&self) -> bool {
        self.halted.get().is_some()
    }

    /// Stop applying the log for good, saying why (once).
    pub(crate) fn halt(&self, why: String) {
        if self.halted.set(why.clone()).is_ok() {
            eprintln!("pollbox: log: {why}; stopped applying the log, not ready");
        }
    }

    /// Why a client of the log failed for good, if one did.
    pub(crate) fn failed(&self) -> Option<&str> {
        self.failed.get().map(String::as_str)
    }

    /// A client of the log failed for good: unready, ingest refused, saying
    /// why (once).
    pub(crate) fn fail(&self, why: String) {
        if self.failed.set(why.clone()).is_ok() {
            eprintln!(
                "pollbox: log: {why}; not ready, and every ingest on this node is 503 until it restarts"
            );
        }
    }

    /// Whether the topic can lose acknowledged records (and was taken).
    pub(crate) fn unsafe_topic(&self) -> bool {
        self.unsafe_topic.load(Ordering::Relaxed)
    }

    pub(crate) fn set_unsafe_topic(&self) {
        self.unsafe_topic.store(true, Ordering::Relaxed);
    }

    /// Whether ingest can be produced: the node still applies the log, its
    /// producer works, and the topic was read or its first reading has not
    /// failed yet. Otherwise an ingest is answered 503 at once rather than
    /// after `ack_timeout_ms`.
    pub(crate) fn takes_ingest(&self) -> bool {
        !self.halted()
            && self.failed().is_none()
            && (self.partitions().is_some() || !self.start_failed.load(Ordering::Relaxed))
    }

    /// Whether the node has applied the log up to where it ended at start.
    pub(crate) fn caught_up(&self) -> bool {
        self.caught_up.load(Ordering::Acquire)
    }

    /// Ready (`/readyz`): caught up, still applying the log, every client
    /// working.
    pub(crate) fn ready(&self) -> bool {
        self.caught_up() && !self.halted() && self.failed().is_none()
    }

    /// Check whether every partition reached its end at start, and remember
    /// it: true only for the call that found it first (of all the consuming
    /// threads, one says so).
    pub(crate) fn catch_up(&self) -> bool {
        let Some(parts) = self.partitions() else {
            return false;
        };
        let done = parts.iter().all(|p| p.next() >= p.end_at_start);
        done && self
            .caught_up
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The position to store with a snapshot. Taken before the snapshot
    /// walks the boxes, so they reflect at least every record before it.
    pub(crate) fn position(&self) -> Option<Position> {
        match self.partitions() {
            // Nothing read yet: the snapshot's position, or the log's start.
            None => Some(self.loaded.clone().unwrap_or_else(|| Position {
                topic: self.topic.clone(),
                ..Position::default()
            })),
            Some(parts) => {
                let mut at = Position {
                    topic: self.topic.clone(),
                    ..Position::default()
                };
                for (i, p) in parts.iter().enumerate() {
                    let (next, base) = p.next_and_base();
                    at.next.insert(i as i32, next);
                    if base > 0 {
                        at.base.insert(i as i32, base);
                    }
                }
                Some(at)
            }
        }
    }

    /// Records counted as `result`.
    pub(crate) fn records(&self, result: RecordResult) -> u64 {
        self.records[result as usize].load(Ordering::Relaxed)
    }

    /// `n` more records counted as `result` (a pass's counts at once:
    /// [`RecordCounts`]).
    pub(crate) fn add_records(&self, result: RecordResult, n: u64) {
        self.records[result as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// Errors the consumers reported.
    pub(crate) fn consume_errors(&self) -> u64 {
        self.consume_errors.load(Ordering::Relaxed)
    }

    /// Records this node produced that the log did not take.
    pub(crate) fn produce_errors(&self) -> u64 {
        self.produce_errors.load(Ordering::Relaxed)
    }

    /// A record this node produced was not taken by the log.
    pub(crate) fn produce_failed(&self) {
        self.produce_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Errors of the log's clients of `kind`.
    pub(crate) fn client_errors(&self, kind: ErrorKind) -> u64 {
        self.client_errors.count(kind)
    }

    /// `client` reported an error (`code`, `fatal` when librdkafka says the
    /// client failed for good): counted by kind, said at most once a kind
    /// every [`client_errors::SAY_EVERY`], and a fatal one fails the node
    /// (`why`: the client's own words for it).
    pub(crate) fn client_error(
        &self,
        client: Client,
        code: Option<RDKafkaErrorCode>,
        fatal: bool,
        why: &str,
    ) {
        if client == Client::Consumer {
            self.consume_errors.fetch_add(1, Ordering::Relaxed);
        }
        let kind = ErrorKind::of(code, fatal);
        if let Some(line) = self.client_errors.record(kind, client, why, Instant::now()) {
            eprintln!("pollbox: log: {line}");
        }
        if kind == ErrorKind::Fatal {
            self.fail(format!("the {client} failed for good ({why})"));
        }
    }

    /// An acknowledgement of this node's record became free to answer,
    /// `ns` after the record was produced.
    #[inline]
    pub(crate) fn observe_ack(&self, ns: u64) {
        self.ack.observe_ns(ns);
    }

    /// The acknowledgement latency histogram.
    pub(crate) fn ack_histogram(&self) -> &Histogram<14> {
        &self.ack
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> LogState {
        let mut c = pollbox_core::config::Config::embedded().log;
        c.topic = "t".into();
        LogState::new(&c, None)
    }

    #[test]
    fn a_fatal_client_error_makes_the_node_unready_and_refuse_ingest() {
        let log = state();
        log.set_partitions(vec![PartitionState::new(0, 0, 0)].into_boxed_slice());
        assert!(log.catch_up());
        assert!(log.ready() && log.takes_ingest());
        // Errors that are not fatal change neither.
        log.client_error(
            Client::Producer,
            Some(RDKafkaErrorCode::AllBrokersDown),
            false,
            "1/1 brokers are down",
        );
        assert!(log.ready() && log.takes_ingest());
        assert_eq!(log.client_errors(ErrorKind::AllBrokersDown), 1);
        assert_eq!(log.consume_errors(), 0);
        log.client_error(
            Client::Producer,
            Some(RDKafkaErrorCode::Fatal),
            true,
            "producer fenced",
        );
        assert!(!log.ready() && !log.takes_ingest());
        assert_eq!(log.client_errors(ErrorKind::Fatal), 1);
        assert_eq!(
            log.failed(),
            Some("the producer failed for good (producer fenced)")
        );
        // A consumer's errors count in the consumers' counter too.
        log.client_error(
            Client::Consumer,
            Some(RDKafkaErrorCode::BrokerTransportFailure),
            false,
            "disconnected",
        );
        assert_eq!(log.consume_errors(), 1);
        assert_eq!(log.client_errors(ErrorKind::Transport), 1);
    }

    #[test]
    fn connected_follows_the_last_exchange_and_the_start() {
        let log = state();
        assert!(!log.connected());
        log.start_failed();
        assert!(!log.connected() && !log.takes_ingest());
        log.set_partitions(vec![PartitionState::new(0, 5, 0)].into_boxed_slice());
        assert!(log.connected() && log.takes_ingest());
        log.exchanged(false);
        assert!(!log.connected());
        log.exchanged(true);
        assert!(log.connected());
        // Not caught up: 0 of 5 applied.
        assert!(!log.catch_up() && !log.ready());
    }
}
