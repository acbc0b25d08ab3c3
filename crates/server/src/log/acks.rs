//! Where a record this node produced meets its apply. An ingest is answered
//! once the log acknowledged each of its records (`acks=all`: the delivery
//! report, with the record's partition and offset) **and** this node applied
//! it (the partition's `next` passed the offset). The two come on different
//! threads and in either order:
//!
//! - the acknowledgement first (the usual order under load): it waits here,
//!   by offset, and the consuming thread that applies the offset reports it;
//! - the apply first: the acknowledgement finds the partition past its
//!   offset and reports at once, with the record's outcome, which is
//!   "applied" unless the consuming thread wrote down another
//!   ([`PartitionAcks::outcome`]: the last [`KEPT`] other outcomes a
//!   partition had, so a refusal or a missing box still reaches its answer).
//!
//! A record names its request by the delivery report's opaque value, not by
//! anything in the record: records stay exactly what any producer writes
//! (the key and the message), and this node's are produced as batches
//! (`rd_kafka_produce_batch`, which takes no headers).
//!
//! Neither side misses the other (a Dekker pair, `SeqCst`): the consuming
//! thread moves `next` and then looks at the first waiting offset; an
//! acknowledgement that waits publishes that offset and then looks at `next`
//! again. At least one of them sees the other, and whoever takes an entry
//! takes it under the mutex, so it is reported once.

use pollbox_core::service::Report;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Outcomes other than "applied" a partition keeps for acknowledgements
/// that come after their apply (a replay's, an invalid foreign record's):
/// an acknowledgement older than the oldest forgotten one is reported
/// `Failed` (503: the message may or may not be in the boxes), never a
/// guess.
pub const KEPT: usize = 1024;

/// Which connection waits for a record: its worker, its request, its place
/// in the request; carried as the delivery report's opaque value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    pub worker: u16,
    pub request: u64,
    pub index: u32,
}

/// Bits of the opaque value: 10 for the worker, 25 for the request (a
/// worker's request ids wrap there: [`REQUEST_MASK`]), 28 for the index,
/// and the top bit set (an opaque value of 0 is librdkafka's "none").
const WORKER_BITS: u32 = 10;
const REQUEST_BITS: u32 = 25;
const INDEX_BITS: u32 = 28;
const OURS: u64 = 1 << 63;
/// Request ids a worker hands out stay under this (they wrap: two requests
/// waiting at once are never 2^25 requests apart).
pub const REQUEST_MASK: u64 = (1 << REQUEST_BITS) - 1;
/// Workers a ticket can name.
pub const MAX_WORKERS: usize = 1 << WORKER_BITS;
/// A record's place in its request, as far as a ticket names it: a request
/// of more messages names the later ones' refusals by this index.
pub const MAX_INDEX: u32 = (1 << INDEX_BITS) - 1;

impl Ticket {
    /// The opaque value of a record (a worker past [`MAX_WORKERS`] is not
    /// started on a node of a log).
    pub fn encode(self) -> usize {
        let worker = u64::from(self.worker) & (MAX_WORKERS as u64 - 1);
        let v = (worker << (REQUEST_BITS + INDEX_BITS))
            | ((self.request & REQUEST_MASK) << INDEX_BITS)
            | u64::from(self.index.min(MAX_INDEX));
        (v | OURS) as usize
    }

    /// The ticket of an opaque value, if it is one.
    pub fn decode(v: usize) -> Option<Ticket> {
        let v = v as u64;
        if v & OURS == 0 {
            return None;
        }
        let v = v & !OURS;
        Some(Ticket {
            worker: (v >> (REQUEST_BITS + INDEX_BITS)) as u16,
            request: (v >> INDEX_BITS) & REQUEST_MASK,
            index: (v & u64::from(MAX_INDEX)) as u32,
        })
    }
}

/// One partition's meeting place (beside its `next`, in
/// [`super::PartitionState`]).
#[derive(Debug)]
pub struct PartitionAcks {
    /// The first offset waiting for its apply; `i64::MAX` when none.
    first_waiting: AtomicI64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Acknowledged, not applied yet: (offset, ticket, when it was
    /// produced), by offset.
    waiting: VecDeque<(i64, Ticket, Instant)>,
    /// Applied records whose outcome was not "applied", by offset.
    other: VecDeque<(i64, Report)>,
    /// Offsets below this had outcomes that were forgotten.
    forgotten_below: i64,
}

impl Default for PartitionAcks {
    fn default() -> Self {
        PartitionAcks {
            first_waiting: AtomicI64::new(i64::MAX),
            state: Mutex::new(State::default()),
        }
    }
}

impl PartitionAcks {
    /// The consuming thread applied the record at `offset` with `report`,
    /// before it moves `next` past it. Only outcomes other than "applied"
    /// are written down.
    pub fn applied(&self, offset: i64, report: Report) {
        if report == Report::Applied {
            return;
        }
        let mut s = self.lock();
        if s.other.len() >= KEPT {
            if let Some((o, _)) = s.other.pop_front() {
                s.forgotten_below = o + 1;
            }
        }
        s.other.push_back((offset, report));
    }

    /// The consuming thread moved `next` (with `SeqCst`) to `next`: hand
    /// every acknowledgement waiting below it to `report` (with when its
    /// record was produced).
    #[inline]
    pub fn moved(&self, next: i64, report: impl FnMut(Ticket, Report, Instant)) {
        if self.first_waiting.load(Ordering::SeqCst) < next {
            self.take_below(next, report);
        }
    }

    /// The log acknowledged `acks` of this partition: each record's offset,
    /// ticket and when it was produced (one delivery report's run, taken
    /// under one lock); `next` reads the partition's next offset to apply.
    /// Each is reported now (to `report`) if it is applied, else when it is.
    pub fn acknowledged(
        &self,
        acks: impl IntoIterator<Item = (i64, Ticket, Instant)>,
        next: impl Fn() -> i64,
        mut report: impl FnMut(Ticket, Report, Instant),
    ) {
        let mut s = self.lock();
        let applied = next();
        let mut queued = false;
        for (offset, ticket, produced) in acks {
            if offset < applied {
                let r = s.outcome(offset);
                report(ticket, r, produced);
                continue;
            }
            // By offset (a partition's acknowledgements come in order: this
            // is the back, but an older one is put in its place all the same).
            let at = s.waiting.partition_point(|&(o, _, _)| o <= offset);
            s.waiting.insert(at, (offset, ticket, produced));
            queued = true;
        }
        if !queued {
            return;
        }
        let first = s.waiting.front().map_or(i64::MAX, |&(o, _, _)| o);
        self.first_waiting.store(first, Ordering::SeqCst);
        // The consuming thread may have moved past them since `next` was
        // read, and looked at `first_waiting` before it was stored: look again.
        let now = next();
        if first < now {
            s.take_below(now, &self.first_waiting, &mut report);
        }
    }

    fn take_below(&self, next: i64, mut report: impl FnMut(Ticket, Report, Instant)) {
        let mut s = self.lock();
        s.take_below(next, &self.first_waiting, &mut report);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere under this mutex left nothing half-written that
        // matters more than answering.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Acknowledgements waiting (for tests and the idle check).
    pub fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }
}

impl State {
    /// The outcome of the applied record at `offset`.
    fn outcome(&self, offset: i64) -> Report {
        if offset < self.forgotten_below {
            return Report::Failed;
        }
        match self.other.binary_search_by_key(&offset, |&(o, _)| o) {
            Ok(i) => self.other[i].1,
            Err(_) => Report::Applied,
        }
    }

    fn take_below(
        &mut self,
        next: i64,
        first_waiting: &AtomicI64,
        report: &mut impl FnMut(Ticket, Report, Instant),
    ) {
        while let Some(&(o, t, at)) = self.waiting.front() {
            if o >= next {
                break;
            }
            self.waiting.pop_front();
            report(t, self.outcome(o), at);
        }
        let first = self.waiting.front().map_or(i64::MAX, |&(o, _, _)| o);
        first_waiting.store(first, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pollbox_core::plan::MessageError;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    fn t(request: u64, index: u32) -> Ticket {
        Ticket {
            worker: 3,
            request,
            index,
        }
    }

    #[test]
    fn a_ticket_round_trips_through_its_opaque_value_and_anything_else_is_none() {
        let a = Ticket {
            worker: (MAX_WORKERS - 1) as u16,
            request: REQUEST_MASK,
            index: MAX_INDEX,
        };
        let b = Ticket {
            worker: 0,
            request: 0,
            index: 0,
        };
        for x in [a, b, t(12_345, 99)] {
            assert_eq!(Ticket::decode(x.encode()), Some(x));
            assert_ne!(x.encode(), 0);
        }
        // Request ids wrap; an index past the bits names the last.
        assert_eq!(
            Ticket::decode(t(REQUEST_MASK + 5, 1).encode()),
            Some(t(4, 1))
        );
        assert_eq!(
            Ticket::decode(t(1, u32::MAX).encode()).map(|x| x.index),
            Some(MAX_INDEX)
        );
        assert_eq!(Ticket::decode(0), None);
        assert_eq!(Ticket::decode(12_345), None);
    }

    #[test]
    fn an_acknowledgement_waits_for_its_apply_and_one_after_it_is_reported_at_once() {
        let acks = PartitionAcks::default();
        let next = AtomicI64::new(10);
        let mut got = Vec::new();
        // Not applied yet: waits.
        acks.acknowledged(
            [(12, t(1, 0), Instant::now())],
            || next.load(Ordering::SeqCst),
            |t, r, _| got.push((t, r)),
        );
        acks.acknowledged(
            [(13, t(1, 1), Instant::now())],
            || next.load(Ordering::SeqCst),
            |t, r, _| got.push((t, r)),
        );
        assert!(got.is_empty());
        assert_eq!(acks.waiting(), 2);
        // 10, 11 (someone else's), 12 applied: 12 is reported, 13 waits.
        acks.applied(11, Report::Failed);
        next.store(13, Ordering::SeqCst);
        acks.moved(13, |t, r, _| got.push((t, r)));
        assert_eq!(got, vec![(t(1, 0), Report::Applied)]);
        // 13 applied, refused by the table: its refusal is what is reported.
        let refused = Report::Refused(MessageError::TooManyBoxes);
        acks.applied(13, refused);
        next.store(14, Ordering::SeqCst);
        acks.moved(14, |t, r, _| got.push((t, r)));
        assert_eq!(got[1], (t(1, 1), refused));
        assert_eq!(acks.waiting(), 0);
        // Applied before its acknowledgement: reported at once, with its
        // outcome.
        acks.applied(15, Report::NoBox);
        next.store(17, Ordering::SeqCst);
        acks.moved(17, |_, _, _| unreachable!("nothing waits"));
        acks.acknowledged(
            [(15, t(2, 0), Instant::now())],
            || 17,
            |t, r, _| got.push((t, r)),
        );
        acks.acknowledged(
            [(16, t(2, 1), Instant::now())],
            || 17,
            |t, r, _| got.push((t, r)),
        );
        assert_eq!(
            got[2..],
            [(t(2, 0), Report::NoBox), (t(2, 1), Report::Applied)]
        );
        // One report's run, half applied: those are reported at once, the
        // rest when their apply comes.
        let now = Instant::now();
        acks.acknowledged(
            [(16, t(3, 0), now), (17, t(3, 1), now), (18, t(3, 2), now)],
            || next.load(Ordering::SeqCst),
            |t, r, _| got.push((t, r)),
        );
        assert_eq!(got[4..], [(t(3, 0), Report::Applied)]);
        assert_eq!(acks.waiting(), 2);
        next.store(19, Ordering::SeqCst);
        acks.moved(19, |t, r, _| got.push((t, r)));
        assert_eq!(
            got[5..],
            [(t(3, 1), Report::Applied), (t(3, 2), Report::Applied)]
        );
    }

    #[test]
    fn an_outcome_forgotten_is_reported_failed_never_guessed() {
        let acks = PartitionAcks::default();
        for o in 0..(KEPT as i64 + 10) {
            acks.applied(o, Report::NoBox);
        }
        let mut got = Vec::new();
        let next = || KEPT as i64 + 10;
        acks.acknowledged([(3, t(1, 0), Instant::now())], next, |t, r, _| {
            got.push((t, r))
        });
        acks.acknowledged(
            [(KEPT as i64 + 5, t(1, 1), Instant::now())],
            next,
            |t, r, _| got.push((t, r)),
        );
        assert_eq!(
            got,
            vec![(t(1, 0), Report::Failed), (t(1, 1), Report::NoBox)]
        );
    }

    /// The consuming thread and the acknowledging thread race over 100,000
    /// offsets, in lockstep so that an acknowledgement often comes just as
    /// its offset is applied: each acknowledgement is reported exactly once,
    /// with its own outcome, and nothing is left waiting.
    #[test]
    fn racing_applies_and_acknowledgements_report_each_record_once() {
        const N: i64 = 100_000;
        let acks = Arc::new(PartitionAcks::default());
        let next = Arc::new(AtomicI64::new(0));
        // The last offset acknowledged (the consumer keeps within two of it).
        let acked = Arc::new(AtomicI64::new(-2));
        let reported: Arc<Vec<AtomicU64>> = Arc::new((0..N).map(|_| AtomicU64::new(0)).collect());
        // Every 997th record is a missing box (fewer than KEPT in all);
        // every other is acknowledged (the rest are other producers').
        let outcome = |o: i64| {
            if o % 997 == 0 {
                Report::NoBox
            } else {
                Report::Applied
            }
        };
        let check = {
            let reported = reported.clone();
            move |t: Ticket, r: Report, _: Instant| {
                let o = t.request as i64;
                assert_eq!(r, outcome(o), "offset {o}");
                reported[o as usize].fetch_add(1, Ordering::Relaxed);
            }
        };
        let wait_for = |a: &AtomicI64, at_least: i64| {
            while a.load(Ordering::SeqCst) < at_least {
                std::hint::spin_loop();
                std::thread::yield_now();
            }
        };
        let consumer = {
            let (acks, next, acked, check) =
                (acks.clone(), next.clone(), acked.clone(), check.clone());
            std::thread::spawn(move || {
                for o in 0..N {
                    wait_for(&acked, (o - 2) & !1);
                    acks.applied(o, outcome(o));
                    next.fetch_max(o + 1, Ordering::SeqCst);
                    acks.moved(o + 1, &check);
                }
            })
        };
        for o in (0..N).step_by(2) {
            // Acknowledged as the consumer is about to apply it.
            wait_for(&next, o);
            let n = next.clone();
            let ticket = Ticket {
                worker: 0,
                request: o as u64,
                index: 0,
            };
            acks.acknowledged(
                [(o, ticket, Instant::now())],
                move || n.load(Ordering::SeqCst),
                &check,
            );
            acked.store(o, Ordering::SeqCst);
        }
        let _ = consumer.join();
        for (o, n) in reported.iter().enumerate() {
            let want = u64::from(o % 2 == 0);
            assert_eq!(n.load(Ordering::Relaxed), want, "offset {o}");
        }
        assert_eq!(acks.waiting(), 0);
    }

    /// The same race where nothing comes after: a partition's last record
    /// applied just as its acknowledgement arrives, 20,000 times. Neither
    /// side may leave it waiting for a record that never comes.
    #[test]
    fn a_last_record_acknowledged_as_it_is_applied_is_reported() {
        use std::sync::Barrier;
        const TRIALS: usize = 20_000;
        let start = Arc::new(Barrier::new(2));
        let end = Arc::new(Barrier::new(2));
        type Trial = Option<(Arc<PartitionAcks>, Arc<AtomicI64>)>;
        let shared: Arc<Mutex<Trial>> = Arc::new(Mutex::new(None));
        let count = Arc::new(AtomicU64::new(0));
        let consumer = {
            let (start, end, shared, count) =
                (start.clone(), end.clone(), shared.clone(), count.clone());
            std::thread::spawn(move || {
                for _ in 0..TRIALS {
                    start.wait();
                    let (acks, next) = shared.lock().unwrap().clone().unwrap();
                    acks.applied(0, Report::Applied);
                    next.fetch_max(1, Ordering::SeqCst);
                    acks.moved(1, |_, _, _| {
                        count.fetch_add(1, Ordering::Relaxed);
                    });
                    end.wait();
                }
            })
        };
        for trial in 0..TRIALS {
            let acks = Arc::new(PartitionAcks::default());
            let next = Arc::new(AtomicI64::new(0));
            *shared.lock().unwrap() = Some((acks.clone(), next.clone()));
            let before = count.load(Ordering::Relaxed);
            start.wait();
            acks.acknowledged(
                [(0, t(1, 0), Instant::now())],
                || next.load(Ordering::SeqCst),
                |_, _, _| {
                    count.fetch_add(1, Ordering::Relaxed);
                },
            );
            end.wait();
            assert_eq!(count.load(Ordering::Relaxed), before + 1, "trial {trial}");
            assert_eq!(acks.waiting(), 0, "trial {trial}");
        }
        let _ = consumer.join();
    }
}
