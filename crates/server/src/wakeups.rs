//! Wake-ups of long-polls and event streams: which connections of this
//! worker wait on which key ([`ParkedIndex`]), and which workers wait on which
//! key ([`Wakeups`]).
//!
//! A worker that parks a long-poll or opens an event stream registers the key
//! here (once per key, while it has connections waiting on it). A change of
//! the box (an ingest, a `DELETE` or an expiry on any worker, or a record of
//! the log applied by the consuming thread: each tells
//! [`pollbox_core::service::Watchers`]) then tells exactly the workers waiting
//! on that key: the key's
//! hash goes into the worker's bounded inbox and its `mio::Waker` fires, so the
//! parked poll is answered (the stream sent its event) within the waker's
//! latency, not at the next tick. With nothing parked anywhere, `notify`
//! is one atomic load; otherwise it allocates nothing.
//!
//! Keys travel as 64-bit hashes (keyed SipHash, so clients cannot aim keys at
//! one hash): two keys that share a hash only cost a spurious wake-up, because a
//! woken connection checks its own box's version. An inbox that is full sets its
//! overflow flag instead, and the worker then looks at every parked connection:
//! a burst of ingests can cost a wider look, never a lost wake-up or unbounded
//! memory.
//!
//! On a node of a log the same inboxes carry the fate of each record an ingest
//! produced ([`LogReport`], from the consuming thread or the producer's
//! delivery reports) to the worker whose connection waits for it. Those are
//! never dropped: one per record in flight, so they are bounded by what the
//! workers produced.

use pollbox_core::service::Report;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const SHARDS: usize = 64;
/// Wake-ups a worker's inbox holds before it overflows.
const INBOX: usize = 4096;
/// Buckets of the filter of watched prefixes (a count each, 256 KiB): a
/// prefix counts in two, so with 10,000 prefixes watched about 2 % of the
/// prefixes of updated keys pass it (a mutex and a miss) for nothing.
const FILTER: usize = 1 << 17;

type Shard = Mutex<HashMap<u64, Vec<u16>>>;

/// One worker's inbox.
struct Inbox {
    tx: crossbeam_channel::Sender<u64>,
    rx: crossbeam_channel::Receiver<u64>,
    overflow: AtomicBool,
    waker: Arc<mio::Waker>,
    reports: crossbeam_channel::Sender<LogReport>,
    reported: crossbeam_channel::Receiver<LogReport>,
    /// Keys that moved under a prefix this worker watches (the prefix's
    /// hash, the key); bounded as `tx`, with its own overflow flag.
    moved_tx: crossbeam_channel::Sender<(u64, Box<[u8]>)>,
    moved_rx: crossbeam_channel::Receiver<(u64, Box<[u8]>)>,
    moved_overflow: AtomicBool,
}

/// A key moved under a prefix a worker watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrefixWake {
    /// The key, under the prefix with this hash.
    Moved(u64, Box<[u8]>),
    /// Too many at once: every prefix stream lists its room again.
    All,
}

/// `count` records of log request `request`, record `index` the first of
/// them, met the same fate (only `Applied` and `NoBox` come counted:
/// `pollbox_core::service::Pending::report_many`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogReport {
    pub request: u64,
    pub index: u32,
    pub report: Report,
    pub count: u32,
}

/// What woke a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The box whose key has this hash was updated.
    Key(u64),
    /// Too many at once: look at every parked connection.
    All,
}

pub struct Wakeups {
    hasher: RandomState,
    shards: Vec<Shard>,
    /// Keys with at least one waiting worker, over all shards.
    keys: AtomicUsize,
    inboxes: Vec<Inbox>,
    /// Watched prefixes (docs/http.md#rooms), by hash: the workers watching.
    prefix_shards: Vec<Shard>,
    /// Prefixes with at least one watching worker.
    prefixes: AtomicUsize,
    /// How many watched prefixes' hashes fall in each bucket: an update
    /// looks up a prefix of its key under a mutex only if both its buckets
    /// count.
    filter: Box<[AtomicU16]>,
    /// The hash prefixes travel as: foldhash (a few instructions for a short
    /// prefix, hashed once per separator of every updated key while any
    /// prefix is watched), keyed per process.
    prefix_hasher: foldhash::quality::RandomState,
    /// The empty prefix's hash, computed once.
    empty_prefix: u64,
}

/// `worker` waits on `hash` (a key's or a prefix's) in `shard`; `first`
/// runs when it is the first worker to.
fn add_worker(shard: &Shard, hash: u64, worker: usize, first: impl FnOnce()) {
    let Ok(mut m) = shard.lock() else {
        return;
    };
    let list = m.entry(hash).or_insert_with(|| {
        first();
        Vec::new()
    });
    if !list.contains(&(worker as u16)) {
        list.push(worker as u16);
    }
}

/// Undo [`add_worker`]; `last` runs when no worker waits on `hash` any more.
fn remove_worker(shard: &Shard, hash: u64, worker: usize, last: impl FnOnce()) {
    let Ok(mut m) = shard.lock() else {
        return;
    };
    if let Some(list) = m.get_mut(&hash) {
        list.retain(|&w| w != worker as u16);
        if list.is_empty() {
            m.remove(&hash);
            last();
        }
    }
}

/// The filter's two buckets of a prefix's hash.
#[inline]
fn buckets(hash: u64) -> [usize; 2] {
    [hash as usize % FILTER, (hash >> 32) as usize % FILTER]
}

impl Wakeups {
    /// One inbox per worker, each woken with its waker.
    pub fn new(wakers: Vec<Arc<mio::Waker>>) -> Wakeups {
        let prefix_hasher = foldhash::quality::RandomState::default();
        Wakeups {
            hasher: RandomState::new(),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            keys: AtomicUsize::new(0),
            inboxes: wakers
                .into_iter()
                .map(|waker| {
                    let (tx, rx) = crossbeam_channel::bounded(INBOX);
                    let (reports, reported) = crossbeam_channel::unbounded();
                    let (moved_tx, moved_rx) = crossbeam_channel::bounded(INBOX);
                    Inbox {
                        tx,
                        rx,
                        overflow: AtomicBool::new(false),
                        waker,
                        reports,
                        reported,
                        moved_tx,
                        moved_rx,
                        moved_overflow: AtomicBool::new(false),
                    }
                })
                .collect(),
            prefix_shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            prefixes: AtomicUsize::new(0),
            filter: (0..FILTER).map(|_| AtomicU16::new(0)).collect(),
            empty_prefix: prefix_hasher.hash_one(b""),
            prefix_hasher,
        }
    }

    /// The hash a prefix travels as.
    #[inline]
    pub fn prefix_hash(&self, prefix: &[u8]) -> u64 {
        if prefix.is_empty() {
            return self.empty_prefix;
        }
        self.prefix_hasher.hash_one(prefix)
    }

    /// Worker `worker` now has event streams of the prefix with `hash`.
    pub fn register_prefix(&self, hash: u64, worker: usize) {
        let shard = &self.prefix_shards[(hash >> 32) as usize % SHARDS];
        add_worker(shard, hash, worker, || {
            for b in buckets(hash) {
                // Saturates rather than wraps: a saturated bucket only ever
                // passes (more prefixes than 65,535 in one bucket).
                let _ = self.filter[b]
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_add(1));
            }
            self.prefixes.fetch_add(1, Ordering::AcqRel);
        });
    }

    /// Worker `worker` has no more streams of the prefix with `hash`.
    pub fn unregister_prefix(&self, hash: u64, worker: usize) {
        let shard = &self.prefix_shards[(hash >> 32) as usize % SHARDS];
        remove_worker(shard, hash, worker, || {
            for b in buckets(hash) {
                let _ = self.filter[b].fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < u16::MAX).then(|| n.saturating_sub(1))
                });
            }
            self.prefixes.fetch_sub(1, Ordering::AcqRel);
        });
    }

    /// Tell the workers watching a prefix of `key` that it moved: a hash
    /// and a filter load per prefix of the key (the empty one and one per
    /// separator); a mutex and a message only for a watched one.
    fn notify_prefixes(&self, key: &[u8]) {
        self.notify_prefix(self.empty_prefix, key);
        pollbox_core::boxes::each_prefix_len(key, |n| {
            self.notify_prefix(self.prefix_hasher.hash_one(&key[..n]), key);
        });
    }

    /// `key` moved under the prefix with `hash`: tell its workers, if the
    /// filter says any may watch it.
    #[inline]
    fn notify_prefix(&self, hash: u64, key: &[u8]) {
        if buckets(hash)
            .iter()
            .any(|&b| self.filter[b].load(Ordering::Relaxed) == 0)
        {
            return;
        }
        self.notify_watched_prefix(hash, key);
    }

    #[cold]
    fn notify_watched_prefix(&self, hash: u64, key: &[u8]) {
        let Ok(m) = self.prefix_shards[(hash >> 32) as usize % SHARDS].lock() else {
            return;
        };
        let Some(list) = m.get(&hash) else {
            return;
        };
        for &w in list {
            let Some(inbox) = self.inboxes.get(w as usize) else {
                continue;
            };
            if inbox.moved_tx.try_send((hash, key.into())).is_err() {
                inbox.moved_overflow.store(true, Ordering::Release);
            }
            let _ = inbox.waker.wake();
        }
    }

    /// The next key that moved under a prefix `worker` watches, if any.
    pub fn next_moved(&self, worker: usize) -> Option<PrefixWake> {
        let inbox = self.inboxes.get(worker)?;
        if inbox.moved_overflow.swap(false, Ordering::AcqRel) {
            while inbox.moved_rx.try_recv().is_ok() {}
            return Some(PrefixWake::All);
        }
        let (hash, key) = inbox.moved_rx.try_recv().ok()?;
        Some(PrefixWake::Moved(hash, key))
    }

    /// Keys waiting in `worker`'s inbox of keys that moved under prefixes
    /// (what a cut taken now must wait for: one sent later is for a change
    /// published after it).
    pub fn moved_waiting(&self, worker: usize) -> usize {
        self.inboxes.get(worker).map_or(0, |i| {
            i.moved_rx.len() + usize::from(i.moved_overflow.load(Ordering::Acquire))
        })
    }

    /// Prefixes watched by event streams, over all workers.
    pub fn watched_prefixes(&self) -> usize {
        self.prefixes.load(Ordering::Acquire)
    }

    /// The hash a key travels as.
    #[inline]
    pub fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    fn shard(&self, hash: u64) -> &Shard {
        &self.shards[(hash >> 32) as usize % SHARDS]
    }

    /// Worker `worker` now has polls parked on the key with `hash`.
    pub fn register(&self, hash: u64, worker: usize) {
        add_worker(self.shard(hash), hash, worker, || {
            self.keys.fetch_add(1, Ordering::AcqRel);
        });
    }

    /// Worker `worker` has no more polls parked on the key with `hash`.
    pub fn unregister(&self, hash: u64, worker: usize) {
        remove_worker(self.shard(hash), hash, worker, || {
            self.keys.fetch_sub(1, Ordering::AcqRel);
        });
    }

    /// `key` was updated: wake the workers waiting on it.
    #[inline]
    pub fn notify(&self, key: &[u8]) {
        if self.keys.load(Ordering::Acquire) != 0 {
            self.notify_slow(self.hash(key));
        }
        if self.prefixes.load(Ordering::Acquire) != 0 {
            self.notify_prefixes(key);
        }
    }

    #[cold]
    fn notify_slow(&self, hash: u64) {
        let Ok(m) = self.shard(hash).lock() else {
            return;
        };
        let Some(list) = m.get(&hash) else {
            return;
        };
        for &w in list {
            let Some(inbox) = self.inboxes.get(w as usize) else {
                continue;
            };
            if inbox.tx.try_send(hash).is_err() {
                inbox.overflow.store(true, Ordering::Release);
            }
            let _ = inbox.waker.wake();
        }
    }

    /// The next wake-up for `worker`, if any.
    pub fn next(&self, worker: usize) -> Option<Wake> {
        let inbox = self.inboxes.get(worker)?;
        if inbox.overflow.swap(false, Ordering::AcqRel) {
            // Everything queued is covered by looking at everything.
            while inbox.rx.try_recv().is_ok() {}
            return Some(Wake::All);
        }
        inbox.rx.try_recv().ok().map(Wake::Key)
    }

    /// Tell `worker` what became of a record one of its connections waits for.
    pub fn report(&self, worker: usize, r: LogReport) {
        if let Some(inbox) = self.inboxes.get(worker) {
            let _ = inbox.reports.send(r);
            let _ = inbox.waker.wake();
        }
    }

    /// Hand `reports` to `worker`, emptying it, with one wake-up: the
    /// consuming thread reports what one pass over the client's queue
    /// applied with one wake-up a worker, not one a record (each is a write
    /// to an eventfd and a switch to the worker).
    pub fn report_all(&self, worker: usize, reports: &mut Vec<LogReport>) {
        if reports.is_empty() {
            return;
        }
        if let Some(inbox) = self.inboxes.get(worker) {
            for r in reports.drain(..) {
                let _ = inbox.reports.send(r);
            }
            let _ = inbox.waker.wake();
        }
        reports.clear();
    }

    /// The next record report for `worker`, if any.
    pub fn next_report(&self, worker: usize) -> Option<LogReport> {
        self.inboxes.get(worker)?.reported.try_recv().ok()
    }

    /// The workers (one inbox each).
    pub fn workers(&self) -> usize {
        self.inboxes.len()
    }

    /// Keys with parked polls, over all workers (for tests and metrics).
    pub fn parked_keys(&self) -> usize {
        self.keys.load(Ordering::Acquire)
    }
}

/// A box moved (an ingest on any worker, a record of the log on the
/// consuming thread): its waiters are woken.
impl pollbox_core::service::Watchers for &Wakeups {
    #[inline]
    fn box_updated(&mut self, key: &[u8]) {
        self.notify(key);
    }
}

/// Bytes of one entry of a [`ParkedIndex`] list.
const ENTRY: usize = std::mem::size_of::<(u32, u32)>();

/// The connections of one worker parked on each key (by key hash), as (slot,
/// generation).
#[derive(Default)]
pub(crate) struct ParkedIndex {
    /// Hashes of prefixes (event streams of a prefix), not of keys.
    prefixes: bool,
    /// (slot, generation) of each connection waiting on a key hash.
    by_key: HashMap<u64, Vec<(u32, u32)>>,
    /// The lists' heap bytes (their capacities), kept as they change.
    list_bytes: usize,
}

impl ParkedIndex {
    /// An index of connections by the prefix they stream.
    pub(crate) fn of_prefixes() -> ParkedIndex {
        ParkedIndex {
            prefixes: true,
            ..ParkedIndex::default()
        }
    }

    /// Connection (slot, gen) now waits on the key with `hash`; the first one on
    /// a key tells `waiters` that this worker waits on it.
    pub(crate) fn add(
        &mut self,
        hash: u64,
        slot: usize,
        gen: u32,
        wakeups: &Wakeups,
        worker: usize,
    ) {
        let entry = (slot as u32, gen);
        if let Some(list) = self.by_key.get_mut(&hash) {
            let before = list.capacity();
            list.push(entry);
            self.list_bytes += (list.capacity() - before) * ENTRY;
            return;
        }
        self.by_key.insert(hash, vec![entry]);
        self.list_bytes += ENTRY;
        if self.prefixes {
            wakeups.register_prefix(hash, worker);
        } else {
            wakeups.register(hash, worker);
        }
    }

    /// Heap bytes it holds: its map (at about a bucket and its control byte
    /// an entry) and the lists.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.by_key.capacity() * (std::mem::size_of::<(u64, Vec<(u32, u32)>)>() + 1)
            + self.list_bytes
    }

    /// Connection (slot, gen) no longer waits on the key with `hash`. Returns
    /// whether it did.
    pub(crate) fn remove(
        &mut self,
        hash: u64,
        slot: usize,
        gen: u32,
        wakeups: &Wakeups,
        worker: usize,
    ) -> bool {
        let Some(list) = self.by_key.get_mut(&hash) else {
            return false;
        };
        let found = list.iter().position(|&e| e == (slot as u32, gen));
        if let Some(i) = found {
            list.swap_remove(i);
        }
        if list.is_empty() {
            self.list_bytes -= list.capacity() * ENTRY;
            self.by_key.remove(&hash);
            if self.prefixes {
                wakeups.unregister_prefix(hash, worker);
            } else {
                wakeups.unregister(hash, worker);
            }
        }
        found.is_some()
    }

    /// Append the connections a wake-up concerns to `out`.
    pub(crate) fn woken(&self, wake: Wake, out: &mut Vec<(usize, u32)>) {
        match wake {
            Wake::Key(hash) => {
                if let Some(list) = self.by_key.get(&hash) {
                    out.extend(list.iter().map(|&(slot, gen)| (slot as usize, gen)));
                }
            }
            Wake::All => {
                for list in self.by_key.values() {
                    out.extend(list.iter().map(|&(slot, gen)| (slot as usize, gen)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wakeups(workers: usize) -> (Wakeups, Vec<mio::Poll>) {
        let polls: Vec<mio::Poll> = (0..workers).map(|_| mio::Poll::new().unwrap()).collect();
        let wakers = polls
            .iter()
            .map(|p| Arc::new(mio::Waker::new(p.registry(), mio::Token(1)).unwrap()))
            .collect();
        (Wakeups::new(wakers), polls)
    }

    #[test]
    fn a_worker_registers_a_key_once_while_connections_wait_on_it() {
        let (wakeups, _polls) = wakeups(1);
        let k = wakeups.hash(b"k");
        let mut index = ParkedIndex::default();
        index.add(k, 1, 7, &wakeups, 0);
        index.add(k, 2, 9, &wakeups, 0);
        assert_eq!(wakeups.parked_keys(), 1);
        let mut out = Vec::new();
        index.woken(Wake::Key(k), &mut out);
        assert_eq!(out, vec![(1, 7), (2, 9)]);
        assert!(!index.remove(k, 1, 8, &wakeups, 0), "another generation");
        assert!(index.remove(k, 1, 7, &wakeups, 0));
        assert_eq!(wakeups.parked_keys(), 1);
        assert!(index.remove(k, 2, 9, &wakeups, 0));
        assert_eq!(wakeups.parked_keys(), 0);
    }

    #[test]
    fn only_waiting_workers_are_told_and_a_full_inbox_overflows_to_all() {
        let (wakeups, _polls) = wakeups(2);
        let k = wakeups.hash(b"k");
        wakeups.notify(b"k");
        assert_eq!(wakeups.next(0), None, "nobody waits: nothing sent");
        wakeups.register(k, 1);
        wakeups.notify(b"k");
        assert_eq!(wakeups.next(0), None);
        assert_eq!(wakeups.next(1), Some(Wake::Key(k)));
        assert_eq!(wakeups.next(1), None);
        for _ in 0..INBOX + 10 {
            wakeups.notify(b"k");
        }
        assert_eq!(
            wakeups.next(1),
            Some(Wake::All),
            "bounded: the overflow says look at all"
        );
        assert_eq!(wakeups.next(1), None, "and the queue was emptied");
    }
}
