//! A box's slot: a sequence counter (a seqlock) and a pointer to the box's
//! record, stored as words so that readers may copy it while a writer
//! changes it.
//!
//! Readers take no lock and write nothing: they load the sequence (even: no
//! writer), the record's pointer and length, copy what they need with relaxed
//! atomic loads, and keep the copy only if the sequence is still the same
//! afterwards (Boehm, "Can seqlocks get along with programming language
//! memory models?", 2012: acquire load of the sequence, relaxed data loads,
//! acquire fence, relaxed load of the sequence). Bytes read while a writer
//! races are never used: every access is an atomic load of an `AtomicU64`, so
//! a racing copy is merely stale, never undefined behaviour, and it is thrown
//! away.
//!
//! Writers are optimistic: they read the record the same way, compute the next
//! one from that copy, then claim the sequence with one compare-and-swap from
//! the value they read (even) to the next (odd). A failed swap means another
//! writer got in first: the writer starts again from a fresh copy. A claim
//! ([`Claim`]) is held for the relaxed stores of the new record's words, or to
//! swap in another allocation, and released (the next even value) when it is
//! dropped.
//!
//! The record's allocation changes only under a claim: a record that moves to
//! another size class, a box that moves to another slot or is removed. The
//! old allocation is retired through the epoch collector (crossbeam-epoch)
//! and freed once no thread that was pinned when it was retired is pinned any
//! more, so a reader, which loads the pointer while pinned (a [`Guard`]),
//! never reads freed memory, even when it loaded the pointer just before the
//! swap. The record's length (in words) is kept in the same word as the
//! sequence, and its pointer is read between two equal even loads of that
//! word, so the two belong to one allocation.
//!
//! The slot is 16 bytes: the sequence word (the length in its top
//! [`LEN_BITS`] bits, the counter in the rest) and the pointer. The counter
//! takes 2^43 claims to wrap, and a reader is fooled only if one slot is
//! claimed exactly a multiple of that many times between its two loads of
//! the word, a few instructions apart (Linux's seqcount wraps at 2^31).

use std::cell::Cell;
use std::hint::spin_loop;
use std::sync::atomic::{fence, AtomicPtr, AtomicU64, Ordering};

use crate::bytes::short_le;
use crossbeam_epoch::Guard;

/// Bits of the sequence word that hold the record's length in words (the
/// top ones): 2^20 words is 8 MiB, far above the largest record the config
/// allows (a 64 KiB payload, a 4 KiB key and their state).
const LEN_BITS: u32 = 20;
/// The counter's bits of the sequence word (its low bit: claimed).
const COUNTER: u64 = (1 << (64 - LEN_BITS)) - 1;
/// The longest record a slot can hold, in words.
pub(super) const MAX_WORDS: usize = (1 << LEN_BITS) - 1;

/// The sequence word of a record of `len` words at counter `counter`.
#[inline]
fn pack(counter: u64, len: usize) -> u64 {
    (len as u64) << (64 - LEN_BITS) | (counter & COUNTER)
}

/// The record's length in words a sequence word holds.
#[inline]
fn len_of(seq: u64) -> usize {
    (seq >> (64 - LEN_BITS)) as usize
}

/// One box. 16 bytes, aligned: four slots a cache line, none straddles two.
#[repr(align(16))]
pub(super) struct Slot {
    /// The counter in the low bits (even: the record is stable; odd: a
    /// writer holds a claim) and the record's length in words in the top
    /// [`LEN_BITS`].
    seq: AtomicU64,
    /// The record's words (null: no box in this slot), little-endian (byte
    /// `i` is byte `i % 8` of word `i / 8`), as many as its size class;
    /// owned by the slot (a `Box<[AtomicU64]>` taken apart). It and the
    /// length change only under a claim.
    ptr: AtomicPtr<AtomicU64>,
}

impl Default for Slot {
    fn default() -> Slot {
        Slot {
            seq: AtomicU64::new(0),
            ptr: AtomicPtr::new(std::ptr::null_mut()),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let (ptr, len) = (*self.ptr.get_mut(), len_of(*self.seq.get_mut()));
        if !ptr.is_null() {
            // SAFETY: the slot owns the allocation `ptr` names (it came from
            // `Words::into_raw` and was never handed to another slot without
            // being set to null here first), and `&mut self` means no reader
            // can hold a reference into it: readers only borrow slots through
            // the table, which is being dropped or has retired this slot's
            // chunk past every pinned reader.
            drop(unsafe { Words::from_raw(ptr, len) });
        }
    }
}

/// A record's words, owned (not in a slot yet, or taken out of one).
pub(super) struct Words(Box<[AtomicU64]>);

impl Words {
    /// A record's words from its bytes (padded with zeros to a whole word).
    pub(super) fn new(image: &[u8]) -> Words {
        Words(
            image
                .chunks(8)
                .map(|c| {
                    let mut b = [0u8; 8];
                    b[..c.len()].copy_from_slice(c);
                    AtomicU64::new(u64::from_le_bytes(b))
                })
                .collect(),
        )
    }

    /// Bytes of the allocation.
    pub(super) fn bytes(&self) -> usize {
        self.0.len() * 8
    }

    /// Append `len` bytes from `start` to `out` (false when out of bounds).
    pub(super) fn copy_to(&self, start: usize, len: usize, out: &mut Vec<u8>) -> bool {
        copy_to(&self.0, start, len, out)
    }

    fn into_raw(self) -> (*mut AtomicU64, usize) {
        let len = self.0.len();
        (Box::into_raw(self.0).cast::<AtomicU64>(), len)
    }

    /// # Safety
    /// `(ptr, len)` came from [`Words::into_raw`] and nothing else owns it.
    unsafe fn from_raw(ptr: *mut AtomicU64, len: usize) -> Words {
        // SAFETY: the caller's contract: a boxed slice of `len` words.
        Words(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len)) })
    }

    /// Free the words once no reader pinned now can hold them.
    ///
    /// # Safety
    /// `(ptr, len)` came from [`Words::into_raw`], was unlinked from its slot
    /// (under a claim) before this call, and is retired only once.
    unsafe fn retire(ptr: *mut AtomicU64, len: usize, guard: &Guard) {
        if ptr.is_null() {
            return;
        }
        let raw = RawWords(ptr, len);
        // SAFETY: the closure frees an allocation of `AtomicU64`s (which may
        // be freed from any thread) that nothing owns any more (the caller's
        // contract), after every thread pinned now has unpinned: no reader can
        // still hold it then, since readers load the pointer while pinned and
        // it is no longer in any slot.
        unsafe {
            guard.defer_unchecked(move || {
                let RawWords(ptr, len) = raw;
                drop(Words::from_raw(ptr, len));
            });
        }
    }
}

/// An allocation in flight to the collector.
struct RawWords(*mut AtomicU64, usize);

/// Flushes of the epoch collector a thread owes after changing a shard's
/// structure, at least.
const FLUSHES_AFTER_RETIRING: u32 = 8;
/// What one flush frees at most: crossbeam-epoch's collection pops 8 bags of
/// up to 64 retired items each.
const FREED_PER_FLUSH: u32 = 8 * 64;
/// Flushes in one [`flush_owed`] call at most.
const MAX_FLUSHES_PER_CALL: u32 = 8;

thread_local! {
    /// Flushes owed, and items retired and not yet flushed for.
    static OWED: Cell<(u32, u32)> = const { Cell::new((0, 0)) };
}

/// This thread retired `items` things to the collector while changing a
/// shard's structure (removals, emptied chunks, replaced maps): its next
/// [`flush_owed`] calls flush, enough of them to free it all. (A retired
/// item waits in a thread-local bag until the bag is full or flushed, and is
/// freed once the epoch has moved on twice since, by a collection, which
/// runs on a flush or every 128 pins.)
pub(super) fn retired(items: u32) {
    let _ = OWED.try_with(|o| {
        let (flushes, pending) = o.get();
        o.set((
            flushes.max(FLUSHES_AFTER_RETIRING),
            pending.saturating_add(items),
        ));
    });
}

/// Flush this thread's garbage and let the collector go on, if this thread
/// owes it (see [`retired`]); called once a tick. The owed flushes are paid
/// one a call (the epoch must move on between them, as other threads pin);
/// more in the same call while many retired items are pending, so the
/// collector keeps up with a sweep that removes its whole budget every tick.
/// Not unconditionally: a flush allocates a queue node when there is anything
/// to push, and collecting leaves a little garbage of its own (the popped
/// node), so flushing every tick would allocate every tick forever. Records
/// that updates moved to another size class are not flushed for: they go
/// with the bag once it is full (at most 63 of them per thread wait
/// meanwhile).
pub(super) fn flush_owed() {
    let (flushes, mut pending) = OWED.try_with(Cell::get).unwrap_or((0, 0));
    if flushes == 0 && pending == 0 {
        return;
    }
    for n in 0..MAX_FLUSHES_PER_CALL {
        if n > 0 && pending == 0 {
            break;
        }
        pending = pending.saturating_sub(FREED_PER_FLUSH);
        crossbeam_epoch::pin().flush();
    }
    let _ = OWED.try_with(|o| o.set((flushes.saturating_sub(1), pending)));
}

/// Byte `i` of the record lies in word `i / 8`; the bytes from `start`, `len`
/// of them, fed to `f` word by word. False when out of the record's bounds.
#[inline]
fn for_bytes(words: &[AtomicU64], start: usize, len: usize, mut f: impl FnMut(&[u8])) -> bool {
    if len == 0 {
        return start <= words.len() * 8;
    }
    let end = start + len;
    if end > words.len() * 8 {
        return false;
    }
    let (first, last) = (start / 8, (end - 1) / 8);
    let mut skip = start % 8;
    let mut left = len;
    for w in words.get(first..=last).unwrap_or_default() {
        let b = w.load(Ordering::Relaxed).to_le_bytes();
        let take = (8 - skip).min(left);
        f(&b[skip..skip + take]);
        skip = 0;
        left -= take;
    }
    true
}

/// Append `len` bytes of `words` from `start` to `out`, racy; false (nothing
/// appended) when out of bounds. A word at a time when `start` is a multiple
/// of 8 (a payload: see `record.rs`).
#[inline]
fn copy_to(words: &[AtomicU64], start: usize, len: usize, out: &mut Vec<u8>) -> bool {
    if start + len > words.len() * 8 {
        return false;
    }
    if !start.is_multiple_of(8) {
        out.reserve(len);
        return for_bytes(words, start, len, |b| out.extend_from_slice(b));
    }
    let first = start / 8;
    let Some(words) = words.get(first..first + len.div_ceil(8)) else {
        return false;
    };
    // A word at a time, straight into `out`'s spare room: a load and a store
    // per word; no copy through a buffer, no call.
    let end = out.len() + len;
    let n = words.len() * 8;
    out.reserve(n);
    let Some(room) = out.spare_capacity_mut().get_mut(..n) else {
        return false; // Not after `reserve(n)`.
    };
    for (d, w) in room.chunks_exact_mut(8).zip(words) {
        let b = w.load(Ordering::Relaxed).to_le_bytes();
        for (d, b) in d.iter_mut().zip(b) {
            d.write(b);
        }
    }
    // SAFETY: `room` is the `n` bytes of spare capacity right after `out`'s
    // bytes, and the loop above initialised all of them (`words` has exactly
    // `n / 8` words, one store per byte of each); `end` is at most `n` past
    // the old length (`len <= n`), so every byte up to `end` is initialised,
    // and within the capacity.
    unsafe { out.set_len(end) };
    true
}

impl Slot {
    /// Start an optimistic read: the sequence once it is even (a writer
    /// holds it odd for a few dozen stores; spin, then yield, while it does),
    /// and the record's words as they were at that sequence. The words stay
    /// allocated while `guard` is pinned; what is read from them is only good
    /// if [`Read::valid`] says so afterwards.
    #[inline]
    pub(super) fn begin<'g>(&'g self, _guard: &'g Guard) -> Read<'g> {
        let mut spins = 0u32;
        loop {
            let seq = self.seq.load(Ordering::Acquire);
            if seq & 1 == 0 {
                let ptr = self.ptr.load(Ordering::Relaxed);
                let len = len_of(seq);
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == seq {
                    let words: &'g [AtomicU64] = if ptr.is_null() {
                        &[]
                    } else {
                        // SAFETY: `ptr` was read between two loads of one even
                        // sequence word, which holds `len`, so they are one
                        // allocation's (both change only under a claim, which
                        // makes the sequence odd), initialised before the release that
                        // published them (synchronised with by the acquire
                        // load above). It is freed only after being unlinked
                        // under a claim and retired to the epoch collector;
                        // this thread is pinned (`_guard`) and loaded it
                        // before any such unlink was visible, so the collector
                        // keeps it allocated until `_guard` is dropped, which
                        // outlives `'g`. Only shared references to atomics are
                        // made from it.
                        unsafe { std::slice::from_raw_parts(ptr, len) }
                    };
                    return Read {
                        slot: self,
                        seq,
                        words,
                    };
                }
            }
            backoff(&mut spins);
        }
    }

    /// Claim the slot, waiting for any other claim to end (writers that own
    /// the shard's structure: insert, remove, move).
    pub(super) fn claim_now<'g>(&'g self, guard: &'g Guard) -> Claim<'g> {
        loop {
            if let Some(c) = self.begin(guard).claim() {
                return c;
            }
        }
    }
}

/// Spin a while, then yield to the scheduler (the holder of a claim or of a
/// shard's restructuring may be descheduled on a busy machine).
#[inline]
pub(super) fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 128 {
        spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// A slot as a reader saw it at an even sequence: the record's words of then.
/// Every read through it is racy until [`Read::valid`].
#[derive(Clone, Copy)]
pub(super) struct Read<'g> {
    slot: &'g Slot,
    seq: u64,
    words: &'g [AtomicU64],
}

impl<'g> Read<'g> {
    /// Whether the slot held no box.
    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// Bytes of the record's allocation.
    #[inline]
    pub(super) fn bytes(&self) -> usize {
        self.words.len() * 8
    }

    /// Whether everything read since [`Slot::begin`] is whole: nothing was
    /// stored meanwhile.
    #[inline]
    pub(super) fn valid(&self) -> bool {
        fence(Ordering::Acquire);
        self.slot.seq.load(Ordering::Relaxed) == self.seq
    }

    /// Word `i` of the record (its bytes `8 * i..`), racy; 0 past its end.
    #[inline]
    pub(super) fn word(&self, i: usize) -> u64 {
        self.words.get(i).map_or(0, |w| w.load(Ordering::Relaxed))
    }

    /// The first 16 bytes (the header and the start of the key), racy.
    #[inline]
    pub(super) fn head(&self) -> [u8; 16] {
        let mut h = [0u8; 16];
        if let (Some(a), Some(b)) = (self.words.first(), self.words.get(1)) {
            h[..8].copy_from_slice(&a.load(Ordering::Relaxed).to_le_bytes());
            h[8..].copy_from_slice(&b.load(Ordering::Relaxed).to_le_bytes());
        }
        h
    }

    /// Whether the bytes from `start` are `key`, racy. Eight bytes at a time,
    /// each taken from the two words it spans by shifts.
    #[inline]
    pub(super) fn eq_at(&self, start: usize, key: &[u8]) -> bool {
        let words = self.words;
        if start + key.len() > words.len() * 8 {
            return false;
        }
        let word = |i: usize| words.get(i).map_or(0, |w| w.load(Ordering::Relaxed));
        let shift = (start % 8) as u32 * 8;
        let mut lo = word(start / 8);
        for (at, chunk) in (start / 8..).zip(key.chunks(8)) {
            let next = word(at + 1);
            let v = if shift == 0 {
                lo
            } else {
                (lo >> shift) | (next << (64 - shift))
            };
            let (want, mask) = match <[u8; 8]>::try_from(chunk) {
                Ok(c) => (u64::from_le_bytes(c), u64::MAX),
                Err(_) => (short_le(chunk), (1u64 << (chunk.len() * 8)) - 1),
            };
            if v & mask != want {
                return false;
            }
            lo = next;
        }
        true
    }

    /// Append `len` bytes from `start` to `out`, racy; false (nothing
    /// appended) when out of bounds.
    #[inline]
    pub(super) fn copy_to(&self, start: usize, len: usize, out: &mut Vec<u8>) -> bool {
        copy_to(self.words, start, len, out)
    }

    /// Fill `dst` with the bytes from `start`, racy; false when out of bounds.
    #[cfg(test)]
    pub(super) fn read_into(&self, start: usize, dst: &mut [u8]) -> bool {
        let mut at = 0;
        for_bytes(self.words, start, dst.len(), |b| {
            dst[at..at + b.len()].copy_from_slice(b);
            at += b.len();
        })
    }

    /// Replace `image` by the whole record, racy.
    #[inline]
    pub(super) fn load(&self, image: &mut Vec<u8>) {
        load(self.words, image);
    }

    /// Claim the slot for writing if nothing was stored since this read
    /// began; the claim ends (the slot's sequence moves on) when dropped.
    #[inline]
    pub(super) fn claim(self) -> Option<Claim<'g>> {
        self.slot
            .seq
            // SeqCst (the same instruction as Acquire on x86): a snapshot
            // walk that did not see this claim began after it in the total
            // order, so the generation the writer loads after the claim is
            // the walk's next one (`BoxTable::generation_now`).
            .compare_exchange(
                self.seq,
                pack(self.seq + 1, len_of(self.seq)),
                Ordering::SeqCst,
                Ordering::Relaxed,
            )
            .ok()?;
        // Readers that see any of the stores under the claim must see the
        // odd sequence when they check it again.
        fence(Ordering::Release);
        Some(Claim {
            slot: self.slot,
            seq: self.seq,
            len: self.words.len(),
            words: self.words,
        })
    }
}

#[inline]
fn load(words: &[AtomicU64], image: &mut Vec<u8>) {
    let n = words.len() * 8;
    if image.len() != n {
        image.clear();
        image.resize(n, 0);
    }
    for (c, w) in image.chunks_exact_mut(8).zip(words.iter()) {
        c.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
    }
}

/// The slot to one writer: its record may be stored, replaced, moved or
/// taken out. Readers that began before or during the claim throw away what
/// they read. Released when dropped.
pub(super) struct Claim<'g> {
    slot: &'g Slot,
    /// The sequence word claimed from (even).
    seq: u64,
    /// The record's length in words when released (what `set` stored).
    len: usize,
    words: &'g [AtomicU64],
}

impl<'g> Claim<'g> {
    pub(super) fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    pub(super) fn bytes(&self) -> usize {
        self.words.len() * 8
    }

    /// Replace `image` by the whole record (stable: the slot is ours).
    pub(super) fn load(&self, image: &mut Vec<u8>) {
        load(self.words, image);
    }

    /// Store `image` (whole words, no longer than the record) over the first
    /// `image.len() / 8` words.
    #[inline]
    pub(super) fn store(&self, image: &[u8]) {
        debug_assert!(image.len().is_multiple_of(8));
        for (w, c) in self.words.iter().zip(image.chunks_exact(8)) {
            w.store(
                u64::from_le_bytes(c.try_into().unwrap_or_default()),
                Ordering::Relaxed,
            );
        }
    }

    /// Put `words` in the slot, retiring the record it held (if any) to the
    /// collector.
    pub(super) fn replace(&mut self, words: Words, guard: &'g Guard) {
        assert!(
            words.0.len() <= MAX_WORDS,
            "a record of {} words",
            words.0.len()
        );
        let (ptr, len) = words.into_raw();
        let (old, old_len) = self.set(ptr, len);
        // SAFETY: `(ptr, len)` was just made from an owned `Words`; readers
        // borrow it only while pinned, and it is freed by the slot's drop or
        // a later retire, both after it is unlinked.
        self.words = unsafe { std::slice::from_raw_parts(ptr, len) };
        // SAFETY: the old record came from `Words::into_raw` when it was put
        // here, and was unlinked by `set` under this claim; retired once.
        unsafe { Words::retire(old, old_len, guard) };
    }

    /// Empty the slot, retiring its record to the collector.
    pub(super) fn clear(&mut self, guard: &'g Guard) {
        let (old, old_len) = self.set(std::ptr::null_mut(), 0);
        self.words = &[];
        // SAFETY: as in `replace`: unlinked under this claim, retired once.
        unsafe { Words::retire(old, old_len, guard) };
    }

    /// Move the record of `from` (claimed too) into this slot, which must be
    /// empty; `from` is left empty. The allocation itself stays where it is,
    /// so readers of either slot (which check the sequences) never see it
    /// freed.
    pub(super) fn move_from(&mut self, from: &mut Claim<'g>) {
        debug_assert!(self.is_empty());
        let (ptr, len) = from.set(std::ptr::null_mut(), 0);
        let (old, _) = self.set(ptr, len);
        debug_assert!(old.is_null());
        self.words = std::mem::take(&mut from.words);
    }

    /// The record's pointer and length become `(ptr, len)`; the old ones
    /// are returned (plain loads and stores: the claim makes them ours; the
    /// length is published with the release).
    fn set(&mut self, ptr: *mut AtomicU64, len: usize) -> (*mut AtomicU64, usize) {
        let old = self.slot.ptr.load(Ordering::Relaxed);
        self.slot.ptr.store(ptr, Ordering::Relaxed);
        (old, std::mem::replace(&mut self.len, len))
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.slot
            .seq
            .store(pack(self.seq + 2, self.len), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_epoch as epoch;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    fn slot_with(image: &[u8]) -> Slot {
        let s = Slot::default();
        let guard = epoch::pin();
        s.claim_now(&guard).replace(Words::new(image), &guard);
        s
    }

    #[test]
    fn the_length_rides_in_the_sequence_word_and_survives_its_wrap() {
        let image: Vec<u8> = (0..40).collect();
        let s = slot_with(&image);
        let guard = epoch::pin();
        assert_eq!(s.begin(&guard).bytes(), 40);
        // The counter at its last even value: the next release wraps it to
        // zero and leaves the length alone.
        let at = s.seq.load(Ordering::Relaxed);
        s.seq
            .store(pack(COUNTER - 1, len_of(at)), Ordering::Relaxed);
        let r = s.begin(&guard);
        let claim = r.claim().expect("free");
        assert_eq!(s.seq.load(Ordering::Relaxed) & COUNTER, COUNTER, "odd");
        assert_eq!(len_of(s.seq.load(Ordering::Relaxed)), 5);
        drop(claim);
        assert_eq!(s.seq.load(Ordering::Relaxed), pack(0, 5));
        // A stale read from before the wrap no longer validates.
        assert!(!r.valid());
        // A new record of another length is published with the release.
        let mut claim = s.begin(&guard).claim().expect("free");
        claim.replace(Words::new(&image[..16]), &guard);
        assert_eq!(len_of(s.seq.load(Ordering::Relaxed)), 5, "not before");
        drop(claim);
        let r = s.begin(&guard);
        assert_eq!((r.bytes(), r.valid()), (16, true));
        let mut out = Vec::new();
        assert!(r.copy_to(0, 16, &mut out));
        assert_eq!(out, image[..16]);
        s.claim_now(&guard).clear(&guard);
        assert_eq!(s.seq.load(Ordering::Relaxed) >> (64 - LEN_BITS), 0);
        assert!(s.begin(&guard).is_empty());
    }

    #[test]
    #[should_panic(expected = "a record of")]
    fn a_record_longer_than_the_length_bits_is_refused() {
        let s = Slot::default();
        let guard = epoch::pin();
        s.claim_now(&guard)
            .replace(Words::new(&vec![0; (MAX_WORDS + 1) * 8]), &guard);
    }

    #[test]
    fn short_words_are_the_bytes_in_order() {
        let bytes = [0x81, 0x02, 0xf3, 0x04, 0x65, 0x06, 0xd7, 0x08];
        for n in 0..=8 {
            let want = bytes[..n]
                .iter()
                .rev()
                .fold(0u64, |w, &b| w << 8 | u64::from(b));
            assert_eq!(short_le(&bytes[..n]), want, "{n}");
        }
    }

    #[test]
    fn bytes_read_back_at_any_offset() {
        let image: Vec<u8> = (0..40u8).collect();
        let s = slot_with(&image);
        let guard = epoch::pin();
        let r = s.begin(&guard);
        assert_eq!(r.bytes(), 40);
        for start in 0..40 {
            for len in 0..=40 - start {
                let mut out = vec![9];
                assert!(r.copy_to(start, len, &mut out));
                assert_eq!(out[1..], image[start..start + len]);
                assert!(r.eq_at(start, &image[start..start + len]));
                let mut buf = vec![0; len];
                assert!(r.read_into(start, &mut buf));
                assert_eq!(buf, image[start..start + len]);
                if len > 0 {
                    let mut other = image[start..start + len].to_vec();
                    other[len - 1] ^= 1;
                    assert!(!r.eq_at(start, &other), "{start} {len}");
                    other[len - 1] ^= 1;
                    other[0] ^= 0x80;
                    assert!(!r.eq_at(start, &other), "{start} {len}");
                }
            }
        }
        assert!(!r.copy_to(39, 2, &mut Vec::new()));
        assert!(!r.copy_to(40, 1, &mut Vec::new()));
        assert!(!r.eq_at(39, &[39, 40]));
        assert!(!r.eq_at(3, &[3, 5]));
        assert_eq!(r.head()[..], image[..16]);
        let mut whole = Vec::new();
        r.load(&mut whole);
        assert_eq!(whole, image);
        assert!(r.valid());
        let w = Words::new(&image[..20]);
        assert_eq!(w.bytes(), 24);
        let mut out = Vec::new();
        assert!(w.copy_to(3, 17, &mut out));
        assert_eq!(out, image[3..20]);
    }

    #[test]
    fn a_claim_fails_after_a_store_and_readers_see_it() {
        let s = slot_with(&[0u8; 16]);
        let guard = epoch::pin();
        let read = s.begin(&guard);
        let claim = read.claim().expect("first claim");
        // Claimed: a second writer from the same sequence loses.
        assert!(read.claim().is_none());
        claim.store(&[[7u8; 9].as_slice(), &[0u8; 7]].concat());
        drop(claim);
        assert!(!read.valid(), "a read across the store is refused");
        assert!(read.claim().is_none(), "a writer that read before retries");
        let now = s.begin(&guard);
        assert!(now.valid());
        assert_eq!(now.head()[..9], [7u8; 9]);
        assert_eq!(now.head()[9..], [0u8; 7]);
    }

    #[test]
    fn records_move_between_slots_and_empty_slots_read_empty() {
        let (a, b) = (slot_with(&[1u8; 24]), Slot::default());
        let guard = epoch::pin();
        assert!(b.begin(&guard).is_empty());
        let before = a.begin(&guard);
        {
            let mut from = a.claim_now(&guard);
            let mut to = b.claim_now(&guard);
            to.move_from(&mut from);
            assert!(from.is_empty());
            assert_eq!(to.bytes(), 24);
        }
        assert!(!before.valid());
        assert!(a.begin(&guard).is_empty());
        let mut image = Vec::new();
        b.begin(&guard).load(&mut image);
        assert_eq!(image, [1u8; 24]);
        b.claim_now(&guard).clear(&guard);
        assert!(b.begin(&guard).is_empty());
    }

    /// Two writers store records whose words all hold one number, and bump
    /// it, every few bumps into a new allocation of another size (retiring
    /// the old one); readers check every copy they keep is one record (all
    /// words equal), never a mix of two. Readers keep reading allocations
    /// that writers retired meanwhile: the collector must not free them
    /// under them (a use after free here reads garbage or crashes, the more
    /// so with the system allocator's reuse).
    #[test]
    fn readers_never_keep_a_torn_copy() {
        const WORDS: usize = 8;
        const BUMPS: u64 = 20_000;
        let slot = Arc::new(slot_with(&[0u8; WORDS * 8]));
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..2)
            .map(|_| {
                let slot = Arc::clone(&slot);
                std::thread::spawn(move || {
                    let mut image = Vec::new();
                    for bump in 0..BUMPS {
                        loop {
                            let guard = epoch::pin();
                            let r = slot.begin(&guard);
                            r.load(&mut image);
                            let n = u64::from_le_bytes(image[..8].try_into().expect("8"));
                            let words = if bump % 4 == 0 {
                                WORDS + (bump % 3) as usize
                            } else {
                                image.len() / 8
                            };
                            let next: Vec<u8> =
                                (0..words).flat_map(|_| (n + 1).to_le_bytes()).collect();
                            let Some(mut claim) = r.claim() else {
                                continue;
                            };
                            if next.len() == claim.bytes() {
                                claim.store(&next);
                            } else {
                                claim.replace(Words::new(&next), &guard);
                            }
                            break;
                        }
                    }
                })
            })
            .collect();
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (slot, stop) = (Arc::clone(&slot), Arc::clone(&stop));
                std::thread::spawn(move || {
                    let mut out = Vec::new();
                    let (mut kept, mut last) = (0u64, 0u64);
                    // Until the writers are done, and at least one copy kept
                    // (on a busy machine the writers may finish first).
                    while !stop.load(Ordering::Relaxed) || kept == 0 {
                        let guard = epoch::pin();
                        let r = slot.begin(&guard);
                        out.clear();
                        assert!(r.copy_to(0, r.bytes(), &mut out));
                        if !r.valid() {
                            continue;
                        }
                        let first = &out[..8];
                        assert!(out.chunks(8).all(|w| w == first), "torn: {out:?}");
                        let n = u64::from_le_bytes(first.try_into().expect("8"));
                        assert!(n >= last, "went back from {last} to {n}");
                        last = n;
                        kept += 1;
                    }
                    kept
                })
            })
            .collect();
        for w in writers {
            w.join().expect("writer");
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            assert!(r.join().expect("reader") > 0);
        }
        // No increment was lost: every writer's claim was exclusive.
        let guard = epoch::pin();
        assert_eq!(slot.begin(&guard).head()[..8], (2 * BUMPS).to_le_bytes());
    }
}
