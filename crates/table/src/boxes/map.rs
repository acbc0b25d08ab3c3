//! A shard's map: the index readers probe without locking (open addressing,
//! one `AtomicU64` per bucket: a key fingerprint and a slot number) and the
//! directory of chunks holding the slots and their expiry stamps. Chunks never
//! move while published; a map that must grow or shrink is replaced whole.

use super::*;

/// Slots and their expiry stamps. Never moves while published; retired (not
/// freed) when emptied.
pub(super) struct Chunk {
    pub(super) slots: [Slot; CHUNK],
    /// Slot `i`'s stamp: the second (of the caller's clock) from which the
    /// box is due, [`NEVER`] without a ttl. Stored only under the slot's
    /// claim.
    pub(super) expiry: [AtomicU32; CHUNK],
    /// Slot `i`'s snapshot generation: the one its record was last written
    /// in, stored under the slot's claim, so a delta's walk reads it between
    /// the slot's sequence loads without touching the record (`changes.rs`).
    pub(super) gens: [AtomicU16; CHUNK],
    /// Slot `i`'s mark: the lane and position of the last change of its box
    /// (`lanes.rs`), stored under the slot's claim.
    pub(super) marks: [AtomicU64; CHUNK],
}

impl Chunk {
    pub(super) fn new() -> Box<Chunk> {
        Box::new(Chunk {
            slots: std::array::from_fn(|_| Slot::default()),
            expiry: std::array::from_fn(|_| AtomicU32::new(NEVER)),
            gens: std::array::from_fn(|_| AtomicU16::new(0)),
            marks: std::array::from_fn(|_| AtomicU64::new(0)),
        })
    }
}

/// What readers of a shard find boxes through. Changed in place, entry by
/// entry, by the shard's writer; replaced whole (published new, the old one
/// retired) when the index or the directory must grow or shrink. Dropping a
/// map frees its two arrays, not the chunks (the shard owns those).
pub(super) struct Map {
    /// Open addressing, linear probing from bucket `fingerprint & mask`; an
    /// entry is `fingerprint << 32 | (slot number + 1)`, 0 an empty bucket.
    /// A power of two long, at most 3/4 full.
    pub(super) entries: Box<[AtomicU64]>,
    /// Chunk `c` holds slots `c * CHUNK..`; null past the chunks in use.
    pub(super) chunks: Box<[AtomicPtr<Chunk>]>,
}

/// A slot, its expiry stamp and its snapshot generation, borrowed for as
/// long as a guard is pinned.
#[derive(Clone, Copy)]
pub(super) struct Place<'g> {
    /// The slot number.
    pub(super) n: usize,
    pub(super) slot: &'g Slot,
    pub(super) stamp: &'g AtomicU32,
    pub(super) gen: &'g AtomicU16,
    pub(super) mark: &'g AtomicU64,
}

impl Map {
    pub(super) fn new(buckets: usize, chunks: usize) -> Map {
        Map {
            entries: (0..buckets).map(|_| AtomicU64::new(0)).collect(),
            chunks: (0..chunks)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
        }
    }

    /// Slot `n`, if its chunk is in this map.
    #[inline]
    pub(super) fn place<'g>(&'g self, n: usize, _guard: &'g Guard) -> Option<Place<'g>> {
        let chunk = self.chunks.get(n / CHUNK)?.load(Ordering::Acquire);
        if chunk.is_null() {
            return None;
        }
        // SAFETY: a chunk is published here (release) fully built, and freed
        // only after it was unlinked from the shard's current map (the only
        // one writers change) and retired to the epoch collector; a map that
        // still names it after that is a retired map, which only threads
        // pinned before its retirement (and so before the chunk's) can hold.
        // This thread is pinned (`_guard`, which outlives `'g`) and holds
        // this map, so the chunk stays allocated for `'g`. Only shared
        // references to atomics are made from it.
        let chunk = unsafe { &*chunk };
        let i = n % CHUNK;
        Some(Place {
            n,
            slot: chunk.slots.get(i)?,
            stamp: chunk.expiry.get(i)?,
            gen: chunk.gens.get(i)?,
            mark: chunk.marks.get(i)?,
        })
    }

    /// The chunk pointers in use, and so owned by the shard.
    pub(super) fn chunk_ptrs(&self) -> impl Iterator<Item = *mut Chunk> + '_ {
        self.chunks
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .filter(|c| !c.is_null())
    }

    /// Store `entry` in the first empty bucket of its probe sequence (the
    /// shard's writer; the map has room).
    pub(super) fn insert_entry(&self, entry: u64) {
        let mask = self.entries.len() - 1;
        let mut i = (entry >> 32) as usize & mask;
        for _ in 0..self.entries.len() {
            if let Some(e) = self.entries.get(i) {
                if e.load(Ordering::Relaxed) == 0 {
                    // Release: a reader that loads the entry sees the filled slot.
                    e.store(entry, Ordering::Release);
                    return;
                }
            }
            i = (i + 1) & mask;
        }
        debug_assert!(false, "index full");
    }

    /// The bucket holding `entry`.
    pub(super) fn bucket_of(&self, entry: u64) -> Option<usize> {
        let mask = self.entries.len().checked_sub(1)?;
        let mut i = (entry >> 32) as usize & mask;
        for _ in 0..self.entries.len() {
            match self.entries.get(i)?.load(Ordering::Relaxed) {
                0 => return None,
                e if e == entry => return Some(i),
                _ => i = (i + 1) & mask,
            }
        }
        None
    }

    /// Take `entry` out, shifting the entries after it back so no probe
    /// sequence has a gap (no tombstones). Readers probing meanwhile may miss
    /// an entry: the caller holds the shard's sequence odd.
    pub(super) fn remove_entry(&self, entry: u64) {
        let Some(mut hole) = self.bucket_of(entry) else {
            return;
        };
        let mask = self.entries.len() - 1;
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let Some(e) = self.entries.get(j).map(|e| e.load(Ordering::Relaxed)) else {
                break;
            };
            if e == 0 {
                break;
            }
            let home = (e >> 32) as usize & mask;
            // `e` may fill the hole if its home is not between the hole
            // (exclusive) and `j` (inclusive), cyclically.
            if j.wrapping_sub(home) & mask >= j.wrapping_sub(hole) & mask {
                if let Some(h) = self.entries.get(hole) {
                    h.store(e, Ordering::Release);
                }
                hole = j;
            }
        }
        if let Some(h) = self.entries.get(hole) {
            h.store(0, Ordering::Release);
        }
    }

    /// Point the entry of `from` at slot `to` instead.
    pub(super) fn rename_entry(&self, from: u64, to: u64) {
        if let Some(e) = self.bucket_of(from).and_then(|i| self.entries.get(i)) {
            e.store(to, Ordering::Release);
        }
    }

    /// A copy with `buckets` buckets and `chunks` directory entries (room for
    /// every entry and chunk in use), entries rehashed from their fingerprints.
    pub(super) fn resized(&self, buckets: usize, chunks: usize) -> Map {
        let map = Map::new(buckets, chunks);
        for e in self.entries.iter() {
            let e = e.load(Ordering::Relaxed);
            if e != 0 {
                map.insert_entry(e);
            }
        }
        for (to, from) in map.chunks.iter().zip(self.chunks.iter()) {
            to.store(from.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        map
    }

    /// Heap bytes of the map: itself and its two arrays.
    pub(super) fn bytes(&self) -> usize {
        size_class(std::mem::size_of::<Map>())
            + size_class(self.entries.len() * 8)
            + size_class(self.chunks.len() * std::mem::size_of::<AtomicPtr<Chunk>>())
    }
}

/// The index entry of the box in slot `n` whose key has fingerprint `fp`.
#[inline]
pub(super) fn entry(fp: u32, n: usize) -> u64 {
    u64::from(fp) << 32 | (n as u64 + 1)
}

/// The smallest index (a power of two) that holds `n` entries at most 3/4
/// full.
pub(super) fn buckets_for(n: usize) -> usize {
    (n * 4).div_ceil(3).next_power_of_two().max(MIN_BUCKETS)
}

/// The 32 bits of a key's hash kept in the index to tell boxes apart without
/// reading them (bits 8..40: not the shard bits); its low bits choose the
/// bucket, so an entry can be moved to a resized index without its key.
#[inline]
pub(super) fn fingerprint(hash: u64) -> u32 {
    (hash >> 8) as u32
}

/// Bytes of a chunk's allocation.
pub(super) fn chunk_bytes() -> usize {
    size_class(std::mem::size_of::<Chunk>())
}
