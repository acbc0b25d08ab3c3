//! What a snapshot walk hands over, and how it knows what changed: every
//! record written stamps its slot with the snapshot generation it was written
//! in (16 bits beside the slot in its chunk, stored under the slot's claim: a
//! delta's walk reads it between the slot's sequence loads, so an unchanged
//! record is never touched, and a delta costs the slots' 22 bytes each plus
//! what changed, not a cache miss a box), every
//! walk moves the table's generation on, and a delta
//! walk ([`Walk::Changed`]) hands over only the records of the generation
//! before it, with the keys removed since the walk before (kept per shard
//! while the table tracks changes).
//!
//! Why no change is missed: a walk moves the generation on (a SeqCst
//! read-modify-write and fence) before it reads any slot; a writer loads
//! the generation (SeqCst) after its claim on the slot (a SeqCst
//! compare-and-swap), a creation under the shard's mutex. So a record the
//! walk did not see written (the claim came after the walk's read in the
//! total order, or the creation after the walk took the shard's mutex) is
//! stamped with the new generation and goes into the next delta; one
//! stamped with the old generation was claimed before the walk moved it on,
//! and the walk, which reads the slot after that, sees it. A record stamped
//! with the new generation *before* the walk reads its slot is taken by this
//! delta as well (and again by the next): it replaced a state of the old
//! generation, written before the delta's log position was taken, that no
//! file would hold otherwise (a restart would replay from that position on
//! top of the older state the file before holds, and lose what was between:
//! `kill_9_under_ingest_loses_nothing_acknowledged_and_applies_nothing_twice`
//! caught it under load). A generation that
//! wraps (16 bits) only makes an unchanged record look changed: written again,
//! never missed.
//!
//! Each shard is read from its end down, as the expiry sweep does: a removal
//! moves the shard's last box, which the walk has read already, into the
//! hole, so a box present for the whole walk is always read (at worst twice,
//! the second copy the newer; readers let the first of a file win, which is
//! a state the box had during the walk).

use super::*;

/// Which boxes a snapshot walk hands over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Walk {
    /// Every box (a base snapshot). The keys removed since the walk before
    /// are dropped: a base does not need them.
    All,
    /// The boxes written, and the keys removed, since the walk before (a
    /// delta snapshot).
    Changed,
}

impl BoxTable {
    /// Keep the keys of removed boxes for the next delta snapshot from now
    /// on (set before anything is served, once snapshots are written).
    pub fn track_changes(&self) {
        self.tracking.store(true, Ordering::Relaxed);
    }

    /// The generation a record written now is stamped with (see the module
    /// doc for why SeqCst; a plain load on x86).
    #[inline]
    pub(super) fn generation_now(&self) -> u16 {
        self.generation.load(Ordering::SeqCst) as u16
    }

    /// A snapshot's walk at `now_ms`: moves the generation on, then calls
    /// `removed(key)` for each key removed since the walk before (with
    /// [`Walk::Changed`]; before the boxes of its shard, which may hold the
    /// key again: created again since) and `f(key, version, idle_s, state)`
    /// for each box `which` asks for, as [`BoxTable::for_each`] does.
    pub fn walk(
        &self,
        now_ms: u64,
        which: Walk,
        mut removed: impl FnMut(&str),
        f: impl FnMut(&str, u64, u32, &[FieldState]),
    ) {
        self.tracking.store(true, Ordering::Relaxed);
        let was = self.generation.fetch_add(1, Ordering::SeqCst) as u16;
        fence(Ordering::SeqCst);
        let only = match which {
            Walk::All => None,
            Walk::Changed => Some(was),
        };
        let mut keys = String::new();
        self.walk_shards(
            now_ms,
            only,
            true,
            |taken| {
                if which == Walk::All {
                    return;
                }
                let mut at = 0;
                while let Some(len) = taken.get(at..at + 2) {
                    let len = u16::from_le_bytes([len[0], len[1]]) as usize;
                    let key = taken.get(at + 2..at + 2 + len).unwrap_or_default();
                    at += 2 + len;
                    keys.clear();
                    // Keys are stored from a `&str`.
                    keys.push_str(std::str::from_utf8(key).unwrap_or_default());
                    removed(&keys);
                }
            },
            f,
        );
    }

    /// Walk every shard from its end down, in batches of [`WALK_BATCH`]
    /// records copied under the shard's mutex; with `only`, just the records
    /// of that generation. With `take_removed`, `taken` gets each shard's
    /// removed keys (taken under its mutex before its first batch); `f` gets
    /// each record.
    pub(super) fn walk_shards(
        &self,
        now_ms: u64,
        only: Option<u16>,
        take_removed: bool,
        mut taken: impl FnMut(&[u8]),
        mut f: impl FnMut(&str, u64, u32, &[FieldState]),
    ) {
        let n = self.plan.fields.len();
        let mut states: Vec<FieldState> = Vec::with_capacity(n);
        let mut key = String::new();
        let fresh = self.expires_at(now_ms);
        let mut copied: Vec<u8> = Vec::with_capacity(WALK_BATCH * 128);
        // Per copied record: where it ends in `copied`, and its idle seconds.
        let mut ends: Vec<(usize, u32)> = Vec::with_capacity(WALK_BATCH);
        for shard in self.shards.iter() {
            // Slots below `next` are still to be read.
            let mut next = usize::MAX;
            let mut first = true;
            loop {
                copied.clear();
                ends.clear();
                let mut removed = Vec::new();
                let done = {
                    let guard = epoch::pin();
                    let _writer = shard.lock();
                    if first && take_removed {
                        removed = std::mem::take(&mut *shard.removed());
                        shard.add_bytes(size_class(removed.capacity()), 0);
                        first = false;
                    }
                    let hi = next.min(shard.write.len.load(Ordering::Relaxed));
                    let lo = hi.saturating_sub(WALK_BATCH);
                    let map = shard.map(&guard);
                    for i in (lo..hi).rev() {
                        let Some(place) = map.and_then(|m| m.place(i, &guard)) else {
                            continue;
                        };
                        let mut skip = false;
                        loop {
                            let r = place.slot.begin(&guard);
                            if let Some(g) = only {
                                // The slot's generation, read between the
                                // sequence loads as the record would be: an
                                // unchanged record is never touched. A record
                                // written since this walk began (the next
                                // generation) is taken too: it replaced a
                                // state of this generation that the delta's
                                // position counts on.
                                let at = place.gen.load(Ordering::Relaxed);
                                if (at != g && at != g.wrapping_add(1)) || r.is_empty() {
                                    if r.valid() {
                                        skip = true;
                                        break;
                                    }
                                    continue;
                                }
                            }
                            let mark = copied.len();
                            r.copy_to(0, r.bytes(), &mut copied);
                            if r.valid() {
                                break;
                            }
                            copied.truncate(mark);
                        }
                        if skip {
                            continue;
                        }
                        let idle = match place.stamp.load(Ordering::Relaxed) {
                            NEVER => 0,
                            at => fresh.saturating_sub(at),
                        };
                        ends.push((copied.len(), idle));
                    }
                    next = lo;
                    lo == 0
                };
                if !removed.is_empty() {
                    taken(&removed);
                }
                let mut start = 0;
                for &(end, idle) in &ends {
                    let record = &copied[start..end];
                    start = end;
                    if record.is_empty() {
                        continue;
                    }
                    states.clear();
                    states.extend(
                        codec::Decoder::new(record::state(record))
                            .take(n)
                            .map(FieldView::to_state),
                    );
                    key.clear();
                    // Keys are stored from a `&str`.
                    key.push_str(std::str::from_utf8(record::key(record)).unwrap_or_default());
                    f(&key, record::version(record), idle, &states);
                }
                if done {
                    break;
                }
            }
        }
    }
}
