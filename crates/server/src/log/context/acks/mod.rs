//! Where a record this node produced meets its apply. An ingest is answered
//! once the log acknowledged each of its records (`acks=all`: the delivery
//! report, with the record's partition and offset) **and** this node applied
//! it (the partition's `next` passed the offset). The two come on different
//! threads and in either order:
//!
//! - the acknowledgement first (the usual order under load): it is held
//!   here, by offset, and the consuming thread that applies the offset
//!   reports it;
//! - the apply first: the acknowledgement finds the partition past its
//!   offset and is reported at once, with the record's outcome, which is
//!   "applied" unless the consuming thread wrote down another (the last
//!   [`KEPT`] other outcomes a partition had, so a refusal or a missing box
//!   still reaches its answer).
//!
//! [`PartitionAcks`] owns the partition's `next` and the whole order of the
//! handshake; each side calls one method:
//!
//! ```text
//!  consuming thread: applied(offset)        delivery thread: acknowledged(run)
//!  ─────────────────────────────────        ──────────────────────────────────
//!  (outcome ≠ applied: noted, locked)       lock
//!  C1 next ← offset + 1          (SeqCst)   D1 n ← next                (SeqCst)
//!  C2 f ← first_held             (SeqCst)      offsets < n: reported now
//!     f < next: lock, report the held          the rest held, by offset
//!     below next, first_held ← the rest     D2 first_held ← first held (SeqCst)
//!                                           D3 n ← next again          (SeqCst)
//!                                              held below n: reported now
//! ```
//!
//! Neither side misses the other (a Dekker pair): in the one order of all
//! `SeqCst` operations, either C1 comes before D3 (the delivery thread's
//! look again sees the apply) or D2 comes before C2 (the consuming thread
//! sees the held offset). Whoever takes an entry takes it under the mutex,
//! so it is reported once. `model.rs` (tests) runs both methods in every
//! order of these steps.
//!
//! A record names its request by the delivery report's opaque value
//! ([`DeliveryTag`]), not by anything in the record: records stay exactly
//! what any producer writes (the key and the message), and this node's are
//! produced as batches (`rd_kafka_produce_batch`, which takes no headers).

#[cfg(test)]
mod model;

use super::DeliveryTag;
use pollbox_core::service::Report;
use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// Outcomes other than "applied" a partition keeps for acknowledgements
/// that come after their apply (a replay's, an invalid foreign record's):
/// an acknowledgement older than the oldest forgotten one is reported
/// `Failed` (503: the message may or may not be in the boxes), never a
/// guess.
pub(crate) const KEPT: usize = 1024;

/// One acknowledgement of the log: its record's offset, its tag, and when
/// the record was produced.
pub(crate) type Ack = (i64, DeliveryTag, Instant);

/// One partition's `next` and its meeting place (in
/// [`super::PartitionState`]).
#[derive(Debug)]
pub(crate) struct PartitionAcks {
    /// The next offset to apply: every record before it is applied. Moved
    /// by [`PartitionAcks::applied`] only.
    next: AtomicI64,
    /// The first offset held for its apply; `i64::MAX` when none.
    first_held: AtomicI64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Acknowledged, not applied yet, by offset.
    held: VecDeque<Ack>,
    /// Applied records whose outcome was not "applied", by offset.
    other: VecDeque<(i64, Report)>,
    /// Offsets below this had outcomes that were forgotten.
    forgotten_below: i64,
}

impl PartitionAcks {
    /// A partition whose next record to apply is `next`.
    pub(crate) fn new(next: i64) -> PartitionAcks {
        PartitionAcks {
            next: AtomicI64::new(next),
            first_held: AtomicI64::new(i64::MAX),
            state: Mutex::new(State::default()),
        }
    }

    /// The next offset to apply: every record before it is applied (for the
    /// snapshot's position, the lag and the catch-up).
    #[inline]
    pub(crate) fn next(&self) -> i64 {
        self.next.load(Ordering::Acquire)
    }

    /// The consuming thread applied the record at `offset` with `report`:
    /// its outcome is written down (if not "applied"), `next` moves past it,
    /// and every acknowledgement held below `next` is handed to `ready`
    /// (with when its record was produced). Per record: no lock unless an
    /// outcome is written down or an acknowledgement is ready.
    #[inline]
    pub(crate) fn applied(
        &self,
        offset: i64,
        report: Report,
        ready: impl FnMut(DeliveryTag, Report, Instant),
    ) {
        if report != Report::Applied {
            self.note(offset, report);
        }
        let next = offset + 1;
        step();
        self.next.fetch_max(next, Ordering::SeqCst);
        step();
        if self.first_held.load(Ordering::SeqCst) < next {
            let mut s = self.lock();
            s.take_below(next, &self.first_held, ready);
        }
    }

    /// The log acknowledged `run`, records of this partition (one delivery
    /// report's, taken under one lock): each is handed to `ready` now if it
    /// is applied, else held until it is.
    pub(crate) fn acknowledged(
        &self,
        run: impl IntoIterator<Item = Ack>,
        mut ready: impl FnMut(DeliveryTag, Report, Instant),
    ) {
        let mut s = self.lock();
        step();
        let applied = self.next.load(Ordering::SeqCst);
        let mut held = false;
        for (offset, tag, produced) in run {
            if offset < applied {
                let r = s.outcome(offset);
                ready(tag, r, produced);
                continue;
            }
            // By offset (a partition's acknowledgements come in order: this
            // is the back, but an older one is put in its place all the same).
            let at = s.held.partition_point(|&(o, _, _)| o <= offset);
            s.held.insert(at, (offset, tag, produced));
            held = true;
        }
        if !held {
            return;
        }
        let first = s.held.front().map_or(i64::MAX, |&(o, _, _)| o);
        step();
        self.first_held.store(first, Ordering::SeqCst);
        // The consuming thread may have moved past them since `next` was
        // read, and looked at `first_held` before it was stored: look again.
        step();
        let now = self.next.load(Ordering::SeqCst);
        if first < now {
            s.take_below(now, &self.first_held, ready);
        }
    }

    /// Acknowledgements held for their apply.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.lock().held.len()
    }

    /// The record at `offset` was applied with `report`, not "applied".
    fn note(&self, offset: i64, report: Report) {
        let mut s = self.lock();
        if s.other.len() >= KEPT {
            if let Some((o, _)) = s.other.pop_front() {
                s.forgotten_below = o + 1;
            }
        }
        s.other.push_back((offset, report));
    }

    fn lock(&self) -> Locked<'_> {
        lock_step();
        // A panic elsewhere under this mutex left nothing half-written that
        // matters more than answering.
        Locked(self.state.lock().unwrap_or_else(PoisonError::into_inner))
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

    /// Hand every acknowledgement held below `next` to `ready`, and publish
    /// the first one still held.
    fn take_below(
        &mut self,
        next: i64,
        first_held: &AtomicI64,
        mut ready: impl FnMut(DeliveryTag, Report, Instant),
    ) {
        while let Some(&(o, tag, at)) = self.held.front() {
            if o >= next {
                break;
            }
            self.held.pop_front();
            ready(tag, self.outcome(o), at);
        }
        let first = self.held.front().map_or(i64::MAX, |&(o, _, _)| o);
        step();
        first_held.store(first, Ordering::SeqCst);
    }
}

/// The partition's state, locked. Its own type so that the model check
/// (tests) sees the lock taken and let go; nothing else.
struct Locked<'a>(MutexGuard<'a, State>);

impl Deref for Locked<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.0
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.0
    }
}

impl Drop for Locked<'_> {
    #[inline]
    fn drop(&mut self) {
        #[cfg(test)]
        model::unlocked();
    }
}

/// One step of the handshake (an operation on `next` or `first_held`): the
/// model check (tests) may run the other side here. Nothing otherwise.
#[inline(always)]
fn step() {
    #[cfg(test)]
    model::step();
}

/// The lock about to be taken: as [`step`].
#[inline(always)]
fn lock_step() {
    #[cfg(test)]
    model::lock_step();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::context::tag::t;
    use pollbox_core::plan::MessageError;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    #[test]
    fn an_acknowledgement_is_held_for_its_apply_and_one_after_it_is_reported_at_once() {
        let acks = PartitionAcks::new(10);
        let mut got = Vec::new();
        // Not applied yet: held.
        acks.acknowledged([(12, t(1, 0), Instant::now())], |t, r, _| got.push((t, r)));
        acks.acknowledged([(13, t(1, 1), Instant::now())], |t, r, _| got.push((t, r)));
        assert!(got.is_empty());
        assert_eq!(acks.held(), 2);
        // 10, 11 (someone else's, failed), 12 applied: 12 is reported, 13
        // is held.
        acks.applied(10, Report::Applied, |_, _, _| unreachable!("none held"));
        acks.applied(11, Report::Failed, |_, _, _| unreachable!("none held"));
        acks.applied(12, Report::Applied, |t, r, _| got.push((t, r)));
        assert_eq!(got, vec![(t(1, 0), Report::Applied)]);
        assert_eq!(acks.next(), 13);
        // 13 applied, refused by the table: its refusal is what is reported.
        let refused = Report::Refused(MessageError::TooManyBoxes);
        acks.applied(13, refused, |t, r, _| got.push((t, r)));
        assert_eq!(got[1], (t(1, 1), refused));
        assert_eq!(acks.held(), 0);
        // Applied before its acknowledgement: reported at once, with its
        // outcome.
        acks.applied(14, Report::Applied, |_, _, _| unreachable!("none held"));
        acks.applied(15, Report::NoBox, |_, _, _| unreachable!("none held"));
        acks.applied(16, Report::Applied, |_, _, _| unreachable!("none held"));
        acks.acknowledged([(15, t(2, 0), Instant::now())], |t, r, _| got.push((t, r)));
        acks.acknowledged([(16, t(2, 1), Instant::now())], |t, r, _| got.push((t, r)));
        assert_eq!(
            got[2..],
            [(t(2, 0), Report::NoBox), (t(2, 1), Report::Applied)]
        );
        // One report's run, half applied: those are reported at once, the
        // rest when their apply comes.
        let now = Instant::now();
        acks.acknowledged(
            [(16, t(3, 0), now), (17, t(3, 1), now), (18, t(3, 2), now)],
            |t, r, _| got.push((t, r)),
        );
        assert_eq!(got[4..], [(t(3, 0), Report::Applied)]);
        assert_eq!(acks.held(), 2);
        acks.applied(17, Report::Applied, |t, r, _| got.push((t, r)));
        acks.applied(18, Report::Applied, |t, r, _| got.push((t, r)));
        assert_eq!(
            got[5..],
            [(t(3, 1), Report::Applied), (t(3, 2), Report::Applied)]
        );
        assert_eq!(acks.held(), 0);
    }

    #[test]
    fn an_outcome_forgotten_is_reported_failed_never_guessed() {
        let acks = PartitionAcks::new(0);
        for o in 0..(KEPT as i64 + 10) {
            acks.applied(o, Report::NoBox, |_, _, _| unreachable!("none held"));
        }
        let mut got = Vec::new();
        acks.acknowledged([(3, t(1, 0), Instant::now())], |t, r, _| got.push((t, r)));
        acks.acknowledged([(KEPT as i64 + 5, t(1, 1), Instant::now())], |t, r, _| {
            got.push((t, r))
        });
        assert_eq!(
            got,
            vec![(t(1, 0), Report::Failed), (t(1, 1), Report::NoBox)]
        );
    }

    /// The consuming thread and the delivery thread race over 100,000
    /// offsets, in lockstep so that an acknowledgement often comes just as
    /// its offset is applied: each acknowledgement is reported exactly once,
    /// with its own outcome, and nothing is left held. (`model.rs` tries
    /// every order of the steps; this runs the real atomics at speed.)
    #[test]
    fn racing_applies_and_acknowledgements_report_each_record_once() {
        const N: i64 = 100_000;
        let acks = Arc::new(PartitionAcks::new(0));
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
            move |t: DeliveryTag, r: Report, _: Instant| {
                let o = t.request as i64;
                assert_eq!(r, outcome(o), "offset {o}");
                reported[o as usize].fetch_add(1, Ordering::Relaxed);
            }
        };
        let wait_for = |at_least: &dyn Fn() -> bool| {
            while !at_least() {
                std::hint::spin_loop();
                std::thread::yield_now();
            }
        };
        let consumer = {
            let (acks, acked, check) = (acks.clone(), acked.clone(), check.clone());
            std::thread::spawn(move || {
                for o in 0..N {
                    wait_for(&|| acked.load(Ordering::SeqCst) >= (o - 2) & !1);
                    acks.applied(o, outcome(o), &check);
                }
            })
        };
        for o in (0..N).step_by(2) {
            // Acknowledged as the consumer is about to apply it.
            wait_for(&|| acks.next() >= o);
            let tag = DeliveryTag {
                worker: 0,
                request: o as u64,
                index: 0,
            };
            acks.acknowledged([(o, tag, Instant::now())], &check);
            acked.store(o, Ordering::SeqCst);
        }
        let _ = consumer.join();
        for (o, n) in reported.iter().enumerate() {
            let want = u64::from(o % 2 == 0);
            assert_eq!(n.load(Ordering::Relaxed), want, "offset {o}");
        }
        assert_eq!(acks.held(), 0);
    }

    /// The same race where nothing comes after: a partition's last record
    /// applied just as its acknowledgement arrives, 20,000 times. Neither
    /// side may leave it held for a record that never comes.
    #[test]
    fn a_last_record_acknowledged_as_it_is_applied_is_reported() {
        use std::sync::Barrier;
        const TRIALS: usize = 20_000;
        let start = Arc::new(Barrier::new(2));
        let end = Arc::new(Barrier::new(2));
        let shared: Arc<Mutex<Option<Arc<PartitionAcks>>>> = Arc::new(Mutex::new(None));
        let count = Arc::new(AtomicU64::new(0));
        let consumer = {
            let (start, end, shared, count) =
                (start.clone(), end.clone(), shared.clone(), count.clone());
            std::thread::spawn(move || {
                for _ in 0..TRIALS {
                    start.wait();
                    let acks = shared.lock().unwrap().clone().unwrap();
                    acks.applied(0, Report::Applied, |_, _, _| {
                        count.fetch_add(1, Ordering::Relaxed);
                    });
                    end.wait();
                }
            })
        };
        for trial in 0..TRIALS {
            let acks = Arc::new(PartitionAcks::new(0));
            *shared.lock().unwrap() = Some(acks.clone());
            let before = count.load(Ordering::Relaxed);
            start.wait();
            acks.acknowledged([(0, t(1, 0), Instant::now())], |_, _, _| {
                count.fetch_add(1, Ordering::Relaxed);
            });
            end.wait();
            assert_eq!(count.load(Ordering::Relaxed), before + 1, "trial {trial}");
            assert_eq!(acks.held(), 0, "trial {trial}");
        }
        let _ = consumer.join();
    }
}
