//! Per-worker counters, summed at scrape time.
//!
//! Each worker owns one [`WorkerStats`] and is its only writer, so a counter is
//! bumped with a relaxed load and store (no locked read-modify-write, no shared
//! cache line bouncing between workers). The scraper on any thread reads them
//! with relaxed loads; a value is at worst one increment stale.

use pollbox_core::clients::Limit;
use pollbox_core::service::AuthRefused;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A counter written by one thread only.
#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
    }
    #[inline]
    pub fn inc(&self) {
        self.add(1);
    }
    #[inline]
    pub fn set(&self, v: u64) {
        self.0.store(v, Relaxed);
    }
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
    /// For gauges that go down too (stored as two's complement).
    #[inline]
    pub fn sub(&self, n: u64) {
        self.0.store(self.0.load(Relaxed).wrapping_sub(n), Relaxed);
    }
}

pub use pollbox_core::service::{IngestResult, Removal, RouteLabel};

/// Why a connection was refused, in `pollbox_connections_rejected_total{reason=...}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    MaxConnections,
    Draining,
    /// The worker's share of `max_buffered_bytes` was used up.
    MaxBufferedBytes,
}

impl Rejected {
    pub const ALL: [Rejected; 3] = [
        Rejected::MaxConnections,
        Rejected::Draining,
        Rejected::MaxBufferedBytes,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Rejected::MaxConnections => "max_connections",
            Rejected::Draining => "draining",
            Rejected::MaxBufferedBytes => "max_buffered_bytes",
        }
    }
}

/// Status codes pollbox answers with; anything else lands in the last slot.
pub const CODES: [u16; 20] = [
    100, 200, 204, 304, 400, 401, 403, 404, 405, 408, 413, 422, 429, 431, 500, 501, 503, 505, 507,
    0,
];
const NCODES: usize = CODES.len();

fn code_index(code: u16) -> usize {
    CODES.iter().position(|&c| c == code).unwrap_or(NCODES - 1)
}

/// Upper bounds (seconds) of the request duration histogram: microseconds matter.
pub const DURATION_BUCKETS: [f64; 16] = [
    0.000_002, 0.000_005, 0.000_010, 0.000_020, 0.000_050, 0.000_100, 0.000_250, 0.000_500, 0.001,
    0.002_5, 0.005, 0.010, 0.050, 0.250, 1.0, 5.0,
];

/// Upper bounds (seconds) of the arena reset duration histogram.
pub const RESET_BUCKETS: [f64; 12] = [
    0.000_000_5,
    0.000_001,
    0.000_002,
    0.000_004,
    0.000_007,
    0.000_010,
    0.000_020,
    0.000_050,
    0.000_100,
    0.000_500,
    0.001,
    0.010,
];

/// Upper bounds (seconds) of the tick work histogram (arena reset, timers,
/// expiry): a tick should stay far below an epoch (16 ms).
pub const TICK_BUCKETS: [f64; 14] = [
    0.000_002, 0.000_005, 0.000_010, 0.000_025, 0.000_050, 0.000_100, 0.000_250, 0.000_500, 0.001,
    0.002_5, 0.005, 0.010, 0.016, 0.050,
];

/// A fixed-bucket histogram written by one thread.
pub struct Histogram<const N: usize> {
    bounds_ns: [u64; N],
    /// Non-cumulative counts; the last slot is +Inf.
    counts: Vec<Counter>,
    sum_ns: Counter,
}

impl<const N: usize> Histogram<N> {
    pub fn new(bounds_s: &[f64; N]) -> Self {
        let mut bounds_ns = [0u64; N];
        for (b, s) in bounds_ns.iter_mut().zip(bounds_s) {
            *b = (s * 1e9).round() as u64;
        }
        Histogram {
            bounds_ns,
            counts: (0..=N).map(|_| Counter::default()).collect(),
            sum_ns: Counter::default(),
        }
    }
    #[inline]
    pub fn observe_ns(&self, ns: u64) {
        self.observe_ns_times(ns, 1);
    }
    /// `n` observations of `ns` each.
    #[inline]
    pub fn observe_ns_times(&self, ns: u64, n: u64) {
        let i = self.bounds_ns.partition_point(|&b| b < ns);
        self.counts[i].add(n);
        self.sum_ns.add(ns.wrapping_mul(n));
    }
    /// Non-cumulative counts per bucket, the last one +Inf.
    pub fn counts(&self) -> impl Iterator<Item = u64> + '_ {
        self.counts.iter().map(Counter::get)
    }
    pub fn sum_ns(&self) -> u64 {
        self.sum_ns.get()
    }
}

/// Everything one worker counts.
pub struct WorkerStats {
    requests: Vec<Counter>,
    pub duration: Histogram<16>,
    ingest: [Counter; IngestResult::ALL.len()],
    pub connections_open: Counter,
    pub connections_total: Counter,
    rejected: [Counter; Rejected::ALL.len()],
    pub bytes_received: Counter,
    pub bytes_sent: Counter,
    pub arena_resets: Counter,
    pub arena_reset: Histogram<12>,
    pub arena_used_before_reset: Counter,
    pub arena_capacity: Counter,
    pub arena_high_water: Counter,
    pub arena_replaced: Counter,
    pub epoch_overruns: Counter,
    /// Longest epoch tick work seen, in nanoseconds.
    pub epoch_work_max_ns: Counter,
    /// Every tick's work (reset, timers, expiry).
    pub tick: Histogram<14>,
    /// Boxes this worker removed, by how (`DELETE`, expiry).
    removed: [Counter; Removal::ALL.len()],
    /// Bytes of connection read buffers and the buffer pool.
    pub buffer_bytes: Counter,
    /// Bytes queued to be sent.
    pub send_queue_bytes: Counter,
    /// Connections' read buffers and send queues (against max_buffered_bytes).
    pub buffered_bytes: Counter,
    /// jemalloc's per-thread cumulative counters, copied at each tick.
    pub thread_allocated: Counter,
    pub thread_deallocated: Counter,
    pub parked_polls: Counter,
    pub sse_subscribers: Counter,
    /// Event streams of a prefix (also counted in `sse_subscribers`).
    pub prefix_streams: Counter,
    pub sse_events: Counter,
    pub sse_coalesced: Counter,
    /// Requests (and batch messages) refused by access control, by reason.
    pub auth_refused: [Counter; AuthRefused::ALL.len()],
    /// Requests and connections refused by a per-client limit, by limit.
    pub limit_refused: [Counter; Limit::ALL.len()],
}

impl Default for WorkerStats {
    fn default() -> Self {
        WorkerStats {
            requests: (0..RouteLabel::ALL.len() * NCODES)
                .map(|_| Counter::default())
                .collect(),
            duration: Histogram::new(&DURATION_BUCKETS),
            ingest: Default::default(),
            connections_open: Counter::default(),
            connections_total: Counter::default(),
            rejected: Default::default(),
            bytes_received: Counter::default(),
            bytes_sent: Counter::default(),
            arena_resets: Counter::default(),
            arena_reset: Histogram::new(&RESET_BUCKETS),
            arena_used_before_reset: Counter::default(),
            arena_capacity: Counter::default(),
            arena_high_water: Counter::default(),
            arena_replaced: Counter::default(),
            epoch_overruns: Counter::default(),
            epoch_work_max_ns: Counter::default(),
            tick: Histogram::new(&TICK_BUCKETS),
            removed: Default::default(),
            buffer_bytes: Counter::default(),
            send_queue_bytes: Counter::default(),
            buffered_bytes: Counter::default(),
            thread_allocated: Counter::default(),
            thread_deallocated: Counter::default(),
            parked_polls: Counter::default(),
            sse_subscribers: Counter::default(),
            prefix_streams: Counter::default(),
            sse_events: Counter::default(),
            sse_coalesced: Counter::default(),
            auth_refused: Default::default(),
            limit_refused: Default::default(),
        }
    }
}

impl WorkerStats {
    #[inline]
    pub fn request(&self, route: RouteLabel, code: u16) {
        self.requests[route as usize * NCODES + code_index(code)].inc();
    }

    /// (route, code, count) for every non-zero cell.
    pub fn requests(&self) -> impl Iterator<Item = (RouteLabel, u16, u64)> + '_ {
        RouteLabel::ALL.iter().flat_map(move |&r| {
            CODES
                .iter()
                .enumerate()
                .filter(|(i, &c)| c != 0 || *i == NCODES - 1)
                .map(move |(i, &c)| (r, c, self.requests[r as usize * NCODES + i].get()))
                .filter(|&(_, _, n)| n > 0)
        })
    }

    #[inline]
    pub fn ingested(&self, result: IngestResult, n: u64) {
        self.ingest[result as usize].add(n);
    }

    pub fn ingested_total(&self, result: IngestResult) -> u64 {
        self.ingest[result as usize].get()
    }

    #[inline]
    pub fn boxes_removed(&self, why: Removal, n: u64) {
        self.removed[why as usize].add(n);
    }

    pub fn boxes_removed_total(&self, why: Removal) -> u64 {
        self.removed[why as usize].get()
    }

    #[inline]
    pub fn rejected(&self, why: Rejected) {
        self.rejected[why as usize].inc();
    }

    pub fn rejected_total(&self, why: Rejected) -> u64 {
        self.rejected[why as usize].get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_by_upper_bound() {
        let h = Histogram::new(&[0.000_001, 0.000_010]);
        h.observe_ns(1_000); // le 1us
        h.observe_ns(1_001); // le 10us
        h.observe_ns(50_000); // +Inf
        assert_eq!(h.counts().collect::<Vec<_>>(), vec![1, 1, 1]);
        assert_eq!(h.sum_ns(), 52_001);
        // A batch of pipelined answers: n observations of one duration.
        h.observe_ns_times(5_000, 16);
        assert_eq!(h.counts().collect::<Vec<_>>(), vec![1, 17, 1]);
        assert_eq!(h.sum_ns(), 52_001 + 80_000);
    }

    #[test]
    fn requests_are_counted_per_route_and_code() {
        let s = WorkerStats::default();
        s.request(RouteLabel::Poll, 200);
        s.request(RouteLabel::Poll, 200);
        s.request(RouteLabel::Ingest, 422);
        s.request(RouteLabel::Other, 999);
        let v: Vec<_> = s.requests().collect();
        assert!(v.contains(&(RouteLabel::Poll, 200, 2)));
        assert!(v.contains(&(RouteLabel::Ingest, 422, 1)));
        assert!(v.contains(&(RouteLabel::Other, 0, 1)));
        assert_eq!(v.len(), 3);
    }
}
