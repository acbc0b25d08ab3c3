//! The key order's view of the table: a box's key read from its id (the
//! order keeps ids, not keys: `order.rs`), and [`Order`], the order with
//! the table to read its keys from, as [`BoxTable::order`] gives it.

use super::order::{box_id, split_id, KeySource};
use super::slot::Read;
use super::*;
use crate::bytes::short_le;
use std::cmp::Ordering as KeyOrdering;

/// The table's boxes by id, for the key order: keys read with seqlock
/// reads of their slots, while `guard` is pinned.
pub(super) struct TableKeys<'a> {
    pub(super) table: &'a BoxTable,
    pub(super) guard: &'a Guard,
}

impl KeySource for TableKeys<'_> {
    fn key_into(&self, id: u32, out: &mut Vec<u8>) -> bool {
        out.clear();
        let Some(place) = self.place(id) else {
            return false;
        };
        self.read(place, |r, start, len| {
            out.clear();
            out.reserve(len + 8);
            for at in (0..len).step_by(8) {
                out.extend_from_slice(&eight_at(r, start + at).to_le_bytes());
            }
            out.truncate(len);
        })
        .is_some()
    }

    fn cmp_key(&self, id: u32, key: &[u8]) -> Option<KeyOrdering> {
        let place = self.place(id)?;
        self.read(place, |r, start, len| cmp_at(r, start, len, key))
    }
}

impl<'a> TableKeys<'a> {
    /// The slot of box `id`.
    fn place(&self, id: u32) -> Option<Place<'a>> {
        let (s, n) = split_id(id);
        let map = self.table.shards.get(s)?.map(self.guard)?;
        map.place(n, self.guard)
    }

    /// `f(read, key start, key length)` on a whole read of the record in
    /// `place` (again, should a writer store meanwhile); `None` for an empty
    /// slot.
    #[inline]
    fn read<R>(
        &self,
        place: Place<'_>,
        mut f: impl FnMut(&Read<'_>, usize, usize) -> R,
    ) -> Option<R> {
        loop {
            let r = place.slot.begin(self.guard);
            let (start, len) = record::key_span(r.word(1));
            let seen = (!r.is_empty() && start + len <= r.bytes()).then(|| f(&r, start, len));
            if r.valid() {
                return seen;
            }
        }
    }
}

/// The eight bytes of the record from byte `at`, as a little-endian `u64`,
/// racy (two word loads and shifts, no copy); zeros past its end.
#[inline]
fn eight_at(r: &Read<'_>, at: usize) -> u64 {
    let (i, shift) = (at / 8, (at % 8) as u32 * 8);
    let lo = r.word(i);
    if shift == 0 {
        lo
    } else {
        (lo >> shift) | (r.word(i + 1) << (64 - shift))
    }
}

/// How the `len` bytes of the record from `start` compare with `key`, racy:
/// eight bytes at a time (one word load each), byte-swapped so that
/// comparing the numbers compares the bytes in order.
#[inline]
fn cmp_at(r: &Read<'_>, start: usize, len: usize, key: &[u8]) -> KeyOrdering {
    let n = len.min(key.len());
    let shift = (start % 8) as u32 * 8;
    let mut i = start / 8;
    let mut lo = r.word(i);
    let mut rest = key.get(..n).unwrap_or_default();
    while !rest.is_empty() {
        let hi = r.word(i + 1);
        let mine = if shift == 0 {
            lo
        } else {
            (lo >> shift) | (hi << (64 - shift))
        };
        let (theirs, mine) = match rest.split_first_chunk::<8>() {
            Some((c, tail)) => {
                rest = tail;
                (u64::from_le_bytes(*c), mine)
            }
            None => {
                let mask = u64::MAX >> (64 - 8 * rest.len() as u32);
                let last = short_le(rest);
                rest = &[];
                (last, mine & mask)
            }
        };
        if mine != theirs {
            return mine.swap_bytes().cmp(&theirs.swap_bytes());
        }
        (i, lo) = (i + 1, hi);
    }
    len.cmp(&key.len())
}

impl BoxTable {
    /// The index of `shard` in the table.
    pub(super) fn shard_index(&self, shard: &Shard) -> usize {
        let at = shard as *const Shard as usize;
        (at - self.shards.as_ptr() as usize) / std::mem::size_of::<Shard>()
    }

    /// The id of slot `n` of `shard` (see [`box_id`]); `None` past the
    /// slots an id holds.
    pub(super) fn box_id(&self, shard: &Shard, n: usize) -> Option<u32> {
        box_id(self.shard_index(shard), n)
    }

    /// Whether a new box of `shard` would have an id (else a table with
    /// rooms refuses it: 2^24 boxes in one shard, some 4 billion in all).
    pub(super) fn has_id_room(&self, shard: &Shard) -> bool {
        !self.plan.rooms
            || self
                .box_id(shard, shard.write.len.load(Ordering::Relaxed))
                .is_some()
    }

    /// Box `n` of `shard`, whose key is `key`, was created: into the key
    /// order (the shard's mutex held).
    pub(super) fn order_insert(&self, shard: &Shard, n: usize, key: &[u8], guard: &Guard) {
        if let Some(id) = self.box_id(shard, n).filter(|_| self.plan.rooms) {
            let keys = TableKeys { table: self, guard };
            self.order.insert(&keys, key, id);
        }
    }

    /// Every key in order: pages of a prefix walk it (docs/boxes.md#rooms).
    pub fn order(&self) -> Order<'_> {
        Order { table: self }
    }
}

/// The key order of a table, read through the table.
#[derive(Clone, Copy)]
pub struct Order<'a> {
    table: &'a BoxTable,
}

impl Order<'_> {
    fn with_keys<R>(&self, f: impl FnOnce(&KeyOrder, &TableKeys<'_>) -> R) -> R {
        let guard = epoch::pin();
        let keys = TableKeys {
            table: self.table,
            guard: &guard,
        };
        f(&self.table.order, &keys)
    }

    /// Append to `out` the keys of boxes under `prefix` after `after` (see
    /// [`KeyOrder::page`]). Returns the number appended and whether more
    /// keys follow.
    pub fn page(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
        out: &mut Vec<u8>,
    ) -> (usize, bool) {
        self.with_keys(|o, keys| o.page(keys, (prefix, after), limit, out))
    }

    /// [`Order::page`] with tombstones too (see [`KeyOrder::page_marked`]).
    pub fn page_marked(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
        out: &mut Vec<u8>,
    ) -> (usize, bool) {
        self.with_keys(|o, keys| o.page_marked(keys, (prefix, after), limit, out))
    }

    /// The mark of `key`'s tombstone, if the key order keeps one.
    pub fn mark_of(&self, key: &[u8]) -> Option<u64> {
        self.table.order.mark_of(key)
    }

    /// Whether any box lies under `prefix` (tests).
    #[doc(hidden)]
    pub fn any_under(&self, prefix: &[u8]) -> bool {
        self.with_keys(|o, keys| o.any_under(keys, prefix))
    }

    /// Accounted heap bytes of the boxes' ids.
    pub fn bytes(&self) -> usize {
        self.table.order.bytes()
    }

    /// Accounted heap bytes of the tombstones.
    pub fn tombstone_bytes(&self) -> usize {
        self.table.order.tombstone_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{apply, i};
    use super::*;
    use crate::plan::Plan;
    use std::collections::BTreeSet;

    fn walk(t: &BoxTable, prefix: &str, limit: usize) -> Vec<Vec<u8>> {
        let (mut all, mut after) = (Vec::new(), None::<Vec<u8>>);
        loop {
            let mut buf = Vec::new();
            let (_, more) = t
                .order()
                .page(prefix.as_bytes(), after.as_deref(), limit, &mut buf);
            let mut rest = &buf[..];
            while let Some((len, r)) = rest.split_first_chunk::<2>() {
                let (key, r) = r.split_at(u16::from_le_bytes(*len) as usize);
                all.push(key.to_vec());
                after = Some(key.to_vec());
                rest = r;
            }
            if !more {
                return all;
            }
        }
    }

    fn table() -> BoxTable {
        let mut plan = Plan::default_plan();
        plan.rooms = true;
        BoxTable::new(Arc::new(plan))
    }

    #[test]
    fn the_order_follows_boxes_that_move_between_slots() {
        let t = table();
        let mut model = BTreeSet::new();
        for k in 0..3000 {
            let key = format!("room-{}/k{k}", k % 7);
            apply(&t, &key, &[i(k)]).expect("ok");
            model.insert(key.into_bytes());
        }
        // Every removal moves its shard's last box into its slot.
        for k in (0..3000).filter(|k| k % 3 != 0) {
            let key = format!("room-{}/k{k}", k % 7);
            assert!(t.remove(key.as_bytes()).is_some());
            model.remove(key.as_bytes());
            if k % 500 == 1 {
                assert!(walk(&t, "", 97).iter().eq(model.iter()));
            }
        }
        assert!(walk(&t, "", 1000).iter().eq(model.iter()));
        let room: Vec<_> = model.iter().filter(|k| k.starts_with(b"room-3/")).collect();
        assert!(walk(&t, "room-3/", 10).iter().eq(room));
        for key in &model {
            assert!(t.remove(key).is_some());
        }
        assert_eq!(t.order().bytes(), 0);
        assert!(!t.order().any_under(b""));
    }

    #[test]
    fn keys_compare_and_copy_in_place_as_bytes_do() {
        let t = table();
        let mut keys: Vec<String> = (1..40).map(|n| "k".repeat(n)).collect();
        keys.extend(
            [
                "a",
                "ab",
                "b",
                "a\"q",
                "a\\",
                "\u{7f}\u{80}x",
                "zz/é",
                "a\tb/c",
            ]
            .map(String::from),
        );
        keys.extend((0..20).map(|i| format!("room-{i}/lg-{}", i * 37)));
        for k in &keys {
            apply(&t, k, &[i(1)]).expect("ok");
        }
        let guard = epoch::pin();
        let source = TableKeys {
            table: &t,
            guard: &guard,
        };
        let mut ids = Vec::new();
        for (s, shard) in t.shards.iter().enumerate() {
            for n in 0..shard.write.len.load(Ordering::Relaxed) {
                ids.push(box_id(s, n).expect("an id"));
            }
        }
        assert_eq!(ids.len(), keys.len());
        let mut buf = Vec::new();
        for &id in &ids {
            assert!(source.key_into(id, &mut buf));
            assert!(keys.iter().any(|k| k.as_bytes() == buf.as_slice()));
            for other in &keys {
                let other = other.as_bytes();
                assert_eq!(source.cmp_key(id, other), Some(buf.as_slice().cmp(other)));
                for cut in 0..other.len() {
                    let other = &other[..cut];
                    assert_eq!(source.cmp_key(id, other), Some(buf.as_slice().cmp(other)));
                }
            }
        }
        let gone = box_id(0, 1 << 20).expect("an id");
        assert!(!source.key_into(gone, &mut buf) && buf.is_empty());
        assert_eq!(source.cmp_key(gone, b"a"), None);
    }

    /// Writers create and remove boxes (moving others between slots) in
    /// the walked room and others while a reader walks the room: every walk
    /// gives each lasting box exactly once, in order, and nothing waits
    /// forever.
    #[test]
    fn walks_under_churn_see_every_lasting_box_once() {
        let t = Arc::new(table());
        for k in 0..500 {
            apply(&t, &format!("r/last-{k:04}"), &[i(k)]).expect("ok");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..2)
            .map(|w| {
                let (t, stop) = (Arc::clone(&t), Arc::clone(&stop));
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) || n < 2000 {
                        let room = if n.is_multiple_of(2) { "r" } else { "q" };
                        let key = format!("{room}/churn-{w}-{:03}", n % 300);
                        if t.remove(key.as_bytes()).is_none() {
                            apply(&t, &key, &[i(1)]).expect("ok");
                        }
                        n += 1;
                    }
                })
            })
            .collect();
        for _ in 0..30 {
            let seen = walk(&t, "r/", 64);
            assert!(seen.windows(2).all(|w| w[0] < w[1]), "in order, once");
            let lasting = seen.iter().filter(|k| k.starts_with(b"r/last-")).count();
            assert_eq!(lasting, 500);
        }
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.join().expect("writer");
        }
    }
}
