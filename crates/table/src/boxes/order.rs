//! The keys in order: what a page of a prefix (`GET /v1/boxes?prefix=P`) and a
//! prefix stream's first listing walk (docs/boxes.md#rooms).
//!
//! Every box is here once, kept sorted by key, so the boxes under a prefix
//! are one range. The boxes are spread over [`ORDER_SHARDS`] sets by their
//! key's first segment (up to and including the first separator), so every
//! non-empty prefix (which ends with a separator) lies in one set; the empty
//! prefix (every box) merges them. A set holds no key of a box, only its
//! 4-byte id (its table shard and slot: [`box_id`]) in sorted blocks
//! (`blocks.rs`), and reads a key from the box's record when it compares
//! (through a [`KeySource`]): about 5 bytes a box (docs/box-table.md#the-key-order).
//!
//! Each set is a mutex; a holder reads the keys of the set's boxes from
//! their slots (seqlock reads) and must find each id naming its box:
//! - the creation and the removal of a box take it (the table's shard mutex
//!   held), never an update or a poll;
//! - a removal locks the sets of the removed box and of the box that moves
//!   into its slot (in the order of their indices) before it claims either
//!   slot, and renames the moved box's id before it lets go. No one waits
//!   for a set while holding a slot claim, so no holder of a set waits on a
//!   claim that waits on it;
//! - a page takes it once for each set it reads, copies at most `limit + 1`
//!   keys out and lets go: the bounded step a creation can wait behind.
//!
//! A page walks by key, the cursor is the last key it gave: a box that lived
//! through a walk is in exactly one page (keys are unique and their order
//! does not change), and the cursor means the same on any node.
//!
//! A removed box leaves a **tombstone**: its key (a copy: the box is gone)
//! with the mark of its removal (`lanes.rs`), so a client coming back to a
//! room is told which boxes went while it was away. Each set keeps its last
//! [`TOMBSTONES`], in [`TOMBSTONE_BYTES`] at most (a box created again under
//! a tombstone takes its place); a tombstone let go raises its lane's
//! horizon, below which a client's cut is no longer honored.

use super::blocks::{At, Blocks};
pub use super::blocks::{KeySource, BLOCK};
use super::lanes::{lane_of, pos_of, Lanes};
use super::prefix::is_separator;
use super::size_class;
use std::cell::RefCell;
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Sets the keys are spread over by their first segment.
pub const ORDER_SHARDS: usize = 16;
/// Tombstones each set keeps at most (the oldest go first): 4,096 in all.
pub const TOMBSTONES: usize = 256;
/// Accounted bytes of tombstones each set keeps at most (the oldest go
/// first): 1 MiB in all, whatever the keys' lengths, accounted apart from
/// the boxes (docs/boxes.md#watermarks).
pub const TOMBSTONE_BYTES: usize = 64 * 1024;
/// What a tombstone's entry in its set's map costs besides its key (a
/// 16-byte pointer and an 8-byte mark in a leaf about two thirds full, and
/// the inner nodes' share).
const MAP_SHARE: usize = 44;
/// What its entry in the set's queue costs besides its key.
const QUEUE_SHARE: usize = 24;
/// Slot numbers a box id holds (the table shard above them): 2^24 a shard.
pub const SLOT_BITS: u32 = 24;

/// The id of the box in slot `n` of table shard `shard`; `None` past
/// [`SLOT_BITS`] (a table with rooms refuses such a box).
#[inline]
pub fn box_id(shard: usize, n: usize) -> Option<u32> {
    let n = u32::try_from(n).ok().filter(|&n| n < 1 << SLOT_BITS)?;
    let shard = u32::try_from(shard)
        .ok()
        .filter(|&s| s < 1 << (32 - SLOT_BITS))?;
    Some(shard << SLOT_BITS | n)
}

/// The table shard and slot of a box id.
#[inline]
pub fn split_id(id: u32) -> (usize, usize) {
    (
        (id >> SLOT_BITS) as usize,
        (id & ((1 << SLOT_BITS) - 1)) as usize,
    )
}

/// The set a key or a non-empty prefix is in: FNV-1a of its first segment
/// (not keyed: a cursor must mean the same on every node; keys aimed at one
/// set only make its mutex busier).
fn shard_of(key: &[u8]) -> usize {
    let end = key
        .iter()
        .position(|&b| is_separator(b))
        .map_or(key.len(), |i| i + 1);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in &key[..end] {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % ORDER_SHARDS as u64) as usize
}

thread_local! {
    /// A key read from a record, to compare (one a thread: a set's walk
    /// or change never nests another).
    static KEY: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Run `f` with this thread's key buffer (a fresh one should it be taken).
fn with_key<R>(f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    let mut f = Some(f);
    let done = KEY.try_with(|k| {
        let mut k = k.try_borrow_mut().ok()?;
        f.take().map(|f| f(&mut k))
    });
    match (done, f) {
        (Ok(Some(r)), _) => r,
        (_, Some(f)) => f(&mut Vec::new()),
        (_, None) => unreachable!("f ran, so it returned"),
    }
}

/// One set: its boxes' ids in order, and its tombstones (each key with its
/// mark, and the same in the order they were made: one copy of the key,
/// shared).
#[derive(Default)]
struct KeySet {
    live: Blocks,
    dead: BTreeMap<Arc<[u8]>, u64>,
    buried: VecDeque<(Arc<[u8]>, u64)>,
    /// Accounted bytes of the tombstones in `buried` ([`tombstone_bytes`]
    /// each), held under [`TOMBSTONE_BYTES`].
    queued: usize,
}

/// Accounted bytes of the shared copy of a tombstone's key (an `Arc`'s
/// two counters and the bytes).
fn key_bytes(key: &[u8]) -> usize {
    size_class(16 + key.len())
}

/// Accounted bytes of a tombstone of `key` (its key, its two entries).
fn tombstone_bytes(key: &[u8]) -> usize {
    key_bytes(key) + MAP_SHARE + QUEUE_SHARE
}

impl KeySet {
    /// Call `f(key, mark)` on each box (mark 0) and, when `marked`, each
    /// tombstone, in key order from `from`, while it says true.
    fn each(
        &self,
        keys: &(impl KeySource + ?Sized),
        buf: &mut Vec<u8>,
        from: Bound<&[u8]>,
        marked: bool,
        mut f: impl FnMut(&[u8], u64) -> bool,
    ) {
        let mut at: At = match from {
            Bound::Included(k) => self.live.seek(keys, k, false),
            Bound::Excluded(k) => self.live.seek(keys, k, true),
            Bound::Unbounded => self.live.first(),
        };
        let mut dead = self
            .dead
            .range::<[u8], _>((from, Bound::Unbounded))
            .filter(|_| marked)
            .peekable();
        // Whether `buf` holds the key of the box at `at`.
        let mut loaded = false;
        loop {
            if !loaded {
                while let Some(id) = self.live.get(at) {
                    if keys.key_into(id, buf) {
                        loaded = true;
                        break;
                    }
                    at = self.live.next(at);
                }
            }
            let tomb_first = match dead.peek() {
                Some((k, _)) => !loaded || k.as_ref() < buf.as_slice(),
                None if loaded => false,
                None => return,
            };
            if tomb_first {
                if let Some((k, &m)) = dead.next() {
                    if !f(k, m) {
                        return;
                    }
                }
            } else {
                if !f(buf, 0) {
                    return;
                }
                at = self.live.next(at);
                loaded = false;
            }
        }
    }
}

/// Every key, in order.
pub struct KeyOrder {
    sets: Box<[Mutex<KeySet>]>,
    /// Accounted heap bytes of the sets' blocks of ids.
    bytes: AtomicUsize,
    /// Accounted heap bytes of the tombstones (their keys, map and queue).
    buried_bytes: AtomicUsize,
}

impl Default for KeyOrder {
    fn default() -> KeyOrder {
        KeyOrder {
            sets: (0..ORDER_SHARDS)
                .map(|_| Mutex::new(KeySet::default()))
                .collect(),
            bytes: AtomicUsize::new(0),
            buried_bytes: AtomicUsize::new(0),
        }
    }
}

/// One or two sets of the order, locked (a removal's: [`KeyOrder::hold`]).
pub struct Held<'a> {
    order: &'a KeyOrder,
    sets: [Option<(usize, MutexGuard<'a, KeySet>)>; 2],
}

impl Held<'_> {
    fn set_of(&mut self, key: &[u8]) -> Option<&mut KeySet> {
        let i = shard_of(key);
        self.sets
            .iter_mut()
            .flatten()
            .find(|(j, _)| *j == i)
            .map(|(_, s)| &mut **s)
    }

    /// Run `f` on the set of `key` (held, else nothing), and account the
    /// change in its blocks' bytes.
    fn change<R>(&mut self, key: &[u8], f: impl FnOnce(&mut KeySet) -> R) -> Option<R> {
        let order = self.order;
        let set = self.set_of(key)?;
        let was = set.live.bytes();
        let r = f(set);
        let is = set.live.bytes();
        if is >= was {
            order.bytes.fetch_add(is - was, Ordering::Relaxed);
        } else {
            order.bytes.fetch_sub(was - is, Ordering::Relaxed);
        }
        Some(r)
    }

    /// Box `id` of `key` was created (in the place of its tombstone, if any).
    pub fn insert(&mut self, keys: &(impl KeySource + ?Sized), key: &[u8], id: u32) {
        let order = self.order;
        self.change(key, |set| {
            if !set.dead.is_empty() && set.dead.remove(key).is_some() {
                // Its place in the queue (and the key) stays, and goes with it.
                order.buried_bytes.fetch_sub(MAP_SHARE, Ordering::Relaxed);
            }
            with_key(|buf| set.live.insert(keys, buf, key, id));
        });
    }

    /// Box `id` of `key` was removed by a change marked `mark`: it leaves a
    /// tombstone; the set's oldest ones go past [`TOMBSTONES`] or
    /// [`TOMBSTONE_BYTES`], and their lanes' horizons rise in `lanes`. No
    /// record is read (the caller may hold the box's claim): the id is
    /// found in the block the separators give.
    pub fn bury(&mut self, (key, id): (&[u8], u32), mark: u64, lanes: &Lanes) {
        let order = self.order;
        self.change(key, |set| {
            if !set.live.remove(key, id) {
                return;
            }
            let mark = mark.max(1);
            let copy: Arc<[u8]> = key.into();
            set.dead.insert(Arc::clone(&copy), mark);
            set.buried.push_back((copy, mark));
            order
                .buried_bytes
                .fetch_add(tombstone_bytes(key), Ordering::Relaxed);
            set.queued += tombstone_bytes(key);
            while set.buried.len() > TOMBSTONES || set.queued > TOMBSTONE_BYTES {
                let Some((old, mark)) = set.buried.pop_front() else {
                    break;
                };
                set.queued -= tombstone_bytes(&old);
                lanes.forget(lane_of(mark), pos_of(mark));
                // Its queue entry and its key (the map's entry, if any, is
                // this same copy, or another tombstone's).
                let mut freed = key_bytes(&old) + QUEUE_SHARE;
                // Still that tombstone (not a box created again, nor buried
                // again).
                if let Entry::Occupied(e) = set.dead.entry(old) {
                    if *e.get() == mark {
                        e.remove();
                        freed += MAP_SHARE;
                    }
                }
                order.buried_bytes.fetch_sub(freed, Ordering::Relaxed);
            }
        });
    }

    /// Box `from` of `key` is box `to` now (it moved to another slot); false
    /// if the set did not hold it. No record is read.
    pub fn rename(&mut self, key: &[u8], (from, to): (u32, u32)) -> bool {
        self.change(key, |set| set.live.rename(key, (from, to)))
            .unwrap_or(false)
    }
}

impl KeyOrder {
    fn set(&self, i: usize) -> MutexGuard<'_, KeySet> {
        // A panic under the mutex leaves a set whose order still holds.
        self.sets[i % ORDER_SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The set of box `id`'s key; `None` if no box has that id.
    pub fn set_of_id(&self, keys: &(impl KeySource + ?Sized), id: u32) -> Option<usize> {
        with_key(|buf| keys.key_into(id, buf).then(|| shard_of(buf)))
    }

    /// Lock sets `a` and `b` (one, if the same), in the order of their
    /// indices.
    pub fn hold(&self, a: usize, b: Option<usize>) -> Held<'_> {
        let (a, b) = (a % ORDER_SHARDS, b.map(|b| b % ORDER_SHARDS));
        let (lo, hi) = match b {
            Some(b) if b < a => (b, Some(a)),
            Some(b) if b > a => (a, Some(b)),
            _ => (a, None),
        };
        let first = (lo, self.set(lo));
        Held {
            order: self,
            sets: [Some(first), hi.map(|h| (h, self.set(h)))],
        }
    }

    fn hold_key(&self, key: &[u8]) -> Held<'_> {
        self.hold(shard_of(key), None)
    }

    /// Box `id` of `key` was created (see [`Held::insert`]).
    pub fn insert(&self, keys: &(impl KeySource + ?Sized), key: &[u8], id: u32) {
        self.hold_key(key).insert(keys, key, id);
    }

    /// Box `id` of `key` was removed by a change marked `mark` (see
    /// [`Held::bury`]).
    pub fn bury(&self, (key, id): (&[u8], u32), mark: u64, lanes: &Lanes) {
        self.hold_key(key).bury((key, id), mark, lanes);
    }

    /// Box `from` of `key` is box `to` now (see [`Held::rename`]).
    pub fn rename(&self, key: &[u8], ids: (u32, u32)) -> bool {
        self.hold_key(key).rename(key, ids)
    }

    /// The mark of `key`'s tombstone, if the key order keeps one.
    pub fn mark_of(&self, key: &[u8]) -> Option<u64> {
        self.set(shard_of(key)).dead.get(key).copied()
    }

    /// Accounted heap bytes of the boxes' ids.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Accounted heap bytes of the tombstones.
    pub fn tombstone_bytes(&self) -> usize {
        self.buried_bytes.load(Ordering::Relaxed)
    }

    /// Append to `out` the keys of boxes under `prefix` after `after` (from
    /// the first without), at most `limit`, each as a little-endian `u16`
    /// length and its bytes (as `ManyKeys` of the service reads them).
    /// Returns the number appended and whether more keys follow.
    pub fn page(
        &self,
        keys: &(impl KeySource + ?Sized),
        (prefix, after): (&[u8], Option<&[u8]>),
        limit: usize,
        out: &mut Vec<u8>,
    ) -> (usize, bool) {
        with_key(|buf| self.walk(keys, buf, (prefix, after), (limit, false), out))
    }

    /// [`KeyOrder::page`] with tombstones too: each key is followed by its
    /// mark as a little-endian `u64` (0: a box; else a tombstone's mark), and
    /// both count against `limit`.
    pub fn page_marked(
        &self,
        keys: &(impl KeySource + ?Sized),
        (prefix, after): (&[u8], Option<&[u8]>),
        limit: usize,
        out: &mut Vec<u8>,
    ) -> (usize, bool) {
        with_key(|buf| self.walk(keys, buf, (prefix, after), (limit, true), out))
    }

    fn walk(
        &self,
        keys: &(impl KeySource + ?Sized),
        buf: &mut Vec<u8>,
        (prefix, after): (&[u8], Option<&[u8]>),
        (limit, marked): (usize, bool),
        out: &mut Vec<u8>,
    ) -> (usize, bool) {
        let from = match after {
            Some(a) if a >= prefix => Bound::Excluded(a),
            _ => Bound::Included(prefix),
        };
        if !prefix.is_empty() {
            let set = self.set(shard_of(prefix));
            let (mut n, mut more) = (0, false);
            set.each(keys, buf, from, marked, |key, m| {
                if !key.starts_with(prefix) {
                    return false;
                }
                if n == limit {
                    more = true;
                    return false;
                }
                push_key(key, marked.then_some(m), out);
                n += 1;
                true
            });
            return (n, more);
        }
        // Every key: the first `limit + 1` of each set, merged. Each set is
        // held for one copy of at most `limit + 1` keys.
        let mut found: Vec<(Box<[u8]>, u64)> = Vec::new();
        for i in 0..ORDER_SHARDS {
            let set = self.set(i);
            // Past the largest of the `limit + 1` smallest kept: no use.
            let bound = (found.len() > limit).then(|| found[found.len() - 1].0.clone());
            let mut taken = 0;
            set.each(keys, buf, from, marked, |key, m| {
                if taken > limit || bound.as_ref().is_some_and(|b| key > &b[..]) {
                    return false;
                }
                found.push((key.into(), m));
                taken += 1;
                true
            });
            drop(set);
            found.sort_unstable();
            found.truncate(limit + 1);
        }
        let more = found.len() > limit;
        let n = found.len().min(limit);
        for (key, m) in &found[..n] {
            push_key(key, marked.then_some(*m), out);
        }
        (n, more)
    }

    /// Whether any box lies under `prefix` (tests).
    #[doc(hidden)]
    pub fn any_under(&self, keys: &(impl KeySource + ?Sized), prefix: &[u8]) -> bool {
        self.page(keys, (prefix, None), 1, &mut Vec::new()).0 > 0
    }
}
fn push_key(key: &[u8], mark: Option<u64>, out: &mut Vec<u8>) {
    out.extend_from_slice(&(key.len().min(u16::MAX as usize) as u16).to_le_bytes());
    out.extend_from_slice(key);
    if let Some(m) = mark {
        out.extend_from_slice(&m.to_le_bytes());
    }
}

/// The entries of a [`KeyOrder::page_marked`]: each key and its mark (0: a
/// box).
pub struct MarkedKeys<'a>(pub &'a [u8]);

impl<'a> Iterator for MarkedKeys<'a> {
    type Item = (&'a [u8], u64);

    fn next(&mut self) -> Option<(&'a [u8], u64)> {
        let (len, rest) = self.0.split_first_chunk::<2>()?;
        let len = u16::from_le_bytes(*len) as usize;
        let (key, rest) = rest.split_at_checked(len)?;
        let (mark, rest) = rest.split_first_chunk::<8>()?;
        self.0 = rest;
        Some((key, u64::from_le_bytes(*mark)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::BTreeSet;

    /// Boxes by id: id `i` is the `i`th key given (empty: gone).
    #[derive(Default)]
    struct Ids(RefCell<Vec<Vec<u8>>>);

    impl KeySource for Ids {
        fn key_into(&self, id: u32, out: &mut Vec<u8>) -> bool {
            out.clear();
            match self.0.borrow().get(id as usize) {
                Some(k) if !k.is_empty() => {
                    out.extend_from_slice(k);
                    true
                }
                _ => false,
            }
        }
    }

    impl Ids {
        fn id(&self, key: &[u8]) -> u32 {
            let ids = self.0.borrow();
            ids.iter().position(|k| k == key).expect("a box") as u32
        }

        /// Create the box of `key` in `o`.
        fn insert(&self, o: &KeyOrder, key: &str) {
            let id = self.0.borrow().len() as u32;
            self.0.borrow_mut().push(key.as_bytes().to_vec());
            o.insert(self, key.as_bytes(), id);
        }

        /// Remove the box of `key` from `o`, marked `mark`.
        fn bury(&self, o: &KeyOrder, key: &str, mark: u64, lanes: &Lanes) {
            let Some(id) = self.0.borrow().iter().position(|k| k == key.as_bytes()) else {
                return;
            };
            o.bury((key.as_bytes(), id as u32), mark, lanes);
            self.0.borrow_mut()[id].clear();
        }
    }

    fn keys(buf: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        let mut rest = buf;
        while let Some((len, r)) = rest.split_first_chunk::<2>() {
            let len = u16::from_le_bytes(*len) as usize;
            out.push(String::from_utf8_lossy(&r[..len]).into_owned());
            rest = &r[len..];
        }
        out
    }

    fn walk(o: &KeyOrder, ids: &Ids, prefix: &str, limit: usize) -> Vec<String> {
        let mut all = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let mut buf = Vec::new();
            let (n, more) = o.page(ids, (prefix.as_bytes(), after.as_deref()), limit, &mut buf);
            let page = keys(&buf);
            assert_eq!(page.len(), n);
            assert!(n <= limit);
            after = page.last().map(|k| k.as_bytes().to_vec());
            all.extend(page);
            if !more {
                return all;
            }
        }
    }
    #[test]
    fn pages_walk_a_prefix_in_order_exactly_once() {
        let (o, ids) = (KeyOrder::default(), Ids::default());
        for i in 0..250 {
            ids.insert(&o, &format!("room-1/p{i:03}"));
            ids.insert(&o, &format!("room-2/p{i:03}"));
        }
        ids.insert(&o, "room-1");
        ids.insert(&o, "room-10/x");
        let got = walk(&o, &ids, "room-1/", 7);
        let want: Vec<String> = (0..250).map(|i| format!("room-1/p{i:03}")).collect();
        assert_eq!(got, want);
        let every = walk(&o, &ids, "", 33);
        assert_eq!(every.len(), 502);
        for limit in [1, 2, 3, 5, 10] {
            assert_eq!(walk(&o, &ids, "", limit), every, "pages of {limit}");
        }
        assert!(every.windows(2).all(|w| w[0] < w[1]), "in order, once");
        assert_eq!(walk(&o, &ids, "room-3/", 10), Vec::<String>::new());
        let lanes = Lanes::new(1);
        let x = ids.id(b"room-10/x");
        o.bury((b"room-10/x", x), 5, &lanes);
        o.bury((b"room-10/x", x), 6, &lanes); // not buried again
        ids.0.borrow_mut()[x as usize].clear();
        assert!(!o.any_under(&ids, b"room-10/"));
        let mut buf = Vec::new();
        o.page_marked(&ids, (b"room-10/", None), 10, &mut buf);
        let marked: Vec<(&[u8], u64)> = MarkedKeys(&buf).collect();
        assert_eq!(
            marked,
            [(&b"room-10/x"[..], 5)],
            "a tombstone with its mark"
        );
        assert_eq!(walk(&o, &ids, "", 1000).len(), 501);
    }

    #[test]
    fn a_walk_while_keys_come_and_go_gives_each_survivor_once() {
        let (o, ids) = (KeyOrder::default(), Ids::default());
        let lanes = Lanes::new(1);
        for i in 0..1000 {
            ids.insert(&o, &format!("r/{i:04}"));
        }
        let mut seen = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        let mut step = 0;
        loop {
            let mut buf = Vec::new();
            let (_, more) = o.page(&ids, (b"r/", after.as_deref()), 50, &mut buf);
            let page = keys(&buf);
            after = page.last().map(|k| k.as_bytes().to_vec());
            seen.extend(page);
            // Between pages: odd keys go, new keys come (before and after
            // the cursor).
            for i in step * 50..step * 50 + 50 {
                for j in [i, 999 - i] {
                    if j % 2 == 1 {
                        ids.bury(&o, &format!("r/{j:04}"), 1 + j as u64, &lanes);
                    }
                }
            }
            ids.insert(&o, &format!("r/{:04}x", step));
            ids.insert(&o, &format!("r/{:04}y", 999 - step));
            step += 1;
            if !more {
                break;
            }
        }
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "no key twice");
        for i in (0..1000).filter(|i| i % 2 == 0) {
            assert!(seen.contains(&format!("r/{i:04}")), "survivor {i} seen");
        }
    }

    #[test]
    fn the_accounting_follows_the_blocks_and_tombstones() {
        let (o, ids) = (KeyOrder::default(), Ids::default());
        ids.insert(&o, "a/b");
        let one = o.bytes();
        let block = size_class(BLOCK * 4);
        assert!(
            one > block && one <= block + 256,
            "a block and its directory"
        );
        let lanes = Lanes::new(1);
        ids.bury(&o, "a/b", 3, &lanes);
        assert_eq!(o.bytes(), 0, "the block's bytes are back");
        assert_eq!(o.tombstone_bytes(), tombstone_bytes(b"a/b"));
        assert_eq!(tombstone_bytes(b"a/b"), 32 + MAP_SHARE + QUEUE_SHARE);
        ids.insert(&o, "a/b");
        assert!(
            o.any_under(&ids, b"a/"),
            "created again under its tombstone"
        );
        assert_eq!(o.bytes(), one);
        assert_eq!(
            o.tombstone_bytes(),
            32 + QUEUE_SHARE,
            "its place in the queue"
        );
        assert_eq!(o.mark_of(b"a/b"), None);
    }

    #[test]
    fn the_oldest_tombstones_go_and_raise_their_lanes_horizon() {
        let (o, ids) = (KeyOrder::default(), Ids::default());
        let lanes = Lanes::new(1);
        lanes.for_writers(1);
        let key = |i: usize| format!("t/{i:05}");
        for i in 0..=TOMBSTONES {
            ids.insert(&o, &key(i));
            ids.bury(
                &o,
                &key(i),
                super::super::lanes::mark(1, 1 + i as u64),
                &lanes,
            );
        }
        let mut buf = Vec::new();
        let (n, _) = o.page_marked(&ids, (b"t/", None), 2 * TOMBSTONES, &mut buf);
        assert_eq!(n, TOMBSTONES, "the set keeps its last ones");
        lanes.publish_at(1, 1 + TOMBSTONES as u64);
        assert!(
            !lanes.honors(1, &[0, 0]),
            "the first one's removal is forgotten"
        );
        assert!(lanes.honors(1, &[0, 1]));
    }

    #[test]
    fn tombstones_of_long_keys_stay_within_their_bytes() {
        let (o, ids) = (KeyOrder::default(), Ids::default());
        let lanes = Lanes::new(1);
        let key = |i: usize| format!("t/{i:05}{}", "x".repeat(4000));
        for i in 0..100 {
            ids.insert(&o, &key(i));
            ids.bury(&o, &key(i), 1 + i as u64, &lanes);
        }
        assert!(o.tombstone_bytes() <= TOMBSTONE_BYTES);
        assert!(o.tombstone_bytes() > TOMBSTONE_BYTES / 2);
        assert_eq!(o.mark_of(key(99).as_bytes()), Some(100), "the newest kept");
        assert_eq!(o.mark_of(key(0).as_bytes()), None, "the oldest gone");
    }

    /// The live keys of `o` (every page of 1,000) against a model.
    fn check(o: &KeyOrder, ids: &Ids, model: &BTreeSet<Vec<u8>>) {
        let every: Vec<Vec<u8>> = walk(o, ids, "", 1000)
            .into_iter()
            .map(String::into_bytes)
            .collect();
        assert!(every.iter().eq(model.iter()), "the walk is the model");
        let mut blocks = 0;
        for i in 0..ORDER_SHARDS {
            let set = o.set(i);
            let keys = set.live.check(ids);
            blocks += set.live.len();
            assert!(keys.iter().all(|k| shard_of(k) == i));
        }
        assert_eq!(blocks, model.len());
    }

    #[test]
    fn blocks_follow_a_model_through_inserts_removals_and_moves() {
        let (o, ids) = (KeyOrder::default(), Ids::default());
        let lanes = Lanes::new(1);
        let mut model = BTreeSet::new();
        // A small linear congruential generator: the same run each time.
        let mut x: u64 = 12345;
        let mut rand = |n: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % n
        };
        for step in 0..20_000 {
            let k = rand(3000);
            // Few sets, long runs in order and at random.
            let key = if step < 3000 {
                format!("s{}/{step:05}", step % 3)
            } else {
                format!("s{}/{k:05}", k % 3)
            };
            match rand(10) {
                0..=5 => {
                    if model.insert(key.clone().into_bytes()) {
                        ids.insert(&o, &key);
                    }
                }
                6..=8 => {
                    if model.remove(key.as_bytes()) {
                        ids.bury(&o, &key, 1 + step, &lanes);
                    }
                }
                _ => {
                    // The box moves to a new id.
                    if model.contains(key.as_bytes()) {
                        let from = ids.id(key.as_bytes());
                        let to = ids.0.borrow().len() as u32;
                        assert!(o.rename(key.as_bytes(), (from, to)));
                        let mut v = ids.0.borrow_mut();
                        let k = std::mem::take(&mut v[from as usize]);
                        v.push(k);
                    }
                }
            }
            if step % 2000 == 0 {
                check(&o, &ids, &model);
            }
        }
        check(&o, &ids, &model);
        // Blocks about 80 % full at least, whatever the order of keys.
        let per_box = o.bytes() as f64 / model.len() as f64;
        assert!(per_box < 7.0, "{per_box} B a box");
        for key in model.iter() {
            let key = String::from_utf8(key.clone()).expect("utf-8");
            ids.bury(&o, &key, 1, &lanes);
        }
        assert_eq!(o.bytes(), 0, "every block freed");
    }

    #[test]
    fn keys_in_order_fill_whole_blocks() {
        let (o, ids) = (KeyOrder::default(), Ids::default());
        for i in 0..100_000 {
            ids.insert(&o, &format!("room/{i:06}"));
        }
        let per_box = o.bytes() as f64 / 100_000.0;
        // 4 bytes an id, and the separators' and directory's share.
        assert!(per_box < 4.5, "{per_box} B a box");
        assert_eq!(walk(&o, &ids, "room/", 999).len(), 100_000);
    }
}
