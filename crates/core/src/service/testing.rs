//! A [`Host`] that records what it is told, for unit tests of the service and
//! the connection state machine.

use super::{Host, IngestResult, LogRecord, Removal, RouteLabel};

/// A record a node of a log produced: request, index, key, value.
pub type Produced = (u64, u32, Vec<u8>, Option<Vec<u8>>);

#[derive(Default)]
pub struct Recorder {
    pub draining: bool,
    pub not_ready: bool,
    pub answers: Vec<(RouteLabel, u16)>,
    pub ingested: Vec<(IngestResult, u64)>,
    pub updated: Vec<Vec<u8>>,
    pub removed: Vec<(Removal, u64)>,
    /// One entry per event stream event: the versions it coalesced.
    pub sse_events: Vec<u64>,
    /// A node of a log: the records produced (request, index, key, value).
    pub produced: Vec<Produced>,
    /// The log takes no record.
    pub log_down: bool,
    pub requests: u64,
    /// Requests refused on connections past `max_connections`.
    pub over_cap: u64,
    /// Refusals by a per-client limit, in order.
    pub limit_refused: Vec<crate::clients::Limit>,
}

impl super::Watchers for Recorder {
    fn box_updated(&mut self, key: &[u8]) {
        self.updated.push(key.to_vec());
    }
}

impl Host for Recorder {
    fn over_connection_cap(&mut self) {
        self.over_cap += 1;
    }
    fn limit_refused(&mut self, limit: crate::clients::Limit) {
        self.limit_refused.push(limit);
    }

    fn draining(&self) -> bool {
        self.draining
    }
    fn ready(&self) -> bool {
        !self.not_ready
    }
    fn boxes_removed(&mut self, why: Removal, n: u64) {
        self.removed.push((why, n));
    }
    fn render_metrics(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"pollbox_test 1\n");
    }
    fn answered(&mut self, route: RouteLabel, code: u16) {
        self.answers.push((route, code));
    }
    fn sse_event(&mut self, coalesced: u64) {
        self.sse_events.push(coalesced);
    }
    fn log_request(&mut self) -> u64 {
        self.requests += 1;
        self.requests
    }
    fn produce(&mut self, request: u64, records: &[LogRecord<'_>]) -> usize {
        if self.log_down {
            return 0;
        }
        for r in records {
            self.produced.push((
                request,
                r.index,
                r.key.to_vec(),
                r.value.map(<[u8]>::to_vec),
            ));
        }
        records.len()
    }
    fn ingested(&mut self, result: IngestResult, n: u64) {
        if n > 0 {
            self.ingested.push((result, n));
        }
    }
}
