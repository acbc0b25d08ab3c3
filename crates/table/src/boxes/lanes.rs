//! Watermarks (docs/boxes.md#watermarks): where each change of a box falls
//! in the order of the one writer that made it, so a client of a room can be
//! told exactly what moved since it last looked.
//!
//! A **lane** is one writer's order: on a standalone node each worker thread
//! is a lane (and lane 0 takes any other thread); on a node of a Kafka log
//! each partition is one, and a change's position in it is its record's
//! offset + 1 (its version), the same on every node. Every change of a box
//! (creation, update, removal) is **marked** with its lane and position, kept
//! beside the box's slot (a removed box's mark goes with its key into the key
//! order, as a tombstone).
//!
//! Each lane **publishes** how far it has gone, after the watchers of its
//! changes were told ([`Lanes::publish`]): so a reader that loads the
//! published positions (a **cut**) and then takes every wake-up it was sent
//! has heard of every change at or below the cut. A client holding a cut
//! holds every box under its prefix as of that cut; what moved since is what
//! is marked past it.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Lanes a table keeps: 1 + the workers of a standalone node, or the
/// partitions of a log (a topic with more has no watermarks: every reconnect
/// of a room is listed again).
pub const MAX_LANES: usize = 256;
/// Bits of a mark that hold the position (the lane above them).
const POS_BITS: u32 = 48;
const POS_MASK: u64 = (1 << POS_BITS) - 1;

thread_local! {
    /// The lane of the writer on this thread (0: none of its own).
    static LANE: Cell<u16> = const { Cell::new(0) };
}

/// This thread writes as lane `lane` (a worker: 1 + its index) from now on.
pub fn enter_lane(lane: usize) {
    LANE.with(|l| l.set(lane.min(MAX_LANES - 1) as u16));
}

/// A mark: lane `lane`, position `pos`.
#[inline]
pub fn mark(lane: usize, pos: u64) -> u64 {
    ((lane as u64) << POS_BITS) | (pos & POS_MASK)
}

/// The lane of a mark.
#[inline]
pub fn lane_of(mark: u64) -> usize {
    (mark >> POS_BITS) as usize
}

/// The position of a mark in its lane.
#[inline]
pub fn pos_of(mark: u64) -> u64 {
    mark & POS_MASK
}

/// Whether a change marked `mark` is past `cut` (a position per lane): not
/// in what a client at that cut holds. A lane past the cut's end is.
#[inline]
pub fn past(mark: u64, cut: &[u64]) -> bool {
    cut.get(lane_of(mark))
        .is_none_or(|&through| pos_of(mark) > through)
}

#[repr(align(64))]
#[derive(Default)]
struct Padded(AtomicU64);

/// Where each lane stands.
pub struct Lanes {
    /// Which table the positions belong to: random for a standalone process
    /// (its lanes start again at each start), the topic's for a log.
    run: AtomicU64,
    /// Lanes in use.
    count: AtomicUsize,
    /// A partition per lane (positions are versions) rather than a writer.
    log: std::sync::atomic::AtomicBool,
    /// The last position each lane gave.
    next: Box<[Padded]>,
    /// The last position each lane published.
    through: Box<[Padded]>,
    /// Per lane, the highest position of a tombstone no longer kept: a
    /// client whose cut is below it may have missed a removal.
    horizon: Box<[AtomicU64]>,
}

impl Lanes {
    /// The lanes of a table of run `run` (one lane until told more).
    pub fn new(run: u64) -> Lanes {
        Lanes {
            run: AtomicU64::new(run),
            count: AtomicUsize::new(1),
            log: std::sync::atomic::AtomicBool::new(false),
            next: (0..MAX_LANES).map(|_| Padded::default()).collect(),
            through: (0..MAX_LANES).map(|_| Padded::default()).collect(),
            horizon: (0..MAX_LANES).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// A standalone node with `writers` worker threads (lanes 1..=writers).
    pub fn for_writers(&self, writers: usize) {
        self.count
            .store((writers + 1).min(MAX_LANES), Ordering::Release);
    }

    /// A node of a log: one lane per partition, named `run` (the topic's).
    /// Past [`MAX_LANES`] partitions there are no watermarks (count 0).
    pub fn for_partitions(&self, partitions: usize, run: u64) {
        let count = if partitions <= MAX_LANES {
            partitions
        } else {
            0
        };
        self.run.store(run, Ordering::Release);
        self.log.store(true, Ordering::Release);
        self.count.store(count, Ordering::Release);
    }

    /// Which table the positions belong to.
    pub fn run(&self) -> u64 {
        self.run.load(Ordering::Acquire)
    }

    /// Lanes in use (a cut has this many positions).
    pub fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Whether lanes are a log's partitions.
    pub fn is_log(&self) -> bool {
        self.log.load(Ordering::Acquire)
    }

    /// The mark of a change made now on this thread: its lane's next
    /// position.
    #[inline]
    pub(super) fn next_mark(&self) -> u64 {
        let lane = LANE.with(Cell::get) as usize;
        let pos = match self.next.get(lane) {
            Some(n) => n.0.fetch_add(1, Ordering::Relaxed) + 1,
            None => 0,
        };
        mark(lane, pos)
    }

    /// The mark of a removal made now of a box last marked `last`: this
    /// thread's next position; on a node of a log (an expiry, which no
    /// record orders) the box's partition where it stands.
    pub(super) fn removal_mark(&self, last: u64) -> u64 {
        if self.is_log() {
            let lane = lane_of(last);
            return mark(lane, self.through(lane));
        }
        self.next_mark()
    }

    /// This thread's lane has told the watchers of every change it marked:
    /// publish its position.
    #[inline]
    pub fn publish(&self) {
        if self.is_log() {
            // A log's lanes are its partitions, published by the threads
            // that apply them ([`Lanes::publish_at`]), not a worker's.
            return;
        }
        let lane = LANE.with(Cell::get) as usize;
        if let (Some(n), Some(t)) = (self.next.get(lane), self.through.get(lane)) {
            t.0.store(n.0.load(Ordering::Relaxed), Ordering::Release);
        }
    }

    /// A log's lane `lane` has applied (and told the watchers of) every
    /// record up to position `pos`. Kept to the bits a mark holds, as the
    /// marks are: a write-ahead file's positions start past the versions a
    /// standalone node served (microseconds since the epoch, past 2^48).
    #[inline]
    pub fn publish_at(&self, lane: usize, pos: u64) {
        if let Some(t) = self.through.get(lane) {
            t.0.fetch_max(pos & POS_MASK, Ordering::Release);
        }
    }

    /// Where lane `lane` has published to.
    pub fn through(&self, lane: usize) -> u64 {
        self.through
            .get(lane)
            .map_or(0, |t| t.0.load(Ordering::Acquire))
    }

    /// The cut now: each lane's published position, into `out`.
    pub fn cut(&self, out: &mut Vec<u64>) {
        out.clear();
        out.extend((0..self.count()).map(|l| self.through(l)));
    }

    /// A node of a log starts partition `lane` at position `pos` (from a
    /// snapshot: what it holds is applied through there, and the removals
    /// before it left no tombstone): a client's cut below it is not honored.
    pub fn restored(&self, lane: usize, pos: u64) {
        self.forget(lane, pos);
        self.publish_at(lane, pos);
    }

    /// A tombstone of lane `lane` at `pos` is no longer kept.
    pub(super) fn forget(&self, lane: usize, pos: u64) {
        if let Some(h) = self.horizon.get(lane) {
            h.fetch_max(pos & POS_MASK, Ordering::AcqRel);
        }
    }

    /// Whether a client at `cut` of run `run` can be told exactly what moved
    /// since: the same table, the same lanes, no removal since forgotten.
    pub fn honors(&self, run: u64, cut: &[u64]) -> bool {
        // A node of a log may be behind the node that gave the cut: what it
        // has not applied yet is what it sends later. A writer's lane is
        // never past what it published.
        let log = self.is_log();
        run == self.run()
            && cut.len() == self.count()
            && cut.iter().enumerate().all(|(l, &c)| {
                c >= self.horizon.get(l).map_or(0, |h| h.load(Ordering::Acquire))
                    && (log || c <= self.through(l))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_positions_compare_with_marks_past_48_bits() {
        let lanes = Lanes::new(1);
        lanes.for_partitions(1, 1);
        let v = 1_764_000_000_000_000u64;
        lanes.publish_at(0, v);
        let mut cut = Vec::new();
        lanes.cut(&mut cut);
        assert!(!past(mark(0, v), &cut), "published: not past the cut");
        assert!(past(mark(0, v + 1), &cut));
    }

    #[test]
    fn marks_pack_a_lane_and_a_position() {
        let m = mark(7, 12345);
        assert_eq!((lane_of(m), pos_of(m)), (7, 12345));
        assert!(past(m, &[0; 7]), "a lane past the cut's end");
        assert!(past(m, &[0, 0, 0, 0, 0, 0, 0, 12344]));
        assert!(!past(m, &[0, 0, 0, 0, 0, 0, 0, 12345]));
    }

    #[test]
    fn a_thread_publishes_its_own_lane() {
        let lanes = Lanes::new(9);
        lanes.for_writers(2);
        std::thread::scope(|s| {
            s.spawn(|| {
                enter_lane(2);
                assert_eq!(lanes.next_mark(), mark(2, 1));
                assert_eq!(lanes.next_mark(), mark(2, 2));
                let mut cut = Vec::new();
                lanes.cut(&mut cut);
                assert_eq!(cut, [0, 0, 0], "not published yet");
                lanes.publish();
                lanes.cut(&mut cut);
                assert_eq!(cut, [0, 0, 2]);
            });
        });
        assert!(lanes.honors(9, &[0, 0, 2]));
        assert!(!lanes.honors(8, &[0, 0, 2]), "another run");
        assert!(!lanes.honors(9, &[0, 2]), "other lanes");
        assert!(!lanes.honors(9, &[0, 0, 3]), "past what was published");
        lanes.forget(2, 1);
        assert!(!lanes.honors(9, &[0, 0, 0]), "a removal was forgotten");
        assert!(lanes.honors(9, &[0, 0, 1]));
    }
}
