//! The keys in order: what a page of a prefix (`GET /v1/boxes?prefix=P`) and a
//! prefix stream's first listing walk (docs/boxes.md#rooms).
//!
//! Every key is here once, kept sorted, so the keys under a prefix are one
//! range. The keys are spread over [`ORDER_SHARDS`] sets by their first
//! segment (up to and including the first separator), so every non-empty
//! prefix (which ends with a separator) lies in one set; the empty prefix
//! (every box) merges them. Each set is a mutex around a `BTreeMap`:
//! - only the creation and the removal of a box take it (the table's shard
//!   mutex held), never an update or a poll;
//! - a page takes it once for each set it reads, copies at most `limit + 1`
//!   keys out and lets go: the bounded step a creation can wait behind.
//!
//! A page walks by key, the cursor is the last key it gave: a box that lived
//! through a walk is in exactly one page (keys are unique and their order
//! does not change), and the cursor means the same on any node.
//!
//! A removed box leaves a **tombstone**: its key with the mark of its removal
//! (`lanes.rs`), so a client coming back to a room is told which boxes went
//! while it was away. Each set keeps its last [`TOMBSTONES`] (a box created
//! again under a tombstone takes its place); a tombstone let go raises its
//! lane's horizon, below which a client's cut is no longer honored.

use super::lanes::{lane_of, pos_of, Lanes};
use super::size_class;
use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

/// Sets the keys are spread over by their first segment.
pub const ORDER_SHARDS: usize = 16;
/// Tombstones each set keeps (the oldest go first): 4,096 in all, about
/// 400 KB at most, accounted apart from the boxes (docs/boxes.md#watermarks).
pub const TOMBSTONES: usize = 256;
/// What a key costs in a set's nodes besides its own allocation (a 16-byte
/// box pointer and an 8-byte mark in a leaf about two thirds full, and the
/// inner nodes' share), for the accounting (measured: `tests/alloc_boxes.rs`).
const NODE_SHARE: usize = 44;

/// The separators that end a prefix.
pub fn is_separator(b: u8) -> bool {
    matches!(b, b'/' | b':' | b'.')
}

/// Whether `p` is a prefix: empty, or ending with a separator.
pub fn is_prefix(p: &[u8]) -> bool {
    p.last().is_none_or(|&b| is_separator(b))
}

/// The prefixes of `key` (docs/boxes.md#rooms), shortest first: the empty
/// prefix, then the key up to and including each separator, the key itself
/// excluded.
pub fn prefixes_of(key: &[u8]) -> impl Iterator<Item = &[u8]> {
    std::iter::once(&key[..0]).chain(
        key.iter()
            .enumerate()
            .filter(|&(i, &b)| is_separator(b) && i + 1 < key.len())
            .map(move |(i, _)| &key[..=i]),
    )
}

/// Call `f` with the length of each non-empty prefix of `key` (up to and
/// including each separator but a last byte), shortest first: what
/// [`prefixes_of`] gives after the empty one, eight bytes a step (an update
/// looks for its key's prefixes while any prefix is watched).
#[inline]
pub fn each_prefix_len(key: &[u8], mut f: impl FnMut(usize)) {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const ONES: u64 = 0x0101_0101_0101_0101;
    // The high bit of each byte of `w` equal to `c`, exactly (no carries
    // between bytes).
    let eq = |w: u64, c: u8| {
        let x = w ^ (ONES * u64::from(c));
        !(((x & LOW7) + LOW7) | x | LOW7)
    };
    // The key's last byte ends no prefix (the key itself is not one).
    let len = key.len();
    let n = len.saturating_sub(1);
    let mut i = 0;
    while i < n {
        // Eight bytes from `i`; past the end, the key's last eight (bytes
        // before `i` masked off); a key under eight bytes, padded with
        // zeros (no separator).
        let (w, base) = if let Some(c) = key.get(i..).and_then(|r| r.first_chunk::<8>()) {
            (u64::from_le_bytes(*c), i)
        } else if let Some(c) = key.last_chunk::<8>() {
            (u64::from_le_bytes(*c), len - 8)
        } else {
            let mut b = [0u8; 8];
            if let Some(d) = b.get_mut(..len) {
                d.copy_from_slice(key);
            }
            (u64::from_le_bytes(b), 0)
        };
        let (lo, hi) = (i - base, (n - base).min(8));
        let keep = (u64::MAX << (lo * 8)) & u64::MAX.checked_shr(64 - hi as u32 * 8).unwrap_or(0);
        let mut m = (eq(w, b'/') | eq(w, b':') | eq(w, b'.')) & keep;
        while m != 0 {
            f(base + m.trailing_zeros() as usize / 8 + 1);
            m &= m - 1;
        }
        i = base + 8;
    }
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

/// One set of keys: each key with 0 (a box) or the mark of its removal (a
/// tombstone), and the tombstones in the order they were made.
#[derive(Default)]
struct KeySet {
    keys: BTreeMap<Box<[u8]>, u64>,
    buried: VecDeque<(Box<[u8]>, u64)>,
}

/// Every key, in order.
pub struct KeyOrder {
    sets: Box<[Mutex<KeySet>]>,
    /// Accounted heap bytes of the boxes' keys in the sets.
    bytes: AtomicUsize,
    /// Accounted heap bytes of the tombstones (their keys, nodes and queue).
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

fn entry_bytes(key: &[u8]) -> usize {
    size_class(key.len()) + NODE_SHARE
}

/// A tombstone's place in its set's queue: its key again and its mark.
fn buried_bytes(key: &[u8]) -> usize {
    size_class(key.len()) + 24
}

impl KeyOrder {
    fn set(&self, i: usize) -> std::sync::MutexGuard<'_, KeySet> {
        // A panic under the mutex leaves a set whose order still holds.
        self.sets[i % ORDER_SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A box of `key` was created (in the place of its tombstone, if any).
    pub fn insert(&self, key: &[u8]) {
        let mut set = self.set(shard_of(key));
        match set.keys.get_mut(key) {
            Some(m) if *m != 0 => {
                // Its tombstone's entry is a box's again (its place in the
                // queue stays, and goes with it).
                *m = 0;
                self.buried_bytes
                    .fetch_sub(entry_bytes(key), Ordering::Relaxed);
                self.bytes.fetch_add(entry_bytes(key), Ordering::Relaxed);
            }
            Some(_) => {}
            None => {
                set.keys.insert(key.into(), 0);
                self.bytes.fetch_add(entry_bytes(key), Ordering::Relaxed);
            }
        }
    }

    /// The box of `key` was removed by a change marked `mark`: it leaves a
    /// tombstone; the set's oldest one goes past [`TOMBSTONES`], and its
    /// lane's horizon rises in `lanes`.
    pub fn bury(&self, key: &[u8], mark: u64, lanes: &Lanes) {
        let mut set = self.set(shard_of(key));
        let KeySet { keys, buried } = &mut *set;
        let Some(m) = keys.get_mut(key).filter(|m| **m == 0) else {
            return;
        };
        *m = mark.max(1);
        buried.push_back((key.into(), *m));
        self.bytes.fetch_sub(entry_bytes(key), Ordering::Relaxed);
        self.buried_bytes
            .fetch_add(entry_bytes(key) + buried_bytes(key), Ordering::Relaxed);
        while buried.len() > TOMBSTONES {
            let Some((old, mark)) = buried.pop_front() else {
                break;
            };
            self.buried_bytes
                .fetch_sub(buried_bytes(&old), Ordering::Relaxed);
            lanes.forget(lane_of(mark), pos_of(mark));
            // Still that tombstone (not a box created again, nor buried again).
            if keys.get(&old[..]) == Some(&mark) {
                keys.remove(&old[..]);
                self.buried_bytes
                    .fetch_sub(entry_bytes(&old), Ordering::Relaxed);
            }
        }
    }

    /// The mark of `key`'s tombstone, if the key order keeps one.
    pub fn mark_of(&self, key: &[u8]) -> Option<u64> {
        self.set(shard_of(key))
            .keys
            .get(key)
            .copied()
            .filter(|&m| m != 0)
    }

    /// Accounted heap bytes of the boxes' keys.
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
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
        out: &mut Vec<u8>,
    ) -> (usize, bool) {
        self.walk(prefix, after, limit, false, out)
    }

    /// [`KeyOrder::page`] with tombstones too: each key is followed by its
    /// mark as a little-endian `u64` (0: a box; else a tombstone's mark), and
    /// both count against `limit`.
    pub fn page_marked(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
        out: &mut Vec<u8>,
    ) -> (usize, bool) {
        self.walk(prefix, after, limit, true, out)
    }

    fn walk(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
        marked: bool,
        out: &mut Vec<u8>,
    ) -> (usize, bool) {
        let from = match after {
            Some(a) if a >= prefix => Bound::Excluded(a),
            _ => Bound::Included(prefix),
        };
        let wanted = |m: &u64| marked || *m == 0;
        if !prefix.is_empty() {
            let set = self.set(shard_of(prefix));
            let mut n = 0;
            for (key, m) in set.keys.range::<[u8], _>((from, Bound::Unbounded)) {
                if !key.starts_with(prefix) {
                    return (n, false);
                }
                if !wanted(m) {
                    continue;
                }
                if n == limit {
                    return (n, true);
                }
                push_key(key, marked.then_some(*m), out);
                n += 1;
            }
            return (n, false);
        }
        // Every key: the first `limit + 1` of each set, merged. Each set is
        // held for one copy of at most `limit + 1` keys.
        let mut found: Vec<(Box<[u8]>, u64)> = Vec::new();
        for i in 0..ORDER_SHARDS {
            let set = self.set(i);
            let range = set.keys.range::<[u8], _>((from, Bound::Unbounded));
            // Past the largest of the `limit + 1` smallest kept: no use.
            let bound = (found.len() > limit).then(|| found[found.len() - 1].0.clone());
            for (key, m) in range.filter(|(_, m)| wanted(m)).take(limit + 1) {
                if bound.as_ref().is_some_and(|b| key > b) {
                    break;
                }
                found.push((key.clone(), *m));
            }
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

    /// Whether any key lies under `prefix` (tests).
    #[doc(hidden)]
    pub fn any_under(&self, prefix: &[u8]) -> bool {
        self.page(prefix, None, 1, &mut Vec::new()).0 > 0
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

    fn walk(o: &KeyOrder, prefix: &str, limit: usize) -> Vec<String> {
        let mut all = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let mut buf = Vec::new();
            let (n, more) = o.page(prefix.as_bytes(), after.as_deref(), limit, &mut buf);
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
    fn prefix_ends_are_found_eight_bytes_a_step_as_one_by_one() {
        let keys: [&[u8]; 8] = [
            b"",
            b"/",
            b"a/b",
            b"room-17/alice",
            b"tenant:4:orders.eu/x",
            b"//////////////////",
            b"abcdefghijklmnop/q",
            "caf\u{e9}/\u{7f}\u{80}./:x".as_bytes(),
        ];
        for key in keys {
            let mut fast = Vec::new();
            each_prefix_len(key, |n| fast.push(&key[..n]));
            let slow: Vec<&[u8]> = prefixes_of(key).skip(1).collect();
            assert_eq!(fast, slow, "{key:?}");
        }
        // Every byte value around a separator, at every offset.
        for pos in 0..20 {
            for b in 0..=255u8 {
                let mut key = vec![b'x'; 21];
                key[pos] = b;
                let mut fast = Vec::new();
                each_prefix_len(&key, |n| fast.push(n));
                let slow: Vec<usize> = prefixes_of(&key).skip(1).map(<[u8]>::len).collect();
                assert_eq!(fast, slow, "{pos} {b}");
            }
        }
    }

    #[test]
    fn prefixes_are_empty_or_end_with_a_separator() {
        assert!(is_prefix(b"") && is_prefix(b"room-17/") && is_prefix(b"tenant:4:"));
        assert!(is_prefix(b"eu.") && !is_prefix(b"room-17") && !is_prefix(b"a/b"));
        let p: Vec<&[u8]> = prefixes_of(b"room-17/a:b").collect();
        assert_eq!(p, [&b""[..], b"room-17/", b"room-17/a:"]);
        let p: Vec<&[u8]> = prefixes_of(b"a/").collect();
        assert_eq!(p, [&b""[..]], "the key itself is not its prefix");
    }

    #[test]
    fn pages_walk_a_prefix_in_order_exactly_once() {
        let o = KeyOrder::default();
        for i in 0..250 {
            o.insert(format!("room-1/p{i:03}").as_bytes());
            o.insert(format!("room-2/p{i:03}").as_bytes());
        }
        o.insert(b"room-1");
        o.insert(b"room-10/x");
        let got = walk(&o, "room-1/", 7);
        let want: Vec<String> = (0..250).map(|i| format!("room-1/p{i:03}")).collect();
        assert_eq!(got, want);
        let every = walk(&o, "", 33);
        assert_eq!(every.len(), 502);
        for limit in [1, 2, 3, 5, 10] {
            assert_eq!(walk(&o, "", limit), every, "pages of {limit}");
        }
        assert!(every.windows(2).all(|w| w[0] < w[1]), "in order, once");
        assert_eq!(walk(&o, "room-3/", 10), Vec::<String>::new());
        let lanes = Lanes::new(1);
        o.bury(b"room-10/x", 5, &lanes);
        o.bury(b"room-10/x", 6, &lanes); // a tombstone is not buried again
        assert!(!o.any_under(b"room-10/"));
        let mut buf = Vec::new();
        o.page_marked(b"room-10/", None, 10, &mut buf);
        let marked: Vec<(&[u8], u64)> = MarkedKeys(&buf).collect();
        assert_eq!(
            marked,
            [(&b"room-10/x"[..], 5)],
            "a tombstone with its mark"
        );
        assert_eq!(walk(&o, "", 1000).len(), 501);
    }

    #[test]
    fn a_walk_while_keys_come_and_go_gives_each_survivor_once() {
        let o = KeyOrder::default();
        let lanes = Lanes::new(1);
        for i in 0..1000 {
            o.insert(format!("r/{i:04}").as_bytes());
        }
        let mut seen = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        let mut step = 0;
        loop {
            let mut buf = Vec::new();
            let (_, more) = o.page(b"r/", after.as_deref(), 50, &mut buf);
            let page = keys(&buf);
            after = page.last().map(|k| k.as_bytes().to_vec());
            seen.extend(page);
            // Between pages: odd keys go, new keys come (before and after
            // the cursor).
            for i in step * 50..step * 50 + 50 {
                for j in [i, 999 - i] {
                    if j % 2 == 1 {
                        o.bury(format!("r/{j:04}").as_bytes(), 1 + j as u64, &lanes);
                    }
                }
            }
            o.insert(format!("r/{:04}x", step).as_bytes());
            o.insert(format!("r/{:04}y", 999 - step).as_bytes());
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
    fn the_accounting_follows_the_keys() {
        let o = KeyOrder::default();
        o.insert(b"a/b");
        o.insert(b"a/b");
        assert_eq!(o.bytes(), 8 + NODE_SHARE);
        let lanes = Lanes::new(1);
        o.bury(b"a/b", 3, &lanes);
        assert_eq!(o.bytes(), 0, "the box's bytes are back");
        assert_eq!(o.tombstone_bytes(), 8 + NODE_SHARE + 8 + 24);
        o.insert(b"a/b");
        assert!(o.any_under(b"a/"), "created again under its tombstone");
        assert_eq!(o.bytes(), 8 + NODE_SHARE);
        assert_eq!(o.tombstone_bytes(), 8 + 24, "its place in the queue");
    }

    #[test]
    fn the_oldest_tombstones_go_and_raise_their_lanes_horizon() {
        let o = KeyOrder::default();
        let lanes = Lanes::new(1);
        lanes.for_writers(1);
        let key = |i: usize| format!("t/{i:05}");
        for i in 0..=TOMBSTONES {
            o.insert(key(i).as_bytes());
            o.bury(
                key(i).as_bytes(),
                super::super::lanes::mark(1, 1 + i as u64),
                &lanes,
            );
        }
        let mut buf = Vec::new();
        let (n, _) = o.page_marked(b"t/", None, 2 * TOMBSTONES, &mut buf);
        assert_eq!(n, TOMBSTONES, "the set keeps its last ones");
        lanes.publish_at(1, 1 + TOMBSTONES as u64);
        assert!(
            !lanes.honors(1, &[0, 0]),
            "the first one's removal is forgotten"
        );
        assert!(lanes.honors(1, &[0, 1]));
    }
}
