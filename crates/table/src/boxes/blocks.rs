//! One set of the key order (`order.rs`) without its keys: the ids of its
//! boxes (4 bytes each) in sorted blocks, ordered by the keys the boxes'
//! records already hold, read through a [`KeySource`].
//!
//! A block holds at most [`BLOCK`] ids in one allocation of exactly that
//! many (1 KiB). Each block keeps a **separator**, a copy of a key: every
//! key of the block is at or above it, every key of the block before is
//! below it (the first block's is empty). A seek compares the separators
//! (bytes in memory, no record read) to choose a block, then bisects the
//! block, reading about log2([`BLOCK`]) keys. A full block hands an id to a
//! neighbor with room before it splits, and an insert past a full block's
//! end starts a new one, so blocks stay about 80 % full whether keys come
//! in order or at random (a B*-tree's rule); a block under a quarter full
//! is merged into a neighbor.
//!
//! What it is not: locked, nor able to read a key itself. The caller holds
//! the set's mutex, and every id in the set names a box that keeps that id
//! while the mutex is held (`order.rs` says how removals keep that).

use super::size_class;
use std::cmp::Ordering;

/// Ids a block holds at most: 1 KiB, a size class of its own.
pub const BLOCK: usize = 256;
/// A block with fewer ids than this is merged into a neighbor that has room.
const SPARSE: usize = BLOCK / 4;

/// Where the order reads a box's key from its id.
pub trait KeySource {
    /// Replace `out` by the key of box `id`; false (and `out` empty) if no
    /// box has that id.
    fn key_into(&self, id: u32, out: &mut Vec<u8>) -> bool;

    /// How box `id`'s key compares with `key`; `None` if no box has that id.
    /// (A source that can compare in place, as the table's does, skips the
    /// copy this one makes.)
    fn cmp_key(&self, id: u32, key: &[u8]) -> Option<Ordering> {
        let mut own = Vec::new();
        self.key_into(id, &mut own).then(|| own.as_slice().cmp(key))
    }
}

/// Whether `a` sorts at or below `b`: eight bytes a compare, inline (a
/// separator and a key are short; `memcmp` is a call).
#[inline]
fn at_or_below(a: &[u8], b: &[u8]) -> bool {
    let (mut x, mut y) = (a, b);
    while let (Some(p), Some(q)) = (x.first_chunk::<8>(), y.first_chunk::<8>()) {
        if p != q {
            return u64::from_be_bytes(*p) < u64::from_be_bytes(*q);
        }
        (x, y) = (&x[8..], &y[8..]);
    }
    for (p, q) in x.iter().zip(y) {
        if p != q {
            return p < q;
        }
    }
    a.len() <= b.len()
}

struct Block {
    /// At or below every key here, above every key of the block before.
    sep: Vec<u8>,
    /// Sorted by key; capacity [`BLOCK`], never reallocated.
    ids: Vec<u32>,
}

impl Block {
    fn new(sep: &[u8]) -> Block {
        Block {
            sep: sep.to_vec(),
            ids: Vec::with_capacity(BLOCK),
        }
    }

    fn bytes(&self) -> usize {
        size_class(BLOCK * 4) + size_class(self.sep.capacity())
    }
}

/// A position: block `.0`, id `.1` in it.
pub(super) type At = (usize, usize);

/// The sorted ids of one set.
#[derive(Default)]
pub(super) struct Blocks {
    blocks: Vec<Block>,
    /// Heap bytes of the blocks and their separators (not the directory).
    heap: usize,
}

impl Blocks {
    /// Heap bytes, at allocator size classes.
    pub(super) fn bytes(&self) -> usize {
        let dir = self.blocks.capacity() * std::mem::size_of::<Block>();
        self.heap + if dir > 0 { size_class(dir) } else { 0 }
    }

    /// Ids held.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.blocks.iter().map(|b| b.ids.len()).sum()
    }

    /// The id at `at`, if any.
    pub(super) fn get(&self, at: At) -> Option<u32> {
        self.blocks.get(at.0)?.ids.get(at.1).copied()
    }

    /// The position after `at`.
    pub(super) fn next(&self, (b, i): At) -> At {
        match self.blocks.get(b) {
            Some(blk) if i + 1 < blk.ids.len() => (b, i + 1),
            _ => (b + 1, 0),
        }
    }

    /// The block whose separator range holds `target`, and the first id in
    /// it whose key is at or above `target` (`strict`: above): possibly
    /// one past the block's last id. `None` without blocks.
    fn find(&self, keys: &(impl KeySource + ?Sized), target: &[u8], strict: bool) -> Option<At> {
        let b = self.block_of(target);
        let blk = self.blocks.get(b)?;
        let i = blk.ids.partition_point(|&id| {
            // An id without a box reads as the empty key: never, while the
            // set's mutex is held (see the module doc).
            match keys.cmp_key(id, target) {
                Some(Ordering::Greater) => false,
                Some(Ordering::Equal) => strict,
                _ => true,
            }
        });
        Some((b, i))
    }

    /// The first id whose key is at or above `target` (`strict`: above), or
    /// the end.
    pub(super) fn seek(&self, keys: &(impl KeySource + ?Sized), target: &[u8], strict: bool) -> At {
        match self.find(keys, target, strict) {
            Some((b, i)) if i >= self.blocks[b].ids.len() => (b + 1, 0),
            Some(at) => at,
            None => (0, 0),
        }
    }

    /// The first id.
    pub(super) fn first(&self) -> At {
        (0, 0)
    }

    /// Put `id`, whose key is `key`, in its place. A key already here takes
    /// the new id.
    pub(super) fn insert(
        &mut self,
        keys: &(impl KeySource + ?Sized),
        buf: &mut Vec<u8>,
        key: &[u8],
        id: u32,
    ) {
        let Some((b, i)) = self.find(keys, key, false) else {
            let mut blk = Block::new(&[]);
            blk.ids.push(id);
            self.heap += blk.bytes();
            self.blocks.push(blk);
            return;
        };
        if let Some(same) = self.blocks[b].ids.get_mut(i) {
            if keys.cmp_key(*same, key) == Some(Ordering::Equal) {
                *same = id;
                return;
            }
        }
        if self.blocks[b].ids.len() < BLOCK {
            self.blocks[b].ids.insert(i, id);
            return;
        }
        // Full: hand the last id to the next block, or the first to the one
        // before, when it has room; else split.
        let room = |b: usize| self.blocks.get(b).is_some_and(|n| n.ids.len() < BLOCK);
        if room(b + 1) {
            let last = if i == BLOCK {
                id
            } else {
                let last = self.blocks[b].ids.pop().unwrap_or(id);
                self.blocks[b].ids.insert(i, id);
                last
            };
            self.blocks[b + 1].ids.insert(0, last);
            self.set_sep(keys, buf, b + 1);
        } else if b > 0 && room(b - 1) {
            if i == 0 {
                self.blocks[b - 1].ids.push(id);
            } else {
                let first = self.blocks[b].ids.remove(0);
                self.blocks[b - 1].ids.push(first);
                self.blocks[b].ids.insert(i - 1, id);
            }
            self.set_sep(keys, buf, b);
        } else if i == BLOCK {
            // Past the end (keys in order): a new block, this one stays full.
            let mut blk = Block::new(key);
            blk.ids.push(id);
            self.heap += blk.bytes();
            self.blocks.insert(b + 1, blk);
        } else {
            let mut blk = Block::new(&[]);
            blk.ids.extend(self.blocks[b].ids.drain(BLOCK / 2..));
            self.heap += blk.bytes();
            self.blocks.insert(b + 1, blk);
            self.set_sep(keys, buf, b + 1);
            match i.checked_sub(BLOCK / 2) {
                None => self.blocks[b].ids.insert(i, id),
                Some(j) => self.blocks[b + 1].ids.insert(j, id),
            }
            if i == BLOCK / 2 {
                // The new id went first into the new block.
                self.set_sep(keys, buf, b + 1);
            }
        }
    }

    /// Block `b`'s separator becomes its first key.
    fn set_sep(&mut self, keys: &(impl KeySource + ?Sized), buf: &mut Vec<u8>, b: usize) {
        let Some(&first) = self.blocks.get(b).and_then(|blk| blk.ids.first()) else {
            return;
        };
        keys.key_into(first, buf);
        let blk = &mut self.blocks[b];
        let was = size_class(blk.sep.capacity());
        blk.sep.clear();
        blk.sep.extend_from_slice(buf);
        self.heap = self.heap + size_class(blk.sep.capacity()) - was;
    }

    /// The block whose separator range holds `key` (0 without blocks): by
    /// the separators alone.
    fn block_of(&self, key: &[u8]) -> usize {
        self.blocks
            .partition_point(|blk| at_or_below(&blk.sep, key))
            .saturating_sub(1)
    }

    /// The position of `id`, whose key is `key`, if it is here: its block
    /// by the separators, then a scan of the block's ids (no key read).
    pub(super) fn position(&self, key: &[u8], id: u32) -> Option<At> {
        let b = self.block_of(key);
        let ids = &self.blocks.get(b)?.ids;
        // Sixteen ids a step, compared without a branch each.
        let mut base = 0;
        for chunk in ids.chunks(16) {
            if chunk.iter().fold(false, |hit, &x| hit | (x == id)) {
                let i = chunk.iter().position(|&x| x == id)?;
                return Some((b, base + i));
            }
            base += chunk.len();
        }
        None
    }

    /// Take `id`, whose key is `key`, out; false if it was not here.
    pub(super) fn remove(&mut self, key: &[u8], id: u32) -> bool {
        let Some((b, i)) = self.position(key, id) else {
            return false;
        };
        self.blocks[b].ids.remove(i);
        let len = self.blocks[b].ids.len();
        if len == 0 {
            self.drop_block(b);
        } else if len < SPARSE {
            let fits = |o: usize| {
                self.blocks
                    .get(o)
                    .is_some_and(|n| n.ids.len() + len <= BLOCK)
            };
            if b > 0 && fits(b - 1) {
                let ids = std::mem::take(&mut self.blocks[b].ids);
                self.blocks[b - 1].ids.extend_from_slice(&ids);
                self.blocks[b].ids = ids;
                self.drop_block(b);
            } else if fits(b + 1) {
                let ids = std::mem::take(&mut self.blocks[b + 1].ids);
                self.blocks[b].ids.extend_from_slice(&ids);
                self.blocks[b + 1].ids = ids;
                self.drop_block(b + 1);
            }
        }
        true
    }

    fn drop_block(&mut self, b: usize) {
        let blk = self.blocks.remove(b);
        self.heap -= blk.bytes();
        if let Some(first) = self.blocks.first_mut() {
            if b == 0 {
                let was = size_class(first.sep.capacity());
                first.sep = Vec::new();
                self.heap -= was;
            }
        }
        if self.blocks.is_empty() {
            self.blocks = Vec::new();
        } else if self.blocks.capacity() > 4 * self.blocks.len() {
            self.blocks.shrink_to(2 * self.blocks.len());
        }
    }

    /// Box `from`, whose key is `key`, is box `to` now; false if `from` was
    /// not here.
    pub(super) fn rename(&mut self, key: &[u8], (from, to): (u32, u32)) -> bool {
        let Some((b, i)) = self.position(key, from) else {
            return false;
        };
        self.blocks[b].ids[i] = to;
        true
    }

    /// Check the order and the separators (tests).
    #[cfg(test)]
    pub(super) fn check(&self, keys: &(impl KeySource + ?Sized)) -> Vec<Vec<u8>> {
        let mut all: Vec<Vec<u8>> = Vec::new();
        let mut buf = Vec::new();
        for (b, blk) in self.blocks.iter().enumerate() {
            assert!(!blk.ids.is_empty() && blk.ids.len() <= BLOCK);
            assert_eq!(blk.ids.capacity(), BLOCK);
            if b == 0 {
                assert!(blk.sep.is_empty());
            } else {
                assert!(all
                    .last()
                    .is_some_and(|k| k.as_slice() < blk.sep.as_slice()));
            }
            for &id in &blk.ids {
                assert!(keys.key_into(id, &mut buf), "id {id} has a key");
                assert!(blk.sep.as_slice() <= buf.as_slice());
                if let Some(k) = all.last() {
                    assert!(k < &buf, "in order");
                }
                all.push(buf.clone());
            }
        }
        all
    }
}
