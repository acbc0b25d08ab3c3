//! What one load thread counts: a latency histogram, status codes and errors per
//! operation. Threads keep their own [`Stats`] (no sharing on the hot path) and the
//! run merges them at the end.

use hdrhistogram::Histogram;

use crate::mix::Op;

/// Highest latency the histograms hold: one hour, in nanoseconds. Longer ones are
/// recorded as one hour.
pub const MAX_LATENCY_NS: u64 = 3_600 * 1_000_000_000;
/// Significant decimal digits of the histograms (0.1% resolution).
pub const SIGFIG: u8 = 3;
/// Status codes are counted in a slot per code below this; others in slot 0.
pub const STATUS_SLOTS: usize = 600;

/// A latency histogram in nanoseconds with the generator's bounds.
pub fn latency_histogram() -> Histogram<u64> {
    match Histogram::new_with_bounds(1, MAX_LATENCY_NS, SIGFIG) {
        Ok(h) => h,
        // The bounds are constants that hdrhistogram accepts; a test covers it.
        Err(e) => unreachable!("constant histogram bounds refused: {e}"),
    }
}

/// Why a request counts as failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Connecting (or reconnecting) to the server failed.
    Connect,
    /// A read or write on the socket failed.
    Io,
    /// The server closed the connection while this request waited for its answer.
    Closed,
    /// The response could not be framed as HTTP/1.1.
    Protocol,
    /// A status the operation does not expect (e.g. 500 to a poll).
    Status,
    /// The body is not what the operation returns (wrong key, no version, ...).
    Payload,
    /// A box's version went backwards on one connection, or a long-poll answered 200
    /// without a newer version.
    Version,
    /// A batch answer rejected some of its messages.
    Rejected,
    /// No answer before the end of the run's drain period.
    Timeout,
}

impl ErrorKind {
    pub const COUNT: usize = 9;
    pub const ALL: [ErrorKind; ErrorKind::COUNT] = [
        ErrorKind::Connect,
        ErrorKind::Io,
        ErrorKind::Closed,
        ErrorKind::Protocol,
        ErrorKind::Status,
        ErrorKind::Payload,
        ErrorKind::Version,
        ErrorKind::Rejected,
        ErrorKind::Timeout,
    ];

    /// Name in the report.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Connect => "connect",
            ErrorKind::Io => "io",
            ErrorKind::Closed => "closed",
            ErrorKind::Protocol => "protocol",
            ErrorKind::Status => "status",
            ErrorKind::Payload => "payload",
            ErrorKind::Version => "version",
            ErrorKind::Rejected => "rejected",
            ErrorKind::Timeout => "timeout",
        }
    }
}

/// Counts for one operation.
#[derive(Debug, Clone)]
pub struct OpStats {
    /// Latency of answered requests of the measured window, nanoseconds.
    pub latency: Histogram<u64>,
    /// Answered requests of the measured window.
    pub requests: u64,
    /// Of those, the ones answered before the window closed (the achieved rate counts
    /// these: answers that trickle in after the end do not make a slow server look
    /// fast).
    pub answered_in_window: u64,
    /// Answered requests of the warm-up.
    pub warmup: u64,
    /// Sent requests that never got an answer (connection lost, run ended).
    pub unanswered: u64,
    /// 404 to a poll or long-poll: the key has no box yet.
    pub not_found: u64,
    /// 304 to a long-poll: no newer version within `wait_ms`.
    pub not_modified: u64,
    /// Messages the server accepted (ingest and batch).
    pub accepted: u64,
    /// Of those, the ones in answers that came before the window closed (messages/s
    /// counts these, as the achieved rate counts requests).
    pub accepted_in_window: u64,
    pub errors: [u64; ErrorKind::COUNT],
    /// Answers by status code (measured window).
    pub status: Vec<u64>,
}

impl OpStats {
    fn new() -> OpStats {
        OpStats {
            latency: latency_histogram(),
            requests: 0,
            answered_in_window: 0,
            warmup: 0,
            unanswered: 0,
            not_found: 0,
            not_modified: 0,
            accepted: 0,
            accepted_in_window: 0,
            errors: [0; ErrorKind::COUNT],
            status: vec![0; STATUS_SLOTS],
        }
    }

    /// Counts an answer's status code.
    #[inline]
    pub fn count_status(&mut self, status: u16) {
        let slot = usize::from(status);
        let slot = if slot < STATUS_SLOTS { slot } else { 0 };
        self.status[slot] += 1;
    }

    fn merge(&mut self, other: &OpStats) {
        // Same bounds on both sides, so adding cannot fail; saturate if it ever did.
        if self.latency.add(&other.latency).is_err() {
            for v in other.latency.iter_recorded() {
                self.latency
                    .saturating_record_n(v.value_iterated_to(), v.count_at_value());
            }
        }
        self.requests += other.requests;
        self.answered_in_window += other.answered_in_window;
        self.warmup += other.warmup;
        self.unanswered += other.unanswered;
        self.not_found += other.not_found;
        self.not_modified += other.not_modified;
        self.accepted += other.accepted;
        self.accepted_in_window += other.accepted_in_window;
        for (a, b) in self.errors.iter_mut().zip(other.errors) {
            *a += b;
        }
        for (a, b) in self.status.iter_mut().zip(&other.status) {
            *a += b;
        }
    }

    /// Errors of all kinds.
    pub fn error_total(&self) -> u64 {
        self.errors.iter().sum()
    }
}

/// Everything one thread (or, merged, the whole run) counted.
#[derive(Debug, Clone)]
pub struct Stats {
    /// Indexed by [`Op::index`].
    pub ops: Vec<OpStats>,
    /// Errors not tied to a request (failed reconnects).
    pub connection_errors: [u64; ErrorKind::COUNT],
    /// Requests the open-loop schedule intended to send in the measured window.
    pub scheduled: u64,
    /// Open-loop: how late the thread woke for a request that was due on an idle
    /// connection (ns). This is the generator's own lateness, which the latencies
    /// include; it should stay far below them.
    pub wake_lateness: Histogram<u64>,
}

impl Default for Stats {
    fn default() -> Stats {
        Stats {
            ops: Op::ALL.iter().map(|_| OpStats::new()).collect(),
            connection_errors: [0; ErrorKind::COUNT],
            scheduled: 0,
            wake_lateness: latency_histogram(),
        }
    }
}

impl Stats {
    /// The counts of one operation.
    #[inline]
    pub fn op(&mut self, op: Op) -> &mut OpStats {
        &mut self.ops[op.index()]
    }

    /// Adds another thread's counts.
    pub fn merge(&mut self, other: &Stats) {
        for (a, b) in self.ops.iter_mut().zip(&other.ops) {
            a.merge(b);
        }
        for (a, b) in self
            .connection_errors
            .iter_mut()
            .zip(other.connection_errors)
        {
            *a += b;
        }
        self.scheduled += other.scheduled;
        let _ = self.wake_lateness.add(&other.wake_lateness);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_hold_an_hour_at_three_digits() {
        let mut h = latency_histogram();
        h.record(1).unwrap();
        h.record(MAX_LATENCY_NS).unwrap();
        h.saturating_record(u64::MAX);
        assert_eq!(h.len(), 3);
    }

    #[test]
    fn merging_adds_everything() {
        let mut a = Stats::default();
        let mut b = Stats::default();
        a.op(Op::Poll).latency.record(1000).unwrap();
        a.op(Op::Poll).count_status(200);
        b.op(Op::Poll).latency.record(2000).unwrap();
        b.op(Op::Poll).count_status(200);
        b.op(Op::Poll).count_status(999);
        b.op(Op::Ingest).errors[ErrorKind::Status as usize] = 2;
        b.connection_errors[ErrorKind::Connect as usize] = 1;
        a.merge(&b);
        assert_eq!(a.ops[Op::Poll.index()].latency.len(), 2);
        assert_eq!(a.ops[Op::Poll.index()].status[200], 2);
        assert_eq!(a.ops[Op::Poll.index()].status[0], 1);
        assert_eq!(a.ops[Op::Ingest.index()].error_total(), 2);
        assert_eq!(a.connection_errors[ErrorKind::Connect as usize], 1);
    }
}
