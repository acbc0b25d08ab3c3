//! The shards: what readers load (sequence and map) and what only writers
//! touch (the mutex, the length, the version floor, the bytes), each on a
//! cache line of its own; and the structural changes made under the mutex:
//! inserting a box, removing one (moving the last slot into the hole),
//! growing and shrinking the map, retiring what was replaced.

use super::keys::TableKeys;
use super::slot::Words;
use super::*;

/// What a poll reads: the sequence and the map, on a line of their own.
#[repr(align(64))]
pub(super) struct ReadSide {
    /// Odd while a removal changes the index (a lookup that finds nothing
    /// meanwhile looks again); moved on only by the shard's writer.
    pub(super) seq: AtomicU64,
    pub(super) map: Atomic<Map>,
}

/// What only writers touch, on a line of its own, so a creation's stores do
/// not take the readers' line away from them.
#[repr(align(64))]
pub(super) struct WriteSide {
    /// Held to change the shard's structure (create, remove, walk, restore).
    pub(super) mutex: Mutex<()>,
    /// Slots `0..len` are used (written under the mutex).
    pub(super) len: AtomicUsize,
    /// The highest version a box removed from this shard served: a new box
    /// starts past it (raised under the mutex).
    pub(super) floor: AtomicU64,
    /// Heap bytes of this shard: map, chunks, records.
    pub(super) bytes: AtomicUsize,
    /// Keys removed since the snapshot walk last took them (each a u16
    /// length and the key), kept only while the table tracks changes
    /// ([`BoxTable::track_changes`]); pushed with the mutex held.
    pub(super) removed: Mutex<Vec<u8>>,
}

pub(super) struct Shard {
    pub(super) read: ReadSide,
    pub(super) write: WriteSide,
}

/// The shard's sequence made odd for the time of a restructuring, even again
/// when dropped (the shard's writer only: plain stores).
pub(super) struct Restructuring<'a> {
    pub(super) seq: &'a AtomicU64,
    pub(super) was: u64,
}

impl Shard {
    pub(super) fn new() -> Shard {
        Shard {
            read: ReadSide {
                seq: AtomicU64::new(0),
                map: Atomic::null(),
            },
            write: WriteSide {
                mutex: Mutex::new(()),
                len: AtomicUsize::new(0),
                floor: AtomicU64::new(0),
                bytes: AtomicUsize::new(0),
                removed: Mutex::new(Vec::new()),
            },
        }
    }

    #[inline]
    pub(super) fn map<'g>(&self, guard: &'g Guard) -> Option<&'g Map> {
        let map = self.read.map.load(Ordering::Acquire, guard);
        // SAFETY: maps are published fully built (release, paired with the
        // acquire above) and freed only through `defer_destroy` after being
        // replaced, so one loaded while pinned stays allocated while `guard`
        // is.
        unsafe { map.as_ref() }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, ()> {
        // Poisoning is ignored: every structural change is finished (or not
        // begun) when a writer could panic, and records are written only
        // after every check passed.
        self.write
            .mutex
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// With the mutex held: readers that miss a key from now until the
    /// returned value is dropped look again.
    pub(super) fn restructure(&self) -> Restructuring<'_> {
        let seq = &self.read.seq;
        let was = seq.load(Ordering::Relaxed);
        seq.store(was + 1, Ordering::Relaxed);
        // Readers that see any store of the restructuring see the odd value
        // when they check the sequence again.
        fence(Ordering::Release);
        Restructuring { seq, was }
    }

    /// The keys removed since the last walk took them.
    pub(super) fn removed(&self) -> MutexGuard<'_, Vec<u8>> {
        self.write
            .removed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn add_bytes(&self, was: usize, is: usize) {
        if is >= was {
            self.write.bytes.fetch_add(is - was, Ordering::Relaxed);
        } else {
            self.write.bytes.fetch_sub(was - is, Ordering::Relaxed);
        }
    }
}

impl Drop for Restructuring<'_> {
    fn drop(&mut self) {
        self.seq.store(self.was + 2, Ordering::Release);
    }
}

impl Drop for Shard {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no thread can hold the shard any more, so its
        // map and chunks are ours to free now (what was retired before is the
        // collector's, and is not named by the current map).
        unsafe {
            let guard = epoch::unprotected();
            let map = self.read.map.swap(Shared::null(), Ordering::Relaxed, guard);
            if let Some(m) = map.as_ref() {
                for c in m.chunk_ptrs() {
                    drop(Box::from_raw(c));
                }
            }
            if !map.is_null() {
                drop(map.into_owned());
            }
        }
    }
}

impl BoxTable {
    /// Put a counted, new box in the shard's next slot and index it (the
    /// shard's mutex held): the slot is filled first, then the entry stored,
    /// so a reader that finds the entry finds the box. Returns its slot.
    pub(super) fn insert(
        &self,
        shard: &Shard,
        hash: u64,
        words: Words,
        (gen, mark): (u16, u64),
        expires: u32,
        guard: &Guard,
    ) -> Option<usize> {
        // Shards hold far fewer than 2^32 boxes: max_boxes is a usize, but the
        // index spreads boxes over 256 shards and 2^32 records would not fit
        // in memory anyway.
        let n = shard.write.len.load(Ordering::Relaxed);
        let mut added = words.bytes();
        let map = self.map_with_room(shard, n + 1, guard);
        let dir = map.chunks.get(n / CHUNK)?;
        if dir.load(Ordering::Relaxed).is_null() {
            // Release: a reader that loads the pointer sees the chunk built.
            dir.store(Box::into_raw(Chunk::new()), Ordering::Release);
            added += chunk_bytes();
        }
        let place = map.place(n, guard)?;
        {
            let mut claim = place.slot.claim_now(guard);
            debug_assert!(claim.is_empty());
            // Under the claim, as every store of a slot's generation.
            place.gen.store(gen, Ordering::Relaxed);
            place.mark.store(mark, Ordering::Relaxed);
            claim.replace(words, guard);
            place.stamp.store(expires, Ordering::Relaxed);
        }
        map.insert_entry(entry(fingerprint(hash), n));
        shard.write.len.store(n + 1, Ordering::Release);
        shard.write.bytes.fetch_add(added, Ordering::Relaxed);
        Some(n)
    }

    /// The shard's map, replaced by a bigger one first if it has no room for
    /// `len` boxes (index at most 3/4 full, a chunk for each); doubling, so
    /// inserts copy each entry a constant number of times on average.
    pub(super) fn map_with_room<'g>(&self, shard: &Shard, len: usize, guard: &'g Guard) -> &'g Map {
        let chunks = len.div_ceil(CHUNK);
        let (buckets, dir) = match shard.map(guard) {
            Some(m) if len * 4 <= m.entries.len() * 3 && chunks <= m.chunks.len() => return m,
            Some(m) => {
                let b = m.entries.len();
                let d = m.chunks.len();
                (
                    if len * 4 <= b * 3 {
                        b
                    } else {
                        buckets_for(len).max(2 * b)
                    },
                    if chunks <= d { d } else { chunks.max(2 * d) },
                )
            }
            None => (buckets_for(len), chunks),
        };
        self.republish(shard, Some((buckets, dir)), guard)
            .unwrap_or_else(|| unreachable!("a map was published"))
    }

    /// Publish a copy of the shard's map with `size` (buckets, directory
    /// entries), or no map at all, and retire the old one (the shard's mutex
    /// held). Returns the new map.
    pub(super) fn republish<'g>(
        &self,
        shard: &Shard,
        size: Option<(usize, usize)>,
        guard: &'g Guard,
    ) -> Option<&'g Map> {
        let old = shard.read.map.load(Ordering::Relaxed, guard);
        // SAFETY: only the holder of the shard's mutex (us) retires maps.
        let was = unsafe { old.as_ref() };
        let new = match size {
            None => Shared::null(),
            Some((buckets, dir)) => Owned::new(match was {
                Some(m) => m.resized(buckets, dir),
                None => Map::new(buckets, dir),
            })
            .into_shared(guard),
        };
        // Release: a reader that loads the new map sees it built.
        shard.read.map.store(new, Ordering::Release);
        // SAFETY: as above; the new map is published and so owned by the
        // shard until it is retired in turn.
        let is = unsafe { new.as_ref() };
        shard.add_bytes(was.map_or(0, Map::bytes), is.map_or(0, Map::bytes));
        if !old.is_null() {
            // SAFETY: the old map is unlinked (no longer in the shard), and
            // retired once: freed once every thread pinned now has unpinned.
            // Its drop frees its arrays only, not the chunks they name.
            unsafe { guard.defer_destroy(old) };
            slot::retired(1);
        }
        is
    }

    /// Take the box in slot `n` out (the shard's mutex held) and return a copy
    /// of its record; with `due`, only if its stamp (read again under the
    /// slot's claim) is due at that second. Its key is buried in the key
    /// order with `mark` (by default, a mark of this thread's lane). The shard's last box moves into
    /// the hole so slots `0..len` stay used; an emptied chunk is retired, a
    /// mostly empty map shrinks, the floor rises to the box's version.
    pub(super) fn remove_slot(
        &self,
        shard: &Shard,
        n: usize,
        due: Option<u32>,
        mark: Option<u64>,
        guard: &Guard,
    ) -> Option<Vec<u8>> {
        let last = shard.write.len.load(Ordering::Relaxed).checked_sub(1)?;
        if n > last {
            return None;
        }
        let map = shard.map(guard)?;
        let hole = map.place(n, guard)?;
        let from = map.place(last, guard)?;
        // The key order's sets of this box and of the one that moves into
        // its slot, held before either slot is claimed (`order.rs`).
        let keys = TableKeys { table: self, guard };
        let mut held = None;
        if self.plan.rooms {
            let (Some(gone), Some(moved)) = (self.box_id(shard, n), self.box_id(shard, last))
            else {
                return None;
            };
            let set = self.order.set_of_id(&keys, gone)?;
            let other = (n != last)
                .then(|| self.order.set_of_id(&keys, moved))
                .flatten();
            held = Some((self.order.hold(set, other), gone, moved));
        }
        let mut claim = hole.slot.claim_now(guard);
        if claim.is_empty() || due.is_some_and(|now| hole.stamp.load(Ordering::Relaxed) > now) {
            return None;
        }
        let mut record = Vec::new();
        claim.load(&mut record);
        if self.tracking.load(Ordering::Relaxed) {
            let key = record::key(&record);
            let mut removed = shard.removed();
            let was = removed.capacity();
            removed.extend_from_slice(&(key.len() as u16).to_le_bytes());
            removed.extend_from_slice(key);
            // Accounted as the records are: until a walk takes the list.
            shard.add_bytes(size_class(was), size_class(removed.capacity()));
        }
        let buried =
            mark.unwrap_or_else(|| self.lanes.removal_mark(hole.mark.load(Ordering::Relaxed)));
        if let Some((held, gone, _)) = held.as_mut() {
            held.bury((record::key(&record), *gone), buried, &self.lanes);
        }
        let gone = entry(fingerprint(self.hasher.hash_one(record::key(&record))), n);
        let mut freed = claim.bytes();
        {
            let _restructuring = shard.restructure();
            map.remove_entry(gone);
            claim.clear(guard);
            if n != last {
                let mut moved = from.slot.claim_now(guard);
                let fp = with_scratch(|s| {
                    moved.load(&mut s.image);
                    let key = record::key(&s.image);
                    if let Some((held, gone, from)) = held.as_mut() {
                        // Under the set's mutex, held since before the
                        // claims: no one reads the box between its two
                        // slots.
                        held.rename(key, (*from, *gone));
                    }
                    fingerprint(self.hasher.hash_one(key))
                });
                claim.move_from(&mut moved);
                hole.stamp
                    .store(from.stamp.load(Ordering::Relaxed), Ordering::Relaxed);
                hole.gen
                    .store(from.gen.load(Ordering::Relaxed), Ordering::Relaxed);
                hole.mark
                    .store(from.mark.load(Ordering::Relaxed), Ordering::Relaxed);
                map.rename_entry(entry(fp, last), entry(fp, n));
            }
            drop(claim);
            shard.write.len.store(last, Ordering::Release);
            if last.is_multiple_of(CHUNK) {
                // Slot `last` was the only one used in its chunk.
                if let Some(dir) = map.chunks.get(last / CHUNK) {
                    let chunk = dir.load(Ordering::Relaxed);
                    dir.store(std::ptr::null_mut(), Ordering::Release);
                    if !chunk.is_null() {
                        freed += chunk_bytes();
                        let chunk = RetiredChunk(chunk);
                        // SAFETY: the chunk is unlinked from the current map
                        // (the one readers load from now on) and retired once;
                        // its slots are all empty. Freed once every thread
                        // pinned now has unpinned, so no reader holds it then.
                        unsafe {
                            guard.defer_unchecked(move || {
                                let RetiredChunk(c) = chunk;
                                drop(Box::from_raw(c));
                            });
                        }
                        slot::retired(1);
                    }
                }
            }
            self.shrink(shard, last, guard);
        }
        slot::retired(1);
        shard.write.bytes.fetch_sub(freed, Ordering::Relaxed);
        shard
            .write
            .floor
            .fetch_max(record::version(&record), Ordering::AcqRel);
        self.boxes.fetch_sub(1, Ordering::AcqRel);
        Some(record)
    }

    /// Give back what a shard of `len` boxes no longer needs (its mutex held,
    /// its sequence odd): the index shrinks once under 1/8 full (to 3/8 at
    /// most, so a shard that grows again does not reallocate at once), the
    /// directory once under a quarter used; an empty shard has no map.
    pub(super) fn shrink(&self, shard: &Shard, len: usize, guard: &Guard) {
        let Some(map) = shard.map(guard) else {
            return;
        };
        if len == 0 {
            self.republish(shard, None, guard);
            return;
        }
        let (b, d) = (map.entries.len(), map.chunks.len());
        let chunks = len.div_ceil(CHUNK);
        let buckets = if b > MIN_BUCKETS && len * 8 < b {
            buckets_for(2 * len)
        } else {
            b
        };
        let dir = if d >= 4 * chunks.max(2) {
            2 * chunks
        } else {
            d
        };
        if (buckets, dir) != (b, d) {
            self.republish(shard, Some((buckets, dir)), guard);
        }
    }
}

/// A chunk in flight to the collector.
pub(super) struct RetiredChunk(pub(super) *mut Chunk);
