//! A box's slot: a sequence counter (a seqlock) and the box's record, stored
//! as words so that readers may copy it while a writer changes it.
//!
//! Readers take no lock and write nothing: they load the sequence (even: no
//! writer), copy what they need with relaxed atomic loads, and keep the copy
//! only if the sequence is still the same afterwards (Boehm, "Can seqlocks get
//! along with programming language memory models?", 2012: acquire load of the
//! sequence, relaxed data loads, acquire fence, relaxed load of the sequence).
//! Bytes read while a writer races are never used: every access is an atomic
//! load of an `AtomicU64`, so a racing copy is merely stale, never undefined
//! behaviour, and it is thrown away. No `unsafe` anywhere.
//!
//! Writers are optimistic: they read the record the same way, compute the next
//! one from that copy, then claim the sequence with one compare-and-swap from
//! the value they read (even) to the next (odd). A failed swap means another
//! writer got in first: the writer starts again from a fresh copy. A claimed
//! sequence is held only for the relaxed stores of the new record's words, and
//! released by storing the next even value.
//!
//! The record's allocation never changes while shared: growing it needs
//! `&mut Slot`, which the table only hands out under its shard's write lock,
//! when no reader or writer can be in the slot.

use std::hint::spin_loop;
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// One box. 32 bytes, aligned: two slots a cache line, none straddles two
/// (at 24 bytes a third of them would, and a poll would miss twice).
#[derive(Default)]
#[repr(align(32))]
pub(super) struct Slot {
    /// Even: the record is stable; odd: a writer is storing it.
    seq: AtomicU64,
    /// The record's bytes, little-endian in words (byte `i` is byte `i % 8`
    /// of word `i / 8`); as long as the record's size class.
    words: Box<[AtomicU64]>,
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

impl Slot {
    /// A slot holding `image` (a whole record, its length a multiple of 8).
    pub(super) fn new(image: &[u8]) -> Slot {
        Slot {
            seq: AtomicU64::new(0),
            words: words_of(image),
        }
    }

    /// Bytes of the record's allocation.
    pub(super) fn bytes(&self) -> usize {
        self.words.len() * 8
    }

    /// Start an optimistic read: the sequence once it is even (a writer
    /// holds it odd for a few dozen stores; spin, then yield, while it does).
    #[inline]
    pub(super) fn begin(&self) -> u64 {
        let mut spins = 0u32;
        loop {
            let s = self.seq.load(Ordering::Acquire);
            if s & 1 == 0 {
                return s;
            }
            spins += 1;
            if spins < 128 {
                spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Whether what was read since [`Slot::begin`] returned `s` is whole:
    /// nothing was stored meanwhile.
    #[inline]
    pub(super) fn valid(&self, s: u64) -> bool {
        fence(Ordering::Acquire);
        self.seq.load(Ordering::Relaxed) == s
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
        if start + key.len() > self.words.len() * 8 {
            return false;
        }
        let word = |i: usize| self.words.get(i).map_or(0, |w| w.load(Ordering::Relaxed));
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
                Err(_) => {
                    let mut c = [0u8; 8];
                    for (d, b) in c.iter_mut().zip(chunk) {
                        *d = *b;
                    }
                    (u64::from_le_bytes(c), (1u64 << (chunk.len() * 8)) - 1)
                }
            };
            if v & mask != want {
                return false;
            }
            lo = next;
        }
        true
    }

    /// Append `len` bytes from `start` to `out`, racy; false (nothing
    /// appended) when out of bounds. A word at a time when `start` is a
    /// multiple of 8 (a payload: see `record.rs`).
    #[inline]
    pub(super) fn copy_to(&self, start: usize, len: usize, out: &mut Vec<u8>) -> bool {
        if start + len > self.words.len() * 8 {
            return false;
        }
        if !start.is_multiple_of(8) {
            out.reserve(len);
            return for_bytes(&self.words, start, len, |b| out.extend_from_slice(b));
        }
        let first = start / 8;
        let Some(words) = self.words.get(first..first + len.div_ceil(8)) else {
            return false;
        };
        // Through a buffer on the stack, 16 words at a time: a load and a
        // store per word, one copy into `out` per 128 bytes, no unsafe.
        let end = out.len() + len;
        out.reserve(words.len() * 8);
        let mut buf = [0u8; 128];
        for group in words.chunks(16) {
            for (d, w) in buf.chunks_exact_mut(8).zip(group) {
                d.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
            }
            out.extend_from_slice(buf.get(..group.len() * 8).unwrap_or_default());
        }
        out.truncate(end);
        true
    }

    /// Fill `dst` with the bytes from `start`, racy; false when out of bounds.
    pub(super) fn read_into(&self, start: usize, dst: &mut [u8]) -> bool {
        let mut at = 0;
        for_bytes(&self.words, start, dst.len(), |b| {
            dst[at..at + b.len()].copy_from_slice(b);
            at += b.len();
        })
    }

    /// Replace `image` by the whole record, racy.
    #[inline]
    pub(super) fn load(&self, image: &mut Vec<u8>) {
        let n = self.words.len() * 8;
        if image.len() != n {
            image.clear();
            image.resize(n, 0);
        }
        for (c, w) in image.chunks_exact_mut(8).zip(self.words.iter()) {
            c.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
    }

    /// A copy of the whole record, read until whole.
    #[cfg(test)]
    pub(super) fn load_whole(&self, image: &mut Vec<u8>) {
        loop {
            let s = self.begin();
            self.load(image);
            if self.valid(s) {
                return;
            }
        }
    }

    /// Claim the slot for writing if nothing was stored since `s` (from
    /// [`Slot::begin`]). On success the caller stores and then calls
    /// [`Slot::release`] with the same `s`.
    #[inline]
    pub(super) fn claim(&self, s: u64) -> bool {
        if self
            .seq
            .compare_exchange(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        // Readers that see any of the stores below must see the odd sequence
        // when they check it again.
        fence(Ordering::Release);
        true
    }

    /// Store `image` (whole words, no longer than the record) over the first
    /// `image.len() / 8` words (the slot claimed, or ours alone).
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

    /// Let readers in again after a [`Slot::claim`] of `s`.
    #[inline]
    pub(super) fn release(&self, s: u64) {
        self.seq.store(s + 2, Ordering::Release);
    }

    /// With the slot to ourselves: replace the record by `image`, returning the
    /// old one.
    pub(super) fn replace(&mut self, image: &[u8]) -> Box<[AtomicU64]> {
        *self.seq.get_mut() += 2;
        std::mem::replace(&mut self.words, words_of(image))
    }

    /// With the slot to ourselves: take the record out, leaving it empty.
    pub(super) fn take(&mut self) -> Slot {
        std::mem::take(self)
    }
}

/// A record's words from its bytes (padded with zeros to a whole word).
pub(super) fn words_of(image: &[u8]) -> Box<[AtomicU64]> {
    image
        .chunks(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            AtomicU64::new(u64::from_le_bytes(b))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn bytes_read_back_at_any_offset() {
        let image: Vec<u8> = (0..40u8).collect();
        let s = Slot::new(&image);
        assert_eq!(s.bytes(), 40);
        for start in 0..40 {
            for len in 0..=40 - start {
                let mut out = vec![9];
                assert!(s.copy_to(start, len, &mut out));
                assert_eq!(out[1..], image[start..start + len]);
                assert!(s.eq_at(start, &image[start..start + len]));
                if len > 0 {
                    let mut other = image[start..start + len].to_vec();
                    other[len - 1] ^= 1;
                    assert!(!s.eq_at(start, &other), "{start} {len}");
                    other[len - 1] ^= 1;
                    other[0] ^= 0x80;
                    assert!(!s.eq_at(start, &other), "{start} {len}");
                }
            }
        }
        assert!(!s.copy_to(39, 2, &mut Vec::new()));
        assert!(!s.copy_to(40, 1, &mut Vec::new()));
        assert!(!s.eq_at(39, &[39, 40]));
        assert!(!s.eq_at(3, &[3, 5]));
        assert_eq!(s.head()[..], image[..16]);
        let mut whole = Vec::new();
        s.load_whole(&mut whole);
        assert_eq!(whole, image);
    }

    #[test]
    fn a_claim_fails_after_a_store_and_readers_see_it() {
        let s = Slot::new(&[0u8; 16]);
        let seq = s.begin();
        assert!(s.claim(seq));
        // Claimed: a second writer from the same sequence loses.
        assert!(!s.claim(seq));
        s.store(&[[7u8; 9].as_slice(), &[0u8; 7]].concat());
        s.release(seq);
        assert!(!s.valid(seq), "a read across the store is refused");
        assert!(!s.claim(seq), "a writer that read before the store retries");
        let now = s.begin();
        assert!(s.valid(now));
        assert_eq!(s.head()[..9], [7u8; 9]);
        assert_eq!(s.head()[9..], [0u8; 7]);
    }

    /// Four writers store records whose 8 words all hold one number, and
    /// bump it; readers check every copy they keep is one record (all words
    /// equal), never a mix of two.
    #[test]
    fn readers_never_keep_a_torn_copy() {
        const WORDS: usize = 8;
        let slot = Arc::new(Slot::new(&[0u8; WORDS * 8]));
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..2)
            .map(|_| {
                let slot = Arc::clone(&slot);
                std::thread::spawn(move || {
                    let mut image = Vec::new();
                    for _ in 0..20_000 {
                        loop {
                            let s = slot.begin();
                            slot.load(&mut image);
                            let n = u64::from_le_bytes(image[..8].try_into().expect("8"));
                            let next: Vec<u8> =
                                (0..WORDS).flat_map(|_| (n + 1).to_le_bytes()).collect();
                            if slot.claim(s) {
                                slot.store(&next);
                                slot.release(s);
                                break;
                            }
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
                    while !stop.load(Ordering::Relaxed) {
                        let s = slot.begin();
                        out.clear();
                        assert!(slot.copy_to(0, WORDS * 8, &mut out));
                        if !slot.valid(s) {
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
        assert_eq!(slot.head()[..8], 40_000u64.to_le_bytes());
    }
}
