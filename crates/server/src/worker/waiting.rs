//! What a worker's connections wait on: the keys of parked long-polls and
//! event streams (the [`ParkedIndex`], and through it the node's
//! [`crate::wakeups::Wakeups`]), and the log requests whose records' reports
//! are routed to them. Filled and emptied only by applying the connections'
//! actions ([`pollbox_core::conn::Action`]: `Watch`, `Unwatch`, `Await`, `Unawait`): this is the
//! worker's side of those actions, and what it made for each (a
//! [`Registration`]) is what it undoes.
//!
//! What it is not: the wake-up path between workers (`crate::wakeups`).

use crate::stats::WorkerStats;
use crate::wakeups::{ParkedIndex, Wake, Wakeups};
use pollbox_core::conn::Watch;
use pollbox_core::service::ManyKeys;
use std::collections::HashMap;

/// Where a watching connection is registered (made when its
/// [`Action::Watch`](pollbox_core::conn::Action::Watch) was applied).
#[derive(Debug)]
pub(super) struct Registration {
    /// The key's hash; of many boxes, the hashes of its keys in their order
    /// (a wake-up of the `i`th concerns box `i`), and `hash` is unused.
    hash: u64,
    keys: Vec<u64>,
    /// An event stream (else a long-poll): which gauge counts it.
    stream: bool,
    /// `hash` is a prefix's (an event stream of a prefix).
    prefix: bool,
}

impl Registration {
    /// Which of the watched keys a wake-up concerns: `moved(i)` for the
    /// `i`th of a many-box watch's keys.
    pub(super) fn moved(&self, wake: Wake, i: usize) -> bool {
        if self.prefix {
            return false;
        }
        match wake {
            Wake::Key(h) => self.keys.get(i) == Some(&h),
            Wake::All => true,
        }
    }
}

/// A worker's connections by what they wait on.
pub(super) struct Waiting {
    worker: usize,
    parked: ParkedIndex,
    /// The connections streaming each prefix (by the prefix's hash).
    rooms: ParkedIndex,
    /// A node of a log: the connection (slot, generation) whose ingest waits
    /// for the records of each log request.
    awaiting: HashMap<u64, (usize, u32)>,
    /// Heap bytes of the registrations' hashes of many keys.
    keys_bytes: usize,
}

impl Waiting {
    pub(super) fn new(worker: usize) -> Waiting {
        Waiting {
            worker,
            parked: ParkedIndex::default(),
            rooms: ParkedIndex::of_prefixes(),
            awaiting: HashMap::new(),
            keys_bytes: 0,
        }
    }

    /// Wake connection (slot, gen) when a box of `w`'s keys moves.
    pub(super) fn watch(
        &mut self,
        w: Watch<'_>,
        (slot, gen): (usize, u32),
        wakeups: &Wakeups,
        stats: &WorkerStats,
    ) -> Registration {
        let mut r = Registration {
            hash: 0,
            keys: Vec::new(),
            stream: w.stream,
            prefix: w.prefix,
        };
        if w.prefix {
            r.hash = wakeups.prefix_hash(w.keys);
            self.rooms.add(r.hash, slot, gen, wakeups, self.worker);
            stats.prefix_streams.inc();
        } else if w.many {
            // A poll of many boxes: a wake-up of any of its keys concerns it.
            r.keys.reserve_exact(ManyKeys(w.keys).count());
            for key in ManyKeys(w.keys) {
                let h = wakeups.hash(key);
                self.parked.add(h, slot, gen, wakeups, self.worker);
                r.keys.push(h);
            }
            self.keys_bytes += r.keys.capacity() * std::mem::size_of::<u64>();
        } else {
            r.hash = wakeups.hash(w.keys);
            self.parked.add(r.hash, slot, gen, wakeups, self.worker);
        }
        if r.stream {
            stats.sse_subscribers.inc();
        } else {
            stats.parked_polls.inc();
        }
        r
    }

    /// Undo [`Waiting::watch`].
    pub(super) fn unwatch(
        &mut self,
        r: Registration,
        (slot, gen): (usize, u32),
        wakeups: &Wakeups,
        stats: &WorkerStats,
    ) {
        let mut removed = false;
        if r.prefix {
            removed = self.rooms.remove(r.hash, slot, gen, wakeups, self.worker);
            if removed {
                stats.prefix_streams.sub(1);
            }
        } else if r.keys.is_empty() {
            removed = self.parked.remove(r.hash, slot, gen, wakeups, self.worker);
        }
        for &h in &r.keys {
            removed |= self.parked.remove(h, slot, gen, wakeups, self.worker);
        }
        self.keys_bytes -= r.keys.capacity() * std::mem::size_of::<u64>();
        if removed {
            if r.stream {
                stats.sse_subscribers.sub(1);
            } else {
                stats.parked_polls.sub(1);
            }
        }
    }

    /// Route the reports of log request `request` to connection (slot, gen).
    pub(super) fn await_reports(&mut self, request: u64, conn: (usize, u32)) {
        self.awaiting.insert(request, conn);
    }

    /// Undo [`Waiting::await_reports`].
    pub(super) fn unawait(&mut self, request: u64) {
        self.awaiting.remove(&request);
    }

    /// The connection waiting for log request `request`'s reports, if one
    /// still does (it may have been answered at its deadline, or closed).
    pub(super) fn awaiting(&self, request: u64) -> Option<(usize, u32)> {
        self.awaiting.get(&request).copied()
    }

    /// Append the connections streaming the prefix with `hash` to `out`
    /// (every prefix stream for [`Wake::All`]).
    pub(super) fn rooms_woken(&self, wake: Wake, out: &mut Vec<(usize, u32)>) {
        self.rooms.woken(wake, out);
    }

    /// Append the connections a wake-up concerns to `out`.
    pub(super) fn woken(&self, wake: Wake, out: &mut Vec<(usize, u32)>) {
        self.parked.woken(wake, out);
    }

    /// Heap bytes of the index and the registrations' hashes.
    pub(super) fn heap_bytes(&self) -> usize {
        self.parked.heap_bytes() + self.rooms.heap_bytes() + self.keys_bytes
    }
}
