//! The live progress line (docs/operations.md#load-generator-and-demo): each load
//! thread hands over what it saw during the last second once a second (one lock per
//! thread per second, nothing per request), and the run's main thread prints one
//! line per second on stderr.

use std::io::Write;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use hdrhistogram::Histogram;

use crate::stats::latency_histogram;

/// What a thread hands over each second.
pub struct Tally {
    pub answered: u64,
    pub errors: u64,
    /// Latencies of everything answered since the last hand-over, warm-up included.
    pub latency: Histogram<u64>,
}

impl Tally {
    pub fn new() -> Tally {
        Tally {
            answered: 0,
            errors: 0,
            latency: latency_histogram(),
        }
    }

    /// Moves this tally into `into` and starts over.
    pub fn drain_into(&mut self, into: &mut Tally) {
        into.answered += self.answered;
        into.errors += self.errors;
        // Same bounds on both sides: adding cannot fail.
        let _ = into.latency.add(&self.latency);
        self.answered = 0;
        self.errors = 0;
        self.latency.reset();
    }
}

impl Default for Tally {
    fn default() -> Tally {
        Tally::new()
    }
}

/// One hand-over slot per thread.
pub struct Board {
    slots: Vec<Mutex<Tally>>,
}

impl Board {
    pub fn new(threads: usize) -> Board {
        Board {
            slots: (0..threads).map(|_| Mutex::new(Tally::new())).collect(),
        }
    }

    /// The slot of thread `i`.
    pub fn slot(&self, i: usize) -> MutexGuard<'_, Tally> {
        // A panicking thread poisons only its own slot; the counts are still valid.
        self.slots[i].lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Collects every thread's last second into `into`.
    pub fn collect(&self, into: &mut Tally) {
        for i in 0..self.slots.len() {
            self.slot(i).drain_into(into);
        }
    }
}

/// Prints the per-second lines.
pub struct Printer {
    warmup: Duration,
    /// End of the previous line's interval.
    last: Duration,
    total_answered: u64,
    total_errors: u64,
    /// Latencies of the measured window so far.
    measured: Histogram<u64>,
}

impl Printer {
    pub fn new(warmup: Duration) -> Printer {
        Printer {
            warmup,
            last: Duration::ZERO,
            total_answered: 0,
            total_errors: 0,
            measured: latency_histogram(),
        }
    }

    /// Prints the line for the interval (a second, or the last part of one) that ended
    /// at `elapsed`.
    pub fn line(&mut self, elapsed: Duration, second: &Tally, out: &mut impl Write) {
        let interval = elapsed.saturating_sub(self.last).as_secs_f64();
        self.last = elapsed;
        let rate = if interval > 0.0 {
            second.answered as f64 / interval
        } else {
            0.0
        };
        self.total_answered += second.answered;
        self.total_errors += second.errors;
        let in_warmup = elapsed <= self.warmup;
        if !in_warmup {
            let _ = self.measured.add(&second.latency);
        }
        let p99_second = ms(second.latency.value_at_quantile(0.99));
        let p99_so_far = if in_warmup {
            "-".to_string()
        } else {
            format!("{:.3}", ms(self.measured.value_at_quantile(0.99)))
        };
        let _ = writeln!(
            out,
            "[{:>6.1}s{}] {:>9.0} req/s  p99 {:>9.3} ms (so far {} ms)  errors {}  total {}",
            elapsed.as_secs_f64(),
            if in_warmup { " warmup" } else { "" },
            rate,
            p99_second,
            p99_so_far,
            self.total_errors,
            self.total_answered,
        );
    }
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn board_hands_over_and_printer_prints() {
        let board = Board::new(2);
        {
            let mut slot = board.slot(0);
            slot.answered = 10;
            slot.latency.record(2_000_000).unwrap();
        }
        board.slot(1).errors = 1;
        let mut second = Tally::new();
        board.collect(&mut second);
        assert_eq!((second.answered, second.errors), (10, 1));
        assert_eq!(
            board.slot(0).answered,
            0,
            "slots start over after a hand-over"
        );

        let mut printer = Printer::new(Duration::ZERO);
        let mut out = Vec::new();
        printer.line(Duration::from_secs(1), &second, &mut out);
        let line = String::from_utf8(out).unwrap();
        assert!(line.contains("10 req/s"), "{line}");
        assert!(line.contains("p99     2.001 ms"), "{line}");
        assert!(line.contains("errors 1"), "{line}");
    }
}
