//! Long-poll wake-ups: which connections of this worker wait on which key
//! ([`ParkedIndex`]), and which workers wait on which key ([`Waiters`]).
//!
//! A worker that parks a long-poll registers the key here (once per key, while
//! it has polls parked on it). An ingest on any worker then tells exactly the
//! workers waiting on that key: the key goes down the worker's channel and its
//! `mio::Waker` fires, so the parked poll is answered within the waker's latency,
//! not at the next tick. With nothing parked anywhere, `notify` is one atomic load.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const SHARDS: usize = 64;

type Shard = Mutex<HashMap<Box<[u8]>, Vec<u16>>>;

pub struct Waiters {
    shards: Vec<Shard>,
    /// Keys with at least one waiting worker, over all shards.
    keys: AtomicUsize,
    senders: Vec<crossbeam_channel::Sender<Box<[u8]>>>,
    wakers: Vec<Arc<mio::Waker>>,
}

fn shard_of(key: &[u8]) -> usize {
    // FNV-1a: the shard only spreads lock contention; it needs no DoS resistance
    // because the map inside each shard is std's randomized HashMap.
    let mut h: u32 = 0x811c_9dc5;
    for &b in key {
        h = (h ^ b as u32).wrapping_mul(0x0100_0193);
    }
    h as usize % SHARDS
}

impl Waiters {
    pub fn new(
        senders: Vec<crossbeam_channel::Sender<Box<[u8]>>>,
        wakers: Vec<Arc<mio::Waker>>,
    ) -> Waiters {
        Waiters {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            keys: AtomicUsize::new(0),
            senders,
            wakers,
        }
    }

    /// Worker `worker` now has polls parked on `key`.
    pub fn register(&self, key: &[u8], worker: usize) {
        let Ok(mut m) = self.shards[shard_of(key)].lock() else {
            return;
        };
        let list = m.entry(key.into()).or_insert_with(|| {
            self.keys.fetch_add(1, Ordering::AcqRel);
            Vec::new()
        });
        if !list.contains(&(worker as u16)) {
            list.push(worker as u16);
        }
    }

    /// Worker `worker` has no more polls parked on `key`.
    pub fn unregister(&self, key: &[u8], worker: usize) {
        let Ok(mut m) = self.shards[shard_of(key)].lock() else {
            return;
        };
        if let Some(list) = m.get_mut(key) {
            list.retain(|&w| w != worker as u16);
            if list.is_empty() {
                m.remove(key);
                self.keys.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// `key` was updated: wake the workers waiting on it.
    #[inline]
    pub fn notify(&self, key: &[u8]) {
        if self.keys.load(Ordering::Acquire) == 0 {
            return;
        }
        self.notify_slow(key);
    }

    #[cold]
    fn notify_slow(&self, key: &[u8]) {
        let Ok(m) = self.shards[shard_of(key)].lock() else {
            return;
        };
        if let Some(list) = m.get(key) {
            for &w in list {
                let w = w as usize;
                if self.senders[w].send(key.into()).is_ok() {
                    let _ = self.wakers[w].wake();
                }
            }
        }
    }

    /// Keys with parked polls, over all workers (for tests and metrics).
    pub fn parked_keys(&self) -> usize {
        self.keys.load(Ordering::Acquire)
    }
}

/// The connections of one worker parked on each key, by (slot, generation).
#[derive(Default)]
pub struct ParkedIndex {
    by_key: HashMap<Box<[u8]>, Vec<(usize, u32)>>,
}

impl ParkedIndex {
    /// Connection (slot, gen) now waits on `key`; the first one on a key tells
    /// `waiters` that this worker waits on it.
    pub fn add(&mut self, key: &[u8], slot: usize, gen: u32, waiters: &Waiters, worker: usize) {
        if let Some(list) = self.by_key.get_mut(key) {
            list.push((slot, gen));
            return;
        }
        self.by_key.insert(key.into(), vec![(slot, gen)]);
        waiters.register(key, worker);
    }

    /// Connection (slot, gen) no longer waits on `key`. Returns whether it did.
    pub fn remove(
        &mut self,
        key: &[u8],
        slot: usize,
        gen: u32,
        waiters: &Waiters,
        worker: usize,
    ) -> bool {
        let Some(list) = self.by_key.get_mut(key) else {
            return false;
        };
        let found = list.iter().position(|&e| e == (slot, gen));
        if let Some(i) = found {
            list.swap_remove(i);
        }
        if list.is_empty() {
            self.by_key.remove(key);
            waiters.unregister(key, worker);
        }
        found.is_some()
    }

    /// Append the connections waiting on `key` to `out`.
    pub fn waiting(&self, key: &[u8], out: &mut Vec<(usize, u32)>) {
        if let Some(list) = self.by_key.get(key) {
            out.extend_from_slice(list);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_registers_a_key_once_while_connections_wait_on_it() {
        let waiters = Waiters::new(Vec::new(), Vec::new());
        let mut index = ParkedIndex::default();
        index.add(b"k", 1, 7, &waiters, 0);
        index.add(b"k", 2, 9, &waiters, 0);
        assert_eq!(waiters.parked_keys(), 1);
        let mut out = Vec::new();
        index.waiting(b"k", &mut out);
        assert_eq!(out, vec![(1, 7), (2, 9)]);
        assert!(!index.remove(b"k", 1, 8, &waiters, 0), "another generation");
        assert!(index.remove(b"k", 1, 7, &waiters, 0));
        assert_eq!(waiters.parked_keys(), 1);
        assert!(index.remove(b"k", 2, 9, &waiters, 0));
        assert_eq!(waiters.parked_keys(), 0);
    }
}
