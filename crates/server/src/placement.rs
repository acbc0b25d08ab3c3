//! Where a new connection is served: by load, not by the listener's hash alone.
//!
//! Each worker accepts from its own `SO_REUSEPORT` listener, and the kernel
//! spreads new connections over them by a hash of the addresses: with a few
//! heavy connections (a handful of ingest clients) one worker can get three and
//! another none, one saturated beside one idle. So a worker that accepts a
//! connection asks [`Placement::place`] where it goes: to the worker with the
//! fewest connections among those whose recent busy share is within
//! [`BUSY_SLACK`] of the least busy (a saturated worker gets no new connection
//! while another idles); ties stay with the accepting worker. A connection
//! placed elsewhere travels through that worker's inbox, with its waker
//! (one wake-up, before the first request is read). Connections are placed
//! once, when accepted; they are not moved later (docs/operations.md#workers).

use crate::stats::WorkerStats;
use mio::net::TcpStream;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

/// Workers whose busy share (per mille) is within this of the least busy one's
/// count as equally loaded: among them, the fewest connections wins.
pub(crate) const BUSY_SLACK: u32 = 250;

/// Each worker's load, as the others see it, and its inbox of connections.
pub(crate) struct Placement {
    workers: Vec<Slot>,
}

struct Slot {
    /// Busy share over the last ~100 ms, per mille (written at the worker's tick).
    busy: AtomicU32,
    /// Connections handed to this worker, not yet taken from its inbox.
    pending: AtomicUsize,
    tx: crossbeam_channel::Sender<TcpStream>,
    rx: crossbeam_channel::Receiver<TcpStream>,
    waker: Arc<mio::Waker>,
}

impl Placement {
    /// One inbox per worker, each woken with its waker.
    pub(crate) fn new(wakers: &[Arc<mio::Waker>]) -> Placement {
        Placement {
            workers: wakers
                .iter()
                .map(|w| {
                    let (tx, rx) = crossbeam_channel::unbounded();
                    Slot {
                        busy: AtomicU32::new(0),
                        pending: AtomicUsize::new(0),
                        tx,
                        rx,
                        waker: w.clone(),
                    }
                })
                .collect(),
        }
    }

    /// The worker that serves a connection `me` just accepted: `me`, unless
    /// another is less loaded (see the module's text). `stats` gives each
    /// worker's open connections. A connection placed elsewhere counts for its
    /// worker from here on (two workers accepting at the same moment do not
    /// both see that worker empty); [`Placement::hand`] must follow.
    pub(crate) fn place(&self, me: usize, stats: &[WorkerStats]) -> usize {
        if self.workers.len() < 2 {
            return me;
        }
        let min_busy = self
            .workers
            .iter()
            .map(|w| w.busy.load(Ordering::Relaxed))
            .min()
            .unwrap_or(0);
        let load = |j: usize| -> Option<u64> {
            let w = &self.workers[j];
            (w.busy.load(Ordering::Relaxed) <= min_busy + BUSY_SLACK).then(|| {
                stats.get(j).map_or(0, |s| s.connections_open.get())
                    + w.pending.load(Ordering::Relaxed) as u64
            })
        };
        let (mut best, mut best_load) = (me, load(me).unwrap_or(u64::MAX));
        for j in (0..self.workers.len()).filter(|&j| j != me) {
            if let Some(l) = load(j) {
                if l < best_load {
                    (best, best_load) = (j, l);
                }
            }
        }
        if best != me {
            self.workers[best].pending.fetch_add(1, Ordering::Relaxed);
        }
        best
    }

    /// Hand `stream` to worker `to` (which [`Placement::place`] chose) and wake
    /// it. Gives the stream back if that worker has gone (shutting down).
    pub(crate) fn hand(&self, to: usize, stream: TcpStream) -> Result<(), TcpStream> {
        let Some(w) = self.workers.get(to) else {
            return Err(stream);
        };
        if let Err(e) = w.tx.send(stream) {
            w.pending.fetch_sub(1, Ordering::Relaxed);
            return Err(e.into_inner());
        }
        let _ = w.waker.wake();
        Ok(())
    }

    /// The next connection handed to `worker`, if any.
    pub(crate) fn next(&self, worker: usize) -> Option<TcpStream> {
        let w = self.workers.get(worker)?;
        let s = w.rx.try_recv().ok()?;
        w.pending.fetch_sub(1, Ordering::Relaxed);
        Some(s)
    }

    /// `worker`'s busy share now, per mille.
    pub(crate) fn set_busy(&self, worker: usize, per_mille: u32) {
        if let Some(w) = self.workers.get(worker) {
            w.busy.store(per_mille, Ordering::Relaxed);
        }
    }

    /// `worker`'s busy share, per mille, as last published.
    pub(crate) fn busy(&self, worker: usize) -> u32 {
        self.workers
            .get(worker)
            .map_or(0, |w| w.busy.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` workers' placement (one poll each: a poll takes one waker).
    fn placement(n: usize) -> (Placement, Vec<WorkerStats>, Vec<mio::Poll>) {
        let polls: Vec<_> = (0..n).map(|_| mio::Poll::new().expect("poll")).collect();
        let wakers: Vec<_> = polls
            .iter()
            .map(|p| Arc::new(mio::Waker::new(p.registry(), mio::Token(1)).expect("waker")))
            .collect();
        let stats = (0..n).map(|_| WorkerStats::default()).collect();
        (Placement::new(&wakers), stats, polls)
    }

    #[test]
    fn the_fewest_connections_win_and_ties_stay() {
        let (p, stats, _poll) = placement(3);
        assert_eq!(p.place(1, &stats), 1, "a tie stays with the acceptor");
        stats[1].connections_open.add(2);
        stats[0].connections_open.add(1);
        assert_eq!(p.place(1, &stats), 2);
        stats[2].connections_open.add(3);
        assert_eq!(p.place(1, &stats), 0);
    }

    #[test]
    fn a_saturated_worker_gets_nothing_while_another_idles() {
        let (p, stats, _poll) = placement(2);
        stats[1].connections_open.add(50);
        p.set_busy(0, 990);
        p.set_busy(1, 100);
        assert_eq!(p.place(0, &stats), 1, "fewer connections but saturated");
        p.set_busy(0, 300);
        assert_eq!(p.place(0, &stats), 0, "within the slack: by connections");
    }

    #[test]
    fn handed_connections_count_until_taken() {
        let (p, stats, _poll) = placement(2);
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let c = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let s = TcpStream::from_std(c);
        stats[0].connections_open.add(1);
        assert_eq!(p.place(0, &stats), 1);
        assert_eq!(p.place(0, &stats), 0, "the one placed counts at once");
        assert!(p.hand(1, s).is_ok());
        assert_eq!(p.place(0, &stats), 0, "the one in the inbox counts");
        assert!(p.next(0).is_none());
        assert!(p.next(1).is_some());
        assert_eq!(p.place(0, &stats), 1);
    }
}
