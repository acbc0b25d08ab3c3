//! The server as the core sees it ([`Host`]): per-worker counting, request
//! durations, cross-worker wake-ups and `/metrics`.
//!
//! What it is not: the counters themselves ([`crate::stats`]) or the
//! exposition ([`crate::metrics`]); it bumps the one and calls the other.

use crate::log::REQUEST_MASK;
use crate::metrics;
use crate::shared::Shared;
use crate::stats::{IngestResult, Removal, RouteLabel, WorkerStats};
use crate::wakeups::Wakeups;
use pollbox_core::service::{Host, LogRecord, Watchers};
use std::sync::Arc;
use std::time::Instant;

pub(super) struct WorkerHost {
    shared: Arc<Shared>,
    id: usize,
    /// When the requests being answered began to be handled: the read (or
    /// timer, or wake-up) that led to them.
    mark: Instant,
    /// Answers written since `mark`, not yet observed in the duration
    /// histogram: [`WorkerHost::finish`] observes them all with one clock
    /// read (one per read, not one per pipelined request).
    unobserved: u64,
    /// The last id this worker gave a log request (its records' delivery tags say
    /// which); ids wrap under [`REQUEST_MASK`].
    log_requests: u64,
    /// Fault injection for the tests of docs/operations.md#worker-panics, in debug
    /// builds only: `POLLBOX_TEST_PANIC_AFTER=N` panics the worker that answers
    /// its N-th request.
    #[cfg(debug_assertions)]
    panic_after: Option<u64>,
}

impl WorkerHost {
    pub(super) fn new(shared: Arc<Shared>, id: usize) -> WorkerHost {
        WorkerHost {
            shared,
            id,
            mark: Instant::now(),
            unobserved: 0,
            log_requests: 0,
            #[cfg(debug_assertions)]
            panic_after: std::env::var("POLLBOX_TEST_PANIC_AFTER")
                .ok()
                .and_then(|v| v.parse().ok()),
        }
    }

    /// Request handling starts now (bytes arrived, a timer fired, a box moved).
    /// Call [`WorkerHost::finish`] once its answers are written.
    #[inline]
    pub(super) fn start(&mut self) {
        // Answers a caller forgot to finish are observed now rather than lost.
        self.finish();
        self.mark = Instant::now();
    }

    /// The answers since [`WorkerHost::start`] (or the last `finish`) are
    /// written: observe each with the time from the mark to now, the time its
    /// request waited in the server (they are sent together, after the
    /// batch). One clock read per batch; none when nothing was answered.
    #[inline]
    pub(super) fn finish(&mut self) {
        if self.unobserved == 0 {
            return;
        }
        let now = Instant::now();
        let ns = now.duration_since(self.mark).as_nanos() as u64;
        self.shared.stats()[self.id]
            .duration
            .observe_ns_times(ns, self.unobserved);
        self.unobserved = 0;
        self.mark = now;
    }

    /// The state every worker shares.
    #[inline]
    pub(super) fn shared(&self) -> &Shared {
        &self.shared
    }

    #[inline]
    pub(super) fn stats(&self) -> &WorkerStats {
        &self.shared.stats()[self.id]
    }
}

/// An ingest's, a `DELETE`'s, an expiry's change: told as a record of the
/// log tells it ([`crate::wakeups::Wakeups`]).
impl Watchers for WorkerHost {
    #[inline]
    fn box_updated(&mut self, key: &[u8]) {
        let mut wakeups: &Wakeups = self.shared.wakeups();
        wakeups.box_updated(key);
    }
}

impl Host for WorkerHost {
    fn log_request(&mut self) -> u64 {
        self.log_requests = (self.log_requests + 1) & REQUEST_MASK;
        self.log_requests
    }

    fn produce(&mut self, request: u64, records: &[LogRecord<'_>]) -> usize {
        if let Some(wal) = self.shared.wal() {
            return wal.append(self.id as u16, request, records);
        }
        let Some(log) = self.shared.log() else {
            return 0;
        };
        if !log.takes_ingest() {
            return 0;
        }
        let Some(producer) = self.shared.producer() else {
            return 0;
        };
        let partitions = log.partitions().map(|p| p.len() as u32);
        producer.send(self.id as u16, request, records, partitions)
    }

    fn unavailable(&self) -> &'static str {
        match self.shared.wal() {
            Some(wal) => wal.unavailable(),
            None => "log unavailable",
        }
    }

    fn unready_reason(&self) -> Option<&str> {
        self.shared.wal()?.failed()
    }

    fn over_connection_cap(&mut self) {
        self.shared.stats()[self.id].rejected(crate::stats::Rejected::MaxConnections);
    }

    fn draining(&self) -> bool {
        self.shared.lifecycle().is_draining_relaxed()
    }

    fn ready(&self) -> bool {
        self.shared.is_ready()
    }

    fn boxes_removed(&mut self, why: Removal, n: u64) {
        self.shared.stats()[self.id].boxes_removed(why, n);
    }

    fn render_metrics(&mut self, out: &mut Vec<u8>) {
        metrics::render(&self.shared, out);
    }

    #[inline]
    fn answered(&mut self, route: RouteLabel, code: u16) {
        self.shared.stats()[self.id].request(route, code);
        self.unobserved += 1;
        #[cfg(debug_assertions)]
        if let Some(n) = self.panic_after.as_mut() {
            *n = n.saturating_sub(1);
            if *n == 0 {
                panic!("POLLBOX_TEST_PANIC_AFTER: injected worker panic");
            }
        }
    }

    #[inline]
    fn auth_refused(&mut self, why: pollbox_core::service::AuthRefused) {
        self.shared.stats()[self.id].auth_refused[why.index()].inc();
    }

    fn limit_refused(&mut self, limit: pollbox_core::clients::Limit) {
        self.shared.stats()[self.id].limit_refused[limit.index()].inc();
    }

    #[inline]
    fn takes_cuts(&self) -> bool {
        true
    }

    fn prefix_streams(&self) -> usize {
        let n: u64 = self
            .shared
            .stats()
            .iter()
            .map(|w| w.prefix_streams.get())
            .sum();
        n as usize
    }

    fn sse_event(&mut self, coalesced: u64) {
        let stats = &self.shared.stats()[self.id];
        stats.sse_events.inc();
        stats.sse_coalesced.add(coalesced);
    }

    #[inline]
    fn ingested(&mut self, result: IngestResult, n: u64) {
        self.shared.stats()[self.id].ingested(result, n);
    }
}
